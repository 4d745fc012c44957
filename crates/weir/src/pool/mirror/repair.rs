//! Background repair: scrubbing a chunk (every copy read and verified), and
//! replacing a member, whose copy is then rebuilt chunk by chunk in LBA
//! order (resilver) while the pool keeps serving.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::io_ops::{run_all, run_one, write_op};
use super::read::ReadSource;
use super::{io_err, Attached, Health, PoolData, BLOCKS_PER_CHUNK, CHUNK_BYTES, DATA_BLOCK_BYTES};
use crate::device::{AlignedBuf, Device, DeviceOp};
use crate::pool::geometry::Piece;
use crate::pool::integrity::BlockSum;
use crate::sched::IoClass;

/// What scrubbing one chunk found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubResult {
    /// Bytes read from all copies.
    pub bytes_read: u64,
    /// Bad block copies rewritten from a good copy.
    pub repaired: u64,
    /// Blocks with no good copy left.
    pub unrecoverable: u64,
}

/// What the scrub read of one copy of a chunk found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyScrub {
    /// Every allocated block read and verified; the bytes read.
    Clean(u64),
    /// A block did not read or verify: the chunk needs the repairing scrub
    /// of every copy (`scrub_chunk_repair`).
    Suspect,
    /// The member holds no complete copy any more (faulted or replaced).
    Gone,
}

/// A scrub read of the whole of `chunk` on each of `members`.
fn chunk_reads(
    members: &[(usize, Arc<Attached>)],
    chunk: u64,
) -> Vec<(Arc<Attached>, IoClass, DeviceOp)> {
    members
        .iter()
        .map(|(_, m)| {
            let op = DeviceOp::Read {
                offset: m.regions.data.0 + chunk * CHUNK_BYTES,
                buf: AlignedBuf::new(CHUNK_BYTES as usize),
            };
            (Arc::clone(m), IoClass::Scrub, op)
        })
        .collect()
}

impl PoolData {
    /// Read every allocated block of every complete copy of one chunk,
    /// verify it, and rewrite bad copies from a good one. Chunks that hold
    /// no data cost no I/O.
    pub fn scrub_chunk(&self, group_index: usize, chunk: u64) -> io::Result<ScrubResult> {
        if chunk == 0 {
            self.scrub_volume_tables(group_index);
        }
        for slot in self.scrub_copies(group_index) {
            self.scrub_chunk_entries(group_index, slot, chunk);
        }
        let (start, end) = self.chunk_keys(group_index, chunk);
        {
            // Nearly every chunk is clean: read and verify it beside client
            // reads of the same chunk, which would otherwise wait for the
            // whole scrub of it (a scrub read in small pieces is slow).
            let _shared = self.locks.lock_blocking(start, end, false);
            if let Some(clean) = self.scrub_chunk_if_clean(group_index, chunk) {
                return Ok(clean);
            }
        }
        // Something to narrow or repair: again, with writes held off.
        let _guard = self.locks.lock_blocking(start, end, true);
        self.scrub_chunk_repairing(group_index, chunk)
    }

    /// Members whose copies a scrub of `group_index` reads.
    pub fn scrub_copies(&self, group_index: usize) -> Vec<usize> {
        self.groups[group_index]
            .readable()
            .into_iter()
            .map(|(slot, _)| slot)
            .collect()
    }

    /// Tell the group's read selector how far each copy's scrub has got
    /// (`positions`: member slot and next chunk); `None` when the scrub of
    /// the group stops, so that no copy stays preferred. Whether each copy
    /// is a rotating disk, the read path tells it with every read.
    pub fn note_scrub_positions(&self, group_index: usize, positions: Option<&[(usize, u64)]>) {
        let group = &self.groups[group_index];
        let mut selector = group.selector.lock();
        match positions {
            Some(positions) => {
                for &(slot, chunk) in positions {
                    selector.set_background_position(slot, chunk);
                }
            }
            None => selector.clear_background_positions(),
        }
    }

