//! Client flushes (FLUSH, and FUA writes) coalesced: one flush of the
//! pool runs at a time, on a worker thread, and every flush that arrives
//! meanwhile is answered by the next one, which starts after it. A burst
//! of flushes from many connections costs two flushes and one thread, not
//! a thread each.

use std::sync::Arc;

use parking_lot::Mutex;

use super::{copy_error, PoolData};
use crate::device::{Completion, Outcome};

#[derive(Default)]
pub(super) struct FlushQueue {
    state: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    running: bool,
    flushes: Vec<Completion>,
}

impl PoolData {
    /// Make every write completed before this call durable, then run `done`.
    pub(super) fn flush_submit(self: &Arc<Self>, done: Completion) {
        let mut waiting = self.flushes.state.lock();
        waiting.flushes.push(done);
        if waiting.running {
            return;
        }
        waiting.running = true;
        let mut batch = std::mem::take(&mut waiting.flushes);
        drop(waiting);
        let mut pool = Some(Arc::clone(self));
        self.workers.run(Box::new(move || loop {
            let flushing = pool.as_ref().expect("held while flushing");
            let result = flushing.flush_all();
            let next = {
                let mut waiting = flushing.flushes.state.lock();
                if waiting.flushes.is_empty() {
                    waiting.running = false;
                    None
                } else {
                    Some(std::mem::take(&mut waiting.flushes))
                }
            };
            if next.is_none() {
                // The last reference to the pool never drops on a worker:
                // closing the pool waits for them.
                pool = None;
            }
            for done in batch.drain(..) {
                done(Outcome::done(
                    result.as_ref().map(|_| ()).map_err(copy_error),
                ));
            }
            match next {
                Some(more) => batch = more,
                None => return,
            }
        }));
    }
}
