//! Which copy of a mirror serves a read, as a sans-IO state machine: the
//! caller asks `choose_among` for each interactive or readahead read, with
//! the copies that may serve it (not faulted, and resilvered past the
//! block), tells `completed` when it is done and `checksum_failed` when a
//! copy returned bad data. It never reads a clock; every call takes `now`.
//! Scrub and resilver read the copies they need and do not come here.
//!
//! ```text
//!  choose(read, now) ──> policy: pid | round-robin | least-pending | latency
//!                         └─> a copy (its in-flight count goes up)
//!  completed(choice, latency, now) ──> its service estimate (decaying)
//! ```
//!
//! The `latency` policy predicts when each copy would finish the read: its
//! reads in flight, at its recent service time per read. Each copy keeps
//! two service times, one for reads that continue the last read sent to it
//! and one for the rest, so a sequential run stays where its next read is
//! cheap (a rotating disk's head is there) and spreads where it is not
//! (flash). Now and then it probes a copy it has not heard from, so that a
//! copy that got faster is noticed. While a scrub runs on rotating disks,
//! the copies' scrub positions move reads instead: a copy whose scrub falls
//! behind is left for the others. Beside background work on rotating
//! disks whose queues hold it back for reads, a read that could go to
//! either of two equal copies joins the reads already on one, so that the
//! other drive streams its background.

use crate::device::model::{Nanos, NANOS_PER_MS};
use crate::pool::label::COPIES_MAX;
pub use crate::pool::read_policy::ReadPolicy;
use crate::sched::{Ewma, LinearCost};

/// Bytes read from one copy before round-robin moves on (btrfs's minimum
/// contiguous read, 256 KiB), so that a sequential stream stays whole.
const ROUND_ROBIN_RUN_BYTES: u64 = 256 << 10;
/// A copy the latency policy has not heard from for this long gets the
/// next read it could take, to refresh its estimate.
const PROBE_AFTER_NS: Nanos = 100 * NANOS_PER_MS;
/// A copy that returned a block failing its checksum is passed over for
/// this long, while another copy can serve: the read heals the block, but
/// a device that has begun to return bad data often goes on doing so.
const CHECKSUM_AVOID_NS: Nanos = 1000 * NANOS_PER_MS;

/// How far (in chunks) one copy's scrub may run ahead of the slowest
/// copy's. Copies are read on their own, so client reads that land on one
/// device leave the others scrubbing instead of idle (in the simulator, a
/// light reader's HDD mirror scrubbed at 0.69x its idle rate with the copies
/// in step, 0.71x without); the bound caps what a restart redoes. The scrub
/// keeps to it; the selector steers reads by it.
pub const COPY_LEAD_MAX_CHUNKS: u64 = 256;

/// While a scrub runs on rotating disks, a copy whose scrub lags the
/// furthest-ahead copy's by more than this many chunks gets no reads (a
/// quarter of the lead the pool's scrub allows). The reader stays on its
/// copy until then, so its drive's scrub is interrupted in runs of about
/// half a second, not every 100 ms, and each run costs one seek back.
const SCRUB_LAG_SWITCH_CHUNKS: u64 = COPY_LEAD_MAX_CHUNKS / 4;

/// Predictions within this ratio of the earliest are taken as equal: the
/// service estimates of two identical devices differ by a few percent from
/// sampling alone.
const EQUAL_PREDICTIONS_RATIO: f64 = 1.2;

/// Beside background work (scrub, resilver) on rotating disks whose queues
/// hold it back for reads (the adaptive mode), a read that could go to any
/// of several equal copies goes to the one with the most reads in flight,
/// while that is under this many. A drive left without reads streams its
/// background at full depth; reads spread one per drive left each drive's
/// background a 1 MiB read at a time between them, a seek away each. In
/// the simulator's 2-way HDD mirrors beside a resilver, gathering took a
/// 16-128 KiB QD4 reader's p99 from 1.14-1.26x zfs's to 0.91-0.99x, and
/// the resilver from 0.25-0.29 of its idle rate to 0.33-0.35 (seeds 1-4);
/// a 128 KiB QD2 reader that had settled one read per drive (seed 3) had
/// left its resilver 0.13 of its idle rate, 0.47 gathered. With no bound,
/// reads gathered eight deep on one drive beside a QD8 reader's scrub, at
/// 1.14-1.33x zfs's p99; with three, fewer cells of an off-matrix sweep
/// met their figures (43 of 66 against 46; 38 spreading).
const GATHER_READS_MAX: u32 = 4;

/// A set of copies, as bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CopySet(u64);

impl CopySet {
    fn of(copies: usize, member: impl Fn(usize) -> bool) -> CopySet {
        CopySet(
            (0..copies)
                .filter(|&c| member(c))
                .fold(0, |bits, c| bits | 1 << c),
        )
    }

    fn is_empty(self) -> bool {
        self.0 == 0
    }

    fn contains(self, copy: usize) -> bool {
        copy < COPIES_MAX && self.0 >> copy & 1 == 1
    }

    fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The copies in ascending order.
    fn iter(self) -> impl Iterator<Item = usize> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let copy = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                copy
            })
        })
    }
}

/// One read to place.
#[derive(Clone, Copy, Debug)]
pub struct ReadRequest {
    pub offset: u64,
    pub length: u64,
    /// Who asks (a connection id): the pid policy's key.
    pub requester: u64,
}

/// Where a read went, to hand back to `completed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub copy: usize,
    /// Reads in flight on the copy with this one: its latency over this is
    /// the copy's service time per read.
    in_flight: u32,
    /// It continued the last read sent to the copy.
    continues_run: bool,
    length: u64,
}

#[derive(Clone, Debug, Default)]
struct CopyState {
    in_flight: u32,
    /// Where the last read chosen for it ended: a read starting here
    /// continues a sequential run on this copy.
    next_offset: u64,
    /// Recent latency per read in flight (ns), of reads that continued
    /// the one before on this copy, and of the others.
    service_run: Ewma,
    service: Ewma,
    /// What a read that continues a run costs by its length, once runs of
    /// two lengths have been seen: the reads of one run can differ in
    /// length many times over (read-ahead windows that grow from 256 KiB
    /// to tens of MiB). Priced per read, a window's copy looked slower
    /// than the other copy's short reads, and a stream's windows went back
    /// and forth between two disks, each move a seek. Any other read
    /// costs at least its bytes at the run's rate.
    run_cost: LinearCost,
    last_heard: Nanos,
    reads: u64,
    /// Passed over until then, after a checksum failure.
    avoid_until: Nanos,
    /// Background I/O (scrub, resilver) in the copy's device queue, queued
    /// or at the device, as the caller last reported it.
    background: u32,
    /// How far the copy's scrub has got (its next chunk), as the caller
    /// last reported it; equal on every copy when no scrub runs.
    background_position: u64,
    /// The copy's device is a rotating disk, as the caller last reported.
    rotational: bool,
}

/// What the selector knows of one copy, for status and metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct CopyEstimate {
    pub reads: u64,
    pub in_flight: u32,
    /// Service time per read (ns) of reads that continue a run on the copy,
    /// and of the others, once measured.
    pub service_run_ns: Option<f64>,
    pub service_ns: Option<f64>,
    /// Passed over for now after a checksum failure.
    pub avoided: bool,
}

pub struct MirrorSelector {
    policy: ReadPolicy,
    copies: Vec<CopyState>,
    round_robin_copy: usize,
    round_robin_left: u64,
    /// A scrub runs and has said where each copy's is.
    scrub_positions_known: bool,
    /// The copies' queues hold background work back while reads are there,
    /// and give it the device when none are (the adaptive mode).
    background_held_for_reads: bool,
}

impl MirrorSelector {
    pub fn new(policy: ReadPolicy, copies: usize) -> MirrorSelector {
        assert!(copies <= COPIES_MAX, "a mirror of {copies} copies");
        MirrorSelector {
            policy,
            copies: vec![CopyState::default(); copies],
            round_robin_copy: 0,
            round_robin_left: ROUND_ROBIN_RUN_BYTES,
            scrub_positions_known: false,
            background_held_for_reads: false,
        }
    }

    pub fn policy(&self) -> ReadPolicy {
        self.policy
    }

    pub fn set_policy(&mut self, policy: ReadPolicy) {
        self.policy = policy;
    }

    /// The copy for `read`, any copy allowed.
    pub fn choose(&mut self, read: ReadRequest, now: Nanos) -> Option<Choice> {
        self.choose_among(read, now, |_| true)
    }

    /// The copy for `read` among those `allowed` (the caller's: not
    /// faulted, resilvered past the read), or None when none is. A copy
    /// whose checksums failed lately is chosen only when no other is
    /// allowed.
    pub fn choose_among(
        &mut self,
        read: ReadRequest,
        now: Nanos,
        allowed: impl Fn(usize) -> bool,
    ) -> Option<Choice> {
        let allowed = CopySet::of(self.copies.len(), allowed);
        let trusted = CopySet::of(self.copies.len(), |c| {
            allowed.contains(c) && now >= self.copies[c].avoid_until
        });
        let usable = if trusted.is_empty() { allowed } else { trusted };
        if usable.is_empty() {
            return None;
        }
        let copy = match self.policy {
            ReadPolicy::Pid => usable
                .iter()
                .nth((read.requester % usable.len() as u64) as usize)
                .expect("the index is below the count"),
            ReadPolicy::RoundRobin => self.round_robin(usable, read.length),
            ReadPolicy::LeastPending => usable
                .iter()
                .min_by_key(|&c| {
                    let s = &self.copies[c];
                    (s.in_flight, s.next_offset.abs_diff(read.offset))
                })
                .expect("not empty"),
            ReadPolicy::Latency => self.fastest(usable, read, now),
        };
        let continues_run = self.continues_run(copy, read);
        let state = &mut self.copies[copy];
        state.in_flight += 1;
        state.reads += 1;
        state.next_offset = read.offset + read.length;
        Some(Choice {
            copy,
            in_flight: state.in_flight,
            continues_run,
            length: read.length,
        })
    }