    /// Read and verify one copy (member `slot`) of one chunk, beside
    /// client I/O to it. The scrub reads each copy on its own, so that a
    /// copy slowed by client reads holds no other device idle.
    pub fn scrub_copy(&self, group_index: usize, slot: usize, chunk: u64) -> CopyScrub {
        self.scrub_chunk_entries(group_index, slot, chunk);
        let (start, end) = self.chunk_keys(group_index, chunk);
        let _shared = self.locks.lock_blocking(start, end, false);
        let group = &self.groups[group_index];
        let first = (chunk * BLOCKS_PER_CHUNK) as usize;
        let sums: Vec<BlockSum> =
            group.state.lock().sums[first..first + BLOCKS_PER_CHUNK as usize].to_vec();
        if sums.iter().all(|s| *s == BlockSum::Zero) {
            return CopyScrub::Clean(0);
        }
        let Some((_, member)) = group.readable().into_iter().find(|(i, _)| *i == slot) else {
            return CopyScrub::Gone;
        };
        let ops = chunk_reads(&[(slot, member)], chunk);
        let outcome = run_all(ops).pop().expect("one op, one outcome");
        let Some(buf) = outcome.result.ok().and(outcome.buf) else {
            return CopyScrub::Suspect;
        };
        let clean = sums.iter().enumerate().all(|(block, sum)| {
            let at = block * DATA_BLOCK_BYTES as usize;
            *sum == BlockSum::Zero
                || sum.verifies(&buf.as_slice()[at..at + DATA_BLOCK_BYTES as usize])
        });
        if clean {
            CopyScrub::Clean(CHUNK_BYTES)
        } else {
            CopyScrub::Suspect
        }
    }

    /// The repairing scrub of every copy of a chunk, with writes to it
    /// held off: for a chunk that `scrub_copy` found suspect.
    pub fn scrub_chunk_repair(&self, group_index: usize, chunk: u64) -> io::Result<ScrubResult> {
        let (start, end) = self.chunk_keys(group_index, chunk);
        let _guard = self.locks.lock_blocking(start, end, true);
        self.scrub_chunk_repairing(group_index, chunk)
    }

    /// The scrub of a chunk whose every copy reads and verifies; None if
    /// one does not (nothing is counted or repaired here).
    fn scrub_chunk_if_clean(&self, group_index: usize, chunk: u64) -> Option<ScrubResult> {
        let group = &self.groups[group_index];
        let first = (chunk * BLOCKS_PER_CHUNK) as usize;
        let sums: Vec<BlockSum> =
            group.state.lock().sums[first..first + BLOCKS_PER_CHUNK as usize].to_vec();
        if sums.iter().all(|s| *s == BlockSum::Zero) {
            return Some(ScrubResult::default());
        }
        let members = group.readable();
        let ops = chunk_reads(&members, chunk);
        for outcome in run_all(ops) {
            let buf = outcome.result.ok().and(outcome.buf)?;
            let clean = sums.iter().enumerate().all(|(block, sum)| {
                let at = block * DATA_BLOCK_BYTES as usize;
                *sum == BlockSum::Zero
                    || sum.verifies(&buf.as_slice()[at..at + DATA_BLOCK_BYTES as usize])
            });
            if !clean {
                return None;
            }
        }
        Some(ScrubResult {
            bytes_read: members.len() as u64 * CHUNK_BYTES,
            ..ScrubResult::default()
        })
    }

