//! weir's own choice of class: interactive I/O always goes; background I/O
//! (readahead, writeback, scrub, resilver, trim) gets as much depth as the
//! interactive latency target allows. The target comes from measurement:
//! the device's recent interactive latency when no background I/O ran
//! beside it. Over the target the depth halves; under it, it grows by one
//! per window of samples. When interactive I/O stops, background gets the
//! device; and it always keeps a share of device time. No constant here
//! depends on the kind of device: every time is a multiple of a latency
//! the device showed. See docs/scheduler.md.

use super::estimate::Ewma;
use super::floor::{self, Floors, RunPosition};
use super::{ClassActivity, IoClass, CLASSES};
use crate::device::model::Nanos;

/// Interactive latency may reach this multiple of its clean level before
/// background depth is cut.
const TARGET_FACTOR: f64 = 2.5;
/// The ceiling of the controlled depth, and the least background depth
/// when no interactive work has been seen for a long while.
pub(super) const BACKGROUND_DEPTH_MAX: f64 = 8.0;
/// With no interactive work present, background may fill the device with
/// as much work as this many background I/Os served one at a time: what a
/// read that arrives after the idle spell waits for. Where the device
/// serves background I/Os one at a time (an HDD) that is this many; where
/// they overlap (small writes on flash, or a virtual disk), more, and
/// writeback of scattered 4 KiB blocks needs them to keep up with the
/// writers it stands for.
const IDLE_BACKLOG_SERVICES: f64 = BACKGROUND_DEPTH_MAX;
/// The deepest idle background: Linux's default request-queue depth for a
/// device with a scheduler (nr_requests, 256).
pub(super) const IDLE_DEPTH_CEILING: u32 = 256;
/// With interactive work present, background still gets one I/O after
/// being held for this many of its own service times: about a tenth of the
/// device's time.
const SHARE_WINDOW_SERVICES: f64 = 9.0;
/// Interactive work counts as gone after this many of its service times
/// without any: an arrival after a shorter gap would find the device full
/// of background I/O.
const IDLE_AFTER_SERVICES: f64 = 64.0;
/// Dense interactive work (see `background_may_pass`) counts as gone
/// after a gap of this many service times, or of `TURNAROUND_FACTOR`
/// times its usual turnaround if that is longer. A gap in dense work is
/// where background gets its device time: a QD1 reader on a mirror moves
/// between the copies in runs of about 100 ms, and the copy it left
/// should stream its scrub until the reader comes back, not stay held to
/// the controlled depth for 64 service times (most of the gap). Only the
/// first read of the next run meets the full depth. In the simulator this
/// took the scrub beside such a reader from 0.90-0.91x zfs's to about
/// 0.95x (docs/scheduler.md).
const DENSE_GAP_SERVICES: f64 = 1.0;
/// A client's turnaround is the gap between one interactive I/O's end
/// and the next one's start. Through NBD it is 0.1-0.3 ms: short against
/// an HDD read, but longer than a flash read, so one service time alone
/// took every turnaround for a pause. Background then filled the device
/// before each read, and the SSD reader's p99 beside a scrub went from
/// 1.5x to 8.9x its idle p99 in real time.
const TURNAROUND_FACTOR: f64 = 4.0;
/// The share of the latency slack one background piece may take.
const PIECE_SLACK_SHARE: f64 = 0.125;
/// The share of the latency slack that background streaming in the
/// device may take ahead of a lone interactive I/O waiting there. Three
/// quarters rather than a half gave the scrub beside a QD1 reader
/// 0.3-0.8% more on seeds 1-8, with the reader's max 1.13-1.35x better
/// than zfs's on seeds 1-10 (before the turnaround rule); a whole slack
/// gave about the same scrub and a max only 1.05x better on some seeds
/// (docs/scheduler.md).
const STREAM_SLACK_SHARE: f64 = 0.75;
/// Background pieces are whole 4 KiB blocks.
const PIECE_ALIGN_BYTES: u64 = 4096;
/// Interactive samples per depth decision: single HDD latencies vary by
/// their seek, so the depth follows their mean.
const WINDOW_SAMPLES: u32 = 8;
/// Clean interactive samples needed before the target is trusted, and
/// taken again after this many samples with background beside them.
const CLEAN_SAMPLES_WANTED: u32 = 8;
const REFRESH_AFTER_SAMPLES: u32 = 512;
/// An issue's token: whether background was in the device (bit 0), the
/// I/Os in the device (bits 1-16), the I/O's place in a floor run (bits
/// 17-18), and the background issues so far (the rest).
const RUN_POSITION_SHIFT: u32 = 17;
const ISSUES_SHIFT: u32 = 19;

