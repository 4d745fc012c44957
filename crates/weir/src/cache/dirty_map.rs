//! The write-back cache's state, with no I/O in it (sans-IO): which byte
//! ranges hold data newer than the store, what must reach the store before
//! a FLUSH may be answered, and in what order writes may go out.
//!
//! ```text
//!   write ──> piece (newest data for its range; older pieces split or dropped)
//!   pump  ──> writeback: a run of adjacent pieces, copied out, marked writing
//!   flush ──> waits until every write answered before it has reached the
//!             store (its piece written back, or superseded by data that was)
//!   direct──> FUA writes, zeroing, trims and writes larger than the
//!             budget go to the store themselves, after older cached data
//!             in their range
//! ```
//!
//! Generations order everything: each write, flush and direct op takes the
//! next one. A piece keeps two: `gen`, the write its bytes came from, and
//! `oldest`, the oldest answered write whose bytes it stands for. When a
//! write replaces a piece that is not being written back, it inherits that
//! piece's `oldest`: the older write is only durable once the newer bytes
//! are. When it replaces a piece that is being written back, the writeback
//! keeps the obligation until it completes. A flush with generation F is
//! ready when no obligation at or below F remains.
//!
//! Ordering: the store may reorder writes in flight, so two store writes
//! whose ranges overlap are never in flight together. A piece overlapping
//! an in-flight writeback or direct op waits; a direct op waits for older
//! pieces in its range to be written back and for in-flight overlaps; a
//! piece newer than a waiting direct op in its range waits for that op.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use crate::device::WriteBuf;

mod range_union;

use range_union::RangeUnion;

/// The bytes of one cached write, shared by the pieces cut from it and by
/// reads and writebacks that copy from it.
pub trait Bytes: Send + Sync {
    fn bytes(&self) -> &[u8];

    /// The same bytes as a device write's buffer, where they can be
    /// shared instead of copied.
    fn write_buf(&self) -> Option<WriteBuf> {
        None
    }
}

#[derive(Clone)]
struct Piece {
    end: u64,
    data: Arc<dyn Bytes>,
    /// Where this piece's first byte sits in `data`.
    data_at: usize,
    gen: u64,
    oldest: u64,
    /// The writeback carrying this piece to the store.
    writing: Option<u64>,
}

/// A view of cached bytes, for copying into a read or a writeback buffer.
#[derive(Clone)]
pub struct Span {
    pub start: u64,
    pub end: u64,
    pub data: Arc<dyn Bytes>,
    pub data_at: usize,
}

impl Span {
    pub fn bytes(&self) -> &[u8] {
        &self.data.bytes()[self.data_at..self.data_at + (self.end - self.start) as usize]
    }

    /// Copy this span into `buf`, which holds `[buf_start, ..)`.
    pub fn copy_into(&self, buf: &mut [u8], buf_start: u64) {
        let from = self.start.max(buf_start);
        let to = self.end.min(buf_start + buf.len() as u64);
        if from >= to {
            return;
        }
        let src = &self.bytes()[(from - self.start) as usize..(to - self.start) as usize];
        buf[(from - buf_start) as usize..(to - buf_start) as usize].copy_from_slice(src);
    }
}

/// Whether `spans` (in order, as [`DirtyMap::spans`] gives them) cover
/// all of `[start, end)`.
pub fn spans_cover(spans: &[Span], start: u64, end: u64) -> bool {
    let mut at = start;
    for span in spans {
        if span.start > at {
            return false;
        }
        at = span.end;
    }
    at >= end
}

/// A run of adjacent pieces to write to the store as one request.
pub struct Writeback {
    pub id: u64,
    pub start: u64,
    pub end: u64,
    pub spans: Vec<Span>,
    /// A flush, or a direct op a client waits on, is waiting for it.
    pub urgent: bool,
}

struct InFlight {
    end: u64,
    /// For writebacks: the oldest obligation they carry.
    oldest: Option<u64>,
}

struct DirectWait<T> {
    gen: u64,
    start: u64,
    end: u64,
    /// A client waits on it: the pieces it must follow are urgent.
    urgent: bool,
    /// Every piece it must follow has been started: pieces written later
    /// are newer, so there is nothing more to start for it.
    ahead_started: bool,
    token: T,
}

/// What the caller may do now.
pub struct Ready<F, D> {
    /// Flushes whose writes are all in the store: flush the store, then answer.
    pub flushes: Vec<F>,
    /// Direct ops that may go to the store, with the id to report back.
    pub directs: Vec<(u64, D)>,
}

