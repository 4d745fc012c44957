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
//! or a pool beneath it can complete on any thread. None of them waits:
//! a request that must wait for a lock or for one of its own steps
//! continues on the thread that releases the lock or completes the step,
//! so the connection thread goes on reading requests (and reaping its
//! ring, where those steps' I/O may be).

mod chain;

use std::io;
use std::sync::Arc;

use crate::device::{AlignedBuf, DeviceOp, Extent, Outcome};
use crate::pool::Store;
use crate::range_lock::RangeLocks;
use crate::sched::IoClass;

pub type Done<T> = Box<dyn FnOnce(io::Result<T>) + Send>;
/// Called once per piece of a read answered in pieces: the piece's offset
/// and length within the read, and its data.
pub type ReadPieceDone = Arc<dyn Fn(u64, u64, io::Result<ReadData>) + Send + Sync>;

/// Size of each plain write used when a store cannot zero a range itself.
const ZERO_WRITE_BYTES: u64 = 1 << 20;

/// What a read-modify-write puts into the blocks it read.
enum Patch {
    Data(AlignedBuf),
    Zeroes(usize),
}

impl Patch {
    fn len(&self) -> usize {
        match self {
            Patch::Data(data) => data.len(),
            Patch::Zeroes(len) => *len,
        }
    }

    fn apply(&self, into: &mut [u8]) {
        match self {
            Patch::Data(data) => into.copy_from_slice(data.as_slice()),
            Patch::Zeroes(_) => into.fill(0),
        }
    }
}

/// Steps that write zeroes over `[start, end)` in pieces of
/// `ZERO_WRITE_BYTES`, one after another.
fn zero_writes(store: &Arc<dyn Store>, start: u64, end: u64) -> Vec<chain::Step> {
    (start..end)
        .step_by(ZERO_WRITE_BYTES as usize)
        .map(|at| -> chain::Step {
            let store = Arc::clone(store);
            let length = (end - at).min(ZERO_WRITE_BYTES);
            Box::new(move |step_done| {
                let op = DeviceOp::Write {
                    offset: at,
                    buf: AlignedBuf::zeroed(length as usize).into(),
                    durable: false,
                };
                store.submit(
                    IoClass::SyncWrite,
                    op,
                    Box::new(move |outcome| step_done(outcome.result)),
                )
            })
        })
        .collect()
}

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

