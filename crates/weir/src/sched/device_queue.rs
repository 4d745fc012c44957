//! The queue in front of one real device: counts every I/O by class with
//! a latency histogram, and, unless its mode is fifo, holds reads and
//! writes in an `IoQueue` until the mode lets them go. The queue's state
//! machine is driven from submissions and completions; a small timer
//! thread covers the mode's own deadlines (a background I/O held while
//! nothing is in flight).
//!
//! ```text
//!  submit(class, op) ──fifo, flush, discard──────────────────────> device
//!        │ read / write
//!        ▼
//!  IoQueue.enqueue ── next_to_issue ──> device ── completion ──> IoQueue.complete
//!        ▲                                                  └──> next_to_issue ...
//!  timer thread: next_deadline ─┘
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{IoClass, IoQueue, LinearCost, Mode, QueuedIo};
use crate::device::buf::AlignedBuf;
use crate::device::{Completion, Device, DeviceOp, Outcome};

/// Log2 latency buckets: bucket i holds [2^i, 2^(i+1)) microseconds.
pub const LATENCY_BUCKETS: usize = 32;
/// The timer thread looks again at least this often.
const TIMER_POLL_MAX: Duration = Duration::from_millis(100);
/// Client reads go in pieces no smaller than this: below it a piece's own
/// costs (a reply chunk, a completion, a wake-up) outweigh what it overlaps.
const READ_PIECE_MIN_BYTES: f64 = 64.0 * 1024.0;
/// Reads of each of two lengths timed before their costs size pieces.
const READ_COST_SAMPLES_MIN: u32 = 4;

/// Counters of one class on one device.
#[derive(Debug, Default)]
pub struct ClassCounters {
    pub ops: AtomicU64,
    pub bytes: AtomicU64,
    pub in_flight: AtomicU64,
    pub errors: AtomicU64,
    /// Device operations sent for I/Os split into pieces.
    pub pieces: AtomicU64,
    /// Submission to completion, queueing included.
    pub latency_log2_us: [AtomicU64; LATENCY_BUCKETS],
    /// The sum of those latencies, for means and Prometheus's `_sum`.
    pub latency_sum_ns: AtomicU64,
}

impl ClassCounters {
    fn record_latency(&self, elapsed: Duration) {
        let us = elapsed.as_micros() as u64;
        let bucket = if us == 0 {
            0
        } else {
            (63 - us.leading_zeros() as usize).min(LATENCY_BUCKETS - 1)
        };
        self.latency_log2_us[bucket].fetch_add(1, Relaxed);
        self.latency_sum_ns
            .fetch_add(elapsed.as_nanos() as u64, Relaxed);
    }
}

struct Held {
    op: DeviceOp,
    done: Completion,
    class: IoClass,
    submitted: Instant,
    /// Sent in pieces (the adaptive mode splits large background I/O).
    pieces: Option<Pieces>,
}

/// What the pieces of one I/O found so far. A read's pieces are kept and
/// copied into its buffer once the last is back, outside the queue's lock.
struct Pieces {
    error: Option<std::io::Error>,
    /// Pieces read: (offset, bytes, found a hole).
    read: Vec<(u64, AlignedBuf, bool)>,
}

/// What the mode released: a whole I/O, or a piece of a held one, which
/// goes to the device with a buffer of its own.
enum Ready {
    Whole(u64, Held),
    Piece {
        id: u64,
        owner: u64,
        offset: u64,
        op: DeviceOp,
        class: IoClass,
    },
}

struct Scheduled {
    queue: IoQueue,
    held: HashMap<u64, Held>,
    next_id: u64,
}

struct Shared {
    device: Arc<dyn Device>,
    counters: [ClassCounters; IoClass::ALL.len()],
    mode: AtomicU8,
    scheduled: Mutex<Scheduled>,
    epoch: Instant,
    timer_wake: Condvar,
    stopping: AtomicBool,
    /// What a read costs the device by its length, from issue to
    /// completion, timed only while it was the device's one operation:
    /// beside others its time is theirs too.
    read_cost: Mutex<LinearCost>,
    /// Operations in the device now, and ever issued to it.
    device_in_flight: AtomicU64,
    device_issued: AtomicU64,
}

