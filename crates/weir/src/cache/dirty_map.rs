//! The write-back cache's state, with no I/O in it (sans-IO): which byte
//! ranges hold data newer than the store, what must reach the store before
//! a FLUSH may be answered, and in what order writes may go out.
//!
//! ```text
//!   write ──> piece (newest data for its range; older pieces split or dropped)
//!   pump  ──> writeback: a run of adjacent pieces, copied out, marked writing
//!   flush ──> waits until every write answered before it has reached the
//!             store (its piece written back, or superseded by data that was)
//!   direct──> FUA writes, zeroing, trims and writes past the budget go to the
//!             store themselves, after older cached data in their range
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

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// The bytes of one cached write, shared by the pieces cut from it and by
/// reads and writebacks that copy from it.
pub trait Bytes: Send + Sync {
    fn bytes(&self) -> &[u8];
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
    /// A flush or direct op is waiting for it.
    pub urgent: bool,
}

struct InFlight {
    id: u64,
    start: u64,
    end: u64,
    /// For writebacks: the oldest obligation they carry.
    oldest: Option<u64>,
}

struct DirectWait<T> {
    gen: u64,
    start: u64,
    end: u64,
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
    next_gen: u64,
    next_id: u64,
    /// Obligations by generation: pieces not being written back count by
    /// their `oldest`, writebacks in flight by theirs.
    obligations: BTreeMap<u64, u32>,
    in_flight: Vec<InFlight>,
    flushes: VecDeque<(u64, F)>,
    directs: VecDeque<DirectWait<D>>,
    dirty_bytes: u64,
    /// Pieces older than this may be written back without pressure.
    settled_gen: u64,
    /// Some settled piece may still be waiting to go out.
    settled_left: bool,
    /// Where the last writeback ended: the next starts after it, so that
    /// runs go out in ascending order like an elevator.
    cursor: u64,
    failed: bool,
}