    fn round_robin(&mut self, usable: CopySet, length: u64) -> usize {
        if self.round_robin_left == 0 || !usable.contains(self.round_robin_copy) {
            let first = usable.iter().next().expect("not empty");
            let next = usable
                .iter()
                .find(|&c| c > self.round_robin_copy)
                .unwrap_or(first);
            self.round_robin_copy = next;
            self.round_robin_left = ROUND_ROBIN_RUN_BYTES;
        }
        self.round_robin_left = self.round_robin_left.saturating_sub(length);
        self.round_robin_copy
    }

    /// Whether `read` starts where the last read sent to `copy` ended.
    fn continues_run(&self, copy: usize, read: ReadRequest) -> bool {
        self.copies[copy].next_offset == read.offset
    }

    /// When `copy` would finish `read`: its reads in flight, its background
    /// I/O, and this read, each at its recent service time for this kind
    /// of read. A copy not
    /// measured yet for this kind is taken to be as fast as the fastest
    /// copy that is, so that it gets reads (and a measure) in proportion to
    /// its free slots. Only then does the other kind stand in: a seek is
    /// not priced at the cost of continuing a run.
    fn predicted_ns(&self, copy: usize, read: ReadRequest) -> f64 {
        let run = self.continues_run(copy, read);
        let s = &self.copies[copy];
        let run_parts = s.run_cost.parts().or_else(|| {
            self.copies
                .iter()
                .filter_map(|c| c.run_cost.parts())
                .min_by(|a, b| a.1.total_cmp(&b.1))
        });
        let measured = || {
            Self::service_of(s, run)
                .or_else(|| self.fastest_measured_ns(run))
                .or_else(|| Self::service_of(s, !run))
                .or_else(|| self.fastest_measured_ns(!run))
        };
        let length = read.length as f64;
        let per_read = match (run, run_parts) {
            (true, Some((fixed, per_byte))) => fixed + per_byte * length,
            (false, Some((_, per_byte))) => measured().unwrap_or(0.0).max(per_byte * length),
            (_, None) => measured().unwrap_or(0.0),
        };
        per_read * f64::from(s.in_flight + 1 + s.background)
    }

    /// `copy`'s device queue holds `ios` background I/Os (scrub,
    /// resilver), queued or at the device, and the device is a rotating
    /// disk (`rotational`) or flash. The prediction counts them as
    /// reads ahead of this one. The queue lets an interactive read pass
    /// them, so this overprices the read. It is still what keeps the
    /// reader off the copy whose background work is throttled most: a
    /// scrub reads every copy of a chunk, so it goes at the pace of its
    /// slowest copy, and a reader that gathers on one copy holds back the
    /// whole scrub (docs/scheduler.md).
    pub fn set_background(&mut self, copy: usize, ios: u32, rotational: bool) {
        let state = &mut self.copies[copy];
        state.background = ios;
        state.rotational = rotational;
    }

    /// Whether the copies' queues hold background work back while reads
    /// are there and give it the device when none are (the adaptive mode).
    /// Only then does a drive left without reads make up for it, so only
    /// then do equal disks gather reads (`GATHER_READS_MAX`): a zfs-mode
    /// queue keeps its two scrub I/Os beside the reads, and gathered there
    /// a 4 KiB QD2 reader's p99 beside a scrub went from 47 to 101 ms.
    pub fn set_background_held_for_reads(&mut self, held: bool) {
        self.background_held_for_reads = held;
    }

    /// `copy`'s scrub has reached `chunk` (its next one to read). Among
    /// equal copies a read goes to the one furthest ahead, so that the copy
    /// holding the scrub back is interrupted least; when every copy is a
    /// rotating disk (as `set_background` last said), a copy lagging far
    /// behind gets no reads.
    pub fn set_background_position(&mut self, copy: usize, chunk: u64) {
        self.copies[copy].background_position = chunk;
        self.scrub_positions_known = true;
    }

    /// No scrub runs: no copy is ahead.
    pub fn clear_background_positions(&mut self) {
        for copy in &mut self.copies {
            copy.background_position = 0;
        }
        self.scrub_positions_known = false;
    }

    fn service_of(copy: &CopyState, continues_run: bool) -> Option<f64> {
        if continues_run {
            copy.service_run.get()
        } else {
            copy.service.get()
        }
    }

    /// The lowest service time measured on any copy, for reads that
    /// continue a run (`continues_run`) or for the others.
    fn fastest_measured_ns(&self, continues_run: bool) -> Option<f64> {
        self.copies
            .iter()
            .filter_map(|c| Self::service_of(c, continues_run))
            .min_by(f64::total_cmp)
    }