#[derive(Debug)]
pub struct Adaptive {
    /// Decaying service latency per class.
    latency: [Ewma; CLASSES],
    /// Decaying background latency per I/O ahead of it at issue.
    background_unqueued: Ewma,
    /// Background latency of I/Os that found the device empty.
    background_alone: Ewma,
    /// The device moves a head: it serves one I/O at a time, and an I/O
    /// alone in it often paid a seek that the next in a stream does not.
    rotational: bool,
    /// The same per byte: what a byte of background costs the device.
    background_ns_per_byte: Ewma,
    /// Interactive latency with no background I/O beside it.
    clean: Ewma,
    /// Clean samples still to take before background may grow again.
    clean_wanted: u32,
    /// When the clean samples wanted now were first asked for.
    clean_wanted_since: Nanos,
    /// Interactive samples since the last clean one.
    since_clean: u32,
    /// Background depth allowed while interactive work is present.
    depth: f64,
    /// Interactive latency with background beside it, over the current
    /// window of samples; the depth changes once per window.
    window_sum: f64,
    window_samples: u32,
    /// Background I/Os issued since the last interactive one: while
    /// interactive I/O is in the device, no more than the depth may pass it.
    background_since_interactive: u32,
    /// Background issues so far: an interactive I/O that saw one is not clean.
    background_issues: u64,
    last_interactive: Nanos,
    last_background: Nanos,
    /// When the device last finished an I/O: the device time an I/O took
    /// is from then, or from its issue if later, to its completion.
    last_completion: Nanos,
    /// The I/O being chosen goes by the guaranteed share: send it whole,
    /// since a share that moves one small piece per window moves nothing.
    share_grant: bool,
    /// Decaying lengths (ns) of the periods with interactive I/O in the
    /// device and of the gaps between them: the interactive duty cycle.
    busy_period: Ewma,
    gap_period: Ewma,
    /// Floors of device time for writeback, resilver and scrub.
    floors: Floors,
    busy_since: Option<Nanos>,
    gap_since: Option<Nanos>,
    /// Decaying length (ns) of the gaps between interactive busy
    /// periods, each counted up to the length that makes a pause in
    /// dense work: the client's turnaround, which a pause must outlast.
    turnaround: Ewma,
}

impl Default for Adaptive {
    fn default() -> Adaptive {
        Adaptive::new(false)
    }
}

impl Adaptive {
    /// The state for a device; `rotational` if it moves a head.
    pub fn new(rotational: bool) -> Adaptive {
        Adaptive {
            rotational,
            latency: [Ewma::default(); CLASSES],
            background_unqueued: Ewma::default(),
            background_alone: Ewma::default(),
            background_ns_per_byte: Ewma::default(),
            clean: Ewma::default(),
            clean_wanted: CLEAN_SAMPLES_WANTED,
            clean_wanted_since: 0,
            since_clean: 0,
            depth: 1.0,
            window_sum: 0.0,
            window_samples: 0,
            background_since_interactive: 0,
            background_issues: 0,
            last_interactive: 0,
            last_background: 0,
            last_completion: 0,
            share_grant: false,
            busy_period: Ewma::default(),
            floors: Floors::default(),
            gap_period: Ewma::default(),
            busy_since: None,
            gap_since: None,
            turnaround: Ewma::default(),
        }
    }
}

