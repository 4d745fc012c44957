//! Client flushes (FLUSH, and FUA writes) coalesced: one flush of the
//! pool runs at a time, on a worker thread, and every flush that arrives
//! meanwhile is answered by the next one, which starts after it. A burst
//! of flushes from many connections costs two flushes and one thread, not
//! a thread each.

use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use super::PoolData;
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

fn copy_result(result: &io::Result<()>) -> io::Result<()> {
    match result {
        Ok(()) => Ok(()),
        Err(err) => Err(match err.raw_os_error() {
            Some(errno) => io::Error::from_raw_os_error(errno),
            None => io::Error::new(err.kind(), err.to_string()),
        }),
    }
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
                done(Outcome::done(copy_result(&result)));
            }
            match next {
                Some(more) => batch = more,
                None => return,
            }
        }));
    }
}
