//! The per-device queue as a sans-IO state machine: I/Os come in tagged
//! with their class, the mode decides which goes to the device next, and
//! completions feed back. Driven in real time by `DeviceQueue` and in
//! virtual time by the simulator; it never reads a clock.
//!
//! ```text
//!  enqueue(io, now) ──> class queues (sync, and read-ahead on flash: FIFO;
//!                       others: LBA order, aged)
//!  next_to_issue(now) ──> mode picks a class (fifo / zfs / adaptive)
//!                         ──> the I/O, merged with adjacent ones of its class
//!  complete(id, now) ──> the merged I/Os back; latency feeds the mode
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use super::adaptive::Adaptive;
use super::zfs::Zfs;
use super::{ClassActivity, IoClass, CLASSES};
use crate::device::model::{Nanos, NANOS_PER_SEC};

/// Nothing waits longer than this for its class to pick it (LBA classes).
const AGE_BOUND_NS: Nanos = 2 * NANOS_PER_SEC;
/// Merged I/Os stay within this span: rotating devices gain from large
/// transfers, flash much less (OpenZFS uses the same two limits).
const MERGE_LIMIT_ROTATING: u64 = 1 << 20;
const MERGE_LIMIT_FLASH: u64 = 128 << 10;
/// A read may span a hole this large between merged reads (read and dropped).
const READ_GAP_BYTES: u64 = 32 << 10;

/// How a device queue chooses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// No scheduling: every I/O goes to the device at once, in order.
    Fifo,
    /// OpenZFS's vdev queue (after PR 11166), with its default numbers.
    Zfs,
    /// weir's own: background depth from measured interactive latency.
    #[default]
    Adaptive,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Fifo, Mode::Zfs, Mode::Adaptive];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Fifo => "fifo",
            Mode::Zfs => "zfs",
            Mode::Adaptive => "adaptive",
        }
    }

    pub fn parse(text: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == text)
    }
}

/// One I/O as the queue sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuedIo {
    pub id: u64,
    pub class: IoClass,
    pub offset: u64,
    pub length: u64,
    pub write: bool,
}

/// What goes to the device: one I/O, or several adjacent ones merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatch {
    /// The first I/O's id; `complete` takes it.
    pub id: u64,
    pub class: IoClass,
    pub offset: u64,
    pub length: u64,
    pub write: bool,
    /// The I/Os it completes: one, several merged, or none for a piece
    /// that is not its I/O's last.
    pub ios: Vec<QueuedIo>,
    /// A piece of this I/O (id), sent in pieces.
    pub piece_of: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
struct Waiting {
    io: QueuedIo,
    since: Nanos,
}

/// The I/Os of one class waiting their turn.
#[derive(Default)]
struct ClassQueue {
    /// Keyed by (offset, seq) for LBA-ordered classes, (0, seq) for FIFO ones.
    by_key: BTreeMap<(u64, u64), Waiting>,
    /// (enqueued at, seq) -> key, for the age bound.
    by_age: BTreeSet<(Nanos, u64, (u64, u64))>,
    bytes: u64,
}

impl ClassQueue {
    fn len(&self) -> usize {
        self.by_key.len()
    }

    fn insert(&mut self, key: (u64, u64), waiting: Waiting) {
        self.bytes += waiting.io.length;
        self.by_age.insert((waiting.since, key.1, key));
        self.by_key.insert(key, waiting);
    }

    fn remove(&mut self, key: (u64, u64)) -> Waiting {
        let waiting = self.by_key.remove(&key).expect("queued");
        self.by_age.remove(&(waiting.since, key.1, key));
        self.bytes -= waiting.io.length;
        waiting
    }
}

struct InFlight {
    class: IoClass,
    /// The mode that issued it hears of its completion, even if the mode
    /// changed meanwhile.
    mode: Mode,
    issued: Nanos,
    length: u64,
    /// What the adaptive mode needs back at completion.
    token: u64,
    ios: Vec<QueuedIo>,
    /// A piece of this I/O (split), rather than whole I/Os.
    piece_of: Option<u64>,
}

/// An I/O sent in pieces: it completes with its last piece.
struct Split {
    io: QueuedIo,
    in_flight: u32,
    rest_queued: bool,
}

/// Piece dispatch ids live apart from I/O ids.
const PIECE_IDS_FROM: u64 = 1 << 62;

