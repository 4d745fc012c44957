//! Read-ahead for a client that keeps several reads of its stream in
//! flight, decided by trial.
//!
//! Such a client drives the device as deep as it likes, and whether
//! read-ahead still pays depends on how its depth compares with what the
//! device needs: 4 KiB reads eight at a time leave a disk seeking between
//! tiny transfers and a flash drive paying its per-command cost for each
//! (read ahead in larger reads they went 3.5x faster on the HDD model and
//! 2.7x on the SSD), while 1 MiB reads eight at a time already move all
//! the device can and a window only adds a wait and a copy. Rather than
//! guess from sizes, each deep stream measures both: its rate without
//! read-ahead, then with it for as many reads (and through the first
//! window the trial read ahead), and keeps whichever was faster.
//! Read-ahead that paid is kept for longer each time it pays again; a
//! trial that lost waits longer before the next, and the volume keeps
//! both for the next streams of the same read size.
//!
//! Sans-IO: the caller counts the stream's reads and reports its frontier
//! and the time.

/// Read-ahead wins a trial if the stream read at least this much faster
/// with it: a smaller gain is within what waiting for windows costs.
const TRIAL_GAIN_MIN: f64 = 1.1;
/// Reads a measure lasts, with read-ahead or without.
const TRIAL_READS: u64 = 64;
/// Read-ahead that paid is kept for this many measures before the rate
/// without it is measured again, doubling each time it pays again up to
/// `KEEP_MEASURES_MAX`: measuring costs the reads done without it.
const KEEP_MEASURES_FIRST: u64 = 16;
const KEEP_MEASURES_MAX: u64 = 1024;
/// A trial that lost is tried again after this many measures without,
/// doubling each time it loses again up to `WAIT_MEASURES_MAX`.
const WAIT_MEASURES_FIRST: u64 = 1;
const WAIT_MEASURES_MAX: u64 = 64;
/// A stream that already reads at this share of the rate read-ahead
/// windows stream at on the volume gets no trial: nothing is left to gain,
/// and a large reader would only wait behind the windows.
const STREAMING_SHARE: f64 = 0.9;

/// Where a stream stood: its reads, its frontier, the time.
#[derive(Clone, Copy, Debug)]
struct Mark {
    reads: u64,
    frontier: u64,
    ns: u64,
}

impl Mark {
    /// Bytes per ns from `self` to `now`.
    fn rate_to(&self, now: Mark) -> f64 {
        now.frontier.saturating_sub(self.frontier) as f64
            / now.ns.saturating_sub(self.ns).max(1) as f64
    }
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    /// No read-ahead; measured from `since` once the stream has passed
    /// `clear_of` (data read ahead before would make it look faster).
    Without { since: Mark, clear_of: u64 },
    /// Read-ahead on trial, measured from `since` against `rate_without`,
    /// at least until the stream has read `through` (the end of the
    /// first window the trial read ahead, once known).
    With {
        since: Mark,
        rate_without: f64,
        through: Option<u64>,
    },
    /// Read-ahead paid: kept until the stream's `until`-th read.
    Kept { until: u64 },
}

/// How long read-ahead is kept once it pays and how long a lost trial
/// waits, in measures: what the trials so far have learned. The volume
/// keeps it for the streams after, so that a client reading the volume
/// again, or reading several streams of the same size, does not pay for
/// the first trials each time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrialPace {
    keep_measures: u64,
    wait_measures: u64,
}

impl Default for TrialPace {
    fn default() -> TrialPace {
        TrialPace {
            keep_measures: KEEP_MEASURES_FIRST,
            wait_measures: WAIT_MEASURES_FIRST,
        }
    }
}

#[derive(Debug)]
pub struct DeepTrial {
    phase: Phase,
    /// The stream's reads.
    reads: u64,
    /// Where the last read left it.
    last: Mark,
    keep_measures: u64,
    wait_measures: u64,
    /// The most reads of the stream seen in flight at once.
    depth: u64,
}

