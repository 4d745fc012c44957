//! Whether a connection thread polls its ring for device completions
//! before it sleeps, decided by trying both.
//!
//! Polling helps or hurts depending on things the server cannot see. On
//! the 2-vCPU VM measured, 4 KiB random reads at depth 32 from a file went
//! from about 0.6 to about 0.78 of fio's own io_uring rate when the thread
//! polled for up to 200 us (it takes each batch of completions without a
//! wake-up), while reads at depth 1 lost 30% and at depth 8 15% (the
//! polling vCPU takes CPU time from the host's emulation of the disk).
//! No depth or latency threshold separates the two reliably, so the
//! thread measures: it alternates short epochs with and without polling
//! (A B B A, which cancels a steady drift), keeps whichever completed more
//! ops per second, and tries again after a while. The other arm must win
//! by a margin to replace the one in use.
//!
//! Sans-IO: the caller reports completed ops with the time, and asks for
//! the window.

use std::time::{Duration, Instant};

/// How long a polling thread watches its ring before it sleeps. It bounds
/// the CPU burned per wait.
pub const WINDOW: Duration = Duration::from_micros(200);
/// One epoch of a trial. Switching leaves an after-effect: measured in
/// 20 ms epochs, sleeping right after polling ran 30% slower than
/// sleeping alone at depth 1, and polling looked like the winner. So each
/// epoch first lets the switch settle for `WARMUP`, uncounted, and then
/// counts for the rest.
const EPOCH: Duration = Duration::from_millis(150);
const WARMUP: Duration = Duration::from_millis(50);
/// Which arm (polling or not) each epoch of a trial runs.
const TRIAL_ORDER: [bool; 4] = [false, true, true, false];
/// How long a decision holds before the next trial. A trial spends half
/// its time on the losing arm, so it should be a small part of this.
const SETTLE: Duration = Duration::from_secs(5);
/// The other arm must complete this much more per second to replace the
/// one in use: a thread that sleeps keeps sleeping on a tie (polling costs
/// CPU), and one that polls is not switched back and forth by noise.
const SWITCH_MARGIN: f64 = 1.05;
/// An epoch with fewer ops than this is too quiet to compare; a trial
/// that meets one is abandoned (polling off) until work picks up.
const OPS_PER_EPOCH_MIN: u64 = 32;

#[derive(Debug, Clone, Copy)]
enum Phase {
    Settled {
        polling: bool,
        until: Instant,
    },
    Trial {
        /// The arm in use before the trial: it stays unless the other wins.
        was_polling: bool,
        epoch: usize,
        ops: [u64; 2],
        time: [Duration; 2],
    },
}

#[derive(Debug)]
pub struct SpinTrial {
    phase: Phase,
    epoch_start: Instant,
    /// When this epoch's counting began (after its warm-up).
    counting_since: Option<Instant>,
    epoch_ops: u64,
}

impl SpinTrial {
    /// A new connection starts with a trial (its first epoch does not
    /// poll): a benchmark job of a few seconds should not spend one epoch
    /// more on the wrong arm.
    pub fn new(now: Instant) -> SpinTrial {
        SpinTrial {
            phase: Phase::Trial {
                was_polling: false,
                epoch: 0,
                ops: [0; 2],
                time: [Duration::ZERO; 2],
            },
            epoch_start: now,
            counting_since: None,
            epoch_ops: 0,
        }
    }

    /// Whether the thread polls now.
    pub fn polling(&self) -> bool {
        match self.phase {
            Phase::Settled { polling, .. } => polling,
            Phase::Trial { epoch, .. } => TRIAL_ORDER[epoch],
        }
    }

    /// How long to poll before sleeping.
    pub fn window(&self) -> Duration {
        if self.polling() {
            WINDOW
        } else {
            Duration::ZERO
        }
    }