pub struct IoQueue {
    mode: Mode,
    rotational: bool,
    merge_limit: u64,
    fifo: VecDeque<Waiting>,
    classes: [ClassQueue; CLASSES],
    active: [u32; CLASSES],
    active_bytes: [u64; CLASSES],
    active_total: u32,
    in_flight: HashMap<u64, InFlight>,
    next_seq: u64,
    /// End of the last LBA-ordered dispatch: the elevator continues there.
    last_end: u64,
    zfs: Zfs,
    adaptive: Adaptive,
    splits: HashMap<u64, Split>,
    /// Piece dispatch id -> the I/O it is a piece of.
    piece_owner: HashMap<u64, u64>,
    next_piece_id: u64,
}

impl IoClass {
    /// FIFO classes keep arrival order; the others go in LBA order.
    pub fn is_fifo(self) -> bool {
        matches!(self, IoClass::SyncRead | IoClass::SyncWrite | IoClass::Trim)
    }

    /// A client waits on this very I/O; everything else is background to
    /// the adaptive mode.
    pub fn is_sync(self) -> bool {
        matches!(self, IoClass::SyncRead | IoClass::SyncWrite)
    }

    /// Not scrub or resilver (OpenZFS's "interactive").
    pub fn is_interactive(self) -> bool {
        !matches!(self, IoClass::Scrub | IoClass::Resilver)
    }
}

impl IoQueue {
    pub fn new(mode: Mode, rotational: bool) -> IoQueue {
        IoQueue {
            mode,
            rotational,
            merge_limit: if rotational {
                MERGE_LIMIT_ROTATING
            } else {
                MERGE_LIMIT_FLASH
            },
            fifo: VecDeque::new(),
            classes: Default::default(),
            active: [0; CLASSES],
            active_bytes: [0; CLASSES],
            active_total: 0,
            in_flight: HashMap::new(),
            next_seq: 0,
            last_end: 0,
            zfs: Zfs::default(),
            adaptive: Adaptive::new(rotational),
            splits: HashMap::new(),
            piece_owner: HashMap::new(),
            next_piece_id: PIECE_IDS_FROM,
        }
    }

    /// Split, but never merge: a driver that can give each piece a buffer
    /// of its own, but keeps one completion per submitted I/O.
    pub fn splitting_only(mut self) -> IoQueue {
        self.merge_limit = 0;
        self
    }

    /// A client now waits for the read-ahead queued over
    /// `[offset, offset + length)`: it becomes a client read, and goes in
    /// turn with them. Returns how many I/Os moved.
    pub fn promote(&mut self, offset: u64, length: u64, now: Nanos) -> usize {
        let end = offset + length;
        let over = |io: &QueuedIo| {
            io.class == IoClass::AsyncRead && io.offset < end && offset < io.offset + io.length
        };
        if self.mode == Mode::Fifo {
            let mut moved = 0;
            for waiting in self.fifo.iter_mut().filter(|w| over(&w.io)) {
                waiting.io.class = IoClass::SyncRead;
                moved += 1;
            }
            return moved;
        }
        let keys: Vec<(u64, u64)> = self.classes[IoClass::AsyncRead as usize]
            .by_key
            .iter()
            .filter(|(_, w)| over(&w.io))
            .map(|(key, _)| *key)
            .collect();
        for key in &keys {
            let waiting = self.classes[IoClass::AsyncRead as usize].remove(*key);
            let io = QueuedIo {
                class: IoClass::SyncRead,
                ..waiting.io
            };
            let seq = self.next_seq;
            self.next_seq += 1;
            self.classes[IoClass::SyncRead as usize].insert((0, seq), Waiting { io, since: now });
        }
        keys.len()
    }

