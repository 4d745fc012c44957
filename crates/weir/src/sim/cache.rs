//! The write-back cache in virtual time: the server's own [`DirtyMap`] and
//! [`DirtyBudget`], with their writeback sent to the simulated devices'
//! queues, so that what a cache does to readers is measured in the same
//! seconds as the device models.
//!
//! ```text
//!   job write ──> DirtyMap (answered after the budget's pause)
//!             ├─> over the budget: waits for room, then into the DirtyMap
//!             └─> larger than the budget: a direct write, async-write class
//!   tick (100 ms) ──> settle, measure the writeback rate (sizes the budget)
//!   pump ──> writebacks (runs up to 1 MiB) to every copy, async-write class,
//!            as many as the throttle lets go:
//!              adaptive: all; the devices' adaptive queues hold them back
//!              none:     up to Linux's queue depth (64), to fifo queues
//!              wbt:      Linux wbt's depth per device, to fifo queues
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Pending, Simulation};
use crate::cache::busy::BusyClock;
use crate::cache::dirty_map::{Bytes, DirtyMap};
use crate::cache::flusher::rate_sample_counts;
use crate::cache::{
    writeback_bytes_max, Admission, Charge, DirtyBudget, RUN_BYTES_MAX, SETTLE_TICK,
    WRITEBACK_RUNS_MAX,
};
use crate::device::model::Nanos;
use crate::sched::wbt::Wbt;
use crate::sched::{IoClass, Mode, QueuedIo};

/// What controls how much writeback reaches a device beside its readers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WbThrottle {
    /// weir's: the adaptive device queue, from the read latency it measures.
    #[default]
    Adaptive,
    /// None: writeback fills a fifo request queue of Linux's depth, as in
    /// Linux before wbt.
    None,
    /// Linux's wbt: fixed latency targets per kind of device.
    Wbt,
}

impl WbThrottle {
    pub const ALL: [WbThrottle; 3] = [WbThrottle::Adaptive, WbThrottle::None, WbThrottle::Wbt];

    pub fn name(self) -> &'static str {
        match self {
            WbThrottle::Adaptive => "adaptive",
            WbThrottle::None => "none",
            WbThrottle::Wbt => "wbt",
        }
    }

    /// The device queues' mode under this throttle: the adaptive one
    /// runs in the queue; the others sit above a fifo queue.
    pub fn queue_mode(self) -> Mode {
        match self {
            WbThrottle::Adaptive => Mode::Adaptive,
            WbThrottle::None | WbThrottle::Wbt => Mode::Fifo,
        }
    }
}

impl std::fmt::Display for WbThrottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Linux's request queue depth (nr_requests), which wbt scales from.
const WBT_QUEUE_DEPTH: u32 = 64;

/// A cached write's bytes. The simulator moves no data, so every write
/// shares one buffer of zeros; the charge is real, so the budget counts
/// what a server would hold.
struct SimBytes {
    zeros: Arc<[u8]>,
    length: usize,
    _charge: Charge,
}

impl Bytes for SimBytes {
    fn bytes(&self) -> &[u8] {
        &self.zeros[..self.length]
    }
}

struct WritebackState {
    parts_left: u32,
    length: u64,
    /// The copy a server makes to write back from.
    _charge: Charge,
}

/// What the cache did over a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheRun {
    pub written_back_bytes: u64,
    pub dirty_at_end_bytes: u64,
    pub limit_at_end_bytes: u64,
    /// Client writes that went through, too large for the budget.
    pub direct_writes: u64,
    /// Client writes that waited for room in the budget.
    pub waited_writes: u64,
}

