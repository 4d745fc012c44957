//! A store with readahead in front: client reads are answered from data
//! read ahead when it holds them, and streams' next windows are read in
//! the async-read class, which the device queue serves below client reads
//! (a deep client's windows, which stand for its own reads, as client
//! reads).
//!
//! Never wrong bytes: a write, TRIM or WRITE_ZEROES drops the read-ahead
//! data it overlaps before it goes down, and a read-ahead whose time in
//! flight overlapped such a write in any way is thrown away when it lands
//! (it may hold the bytes from before). Reads waiting on it then go to the
//! store themselves.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use super::fetches::{Fetch, Fetches, Waiting};
use super::streams::{Plan, Streams};
use super::ReadaheadBudget;
use crate::device::{AlignedBuf, Completion, DeviceOp, Extent, Outcome};
use crate::metrics::ReadaheadReport;
use crate::pool::{PieceDone, Store, StoreInfo};
use crate::sched::IoClass;

/// On flash, read-ahead goes in reads of this many client requests, and
/// on a disk in reads of at least as many.
const PIECE_REQUESTS: u64 = 4;
/// On a disk, a window goes in about this many reads after a first of
/// `PIECE_REQUESTS` requests: its reader waits for that first one, not
/// the whole window (read whole, a QD1 stream beside another on the
/// served HDD model waited up to a second for 32 MiB windows).
const DISK_WINDOW_PIECES: u64 = 8;
/// On a disk, a window's pieces in the device at once (see `State::send`):
/// sent only once the one before had landed, other reads queued meanwhile
/// went between every two of them; all sent at once, two 64 KiB QD1
/// streams on the served HDD model read 0.68-0.73 of its rate, two at a
/// time 0.78-0.81.
const DISK_PIECES_IN_FLIGHT: u32 = 2;
/// On a disk, the windows a deep client's turn takes (see `State::landed`).
const TURN_DEEP_WINDOWS: u32 = 2;
/// A prefetch (NBD_CMD_CACHE) takes at most this share of the read-ahead
/// memory, as one stream's window does beside other readers: a client's
/// hint may not push out what the streams read ahead.
const PREFETCH_MEMORY_SHARE: u64 = 8;
/// The stream that prefetched data belongs to: none that reads.
const PREFETCH_STREAM: u64 = u64::MAX;

/// Read-ahead counts for reports.
#[derive(Debug, Default)]
pub struct ReadaheadCounters {
    /// Client reads answered from read-ahead data (or from a read-ahead
    /// still in flight).
    pub hits: AtomicU64,
    /// Client reads that went to the store.
    pub misses: AtomicU64,
    /// Bytes read ahead.
    pub read_ahead_bytes: AtomicU64,
    /// Bytes read ahead and dropped unread (evicted or overwritten).
    pub wasted_bytes: AtomicU64,
}

struct Segment {
    end: u64,
    buf: AlignedBuf,
    stream: u64,
    /// End of the furthest client read from it: the segment's start while
    /// none has read it, its end once a reader has passed it.
    read_end: u64,
    last_use: u64,
}

/// How a client read is answered.
enum Answer {
    /// Whole, in the caller's buffer.
    Whole(AlignedBuf, Completion),
    /// In pieces of at most `piece_bytes` where the store reads it; whole
    /// where held data or a read-ahead in flight has it.
    Pieces { piece_bytes: u64, landed: PieceDone },
}

impl Answer {
    /// The same answer, telling `stream` first once the whole read is.
    fn then_answered(self, me: Arc<ReadaheadStore>, stream: u64, length: u64) -> Answer {
        match self {
            Answer::Whole(buf, client) => Answer::Whole(
                buf,
                Box::new(move |outcome| {
                    me.state().streams.answered(stream);
                    client(outcome);
                }),
            ),
            Answer::Pieces {
                piece_bytes,
                landed,
            } => {
                let left = AtomicU64::new(length);
                Answer::Pieces {
                    piece_bytes,
                    landed: Arc::new(move |offset, bytes, outcome| {
                        if left.fetch_sub(bytes, Ordering::AcqRel) == bytes {
                            me.state().streams.answered(stream);
                        }
                        landed(offset, bytes, outcome);
                    }),
                }
            }
        }
    }

