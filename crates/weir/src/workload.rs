//! Workload jobs: `name=reader,rw=randread,bs=4k,qd=1[,rate=N/s][,mix=0.7]
//! [,offset=..][,size=..][,start=S][,stop=S][,class=..][,conns=N]`, and the
//! sans-IO generator that turns a job into a stream of requests.

use serde::Serialize;

use crate::device::model::{IoKind, Nanos, NANOS_PER_SEC};
use crate::rng::Rng;
use crate::sched::IoClass;
use crate::units::parse_bytes;

/// Connections one job may open: enough for any multi-connection client,
/// few enough that a typo cannot exhaust a server's connection limit.
pub const CONNS_MAX: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    Read,
    Write,
    RandRead,
    RandWrite,
    RandRw,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobSpec {
    pub name: String,
    pub rw: Rw,
    pub bs: u64,
    pub qd: u32,
    /// Open loop: Poisson arrivals at this rate per second, at most `qd` in flight.
    pub rate_per_sec: Option<f64>,
    /// Fraction of reads for `randrw`.
    pub read_mix: f64,
    pub offset: u64,
    /// Bytes of the device the job covers from `offset`; None: to the end.
    pub size: Option<u64>,
    pub start_s: f64,
    pub stop_s: Option<f64>,
    /// Closed loop: pause after each completion before the next request.
    pub think_s: f64,
    #[serde(skip)]
    pub class: Option<IoClass>,
    /// Spread consecutive requests round-robin over this many connections
    /// (in the simulator: server threads that each hand a request on after
    /// a random delay, so requests reach the volume reordered). None: one
    /// connection, and in the simulator no server threads at all.
    pub conns: Option<u32>,
    /// The job as written.
    pub text: String,
}

impl JobSpec {
    pub fn parse(text: &str) -> Result<JobSpec, String> {
        let mut job = JobSpec {
            name: String::new(),
            rw: Rw::RandRead,
            bs: 4096,
            qd: 1,
            rate_per_sec: None,
            read_mix: 0.5,
            offset: 0,
            size: None,
            start_s: 0.0,
            stop_s: None,
            think_s: 0.0,
            class: None,
            conns: None,
            text: text.into(),
        };
        let mut saw_rw = false;
        for part in text.split(',') {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("job {text:?}: {part:?} is not KEY=VALUE"))?;
            let bad = |what: &str| format!("job {text:?}: {key}={value}: {what}");
            match key {
                "name" => job.name = value.into(),
                "rw" => {
                    saw_rw = true;
                    job.rw = match value {
                        "read" => Rw::Read,
                        "write" => Rw::Write,
                        "randread" => Rw::RandRead,
                        "randwrite" => Rw::RandWrite,
                        "randrw" => Rw::RandRw,
                        _ => return Err(bad("want read, write, randread, randwrite or randrw")),
                    }
                }
                "bs" => job.bs = parse_bytes(value).map_err(|e| bad(&e))?,
                "qd" => job.qd = value.parse().map_err(|_| bad("want an integer"))?,
                "rate" => {
                    let rate: f64 = value
                        .trim_end_matches("/s")
                        .parse()
                        .map_err(|_| bad("want N/s"))?;
                    if !(rate > 0.0 && rate.is_finite()) {
                        return Err(bad("want a positive rate"));
                    }
                    job.rate_per_sec = Some(rate);
                }
                "mix" => {
                    job.read_mix = value.parse().map_err(|_| bad("want a read fraction"))?;
                    if !(0.0..=1.0).contains(&job.read_mix) {
                        return Err(bad("want a read fraction in [0, 1]"));
                    }
                }
                "offset" => job.offset = parse_bytes(value).map_err(|e| bad(&e))?,
                "size" => job.size = Some(parse_bytes(value).map_err(|e| bad(&e))?),
                "start" => job.start_s = seconds(value).ok_or_else(|| bad("want seconds"))?,
                "stop" => job.stop_s = Some(seconds(value).ok_or_else(|| bad("want seconds"))?),
                "think" => {
                    job.think_s = duration(value).ok_or_else(|| bad("want a duration like 5ms"))?
                }
                "class" => {
                    job.class = Some(IoClass::parse(value).ok_or_else(|| bad("unknown class"))?)
                }
                "conns" => {
                    let conns: u32 = value.parse().map_err(|_| bad("want an integer"))?;
                    if !(1..=CONNS_MAX).contains(&conns) {
                        return Err(bad(&format!("want 1-{CONNS_MAX} connections")));
                    }
                    job.conns = Some(conns);
                }
                _ => return Err(bad("unknown job key")),
            }
        }
        if !saw_rw {
            return Err(format!("job {text:?}: rw= is required"));
        }
        if job.bs == 0 || !job.bs.is_multiple_of(512) {
            return Err(format!(
                "job {text:?}: bs must be a positive multiple of 512"
            ));
        }
        if job.qd == 0 || job.qd > 1024 {
            return Err(format!("job {text:?}: qd must be 1-1024"));
        }
        if job.think_s > 0.0 && job.rate_per_sec.is_some() {
            return Err(format!(
                "job {text:?}: think= is for closed loops, rate= for open ones"
            ));
        }
        if job.stop_s.is_some_and(|stop| stop <= job.start_s) {
            return Err(format!("job {text:?}: stop must come after start"));
        }
        if job.name.is_empty() {
            job.name = format!("{:?}", job.rw).to_lowercase();
        }
        Ok(job)
    }

    pub fn start_ns(&self) -> Nanos {
        (self.start_s * NANOS_PER_SEC as f64) as Nanos
    }

    pub fn think_ns(&self) -> Nanos {
        (self.think_s * NANOS_PER_SEC as f64) as Nanos
    }

    /// The connections the job's requests are spread over.
    pub fn connections(&self) -> u32 {
        self.conns.unwrap_or(1)
    }

    pub fn stop_ns(&self) -> Option<Nanos> {
        self.stop_s.map(|s| (s * NANOS_PER_SEC as f64) as Nanos)
    }
}

