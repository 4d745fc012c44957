//! Writes and zeroing: every writable copy gets the data, the dirty-region
//! log covers it first, and checksums change in memory until the next flush.

use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

use super::io_ops::{run_all, write_op};
use super::{PoolData, CHUNK_BYTES, DATA_BLOCK_BYTES, LOCK_STRIPES, SUMS_PER_PAGE};
use crate::device::{AlignedBuf, DeviceOp};
use crate::pool::geometry::Piece;
use crate::pool::integrity::BlockSum;
use crate::sched::IoClass;

impl PoolData {
    /// The lock stripes covering `pieces`, in a deadlock-free order.
    pub(super) fn stripes(&self, pieces: &[Piece]) -> Vec<usize> {
        let mut stripes: Vec<usize> = pieces
            .iter()
            .flat_map(|p| {
                let first = p.data_offset / CHUNK_BYTES;
                let last = (p.data_offset + p.length - 1) / CHUNK_BYTES;
                (first..=last)
                    .map(move |c| ((c as usize) * self.stripe.groups + p.group) % LOCK_STRIPES)
            })
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes
    }

    fn regions_of(piece: &Piece) -> Vec<u64> {
        (piece.data_offset / CHUNK_BYTES..=(piece.data_offset + piece.length - 1) / CHUNK_BYTES)
            .collect()
    }

    /// Write `data` at `logical`; with `durable`, flush the groups it
    /// touched before returning (FUA).
    pub(super) fn write(&self, logical: u64, data: &[u8], durable: bool) -> io::Result<()> {
        let pieces = self.stripe.map(logical, data.len() as u64);
        let stripes = self.stripes(&pieces);
        let _guards: Vec<_> = stripes.iter().map(|&s| self.locks[s].write()).collect();
        self.announce(&pieces)?;
        // A client waits for every write (weir has no write-back cache), so
        // all are sync-write; async-write is for write-back.
        let class = IoClass::SyncWrite;
        let mut ops = Vec::new();
        let mut owners = Vec::new();
        for piece in &pieces {
            let bytes =
                &data[piece.range_offset as usize..(piece.range_offset + piece.length) as usize];
            for (m, member) in self.groups[piece.group].writable() {
                let offset = member.regions.data.0 + piece.data_offset;
                ops.push((Arc::clone(&member), class, write_op(offset, bytes, false)));
                owners.push((piece.group, m));
            }
        }
        let outcomes = run_all(ops);
        let mut written = Ok(());
        for group in self.touched_groups(&pieces) {
            let results = owners
                .iter()
                .zip(&outcomes)
                .filter(|((g, _), _)| *g == group)
                .map(|((_, m), o)| {
                    (
                        *m,
                        o.result
                            .as_ref()
                            .map(|_| ())
                            .map_err(|e| match e.raw_os_error() {
                                Some(errno) => io::Error::from_raw_os_error(errno),
                                None => io::Error::new(e.kind(), e.to_string()),
                            }),
                    )
                })
                .collect();
            if let Err(err) = self.settle_writes(group, results, "write") {
                written = Err(err);
            }
        }
        if written.is_err() {
            for piece in &pieces {
                let bytes = &data
                    [piece.range_offset as usize..(piece.range_offset + piece.length) as usize];
                self.settle_failed_blocks(piece, bytes);
            }
        }
        for piece in &pieces {
            let bytes =
                &data[piece.range_offset as usize..(piece.range_offset + piece.length) as usize];
            let mut state = self.groups[piece.group].state.lock();
            if written.is_ok() {
                for (i, block) in bytes.chunks(DATA_BLOCK_BYTES as usize).enumerate() {
                    let index = piece.data_offset / DATA_BLOCK_BYTES + i as u64;
                    state.sums[index as usize] = BlockSum::of(block);
                    state.dirty_pages.insert(index / SUMS_PER_PAGE);
                }
            }
            state.log.after_write(Self::regions_of(piece));
        }
        written?;
        if durable {
            for group in self.touched_groups(&pieces) {
                self.flush_group(group)?;
            }
        }
        Ok(())
    }