    /// The scrub of one chunk, repairing; the caller holds its write lock.
    fn scrub_chunk_repairing(&self, group_index: usize, chunk: u64) -> io::Result<ScrubResult> {
        let group = &self.groups[group_index];
        let first = (chunk * BLOCKS_PER_CHUNK) as usize;
        let sums: Vec<BlockSum> =
            group.state.lock().sums[first..first + BLOCKS_PER_CHUNK as usize].to_vec();
        let mut result = ScrubResult::default();
        if sums.iter().all(|s| *s == BlockSum::Zero) {
            return Ok(result);
        }
        let members = group.readable();
        let ops = chunk_reads(&members, chunk);
        // Per copy: its bytes, and which blocks could be read. A failed
        // read is narrowed, so that only unreadable blocks count as bad.
        let copies: Vec<(Vec<u8>, Vec<bool>)> = run_all(ops)
            .into_iter()
            .zip(&members)
            .map(
                |(outcome, (m, member))| match (outcome.result, outcome.buf) {
                    (Ok(()), Some(buf)) => (buf.as_slice().to_vec(), vec![true; sums.len()]),
                    _ => {
                        let mut bytes = vec![0u8; CHUNK_BYTES as usize];
                        let mut read_ok = vec![false; sums.len()];
                        let offset = member.regions.data.0 + chunk * CHUNK_BYTES;
                        self.read_narrowed(
                            group_index,
                            *m,
                            member,
                            IoClass::Scrub,
                            offset,
                            &mut bytes,
                            &mut read_ok,
                        );
                        (bytes, read_ok)
                    }
                },
            )
            .collect();
        result.bytes_read = members.len() as u64 * CHUNK_BYTES;
        for (block, sum) in sums.iter().enumerate() {
            if *sum == BlockSum::Zero {
                continue;
            }
            let range = block * DATA_BLOCK_BYTES as usize..(block + 1) * DATA_BLOCK_BYTES as usize;
            let good: Vec<bool> = copies
                .iter()
                .map(|(bytes, read_ok)| read_ok[block] && sum.verifies(&bytes[range.clone()]))
                .collect();
            let Some(source) = good.iter().position(|g| *g) else {
                result.unrecoverable += 1;
                continue;
            };
            let data = copies[source].0[range.clone()].to_vec();
            for (index, ok) in good.iter().enumerate() {
                if *ok {
                    continue;
                }
                let (member_index, member) = &members[index];
                let counters = &group.slots[*member_index].counters;
                if copies[index].1[block] {
                    counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
                }
                let offset = member.regions.data.0 + chunk * CHUNK_BYTES + range.start as u64;
                let outcome = run_one(member, IoClass::Scrub, write_op(offset, &data, true));
                match outcome.result {
                    Ok(()) => {
                        result.repaired += 1;
                        counters.repaired.fetch_add(1, Ordering::Relaxed);
                        self.repairs.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(err) => {
                        self.note_write_error(group_index, *member_index, &err);
                    }
                }
            }
        }
        Ok(result)
    }

    /// Where a member sits, by the name it was given (its device spec) or
    /// its device id in hex.
    pub fn find_member(&self, name: &str) -> Option<(usize, usize)> {
        let config = self.config.lock();
        self.groups.iter().enumerate().find_map(|(g, group)| {
            group.slots.iter().enumerate().find_map(|(m, slot)| {
                let id = format!("{:032x}", config.layout.groups[g][m]);
                (*slot.spec.read() == name || id == name).then_some((g, m))
            })
        })
    }

    /// The device id of every member, by the names they were given.
    pub fn member_specs(&self) -> Vec<String> {
        self.groups
            .iter()
            .flat_map(|g| g.slots.iter().map(|s| s.spec.read().clone()))
            .collect()
    }

    /// Put `device` in the place of member (`group`, `member`): the old one
    /// is faulted, the new one gets a label and the pool's metadata, and a
    /// resilver copies the data onto it in the background.
    pub fn replace(
        self: &Arc<Self>,
        group: usize,
        member: usize,
        device: Arc<dyn Device>,
        spec: &str,
        new_id: u128,
    ) -> io::Result<()> {
        self.attach_replacement(group, member, device, spec, new_id)?;
        self.spawn_resilver(group, member);
        Ok(())
    }

    /// `replace` up to the resilver, which the caller starts.
    pub(super) fn attach_replacement(
        &self,
        group: usize,
        member: usize,
        device: Arc<dyn Device>,
        spec: &str,
        new_id: u128,
    ) -> io::Result<()> {
        let attached = Attached::new(device, self.sched())?;
        if attached.regions.data_chunks() < self.stripe.chunks_per_group {
            return Err(io_err(format!(
                "{spec} is too small: it holds {} MiB of data, the group needs {} MiB",
                attached.regions.data_chunks(),
                self.stripe.chunks_per_group
            )));
        }
        if !self.groups[group]
            .readable()
            .iter()
            .any(|(m, _)| *m != member)
        {
            return Err(io_err(
                "the member holds its group's only complete copy; add another first".into(),
            ));
        }
        {
            let mut config = self.config.lock();
            let slot = &self.groups[group].slots[member];
            slot.set_health(Health::Faulted);
            *slot.attached.write() = Some(Arc::clone(&attached));
            *slot.spec.write() = spec.to_string();
            slot.resilvered_chunks.store(0, Ordering::SeqCst);
            // A new device: the old one's errors are not its own.
            slot.counters.clear_errors();
            slot.counters.reads.store(0, Ordering::Relaxed);
            slot.resilver_dirty_only.store(false, Ordering::SeqCst);
            *slot.resilver_started.lock() = Some(Instant::now());
            config.layout.groups[group][member] = new_id;
            config.generation += 1;
            slot.set_health(Health::Resilvering);
            if let Err(err) = self.write_member_labels(&config) {
                slot.set_health(Health::Faulted);
                return Err(io::Error::new(
                    err.kind(),
                    format!("cannot label the new member: {err}"),
                ));
            }
            tracing::info!(
                pool = self.name,
                group,
                member,
                device = spec,
                generation = config.generation,
                "replacing a member: resilver starts"
            );
        }
        // The volume table, then every metadata page, before any data.
        let written = self.write_volume_table_to(&attached);
        let copied = written.and_then(|()| self.copy_metadata(group));
        if let Err(err) = copied {
            self.fault(group, member, &format!("cannot copy metadata: {err}"));
            return Err(err);
        }
        Ok(())
    }

    /// Run a resilver on this thread until it ends.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(super) fn resilver_now(self: &Arc<Self>, group: usize, member: usize) {
        resilver(Arc::downgrade(self), group, member)
    }