    /// One buffer for the whole read, and what answers with it.
    fn whole(self, offset: u64, length: u64) -> (AlignedBuf, Completion) {
        match self {
            Answer::Whole(buf, done) => (buf, done),
            Answer::Pieces { landed, .. } => (
                AlignedBuf::new(length as usize),
                Box::new(move |outcome| landed(offset, length, outcome)),
            ),
        }
    }
}

struct WriteInFlight {
    start: u64,
    end: u64,
}

/// How a planned read-ahead is cut into device reads (`register`).
#[derive(Clone, Copy)]
struct Cut {
    first_bytes: u64,
    bytes: u64,
    /// A last read shorter than this joins the one before.
    bytes_min: u64,
}

impl Cut {
    const WHOLE: Cut = Cut {
        first_bytes: u64::MAX,
        bytes: u64::MAX,
        bytes_min: 0,
    };

    /// How to cut `plan`, read ahead for a stream of client reads of
    /// `request` bytes, on a disk (`rotational`) or on flash. On a disk a
    /// window read one request at a time goes in pieces
    /// (`DISK_WINDOW_PIECES`). Beside random readers it
    /// goes whole, as one turn between their reads: its pieces each waited
    /// in the device queue behind the next of them (a 64 KiB QD1 stream
    /// beside a 4 KiB QD1 random reader on the HDD model read 8.9 MB/s
    /// instead of 24). Its window is a quarter of their gap then, and
    /// short to wait for anyway. A deep client's window stands for reads
    /// it waits for all together.
    fn for_plan(plan: &Plan, request: u64, rotational: bool) -> Cut {
        let first = PIECE_REQUESTS * request;
        if !rotational {
            return Cut {
                first_bytes: first,
                bytes: first,
                bytes_min: 0,
            };
        }
        if plan.beside_others || plan.deep {
            return Cut::WHOLE;
        }
        Cut {
            first_bytes: first,
            bytes: (plan.end - plan.start)
                .div_ceil(DISK_WINDOW_PIECES)
                .next_multiple_of(request)
                .max(first),
            bytes_min: first,
        }
    }
}

/// A stream's window in the devices, sent in pieces.
struct Turn {
    start: u64,
    end: u64,
    started_ns: u64,
    /// Its pieces in the devices.
    in_flight: u32,
    /// Windows of the stream's this turn has sent, this one included.
    windows: u32,
    /// A deep client's window (see `State::landed`).
    deep: bool,
    /// End of the furthest piece landed.
    landed_end: u64,
}