impl DeepTrial {
    /// A stream at `frontier`, whose reads ahead end at `ahead_end`, seen
    /// deep at `now_ns`: it starts without read-ahead, at the `pace` the
    /// trials of streams like it learned.
    pub fn new(frontier: u64, ahead_end: u64, now_ns: u64, pace: TrialPace) -> DeepTrial {
        let since = Mark {
            reads: 0,
            frontier,
            ns: now_ns,
        };
        DeepTrial {
            phase: Phase::Without {
                since,
                clear_of: ahead_end,
            },
            reads: 0,
            last: since,
            keep_measures: pace.keep_measures,
            wait_measures: pace.wait_measures,
            depth: 1,
        }
    }

    /// What this stream's trials have learned, for the streams after it.
    pub fn pace(&self) -> TrialPace {
        TrialPace {
            keep_measures: self.keep_measures,
            wait_measures: self.wait_measures,
        }
    }

    /// The stream has `outstanding` reads in flight.
    pub fn note_depth(&mut self, outstanding: u32) {
        self.depth = self.depth.max(u64::from(outstanding));
    }

    /// The most reads of the stream seen in flight at once.
    pub fn depth(&self) -> u64 {
        self.depth
    }

    /// A read took the stream to `frontier` at `now_ns`, with its reads
    /// ahead ending at `ahead_end`: whether it reads ahead now.
    /// `streaming_rate` is what read-ahead windows move on the volume
    /// (bytes per ns), once measured.
    pub fn on_read(
        &mut self,
        frontier: u64,
        ahead_end: u64,
        now_ns: u64,
        streaming_rate: Option<f64>,
    ) -> bool {
        self.reads += 1;
        let now = Mark {
            reads: self.reads,
            frontier,
            ns: now_ns,
        };
        self.last = now;
        match self.phase {
            Phase::Without { since, clear_of } => {
                if frontier <= clear_of {
                    self.phase = Phase::Without {
                        since: now,
                        clear_of,
                    };
                    return false;
                }
                if now.reads - since.reads < self.wait_measures * TRIAL_READS {
                    return false;
                }
                let rate_without = since.rate_to(now);
                if streaming_rate.is_some_and(|rate| rate_without >= rate * STREAMING_SHARE) {
                    self.phase = Phase::Without {
                        since: now,
                        clear_of,
                    };
                    self.wait_measures = (self.wait_measures * 2).min(WAIT_MEASURES_MAX);
                    return false;
                }
                self.phase = Phase::With {
                    since: now,
                    rate_without,
                    through: None,
                };
                true
            }
            Phase::With {
                since,
                rate_without,
                through,
            } => {
                // The trial's first window is planned after the read that
                // started it: this read sees where it ends. A measure that
                // ends inside it times the wait for one window, not the
                // rate windows stream at (4 KiB reads eight at a time on
                // the HDD model, after the window had grown to megabytes,
                // measured 0.3x of their rate without read-ahead on trial
                // and 3x while it was kept).
                let through = through.unwrap_or(ahead_end);
                if now.reads - since.reads < TRIAL_READS || frontier < through {
                    self.phase = Phase::With {
                        since,
                        rate_without,
                        through: Some(through),
                    };
                    return true;
                }
                if since.rate_to(now) >= rate_without * TRIAL_GAIN_MIN {
                    self.phase = Phase::Kept {
                        until: now.reads + self.keep_measures * TRIAL_READS,
                    };
                    self.keep_measures = (self.keep_measures * 2).min(KEEP_MEASURES_MAX);
                    self.wait_measures = WAIT_MEASURES_FIRST;
                    true
                } else {
                    self.phase = Phase::Without {
                        since: now,
                        clear_of: ahead_end,
                    };
                    self.wait_measures = (self.wait_measures * 2).min(WAIT_MEASURES_MAX);
                    self.keep_measures = KEEP_MEASURES_FIRST;
                    false
                }
            }
            Phase::Kept { until } => {
                if now.reads < until {
                    return true;
                }
                self.phase = Phase::Without {
                    since: now,
                    clear_of: ahead_end,
                };
                false
            }
        }
    }

