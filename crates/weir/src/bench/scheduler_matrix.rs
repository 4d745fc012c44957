//! The scheduler scenario's matrix, in the simulator: foreground loads
//! beside a scrub (and a resilver) on HDD, SSD and NVMe mirrors, under
//! fifo, zfs and adaptive. Readers closed-loop at QD1-8 with 4-128 KiB
//! blocks, open-loop at half what a QD1 reader gets alone, and readers
//! beside writers through the write-back cache, paced at a tenth of what
//! the writer gets alone so that every mode can keep up with them.

use std::fmt::Write as _;

use super::canvas::Canvas;
use super::plot::{self, YScale};
use super::report::Run;
use super::scenarios::{self, jobs, model, stream, Check, Outcome, Targets, HDD, NVME, SSD};
use super::{run_jobs, Target};
use crate::pool::mirror::select::ReadPolicy;
use crate::sched::Mode;
use crate::sim::WbThrottle;

const MODES: [Mode; 3] = [Mode::Fifo, Mode::Zfs, Mode::Adaptive];
const DEVICES: [(&str, &str); 3] = [("hdd", HDD), ("ssd", SSD), ("nvme", NVME)];
/// Background at least this share of its idle rate in every cell.
const SCRUB_SHARE_MIN: f64 = 0.1;
const RESILVER_SHARE_MIN: f64 = 0.2;
/// Against zfs: reader IOPS at least, reader p99 at most.
const IOPS_VS_ZFS_MIN: f64 = 0.9;
const P99_VS_ZFS_MAX: f64 = 1.1;
/// A cached writer counts as kept up with at this share of its pace.
const PACE_KEPT: f64 = 0.9;
/// Writers are paced at this fraction of their closed-loop rate alone.
const WRITER_PACE_FRACTION: f64 = 0.1;

/// One foreground load.
struct Load {
    label: String,
    jobs: Vec<String>,
    /// Writes go through the write-back cache.
    cached: bool,
    /// The paced writer's rate (MB/s), if there is one.
    writer_pace_mb: Option<f64>,
}

/// What one mode gave one cell.
#[derive(Clone, Copy, Debug)]
struct Figures {
    iops: f64,
    p99_us: f64,
    background_mb: f64,
    writer_mb: Option<f64>,
    /// The paced writer's p99 latency (us), counted from when its pace
    /// meant to send each write: a writer held back falls behind, and
    /// this is how far.
    writer_p99_us: Option<f64>,
}

struct Cell {
    device: &'static str,
    load: String,
    background: &'static str,
    idle_background_mb: f64,
    writer_pace_mb: Option<f64>,
    by_mode: Vec<(Mode, Figures)>,
}

impl Cell {
    fn figures(&self, mode: Mode) -> Figures {
        self.by_mode
            .iter()
            .find(|(m, _)| *m == mode)
            .expect("every mode ran")
            .1
    }

    fn background_share(&self, mode: Mode) -> f64 {
        self.figures(mode).background_mb / self.idle_background_mb.max(1e-9)
    }

    fn share_min(&self) -> f64 {
        if self.background == "resilver" {
            RESILVER_SHARE_MIN
        } else {
            SCRUB_SHARE_MIN
        }
    }

    /// Whether zfs kept the cell's paced writer at its pace while
    /// adaptive did: a zfs reader that beat adaptive's there did so by
    /// holding the writes back (seconds, in the simulator).
    fn zfs_stalled_writer(&self) -> bool {
        let (Some(pace), Some(zfs), Some(adaptive)) = (
            self.writer_pace_mb,
            self.figures(Mode::Zfs).writer_mb,
            self.figures(Mode::Adaptive).writer_mb,
        ) else {
            return false;
        };
        zfs < pace * PACE_KEPT && adaptive >= pace * PACE_KEPT
    }

    fn iops_vs_zfs(&self) -> f64 {
        self.figures(Mode::Adaptive).iops / self.figures(Mode::Zfs).iops.max(1e-9)
    }

    fn p99_vs_zfs(&self) -> f64 {
        self.figures(Mode::Adaptive).p99_us / self.figures(Mode::Zfs).p99_us.max(1e-9)
    }

    fn met(&self) -> bool {
        let background = self.background_share(Mode::Adaptive) >= self.share_min();
        let iops = self.iops_vs_zfs() >= IOPS_VS_ZFS_MIN;
        let p99 = self.p99_vs_zfs() <= P99_VS_ZFS_MAX || self.zfs_stalled_writer();
        background && iops && p99
    }
}

