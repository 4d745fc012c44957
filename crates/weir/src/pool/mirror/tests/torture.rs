//! The torture test: a seeded simulation of a pool under every
//! recoverable fault, in the spirit of ZFS's ztest and TigerBeetle's VOPR.
//! Random writes, reads, zeroing, flushes and FUA over 2- and 3-way
//! mirrors and stripes of mirrors, checked against a reference model after
//! every step, with:
//! - bit flips, unreadable blocks and misdirected writes on all but one
//!   copy of any block; damaged checksum entries, dirty-log pages and
//!   label copies on those copies;
//! - power losses that drop or tear unflushed writes in any order (and
//!   cut the crashed pool off its disks: nothing it sends afterwards
//!   lands), and kill -9 (completed writes stay);
//! - a write still in flight across two flushes, then a crash;
//! - writes to disjoint ranges at once, from threads, beside a flush;
//! - writes in a client's class and in writeback's, mixed, so that one
//!   dirty-log write may serve both;
//! - a member that vanishes and is replaced, and one that misses a run of
//!   the server and returns stale (it is rebuilt, a chunk per step, while
//!   the workload goes on);
//! - a file system that fills under a member (ENOSPC) and frees up;
//! - a member the operator takes offline while writes go on, and brings
//!   back (only what it missed is rebuilt);
//! - heartbeats rewriting the first label copy between all of these, and
//!   a member another process stamps as its own (taken over from another
//!   host), which the label check faults and a replacement rebuilds;
//! - the volume table changing (volumes created and deleted on the running
//!   server) between all of these, and one copy of it damaged: the pool
//!   serves the last table it acknowledged after every crash, and every
//!   member in service, a returning or replacing one too, holds it;
//! - scrub steps between the operations.
//!
//! After the faults stop, a scrub must make every copy identical and
//! report exactly the bad copies it found.
//!
//! Silent corruption (flips, misdirected writes, damaged metadata) and
//! power loss never overlap: a power loss first ends the corruption epoch
//! with a flush and a scrub. Both at once can leave a block with no copy
//! that checks out (a torn write on the clean copy, a corrupt other copy);
//! that window is described in docs/on-disk.md. Unreadable blocks may meet
//! power losses; they are recoverable.
//!
//! `WEIR_SIM_SEEDS=N` runs N seeds (default 1000), from `WEIR_SIM_FIRST`
//! (default 0); `WEIR_SIM_SEED=S` runs one, `WEIR_SIM_LOG=1` shows the
//! pool's log, and `WEIR_SIM_HISTORY=1`
//! prints what it did. A failure names its seed.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::disk::{Gate, SimDisk, SECTOR};
use super::{any_copy, Fixture, DISK_BYTES};
use crate::pool::geometry::{DeviceRegions, CHECKSUM_ENTRY_BYTES, CHUNK_BYTES, VOLUME_TABLE_BYTES};
use crate::pool::holder::Holder;
use crate::pool::integrity::BlockSum;
use crate::pool::label::choose;
use crate::pool::members::{read_labels, write_labels};
use crate::pool::mirror::{Health, PoolData, BLOCKS_PER_CHUNK, DATA_BLOCK_BYTES};
use crate::pool::takeover::this_process;
use crate::pool::volume_table::{VolumeEntry, VolumeProperties, VolumeTable};
use crate::rng::Rng;
use crate::sched::IoClass;

const BLOCK: usize = DATA_BLOCK_BYTES as usize;
/// The logical range the workload touches: three chunks, so regions are
/// shared often and stripes span groups.
const RANGE_BLOCKS: u64 = 3 * BLOCKS_PER_CHUNK;
const OPS_PER_SEED: usize = 120;

/// What one logical block may read back as.
#[derive(Clone)]
struct Block {
    /// The value a read must return now.
    latest: Vec<u8>,
    /// The value a flush or FUA made durable.
    durable: Vec<u8>,
    /// Values written since: a power loss may leave any of them, or a
    /// sector-by-sector mix.
    pending: Vec<Vec<u8>>,
    /// Values of writes that failed (ENOSPC): the next read may return
    /// one of them instead of `latest`, and then the block holds it.
    failed: Vec<Vec<u8>>,
}

impl Default for Block {
    fn default() -> Block {
        Block {
            latest: vec![0; BLOCK],
            durable: vec![0; BLOCK],
            pending: Vec::new(),
            failed: Vec::new(),
        }
    }
}

#[derive(Default)]
struct Reference {
    blocks: HashMap<u64, Block>,
}

impl Reference {
    fn write(&mut self, first: u64, data: &[u8], durable: bool) {
        for (i, bytes) in data.chunks(BLOCK).enumerate() {
            let block = self.blocks.entry(first + i as u64).or_default();
            block.latest = bytes.to_vec();
            block.failed.clear();
            if durable {
                block.durable = bytes.to_vec();
                block.pending.clear();
            } else {
                block.pending.push(bytes.to_vec());
            }
        }
    }

    /// A write that failed: each block may hold the old or the new data.
    fn write_failed(&mut self, first: u64, data: &[u8]) {
        for (i, bytes) in data.chunks(BLOCK).enumerate() {
            let block = self.blocks.entry(first + i as u64).or_default();
            block.failed.push(bytes.to_vec());
            block.pending.push(bytes.to_vec());
        }
    }

