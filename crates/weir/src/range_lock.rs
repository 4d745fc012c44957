//! Byte-range locks that never block the thread that asks for them.
//!
//! Two users: the volume layer keeps read-modify-write atomic (an unaligned
//! write reads whole blocks, patches them and writes them back; a write to
//! the same blocks in between would be lost), so plain writes hold their
//! range shared and read-modify-write holds it exclusive. A pool keeps
//! each chunk's copies and checksums in step: a write holds its chunks
//! exclusive from before its device writes until its checksums are
//! updated, and reads, scrub and resilver hold them shared or exclusive.
//!
//! Nobody waits on a lock: [`RangeLocks::lock_then`] runs its continuation
//! at once, or later on the thread that releases the conflicting range.
//! A connection thread that slept on a lock could not reap the ring that
//! holds the very I/O it waits for, and it could not read the requests
//! behind it either. Background threads that do nothing else may wait
//! with [`RangeLocks::lock_blocking`]. Waiters are granted in arrival
//! order among those that overlap, so a stream of shared holders cannot
//! starve an exclusive one.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

/// What runs once a range is held; the guard releases it.
pub type Granted = Box<dyn FnOnce(RangeGuard) + Send>;

#[derive(Clone, Copy, Debug)]
struct Range {
    start: u64,
    end: u64,
    exclusive: bool,
}

impl Range {
    fn conflicts(&self, other: &Range) -> bool {
        self.start < other.end && other.start < self.end && (self.exclusive || other.exclusive)
    }
}

struct Waiter {
    range: Range,
    granted: Granted,
}

#[derive(Default)]
struct Table {
    held: Vec<(u64, Range)>,
    waiting: VecDeque<Waiter>,
    next_id: u64,
}

impl Table {
    fn hold(&mut self, locks: &Arc<RangeLocks>, range: Range) -> RangeGuard {
        let id = self.next_id;
        self.next_id += 1;
        self.held.push((id, range));
        RangeGuard {
            locks: Arc::clone(locks),
            id,
        }
    }

    fn blocked(&self, range: &Range, earlier_waiters: usize) -> bool {
        self.held.iter().any(|(_, h)| h.conflicts(range))
            || self
                .waiting
                .iter()
                .take(earlier_waiters)
                .any(|w| w.range.conflicts(range))
    }
}

#[derive(Default)]
pub struct RangeLocks {
    table: Mutex<Table>,
}

/// Releases its range when dropped (typically on I/O completion), which
/// may start waiters' continuations on the dropping thread.
pub struct RangeGuard {
    locks: Arc<RangeLocks>,
    id: u64,
}

impl RangeLocks {
    /// Run `granted` once `[start, end)` is held in the given mode: now, if
    /// nothing in the way holds or waits for it, else when it is released.
    pub fn lock_then(self: &Arc<Self>, start: u64, end: u64, exclusive: bool, granted: Granted) {
        assert!(start < end, "empty lock range {start}..{end}");
        let range = Range {
            start,
            end,
            exclusive,
        };
        let mut table = self.table.lock();
        let waiters = table.waiting.len();
        if table.blocked(&range, waiters) {
            table.waiting.push_back(Waiter { range, granted });
            return;
        }
        let guard = table.hold(self, range);
        drop(table);
        run_granted(vec![(guard, granted)]);
    }

    /// Hold `[start, end)`, waiting on this thread until it is granted.
    /// Only for threads that own no ring and hold no other range lock
    /// (background work, tests): anyone else uses `lock_then`.
    pub fn lock_blocking(self: &Arc<Self>, start: u64, end: u64, exclusive: bool) -> RangeGuard {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        self.lock_then(
            start,
            end,
            exclusive,
            Box::new(move |guard| drop(sender.send(guard))),
        );
        receiver.recv().expect("every waiter is granted")
    }

    /// Ranges held and waiting (for tests and debugging).
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let table = self.table.lock();
        (table.held.len(), table.waiting.len())
    }
}

impl Drop for RangeGuard {
    fn drop(&mut self) {
        let mut table = self.locks.table.lock();
        let index = table
            .held
            .iter()
            .position(|(id, _)| *id == self.id)
            .expect("held range lock");
        table.held.swap_remove(index);
        let mut granted = Vec::new();
        let mut i = 0;
        while i < table.waiting.len() {
            let range = table.waiting[i].range;
            if table.blocked(&range, i) {
                i += 1;
                continue;
            }
            let waiter = table.waiting.remove(i).expect("index in range");
            let guard = table.hold(&self.locks, range);
            granted.push((guard, waiter.granted));
        }
        drop(table);
        run_granted(granted);
    }
}