    /// Start a resilver for every member that needs one (after an import
    /// that found a replacement unfinished, it starts over).
    pub fn start_resilvers(self: &Arc<Self>) {
        for (g, group) in self.groups.iter().enumerate() {
            for (m, slot) in group.slots.iter().enumerate() {
                if slot.health() == Health::Resilvering {
                    *slot.resilver_started.lock() = Some(Instant::now());
                    self.spawn_resilver(g, m);
                }
            }
        }
    }

    pub(super) fn spawn_resilver(self: &Arc<Self>, group: usize, member: usize) {
        let pool = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name(format!("weir-resilver-{group}-{member}"))
            .spawn(move || resilver(pool, group, member));
        if let Err(err) = spawned {
            tracing::error!(pool = self.name, error = %err, "cannot start the resilver");
        }
    }

    /// Copy one chunk onto a resilvering member from the complete copies.
    pub(super) fn resilver_chunk(&self, group: usize, member: usize, chunk: u64) -> io::Result<()> {
        let (start, end) = self.chunk_keys(group, chunk);
        let _guard = self.locks.lock_blocking(start, end, true);
        let slot = &self.groups[group].slots[member];
        if slot.resilver_dirty_only.load(Ordering::SeqCst)
            && !self.groups[group].state.lock().log.is_dirty(chunk)
        {
            return Ok(()); // written to nowhere while the member was away
        }
        let piece = Piece {
            group,
            data_offset: chunk * CHUNK_BYTES,
            length: CHUNK_BYTES,
            range_offset: 0,
        };
        let mut data = vec![0u8; CHUNK_BYTES as usize];
        match self.read_piece(
            &piece,
            &mut data,
            IoClass::Resilver,
            &ReadSource::Background,
        ) {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            // A block with no good copy anywhere: the new copy fails its
            // checksum there too, so reads of it keep returning EIO.
            Err(err) => tracing::error!(
                pool = self.name,
                group,
                chunk,
                error = %err,
                "resilver: a block of this chunk has no good copy"
            ),
        }
        let slot = &self.groups[group].slots[member];
        let Some(target) = slot.attached() else {
            return Err(io_err("the member was detached".into()));
        };
        let op = write_op(target.regions.data.0 + chunk * CHUNK_BYTES, &data, false);
        let outcome = run_one(&target, IoClass::Resilver, op);
        if let Err(err) = outcome.result {
            self.note_write_error(group, member, &err);
            return Err(err);
        }
        Ok(())
    }