    /// Whether a read may return `found` for the block; it then holds it.
    fn read_back(&mut self, index: u64, found: &[u8]) -> bool {
        let block = self.blocks.entry(index).or_default();
        if block.latest == found {
            block.failed.clear();
            return true;
        }
        if block.failed.iter().any(|f| f == found) {
            // A flush since the failed write may have made either durable.
            block.latest = found.to_vec();
            block.pending.push(found.to_vec());
            block.failed.clear();
            return true;
        }
        false
    }

    fn flush(&mut self) {
        for block in self.blocks.values_mut() {
            block.durable = block.latest.clone();
            block.pending.clear();
        }
    }

    #[allow(dead_code)]
    fn latest(&self, index: u64) -> Vec<u8> {
        self.blocks
            .get(&index)
            .map_or_else(|| vec![0; BLOCK], |b| b.latest.clone())
    }

    /// After a power loss: whether `found` is a legal state of the block,
    /// sector by sector; then it becomes the block's value.
    fn settle_after_crash(&mut self, index: u64, found: &[u8]) -> bool {
        let block = self.blocks.entry(index).or_default();
        let legal = found.chunks(SECTOR).enumerate().all(|(s, sector)| {
            let range = s * SECTOR..(s + 1) * SECTOR;
            std::iter::once(&block.durable)
                .chain(&block.pending)
                .chain(&block.failed)
                .any(|candidate| candidate[range.clone()] == *sector)
        });
        *block = Block {
            latest: found.to_vec(),
            durable: found.to_vec(),
            pending: Vec::new(),
            failed: Vec::new(),
        };
        legal
    }
}

struct Run {
    rng: Rng,
    fixture: Fixture,
    pool: Option<Arc<PoolData>>,
    reference: Reference,
    /// Members that may take data faults: all but the last of each group.
    data_faults: bool,
    /// A member that vanished and awaits replacement: (group, member).
    vanished: Option<(usize, usize)>,
    /// A member left out of the running server: it returns stale.
    absent: Option<(usize, usize)>,
    /// A member being rebuilt, a chunk per step.
    rebuilding: Option<(usize, usize)>,
    /// A member the operator took offline: no I/O until it is brought back.
    offline: Option<(usize, usize)>,
    /// A disk whose file system is full (its index).
    full: Option<usize>,
    /// Disks with one label copy damaged since they were last imported.
    damaged_labels: std::collections::HashSet<usize>,
    replacements: usize,
    /// Silent corruption may be present: scrub before any power loss.
    corrupt_epoch: bool,
    /// The volume table as last acknowledged.
    volume_table: VolumeTable,
    /// What happened, for the failure message.
    history: Vec<String>,
}

impl Run {
    fn pool(&self) -> &Arc<PoolData> {
        self.pool.as_ref().expect("the pool is open")
    }

    fn random_data(&mut self, blocks: u64) -> Vec<u8> {
        let mut data = Vec::with_capacity(blocks as usize * BLOCK);
        for _ in 0..blocks as usize * BLOCK / 8 {
            data.extend_from_slice(&self.rng.next_u64().to_le_bytes());
        }
        data
    }

    fn random_range(&mut self, blocks_max: u64) -> (u64, u64) {
        let first = self.rng.below(RANGE_BLOCKS);
        let count = 1 + self.rng.below(blocks_max.min(RANGE_BLOCKS - first));
        (first, count)
    }

    fn check_read(&mut self, first: u64, count: u64) -> Result<(), String> {
        let mut out = vec![0u8; count as usize * BLOCK];
        self.pool()
            .read(
                first * DATA_BLOCK_BYTES,
                &mut out,
                IoClass::SyncRead,
                &any_copy(),
            )
            .map_err(|e| format!("read of blocks {first}+{count} failed: {e}"))?;
        for i in 0..count {
            let got = &out[i as usize * BLOCK..(i as usize + 1) * BLOCK];
            if !self.reference.read_back(first + i, got) {
                return Err(format!(
                    "block {} read back wrong{}",
                    first + i,
                    self.describe(first + i, got)
                ));
            }
        }
        Ok(())
    }

    /// With WEIR_SIM_HISTORY: what each copy of a block holds.
    fn describe(&self, index: u64, found: &[u8]) -> String {
        if std::env::var("WEIR_SIM_HISTORY").is_err() {
            return String::new();
        }
        let pool = self.pool();
        let groups = pool.groups() as u64;
        let (chunk, within) = (index / BLOCKS_PER_CHUNK, index % BLOCKS_PER_CHUNK);
        let (group, local) = (
            (chunk % groups) as usize,
            chunk / groups * BLOCKS_PER_CHUNK + within,
        );
        let sum = pool.groups[group].state.lock().sums[local as usize];
        let block = self
            .reference
            .blocks
            .get(&index)
            .cloned()
            .unwrap_or_default();
        let crc = |b: &[u8]| crc32c::crc32c(b);
        let mut out = format!(
            " (found {:08x}, sum {sum:?}, latest {:08x}, failed {:?})",
            crc(found),
            crc(&block.latest),
            block
                .failed
                .iter()
                .map(|f| format!("{:08x}", crc(f)))
                .collect::<Vec<_>>()
        );
        for m in 0..self.fixture.copies {
            let disk = &self.fixture.disks[self.disk_of(group, m)];
            let at = self.fixture.data_start() + local * DATA_BLOCK_BYTES;
            let health = pool.groups[group].slots[m].health().name();
            out += &format!("; member {m} {health}: {:08x}", crc(&disk.peek(at, BLOCK)));
        }
        out
    }