    /// Set the log bits of the regions `pieces` touch, durably where new.
    /// On failure the write is withdrawn from the log's accounting.
    fn announce(&self, pieces: &[Piece]) -> io::Result<()> {
        let mut newly: Vec<(usize, Vec<u64>, u64)> = Vec::new();
        for piece in pieces {
            let mut state = self.groups[piece.group].state.lock();
            let regions = state.log.before_write(Self::regions_of(piece));
            if !regions.is_empty() {
                state.log_version += 1;
                newly.push((piece.group, regions, state.log_version));
            }
        }
        for (group, regions, version) in newly {
            if let Err(err) = self.persist_log_bits(group, &regions, version) {
                for piece in pieces {
                    let mut state = self.groups[piece.group].state.lock();
                    state.log.after_write(Self::regions_of(piece));
                }
                return Err(err);
            }
        }
        Ok(())
    }

    /// After a write that failed on a copy that stays in service (its file
    /// system is full), each block it touched may hold the old or the new
    /// bytes on each copy, both legal after an error. The block's checksum
    /// becomes that of the new bytes if a copy holds them, else stays if a
    /// copy still matches it, else takes the first copy that reads, so the
    /// block reads back instead of failing everywhere; reads and the scrub
    /// heal the other copies. A copy holding neither old nor new bytes is
    /// corrupt and is never the source while another will do. The caller
    /// holds the chunks.
    fn settle_failed_blocks(&self, piece: &Piece, new: &[u8]) {
        let group = &self.groups[piece.group];
        let ops = group
            .readable()
            .into_iter()
            .map(|(_, member)| {
                let op = DeviceOp::Read {
                    offset: member.regions.data.0 + piece.data_offset,
                    buf: AlignedBuf::new(piece.length as usize),
                };
                (member, IoClass::SyncWrite, op)
            })
            .collect();
        let copies: Vec<AlignedBuf> = run_all(ops)
            .into_iter()
            .filter_map(|o| o.result.ok().and(o.buf))
            .collect();
        let block = DATA_BLOCK_BYTES as usize;
        let first = piece.data_offset / DATA_BLOCK_BYTES;
        let mut state = group.state.lock();
        for b in 0..(piece.length / DATA_BLOCK_BYTES) as usize {
            let index = first + b as u64;
            let sum = state.sums[index as usize];
            let range = b * block..(b + 1) * block;
            let held = |sum: BlockSum| {
                copies
                    .iter()
                    .any(|c| sum.verifies(&c.as_slice()[range.clone()]))
            };
            let written = BlockSum::of(&new[range.clone()]);
            // The new bytes where a copy took them: the copies that missed
            // them (out of space) are the ones repaired later.
            let settled = if held(written) {
                Some(written)
            } else if sum == BlockSum::Zero || held(sum) {
                None
            } else {
                copies.first().map(|c| BlockSum::of(&c.as_slice()[range]))
            };
            if let Some(sum) = settled {
                state.sums[index as usize] = sum;
                state.dirty_pages.insert(index / SUMS_PER_PAGE);
            }
        }
    }

    fn touched_groups(&self, pieces: &[Piece]) -> BTreeSet<usize> {
        pieces.iter().map(|p| p.group).collect()
    }

    /// Mark whole blocks as zero: no data I/O.
    pub(super) fn zero(&self, logical: u64, length: u64) -> io::Result<()> {
        let pieces = self.stripe.map(logical, length);
        let stripes = self.stripes(&pieces);
        let _guards: Vec<_> = stripes.iter().map(|&s| self.locks[s].write()).collect();
        self.announce(&pieces)?;
        for piece in &pieces {
            let mut state = self.groups[piece.group].state.lock();
            let first = piece.data_offset / DATA_BLOCK_BYTES;
            for index in first..first + piece.length / DATA_BLOCK_BYTES {
                state.sums[index as usize] = BlockSum::Zero;
                state.dirty_pages.insert(index / SUMS_PER_PAGE);
            }
            state.log.after_write(Self::regions_of(piece));
        }
        Ok(())
    }

    /// Per 4 KiB block of a logical range: whether it reads as zeroes.
    pub(super) fn zero_blocks(&self, logical: u64, length: u64) -> Vec<bool> {
        let mut out = Vec::new();
        for piece in self.stripe.map(logical, length) {
            let state = self.groups[piece.group].state.lock();
            let first = (piece.data_offset / DATA_BLOCK_BYTES) as usize;
            let count = (piece.length / DATA_BLOCK_BYTES) as usize;
            out.extend(
                state.sums[first..first + count]
                    .iter()
                    .map(|s| *s == BlockSum::Zero),
            );
        }
        out
    }
}
