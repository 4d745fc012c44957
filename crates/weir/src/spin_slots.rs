//! How many threads may busy-poll at once: one per CPU beyond the first.
//!
//! A thread that polls for a completion or a client's next request instead
//! of sleeping saves a wake-up only while a CPU has nothing else to do.
//! Each thread's own measurement (`server::spin_trial`, `idle_spin`) sees
//! its own gain, not what its polling takes from the others, so with many
//! connections on few CPUs every thread polls and the CPUs go to polling:
//! 4 KiB random writes from 32 connections on a 2-vCPU VM spent 9% of the
//! server's CPU time polling. A thread that finds no slot free sleeps at
//! once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// A count of polling threads under a bound.
struct Slots {
    polling: AtomicUsize,
    bound: usize,
}

impl Slots {
    fn try_take(&'static self) -> Option<SpinSlot> {
        self.polling
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.bound).then_some(n + 1)
            })
            .ok()
            .map(|_| SpinSlot { slots: self })
    }
}

/// The right to poll; the slot frees when it drops.
pub struct SpinSlot {
    slots: &'static Slots,
}

impl Drop for SpinSlot {
    fn drop(&mut self) {
        self.slots.polling.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A slot if one is free. The bound is every CPU but one, which is left
/// to the threads a poller waits for (the client, the kernel's I/O
/// workers); with one CPU, no one polls.
pub fn try_take() -> Option<SpinSlot> {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    SLOTS
        .get_or_init(|| Slots {
            polling: AtomicUsize::new(0),
            bound: std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .saturating_sub(1),
        })
        .try_take()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_and_freed_on_drop() {
        static TWO: Slots = Slots {
            polling: AtomicUsize::new(0),
            bound: 2,
        };
        let first = TWO.try_take().expect("a free slot");
        let second = TWO.try_take().expect("a second free slot");
        assert!(TWO.try_take().is_none(), "every slot taken");
        drop(first);
        let third = TWO.try_take().expect("a dropped slot is free again");
        assert!(TWO.try_take().is_none());
        drop((second, third));
        assert_eq!(TWO.polling.load(Ordering::Relaxed), 0);
    }
}
