//! The server-wide limit on request and reply bytes in flight, across
//! every connection, with a share per client address.
//!
//! Each connection's own budget bounds what one client holds (twice the
//! largest request); this bounds them all together, so a flood of large
//! requests on many connections cannot take more memory than the limit.
//! One address (or all Unix-socket clients together) may hold at most a
//! quarter of it, and the last quarter is kept for sources holding less
//! than one largest request: clients that stop reading their replies keep
//! their bytes until they read, and those of a few hosts must not block
//! the rest.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// The largest share of the limit one source may hold.
const SOURCE_SHARE_DIVISOR: u64 = 4;

/// Whose bytes they are.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Source {
    Address(IpAddr),
    /// Clients on the Unix socket.
    Local,
}

impl Source {
    pub fn of(address: Option<IpAddr>) -> Source {
        address.map_or(Source::Local, Source::Address)
    }
}

#[derive(Default)]
struct Used {
    total: u64,
    by_source: HashMap<Source, u64>,
}

pub struct SharedBudget {
    bytes_max: u64,
    source_bytes_max: u64,
    /// Only sources holding at most `light_bytes_max` take from the last
    /// `reserve_bytes`.
    reserve_bytes: u64,
    light_bytes_max: u64,
    used: Mutex<Used>,
    changed: Condvar,
}

impl SharedBudget {
    /// `bytes_max` must hold at least four of the largest request,
    /// `request_bytes_max`.
    pub fn new(bytes_max: u64, request_bytes_max: u64) -> SharedBudget {
        assert!(bytes_max / SOURCE_SHARE_DIVISOR >= request_bytes_max);
        SharedBudget {
            bytes_max,
            source_bytes_max: bytes_max / SOURCE_SHARE_DIVISOR,
            reserve_bytes: bytes_max / SOURCE_SHARE_DIVISOR,
            light_bytes_max: request_bytes_max,
            used: Mutex::new(Used::default()),
            changed: Condvar::new(),
        }
    }

    fn fits(&self, used: &Used, source: Source, bytes: u64) -> bool {
        let mine = used.by_source.get(&source).copied().unwrap_or(0);
        let total = used.total + bytes;
        if total > self.bytes_max || mine + bytes > self.source_bytes_max {
            return false;
        }
        total <= self.bytes_max - self.reserve_bytes || mine + bytes <= self.light_bytes_max
    }

    fn take_locked(used: &mut Used, source: Source, bytes: u64) {
        used.total += bytes;
        *used.by_source.entry(source).or_insert(0) += bytes;
    }

    /// Take `bytes` if they fit now.
    pub fn try_take(&self, source: Source, bytes: u64) -> bool {
        let mut used = self.used.lock();
        if !self.fits(&used, source, bytes) {
            return false;
        }
        Self::take_locked(&mut used, source, bytes);
        true
    }

    /// Take `bytes`, waiting up to `limit` for other connections to give
    /// some back; false if they still do not fit.
    pub fn take_within(&self, source: Source, bytes: u64, limit: Duration) -> bool {
        assert!(
            bytes <= self.source_bytes_max,
            "a request of {bytes} bytes exceeds one source's share"
        );
        let deadline = Instant::now() + limit;
        let mut used = self.used.lock();
        while !self.fits(&used, source, bytes) {
            if self.changed.wait_until(&mut used, deadline).timed_out() {
                return false;
            }
        }
        Self::take_locked(&mut used, source, bytes);
        true
    }

    pub fn give_back(&self, source: Source, bytes: u64) {
        let mut used = self.used.lock();
        assert!(used.total >= bytes, "gave back more than taken");
        used.total -= bytes;
        let mine = used
            .by_source
            .get_mut(&source)
            .expect("given back by a source that took nothing");
        assert!(*mine >= bytes, "gave back more than taken");
        *mine -= bytes;
        if *mine == 0 {
            used.by_source.remove(&source);
        }
        drop(used);
        self.changed.notify_all();
    }

    /// Bytes held now, by everyone.
    pub fn used_bytes(&self) -> u64 {
        self.used.lock().total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn address(text: &str) -> Source {
        Source::Address(text.parse().unwrap())
    }

    #[test]
    fn one_source_gets_a_quarter_and_light_sources_keep_the_last_quarter() {
        let budget = SharedBudget::new(400, 40);
        let a = address("10.0.0.1");
        assert!(budget.try_take(a, 100));
        assert!(!budget.try_take(a, 1), "a's share is 100");
        for source in ["10.0.0.2", "10.0.0.3"] {
            assert!(budget.try_take(address(source), 100), "{source}");
        }
        // 300 taken: the rest is for sources holding at most 40.
        assert!(!budget.try_take(address("10.0.0.4"), 41));
        for source in ["10.0.0.4", "10.0.0.5"] {
            assert!(budget.try_take(address(source), 40), "{source}");
        }
        assert!(!budget.try_take(address("10.0.0.4"), 1), "now holding 40");
        assert!(budget.try_take(Source::Local, 20));
        assert!(!budget.try_take(address("10.0.0.6"), 1), "the whole is 400");
        budget.give_back(a, 100);
        // 300 held again: heavy requests still wait, light ones go in.
        assert!(!budget.try_take(address("10.0.0.6"), 41));
        assert!(budget.try_take(address("10.0.0.6"), 40));
        assert_eq!(budget.used_bytes(), 340);
    }

    #[test]
    fn take_waits_until_another_connection_gives_back() {
        let budget = Arc::new(SharedBudget::new(400, 40));
        let a = address("10.0.0.1");
        assert!(budget.try_take(a, 100));
        assert!(!budget.take_within(a, 50, Duration::from_millis(20)));
        let waiter = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || budget.take_within(a, 50, Duration::from_secs(60)))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "the share is full");
        budget.give_back(a, 60);
        assert!(waiter.join().unwrap());
        assert_eq!(budget.used_bytes(), 90);
    }
}