fn pool(device: &str, mode: Mode, cached: bool) -> anyhow::Result<Target> {
    let spec = model(device)?;
    let throttle = match mode {
        Mode::Adaptive => WbThrottle::Adaptive,
        _ => WbThrottle::None,
    };
    let cache = cached.then_some(throttle);
    Ok(Target::SimPool {
        devices: vec![spec.clone(), spec],
        mode,
        read_policy: ReadPolicy::default(),
        cache,
        readahead: false,
    })
}

fn background_job(kind: &str) -> String {
    format!("name=background,rw=read,bs=1m,qd=8,class={kind}")
}

/// The scheduler scenario (scenarios.rs) and, in the simulator, the
/// matrix: its table in the notes, its check after the scenario's, its
/// plot as `matrix`. The matrix's runs stay out of the report, whose
/// histograms would otherwise hold hundreds of them.
pub fn scheduler(targets: &mut dyn Targets, seconds: f64, seed: u64) -> anyhow::Result<Outcome> {
    let mut outcome = scenarios::scheduler(targets, seconds, seed)?;
    if outcome.report.mode == "sim" {
        let matrix = run(seconds, seed)?;
        outcome.notes = format!(
            "Matrix: each load beside a scrub (fifo, zfs, adaptive) and a resilver (zfs, adaptive); background / idle is its rate over its rate alone.\n\n{}",
            matrix.table
        );
        outcome.checks.extend(matrix.checks);
        outcome.plots.push(("matrix".to_string(), matrix.plot));
    }
    Ok(outcome)
}

/// The matrix's outcome: a table, its checks and the plot.
pub struct Matrix {
    pub table: String,
    pub checks: Vec<Check>,
    pub plot: Canvas,
}

struct Runner {
    seconds: f64,
    seed: u64,
}

/// One simulation to run: its label, target and jobs.
type Spec = (String, Target, Vec<String>);

impl Runner {
    /// Runs side by side, as many at once as there are CPUs, each thread
    /// taking the next: every simulation is its own, seeded, and gives the
    /// same result on any thread. The results come back in `specs`' order.
    fn run_all(&self, specs: Vec<Spec>) -> anyhow::Result<Vec<Run>> {
        let (seconds, seed) = (self.seconds, self.seed);
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<parking_lot::Mutex<Option<anyhow::Result<Run>>>> = specs
            .iter()
            .map(|_| parking_lot::Mutex::new(None))
            .collect();
        std::thread::scope(|scope| {
            for _ in 0..threads.min(specs.len()) {
                scope.spawn(|| loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((label, target, texts)) = specs.get(index) else {
                        return;
                    };
                    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                    let run = run_jobs(label, target, &jobs(&texts), seconds, seed);
                    *results[index].lock() = Some(run);
                });
            }
        });
        results
            .into_iter()
            .map(|r| r.into_inner().expect("every run finished"))
            .collect()
    }
}

/// The loads of one device, given what its reader and writers do alone.
fn loads(alone: &Alone) -> Vec<Load> {
    let mut loads = Vec::new();
    for qd in [1, 2, 4, 8] {
        for bs in ["4k", "16k", "128k"] {
            loads.push(Load {
                label: format!("{bs} qd{qd}"),
                jobs: vec![format!("name=reader,rw=randread,bs={bs},qd={qd}")],
                cached: false,
                writer_pace_mb: None,
            });
        }
    }
    let rate = (stream(&alone.reader, "reader").iops / 2.0).max(1.0) as u64;
    loads.push(Load {
        label: "4k open".into(),
        jobs: vec![format!("name=reader,rw=randread,bs=4k,qd=8,rate={rate}/s")],
        cached: false,
        writer_pace_mb: None,
    });
    for ((label, bs, qd, writer, mib), alone) in WRITERS.iter().zip(&alone.writers) {
        let pace = (stream(alone, "writer").iops * WRITER_PACE_FRACTION).max(1.0) as u64;
        loads.push(Load {
            label: (*label).into(),
            jobs: vec![
                format!("name=reader,rw=randread,bs={bs},qd={qd}"),
                format!("name=writer,{writer},rate={pace}/s"),
            ],
            cached: true,
            writer_pace_mb: Some(pace as f64 * mib * 1.048576),
        });
    }
    loads
}

/// Readers beside writers: (label, reader block size, reader depth,
/// writer, MiB per writer I/O).
const WRITERS: [(&str, &str, u32, &str, f64); 2] = [
    (
        "4k qd1 + seq 1m writer",
        "4k",
        1,
        "rw=write,bs=1m,qd=4",
        1.0,
    ),
    (
        "16k qd4 + rand 64k writer",
        "16k",
        4,
        "rw=randwrite,bs=64k,qd=2",
        1.0 / 16.0,
    ),
];
const BACKGROUNDS: [&str; 2] = ["scrub", "resilver"];

