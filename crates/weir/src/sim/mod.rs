//! The virtual-time simulator: workload generators driving device models
//! through their queues, with no threads and no sleeps. Time jumps from
//! event to event, so ten simulated seconds of an HDD take milliseconds,
//! and one seed reproduces a run exactly.
//!
//! ```text
//!   jobs (closed loop: qd in flight; open loop: Poisson arrivals)
//!     │ with conns=N: N server threads, each a random delay, reorder them
//!     │ one device, or a mirror: reads to the copy a read policy picks, writes
//!     │ to every copy, scrub reads each copy in LBA order on its own
//!     ▼                                                   ▲ completions
//!   sched::IoQueue per device (fifo / zfs / adaptive) ────┤
//!     ▼ next_to_issue(now)                                │
//!   TimingModel ── next_event() ──> the loop jumps `now` there ── advance(now)
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap as HashMap;

use crate::device::model::{IoKind, ModelIo, ModelSpec, Nanos, TimingModel, NANOS_PER_MS};
use crate::pool::mirror::select::{Choice, MirrorSelector, ReadPolicy, ReadRequest};
use crate::pool::scrub::COPY_LEAD_MAX_CHUNKS;
use crate::sched::{IoClass, IoQueue, Mode, QueuedIo};
use crate::stats::LatencyStats;
use crate::workload::{Generator, JobSpec, Rw};

mod cache;
mod connections;
mod readahead;
use cache::SimCache;
pub use cache::{CacheRun, WbThrottle};
use connections::ServerThreads;
pub use readahead::ReadaheadRun;
use readahead::SimReadahead;

/// The width of one step of each device's share of reads over time.
pub const READ_TIMELINE_BUCKET_NS: Nanos = 100 * NANOS_PER_MS;

/// The width of one step of each stream's latency over time.
pub const LATENCY_TIMELINE_STEP_NS: Nanos = 250 * NANOS_PER_MS;

/// Open-loop arrivals waiting for a slot, per job. Past this the device is
/// hopelessly behind the rate, and further arrivals count as errors.
const BACKLOG_MAX: usize = 1 << 20;

/// How long an I/O to a vanished device takes to fail.
const VANISHED_FAILURE_NS: Nanos = NANOS_PER_MS;

/// What one job did during a run.
#[derive(Clone, Debug)]
pub struct StreamResult {
    pub job: JobSpec,
    pub ops: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Time the job was running, for rates.
    pub active_ns: Nanos,
    pub latency: LatencyStats,
    /// The same per `LATENCY_TIMELINE_STEP_NS` of the run, by completion
    /// time (the simulator's runs only).
    pub latency_over_time: Vec<LatencyStats>,
}

/// A run of a mirror: the streams, and where the client reads went.
pub struct MirrorRun {
    pub streams: Vec<StreamResult>,
    /// Each device's share of all client reads.
    pub read_shares: Vec<f64>,
    /// The same per job, in job order.
    pub job_read_shares: Vec<Vec<f64>>,
    /// The same per `READ_TIMELINE_BUCKET_NS`, from the start (a step with
    /// no reads has every share 0).
    pub read_timeline: Vec<Vec<f64>>,
    /// With a write-back cache: what it did.
    pub cache: Option<CacheRun>,
    /// With readahead: what it did.
    pub readahead: Option<ReadaheadRun>,
}

fn shares_of(counts: &[u64]) -> Vec<f64> {
    let total: u64 = counts.iter().sum();
    counts
        .iter()
        .map(|c| *c as f64 / total.max(1) as f64)
        .collect()
}

struct JobState {
    generator: Generator,
    started: bool,
    in_flight: u32,
    /// Open loop: arrivals waiting for a free slot.
    backlog: std::collections::VecDeque<Nanos>,
    next_arrival: Option<Nanos>,
    stop: Nanos,
    /// With `conns=N`: the server threads its requests pass through.
    threads: Option<ServerThreads>,
    result: StreamResult,
}

/// A request on its way through a server thread to the volume.
struct Handing {
    job: usize,
    arrived: Nanos,
    io: (IoKind, u64, u64),
}

