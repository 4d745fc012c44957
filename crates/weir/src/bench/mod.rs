//! `weir bench`: workloads against a simulated device (virtual time) or a
//! real NBD server (real time), with the same generators and reports.
//!
//! ```text
//!   weir bench run --job ... ─┐
//!   weir bench SCENARIO ──────┼─> Target::Sim(model spec) ──> sim::Simulation
//!                             ├─> Target::Nbd(uri) ─────────> real::run (NBD client threads)
//!                             └─> Target::ServedPool ───────> served::run_pool (NBD + the
//!                                                             pool's scrub via admin)
//!                                        │
//!                                  report: table, log2 histograms, JSON
//! ```

pub mod canvas;
pub mod mirror_reads;
pub mod nbd_client;
pub mod overhead;
pub mod plot;
pub mod readahead;
pub mod real;
pub mod report;
pub mod scenarios;
pub mod scheduler_matrix;
pub mod served;
pub mod streams;
pub mod writeback;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::device::model::{ModelSpec, NANOS_PER_MS, NANOS_PER_SEC};
use crate::pool::mirror::select::ReadPolicy;
use crate::sched::Mode;
use crate::sim::{Simulation, StreamResult, WbThrottle, READ_TIMELINE_BUCKET_NS};
use crate::workload::JobSpec;
use report::{ReadTimeline, ReadaheadSummary, Report, Run, RunConfig, Stream, WritebackSummary};

/// The read-ahead memory of a simulated server: a server's default (1/64
/// of RAM) on 16 GiB, fixed so that a run does not depend on the machine
/// that simulates it.
pub const SIM_READAHEAD_MEMORY_BYTES: u64 = 256 << 20;

/// Where a workload runs.
#[derive(Clone, Debug)]
pub enum Target {
    Sim(Box<ModelSpec>),
    /// A mirror of simulated devices (one device: just it), each behind a
    /// queue in `mode`.
    SimPool {
        devices: Vec<ModelSpec>,
        mode: Mode,
        /// How a mirror picks the copy for a read.
        read_policy: ReadPolicy,
        /// Writes go through a write-back cache whose writeback this
        /// throttles (the queues then run in its mode); None: written through.
        cache: Option<WbThrottle>,
        /// Client I/O goes through the server's readahead.
        readahead: bool,
    },
    /// An NBD URI; `device` says what is behind it, when we know.
    Nbd {
        uri: String,
        device: Option<String>,
    },
    /// A pool volume served by a `weir serve` of our own, whose device
    /// queues run in `mode`; its scrub is the pool's own.
    ServedPool {
        uri: String,
        data_dir: PathBuf,
        pool: String,
        mode: Mode,
        device: String,
    },
}

impl Target {
    pub fn describe(&self) -> String {
        match self {
            Target::Sim(spec) => spec.text.clone(),
            Target::SimPool {
                devices,
                mode,
                read_policy,
                cache,
                readahead,
            } => {
                let texts: Vec<&str> = devices.iter().map(|d| d.text.as_str()).collect();
                let reads = if devices.len() > 1 {
                    format!(", reads {}", read_policy.name())
                } else {
                    String::new()
                };
                let cache = match cache {
                    Some(throttle) => format!(", cache writeback, throttle {throttle}"),
                    None => String::new(),
                };
                let readahead = if *readahead { ", readahead on" } else { "" };
                let what = if devices.len() > 1 { "mirror " } else { "" };
                format!(
                    "{what}{} (sched {}{reads}{cache}{readahead})",
                    texts.join(" "),
                    mode.name()
                )
            }
            Target::Nbd {
                uri,
                device: Some(device),
            } => format!("{uri} ({device})"),
            Target::Nbd { uri, device: None } => uri.clone(),
            Target::ServedPool { device, mode, .. } => {
                format!("{device}, served (sched {})", mode.name())
            }
        }
    }

    pub fn mode(&self) -> &'static str {
        match self {
            Target::Sim(_) | Target::SimPool { .. } => "sim",
            Target::Nbd { .. } | Target::ServedPool { .. } => "real",
        }
    }
}

