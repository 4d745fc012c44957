//! An exported block device. The volume turns byte-granular client
//! requests into aligned store operations:
//!
//! ```text
//!   read  [off, len)  ──> aligned read of the covering blocks, reply from inside it
//!   write aligned     ──> shared range lock ──> store write (durable if FUA)
//!   write unaligned   ──> exclusive range lock ──> read blocks, patch, write back
//!   trim              ──> discard of the whole blocks inside the range
//!   write zeroes      ──> store zeroing for whole blocks, RMW for the edges,
//!                         plain zero writes if the store cannot (unless FAST_ZERO)
//! ```
//!
//! Every method reports through a callback so that a volume with caching
//! or a pool beneath it can complete on any thread.

mod range_lock;

use std::io;
use std::sync::{mpsc, Arc};

use crate::device::{self, AlignedBuf, DeviceOp, Extent, Outcome};
use crate::pool::Store;
use crate::sched::IoClass;
use range_lock::RangeLocks;

pub type Done<T> = Box<dyn FnOnce(io::Result<T>) + Send>;

/// Size of each plain write used when a store cannot zero a range itself.
const ZERO_WRITE_BYTES: u64 = 1 << 20;

/// The bytes of a completed read: `buf[start..start + len]`.
#[derive(Debug)]
pub struct ReadData {
    pub buf: AlignedBuf,
    pub start: usize,
    pub len: usize,
    /// The range is unallocated and reads as zeroes.
    pub hole: bool,
}

impl ReadData {
    pub fn bytes(&self) -> &[u8] {
        &self.buf.as_slice()[self.start..self.start + self.len]
    }
}

/// What the server may advertise for this volume.
#[derive(Clone, Copy, Debug)]
pub struct VolumeCaps {
    pub read_only: bool,
    pub rotational: bool,
}

pub struct Volume {
    store: Arc<dyn Store>,
    read_only: bool,
    locks: Arc<RangeLocks>,
}

impl Volume {
    pub fn new(store: Arc<dyn Store>, read_only: bool) -> Volume {
        Volume {
            store,
            read_only,
            locks: Arc::default(),
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.store.info().size_bytes
    }

    pub fn description(&self) -> &str {
        &self.store.info().description
    }

    pub fn caps(&self) -> VolumeCaps {
        VolumeCaps {
            read_only: self.read_only,
            rotational: self.store.info().rotational,
        }
    }

    fn block(&self) -> u64 {
        u64::from(self.store.info().block_bytes)
    }

    /// `[start, end)` widened to whole blocks.
    fn widen(&self, offset: u64, length: u64) -> (u64, u64) {
        let block = self.block();
        (
            offset - offset % block,
            (offset + length).next_multiple_of(block),
        )
    }

    /// Run one store op and wait for it (slow paths only).
    fn submit_and_wait(&self, class: IoClass, op: DeviceOp) -> Outcome {
        let (tx, rx) = mpsc::sync_channel(1);
        // This thread sleeps until the op is done, so it must not be the
        // one expected to reap it.
        device::without_thread_ring(|| {
            self.store
                .submit(class, op, Box::new(move |outcome| drop(tx.send(outcome))));
            rx.recv().expect("store dropped a completion")
        })
    }

    pub fn read(&self, offset: u64, length: u32, done: Done<ReadData>) {
        let (start, end) = self.widen(offset, u64::from(length));
        let buf = AlignedBuf::new((end - start) as usize);
        let skip = (offset - start) as usize;
        let op = DeviceOp::Read { offset: start, buf };
        self.store.submit(
            IoClass::SyncRead,
            op,
            Box::new(move |outcome| {
                done(outcome.result.map(|()| ReadData {
                    buf: outcome.buf.expect("reads return their buffer"),
                    start: skip,
                    len: length as usize,
                    hole: outcome.hole,
                }))
            }),
        );
    }

    /// Write `data` at `offset`; with `fua` it is durable before `done`.
    pub fn write(&self, offset: u64, data: AlignedBuf, fua: bool, done: Done<()>) {
        assert!(
            !self.read_only,
            "writes to read-only volumes are rejected at the edge"
        );
        let (start, end) = self.widen(offset, data.len() as u64);
        if start == offset && end == offset + data.len() as u64 {
            let guard = self.locks.lock(start, end, false);
            let op = DeviceOp::Write {
                offset,
                buf: data,
                durable: fua,
            };
            self.store.submit(
                IoClass::SyncWrite,
                op,
                Box::new(move |outcome| {
                    drop(guard);
                    done(outcome.result)
                }),
            );
        } else {
            // Slow path: it sleeps on a lock and on its ops.
            done(device::without_thread_ring(|| {
                self.read_modify_write(offset, data.as_slice(), fua)
            }));
        }
    }

    fn read_modify_write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let (start, end) = self.widen(offset, data.len() as u64);
        let _guard = self.locks.lock(start, end, true);
        let outcome = self.submit_and_wait(
            IoClass::SyncWrite,
            DeviceOp::Read {
                offset: start,
                buf: AlignedBuf::new((end - start) as usize),
            },
        );
        outcome.result?;
        let mut buf = outcome.buf.expect("reads return their buffer");
        let at = (offset - start) as usize;
        buf.as_mut_slice()[at..at + data.len()].copy_from_slice(data);
        self.submit_and_wait(
            IoClass::SyncWrite,
            DeviceOp::Write {
                offset: start,
                buf,
                durable: fua,
            },
        )
        .result
    }