struct Pending {
    job: usize,
    arrived: Nanos,
    bytes: u64,
    fails: bool,
    /// Device I/Os (copies) still to complete.
    parts_left: u32,
    /// For a scrub read, the copy it read: the scrub's next read goes to
    /// the same device, so each device keeps its own reads in flight.
    scrub_device: Option<usize>,
    /// A write that went past the cache: its id in the dirty map.
    direct: Option<u64>,
}

impl Pending {
    /// A client request of `bytes` from `job`, waiting for `parts_left` device I/Os.
    fn client(job: usize, arrived: Nanos, bytes: u64, parts_left: u32) -> Pending {
        Pending {
            job,
            arrived,
            bytes,
            fails: false,
            parts_left,
            scrub_device: None,
            direct: None,
        }
    }
}

struct SimDevice {
    model: Box<dyn TimingModel>,
    spec: ModelSpec,
    queue: IoQueue,
    /// Where a scrub of this device reads next.
    scrub_at: u64,
    /// Scrub reads sent to this device, and the bytes of those done.
    scrub_reads: u64,
    scrub_done_bytes: u64,
}

pub struct Simulation {
    devices: Vec<SimDevice>,
    jobs: Vec<JobState>,
    pending: HashMap<u64, Pending>,
    /// Device I/O id -> request id.
    parts: HashMap<u64, u64>,
    failing: BinaryHeap<Reverse<(Nanos, u64)>>,
    /// Closed-loop jobs thinking: (when, job index).
    thinking: BinaryHeap<Reverse<(Nanos, usize)>>,
    /// Requests passing through server threads: (when they reach the
    /// volume, request id), and the requests themselves.
    handing_at: BinaryHeap<Reverse<(Nanos, u64)>>,
    handing: HashMap<u64, Handing>,
    next_id: u64,
    /// A scrub's first I/Os go round the copies; after that each goes to
    /// the device whose scrub read just finished (`scrub_next`).
    scrub_turn: usize,
    scrub_next: Option<usize>,
    /// Which copy serves each client read of a mirror (latency unless
    /// `with_read_policy` says otherwise), as in a pool.
    selector: MirrorSelector,
    /// Device part -> the selector's choice and when it was issued.
    choices: HashMap<u64, (Choice, Nanos)>,
    /// Client reads (not scrub) sent to each device.
    reads_per_device: Vec<u64>,
    /// The same per `READ_TIMELINE_BUCKET_NS` of the run.
    reads_timeline: Vec<Vec<u64>>,
    /// The same per job.
    reads_per_job: Vec<Vec<u64>>,
    /// Client writes go through a write-back cache.
    cache: Option<SimCache>,
    /// Client reads and writes go through the server's readahead.
    readahead: Option<SimReadahead>,
    duration: Nanos,
    now: Nanos,
}

impl Simulation {
    /// One device, no scheduling (every I/O straight to the model).
    pub fn new(
        spec: &ModelSpec,
        jobs: &[JobSpec],
        duration: Nanos,
        seed: u64,
    ) -> Result<Simulation, String> {
        Self::new_pool(std::slice::from_ref(spec), Mode::Fifo, jobs, duration, seed)
    }