/// `F` and `D` are the caller's tokens for a waiting flush and direct op.
pub struct DirtyMap<F, D> {
    pieces: BTreeMap<u64, Piece>,
    /// Pieces not being written back, indexed the ways writeback looks
    /// for work, so that it never walks past pieces it cannot take (a
    /// walk per completion over thousands of pieces cost more CPU than
    /// the writes themselves): by offset, all of them and the settled
    /// ones; and by the oldest write they stand for, for flushes.
    idle: BTreeSet<u64>,
    settled_idle: BTreeSet<u64>,
    idle_by_oldest: BTreeSet<(u64, u64)>,
    next_gen: u64,
    next_id: u64,
    /// Obligations by generation: pieces not being written back count by
    /// their `oldest`, writebacks in flight by theirs.
    obligations: BTreeMap<u64, u32>,
    /// Store ops in flight by (start, id). Their ranges never overlap, so
    /// the one that could overlap a range is the last starting before its
    /// end.
    in_flight: BTreeMap<(u64, u64), InFlight>,
    /// Where each op in flight starts, by id.
    in_flight_starts: HashMap<u64, u64>,
    writebacks_in_flight: usize,
    writeback_bytes_in_flight: u64,
    flushes: VecDeque<(u64, F)>,
    directs: VecDeque<DirectWait<D>>,
    /// The first `directs_checked` direct ops were found blocked when
    /// [`ready`](Self::ready) last looked, and `directs_blocked` covers
    /// their ranges. They are looked at again only after something that
    /// can unblock one touched that union (a store op in their range
    /// completed, or a write replaced older bytes there): with hundreds
    /// of direct ops waiting, checking all of them on every
    /// request took a seventh of the server's CPU time.
    directs_checked: usize,
    directs_blocked: RangeUnion,
    recheck_directs: bool,
    dirty_bytes: u64,
    /// Pieces older than this may be written back without pressure.
    settled_gen: u64,
    /// Where the last writeback ended: the next starts after it, so that
    /// runs go out in ascending order like an elevator.
    cursor: u64,
    failed: bool,
}

impl<F, D> Default for DirtyMap<F, D> {
    fn default() -> Self {
        DirtyMap {
            pieces: BTreeMap::new(),
            idle: BTreeSet::new(),
            settled_idle: BTreeSet::new(),
            idle_by_oldest: BTreeSet::new(),
            next_gen: 1,
            next_id: 1,
            obligations: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            in_flight_starts: HashMap::new(),
            writebacks_in_flight: 0,
            writeback_bytes_in_flight: 0,
            flushes: VecDeque::new(),
            directs: VecDeque::new(),
            directs_checked: 0,
            directs_blocked: RangeUnion::default(),
            recheck_directs: false,
            dirty_bytes: 0,
            settled_gen: 0,
            cursor: 0,
            failed: false,
        }
    }
}

fn overlaps(a_start: u64, a_end: u64, b_start: u64, b_end: u64) -> bool {
    a_start < b_end && b_start < a_end
}

