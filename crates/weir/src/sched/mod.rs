//! Per-device I/O queues. Every device I/O arrives here tagged with its
//! class. `DeviceQueue` (device_queue.rs) counts it and, unless its mode is
//! fifo, holds it in the sans-IO `IoQueue` (queue.rs) until the mode
//! (zfs.rs, adaptive.rs) lets it go to the device. docs/scheduler.md.

mod adaptive;
mod device_queue;
mod estimate;
pub use estimate::{Ewma, LinearCost};
mod floor;
pub mod queue;
pub mod wbt;
mod zfs;

#[cfg(test)]
mod tests;

pub use queue::{Dispatch, IoQueue, Mode, QueuedIo};

/// How many classes there are; per-class tables are arrays of this length.
pub const CLASSES: usize = IoClass::ALL.len();

/// Counters of one class, for iostat and /metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClassActivity {
    pub queued: usize,
    pub active: u32,
    /// Bytes of the class's I/Os at the device.
    pub active_bytes: u64,
}

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

pub use device_queue::{ClassCounters, DeviceQueue, LATENCY_BUCKETS};