/// What one device does with each job alone: the references the loads
/// and the background shares are taken from.
struct Alone {
    reader: Run,
    writers: Vec<Run>,
    /// Per background kind, in `BACKGROUNDS`' order.
    background_mb: Vec<f64>,
}

fn alone_specs(name: &str, device: &str) -> anyhow::Result<Vec<Spec>> {
    let plain = pool(device, Mode::Adaptive, false)?;
    let cached = pool(device, Mode::Adaptive, true)?;
    let mut specs = vec![(
        format!("matrix-{name}-reader-alone"),
        plain.clone(),
        vec!["name=reader,rw=randread,bs=4k,qd=1".to_string()],
    )];
    for (_, _, _, writer, _) in WRITERS {
        specs.push((
            format!(
                "matrix-{name}-writer-alone-{}",
                writer.replace([',', '='], "-")
            ),
            cached.clone(),
            vec![format!("name=writer,{writer}")],
        ));
    }
    for background in BACKGROUNDS {
        specs.push((
            format!("matrix-{name}-{background}-alone"),
            plain.clone(),
            vec![background_job(background)],
        ));
    }
    Ok(specs)
}

fn modes(background: &str) -> &'static [Mode] {
    if background == "scrub" {
        &MODES
    } else {
        &[Mode::Zfs, Mode::Adaptive]
    }
}

/// Run the matrix: every load beside a scrub under every mode, and beside
/// a resilver under zfs and adaptive, on each device model. The runs
/// alone go first, all at once, then every cell's runs.
pub fn run(seconds: f64, seed: u64) -> anyhow::Result<Matrix> {
    let runner = Runner { seconds, seed };
    let mut specs = Vec::new();
    for (name, device) in DEVICES {
        specs.extend(alone_specs(name, device)?);
    }
    let per_device = specs.len() / DEVICES.len();
    let mut runs = runner.run_all(specs)?.into_iter();
    let mut alone = Vec::new();
    for _ in DEVICES {
        let mut device: Vec<Run> = runs.by_ref().take(per_device).collect();
        let background_mb = device
            .split_off(1 + WRITERS.len())
            .iter()
            .map(|run| stream(run, "background").mb_per_s)
            .collect();
        let reader = device.remove(0);
        alone.push(Alone {
            reader,
            writers: device,
            background_mb,
        });
    }
    // Every cell: (device, load, background), with its specs, one per mode.
    let mut layout = Vec::new();
    let mut specs = Vec::new();
    for ((name, device), alone) in DEVICES.iter().zip(&alone) {
        let loads = loads(alone);
        for (b, background) in BACKGROUNDS.iter().enumerate() {
            for load in &loads {
                for mode in modes(background) {
                    let mut texts = load.jobs.clone();
                    texts.push(background_job(background));
                    let label = format!(
                        "matrix-{name}-{background}-{}-{}",
                        load.label.replace(' ', "-"),
                        mode.name()
                    );
                    specs.push((label, pool(device, *mode, load.cached)?, texts));
                }
                layout.push((
                    *name,
                    load.label.clone(),
                    *background,
                    alone.background_mb[b],
                    load.writer_pace_mb,
                    load.cached,
                ));
            }
        }
    }
    let mut runs = runner.run_all(specs)?.into_iter();
    let mut cells = Vec::new();
    for (device, load, background, idle_background_mb, writer_pace_mb, cached) in layout {
        let mut by_mode = Vec::new();
        for mode in modes(background) {
            let run = runs.next().expect("one run per mode of every cell");
            let reader = stream(&run, "reader");
            let writer = cached.then(|| stream(&run, "writer"));
            by_mode.push((
                *mode,
                Figures {
                    iops: reader.iops,
                    p99_us: reader.latency_us.p99,
                    background_mb: stream(&run, "background").mb_per_s,
                    writer_mb: writer.map(|w| w.mb_per_s),
                    writer_p99_us: writer.map(|w| w.latency_us.p99),
                },
            ));
        }
        cells.push(Cell {
            device,
            load,
            background,
            idle_background_mb,
            writer_pace_mb,
            by_mode,
        });
    }
    Ok(Matrix {
        table: table(&cells),
        checks: checks(&cells),
        plot: scatter(&cells),
    })
}