/// The queue in front of one device.
pub struct DeviceQueue {
    shared: Arc<Shared>,
    timer: Option<JoinHandle<()>>,
}

fn mode_from(value: u8) -> Mode {
    match value {
        0 => Mode::Fifo,
        1 => Mode::Zfs,
        _ => Mode::Adaptive,
    }
}

fn mode_to(mode: Mode) -> u8 {
    match mode {
        Mode::Fifo => 0,
        Mode::Zfs => 1,
        Mode::Adaptive => 2,
    }
}

impl DeviceQueue {
    /// A pass-through queue (fifo): it only counts.
    pub fn new(device: Arc<dyn Device>) -> Self {
        Self::with_mode(device, Mode::Fifo)
    }

    pub fn with_mode(device: Arc<dyn Device>, mode: Mode) -> Self {
        let rotational = device.info().rotational;
        let shared = Arc::new(Shared {
            device,
            counters: Default::default(),
            mode: AtomicU8::new(mode_to(mode)),
            // Pieces get buffers of their own; merging would need one
            // completion per merged I/O from one device operation: not yet.
            scheduled: Mutex::new(Scheduled {
                queue: IoQueue::new(mode, rotational).splitting_only(),
                held: HashMap::new(),
                next_id: 1,
            }),
            epoch: Instant::now(),
            timer_wake: Condvar::new(),
            stopping: AtomicBool::new(false),
            read_cost: Mutex::new(LinearCost::default()),
            device_in_flight: AtomicU64::new(0),
            device_issued: AtomicU64::new(0),
        });
        let timer_shared = Arc::clone(&shared);
        let timer = std::thread::Builder::new()
            .name("weir-sched-timer".into())
            .spawn(move || timer_loop(&timer_shared))
            .map_err(|err| tracing::error!(error = %err, "cannot start a queue timer"))
            .ok();
        DeviceQueue { shared, timer }
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.shared.device
    }

    pub fn counters(&self, class: IoClass) -> &ClassCounters {
        &self.shared.counters[class as usize]
    }

    pub fn mode(&self) -> Mode {
        mode_from(self.shared.mode.load(Relaxed))
    }

    /// The length a large client read is answered in pieces of: where a
    /// read's transfer takes as long as the device's fixed cost per read
    /// (a seek, a command), so each piece moves at least half the bytes
    /// the device could. Until a few reads of each of two lengths have
    /// been timed, half the longest seen: its pieces give the second
    /// length. None before any read, or on a device whose reads cost
    /// nothing per byte.
    pub fn read_piece_bytes(&self) -> Option<u64> {
        let cost = self.shared.read_cost.lock();
        let bytes = match cost.parts_after(READ_COST_SAMPLES_MIN) {
            Some((fixed, per_byte)) if per_byte > 0.0 => fixed / per_byte,
            Some(_) => return None,
            None => cost.longest()? / 2.0,
        };
        Some((bytes.max(READ_PIECE_MIN_BYTES) as u64) / 4096 * 4096)
    }

    /// In adaptive mode, `class`'s floor: its share of device time and its
    /// credit (ns).
    pub fn floor(&self, class: IoClass) -> Option<(f64, f64)> {
        self.shared.scheduled.lock().queue.floor(class)
    }

    /// Change the mode now; held I/Os move over (to fifo: they all go).
    pub fn set_mode(&self, mode: Mode) {
        let ready = {
            let mut s = self.shared.scheduled.lock();
            let now = self.shared.now();
            s.queue.set_mode(mode, now);
            self.shared.mode.store(mode_to(mode), Relaxed);
            take_ready(&mut s, now)
        };
        issue(&self.shared, ready);
    }

    /// A client now waits for the read-ahead queued over
    /// `[offset, offset + length)`: it goes as a client read. Its counts
    /// stay with the class it was submitted in.
    pub fn promote(&self, offset: u64, length: u64) {
        if self.mode() == Mode::Fifo {
            return;
        }
        let ready = {
            let mut s = self.shared.scheduled.lock();
            let now = self.shared.now();
            if s.queue.promote(offset, length, now) == 0 {
                return;
            }
            take_ready(&mut s, now)
        };
        issue(&self.shared, ready);
    }

