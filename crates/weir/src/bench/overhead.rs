//! `weir bench queue-overhead`: what the device queue costs per I/O on one
//! core (enqueue + next_to_issue + complete), for each mode, on a steady
//! mix of interactive reads at depth 32 and scrub reads, with no device.

use std::fmt::Write as _;
use std::time::Instant;

use crate::sched::{IoClass, IoQueue, Mode, QueuedIo};
use crate::sim::rng::Rng;

/// Interactive I/Os kept queued or active; every fourth I/O is a scrub read.
const DEPTH: usize = 32;

/// ns per I/O for `mode` over `ios` I/Os.
fn measure(mode: Mode, ios: u64) -> f64 {
    let mut queue = IoQueue::new(mode, true);
    let mut rng = Rng::new(1);
    let mut in_flight: Vec<u64> = Vec::with_capacity(4 * DEPTH);
    let mut next_id = 0u64;
    let mut now = 0u64;
    let mut completed = 0u64;
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
        }
        now += 10_000;
        if in_flight.is_empty() {
            continue;
        }
        let index = rng.below(in_flight.len() as u64) as usize;
        let id = in_flight.swap_remove(index);
        completed += queue.complete(id, now).len() as u64;
    }
    started.elapsed().as_nanos() as f64 / completed as f64
}

pub fn run(ios: u64) -> anyhow::Result<String> {
    anyhow::ensure!(
        (1000..=100_000_000).contains(&ios),
        "--ios must be 1000..100000000"
    );
    let mut out = String::from("| mode | ns per I/O (enqueue + issue + complete) |\n|---|---:|\n");
    for mode in [Mode::Fifo, Mode::Zfs, Mode::Adaptive] {
        let _ = writeln!(out, "| {} | {:.0} |", mode.name(), measure(mode, ios));
    }
    Ok(out)
}
