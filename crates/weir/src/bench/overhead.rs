//! `weir bench queue-overhead`: what the device queue costs on one core
//! (enqueue + next_to_issue + complete), for each mode, on a steady mix of
//! interactive reads at depth 32 and scrub reads, with no device: per
//! device operation, and per I/O (an I/O sent in pieces costs one
//! operation per piece). Completions come 10 us apart in virtual time, so
//! the adaptive mode sizes scrub pieces as for a fast device.

use std::fmt::Write as _;
use std::time::Instant;

use crate::rng::Rng;
use crate::sched::{IoClass, IoQueue, Mode, QueuedIo};

/// Interactive I/Os kept queued or active; every fourth I/O is a scrub read.
const DEPTH: usize = 32;

/// (ns per completed I/O, ns per device operation) for `mode` over `ios`
/// I/Os. They differ where the mode sends an I/O in pieces.
fn measure(mode: Mode, ios: u64) -> (f64, f64) {
    let mut queue = IoQueue::new(mode, true);
    let mut rng = Rng::new(1);
    let mut in_flight: Vec<u64> = Vec::with_capacity(4 * DEPTH);
    let mut next_id = 0u64;
    let mut now = 0u64;
    let mut completed = 0u64;
    let mut operations = 0u64;
    let started = Instant::now();
    while completed < ios {
        while queue.waiting_total() + in_flight.len() < DEPTH {
            let scrub = next_id % 4 == 3;
            queue.enqueue(
                QueuedIo {
                    id: next_id,
                    class: if scrub {
                        IoClass::Scrub
                    } else {
                        IoClass::SyncRead
                    },
                    offset: if scrub {
                        next_id << 20
                    } else {
                        rng.below(1 << 24) << 12
                    },
                    length: if scrub { 1 << 20 } else { 4096 },
                    write: false,
                },
                now,
            );
            next_id += 1;
        }
        while let Some(d) = queue.next_to_issue(now) {
            in_flight.push(d.id);
            operations += 1;
        }
        now += 10_000;
        if in_flight.is_empty() {
            continue;
        }
        let index = rng.below(in_flight.len() as u64) as usize;
        let id = in_flight.swap_remove(index);
        completed += queue.complete(id, now).len() as u64;
    }
    let ns = started.elapsed().as_nanos() as f64;
    (ns / completed as f64, ns / operations.max(1) as f64)
}

pub fn run(ios: u64) -> anyhow::Result<String> {
    anyhow::ensure!(
        (1000..=100_000_000).contains(&ios),
        "--ios must be 1000..100000000"
    );
    let mut out = String::from(
        "| mode | ns per device operation | ns per I/O (with its pieces) |\n|---|---:|---:|\n",
    );
    for mode in [Mode::Fifo, Mode::Zfs, Mode::Adaptive] {
        let (per_io, per_operation) = measure(mode, ios);
        let _ = writeln!(
            out,
            "| {} | {per_operation:.0} | {per_io:.0} |",
            mode.name()
        );
    }
    Ok(out)
}