fn seconds(text: &str) -> Option<f64> {
    let s: f64 = text.trim_end_matches('s').parse().ok()?;
    (s >= 0.0 && s.is_finite()).then_some(s)
}

/// Turns a job into requests. Sans-IO: the driver supplies time and
/// decides when to ask.
#[derive(Clone, Debug)]
pub struct Generator {
    job: JobSpec,
    rng: Rng,
    /// Usable range, aligned to `bs`.
    first: u64,
    blocks: u64,
    next_sequential: u64,
}

impl Generator {
    /// `device_bytes`: the size of the device or export the job runs on.
    pub fn new(job: JobSpec, device_bytes: u64, seed: u64) -> Result<Generator, String> {
        let first = job.offset.next_multiple_of(job.bs);
        let end = job
            .size
            .map_or(device_bytes, |size| job.offset.saturating_add(size))
            .min(device_bytes);
        let blocks = end.saturating_sub(first) / job.bs;
        if blocks == 0 {
            return Err(format!(
                "job {}: no whole {}-byte block between offset {} and {}",
                job.name, job.bs, job.offset, end
            ));
        }
        Ok(Generator {
            rng: Rng::new(crate::rng::mix(seed ^ crate::rng::mix(hash(&job.name)))),
            job,
            first,
            blocks,
            next_sequential: 0,
        })
    }

    pub fn job(&self) -> &JobSpec {
        &self.job
    }

    /// The next request: (kind, offset, length).
    pub fn next_io(&mut self) -> (IoKind, u64, u64) {
        let bs = self.job.bs;
        let sequential = |g: &mut Generator| {
            let block = g.next_sequential;
            g.next_sequential = (g.next_sequential + 1) % g.blocks;
            g.first + block * bs
        };
        let random = |g: &mut Generator| g.first + g.rng.below(g.blocks) * bs;
        match self.job.rw {
            Rw::Read => (IoKind::Read, sequential(self), bs),
            Rw::Write => (IoKind::Write, sequential(self), bs),
            Rw::RandRead => (IoKind::Read, random(self), bs),
            Rw::RandWrite => (IoKind::Write, random(self), bs),
            Rw::RandRw => {
                let kind = if self.rng.unit() < self.job.read_mix {
                    IoKind::Read
                } else {
                    IoKind::Write
                };
                (kind, random(self), bs)
            }
        }
    }

    /// Open loop: the gap to the next arrival, in ns.
    pub fn next_gap_ns(&mut self) -> Option<Nanos> {
        let rate = self.job.rate_per_sec?;
        Some((self.rng.exponential(NANOS_PER_SEC as f64 / rate) as Nanos).max(1))
    }
}

/// `250us`, `5ms`, `0.1s` or plain seconds.
fn duration(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else {
        (text.strip_suffix('s').unwrap_or(text), 1.0)
    };
    let value: f64 = number.parse().ok()?;
    (value >= 0.0 && value.is_finite()).then_some(value * scale)
}

fn hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_parse_and_reject_nonsense() {
        let job = JobSpec::parse("name=scan,rw=read,bs=1m,qd=3,start=1,stop=5").unwrap();
        assert_eq!(job.rw, Rw::Read);
        assert_eq!(job.bs, 1 << 20);
        assert_eq!(job.qd, 3);
        assert_eq!(job.stop_ns(), Some(5 * NANOS_PER_SEC));
        assert_eq!(
            JobSpec::parse("rw=randread,rate=200/s")
                .unwrap()
                .rate_per_sec,
            Some(200.0)
        );
        assert_eq!(JobSpec::parse("rw=read,conns=4").unwrap().conns, Some(4));
        assert_eq!(JobSpec::parse("rw=read").unwrap().conns, None);
        for bad in [
            "rw=read,conns=0",
            "rw=read,conns=65",
            "rw=read,conns=two",
            "bs=4k",
            "rw=sideways",
            "rw=read,bs=100",
            "rw=read,qd=0",
            "rw=read,start=5,stop=1",
            "rw=read,colour=blue",
            "rw=randrw,mix=2",
            "rw=read,think=soon",
            "rw=read,think=1ms,rate=10/s",
        ] {
            assert!(JobSpec::parse(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn generators_stay_in_their_range() {
        let job = JobSpec::parse("rw=randread,bs=4k,offset=1m,size=1m").unwrap();
        let mut g = Generator::new(job, 1 << 30, 1).unwrap();
        for _ in 0..1000 {
            let (_, offset, len) = g.next_io();
            assert!(offset >= 1 << 20 && offset + len <= 2 << 20);
            assert_eq!(offset % 4096, 0);
        }
        let job = JobSpec::parse("rw=read,bs=1m,size=2m").unwrap();
        let mut g = Generator::new(job, 1 << 30, 1).unwrap();
        let offsets: Vec<u64> = (0..3).map(|_| g.next_io().1).collect();
        assert_eq!(offsets, vec![0, 1 << 20, 0]);
    }
}