/// Run `jobs` on `target` for `seconds` and label the result.
pub fn run_jobs(
    label: &str,
    target: &Target,
    jobs: &[JobSpec],
    seconds: f64,
    seed: u64,
) -> anyhow::Result<Run> {
    let duration = (seconds * NANOS_PER_SEC as f64) as u64;
    let mut device_read_share = None;
    let mut device_read_timeline = None;
    let mut stream_read_share = None;
    let mut writeback = None;
    let mut read_ahead = None;
    let results: Vec<StreamResult> = match target {
        Target::Sim(spec) => Simulation::new(spec, jobs, duration, seed)
            .map_err(anyhow::Error::msg)?
            .run(),
        Target::SimPool {
            devices,
            mode,
            read_policy,
            cache,
            readahead,
        } => {
            let mut simulation = Simulation::new_pool(devices, *mode, jobs, duration, seed)
                .map_err(anyhow::Error::msg)?
                .with_read_policy(*read_policy);
            if let Some(throttle) = cache {
                simulation = simulation.with_cache(*throttle, None);
            }
            if *readahead {
                simulation = simulation
                    .with_readahead(SIM_READAHEAD_MEMORY_BYTES)
                    .map_err(anyhow::Error::msg)?;
            }
            let run = simulation.run_mirror();
            read_ahead = run.readahead.map(|r| ReadaheadSummary {
                device_read_bytes: r.device_read_bytes,
                hits: r.hits,
                misses: r.misses,
                read_ahead_bytes: r.read_ahead_bytes,
                wasted_bytes: r.wasted_bytes,
            });
            if let (Some(throttle), Some(done)) = (cache, &run.cache) {
                writeback = Some(WritebackSummary {
                    throttle: throttle.name().into(),
                    written_back_mb_per_s: done.written_back_bytes as f64 / seconds / 1e6,
                    dirty_at_end_bytes: done.dirty_at_end_bytes,
                    dirty_limit_at_end_bytes: done.limit_at_end_bytes,
                    direct_writes: done.direct_writes,
                    waited_writes: done.waited_writes,
                });
            }
            if devices.len() > 1 {
                device_read_share = Some(
                    devices
                        .iter()
                        .zip(run.read_shares)
                        .enumerate()
                        .map(|(i, (d, share))| (format!("{i}:{}", d.text), share))
                        .collect(),
                );
                stream_read_share = Some(
                    jobs.iter()
                        .zip(&run.job_read_shares)
                        .map(|(job, shares)| (job.name.clone(), shares.clone()))
                        .collect(),
                );
                device_read_timeline = Some(ReadTimeline {
                    step_ms: READ_TIMELINE_BUCKET_NS / NANOS_PER_MS,
                    shares: run.read_timeline,
                });
            }
            run.streams
        }
        Target::Nbd { uri, .. } => real::run(uri, jobs, duration, seed)?,
        Target::ServedPool {
            uri,
            data_dir,
            pool,
            mode,
            ..
        } => {
            let before = served::pool_reads(data_dir)?;
            let results = served::run_pool(uri, data_dir, pool, *mode, jobs, duration, seed)?;
            let after = served::pool_reads(data_dir)?;
            let delta: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
            let total: u64 = delta.iter().sum();
            if delta.len() > 1 && total > 0 {
                device_read_share = Some(
                    delta
                        .iter()
                        .enumerate()
                        .map(|(i, d)| (format!("{i}"), *d as f64 / total as f64))
                        .collect(),
                );
            }
            results
        }
    };
    Ok(Run {
        label: label.into(),
        config: RunConfig {
            target: target.describe(),
            jobs: jobs.iter().map(|j| j.text.clone()).collect(),
        },
        streams: results.iter().map(Stream::from_result).collect(),
        device_read_share,
        device_read_timeline,
        stream_read_share,
        writeback,
        readahead: read_ahead,
    })
}

pub fn parse_jobs(texts: &[String]) -> anyhow::Result<Vec<JobSpec>> {
    if texts.is_empty() {
        bail!("give at least one --job");
    }
    let jobs = texts
        .iter()
        .map(|t| JobSpec::parse(t).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
        bail!(
            "two jobs are named {:?}; give each a distinct name=",
            pair[0]
        );
    }
    Ok(jobs)
}

/// Print the report and write its JSON (to `json`, or into `out_dir`) and,
/// beside the JSON, a PNG of the latency histograms.
pub fn emit(report: &Report, json: Option<&Path>, out_dir: Option<&Path>) -> anyhow::Result<()> {
    print!("{}", report::render(report));
    let path: Option<PathBuf> = match (json, out_dir) {
        (Some(path), _) => Some(path.to_path_buf()),
        (None, Some(dir)) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            Some(dir.join(format!("{}-{}.json", report.scenario, report.mode)))
        }
        (None, None) => None,
    };
    if let Some(path) = path {
        let text = serde_json::to_string_pretty(report)?;
        std::fs::write(&path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        let png = path.with_extension("png");
        plot::write(report, &png).with_context(|| format!("cannot write {}", png.display()))?;
        println!("wrote {} and {}", path.display(), png.display());
    }
    Ok(())
}
