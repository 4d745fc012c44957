//! The `weir bench` command line.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use crate::bench::report::Report;
use crate::bench::scenarios::{self, checks_table, Outcome, SimTargets, Targets};
use crate::bench::scheduler_matrix;
use crate::bench::served::{PoolRoot, ServedTargets};
use crate::bench::{emit, parse_jobs, run_jobs, Target};
use crate::cache::CacheMode;
use crate::device::model::ModelSpec;
use crate::pool::mirror::select::ReadPolicy;
use crate::readahead::ReadaheadMode;
use crate::sched::Mode;
use crate::sim::WbThrottle;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Run jobs against a simulated device or pool (--sim --device/--pool) or an NBD server (--uri).
    Run(RunArgs),
    /// Each device model alone, measured against its expected figures.
    Calibrate(ScenarioArgs),
    /// A sequential scrub starves 4 KiB random reads on an HDD.
    ScrubVsRandread(ScenarioArgs),
    /// A 1 MiB writer beside a 4 KiB random reader, through the write-back cache under each throttle, on each model.
    WritebackVsRandread(ScenarioArgs),
    /// The device queue's modes (fifo, zfs, adaptive) with a scrub beside readers on mirrors: --sim, or --real (pools it serves).
    Scheduler(ScenarioArgs),
    /// Every mirror read policy on NVMe + SSD, equal NVMe, HDD and a copy that slows down (sim).
    MirrorReads(ScenarioArgs),
    /// Readahead off and on for readers on each device model (virtual time; real time: bench/readahead.sh).
    Readahead(ScenarioArgs),
    /// One and two QD1 64 KiB streams on an HDD through 1, 4 and 16 connections each, readahead off and on (virtual time).
    Streams(ScenarioArgs),
    /// CPU cost of the device queue: enqueue + next_to_issue + complete per I/O, per mode, on one core.
    QueueOverhead(OverheadArgs),
    /// Draw a saved JSON report's latency histograms again, as a PNG beside it.
    Plot(PlotArgs),
}

#[derive(Args)]
pub struct PlotArgs {
    /// A report written by --out or --json.
    report: PathBuf,
    /// Where the PNG goes (default: the report's path with .png).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
pub struct OverheadArgs {
    /// I/Os per mode.
    #[arg(long, default_value_t = 2_000_000)]
    ios: u64,
}

#[derive(Args)]
pub struct RunArgs {
    /// Virtual time on a device model (--device) or a pool of them (--pool).
    #[arg(long, conflicts_with = "uri")]
    sim: bool,
    /// The device for --sim: model:KIND,size=SIZE[,param=value...].
    #[arg(long, requires = "sim", conflicts_with = "pool")]
    device: Option<String>,
    /// For --sim, a pool: 'mirror model:... model:...' (the `weir pool create` layout).
    #[arg(long, requires = "sim")]
    pool: Option<String>,
    /// For --sim: the device queues' mode [default: adaptive with --pool, fifo with --device].
    #[arg(long, requires = "sim", value_parser = super::one_of(&Mode::ALL, Mode::name))]
    sched: Option<Mode>,
    /// For --sim --pool: how the mirror picks the copy for a read, as a served pool does.
    #[arg(long, requires = "pool", default_value_t = ReadPolicy::default(),
          value_parser = super::one_of(&ReadPolicy::ALL, ReadPolicy::name))]
    read_policy: ReadPolicy,
    /// For --sim: writes go through the server's write-back cache, or straight to the devices.
    #[arg(long, requires = "sim", default_value = "writethrough")]
    cache: CacheMode,
    /// For --sim --cache writeback: what holds writeback back from readers: weir's
    /// adaptive queues, nothing (fifo queues), or Linux wbt's fixed targets (fifo queues).
    #[arg(long, requires = "sim", value_parser = super::one_of(&WbThrottle::ALL, WbThrottle::name))]
    wb_throttle: Option<WbThrottle>,
    /// For --sim: client reads and writes go through the server's readahead.
    #[arg(long, requires = "sim", default_value = "off")]
    readahead: ReadaheadMode,
    /// Add a scrub that runs for the whole run (stream `scrub`: 1 MiB reads of every copy).
    #[arg(long)]
    scrub: bool,
    /// Real time through NBD: nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH.
    #[arg(long)]
    uri: Option<String>,
    /// A workload: name=N,rw=randread,bs=4k,qd=1[,rate=N/s,think=T,mix=F,offset=B,size=B,start=S,stop=S,class=C,conns=N].
    #[arg(long = "job", required_unless_present = "scrub")]
    jobs: Vec<String>,
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
pub struct ScenarioArgs {
    /// Virtual time (the default).
    #[arg(long, conflicts_with_all = ["real", "uri"])]
    sim: bool,
    /// Real time: start `weir serve` on each model device and drive it through NBD.
    #[arg(long, conflicts_with = "uri")]
    real: bool,
    /// Real time against a server you started, serving the scenario's device.
    #[arg(long)]
    uri: Option<String>,
    /// Seconds per run.
    #[arg(long)]
    seconds: Option<f64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for the JSON report.
    #[arg(long)]
    out: Option<PathBuf>,
    /// For --real: where the served pools keep their member files [default:
    /// /dev/shm when it and memory have room for two pools (9 GiB), else the
    /// temporary directory].
    #[arg(long, requires = "real")]
    pool_dir: Option<PathBuf>,
}

