//! How many of a thread ring's ops the device gets at once.
//!
//! The virtual disk measured (virtio under Firecracker) takes every request
//! it holds, answers them all with one interrupt once its queue is empty,
//! and then sits idle until new requests come. With one client at depth 32,
//! those come only after a round trip through weir and the client: the
//! replies go out, the client reads them and sends new requests one by
//! one. A cycle of 32 reads took about 540 us, of which the disk was idle
//! for about 120.
//!
//! Holding a quarter of the ops back fills that gap: when the batch of
//! completions arrives, the held ops go to the device before any reply is
//! sent, so the device works while the client turns around. 4 KiB random
//! reads from a file went from 0.78 to 0.88 of fio's io_uring limit at
//! depth 32 (medians of 5 alternating rounds), and gained 15-20% at depth
//! 8 and 16 (see docs/benchmarks.md).
//!
//! A device that completes each op on its own (most NVMe drives) would
//! lose a quarter of its depth instead and gain nothing. So the ring holds
//! a reserve only while it sees the device drain: a reap finds every op
//! the ring had in the device done (the device sat idle from its last
//! completion until weir noticed) at least once per two depths' worth of
//! completions. The disk above drains once per depth; a device answering
//! op by op, with the client keeping it full, almost never does. The
//! reserve itself stops the draining (the held ops go in as soon as part
//! of a batch is reaped), so the ring keeps it for a while and then checks
//! for a window without it.
//!
//! Only a ring alone on the devices holds a reserve. With four connections
//! at depth 8, each holding its own reserve raised the p99 from about 1.4
//! to about 3 ms: a held op waits for its own ring's thread to run again,
//! and on two vCPUs that thread competes with every client. Other rings'
//! requests keep a shared device busy anyway.
//!
//! Sans-IO: the ring reports depths, busy rings and completions, and asks
//! how many ops the device may have.

/// The share of the ring's ops held back: one in this many.
const RESERVE_DIVISOR: usize = 4;
/// Windows the reserve holds after a window that saw the device drain
/// (with the reserve on, it no longer does): one window in this many plus
/// one runs without the reserve.
const RESERVE_WINDOWS: usize = 15;
/// Completions over which the ring's depth and the device's draining are
/// judged, and after which a ring that saw another one busy counts as
/// alone again.
const WINDOW_COMPLETIONS: usize = 256;

#[derive(Debug, Default)]
pub(super) struct Reserve {
    /// Windows the reserve stays on before a window without it checks
    /// that the device still drains; zero while checking.
    reserve_windows_left: usize,
    /// Reaps in this window that found two or more ops done and none left
    /// in the device.
    drains_this_window: usize,
    /// Most ops the ring had outstanding in this window and the last one.
    depth_this_window: usize,
    depth_last_window: usize,
    completions_this_window: usize,
    /// Completions to go before the ring counts as alone again.
    shared_countdown: usize,
    /// A cap that tests set, whatever the device does.
    #[cfg(test)]
    pub(super) fixed_cap: Option<usize>,
}

impl Reserve {
    /// The ring has `outstanding` ops (held ones included).
    pub(super) fn note_depth(&mut self, outstanding: usize) {
        self.depth_this_window = self.depth_this_window.max(outstanding);
    }

    /// `rings_busy` rings (this one included) have ops in flight.
    pub(super) fn note_rings_busy(&mut self, rings_busy: usize) {
        if rings_busy > 1 {
            self.shared_countdown = WINDOW_COMPLETIONS;
        }
    }

    /// A reap found `ops` finished, and left `device_ops_left` in the
    /// device (before any held op is released).
    pub(super) fn reaped(&mut self, ops: usize, device_ops_left: usize) {
        if ops == 0 {
            return;
        }
        if ops >= 2 && device_ops_left == 0 {
            self.drains_this_window += 1;
        }
        self.shared_countdown = self.shared_countdown.saturating_sub(ops);
        self.completions_this_window += ops;
        if self.completions_this_window >= WINDOW_COMPLETIONS {
            self.completions_this_window = 0;
            self.depth_last_window = std::mem::take(&mut self.depth_this_window);
            let drains = std::mem::take(&mut self.drains_this_window);
            if self.reserve_windows_left > 0 {
                // The reserve keeps the device from draining; the window
                // after the last one checks without it.
                self.reserve_windows_left -= 1;
            } else if drains * self.depth_last_window * 2 >= WINDOW_COMPLETIONS {
                // A device that drains does so about once per depth's worth
                // of completions; one answering op by op almost never does.
                self.reserve_windows_left = RESERVE_WINDOWS;
            }
        }
    }

