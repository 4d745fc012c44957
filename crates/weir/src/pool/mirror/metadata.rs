//! The pool's own metadata on every member: checksum pages, dirty-region
//! log bits, and the flush that makes both durable. Recovery at open.

use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

use super::io_ops::{read_at, run_all, write_op};
use super::{
    io_err, Attached, PoolData, BLOCKS_PER_CHUNK, CHUNK_BYTES, DATA_BLOCK_BYTES, PAGE_BYTES,
    SUMS_PER_PAGE,
};
use crate::device::DeviceOp;
use crate::pool::geometry::{DeviceRegions, CHECKSUM_ENTRY_BYTES};
use crate::pool::integrity::{resolve, BlockSum, CopyState, Resolution};
use crate::sched::IoClass;

use super::log_commit::LOG_BITS_PER_PAGE;

impl PoolData {
    /// At open: make every copy of each dirty region agree, then flush.
    pub(super) fn recover_group(&self, index: usize) -> io::Result<()> {
        let dirty: Vec<u64> = self.groups[index]
            .state
            .lock()
            .log
            .dirty_regions()
            .collect();
        if !dirty.is_empty() {
            tracing::info!(
                pool = self.name,
                group = index,
                regions = dirty.len(),
                "recovering dirty regions"
            );
        }
        for chunk in dirty {
            self.recover_chunk(index, chunk)?;
        }
        self.flush_group(index)
    }

    /// Make every copy of one chunk agree, block by block (integrity::resolve).
    fn recover_chunk(&self, group_index: usize, chunk: u64) -> io::Result<()> {
        let group = &self.groups[group_index];
        let page = chunk * BLOCKS_PER_CHUNK / SUMS_PER_PAGE;
        // Per copy: its data, which blocks could be read (a failed read is
        // narrowed to the blocks that fail), and its checksum page.
        let mut copies = Vec::new();
        for (m, member) in group.readable() {
            let mut data = vec![0u8; CHUNK_BYTES as usize];
            let mut read_ok = vec![false; BLOCKS_PER_CHUNK as usize];
            self.read_narrowed(
                group_index,
                m,
                &member,
                IoClass::SyncWrite,
                member.regions.data.0 + chunk * CHUNK_BYTES,
                &mut data,
                &mut read_ok,
            );
            let sums = read_at(
                &member,
                IoClass::SyncWrite,
                member.regions.checksums.0 + page * PAGE_BYTES,
                PAGE_BYTES,
            );
            copies.push((data, read_ok, sums.ok()));
        }
        let first_in_page = (chunk * BLOCKS_PER_CHUNK % SUMS_PER_PAGE) as usize;
        let mut resolved = vec![0u8; CHUNK_BYTES as usize];
        let mut unreadable = false;
        let mut state = group.state.lock();
        for block in 0..BLOCKS_PER_CHUNK as usize {
            let range = block * DATA_BLOCK_BYTES as usize..(block + 1) * DATA_BLOCK_BYTES as usize;
            let states: Vec<CopyState> = copies
                .iter()
                .map(|(data, read_ok, sums)| {
                    let index = chunk * BLOCKS_PER_CHUNK + block as u64;
                    let stored = sums.as_ref().and_then(|s| {
                        let at = (first_in_page + block) * CHECKSUM_ENTRY_BYTES as usize;
                        let entry = s.as_slice()[at..at + 8].try_into().expect("8 bytes");
                        BlockSum::decode(entry, index).ok()
                    });
                    CopyState {
                        readable: read_ok[block],
                        stored,
                        actual: crc32c::crc32c(&data[range.clone()]),
                    }
                })
                .collect();
            let index = (chunk * BLOCKS_PER_CHUNK) as usize + block;
            match resolve(&states) {
                Resolution::Data { source, sum } => {
                    resolved[range.clone()].copy_from_slice(&copies[source].0[range]);
                    state.sums[index] = sum;
                }
                Resolution::Zero => state.sums[index] = BlockSum::Zero,
                Resolution::Unreadable => {
                    // Reads of it fail until it is written; the readable
                    // blocks around it are not worth overwriting it for.
                    tracing::error!(
                        pool = self.name,
                        group = group_index,
                        chunk,
                        block,
                        "recovery: no copy of this block can be read"
                    );
                    unreadable = true;
                }
            }
            state.dirty_pages.insert(index as u64 / SUMS_PER_PAGE);
        }
        drop(state);
        if unreadable {
            return Ok(());
        }
        let writes: Vec<_> = group
            .writable()
            .into_iter()
            .map(|(m, member)| {
                let op = write_op(
                    member.regions.data.0 + chunk * CHUNK_BYTES,
                    &resolved,
                    false,
                );
                (m, (member, IoClass::SyncWrite, op))
            })
            .collect();
        let (members, ops): (Vec<usize>, Vec<_>) = writes.into_iter().unzip();
        let results = members
            .into_iter()
            .zip(run_all(ops).into_iter().map(|o| o.result))
            .collect();
        match self.settle_writes(group_index, results, "recovery write") {
            // A copy that could not take the chunk (its file system is full)
            // keeps blocks that fail their checksum; reads heal them from a
            // copy that took it. Opening the pool must not wait for space.
            Err(err) if super::health::is_out_of_space(&err) => {
                tracing::warn!(
                    pool = self.name,
                    group = group_index,
                    chunk,
                    "recovery: a copy is out of space; reads heal it"
                );
                Ok(())
            }
            other => other,
        }
    }