    fn fastest(&self, usable: CopySet, read: ReadRequest, now: Nanos) -> usize {
        // A probe: a copy not heard from lately, with nothing in flight.
        // Never a read that continues a run: it would move a sequential
        // stream to the probed copy, and there it can wait long behind
        // other work (measured with both copies on one disk: the kernel's
        // mq-deadline held such a read for its 500 ms read deadline while the stream's
        // neighbours went first). Never while a scrub runs on disks: the
        // lag rule below moves reads between copies then, and a probe moved
        // the reader outright (the probed device cuts its background depth
        // for the probe, so it looks the less busy), so every 100 ms probe
        // cost each drive's scrub a seek back. On flash a move costs no
        // seek, and through NBD the probes kept the SSD reader's p99
        // beside a scrub at 1.5x idle; without them it was 9x
        // (docs/scheduler.md).
        let lag_rule = self.scrub_lag_rule(usable);
        let in_a_run = usable.iter().any(|c| self.continues_run(c, read));
        let stale = usable
            .iter()
            .filter(|&c| {
                let s = &self.copies[c];
                s.in_flight == 0 && now.saturating_sub(s.last_heard) >= PROBE_AFTER_NS
            })
            .min_by_key(|&c| self.copies[c].last_heard);
        if let Some(stale) = stale.filter(|_| !in_a_run && !lag_rule) {
            return stale;
        }
        // Before any copy is measured, a run stays where it is and other
        // reads go where the fewest are: on a rotating disk a read sent into
        // another stream's run can wait behind it for seconds.
        if self.fastest_measured_ns(true).is_none() && self.fastest_measured_ns(false).is_none() {
            return usable
                .iter()
                .min_by_key(|&c| (!self.continues_run(c, read), self.copies[c].in_flight))
                .expect("not empty");
        }
        // The earliest finish. Copies whose predictions are within the
        // estimates' noise of it are equals: among those the read goes where
        // the fewest are in flight (then where it continues a run), so that
        // equal devices stay evenly loaded instead of following the noise;
        // then to the copy whose scrub is furthest ahead. A mirror's scrub
        // goes at the pace of its slowest copy, and a copy too far ahead
        // waits idle for it: with the first copy taking every tie, a light
        // reader slowed that copy's scrub and left the other drive idle 7-10%
        // of the time (docs/scheduler.md). Beside background work on disks,
        // equals gather reads instead (`GATHER_READS_MAX`).
        let gathering = self.gathers(usable);
        let usable = if lag_rule {
            self.keeping_up(usable)
        } else {
            usable
        };
        let predicted = |c: usize| self.predicted_ns(c, read);
        let best = usable
            .iter()
            .map(predicted)
            .min_by(f64::total_cmp)
            .expect("not empty");
        usable
            .iter()
            .filter(|&c| predicted(c) <= best * EQUAL_PREDICTIONS_RATIO)
            .min_by_key(|&c| {
                let s = &self.copies[c];
                (
                    load_rank(s.in_flight, gathering),
                    !self.continues_run(c, read),
                    std::cmp::Reverse(s.background_position),
                )
            })
            .expect("the best is among them")
    }

    /// Whether equal copies among `usable` gather reads: their queues hold
    /// background back for reads, every one is a rotating disk, and one
    /// has background work queued or in flight.
    fn gathers(&self, usable: CopySet) -> bool {
        self.background_held_for_reads
            && usable.iter().all(|c| self.copies[c].rotational)
            && usable.iter().any(|c| self.copies[c].background > 0)
    }

    /// Whether scrub progress, not probes, moves reads among `usable`: a
    /// scrub runs and every copy is a rotating disk.
    fn scrub_lag_rule(&self, usable: CopySet) -> bool {
        self.scrub_positions_known && usable.iter().all(|c| self.copies[c].rotational)
    }

    /// `usable` without the copies whose scrub lags the furthest-ahead
    /// usable copy's by more than `SCRUB_LAG_SWITCH_CHUNKS`. A reader on a
    /// copy holds its scrub back (its queue throttles background for the
    /// reader), so the reader moves once that copy has fallen behind, and
    /// the copy catches up while the other is interrupted in turn.
    fn keeping_up(&self, usable: CopySet) -> CopySet {
        let position = |c: usize| self.copies[c].background_position;
        let lead = usable.iter().map(position).max().unwrap_or(0);
        CopySet::of(self.copies.len(), |c| {
            usable.contains(c) && position(c) + SCRUB_LAG_SWITCH_CHUNKS >= lead
        })
    }

    /// `choice`'s read is done after `latency_ns`.
    pub fn completed(&mut self, choice: Choice, latency_ns: Nanos, now: Nanos) {
        let s = &mut self.copies[choice.copy];
        s.in_flight = s.in_flight.saturating_sub(1);
        let service = if choice.continues_run {
            &mut s.service_run
        } else {
            &mut s.service
        };
        let per_read = latency_ns as f64 / f64::from(choice.in_flight.max(1));
        service.record(per_read);
        if choice.continues_run {
            s.run_cost.record(choice.length as f64, per_read);
        }
        s.last_heard = now;
    }

