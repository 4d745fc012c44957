//! Named scenarios: the device calibration and the scrub that starves
//! reads, each run as labelled runs of one report with a table of measured
//! against expected figures (writeback stalling reads is in writeback.rs).

use std::fmt::Write as _;

use anyhow::Context;

use super::report::{Report, Run, Stream};
use super::{run_jobs, Target};
use crate::device::model::ModelSpec;
use crate::pool::mirror::select::ReadPolicy;
use crate::sched::Mode;
use crate::workload::JobSpec;

/// Devices the scenarios use. 64 GiB keeps a memory store's page table
/// small in real time; the models' timing depends on fractions of the size.
pub const HDD: &str = "model:hdd,size=64G";
pub const SSD: &str = "model:ssd,size=64G";
pub const NVME: &str = "model:nvme,size=64G";

/// One figure checked against its expected range.
pub struct Check {
    pub what: String,
    pub expected: String,
    pub measured: String,
    pub ok: bool,
    /// Set when the expected range is out of reach of any policy on these
    /// devices (a reference run shows the ceiling): reported, not failed.
    pub beyond_reach: Option<String>,
}

impl Check {
    pub(crate) fn range(what: &str, unit: &str, measured: f64, low: f64, high: f64) -> Check {
        Check {
            what: what.into(),
            expected: if high.is_finite() {
                format!("{low}-{high} {unit}")
            } else {
                format!(">= {low} {unit}")
            },
            measured: if unit == "x" {
                format!("{measured:.2} {unit}")
            } else {
                format!("{measured:.1} {unit}")
            },
            ok: measured >= low && measured <= high,
            beyond_reach: None,
        }
    }

    /// A missed lower bound that even `ceiling` (the same ratio for the
    /// best any policy could do, from reference runs) would miss is beyond
    /// reach, not a failure of the policy.
    pub(crate) fn unless_beyond_reach(mut self, ceiling: f64, low: f64, how: &str) -> Check {
        if !self.ok && ceiling < low {
            self.beyond_reach = Some(format!("{how} reaches {ceiling:.2} x"));
        }
        self
    }

    /// A missed upper bound that even `best` (the same figure for the best
    /// any policy could do, from reference runs) would miss is beyond
    /// reach, not a failure of the policy.
    pub(crate) fn unless_beyond_reach_above(mut self, best: f64, high: f64, how: &str) -> Check {
        if !self.ok && best > high {
            self.beyond_reach = Some(format!("{how} gives {best:.2} x"));
        }
        self
    }

    /// Missed its range where a policy could have met it.
    pub fn failed(&self) -> bool {
        !self.ok && self.beyond_reach.is_none()
    }
}