    /// Change mode at run time; waiting I/Os move to the new structure.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn set_mode(&mut self, mode: Mode, now: Nanos) {
        if mode == self.mode {
            return;
        }
        let mut waiting: Vec<Waiting> = self.fifo.drain(..).collect();
        for class in &mut self.classes {
            let keys: Vec<(u64, u64)> = class.by_key.keys().copied().collect();
            waiting.extend(keys.into_iter().map(|k| class.remove(k)));
        }
        waiting.sort_by_key(|w| w.since);
        self.mode = mode;
        for w in waiting {
            self.enqueue(w.io, w.since.min(now));
        }
    }

    pub fn enqueue(&mut self, io: QueuedIo, now: Nanos) {
        let waiting = Waiting { io, since: now };
        if self.mode == Mode::Fifo {
            self.fifo.push_back(waiting);
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let key = if io.class.is_fifo() {
            (0, seq)
        } else {
            (io.offset, seq)
        };
        self.classes[io.class as usize].insert(key, waiting);
    }

    /// The next device operation, if the mode lets one go now.
    pub fn next_to_issue(&mut self, now: Nanos) -> Option<Dispatch> {
        let dispatch = match self.mode {
            Mode::Fifo => {
                let w = self.fifo.pop_front()?;
                if self.splits.contains_key(&w.io.id) {
                    // The rest of an I/O split before a switch to fifo:
                    // it goes whole, as its last piece.
                    self.take_piece(w.io, w.since, None)
                } else {
                    Dispatch {
                        id: w.io.id,
                        class: w.io.class,
                        offset: w.io.offset,
                        length: w.io.length,
                        write: w.io.write,
                        ios: vec![w.io],
                        piece_of: None,
                    }
                }
            }
            Mode::Zfs | Mode::Adaptive => {
                let queued = self.activity();
                let class = match self.mode {
                    Mode::Zfs => self.zfs.class_to_issue(&queued, self.async_write_bytes()),
                    _ => self.adaptive.class_to_issue(&queued, now),
                }?;
                self.take(class, now)
            }
        };
        let class = dispatch.class;
        self.active[class as usize] += 1;
        self.active_bytes[class as usize] += dispatch.length;
        self.active_total += 1;
        let token = match self.mode {
            Mode::Zfs => {
                self.zfs.issued(class);
                0
            }
            Mode::Adaptive => {
                let activity = self.activity();
                self.adaptive.issued(class, now, &activity, dispatch.length)
            }
            Mode::Fifo => 0,
        };
        let piece_of = self.piece_owner.remove(&dispatch.id);
        self.in_flight.insert(
            dispatch.id,
            InFlight {
                class,
                mode: self.mode,
                issued: now,
                length: dispatch.length,
                token,
                ios: dispatch.ios.clone(),
                piece_of,
            },
        );
        Some(dispatch)
    }

    /// A dispatch finished: its I/Os, for the caller to complete.
    pub fn complete(&mut self, id: u64, now: Nanos) -> Vec<QueuedIo> {
        let done = self
            .in_flight
            .remove(&id)
            .expect("completed dispatch was in flight");
        self.active[done.class as usize] -= 1;
        self.active_bytes[done.class as usize] -= done.length;
        self.active_total -= 1;
        let latency = now.saturating_sub(done.issued);
        match done.mode {
            Mode::Zfs => self.zfs.completed(done.class),
            Mode::Adaptive => {
                let interactive_active = self.active[IoClass::SyncRead as usize]
                    + self.active[IoClass::SyncWrite as usize];
                if done.class.is_sync() && interactive_active == 0 {
                    self.adaptive.interactive_drained(now);
                }
                self.adaptive
                    .completed(done.class, done.token, latency, done.length, now)
            }
            Mode::Fifo => {}
        }
        let Some(owner) = done.piece_of else {
            return done.ios;
        };
        let split = self.splits.get_mut(&owner).expect("a piece has its split");
        split.in_flight -= 1;
        if split.in_flight == 0 && !split.rest_queued {
            let split = self.splits.remove(&owner).expect("present");
            return vec![split.io];
        }
        Vec::new()
    }

    /// When, after `now`, the mode wants to be asked again even with no
    /// completion (a timer of the adaptive mode), if anything waits.
    pub fn next_deadline(&self, now: Nanos) -> Option<Nanos> {
        if self.mode != Mode::Adaptive || self.classes.iter().all(|c| c.len() == 0) {
            return None;
        }
        self.adaptive.next_deadline(now)
    }

    /// Per class: waiting and active counts.
    /// In adaptive mode, `class`'s floor: its share of device time and
    /// its credit (ns).
    pub fn floor(&self, class: IoClass) -> Option<(f64, f64)> {
        (self.mode == Mode::Adaptive)
            .then(|| self.adaptive.floor(class))
            .flatten()
    }

    pub fn activity(&self) -> [ClassActivity; CLASSES] {
        let mut out = [ClassActivity::default(); CLASSES];
        for (i, a) in out.iter_mut().enumerate() {
            a.queued = self.classes[i].len();
            a.active = self.active[i];
            a.active_bytes = self.active_bytes[i];
        }
        if self.mode == Mode::Fifo {
            for w in &self.fifo {
                out[w.io.class as usize].queued += 1;
            }
        }
        out
    }

    pub fn active_total(&self) -> u32 {
        self.active_total
    }

    pub fn waiting_total(&self) -> usize {
        self.fifo.len() + self.classes.iter().map(ClassQueue::len).sum::<usize>()
    }

    fn async_write_bytes(&self) -> u64 {
        self.classes[IoClass::AsyncWrite as usize].bytes
    }

    /// Take the next I/O of `class` (and what merges with it).
    fn take(&mut self, class: IoClass, now: Nanos) -> Dispatch {
        let queue = &mut self.classes[class as usize];
        let oldest = *queue.by_age.first().expect("the class has I/Os");
        // On flash, read-ahead goes in arrival order: each read-ahead has a
        // reader waiting for it, and in LBA order the stream at the lower
        // offsets, whose next windows keep landing ahead of the sweep, was
        // served first every time (of two streams on the SSD model, the
        // other read at 0.7 of its rate without readahead). A drive that
        // seeks keeps the elevator.
        let arrival = class.is_fifo() || (class == IoClass::AsyncRead && !self.rotational);
        let key = if arrival || now.saturating_sub(oldest.0) >= AGE_BOUND_NS {
            oldest.2
        } else {
            // The elevator: the first at or after where the last one ended.
            *queue
                .by_key
                .range((self.last_end, 0)..)
                .next()
                .or_else(|| queue.by_key.iter().next())
                .expect("the class has I/Os")
                .0
        };
        let waiting = queue.remove(key);
        let first = waiting.io;
        // Read-ahead is not cut: its reads are already sized by the client
        // requests they stand for (readahead/store.rs), and its reader
        // waits for each one whole, so pieces would only add a device
        // round trip per piece to the stream.
        let piece =
            if self.mode == Mode::Adaptive && !class.is_sync() && class != IoClass::AsyncRead {
                self.adaptive.piece_bytes(class)
            } else {
                None
            };
        if piece.is_some() || self.splits.contains_key(&first.id) {
            return self.take_piece(first, waiting.since, piece);
        }
        let queue = &mut self.classes[class as usize];
        let mut ios = vec![first];
        let mut end = first.offset + first.length;
        if !class.is_fifo() {
            let gap = if first.write { 0 } else { READ_GAP_BYTES };
            while let Some((&next_key, next)) = queue.by_key.range((end, 0)..).next() {
                let io = next.io;
                if io.write != first.write
                    || io.offset > end + gap
                    || io.offset + io.length - first.offset > self.merge_limit
                {
                    break;
                }
                queue.remove(next_key);
                end = end.max(io.offset + io.length);
                ios.push(io);
            }
            self.last_end = end;
        }
        Dispatch {
            id: first.id,
            class,
            offset: first.offset,
            length: end - first.offset,
            write: first.write,
            ios,
            piece_of: None,
        }
    }

    /// Send the first `piece` bytes of `io` (all of it if it fits), and
    /// queue the rest under the same id. The I/O completes with its last piece.
    fn take_piece(&mut self, io: QueuedIo, since: Nanos, piece: Option<u64>) -> Dispatch {
        let length = piece.map_or(io.length, |p| p.min(io.length));
        let rest = io.length - length;
        if rest == 0 && !self.splits.contains_key(&io.id) {
            // Fits whole and was never split: an ordinary dispatch.
            self.last_end = io.offset + io.length;
            return Dispatch {
                id: io.id,
                class: io.class,
                offset: io.offset,
                length: io.length,
                write: io.write,
                ios: vec![io],
                piece_of: None,
            };
        }
        let split = self.splits.entry(io.id).or_insert(Split {
            io,
            in_flight: 0,
            rest_queued: false,
        });
        split.in_flight += 1;
        split.rest_queued = rest > 0;
        if rest > 0 {
            let remainder = QueuedIo {
                offset: io.offset + length,
                length: rest,
                ..io
            };
            let seq = self.next_seq;
            self.next_seq += 1;
            self.classes[io.class as usize].insert(
                (remainder.offset, seq),
                Waiting {
                    io: remainder,
                    since,
                },
            );
        }
        self.last_end = io.offset + length;
        let id = self.next_piece_id;
        self.next_piece_id += 1;
        self.piece_owner.insert(id, io.id);
        Dispatch {
            id,
            class: io.class,
            offset: io.offset,
            length,
            write: io.write,
            ios: Vec::new(),
            piece_of: Some(io.id),
        }
    }
}