pub(super) struct SimCache {
    /// Flush tokens are unused (jobs do not flush); direct ops carry
    /// their request's id.
    map: DirtyMap<u64, u64>,
    budget: Arc<DirtyBudget>,
    zeros: Arc<[u8]>,
    throttle: WbThrottle,
    /// Per device, with the wbt throttle.
    wbt: Vec<Wbt>,
    /// Writeback parts in flight per device.
    in_flight: Vec<u32>,
    writebacks: HashMap<u64, WritebackState>,
    /// Device part -> (writeback id, device).
    parts: HashMap<u64, (u64, usize)>,
    /// Direct writes' requests -> (offset, length).
    directs: HashMap<u64, (u64, u64)>,
    /// Direct writes the dirty map let go, waiting for wbt's depth:
    /// (the map's id, request). wbt holds back all buffered writes;
    /// these stand for the writer that Linux would block until its
    /// pages were written back.
    directs_ready: VecDeque<(u64, u64)>,
    /// Direct write parts in flight -> device, counted against wbt's depth.
    direct_parts: HashMap<u64, usize>,
    /// Client read parts -> (device, when sent), for wbt's samples.
    read_parts: HashMap<u64, (usize, Nanos)>,
    /// Cached writes' replies, held for the budget's pause: (when, request).
    pub(super) replies: BinaryHeap<Reverse<(Nanos, u64)>>,
    /// Writes waiting for room: (request, offset, length), oldest first.
    waiting: VecDeque<(u64, u64, u64)>,
    next_tick: Nanos,
    last_written: u64,
    /// When writebacks were in flight: the rate counts their bytes.
    busy: BusyClock,
    last_tick: Nanos,
    run: CacheRun,
}

fn nanos(duration: Duration) -> Nanos {
    duration.as_nanos().min(u128::from(u64::MAX)) as Nanos
}

impl SimCache {
    pub(super) fn new(
        throttle: WbThrottle,
        dirty_max: Option<u64>,
        write_bytes_max: u64,
        rotational: &[bool],
    ) -> SimCache {
        SimCache {
            map: DirtyMap::default(),
            budget: DirtyBudget::new(dirty_max),
            zeros: vec![0u8; write_bytes_max as usize].into(),
            throttle,
            wbt: if throttle == WbThrottle::Wbt {
                rotational
                    .iter()
                    .map(|r| Wbt::new(*r, WBT_QUEUE_DEPTH))
                    .collect()
            } else {
                Vec::new()
            },
            in_flight: vec![0; rotational.len()],
            writebacks: HashMap::default(),
            parts: HashMap::default(),
            directs: HashMap::default(),
            directs_ready: VecDeque::new(),
            direct_parts: HashMap::default(),
            read_parts: HashMap::default(),
            replies: BinaryHeap::new(),
            waiting: VecDeque::new(),
            next_tick: nanos(SETTLE_TICK),
            last_written: 0,
            busy: BusyClock::default(),
            last_tick: 0,
            run: CacheRun::default(),
        }
    }

    /// The next time the cache has something to do.
    pub(super) fn next_event(&self) -> Nanos {
        let reply = self.replies.peek().map(|Reverse((at, _))| *at);
        let wbt = self.wbt.iter().map(Wbt::next_deadline);
        reply
            .into_iter()
            .chain(wbt)
            .chain([self.next_tick])
            .min()
            .expect("the tick is always set")
    }

    /// Writebacks the throttle lets start now: (runs, bytes).
    fn slots(&self) -> (usize, u64) {
        if self.throttle == WbThrottle::None {
            // Linux before wbt: writeback fills the request queue.
            let runs = (WBT_QUEUE_DEPTH as usize).saturating_sub(self.writebacks.len());
            return (runs, u64::MAX);
        }
        // The server's own bounds.
        let bytes = writeback_bytes_max(self.budget.limit_bytes())
            .saturating_sub(self.map.writeback_bytes_in_flight());
        let own_runs = WRITEBACK_RUNS_MAX.saturating_sub(self.writebacks.len());
        if self.throttle != WbThrottle::Wbt {
            return (own_runs, bytes);
        }
        let runs = self
            .wbt
            .iter()
            .zip(&self.in_flight)
            .map(|(w, n)| w.background_limit().saturating_sub(*n) as usize)
            .min()
            .unwrap_or(0);
        (runs.min(own_runs), bytes)
    }

    pub(super) fn report(&self) -> CacheRun {
        CacheRun {
            dirty_at_end_bytes: self.map.dirty_bytes(),
            limit_at_end_bytes: self.budget.limit_bytes(),
            ..self.run
        }
    }

