//! Layout of volumes on devices. Today a volume sits on one whole device
//! (`SingleDevice`, a raw export); mirrored, checksummed pools implement
//! the same `Store` trait later, so the volume and server do not change.

pub mod advice;
pub mod create;
pub mod data_dir;
pub mod geometry;
pub mod holder;
pub mod import;
pub mod integrity;
pub mod label;
pub mod layout;
pub mod lifecycle;
pub mod list;
mod members;
pub mod mirror;
pub mod progress;
pub mod read_policy;
pub mod registry;
pub mod scan;
pub mod scrub;
pub mod service;
pub mod status;
pub mod takeover;
pub mod vacancy;
pub mod volume_table;
pub mod volumes;

use std::io;

use std::sync::Arc;

use crate::device::{AlignedBuf, Completion, DeviceOp, Extent, Outcome};
use crate::sched::{DeviceQueue, IoClass};

/// Called once per piece of a read answered in pieces, with the piece's
/// offset and length: together the pieces cover the read once each.
pub type PieceDone = Arc<dyn Fn(u64, u64, Outcome) + Send + Sync>;

/// What a volume needs to know about the storage beneath it.
#[derive(Clone, Debug)]
pub struct StoreInfo {
    pub size_bytes: u64,
    /// Offsets and lengths of every op must be multiples of this.
    pub block_bytes: u32,
    pub rotational: bool,
    /// Devices that serve its reads side by side: a mirror's copies, one
    /// for a single device.
    pub read_devices: u32,
    pub description: String,
}

/// Aligned block storage for one volume. Contract: `done` runs exactly
/// once; a read that completes `Ok` filled its whole buffer; a write with
/// `durable` is on stable storage when `done` runs; a `Flush` makes every
/// write completed before it durable.
pub trait Store: Send + Sync {
    fn info(&self) -> &StoreInfo;
    fn submit(&self, class: IoClass, op: DeviceOp, done: Completion);
    fn extents(&self, offset: u64, length: u64, extents_max: usize) -> io::Result<Vec<Extent>>;
    /// A client now waits for the read-ahead submitted over
    /// `[offset, offset + length)`: it is a client read from now on.
    fn promote(&self, _offset: u64, _length: u64) {}
    /// A client says it will read `[offset, offset + length)` soon
    /// (NBD_CMD_CACHE): a store that holds reads may read it now.
    fn prefetch(&self, _offset: u64, _length: u64) {}
    /// The length a large client read is best read in, as measured on the
    /// devices below (`DeviceQueue::read_piece_bytes`); None: whole.
    fn read_piece_bytes(&self) -> Option<u64> {
        None
    }
    /// A client read of `[offset, offset + length)`, answered in pieces as
    /// they land: at most `piece_bytes` each (a multiple of the block),
    /// or fewer and larger where a store holds the range already.
    fn read_in_pieces(&self, offset: u64, length: u64, piece_bytes: u64, landed: PieceDone) {
        read_each_piece(self, offset, length, piece_bytes, landed)
    }
}

/// Each piece of `[offset, offset + length)` as its own client read. Pieces
/// start at multiples of `piece_bytes`, so a store whose own units divide it
/// (a pool's stripe chunks) never reads one unit for two pieces.
pub fn read_each_piece<S: Store + ?Sized>(
    store: &S,
    offset: u64,
    length: u64,
    piece_bytes: u64,
    landed: PieceDone,
) {
    assert!(piece_bytes > 0, "pieces have a size");
    let end = offset + length;
    let mut at = offset;
    while at < end {
        let len = (piece_bytes - at % piece_bytes).min(end - at);
        let landed = Arc::clone(&landed);
        store.submit(
            IoClass::SyncRead,
            DeviceOp::Read {
                offset: at,
                buf: AlignedBuf::new(len as usize),
            },
            Box::new(move |outcome| landed(at, len, outcome)),
        );
        at += len;
    }
}

/// A volume that is a whole device, exported as is.
pub struct SingleDevice {
    queue: DeviceQueue,
    info: StoreInfo,
}

impl SingleDevice {
    pub fn new(queue: DeviceQueue) -> Self {
        let device = queue.device().info();
        let info = StoreInfo {
            size_bytes: device.size_bytes,
            block_bytes: device.logical_block_bytes,
            rotational: device.rotational,
            read_devices: 1,
            description: device.description.clone(),
        };
        SingleDevice { queue, info }
    }
}

impl Store for SingleDevice {
    fn info(&self) -> &StoreInfo {
        &self.info
    }

    fn submit(&self, class: IoClass, op: DeviceOp, done: Completion) {
        self.queue.submit(class, op, done)
    }

    fn promote(&self, offset: u64, length: u64) {
        self.queue.promote(offset, length)
    }

    fn read_piece_bytes(&self) -> Option<u64> {
        self.queue.read_piece_bytes()
    }

    fn extents(&self, offset: u64, length: u64, extents_max: usize) -> io::Result<Vec<Extent>> {
        self.queue.device().extents(offset, length, extents_max)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::device::mem::MemDevice;

    #[test]
    fn pieces_start_at_multiples_of_their_length_and_cover_the_read_once() {
        let store = SingleDevice::new(DeviceQueue::new(Arc::new(MemDevice::new(8 << 20))));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let landed: PieceDone = Arc::new(move |offset, length, outcome| {
            outcome.result.expect("read");
            assert_eq!(outcome.buf.expect("data").len() as u64, length);
            log.lock().unwrap().push((offset, length));
        });
        store.read_in_pieces(12 << 10, 3 << 20, 1 << 20, landed);
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_unstable();
        assert_eq!(
            seen,
            vec![
                (12 << 10, (1 << 20) - (12 << 10)),
                (1 << 20, 1 << 20),
                (2 << 20, 1 << 20),
                (3 << 20, 12 << 10)
            ]
        );
    }
}