#[derive(Default)]
struct State {
    streams: Streams,
    segments: BTreeMap<u64, Segment>,
    /// Per stream, (last use, start) of each of its segments: the least
    /// recently used of a stream that stopped is found without a scan.
    by_use: BTreeMap<u64, BTreeSet<(u64, u64)>>,
    fetches: Fetches,
    writes: BTreeMap<u64, WriteInFlight>,
    /// Per stream, on a disk: the pieces of its windows not yet sent, in
    /// order (see `gate`).
    held: HashMap<u64, VecDeque<(u64, Plan)>>,
    /// Per stream, on a disk: its window in the devices.
    turns: HashMap<u64, Turn>,
    /// Streams whose next window waits for a disk, in the order they
    /// began to wait.
    waiting: VecDeque<u64>,
    /// Disks that serve the volume's reads side by side: windows in the
    /// devices at once.
    read_devices: u32,
    /// Starts of segments in the order their readers passed them: the
    /// first to go when room is needed, found without a scan (a 4 KiB
    /// stream on flash leaves tens of thousands of small segments behind).
    /// An entry whose segment has gone, or been replaced, is skipped.
    passed: VecDeque<u64>,
    next_id: u64,
    clock: u64,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl State {
    /// Which of a stream's new read-aheads go now: all of them, or on a
    /// disk one window at a time per disk, the streams in turns
    /// (`turns_come`), each window's pieces a few at a time (`send`).
    fn gate(
        &mut self,
        pieces: Vec<(u64, Plan)>,
        one_at_a_time: bool,
        now_ns: u64,
    ) -> Vec<(u64, Plan)> {
        if !one_at_a_time || pieces.is_empty() {
            return pieces;
        }
        let stream = pieces[0].1.stream;
        self.held.entry(stream).or_default().extend(pieces);
        if !self.turns.contains_key(&stream) && !self.waiting.contains(&stream) {
            self.waiting.push_back(stream);
        }
        self.turns_come(now_ns)
    }

    /// Windows go in turns, one in the devices per disk that serves reads,
    /// the streams in the order they began to wait. A drive serves what is
    /// nearest its head, so without turns two streams whose windows lie
    /// close together took it in turns while others further off waited
    /// for its age limit (four 64 KiB QD1 streams on the HDD model: one
    /// read 1.3 MB/s while another read 79, and reads waited 2.3 s; in
    /// turns each read 35-40). A stream whose window just landed waits
    /// behind those that waited for it (but see `landed`). On a mirror
    /// each copy serves a stream of its own meanwhile.
    fn turns_come(&mut self, now_ns: u64) -> Vec<(u64, Plan)> {
        let mut now = Vec::new();
        while self.turns.len() < self.read_devices.max(1) as usize {
            let Some(stream) = self.waiting.pop_front() else {
                break;
            };
            let mut held = self.held.remove(&stream).unwrap_or_default();
            self.skip_read_past(stream, &mut held);
            if let Some((turn, pieces)) = self.send(&mut held, 1, now_ns) {
                self.turns.insert(stream, turn);
                now.extend(pieces);
            }
            if !held.is_empty() {
                self.held.insert(stream, held);
            }
        }
        now
    }

    /// The first pieces of the window at the front of `held`, taken from
    /// it, as the `windows`th of a turn. The drive always has the next
    /// piece of the window queued when it finishes one, and that piece
    /// is what it serves next, at the head. Several pieces sent together
    /// may be read in either order, which costs a rotation, so a window
    /// in pieces starts with a short one: what its reader waits for.
    fn send(
        &self,
        held: &mut VecDeque<(u64, Plan)>,
        windows: u32,
        now_ns: u64,
    ) -> Option<(Turn, Vec<(u64, Plan)>)> {
        let (id, first) = held.front()?;
        let end = self.fetches.get(*id).map_or(first.end, |f| f.window_end);
        let mut turn = Turn {
            start: first.start,
            end,
            started_ns: now_ns,
            in_flight: 0,
            windows,
            deep: first.deep,
            landed_end: first.start,
        };
        let mut pieces = Vec::new();
        while turn.in_flight < DISK_PIECES_IN_FLIGHT {
            let Some(piece) = self.take_held(held, end) else {
                break;
            };
            turn.in_flight += 1;
            pieces.push(piece);
        }
        Some((turn, pieces))
    }

    /// The next held piece, if it starts before `end`, taken from `held`.
    /// Whoever came to wait for it while it was held waits for it as for
    /// a client read.
    fn take_held(&self, held: &mut VecDeque<(u64, Plan)>, end: u64) -> Option<(u64, Plan)> {
        let (id, mut plan) = held.pop_front_if(|(_, p)| p.start < end)?;
        plan.urgent = self.fetches.get(id).is_some_and(|f| f.urgent);
        Some((id, plan))
    }

    /// Drop `stream`'s held read-aheads that its reader already read past
    /// by itself and nobody waits for.
    fn skip_read_past(&mut self, stream: u64, held: &mut VecDeque<(u64, Plan)>) {
        let frontier = self.streams.frontier(stream).unwrap_or(0);
        while let Some((id, _)) = held.front().filter(|(id, plan)| {
            plan.end <= frontier && self.fetches.get(*id).is_some_and(|f| f.waiting.is_empty())
        }) {
            let id = *id;
            self.fetches.remove(id);
            held.pop_front();
        }
    }

    /// A piece of `stream`'s window ending at `end` is back: the window's
    /// next piece goes now. Once the window is all in, it tells the
    /// streams what it cost. A deep client's window takes the client's
    /// next one along in its turn: the client waits for all of each (see
    /// `Plan::deep`), and the seek saved is the other readers' gain too
    /// (two 4 KiB streams four deep on the HDD model read 154 MB/s a window
    /// per turn, 183 two). Any other window ends the turn, since the other
    /// streams' readers wait through it, and the stream's next one waits
    /// for its turn (`turns_come`), unless the stream's reader has not
    /// read since the window was sent and waits for none of them. Then
    /// its held ones are dropped: a reader that stopped (or that reads
    /// slower than its disk) would otherwise leave a queue of windows to
    /// take the disk from the readers that remain. Its next read plans
    /// again from where the dropped ones began.
    fn landed(&mut self, stream: u64, end: u64, waited_for: bool, now_ns: u64) -> Vec<(u64, Plan)> {
        let Some(turn) = self.turns.get_mut(&stream) else {
            return Vec::new();
        };
        turn.in_flight -= 1;
        turn.landed_end = turn.landed_end.max(end);
        let (turn_end, in_flight) = (turn.end, turn.in_flight);
        let mut held = self.held.remove(&stream).unwrap_or_default();
        // What the reader already read by itself need not come again.
        self.skip_read_past(stream, &mut held);
        let next = self.take_held(&mut held, turn_end);
        if next.is_some() || in_flight > 0 {
            if !held.is_empty() {
                self.held.insert(stream, held);
            }
            let turn = self.turns.get_mut(&stream).expect("looked up above");
            turn.in_flight += u32::from(next.is_some());
            return next.into_iter().collect();
        }
        let turn = self.turns.remove(&stream).expect("looked up above");
        self.streams.window_served(
            turn.landed_end - turn.start,
            now_ns.saturating_sub(turn.started_ns),
        );
        let waited_for = waited_for
            || held
                .iter()
                .any(|(id, _)| self.fetches.get(*id).is_some_and(|f| !f.waiting.is_empty()));
        if !(waited_for || self.streams.read_since(stream, turn.started_ns)) {
            if let Some((_, first)) = held.front() {
                self.streams.rewind(stream, first.start);
            }
            for (id, _) in &held {
                self.fetches.remove(*id);
            }
            held.clear();
        }
        if turn.deep
            && turn.windows < TURN_DEEP_WINDOWS
            && held.front().is_some_and(|(_, p)| p.deep)
        {
            if let Some((next, pieces)) = self.send(&mut held, turn.windows + 1, now_ns) {
                self.turns.insert(stream, next);
                if !held.is_empty() {
                    self.held.insert(stream, held);
                }
                return pieces;
            }
        }
        if !held.is_empty() {
            self.held.insert(stream, held);
            self.waiting.push_back(stream);
        }
        self.turns_come(now_ns)
    }

    /// The starts of the held segments that together cover
    /// `[offset, end)`, in order, if they do.
    fn covering(&self, offset: u64, end: u64) -> Option<Vec<u64>> {
        let mut at = offset;
        let mut pieces = Vec::new();
        for (&start, segment) in self.segments.range(..end).rev() {
            if segment.end <= offset {
                break;
            }
            pieces.push(start);
        }
        pieces.reverse();
        for &start in &pieces {
            if start > at {
                return None;
            }
            at = at.max(self.segments[&start].end);
        }
        (at >= end).then_some(pieces)
    }

    /// Copy `[offset, offset + buf.len())` from held segments if they
    /// cover all of it.
    fn take_from_segments(&mut self, offset: u64, buf: &mut AlignedBuf) -> bool {
        let end = offset + buf.len() as u64;
        let Some(pieces) = self.covering(offset, end) else {
            return false;
        };
        self.clock += 1;
        let out = buf.as_mut_slice();
        for start in pieces {
            let segment = self.segments.get_mut(&start).expect("listed above");
            let from = offset.max(start);
            let to = end.min(segment.end);
            out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(
                &segment.buf.as_slice()[(from - start) as usize..(to - start) as usize],
            );
            let was_passed = segment.read_end >= segment.end;
            segment.read_end = segment.read_end.max(to);
            let used = self.by_use.entry(segment.stream).or_default();
            used.remove(&(segment.last_use, start));
            used.insert((self.clock, start));
            segment.last_use = self.clock;
            if !was_passed && segment.read_end >= segment.end {
                self.passed.push_back(start);
            }
        }
        // Entries whose segments went another way (overwritten, replaced)
        // are dropped once they outnumber the segments.
        if self.passed.len() > 2 * self.segments.len() + 64 {
            let segments = &self.segments;
            self.passed
                .retain(|start| segments.get(start).is_some_and(|s| s.read_end >= s.end));
        }
        true
    }

    fn hold_segment(&mut self, start: u64, segment: Segment) {
        self.by_use
            .entry(segment.stream)
            .or_default()
            .insert((segment.last_use, start));
        if let Some(old) = self.segments.insert(start, segment) {
            self.unindex(start, &old);
        }
    }

    fn remove_segment(&mut self, start: u64) -> Option<Segment> {
        let segment = self.segments.remove(&start)?;
        self.unindex(start, &segment);
        Some(segment)
    }

    /// `by_use` lists exactly the segments held.
    #[cfg(test)]
    fn use_index_matches(&self) -> bool {
        let held: BTreeSet<(u64, u64, u64)> = self
            .segments
            .iter()
            .map(|(&start, s)| (s.stream, s.last_use, start))
            .collect();
        let indexed: BTreeSet<(u64, u64, u64)> = self
            .by_use
            .iter()
            .flat_map(|(&stream, used)| used.iter().map(move |&(u, start)| (stream, u, start)))
            .collect();
        held == indexed && self.by_use.values().all(|used| !used.is_empty())
    }

    fn unindex(&mut self, start: u64, segment: &Segment) {
        if let Some(used) = self.by_use.get_mut(&segment.stream) {
            used.remove(&(segment.last_use, start));
            if used.is_empty() {
                self.by_use.remove(&segment.stream);
            }
        }
    }

    /// Drop the segments overlapping `[start, end)`. Returns the bytes
    /// dropped unread.
    fn drop_segments(&mut self, start: u64, end: u64, budget: &ReadaheadBudget) -> u64 {
        // Segments never overlap: going back from `end`, the first that
        // ends by `start` is the last to look at.
        let doomed: Vec<u64> = self
            .segments
            .range(..end)
            .rev()
            .take_while(|(_, seg)| seg.end > start)
            .map(|(s, _)| *s)
            .collect();
        let mut wasted = 0;
        for s in doomed {
            let segment = self.remove_segment(s).expect("listed above");
            budget.release(segment.end - s);
            wasted += segment.end - segment.read_end.max(s);
        }
        wasted
    }

    /// Drop the segments overlapping `[start, end)`; mark fetches in
    /// flight there stale. Returns the bytes dropped unread.
    fn invalidate(&mut self, start: u64, end: u64, budget: &ReadaheadBudget) -> u64 {
        let wasted = self.drop_segments(start, end, budget);
        self.fetches.mark_stale(start, end);
        wasted
    }

    fn write_in_flight_over(&self, start: u64, end: u64) -> bool {
        self.writes
            .values()
            .any(|w| overlaps((w.start, w.end), (start, end)))
    }

    /// Make room for `bytes` under the budget at `now_ns`: first this
    /// volume's segments that their readers have passed, then those of
    /// streams no longer reading, then the rest, least recently used first
    /// within each. A sequential reader seldom reads again what it passed,
    /// a segment it is part way through holds its next reads, and a
    /// stream that stopped will not read what it left. Each stream is told
    /// where its unread data went (`Streams::evicted`). Returns false if
    /// it cannot.
    fn make_room(
        &mut self,
        bytes: u64,
        budget: &ReadaheadBudget,
        wasted: &mut u64,
        now_ns: u64,
    ) -> bool {
        while budget.held_bytes() + bytes > budget.limit_bytes() {
            let Some(start) = self.passed.pop_front() else {
                break;
            };
            if self
                .segments
                .get(&start)
                .is_some_and(|s| s.read_end >= s.end)
            {
                let segment = self.remove_segment(start).expect("found above");
                budget.release(segment.end - start);
            }
        }
        // Every segment readers passed went above, so what is left is
        // unread: a stopped stream's first, least recently used first.
        while budget.held_bytes() + bytes > budget.limit_bytes() {
            let streams = &self.streams;
            let oldest = |reading: bool| {
                self.by_use
                    .iter()
                    .filter(|(stream, _)| streams.reading(**stream, now_ns) == reading)
                    .filter_map(|(_, used)| used.first())
                    .min()
                    .copied()
            };
            let Some((_, start)) = oldest(false).or_else(|| oldest(true)) else {
                break;
            };
            let segment = self.remove_segment(start).expect("indexed");
            budget.release(segment.end - start);
            let unread_from = segment.read_end.max(start);
            if unread_from < segment.end {
                *wasted += segment.end - unread_from;
                self.streams.evicted(segment.stream, unread_from);
            }
        }
        budget.held_bytes() + bytes <= budget.limit_bytes()
    }
}

pub struct ReadaheadStore {
    inner: Arc<dyn Store>,
    state: Mutex<State>,
    budget: Arc<ReadaheadBudget>,
    counters: ReadaheadCounters,
    clock: Clock,
    me: Weak<ReadaheadStore>,
}

/// Nanoseconds on the clock streams are timed by: real time in a server,
/// virtual time in the simulator.
pub type Clock = Box<dyn Fn() -> u64 + Send + Sync>;

impl ReadaheadStore {
    pub fn new(inner: Arc<dyn Store>, budget: &Arc<ReadaheadBudget>) -> Arc<ReadaheadStore> {
        let epoch = Instant::now();
        Self::with_clock(
            inner,
            budget,
            Box::new(move || epoch.elapsed().as_nanos() as u64),
        )
    }