    pub fn submit(&self, class: IoClass, op: DeviceOp, done: Completion) {
        let shared = &self.shared;
        let this = &shared.counters[class as usize];
        this.ops.fetch_add(1, Relaxed);
        this.bytes.fetch_add(op.range().1, Relaxed);
        this.in_flight.fetch_add(1, Relaxed);
        let submitted = Instant::now();
        let schedulable = matches!(op, DeviceOp::Read { .. } | DeviceOp::Write { .. });
        if self.mode() == Mode::Fifo || !schedulable {
            let shared_done = Arc::clone(shared);
            shared.submit_to_device(
                op,
                Box::new(move |outcome| {
                    finish(&shared_done, class, submitted, outcome.result.is_err());
                    done(outcome)
                }),
            );
            return;
        }
        let (offset, length) = op.range();
        let write = matches!(op, DeviceOp::Write { .. });
        let ready = {
            let mut s = shared.scheduled.lock();
            let id = s.next_id;
            s.next_id += 1;
            s.held.insert(
                id,
                Held {
                    op,
                    done,
                    class,
                    submitted,
                    pieces: None,
                },
            );
            let now = shared.now();
            s.queue.enqueue(
                QueuedIo {
                    id,
                    class,
                    offset,
                    length,
                    write,
                },
                now,
            );
            let ready = take_ready(&mut s, now);
            if s.queue.active_total() == 0 && s.queue.waiting_total() > 0 {
                // Held with nothing in flight: only the timer can release it.
                shared.timer_wake.notify_one();
            }
            ready
        };
        issue(shared, ready);
    }
}

impl Drop for DeviceQueue {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Relaxed);
        self.shared.timer_wake.notify_all();
        if let Some(timer) = self.timer.take() {
            crate::join::join_unless_current(timer);
        }
    }
}

impl Shared {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Send `op` to the device; a read that turns out to have been its
    /// only operation from issue to completion is timed into `read_cost`.
    fn submit_to_device(self: &Arc<Self>, op: DeviceOp, done: Completion) {
        let read_length = matches!(op, DeviceOp::Read { .. }).then(|| op.range().1);
        let alone = self.device_in_flight.fetch_add(1, Relaxed) == 0;
        let issue = self.device_issued.fetch_add(1, Relaxed);
        let issued = Instant::now();
        let shared = Arc::clone(self);
        self.device.submit(
            op,
            Box::new(move |outcome| {
                shared.device_in_flight.fetch_sub(1, Relaxed);
                let none_since = shared.device_issued.load(Relaxed) == issue + 1;
                if let (Some(length), true, true) = (read_length, alone, none_since) {
                    let ns = issued.elapsed().as_nanos() as f64;
                    shared.read_cost.lock().record(length as f64, ns);
                }
                done(outcome)
            }),
        );
    }
}

fn finish(shared: &Shared, class: IoClass, submitted: Instant, failed: bool) {
    let this = &shared.counters[class as usize];
    this.in_flight.fetch_sub(1, Relaxed);
    if failed {
        this.errors.fetch_add(1, Relaxed);
    }
    this.record_latency(submitted.elapsed());
}

/// Everything the mode lets go now.
fn take_ready(s: &mut Scheduled, now: u64) -> Vec<Ready> {
    let mut ready = Vec::new();
    while let Some(dispatch) = s.queue.next_to_issue(now) {
        let Some(owner) = dispatch.piece_of else {
            for io in dispatch.ios {
                let held = s.held.remove(&io.id).expect("held I/Os are in the queue");
                ready.push(Ready::Whole(io.id, held));
            }
            continue;
        };
        let held = s.held.get_mut(&owner).expect("a piece's I/O is held");
        held.pieces.get_or_insert(Pieces {
            error: None,
            read: Vec::new(),
        });
        ready.push(Ready::Piece {
            id: dispatch.id,
            owner,
            offset: dispatch.offset,
            op: piece_op(&held.op, dispatch.offset, dispatch.length),
            class: dispatch.class,
        });
    }
    ready
}

