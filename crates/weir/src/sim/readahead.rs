//! Readahead in virtual time: the server's own [`ReadaheadStore`] in front
//! of the simulated devices, timed by the simulation's clock, so that what
//! readahead does to each reader is measured in the device models' seconds.
//!
//! ```text
//!   job read/write ──> ReadaheadStore ──> what it sends down (misses,
//!        ▲               │ answers        read-ahead windows in their
//!        │               ▼                class, writes) ──> device queues
//!        └── after the copy a hit costs ◄── answered     ◄── completions
//! ```
//!
//! The store calls back synchronously; its calls only queue work here, and
//! the simulation's loop moves it on ([`Simulation::readahead_pump`]), so
//! no call re-enters the store.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{Pending, Simulation};
use crate::device::model::{IoKind, Nanos, NANOS_PER_SEC};
use crate::device::{AlignedBuf, Completion, DeviceOp, Extent, Outcome};
use crate::pool::{Store, StoreInfo};
use crate::readahead::{ReadaheadBudget, ReadaheadStore};
use crate::sched::{IoClass, QueuedIo};

/// What answering a read from read-ahead data costs a server beyond
/// answering it from the device: one copy out of the read-ahead buffer
/// (a conservative memory-copy rate for one core), and a fixed cost for
/// the lookup.
const HIT_COPY_BYTES_PER_SEC: u64 = 4_000_000_000;
const HIT_FIXED_NS: Nanos = 1_000;

/// Work the store handed down, and its answers, waiting for the loop.
#[derive(Default)]
struct Handoff {
    submitted: Mutex<Vec<(IoClass, DeviceOp, Completion)>>,
    /// (request id, succeeded).
    answered: Mutex<Vec<(u64, bool)>>,
    /// Ranges of read-ahead a client now waits for.
    promoted: Mutex<Vec<(u64, u64)>>,
}

/// The store's view of the simulated devices: whatever it submits waits
/// in the handoff for the loop to send down.
struct Devices {
    info: StoreInfo,
    handoff: Arc<Handoff>,
}

impl Store for Devices {
    fn info(&self) -> &StoreInfo {
        &self.info
    }

    fn submit(&self, class: IoClass, op: DeviceOp, done: Completion) {
        self.handoff
            .submitted
            .lock()
            .expect("handoff lock")
            .push((class, op, done));
    }

    fn promote(&self, offset: u64, length: u64) {
        self.handoff
            .promoted
            .lock()
            .expect("handoff lock")
            .push((offset, length));
    }

    fn extents(&self, _offset: u64, _length: u64, _max: usize) -> io::Result<Vec<Extent>> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// One I/O the store sent down, waiting for its copies.
struct StoreIo {
    done: Completion,
    buf: Option<AlignedBuf>,
    parts_left: u32,
    fails: bool,
}

/// What readahead did over a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadaheadRun {
    /// Bytes read from the devices: client reads that missed, and read-ahead.
    pub device_read_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub read_ahead_bytes: u64,
    pub wasted_bytes: u64,
}

pub(super) struct SimReadahead {
    store: Arc<ReadaheadStore>,
    handoff: Arc<Handoff>,
    clock: Arc<AtomicU64>,
    ios: HashMap<u64, StoreIo>,
    /// Device part -> its store I/O.
    parts: HashMap<u64, u64>,
    /// Requests answered from read-ahead data, each held for its copy.
    hits: HashSet<u64>,
    /// Answers waiting out that copy: (when, request, succeeded).
    replies: BinaryHeap<Reverse<(Nanos, u64, bool)>>,
    device_read_bytes: u64,
}

impl SimReadahead {
    /// `size` and `block` as the volume's; `memory_max` the server's
    /// read-ahead bound.
    pub(super) fn new(
        size: u64,
        block: u32,
        rotational: bool,
        read_devices: u32,
        memory_max: u64,
    ) -> SimReadahead {
        let handoff = Arc::new(Handoff::default());
        let clock = Arc::new(AtomicU64::new(0));
        let devices = Arc::new(Devices {
            info: StoreInfo {
                size_bytes: size,
                block_bytes: block,
                rotational,
                read_devices,
                description: "simulated devices".into(),
            },
            handoff: Arc::clone(&handoff),
        });
        let ticks = Arc::clone(&clock);
        let store = ReadaheadStore::with_clock(
            devices,
            &ReadaheadBudget::new(Some(memory_max)),
            Box::new(move || ticks.load(Ordering::Relaxed)),
        );
        SimReadahead {
            store,
            handoff,
            clock,
            ios: HashMap::new(),
            parts: HashMap::new(),
            hits: Default::default(),
            replies: BinaryHeap::new(),
            device_read_bytes: 0,
        }
    }

    pub(super) fn set_clock(&self, now: Nanos) {
        self.clock.store(now, Ordering::Relaxed);
    }

    pub(super) fn next_event(&self) -> Option<Nanos> {
        self.replies.peek().map(|Reverse((at, _, _))| *at)
    }

    pub(super) fn report(&self) -> ReadaheadRun {
        let c = self.store.counters();
        ReadaheadRun {
            device_read_bytes: self.device_read_bytes,
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            read_ahead_bytes: c.read_ahead_bytes.load(Ordering::Relaxed),
            wasted_bytes: c.wasted_bytes.load(Ordering::Relaxed),
        }
    }
}

fn hit_cost_ns(length: u64) -> Nanos {
    HIT_FIXED_NS + length * NANOS_PER_SEC / HIT_COPY_BYTES_PER_SEC
}