pub fn checks_table(checks: &[Check]) -> String {
    let mut out = String::from("| measure | expected | measured | ok |\n|---|---|---|---|\n");
    for c in checks {
        let verdict = match (&c.beyond_reach, c.ok) {
            (_, true) => "yes".to_string(),
            (Some(why), false) => format!("beyond reach ({why})"),
            (None, false) => "NO".to_string(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {verdict} |",
            c.what, c.expected, c.measured
        );
    }
    out
}

/// How a scenario reaches its devices.
pub trait Targets {
    /// The target for a device spec such as `model:hdd,size=64G`.
    fn target(&mut self, device: &str) -> anyhow::Result<Target>;

    /// A 2-way mirror of `device` with its queues in `mode`, where the
    /// targets can build one (the simulator, or a pool served by us).
    fn mirror(&mut self, _device: &str, _mode: Mode) -> anyhow::Result<Option<Target>> {
        Ok(None)
    }

    /// A pool of `devices` (one: just it; more: a mirror) whose reads
    /// choose a copy by `policy`, its queues in the default mode.
    fn pool_of(
        &mut self,
        _devices: &[&str],
        _policy: Option<ReadPolicy>,
    ) -> anyhow::Result<Option<Target>> {
        Ok(None)
    }

    /// Bytes of the volume a `pool_of` target offers its jobs.
    fn pool_volume_bytes(&self) -> u64 {
        64 << 30
    }

    /// Run `jobs` on a pool of `devices` read by `policy`, with copy
    /// `slow.copy` slowed over a window of the run, and record each
    /// device's share of the reads over time.
    fn run_with_slow_copy(
        &mut self,
        _label: &str,
        _devices: &[&str],
        _policy: ReadPolicy,
        _jobs: &[JobSpec],
        _slow: SlowCopy,
        _seed: u64,
    ) -> anyhow::Result<Run> {
        anyhow::bail!("these targets cannot slow a copy down")
    }
}

/// A copy made `factor` times slower from `from_s` to `until_s` of a run
/// of `run_s` seconds.
#[derive(Clone, Copy, Debug)]
pub struct SlowCopy {
    pub copy: usize,
    pub factor: u32,
    pub from_s: f64,
    pub until_s: f64,
    pub run_s: f64,
}

/// Simulated devices.
pub struct SimTargets;

pub(super) fn model(device: &str) -> anyhow::Result<ModelSpec> {
    let text = device.strip_prefix("model:").unwrap_or(device);
    ModelSpec::parse(text).map_err(anyhow::Error::msg)
}

impl Targets for SimTargets {
    fn target(&mut self, device: &str) -> anyhow::Result<Target> {
        Ok(Target::Sim(Box::new(model(device)?)))
    }

    fn mirror(&mut self, device: &str, mode: Mode) -> anyhow::Result<Option<Target>> {
        Ok(Some(Target::SimPool {
            devices: vec![model(device)?, model(device)?],
            mode,
            read_policy: ReadPolicy::default(),
            cache: None,
            readahead: false,
        }))
    }

    fn pool_of(
        &mut self,
        devices: &[&str],
        policy: Option<ReadPolicy>,
    ) -> anyhow::Result<Option<Target>> {
        Ok(Some(Target::SimPool {
            devices: devices
                .iter()
                .map(|d| model(d))
                .collect::<anyhow::Result<_>>()?,
            mode: Mode::default(),
            read_policy: policy.unwrap_or_default(),
            cache: None,
            readahead: false,
        }))
    }

    fn run_with_slow_copy(
        &mut self,
        label: &str,
        devices: &[&str],
        policy: ReadPolicy,
        jobs: &[JobSpec],
        slow: SlowCopy,
        seed: u64,
    ) -> anyhow::Result<Run> {
        let slowed = format!(
            "{},slow={}x@{}..{}",
            devices[slow.copy], slow.factor, slow.from_s, slow.until_s
        );
        let mut specs = devices.to_vec();
        specs[slow.copy] = &slowed;
        let target = self
            .pool_of(&specs, Some(policy))?
            .expect("the simulator builds pools");
        run_jobs(label, &target, jobs, slow.run_s, seed)
    }
}

/// The scrub stream: 1 MiB reads of every copy in LBA order, four in
/// flight per device (OpenZFS keeps 4 MiB of scrub I/O per leaf by default).
pub fn scrub_job(copies: usize) -> String {
    format!("name=scrub,rw=read,bs=1m,qd={},class=scrub", 4 * copies)
}

pub(super) fn jobs(texts: &[&str]) -> Vec<JobSpec> {
    texts
        .iter()
        .map(|t| JobSpec::parse(t).expect("scenario jobs are valid"))
        .collect()
}

pub(super) fn stream<'a>(run: &'a Run, name: &str) -> &'a Stream {
    run.streams
        .iter()
        .find(|s| s.name == name)
        .expect("scenario streams exist")
}

pub struct Outcome {
    pub report: Report,
    pub checks: Vec<Check>,
    /// Reference figures printed before the checks.
    pub notes: String,
    /// Plots beyond the latency histograms: (name, picture), written
    /// beside the JSON as SCENARIO-MODE-NAME.png.
    pub plots: Vec<(String, super::canvas::Canvas)>,
}