/// Background classes in the order they are served.
const BACKGROUND: [IoClass; 5] = [
    IoClass::AsyncRead,
    IoClass::AsyncWrite,
    IoClass::Resilver,
    IoClass::Scrub,
    IoClass::Trim,
];

/// Interactive I/Os in the device.
fn interactive_in_device(activity: &[ClassActivity; CLASSES]) -> u32 {
    activity[IoClass::SyncRead as usize].active + activity[IoClass::SyncWrite as usize].active
}

/// Background I/Os in the device.
fn background_active(activity: &[ClassActivity; CLASSES]) -> u32 {
    BACKGROUND
        .iter()
        .map(|c| activity[*c as usize].active)
        .sum()
}

impl Adaptive {
    fn interactive_service(&self) -> Option<f64> {
        let ia = [IoClass::SyncRead, IoClass::SyncWrite];
        ia.iter()
            .filter_map(|c| self.latency[*c as usize].get())
            .reduce(f64::min)
    }

    /// Background service time: latency divided by the I/Os it found in
    /// the device, so that queueing behind them does not count. It sets the
    /// share window.
    fn background_service(&self) -> Option<f64> {
        self.background_unqueued.get()
    }

    /// What a background I/O costs an interactive one that meets it in the
    /// device: its whole latency there (seeks and queueing included). It
    /// sets the budget.
    fn background_cost(&self) -> Option<f64> {
        BACKGROUND
            .iter()
            .filter_map(|c| self.latency[*c as usize].get())
            .reduce(f64::max)
    }

    /// Whether background I/O may be issued while interactive I/O is in
    /// the device, and so be served before it. Passing stretches an
    /// interactive busy period by up to the slack, `TARGET_FACTOR - 1`
    /// times its length. When the gaps between busy periods are longer
    /// than that (interactive I/O holds the device less than
    /// `1 / TARGET_FACTOR` of the time), background gets more device time
    /// in each gap than passing could give it, and passing would only add
    /// to interactive latency: a light reader's p99 beside a scrub fell
    /// from 1.8-2.0x to 1.2-1.4x its idle p99 in the simulator, and the
    /// scrub went faster (0.69-0.70x of its idle rate, from 0.62-0.67x),
    /// since reads no longer waited behind pieces that overtook them.
    ///
    /// A busy period still going counts at its length so far: averages
    /// from a light load must not hold background back from a saturating
    /// one that followed it (measured in real time, where one device queue
    /// serves every run: the QD32 reader's scrub fell to nothing).
    fn background_may_pass(&self, now: Nanos) -> bool {
        let ongoing = self
            .busy_since
            .map_or(0.0, |since| now.saturating_sub(since) as f64);
        match (self.busy_period.get(), self.gap_period.get()) {
            (Some(busy), Some(gap)) => gap <= busy.max(ongoing) * (TARGET_FACTOR - 1.0),
            // Not measured yet: as dense interactive work.
            _ => true,
        }
    }

    /// Whether interactive work is present (active, waiting, or recent).
    fn interactive_present(&self, queued: &[ClassActivity; CLASSES], now: Nanos) -> bool {
        let busy = [IoClass::SyncRead, IoClass::SyncWrite]
            .iter()
            .any(|c| queued[*c as usize].queued > 0 || queued[*c as usize].active > 0);
        if busy {
            return true;
        }
        (now.saturating_sub(self.last_interactive) as f64) < self.interactive_gone_after(now)
    }

    /// How long after its last I/O interactive work counts as gone (ns):
    /// soon for work measured as dense, whose gaps background should
    /// fill; late for light work, whose every read would otherwise find
    /// the device full, and for work not measured yet.
    fn interactive_gone_after(&self, now: Nanos) -> f64 {
        let dense = self.gap_period.get().is_some() && self.background_may_pass(now);
        if dense {
            self.dense_pause_after()
        } else {
            self.interactive_service()
                .map_or(0.0, |s| s * IDLE_AFTER_SERVICES)
        }
    }

