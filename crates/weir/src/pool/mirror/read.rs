//! Reads: one copy, chosen by the group's `select::MirrorSelector`, every
//! block verified; a bad block is served from another copy and rewritten
//! on the bad one.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::io_ops::{read_at, run_one, write_op};
use super::select::{Choice, ReadRequest};
use super::{eio, Attached, PoolData, CHUNK_BYTES, DATA_BLOCK_BYTES};
use crate::device::{AlignedBuf, Completion, DeviceOp, Outcome};
use crate::pool::geometry::Piece;
use crate::pool::integrity::BlockSum;
use crate::range_lock::ShardedGuard;
use crate::sched::{IoClass, Mode};

/// The class of the rewrite that heals what a read of `class` found.
fn repair_class(class: IoClass) -> IoClass {
    match class {
        IoClass::Scrub | IoClass::Resilver => class,
        _ => IoClass::SyncWrite,
    }
}

/// Who asks for a read, for the `pid` policy: the submitting thread,
/// which for a client read is its connection's.
pub(super) fn requester() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::thread::current().id().hash(&mut hasher);
    hasher.finish()
}

/// Which copy serves a read.
#[derive(Clone, Copy, Debug)]
pub(super) enum ReadSource {
    /// A client's read (by `requester`): the group's selector chooses.
    Client { requester: u64 },
    /// This member, if it can serve the block: a fast-path read found bad
    /// blocks on it, and this read heals them.
    Member(usize),
    /// Background work (resilver): the first whole copy, past the selector.
    Background,
}

impl PoolData {
    /// Read `out` at `logical`, verified; true if every block is a zero
    /// block. The caller holds the blocks it covers.
    fn read_locked(
        &self,
        logical: u64,
        out: &mut [u8],
        class: IoClass,
        source: &ReadSource,
    ) -> io::Result<bool> {
        let pieces = self.stripe.map(logical, out.len() as u64);
        let mut all_zero = true;
        for piece in &pieces {
            let target =
                &mut out[piece.range_offset as usize..(piece.range_offset + piece.length) as usize];
            all_zero &= self.read_piece(piece, target, class, source)?;
        }
        Ok(all_zero)
    }

    /// The read that may need a worker: several pieces, background
    /// classes, or healing. Its blocks are held shared before a worker
    /// takes it, so that no worker waits on a lock.
    pub(super) fn read_submit(
        self: &Arc<Self>,
        logical: u64,
        buf: AlignedBuf,
        class: IoClass,
        source: ReadSource,
        done: Completion,
    ) {
        let pieces = self.stripe.map(logical, buf.len() as u64);
        self.hold_blocks(&pieces, false, move |pool, blocks| {
            pool.read_on_worker(logical, buf, class, source, blocks, done)
        });
    }

    /// A client now waits for the read-ahead submitted over the logical
    /// range: wherever a copy's queue still holds it, it goes as a client
    /// read.
    pub(super) fn promote(&self, logical: u64, length: u64) {
        for piece in self.stripe.map(logical, length) {
            let group = &self.groups[piece.group];
            for (_, member) in group.readable_at(piece.data_offset / CHUNK_BYTES) {
                let offset = member.regions.data.0 + piece.data_offset;
                member.queue.promote(offset, piece.length);
            }
        }
    }

    /// The largest read piece any member's measurements ask for (a piece
    /// small enough for one copy would cost another its fixed part again),
    /// in whole stripe chunks: pieces start at multiples of their length
    /// (`pool::read_each_piece`), so no two pieces read the same chunk.
    pub(super) fn read_piece_bytes(&self) -> Option<u64> {
        self.groups
            .iter()
            .flat_map(|group| group.slots.iter().filter_map(|slot| slot.attached()))
            .filter_map(|member| member.queue.read_piece_bytes())
            .max()
            .map(|bytes| bytes.next_multiple_of(CHUNK_BYTES))
    }

