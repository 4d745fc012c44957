//! What a served pool looks like right now: `weir pool status` through the
//! admin endpoint, and the pool's lines of `/metrics`.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::{Health, PoolData};
use crate::metrics::{Sample, SampleValue};
use crate::sched::IoClass;

impl PoolData {
    /// A `zpool status`-like report. `scan` is the scrub's line, if any;
    /// `verbose` adds how the mirrors choose the copy for each read.
    pub fn status_text(&self, scan: Option<&str>, verbose: bool) -> String {
        let mut out = String::new();
        let config = self.config.lock().clone();
        let _ = writeln!(out, "  pool: {}", self.name);
        let _ = writeln!(out, "    id: {:032x}", config.pool_id);
        let _ = writeln!(out, " state: {}", self.state_name());
        let _ = writeln!(out, " sched: {}", self.sched().name());
        let _ = writeln!(out, " reads: {}", self.read_policy().name());
        let errors = self.error_count();
        let offline = self
            .groups
            .iter()
            .flat_map(|g| &g.slots)
            .find(|s| s.state_name() == "OFFLINE")
            .map(|s| s.spec.read().clone());
        if let Some((status, action)) = crate::pool::advice::advice(
            &self.name,
            self.state_name(),
            self.resilvering(),
            errors,
            offline.as_deref(),
        ) {
            let _ = writeln!(out, "status: {status}");
            let _ = writeln!(out, "action: {action}");
        }
        if let Some(scan) = scan {
            let _ = writeln!(out, "  scan: {scan}");
        }
        if !self.resilvering() {
            if let Some(last) = self.last_resilver.lock().as_ref() {
                let _ = writeln!(out, "resilver: {}", last.describe());
            }
        }
        for (g, group) in self.groups.iter().enumerate() {
            for (m, slot) in group.slots.iter().enumerate() {
                if slot.health() == Health::Resilvering {
                    let (done, total) = self.resilver_progress(g, m);
                    let seconds = slot
                        .resilver_started
                        .lock()
                        .map_or(0.0, |t| t.elapsed().as_secs_f64());
                    let eta = crate::pool::progress::eta(done, total, seconds);
                    let _ = writeln!(
                        out,
                        "resilver: {} {:.1}% ({done} of {total} chunks) after {seconds:.0} s{eta}",
                        slot.spec.read(),
                        percent(done, total)
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "config:\n\n\t{:<44} {:<12} {:>6} {:>6} {:>6} {:>9} {:>10}",
            "NAME", "STATE", "READ", "WRITE", "CKSUM", "REPAIRED", "READS"
        );
        let _ = writeln!(out, "\t{:<44} {}", self.name, self.state_name());
        let copies = self.groups[0].slots.len();
        for (g, group) in self.groups.iter().enumerate() {
            let indent = if copies > 1 {
                let _ = writeln!(
                    out,
                    "\t  {:<42} {}",
                    format!("mirror-{g}"),
                    group.state_name()
                );
                "    "
            } else {
                "  "
            };
            for (m, slot) in group.slots.iter().enumerate() {
                let c = &slot.counters;
                let width = 44 - indent.len();
                let mut state = slot.state_name().to_string();
                if slot.health() == Health::Resilvering {
                    let (done, total) = self.resilver_progress(g, m);
                    state = format!("{state} {:.0}%", percent(done, total));
                }
                let _ = writeln!(
                    out,
                    "\t{indent}{:<width$} {:<12} {:>6} {:>6} {:>6} {:>9} {:>10}",
                    slot.spec.read().as_str(),
                    state,
                    c.read_errors.load(Ordering::Relaxed),
                    c.write_errors.load(Ordering::Relaxed),
                    c.checksum_errors.load(Ordering::Relaxed),
                    c.repaired.load(Ordering::Relaxed),
                    c.reads.load(Ordering::Relaxed),
                );
            }
        }
        let _ = writeln!(
            out,
            "errors: {}",
            if errors == 0 {
                "none since the pool opened or was cleared".to_string()
            } else {
                format!("{errors} on its members (the READ, WRITE and CKSUM columns)")
            }
        );
        if verbose {
            self.read_selection_text(&mut out);
        }
        out
    }

    /// Per member: its share of the client reads the selector placed, its
    /// reads in flight, and the service times per read it predicts from.
    fn read_selection_text(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\nread selection ({}): each member's share of the client reads since open, its reads\n\
             in flight, and its recent service time per read (continuing a run / other)\n\n\
             \t{:<44} {:>7} {:>9} {:>10} {:>10}  NOTE",
            self.read_policy().name(),
            "NAME",
            "SHARE",
            "IN-FLIGHT",
            "RUN us",
            "OTHER us"
        );
        let now = self.clock_ns();
        let micros = |ns: Option<f64>| ns.map_or("-".to_string(), |ns| format!("{:.1}", ns / 1e3));
        for (g, group) in self.groups.iter().enumerate() {
            let _ = writeln!(out, "	  {}", format_args!("mirror-{g}"));
            let estimates = group.selector.lock().estimates(now);
            let total: u64 = estimates.iter().map(|e| e.reads).sum();
            for (slot, e) in group.slots.iter().zip(&estimates) {
                let _ = writeln!(
                    out,
                    "	    {:<40} {:>6.1}% {:>9} {:>10} {:>10}  {}",
                    slot.spec.read().as_str(),
                    100.0 * e.reads as f64 / total.max(1) as f64,
                    e.in_flight,
                    micros(e.service_run_ns),
                    micros(e.service_ns),
                    if e.avoided {
                        "passed over: bad checksums"
                    } else {
                        ""
                    }
                );
            }
        }
    }

    /// One JSON row per member and class: counters and the log2 latency
    /// histogram (microseconds), for `weir iostat`.
    pub fn iostat_rows(&self) -> Vec<serde_json::Value> {
        let mut rows = Vec::new();
        for group in &self.groups {
            for slot in &group.slots {
                let Some(attached) = slot.attached() else {
                    continue;
                };
                for class in IoClass::ALL {
                    let k = attached.queue.counters(class);
                    let histogram: Vec<u64> = k
                        .latency_log2_us
                        .iter()
                        .map(|b| b.load(Ordering::Relaxed))
                        .collect();
                    rows.push(serde_json::json!({
                        "pool": self.name,
                        "device": slot.spec.read().as_str(),
                        "class": class.name(),
                        "ops": k.ops.load(Ordering::Relaxed),
                        "bytes": k.bytes.load(Ordering::Relaxed),
                        "in_flight": k.in_flight.load(Ordering::Relaxed),
                        "errors": k.errors.load(Ordering::Relaxed),
                        "latency_log2_us": histogram,
                        "floor_share": attached.queue.floor(class).map(|(share, _)| share),
                        "floor_credit_ms": attached.queue.floor(class).map(|(_, credit)| credit / 1e6),
                    }));
                }
            }
        }
        rows
    }

    /// This pool's metrics, for the admin endpoint to encode.
    pub fn metrics(&self, out: &mut Vec<Sample>) {
        let pool = &self.name;
        out.push(Sample::counter(
            "weir_pool_repairs",
            vec![("pool", pool.clone())],
            self.repairs(),
        ));
        let now = self.clock_ns();
        for (g, group) in self.groups.iter().enumerate() {
            let estimates = group.selector.lock().estimates(now);
            let selected: u64 = estimates.iter().map(|e| e.reads).sum();
            for (m, slot) in group.slots.iter().enumerate() {
                let labels = vec![
                    ("pool", pool.clone()),
                    ("group", g.to_string()),
                    ("member", m.to_string()),
                    ("device", slot.spec.read().clone()),
                ];
                let with = |key: &'static str, value: &str| {
                    let mut l = labels.clone();
                    l.push((key, value.to_string()));
                    l
                };
                let c = &slot.counters;
                let current = slot.state_name();
                for state in ["ONLINE", "RESILVERING", "FAULTED", "OFFLINE"] {
                    out.push(Sample::gauge(
                        "weir_member_state",
                        with("state", state),
                        f64::from(u8::from(current == state)),
                    ));
                }
                for (name, value) in [
                    ("weir_member_reads", &c.reads),
                    ("weir_member_read_errors", &c.read_errors),
                    ("weir_member_write_errors", &c.write_errors),
                    ("weir_member_checksum_errors", &c.checksum_errors),
                    ("weir_member_repaired_blocks", &c.repaired),
                ] {
                    out.push(Sample::counter(
                        name,
                        labels.clone(),
                        value.load(Ordering::Relaxed),
                    ));
                }
                let e = &estimates[m];
                out.push(Sample::gauge(
                    "weir_member_read_share",
                    labels.clone(),
                    e.reads as f64 / selected.max(1) as f64,
                ));
                for (kind, estimate) in [("run", e.service_run_ns), ("other", e.service_ns)] {
                    if let Some(ns) = estimate {
                        out.push(Sample::gauge(
                            "weir_member_read_service_seconds",
                            with("kind", kind),
                            ns / 1e9,
                        ));
                    }
                }
                out.push(Sample::gauge(
                    "weir_member_read_passed_over",
                    labels.clone(),
                    f64::from(u8::from(e.avoided)),
                ));
                let Some(attached) = slot.attached() else {
                    continue;
                };
                for class in IoClass::ALL {
                    let k = attached.queue.counters(class);
                    let class_labels = with("class", class.name());
                    for (name, value) in [
                        ("weir_device_ops", &k.ops),
                        ("weir_device_bytes", &k.bytes),
                        ("weir_device_errors", &k.errors),
                        ("weir_device_pieces", &k.pieces),
                    ] {
                        out.push(Sample::counter(
                            name,
                            class_labels.clone(),
                            value.load(Ordering::Relaxed),
                        ));
                    }
                    out.push(Sample::gauge(
                        "weir_device_in_flight",
                        class_labels.clone(),
                        k.in_flight.load(Ordering::Relaxed) as f64,
                    ));
                    if let Some((share, _)) = attached.queue.floor(class) {
                        out.push(Sample::gauge(
                            "weir_device_floor_share",
                            class_labels.clone(),
                            share,
                        ));
                    }
                    // Bucket i holds [2^i, 2^(i+1)) us: its upper bound in seconds.
                    let buckets = k
                        .latency_log2_us
                        .iter()
                        .enumerate()
                        .map(|(i, b)| ((1u64 << (i + 1)) as f64 / 1e6, b.load(Ordering::Relaxed)))
                        .collect();
                    out.push(Sample {
                        family: "weir_device_latency_seconds",
                        labels: class_labels,
                        value: SampleValue::Histogram {
                            buckets,
                            sum: k.latency_sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
                        },
                    });
                }
            }
        }
    }
}

fn percent(done: u64, total: u64) -> f64 {
    if total == 0 {
        100.0
    } else {
        100.0 * done as f64 / total as f64
    }
}
