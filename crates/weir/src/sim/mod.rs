//! The virtual-time simulator: workload generators driving a device model
//! with no threads and no sleeps. Time jumps from event to event, so ten
//! simulated seconds of an HDD take milliseconds, and one seed reproduces
//! a run exactly.
//!
//! ```text
//!   jobs (closed loop: qd in flight; open loop: Poisson arrivals)
//!     │ submit(io, now)                      ▲ completions
//!     ▼                                      │
//!   TimingModel ── next_event() ──> the loop jumps `now` there ── advance(now)
//! ```

pub mod rng;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::bench::job::{Generator, JobSpec};
use crate::bench::stats::LatencyStats;
use crate::device::model::{IoKind, ModelIo, ModelSpec, Nanos, TimingModel, NANOS_PER_MS};

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
}

struct JobState {
    generator: Generator,
    started: bool,
    in_flight: u32,
    /// Open loop: arrivals waiting for a free slot.
    backlog: std::collections::VecDeque<Nanos>,
    next_arrival: Option<Nanos>,
    stop: Nanos,
    result: StreamResult,
}

struct Pending {
    job: usize,
    arrived: Nanos,
    bytes: u64,
    fails: bool,
}

pub struct Simulation {
    model: Box<dyn TimingModel>,
    spec: ModelSpec,
    jobs: Vec<JobState>,
    pending: HashMap<u64, Pending>,
    failing: BinaryHeap<Reverse<(Nanos, u64)>>,
    /// Closed-loop jobs thinking: (when, job index).
    thinking: BinaryHeap<Reverse<(Nanos, usize)>>,
    next_id: u64,
    duration: Nanos,
}

impl Simulation {
    pub fn new(
        spec: &ModelSpec,
        jobs: &[JobSpec],
        duration: Nanos,
        seed: u64,
    ) -> Result<Simulation, String> {
        let jobs = jobs
            .iter()
            .map(|job| {
                let generator = Generator::new(job.clone(), spec.size_bytes, seed)?;
                let stop = job.stop_ns().unwrap_or(duration).min(duration);
                Ok(JobState {
                    generator,
                    started: false,
                    in_flight: 0,
                    backlog: Default::default(),
                    next_arrival: None,
                    stop,
                    result: StreamResult {
                        job: job.clone(),
                        ops: 0,
                        bytes: 0,
                        errors: 0,
                        active_ns: stop.saturating_sub(job.start_ns()),
                        latency: LatencyStats::default(),
                    },
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Simulation {
            model: spec.timing_model(),
            spec: spec.clone(),
            jobs,
            pending: HashMap::new(),
            failing: BinaryHeap::new(),
            thinking: BinaryHeap::new(),
            next_id: 1,
            duration,
        })
    }

    /// Run to the end; the results are in job order.
    pub fn run(mut self) -> Vec<StreamResult> {
        let mut done = Vec::new();
        while let Some(now) = self.next_time().filter(|t| *t < self.duration) {
            self.model
                .set_slowdown(self.spec.faults.latency_factor(now));
            self.model.advance(now, &mut done);
            for (id, at) in done.drain(..) {
                debug_assert_eq!(at, now, "the loop stops at every completion");
                self.complete(id, at);
            }
            while let Some(Reverse((at, id))) = self.failing.peek().copied() {
                if at > now {
                    break;
                }
                self.failing.pop();
                self.complete(id, at);
            }
            while let Some(Reverse((at, index))) = self.thinking.peek().copied() {
                if at > now {
                    break;
                }
                self.thinking.pop();
                self.issue(index, at, at);
            }
            for index in 0..self.jobs.len() {
                self.start_or_arrive(index, now);
            }
        }
        self.jobs.into_iter().map(|job| job.result).collect()
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
        jobs.chain(self.model.next_event())
            .chain(failing)
            .chain(thinking)
            .min()
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

    fn issue(&mut self, index: usize, arrived: Nanos, now: Nanos) {
        let job = &mut self.jobs[index];
        if now >= job.stop {
            return;
        }
        let (kind, offset, length) = job.generator.next_io();
        job.in_flight += 1;
        let id = self.next_id;
        self.next_id += 1;
        let faults = &self.spec.faults;
        let fails = kind == IoKind::Read && faults.read_fails(offset, length);
        self.pending.insert(
            id,
            Pending {
                job: index,
                arrived,
                bytes: length,
                fails,
            },
        );
        if faults.vanished(now) {
            self.failing.push(Reverse((now + VANISHED_FAILURE_NS, id)));
            if let Some(pending) = self.pending.get_mut(&id) {
                pending.fails = true;
            }
            return;
        }
        self.model.submit(
            ModelIo {
                id,
                kind,
                offset,
                length,
            },
            now,
        );
    }

    fn complete(&mut self, id: u64, at: Nanos) {
        let pending = self
            .pending
            .remove(&id)
            .expect("completed request was pending");
        let job = &mut self.jobs[pending.job];
        job.in_flight -= 1;
        if pending.fails {
            job.result.errors += 1;
        } else {
            job.result.ops += 1;
            job.result.bytes += pending.bytes;
            job.result.latency.record(at - pending.arrived);
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