    /// Persist changed checksum pages, flush every member, clear quiet regions.
    pub(super) fn flush_group(&self, group_index: usize) -> io::Result<()> {
        let group = &self.groups[group_index];
        let _io = group.metadata_io.lock();
        let (covered, pages) = {
            let mut state = group.state.lock();
            let covered = state.log.start_flush();
            let pages: Vec<(u64, Vec<u8>)> = std::mem::take(&mut state.dirty_pages)
                .into_iter()
                .map(|page| (page, page_bytes(&state.sums, page)))
                .collect();
            (covered, pages)
        };
        let persisted = self
            .write_pages(group_index, |r| r.checksums.0, &pages, "checksum write")
            .and_then(|()| {
                let members = group.writable();
                let ops = members
                    .iter()
                    .map(|(_, a)| (Arc::clone(a), IoClass::SyncWrite, DeviceOp::Flush))
                    .collect();
                let results = members
                    .iter()
                    .map(|(m, _)| *m)
                    .zip(run_all(ops).into_iter().map(|o| o.result))
                    .collect();
                self.settle_writes(group_index, results, "flush")
            });
        if let Err(err) = persisted {
            // Nothing was cleared: the next flush writes these pages again.
            let mut state = group.state.lock();
            state.dirty_pages.extend(pages.iter().map(|(p, _)| *p));
            state.log.restore_written(covered);
            return Err(err);
        }
        // While a member is out of service or being rebuilt, the log also
        // records what it misses (ZFS's DTL, md's write-intent bitmap): no
        // bit clears, and a member that returns is rebuilt from the set bits.
        if group.missing_a_member() {
            return Ok(());
        }
        let cleared = group.state.lock().log.after_flush(&covered);
        if !cleared.is_empty() {
            // Losing a clear only means an extra recovery: no durability needed.
            self.write_log_images(group_index, &cleared, false)?;
        }
        Ok(())
    }

    /// At a clean close: flush, then clear every quiet region's bit.
    pub(super) fn close_group(&self, group_index: usize) -> io::Result<()> {
        self.flush_group(group_index)?;
        let group = &self.groups[group_index];
        let _io = group.metadata_io.lock();
        if group.missing_a_member() {
            return Ok(());
        }
        let cleared = group.state.lock().log.clear_after_final_flush();
        if cleared.is_empty() {
            Ok(())
        } else {
            self.write_log_images(group_index, &cleared, true)
        }
    }