    /// `copy` returned a block whose checksum failed.
    pub fn checksum_failed(&mut self, copy: usize, now: Nanos) {
        self.copies[copy].avoid_until = now + CHECKSUM_AVOID_NS;
    }

    /// Per copy: what the selector knows of it now.
    pub fn estimates(&self, now: Nanos) -> Vec<CopyEstimate> {
        self.copies
            .iter()
            .map(|c| CopyEstimate {
                reads: c.reads,
                in_flight: c.in_flight,
                service_run_ns: c.service_run.get(),
                service_ns: c.service.get(),
                avoided: now < c.avoid_until,
            })
            .collect()
    }

    /// Each copy's share of the reads chosen so far.
    pub fn read_shares(&self) -> Vec<f64> {
        let total: u64 = self.copies.iter().map(|c| c.reads).sum();
        self.copies
            .iter()
            .map(|c| c.reads as f64 / total.max(1) as f64)
            .collect()
    }
}

/// Where a copy with `in_flight` reads ranks among equal copies, least
/// first: fewest reads in flight first, so that equal devices stay evenly
/// loaded; while `gathering`, most first below `GATHER_READS_MAX`, then
/// fewest.
fn load_rank(in_flight: u32, gathering: bool) -> (bool, u32) {
    if gathering && in_flight < GATHER_READS_MAX {
        (false, GATHER_READS_MAX - in_flight)
    } else {
        (true, in_flight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(offset: u64, length: u64) -> ReadRequest {
        ReadRequest {
            offset,
            length,
            requester: 0,
        }
    }

    /// Drive `selector` with `reads` random 4 KiB reads, one at a time,
    /// against copies that take `service_ns[copy]` each.
    fn run_one_at_a_time(selector: &mut MirrorSelector, service_ns: &[Nanos], reads: u64) -> Nanos {
        let mut now = 0;
        for i in 0..reads {
            let offset = (i * 7919 % 1000) << 20;
            let choice = selector.choose(read(offset, 4096), now).expect("usable");
            now += service_ns[choice.copy];
            selector.completed(choice, service_ns[choice.copy], now);
        }
        now
    }

    #[test]
    fn latency_sends_reads_to_the_faster_copy_and_probes_the_other() {
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        // Copy 0 takes 100 us a read, copy 1 ten times that.
        let elapsed = run_one_at_a_time(&mut selector, &[100_000, 1_000_000], 10_000);
        let shares = selector.read_shares();
        assert!(shares[0] > 0.98, "{shares:?}");
        // Probes: about one per 100 ms on the slow copy.
        let probes = (shares[1] * 10_000.0).round() as u64;
        let expected = elapsed / PROBE_AFTER_NS;
        assert!(
            probes >= expected / 2 && probes <= expected * 2 + 2,
            "{probes} probes in {elapsed} ns"
        );
    }

    #[test]
    fn latency_notices_a_copy_that_got_faster() {
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        run_one_at_a_time(&mut selector, &[100_000, 1_000_000], 5_000);
        // Now copy 1 is the fast one.
        run_one_at_a_time(&mut selector, &[1_000_000, 100_000], 5_000);
        let before = selector.read_shares();
        run_one_at_a_time(&mut selector, &[1_000_000, 100_000], 5_000);
        let after = selector.read_shares();
        // Of the last 5000 reads, nearly all went to copy 1.
        let last_to_1 = after[1] * 15_000.0 - before[1] * 10_000.0;
        assert!(last_to_1 > 4_900.0, "{last_to_1}");
    }

    #[test]
    fn latency_keeps_a_sequential_run_on_one_copy() {
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        let mut now = 0;
        // Measure both copies alike first.
        run_one_at_a_time(&mut selector, &[100_000, 100_000], 100);
        let mut copies = Vec::new();
        for i in 1..=64u64 {
            let choice = selector.choose(read(i << 20, 1 << 20), now).unwrap();
            copies.push(choice.copy);
            now += 100_000;
            selector.completed(choice, 100_000, now);
        }
        assert!(copies.windows(2).all(|w| w[0] == w[1]), "{copies:?}");
    }

    #[test]
    fn probes_do_not_take_reads_from_a_run() {
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        run_one_at_a_time(&mut selector, &[100_000, 100_000], 100);
        // A sequential stream for 1 s, ten probe intervals, as fast as
        // the random reads were.
        let service = 100_000;
        let mut now = 10 * NANOS_PER_MS;
        let first = selector.choose(read(1 << 30, 1 << 20), now).unwrap();
        now += service;
        selector.completed(first, service, now);
        for i in 1..10_000u64 {
            let choice = selector
                .choose(read((1 << 30) + (i << 20), 1 << 20), now)
                .unwrap();
            assert_eq!(choice.copy, first.copy, "read {i} left the run");
            now += service;
            selector.completed(choice, service, now);
        }
        // A read outside the run probes the copy not heard from.
        let other = selector.choose(read(7 << 20, 4096), now).unwrap();
        assert_ne!(other.copy, first.copy);
    }

    #[test]
    fn latency_keeps_a_run_whose_reads_grow_on_one_copy() {
        // Two disks: 10 ms to reach a read, then 4 ns a byte.
        let cost = |length: u64| 10_000_000 + 4 * length;
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        let mut now = 0;
        // Random 4 KiB reads measure both copies alike first.
        for i in 0..64u64 {
            let choice = selector
                .choose(read((i * 7919 % 1000) << 20, 4096), now)
                .unwrap();
            now += cost(4096);
            selector.completed(choice, cost(4096), now);
        }
        // Read-ahead windows of a stream, one at a time, growing from
        // 256 KiB to 32 MiB: only the first pays the seek.
        let mut copies = Vec::new();
        let mut offset = 1 << 40;
        let mut length = 256 << 10;
        for _ in 0..24 {
            let choice = selector.choose(read(offset, length), now).unwrap();
            let took = if copies.last() == Some(&choice.copy) {
                4 * length
            } else {
                cost(length)
            };
            copies.push(choice.copy);
            now += took;
            selector.completed(choice, took, now);
            offset += length;
            length = (length * 2).min(32 << 20);
        }
        assert!(copies.windows(2).all(|w| w[0] == w[1]), "{copies:?}");
    }

    #[test]
    fn two_sequential_streams_on_disks_keep_a_copy_each() {
        // Rotating-disk costs: 1 ms to continue a run, 10 ms to seek.
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        let mut now = 0;
        let mut copies = [Vec::new(), Vec::new()];
        for i in 0..200u64 {
            for (stream, base) in [(0, 0u64), (1, 1u64 << 40)] {
                let request = read(base + (i << 20), 1 << 20);
                let choice = selector.choose(request, now).unwrap();
                let cost = if choice.continues_run {
                    1_000_000
                } else {
                    10_000_000
                };
                now += cost;
                selector.completed(choice, cost, now);
                copies[stream].push(choice.copy);
            }
        }
        // After the first reads, each stream stays on one copy, not the same.
        let a = copies[0][10..].to_vec();
        let b = copies[1][10..].to_vec();
        assert!(a.windows(2).all(|w| w[0] == w[1]), "{a:?}");
        assert!(b.windows(2).all(|w| w[0] == w[1]), "{b:?}");
        assert_ne!(a[0], b[0]);
    }

    #[test]
    fn streams_that_start_together_start_on_a_copy_each() {
        // Nothing measured yet: each stream's reads stay together, and the
        // second stream goes where nothing is in flight.
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        let copies_of = |selector: &mut MirrorSelector, base: u64| -> Vec<usize> {
            (0..4u64)
                .map(|i| {
                    selector
                        .choose(read(base + (i << 20), 1 << 20), 0)
                        .unwrap()
                        .copy
                })
                .collect()
        };
        let a = copies_of(&mut selector, 0);
        let b = copies_of(&mut selector, 1 << 40);
        assert!(a.iter().all(|c| *c == a[0]), "{a:?}");
        assert!(b.iter().all(|c| *c == b[0]), "{b:?}");
        assert_ne!(a[0], b[0]);
    }

    #[test]
    fn equal_copies_stay_evenly_loaded() {
        // Two copies measured a few percent apart, as sampling leaves two
        // identical devices: random reads still split evenly by depth.
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        run_one_at_a_time(&mut selector, &[100_000, 104_000], 1_000);
        let mut in_flight = [0u32; 2];
        for i in 0..64u64 {
            let choice = selector
                .choose(read((i * 7919 % 1000) << 20, 4096), 1 << 40)
                .unwrap();
            in_flight[choice.copy] += 1;
        }
        assert_eq!(in_flight, [32, 32]);
    }

    #[test]
    fn background_work_on_a_copy_sends_reads_to_the_other() {
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        let now = run_one_at_a_time(&mut selector, &[100_000, 100_000], 100);
        selector.set_background(0, 4, false);
        for i in 0..10 {
            let choice = selector.choose(read(i << 20, 4096), now).unwrap();
            assert_eq!(choice.copy, 1);
            selector.completed(choice, 100_000, now);
        }
        selector.set_background(0, 0, false);
        selector.set_background(1, 4, false);
        assert_eq!(selector.choose(read(0, 4096), now).unwrap().copy, 0);
    }

    /// The copies the first `reads` reads go to, none completing, with
    /// copy 0 holding one background I/O and copy 1 five, in queues that
    /// hold it back for reads or not (`held`).
    fn copies_beside_background(rotational: bool, held: bool, reads: u64) -> Vec<usize> {
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        let now = run_one_at_a_time(&mut selector, &[100_000, 100_000], 100);
        selector.set_background_held_for_reads(held);
        selector.set_background(0, 1, rotational);
        selector.set_background(1, 5, rotational);
        (0..reads)
            .map(|i| selector.choose(read(i << 30, 4096), now).unwrap().copy)
            .collect()
    }

    #[test]
    fn beside_background_on_disks_equal_copies_gather_reads_up_to_a_bound() {
        // Copy 0 with three reads and its one background I/O ahead of a
        // fourth predicts 5 reads' time, copy 1 with its five 6: equal
        // within the estimates' noise. On disks the fourth joins the
        // three, so that copy 1's drive goes on with its background; the
        // fifth would be the fifth read there, and goes to copy 1.
        assert_eq!(copies_beside_background(true, true, 5), [0, 0, 0, 0, 1]);
        // On flash a move costs no seek, and equal copies share the reads.
        assert_eq!(copies_beside_background(false, true, 5), [0, 0, 0, 1, 0]);
        // Queues that keep background beside the reads (fifo, zfs) give a
        // drive left without reads nothing more to do.
        assert_eq!(copies_beside_background(true, false, 5), [0, 0, 0, 1, 0]);
    }

    #[test]
    fn among_equal_copies_reads_go_to_the_copy_whose_scrub_is_ahead() {
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        let now = run_one_at_a_time(&mut selector, &[100_000, 100_000], 100);
        let chosen = |selector: &mut MirrorSelector| {
            let choice = selector.choose(read(7 << 30, 4096), now).unwrap();
            let copy = choice.copy;
            selector.completed(choice, 100_000, now);
            copy
        };
        // Both scrubbing, copy 1 ahead: it takes the reads, so copy 0
        // (which the scrub waits for) is left alone.
        selector.set_background(0, 4, false);
        selector.set_background(1, 4, false);
        selector.set_background_position(0, 100);
        selector.set_background_position(1, 140);
        assert_eq!(chosen(&mut selector), 1);
        selector.set_background_position(0, 180);
        assert_eq!(chosen(&mut selector), 0);
        // Still only a tie-break: a copy with less queued wins regardless.
        selector.set_background(0, 12, false);
        assert_eq!(chosen(&mut selector), 1);
        // Scrub over: the first copy again.
        selector.set_background(0, 0, false);
        selector.set_background(1, 0, false);
        selector.clear_background_positions();
        assert_eq!(chosen(&mut selector), 0);
    }

    #[test]
    fn during_a_scrub_of_disks_a_reader_moves_when_its_copy_lags_not_on_probes() {
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        let mut now = run_one_at_a_time(&mut selector, &[100_000, 100_000], 100);
        // As on a disk mirror: the reader's copy throttles its scrub, so
        // less background is at that device than at the other.
        selector.set_background(0, 4, true);
        selector.set_background(1, 10, true);
        let read_at = |selector: &mut MirrorSelector, now: Nanos| {
            let choice = selector.choose(read(9 << 30, 4096), now).unwrap();
            selector.completed(choice, 100_000, now + 100_000);
            choice.copy
        };
        // Reads a probe interval apart stay on copy 0 while its scrub lags
        // copy 1's by up to the switch lag.
        for lag in [0, 10, SCRUB_LAG_SWITCH_CHUNKS] {
            selector.set_background_position(0, 1000);
            selector.set_background_position(1, 1000 + lag);
            now += 2 * PROBE_AFTER_NS;
            assert_eq!(read_at(&mut selector, now), 0, "lag {lag}");
        }
        // One chunk more and the reader moves.
        selector.set_background_position(1, 1001 + SCRUB_LAG_SWITCH_CHUNKS);
        now += 2 * PROBE_AFTER_NS;
        assert_eq!(read_at(&mut selector, now), 1);
        // Scrub over: probes again. Copy 1 now predicts the sooner finish,
        // but copy 0 has not been heard from for longest.
        selector.clear_background_positions();
        selector.set_background(0, 10, false);
        selector.set_background(1, 4, false);
        now += 2 * PROBE_AFTER_NS;
        assert_eq!(read_at(&mut selector, now), 0);
    }

    #[test]
    fn during_a_scrub_of_flash_probes_go_on_and_a_lagging_copy_is_read() {
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        let now = run_one_at_a_time(&mut selector, &[100_000, 100_000], 100);
        selector.set_background(0, 4, false);
        selector.set_background(1, 10, false);
        // Copy 0 lags far behind, and copy 1 has not been heard from
        // lately: it gets a probe.
        selector.set_background_position(0, 0);
        selector.set_background_position(1, 10 * SCRUB_LAG_SWITCH_CHUNKS);
        let later = now + 2 * PROBE_AFTER_NS;
        let probe = selector.choose(read(9 << 30, 4096), later).unwrap();
        assert_eq!(probe.copy, 1);
        selector.completed(probe, 100_000, later + 100_000);
        // Then the lagging copy, predicted the sooner finish, reads again.
        let next = selector
            .choose(read(3 << 30, 4096), later + 100_000)
            .unwrap();
        assert_eq!(next.copy, 0);
    }

    #[test]
    fn copies_not_allowed_are_never_chosen() {
        for policy in ReadPolicy::ALL {
            let mut selector = MirrorSelector::new(policy, 3);
            for i in 0..100 {
                let request = ReadRequest {
                    offset: i << 20,
                    length: 4096,
                    requester: i,
                };
                let choice = selector
                    .choose_among(request, i * 1_000_000, |c| c != 1)
                    .unwrap();
                assert_ne!(choice.copy, 1, "{policy:?}");
                selector.completed(choice, 1_000, i * 1_000_000 + 1_000);
            }
            assert!(selector.choose_among(read(0, 4096), 0, |_| false).is_none());
        }
    }

    #[test]
    fn a_copy_failing_checksums_is_passed_over_for_a_while() {
        let mut selector = MirrorSelector::new(ReadPolicy::Latency, 2);
        // Copy 1 is the faster, until it returns a bad block.
        run_one_at_a_time(&mut selector, &[1_000_000, 100_000], 100);
        let now = 1 << 40;
        selector.checksum_failed(1, now);
        assert!(selector.estimates(now)[1].avoided);
        for i in 0..50 {
            let at = now + i * 1_000_000;
            let choice = selector.choose(read(i << 20, 4096), at).unwrap();
            assert_eq!(choice.copy, 0);
            selector.completed(choice, 1_000_000, at + 1_000_000);
        }
        // Unless it is the only copy allowed.
        let only = selector
            .choose_among(read(0, 4096), now, |c| c == 1)
            .unwrap();
        assert_eq!(only.copy, 1);
        selector.completed(only, 100_000, now + 100_000);
        // And after the pause it is chosen again.
        let later = now + CHECKSUM_AVOID_NS + PROBE_AFTER_NS;
        assert!(!selector.estimates(later)[1].avoided);
        assert_eq!(selector.choose(read(0, 4096), later).unwrap().copy, 1);
    }

    #[test]
    fn the_baselines_do_what_their_names_say() {
        let mut pid = MirrorSelector::new(ReadPolicy::Pid, 2);
        for requester in 0..10 {
            let request = ReadRequest {
                offset: 0,
                length: 4096,
                requester,
            };
            assert_eq!(
                pid.choose(request, 0).unwrap().copy,
                (requester % 2) as usize
            );
        }
        // Round-robin: 256 KiB on one copy, then the next.
        let mut rr = MirrorSelector::new(ReadPolicy::RoundRobin, 2);
        let copies: Vec<usize> = (0..16)
            .map(|i| rr.choose(read(i * 65536, 65536), 0).unwrap().copy)
            .collect();
        assert_eq!(copies, [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
        // Least-pending: the copy with fewer reads in flight.
        let mut lp = MirrorSelector::new(ReadPolicy::LeastPending, 2);
        let first = lp.choose(read(0, 4096), 0).unwrap();
        let second = lp.choose(read(1 << 30, 4096), 0).unwrap();
        assert_ne!(first.copy, second.copy);
        lp.completed(first, 1_000, 1_000);
        assert_eq!(
            lp.choose(read(5 << 30, 4096), 1_000).unwrap().copy,
            first.copy
        );
    }

    #[test]
    fn copy_sets_list_their_copies_in_order() {
        let set = CopySet::of(COPIES_MAX, |c| c % 3 == 0 || c == 63);
        let listed: Vec<usize> = set.iter().collect();
        let expected: Vec<usize> = (0..COPIES_MAX).filter(|c| c % 3 == 0 || *c == 63).collect();
        assert_eq!(listed, expected);
        assert_eq!(set.len(), expected.len());
        assert!(set.contains(63) && set.contains(0) && !set.contains(1) && !set.contains(64));
        assert!(CopySet::of(4, |_| false).is_empty());
    }

    #[test]
    fn pid_and_round_robin_cover_sparse_allowed_sets() {
        // Copies 1 and 3 of 4 allowed: pid maps requesters onto those two,
        // round-robin alternates between them.
        let allowed = |c: usize| c == 1 || c == 3;
        let mut pid = MirrorSelector::new(ReadPolicy::Pid, 4);
        let copies: Vec<usize> = (0..4)
            .map(|r| {
                let req = ReadRequest {
                    offset: 0,
                    length: 4096,
                    requester: r,
                };
                pid.choose_among(req, 0, allowed).unwrap().copy
            })
            .collect();
        assert_eq!(copies, vec![1, 3, 1, 3]);
        let mut rr = MirrorSelector::new(ReadPolicy::RoundRobin, 4);
        let copies: Vec<usize> = (0..4u64)
            .map(|i| {
                let req = read(i * ROUND_ROBIN_RUN_BYTES, ROUND_ROBIN_RUN_BYTES);
                rr.choose_among(req, 0, allowed).unwrap().copy
            })
            .collect();
        assert_eq!(copies, vec![1, 3, 1, 3]);
    }

    #[test]
    fn policies_parse_by_name() {
        for policy in ReadPolicy::ALL {
            assert_eq!(ReadPolicy::parse(policy.name()), Some(policy));
        }
        assert_eq!(ReadPolicy::parse("fastest"), None);
    }
}