    /// How long a gap in dense interactive work lasts before it counts as
    /// a pause (ns): longer than a service time and than the client's
    /// usual turnaround, never longer than the idle rule's.
    fn dense_pause_after(&self) -> f64 {
        let Some(service) = self.interactive_service() else {
            return 0.0;
        };
        let turnaround = self.turnaround.get().unwrap_or(0.0) * TURNAROUND_FACTOR;
        (service * DENSE_GAP_SERVICES)
            .max(turnaround)
            .min(service * IDLE_AFTER_SERVICES)
    }

    /// Background I/Os an interactive arrival may find ahead of it and
    /// still meet the target: the slack over its clean latency, in units
    /// of background service time (at least one).
    fn budget_depth(&self) -> u32 {
        match (self.clean.get(), self.background_cost()) {
            (Some(clean), Some(service)) if service > 0.0 => {
                let slack = clean * (TARGET_FACTOR - 1.0);
                ((slack / service).floor() as u32).max(1)
            }
            _ => 1,
        }
    }

    /// Whether one more background piece may pass the lone interactive
    /// I/O in the device. Only while background is at the device: a drive
    /// that is streaming it serves the next piece of the stream before the
    /// waiting read (HDD firmware picks the cheapest positioning), and that
    /// piece costs the read only its transfer. A piece sent while the read
    /// itself is being served lands behind it instead, away from the head,
    /// and the reader's next read waits for its seek: in a trace of the
    /// simulator, those were every read over 36 ms beside a scrub. The
    /// busy period's time so far (the read's, or longer when reads
    /// overlapped), the background ahead of it and this piece stay within
    /// a share of the slack, so the pass is bounded in time, not in pieces.
    fn streaming_pass_fits(&self, background_active: u32, now: Nanos) -> bool {
        if background_active == 0 {
            return false;
        }
        match (self.busy_since, self.clean.get(), self.background_service()) {
            (Some(since), Some(clean), Some(service)) => {
                let waited = now.saturating_sub(since) as f64;
                let ahead = f64::from(background_active + 1) * service;
                waited + ahead <= clean * (TARGET_FACTOR - 1.0) * STREAM_SLACK_SHARE
            }
            _ => false,
        }
    }

    /// Whether the guaranteed share lets one more background I/O go. Until
    /// a background service time is measured there is no window: then one
    /// at a time, so that it gets measured without crowding the device.
    fn share_due(&self, background_active: u32, now: Nanos) -> bool {
        match self.share_window() {
            Some(window) => now.saturating_sub(self.last_background) >= window,
            None => background_active == 0,
        }
    }

    /// No background I/O for `IDLE_AFTER_SERVICES` interactive service
    /// times.
    fn starved_behind_interactive(&self, now: Nanos) -> bool {
        self.interactive_service().is_some_and(|service| {
            now.saturating_sub(self.last_background) as f64 >= service * IDLE_AFTER_SERVICES
        })
    }

    fn share_window(&self) -> Option<Nanos> {
        self.background_service()
            .map(|s| (s * SHARE_WINDOW_SERVICES) as Nanos)
    }

    /// The background depth allowed now.
    fn background_limit(&self, queued: &[ClassActivity; CLASSES], now: Nanos) -> u32 {
        if !self.interactive_present(queued, now) {
            return self.idle_depth().min(self.pause_depth(now));
        }
        let granted = if self.clean_wanted > 0 {
            0
        } else {
            (self.depth.floor() as u32).min(self.budget_depth())
        };
        let background_active = background_active(queued);
        // The guaranteed share: one more background I/O once per window,
        // even when interactive I/O keeps the device full.
        let starved = self.share_due(background_active, now);
        if starved && granted == 0 {
            background_active + 1
        } else {
            granted
        }
    }

