//! Flash drives (a SATA SSD, an NVMe drive) as timing state machines.
//!
//! ```text
//!  submit ──> tags (device queue) ──> controller (serial, per command)
//!                                        │
//!     read:  pages on their dies (FIFO per die) ──> link ──> done
//!     write: link ──> write buffer ──> done (acknowledged)
//!                          └──> programs on the dies, round robin, FIFO
//!     flush: when every buffered program is on flash, plus the flush cost
//! ```
//!
//! Dies are FIFO and a program is not suspended for a read, so a burst of
//! writes that fills the buffer puts reads behind milliseconds of programs:
//! the stall Linux's wbt was written for. Every timing is known when a
//! command starts, so the model keeps running commands as a list of
//! completion times.
//!
//! What makes a drive fight back, as real ones do:
//! - Reads vary at QD1: a TLC page reads faster or slower by its type
//!   (lower, middle, upper page, set by its address), and now and then a
//!   page needs a read retry (seeded, so runs repeat).
//! - A write is acknowledged a firmware commit time after its data is in
//!   the buffer, so one 1 MiB write at a time runs below the link's rate.
//! - Programs consume clean blocks. Once the spare area is used up, every
//!   program also relocates valid data and blocks are erased: the dies are
//!   busy longer per byte, write throughput falls, and reads wait behind
//!   erases. Idle time (no program on any die) reclaims clean space.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::{
    slowed, transfer_nanos, IoKind, ModelIo, Nanos, TimingModel, NANOS_PER_MS, NANOS_PER_US,
};
use crate::rng::Rng;

/// The largest transfer that passes between the bursts of a larger one,
/// and the burst it waits for. 16 KiB gives reads beside a streaming
/// 1 MiB writer on the SSD model about a fifth of the link, as the
/// Micron 1100 figures in docs/devices.md show (writer 458 MB/s).
const LINK_FRAME_BYTES: u64 = 16 << 10;

/// The clean space a drive starts with: its spare area, or with garbage
/// collection off, all it will ever need.
fn params_spare(params: &FlashParams) -> u64 {
    if params.gc_every_programs == 0 {
        u64::MAX
    } else {
        params.spare_bytes
    }
}

/// Bytes moved in `ns` at `bytes_per_sec`.
fn transfer_bytes(ns: Nanos, bytes_per_sec: u64) -> u64 {
    (u128::from(ns) * u128::from(bytes_per_sec) / 1_000_000_000).min(u128::from(u64::MAX)) as u64
}

#[derive(Clone, Debug, PartialEq)]
pub struct FlashParams {
    pub size_bytes: u64,
    pub dies: usize,
    /// Read unit: a request touches one die per page.
    pub page_bytes: u64,
    pub read_page_ns: Nanos,
    /// Program unit and time: each die programs this much at once.
    pub program_bytes: u64,
    pub program_ns: Nanos,
    /// Host link, both directions share it.
    pub link_bytes_per_sec: u64,
    /// Controller time per command; commands pass one at a time.
    pub controller_ns: Nanos,
    /// Fixed latency from data ready to the host seeing completion.
    pub completion_ns: Nanos,
    pub tags: usize,
    pub write_buffer_bytes: u64,
    /// Power-loss protection: a flush does not wait for the buffer.
    pub plp: bool,
    pub flush_ns: Nanos,
    /// Garbage collection once the spare area is used up: programs wait
    /// for space freed at `gc_bytes_per_sec`, and every
    /// `gc_every_programs` programs on a die add an erase of `erase_ns`.
    /// 0 turns it off.
    pub gc_every_programs: u32,
    pub erase_ns: Nanos,
    pub gc_bytes_per_sec: u64,
    /// Clean space programs may use before garbage collection must run.
    pub spare_bytes: u64,
    /// Clean space reclaimed per second while no die programs.
    pub reclaim_bytes_per_sec: u64,
    /// Page read time by page type: lower pages take `1 - read_spread`
    /// times `read_page_ns`, upper pages `1 + read_spread`.
    pub read_spread: f64,
    /// Chance per page read, in parts per million, of a read retry that
    /// costs two more reads of the page.
    pub read_retry_ppm: u32,
    /// Firmware time from a write's data in the buffer to its completion.
    pub write_ack_ns: Nanos,
}