fn report(scenario: &str, targets_mode: &str, seconds: f64, seed: u64, runs: Vec<Run>) -> Report {
    Report {
        scenario: scenario.into(),
        mode: targets_mode.into(),
        seconds,
        seed,
        runs,
    }
}

/// Reader jobs in the Micron 1100 figures.
const MICRON_READERS: usize = 20;

pub fn calibrate(targets: &mut dyn Targets, seconds: f64, seed: u64) -> anyhow::Result<Outcome> {
    let hdd = targets.target(HDD)?;
    let ssd = targets.target(SSD)?;
    let nvme = targets.target(NVME)?;
    let mode = hdd.mode();
    // The inner-edge job starts 1 GiB before the end of the 64 GiB drive.
    let plan: Vec<(&str, &Target, &str)> = vec![
        ("hdd-randread-qd1", &hdd, "name=io,rw=randread,bs=4k,qd=1"),
        ("hdd-randread-qd32", &hdd, "name=io,rw=randread,bs=4k,qd=32"),
        (
            "hdd-seqread-outer",
            &hdd,
            "name=io,rw=read,bs=1m,qd=2,offset=0,size=1g",
        ),
        (
            "hdd-seqread-inner",
            &hdd,
            "name=io,rw=read,bs=1m,qd=2,offset=63g,size=1g",
        ),
        ("ssd-randread-qd1", &ssd, "name=io,rw=randread,bs=4k,qd=1"),
        ("ssd-seqread", &ssd, "name=io,rw=read,bs=1m,qd=4"),
        ("ssd-randread-qd32", &ssd, "name=io,rw=randread,bs=4k,qd=32"),
        ("nvme-randread-qd1", &nvme, "name=io,rw=randread,bs=4k,qd=1"),
        ("nvme-seqread", &nvme, "name=io,rw=read,bs=1m,qd=8"),
    ];
    let mut runs = Vec::new();
    for (label, target, job) in plan {
        runs.push(run_jobs(label, target, &jobs(&[job]), seconds, seed)?);
    }
    // The Micron 1100 figures (a SATA TLC SSD, in the discussion behind
    // Linux's writeback throttle): 20 fio jobs of 4 KiB random reads at
    // QD1, alone and beside dd writing 1 MiB O_DIRECT, and dd alone.
    let readers: Vec<String> = (0..MICRON_READERS)
        .map(|i| format!("name=r{i},rw=randread,bs=4k,qd=1"))
        .collect();
    let reader_refs: Vec<&str> = readers.iter().map(String::as_str).collect();
    let mut beside = reader_refs.clone();
    beside.push("name=w,rw=write,bs=1m,qd=1");
    let sustained = [
        "name=fresh,rw=write,bs=1m,qd=8,stop=4",
        "name=filling,rw=write,bs=1m,qd=8,offset=8g,start=4,stop=20",
        "name=full,rw=write,bs=1m,qd=8,offset=24g,start=20,stop=30",
    ];
    let micron = [
        ("ssd-20-readers", &ssd, jobs(&reader_refs), seconds),
        ("ssd-20-readers-beside-writer", &ssd, jobs(&beside), seconds),
        (
            "ssd-write-qd1",
            &ssd,
            jobs(&["name=w,rw=write,bs=1m,qd=1"]),
            seconds,
        ),
        ("ssd-write-sustained", &ssd, jobs(&sustained), 30.0),
        ("nvme-write-sustained", &nvme, jobs(&sustained), 30.0),
    ];
    for (label, target, job_list, run_seconds) in micron {
        runs.push(run_jobs(label, target, &job_list, run_seconds, seed)?);
    }
    let io = |i: usize| stream(&runs[i], "io");
    // The median over the reader streams of one figure.
    let readers_median = |run: &Run, figure: fn(&Stream) -> f64| {
        let mut values: Vec<f64> = run
            .streams
            .iter()
            .filter(|s| s.name.starts_with('r'))
            .map(figure)
            .collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let micron_run = |label: &str| {
        runs.iter()
            .find(|r| r.label == label)
            .expect("calibration run")
    };
    // Sustained writes once the spare is used up, over the fresh drive's.
    let used_up_over_fresh = |label: &str| {
        let run = micron_run(label);
        stream(run, "full").mb_per_s / stream(run, "fresh").mb_per_s.max(1e-9)
    };
    let hdd_qd1 = io(0).iops;
    let checks = vec![
        Check::range(
            "HDD 4K random read QD1, mean",
            "ms",
            io(0).latency_us.mean / 1000.0,
            11.0,
            14.0,
        ),
        Check::range("HDD 4K random read QD1", "IOPS", hdd_qd1, 70.0, 90.0),
        Check::range(
            "HDD 4K random read QD32 / QD1",
            "x",
            io(1).iops / hdd_qd1.max(1e-9),
            1.5,
            2.5,
        ),
        Check::range(
            "HDD 1M sequential read, outer edge",
            "MB/s",
            io(2).mb_per_s,
            200.0,
            260.0,
        ),
        Check::range(
            "HDD inner / outer sequential rate",
            "x",
            io(3).mb_per_s / io(2).mb_per_s.max(1e-9),
            0.4,
            0.6,
        ),
        Check::range(
            "SSD 4K random read QD1, mean",
            "us",
            io(4).latency_us.mean,
            80.0,
            120.0,
        ),
        Check::range(
            "SSD 1M sequential read",
            "MB/s",
            io(5).mb_per_s,
            500.0,
            560.0,
        ),
        Check::range(
            "SSD 4K random read QD32",
            "IOPS",
            io(6).iops,
            75_000.0,
            95_000.0,
        ),
        Check::range(
            "SSD 4K random read QD1, p99 / p50 (reads vary)",
            "x",
            io(4).latency_us.p99 / io(4).latency_us.p50.max(1e-9),
            1.2,
            4.0,
        ),
        Check::range(
            "SSD 4K random read, 20 jobs at QD1, p50 (Micron 1100: 225 us)",
            "us",
            readers_median(micron_run("ssd-20-readers"), |s| s.latency_us.p50),
            180.0,
            270.0,
        ),
        Check::range(
            "SSD 4K random read, 20 jobs at QD1, p99 (Micron 1100: 580 us)",
            "us",
            readers_median(micron_run("ssd-20-readers"), |s| s.latency_us.p99),
            300.0,
            750.0,
        ),
        Check::range(
            "SSD 1M writes at QD1 (Micron 1100: 424 MB/s)",
            "MB/s",
            stream(micron_run("ssd-write-qd1"), "w").mb_per_s,
            380.0,
            470.0,
        ),
        Check::range(
            "SSD 20 readers beside a 1M QD1 writer, p99 (Micron 1100: 2672 us)",
            "us",
            readers_median(micron_run("ssd-20-readers-beside-writer"), |s| {
                s.latency_us.p99
            }),
            1500.0,
            4500.0,
        ),
        Check::range(
            "SSD sustained 1M writes, spare used up / fresh",
            "x",
            used_up_over_fresh("ssd-write-sustained"),
            0.4,
            0.8,
        ),
        Check::range(
            "NVMe sustained 1M writes, spare used up / fresh",
            "x",
            used_up_over_fresh("nvme-write-sustained"),
            0.3,
            0.8,
        ),
        Check::range(
            "NVMe 4K random read QD1, mean",
            "us",
            io(7).latency_us.mean,
            60.0,
            120.0,
        ),
        Check::range(
            "NVMe 1M sequential read",
            "MB/s",
            io(8).mb_per_s,
            2500.0,
            f64::INFINITY,
        ),
    ];
    Ok(Outcome {
        report: report("calibrate", mode, seconds, seed, runs),
        checks,
        notes: String::new(),
        plots: Vec::new(),
    })
}

/// A sequential scan starves a random reader on an HDD.
pub fn scrub_vs_randread(
    targets: &mut dyn Targets,
    seconds: f64,
    seed: u64,
) -> anyhow::Result<Outcome> {
    let hdd = targets.target(HDD)?;
    let reader = "name=randread,rw=randread,bs=4k,qd=1";
    let scan = |qd: u32| format!("name=scrub,rw=read,bs=1m,qd={qd}");
    let runs = vec![
        run_jobs("idle", &hdd, &jobs(&[reader]), seconds, seed)?,
        run_jobs("fifo", &hdd, &jobs(&[reader, &scan(3)]), seconds, seed)?,
        run_jobs(
            "fifo-scrub-qd1",
            &hdd,
            &jobs(&[reader, &scan(1)]),
            seconds,
            seed,
        )?,
    ];
    let idle = stream(&runs[0], "randread");
    let qd3 = stream(&runs[1], "randread");
    let qd1 = stream(&runs[2], "randread");
    let checks = vec![
        Check::range(
            "random reader max latency, scrub QD3",
            "ms",
            qd3.latency_us.max / 1000.0,
            1000.0,
            f64::INFINITY,
        ),
        Check::range(
            "random reader IOPS / idle, scrub QD3",
            "x",
            qd3.iops / idle.iops.max(1e-9),
            0.0,
            0.3,
        ),
        Check {
            what: "scrub QD1 stalls the reader less than QD3 (max latency)".into(),
            expected: format!("< {:.0} ms", qd3.latency_us.max / 1000.0),
            measured: format!("{:.0} ms", qd1.latency_us.max / 1000.0),
            ok: qd1.latency_us.max < qd3.latency_us.max,
            beyond_reach: None,
        },
    ];
    Ok(Outcome {
        report: report("scrub-vs-randread", hdd.mode(), seconds, seed, runs),
        checks,
        notes: String::new(),
        plots: Vec::new(),
    })
}

fn mirror(targets: &mut dyn Targets, device: &str, mode: Mode) -> anyhow::Result<Target> {
    targets
        .mirror(device, mode)?
        .context("the scheduler scenario needs mirrors: run it with --sim or --real (a --uri server is one device)")
}

/// The device queue's modes on mirrors of two devices: fifo, zfs and
/// adaptive with a scrub beside random readers, and idle references,
/// checked against the scenario's checks (scheduler_matrix.rs adds the
/// matrix in the simulator). In real time each mirror is a served pool,
/// and the scrub is the pool's own.
pub fn scheduler(targets: &mut dyn Targets, seconds: f64, seed: u64) -> anyhow::Result<Outcome> {
    let scrub = scrub_job(2);
    let reader = "name=randread,rw=randread,bs=4k,qd=1";
    let light = "name=randread,rw=randread,bs=4k,qd=1,rate=20/s";
    let saturating = "name=randread,rw=randread,bs=4k,qd=32";
    let mut runs = Vec::new();
    let mut targets_mode = "sim";
    let mut run = |label: &str, device: &str, mode: Mode, texts: &[&str]| -> anyhow::Result<Run> {
        let target = mirror(targets, device, mode)?;
        targets_mode = target.mode();
        let run = run_jobs(label, &target, &jobs(texts), seconds, seed)?;
        runs.push(run.clone());
        Ok(run)
    };
    let idle = run("idle", HDD, Mode::Adaptive, &[reader])?;
    let scrub_idle = run("idle-scrub", HDD, Mode::Adaptive, &[&scrub])?;
    let fifo = run("fifo", HDD, Mode::Fifo, &[reader, &scrub])?;
    let zfs = run("zfs", HDD, Mode::Zfs, &[reader, &scrub])?;
    let adaptive = run("adaptive", HDD, Mode::Adaptive, &[reader, &scrub])?;
    let light_idle = run("idle-light", HDD, Mode::Adaptive, &[light])?;
    let light_busy = run("adaptive-light", HDD, Mode::Adaptive, &[light, &scrub])?;
    let saturated = run("adaptive-qd32", HDD, Mode::Adaptive, &[saturating, &scrub])?;
    let mut flash = Vec::new();
    for (name, device) in [("ssd", SSD), ("nvme", NVME)] {
        let idle = run(&format!("idle-{name}"), device, Mode::Adaptive, &[reader])?;
        let busy = run(
            &format!("adaptive-{name}"),
            device,
            Mode::Adaptive,
            &[reader, &scrub],
        )?;
        let fifo32 = run(
            &format!("fifo-qd32-{name}"),
            device,
            Mode::Fifo,
            &[saturating],
        )?;
        let adaptive32 = run(
            &format!("adaptive-qd32-{name}"),
            device,
            Mode::Adaptive,
            &[saturating],
        )?;
        flash.push((name, idle, busy, fifo32, adaptive32));
    }
    let r = |run: &Run| stream(run, "randread").clone();
    let s = |run: &Run| stream(run, "scrub").mb_per_s;
    let (f, z, a) = (r(&fifo), r(&zfs), r(&adaptive));
    let ms = |us: f64| us / 1000.0;
    let better = [
        z.latency_us.p99 / a.latency_us.p99.max(1e-9),
        z.latency_us.max / a.latency_us.max.max(1e-9),
        a.iops / z.iops.max(1e-9),
        s(&adaptive) / s(&zfs).max(1e-9),
    ];
    let mut checks = vec![
        Check::range(
            "1. fifo: reader max latency",
            "ms",
            ms(f.latency_us.max),
            1000.0,
            f64::INFINITY,
        ),
        Check::range(
            "2. fifo / adaptive: reader max latency",
            "x",
            f.latency_us.max / a.latency_us.max.max(1e-9),
            10.0,
            f64::INFINITY,
        ),
        Check::range(
            "3. zfs / adaptive: reader p99",
            "x",
            better[0],
            1.0,
            f64::INFINITY,
        ),
        Check::range(
            "3. zfs / adaptive: reader max",
            "x",
            better[1],
            1.0,
            f64::INFINITY,
        ),
        Check::range(
            "3. adaptive / zfs: reader IOPS",
            "x",
            better[2],
            1.0,
            f64::INFINITY,
        ),
        Check::range(
            "3. adaptive / zfs: scrub MB/s",
            "x",
            better[3],
            0.95,
            f64::INFINITY,
        ),
        Check {
            what: "3. one of those better by 10%".into(),
            expected: ">= 1.10 x".into(),
            measured: format!("{:.2} x", better.iter().copied().fold(0.0, f64::max)),
            ok: better.iter().any(|b| *b >= 1.1),
            beyond_reach: None,
        },
        Check::range(
            "4. light reader: p99 / idle p99",
            "x",
            r(&light_busy).latency_us.p99 / r(&light_idle).latency_us.p99.max(1e-9),
            0.0,
            1.5,
        ),
        Check::range(
            "4. light reader: scrub / idle scrub",
            "x",
            s(&light_busy) / s(&scrub_idle).max(1e-9),
            0.7,
            f64::INFINITY,
        ),
        Check::range(
            "5. QD32 reader: scrub / idle scrub",
            "x",
            s(&saturated) / s(&scrub_idle).max(1e-9),
            0.05,
            f64::INFINITY,
        ),
    ];
    let _ = idle;
    for (name, idle, busy, fifo32, adaptive32) in &flash {
        checks.push(Check::range(
            &format!("6. {name}: reader p99 with scrub / idle"),
            "x",
            r(busy).latency_us.p99 / r(idle).latency_us.p99.max(1e-9),
            0.0,
            2.0,
        ));
        checks.push(Check::range(
            &format!("6. {name}: QD32 reads, adaptive / fifo"),
            "x",
            r(adaptive32).iops / r(fifo32).iops.max(1e-9),
            0.97,
            f64::INFINITY,
        ));
    }
    Ok(Outcome {
        report: report("scheduler", targets_mode, seconds, seed, runs),
        checks,
        notes: String::new(),
        plots: Vec::new(),
    })
}
