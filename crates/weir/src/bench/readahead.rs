//! `weir bench readahead`: readers on each device model with readahead off
//! and on, in virtual time, through the server's own readahead store.
//!
//! Each reader runs alone on a 4 GiB model, once with readahead off and
//! once on: random readers (which must lose nothing), sequential readers
//! of several sizes and depths, two QD1 streams at once, a stream beside
//! a 4 KiB and beside a 64 KiB random reader, and a stream that pauses
//! between reads. The table gives throughput, the bytes read from the
//! device, and p99 latency.
//!
//! The readers that share the device (the streams, and a stream beside a
//! random reader) each spread their requests over four connections
//! (`conns=4`), as nbdcopy and qemu do. `weir bench streams` varies the
//! connections; real time through NBD is `bench/readahead.sh`.

use std::fmt::Write as _;

use super::report::{Report, Run};
use super::run_jobs;
use super::scenarios::{self, model, Check, Outcome, Targets};
use super::Target;
use crate::pool::mirror::select::ReadPolicy;
use crate::sched::Mode;

pub(super) const SIZE: &str = "size=4G";
/// Two streams' regions: each stream reads one half of the device.
pub(super) const HALF: &str = "2G";
/// Aggregate of two QD1 streams on a disk, of the sequential rate of the
/// regions they read.
pub(super) const TWO_STREAMS_MIN: f64 = 0.8;
/// One QD1 stream on a disk, of the same.
pub(super) const ONE_STREAM_MIN: f64 = 0.95;
/// Without readahead two streams on a disk collapse below this share.
pub(super) const COLLAPSE_MAX: f64 = 0.1;
/// Random readers: IOPS kept with readahead on, and device bytes allowed.
const RANDOM_IOPS_MIN: f64 = 0.97;
const RANDOM_BYTES_MAX: f64 = 1.05;
/// On flash, every job (each of its readers) keeps this share.
const FLASH_JOB_MIN: f64 = 0.97;
/// On a disk, a random reader beside a stream keeps this share of its
/// reads, and one reading now and then its p99 within this factor, as a
/// reader beside writeback keeps it (the stream's reads come between its
/// reads either way: without readahead each is a request with its seek).
const BESIDE_STREAM_IOPS_MIN: f64 = 0.85;
const BESIDE_STREAM_P99_MAX: f64 = 2.0;
/// On a mirror of two disks, a stream's gain from readahead (on / off) is
/// at least this share of its gain on one of the disks alone.
const MIRROR_STREAM_MIN: f64 = 0.95;
/// Beside a light random reader, a stream keeps this share of what it
/// reads without readahead.
const STREAM_BESIDE_LIGHT_MIN: f64 = 0.9;