impl Simulation {
    /// A client read or write of job `index`, `(kind, offset, length)`,
    /// goes to the readahead store.
    pub(super) fn readahead_issue(
        &mut self,
        index: usize,
        id: u64,
        arrived: Nanos,
        (kind, offset, length): (IoKind, u64, u64),
        now: Nanos,
    ) {
        let ra = self.readahead.as_mut().expect("readahead is on");
        self.pending
            .insert(id, Pending::client(index, arrived, length, 1));
        let handoff = Arc::clone(&ra.handoff);
        let done: Completion = Box::new(move |outcome: Outcome| {
            handoff
                .answered
                .lock()
                .expect("handoff lock")
                .push((id, outcome.result.is_ok()));
        });
        if kind == IoKind::Read {
            let misses = ra.store.counters().misses.load(Ordering::Relaxed);
            let op = DeviceOp::Read {
                offset,
                buf: AlignedBuf::new(length as usize),
            };
            ra.store.submit(IoClass::SyncRead, op, done);
            if ra.store.counters().misses.load(Ordering::Relaxed) == misses {
                ra.hits.insert(id);
            }
        } else {
            let op = DeviceOp::Write {
                offset,
                buf: AlignedBuf::new(length as usize).into(),
                durable: false,
            };
            ra.store.submit(IoClass::SyncWrite, op, done);
        }
        self.readahead_pump(now);
    }

    /// Send down what the store submitted, and hold its answers for their
    /// copy, until neither is left.
    pub(super) fn readahead_pump(&mut self, now: Nanos) {
        loop {
            let Some(ra) = self.readahead.as_mut() else {
                return;
            };
            let submitted = std::mem::take(&mut *ra.handoff.submitted.lock().expect("lock"));
            let answered = std::mem::take(&mut *ra.handoff.answered.lock().expect("lock"));
            let promoted = std::mem::take(&mut *ra.handoff.promoted.lock().expect("lock"));
            if submitted.is_empty() && answered.is_empty() && promoted.is_empty() {
                return;
            }
            for (offset, length) in promoted {
                for index in 0..self.devices.len() {
                    self.devices[index].queue.promote(offset, length, now);
                    self.dispatch(index, now);
                }
            }
            let ra = self.readahead.as_mut().expect("checked above");
            for (id, ok) in answered {
                let cost = match (ra.hits.remove(&id), self.pending.get(&id)) {
                    (true, Some(p)) => hit_cost_ns(p.bytes),
                    _ => 0,
                };
                ra.replies.push(Reverse((now + cost, id, ok)));
            }
            for (class, op, done) in submitted {
                self.readahead_send(class, op, done, now);
            }
            self.readahead_replies(now);
        }
    }

    /// Answers whose copy is done complete their requests.
    pub(super) fn readahead_replies(&mut self, now: Nanos) {
        let mut due = Vec::new();
        if let Some(ra) = self.readahead.as_mut() {
            while let Some(Reverse((at, id, ok))) = ra.replies.peek().copied() {
                if at > now {
                    break;
                }
                ra.replies.pop();
                due.push((id, ok, at));
            }
        }
        for (id, ok, at) in due {
            if let Some(pending) = self.pending.get_mut(&id) {
                pending.fails |= !ok;
                self.complete(id, at);
            }
        }
    }

    fn readahead_send(&mut self, class: IoClass, op: DeviceOp, done: Completion, now: Nanos) {
        let (kind, offset, length, buf) = match op {
            DeviceOp::Read { offset, buf } => (IoKind::Read, offset, buf.len() as u64, Some(buf)),
            DeviceOp::Write { offset, buf, .. } => (IoKind::Write, offset, buf.len() as u64, None),
            // Jobs neither flush nor trim: nothing of these reaches here
            // but a flush the store passes on, which has nothing to do.
            _ => return done(Outcome::done(Ok(()))),
        };
        let targets = self.targets(0, class, kind, offset, length);
        let ra = self.readahead.as_mut().expect("readahead is on");
        let io = self.next_id;
        self.next_id += 1;
        ra.ios.insert(
            io,
            StoreIo {
                done,
                buf,
                parts_left: targets.len() as u32,
                fails: false,
            },
        );
        for (device_index, at, choice) in targets {
            let part = self.next_id;
            self.next_id += 1;
            let ra = self.readahead.as_mut().expect("readahead is on");
            ra.parts.insert(part, io);
            if kind == IoKind::Read {
                ra.device_read_bytes += length;
                self.reads_per_device[device_index] += 1;
            }
            if let Some(choice) = choice {
                self.choices.insert(part, (choice, now));
            }
            let device = &self.devices[device_index];
            if kind == IoKind::Read && device.spec.faults.read_fails(at, length) {
                let ra = self.readahead.as_mut().expect("readahead is on");
                ra.ios.get_mut(&io).expect("just added").fails = true;
            }
            let io = QueuedIo {
                id: part,
                class,
                offset: at,
                length,
                write: kind == IoKind::Write,
            };
            self.send_part(device_index, io, now);
        }
    }

    /// A device part of a store I/O is done: true if it was one.
    pub(super) fn readahead_part_done(&mut self, part: u64, at: Nanos) -> bool {
        let Some(ra) = self.readahead.as_mut() else {
            return false;
        };
        let Some(io) = ra.parts.remove(&part) else {
            return false;
        };
        if let Some((choice, issued)) = self.choices.remove(&part) {
            self.selector.completed(choice, at - issued, at);
        }
        let ra = self.readahead.as_mut().expect("checked above");
        let state = ra.ios.get_mut(&io).expect("its store I/O is in flight");
        state.parts_left -= 1;
        if state.parts_left > 0 {
            return true;
        }
        let state = ra.ios.remove(&io).expect("found above");
        let result = if state.fails {
            Err(io::Error::other("simulated read error"))
        } else {
            Ok(())
        };
        (state.done)(Outcome {
            result,
            buf: state.buf,
            hole: false,
        });
        self.readahead_pump(at);
        true
    }
}