impl FlashParams {
    /// A SATA TLC SSD like the Micron 1100: ~100 us 4 KiB reads, ~550 MB/s
    /// over the link, 64 dies, no PLP.
    pub fn sata_ssd(size_bytes: u64) -> FlashParams {
        FlashParams {
            size_bytes,
            dies: 64,
            page_bytes: 16 << 10,
            read_page_ns: 60 * NANOS_PER_US,
            program_bytes: 256 << 10,
            program_ns: 2_500 * NANOS_PER_US,
            link_bytes_per_sec: 550_000_000,
            controller_ns: 12 * NANOS_PER_US,
            completion_ns: 20 * NANOS_PER_US,
            tags: 32,
            write_buffer_bytes: 8 << 20,
            plp: false,
            flush_ns: 3 * NANOS_PER_MS,
            gc_every_programs: 4,
            erase_ns: 3_500 * NANOS_PER_US,
            gc_bytes_per_sec: 300_000_000,
            spare_bytes: size_bytes / 16,
            reclaim_bytes_per_sec: 200_000_000,
            read_spread: 0.5,
            read_retry_ppm: 10_000,
            write_ack_ns: 350 * NANOS_PER_US,
        }
    }

    /// An NVMe TLC drive: ~80 us 4 KiB reads, ~3 GB/s, 128 dies, 256 tags.
    pub fn nvme(size_bytes: u64) -> FlashParams {
        FlashParams {
            size_bytes,
            dies: 128,
            page_bytes: 16 << 10,
            read_page_ns: 60 * NANOS_PER_US,
            program_bytes: 256 << 10,
            program_ns: 2_000 * NANOS_PER_US,
            link_bytes_per_sec: 3_200_000_000,
            controller_ns: 2 * NANOS_PER_US,
            completion_ns: 10 * NANOS_PER_US,
            tags: 256,
            write_buffer_bytes: 64 << 20,
            plp: false,
            flush_ns: NANOS_PER_MS,
            gc_every_programs: 4,
            erase_ns: 3 * NANOS_PER_MS,
            gc_bytes_per_sec: 1_500_000_000,
            spare_bytes: size_bytes / 16,
            reclaim_bytes_per_sec: 1_000_000_000,
            read_spread: 0.5,
            read_retry_ppm: 10_000,
            write_ack_ns: 30 * NANOS_PER_US,
        }
    }
}

/// One die's booked work: busy intervals `[start, end)` in time order.
/// Programs go after everything booked; a read takes the first gap long
/// enough for it, so a program booked to start later does not hold back a
/// read that fits before it.
#[derive(Clone, Debug, Default)]
struct Die {
    busy: VecDeque<(Nanos, Nanos)>,
    programs: u32,
}

impl Die {
    /// Forget work that ended by `now`, the current command's time. Command
    /// times only grow, and nothing books before its command, so nothing
    /// later needs it. Pruning by a booking's own start would be wrong: a
    /// program booked to start in the future (its data still queued on
    /// the link) would erase the programs running now, and a read
    /// arriving now would find their die free.
    fn prune(&mut self, now: Nanos) {
        while self.busy.front().is_some_and(|(_, end)| *end <= now) {
            self.busy.pop_front();
        }
    }

    fn free_at(&self) -> Nanos {
        self.busy.back().map_or(0, |(_, end)| *end)
    }

    /// Book `length` after everything booked, from `from` on; returns its end.
    fn book_last(&mut self, now: Nanos, from: Nanos, length: Nanos) -> Nanos {
        self.prune(now);
        let start = from.max(self.free_at());
        self.busy.push_back((start, start + length));
        start + length
    }

    /// Book `length` in the first gap from `from` on; returns its end.
    fn book_gap(&mut self, now: Nanos, from: Nanos, length: Nanos) -> Nanos {
        self.prune(now);
        let mut at = from;
        for (index, (start, end)) in self.busy.iter().enumerate() {
            if at + length <= *start {
                self.busy.insert(index, (at, at + length));
                return at + length;
            }
            at = at.max(*end);
        }
        self.busy.push_back((at, at + length));
        at + length
    }
}

/// The host link's booked transfers: `[start, end)` in order of start, and
/// whether each is large (over `LINK_FRAME_BYTES`, so it moves in frames
/// that small transfers can go between).
#[derive(Clone, Debug, Default)]
struct Link {
    busy: VecDeque<(Nanos, Nanos, bool)>,
}

