//! Per-device I/O queues. Every device I/O arrives here tagged with its
//! class; for now the queue passes it straight through (FIFO) and counts it.
//! The scheduler proper (class min/max active, latency feedback) slots in
//! here without changing the layers above or below.

mod adaptive;
pub mod queue;
mod zfs;

#[cfg(test)]
mod tests;

pub use queue::{Dispatch, IoQueue, Mode, QueuedIo};

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::device::{Completion, Device, DeviceOp};

/// Why an I/O is being done; it travels with the I/O to the device queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoClass {
    /// A client is waiting for this read.
    SyncRead,
    /// A client is waiting for this write (FUA, flush, or the write itself).
    SyncWrite,
    /// Readahead.
    AsyncRead,
    /// Writeback of buffered data.
    AsyncWrite,
    Scrub,
    Resilver,
    Trim,
}

impl IoClass {
    pub const ALL: [IoClass; 7] = [
        IoClass::SyncRead,
        IoClass::SyncWrite,
        IoClass::AsyncRead,
        IoClass::AsyncWrite,
        IoClass::Scrub,
        IoClass::Resilver,
        IoClass::Trim,
    ];

    pub fn name(self) -> &'static str {
        match self {
            IoClass::SyncRead => "sync-read",
            IoClass::SyncWrite => "sync-write",
            IoClass::AsyncRead => "async-read",
            IoClass::AsyncWrite => "async-write",
            IoClass::Scrub => "scrub",
            IoClass::Resilver => "resilver",
            IoClass::Trim => "trim",
        }
    }

    pub fn parse(name: &str) -> Option<IoClass> {
        IoClass::ALL.into_iter().find(|class| class.name() == name)
    }
}

/// Counters of one class on one device.
#[derive(Debug, Default)]
pub struct ClassCounters {
    pub ops: AtomicU64,
    pub bytes: AtomicU64,
    pub in_flight: AtomicU64,
    pub errors: AtomicU64,
}

/// The queue in front of one device.
pub struct DeviceQueue {
    device: Arc<dyn Device>,
    counters: Arc<[ClassCounters; IoClass::ALL.len()]>,
}

impl DeviceQueue {
    pub fn new(device: Arc<dyn Device>) -> Self {
        DeviceQueue {
            device,
            counters: Arc::new(Default::default()),
        }
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    pub fn counters(&self, class: IoClass) -> &ClassCounters {
        &self.counters[class as usize]
    }

    pub fn submit(&self, class: IoClass, op: DeviceOp, done: Completion) {
        let counters = Arc::clone(&self.counters);
        let this = &counters[class as usize];
        this.ops.fetch_add(1, Relaxed);
        this.bytes.fetch_add(op.range().1, Relaxed);
        this.in_flight.fetch_add(1, Relaxed);
        self.device.submit(
            op,
            Box::new(move |outcome| {
                let this = &counters[class as usize];
                this.in_flight.fetch_sub(1, Relaxed);
                if outcome.result.is_err() {
                    this.errors.fetch_add(1, Relaxed);
                }
                done(outcome)
            }),
        );
    }
}