pub fn main(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Run(args) => run(args),
        BenchCommand::Calibrate(args) => scenario(args, 10.0, scenarios::calibrate),
        BenchCommand::ScrubVsRandread(args) => scenario(args, 20.0, scenarios::scrub_vs_randread),
        BenchCommand::Scheduler(args) => scenario(args, 60.0, scheduler_matrix::scheduler),
        BenchCommand::MirrorReads(args) => {
            scenario(args, 10.0, crate::bench::mirror_reads::mirror_reads)
        }
        BenchCommand::Readahead(args) => scenario(args, 5.0, crate::bench::readahead::readahead),
        BenchCommand::Streams(args) => scenario(args, 10.0, crate::bench::streams::streams),
        BenchCommand::QueueOverhead(args) => {
            print!("{}", crate::bench::overhead::run(args.ios)?);
            let rerun: Vec<String> = std::env::args().collect();
            println!("rerun: {}", rerun.join(" "));
            Ok(())
        }
        BenchCommand::WritebackVsRandread(args) => {
            scenario(args, 30.0, crate::bench::writeback::writeback_vs_randread)
        }
        BenchCommand::Plot(args) => plot(args),
    }
}

fn plot(args: PlotArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.report)
        .with_context(|| format!("cannot read {}", args.report.display()))?;
    let report: Report = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a weir bench report", args.report.display()))?;
    let png = args
        .out
        .unwrap_or_else(|| args.report.with_extension("png"));
    crate::bench::plot::write(&report, &png)
        .with_context(|| format!("cannot write {}", png.display()))?;
    println!("wrote {}", png.display());
    Ok(())
}

