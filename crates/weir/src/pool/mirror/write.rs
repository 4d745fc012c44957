//! Writes and zeroing, as state machines that never wait on a thread:
//!
//! ```text
//!  submit (caller's thread): checksums of the new blocks
//!    └─> hold the blocks (range lock; granted now, or on the releasing thread)
//!         └─> log bits: already durable ──────────────┐
//!             newly dirty: made durable (slow path) ───┤
//!                                                       v
//!             data to every writable copy at once ─> last completion, wherever it
//!             lands: checksums in memory, release the blocks, answer (FUA: flush
//!             the groups first)
//! ```
//!
//! A newly dirty log bit joins the group's log queue (log_commit.rs) and
//! the write continues in that queue's completion. Only two rare steps
//! block, on the pool's worker threads: a flush for FUA (flush_queue.rs)
//! and settling a write that failed on a copy.

use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use super::io_ops::run_all;
#[cfg(any(test, feature = "fuzzing"))]
use super::io_ops::wait;
use super::log_commit::{LogDone, LOG_BITS_PER_PAGE};
use super::{PoolData, BLOCKS_PER_CHUNK, CHUNK_BYTES, DATA_BLOCK_BYTES, SUMS_PER_PAGE};
use crate::device::{AlignedBuf, Completion, DeviceOp, Outcome, WriteBuf};
use crate::pool::geometry::Piece;
use crate::pool::integrity::BlockSum;
use crate::range_lock::ShardedGuard;
use crate::sched::IoClass;

/// Regions a sequential writer's log bits are set ahead of it (see
/// `DirtyLog::mark_ahead`): one durable log write per 8 MiB of a stream
/// rather than per 1 MiB region, and at most 8 MiB more to recover per
/// stream after a crash.
const LOG_AHEAD_REGIONS: u64 = 8;

/// Log bits a write set that were clear: (group, regions, log version).
type Announced = Vec<(usize, Vec<u64>, u64)>;

/// A write whose data is on its way to the copies.
struct WriteInFlight {
    pool: Arc<PoolData>,
    pieces: Vec<Piece>,
    /// Per piece, the checksum of each of its blocks.
    sums: Vec<Vec<BlockSum>>,
    durable: bool,
    /// A client waiting on the write is sync-write; write-back from a
    /// cache is async-write, below client I/O in the device queues.
    class: IoClass,
    blocks: ShardedGuard,
    done: Completion,
}

/// The device writes of one pool write, counted down as they complete.
struct Countdown {
    /// (group, member, result) of each completed device write.
    results: Vec<(usize, usize, io::Result<()>)>,
    write: Option<WriteInFlight>,
}

impl PoolData {
    /// The range of lock keys covering `pieces`. A key is a 4 KiB block
    /// of logical space, so the pieces of one request are one range and
    /// only requests to the same blocks wait for each other.
    pub(super) fn block_keys(&self, pieces: &[Piece]) -> (u64, u64) {
        let groups = self.stripe.groups as u64;
        let (mut low, mut high) = (u64::MAX, 0);
        for p in pieces {
            let logical_chunk = p.data_offset / CHUNK_BYTES * groups + p.group as u64;
            let first =
                logical_chunk * BLOCKS_PER_CHUNK + p.data_offset % CHUNK_BYTES / DATA_BLOCK_BYTES;
            low = low.min(first);
            high = high.max(first + p.length.div_ceil(DATA_BLOCK_BYTES));
        }
        (low, high)
    }

    /// Hold the blocks `pieces` cover (`exclusive` for writes), then run
    /// `then`: now, or on the thread that releases them.
    pub(super) fn hold_blocks(
        self: &Arc<Self>,
        pieces: &[Piece],
        exclusive: bool,
        then: impl FnOnce(Arc<Self>, ShardedGuard) + Send + 'static,
    ) {
        let (start, end) = self.block_keys(pieces);
        let pool = Arc::clone(self);
        self.locks.lock_then(
            start,
            end,
            exclusive,
            Box::new(move |held| then(pool, held)),
        );
    }

    /// The lock keys of one chunk of one group.
    pub(super) fn chunk_keys(&self, group: usize, chunk: u64) -> (u64, u64) {
        let first = (chunk * self.stripe.groups as u64 + group as u64) * BLOCKS_PER_CHUNK;
        (first, first + BLOCKS_PER_CHUNK)
    }

    fn regions_of(piece: &Piece) -> Vec<u64> {
        (piece.data_offset / CHUNK_BYTES..=(piece.data_offset + piece.length - 1) / CHUNK_BYTES)
            .collect()
    }