    /// The read just reported was answered from data held; `own` if the
    /// stream read it ahead itself. While the stream is measured without
    /// read-ahead, the measure starts again after it, and on trial so
    /// does the measure with it unless the data was its own: data read
    /// ahead for another reader, or before, comes faster than the device.
    /// Counted without read-ahead, it made that rate look higher than any
    /// trial could beat (4 KiB reads eight at a time after a reader of the
    /// same range, on a served HDD model: 87 MB/s, against 198 when the
    /// range was not held); counted on trial, it would keep read-ahead
    /// that does not pay.
    pub fn held_read(&mut self, own: bool) {
        match self.phase {
            Phase::Without { clear_of, .. } => {
                self.phase = Phase::Without {
                    since: self.last,
                    clear_of,
                };
            }
            Phase::With {
                rate_without,
                through,
                ..
            } if !own => {
                self.phase = Phase::With {
                    since: self.last,
                    rate_without,
                    through,
                };
            }
            Phase::With { .. } | Phase::Kept { .. } => {}
        }
    }

    /// Read-ahead is on trial or kept.
    #[cfg(test)]
    fn reading_ahead(&self) -> bool {
        !matches!(self.phase, Phase::Without { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deep stream of 4 KiB reads whose reads take `ns_without` each
    /// without read-ahead and `ns_with` with it.
    struct Reader {
        trial: DeepTrial,
        frontier: u64,
        now: u64,
    }

    impl Reader {
        fn new() -> Reader {
            Reader {
                trial: DeepTrial::new(0, 0, 0, TrialPace::default()),
                frontier: 0,
                now: 0,
            }
        }

        /// `reads` more reads; returns how many went with read-ahead.
        fn read(&mut self, reads: u64, ns_without: u64, ns_with: u64) -> u64 {
            let mut with = 0;
            let mut ahead = false;
            for _ in 0..reads {
                self.now += if ahead { ns_with } else { ns_without };
                self.frontier += 4096;
                ahead = self.trial.on_read(self.frontier, 0, self.now, None);
                with += u64::from(ahead);
            }
            with
        }

        /// `reads` reads of data another stream read ahead, 10 ns each, on
        /// trial.
        fn read_held_on_trial(&mut self, reads: u64) {
            for _ in 0..reads {
                self.frontier += 4096;
                self.now += 10;
                assert!(self.trial.on_read(self.frontier, 0, self.now, None));
                self.trial.held_read(false);
            }
        }

        /// `reads` reads of data held, 10 ns each.
        fn read_held(&mut self, reads: u64) {
            for _ in 0..reads {
                self.frontier += 4096;
                self.now += 10;
                assert!(!self.trial.on_read(self.frontier, 0, self.now, None));
                self.trial.held_read(false);
            }
        }
    }

    #[test]
    fn read_ahead_that_pays_is_kept_for_longer_each_time() {
        let mut reader = Reader::new();
        // Three times faster with it: after the first measure without it,
        // nearly every read goes with read-ahead.
        let with = reader.read(100 * TRIAL_READS, 300, 100);
        assert!(
            with >= 90 * TRIAL_READS,
            "{with} of {} read ahead",
            100 * TRIAL_READS
        );
        let later = reader.read(100 * TRIAL_READS, 300, 100);
        assert!(later >= 98 * TRIAL_READS, "then {later}");
    }

    #[test]
    fn read_ahead_that_does_not_pay_is_tried_less_and_less() {
        let mut reader = Reader::new();
        // As fast either way: trials only.
        let with = reader.read(100 * TRIAL_READS, 100, 100);
        assert!(
            with <= 8 * TRIAL_READS,
            "{with} of {} read ahead",
            100 * TRIAL_READS
        );
        let later = reader.read(200 * TRIAL_READS, 100, 100);
        assert!(later <= 4 * TRIAL_READS, "then {later}");
        // Slower with it: the same.
        let slower = reader.read(200 * TRIAL_READS, 100, 150);
        assert!(slower <= 4 * TRIAL_READS, "slower with it: {slower}");
    }

    #[test]
    fn a_trial_is_measured_through_its_first_window() {
        // 4 KiB reads: 51.2 us each without read-ahead (80 MB/s). With it,
        // 4 MiB windows land 4 ns a byte after they are planned (250
        // MB/s), and reads of landed data take 10 ns. Over its first 64
        // reads alone, read-ahead is the wait for one window: 0.016 bytes
        // a ns against 0.08.
        let window = 4 << 20;
        let mut trial = DeepTrial::new(0, 0, 0, TrialPace::default());
        let (mut frontier, mut now, mut ahead_end, mut landed) = (0u64, 0u64, 0u64, 0u64);
        let (mut reading_ahead, mut with) = (false, 0);
        for _ in 0..4096 {
            frontier += 4096;
            if reading_ahead && landed < frontier {
                now += 4 * (ahead_end - landed);
                landed = ahead_end;
            } else if reading_ahead {
                now += 10;
            } else {
                now += 51_200;
                landed = frontier;
            }
            reading_ahead = trial.on_read(frontier, ahead_end, now, None);
            with += u64::from(reading_ahead);
            // Halfway through what is read ahead, the next window.
            if reading_ahead && ahead_end < frontier + window / 2 {
                ahead_end = frontier + window;
            }
        }
        assert!(with >= 2048, "{with} of 4096 reads read ahead");
    }

    #[test]
    fn a_stream_already_reading_at_the_streaming_rate_gets_no_trial() {
        let mut trial = DeepTrial::new(0, 0, 0, TrialPace::default());
        // 4096 bytes per 100 ns: the rate windows stream at.
        let streaming = Some(4096.0 / 100.0);
        for i in 1..=100 * TRIAL_READS {
            assert!(!trial.on_read(i * 4096, 0, i * 100, streaming), "read {i}");
        }
    }

    #[test]
    fn a_stream_is_measured_without_only_once_past_its_read_ahead_data() {
        // Read ahead to 1 MiB before: reads up to there are answered from
        // it, fast, and must not count as the rate without.
        let mut trial = DeepTrial::new(0, 1 << 20, 0, TrialPace::default());
        let mut now = 0;
        for frontier in (1..=256).map(|i| i * 4096) {
            now += 10;
            assert!(!trial.on_read(frontier, 1 << 20, now, None));
        }
        let (mut frontier, mut with) = (1 << 20, 0);
        for _ in 0..4 * TRIAL_READS {
            frontier += 4096;
            now += if with > 0 { 100 } else { 300 };
            with += u64::from(trial.on_read(frontier, 1 << 20, now, None));
        }
        assert!(with > 0, "read ahead after a measure without it");
    }

    #[test]
    fn reads_of_data_held_do_not_count_while_measuring_without() {
        let mut reader = Reader::new();
        reader.read_held(10 * TRIAL_READS);
        assert!(!reader.trial.reading_ahead());
    }

    #[test]
    fn reads_of_data_held_do_not_make_the_rate_without_look_higher() {
        let mut reader = Reader::new();
        reader.read_held(1000);
        // Then the device: three times faster with read-ahead.
        let with = reader.read(20 * TRIAL_READS, 300, 100);
        assert!(
            with >= 15 * TRIAL_READS,
            "{with} of {} read ahead",
            20 * TRIAL_READS
        );
    }

    #[test]
    fn on_trial_reads_of_data_held_for_others_do_not_make_it_pay() {
        let mut reader = Reader::new();
        // As fast either way; the trial starts after the first measure.
        reader.read(TRIAL_READS, 100, 100);
        assert!(reader.trial.reading_ahead());
        // Half its trial reads data held for another reader.
        reader.read_held_on_trial(TRIAL_READS / 2);
        reader.read(2 * TRIAL_READS, 100, 100);
        assert!(
            !reader.trial.reading_ahead(),
            "kept a read-ahead that did not pay"
        );
    }
}
