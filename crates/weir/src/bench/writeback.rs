//! `weir bench writeback-vs-randread`: a 1 MiB sequential writer at QD8
//! beside a 4 KiB random reader at QD1, on each device model.
//!
//! In virtual time every device runs the writer through the server's
//! write-back cache under each writeback throttle (none, Linux wbt,
//! weir's adaptive queue), and written through, beside the reader alone.
//! Reference runs then show what the device itself allows: the writer
//! paced open-loop at a given rate, in evenly spaced requests of 64 KiB,
//! 1 MiB or 4 MiB with nothing queued, and the reader's p99 beside the
//! best of them. A check that even that reference misses is beyond reach
//! of any writeback policy on that device, and reported as such.
//!
//! In real time the scenario runs the reader alone and beside the writer
//! against a served `model:ssd` with the server's defaults (write-back
//! cache, adaptive queue).

use std::fmt::Write as _;

use super::plot::{step_plot, YScale};
use super::report::{Report, Run};
use super::run_jobs;
use super::scenarios::{self, model, stream, Check, Outcome, Targets, HDD, NVME, SSD};
use super::Target;
use crate::pool::mirror::select::ReadPolicy;
use crate::sched::Mode;
use crate::sim::WbThrottle;
use crate::workload::JobSpec;

/// Reader p99 within this multiple of its idle p99 beside the writer:
/// flash, and rotational (where one seek is most of a read).
const READER_BOUND_FLASH: f64 = 2.0;
const READER_BOUND_HDD: f64 = 3.0;
/// In real time through NBD.
const READER_BOUND_REAL: f64 = 3.0;
/// The writer keeps this share of what it gets with no throttle.
const WRITER_SHARE_MIN: f64 = 0.9;
/// Without a throttle the stall shows: reader p99 at least this multiple.
const PATHOLOGY_MIN: f64 = 20.0;
/// The policy's reader p99 within this multiple of the best paced
/// reference at the same write rate.
const FRONTIER_BOUND: f64 = 2.0;
/// Request sizes of the paced references.
const PACED_SIZES: [(&str, u64); 3] = [("64k", 64 << 10), ("1m", 1 << 20), ("4m", 4 << 20)];

fn jobs(texts: &[String]) -> Vec<JobSpec> {
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    scenarios::jobs(&texts)
}

fn sim(device: &str, mode: Mode, cache: Option<WbThrottle>) -> anyhow::Result<Target> {
    Ok(Target::SimPool {
        devices: vec![model(device)?],
        mode,
        read_policy: ReadPolicy::default(),
        cache,
        readahead: false,
    })
}