    /// One device, or with several a mirror of them, each behind a queue
    /// in `mode`. Job offsets address one copy's space.
    pub fn new_pool(
        specs: &[ModelSpec],
        mode: Mode,
        jobs: &[JobSpec],
        duration: Nanos,
        seed: u64,
    ) -> Result<Simulation, String> {
        let size = specs
            .iter()
            .map(|s| s.size_bytes)
            .min()
            .ok_or("a simulation needs a device")?;
        let job_count = jobs.len();
        let jobs = jobs
            .iter()
            .enumerate()
            .map(|(index, job)| {
                let generator = Generator::new(job.clone(), size, seed)?;
                let stop = job.stop_ns().unwrap_or(duration).min(duration);
                let threads_seed = crate::rng::mix(seed ^ crate::rng::mix(index as u64 + 1));
                Ok(JobState {
                    generator,
                    started: false,
                    in_flight: 0,
                    backlog: Default::default(),
                    next_arrival: None,
                    stop,
                    threads: job.conns.map(|n| ServerThreads::new(n, threads_seed)),
                    result: StreamResult {
                        job: job.clone(),
                        ops: 0,
                        bytes: 0,
                        errors: 0,
                        active_ns: stop.saturating_sub(job.start_ns()),
                        latency: LatencyStats::default(),
                        latency_over_time: Vec::new(),
                    },
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let devices = specs
            .iter()
            .map(|spec| SimDevice {
                model: spec.timing_model(),
                spec: spec.clone(),
                queue: IoQueue::new(mode, spec.rotational()),
                scrub_at: 0,
                scrub_reads: 0,
                scrub_done_bytes: 0,
            })
            .collect();
        Ok(Simulation {
            devices,
            jobs,
            pending: HashMap::default(),
            parts: HashMap::default(),
            failing: BinaryHeap::new(),
            thinking: BinaryHeap::new(),
            handing_at: BinaryHeap::new(),
            handing: HashMap::default(),
            next_id: 1,
            scrub_turn: 0,
            scrub_next: None,
            selector: MirrorSelector::new(ReadPolicy::default(), specs.len()),
            choices: HashMap::default(),
            reads_per_device: vec![0; specs.len()],
            reads_timeline: Vec::new(),
            reads_per_job: vec![vec![0; specs.len()]; job_count],
            cache: None,
            readahead: None,
            duration,
            now: 0,
        })
    }

    /// Reads of a mirror go where `policy` chooses.
    pub fn with_read_policy(mut self, policy: ReadPolicy) -> Simulation {
        self.selector.set_policy(policy);
        self
    }

    /// Client writes go to a write-back cache (the server's own), whose
    /// writeback `throttle` controls; `dirty_max` as `--cache-dirty-max`.
    /// The devices' queues keep the pool's mode, which the caller chose
    /// to suit the throttle (`WbThrottle::queue_mode`).
    pub fn with_cache(mut self, throttle: WbThrottle, dirty_max: Option<u64>) -> Simulation {
        let write_bytes_max = self
            .jobs
            .iter()
            .filter(|j| j.result.job.rw != Rw::Read && j.result.job.rw != Rw::RandRead)
            .map(|j| j.result.job.bs)
            .max()
            .unwrap_or(0);
        let rotational: Vec<bool> = self.devices.iter().map(|d| d.spec.rotational()).collect();
        self.cache = Some(SimCache::new(
            throttle,
            dirty_max,
            write_bytes_max,
            &rotational,
        ));
        self
    }

    /// Client reads and writes go through the server's readahead, which
    /// holds at most `memory_max` bytes read ahead. Not with a cache.
    pub fn with_readahead(mut self, memory_max: u64) -> Result<Simulation, String> {
        if self.cache.is_some() {
            return Err("the simulator runs readahead without a write-back cache".into());
        }
        let size = self.devices.iter().map(|d| d.spec.size_bytes).min();
        let rotational = self.devices.iter().any(|d| d.spec.rotational());
        self.readahead = Some(SimReadahead::new(
            size.unwrap_or(0),
            4096,
            rotational,
            self.devices.len() as u32,
            memory_max,
        ));
        Ok(self)
    }

    /// Run to the end; the results are in job order.
    pub fn run(self) -> Vec<StreamResult> {
        self.run_mirror().streams
    }

    /// Run to the end: the results in job order, and how the client reads
    /// were spread over the devices.
    pub fn run_mirror(mut self) -> MirrorRun {
        let mut done = Vec::new();
        while let Some(now) = self.next_time().filter(|t| *t < self.duration) {
            self.now = now;
            if let Some(ra) = &self.readahead {
                ra.set_clock(now);
            }
            for index in 0..self.devices.len() {
                let device = &mut self.devices[index];
                device
                    .model
                    .set_slowdown(device.spec.faults.latency_factor(now));
                device.model.advance(now, &mut done);
                for (id, at) in done.drain(..) {
                    assert_eq!(at, now, "the loop stops at every completion");
                    let ios = self.devices[index].queue.complete(id, at);
                    for io in ios {
                        self.part_done(io.id, at);
                    }
                }
            }
            while let Some(Reverse((at, id))) = self.failing.peek().copied() {
                if at > now {
                    break;
                }
                self.failing.pop();
                self.part_done(id, at);
            }
            while let Some(Reverse((at, index))) = self.thinking.peek().copied() {
                if at > now {
                    break;
                }
                self.thinking.pop();
                self.issue(index, at, at);
            }
            while let Some(Reverse((at, id))) = self.handing_at.peek().copied() {
                if at > now {
                    break;
                }
                self.handing_at.pop();
                let handing = self.handing.remove(&id).expect("a handed request");
                self.admit(handing, id, at);
            }
            self.cache_timers(now);
            self.readahead_replies(now);
            for index in 0..self.jobs.len() {
                self.start_or_arrive(index, now);
            }
            for index in 0..self.devices.len() {
                self.dispatch(index, now);
            }
        }
        self.count_scrub_progress();
        let read_timeline = self
            .reads_timeline
            .iter()
            .map(|counts| shares_of(counts))
            .collect();
        MirrorRun {
            cache: self.cache.as_ref().map(SimCache::report),
            readahead: self.readahead.as_ref().map(SimReadahead::report),
            read_shares: shares_of(&self.reads_per_device),
            job_read_shares: self.reads_per_job.iter().map(|c| shares_of(c)).collect(),
            read_timeline,
            streams: self.jobs.into_iter().map(|job| job.result).collect(),
        }
    }

    fn next_time(&self) -> Option<Nanos> {
        let jobs = self.jobs.iter().filter_map(|job| {
            if !job.started {
                Some(job.result.job.start_ns())
            } else {
                job.next_arrival.filter(|t| *t < job.stop)
            }
        });
        let failing = self.failing.peek().map(|Reverse((at, _))| *at);
        let thinking = self.thinking.peek().map(|Reverse((at, _))| *at);
        let handing = self.handing_at.peek().map(|Reverse((at, _))| *at);
        let devices = self.devices.iter().flat_map(|d| {
            d.model
                .next_event()
                .into_iter()
                .chain(d.queue.next_deadline(self.now))
        });
        let cache = self.cache.as_ref().map(SimCache::next_event);
        let readahead = self.readahead.as_ref().and_then(SimReadahead::next_event);
        jobs.chain(devices)
            .chain(readahead)
            .chain(failing)
            .chain(thinking)
            .chain(handing)
            .chain(cache)
            .min()
    }

    /// A mirror's scrub has scrubbed what every copy has read: bytes a copy
    /// read ahead of the slowest are not progress yet. So a scrub stream
    /// counts the slowest copy's bytes once per copy.
    fn count_scrub_progress(&mut self) {
        let copies = self.devices.len() as u64;
        let scrubs = self
            .jobs
            .iter()
            .filter(|j| Self::class_of(&j.result.job, IoKind::Read) == IoClass::Scrub)
            .count();
        if copies < 2 || scrubs != 1 {
            return;
        }
        let slowest = self.devices.iter().map(|d| d.scrub_done_bytes).min();
        if let Some(job) = self
            .jobs
            .iter_mut()
            .find(|j| Self::class_of(&j.result.job, IoKind::Read) == IoClass::Scrub)
        {
            job.result.bytes = slowest.unwrap_or(0) * copies;
        }
    }

    /// Send what the device's queue lets go.
    fn dispatch(&mut self, index: usize, now: Nanos) {
        let device = &mut self.devices[index];
        while let Some(d) = device.queue.next_to_issue(now) {
            let kind = if d.write { IoKind::Write } else { IoKind::Read };
            device.model.submit(
                ModelIo {
                    id: d.id,
                    kind,
                    offset: d.offset,
                    length: d.length,
                },
                now,
            );
        }
    }

    fn start_or_arrive(&mut self, index: usize, now: Nanos) {
        let job = &mut self.jobs[index];
        if !job.started {
            if job.result.job.start_ns() > now {
                return;
            }
            job.started = true;
            match job.generator.next_gap_ns() {
                Some(gap) => job.next_arrival = Some(now + gap),
                None => {
                    for _ in 0..job.result.job.qd {
                        self.issue(index, now, now);
                    }
                }
            }
            return;
        }
        while let Some(arrival) = self.jobs[index].next_arrival.filter(|t| *t <= now) {
            let job = &mut self.jobs[index];
            job.next_arrival = job.generator.next_gap_ns().map(|gap| arrival + gap);
            if arrival >= job.stop {
                job.next_arrival = None;
                break;
            }
            if job.in_flight < job.result.job.qd {
                self.issue(index, arrival, now);
            } else if job.backlog.len() < BACKLOG_MAX {
                job.backlog.push_back(arrival);
            } else {
                job.result.errors += 1;
            }
        }
    }

    /// The class a job's I/O carries: as given, else scrub for a job named
    /// scrub, else sync-read or sync-write.
    fn class_of(job: &JobSpec, kind: IoKind) -> IoClass {
        job.class.unwrap_or(if job.name == "scrub" {
            IoClass::Scrub
        } else if kind == IoKind::Write {
            IoClass::SyncWrite
        } else {
            IoClass::SyncRead
        })
    }

    /// Which copies an I/O goes to, at which offset, and for a client read
    /// of a mirror, the selector's choice.
    fn targets(
        &mut self,
        job: usize,
        class: IoClass,
        kind: IoKind,
        offset: u64,
        length: u64,
    ) -> Vec<(usize, u64, Option<Choice>)> {
        let copies = self.devices.len();
        if copies == 1 {
            return vec![(0, offset, None)];
        }
        if kind == IoKind::Write {
            return (0..copies).map(|d| (d, offset, None)).collect();
        }
        if matches!(class, IoClass::Scrub | IoClass::Resilver) {
            // A scrub reads every copy, each in LBA order on its own, as a
            // pool's does: no copy more than the pool's lead ahead.
            let mut index = self.scrub_next.take().unwrap_or_else(|| {
                self.scrub_turn += 1;
                (self.scrub_turn - 1) % copies
            });
            let slowest = (0..copies)
                .min_by_key(|d| self.devices[*d].scrub_reads)
                .expect("a mirror has copies");
            if self.devices[index].scrub_reads
                >= self.devices[slowest].scrub_reads + COPY_LEAD_MAX_CHUNKS
            {
                index = slowest;
            }
            let device = &mut self.devices[index];
            device.scrub_reads += 1;
            if device.scrub_at + length > device.spec.size_bytes {
                device.scrub_at = 0;
            }
            let at = device.scrub_at;
            device.scrub_at += length;
            return vec![(index, at, None)];
        }
        let request = ReadRequest {
            offset,
            length,
            requester: job as u64,
        };
        let now = self.now;
        // The selector weighs each copy's background work, as a pool's does,
        // and hears the scrub's positions only once a scrub has begun (a
        // pool's scrub tells them only while it runs).
        let scrubbing = self.devices.iter().any(|d| d.scrub_reads > 0);
        let held = self
            .devices
            .iter()
            .all(|d| d.queue.mode() == Mode::Adaptive);
        self.selector.set_background_held_for_reads(held);
        for (i, d) in self.devices.iter().enumerate() {
            let waiting: u32 = IoClass::ALL
                .iter()
                .zip(d.queue.activity())
                .filter(|(class, _)| !class.is_interactive())
                .map(|(_, a)| a.queued as u32 + a.active)
                .sum();
            self.selector
                .set_background(i, waiting, d.spec.rotational());
            if scrubbing {
                self.selector.set_background_position(i, d.scrub_reads);
            }
        }
        let choice = self
            .selector
            .choose(request, now)
            .expect("every copy of a simulated mirror may serve");
        vec![(choice.copy, offset, Some(choice))]
    }

    fn issue(&mut self, index: usize, arrived: Nanos, now: Nanos) {
        let job = &mut self.jobs[index];
        if now >= job.stop {
            return;
        }
        let io = job.generator.next_io();
        job.in_flight += 1;
        let id = self.next_id;
        self.next_id += 1;
        let handing = Handing {
            job: index,
            arrived,
            io,
        };
        match &mut job.threads {
            Some(threads) => {
                self.handing_at.push(Reverse((threads.hand_on(now), id)));
                self.handing.insert(id, handing);
            }
            None => self.admit(handing, id, now),
        }
    }

    /// A job's request `id` reaches the volume at `now`.
    fn admit(&mut self, handing: Handing, id: u64, now: Nanos) {
        let Handing {
            job: index,
            arrived,
            io: (kind, offset, length),
        } = handing;
        let class = Self::class_of(&self.jobs[index].result.job, kind);
        if let Some(cache) = &mut self.cache {
            if kind == IoKind::Write && class == IoClass::SyncWrite {
                return self.cache_write(index, id, arrived, offset, length);
            }
            if kind == IoKind::Read
                && class == IoClass::SyncRead
                && cache.covers(offset, offset + length)
            {
                // Every byte is in memory: answered at once.
                self.pending
                    .insert(id, Pending::client(index, arrived, length, 0));
                cache.replies.push(Reverse((now, id)));
                return;
            }
        }
        if self.readahead.is_some() && matches!(class, IoClass::SyncRead | IoClass::SyncWrite) {
            return self.readahead_issue(index, id, arrived, (kind, offset, length), now);
        }
        let targets = self.targets(index, class, kind, offset, length);
        let mut pending = Pending::client(index, arrived, length, targets.len() as u32);
        pending.scrub_device =
            matches!(class, IoClass::Scrub | IoClass::Resilver).then(|| targets[0].0);
        self.pending.insert(id, pending);
        let client_read =
            kind == IoKind::Read && !matches!(class, IoClass::Scrub | IoClass::Resilver);
        for (device_index, at, choice) in targets {
            let part = self.next_id;
            self.next_id += 1;
            self.parts.insert(part, id);
            if let Some(choice) = choice {
                self.choices.insert(part, (choice, now));
            }
            if client_read {
                self.count_read(index, device_index, now);
                if let Some(cache) = &mut self.cache {
                    cache.read_sent(part, device_index, now);
                }
            }
            let device = &self.devices[device_index];
            let faults = &device.spec.faults;
            if kind == IoKind::Read && faults.read_fails(at, length) {
                self.pending.get_mut(&id).expect("just added").fails = true;
            }
            if faults.vanished(now) {
                self.pending.get_mut(&id).expect("just added").fails = true;
                self.failing
                    .push(Reverse((now + VANISHED_FAILURE_NS, part)));
                continue;
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

    /// Queue one copy's I/O on its device and send what the queue lets go.
    fn send_part(&mut self, device: usize, io: QueuedIo, now: Nanos) {
        self.devices[device].queue.enqueue(io, now);
        self.dispatch(device, now);
    }

    fn count_read(&mut self, job: usize, device: usize, now: Nanos) {
        self.reads_per_device[device] += 1;
        self.reads_per_job[job][device] += 1;
        let bucket = (now / READ_TIMELINE_BUCKET_NS) as usize;
        let devices = self.devices.len();
        if self.reads_timeline.len() <= bucket {
            self.reads_timeline.resize(bucket + 1, vec![0; devices]);
        }
        self.reads_timeline[bucket][device] += 1;
    }

    /// One copy's I/O is done; the request completes with its last copy.
    fn part_done(&mut self, part: u64, at: Nanos) {
        if self.readahead_part_done(part, at) {
            return;
        }
        if self.cache_part_done(part, at) {
            return;
        }
        if let Some((choice, issued)) = self.choices.remove(&part) {
            self.selector.completed(choice, at - issued, at);
        }
        let id = self
            .parts
            .remove(&part)
            .expect("completed part was pending");
        let pending = self.pending.get_mut(&id).expect("its request is pending");
        pending.parts_left -= 1;
        if pending.parts_left == 0 {
            self.complete(id, at);
        }
    }

    fn complete(&mut self, id: u64, at: Nanos) {
        let pending = self
            .pending
            .remove(&id)
            .expect("completed request was pending");
        if let Some(direct) = pending.direct {
            self.cache_direct_done(direct, id, at);
        }
        self.scrub_next = pending.scrub_device;
        if let (Some(device), false) = (pending.scrub_device, pending.fails) {
            self.devices[device].scrub_done_bytes += pending.bytes;
        }
        let job = &mut self.jobs[pending.job];
        job.in_flight -= 1;
        if pending.fails {
            job.result.errors += 1;
        } else {
            job.result.ops += 1;
            job.result.bytes += pending.bytes;
            job.result.latency.record(at - pending.arrived);
            let step = (at / LATENCY_TIMELINE_STEP_NS) as usize;
            let timeline = &mut job.result.latency_over_time;
            if timeline.len() <= step {
                timeline.resize_with(step + 1, LatencyStats::default);
            }
            timeline[step].record(at - pending.arrived);
        }
        if job.result.job.rate_per_sec.is_some() {
            if let Some(arrival) = job.backlog.pop_front() {
                self.issue(pending.job, arrival, at);
            }
        } else {
            match job.result.job.think_ns() {
                0 => self.issue(pending.job, at, at),
                think => self.thinking.push(Reverse((at + think, pending.job))),
            }
        }
    }
}

#[cfg(test)]
mod tests;
