//! `weir bench streams`: sequential streams a server's connections break
//! up, on a disk, with readahead off and on, in virtual time.
//!
//! One and two concurrent QD1 64 KiB sequential streams, each read through
//! 1, 4 and 16 connections (`conns=N`: consecutive requests go round-robin
//! to N server threads, which hand them to the volume after a random
//! delay), on the HDD model. Without readahead each 64 KiB request pays
//! for its own positioning, and two streams make the head move between
//! them on every request: the collapse a thread-pool storage target shows
//! (two streams at a few percent of the disk). With readahead the volume
//! recognises each stream whichever connection its reads come on.
//!
//! Each figure is the streams' aggregate rate as a share of the disk's
//! sequential rate over the region they read (1 MiB QD8 reads alone).

use std::fmt::Write as _;

use super::plot::share_columns;
use super::readahead::{
    total_mb, DeviceRuns, COLLAPSE_MAX, HALF, ONE_STREAM_MIN, SIZE, TWO_STREAMS_MIN,
};
use super::report::{Report, Run};
use super::scenarios::{self, Check, Outcome, Targets};

const CONNECTIONS: [u32; 3] = [1, 4, 16];
const STREAMS: [u32; 2] = [1, 2];

/// The jobs of `streams` QD1 64 KiB streams through `conns` connections
/// each, stream k reading the k-th half of the device.
fn stream_jobs(streams: u32, conns: u32) -> Vec<String> {
    let halves = ["0", HALF];
    (0..streams as usize)
        .map(|k| {
            format!(
                "name=s{k},rw=read,bs=64k,qd=1,offset={},size={HALF},conns={conns}",
                halves[k]
            )
        })
        .collect()
}

pub fn streams(targets: &mut dyn Targets, seconds: f64, seed: u64) -> anyhow::Result<Outcome> {
    if targets.target(scenarios::HDD)?.mode() != "sim" {
        anyhow::bail!(
            "streams runs in virtual time; in real time: weir bench run --uri URI with conns=N \
             jobs, or bench/readahead.sh"
        );
    }
    let mut runs = Vec::new();
    let mut device = DeviceRuns {
        device: format!("model:hdd,{SIZE}"),
        copies: 1,
        seconds,
        seed,
        runs: &mut runs,
    };
    let region_mb = device.halves_mb("", "seq")?;
    let mut run = |label, readahead, texts: &[String]| device.run(label, readahead, texts);
    let reference = |streams: u32| match streams {
        1 => region_mb[0],
        _ => region_mb.iter().sum::<f64>() / 2.0,
    };
    let mut checks = Vec::new();
    let mut notes = String::from(
        "| streams | connections each | off MB/s | on MB/s | off / sequential | on / sequential |\n\
         |---:|---:|---:|---:|---:|---:|\n",
    );
    let mut groups = Vec::new();
    for streams in STREAMS {
        for conns in CONNECTIONS {
            let jobs = stream_jobs(streams, conns);
            let what = format!("{streams} stream(s) x {conns} conns");
            let off = run(format!("{streams}-streams-{conns}-conns-off"), false, &jobs)?;
            let on = run(format!("{streams}-streams-{conns}-conns-on"), true, &jobs)?;
            let share = |run: &Run| total_mb(run) / reference(streams).max(1e-9);
            let _ = writeln!(
                notes,
                "| {streams} | {conns} | {:.1} | {:.1} | {:.2} | {:.2} |",
                total_mb(&off),
                total_mb(&on),
                share(&off),
                share(&on)
            );
            let on_min = if streams == 1 {
                ONE_STREAM_MIN
            } else {
                TWO_STREAMS_MIN
            };
            checks.push(Check::range(
                &format!("{what}, readahead on / sequential rate"),
                "x",
                share(&on),
                on_min,
                f64::INFINITY,
            ));
            if streams > 1 {
                checks.push(Check::range(
                    &format!("{what}, readahead off / sequential rate"),
                    "x",
                    share(&off),
                    0.0,
                    COLLAPSE_MAX,
                ));
            }
            groups.push((
                format!(
                    "{streams}x, {conns} conn{}",
                    if conns > 1 { "s" } else { "" }
                ),
                vec![share(&off), share(&on)],
            ));
        }
    }
    let _ = writeln!(
        notes,
        "\nSequential rate: 1 MiB QD8 reads alone, {:.1} MB/s over the first half and {:.1} MB/s \
         over the second; one stream reads the first half, two streams one half each.",
        region_mb[0], region_mb[1]
    );
    let plot = share_columns(
        "HDD model: QD1 64 KiB sequential streams through N connections",
        &["readahead off", "readahead on"],
        &groups,
        Some(TWO_STREAMS_MIN),
        "streams x connections each. columns: aggregate MB/s / sequential rate of the disk. line: 0.8",
    );
    Ok(Outcome {
        report: Report {
            scenario: "streams".into(),
            mode: "sim".into(),
            seconds,
            seed,
            runs,
        },
        checks,
        notes,
        plots: vec![("shares".into(), plot)],
    })
}