impl Link {
    /// Forget transfers that ended by `now`, the current command's time
    /// (see `Die::prune`).
    fn prune(&mut self, now: Nanos) {
        while self.busy.front().is_some_and(|(_, end, _)| *end <= now) {
            self.busy.pop_front();
        }
    }

    /// A large transfer of `length` ready at `from`: after the large
    /// transfers booked, in turn, and longer by the small ones booked
    /// within its span, which go between its frames. A small transfer
    /// booked for later (a read whose die is busy until then) does not
    /// hold it back. Returns its end.
    fn book_large(&mut self, now: Nanos, from: Nanos, length: Nanos) -> Nanos {
        self.prune(now);
        let start = self
            .busy
            .iter()
            .filter(|(_, _, large)| *large)
            .map(|(_, end, _)| *end)
            .fold(from, Nanos::max);
        let mut end = start + length;
        for (small_start, small_end, large) in &self.busy {
            if !large && *small_start < end && *small_end > start {
                end += small_end - (*small_start).max(start);
            }
        }
        let index = self.busy.partition_point(|(at, _, _)| *at <= start);
        self.busy.insert(index, (start, end, true));
        end
    }

    /// A small transfer of `length` ready at `from`: in the first gap long
    /// enough for it, unless a large transfer comes first; then between
    /// that one's frames (`frame` apart), which with everything after it
    /// moves later by `length`. Returns its end.
    fn book_small(&mut self, now: Nanos, from: Nanos, length: Nanos, frame: Nanos) -> Nanos {
        self.prune(now);
        let mut at = from;
        for index in 0..self.busy.len() {
            let (start, end, large) = self.busy[index];
            if at + length <= start {
                self.busy.insert(index, (at, at + length, false));
                return at + length;
            }
            if at >= end {
                continue;
            }
            if large {
                let between = (at.max(start) + frame).min(end);
                self.busy[index].1 += length;
                for later in self.busy.iter_mut().skip(index + 1) {
                    later.0 += length;
                    later.1 += length;
                }
                return between + length;
            }
            at = end;
        }
        self.busy.push_back((at, at + length, false));
        at + length
    }
}

pub struct Flash {
    params: FlashParams,
    /// Submitted, waiting for a tag.
    waiting: VecDeque<ModelIo>,
    /// Started: `(done_at, id)`, earliest first.
    running: BinaryHeap<Reverse<(Nanos, u64)>>,
    dies: Vec<Die>,
    controller_free_at: Nanos,
    link: Link,
    /// Programs scheduled and the bytes each frees from the buffer when done.
    programs: VecDeque<(Nanos, u64)>,
    /// Buffered bytes not yet making up a whole program unit.
    unprogrammed_bytes: u64,
    next_program_die: usize,
    slowdown: f64,
    /// Clean space left for programs, and when it was last counted.
    clean_bytes: u64,
    clean_at: Nanos,
    /// With the spare used up: when garbage collection has freed space
    /// for the next program unit.
    gc_free_at: Nanos,
    rng: Rng,
}

impl Flash {
    pub fn new(params: FlashParams, seed: u64) -> Flash {
        assert!(params.dies > 0 && params.tags > 0 && params.page_bytes > 0);
        let clean_bytes = params_spare(&params);
        assert!(params.program_bytes > 0 && params.write_buffer_bytes >= 2 * params.program_bytes);
        Flash {
            dies: vec![Die::default(); params.dies],
            params,
            waiting: VecDeque::new(),
            running: BinaryHeap::new(),
            controller_free_at: 0,
            link: Link::default(),
            programs: VecDeque::new(),
            unprogrammed_bytes: 0,
            next_program_die: 0,
            slowdown: 1.0,
            clean_bytes,
            clean_at: 0,
            gc_free_at: 0,
            rng: Rng::new(crate::rng::mix(seed ^ 0xf1a5)),
        }
    }

    pub fn params(&self) -> &FlashParams {
        &self.params
    }