    /// Compare one copy's checksum entries for `chunk` with the pool's
    /// and rewrite them if they differ (damage the data scrub cannot see,
    /// as the pool verifies data against the entries it holds in memory).
    /// True if they were rewritten. Entries waiting for a flush are skipped:
    /// that flush writes them. The scrub-class read runs without the
    /// metadata lock, so a throttled scrub never holds up a flush.
    pub(super) fn scrub_chunk_entries(&self, group_index: usize, slot: usize, chunk: u64) -> bool {
        let group = &self.groups[group_index];
        let Some((_, member)) = group.readable().into_iter().find(|(m, _)| *m == slot) else {
            return false;
        };
        let page = chunk * BLOCKS_PER_CHUNK / SUMS_PER_PAGE;
        let offset = member.regions.checksums.0 + page * PAGE_BYTES;
        let entries = (chunk * BLOCKS_PER_CHUNK % SUMS_PER_PAGE * CHECKSUM_ENTRY_BYTES) as usize;
        let entries = entries..entries + (BLOCKS_PER_CHUNK * CHECKSUM_ENTRY_BYTES) as usize;
        // The page as the last flush wrote it; None while a flush is due.
        let expected = || {
            let state = group.state.lock();
            let first = (chunk * BLOCKS_PER_CHUNK) as usize;
            let empty = state.sums[first..first + BLOCKS_PER_CHUNK as usize]
                .iter()
                .all(|s| *s == BlockSum::Zero);
            // An empty chunk's entries are read only at open, where a
            // damaged one is outvoted; skipping them keeps a scrub of an
            // empty pool free of I/O.
            (!empty && !state.dirty_pages.contains(&page)).then(|| page_bytes(&state.sums, page))
        };
        let matches = |class: IoClass, expected: &[u8]| {
            read_at(&member, class, offset, PAGE_BYTES)
                .is_ok_and(|f| f.as_slice()[entries.clone()] == expected[entries.clone()])
        };
        match expected() {
            Some(image) if !matches(IoClass::Scrub, &image) => {}
            _ => return false,
        }
        // Again under the lock: a flush may have written the page since.
        let io = group.metadata_io.lock();
        let Some(image) = expected().filter(|image| !matches(IoClass::SyncWrite, image)) else {
            return false;
        };
        let rewrite = write_op(offset, &image, false);
        let written = super::io_ops::run_one(&member, IoClass::Scrub, rewrite).result;
        drop(io);
        match written {
            Ok(()) => {
                self.metadata_repairs
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(
                    pool = self.name,
                    group = group_index,
                    member = slot,
                    page,
                    "scrub: rewrote a damaged checksum page"
                );
            }
            Err(err) => {
                self.note_write_error(group_index, slot, &err);
            }
        }
        true
    }

    pub(super) fn flush_all(&self) -> io::Result<()> {
        for index in 0..self.groups.len() {
            self.flush_group(index)?;
        }
        Ok(())
    }

    /// Write the log pages holding `regions`' bits and wait, with the
    /// group's metadata lock held. The writes go through the group's log
    /// queue (log_commit.rs), which orders them after writers' bits.
    fn write_log_images(
        &self,
        group_index: usize,
        regions: &[u64],
        durable: bool,
    ) -> io::Result<()> {
        let Some(pool) = self.me.upgrade() else {
            return self.write_log_images_now(group_index, regions, durable);
        };
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        crate::device::without_thread_ring(|| {
            pool.commit_log(
                group_index,
                regions,
                durable,
                None,
                // Clearing bits can wait; making them durable is for a flush.
                if durable {
                    IoClass::SyncWrite
                } else {
                    IoClass::AsyncWrite
                },
                Box::new(move |result| drop(sender.send(result))),
            );
            drop(pool);
            receiver.recv().expect("every log write completes")
        })
    }