    pub fn flush(&self, done: Done<()>) {
        self.store.submit(
            IoClass::SyncWrite,
            DeviceOp::Flush,
            Box::new(move |outcome| done(outcome.result)),
        );
    }

    /// Forget whole blocks inside the range. Partial blocks at the edges
    /// keep their data: trim is advisory.
    pub fn trim(&self, offset: u64, length: u32, fua: bool, done: Done<()>) {
        assert!(
            !self.read_only,
            "trims of read-only volumes are rejected at the edge"
        );
        let block = self.block();
        let start = offset.next_multiple_of(block);
        let end = (offset + u64::from(length)) / block * block;
        let result = if start < end {
            let _guard = self.locks.lock(start, end, false);
            self.submit_and_wait(
                IoClass::Trim,
                DeviceOp::Discard {
                    offset: start,
                    length: end - start,
                },
            )
            .result
        } else {
            Ok(())
        };
        done(result.and_then(|()| self.flush_if(fua)))
    }

    /// Make the range read as zeroes. `may_trim` allows deallocating it;
    /// `fast_only` fails with ENOTSUP rather than writing zeroes slowly.
    pub fn write_zeroes(
        &self,
        offset: u64,
        length: u32,
        fua: bool,
        may_trim: bool,
        fast_only: bool,
        done: Done<()>,
    ) {
        assert!(
            !self.read_only,
            "zeroing read-only volumes is rejected at the edge"
        );
        done(device::without_thread_ring(|| {
            self.zero_range(offset, u64::from(length), may_trim, fast_only)
                .and_then(|()| self.flush_if(fua))
        }))
    }

    fn zero_range(
        &self,
        offset: u64,
        length: u64,
        may_trim: bool,
        fast_only: bool,
    ) -> io::Result<()> {
        let block = self.block();
        let end = offset + length;
        let inner_start = offset.next_multiple_of(block).min(end);
        let inner_end = (end / block * block).max(inner_start);
        if inner_start < inner_end {
            let _guard = self.locks.lock(inner_start, inner_end, false);
            let op = DeviceOp::WriteZeroes {
                offset: inner_start,
                length: inner_end - inner_start,
                may_unmap: may_trim,
            };
            match self.submit_and_wait(IoClass::SyncWrite, op).result {
                Ok(()) => {}
                Err(err) if err.raw_os_error() == Some(libc::EOPNOTSUPP) && !fast_only => {
                    self.write_zero_buffers(inner_start, inner_end)?
                }
                Err(err) => return Err(err),
            }
        }
        for (edge_start, edge_end) in [(offset, inner_start), (inner_end, end)] {
            if edge_start < edge_end {
                self.read_modify_write(
                    edge_start,
                    &vec![0u8; (edge_end - edge_start) as usize],
                    false,
                )?;
            }
        }
        Ok(())
    }

    fn write_zero_buffers(&self, start: u64, end: u64) -> io::Result<()> {
        let mut at = start;
        while at < end {
            let chunk = (end - at).min(ZERO_WRITE_BYTES);
            let op = DeviceOp::Write {
                offset: at,
                buf: AlignedBuf::zeroed(chunk as usize),
                durable: false,
            };
            self.submit_and_wait(IoClass::SyncWrite, op).result?;
            at += chunk;
        }
        Ok(())
    }

    fn flush_if(&self, fua: bool) -> io::Result<()> {
        if fua {
            self.submit_and_wait(IoClass::SyncWrite, DeviceOp::Flush)
                .result
        } else {
            Ok(())
        }
    }

    /// Allocation map of the range, at most `extents_max` extents.
    pub fn extents(&self, offset: u64, length: u32, extents_max: usize) -> io::Result<Vec<Extent>> {
        self.store.extents(offset, u64::from(length), extents_max)
    }
}

#[cfg(test)]
mod tests;