impl<F, D> DirtyMap<F, D> {
    /// Bytes of cached data not yet in the store.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes
    }

    pub fn is_clean(&self) -> bool {
        self.pieces.is_empty() && self.in_flight.is_empty()
    }

    /// A writeback failed: nothing more is promised durable.
    pub fn failed(&self) -> bool {
        self.failed
    }

    pub fn writebacks_in_flight(&self) -> usize {
        self.writebacks_in_flight
    }

    /// Bytes being written back now.
    pub fn writeback_bytes_in_flight(&self) -> u64 {
        self.writeback_bytes_in_flight
    }

    fn add_in_flight(&mut self, id: u64, start: u64, end: u64, oldest: Option<u64>) {
        assert!(
            start == end || !self.in_flight_overlaps(start, end),
            "store ops in flight never overlap"
        );
        if oldest.is_some() {
            self.writebacks_in_flight += 1;
            self.writeback_bytes_in_flight += end - start;
        }
        self.in_flight_starts.insert(id, start);
        self.in_flight.insert((start, id), InFlight { end, oldest });
    }

    /// Take op `id` out of flight: (its start, its record).
    fn remove_in_flight(&mut self, id: u64) -> (u64, InFlight) {
        let start = self.in_flight_starts.remove(&id).expect("op in flight");
        let flight = self.in_flight.remove(&(start, id)).expect("op in flight");
        self.note_change(start, flight.end);
        if flight.oldest.is_some() {
            self.writebacks_in_flight -= 1;
            self.writeback_bytes_in_flight -= flight.end - start;
        }
        (start, flight)
    }

    /// Enter the piece at `key` in the idle indexes, or take it out.
    fn index_idle(&mut self, key: u64, gen: u64, oldest: u64, idle: bool) {
        if idle {
            self.idle.insert(key);
            if gen < self.settled_gen {
                self.settled_idle.insert(key);
            }
            self.idle_by_oldest.insert((oldest, key));
        } else {
            self.idle.remove(&key);
            self.settled_idle.remove(&key);
            self.idle_by_oldest.remove(&(oldest, key));
        }
    }

    fn put_piece(&mut self, key: u64, piece: Piece) {
        self.index_idle(key, piece.gen, piece.oldest, piece.writing.is_none());
        self.pieces.insert(key, piece);
    }

    fn take_piece(&mut self, key: u64) -> Piece {
        let piece = self.pieces.remove(&key).expect("piece listed");
        self.index_idle(key, piece.gen, piece.oldest, false);
        piece
    }

    /// Something in `[start, end)` that may have blocked a waiting direct
    /// op is gone.
    fn note_change(&mut self, start: u64, end: u64) {
        if self.directs_blocked.overlaps(start, end) {
            self.recheck_directs = true;
        }
    }

    fn add_obligation(&mut self, gen: u64) {
        *self.obligations.entry(gen).or_default() += 1;
    }

    fn remove_obligation(&mut self, gen: u64) {
        let count = self.obligations.get_mut(&gen).expect("obligation recorded");
        *count -= 1;
        if *count == 0 {
            self.obligations.remove(&gen);
        }
    }

    fn take_gen(&mut self) -> u64 {
        let gen = self.next_gen;
        self.next_gen += 1;
        gen
    }

    /// Cut the pieces overlapping `[start, end)` out of the map, keeping
    /// the parts outside it. Returns the removed parts.
    fn cut(&mut self, start: u64, end: u64) -> Vec<(u64, Piece)> {
        let mut keys: Vec<u64> = self
            .pieces
            .range(..end)
            .rev()
            .take_while(|(_, p)| p.end > start)
            .map(|(k, _)| *k)
            .collect();
        keys.reverse();
        let mut removed = Vec::with_capacity(keys.len());
        for key in keys {
            let piece = self.take_piece(key);
            if key < start {
                let mut head = piece.clone();
                head.end = start;
                self.add_split_obligation(&head);
                self.put_piece(key, head);
            }
            if piece.end > end {
                let mut tail = piece.clone();
                tail.data_at += (end - key) as usize;
                self.add_split_obligation(&tail);
                self.put_piece(end, tail);
            }
            let inner_start = key.max(start);
            let mut inner = piece;
            inner.data_at += (inner_start - key) as usize;
            inner.end = inner.end.min(end);
            // The original piece's obligation moves to the removed part;
            // the kept parts above took their own.
            removed.push((inner_start, inner));
        }
        removed
    }

    fn add_split_obligation(&mut self, part: &Piece) {
        if part.writing.is_none() {
            self.add_obligation(part.oldest);
        }
    }

    /// Cache `data` at `start`; the caller answers the write. Returns its
    /// generation.
    pub fn write(&mut self, start: u64, data: Arc<dyn Bytes>) -> u64 {
        let end = start + data.bytes().len() as u64;
        let gen = self.take_gen();
        let replaced = self.cut(start, end);
        if !replaced.is_empty() {
            self.note_change(start, end);
        }
        let mut covered = start;
        let mut new_parts = Vec::new();
        for (at, old) in replaced {
            self.dirty_bytes -= old.end - at;
            if old.writing.is_none() {
                self.remove_obligation(old.oldest);
            }
            if at > covered {
                new_parts.push((covered, at, gen));
            }
            // Bytes that replace a piece not yet going out stand for its
            // writes too; a writeback in flight keeps its own obligation.
            let oldest = if old.writing.is_none() {
                old.oldest
            } else {
                gen
            };
            new_parts.push((at, old.end, oldest));
            covered = old.end;
        }
        if covered < end {
            new_parts.push((covered, end, gen));
        }
        for (part_start, part_end, oldest) in new_parts {
            self.add_obligation(oldest);
            self.dirty_bytes += part_end - part_start;
            self.put_piece(
                part_start,
                Piece {
                    end: part_end,
                    data: Arc::clone(&data),
                    data_at: (part_start - start) as usize,
                    gen,
                    oldest,
                    writing: None,
                },
            );
        }
        self.merge_around(start, end);
        gen
    }

    /// Join the new write's parts back into one piece where they share
    /// their obligation (keeps the map small for overwrite-heavy loads).
    fn merge_around(&mut self, start: u64, end: u64) {
        let keys: Vec<u64> = self.pieces.range(start..end).map(|(k, _)| *k).collect();
        let mut iter = keys.into_iter();
        let Some(mut prev) = iter.next() else { return };
        for key in iter {
            let (a, b) = (&self.pieces[&prev], &self.pieces[&key]);
            let joinable = a.end == key
                && a.writing.is_none()
                && b.writing.is_none()
                && a.gen == b.gen
                && a.oldest == b.oldest
                && Arc::ptr_eq(&a.data, &b.data)
                && a.data_at + (a.end - prev) as usize == b.data_at;
            if joinable {
                let b = self.take_piece(key);
                self.remove_obligation(b.oldest);
                self.pieces.get_mut(&prev).expect("listed").end = b.end;
            } else {
                prev = key;
            }
        }
    }

    /// Cached bytes overlapping `[start, end)`, in order.
    pub fn spans(&self, start: u64, end: u64) -> Vec<Span> {
        let mut out: Vec<Span> = self
            .pieces
            .range(..end)
            .rev()
            .take_while(|(_, p)| p.end > start)
            .map(|(k, p)| Span {
                start: *k,
                end: p.end,
                data: Arc::clone(&p.data),
                data_at: p.data_at,
            })
            .collect();
        out.reverse();
        out
    }

    /// Whether cached bytes cover all of `[start, end)`.
    pub fn covers(&self, start: u64, end: u64) -> bool {
        spans_cover(&self.spans(start, end), start, end)
    }

    /// A FLUSH covering every write cached so far. It is handed back by
    /// [`ready`](Self::ready) once those writes are in the store.
    pub fn flush(&mut self, token: F) {
        let gen = self.take_gen();
        self.flushes.push_back((gen, token));
    }

    /// An op that must reach the store after the cached data older than it
    /// in `[start, end)`, and before anything newer there. `urgent` if a
    /// client waits on it (not a write larger than the budget, which is
    /// itself write-back). Returns its generation.
    pub fn direct(&mut self, start: u64, end: u64, urgent: bool, token: D) -> u64 {
        let gen = self.take_gen();
        self.directs.push_back(DirectWait {
            gen,
            start,
            end,
            urgent,
            ahead_started: false,
            token,
        });
        gen
    }

    pub fn direct_done(&mut self, id: u64) {
        self.remove_in_flight(id);
    }

    /// Pieces written so far count as settled: background writeback may
    /// take them without memory pressure. Called on a timer, so a piece
    /// waits at least one period for neighbours to join it.
    pub fn settle(&mut self) {
        self.settled_gen = self.next_gen;
        self.settled_idle.clone_from(&self.idle);
    }

    fn in_flight_overlaps(&self, start: u64, end: u64) -> bool {
        // Empty ops overlap nothing; past them, the last op starting
        // before `end` is the only candidate.
        self.in_flight
            .range(..(end, 0))
            .rev()
            .find(|((op_start, _), f)| f.end > *op_start)
            .is_some_and(|((op_start, _), f)| overlaps(*op_start, f.end, start, end))
    }

    /// A piece of generation `gen` over `[start, end)` may go out: nothing
    /// overlapping is in flight, and no waiting direct op older than it
    /// overlaps it.
    fn may_write(&self, start: u64, end: u64, gen: u64) -> bool {
        // Only the unchecked direct ops can overlap outside the union.
        let from = if self.directs_blocked.overlaps(start, end) {
            0
        } else {
            self.directs_checked
        };
        !self.in_flight_overlaps(start, end)
            && !self
                .directs
                .range(from..)
                .any(|d| d.gen < gen && overlaps(d.start, d.end, start, end))
    }

    /// Choose writebacks: at most `runs` of them, together at most about
    /// `bytes` (the last may pass it by one run), each at most
    /// `run_bytes_max` long. Urgent pieces go first: those a waiting direct
    /// op must follow, oldest op first, then those standing for writes a
    /// waiting flush covers, oldest first. Then, in offset order from where
    /// the last run ended (an elevator), any piece with `pressure`, else
    /// settled ones.
    pub fn next_writebacks(
        &mut self,
        runs: usize,
        bytes: u64,
        run_bytes_max: u64,
        pressure: bool,
    ) -> Vec<Writeback> {
        let mut out = Vec::new();
        if self.failed {
            return out;
        }
        let mut chosen_bytes = 0;
        let mut take = |map: &mut Self, out: &mut Vec<Writeback>, key: u64, urgent: bool| {
            if out.len() >= runs || chosen_bytes >= bytes {
                return false;
            }
            if let Some(run) = map.try_run(key, run_bytes_max, urgent) {
                chosen_bytes += run.end - run.start;
                out.push(run);
            }
            true
        };
        if runs == 0 || bytes == 0 {
            return out;
        }
        for index in 0..self.directs.len() {
            let d = &self.directs[index];
            if d.ahead_started {
                continue;
            }
            let (gen, urgent) = (d.gen, d.urgent);
            let ahead: Vec<u64> = self
                .pieces
                .range(..d.end)
                .rev()
                .take_while(|(_, p)| p.end > d.start)
                .filter(|(_, p)| p.writing.is_none() && p.gen < gen)
                .map(|(k, _)| *k)
                .collect();
            self.directs[index].ahead_started = ahead.is_empty();
            for key in ahead {
                if !take(self, &mut out, key, urgent) {
                    return out;
                }
            }
        }
        if let Some(flush_gen) = self.flushes.back().map(|(gen, _)| *gen) {
            let mut from = (0, 0);
            while let Some(&(oldest, key)) = self.idle_by_oldest.range(from..).next() {
                if oldest >= flush_gen || !take(self, &mut out, key, true) {
                    break;
                }
                from = (oldest, key + 1);
            }
        }
        let start = self.cursor;
        let mut pos = start;
        let mut wrapped = false;
        loop {
            let next = {
                let set = if pressure {
                    &self.idle
                } else {
                    &self.settled_idle
                };
                if wrapped {
                    set.range(pos..start).next().copied()
                } else {
                    set.range(pos..).next().copied()
                }
            };
            let Some(key) = next else {
                if wrapped {
                    break;
                }
                wrapped = true;
                pos = 0;
                continue;
            };
            pos = self.pieces[&key].end;
            let before = out.len();
            if !take(self, &mut out, key, false) {
                break;
            }
            if out.len() > before {
                pos = out.last().expect("pushed").end;
            }
            if wrapped && pos >= start {
                break;
            }
        }
        out
    }

    /// Start a writeback at the piece at `key` if it may go now.
    fn try_run(&mut self, key: u64, run_bytes_max: u64, urgent: bool) -> Option<Writeback> {
        let piece = self.pieces.get(&key)?;
        if piece.writing.is_some() || !self.may_write(key, piece.end, piece.gen) {
            return None;
        }
        Some(self.start_run(key, run_bytes_max, urgent))
    }

    /// Mark the run of adjacent writable pieces from `key` as one writeback.
    fn start_run(&mut self, key: u64, run_bytes_max: u64, urgent: bool) -> Writeback {
        let id = self.next_id;
        self.next_id += 1;
        let mut spans = Vec::new();
        let mut oldest = u64::MAX;
        let mut at = key;
        while let Some(piece) = self.pieces.get(&at) {
            let length = piece.end - at;
            let fits = spans.is_empty() || (at - key) + length <= run_bytes_max;
            if piece.writing.is_some() || !fits || !self.may_write(at, piece.end, piece.gen) {
                break;
            }
            let piece = self.pieces.get_mut(&at).expect("checked");
            piece.writing = Some(id);
            let (end, gen, piece_oldest) = (piece.end, piece.gen, piece.oldest);
            spans.push(Span {
                start: at,
                end,
                data: Arc::clone(&piece.data),
                data_at: piece.data_at,
            });
            self.index_idle(at, gen, piece_oldest, false);
            self.remove_obligation(piece_oldest);
            oldest = oldest.min(piece_oldest);
            at = end;
        }
        self.add_obligation(oldest);
        self.add_in_flight(id, key, at, Some(oldest));
        self.cursor = at;
        Writeback {
            id,
            start: key,
            end: at,
            spans,
            urgent,
        }
    }

    /// A writeback finished. On success its pieces leave the map; on
    /// failure they stay (reads still see them) and the map is failed.
    pub fn writeback_done(&mut self, id: u64, ok: bool) {
        let (start, flight) = self.remove_in_flight(id);
        self.remove_obligation(flight.oldest.expect("a writeback"));
        let keys: Vec<u64> = self
            .pieces
            .range(start..flight.end)
            .filter(|(_, p)| p.writing == Some(id))
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            if ok {
                let piece = self.take_piece(key);
                self.dirty_bytes -= piece.end - key;
            } else {
                let piece = self.pieces.get_mut(&key).expect("listed");
                piece.writing = None;
                let (gen, oldest) = (piece.gen, piece.oldest);
                self.index_idle(key, gen, oldest, true);
                self.add_obligation(oldest);
            }
        }
        if !ok {
            self.failed = true;
        }
    }

    /// Flushes and direct ops that may proceed now.
    pub fn ready(&mut self) -> Ready<F, D> {
        let floor = self.obligations.keys().next().copied().unwrap_or(u64::MAX);
        let mut flushes = Vec::new();
        while self.flushes.front().is_some_and(|(gen, _)| *gen < floor) {
            flushes.push(self.flushes.pop_front().expect("checked").1);
        }
        let mut directs = Vec::new();
        let mut index = if self.recheck_directs {
            self.directs_blocked.clear();
            0
        } else {
            self.directs_checked
        };
        // `directs_blocked` covers the ops before `index`, all still
        // waiting: an op overlapping one of them must follow it.
        while index < self.directs.len() {
            let d = &self.directs[index];
            let older_piece = self.spans_with_gen(d.start, d.end).any(|gen| gen < d.gen);
            let older_direct = self.directs_blocked.overlaps(d.start, d.end);
            if older_piece || older_direct || self.in_flight_overlaps(d.start, d.end) {
                self.directs_blocked.insert(d.start, d.end);
                index += 1;
                continue;
            }
            let d = self.directs.remove(index).expect("indexed");
            let id = self.next_id;
            self.next_id += 1;
            self.add_in_flight(id, d.start, d.end, None);
            directs.push((id, d.token));
        }
        self.directs_checked = self.directs.len();
        self.recheck_directs = false;
        Ready { flushes, directs }
    }

    fn spans_with_gen(&self, start: u64, end: u64) -> impl Iterator<Item = u64> + '_ {
        self.pieces
            .range(..end)
            .rev()
            .take_while(move |(_, p)| p.end > start)
            .map(|(_, p)| p.gen)
    }

    /// The indexes agree with the pieces and the ops in flight.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn check_invariants(&self) {
        let idle: BTreeSet<u64> = self
            .pieces
            .iter()
            .filter(|(_, p)| p.writing.is_none())
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(idle, self.idle, "idle index");
        let settled: BTreeSet<u64> = idle
            .iter()
            .copied()
            .filter(|k| self.pieces[k].gen < self.settled_gen)
            .collect();
        assert_eq!(settled, self.settled_idle, "settled index");
        let by_oldest: BTreeSet<(u64, u64)> =
            idle.iter().map(|k| (self.pieces[k].oldest, *k)).collect();
        assert_eq!(by_oldest, self.idle_by_oldest, "oldest index");
        let writebacks: Vec<_> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.oldest.is_some())
            .collect();
        assert_eq!(writebacks.len(), self.writebacks_in_flight);
        let bytes: u64 = writebacks.iter().map(|((start, _), f)| f.end - start).sum();
        assert_eq!(bytes, self.writeback_bytes_in_flight);
        let mut last_end = 0;
        for ((start, id), f) in &self.in_flight {
            assert_eq!(self.in_flight_starts[id], *start);
            if f.end > *start {
                assert!(*start >= last_end, "ops in flight overlap");
                last_end = f.end;
            }
        }
        for piece in self.pieces.values() {
            if let Some(id) = piece.writing {
                assert!(
                    self.in_flight_starts.contains_key(&id),
                    "writing piece's op in flight"
                );
            }
        }
    }

    /// Hand back every waiting flush and direct op (the map has failed and
    /// none of them can be kept).
    pub fn take_waiting(&mut self) -> (Vec<F>, Vec<D>) {
        let flushes = self.flushes.drain(..).map(|(_, f)| f).collect();
        let directs = self.directs.drain(..).map(|d| d.token).collect();
        self.directs_checked = 0;
        self.directs_blocked.clear();
        (flushes, directs)
    }

    /// Ranges with cached bytes in `[start, end)`: they read as data
    /// whatever the store's map says.
    pub fn dirty_ranges(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for span in self.spans(start, end) {
            let (s, e) = (span.start.max(start), span.end.min(end));
            match out.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => out.push((s, e)),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