    /// The host link moves a transfer of `bytes` whose data is ready at
    /// `ready`, for a command at `now`; returns when it has moved. Large
    /// transfers take the link in turn. A small one (up to
    /// `LINK_FRAME_BYTES`) takes the first gap it fits, or goes out between
    /// the frames of a large one, as SATA FISes and PCIe packets do, and
    /// delays the rest of it instead. Either way it holds the link for its
    /// own bytes: small transfers together move no faster than the link.
    fn link(&mut self, now: Nanos, ready: Nanos, bytes: u64) -> Nanos {
        let own = slowed(
            transfer_nanos(bytes, self.params.link_bytes_per_sec),
            self.slowdown,
        );
        if bytes > LINK_FRAME_BYTES {
            return self.link.book_large(now, ready, own);
        }
        let frame = slowed(
            transfer_nanos(LINK_FRAME_BYTES, self.params.link_bytes_per_sec),
            self.slowdown,
        );
        self.link.book_small(now, ready, own, frame)
    }

    /// How long reading page `index` takes on its die: by its type, and
    /// with a read retry now and then.
    fn page_read_ns(&mut self, index: u64) -> Nanos {
        let spread = self.params.read_spread;
        let factor = match index % 3 {
            0 => 1.0 - spread,
            1 => 1.0,
            _ => 1.0 + spread,
        };
        let mut ns = self.params.read_page_ns as f64 * factor;
        if self.params.read_retry_ppm > 0
            && self.rng.below(1_000_000) < u64::from(self.params.read_retry_ppm)
        {
            ns *= 3.0;
        }
        ns as Nanos
    }

    fn read(&mut self, io: &ModelIo, start: Nanos) -> Nanos {
        let page = self.params.page_bytes;
        let first = io.offset / page;
        let last = (io.offset + io.length.max(1) - 1) / page;
        let mut data_ready = start;
        let dies = self.dies.len() as u64;
        for index in first..=last {
            let read_ns = slowed(self.page_read_ns(index), self.slowdown);
            let die = &mut self.dies[(index % dies) as usize];
            data_ready = data_ready.max(die.book_gap(start, start, read_ns));
        }
        self.link(start, data_ready, io.length)
    }

    /// Bytes buffered (not yet programmed) at `now`.
    fn buffered_at(&self, now: Nanos) -> u64 {
        self.unprogrammed_bytes
            + self
                .programs
                .iter()
                .filter(|(done, _)| *done > now)
                .map(|(_, bytes)| bytes)
                .sum::<u64>()
    }

    /// The earliest time from `now` when `bytes` more fit in the buffer.
    fn buffer_room_at(&self, now: Nanos, bytes: u64) -> Nanos {
        let limit = self.params.write_buffer_bytes;
        let mut used = self.buffered_at(now);
        if used + bytes <= limit {
            return now;
        }
        let mut pending: Vec<(Nanos, u64)> = self
            .programs
            .iter()
            .copied()
            .filter(|(done, _)| *done > now)
            .collect();
        pending.sort_unstable();
        for (done, freed) in pending {
            used -= freed;
            if used + bytes <= limit {
                return done;
            }
        }
        unreachable!("a buffer holding only a partial unit has room for any part");
    }

    fn write(&mut self, io: &ModelIo, start: Nanos) -> Nanos {
        // A write larger than the buffer passes through it in buffer-sized parts.
        let mut at = start;
        let mut left = io.length;
        while left > 0 {
            // Room for the part even beside a partial program unit.
            let part = left.min(self.params.write_buffer_bytes - self.params.program_bytes);
            let room = self.buffer_room_at(at, part);
            let in_buffer = self.link(start, room, part);
            self.schedule_programs(start, in_buffer, part, false);
            at = in_buffer;
            left -= part;
        }
        at + slowed(self.params.write_ack_ns, self.slowdown)
    }

    /// Reclaim clean space for the time since the last count in which no
    /// die was programming (the drive's own background collection).
    fn reclaim(&mut self, now: Nanos) {
        let busy_until = self
            .programs
            .iter()
            .map(|(done, _)| *done)
            .max()
            .unwrap_or(0);
        let idle_from = self.clean_at.max(busy_until);
        if now > idle_from {
            let bytes = transfer_bytes(now - idle_from, self.params.reclaim_bytes_per_sec);
            self.clean_bytes = (self.clean_bytes + bytes).min(params_spare(&self.params));
        }
        self.clean_at = self.clean_at.max(now);
    }