    /// How many ops the device may have now. Never below one, so a ring
    /// with ops held always has one in the device to wake it.
    pub(super) fn device_cap(&self) -> usize {
        #[cfg(test)]
        if let Some(cap) = self.fixed_cap {
            return cap;
        }
        if self.reserve_windows_left == 0 || self.shared_countdown > 0 {
            return usize::MAX;
        }
        let depth = self.depth_this_window.max(self.depth_last_window);
        (depth - depth / RESERVE_DIVISOR).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring at `depth`, alone, whose device answered a window of reaps:
    /// each found `ops_per_reap` done and left `left` in the device.
    fn reserve_after(depth: usize, ops_per_reap: usize, left: usize) -> Reserve {
        let mut reserve = Reserve::default();
        reserve.note_rings_busy(1);
        reserve.note_depth(depth);
        for _ in 0..WINDOW_COMPLETIONS.div_ceil(ops_per_reap) {
            reserve.reaped(ops_per_reap, left);
        }
        reserve.note_depth(depth);
        reserve
    }

    #[test]
    fn holds_a_quarter_back_from_a_device_that_drains() {
        assert_eq!(reserve_after(32, 32, 0).device_cap(), 24);
        assert_eq!(reserve_after(8, 8, 0).device_cap(), 6);
        assert_eq!(reserve_after(4, 4, 0).device_cap(), 3);
    }

    #[test]
    fn a_drain_reaped_in_parts_counts() {
        // The thread may take a batch of 32 in four reaps.
        let mut reserve = Reserve::default();
        reserve.note_rings_busy(1);
        reserve.note_depth(32);
        for _ in 0..WINDOW_COMPLETIONS / 32 {
            for left in [24, 16, 8, 0] {
                reserve.reaped(8, left);
            }
        }
        assert_eq!(reserve.device_cap(), 24);
    }

    #[test]
    fn checks_without_the_reserve_now_and_then() {
        let mut reserve = reserve_after(32, 32, 0);
        // With the reserve on, the device no longer drains.
        for _ in 0..RESERVE_WINDOWS * WINDOW_COMPLETIONS / 8 {
            reserve.note_depth(32);
            reserve.reaped(8, 24);
        }
        assert_eq!(reserve.device_cap(), usize::MAX);
        // The check finds it draining again.
        for _ in 0..WINDOW_COMPLETIONS / 32 {
            reserve.note_depth(32);
            reserve.reaped(32, 0);
        }
        assert_eq!(reserve.device_cap(), 24);
    }

    #[test]
    fn stops_holding_back_once_the_device_no_longer_drains() {
        let mut reserve = reserve_after(32, 32, 0);
        for _ in 0..(RESERVE_WINDOWS + 2) * WINDOW_COMPLETIONS / 2 {
            reserve.note_depth(32);
            reserve.reaped(2, 30);
        }
        assert_eq!(reserve.device_cap(), usize::MAX);
    }

    #[test]
    fn holds_nothing_back_from_a_device_that_answers_op_by_op() {
        assert_eq!(reserve_after(32, 2, 30).device_cap(), usize::MAX);
    }

    #[test]
    fn holds_nothing_back_before_the_device_is_known() {
        let mut reserve = Reserve::default();
        reserve.note_depth(32);
        reserve.reaped(32, 0);
        assert_eq!(reserve.device_cap(), usize::MAX);
    }

    #[test]
    fn shallow_rings_hold_nothing_back() {
        assert!(reserve_after(1, 1, 0).device_cap() >= 1);
        assert_eq!(reserve_after(3, 3, 0).device_cap(), 3);
    }

    #[test]
    fn another_busy_ring_lifts_the_cap_for_a_window() {
        let mut reserve = reserve_after(32, 32, 0);
        reserve.note_rings_busy(2);
        assert_eq!(reserve.device_cap(), usize::MAX);
        for _ in 0..WINDOW_COMPLETIONS / 32 - 1 {
            reserve.reaped(32, 0);
        }
        reserve.note_rings_busy(1);
        assert_eq!(reserve.device_cap(), usize::MAX);
        reserve.reaped(32, 0);
        assert_eq!(reserve.device_cap(), 24);
    }

    #[test]
    fn the_depth_is_forgotten_after_two_windows() {
        let mut reserve = reserve_after(32, 32, 0);
        for _ in 0..2 {
            reserve.note_depth(8);
            for _ in 0..WINDOW_COMPLETIONS / 8 {
                reserve.reaped(8, 0);
            }
        }
        reserve.note_depth(8);
        assert_eq!(reserve.device_cap(), 6);
    }
}
