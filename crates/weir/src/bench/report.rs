//! Bench reports: the stable JSON shape (documented in `docs/bench.md`)
//! and the tables and log2 histograms printed for people.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::sim::StreamResult;
use crate::stats::{LatencyStats, LatencySummary};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub scenario: String,
    /// "sim" or "real".
    pub mode: String,
    pub seconds: f64,
    pub seed: u64,
    pub runs: Vec<Run>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Run {
    pub label: String,
    pub config: RunConfig,
    pub streams: Vec<Stream>,
    /// For a mirror: each device's share of the client reads, by
    /// "INDEX:SPEC".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_read_share: Option<std::collections::BTreeMap<String, f64>>,
    /// For a mirror read by a policy: each stream's share of its reads per
    /// device, in device order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_read_share: Option<std::collections::BTreeMap<String, Vec<f64>>>,
    /// For a mirror read by a policy: the device shares over time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_read_timeline: Option<ReadTimeline>,
    /// With a simulated write-back cache: what its writeback did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writeback: Option<WritebackSummary>,
    /// With simulated readahead: what it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readahead: Option<ReadaheadSummary>,
}

/// Simulated readahead over one run.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ReadaheadSummary {
    /// Bytes read from the devices: client reads that missed, and read-ahead.
    pub device_read_bytes: u64,
    /// Client reads answered from read-ahead data, and those that were not.
    pub hits: u64,
    pub misses: u64,
    pub read_ahead_bytes: u64,
    /// Read ahead and dropped unread.
    pub wasted_bytes: u64,
}

/// A simulated write-back cache over one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WritebackSummary {
    /// "adaptive", "none" or "wbt".
    pub throttle: String,
    /// Bytes written back to the devices per second of the run (one copy).
    pub written_back_mb_per_s: f64,
    pub dirty_at_end_bytes: u64,
    pub dirty_limit_at_end_bytes: u64,
    /// Client writes that went through, too large for the budget.
    pub direct_writes: u64,
    /// Client writes that waited for room in the budget.
    #[serde(default)]
    pub waited_writes: u64,
}

/// Each device's share of the client reads, step by step through a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReadTimeline {
    pub step_ms: u64,
    /// One row per step, one share per device (in device order); a step
    /// with no reads is all zero.
    pub shares: Vec<Vec<f64>>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunConfig {
    /// The device spec (sim) or the NBD URI (real).
    pub target: String,
    pub jobs: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stream {
    pub name: String,
    pub ops: u64,
    pub errors: u64,
    pub iops: f64,
    pub mb_per_s: f64,
    pub latency_us: LatencySummary,
    /// Counts per bucket; bucket i holds latencies in [2^i, 2^(i+1)) us.
    pub histogram_log2_us: Vec<u64>,
    /// Simulated runs: p99 latency (us) per step of `timeline_step_ms`,
    /// by completion time; 0 for a step with none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub p99_over_time_us: Vec<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline_step_ms: Option<u64>,
}

impl Stream {
    pub fn from_result(result: &StreamResult) -> Stream {
        let seconds = result.active_ns as f64 / 1e9;
        let per_sec = |x: f64| if seconds > 0.0 { x / seconds } else { 0.0 };
        Stream {
            name: result.job.name.clone(),
            ops: result.ops,
            errors: result.errors,
            iops: per_sec(result.ops as f64),
            mb_per_s: per_sec(result.bytes as f64) / 1e6,
            latency_us: result.latency.summary_us(),
            histogram_log2_us: trimmed_log2(&result.latency),
            p99_over_time_us: result
                .latency_over_time
                .iter()
                .map(|step| {
                    if step.count() == 0 {
                        0.0
                    } else {
                        step.quantile_ns(0.99) as f64 / 1000.0
                    }
                })
                .collect(),
            timeline_step_ms: (!result.latency_over_time.is_empty())
                .then_some(crate::sim::LATENCY_TIMELINE_STEP_NS / 1_000_000),
        }
    }
}

/// The log2 buckets without the empty tail.
fn trimmed_log2(stats: &LatencyStats) -> Vec<u64> {
    let mut buckets = stats.log2_us();
    while buckets.len() > 1 && buckets.last() == Some(&0) {
        buckets.pop();
    }
    buckets
}

fn fmt_us(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.0} ms", us / 1000.0)
    } else if us >= 1000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.0} us")
    }
}

/// One table per run, then each stream's histogram.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "scenario {} ({}, {} s, seed {})",
        report.scenario, report.mode, report.seconds, report.seed
    );
    for run in &report.runs {
        let _ = writeln!(out, "\n== {}: {}", run.label, run.config.target);
        let _ = writeln!(
            out,
            "{:<12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
            "stream", "IOPS", "MB/s", "mean", "p50", "p90", "p99", "p99.9", "max", "ops", "errors"
        );
        for s in &run.streams {
            let l = &s.latency_us;
            let _ = writeln!(
                out,
                "{:<12} {:>9.1} {:>9.1} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
                s.name,
                s.iops,
                s.mb_per_s,
                fmt_us(l.mean),
                fmt_us(l.p50),
                fmt_us(l.p90),
                fmt_us(l.p99),
                fmt_us(l.p99_9),
                fmt_us(l.max),
                s.ops,
                s.errors
            );
        }
        if let Some(shares) = &run.device_read_share {
            let shares: Vec<String> = shares
                .iter()
                .map(|(device, share)| format!("{device} {:.1}%", share * 100.0))
                .collect();
            let _ = writeln!(out, "device read share: {}", shares.join(", "));
        }
        if let Some(w) = &run.writeback {
            let _ = writeln!(
                out,
                "writeback ({}): {:.1} MB/s to the devices, {} dirty at the end (limit {}), \
                 {} writes waited for room, {} too large for the limit went through",
                w.throttle,
                w.written_back_mb_per_s,
                crate::units::format_bytes(w.dirty_at_end_bytes),
                crate::units::format_bytes(w.dirty_limit_at_end_bytes),
                w.waited_writes,
                w.direct_writes
            );
        }
        for s in &run.streams {
            let counts: Vec<String> = s.histogram_log2_us.iter().map(u64::to_string).collect();
            let _ = writeln!(
                out,
                "{} latency, log2 histogram in us (bucket i = [2^i, 2^(i+1)) us, from 1 us):\n  {}",
                s.name,
                counts.join(", ")
            );
        }
    }
    out
}
