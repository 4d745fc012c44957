//! The real-time driver: each job gets its own NBD connections (one, or
//! `conns=N` with consecutive requests sent round-robin over them), a
//! sender thread that keeps `qd` requests in flight (or sends Poisson
//! arrivals on an absolute schedule) and a receiver thread per connection
//! that times the replies.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use parking_lot::{Condvar, Mutex};
use weir_nbd::consts::{CMD_DISC, CMD_FLUSH, CMD_READ, CMD_TRIM, CMD_WRITE};

use super::nbd_client::{self, request_header, Socket};
use crate::device::model::{IoKind, Nanos};
use crate::sim::StreamResult;
use crate::stats::LatencyStats;
use crate::workload::{Generator, JobSpec};

/// How long to wait for replies still in flight when a job stops.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

struct Flight {
    /// handle -> (arrived, bytes, read)
    pending: HashMap<u64, (Nanos, u64, bool)>,
    /// With think time: when each freed slot may be used again.
    slot_ready_at: std::collections::VecDeque<Nanos>,
    result: StreamResult,
    receiver_failed: Option<String>,
}

struct Shared {
    flight: Mutex<Flight>,
    slot_freed: Condvar,
    epoch: Instant,
    stop: Nanos,
}

impl Shared {
    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }
}

pub fn run(
    uri: &str,
    jobs: &[JobSpec],
    duration: Nanos,
    seed: u64,
) -> anyhow::Result<Vec<StreamResult>> {
    let mut connections = Vec::new();
    for job in jobs {
        let mut sockets = Vec::new();
        let mut size_bytes = u64::MAX;
        for _ in 0..job.connections() {
            let connection = nbd_client::connect(uri)?;
            size_bytes = size_bytes.min(connection.size_bytes);
            sockets.push(connection.socket);
        }
        let generator =
            Generator::new(job.clone(), size_bytes, seed).map_err(anyhow::Error::msg)?;
        connections.push((sockets, generator));
    }
    let epoch = Instant::now();
    let mut threads = Vec::new();
    let mut shared_all = Vec::new();
    for (sockets, generator) in connections {
        let job = generator.job().clone();
        let stop = job.stop_ns().unwrap_or(duration).min(duration);
        let shared = Arc::new(Shared {
            flight: Mutex::new(Flight {
                pending: HashMap::new(),
                slot_ready_at: Default::default(),
                result: StreamResult {
                    active_ns: stop.saturating_sub(job.start_ns()),
                    job,
                    ops: 0,
                    bytes: 0,
                    errors: 0,
                    latency: LatencyStats::default(),
                    latency_over_time: Vec::new(),
                },
                receiver_failed: None,
            }),
            slot_freed: Condvar::new(),
            epoch,
            stop,
        });
        for socket in &sockets {
            let reader = socket.try_clone().context("cannot clone the socket")?;
            let receiver_shared = Arc::clone(&shared);
            threads.push(std::thread::spawn(move || {
                receive(reader, &receiver_shared)
            }));
        }
        let sender_shared = Arc::clone(&shared);
        threads.push(std::thread::spawn(move || {
            send(sockets, generator, &sender_shared)
        }));
        shared_all.push(shared);
    }
    for thread in threads {
        let _ = thread.join();
    }
    let mut results = Vec::new();
    for shared in shared_all {
        let mut flight = shared.flight.lock();
        if let Some(reason) = flight.receiver_failed.take() {
            anyhow::bail!("job {}: {reason}", flight.result.job.name);
        }
        results.push(flight.result.clone());
    }
    Ok(results)
}

fn sleep_until(shared: &Shared, at: Nanos) {
    let now = shared.now();
    if at > now {
        std::thread::sleep(Duration::from_nanos(at - now));
    }
}