/// The cache a --sim run puts in front of its devices, and the queue mode
/// that goes with it.
fn sim_cache(args: &RunArgs, default_mode: Mode) -> anyhow::Result<(Option<WbThrottle>, Mode)> {
    match (args.cache, args.wb_throttle) {
        (CacheMode::Writethrough, Some(_)) => {
            bail!("--wb-throttle controls write-back: give --cache writeback with it")
        }
        (CacheMode::Writethrough, None) => Ok((None, args.sched.unwrap_or(default_mode))),
        (CacheMode::Writeback, throttle) => {
            let throttle = throttle.unwrap_or_default();
            let mode = throttle.queue_mode();
            // With no throttle, writeback meets whatever queue the devices
            // run, zfs's included.
            if throttle == WbThrottle::None && args.sched == Some(Mode::Zfs) {
                return Ok((Some(throttle), Mode::Zfs));
            }
            if args.sched.is_some_and(|sched| sched != mode) {
                bail!(
                    "--wb-throttle {throttle} runs the device queues in {} mode; leave out --sched",
                    mode.name()
                );
            }
            Ok((Some(throttle), mode))
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let mut texts = args.jobs.clone();
    check_seconds(args.seconds)?;
    let target = match (args.sim, args.device.clone(), args.uri.clone()) {
        (true, None, None) if args.pool.is_some() => {
            let words: Vec<String> = args
                .pool
                .as_deref()
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from)
                .collect();
            let groups = crate::pool::layout::parse_layout(&words)?;
            let [group] = &groups[..] else {
                bail!("--pool takes one mirror group: 'mirror model:... model:...'");
            };
            let devices = group
                .iter()
                .map(|text| {
                    let text = text
                        .strip_prefix("model:")
                        .context("--pool devices are models: model:KIND,size=SIZE,...")?;
                    ModelSpec::parse(text).map_err(anyhow::Error::msg)
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            if args.scrub {
                texts.push(scenarios::scrub_job(devices.len()));
            }
            let (cache, mode) = sim_cache(&args, Mode::default())?;
            Target::SimPool {
                devices,
                mode,
                read_policy: args.read_policy,
                cache,
                readahead: args.readahead == ReadaheadMode::On,
            }
        }
        (true, Some(device), None)
            if args.sched.is_some()
                || args.scrub
                || args.cache == CacheMode::Writeback
                || args.readahead == ReadaheadMode::On =>
        {
            let text = device
                .strip_prefix("model:")
                .context("--sim runs device models: --device model:KIND,size=SIZE,...")?;
            if args.scrub {
                texts.push(scenarios::scrub_job(1));
            }
            let (cache, mode) = sim_cache(&args, Mode::Fifo)?;
            Target::SimPool {
                devices: vec![ModelSpec::parse(text).map_err(anyhow::Error::msg)?],
                mode,
                read_policy: ReadPolicy::default(),
                cache,
                readahead: args.readahead == ReadaheadMode::On,
            }
        }
        (true, Some(_), None) if args.wb_throttle.is_some() => {
            bail!("--wb-throttle controls write-back: give --cache writeback with it")
        }
        (true, Some(device), None) => {
            let text = device
                .strip_prefix("model:")
                .context("--sim runs device models: --device model:KIND,size=SIZE,...")?;
            Target::Sim(Box::new(
                ModelSpec::parse(text).map_err(anyhow::Error::msg)?,
            ))
        }
        (true, None, _) => {
            bail!("--sim needs --device model:KIND,size=SIZE or --pool 'mirror ...'")
        }
        (false, _, Some(uri)) if !args.scrub => Target::Nbd { uri, device: None },
        (false, _, Some(_)) => {
            bail!("--scrub is for --sim; start a scrub on the server with weir scrub start")
        }
        _ => bail!("give --sim --device SPEC, or --uri URI"),
    };
    let jobs = parse_jobs(&texts)?;
    let run = run_jobs("run", &target, &jobs, args.seconds, args.seed)?;
    let report = Report {
        scenario: "run".into(),
        mode: target.mode().into(),
        seconds: args.seconds,
        seed: args.seed,
        runs: vec![run],
    };
    emit(&report, args.json.as_deref(), None)
}

fn check_seconds(seconds: f64) -> anyhow::Result<()> {
    if !(seconds > 0.0 && seconds <= 3600.0) {
        bail!("--seconds must be in (0, 3600]");
    }
    Ok(())
}

type Scenario = fn(&mut dyn Targets, f64, u64) -> anyhow::Result<Outcome>;

fn scenario(args: ScenarioArgs, default_seconds: f64, scenario: Scenario) -> anyhow::Result<()> {
    let seconds = args.seconds.unwrap_or(default_seconds);
    check_seconds(seconds)?;
    let outcome = match (&args.uri, args.real) {
        (Some(uri), _) => scenario(&mut UriTargets(uri.clone()), seconds, args.seed)?,
        (None, true) => {
            let root = PoolRoot::choose(args.pool_dir.clone());
            scenario(&mut ServedTargets::new(&root)?, seconds, args.seed)?
        }
        (None, false) => scenario(&mut SimTargets, seconds, args.seed)?,
    };
    emit(&outcome.report, None, args.out.as_deref())?;
    if let Some(dir) = &args.out {
        for (name, canvas) in &outcome.plots {
            let report = &outcome.report;
            let path = dir.join(format!("{}-{}-{name}.png", report.scenario, report.mode));
            std::fs::write(&path, canvas.encode())
                .with_context(|| format!("cannot write {}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    if !outcome.notes.is_empty() {
        print!("\n{}", outcome.notes);
    }
    println!("\n{}", checks_table(&outcome.checks));
    let rerun: Vec<String> = std::env::args().collect();
    println!("rerun: {}", rerun.join(" "));
    let beyond = outcome
        .checks
        .iter()
        .filter(|c| c.beyond_reach.is_some() && !c.ok)
        .count();
    if beyond > 0 {
        println!(
            "{beyond} checks are beyond the reach of any policy on these devices (not failures)"
        );
    }
    let failed = outcome.checks.iter().filter(|c| c.failed()).count();
    if failed > 0 {
        bail!(
            "{failed} of {} checks missed their expected range",
            outcome.checks.len()
        );
    }
    Ok(())
}

/// Every device of a scenario is the server at one URI.
struct UriTargets(String);

impl Targets for UriTargets {
    fn target(&mut self, device: &str) -> anyhow::Result<Target> {
        Ok(Target::Nbd {
            uri: self.0.clone(),
            device: Some(format!("assumed {device}")),
        })
    }
}