/// The device operation for `length` bytes at `offset` of `op`.
fn piece_op(op: &DeviceOp, offset: u64, length: u64) -> DeviceOp {
    match op {
        DeviceOp::Read { .. } => DeviceOp::Read {
            offset,
            buf: AlignedBuf::new(length as usize),
        },
        DeviceOp::Write {
            offset: start,
            buf,
            durable,
        } => DeviceOp::Write {
            offset,
            buf: buf.slice((offset - start) as usize, length as usize),
            durable: *durable,
        },
        _ => unreachable!("only reads and writes are queued"),
    }
}

/// Note a piece's outcome on its I/O.
fn absorb_piece(held: &mut Held, offset: u64, outcome: Outcome) {
    let pieces = held.pieces.as_mut().expect("a piece's I/O has pieces");
    match outcome.result {
        Err(err) => {
            pieces.error.get_or_insert(err);
        }
        Ok(()) => {
            if matches!(held.op, DeviceOp::Read { .. }) {
                let buf = outcome.buf.expect("reads return their buffer");
                pieces.read.push((offset, buf, outcome.hole));
            }
        }
    }
}

/// A held I/O sent in pieces is done: answer it as one.
fn finish_pieces(shared: &Shared, held: Held) {
    let Held {
        op,
        done,
        class,
        submitted,
        pieces,
    } = held;
    let pieces = pieces.expect("a piece's I/O has pieces");
    let all_holes = pieces.read.iter().all(|(_, _, hole)| *hole);
    let (buf, read) = match op {
        DeviceOp::Read {
            offset: start,
            mut buf,
        } => {
            for (offset, piece, hole) in &pieces.read {
                let at = (offset - start) as usize;
                let target = &mut buf.as_mut_slice()[at..at + piece.len()];
                if *hole {
                    target.fill(0);
                } else {
                    target.copy_from_slice(piece.as_slice());
                }
            }
            (Some(buf), true)
        }
        DeviceOp::Write { .. } => (None, false),
        _ => (None, false),
    };
    let result = pieces.error.map_or(Ok(()), Err);
    finish(shared, class, submitted, result.is_err());
    done(Outcome {
        hole: read && result.is_ok() && all_holes,
        result,
        buf,
    })
}

/// Send released I/Os to the device (never under the queue's lock: a
/// device may complete inline).
fn issue(shared: &Arc<Shared>, ready: Vec<Ready>) {
    for item in ready {
        let shared_done = Arc::clone(shared);
        match item {
            Ready::Whole(id, held) => {
                let Held {
                    op,
                    done,
                    class,
                    submitted,
                    ..
                } = held;
                shared.submit_to_device(
                    op,
                    Box::new(move |outcome| {
                        finish(&shared_done, class, submitted, outcome.result.is_err());
                        let more = {
                            let mut s = shared_done.scheduled.lock();
                            let now = shared_done.now();
                            s.queue.complete(id, now);
                            take_ready(&mut s, now)
                        };
                        issue(&shared_done, more);
                        done(outcome)
                    }),
                );
            }
            Ready::Piece {
                id,
                owner,
                offset,
                op,
                class,
            } => {
                shared.counters[class as usize].pieces.fetch_add(1, Relaxed);
                shared.submit_to_device(
                    op,
                    Box::new(move |outcome| {
                        let (more, finished) = {
                            let mut s = shared_done.scheduled.lock();
                            let now = shared_done.now();
                            let held = s.held.get_mut(&owner).expect("a piece's I/O is held");
                            absorb_piece(held, offset, outcome);
                            let last = !s.queue.complete(id, now).is_empty();
                            let finished = if last { s.held.remove(&owner) } else { None };
                            (take_ready(&mut s, now), finished)
                        };
                        issue(&shared_done, more);
                        if let Some(held) = finished {
                            finish_pieces(&shared_done, held);
                        }
                    }),
                )
            }
        }
    }
}

fn timer_loop(shared: &Arc<Shared>) {
    let mut s = shared.scheduled.lock();
    while !shared.stopping.load(Relaxed) {
        let now = shared.now();
        let wait = s
            .queue
            .next_deadline(now)
            .map_or(TIMER_POLL_MAX, |t| Duration::from_nanos(t - now))
            .min(TIMER_POLL_MAX);
        shared.timer_wake.wait_for(&mut s, wait);
        let ready = take_ready(&mut s, shared.now());
        if !ready.is_empty() {
            drop(s);
            issue(shared, ready);
            s = shared.scheduled.lock();
        }
    }
}
