//! Byte-range locks that keep read-modify-write atomic.
//!
//! An unaligned write reads whole blocks, patches them and writes them
//! back; a concurrent write to the same blocks in between would be lost.
//! So every write holds its aligned range: plain writes in shared mode
//! (they may overlap each other, as the client allows), read-modify-write
//! in exclusive mode.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

#[derive(Clone, Copy, Debug)]
struct Held {
    id: u64,
    start: u64,
    end: u64,
    exclusive: bool,
}

#[derive(Default)]
struct Table {
    held: Vec<Held>,
    next_id: u64,
}

#[derive(Default)]
pub struct RangeLocks {
    table: Mutex<Table>,
    released: Condvar,
}

/// Releases its range when dropped (typically on I/O completion).
pub struct RangeGuard {
    locks: Arc<RangeLocks>,
    id: u64,
}

impl RangeLocks {
    /// Block until `[start, end)` can be held in the given mode.
    pub fn lock(self: &Arc<Self>, start: u64, end: u64, exclusive: bool) -> RangeGuard {
        assert!(start < end, "empty lock range {start}..{end}");
        let mut table = self.table.lock();
        while table
            .held
            .iter()
            .any(|h| h.start < end && start < h.end && (exclusive || h.exclusive))
        {
            self.released.wait(&mut table);
        }
        let id = table.next_id;
        table.next_id += 1;
        table.held.push(Held {
            id,
            start,
            end,
            exclusive,
        });
        RangeGuard {
            locks: Arc::clone(self),
            id,
        }
    }
}

impl Drop for RangeGuard {
    fn drop(&mut self) {
        let mut table = self.locks.table.lock();
        let index = table
            .held
            .iter()
            .position(|h| h.id == self.id)
            .expect("held range lock");
        table.held.swap_remove(index);
        drop(table);
        self.locks.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn shared_locks_overlap() {
        let locks = Arc::new(RangeLocks::default());
        let _a = locks.lock(0, 100, false);
        let _b = locks.lock(50, 150, false);
    }

    #[test]
    fn exclusive_waits_for_overlapping_holders() {
        let locks = Arc::new(RangeLocks::default());
        let first = locks.lock(0, 4096, false);
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let locks = Arc::clone(&locks);
            std::thread::spawn(move || {
                let _g = locks.lock(0, 8192, true);
                tx.send(()).unwrap();
            })
        };
        assert!(
            rx.recv_timeout(Duration::from_millis(100)).is_err(),
            "must wait for the shared holder"
        );
        drop(first);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("granted after release");
        waiter.join().unwrap();
    }

    #[test]
    fn disjoint_exclusive_locks_do_not_wait() {
        let locks = Arc::new(RangeLocks::default());
        let _a = locks.lock(0, 4096, true);
        let _b = locks.lock(4096, 8192, true);
    }
}
