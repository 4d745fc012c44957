//! `weir iostat [-w] [INTERVAL]`: the running server's device queues, per
//! pool member and I/O class, every INTERVAL seconds; with `-w`, a log2
//! latency histogram per pool and class, in the spirit of `zpool iostat -w`.
//! Each report shows what happened during the interval.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::Deserialize;

use super::client::AdminClient;
use crate::sched::{IoClass, LATENCY_BUCKETS};
use crate::stats::bucket_label;

#[derive(Args)]
pub struct IostatArgs {
    /// Show latency histograms per pool and class.
    #[arg(short = 'w')]
    histograms: bool,
    /// Seconds between reports.
    #[arg(default_value_t = 1.0)]
    interval: f64,
    /// Stop after this many reports.
    #[arg(long)]
    count: Option<u64>,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Clone, Debug, Deserialize)]
struct Row {
    pool: String,
    device: String,
    class: String,
    ops: u64,
    bytes: u64,
    in_flight: u64,
    errors: u64,
    latency_log2_us: Vec<u64>,
    /// In adaptive mode, the class's floor: its share of device time.
    #[serde(default)]
    floor_share: Option<f64>,
}

type Key = (String, String, String);

fn key(row: &Row) -> Key {
    (row.pool.clone(), row.device.clone(), row.class.clone())
}

pub fn main(args: IostatArgs) -> anyhow::Result<()> {
    if !(args.interval > 0.0 && args.interval <= 3600.0) {
        anyhow::bail!("the interval must be in (0, 3600] seconds");
    }
    let client = AdminClient::for_data_dir(&args.data_dir)
        .context("weir iostat reads a running server's queues")?;
    let fetch = || -> anyhow::Result<Vec<Row>> {
        let body = client.call("GET", "/v1/iostat", &[])?;
        serde_json::from_str(&body).context("malformed iostat from the server")
    };
    let mut before: BTreeMap<Key, Row> = fetch()?.into_iter().map(|r| (key(&r), r)).collect();
    let mut reports = 0;
    loop {
        std::thread::sleep(Duration::from_secs_f64(args.interval));
        let now = fetch()?;
        print!("{}", render(&before, &now, args.interval, args.histograms));
        before = now.into_iter().map(|r| (key(&r), r)).collect();
        reports += 1;
        if args.count.is_some_and(|c| reports >= c) {
            return Ok(());
        }
    }
}

const FLOORS_LEGEND: &str = "FLOOR: the share of the device's time the class is guaranteed beside client I/O (adaptive mode); async-write, then resilver, then scrub when several are owed.\n";

/// One report: the difference between two snapshots over `seconds`.
fn render(before: &BTreeMap<Key, Row>, now: &[Row], seconds: f64, histograms: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<12} {:<40} {:<12} {:>10} {:>10} {:>8} {:>7} {:>6}",
        "POOL", "DEVICE", "CLASS", "OPS/S", "MB/S", "ACTIVE", "ERRORS", "FLOOR"
    );
    // Per (pool, class): latency buckets over the interval.
    let mut latency: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    let mut floors_shown = false;
    for row in now {
        let old = before.get(&key(row));
        let delta = |new: u64, old: Option<u64>| new.saturating_sub(old.unwrap_or(0));
        let ops = delta(row.ops, old.map(|o| o.ops));
        if ops == 0 && row.in_flight == 0 {
            continue;
        }
        let bytes = delta(row.bytes, old.map(|o| o.bytes));
        let errors = delta(row.errors, old.map(|o| o.errors));
        floors_shown |= row.floor_share.is_some();
        let floor = row
            .floor_share
            .map_or("-".to_string(), |share| format!("{:.0}%", share * 100.0));
        let _ = writeln!(
            out,
            "{:<12} {:<40} {:<12} {:>10.1} {:>10.1} {:>8} {:>7} {:>6}",
            row.pool,
            row.device,
            row.class,
            ops as f64 / seconds,
            bytes as f64 / seconds / 1e6,
            row.in_flight,
            errors,
            floor
        );
        let buckets = latency
            .entry((row.pool.clone(), row.class.clone()))
            .or_insert_with(|| vec![0; LATENCY_BUCKETS]);
        for (i, count) in row.latency_log2_us.iter().enumerate().take(LATENCY_BUCKETS) {
            let old = old.and_then(|o| o.latency_log2_us.get(i).copied());
            buckets[i] += delta(*count, old);
        }
    }
    if floors_shown {
        out.push_str(FLOORS_LEGEND);
    }
    if histograms {
        out.push_str(&render_histograms(&latency));
    }
    out.push('\n');
    out
}