/// The readers: (name, jobs). Job names are the streams' names.
fn readers() -> Vec<(&'static str, Vec<String>)> {
    let half = |name: &str, rw: &str, bs: &str, at: &str| {
        format!("name={name},rw={rw},bs={bs},qd=1,offset={at},size={HALF},conns=4")
    };
    vec![
        (
            "randread-4k-qd1",
            vec!["name=a,rw=randread,bs=4k,qd=1".into()],
        ),
        (
            "randread-4k-qd8",
            vec!["name=a,rw=randread,bs=4k,qd=8".into()],
        ),
        (
            "randread-64k-qd1",
            vec!["name=a,rw=randread,bs=64k,qd=1".into()],
        ),
        (
            "randread-1m-qd1",
            vec!["name=a,rw=randread,bs=1m,qd=1".into()],
        ),
        (
            "randread-4m-qd1",
            vec!["name=a,rw=randread,bs=4m,qd=1".into()],
        ),
        ("read-4k-qd1", vec!["name=a,rw=read,bs=4k,qd=1".into()]),
        ("read-128k-qd1", vec!["name=a,rw=read,bs=128k,qd=1".into()]),
        ("read-1m-qd1", vec!["name=a,rw=read,bs=1m,qd=1".into()]),
        ("read-64k-qd2", vec!["name=a,rw=read,bs=64k,qd=2".into()]),
        ("read-1m-qd8", vec!["name=a,rw=read,bs=1m,qd=8".into()]),
        (
            "read-128k-qd1-think-1ms",
            vec!["name=a,rw=read,bs=128k,qd=1,think=1ms".into()],
        ),
        ("stream-64k-qd1", vec![half("a", "read", "64k", "0")]),
        (
            "two-streams-64k-qd1",
            vec![
                half("a", "read", "64k", "0"),
                half("b", "read", "64k", HALF),
            ],
        ),
        (
            "stream-64k-qd1+randread-4k-qd1",
            vec![
                half("a", "read", "64k", "0"),
                half("b", "randread", "4k", HALF),
            ],
        ),
        (
            "stream-64k-qd1+randread-64k-qd1",
            vec![
                half("a", "read", "64k", "0"),
                half("b", "randread", "64k", HALF),
            ],
        ),
        (
            "stream-64k-qd1+randread-4k-20/s",
            vec![
                half("a", "read", "64k", "0"),
                format!(
                    "name=b,rw=randread,bs=4k,qd=8,rate=20/s,offset={HALF},size={HALF},conns=4"
                ),
            ],
        ),
    ]
}

/// `copies` of `device` as a mirror (one: the device alone).
fn target(device: &str, copies: usize, readahead: bool) -> anyhow::Result<Target> {
    Ok(Target::SimPool {
        devices: vec![model(device)?; copies],
        mode: Mode::Adaptive,
        read_policy: ReadPolicy::default(),
        cache: None,
        readahead,
    })
}

/// Runs of jobs on one model device (or a mirror of `copies` of it) with
/// readahead off or on, each kept for the report.
pub(super) struct DeviceRuns<'a> {
    pub device: String,
    pub copies: usize,
    pub seconds: f64,
    pub seed: u64,
    pub runs: &'a mut Vec<Run>,
}

impl DeviceRuns<'_> {
    pub(super) fn run(
        &mut self,
        label: String,
        readahead: bool,
        texts: &[String],
    ) -> anyhow::Result<Run> {
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        let run = run_jobs(
            &label,
            &target(&self.device, self.copies, readahead)?,
            &scenarios::jobs(&texts),
            self.seconds,
            self.seed,
        )?;
        self.runs.push(run.clone());
        Ok(run)
    }

    /// The device's sequential rate (MB/s) over each half, read alone
    /// (1 MiB QD8, readahead off): runs `{prefix}seq-1m-qd8-at-{offset}`,
    /// whose job is named `job`.
    pub(super) fn halves_mb(&mut self, prefix: &str, job: &str) -> anyhow::Result<Vec<f64>> {
        let mut mb = Vec::new();
        for at in ["0", HALF] {
            let text = format!("name={job},rw=read,bs=1m,qd=8,offset={at},size={HALF}");
            mb.push(total_mb(&self.run(
                format!("{prefix}seq-1m-qd8-at-{at}"),
                false,
                &[text],
            )?));
        }
        Ok(mb)
    }
}

pub(super) fn total_mb(run: &Run) -> f64 {
    run.streams.iter().map(|s| s.mb_per_s).sum()
}

/// Bytes the device read: counted by the readahead store when it is on;
/// with it off every client read is one device read of its own bytes.
fn device_bytes(run: &Run, seconds: f64) -> f64 {
    match &run.readahead {
        Some(r) => r.device_read_bytes as f64,
        None => total_mb(run) * 1e6 * seconds,
    }
}

