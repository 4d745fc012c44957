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
//! the seed-001 stall. Every timing is known when a command starts, so the
//! model keeps running commands as a list of completion times.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::{
    slowed, transfer_nanos, IoKind, ModelIo, Nanos, TimingModel, NANOS_PER_MS, NANOS_PER_US,
};

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
    /// Garbage collection: every `gc_every_programs` programs on a die add
    /// an erase of `erase_ns`. 0 turns it off.
    pub gc_every_programs: u32,
    pub erase_ns: Nanos,
}

impl FlashParams {
    /// A SATA SSD: ~100 us 4 KiB reads, ~550 MB/s, 8 dies, no PLP.
    pub fn sata_ssd(size_bytes: u64) -> FlashParams {
        FlashParams {
            size_bytes,
            dies: 8,
            page_bytes: 16 << 10,
            read_page_ns: 60 * NANOS_PER_US,
            program_bytes: 64 << 10,
            program_ns: NANOS_PER_MS,
            link_bytes_per_sec: 550_000_000,
            controller_ns: 10 * NANOS_PER_US,
            completion_ns: 20 * NANOS_PER_US,
            tags: 32,
            write_buffer_bytes: 8 << 20,
            plp: false,
            flush_ns: 3 * NANOS_PER_MS,
            gc_every_programs: 0,
            erase_ns: 3 * NANOS_PER_MS,
        }
    }

    /// An NVMe drive: ~80 us 4 KiB reads, ~3 GB/s, 64 dies, 256 tags.
    pub fn nvme(size_bytes: u64) -> FlashParams {
        FlashParams {
            size_bytes,
            dies: 64,
            page_bytes: 16 << 10,
            read_page_ns: 60 * NANOS_PER_US,
            program_bytes: 64 << 10,
            program_ns: 1_200 * NANOS_PER_US,
            link_bytes_per_sec: 3_200_000_000,
            controller_ns: 2 * NANOS_PER_US,
            completion_ns: 10 * NANOS_PER_US,
            tags: 256,
            write_buffer_bytes: 64 << 20,
            plp: false,
            flush_ns: NANOS_PER_MS,
            gc_every_programs: 0,
            erase_ns: 3 * NANOS_PER_MS,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Die {
    free_at: Nanos,
    programs: u32,
}

pub struct Flash {
    params: FlashParams,
    /// Submitted, waiting for a tag.
    waiting: VecDeque<ModelIo>,
    /// Started: `(done_at, id)`, earliest first.
    running: BinaryHeap<Reverse<(Nanos, u64)>>,
    dies: Vec<Die>,
    controller_free_at: Nanos,
    link_free_at: Nanos,
    /// Programs scheduled and the bytes each frees from the buffer when done.
    programs: VecDeque<(Nanos, u64)>,
    /// Buffered bytes not yet making up a whole program unit.
    unprogrammed_bytes: u64,
    next_program_die: usize,
    slowdown: f64,
}

impl Flash {
    pub fn new(params: FlashParams) -> Flash {
        assert!(params.dies > 0 && params.tags > 0 && params.page_bytes > 0);
        assert!(params.program_bytes > 0 && params.write_buffer_bytes >= 2 * params.program_bytes);
        Flash {
            dies: vec![
                Die {
                    free_at: 0,
                    programs: 0
                };
                params.dies
            ],
            params,
            waiting: VecDeque::new(),
            running: BinaryHeap::new(),
            controller_free_at: 0,
            link_free_at: 0,
            programs: VecDeque::new(),
            unprogrammed_bytes: 0,
            next_program_die: 0,
            slowdown: 1.0,
        }
    }

    pub fn params(&self) -> &FlashParams {
        &self.params
    }

    fn link(&mut self, ready: Nanos, bytes: u64) -> Nanos {
        let start = ready.max(self.link_free_at);
        self.link_free_at = start
            + slowed(
                transfer_nanos(bytes, self.params.link_bytes_per_sec),
                self.slowdown,
            );
        self.link_free_at
    }

    fn read(&mut self, io: &ModelIo, start: Nanos) -> Nanos {
        let page = self.params.page_bytes;
        let first = io.offset / page;
        let last = (io.offset + io.length.max(1) - 1) / page;
        let mut data_ready = start;
        let dies = self.dies.len() as u64;
        for index in first..=last {
            let die = &mut self.dies[(index % dies) as usize];
            let begin = start.max(die.free_at);
            die.free_at = begin + slowed(self.params.read_page_ns, self.slowdown);
            data_ready = data_ready.max(die.free_at);
        }
        self.link(data_ready, io.length)
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
            let in_buffer = self.link(room, part);
            self.schedule_programs(in_buffer, part, false);
            at = in_buffer;
            left -= part;
        }
        at
    }

    /// Buffered writes are programmed in whole units, whatever their
    /// addresses (the drive's mapping is log-structured); a flush programs
    /// the partial unit too.
    fn schedule_programs(&mut self, from: Nanos, bytes: u64, partial_too: bool) {
        let unit = self.params.program_bytes;
        self.unprogrammed_bytes += bytes;
        while self.unprogrammed_bytes >= unit || (partial_too && self.unprogrammed_bytes > 0) {
            let take = self.unprogrammed_bytes.min(unit);
            self.unprogrammed_bytes -= take;
            let die = &mut self.dies[self.next_program_die];
            self.next_program_die = (self.next_program_die + 1) % self.params.dies;
            let mut busy = self.params.program_ns;
            die.programs += 1;
            let gc = self.params.gc_every_programs;
            if gc > 0 && die.programs.is_multiple_of(gc) {
                busy += self.params.erase_ns;
            }
            let begin = from.max(die.free_at);
            die.free_at = begin + slowed(busy, self.slowdown);
            self.programs.push_back((die.free_at, take));
        }
    }

    fn flush(&mut self, start: Nanos) -> Nanos {
        if self.params.plp {
            return start;
        }
        self.schedule_programs(start, 0, true);
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
        let command =
            now.max(self.controller_free_at) + slowed(self.params.controller_ns, self.slowdown);
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