fn table(cells: &[Cell]) -> String {
    let mut out = summary(cells);
    out.push('\n');
    out.push_str(
        "| device | load | background | zfs: IOPS, p99, background / idle | adaptive: IOPS, p99, background / idle | IOPS / zfs | p99 / zfs | writer MB/s (pace): zfs, adaptive | writer p99: zfs, adaptive | met |\n|---|---|---|---|---|---:|---:|---|---|---|\n",
    );
    for c in cells {
        let (z, a) = (c.figures(Mode::Zfs), c.figures(Mode::Adaptive));
        let writer = match (c.writer_pace_mb, z.writer_mb, a.writer_mb) {
            (Some(pace), Some(zw), Some(aw)) => format!("{zw:.0}, {aw:.0} ({pace:.0})"),
            _ => "-".into(),
        };
        let writer_p99 = match (z.writer_p99_us, a.writer_p99_us) {
            (Some(zp), Some(ap)) => format!("{}, {}", micros(zp), micros(ap)),
            _ => "-".into(),
        };
        let met = if !c.met() {
            "NO"
        } else if c.p99_vs_zfs() > P99_VS_ZFS_MAX {
            "yes (zfs held the writer back)"
        } else {
            "yes"
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0}, {}, {:.2} | {:.0}, {}, {:.2} | {:.2} | {:.2} | {} | {} | {} |",
            c.device,
            c.load,
            c.background,
            z.iops,
            micros(z.p99_us),
            c.background_share(Mode::Zfs),
            a.iops,
            micros(a.p99_us),
            c.background_share(Mode::Adaptive),
            c.iops_vs_zfs(),
            c.p99_vs_zfs(),
            writer,
            writer_p99,
            met
        );
    }
    out
}

fn micros(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.1} s", us / 1e6)
    } else if us >= 1000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.0} us")
    }
}

/// What the matrix checks: the scrub's floor in every cell. How adaptive's
/// reader compares with zfs's, and the resilver cells, are counted in the
/// table's summary (`summary`), not checked: docs/scheduler.md (Known
/// limits) says where adaptive falls short of them.
fn checks(cells: &[Cell]) -> Vec<Check> {
    let scrubs: Vec<&Cell> = cells.iter().filter(|c| c.background == "scrub").collect();
    let met = scrubs
        .iter()
        .filter(|c| c.background_share(Mode::Adaptive) >= c.share_min())
        .count();
    vec![Check {
        what: "7. matrix: adaptive scrub >= 10% of its idle rate".into(),
        expected: format!("{} of {}", scrubs.len(), scrubs.len()),
        measured: format!("{met} of {}", scrubs.len()),
        ok: met == scrubs.len(),
        beyond_reach: None,
    }]
}

/// Cells that meet each figure, by background.
fn summary(cells: &[Cell]) -> String {
    let mut out = String::new();
    for background in ["scrub", "resilver"] {
        let of: Vec<&Cell> = cells
            .iter()
            .filter(|c| c.background == background)
            .collect();
        let count = |pass: &dyn Fn(&Cell) -> bool| of.iter().filter(|c| pass(c)).count();
        let _ = writeln!(
            out,
            "- {background}, {} cells: adaptive {background} >= {:.0}% of its idle rate in {}; reader IOPS >= {IOPS_VS_ZFS_MIN}x zfs's in {}; reader p99 <= {P99_VS_ZFS_MAX}x zfs's (or zfs held the writer back) in {}; all three in {}.",
            of.len(),
            of.first().map_or(0.0, |c| c.share_min() * 100.0),
            count(&|c| c.background_share(Mode::Adaptive) >= c.share_min()),
            count(&|c| c.iops_vs_zfs() >= IOPS_VS_ZFS_MIN),
            count(&|c| c.p99_vs_zfs() <= P99_VS_ZFS_MAX || c.zfs_stalled_writer()),
            count(&|c| c.met()),
        );
    }
    out
}

/// Reader p99 against the scrub's share of its idle rate, one point per
/// cell and mode.
fn scatter(cells: &[Cell]) -> Canvas {
    let series: Vec<(String, Vec<(f64, f64)>)> = MODES
        .iter()
        .map(|mode| {
            let points = cells
                .iter()
                .filter(|c| c.background == "scrub")
                .map(|c| (c.background_share(*mode), c.figures(*mode).p99_us))
                .collect();
            (mode.name().to_string(), points)
        })
        .collect();
    plot::scatter_plot(
        "Scheduler matrix: reader p99 against scrub rate, every load and device",
        YScale::LatencyUs,
        &series,
        "scrub rate / its idle rate",
    )
}