    /// Write the log pages holding `regions`' bits here and now: only
    /// while the pool is being dropped, when no one else can write them.
    fn write_log_images_now(
        &self,
        group_index: usize,
        regions: &[u64],
        durable: bool,
    ) -> io::Result<()> {
        let group = &self.groups[group_index];
        let blocks: BTreeSet<u64> = regions.iter().map(|r| r / LOG_BITS_PER_PAGE).collect();
        let (images, version) = {
            let state = group.state.lock();
            let mut images: Vec<(u64, Vec<u8>)> = blocks
                .iter()
                .map(|&block| (block, vec![0u8; PAGE_BYTES as usize]))
                .collect();
            for region in state.log.dirty_regions() {
                let block = region / LOG_BITS_PER_PAGE;
                if let Some((_, bytes)) = images.iter_mut().find(|(b, _)| *b == block) {
                    let bit = region % LOG_BITS_PER_PAGE;
                    bytes[(bit / 8) as usize] |= 1 << (bit % 8);
                }
            }
            (images, state.log_version)
        };
        let kind = if durable {
            IoClass::SyncWrite
        } else {
            IoClass::AsyncWrite
        };
        self.write_pages_as(
            group_index,
            |r| r.dirty_log.0,
            &images,
            durable,
            kind,
            "dirty log write",
        )?;
        if durable {
            let mut state = group.state.lock();
            for block in blocks {
                state.log_durable.insert(block, version);
            }
        }
        Ok(())
    }

    /// Give a member that joins the group every metadata page: the whole
    /// log and every checksum page (through the next flush).
    pub(super) fn copy_metadata(&self, group_index: usize) -> io::Result<()> {
        let group = &self.groups[group_index];
        {
            let _io = group.metadata_io.lock();
            let log_regions: Vec<u64> = (0..self.stripe.chunks_per_group)
                .step_by(LOG_BITS_PER_PAGE as usize)
                .collect();
            self.write_log_images(group_index, &log_regions, true)?;
            let mut state = group.state.lock();
            let pages = (state.sums.len() as u64).div_ceil(SUMS_PER_PAGE);
            state.dirty_pages.extend(0..pages);
        }
        self.flush_group(group_index)
    }

    /// Write 4 KiB `pages` (index, bytes) of one metadata region, whose start
    /// `region_at` gives per member, to every writable member of the group.
    fn write_pages(
        &self,
        group_index: usize,
        region_at: impl Fn(&DeviceRegions) -> u64,
        pages: &[(u64, Vec<u8>)],
        what: &str,
    ) -> io::Result<()> {
        self.write_pages_as(
            group_index,
            region_at,
            pages,
            false,
            IoClass::SyncWrite,
            what,
        )
    }

    fn write_pages_as(
        &self,
        group_index: usize,
        region_at: impl Fn(&DeviceRegions) -> u64,
        pages: &[(u64, Vec<u8>)],
        durable: bool,
        class: IoClass,
        what: &str,
    ) -> io::Result<()> {
        if pages.is_empty() {
            return Ok(());
        }
        let members = self.groups[group_index].writable();
        let mut ops = Vec::new();
        let mut owners = Vec::new();
        for (m, member) in &members {
            for (page, bytes) in pages {
                let offset = region_at(&member.regions) + page * PAGE_BYTES;
                ops.push((Arc::clone(member), class, write_op(offset, bytes, durable)));
                owners.push(*m);
            }
        }
        let outcomes = run_all(ops);
        // One result per member: its first failure, if any.
        let mut results: Vec<(usize, io::Result<()>)> =
            members.iter().map(|(m, _)| (*m, Ok(()))).collect();
        for (owner, outcome) in owners.into_iter().zip(outcomes) {
            if let Err(err) = outcome.result {
                let slot = results
                    .iter_mut()
                    .find(|(m, _)| *m == owner)
                    .expect("every owner is a member");
                if slot.1.is_ok() {
                    slot.1 = Err(err);
                }
            }
        }
        self.settle_writes(group_index, results, what)
    }
}

fn page_bytes(sums: &[BlockSum], page: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; PAGE_BYTES as usize];
    let first = (page * SUMS_PER_PAGE) as usize;
    for (i, sum) in sums
        .iter()
        .skip(first)
        .take(SUMS_PER_PAGE as usize)
        .enumerate()
    {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&sum.encode((first + i) as u64));
    }
    bytes
}

