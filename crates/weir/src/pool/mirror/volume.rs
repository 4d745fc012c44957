//! One volume of an opened pool, as the server's volume layer sees it: a
//! run of the pool's logical space.

use std::io;
use std::sync::Arc;

use super::read::{requester, ReadSource};
use super::{PoolData, DATA_BLOCK_BYTES};
use crate::device::{Completion, DeviceOp, Extent};
use crate::pool::geometry::CHUNK_BYTES;
use crate::pool::volume_table::VolumeEntry;
use crate::pool::{Store, StoreInfo};
use crate::sched::IoClass;

pub struct PoolVolume {
    pool: Arc<PoolData>,
    first_byte: u64,
    info: StoreInfo,
}

impl PoolVolume {
    pub fn new(pool: Arc<PoolData>, entry: &VolumeEntry) -> io::Result<PoolVolume> {
        let info = StoreInfo {
            size_bytes: entry.size_bytes,
            block_bytes: entry.block_bytes,
            rotational: pool.rotational,
            read_devices: pool.devices(),
            description: format!("pool {} volume {}", pool.name, entry.name),
        };
        Ok(PoolVolume {
            first_byte: entry.first_chunk * CHUNK_BYTES,
            pool,
            info,
        })
    }
}

impl Store for PoolVolume {
    fn info(&self) -> &StoreInfo {
        &self.info
    }

    fn submit(&self, class: IoClass, op: DeviceOp, done: Completion) {
        let (offset, length) = op.range();
        assert!(
            offset + length <= self.info.size_bytes,
            "op past the volume: {op:?}"
        );
        let at = self.first_byte + offset;
        match op {
            DeviceOp::Read { buf, .. } if class == IoClass::SyncRead => {
                self.pool.read_client(at, buf, done)
            }
            DeviceOp::Read { buf, .. } => {
                let source = ReadSource::Client {
                    requester: requester(),
                };
                self.pool.read_submit(at, buf, class, source, done)
            }
            DeviceOp::Write { buf, durable, .. } => {
                self.pool.write_submit(at, buf, durable, class, done)
            }
            DeviceOp::Discard { length, .. } | DeviceOp::WriteZeroes { length, .. } => {
                self.pool.zero_submit(at, length, class, done)
            }
            DeviceOp::Flush => self.pool.flush_submit(done),
        }
    }

    fn promote(&self, offset: u64, length: u64) {
        self.pool.promote(self.first_byte + offset, length)
    }

    fn read_piece_bytes(&self) -> Option<u64> {
        self.pool.read_piece_bytes()
    }

    fn extents(&self, offset: u64, length: u64, extents_max: usize) -> io::Result<Vec<Extent>> {
        let start = offset / DATA_BLOCK_BYTES * DATA_BLOCK_BYTES;
        let end = (offset + length)
            .next_multiple_of(DATA_BLOCK_BYTES)
            .min(self.info.size_bytes);
        let zeros = self.pool.zero_blocks(self.first_byte + start, end - start);
        let mut extents = Vec::new();
        let mut left = length;
        for (i, zero) in zeros.iter().enumerate() {
            let block_start = start + i as u64 * DATA_BLOCK_BYTES;
            let piece =
                (block_start + DATA_BLOCK_BYTES).min(offset + length) - block_start.max(offset);
            let piece = piece.min(left);
            crate::device::push_extent(&mut extents, piece, *zero);
            left -= piece;
            if extents.len() > extents_max {
                break;
            }
        }
        extents.truncate(extents_max);
        Ok(extents)
    }
}