    /// Write through the pool; a full disk may refuse it (ENOSPC only).
    fn write(&mut self, first: u64, data: &[u8], durable: bool) -> Result<(), String> {
        let class = self.write_class(durable);
        let result = self
            .pool()
            .write_as(first * DATA_BLOCK_BYTES, data, durable, class);
        self.settle_write(first, data, durable, result)
    }

    /// A client's write, or half the time when not FUA, the cache's
    /// writeback of one.
    fn write_class(&mut self, durable: bool) -> IoClass {
        if !durable && self.rng.below(2) == 0 {
            IoClass::AsyncWrite
        } else {
            IoClass::SyncWrite
        }
    }

    fn settle_write(
        &mut self,
        first: u64,
        data: &[u8],
        durable: bool,
        result: std::io::Result<()>,
    ) -> Result<(), String> {
        let count = data.len() / BLOCK;
        match result {
            Ok(()) => self.reference.write(first, data, durable),
            Err(err) if err.raw_os_error() == Some(libc::ENOSPC) && self.full.is_some() => {
                self.reference.write_failed(first, data);
                self.history.push(format!("  ENOSPC {first}+{count}"));
            }
            Err(err) => return Err(format!("write of blocks {first}+{count} failed: {err}")),
        }
        Ok(())
    }

    /// The disk index of (group, member).
    fn disk_of(&self, group: usize, member: usize) -> usize {
        group * self.fixture.copies + member
    }

    fn inject_data_fault(&mut self) {
        let groups = self.pool().groups();
        let group = self.rng.below(groups as u64) as usize;
        // Never the last member: one copy of every block stays clean.
        let member = self.rng.below(self.fixture.copies as u64 - 1) as usize;
        let disk = Arc::clone(&self.fixture.disks[self.disk_of(group, member)]);
        let start = self.fixture.data_start();
        let blocks_per_group = RANGE_BLOCKS / groups as u64 + BLOCKS_PER_CHUNK;
        let block = self.rng.below(blocks_per_group);
        let offset = start + block * DATA_BLOCK_BYTES;
        let kind = self.rng.below(3);
        self.corrupt_epoch |= kind != 1;
        let what = match kind {
            0 => {
                disk.flip_bit(offset + self.rng.below(DATA_BLOCK_BYTES), 3);
                "flip"
            }
            1 => {
                disk.make_bad(offset);
                "bad"
            }
            _ => {
                let end = start + blocks_per_group * DATA_BLOCK_BYTES;
                let delta = (1 + self.rng.below(16)) * DATA_BLOCK_BYTES;
                disk.misdirect_next(start, end, delta);
                "misdirect next write"
            }
        };
        self.history.push(format!(
            "{what}: group {group} member {member} data block {block}"
        ));
    }

    /// Flush and scrub away silent corruption, checking the repairs.
    fn end_corrupt_epoch(&mut self) -> Result<(), String> {
        for disk in &self.fixture.disks {
            disk.disarm();
        }
        // Blocks a full disk missed are damaged copies like any other: the
        // scrub repairs them once there is room.
        self.free_space()?;
        self.pool()
            .flush_all()
            .map_err(|e| format!("flush failed: {e}"))?;
        self.reference.flush();
        let expected = self.count_bad_copies();
        let (repaired, unrecoverable) = self.scrub()?;
        if unrecoverable != 0 || repaired != expected {
            return Err(format!(
                "scrub repaired {repaired} of {expected} bad copies, {unrecoverable} unrecoverable"
            ));
        }
        self.corrupt_epoch = false;
        self.history
            .push(format!("flush, scrub: {repaired} repaired"));
        Ok(())
    }

    fn crash_and_recover(&mut self) -> Result<(), String> {
        if self.corrupt_epoch {
            self.end_corrupt_epoch()?;
        }
        self.history.push("power loss".into());
        for disk in &self.fixture.disks {
            disk.power_loss(&mut self.rng);
        }
        self.pool.take().expect("open").crash();
        let refused: u64 = self
            .fixture
            .disks
            .iter()
            .map(|disk| disk.refused_after_power_loss())
            .sum();
        self.history
            .push(format!("the crashed pool's ops refused so far: {refused}"));
        self.reopen();
        self.check_volume_tables("after power loss")?;
        let mut out = vec![0u8; RANGE_BLOCKS as usize * BLOCK];
        self.pool()
            .read(0, &mut out, IoClass::SyncRead, &any_copy())
            .map_err(|e| format!("read after recovery failed: {e}"))?;
        for index in 0..RANGE_BLOCKS {
            let found = &out[index as usize * BLOCK..(index as usize + 1) * BLOCK];
            let candidates = self
                .reference
                .blocks
                .get(&index)
                .map_or(0, |b| b.pending.len());
            let zero = found.iter().all(|b| *b == 0);
            if !self.reference.settle_after_crash(index, found) {
                return Err(format!(
                    "after power loss block {index} holds data never written there \
                     ({candidates} unflushed writes; found zeroes: {zero}; data faults: {})",
                    self.data_faults
                ));
            }
        }
        if !self.data_faults {
            self.check_copies_agree("after recovery")?;
        }
        Ok(())
    }

