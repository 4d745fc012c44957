//! Linux's writeback throttle (block/blk-wbt.c, with the depth steps of
//! block/blk-rq-qos.c) as a sans-IO limiter, so that the simulator can set
//! weir's own writeback control beside the answer Linux ships.
//!
//! wbt watches read completions in windows of 100 ms. When the fastest
//! read of a window took longer than a fixed target (2 ms on flash, 75 ms
//! on a disk), it halves the writeback depth and shortens the window;
//! a window of fast reads, or one with writes and no reads, steps it back
//! up. A read still waiting after a whole window (or past the target in
//! a window with no completed reads) counts as a miss before it
//! completes: on a flooded device a read can take seconds. Background
//! writeback may have a quarter of the depth in flight. Left out: the
//! separate limits for swap and for writers that had to wait (they do not
//! arise in the simulator).

use crate::device::model::{Nanos, NANOS_PER_MS};

/// blk-wbt's window.
const WINDOW_NS: Nanos = 100 * NANOS_PER_MS;
/// blk-wbt's latency targets.
const TARGET_ROTATIONAL_NS: Nanos = 75 * NANOS_PER_MS;
const TARGET_FLASH_NS: Nanos = 2 * NANOS_PER_MS;
/// Writes a window needs before its reads are judged: without write
/// activity, slow reads are not writeback's fault.
const WRITE_SAMPLES_MIN: u32 = 3;
/// Windows with no samples before a scaled depth drifts back to the centre.
const UNKNOWN_WINDOWS_BUMP: u32 = 5;

#[derive(Debug)]
pub struct Wbt {
    target_ns: Nanos,
    queue_depth: u32,
    /// Positive: scaled down by 2^step; negative: scaled up.
    scale_step: i32,
    /// Scaling up has reached its ceiling (three quarters of the queue).
    scaled_max: bool,
    max_depth: u32,
    window_end: Nanos,
    read_min_ns: Option<Nanos>,
    /// One read being watched from its issue: (its id, when sent).
    sync_issue: Option<(u64, Nanos)>,
    writes: u32,
    unknown_windows: u32,
}

impl Wbt {
    /// A limiter for a device with `queue_depth` requests (Linux's
    /// nr_requests); `rotational` chooses the target.
    pub fn new(rotational: bool, queue_depth: u32) -> Wbt {
        let mut wbt = Wbt {
            target_ns: if rotational {
                TARGET_ROTATIONAL_NS
            } else {
                TARGET_FLASH_NS
            },
            queue_depth: queue_depth.max(1),
            scale_step: 0,
            scaled_max: false,
            max_depth: 0,
            window_end: WINDOW_NS,
            read_min_ns: None,
            sync_issue: None,
            writes: 0,
            unknown_windows: 0,
        };
        wbt.calc_max_depth();
        wbt
    }

    /// Background writeback requests allowed in flight.
    pub fn background_limit(&self) -> u32 {
        if self.max_depth <= 1 {
            1
        } else {
            self.max_depth.div_ceil(4)
        }
    }

    /// A read `id` went to the device at `now`.
    pub fn read_sent(&mut self, id: u64, now: Nanos) {
        if self.sync_issue.is_none() {
            self.sync_issue = Some((id, now));
        }
    }

    pub fn read_done(&mut self, id: u64, latency_ns: Nanos) {
        if self.sync_issue.is_some_and(|(watched, _)| watched == id) {
            self.sync_issue = None;
        }
        self.read_min_ns = Some(self.read_min_ns.map_or(latency_ns, |m| m.min(latency_ns)));
    }

    pub fn write_done(&mut self) {
        self.writes += 1;
    }

    /// When the current window ends.
    pub fn next_deadline(&self) -> Nanos {
        self.window_end
    }

    /// Judge every window that ended by `now`.
    pub fn advance(&mut self, now: Nanos) {
        while self.window_end <= now {
            let end = self.window_end;
            self.judge_window(end);
            self.window_end += self.window_ns();
        }
    }

    /// The window shrinks as the depth is scaled down: 100 ms / sqrt(step + 1).
    fn window_ns(&self) -> Nanos {
        if self.scale_step > 0 {
            (WINDOW_NS as f64 / f64::from(self.scale_step + 1).sqrt()) as Nanos
        } else {
            WINDOW_NS
        }
    }

