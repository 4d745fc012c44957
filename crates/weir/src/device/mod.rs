//! Devices: where bytes finally land.
//!
//! ```text
//!   sched::DeviceQueue ──submit(op, done)──> dyn Device
//!                                             ├─ FileDevice  (O_DIRECT; io_uring engine, or threads as fallback)
//!                                             ├─ MemDevice   (sparse pages in RAM)
//!                                             ├─ ModelDevice (HDD / SSD / NVMe timing model over a store)
//!                                             └─ RbdDevice   (an RBD image in a Ceph cluster, through librbd)
//! ```
//!
//! A device executes aligned operations and calls `done` exactly once,
//! possibly on another thread. It knows nothing of NBD, volumes or classes.

pub mod buf;
mod fd_ops;
pub mod file;
pub mod mem;
pub mod model;
pub mod ownership;
pub mod rbd;
pub mod spec;
mod threads;
mod uring;
pub(crate) mod workers;

use std::io;

pub use buf::{AlignedBuf, WriteBuf};
pub use spec::{open, DeviceSpec, IoEngine};
pub use uring::{without_thread_ring, ThreadRing};

/// Static facts about a device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub size_bytes: u64,
    /// Every offset and length must be a multiple of this.
    pub logical_block_bytes: u32,
    pub rotational: bool,
    /// Human-readable origin, for logs ("file /x (io_uring, O_DIRECT)").
    pub description: String,
}

/// One aligned operation.
#[derive(Debug)]
pub enum DeviceOp {
    Read {
        offset: u64,
        buf: AlignedBuf,
    },
    /// `durable`: the data must be on stable storage when `done` runs.
    Write {
        offset: u64,
        buf: WriteBuf,
        durable: bool,
    },
    Flush,
    /// Forget the range; later reads return zeroes.
    Discard {
        offset: u64,
        length: u64,
    },
    /// Make the range read as zeroes without transferring data. Fails with
    /// EOPNOTSUPP where the device cannot; the caller then writes zeroes.
    WriteZeroes {
        offset: u64,
        length: u64,
        may_unmap: bool,
    },
}

impl DeviceOp {
    /// The byte range the op covers, for assertions and accounting.
    pub fn range(&self) -> (u64, u64) {
        match self {
            DeviceOp::Read { offset, buf } => (*offset, buf.len() as u64),
            DeviceOp::Write { offset, buf, .. } => (*offset, buf.len() as u64),
            DeviceOp::Flush => (0, 0),
            DeviceOp::Discard { offset, length } | DeviceOp::WriteZeroes { offset, length, .. } => {
                (*offset, *length)
            }
        }
    }

    /// Panics unless the op is aligned and inside the device: callers above
    /// must have validated and aligned it already.
    pub fn assert_valid(&self, info: &DeviceInfo) {
        let (offset, length) = self.range();
        let block = u64::from(info.logical_block_bytes);
        assert!(
            offset % block == 0 && length % block == 0,
            "unaligned device op {self:?}"
        );
        assert!(
            offset
                .checked_add(length)
                .is_some_and(|end| end <= info.size_bytes),
            "device op past end {self:?}"
        );
    }
}

/// The result of one op; reads hand their buffer back.
#[derive(Debug)]
pub struct Outcome {
    pub result: io::Result<()>,
    pub buf: Option<AlignedBuf>,
    /// A read found the whole range unallocated: it reads as zeroes.
    pub hole: bool,
}

impl Outcome {
    pub fn done(result: io::Result<()>) -> Self {
        Outcome {
            result,
            buf: None,
            hole: false,
        }
    }
}

pub type Completion = Box<dyn FnOnce(Outcome) + Send>;

/// An extent of the allocation map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    /// Unallocated (reads as zeroes, costs no space).
    pub hole: bool,
}

pub trait Device: Send + Sync {
    fn info(&self) -> &DeviceInfo;
    /// Start `op`; `done` runs once it finishes, on any thread.
    fn submit(&self, op: DeviceOp, done: Completion);
    /// The allocation map of `[offset, offset + length)`, at most
    /// `extents_max` entries; the last may stop short of the end.
    fn extents(&self, offset: u64, length: u64, extents_max: usize) -> io::Result<Vec<Extent>>;
    /// Allocate `[offset, offset + length)` without changing what it holds,
    /// so that writes there never fail for want of space (a sparse file on
    /// a file system that fills up). Devices with nothing to allocate
    /// succeed at once.
    fn reserve(&self, _offset: u64, _length: u64) -> io::Result<()> {
        Ok(())
    }
}

/// Run one op and wait for it, from a thread that owns no ring (the CLI,
/// pool administration). Not for the data path.
pub fn run_sync(device: &dyn Device, op: DeviceOp) -> Outcome {
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    without_thread_ring(|| {
        device.submit(op, Box::new(move |outcome| drop(sender.send(outcome))));
        receiver.recv().expect("devices complete every op")
    })
}

/// Append an extent, merging it with the previous one when alike.
pub(crate) fn push_extent(extents: &mut Vec<Extent>, length: u64, hole: bool) {
    if length == 0 {
        return;
    }
    match extents.last_mut() {
        Some(last) if last.hole == hole => last.length += length,
        _ => extents.push(Extent { length, hole }),
    }
}