    /// Damage one copy's metadata where it is not the last clean copy: a
    /// checksum entry in use, a dirty-log page, or one label copy.
    fn inject_metadata_fault(&mut self) {
        let groups = self.pool().groups();
        let group = self.rng.below(groups as u64) as usize;
        let member = self.rng.below(self.fixture.copies as u64 - 1) as usize;
        let disk_index = self.disk_of(group, member);
        let disk = Arc::clone(&self.fixture.disks[disk_index]);
        let regions = DeviceRegions::plan(DISK_BYTES).expect("fits");
        let blocks_per_group = RANGE_BLOCKS / groups as u64 + BLOCKS_PER_CHUNK;
        let bit = self.rng.below(8) as u8;
        let what = match self.rng.below(5) {
            4 => {
                disk.flip_bit(regions.volume_table.0 + self.rng.below(64), bit);
                "volume table".to_string()
            }
            0 | 1 => {
                let entry = self.rng.below(blocks_per_group);
                let at = regions.checksums.0 + entry * CHECKSUM_ENTRY_BYTES;
                disk.flip_bit(at + self.rng.below(CHECKSUM_ENTRY_BYTES), bit);
                format!("checksum entry {entry}")
            }
            2 => {
                disk.flip_bit(regions.dirty_log.0 + self.rng.below(4), bit);
                "dirty log".to_string()
            }
            _ if !self.damaged_labels.contains(&disk_index) => {
                // One copy at a time: the import repairs it from the other.
                self.damaged_labels.insert(disk_index);
                let copy = self.rng.below(2);
                let at = crate::pool::label::label_offsets(DISK_BYTES)[copy as usize];
                disk.flip_bit(at + self.rng.below(4096), bit);
                format!("label copy {copy}")
            }
            _ => return,
        };
        self.corrupt_epoch = true;
        self.history
            .push(format!("damage {what}: group {group} member {member}"));
    }

    /// A restart (clean, or kill -9) without one member: it misses writes.
    fn leave_member_out(&mut self) -> Result<(), String> {
        let group = self.rng.below(self.pool().groups() as u64) as usize;
        // With data faults the last member is the clean copy: it stays.
        let eligible = self.fixture.copies - usize::from(self.data_faults);
        let member = self.rng.below(eligible as u64) as usize;
        self.absent = Some((group, member));
        self.history
            .push(format!("restart without group {group} member {member}"));
        self.restart()
    }

    /// A restart with the left-out member back: it must be rebuilding.
    fn bring_member_back(&mut self) -> Result<(), String> {
        let Some((group, member)) = self.absent.take() else {
            return Ok(());
        };
        self.history
            .push(format!("restart with group {group} member {member} back"));
        self.restart()?;
        let health = self.pool().groups[group].slots[member].health();
        if health != Health::Resilvering {
            return Err(format!("a stale member returned {}", health.name()));
        }
        Ok(())
    }

    fn restart(&mut self) -> Result<(), String> {
        if self.rng.below(2) == 0 {
            self.crash_and_recover()
        } else {
            self.history.push("clean restart".into());
            super::close(self.pool.take().expect("open"));
            self.reopen();
            self.check_volume_tables("after a clean restart")
        }
    }

    /// One chunk of the rebuild of a returned member, or its end.
    fn rebuild_step(&mut self) -> Result<(), String> {
        let Some((group, member)) = self.rebuilding else {
            return Ok(());
        };
        let pool = Arc::clone(self.pool());
        let slot = &pool.groups[group].slots[member];
        let chunk = slot.resilvered_chunks.load(Ordering::SeqCst);
        if chunk < pool.chunks_per_group() {
            // A chunk that fails to copy (a full disk) reads from the others.
            let _ = pool.resilver_chunk(group, member, chunk);
            slot.resilvered_chunks.store(chunk + 1, Ordering::SeqCst);
            return Ok(());
        }
        pool.finish_resilver(group, member)
            .map_err(|e| format!("finishing the rebuild: {e}"))?;
        self.rebuilding = None;
        self.history
            .push(format!("group {group} member {member} rebuilt"));
        if !self.data_faults {
            // Only the regions the log held were copied: they must have
            // been all the member missed.
            self.check_copies_agree("after a rebuild")?;
        }
        Ok(())
    }