/// Rows of latency buckets, a column per class, one table per pool.
fn render_histograms(latency: &BTreeMap<(String, String), Vec<u64>>) -> String {
    let mut out = String::new();
    let pools: Vec<&String> = {
        let mut p: Vec<&String> = latency.keys().map(|(pool, _)| pool).collect();
        p.dedup();
        p
    };
    for pool in pools {
        let classes: Vec<&str> = IoClass::ALL
            .iter()
            .map(|c| c.name())
            .filter(|c| latency.contains_key(&(pool.clone(), (*c).to_string())))
            .collect();
        let columns: Vec<&Vec<u64>> = classes
            .iter()
            .map(|c| &latency[&(pool.clone(), (*c).to_string())])
            .collect();
        let used: Vec<usize> = (0..LATENCY_BUCKETS)
            .filter(|&i| columns.iter().any(|c| c[i] > 0))
            .collect();
        let (Some(&first), Some(&last)) = (used.first(), used.last()) else {
            continue;
        };
        let _ = writeln!(
            out,
            "\n{pool}: latency (submission to completion), I/Os per bucket"
        );
        let _ = write!(out, "{:>10}", "LATENCY");
        for class in &classes {
            let _ = write!(out, " {class:>11}");
        }
        out.push('\n');
        for i in first..=last {
            let _ = write!(out, "{:>10}", bucket_label(i));
            for column in &columns {
                let _ = write!(out, " {:>11}", column[i]);
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(class: &str, ops: u64, bucket: usize, count: u64) -> Row {
        let mut latency_log2_us = vec![0; LATENCY_BUCKETS];
        latency_log2_us[bucket] = count;
        Row {
            pool: "tank".into(),
            device: "/a.img".into(),
            class: class.into(),
            ops,
            bytes: ops * 4096,
            in_flight: 0,
            errors: 0,
            latency_log2_us,
            floor_share: None,
        }
    }

    #[test]
    fn a_report_shows_a_class_floor() {
        let mut scrub = row("scrub", 10, 12, 10);
        scrub.floor_share = Some(0.25);
        let text = render(&BTreeMap::new(), &[scrub], 1.0, false);
        assert!(text.contains("25%"), "{text}");
        assert!(text.contains("then resilver, then scrub"), "{text}");
        let text = render(&BTreeMap::new(), &[row("scrub", 10, 12, 10)], 1.0, false);
        assert!(!text.contains("FLOOR:"), "no floor, no legend: {text}");
    }

    #[test]
    fn a_report_shows_the_interval_not_the_totals() {
        let before: BTreeMap<Key, Row> = [row("sync-read", 100, 7, 100), row("scrub", 0, 0, 0)]
            .into_iter()
            .map(|r| (key(&r), r))
            .collect();
        let now = vec![row("sync-read", 300, 7, 300), row("scrub", 0, 0, 0)];
        let text = render(&before, &now, 2.0, true);
        assert!(text.contains("sync-read"), "{text}");
        assert!(text.contains("100.0"), "200 ops over 2 s: {text}");
        assert!(
            !text.contains("scrub "),
            "idle classes are left out: {text}"
        );
        assert!(text.contains("128us"), "bucket 7 is [128, 256) us: {text}");
        assert!(text.contains("200"), "{text}");
    }
}