    /// Background depth in a pause of dense interactive work, which is
    /// expected back soon: what its next I/O may find ahead of it and
    /// still meet the target, the slack over a background I/O's service
    /// time. Filling the pause to the idle depth gave an HDD reader at QD2
    /// on a mirror, whose reads move between the copies, a p99 of 1.4x
    /// zfs's beside a scrub in the simulator. After a long gap it counts
    /// as idle.
    fn pause_depth(&self, now: Nanos) -> u32 {
        let Some(service) = self.interactive_service() else {
            return u32::MAX;
        };
        let gap = now.saturating_sub(self.last_interactive) as f64;
        if gap >= service * IDLE_AFTER_SERVICES {
            return u32::MAX;
        }
        match (self.clean.get(), self.background_service()) {
            (Some(clean), Some(background)) if background > 0.0 => {
                let slack = clean * (TARGET_FACTOR - 1.0);
                ((slack / background) as u32).max(1)
            }
            _ => u32::MAX,
        }
    }

    /// Background depth with no interactive work present:
    /// `IDLE_BACKLOG_SERVICES` times the overlap the device has shown, the
    /// latency of a background I/O alone in the device over what one more
    /// adds when others are there. It grows until the device saturates and
    /// each I/O adds its whole service time. A disk serves one at a time,
    /// and its lone I/Os (the first after a read) pay seeks that streaming
    /// ones do not, which would read as overlap: there it stays
    /// `BACKGROUND_DEPTH_MAX` (measured in the simulator: a QD1 reader's
    /// max beside a scrub went from 1.34x better than zfs's to 0.88x).
    pub(super) fn idle_depth(&self) -> u32 {
        let floor = BACKGROUND_DEPTH_MAX as u32;
        if self.rotational {
            return floor;
        }
        match (self.background_alone.get(), self.background_service()) {
            (Some(alone), Some(added)) if added > 0.0 => {
                let depth = IDLE_BACKLOG_SERVICES * alone / added;
                (depth.min(f64::from(IDLE_DEPTH_CEILING)) as u32).max(floor)
            }
            _ => floor,
        }
    }

    /// `class`'s floor: its share of device time and its credit (ns).
    pub fn floor(&self, class: IoClass) -> Option<(f64, f64)> {
        self.floors.report(class, self.floor_device(0))
    }

    /// Whether clean samples are wanted now, so that the floors that wait
    /// for them (a scrub's and a resilver's on a disk, see
    /// `floor::Device`) hold back: for at most as long as interactive work
    /// takes to count as gone, since where other background keeps the
    /// samples from coming the floors must go on.
    fn measuring_clean(&self, now: Nanos) -> bool {
        if self.clean_wanted == 0 || self.clean.get().is_none() {
            return false;
        }
        let waited = now.saturating_sub(self.clean_wanted_since) as f64;
        self.interactive_service()
            .is_some_and(|service| waited < service * IDLE_AFTER_SERVICES)
    }

    /// What the floors need to know of this device.
    fn floor_device(&self, interactive_active: u32) -> floor::Device {
        floor::Device {
            interactive_active,
            rotational: self.rotational,
            background_io: self.background_io_cost(),
            slack: self.clean.get().map(|clean| clean * (TARGET_FACTOR - 1.0)),
            measuring_clean: false,
        }
    }

    /// What one background I/O costs the device (ns), as measured; before
    /// that, an interactive one's.
    fn background_io_cost(&self) -> Option<f64> {
        self.background_service().or(self.interactive_service())
    }