    /// A client read part went to `device`: wbt learns its latency.
    pub(super) fn read_sent(&mut self, part: u64, device: usize, now: Nanos) {
        if let Some(wbt) = self.wbt.get_mut(device) {
            wbt.advance(now);
            wbt.read_sent(part, now);
            self.read_parts.insert(part, (device, now));
        }
    }

    pub(super) fn covers(&self, start: u64, end: u64) -> bool {
        self.map.covers(start, end)
    }

    /// Copy a write into the map; its reply after the budget's pause if
    /// `paced`, else now (it waited for room).
    fn cache_write(&mut self, id: u64, offset: u64, length: u64, now: Nanos, paced: bool) {
        let bytes = Arc::new(SimBytes {
            zeros: Arc::clone(&self.zeros),
            length: length as usize,
            _charge: self.budget.charge(length),
        });
        self.map.write(offset, bytes);
        let pause = if paced {
            nanos(self.budget.pause(length))
        } else {
            0
        };
        self.replies.push(Reverse((now + pause, id)));
    }

    /// Cache the waiting writes that fit now, oldest first.
    fn admit_waiting(&mut self, now: Nanos) {
        while let Some(&(id, offset, length)) = self.waiting.front() {
            let too_large = self.budget.too_large(length);
            if !too_large && !self.budget.fits(length) {
                return;
            }
            self.waiting.pop_front();
            self.budget.admitted();
            if too_large {
                self.write_through(id, offset, length);
            } else {
                self.cache_write(id, offset, length, now, false);
            }
        }
    }

    /// A write larger than the limit goes to the devices, after the
    /// cached bytes it overlaps.
    fn write_through(&mut self, id: u64, offset: u64, length: u64) {
        self.run.direct_writes += 1;
        self.directs.insert(id, (offset, length));
        self.map.direct(offset, offset + length, false, id);
    }
}

impl Simulation {
    /// A client write of `length` at `offset`, request `id`, into the cache.
    pub(super) fn cache_write(
        &mut self,
        job: usize,
        id: u64,
        arrived: Nanos,
        offset: u64,
        length: u64,
    ) {
        let now = self.now;
        self.pending
            .insert(id, Pending::client(job, arrived, length, 0));
        let cache = self.cache.as_mut().expect("a cache");
        match cache.budget.admit(length) {
            Admission::Cache => cache.cache_write(id, offset, length, now, true),
            Admission::Wait => {
                cache.run.waited_writes += 1;
                cache.waiting.push_back((id, offset, length));
            }
            Admission::Through => cache.write_through(id, offset, length),
        }
        self.pump_cache(now);
    }

    /// Start the writebacks and direct writes that may start.
    pub(super) fn pump_cache(&mut self, now: Nanos) {
        let Some(cache) = self.cache.as_mut() else {
            return;
        };
        cache.admit_waiting(now);
        let pressure = cache.budget.under_pressure();
        let (runs, bytes) = cache.slots();
        let writebacks = cache
            .map
            .next_writebacks(runs, bytes, RUN_BYTES_MAX, pressure);
        let ready = cache.map.ready();
        let copies = self.devices.len();
        for writeback in writebacks {
            let length = writeback.end - writeback.start;
            let class = if writeback.urgent {
                IoClass::SyncWrite
            } else {
                IoClass::AsyncWrite
            };
            let cache = self.cache.as_mut().expect("a cache");
            cache.busy.start(Duration::from_nanos(now));
            cache.writebacks.insert(
                writeback.id,
                WritebackState {
                    parts_left: copies as u32,
                    length,
                    _charge: cache.budget.charge(length),
                },
            );
            for device in 0..copies {
                let part = self.next_id;
                self.next_id += 1;
                let cache = self.cache.as_mut().expect("a cache");
                cache.parts.insert(part, (writeback.id, device));
                cache.in_flight[device] += 1;
                self.send_write_part(device, part, class, writeback.start, length, now);
            }
        }
        let cache = self.cache.as_mut().expect("a cache");
        cache.directs_ready.extend(ready.directs);
        loop {
            let cache = self.cache.as_mut().expect("a cache");
            let gated = cache.throttle == WbThrottle::Wbt;
            if gated && cache.slots().0 == 0 {
                break;
            }
            let Some((direct, request)) = cache.directs_ready.pop_front() else {
                break;
            };
            let (offset, length) = cache.directs[&request];
            let pending = self
                .pending
                .get_mut(&request)
                .expect("a direct write is pending");
            pending.direct = Some(direct);
            pending.parts_left = copies as u32;
            for device in 0..copies {
                let part = self.next_id;
                self.next_id += 1;
                self.parts.insert(part, request);
                if gated {
                    let cache = self.cache.as_mut().expect("a cache");
                    cache.direct_parts.insert(part, device);
                    cache.in_flight[device] += 1;
                }
                // Write-back that could not wait: its class, as in the server.
                self.send_write_part(device, part, IoClass::AsyncWrite, offset, length, now);
            }
        }
    }