impl<F, D> Default for DirtyMap<F, D> {
    fn default() -> Self {
        DirtyMap {
            pieces: BTreeMap::new(),
            next_gen: 1,
            next_id: 1,
            obligations: BTreeMap::new(),
            in_flight: Vec::new(),
            flushes: VecDeque::new(),
            directs: VecDeque::new(),
            dirty_bytes: 0,
            settled_gen: 0,
            settled_left: false,
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
        self.in_flight.iter().filter(|f| f.oldest.is_some()).count()
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
            let piece = self.pieces.remove(&key).expect("key listed");
            if key < start {
                let mut head = piece.clone();
                head.end = start;
                self.add_split_obligation(&head);
                self.pieces.insert(key, head);
            }
            if piece.end > end {
                let mut tail = piece.clone();
                tail.data_at += (end - key) as usize;
                self.add_split_obligation(&tail);
                self.pieces.insert(end, tail);
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
            self.pieces.insert(
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
                let b = self.pieces.remove(&key).expect("listed");
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
    /// in `[start, end)`, and before anything newer there. Returns its
    /// generation.
    pub fn direct(&mut self, start: u64, end: u64, token: D) -> u64 {
        let gen = self.take_gen();
        self.directs.push_back(DirectWait {
            gen,
            start,
            end,
            token,
        });
        gen
    }

    pub fn direct_done(&mut self, id: u64) {
        self.in_flight.retain(|f| f.id != id);
    }

    /// Pieces written so far count as settled: background writeback may
    /// take them without memory pressure. Called on a timer, so a piece
    /// waits at least one period for neighbours to join it.
    pub fn settle(&mut self) {
        self.settled_gen = self.next_gen;
        self.settled_left = !self.pieces.is_empty();
    }

    fn in_flight_overlaps(&self, start: u64, end: u64) -> bool {
        self.in_flight
            .iter()
            .any(|f| overlaps(f.start, f.end, start, end))
    }

    /// A piece of generation `gen` over `[start, end)` may go out: nothing
    /// overlapping is in flight, and no waiting direct op older than it
    /// overlaps it.
    fn may_write(&self, start: u64, end: u64, gen: u64) -> bool {
        !self.in_flight_overlaps(start, end)
            && !self
                .directs
                .iter()
                .any(|d| d.gen < gen && overlaps(d.start, d.end, start, end))
    }

    /// Whether a piece must go out for a waiting flush or direct op.
    fn urgent(&self, start: u64, piece: &Piece) -> bool {
        let flush_gen = self.flushes.back().map_or(0, |(gen, _)| *gen);
        piece.oldest < flush_gen
            || self
                .directs
                .iter()
                .any(|d| piece.gen < d.gen && overlaps(d.start, d.end, start, piece.end))
    }

    /// Choose writebacks, at most `slots` of them, each at most
    /// `run_bytes_max` long. With `pressure`, any piece may go; otherwise
    /// only urgent and settled ones.
    pub fn next_writebacks(
        &mut self,
        slots: usize,
        run_bytes_max: u64,
        pressure: bool,
    ) -> Vec<Writeback> {
        let mut out = Vec::new();
        if self.failed || slots == 0 {
            return out;
        }
        let waiting = !self.flushes.is_empty() || !self.directs.is_empty();
        let background = pressure || self.settled_left;
        // Urgent pieces first, then the rest; each pass goes once round
        // the map from the cursor.
        for urgent_pass in [true, false] {
            if (urgent_pass && !waiting) || (!urgent_pass && !background) {
                continue;
            }
            let mut found_settled = false;
            let start = self.cursor;
            let mut pos = start;
            let mut wrapped = false;
            loop {
                if out.len() >= slots {
                    return out;
                }
                let next = if wrapped {
                    if pos >= start {
                        break;
                    }
                    self.pieces.range(pos..start).next()
                } else {
                    self.pieces.range(pos..).next()
                };
                let Some((&key, piece)) = next else {
                    if wrapped {
                        break;
                    }
                    wrapped = true;
                    pos = 0;
                    continue;
                };
                pos = piece.end;
                if piece.writing.is_some() {
                    continue;
                }
                let urgent = waiting && self.urgent(key, piece);
                let settled = piece.gen < self.settled_gen;
                found_settled |= settled;
                let wanted = if urgent_pass {
                    urgent
                } else {
                    pressure || settled
                };
                if !wanted || !self.may_write(key, piece.end, piece.gen) {
                    continue;
                }
                let run = self.start_run(key, run_bytes_max, urgent);
                pos = run.end;
                out.push(run);
            }
            if !urgent_pass && !found_settled {
                self.settled_left = false;
            }
        }
        out
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
            let (end, piece_oldest) = (piece.end, piece.oldest);
            spans.push(Span {
                start: at,
                end,
                data: Arc::clone(&piece.data),
                data_at: piece.data_at,
            });
            self.remove_obligation(piece_oldest);
            oldest = oldest.min(piece_oldest);
            at = end;
        }
        self.add_obligation(oldest);
        self.in_flight.push(InFlight {
            id,
            start: key,
            end: at,
            oldest: Some(oldest),
        });
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
        let index = self
            .in_flight
            .iter()
            .position(|f| f.id == id)
            .expect("writeback in flight");
        let flight = self.in_flight.swap_remove(index);
        self.remove_obligation(flight.oldest.expect("a writeback"));
        let keys: Vec<u64> = self
            .pieces
            .range(flight.start..flight.end)
            .filter(|(_, p)| p.writing == Some(id))
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            if ok {
                let piece = self.pieces.remove(&key).expect("listed");
                self.dirty_bytes -= piece.end - key;
            } else {
                let piece = self.pieces.get_mut(&key).expect("listed");
                piece.writing = None;
                let oldest = piece.oldest;
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
        let mut index = 0;
        while index < self.directs.len() {
            let d = &self.directs[index];
            let older_piece = self.spans_with_gen(d.start, d.end).any(|gen| gen < d.gen);
            let older_direct = self
                .directs
                .iter()
                .take(index)
                .any(|e| overlaps(e.start, e.end, d.start, d.end));
            if older_piece || older_direct || self.in_flight_overlaps(d.start, d.end) {
                index += 1;
                continue;
            }
            let d = self.directs.remove(index).expect("indexed");
            let id = self.next_id;
            self.next_id += 1;
            self.in_flight.push(InFlight {
                id,
                start: d.start,
                end: d.end,
                oldest: None,
            });
            directs.push((id, d.token));
        }
        Ready { flushes, directs }
    }

    fn spans_with_gen(&self, start: u64, end: u64) -> impl Iterator<Item = u64> + '_ {
        self.pieces
            .range(..end)
            .rev()
            .take_while(move |(_, p)| p.end > start)
            .map(|(_, p)| p.gen)
    }

    /// Hand back every waiting flush and direct op (the map has failed and
    /// none of them can be kept).
    pub fn take_waiting(&mut self) -> (Vec<F>, Vec<D>) {
        let flushes = self.flushes.drain(..).map(|(_, f)| f).collect();
        let directs = self.directs.drain(..).map(|d| d.token).collect();
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