    fn judge_window(&mut self, end: Nanos) {
        let read_min = self.read_min_ns.take();
        let writes = std::mem::take(&mut self.writes);
        let waiting = self
            .sync_issue
            .map_or(0, |(_, sent)| end.saturating_sub(sent));
        if waiting > self.window_ns() || (waiting > self.target_ns && read_min.is_none()) {
            self.unknown_windows = 0;
            self.scale_down();
            return;
        }
        match read_min {
            Some(min) if writes >= WRITE_SAMPLES_MIN => {
                self.unknown_windows = 0;
                if min > self.target_ns {
                    self.scale_down();
                } else {
                    self.scale_up();
                }
            }
            Some(_) => self.scale_up(),
            None if writes > 0 => {
                self.unknown_windows = 0;
                self.scale_up();
            }
            None => {
                self.unknown_windows += 1;
                if self.unknown_windows >= UNKNOWN_WINDOWS_BUMP {
                    match self.scale_step.cmp(&0) {
                        std::cmp::Ordering::Greater => self.scale_up(),
                        std::cmp::Ordering::Less => {
                            self.scale_step += 1;
                            self.calc_max_depth();
                        }
                        std::cmp::Ordering::Equal => {}
                    }
                }
            }
        }
    }

    fn scale_down(&mut self) {
        if self.max_depth == 1 {
            return;
        }
        if self.scale_step < 0 {
            self.scale_step = 0;
        } else {
            self.scale_step += 1;
        }
        self.calc_max_depth();
    }

    fn scale_up(&mut self) {
        if self.scaled_max {
            return;
        }
        self.scale_step -= 1;
        self.calc_max_depth();
    }

    fn calc_max_depth(&mut self) {
        let depth = self.queue_depth;
        self.scaled_max = false;
        self.max_depth = match self.scale_step.cmp(&0) {
            std::cmp::Ordering::Greater => 1 + ((depth - 1) >> self.scale_step.min(31)),
            std::cmp::Ordering::Equal => depth,
            std::cmp::Ordering::Less => {
                let ceiling = (3 * depth / 4).max(1);
                let up = 1u64 + (u64::from(depth - 1) << (-self.scale_step).min(31));
                if up >= u64::from(ceiling) {
                    self.scaled_max = true;
                    ceiling
                } else {
                    up as u32
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_reads_beside_writes_halve_the_depth_and_fast_ones_restore_it() {
        let mut wbt = Wbt::new(false, 64);
        assert_eq!(wbt.background_limit(), 16);
        let mut now = 0;
        for _ in 0..3 {
            for _ in 0..4 {
                wbt.write_done();
            }
            wbt.read_done(1, 5 * NANOS_PER_MS);
            now = wbt.next_deadline();
            wbt.advance(now);
        }
        // 64 -> 32 -> 16 -> 8
        assert_eq!(wbt.background_limit(), 2);
        for _ in 0..10 {
            for _ in 0..4 {
                wbt.write_done();
            }
            wbt.read_done(1, NANOS_PER_MS);
            now = wbt.next_deadline();
            wbt.advance(now);
        }
        // Back past the centre to the ceiling: three quarters of 64.
        assert_eq!(wbt.background_limit(), 12);
        assert!(now > 10 * WINDOW_NS / 2);
    }

    #[test]
    fn a_disk_is_judged_against_its_own_target() {
        let mut wbt = Wbt::new(true, 64);
        for _ in 0..4 {
            wbt.write_done();
        }
        wbt.read_done(1, 20 * NANOS_PER_MS);
        wbt.advance(WINDOW_NS);
        assert_eq!(wbt.background_limit(), 12, "20 ms is fine on a disk");
    }

    #[test]
    fn a_read_stuck_behind_writes_counts_as_a_miss_before_it_completes() {
        let mut wbt = Wbt::new(true, 64);
        wbt.read_sent(7, 0);
        for _ in 0..4 {
            wbt.write_done();
        }
        wbt.advance(WINDOW_NS);
        // 100 ms waiting is over the disk's 75 ms target, with no reads done.
        assert_eq!(wbt.background_limit(), 8, "64 -> 32");
        wbt.advance(WINDOW_NS + wbt.window_ns());
        assert_eq!(wbt.background_limit(), 4, "still waiting: 32 -> 16");
        wbt.read_done(7, 200 * NANOS_PER_MS);
        for _ in 0..4 {
            wbt.write_done();
        }
        wbt.read_sent(8, wbt.next_deadline() - 1);
        wbt.read_done(8, NANOS_PER_MS);
        wbt.advance(wbt.next_deadline());
        assert_eq!(wbt.background_limit(), 8, "fast again: 16 -> 32");
    }
}