    /// The copy is whole: make it durable, then read from it.
    pub(super) fn finish_resilver(&self, group: usize, member: usize) -> io::Result<()> {
        self.flush_group(group)?;
        let mut config = self.config.lock();
        let slot = &self.groups[group].slots[member];
        if slot.health() != Health::Resilvering {
            return Err(io_err("the member left resilvering".into()));
        }
        slot.set_health(Health::Online);
        config.generation += 1;
        self.write_member_labels(&config)?;
        let seconds = slot
            .resilver_started
            .lock()
            .map_or(0.0, |t| t.elapsed().as_secs_f64());
        *self.last_resilver.lock() = Some(ResilverResult {
            device: slot.spec.read().clone(),
            seconds,
            chunks: self.stripe.chunks_per_group,
            ended: std::time::SystemTime::now(),
            failure: None,
        });
        tracing::info!(
            pool = self.name,
            group,
            member,
            seconds,
            "resilver complete: the member is ONLINE"
        );
        Ok(())
    }

    /// (chunks copied, chunks in all) of a resilvering member.
    pub(super) fn resilver_progress(&self, group: usize, member: usize) -> (u64, u64) {
        let slot = &self.groups[group].slots[member];
        (
            slot.resilvered_chunks.load(Ordering::Relaxed),
            self.stripe.chunks_per_group,
        )
    }
}

/// How the last resilver ended, for `pool status`.
pub(super) struct ResilverResult {
    pub device: String,
    pub seconds: f64,
    /// Chunks copied.
    pub chunks: u64,
    pub ended: std::time::SystemTime,
    /// None: it finished and the member is ONLINE.
    pub failure: Option<String>,
}

impl ResilverResult {
    pub fn describe(&self) -> String {
        let ended = humantime::format_rfc3339_seconds(self.ended);
        match &self.failure {
            None => format!(
                "resilvered {} in {:.0} s ({} chunks), finished {ended}",
                self.device, self.seconds, self.chunks
            ),
            Some(why) => format!(
                "resilver of {} stopped after {:.0} s ({} chunks): {why}, {ended}",
                self.device, self.seconds, self.chunks
            ),
        }
    }
}

/// The resilver of one member, chunk by chunk. It holds the pool only for
/// one chunk at a time, so closing the pool is never held up by it.
fn resilver(pool: Weak<PoolData>, group: usize, member: usize) {
    loop {
        let Some(pool) = pool.upgrade() else { return };
        if pool.is_closing() {
            return;
        }
        let slot = &pool.groups[group].slots[member];
        if slot.health() != Health::Resilvering {
            tracing::warn!(
                pool = pool.name,
                group,
                member,
                "resilver stopped: the member left"
            );
            *pool.last_resilver.lock() = Some(ResilverResult {
                device: slot.spec.read().clone(),
                seconds: slot
                    .resilver_started
                    .lock()
                    .map_or(0.0, |t| t.elapsed().as_secs_f64()),
                chunks: slot.resilvered_chunks.load(Ordering::SeqCst),
                ended: std::time::SystemTime::now(),
                failure: Some(format!("the member is {}", slot.state_name())),
            });
            return;
        }
        let chunk = slot.resilvered_chunks.load(Ordering::SeqCst);
        if chunk >= pool.stripe.chunks_per_group {
            if let Err(err) = pool.finish_resilver(group, member) {
                tracing::error!(pool = pool.name, error = %err, "cannot finish the resilver");
            }
            return;
        }
        if pool.resilver_chunk(group, member, chunk).is_err()
            && slot.health() != Health::Resilvering
        {
            continue; // the loop reports the fault and stops
        }
        slot.resilvered_chunks.store(chunk + 1, Ordering::SeqCst);
    }
}
