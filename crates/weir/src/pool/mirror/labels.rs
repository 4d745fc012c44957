//! Watching members' labels while the pool serves: a label copy damaged
//! under the running server is rewritten; a member whose labels are both
//! gone (the device overwritten or truncated), or that another process
//! has stamped as its own (taken over, from another host or through
//! another path), is faulted at once rather than found at the next start.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::health::member_label;
use super::{Health, PoolData};
use crate::pool::label::Label;
use crate::pool::members::{read_stamped_labels, write_labels};

/// How often each member's labels are read: two 4 KiB reads per member.
const LABEL_CHECK_INTERVAL: Duration = Duration::from_secs(5);

impl PoolData {
    /// Read every in-service member's labels once and act on what differs
    /// from the pool's own record of them.
    pub fn check_labels(&self) {
        let config = self.config.lock().clone();
        for (g, group) in self.groups.iter().enumerate() {
            for (m, slot) in group.slots.iter().enumerate() {
                if self.is_closing() || slot.health() == Health::Faulted {
                    continue;
                }
                let Some(attached) = slot.attached() else {
                    continue;
                };
                let expected = member_label(&config, g, m, attached.device(), slot.health());
                let found = read_stamped_labels(attached.device());
                let taker = found
                    .iter()
                    .filter_map(|copy| copy.as_ref().ok().and_then(|(_, stamp)| stamp.as_ref()))
                    .find(|stamp| self.is_foreign(stamp));
                if let Some(taker) = taker {
                    self.fault(
                        g,
                        m,
                        &format!("it was taken over by weir {}", taker.describe()),
                    );
                    continue;
                }
                let found = found.map(|copy| copy.map(|(label, _)| label));
                // A fault or replace may have moved the generation since
                // `config` was taken: only older or damaged copies count.
                let behind = |copy: &Result<Label, _>| match copy {
                    Ok(label) => {
                        label.pool_id != expected.pool_id
                            || label.device_id != expected.device_id
                            || label.generation < expected.generation
                    }
                    Err(_) => true,
                };
                let bad: Vec<usize> = (0..2).filter(|&c| behind(&found[c])).collect();
                if bad.len() == 2 {
                    self.fault(
                        g,
                        m,
                        "its labels are gone (the device was overwritten or truncated)",
                    );
                } else if !bad.is_empty() && self.config.lock().generation == expected.generation {
                    tracing::warn!(
                        pool = self.name,
                        group = g,
                        member = m,
                        "rewriting a damaged label copy"
                    );
                    let stamp = self.stamp();
                    if let Err(err) =
                        write_labels(attached.device(), &expected, stamp.as_ref(), &bad)
                    {
                        self.note_write_error(g, m, &err);
                    }
                }
            }
        }
    }

    /// Check the labels every few seconds until the pool closes.
    pub fn watch_labels(self: &Arc<Self>) {
        let pool = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("weir-labels".into())
            .spawn(move || watch(pool));
        if let Err(err) = spawned {
            tracing::error!(pool = self.name, error = %err, "cannot start the label watch");
        }
    }
}

fn watch(pool: Weak<PoolData>) {
    loop {
        std::thread::sleep(LABEL_CHECK_INTERVAL);
        let Some(pool) = pool.upgrade() else { return };
        if pool.closing.load(Ordering::SeqCst) {
            return;
        }
        pool.check_labels();
    }
}
