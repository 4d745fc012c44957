//! This process's holder stamp in its members' labels (pool/holder.rs):
//! written on both copies at open, beaten on the first copy while the
//! pool is open (each beat reads both copies first), cleared on a clean
//! close. A crash leaves the stamp; the
//! next open judges it (pool/takeover.rs).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::health::member_label;
use super::{Health, PoolData};
use crate::device::Device;
use crate::pool::holder::{Holder, BEAT_INTERVAL};
use crate::pool::label::Label;
use crate::pool::members::{read_stamped_labels, write_labels};

impl PoolData {
    /// The stamp label writes carry now; None once the pool released its
    /// members.
    pub(super) fn stamp(&self) -> Option<Holder> {
        (!self.released.load(Ordering::SeqCst)).then(|| Holder {
            beat: self.beats.load(Ordering::SeqCst),
            ..self.holder.clone()
        })
    }

    /// Stamp every member's labels as this process's.
    pub(super) fn hold(&self) {
        let config = self.config.lock();
        if let Err(err) = self.rewrite_member_labels(&config) {
            tracing::warn!(pool = self.name, error = %err, "cannot stamp the members' labels");
        }
    }

    /// Clear the stamps: the members are free for anyone.
    pub(super) fn release(&self) {
        let config = self.config.lock();
        self.released.store(true, Ordering::SeqCst);
        if let Err(err) = self.rewrite_member_labels(&config) {
            tracing::warn!(pool = self.name, error = %err, "cannot clear the members' stamps");
        }
    }

    /// One heartbeat: the first label copy of every member in service,
    /// rewritten with the next beat. Under the configuration lock, so it
    /// never writes a generation a fault or replace has just left behind.
    pub fn beat(&self) {
        let mut failed = Vec::new();
        {
            let config = self.config.lock();
            self.beats.fetch_add(1, Ordering::SeqCst);
            let Some(stamp) = self.stamp() else { return };
            for (g, group) in self.groups.iter().enumerate() {
                for (m, slot) in group.slots.iter().enumerate() {
                    let health = slot.health();
                    let Some(attached) = slot.attached().filter(|_| health != Health::Faulted)
                    else {
                        continue;
                    };
                    let label = member_label(&config, g, m, attached.device(), health);
                    if !self.labels_intact(attached.device(), &label) {
                        continue;
                    }
                    if let Err(err) = write_labels(attached.device(), &label, Some(&stamp), &[0]) {
                        failed.push((g, m, err));
                    }
                }
            }
        }
        // Outside the lock: a fault takes it.
        for (g, m, err) in failed {
            self.note_write_error(g, m, &err);
        }
    }

    /// Beat every `BEAT_INTERVAL` until the pool closes.
    pub fn keep_beating(self: &Arc<Self>) {
        let pool = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("weir-beat".into())
            .spawn(move || beat_until_closed(pool));
        if let Err(err) = spawned {
            tracing::error!(pool = self.name, error = %err, "cannot start the heartbeat");
        }
    }

    /// Whether both label copies on `device` are `label` and no other
    /// process's. A beat writes over the first copy only then: never over
    /// a device truncated or overwritten behind the server, nor over
    /// another holder's stamp, which the label check must see to fault
    /// the member.
    fn labels_intact(&self, device: &dyn Device, label: &Label) -> bool {
        read_stamped_labels(device).iter().all(|copy| match copy {
            Ok((found, stamp)) => {
                found.pool_id == label.pool_id
                    && found.device_id == label.device_id
                    && found.generation == label.generation
                    && stamp.as_ref().is_none_or(|s| !self.is_foreign(s))
            }
            Err(_) => false,
        })
    }

    /// Whether `stamp`, found on a member, is another process's.
    pub(super) fn is_foreign(&self, stamp: &Holder) -> bool {
        !stamp.same_holder(&self.holder)
    }
}

fn beat_until_closed(pool: Weak<PoolData>) {
    loop {
        std::thread::sleep(BEAT_INTERVAL);
        let Some(pool) = pool.upgrade() else { return };
        if pool.closing.load(Ordering::SeqCst) {
            return;
        }
        pool.beat();
    }
}