    /// A write held in flight across two flushes, completing during the
    /// second after it took its checksum pages; sometimes a crash follows.
    fn write_across_flushes(&mut self) -> Result<(), String> {
        let (first, count) = self.random_range(32);
        let data = self.random_data(count);
        let gate = Arc::new(Gate::default());
        for disk in &self.fixture.disks {
            disk.hold_writes(&gate, self.fixture.data_start());
        }
        let pool = Arc::clone(self.pool());
        // A write held at the disk holds its slot in the device queue; the
        // adaptive queue then waits for its timer before the flush.
        let sched = pool.sched();
        pool.set_sched(crate::sched::Mode::Fifo);
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (pool, data, finished) = (Arc::clone(&pool), data.clone(), Arc::clone(&finished));
            std::thread::spawn(move || {
                let result = pool.write(first * DATA_BLOCK_BYTES, &data, false);
                finished.store(true, Ordering::SeqCst);
                result
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while gate.held() == 0 && !finished.load(Ordering::SeqCst) {
            if std::time::Instant::now() > deadline {
                return Err("the held write never reached a disk".into());
            }
            std::thread::yield_now();
        }
        // The copies' writes leave together; let the rest of them arrive.
        // (One that arrives after the second flush only waits for the
        // deadline below.)
        let mut seen = gate.held();
        loop {
            std::thread::sleep(std::time::Duration::from_millis(1));
            let now = gate.held();
            if now == seen || finished.load(Ordering::SeqCst) {
                break;
            }
            seen = now;
        }
        let flushed = pool.flush_all();
        let watched = Arc::clone(&finished);
        gate.arm(move || {
            while !watched.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
        });
        let flushed = flushed.and_then(|()| pool.flush_all());
        for disk in &self.fixture.disks {
            disk.release_hold();
        }
        gate.open_now();
        pool.set_sched(sched);
        let result = writer
            .join()
            .map_err(|_| "the writer panicked".to_string())?;
        flushed.map_err(|e| format!("flush failed: {e}"))?;
        // Neither flush covers the write: it was not complete when either
        // began. Everything before it is durable.
        self.reference.flush();
        self.settle_write(first, &data, false, result)?;
        self.history
            .push(format!("write {first}+{count} held across two flushes"));
        if self.rng.below(2) == 0 {
            self.crash_and_recover()?;
        }
        Ok(())
    }

    /// Writes to disjoint ranges at once, from threads, sometimes with a
    /// flush beside them: writers that newly dirty log regions share the
    /// log's writes, and requests cross chunk and group boundaries.
    fn concurrent_writes(&mut self) -> Result<(), String> {
        let mut writes: Vec<(u64, Vec<u8>, bool, IoClass)> = Vec::new();
        for _ in 0..2 + self.rng.below(4) {
            let (first, count) = self.random_range(64);
            let apart = writes.iter().all(|(f, d, _, _)| {
                let c = (d.len() / BLOCK) as u64;
                first + count <= *f || f + c <= first
            });
            if apart {
                let durable = self.rng.below(4) == 0;
                let class = self.write_class(durable);
                writes.push((first, self.random_data(count), durable, class));
            }
        }
        let with_flush = self.rng.below(2) == 0;
        let pool = Arc::clone(self.pool());
        let writers: Vec<_> = writes
            .iter()
            .cloned()
            .map(|(first, data, durable, class)| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    pool.write_as(first * DATA_BLOCK_BYTES, &data, durable, class)
                })
            })
            .collect();
        let flushed = with_flush.then(|| pool.flush_all());
        let mut results = Vec::new();
        for writer in writers {
            results.push(writer.join().map_err(|_| "a writer panicked".to_string())?);
        }
        if let Some(flushed) = flushed {
            flushed.map_err(|e| format!("flush beside writes failed: {e}"))?;
            // It covers everything before the writes; each of them may or
            // may not be in it.
            self.reference.flush();
            self.history.push("flush beside the writes below".into());
        }
        for ((first, data, durable, _), result) in writes.iter().zip(results) {
            let count = data.len() / BLOCK;
            self.history
                .push(format!("concurrent write {first}+{count} fua={durable}"));
            self.settle_write(*first, data, *durable, result)?;
        }
        Ok(())
    }

    /// Open the pool from its disks, less those vanished or left out.
    /// A volume created or deleted on the running pool.
    fn change_volume_table(&mut self) -> Result<(), String> {
        let index = self.rng.below(4);
        let name = format!("v{index}");
        let chunks = 1 + self.rng.below(3);
        let changed = self.pool().change_volume_table(|table| {
            match table.volumes.iter().position(|v| v.name == name) {
                Some(at) => drop(table.volumes.remove(at)),
                None => table.volumes.push(VolumeEntry {
                    name: name.clone(),
                    size_bytes: chunks * CHUNK_BYTES,
                    block_bytes: 4096,
                    first_chunk: index * 4,
                    chunks,
                    properties: VolumeProperties {
                        read_only: index == 1,
                        cache: None,
                        description: format!("volume {index}"),
                    },
                }),
            }
            Ok(())
        });
        changed.map_err(|e| format!("changing the volume table: {e:#}"))?;
        self.volume_table = self.pool().volume_table();
        self.history.push(format!(
            "volume table: {name} at generation {}",
            self.volume_table.generation
        ));
        self.check_volume_tables("after a change")
    }

    /// The pool serves the table last acknowledged, and every member in
    /// service holds it on disk.
    fn check_volume_tables(&self, when: &str) -> Result<(), String> {
        let pool = self.pool();
        if pool.volume_table() != self.volume_table {
            return Err(format!(
                "{when}: the pool serves volume table generation {}, {} was acknowledged",
                pool.volume_table().generation,
                self.volume_table.generation
            ));
        }
        if self.volume_table.generation == 0 {
            return Ok(());
        }
        for (g, group) in pool.groups.iter().enumerate() {
            for (m, slot) in group.slots.iter().enumerate() {
                if slot.attached().is_none() || slot.health() == Health::Faulted {
                    continue;
                }
                let regions = DeviceRegions::plan(DISK_BYTES).expect("fits");
                let disk = &self.fixture.disks[self.disk_of(g, m)];
                let copy = disk.peek(regions.volume_table.0, VOLUME_TABLE_BYTES as usize);
                if VolumeTable::decode(&copy).as_ref() != Some(&self.volume_table) {
                    return Err(format!(
                        "{when}: group {g} member {m} ({}) does not hold the volume table",
                        slot.health().name()
                    ));
                }
            }
        }
        Ok(())
    }

    fn reopen(&mut self) {
        let absent: Vec<usize> = self
            .vanished
            .iter()
            .chain(&self.absent)
            .map(|&(g, m)| self.disk_of(g, m))
            .collect();
        let pool = self.fixture.open_without(&absent);
        // The import rewrote the damaged label copies of the disks it read.
        self.damaged_labels.retain(|d| absent.contains(d));
        self.pool = Some(Arc::clone(&pool));
        self.rebuilding = None;
        // A member offline at a restart returns stale and is rebuilt.
        self.offline = None;
        for (g, group) in pool.groups.iter().enumerate() {
            for (m, slot) in group.slots.iter().enumerate() {
                if slot.health() == Health::Resilvering {
                    self.rebuilding = Some((g, m));
                }
            }
        }
    }

    /// Every complete copy holds the same bytes for every data block, and
    /// those bytes match the checksum.
    fn check_copies_agree(&self, when: &str) -> Result<(), String> {
        let pool = self.pool();
        let start = self.fixture.data_start();
        for (g, group) in pool.groups.iter().enumerate() {
            let sums = group.state.lock().sums.clone();
            let online: Vec<usize> = (0..self.fixture.copies)
                .filter(|&m| group.slots[m].health() == Health::Online)
                .collect();
            for (b, sum) in sums.iter().enumerate() {
                if *sum == BlockSum::Zero {
                    continue;
                }
                for &m in &online {
                    let disk = &self.fixture.disks[self.disk_of(g, m)];
                    let copy = disk.peek(start + (b * BLOCK) as u64, BLOCK);
                    if !sum.verifies(&copy) {
                        return Err(format!(
                            "{when}: group {g} member {m} block {b} fails its checksum"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Bad copies (unreadable, or failing their checksum) of data blocks.
    fn count_bad_copies(&self) -> u64 {
        let pool = self.pool();
        let start = self.fixture.data_start();
        let mut bad = 0;
        for (g, group) in pool.groups.iter().enumerate() {
            let sums = group.state.lock().sums.clone();
            for m in 0..self.fixture.copies {
                if group.slots[m].health() != Health::Online {
                    continue;
                }
                let disk = &self.fixture.disks[self.disk_of(g, m)];
                for (b, sum) in sums.iter().enumerate() {
                    if *sum == BlockSum::Zero {
                        continue;
                    }
                    let offset = start + (b * BLOCK) as u64;
                    if disk.is_bad(offset) || !sum.verifies(&disk.peek(offset, BLOCK)) {
                        bad += 1;
                    }
                }
            }
        }
        bad
    }

    fn scrub(&self) -> Result<(u64, u64), String> {
        let pool = self.pool();
        let (mut repaired, mut unrecoverable) = (0, 0);
        for group in 0..pool.groups() {
            for chunk in 0..pool.chunks_per_group() {
                let result = pool
                    .scrub_chunk(group, chunk)
                    .map_err(|e| format!("scrub failed: {e}"))?;
                repaired += result.repaired;
                unrecoverable += result.unrecoverable;
            }
        }
        Ok((repaired, unrecoverable))
    }

    fn replace_vanished(&mut self) -> Result<(), String> {
        let Some((group, member)) = self.vanished.take() else {
            return Ok(());
        };
        self.replacements += 1;
        let name = format!("replacement{}", self.replacements);
        let fresh = Arc::new(SimDisk::of_kind(&name, DISK_BYTES, self.fixture.rotational));
        let pool = Arc::clone(self.pool());
        pool.attach_replacement(
            group,
            member,
            fresh.handle(),
            &name,
            1000 + self.replacements as u128,
        )
        .map_err(|e| format!("replace failed: {e}"))?;
        pool.resilver_now(group, member);
        if pool.groups[group].slots[member].health() != Health::Online {
            return Err("the resilver did not bring the member ONLINE".into());
        }
        let disk = self.disk_of(group, member);
        self.fixture.disks[disk] = fresh;
        self.fixture.names[disk] = name;
        Ok(())
    }

    fn step(&mut self) -> Result<(), String> {
        let quiet = self.vanished.is_none()
            && self.absent.is_none()
            && self.rebuilding.is_none()
            && self.offline.is_none();
        match self.rng.below(130) {
            0..=35 => {
                let (first, count) = self.random_range(32);
                let data = self.random_data(count);
                let durable = self.rng.below(4) == 0;
                self.history
                    .push(format!("write {first}+{count} fua={durable}"));
                self.write(first, &data, durable)?;
            }
            36..=39 => self.concurrent_writes()?,
            40..=64 => {
                let (first, count) = self.random_range(64);
                self.check_read(first, count)?;
            }
            65..=72 => {
                let (first, count) = self.random_range(64);
                self.pool()
                    .zero(first * DATA_BLOCK_BYTES, count * DATA_BLOCK_BYTES)
                    .map_err(|e| format!("zero failed: {e}"))?;
                let zeros = vec![0u8; count as usize * BLOCK];
                self.reference.write(first, &zeros, false);
                self.history.push(format!("zero {first}+{count}"));
            }
            73..=84 => {
                self.pool()
                    .flush_all()
                    .map_err(|e| format!("flush failed: {e}"))?;
                self.reference.flush();
                self.history.push("flush".into());
            }
            85..=94 if self.data_faults => self.inject_data_fault(),
            95..=97 => self.crash_and_recover()?,
            98 if quiet && !self.data_faults && self.replacements == 0 => {
                let group = self.rng.below(self.pool().groups() as u64) as usize;
                let member = self.rng.below(self.fixture.copies as u64) as usize;
                self.fixture.disks[self.disk_of(group, member)].vanish();
                self.vanished = Some((group, member));
                self.history
                    .push(format!("vanish: group {group} member {member}"));
            }
            99 => self.replace_vanished()?,
            100..=102 if self.data_faults => self.inject_metadata_fault(),
            103 if quiet && self.full.is_none() => self.leave_member_out()?,
            104 => self.bring_member_back()?,
            105..=109 => self.rebuild_step()?,
            110 if self.data_faults && self.full.is_none() => {
                // Not the last member: its copy of every block stays whole
                // (a block it missed for want of space is a damaged copy).
                let group = self.rng.below(self.pool().groups() as u64) as usize;
                let member = self.rng.below(self.fixture.copies as u64 - 1) as usize;
                let disk = self.disk_of(group, member);
                let room = self.rng.below(200) as usize;
                let fill = &self.fixture.disks[disk];
                fill.fill_at(fill.allocated_pages() + room);
                self.full = Some(disk);
                self.corrupt_epoch = true;
                self.history
                    .push(format!("disk {disk} full in {room} pages"));
            }
            111 => self.free_space()?,
            112..=114 if self.vanished.is_none() => self.write_across_flushes()?,
            120..=122 => {
                self.pool().beat();
                self.history.push("heartbeat".into());
            }
            123 if quiet && !self.data_faults && self.replacements == 0 => {
                self.take_over_member()?
            }
            124 if quiet && self.full.is_none() => self.take_offline()?,
            125 | 126 => self.bring_online()?,
            127..=129 => self.change_volume_table()?,
            115..=119 => {
                let group = self.rng.below(self.pool().groups() as u64) as usize;
                let chunk = self.rng.below(self.pool().chunks_per_group());
                let result = self
                    .pool()
                    .scrub_chunk(group, chunk)
                    .map_err(|e| format!("scrub failed: {e}"))?;
                if result.unrecoverable != 0 {
                    return Err(format!("scrub of chunk {chunk}: {result:?}"));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Another process stamps a member's label as its own, as a server on
    /// another host that reaches the same disk would: the label check must
    /// fault the member at once, and it is then replaced like a vanished one.
    fn take_over_member(&mut self) -> Result<(), String> {
        let group = self.rng.below(self.pool().groups() as u64) as usize;
        let member = self.rng.below(self.fixture.copies as u64) as usize;
        let disk = Arc::clone(&self.fixture.disks[self.disk_of(group, member)]);
        let label = choose(read_labels(disk.as_ref()))
            .map_err(|e| format!("the member's label: {e}"))?
            .label;
        let me = this_process();
        let other = Holder {
            machine_id: me.machine_id ^ 1,
            host: "elsewhere".into(),
            ..me
        };
        let copy = self.rng.below(2) as usize;
        write_labels(disk.as_ref(), &label, Some(&other), &[copy])
            .map_err(|e| format!("stamping failed: {e}"))?;
        // A heartbeat before the check must not write over the stamp.
        self.pool().beat();
        self.pool().check_labels();
        let health = self.pool().groups[group].slots[member].health();
        if health != Health::Faulted {
            return Err(format!("a member taken over stayed {}", health.name()));
        }
        self.vanished = Some((group, member));
        self.history.push(format!(
            "taken over (label copy {copy}): group {group} member {member}"
        ));
        Ok(())
    }

    /// The operator takes a member offline; writes go on without it.
    fn take_offline(&mut self) -> Result<(), String> {
        let group = self.rng.below(self.pool().groups() as u64) as usize;
        // With data faults the last member is the clean copy: it stays.
        let eligible = self.fixture.copies - usize::from(self.data_faults);
        let member = self.rng.below(eligible as u64) as usize;
        self.pool()
            .take_offline(group, member)
            .map_err(|e| format!("taking group {group} member {member} offline: {e}"))?;
        self.offline = Some((group, member));
        self.history
            .push(format!("offline: group {group} member {member}"));
        Ok(())
    }

    /// The offline member comes back: only what it missed is rebuilt, a
    /// chunk per step, and then every copy must agree.
    fn bring_online(&mut self) -> Result<(), String> {
        let Some((group, member)) = self.offline.take() else {
            return Ok(());
        };
        self.pool()
            .rejoin(group, member)
            .map_err(|e| format!("bringing group {group} member {member} online: {e}"))?;
        let health = self.pool().groups[group].slots[member].health();
        if health != Health::Resilvering {
            return Err(format!("a member brought online is {}", health.name()));
        }
        self.rebuilding = Some((group, member));
        self.history
            .push(format!("online: group {group} member {member}"));
        Ok(())
    }

    /// Give the full disk room again; it must still be in service.
    fn free_space(&mut self) -> Result<(), String> {
        let Some(disk) = self.full.take() else {
            return Ok(());
        };
        self.fixture.disks[disk].fill_at(usize::MAX);
        self.history.push(format!("disk {disk} has room again"));
        let (group, member) = (disk / self.fixture.copies, disk % self.fixture.copies);
        let slot = &self.pool().groups[group].slots[member];
        // Left out of the running pool, or taken offline: not faulted for
        // anything it did.
        let absent = slot.attached().is_none() || self.offline == Some((group, member));
        // Unreadable blocks that could not be rewritten for want of space
        // do fault it, as read errors.
        let read_errors = slot.counters.read_errors.load(Ordering::Relaxed);
        if !absent && slot.health() == Health::Faulted && read_errors < 32 {
            return Err(format!("disk {disk} was faulted for being full"));
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), String> {
        for disk in &self.fixture.disks {
            disk.disarm();
        }
        self.free_space()?;
        self.bring_member_back()?;
        self.bring_online()?;
        while self.rebuilding.is_some() {
            self.rebuild_step()?;
        }
        self.replace_vanished()?;
        let expected = self.count_bad_copies();
        let (repaired, unrecoverable) = self.scrub()?;
        if unrecoverable != 0 {
            return Err(format!("scrub found {unrecoverable} unrecoverable blocks"));
        }
        if repaired != expected {
            return Err(format!(
                "scrub repaired {repaired} block copies, {expected} were bad"
            ));
        }
        self.check_copies_agree("after scrub")?;
        self.check_volume_tables("after scrub")?;
        let (again, _) = self.scrub()?;
        if again != 0 {
            return Err(format!("a second scrub repaired {again} more"));
        }
        self.check_read(0, RANGE_BLOCKS)?;
        if !self.data_faults {
            let pool = self.pool();
            let checksum_errors: u64 = pool
                .groups
                .iter()
                .flat_map(|g| &g.slots)
                .map(|s| s.counters.checksum_errors.load(Ordering::Relaxed))
                .sum();
            if checksum_errors != 0 || pool.repairs() != 0 {
                return Err(format!(
                    "without data faults: {checksum_errors} checksum errors, {} repairs",
                    pool.repairs()
                ));
            }
        }
        Ok(())
    }
}

fn run_seed(seed: u64) -> Result<(), String> {
    run(Rng::new(seed))
}

/// One whole run, every decision drawn from `rng` (seeded, or scripted by
/// a fuzzer).
pub(crate) fn run(mut rng: Rng) -> Result<(), String> {
    if std::env::var("WEIR_SIM_LOG").is_ok() {
        let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    }
    let (groups, copies) = match rng.below(4) {
        0 | 1 => (1, 2),
        2 => (1, 3),
        _ => (2, 2),
    };
    let data_faults = rng.below(3) != 0;
    // Rotational disks take the queues' and the read selection's disk
    // paths (scrub positions steer reads; equal copies gather reads beside
    // background work).
    let rotational = rng.below(2) == 0;
    let fixture = Fixture::of_kind(groups, copies, rotational);
    let pool = fixture.open();
    let mut run = Run {
        rng,
        fixture,
        pool: Some(pool),
        reference: Reference::default(),
        data_faults,
        vanished: None,
        absent: None,
        offline: None,
        rebuilding: None,
        full: None,
        damaged_labels: Default::default(),
        replacements: 0,
        corrupt_epoch: false,
        volume_table: VolumeTable::default(),
        history: Vec::new(),
    };
    run.history.push(format!("layout {groups}x{copies}"));
    let result = (0..OPS_PER_SEED)
        .try_for_each(|_| run.step())
        .and_then(|()| run.finish());
    result.map_err(|why| {
        if std::env::var("WEIR_SIM_HISTORY").is_ok() {
            format!("{why}\n{}", run.history.join("\n"))
        } else {
            why
        }
    })
}

#[test]
fn every_seed_keeps_flushed_data_and_never_returns_wrong_bytes() {
    let seeds: Vec<u64> = match std::env::var("WEIR_SIM_SEED") {
        Ok(seed) => vec![seed.parse().expect("WEIR_SIM_SEED is a number")],
        Err(_) => {
            let count: u64 = std::env::var("WEIR_SIM_SEEDS")
                .map_or(1000, |n| n.parse().expect("WEIR_SIM_SEEDS is a number"));
            let first: u64 = std::env::var("WEIR_SIM_FIRST")
                .map_or(0, |n| n.parse().expect("WEIR_SIM_FIRST is a number"));
            (first..first + count).collect()
        }
    };
    // Seeds share nothing, and a seed spends much of its time waiting on
    // the pool's threads: they run side by side, each thread taking the
    // next seed, until five have failed.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = parking_lot::Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get() * 2);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(&seed) = seeds.get(index) else {
                    return;
                };
                if failures.lock().len() >= 5 {
                    return;
                }
                let failed = match std::panic::catch_unwind(|| run_seed(seed)) {
                    Ok(Ok(())) => continue,
                    Ok(Err(why)) => format!("seed {seed}: {why}"),
                    Err(_) => format!("seed {seed}: panicked"),
                };
                failures.lock().push((seed, failed));
            });
        }
    });
    let mut failures = failures.into_inner();
    failures.sort();
    let failures: Vec<String> = failures.into_iter().map(|(_, why)| why).collect();
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed (rerun one with WEIR_SIM_SEED=S):\n{}",
        failures.len(),
        seeds.len(),
        failures.join("\n")
    );
}