    /// When a program unit of `bytes` ready at `from` may start, and how
    /// long it holds its die (the die's `programs`-th): from clean space
    /// at once; with the spare used up, once garbage collection has freed
    /// the space, with an erase every few programs.
    fn program_slot(&mut self, from: Nanos, bytes: u64, programs: u32) -> (Nanos, Nanos) {
        let gc = self.params.gc_every_programs;
        if gc == 0 || self.clean_bytes >= bytes {
            self.clean_bytes = self.clean_bytes.saturating_sub(bytes);
            return (from, self.params.program_ns);
        }
        let free_for = transfer_nanos(bytes, self.params.gc_bytes_per_sec.max(1));
        self.gc_free_at = self.gc_free_at.max(from) + slowed(free_for, self.slowdown);
        let mut busy = self.params.program_ns;
        if programs.is_multiple_of(gc) {
            busy += self.params.erase_ns;
        }
        (self.gc_free_at, busy)
    }

    /// Buffered writes are programmed in whole units, whatever their
    /// addresses (the drive's mapping is log-structured); a flush programs
    /// the partial unit too.
    fn schedule_programs(&mut self, now: Nanos, from: Nanos, bytes: u64, partial_too: bool) {
        let unit = self.params.program_bytes;
        self.unprogrammed_bytes += bytes;
        while self.unprogrammed_bytes >= unit || (partial_too && self.unprogrammed_bytes > 0) {
            let take = self.unprogrammed_bytes.min(unit);
            self.unprogrammed_bytes -= take;
            let index = self.next_program_die;
            self.next_program_die = (self.next_program_die + 1) % self.params.dies;
            self.dies[index].programs += 1;
            let (ready, busy) = self.program_slot(from, take, self.dies[index].programs);
            let done = self.dies[index].book_last(now, ready, slowed(busy, self.slowdown));
            self.programs.push_back((done, take));
        }
    }

    fn flush(&mut self, start: Nanos) -> Nanos {
        if self.params.plp {
            return start;
        }
        self.schedule_programs(start, start, 0, true);
        let drained = self
            .programs
            .iter()
            .map(|(done, _)| *done)
            .max()
            .unwrap_or(start);
        drained.max(start) + self.params.flush_ns
    }

    /// Run `io` from `now` on; returns when the host sees it complete.
    fn start(&mut self, io: ModelIo, now: Nanos) {
        self.reclaim(now);
        // Firmware time per command varies with what the controller finds
        // to do (mapping lookups, queue work): half fixed, half random.
        let controller = self.params.controller_ns as f64 * 0.5
            + self.rng.exponential(self.params.controller_ns as f64 * 0.5);
        let command = now.max(self.controller_free_at) + slowed(controller as Nanos, self.slowdown);
        self.controller_free_at = command;
        let ready = match io.kind {
            IoKind::Read => self.read(&io, command),
            IoKind::Write => self.write(&io, command),
            IoKind::Flush => self.flush(command),
            IoKind::Discard => command,
        };
        self.running.push(Reverse((
            ready + slowed(self.params.completion_ns, self.slowdown),
            io.id,
        )));
        self.programs.retain(|(done, _)| *done > now);
    }
}

impl TimingModel for Flash {
    fn submit(&mut self, io: ModelIo, now: Nanos) {
        assert!(
            io.offset
                .checked_add(io.length)
                .is_some_and(|end| end <= self.params.size_bytes),
            "request past the end of the drive: {io:?}"
        );
        if self.running.len() < self.params.tags {
            self.start(io, now);
        } else {
            self.waiting.push_back(io);
        }
    }

    fn next_event(&self) -> Option<Nanos> {
        self.running.peek().map(|Reverse((done, _))| *done)
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<(u64, Nanos)>) {
        while let Some(&Reverse((at, id))) = self.running.peek().filter(|r| r.0 .0 <= now) {
            self.running.pop();
            done.push((id, at));
            if let Some(next) = self.waiting.pop_front() {
                self.start(next, at);
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.running.len() + self.waiting.len()
    }

    fn set_slowdown(&mut self, factor: f64) {
        assert!(factor >= 1.0, "a slowdown cannot speed the drive up");
        self.slowdown = factor;
    }
}

#[cfg(test)]
mod tests;