    fn send_write_part(
        &mut self,
        device: usize,
        part: u64,
        class: IoClass,
        offset: u64,
        length: u64,
        now: Nanos,
    ) {
        if self.devices[device].spec.faults.vanished(now) {
            self.failing
                .push(Reverse((now + super::VANISHED_FAILURE_NS, part)));
            return;
        }
        self.devices[device].queue.enqueue(
            QueuedIo {
                id: part,
                class,
                offset,
                length,
                write: true,
            },
            now,
        );
        self.dispatch(device, now);
    }

    /// A device part finished; true if it was the cache's.
    pub(super) fn cache_part_done(&mut self, part: u64, at: Nanos) -> bool {
        let Some(cache) = self.cache.as_mut() else {
            return false;
        };
        if let Some((device, sent)) = cache.read_parts.remove(&part) {
            cache.wbt[device].advance(at);
            cache.wbt[device].read_done(part, at - sent);
            return false;
        }
        if let Some(device) = cache.direct_parts.remove(&part) {
            // The request's own completion follows; only wbt counts it here.
            cache.in_flight[device] -= 1;
            cache.wbt[device].advance(at);
            cache.wbt[device].write_done();
            return false;
        }
        let Some((id, device)) = cache.parts.remove(&part) else {
            return false;
        };
        cache.in_flight[device] -= 1;
        if let Some(wbt) = cache.wbt.get_mut(device) {
            wbt.advance(at);
            wbt.write_done();
        }
        let state = cache.writebacks.get_mut(&id).expect("its writeback");
        state.parts_left -= 1;
        if state.parts_left == 0 {
            let state = cache.writebacks.remove(&id).expect("present");
            cache.busy.end(Duration::from_nanos(at));
            cache.map.writeback_done(id, true);
            cache.run.written_back_bytes += state.length;
        }
        self.pump_cache(at);
        true
    }

    /// A direct write finished on every copy.
    pub(super) fn cache_direct_done(&mut self, direct: u64, request: u64, at: Nanos) {
        if let Some(cache) = self.cache.as_mut() {
            cache.directs.remove(&request);
            cache.map.direct_done(direct);
        }
        self.pump_cache(at);
    }

    /// Replies whose pause is over, the settle tick and wbt's windows.
    pub(super) fn cache_timers(&mut self, now: Nanos) {
        let Some(cache) = self.cache.as_mut() else {
            return;
        };
        for wbt in &mut cache.wbt {
            wbt.advance(now);
        }
        let mut due = Vec::new();
        while let Some(Reverse((at, id))) = cache.replies.peek().copied() {
            if at > now {
                break;
            }
            cache.replies.pop();
            due.push((id, at));
        }
        if cache.next_tick <= now {
            cache.map.settle();
            // As the server's flusher: the rate over the time writeback
            // was busy.
            let written = cache.run.written_back_bytes;
            let busy = cache.busy.take(Duration::from_nanos(now));
            let pressure = cache.budget.under_pressure();
            let tick = Duration::from_nanos(now - cache.last_tick);
            if written > cache.last_written && rate_sample_counts(busy, tick, pressure) {
                cache
                    .budget
                    .record_rate(written - cache.last_written, busy, tick);
            }
            cache.last_written = written;
            cache.last_tick = now;
            cache.next_tick += nanos(SETTLE_TICK);
        }
        self.pump_cache(now);
        for (id, at) in due {
            self.complete(id, at);
        }
    }
}
