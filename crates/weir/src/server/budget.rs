//! The per-connection limit on work in flight: bytes and requests. The
//! reader acquires before dispatching a request; the reply writer releases
//! once the reply is on the wire. A client that pipelines more than the
//! budget simply waits, and TCP pushes back on it.

use parking_lot::{Condvar, Mutex};

pub struct Budget {
    bytes_max: u64,
    requests_max: u32,
    used: Mutex<(u64, u32)>,
    changed: Condvar,
}

impl Budget {
    pub fn new(bytes_max: u64, requests_max: u32) -> Budget {
        Budget {
            bytes_max,
            requests_max,
            used: Mutex::new((0, 0)),
            changed: Condvar::new(),
        }
    }

    /// Block until `bytes` (at most `bytes_max`) fit. `before_wait` runs
    /// once, unlocked, if the caller must wait (the reader uses it to send
    /// the replies that will free the budget).
    pub fn acquire(&self, bytes: u64, before_wait: impl FnOnce()) {
        assert!(
            bytes <= self.bytes_max,
            "request of {bytes} bytes exceeds the whole budget"
        );
        let fits =
            |used: &(u64, u32)| used.0 + bytes <= self.bytes_max && used.1 < self.requests_max;
        let mut used = self.used.lock();
        if !fits(&used) {
            drop(used);
            before_wait();
            used = self.used.lock();
            while !fits(&used) {
                self.changed.wait(&mut used);
            }
        }
        used.0 += bytes;
        used.1 += 1;
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
        self.changed.notify_all();
    }

    /// Block until nothing is in flight.
    pub fn wait_idle(&self) {
        let mut used = self.used.lock();
        while used.1 > 0 {
            self.changed.wait(&mut used);
        }
    }
}