/// Range locks split into shards by key, so that requests to different
/// places rarely meet on one mutex: the keys `[k * span, (k + 1) * span)`
/// belong to shard `k % shards`. A range across spans takes its parts one
/// after another in key order, so two requests never each hold a part the
/// other waits for.
pub struct ShardedRangeLocks {
    shards: Vec<Arc<RangeLocks>>,
    span: u64,
}

/// Every part of a range held in a [`ShardedRangeLocks`].
pub struct ShardedGuard {
    _parts: Vec<RangeGuard>,
}

pub type ShardedGranted = Box<dyn FnOnce(ShardedGuard) + Send>;

impl ShardedRangeLocks {
    pub fn new(shards: usize, span: u64) -> ShardedRangeLocks {
        assert!(shards > 0 && span > 0);
        ShardedRangeLocks {
            shards: (0..shards).map(|_| Arc::default()).collect(),
            span,
        }
    }

    /// Run `granted` once every key of `[start, end)` is held.
    pub fn lock_then(&self, start: u64, end: u64, exclusive: bool, granted: ShardedGranted) {
        assert!(start < end, "empty lock range {start}..{end}");
        let mut parts = VecDeque::new();
        let mut at = start;
        while at < end {
            let span_index = at / self.span;
            let part_end = ((span_index + 1) * self.span).min(end);
            let shard = &self.shards[(span_index % self.shards.len() as u64) as usize];
            parts.push_back((Arc::clone(shard), at, part_end));
            at = part_end;
        }
        acquire_parts(parts, Vec::new(), exclusive, granted);
    }

    /// Hold `[start, end)`, waiting on this thread: see
    /// [`RangeLocks::lock_blocking`] for who may.
    pub fn lock_blocking(&self, start: u64, end: u64, exclusive: bool) -> ShardedGuard {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        self.lock_then(
            start,
            end,
            exclusive,
            Box::new(move |guard| drop(sender.send(guard))),
        );
        receiver.recv().expect("every waiter is granted")
    }
}

fn acquire_parts(
    mut parts: VecDeque<(Arc<RangeLocks>, u64, u64)>,
    mut held: Vec<RangeGuard>,
    exclusive: bool,
    granted: ShardedGranted,
) {
    let Some((locks, start, end)) = parts.pop_front() else {
        return granted(ShardedGuard { _parts: held });
    };
    locks.lock_then(
        start,
        end,
        exclusive,
        Box::new(move |guard| {
            held.push(guard);
            acquire_parts(parts, held, exclusive, granted)
        }),
    );
}

thread_local! {
    /// Continuations granted on this thread while it is already running
    /// one: a chain of read-modify-writes that complete inline (a memory
    /// device) would otherwise nest one stack frame per waiter.
    static GRANTS_PENDING: RefCell<Option<VecDeque<(RangeGuard, Granted)>>> =
        const { RefCell::new(None) };
}