pub fn readahead(targets: &mut dyn Targets, seconds: f64, seed: u64) -> anyhow::Result<Outcome> {
    if targets.target(scenarios::HDD)?.mode() != "sim" {
        anyhow::bail!("readahead runs in virtual time; in real time: bench/readahead.sh");
    }
    let mut runs = Vec::new();
    let mut checks = Vec::new();
    let mut notes = String::from(
        "| device | reader | off MB/s | on MB/s | on / off | device bytes on / off | p99 off | p99 on |\n\
         |---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    // On / off of each reader on one disk, for the mirror's.
    let mut one_disk = Vec::new();
    for name in ["hdd", "ssd", "nvme"] {
        let mut device = DeviceRuns {
            device: format!("model:{name},{SIZE}"),
            copies: 1,
            seconds,
            seed,
            runs: &mut runs,
        };
        // The device's sequential rate over each half, read alone.
        let region_mb = device.halves_mb(&format!("{name}-"), "a")?;
        let mut run = |label, readahead, texts: &[String]| device.run(label, readahead, texts);
        let both_halves_mb = region_mb.iter().sum::<f64>() / 2.0;
        for (reader, texts) in readers() {
            let off = run(format!("{name}-{reader}-off"), false, &texts)?;
            let on = run(format!("{name}-{reader}-on"), true, &texts)?;
            let ratio = total_mb(&on) / total_mb(&off).max(1e-9);
            if name == "hdd" {
                one_disk.push((reader, ratio));
            }
            let bytes = device_bytes(&on, seconds) / device_bytes(&off, seconds).max(1.0);
            let p99 = |run: &Run| {
                let worst = run
                    .streams
                    .iter()
                    .map(|s| s.latency_us.p99)
                    .fold(0.0, f64::max);
                format!("{:.0} us", worst)
            };
            let per_stream: Vec<String> = on
                .streams
                .iter()
                .zip(&off.streams)
                .map(|(n, f)| format!("{} {:.1}/{:.1}", n.name, f.mb_per_s, n.mb_per_s))
                .collect();
            let _ = writeln!(
                notes,
                "| {name} | {reader}{} | {:.1} | {:.1} | {ratio:.2} | {bytes:.2} | {} | {} |",
                if texts.len() > 1 {
                    format!(" ({})", per_stream.join(", "))
                } else {
                    String::new()
                },
                total_mb(&off),
                total_mb(&on),
                p99(&off),
                p99(&on),
            );
            check(
                &mut checks,
                name,
                reader,
                &off,
                &on,
                bytes,
                &region_mb,
                both_halves_mb,
            );
        }
    }
    // A stream on a mirror of two disks stays on one copy: its windows
    // continue the run there, whatever their lengths.
    let mut mirror = DeviceRuns {
        device: format!("model:hdd,{SIZE}"),
        copies: 2,
        seconds,
        seed,
        runs: &mut runs,
    };
    for reader in ["stream-64k-qd1", "read-1m-qd1"] {
        let (_, texts) = readers()
            .into_iter()
            .find(|(name, _)| *name == reader)
            .expect("a reader of the table");
        let mut mb = [0.0; 2];
        for (i, state) in ["off", "on"].into_iter().enumerate() {
            let label = format!("hdd-mirror-{reader}-{state}");
            mb[i] = total_mb(&mirror.run(label, state == "on", &texts)?);
        }
        let ratio = mb[1] / mb[0].max(1e-9);
        let (_, alone) = one_disk
            .iter()
            .find(|(name, _)| *name == reader)
            .expect("every reader ran on one disk first");
        let _ = writeln!(
            notes,
            "| hdd mirror | {reader} | {:.1} | {:.1} | {ratio:.2} | | | |",
            mb[0], mb[1]
        );
        checks.push(Check::range(
            &format!("hdd mirror: {reader}, on / off, of the same on one disk"),
            "x",
            ratio / alone.max(1e-9),
            MIRROR_STREAM_MIN,
            f64::INFINITY,
        ));
    }
    let _ = writeln!(
        notes,
        "\nThe disk's references: 1 MiB QD8 reads alone over each half of it; two streams\n\
         are judged against the mean of both halves, one stream against the first."
    );
    Ok(Outcome {
        report: Report {
            scenario: "readahead".into(),
            mode: "sim".into(),
            seconds,
            seed,
            runs,
        },
        checks,
        notes,
        plots: Vec::new(),
    })
}

#[allow(clippy::too_many_arguments)]
fn check(
    checks: &mut Vec<Check>,
    device: &str,
    reader: &str,
    off: &Run,
    on: &Run,
    bytes: f64,
    region_mb: &[f64],
    both_halves_mb: f64,
) {
    let ratio = total_mb(on) / total_mb(off).max(1e-9);
    // Random readers alone, of every size: large reads land next to one
    // another by chance far more often than small ones.
    if let Some(size) = reader
        .strip_prefix("randread-")
        .and_then(|rest| rest.strip_suffix("-qd1"))
    {
        let iops = |run: &Run| run.streams[0].iops;
        let kept = iops(on) / iops(off).max(1e-9);
        checks.push(Check::range(
            &format!("{device}: random {size} QD1 IOPS, on / off"),
            "x",
            kept,
            RANDOM_IOPS_MIN,
            f64::INFINITY,
        ));
        checks.push(Check::range(
            &format!("{device}: random {size} QD1 device bytes, on / off"),
            "x",
            bytes,
            0.0,
            RANDOM_BYTES_MAX,
        ));
    }
    if device == "hdd" && reader == "two-streams-64k-qd1" {
        checks.push(Check::range(
            "hdd: two QD1 64k streams, readahead on / sequential rate",
            "x",
            total_mb(on) / both_halves_mb.max(1e-9),
            TWO_STREAMS_MIN,
            f64::INFINITY,
        ));
        checks.push(Check::range(
            "hdd: two QD1 64k streams, readahead off / sequential rate",
            "x",
            total_mb(off) / both_halves_mb.max(1e-9),
            0.0,
            COLLAPSE_MAX,
        ));
    }
    if device == "hdd" && reader == "stream-64k-qd1" {
        checks.push(Check::range(
            "hdd: one QD1 64k stream, readahead on / sequential rate",
            "x",
            total_mb(on) / region_mb[0].max(1e-9),
            ONE_STREAM_MIN,
            f64::INFINITY,
        ));
    }
    if device == "hdd" && reader.starts_with("stream-") && on.streams.len() == 2 {
        let (stream_on, stream_off) = (&on.streams[0], &off.streams[0]);
        let (random_on, random_off) = (&on.streams[1], &off.streams[1]);
        if reader.ends_with("/s") {
            checks.push(Check::range(
                &format!("hdd: {reader}, the stream on / off"),
                "x",
                stream_on.mb_per_s / stream_off.mb_per_s.max(1e-9),
                STREAM_BESIDE_LIGHT_MIN,
                f64::INFINITY,
            ));
            checks.push(Check::range(
                &format!("hdd: {reader}, the random reader's p99 on / off"),
                "x",
                random_on.latency_us.p99 / random_off.latency_us.p99.max(1e-9),
                0.0,
                BESIDE_STREAM_P99_MAX,
            ));
        } else {
            checks.push(Check::range(
                &format!("hdd: {reader}, the random reader's IOPS on / off"),
                "x",
                random_on.iops / random_off.iops.max(1e-9),
                BESIDE_STREAM_IOPS_MIN,
                f64::INFINITY,
            ));
        }
    }
    if device != "hdd" {
        let worst = on
            .streams
            .iter()
            .zip(&off.streams)
            .map(|(n, f)| n.mb_per_s / f.mb_per_s.max(1e-9))
            .fold(ratio, f64::min);
        checks.push(Check::range(
            &format!("{device}: {reader}, slowest reader on / off"),
            "x",
            worst,
            FLASH_JOB_MIN,
            f64::INFINITY,
        ));
    }
}