pub fn writeback_vs_randread(
    targets: &mut dyn Targets,
    seconds: f64,
    seed: u64,
) -> anyhow::Result<Outcome> {
    // The reader and the writer run over the middle of the run; the
    // reader alone over the same window is the idle reference.
    let window = format!("start={},stop={}", seconds * 0.2, seconds * 0.8);
    let window_s = seconds * 0.6;
    let reader = format!("name=randread,rw=randread,bs=4k,qd=1,{window}");
    let writer = format!("name=write,rw=write,bs=1m,qd=8,{window}");
    let ssd = targets.target(SSD)?;
    if ssd.mode() != "sim" {
        return real(&ssd, &reader, &writer, seconds, seed);
    }
    let mut runs = Vec::new();
    let mut checks = Vec::new();
    let mut notes = String::new();
    let mut plots = Vec::new();
    for (name, device, bound) in [
        ("hdd", HDD, READER_BOUND_HDD),
        ("ssd", SSD, READER_BOUND_FLASH),
        ("nvme", NVME, READER_BOUND_FLASH),
    ] {
        let mut run = |label: &str, target: Target, texts: &[String]| -> anyhow::Result<Run> {
            let run = run_jobs(
                &format!("{name}-{label}"),
                &target,
                &jobs(texts),
                seconds,
                seed,
            )?;
            runs.push(run.clone());
            Ok(run)
        };
        let both = [reader.clone(), writer.clone()];
        let idle = run(
            "idle",
            sim(device, Mode::Adaptive, None)?,
            std::slice::from_ref(&reader),
        )?;
        let through = run("writethrough", sim(device, Mode::Adaptive, None)?, &both)?;
        let mut cached = Vec::new();
        for throttle in WbThrottle::ALL {
            let target = sim(device, throttle.queue_mode(), Some(throttle))?;
            cached.push((throttle, run(throttle.name(), target, &both)?));
        }
        let by = |t: WbThrottle| &cached.iter().find(|(c, _)| *c == t).expect("ran").1;
        let (none, adaptive) = (by(WbThrottle::None), by(WbThrottle::Adaptive));
        let idle_p99 = stream(&idle, "randread").latency_us.p99.max(1e-9);
        let p99_x = |run: &Run| stream(run, "randread").latency_us.p99 / idle_p99;
        let writer_mb = |run: &Run| stream(run, "write").mb_per_s;
        let none_mb = writer_mb(none).max(1e-9);
        // The reference: the writer paced at `share` of none's rate.
        let mut paced = |share: f64| -> anyhow::Result<(f64, String)> {
            let mut best = (f64::INFINITY, String::new());
            for (size_name, size) in PACED_SIZES {
                let rate = (share * none_mb * 1e6 / size as f64).max(1.0 / window_s);
                let job =
                    format!("name=write,rw=write,bs={size_name},qd=64,rate={rate:.3}/s,{window}");
                let label = format!("paced-{:.0}pct-{size_name}", share * 100.0);
                let target = sim(device, Mode::Fifo, None)?;
                let r = run(&label, target, &[reader.clone(), job])?;
                if p99_x(&r) < best.0 {
                    best = (p99_x(&r), size_name.to_string());
                }
            }
            Ok(best)
        };
        let adaptive_share = writer_mb(adaptive) / none_mb;
        let (at_policy, at_policy_size) = paced(adaptive_share)?;
        let (at_target, at_target_size) = paced(WRITER_SHARE_MIN)?;
        let _ = writeln!(
            notes,
            "{name}: idle reader p99 {idle_p99:.0} us; writer with no throttle {none_mb:.1} MB/s. \
             Paced references, reader p99 / idle: {at_policy:.2} x at adaptive's {:.0}% \
             ({at_policy_size} writes), {at_target:.2} x at {:.0}% ({at_target_size} writes)",
            adaptive_share * 100.0,
            WRITER_SHARE_MIN * 100.0,
        );
        let _ = writeln!(
            notes,
            "| {name} run | reader p50 | reader p99 | p99 / idle | writer MB/s | written back, MB/s over the whole run |\n\
             |---|---:|---:|---:|---:|---:|"
        );
        for (label, r) in [("writethrough", &through)]
            .into_iter()
            .chain(cached.iter().map(|(t, r)| (t.name(), r)))
        {
            let read = &stream(r, "randread").latency_us;
            let back = r.writeback.as_ref().map_or("-".to_string(), |w| {
                format!("{:.1}", w.written_back_mb_per_s)
            });
            let _ = writeln!(
                notes,
                "| {label} | {:.0} us | {:.0} us | {:.2} | {:.1} | {back} |",
                read.p50,
                read.p99,
                p99_x(r),
                writer_mb(r)
            );
        }
        notes.push('\n');
        checks.push(Check::range(
            &format!("{name}: no throttle: reader p99 / idle"),
            "x",
            p99_x(none),
            PATHOLOGY_MIN,
            f64::INFINITY,
        ));
        checks.push(
            Check::range(
                &format!("{name}: adaptive: reader p99 / idle"),
                "x",
                p99_x(adaptive),
                0.0,
                bound,
            )
            .unless_beyond_reach_above(
                at_policy,
                bound,
                "the paced writer at the same rate",
            ),
        );
        checks.push(
            Check::range(
                &format!("{name}: adaptive: writer / writer with no throttle"),
                "x",
                adaptive_share,
                WRITER_SHARE_MIN,
                f64::INFINITY,
            )
            .unless_beyond_reach_above(
                at_target,
                bound,
                "with the reader in bound, the paced writer at 90%",
            ),
        );
        checks.push(Check::range(
            &format!("{name}: adaptive: reader p99 / paced reference at its write rate"),
            "x",
            p99_x(adaptive) / at_policy.max(1e-9),
            0.0,
            FRONTIER_BOUND,
        ));
        let step_s = stream(&idle, "randread").timeline_step_ms.unwrap_or(250) as f64 / 1000.0;
        let mut lines = vec![(
            "alone".to_string(),
            step_s,
            stream(&idle, "randread").p99_over_time_us.clone(),
        )];
        lines.push((
            "writethrough".into(),
            step_s,
            stream(&through, "randread").p99_over_time_us.clone(),
        ));
        for (throttle, r) in &cached {
            lines.push((
                format!("writeback, {}", throttle.name()),
                step_s,
                stream(r, "randread").p99_over_time_us.clone(),
            ));
        }
        plots.push((
            format!("{name}-reader-p99"),
            step_plot(
                &format!("{name}: 4K random reader p99 per 250 ms, beside a 1M QD8 writer"),
                YScale::LatencyUs,
                (seconds * 0.2, seconds * 0.8),
                &lines,
                "time (s), shaded: the writer runs",
            ),
        ));
    }
    Ok(Outcome {
        report: Report {
            scenario: "writeback-vs-randread".into(),
            mode: "sim".into(),
            seconds,
            seed,
            runs,
        },
        checks,
        notes,
        plots,
    })
}

/// Real time: the reader alone and beside the writer, through the server.
fn real(
    target: &Target,
    reader: &str,
    writer: &str,
    seconds: f64,
    seed: u64,
) -> anyhow::Result<Outcome> {
    let idle = run_jobs("idle", target, &jobs(&[reader.into()]), seconds, seed)?;
    let busy = run_jobs(
        "writer",
        target,
        &jobs(&[reader.into(), writer.into()]),
        seconds,
        seed,
    )?;
    let p99 = |run: &Run| stream(run, "randread").latency_us.p99;
    let checks = vec![Check::range(
        "reader p99 beside the writer / alone",
        "x",
        p99(&busy) / p99(&idle).max(1e-9),
        0.0,
        READER_BOUND_REAL,
    )];
    let notes = format!(
        "writer {:.1} MB/s beside the reader\n",
        stream(&busy, "write").mb_per_s
    );
    Ok(Outcome {
        report: Report {
            scenario: "writeback-vs-randread".into(),
            mode: target.mode().into(),
            seconds,
            seed,
            runs: vec![idle, busy],
        },
        checks,
        notes,
        plots: Vec::new(),
    })
}