    pub fn class_to_issue(
        &mut self,
        queued: &[ClassActivity; CLASSES],
        now: Nanos,
    ) -> Option<IoClass> {
        let present = self.interactive_present(queued, now);
        let device = floor::Device {
            measuring_clean: self.measuring_clean(now),
            ..self.floor_device(interactive_in_device(queued))
        };
        self.floors.accrue(queued, present, now, device);
        for class in [IoClass::SyncRead, IoClass::SyncWrite] {
            if queued[class as usize].queued > 0 {
                return Some(class);
            }
        }
        if let Some(class) = self.floors.due(queued, device) {
            // Whole: the floor is device time, and a piece would spend it
            // on switching.
            self.share_grant = true;
            return Some(class);
        }
        let limit = self.background_limit(queued, now);
        if background_active(queued) >= limit {
            return None;
        }
        let interactive_active =
            queued[IoClass::SyncRead as usize].active + queued[IoClass::SyncWrite as usize].active;
        // How many background I/Os may pass interactive work in the
        // device: none when it is light; the depth when it queues two or
        // more deep (its own I/Os already seek from one to the next); and
        // for a lone interactive I/O, streaming pieces bounded in time.
        let dense = self.background_may_pass(now);
        let may_pass = if !dense {
            0
        } else if interactive_active > 1 {
            limit
        } else if self.streaming_pass_fits(background_active(queued), now) {
            u32::MAX
        } else {
            0
        };
        // The guaranteed share: background held below one I/O of depth
        // still gets one I/O per window. Background that nothing may pass
        // (a lone closed-loop reader that keeps one drive busy) gets one
        // after as long as interactive work counts as gone: each such I/O
        // costs the reader a seek.
        let share_due = if self.depth < 1.0 {
            self.share_due(background_active(queued), now)
        } else {
            dense && may_pass == 0 && self.starved_behind_interactive(now)
        };
        if interactive_active > 0 && self.background_since_interactive >= may_pass && !share_due {
            // Interactive I/O in the device must not see more background
            // overtake it than the depth allows (none, when it is light).
            return None;
        }
        let granted = self.clean_wanted == 0 && self.depth >= 1.0;
        // With interactive I/O in the device, a scrub or resilver goes
        // only by its floor, in whole runs: sent by the depth or the share
        // window it went in pieces that each paid a seek on an HDD, and
        // spent its device time moving a tenth of what a run moves.
        let class = BACKGROUND
            .into_iter()
            .filter(|c| !(interactive_active > 0 && floor::streams(*c)))
            .find(|c| queued[*c as usize].queued > 0)?;
        self.share_grant = !granted && share_due;
        Some(class)
    }

    /// An I/O of `class` went to the device (`active` counts it); the
    /// token goes back with its completion.
    pub fn issued(
        &mut self,
        class: IoClass,
        now: Nanos,
        active: &[ClassActivity; CLASSES],
        length: u64,
    ) -> u64 {
        self.share_grant = false;
        let device = self.floor_device(interactive_in_device(active));
        let present = self.interactive_present(active, now);
        let run_position = self.floors.issued(class, length, device, present);
        if !class.is_sync() {
            self.background_issues += 1;
            self.background_since_interactive += 1;
            self.last_background = now;
        } else {
            self.last_interactive = now;
            self.background_since_interactive = 0;
            if self.busy_since.is_none() {
                if let Some(since) = self.gap_since.take() {
                    let gap = now.saturating_sub(since) as f64;
                    self.gap_period.record(gap);
                    // Capped, so that the pauses themselves do not
                    // stretch the estimate they are judged by.
                    self.turnaround.record(gap.min(self.dense_pause_after()));
                }
                self.busy_since = Some(now);
            }
        }
        let all_active: u32 = active.iter().map(|c| c.active).sum();
        let background_active = background_active(active) > u32::from(!class.is_sync());
        // Packed: background issues so far, I/Os in the device (this one
        // included), whether background was active.
        (self.background_issues << ISSUES_SHIFT)
            | ((run_position as u64) << RUN_POSITION_SHIFT)
            | (u64::from(all_active.min(0xffff)) << 1)
            | u64::from(background_active)
    }

