//! What a bench reads from a served pool while a run goes on, through its
//! admin endpoint: each member's share of the client reads (`/metrics`),
//! and the bytes its scrub reads.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::admin::client::AdminClient;
use crate::bench::report::ReadTimeline;
use crate::device::model::NANOS_PER_MS;
use crate::pool::scrub::{Checkpoint, ScrubState};
use crate::sim::READ_TIMELINE_BUCKET_NS;

/// How often the scrub's progress is read while a run goes on.
const SCRUB_POLL: Duration = Duration::from_millis(200);

/// Each member's share of the pool's client reads, step by step: the
/// member read counters on `/metrics`, read every `READ_TIMELINE_BUCKET_NS`.
pub struct ShareSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<ReadTimeline>>,
}

/// `weir_member_reads_total` of each member of the pool's first group, in
/// member order.
fn member_reads(metrics: &str) -> Vec<u64> {
    let prefix = "weir_member_reads_total{pool=\"bench\",group=\"0\",member=\"";
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

/// Each member's client reads so far, from the server's `/metrics`.
pub fn pool_reads(data_dir: &Path) -> anyhow::Result<Vec<u64>> {
    let client = AdminClient::for_data_dir(data_dir)?;
    Ok(member_reads(&client.call("GET", "/metrics", &[])?))
}

impl ShareSampler {
    pub fn start(data_dir: &Path) -> anyhow::Result<ShareSampler> {
        let client = AdminClient::for_data_dir(data_dir)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let step = Duration::from_nanos(READ_TIMELINE_BUCKET_NS);
        let thread = std::thread::spawn(move || -> anyhow::Result<ReadTimeline> {
            let mut last = member_reads(&client.call("GET", "/metrics", &[])?);
            let mut shares = Vec::new();
            let mut next = Instant::now() + step;
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                next += step;
                let now = member_reads(&client.call("GET", "/metrics", &[])?);
                let delta: Vec<u64> = now.iter().zip(&last).map(|(n, l)| n - l).collect();
                let total: u64 = delta.iter().sum();
                shares.push(
                    delta
                        .iter()
                        .map(|d| *d as f64 / total.max(1) as f64)
                        .collect(),
                );
                last = now;
            }
            Ok(ReadTimeline {
                step_ms: READ_TIMELINE_BUCKET_NS / NANOS_PER_MS,
                shares,
            })
        });
        Ok(ShareSampler { stop, thread })
    }

    pub fn finish(self) -> anyhow::Result<ReadTimeline> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the share sampler panicked"))?
    }
}

/// The pool's scrub, kept running for a run (started again whenever it
/// finishes) and measured by the bytes its progress reports.
pub struct ScrubMeter {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<u64>>,
}

fn scrub_call(
    client: &AdminClient,
    pool: &str,
    path: &str,
    method: &str,
) -> anyhow::Result<Checkpoint> {
    let body = client.call(method, path, &[("pool", pool)])?;
    let checkpoint: Option<Checkpoint> =
        serde_json::from_str(&body).context("malformed scrub progress from the server")?;
    checkpoint.context("the server reports no scrub")
}

impl ScrubMeter {
    /// Start the scrub of `pool`; count from now.
    pub fn start(data_dir: &Path, pool: &str) -> anyhow::Result<ScrubMeter> {
        let client = AdminClient::for_data_dir(data_dir)?;
        let mut last = scrub_call(&client, pool, "/v1/scrub/start", "POST")?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let pool = pool.to_string();
        let thread = std::thread::spawn(move || -> anyhow::Result<u64> {
            let mut bytes = 0u64;
            let mut base = last.bytes_read;
            loop {
                let stopping = flag.load(Ordering::Relaxed);
                let now = scrub_call(&client, &pool, "/v1/scrub", "GET")?;
                bytes += now.bytes_read.saturating_sub(base);
                base = now.bytes_read;
                if stopping {
                    scrub_call(&client, &pool, "/v1/scrub/stop", "POST").ok();
                    return Ok(bytes);
                }
                if now.state == ScrubState::Finished {
                    last = scrub_call(&client, &pool, "/v1/scrub/start", "POST")?;
                    base = last.bytes_read;
                }
                std::thread::sleep(SCRUB_POLL);
            }
        });
        Ok(ScrubMeter { stop, thread })
    }

    /// Stop the scrub: the bytes it read (every copy) since the start.
    pub fn finish(self) -> anyhow::Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the scrub meter panicked"))?
    }
}