/// The group's checksum entries as loaded from its members' copies.
pub(super) struct LoadedSums {
    pub sums: Vec<BlockSum>,
    /// Pages that some copy holds damaged or differing: the next flush
    /// writes them to every member again.
    pub heal_pages: BTreeSet<u64>,
    /// Chunks holding a block no copy has a valid entry for: recovery
    /// takes those blocks from the data itself.
    pub unknown_chunks: BTreeSet<u64>,
}

/// Checksums of the group's blocks. Each entry is taken from a copy on
/// which it passes its own check; copies that are damaged, unreadable or
/// disagree are rewritten at the next flush. Where copies hold differing
/// valid entries, a block with data outranks a zero one (a lost trim costs
/// nothing; a lost write's checksum would make its data unreadable), and
/// the earlier member breaks a tie; a read that fails the chosen checksum
/// is healed from a copy that verifies, as any bad block is.
pub(super) fn load_sums(
    members: &[(usize, Arc<Attached>)],
    blocks: usize,
) -> io::Result<LoadedSums> {
    let bytes = (blocks as u64 * CHECKSUM_ENTRY_BYTES).next_multiple_of(PAGE_BYTES);
    let mut copies = Vec::new();
    let mut last_err = io_err("no member holds a complete copy".into());
    for (_, member) in members {
        match read_at(member, IoClass::SyncRead, member.regions.checksums.0, bytes) {
            Ok(buf) => copies.push(buf),
            Err(err) => last_err = err,
        }
    }
    if copies.is_empty() {
        return Err(last_err);
    }
    let mut loaded = LoadedSums {
        sums: Vec::with_capacity(blocks),
        heal_pages: BTreeSet::new(),
        unknown_chunks: BTreeSet::new(),
    };
    if copies.len() < members.len() {
        loaded.heal_pages.extend(0..bytes / PAGE_BYTES);
    }
    for index in 0..blocks {
        let at = index * CHECKSUM_ENTRY_BYTES as usize;
        let entries: Vec<Option<BlockSum>> = copies
            .iter()
            .map(|c| {
                let entry = c.as_slice()[at..at + 8].try_into().expect("8 bytes");
                BlockSum::decode(entry, index as u64).ok()
            })
            .collect();
        let valid = || entries.iter().flatten();
        let chosen = valid()
            .find(|s| **s != BlockSum::Zero)
            .or_else(|| valid().next())
            .copied();
        let page = index as u64 / SUMS_PER_PAGE;
        if entries.iter().any(|e| *e != chosen) {
            loaded.heal_pages.insert(page);
        }
        match chosen {
            Some(sum) => loaded.sums.push(sum),
            None => {
                loaded.sums.push(BlockSum::Zero);
                loaded
                    .unknown_chunks
                    .insert(index as u64 / BLOCKS_PER_CHUNK);
            }
        }
    }
    Ok(loaded)
}

/// Regions any member marks dirty. Every member carries every bit, so a
/// copy that is damaged or cannot be read loses nothing while another
/// reads; a bit set by damage costs one region's recovery.
pub(super) fn load_dirty(members: &[(usize, Arc<Attached>)], chunks: u64) -> io::Result<Vec<u64>> {
    let bytes = chunks.div_ceil(8).next_multiple_of(PAGE_BYTES);
    let mut dirty = BTreeSet::new();
    let mut read = 0;
    let mut last_err = io_err("no member holds a complete copy".into());
    for (_, member) in members {
        let buf = match read_at(member, IoClass::SyncRead, member.regions.dirty_log.0, bytes) {
            Ok(buf) => buf,
            Err(err) => {
                last_err = err;
                continue;
            }
        };
        read += 1;
        for chunk in 0..chunks {
            if buf.as_slice()[(chunk / 8) as usize] & (1 << (chunk % 8)) != 0 {
                dirty.insert(chunk);
            }
        }
    }
    if read == 0 {
        return Err(last_err);
    }
    Ok(dirty.into_iter().collect())
}