/// Clones share the store and the locks: they are the same volume, for
/// the steps of one request to hold on to.
#[derive(Clone)]
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

    /// The pieces a read of `length` bytes is best answered in, if more
    /// than one: the store's measured piece length, in whole blocks.
    pub fn read_piece_bytes(&self, length: u32) -> Option<u32> {
        let block = u64::from(self.store.info().block_bytes.max(1));
        let piece = self.store.read_piece_bytes()?.next_multiple_of(block);
        (u64::from(length) >= 2 * piece).then_some(piece as u32)
    }

    /// The client will read `[offset, offset + length)` soon: a volume that
    /// reads ahead may read it now (NBD_CMD_CACHE). Nothing waits for it.
    pub fn prefetch(&self, offset: u64, length: u64) {
        let (start, end) = self.widen(offset, length);
        self.store.prefetch(start, end - start);
    }

    /// Read `[offset, offset + length)` in pieces of at most `piece_bytes`
    /// (a multiple of the block), each answered as it lands with the part
    /// of the read it holds: `landed(offset, length, data)`.
    pub fn read_in_pieces(
        &self,
        offset: u64,
        length: u32,
        piece_bytes: u32,
        landed: ReadPieceDone,
    ) {
        let (start, end) = self.widen(offset, u64::from(length));
        let read_end = offset + u64::from(length);
        self.store.read_in_pieces(
            start,
            end - start,
            u64::from(piece_bytes),
            Arc::new(move |at, bytes, outcome| {
                // The client's part of this piece: the widened edges are not.
                let from = offset.max(at);
                let to = read_end.min(at + bytes);
                let data = outcome.result.map(|()| ReadData {
                    buf: outcome.buf.expect("reads return their buffer"),
                    start: (from - at) as usize,
                    len: (to - from) as usize,
                    hole: outcome.hole,
                });
                landed(from, to - from, data)
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
            let op = DeviceOp::Write {
                offset,
                buf: data.into(),
                durable: fua,
            };
            self.locked_op(start, end, IoClass::SyncWrite, op)(done);
        } else {
            self.read_modify_write(offset, Patch::Data(data), fua, done);
        }
    }

    /// Patch part of the blocks around `offset`: read them whole, patch,
    /// write them back, holding them exclusively from the read to the end
    /// of the write.
    fn read_modify_write(&self, offset: u64, patch: Patch, fua: bool, done: Done<()>) {
        let (start, end) = self.widen(offset, patch.len() as u64);
        let at = (offset - start) as usize;
        let store = Arc::clone(&self.store);
        self.locks.lock_then(
            start,
            end,
            true,
            Box::new(move |guard| {
                let read = DeviceOp::Read {
                    offset: start,
                    buf: AlignedBuf::new((end - start) as usize),
                };
                let reader = Arc::clone(&store);
                reader.submit(
                    IoClass::SyncWrite,
                    read,
                    Box::new(move |outcome| {
                        if let Err(err) = outcome.result {
                            drop(guard);
                            return done(Err(err));
                        }
                        let mut buf = outcome.buf.expect("reads return their buffer");
                        patch.apply(&mut buf.as_mut_slice()[at..at + patch.len()]);
                        let write = DeviceOp::Write {
                            offset: start,
                            buf: buf.into(),
                            durable: fua,
                        };
                        let answer = Box::new(move |outcome: Outcome| {
                            drop(guard);
                            done(outcome.result)
                        });
                        store.submit(IoClass::SyncWrite, write, answer);
                    }),
                );
            }),
        );
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
        let mut steps = Vec::new();
        if start < end {
            let op = DeviceOp::Discard {
                offset: start,
                length: end - start,
            };
            steps.push(self.locked_op(start, end, IoClass::Trim, op));
        }
        steps.extend(self.flush_step(fua));
        chain::run(steps, done);
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
        let block = self.block();
        let end = offset + u64::from(length);
        let inner_start = offset.next_multiple_of(block).min(end);
        let inner_end = (end / block * block).max(inner_start);
        let mut steps = Vec::new();
        if inner_start < inner_end {
            steps.push(self.zero_inner(inner_start, inner_end, may_trim, fast_only));
        }
        for (edge_start, edge_end) in [(offset, inner_start), (inner_end, end)] {
            if edge_start < edge_end {
                let edge = self.clone();
                steps.push(Box::new(move |step_done| {
                    let zeroes = Patch::Zeroes((edge_end - edge_start) as usize);
                    edge.read_modify_write(edge_start, zeroes, false, step_done)
                }));
            }
        }
        steps.extend(self.flush_step(fua));
        chain::run(steps, done);
    }

    /// Zero whole blocks `[start, end)` with the store's own zeroing, or
    /// with plain writes of zeroes where it has none (unless `fast_only`).
    fn zero_inner(&self, start: u64, end: u64, may_trim: bool, fast_only: bool) -> chain::Step {
        self.holding(start, end, move |store, done| {
            let op = DeviceOp::WriteZeroes {
                offset: start,
                length: end - start,
                may_unmap: may_trim,
            };
            let writer = Arc::clone(&store);
            writer.submit(
                IoClass::SyncWrite,
                op,
                Box::new(move |outcome| match outcome.result {
                    Err(err) if err.raw_os_error() == Some(libc::EOPNOTSUPP) && !fast_only => {
                        chain::run(zero_writes(&store, start, end), done)
                    }
                    result => done(result),
                }),
            );
        })
    }

    /// A step that holds `[start, end)` shared while `op` runs.
    fn locked_op(&self, start: u64, end: u64, class: IoClass, op: DeviceOp) -> chain::Step {
        self.holding(start, end, move |store, done| {
            store.submit(class, op, Box::new(move |outcome| done(outcome.result)))
        })
    }

    /// A step that holds `[start, end)` shared from when it gets the range
    /// until `body` calls its callback.
    fn holding(
        &self,
        start: u64,
        end: u64,
        body: impl FnOnce(Arc<dyn Store>, Done<()>) + Send + 'static,
    ) -> chain::Step {
        let store = Arc::clone(&self.store);
        let locks = Arc::clone(&self.locks);
        Box::new(move |step_done| {
            locks.lock_then(
                start,
                end,
                false,
                Box::new(move |guard| {
                    body(
                        store,
                        Box::new(move |result| {
                            drop(guard);
                            step_done(result)
                        }),
                    )
                }),
            );
        })
    }

    /// A flush as the last step of a FUA request.
    fn flush_step(&self, fua: bool) -> Option<chain::Step> {
        let store = Arc::clone(&self.store);
        fua.then(|| -> chain::Step {
            Box::new(move |step_done| {
                store.submit(
                    IoClass::SyncWrite,
                    DeviceOp::Flush,
                    Box::new(move |outcome| step_done(outcome.result)),
                )
            })
        })
    }

    /// Allocation map of the range, at most `extents_max` extents.
    pub fn extents(&self, offset: u64, length: u32, extents_max: usize) -> io::Result<Vec<Extent>> {
        self.store.extents(offset, u64::from(length), extents_max)
    }
}

#[cfg(test)]
mod tests;