    pub fn with_clock(
        inner: Arc<dyn Store>,
        budget: &Arc<ReadaheadBudget>,
        clock: Clock,
    ) -> Arc<ReadaheadStore> {
        let streams = Streams::new(inner.info().rotational);
        let read_devices = inner.info().read_devices;
        Arc::new_cyclic(|me| ReadaheadStore {
            inner,
            state: Mutex::new(State {
                streams,
                read_devices,
                ..State::default()
            }),
            budget: Arc::clone(budget),
            counters: ReadaheadCounters::default(),
            clock,
            me: me.clone(),
        })
    }

    pub fn counters(&self) -> &ReadaheadCounters {
        &self.counters
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("readahead state lock")
    }

    /// A client read of `[offset, offset + length)`: it feeds `streams`
    /// once however it is answered, and is answered from held data, from
    /// a read-ahead in flight that covers it, or else by the store.
    fn client_read(&self, offset: u64, length: u64, answer: Answer) {
        let info = self.inner.info();
        let me = self.me.upgrade().expect("a store reads while it lives");
        let end = offset + length;
        let mut state = self.state();
        // The whole bound: volumes that read ahead at once compete for it,
        // each making room from its own segments (`make_room`).
        let memory = self.budget.limit_bytes();
        let now_ns = (self.clock)();
        let (stream, plan) = state.streams.on_read(
            offset,
            length,
            memory,
            u64::from(info.block_bytes),
            info.size_bytes,
            now_ns,
        );
        let answer = answer.then_answered(me, stream, length);
        let request = length.max(u64::from(info.block_bytes));
        let read_ahead = plan.map_or_else(Vec::new, |plan| {
            let cut = Cut::for_plan(&plan, request, info.rotational);
            let pieces = self.register(&mut state, plan, cut);
            state.gate(pieces, info.rotational, now_ns)
        });
        let answered = if let Some(starts) = state.covering(offset, end) {
            let (mut buf, done) = answer.whole(offset, length);
            let own = starts
                .iter()
                .all(|start| state.segments[start].stream == stream);
            let held = state.take_from_segments(offset, &mut buf);
            assert!(held, "covered above");
            state.streams.held_read(stream, own);
            Ok((buf, done))
        } else if let Some(fetch) = state.fetches.covering_mut(offset, end) {
            let (buf, done) = answer.whole(offset, length);
            fetch.waiting.push(Waiting { offset, buf, done });
            let promote = (!fetch.urgent).then(|| {
                fetch.urgent = true;
                (fetch.start, fetch.end - fetch.start)
            });
            drop(state);
            if let Some((start, length)) = promote {
                self.inner.promote(start, length);
            }
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            for piece in read_ahead {
                self.fetch(piece);
            }
            return;
        } else {
            Err(answer)
        };
        drop(state);
        match answered {
            Ok((buf, done)) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                done(Outcome {
                    result: Ok(()),
                    buf: Some(buf),
                    hole: false,
                });
            }
            Err(Answer::Whole(buf, done)) => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                self.inner
                    .submit(IoClass::SyncRead, DeviceOp::Read { offset, buf }, done);
            }
            Err(Answer::Pieces {
                piece_bytes,
                landed,
            }) => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                self.inner
                    .read_in_pieces(offset, length, piece_bytes, landed);
            }
        }
        for piece in read_ahead {
            self.fetch(piece);
        }
    }

    /// Read `[offset, offset + length)` ahead, up to the prefetch share of
    /// the memory, unless it is held or being read already. It goes in
    /// the async-read class, as read-ahead does, in reads of at most the
    /// share: a client read that comes for it waits as for a read-ahead.
    fn prefetch_range(&self, offset: u64, length: u64) {
        let block = u64::from(self.inner.info().block_bytes).max(1);
        let share = self.budget.limit_bytes() / PREFETCH_MEMORY_SHARE;
        let length = length.min(share) / block * block;
        if length == 0 {
            return;
        }
        let end = offset + length;
        let pieces = {
            let mut state = self.state();
            let busy = state.covering(offset, end).is_some()
                || state.fetches.covering_mut(offset, end).is_some();
            if busy {
                return;
            }
            let plan = Plan {
                stream: PREFETCH_STREAM,
                start: offset,
                end,
                urgent: false,
                deep: false,
                beside_others: false,
            };
            self.register(&mut state, plan, Cut::WHOLE)
        };
        for piece in pieces {
            self.fetch(piece);
        }
    }

    /// Note a planned read-ahead as in flight, in reads cut as `cut` says:
    /// on flash the drive serves them side by side and other readers'
    /// reads find their turn between them; on a disk they go a few at a
    /// time (`gate`), since several reads of one window sent together
    /// were reordered by the drive, a rotation lost per read. Returns each
    /// read's id and range.
    fn register(&self, state: &mut State, plan: Plan, cut: Cut) -> Vec<(u64, Plan)> {
        let mut pieces = Vec::new();
        let mut start = plan.start;
        while start < plan.end {
            let bytes = if start == plan.start {
                cut.first_bytes
            } else {
                cut.bytes
            };
            let mut end = start.saturating_add(bytes).min(plan.end);
            if plan.end - end < cut.bytes_min {
                end = plan.end;
            }
            state.next_id += 1;
            let id = state.next_id;
            // The reader waits for the start of an urgent plan, and a deep
            // client for all of its plan: read ahead in the background
            // class, below the very reads it keeps in flight, its windows
            // went at a fraction of the drive (16 KiB reads sixteen at a
            // time on the NVMe model, adaptive queue: 0.89x their rate
            // without read-ahead, 1.81x sent as client reads).
            let urgent = plan.deep || (plan.urgent && start == plan.start);
            let stale = state.write_in_flight_over(start, end);
            state.fetches.insert(
                id,
                Fetch {
                    start,
                    end,
                    stream: plan.stream,
                    window_end: plan.end,
                    stale,
                    urgent,
                    waiting: Vec::new(),
                },
            );
            pieces.push((
                id,
                Plan {
                    start,
                    end,
                    urgent,
                    ..plan
                },
            ));
            start = end;
        }
        pieces
    }

    fn fetch(&self, (id, plan): (u64, Plan)) {
        let length = plan.end - plan.start;
        self.counters
            .read_ahead_bytes
            .fetch_add(length, Ordering::Relaxed);
        let me = self
            .me
            .upgrade()
            .expect("a store reads ahead while it lives");
        let class = if plan.urgent {
            IoClass::SyncRead
        } else {
            IoClass::AsyncRead
        };
        self.inner.submit(
            class,
            DeviceOp::Read {
                offset: plan.start,
                buf: AlignedBuf::new(length as usize),
            },
            Box::new(move |outcome| me.fetched(id, outcome)),
        );
    }

    fn fetched(&self, id: u64, outcome: Outcome) {
        let mut state = self.state();
        let fetch = state.fetches.remove(id).expect("a fetch lands once");
        let now_ns = (self.clock)();
        let next = state.landed(fetch.stream, fetch.end, !fetch.waiting.is_empty(), now_ns);
        let length = fetch.end - fetch.start;
        let stale = fetch.stale || state.write_in_flight_over(fetch.start, fetch.end);
        let data = match (outcome.result, outcome.buf) {
            (Ok(()), Some(mut buf)) if !stale => {
                if outcome.hole {
                    buf.as_mut_slice().fill(0);
                }
                Some(buf)
            }
            _ => None,
        };
        let Some(data) = data else {
            drop(state);
            for piece in next {
                self.fetch(piece);
            }
            self.counters
                .wasted_bytes
                .fetch_add(length, Ordering::Relaxed);
            for w in fetch.waiting {
                self.inner.submit(
                    IoClass::SyncRead,
                    DeviceOp::Read {
                        offset: w.offset,
                        buf: w.buf,
                    },
                    w.done,
                );
            }
            return;
        };
        let mut answers = Vec::with_capacity(fetch.waiting.len());
        let mut read_end = fetch.start;
        for mut w in fetch.waiting {
            let from = (w.offset - fetch.start) as usize;
            let len = w.buf.len();
            w.buf
                .as_mut_slice()
                .copy_from_slice(&data.as_slice()[from..from + len]);
            read_end = read_end.max(w.offset + len as u64);
            answers.push(w);
        }
        // Held data this range overlaps (read ahead for another stream, or
        // for an earlier pass over it) goes: the newer bytes stay, and
        // segments never overlap, which `take_from_segments` relies on.
        let mut wasted = state.drop_segments(fetch.start, fetch.end, &self.budget);
        if state.make_room(length, &self.budget, &mut wasted, now_ns) {
            state.clock += 1;
            let last_use = state.clock;
            self.budget.hold(length);
            state.hold_segment(
                fetch.start,
                Segment {
                    end: fetch.end,
                    buf: data,
                    stream: fetch.stream,
                    read_end,
                    last_use,
                },
            );
            if read_end >= fetch.end {
                state.passed.push_back(fetch.start);
            }
        } else {
            wasted += fetch.end - read_end;
        }
        drop(state);
        for piece in next {
            self.fetch(piece);
        }
        self.counters
            .wasted_bytes
            .fetch_add(wasted, Ordering::Relaxed);
        for w in answers {
            (w.done)(Outcome {
                result: Ok(()),
                buf: Some(w.buf),
                hole: false,
            });
        }
    }

    fn changing(&self, class: IoClass, op: DeviceOp, done: Completion) {
        let (start, length) = op.range();
        let end = start + length;
        let id = {
            let mut state = self.state();
            let wasted = state.invalidate(start, end, &self.budget);
            self.counters
                .wasted_bytes
                .fetch_add(wasted, Ordering::Relaxed);
            state.next_id += 1;
            let id = state.next_id;
            state.writes.insert(id, WriteInFlight { start, end });
            id
        };
        let me = self.me.upgrade().expect("a store writes while it lives");
        self.inner.submit(
            class,
            op,
            Box::new(move |outcome| {
                me.state().writes.remove(&id);
                done(outcome);
            }),
        );
    }
}

