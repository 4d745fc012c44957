//! How long a thread polls for work before it goes to sleep.
//!
//! Waking a sleeping thread is slow where it matters most: on a virtual
//! machine an idle vCPU halts, and the wake-up is an IPI and a host
//! reschedule, tens of microseconds. A reader whose client answers within a
//! few microseconds (queue depth 1, a fast device) spends most of each
//! request asleep. Polling briefly first avoids that, but burns CPU when
//! work is far away, so the window adapts to what the waits measured
//! (the same idea as QEMU's adaptive `aio-poll`, written from its
//! description): a wait that ends just past the window widens it, one that
//! ends far past the maximum narrows it, down to not polling at all.
//!
//! Sans-IO: callers measure the waits and report them.

use std::time::Duration;

/// The most a thread polls before sleeping. It bounds the CPU burned per
/// wait; waits longer than this are not worth polling for. Measured on a
/// 2-vCPU VM with fio's nbd engine at queue depth 1: the client's turnaround
/// (reply received to next request sent) is 30-90 us there, so 50 us caught
/// too few of them and 100 us most.
pub const WINDOW_MAX: Duration = Duration::from_micros(100);
/// The first window tried after not polling.
const WINDOW_START: Duration = Duration::from_micros(4);

#[derive(Debug, Default)]
pub struct IdleSpin {
    window: Duration,
}

impl IdleSpin {
    /// Poll for this long before sleeping.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// A wait ended after `waited` (polling included).
    pub fn record(&mut self, waited: Duration) {
        if waited <= self.window {
            // Polling caught it.
        } else if waited > WINDOW_MAX {
            // Work is far apart: polling only burns CPU.
            self.window /= 2;
            if self.window < WINDOW_START {
                self.window = Duration::ZERO;
            }
        } else {
            // Just missed: a wider window would have caught it.
            self.window = (self.window * 2).clamp(WINDOW_START, WINDOW_MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn starts_without_polling() {
        assert_eq!(IdleSpin::default().window(), Duration::ZERO);
    }

    #[test]
    fn grows_to_cover_short_waits_and_stays() {
        let mut spin = IdleSpin::default();
        for _ in 0..10 {
            spin.record(us(20));
        }
        assert!(spin.window() >= us(20), "window {:?}", spin.window());
        assert!(spin.window() <= WINDOW_MAX);
        let settled = spin.window();
        spin.record(us(10));
        assert_eq!(spin.window(), settled, "a caught wait changes nothing");
    }

    #[test]
    fn never_exceeds_the_maximum() {
        let mut spin = IdleSpin::default();
        for _ in 0..100 {
            spin.record(WINDOW_MAX);
        }
        assert_eq!(spin.window(), WINDOW_MAX);
    }

    #[test]
    fn long_waits_turn_polling_off() {
        let mut spin = IdleSpin::default();
        for _ in 0..10 {
            spin.record(us(30));
        }
        for _ in 0..10 {
            spin.record(Duration::from_millis(5));
        }
        assert_eq!(spin.window(), Duration::ZERO);
    }
}
