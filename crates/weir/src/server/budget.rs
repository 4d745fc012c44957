//! The per-connection limit on work in flight: bytes and requests. The
//! reader acquires before dispatching a request; whichever thread sends
//! the reply releases once it is on the wire. A client that pipelines
//! more than the budget simply waits, and TCP pushes back on it. Bytes
//! also come out of the server-wide budget, when there is one.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::shared_budget::{SharedBudget, Source};

pub struct Budget {
    bytes_max: u64,
    requests_max: u32,
    used: Mutex<(u64, u32)>,
    changed: Condvar,
    shared: Option<(Arc<SharedBudget>, Source)>,
}

impl Budget {
    pub fn new(bytes_max: u64, requests_max: u32) -> Budget {
        Budget {
            bytes_max,
            requests_max,
            used: Mutex::new((0, 0)),
            changed: Condvar::new(),
            shared: None,
        }
    }

    /// Bytes also count against `shared`, as `source`'s.
    pub fn within(mut self, shared: Arc<SharedBudget>, source: Source) -> Budget {
        self.shared = Some((shared, source));
        self
    }

    /// Block until `bytes` (at most `bytes_max`) fit. While they do not,
    /// `make_progress` runs unlocked (the reader sends queued replies and
    /// reaps its own ring there); it returns false when all it can do is
    /// wait for other threads, and then this sleeps until a release.
    pub fn acquire(&self, bytes: u64, mut make_progress: impl FnMut() -> bool) {
        assert!(
            bytes <= self.bytes_max,
            "request of {bytes} bytes exceeds the whole budget"
        );
        let fits =
            |used: &(u64, u32)| used.0 + bytes <= self.bytes_max && used.1 < self.requests_max;
        loop {
            let mut used = self.used.lock();
            if fits(&used) {
                used.0 += bytes;
                used.1 += 1;
                break;
            }
            drop(used);
            if make_progress() {
                continue;
            }
            let mut used = self.used.lock();
            while !fits(&used) {
                self.changed.wait(&mut used);
            }
            used.0 += bytes;
            used.1 += 1;
            break;
        }
        self.acquire_shared(bytes, make_progress);
    }

    /// Take `bytes` from the server-wide budget. Other connections' releases
    /// do not wake this reader, so it makes progress on its own requests
    /// while it has any, and sleeps on the shared budget once it has none.
    fn acquire_shared(&self, bytes: u64, mut make_progress: impl FnMut() -> bool) {
        let Some((shared, source)) = &self.shared else {
            return;
        };
        if bytes == 0 {
            return;
        }
        while !shared.try_take(*source, bytes) {
            if self.used.lock().1 <= 1 {
                return shared.take(*source, bytes);
            }
            make_progress();
        }
    }

    /// No request holds any budget: none of its replies is still to come.
    pub fn idle(&self) -> bool {
        self.used.lock().1 == 0
    }

    pub fn release(&self, bytes: u64) {
        let mut used = self.used.lock();
        assert!(
            used.0 >= bytes && used.1 > 0,
            "budget released more than acquired"
        );
        used.0 -= bytes;
        used.1 -= 1;
        drop(used);
        if let Some((shared, source)) = &self.shared {
            if bytes > 0 {
                shared.give_back(*source, bytes);
            }
        }
        self.changed.notify_all();
    }

    /// Block until nothing is in flight; `make_progress` as in `acquire`.
    pub fn wait_idle(&self, mut make_progress: impl FnMut() -> bool) {
        loop {
            if self.used.lock().1 == 0 {
                return;
            }
            if make_progress() {
                continue;
            }
            let mut used = self.used.lock();
            while used.1 > 0 {
                self.changed.wait(&mut used);
            }
            return;
        }
    }
}
