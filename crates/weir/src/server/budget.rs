//! The per-connection limit on work in flight: bytes and requests. The
//! reader acquires before dispatching a request; whichever thread sends
//! the reply releases once it is on the wire. A client that pipelines
//! more than the budget simply waits, and TCP pushes back on it. Bytes
//! also come out of the server-wide budget, when there is one.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::shared_budget::{SharedBudget, Source};

/// How long a reader waiting for the shared budget sleeps between tending
/// the replies it holds for others (the write-back cache's pauses).
const SHARED_WAIT_SLICE: std::time::Duration = std::time::Duration::from_millis(1);

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
    /// `tend` must not block: it releases what the thread holds for other
    /// connections (see `acquire_shared`).
    pub fn acquire(&self, bytes: u64, mut make_progress: impl FnMut() -> bool, tend: impl FnMut()) {
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
        self.acquire_shared(bytes, make_progress, tend);
    }

    /// Take `bytes` from the server-wide budget. Other connections' releases
    /// do not wake this reader, so it makes progress on its own requests
    /// while it has any. Once it has none, it waits on the shared budget a
    /// slice at a time and tends between slices: replies it holds for other
    /// connections may be what holds the bytes it waits for.
    fn acquire_shared(
        &self,
        bytes: u64,
        mut make_progress: impl FnMut() -> bool,
        mut tend: impl FnMut(),
    ) {
        let Some((shared, source)) = &self.shared else {
            return;
        };
        if bytes == 0 {
            return;
        }
        while !shared.try_take(*source, bytes) {
            if self.used.lock().1 > 1 {
                make_progress();
                continue;
            }
            if shared.take_within(*source, bytes, SHARED_WAIT_SLICE) {
                return;
            }
            tend();
        }
    }

    /// No request holds any budget: none of its replies is still to come.
    pub fn idle(&self) -> bool {
        self.used.lock().1 == 0
    }

    /// A request's reply is sent: its bytes and the request come back.
    pub fn release(&self, bytes: u64) {
        self.give_back(bytes, 1);
    }

    /// Part of a request's bytes come back (a read answered in pieces);
    /// the request still holds the rest.
    pub fn release_bytes(&self, bytes: u64) {
        self.give_back(bytes, 0);
    }

    fn give_back(&self, bytes: u64, requests: u32) {
        let mut used = self.used.lock();
        assert!(
            used.0 >= bytes && used.1 >= requests.max(1),
            "budget released more than acquired"
        );
        used.0 -= bytes;
        used.1 -= requests;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_reader_with_nothing_in_flight_tends_while_it_waits_for_the_shared_budget() {
        // Another source holds the shared budget with replies this thread
        // holds for it: only tending them frees what this request needs.
        let shared = Arc::new(SharedBudget::new(400, 100));
        let other = Source::Address("10.0.0.9".parse().unwrap());
        assert!(shared.try_take(other, 100));
        assert!(shared.try_take(Source::Address("10.0.0.8".parse().unwrap()), 100));
        assert!(shared.try_take(Source::Address("10.0.0.7".parse().unwrap()), 100));
        assert!(shared.try_take(Source::Address("10.0.0.6".parse().unwrap()), 100));
        let budget = Budget::new(1000, 8).within(Arc::clone(&shared), Source::Local);
        let tended = Cell::new(0);
        let tend = || {
            tended.set(tended.get() + 1);
            if tended.get() == 3 {
                shared.give_back(other, 100);
            }
        };
        budget.acquire(100, || panic!("nothing of ours to progress"), tend);
        assert_eq!(tended.get(), 3);
        assert_eq!(shared.used_bytes(), 400);
        budget.release(100);
        assert_eq!(shared.used_bytes(), 300);
    }
}