impl ReadaheadReport for ReadaheadStore {
    fn counts(&self) -> (u64, u64, u64, u64) {
        let c = &self.counters;
        (
            c.hits.load(Ordering::Relaxed),
            c.misses.load(Ordering::Relaxed),
            c.read_ahead_bytes.load(Ordering::Relaxed),
            c.wasted_bytes.load(Ordering::Relaxed),
        )
    }

    fn held_bytes(&self) -> (u64, u64) {
        (self.budget.held_bytes(), self.budget.limit_bytes())
    }
}

impl Drop for ReadaheadStore {
    fn drop(&mut self) {
        let state = self.state.get_mut().expect("readahead state lock");
        let held: u64 = state.segments.iter().map(|(s, seg)| seg.end - s).sum();
        self.budget.release(held);
    }
}

impl Store for ReadaheadStore {
    fn info(&self) -> &StoreInfo {
        self.inner.info()
    }

    fn submit(&self, class: IoClass, op: DeviceOp, done: Completion) {
        match op {
            DeviceOp::Read { offset, buf } if class == IoClass::SyncRead => {
                self.client_read(offset, buf.len() as u64, Answer::Whole(buf, done))
            }
            DeviceOp::Write { .. } | DeviceOp::Discard { .. } | DeviceOp::WriteZeroes { .. } => {
                self.changing(class, op, done)
            }
            op => self.inner.submit(class, op, done),
        }
    }

    fn promote(&self, offset: u64, length: u64) {
        self.inner.promote(offset, length)
    }

    fn prefetch(&self, offset: u64, length: u64) {
        self.prefetch_range(offset, length)
    }

    fn read_piece_bytes(&self) -> Option<u64> {
        self.inner.read_piece_bytes()
    }

    /// One client read to `streams`, however many pieces answer it: read
    /// as several reads in flight, a stream's pieces would look like a
    /// client that keeps reads queued, which gets no read-ahead.
    fn read_in_pieces(&self, offset: u64, length: u64, piece_bytes: u64, landed: PieceDone) {
        self.client_read(
            offset,
            length,
            Answer::Pieces {
                piece_bytes,
                landed,
            },
        )
    }

    fn extents(&self, offset: u64, length: u64, extents_max: usize) -> io::Result<Vec<Extent>> {
        self.inner.extents(offset, length, extents_max)
    }
}

#[cfg(test)]
mod tests;
