//! Replies held for the budget's pause, released in time order.
//!
//! A write answered from the cache past half the budget has its reply held
//! for a pause (see `budget`). On a connection thread that has entered
//! [`LocalPauses`], the reply waits in that thread's own list: the thread
//! releases what is due whenever it would otherwise block, and blocks no
//! longer than the next release. The reply then leaves on the thread that
//! read the request, with no handoff to another thread and back. Anywhere
//! else, the flusher thread holds it.

use std::cell::RefCell;
use std::collections::BinaryHeap;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

/// Replies due within this much of each other are released together (a
/// pause is tens of microseconds to 100 ms; this is the pacing's timer
/// slack).
pub const RELEASE_SLACK: Duration = Duration::from_millis(1);

pub type Reply = Box<dyn FnOnce() + Send>;

/// One held reply.
struct Paused {
    at: Instant,
    seq: u64,
    reply: Reply,
}

impl PartialEq for Paused {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Paused {}
impl PartialOrd for Paused {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Paused {
    /// Earliest first in a max-heap.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Held replies, earliest first.
#[derive(Default)]
pub struct PausedReplies {
    heap: BinaryHeap<Paused>,
    seq: u64,
}

impl PausedReplies {
    pub fn hold(&mut self, at: Instant, reply: Reply) {
        self.seq += 1;
        self.heap.push(Paused {
            at,
            seq: self.seq,
            reply,
        });
    }

    /// When the earliest is due.
    pub fn next_at(&self) -> Option<Instant> {
        self.heap.peek().map(|p| p.at)
    }

    /// Take every reply due by `by`.
    pub fn take_due(&mut self, by: Instant) -> Vec<Reply> {
        let mut due = Vec::new();
        while self.heap.peek().is_some_and(|p| p.at <= by) {
            due.push(self.heap.pop().expect("peeked").reply);
        }
        due
    }

    /// Take every reply, earliest first.
    pub fn take_all(&mut self) -> Vec<Reply> {
        // Sorted ascending by `Ord`, which puts the earliest last.
        let mut all = std::mem::take(&mut self.heap).into_sorted_vec();
        all.reverse();
        all.into_iter().map(|p| p.reply).collect()
    }
}

thread_local! {
    static LOCAL: RefCell<Option<PausedReplies>> = const { RefCell::new(None) };
}

/// While this lives, paused replies of writes made on this thread are held
/// by this thread, which must call [`release_due`](Self::release_due)
/// before it blocks and block no longer than the time it returns.
pub struct LocalPauses {
    _on_this_thread: PhantomData<*const ()>,
}

impl LocalPauses {
    pub fn enter() -> LocalPauses {
        LOCAL.with(|local| *local.borrow_mut() = Some(PausedReplies::default()));
        LocalPauses {
            _on_this_thread: PhantomData,
        }
    }

    /// Run the replies due now (within the slack); returns when the next
    /// one is due.
    pub fn release_due(&self) -> Option<Instant> {
        let (due, next) = LOCAL.with(|local| {
            let mut local = local.borrow_mut();
            let held = local.as_mut().expect("entered");
            (
                held.take_due(Instant::now() + RELEASE_SLACK),
                held.next_at(),
            )
        });
        for reply in due {
            reply();
        }
        next
    }
}

impl Drop for LocalPauses {
    /// Whatever is still held is answered now: nothing is dropped.
    fn drop(&mut self) {
        let left = LOCAL.with(|local| local.borrow_mut().take().map(|mut h| h.take_all()));
        for reply in left.into_iter().flatten() {
            reply();
        }
    }
}

/// Hold `reply` until `at` on this thread, if it has entered
/// [`LocalPauses`]; else hand it back.
pub(super) fn hold_here(at: Instant, reply: Reply) -> Result<(), Reply> {
    LOCAL.with(|local| match local.borrow_mut().as_mut() {
        Some(held) => {
            held.hold(at, reply);
            Ok(())
        }
        None => Err(reply),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_thread_that_entered_releases_its_replies_in_time_order_and_all_on_exit() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let pauses = LocalPauses::enter();
        let now = Instant::now();
        for (i, ms) in [(1, 500u64), (2, 0), (3, 300)] {
            let order = Arc::clone(&order);
            let reply: Reply = Box::new(move || order.lock().unwrap().push(i));
            assert!(hold_here(now + Duration::from_millis(ms), reply).is_ok());
        }
        let next = pauses.release_due().expect("two still held");
        assert_eq!(*order.lock().unwrap(), vec![2]);
        assert_eq!(next, now + Duration::from_millis(300));
        drop(pauses);
        assert_eq!(*order.lock().unwrap(), vec![2, 3, 1]);
        // Without a guard the reply is handed back for someone else to hold.
        assert!(hold_here(now, Box::new(|| {})).is_err());
    }
}