/// Sends the job's requests, each on the next of `sockets`.
fn send(mut sockets: Vec<Socket>, mut generator: Generator, shared: &Shared) {
    let job = generator.job().clone();
    let payload = vec![0x5au8; job.bs as usize];
    sleep_until(shared, job.start_ns());
    let mut next_arrival = shared.now();
    let mut handle = 0u64;
    loop {
        let arrived = match generator.next_gap_ns() {
            Some(gap) => {
                next_arrival += gap;
                sleep_until(shared, next_arrival);
                next_arrival
            }
            None => shared.now(),
        };
        if arrived >= shared.stop {
            break;
        }
        {
            let mut flight = shared.flight.lock();
            while flight.pending.len() >= job.qd as usize && flight.receiver_failed.is_none() {
                shared.slot_freed.wait(&mut flight);
            }
            if flight.receiver_failed.is_some() {
                return;
            }
            // Think time: the freed slot waits; only this thread fills slots.
            if let Some(ready_at) = flight.slot_ready_at.pop_front() {
                drop(flight);
                sleep_until(shared, ready_at);
                if shared.now() >= shared.stop {
                    break;
                }
                flight = shared.flight.lock();
            }
            let arrived = if job.rate_per_sec.is_some() {
                arrived
            } else {
                shared.now()
            };
            let (kind, offset, length) = generator.next_io();
            handle += 1;
            flight
                .pending
                .insert(handle, (arrived, length, kind == IoKind::Read));
            drop(flight);
            let command = match kind {
                IoKind::Read => CMD_READ,
                IoKind::Write => CMD_WRITE,
                IoKind::Flush => CMD_FLUSH,
                IoKind::Discard => CMD_TRIM,
            };
            let header = request_header(command, handle, offset, length as u32);
            let turn = handle as usize % sockets.len();
            let socket = &mut sockets[turn];
            let sent = socket.write_all(&header).and_then(|()| {
                if kind == IoKind::Write {
                    socket.write_all(&payload[..length as usize])
                } else {
                    Ok(())
                }
            });
            if sent.is_err() {
                return;
            }
        }
    }
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let mut flight = shared.flight.lock();
    while !flight.pending.is_empty() && flight.receiver_failed.is_none() {
        if shared
            .slot_freed
            .wait_until(&mut flight, deadline)
            .timed_out()
        {
            break;
        }
    }
    drop(flight);
    for mut socket in sockets {
        let _ = socket.write_all(&request_header(CMD_DISC, 0, 0, 0));
        socket.shutdown();
    }
}

fn receive(mut socket: Socket, shared: &Shared) {
    let mut sink = vec![0u8; 1 << 20];
    loop {
        let (error, handle) = match nbd_client::read_reply(&mut socket) {
            Ok(reply) => reply,
            Err(err) => {
                let mut flight = shared.flight.lock();
                if !flight.pending.is_empty() {
                    flight.receiver_failed =
                        Some(format!("connection lost with requests in flight: {err}"));
                }
                shared.slot_freed.notify_all();
                return;
            }
        };
        let entry = shared.flight.lock().pending.get(&handle).copied();
        let Some((arrived, bytes, read)) = entry else {
            shared.flight.lock().receiver_failed =
                Some(format!("reply for unknown handle {handle}"));
            shared.slot_freed.notify_all();
            return;
        };
        if read && error == 0 {
            let mut left = bytes as usize;
            while left > 0 {
                let take = left.min(sink.len());
                if socket.read_exact(&mut sink[..take]).is_err() {
                    shared.flight.lock().receiver_failed = Some("connection lost mid-reply".into());
                    shared.slot_freed.notify_all();
                    return;
                }
                left -= take;
            }
        }
        let now = shared.now();
        let mut flight = shared.flight.lock();
        flight.pending.remove(&handle);
        let think = flight.result.job.think_ns();
        if think > 0 {
            flight.slot_ready_at.push_back(now + think);
        }
        if now <= shared.stop {
            if error == 0 {
                flight.result.ops += 1;
                flight.result.bytes += bytes;
                flight.result.latency.record(now - arrived);
            } else {
                flight.result.errors += 1;
            }
        }
        drop(flight);
        shared.slot_freed.notify_all();
    }
}