    /// Read and wait, by the path the server would take: for tests.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(super) fn read(
        self: &Arc<Self>,
        logical: u64,
        out: &mut [u8],
        class: IoClass,
        source: &ReadSource,
    ) -> io::Result<bool> {
        let buf = AlignedBuf::new(out.len());
        let outcome = super::io_ops::wait(|done| match (class, *source) {
            (IoClass::SyncRead, ReadSource::Client { requester }) => {
                self.read_client_as(logical, buf, requester, done)
            }
            (_, source) => self.read_submit(logical, buf, class, source, done),
        });
        outcome.result?;
        out.copy_from_slice(outcome.buf.expect("reads return their buffer").as_slice());
        Ok(outcome.hole)
    }

    fn read_on_worker(
        self: Arc<Self>,
        logical: u64,
        buf: AlignedBuf,
        class: IoClass,
        source: ReadSource,
        blocks: ShardedGuard,
        done: Completion,
    ) {
        let pool = Arc::clone(&self);
        pool.workers.run(Box::new(move || {
            let outcome = self.read_outcome(logical, buf, class, &source);
            drop(blocks);
            // The last reference to the pool never drops on a worker:
            // closing the pool waits for them.
            drop(self);
            done(outcome)
        }));
    }

    /// The copy that serves `piece`: a position in `readable`, and the
    /// selector's choice to report back with `copy_read_done`.
    fn choose_copy(
        &self,
        piece: &Piece,
        readable: &[(usize, Arc<Attached>)],
        requester: u64,
    ) -> Option<(usize, Choice)> {
        let request = ReadRequest {
            offset: piece.data_offset,
            length: piece.length,
            requester,
        };
        let mut selector = self.groups[piece.group].selector.lock();
        let held = readable
            .iter()
            .all(|(_, attached)| attached.queue.mode() == Mode::Adaptive);
        selector.set_background_held_for_reads(held);
        for (member, attached) in readable {
            let background: u64 = IoClass::ALL
                .iter()
                .filter(|class| !class.is_interactive())
                .map(|class| {
                    attached
                        .queue
                        .counters(*class)
                        .in_flight
                        .load(Ordering::Relaxed)
                })
                .sum();
            let rotational = attached.device().info().rotational;
            selector.set_background(*member, background as u32, rotational);
        }
        let choice = selector.choose_among(request, self.clock_ns(), |member| {
            readable.iter().any(|(m, _)| *m == member)
        })?;
        drop(selector);
        let position = readable.iter().position(|(m, _)| *m == choice.copy)?;
        Some((position, choice))
    }

    fn copy_read_done(&self, group: usize, choice: Choice, latency_ns: u64, bad_data: bool) {
        let now = self.clock_ns();
        let mut selector = self.groups[group].selector.lock();
        selector.completed(choice, latency_ns, now);
        if bad_data {
            selector.checksum_failed(choice.copy, now);
        }
    }

    /// Fill `out` with the piece's verified data; true if it is all zero
    /// blocks. The caller holds the piece's chunk lock.
    pub(super) fn read_piece(
        &self,
        piece: &Piece,
        out: &mut [u8],
        class: IoClass,
        source: &ReadSource,
    ) -> io::Result<bool> {
        let group = &self.groups[piece.group];
        let first = piece.data_offset / DATA_BLOCK_BYTES;
        let sums: Vec<BlockSum> = {
            let state = group.state.lock();
            state.sums[first as usize..(first + piece.length / DATA_BLOCK_BYTES) as usize].to_vec()
        };
        if sums.iter().all(|s| *s == BlockSum::Zero) {
            out.fill(0);
            return Ok(true);
        }
        let readable = group.readable_at(piece.data_offset / CHUNK_BYTES);
        if readable.is_empty() {
            return Err(eio());
        }
        let forced = match *source {
            ReadSource::Member(m) => readable.iter().position(|(r, _)| *r == m),
            _ => None,
        };
        let (preferred, choice) = match (source, forced) {
            (_, Some(position)) => (position, None),
            (ReadSource::Client { requester }, None) => {
                match self.choose_copy(piece, &readable, *requester) {
                    Some((position, choice)) => (position, Some(choice)),
                    None => return Err(eio()),
                }
            }
            _ => (0, None),
        };
        let (member_index, member) = &readable[preferred];
        let slot = &group.slots[*member_index];
        slot.counters.reads.fetch_add(1, Ordering::Relaxed);
        let mut read_ok = vec![false; sums.len()];
        let started = Instant::now();
        self.read_narrowed(
            piece.group,
            *member_index,
            member,
            class,
            member.regions.data.0 + piece.data_offset,
            out,
            &mut read_ok,
        );
        let read_ns = started.elapsed().as_nanos() as u64;
        let report = |bad_data: bool| {
            if let Some(choice) = choice {
                self.copy_read_done(piece.group, choice, read_ns, bad_data);
            }
        };
        let mut bad_data = false;
        for (i, sum) in sums.iter().enumerate() {
            let range = i * DATA_BLOCK_BYTES as usize..(i + 1) * DATA_BLOCK_BYTES as usize;
            if *sum == BlockSum::Zero {
                out[range].fill(0);
                continue;
            }
            if read_ok[i] && sum.verifies(&out[range.clone()]) {
                continue;
            }
            if read_ok[i] {
                bad_data = true;
                slot.counters
                    .checksum_errors
                    .fetch_add(1, Ordering::Relaxed);
            }
            // This copy failed (EIO or checksum): try the others, heal it.
            let block_offset = piece.data_offset + (i as u64) * DATA_BLOCK_BYTES;
            let good = (1..readable.len())
                .map(|step| &readable[(preferred + step) % readable.len()])
                .find_map(|(other_index, other)| {
                    let offset = other.regions.data.0 + block_offset;
                    match read_at(other, class, offset, DATA_BLOCK_BYTES) {
                        Ok(block) if sum.verifies(block.as_slice()) => Some(block),
                        Ok(_) => {
                            let counters = &group.slots[*other_index].counters;
                            counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
                            None
                        }
                        Err(err) => {
                            self.note_read_error(piece.group, *other_index, &err);
                            None
                        }
                    }
                });
            let Some(good) = good else {
                report(bad_data);
                return Err(eio());
            };
            out[range].copy_from_slice(good.as_slice());
            let healed = run_one(
                member,
                repair_class(class),
                write_op(member.regions.data.0 + block_offset, good.as_slice(), true),
            );
            match healed.result {
                Ok(()) => {
                    slot.counters.repaired.fetch_add(1, Ordering::Relaxed);
                    self.repairs.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        pool = self.name,
                        group = piece.group,
                        member = member_index,
                        block_offset,
                        "repaired a bad block from another copy"
                    );
                }
                Err(err) => {
                    self.note_write_error(piece.group, *member_index, &err);
                }
            }
        }
        report(bad_data);
        Ok(false)
    }

    /// Read `out.len()` bytes at `offset` of one member. An error is
    /// narrowed by halving down to single blocks, so that only blocks that
    /// really fail are marked (`read_ok[i]` false) and repaired.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_narrowed(
        &self,
        group: usize,
        member_index: usize,
        member: &Arc<Attached>,
        class: IoClass,
        offset: u64,
        out: &mut [u8],
        read_ok: &mut [bool],
    ) {
        match read_at(member, class, offset, out.len() as u64) {
            Ok(buf) => {
                out.copy_from_slice(buf.as_slice());
                read_ok.fill(true);
            }
            Err(err) if read_ok.len() == 1 => self.note_read_error(group, member_index, &err),
            Err(_) => {
                let half = read_ok.len() / 2;
                let (out_a, out_b) = out.split_at_mut(half * DATA_BLOCK_BYTES as usize);
                let (ok_a, ok_b) = read_ok.split_at_mut(half);
                self.read_narrowed(group, member_index, member, class, offset, out_a, ok_a);
                let offset_b = offset + half as u64 * DATA_BLOCK_BYTES;
                self.read_narrowed(group, member_index, member, class, offset_b, out_b, ok_b);
            }
        }
    }

    /// A client read: on the caller's thread and in the device's
    /// completion when it is one piece whose copy verifies, the common
    /// case; on a worker otherwise (several pieces, a bad block to heal,
    /// an error to narrow).
    pub(super) fn read_client(self: &Arc<Self>, logical: u64, buf: AlignedBuf, done: Completion) {
        self.read_client_as(logical, buf, requester(), done)
    }

    fn read_client_as(
        self: &Arc<Self>,
        logical: u64,
        buf: AlignedBuf,
        requester: u64,
        done: Completion,
    ) {
        let pieces = self.stripe.map(logical, buf.len() as u64);
        let source = ReadSource::Client { requester };
        let [piece] = pieces[..] else {
            return self.read_submit(logical, buf, IoClass::SyncRead, source, done);
        };
        self.hold_blocks(&pieces, false, move |pool, blocks| {
            pool.read_one_piece(logical, piece, buf, requester, blocks, done)
        });
    }

    fn read_one_piece(
        self: Arc<Self>,
        logical: u64,
        piece: Piece,
        buf: AlignedBuf,
        requester: u64,
        blocks: ShardedGuard,
        done: Completion,
    ) {
        let group = &self.groups[piece.group];
        let first = (piece.data_offset / DATA_BLOCK_BYTES) as usize;
        let sums: Vec<BlockSum> =
            group.state.lock().sums[first..first + buf.len() / DATA_BLOCK_BYTES as usize].to_vec();
        if sums.iter().all(|s| *s == BlockSum::Zero) {
            let mut buf = buf;
            buf.as_mut_slice().fill(0);
            drop(blocks);
            drop(self);
            return done(Outcome {
                result: Ok(()),
                buf: Some(buf),
                hole: true,
            });
        }
        let readable = group.readable_at(piece.data_offset / CHUNK_BYTES);
        let Some((position, choice)) = self.choose_copy(&piece, &readable, requester) else {
            let source = ReadSource::Client { requester };
            return self.read_on_worker(logical, buf, IoClass::SyncRead, source, blocks, done);
        };
        let (member_index, member) = &readable[position];
        let member_index = *member_index;
        group.slots[member_index]
            .counters
            .reads
            .fetch_add(1, Ordering::Relaxed);
        let offset = member.regions.data.0 + piece.data_offset;
        let started = Instant::now();
        member.queue.submit(
            IoClass::SyncRead,
            DeviceOp::Read { offset, buf },
            Box::new(move |mut outcome: Outcome| {
                let verified = outcome.result.is_ok()
                    && outcome.buf.as_mut().is_some_and(|buf| {
                        buf.as_mut_slice()
                            .chunks_mut(DATA_BLOCK_BYTES as usize)
                            .zip(&sums)
                            .all(|(block, sum)| match sum {
                                BlockSum::Zero => {
                                    block.fill(0);
                                    true
                                }
                                BlockSum::Data(_) => sum.verifies(block),
                            })
                    });
                let bad_data = outcome.result.is_ok() && !verified;
                let latency_ns = started.elapsed().as_nanos() as u64;
                self.copy_read_done(piece.group, choice, latency_ns, bad_data);
                if verified {
                    drop(blocks);
                    drop(self);
                    return done(outcome);
                }
                // A bad copy or an error: a worker reads this copy again,
                // heals what fails from another, and answers.
                let buf = outcome
                    .buf
                    .take()
                    .unwrap_or_else(|| AlignedBuf::new(piece.length as usize));
                let source = ReadSource::Member(member_index);
                self.read_on_worker(logical, buf, IoClass::SyncRead, source, blocks, done);
            }),
        );
    }

    pub(super) fn read_outcome(
        &self,
        logical: u64,
        mut buf: AlignedBuf,
        class: IoClass,
        source: &ReadSource,
    ) -> Outcome {
        match self.read_locked(logical, buf.as_mut_slice(), class, source) {
            Ok(hole) => Outcome {
                result: Ok(()),
                buf: Some(buf),
                hole,
            },
            Err(err) => Outcome::done(Err(err)),
        }
    }
}