    /// Write `buf` at `logical` and run `done` once every writable copy
    /// has it (with `durable`, once it is on stable storage: FUA). The
    /// caller's thread computes the checksums and submits; the rest runs
    /// where the blocks are released or the device writes complete.
    pub(super) fn write_submit(
        self: &Arc<Self>,
        logical: u64,
        buf: WriteBuf,
        durable: bool,
        class: IoClass,
        done: Completion,
    ) {
        let pieces = self.stripe.map(logical, buf.len() as u64);
        let sums: Vec<Vec<BlockSum>> = pieces
            .iter()
            .map(|p| {
                let bytes =
                    &buf.as_slice()[p.range_offset as usize..(p.range_offset + p.length) as usize];
                bytes
                    .chunks(DATA_BLOCK_BYTES as usize)
                    .map(BlockSum::of)
                    .collect()
            })
            .collect();
        self.hold_blocks(&pieces.clone(), true, move |pool, blocks| {
            let write = WriteInFlight {
                pool,
                pieces,
                sums,
                durable,
                class,
                blocks,
                done,
            };
            write.announce_then_submit(buf);
        });
    }

    /// Write and wait: for tests and for callers off the data path.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(super) fn write(
        self: &Arc<Self>,
        logical: u64,
        data: &[u8],
        durable: bool,
    ) -> io::Result<()> {
        self.write_as(logical, data, durable, IoClass::SyncWrite)
    }

    /// Write in `class` and wait: for tests.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(super) fn write_as(
        self: &Arc<Self>,
        logical: u64,
        data: &[u8],
        durable: bool,
        class: IoClass,
    ) -> io::Result<()> {
        let mut buf = AlignedBuf::new(data.len());
        buf.as_mut_slice().copy_from_slice(data);
        wait(|done| self.write_submit(logical, buf.into(), durable, class, done)).result
    }

    /// Set the log bits of the regions `pieces` touch. The ones that were
    /// clear, and the ones another write set whose image is not durable
    /// yet, must be on disk (`persist_announced`) before data moves: a
    /// crash must never find new data in a region its log does not name.
    fn log_before_write(&self, pieces: &[Piece]) -> Announced {
        let mut newly = Vec::new();
        for piece in pieces {
            let mut state = self.groups[piece.group].state.lock();
            let touched = Self::regions_of(piece);
            let mut regions = state.log.before_write(touched.iter().copied());
            // Bits another write set may still be on their way to disk:
            // this write also waits for the image that carries them.
            let pending = touched
                .iter()
                .filter(|region| !regions.contains(region))
                .filter_map(|region| {
                    let set_at = *state.bit_versions.get(region)?;
                    let page = region / LOG_BITS_PER_PAGE;
                    let durable_at = state.log_durable.get(&page).copied().unwrap_or(0);
                    (durable_at < set_at).then_some((*region, set_at))
                })
                .collect::<Vec<_>>();
            if let Some(version) = pending.iter().map(|(_, v)| *v).max() {
                let waiting = pending.into_iter().map(|(r, _)| r).collect();
                newly.push((piece.group, waiting, version));
            }
            if !regions.is_empty() {
                let end = self.stripe.chunks_per_group;
                let ahead = state.log.mark_ahead(&regions, LOG_AHEAD_REGIONS, end);
                regions.extend(ahead);
                state.log_version += 1;
                let version = state.log_version;
                for &region in &regions {
                    state.bit_versions.insert(region, version);
                }
                newly.push((piece.group, regions, version));
            }
        }
        newly
    }

    /// Make newly set log bits durable, then run `done`. On failure the
    /// write is withdrawn from the log's accounting.
    fn persist_announced(
        self: &Arc<Self>,
        pieces: &[Piece],
        newly: Announced,
        class: IoClass,
        done: LogDone,
    ) {
        struct Joined {
            left: usize,
            result: io::Result<()>,
            done: Option<LogDone>,
            pieces: Vec<Piece>,
        }
        let joined = Arc::new(Mutex::new(Joined {
            left: newly.len(),
            result: Ok(()),
            done: Some(done),
            pieces: pieces.to_vec(),
        }));
        for (group, regions, version) in newly {
            let (pool, joined) = (Arc::clone(self), Arc::clone(&joined));
            let committed: LogDone = Box::new(move |result| {
                let last = {
                    let mut joined = joined.lock();
                    joined.left -= 1;
                    if let (Err(err), Ok(())) = (result, &joined.result) {
                        joined.result = Err(err);
                    }
                    (joined.left == 0).then(|| {
                        let result = std::mem::replace(&mut joined.result, Ok(()));
                        let done = joined.done.take().expect("joined once");
                        (result, done, std::mem::take(&mut joined.pieces))
                    })
                };
                if let Some((result, done, pieces)) = last {
                    if result.is_err() {
                        pool.log_after_write(&pieces);
                    }
                    drop(pool);
                    done(result);
                }
            });
            self.commit_log(group, &regions, true, Some(version), class, committed);
        }
    }

    fn log_after_write(&self, pieces: &[Piece]) {
        for piece in pieces {
            let mut state = self.groups[piece.group].state.lock();
            state.log.after_write(Self::regions_of(piece));
        }
    }

    /// The write reached every copy: its checksums replace the old ones.
    fn record_sums(&self, pieces: &[Piece], sums: &[Vec<BlockSum>]) {
        for (piece, sums) in pieces.iter().zip(sums) {
            let mut state = self.groups[piece.group].state.lock();
            let first = piece.data_offset / DATA_BLOCK_BYTES;
            for (i, sum) in sums.iter().enumerate() {
                let index = first + i as u64;
                state.sums[index as usize] = *sum;
                state.dirty_pages.insert(index / SUMS_PER_PAGE);
            }
            state.log.after_write(Self::regions_of(piece));
        }
    }

    /// After a write that failed on a copy that stays in service (its file
    /// system is full), each block it touched may hold the old or the new
    /// bytes on each copy, both legal after an error. The block's checksum
    /// becomes that of the new bytes (`written`) if a copy holds them, else
    /// stays if a copy still matches it, else takes the first copy that
    /// reads, so the block reads back instead of failing everywhere; reads
    /// and the scrub heal the other copies. A copy holding neither old nor
    /// new bytes is corrupt and is never the source while another will do.
    /// The caller holds the blocks.
    fn settle_failed_blocks(&self, piece: &Piece, written: &[BlockSum]) {
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
        for (b, &written) in written.iter().enumerate() {
            let index = first + b as u64;
            let sum = state.sums[index as usize];
            let range = b * block..(b + 1) * block;
            let held = |sum: BlockSum| {
                copies
                    .iter()
                    .any(|c| sum.verifies(&c.as_slice()[range.clone()]))
            };
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

    fn touched_groups(pieces: &[Piece]) -> BTreeSet<usize> {
        pieces.iter().map(|p| p.group).collect()
    }

    /// Mark whole blocks as zero: no data I/O, only the log bits (durable
    /// where newly set) and the checksums.
    pub(super) fn zero_submit(
        self: &Arc<Self>,
        logical: u64,
        length: u64,
        class: IoClass,
        done: Completion,
    ) {
        let pieces = self.stripe.map(logical, length);
        self.hold_blocks(&pieces.clone(), true, move |pool, blocks| {
            let newly = pool.log_before_write(&pieces);
            let finish =
                move |pool: Arc<PoolData>, pieces: Vec<Piece>, persisted: io::Result<()>| {
                    if persisted.is_ok() {
                        pool.record_zeroes(&pieces);
                    }
                    drop(blocks);
                    drop(pool);
                    done(Outcome::done(persisted));
                };
            if newly.is_empty() {
                return finish(pool, pieces, Ok(()));
            }
            let job_pool = Arc::clone(&pool);
            pool.persist_announced(
                &pieces.clone(),
                newly,
                class,
                Box::new(move |persisted| finish(job_pool, pieces, persisted)),
            );
        });
    }

    /// Zero and wait: for tests.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(super) fn zero(self: &Arc<Self>, logical: u64, length: u64) -> io::Result<()> {
        wait(|done| self.zero_submit(logical, length, IoClass::SyncWrite, done)).result
    }

    fn record_zeroes(&self, pieces: &[Piece]) {
        for piece in pieces {
            let mut state = self.groups[piece.group].state.lock();
            let first = piece.data_offset / DATA_BLOCK_BYTES;
            for index in first..first + piece.length / DATA_BLOCK_BYTES {
                state.sums[index as usize] = BlockSum::Zero;
                state.dirty_pages.insert(index / SUMS_PER_PAGE);
            }
            state.log.after_write(Self::regions_of(piece));
        }
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

impl WriteInFlight {
    /// With the blocks held: the log bits, then the data.
    fn announce_then_submit(self, buf: WriteBuf) {
        let newly = self.pool.log_before_write(&self.pieces);
        if newly.is_empty() {
            return self.submit(buf);
        }
        let (pool, pieces) = (Arc::clone(&self.pool), self.pieces.clone());
        pool.persist_announced(
            &pieces,
            newly,
            self.class,
            Box::new(move |persisted| match persisted {
                Ok(()) => self.submit(buf),
                Err(err) => self.answer(Err(err)),
            }),
        );
    }

    /// Every copy's write at once; the last to complete finishes.
    fn submit(self, buf: WriteBuf) {
        let pool = Arc::clone(&self.pool);
        let pieces = self.pieces.clone();
        let mut targets = Vec::new();
        for piece in &pieces {
            for (member, attached) in pool.groups[piece.group].writable() {
                targets.push((*piece, member, attached));
            }
        }
        if targets.is_empty() {
            return self.finish(Vec::new());
        }
        let count = targets.len();
        let countdown = Arc::new(Mutex::new(Countdown {
            results: Vec::with_capacity(count),
            write: Some(self),
        }));
        // Every copy's write reads the client's buffer, sharing it. Every
        // write is ready before the first goes out, so that the copies'
        // writes leave together.
        let mut writes = Vec::with_capacity(count);
        for (piece, member, attached) in targets {
            let data = buf.slice(piece.range_offset as usize, piece.length as usize);
            let op = DeviceOp::Write {
                offset: attached.regions.data.0 + piece.data_offset,
                buf: data,
                durable: false,
            };
            writes.push((piece.group, member, attached, op));
        }
        let class = countdown.lock().write.as_ref().expect("set above").class;
        for (group, member, attached, op) in writes {
            let countdown = Arc::clone(&countdown);
            attached.queue.submit(
                class,
                op,
                Box::new(move |outcome| {
                    let last = {
                        let mut countdown = countdown.lock();
                        countdown.results.push((group, member, outcome.result));
                        (countdown.results.len() == count).then(|| {
                            let results = std::mem::take(&mut countdown.results);
                            (results, countdown.write.take().expect("finished once"))
                        })
                    };
                    if let Some((results, write)) = last {
                        write.finish(results);
                    }
                }),
            );
        }
    }

    /// Every device write completed, `results` says how.
    fn finish(self, results: Vec<(usize, usize, io::Result<()>)>) {
        // Every group the write touched took it on some copy, and no copy
        // failed: the common case, finished here.
        let every_group = PoolData::touched_groups(&self.pieces)
            .iter()
            .all(|g| results.iter().any(|(group, _, _)| group == g));
        if every_group && results.iter().all(|(_, _, r)| r.is_ok()) {
            self.pool.record_sums(&self.pieces, &self.sums);
            return self.written();
        }
        let pool = Arc::clone(&self.pool);
        pool.workers.run(Box::new(move || self.settle(results)));
    }

    /// A copy failed, or there was none to write: fault members that
    /// failed (where another copy took the data) and settle the blocks.
    fn settle(self, mut results: Vec<(usize, usize, io::Result<()>)>) {
        let mut written = Ok(());
        for group in PoolData::touched_groups(&self.pieces) {
            let (mine, others) = results.into_iter().partition(|(g, _, _)| *g == group);
            results = others;
            let mine = mine.into_iter().map(|(_, m, r)| (m, r)).collect();
            if let Err(err) = self.pool.settle_writes(group, mine, "write") {
                written = Err(err);
            }
        }
        match written {
            Ok(()) => {
                self.pool.record_sums(&self.pieces, &self.sums);
                self.written();
            }
            Err(err) => {
                for (piece, sums) in self.pieces.iter().zip(&self.sums) {
                    self.pool.settle_failed_blocks(piece, sums);
                }
                self.pool.log_after_write(&self.pieces);
                self.answer(Err(err));
            }
        }
    }

    /// The data is on every copy and its checksums are in memory: release
    /// the blocks and answer; FUA flushes the groups first.
    fn written(self) {
        let WriteInFlight {
            pool,
            durable,
            blocks,
            done,
            ..
        } = self;
        drop(blocks);
        if !durable {
            drop(pool);
            return done(Outcome::done(Ok(())));
        }
        pool.flush_submit(done);
    }

    fn answer(self, result: io::Result<()>) {
        let WriteInFlight {
            pool, blocks, done, ..
        } = self;
        drop(blocks);
        // The last reference to the pool never drops here: closing it
        // waits for its workers, and this may be one.
        drop(pool);
        done(Outcome::done(result))
    }
}