    /// `ops` completed since the last report, at `now`.
    pub fn record(&mut self, ops: u64, now: Instant) {
        let since_start = now.saturating_duration_since(self.epoch_start);
        if since_start < WARMUP {
            return;
        }
        let Some(counting_since) = self.counting_since else {
            // These ops were done (partly) in the warm-up.
            self.counting_since = Some(now);
            return;
        };
        self.epoch_ops += ops;
        if since_start < EPOCH {
            return;
        }
        let elapsed = now.saturating_duration_since(counting_since);
        let epoch_ops = std::mem::take(&mut self.epoch_ops);
        self.epoch_start = now;
        self.counting_since = None;
        let busy = epoch_ops >= OPS_PER_EPOCH_MIN;
        self.phase = match self.phase {
            Phase::Settled { until, polling } if busy && now >= until => Phase::Trial {
                was_polling: polling,
                epoch: 0,
                ops: [0; 2],
                time: [Duration::ZERO; 2],
            },
            // Quiet: polling would burn CPU between rare ops.
            Phase::Settled { until, .. } if !busy => Phase::Settled {
                polling: false,
                until,
            },
            settled @ Phase::Settled { .. } => settled,
            Phase::Trial { .. } if !busy => Phase::Settled {
                polling: false,
                until: now,
            },
            Phase::Trial {
                was_polling,
                epoch,
                mut ops,
                mut time,
            } => {
                let arm = usize::from(TRIAL_ORDER[epoch]);
                ops[arm] += epoch_ops;
                time[arm] += elapsed;
                if epoch + 1 < TRIAL_ORDER.len() {
                    Phase::Trial {
                        was_polling,
                        epoch: epoch + 1,
                        ops,
                        time,
                    }
                } else {
                    let rate = |arm: usize| ops[arm] as f64 / time[arm].as_secs_f64().max(1e-9);
                    let polling = if was_polling {
                        rate(0) <= rate(1) * SWITCH_MARGIN
                    } else {
                        rate(1) > rate(0) * SWITCH_MARGIN
                    };
                    tracing::trace!(
                        sleeping_ops_per_s = rate(0),
                        polling_ops_per_s = rate(1),
                        polling,
                        "ring polling trial"
                    );
                    Phase::Settled {
                        polling,
                        until: now + SETTLE,
                    }
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reports every millisecond from `start` on: `rate(polling)` ops each.
    struct Clock {
        start: Instant,
        now: Instant,
        trial: SpinTrial,
    }

    impl Clock {
        fn new() -> Clock {
            let start = Instant::now();
            Clock {
                start,
                now: start,
                trial: SpinTrial::new(start),
            }
        }

        fn run(&mut self, how_long: Duration, rate: impl Fn(bool) -> u64) {
            let end = self.now + how_long;
            while self.now < end {
                self.now += Duration::from_millis(1);
                let ops = rate(self.trial.polling());
                self.trial.record(ops, self.now);
            }
        }

        fn in_trial(&self) -> bool {
            matches!(self.trial.phase, Phase::Trial { .. })
        }
    }

    /// One trial where polling completes `poll` ops per ms and sleeping
    /// `sleep`; returns the decision and when it was made.
    fn decide(poll: u64, sleep: u64) -> (bool, Duration) {
        let mut clock = Clock::new();
        let mut tried = false;
        for _ in 0..10_000 {
            clock.run(Duration::from_millis(1), |p| if p { poll } else { sleep });
            if clock.in_trial() {
                tried = true;
            } else if tried {
                return (clock.trial.polling(), clock.now - clock.start);
            }
        }
        panic!("the trial never ended");
    }

    #[test]
    fn polls_when_polling_completes_more() {
        let (polling, took) = decide(80, 60);
        assert!(polling);
        let expected = EPOCH * TRIAL_ORDER.len() as u32;
        assert!(took <= expected + Duration::from_millis(5), "{took:?}");
    }

    #[test]
    fn sleeps_when_polling_completes_less() {
        assert!(!decide(7, 10).0);
    }

    #[test]
    fn a_tie_does_not_start_polling() {
        assert!(!decide(103, 100).0);
    }

    #[test]
    fn a_tie_does_not_stop_polling() {
        let mut clock = Clock::new();
        clock.run(SETTLE, |p| if p { 80 } else { 60 });
        assert!(clock.trial.polling());
        // Now both arms are equal: the next trial keeps polling.
        clock.run(SETTLE * 2, |p| if p { 100 } else { 103 });
        assert!(clock.trial.polling());
        // And when sleeping wins clearly, it stops.
        clock.run(SETTLE * 2, |p| if p { 80 } else { 100 });
        assert!(!clock.trial.polling());
    }

    #[test]
    fn ops_in_the_warm_up_do_not_count() {
        // Right after each switch to polling, a burst left over from the
        // sleeping epoch completes; counted, it would make polling win.
        let mut clock = Clock::new();
        let mut last = false;
        let mut switched_at = clock.now;
        let mut tried = false;
        loop {
            clock.now += Duration::from_millis(1);
            let polling = clock.trial.polling();
            if polling != last {
                switched_at = clock.now;
                last = polling;
            }
            let leftover = polling && clock.now - switched_at < Duration::from_millis(45);
            let ops = match (polling, leftover) {
                (true, true) => 1000,
                (true, false) => 10,
                (false, _) => 12,
            };
            clock.trial.record(ops, clock.now);
            if clock.in_trial() {
                tried = true;
            } else if tried {
                break;
            }
        }
        assert!(!clock.trial.polling());
    }

    #[test]
    fn a_quiet_thread_never_polls_or_tries() {
        let mut clock = Clock::new();
        clock.run(EPOCH, |_| 0);
        clock.trial.record(1, clock.now);
        for _ in 0..100 {
            clock.run(Duration::from_millis(50), |_| 0);
            clock.trial.record(1, clock.now);
            assert!(!clock.trial.polling());
            assert!(!clock.in_trial());
        }
    }

    #[test]
    fn tries_again_after_settling() {
        let mut clock = Clock::new();
        let mut trials = 0;
        let mut in_trial = false;
        while clock.now < clock.start + SETTLE * 3 {
            clock.run(Duration::from_millis(1), |p| if p { 80 } else { 60 });
            if clock.in_trial() && !in_trial {
                trials += 1;
            }
            in_trial = clock.in_trial();
        }
        assert!((3..=4).contains(&trials), "{trials} trials");
    }

    #[test]
    fn work_that_stops_ends_polling() {
        let mut clock = Clock::new();
        clock.run(SETTLE, |p| if p { 80 } else { 60 });
        assert!(clock.trial.polling());
        clock.run(EPOCH * 2, |_| 0);
        assert!(!clock.trial.polling());
    }

    #[test]
    fn work_that_stops_mid_trial_ends_it_without_polling() {
        let mut clock = Clock::new();
        clock.run(EPOCH * 2, |_| 50);
        assert!(clock.in_trial());
        clock.run(EPOCH * 2, |_| 0);
        assert!(!clock.trial.polling());
        assert!(!clock.in_trial());
    }
}