fn run_granted(granted: Vec<(RangeGuard, Granted)>) {
    if granted.is_empty() {
        return;
    }
    let mut granted = Some(granted);
    let outermost = GRANTS_PENDING.with(|pending| {
        let mut pending = pending.borrow_mut();
        let granted = granted.take().expect("taken once");
        match pending.as_mut() {
            Some(queue) => {
                queue.extend(granted);
                false
            }
            None => {
                *pending = Some(granted.into());
                true
            }
        }
    });
    if !outermost {
        return;
    }
    while let Some((guard, continuation)) = GRANTS_PENDING.with(|pending| {
        pending
            .borrow_mut()
            .as_mut()
            .expect("the outermost call owns the queue")
            .pop_front()
    }) {
        continuation(guard);
    }
    GRANTS_PENDING.with(|pending| *pending.borrow_mut() = None);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Locks `[start, end)` and sends its guard on the channel once held.
    fn take(
        locks: &Arc<RangeLocks>,
        start: u64,
        end: u64,
        exclusive: bool,
    ) -> mpsc::Receiver<RangeGuard> {
        let (tx, rx) = mpsc::channel();
        locks.lock_then(
            start,
            end,
            exclusive,
            Box::new(move |guard| tx.send(guard).unwrap()),
        );
        rx
    }

    #[test]
    fn shared_locks_overlap() {
        let locks = Arc::new(RangeLocks::default());
        let _a = take(&locks, 0, 100, false).try_recv().unwrap();
        let _b = take(&locks, 50, 150, false).try_recv().unwrap();
    }

    #[test]
    fn exclusive_waits_for_overlapping_holders_and_runs_on_release() {
        let locks = Arc::new(RangeLocks::default());
        let first = take(&locks, 0, 4096, false).try_recv().unwrap();
        let waiter = take(&locks, 0, 8192, true);
        assert!(
            waiter.try_recv().is_err(),
            "must wait for the shared holder"
        );
        assert_eq!(locks.counts(), (1, 1));
        drop(first);
        let _held = waiter.try_recv().expect("granted on release");
        assert_eq!(locks.counts(), (1, 0));
    }

    #[test]
    fn disjoint_exclusive_locks_do_not_wait() {
        let locks = Arc::new(RangeLocks::default());
        let _a = take(&locks, 0, 4096, true).try_recv().unwrap();
        let _b = take(&locks, 4096, 8192, true).try_recv().unwrap();
    }

    #[test]
    fn a_waiting_exclusive_lock_is_not_overtaken_by_later_shared_ones() {
        let locks = Arc::new(RangeLocks::default());
        let reader = take(&locks, 0, 4096, false).try_recv().unwrap();
        let exclusive = take(&locks, 0, 4096, true);
        let later = take(&locks, 0, 4096, false);
        let elsewhere = take(&locks, 8192, 12288, false);
        assert!(later.try_recv().is_err(), "queued behind the exclusive one");
        let _elsewhere = elsewhere.try_recv().expect("no overlap, no wait");
        drop(reader);
        let held = exclusive.try_recv().expect("first in line");
        assert!(later.try_recv().is_err());
        drop(held);
        later.try_recv().expect("then the shared one");
    }

    #[test]
    fn a_long_chain_of_waiters_runs_without_nesting() {
        // Each continuation releases at once, granting the next waiter on
        // the same thread. Without the trampoline that would nest 10k
        // frames deep, more than this thread's 256 KiB stack holds.
        let run = || {
            let locks = Arc::new(RangeLocks::default());
            let first = take(&locks, 0, 4096, true).try_recv().unwrap();
            let (tx, rx) = mpsc::channel();
            for i in 0..10_000u32 {
                let tx = tx.clone();
                locks.lock_then(
                    0,
                    4096,
                    true,
                    Box::new(move |guard| {
                        tx.send(i).unwrap();
                        drop(guard);
                    }),
                );
            }
            drop(first);
            let order: Vec<u32> = rx.try_iter().collect();
            assert_eq!(order, (0..10_000).collect::<Vec<_>>(), "all, in order");
            assert_eq!(locks.counts(), (0, 0));
        };
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(run)
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn sharded_ranges_across_spans_exclude_each_other_and_never_deadlock() {
        let locks = Arc::new(ShardedRangeLocks::new(4, 16));
        // Spans 0-2 (shards 0, 1, 2), and spans 2-5 (shards 2, 3, 0, 1).
        let first = locks.lock_blocking(10, 40, true);
        let (tx, rx) = mpsc::channel();
        locks.lock_then(35, 90, true, Box::new(move |guard| tx.send(guard).unwrap()));
        assert!(rx.try_recv().is_err(), "overlaps in span 2");
        let _disjoint = locks.lock_blocking(64, 70, false);
        drop(first);
        assert!(rx.try_recv().is_err(), "still waits for the shared range");
        drop(_disjoint);
        let _second = rx.try_recv().expect("granted once both are released");
        // Many threads taking ranges over the same spans in both orders.
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let locks = Arc::clone(&locks);
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let start = (i * 7 + t * 13) % 200 + 100;
                        let _held = locks.lock_blocking(start, start + 1 + i % 40, i % 3 != 0);
                    }
                })
            })
            .collect();
        drop(_second);
        for thread in threads {
            thread.join().unwrap();
        }
    }

    #[test]
    fn releases_on_other_threads_grant_waiters() {
        let locks = Arc::new(RangeLocks::default());
        let first = take(&locks, 0, 4096, true).try_recv().unwrap();
        let waiter = take(&locks, 100, 200, true);
        std::thread::spawn(move || drop(first)).join().unwrap();
        waiter
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("granted by the other thread's release");
    }
}