    /// Background pieces of `class` no larger than this: an interactive
    /// I/O that arrives behind one should lose at most an eighth of its
    /// slack to it. Pieces in a row of a sequential stream cost a drive
    /// little, so small is cheap while nothing interrupts, and short when
    /// something does. Writeback pieces are never so small that the fixed
    /// cost every write pays (a flash drive's write commit) outweighs the
    /// bytes it moves: 4 KiB writeback pieces on the SATA SSD model, each
    /// paying a 350 us commit, moved 5 MB/s of a 420 MB/s drive. Read
    /// pieces have no such bound: the pieces of a sequential read stream
    /// come from the drive's read-ahead or the next pages, and larger scrub
    /// pieces only made a reader wait longer behind them.
    pub fn piece_bytes(&self, class: IoClass) -> Option<u64> {
        if self.share_grant {
            return None;
        }
        let clean = self.clean.get()?;
        let per_byte = self.background_ns_per_byte.get()?;
        if per_byte <= 0.0 {
            return None;
        }
        let mut bytes = clean * (TARGET_FACTOR - 1.0) * PIECE_SLACK_SHARE / per_byte;
        let fit = self
            .floors
            .cost_parts(class)
            .filter(|_| class == IoClass::AsyncWrite);
        if let Some((fixed, per_byte)) = fit {
            if per_byte > 0.0 {
                bytes = bytes.max(fixed / per_byte);
            }
        }
        Some(((bytes as u64) / PIECE_ALIGN_BYTES).max(1) * PIECE_ALIGN_BYTES)
    }

    /// The last interactive I/O in the device finished: a busy period
    /// ends and a gap begins.
    pub fn interactive_drained(&mut self, now: Nanos) {
        if let Some(since) = self.busy_since.take() {
            self.busy_period.record(now.saturating_sub(since) as f64);
        }
        self.gap_since = Some(now);
    }

    pub fn completed(
        &mut self,
        class: IoClass,
        token: u64,
        latency: Nanos,
        length: u64,
        now: Nanos,
    ) {
        let sample = latency as f64;
        self.latency[class as usize].record(sample);
        let device_time = latency.min(now.saturating_sub(self.last_completion));
        self.last_completion = now;
        let run_position = RunPosition::from_bits(token >> RUN_POSITION_SHIFT);
        self.floors
            .charge(class, length, device_time as f64, run_position);
        if !class.is_sync() {
            let in_device = ((token >> 1) & 0xffff).max(1);
            self.background_unqueued.record(sample / in_device as f64);
            if in_device == 1 {
                self.background_alone.record(sample);
            }
            if length > 0 {
                self.background_ns_per_byte
                    .record(sample / in_device as f64 / length as f64);
            }
            self.floors
                .completed(class, length, sample / in_device as f64);
            return;
        }
        self.last_interactive = now;
        let clean = token & 1 == 0 && token >> ISSUES_SHIFT == self.background_issues;
        if clean {
            self.clean.record(sample);
            self.clean_wanted = self.clean_wanted.saturating_sub(1);
            self.since_clean = 0;
            return;
        }
        self.since_clean += 1;
        if self.since_clean >= REFRESH_AFTER_SAMPLES && self.clean_wanted == 0 {
            self.clean_wanted = CLEAN_SAMPLES_WANTED;
            self.clean_wanted_since = now;
        }
        let Some(clean) = self.clean.get() else {
            return;
        };
        self.window_sum += sample;
        self.window_samples += 1;
        if self.window_samples < WINDOW_SAMPLES {
            return;
        }
        let mean = self.window_sum / f64::from(self.window_samples);
        self.window_sum = 0.0;
        self.window_samples = 0;
        if mean > clean * TARGET_FACTOR {
            self.depth = (self.depth / 2.0).max(0.0);
        } else {
            self.depth = (self.depth + 1.0).min(BACKGROUND_DEPTH_MAX);
        }
    }

    /// When, after `now`, a timer of ours runs out (share window,
    /// interactive work gone), if one is set.
    pub fn next_deadline(&self, now: Nanos) -> Option<Nanos> {
        let share = self.share_window().map(|w| self.last_background + w);
        // When a floor's credit will pay for its next run.
        let floor = self.floors.next_deadline(now, self.floor_device(1));
        let share = share.into_iter().chain(floor).min();
        let gone = self
            .interactive_service()
            .is_some()
            .then(|| self.last_interactive + self.interactive_gone_after(now) as Nanos);
        share.into_iter().chain(gone).filter(|t| *t > now).min()
    }
}
