//! Serving volumes from a pool: mirrored writes, checksummed reads that heal
//! a bad copy from a good one, and the dirty-region log that makes a crash
//! recoverable (docs/on-disk.md).
//!
//! ```text
//!  PoolVolume (a Store) ──> PoolData: groups striped by 1 MiB chunk
//!     write: lock chunks ─> log bits durable (new regions) ─> data to every member
//!            ─> checksums in memory (pages persisted at FLUSH / FUA)
//!     read:  lock chunks shared ─> one member (rotating by chunk) ─> verify every
//!            4 KiB block ─> a bad block is read from the others, returned if
//!            good, and rewritten on the bad copy; no good copy: EIO
//!     open:  recover every dirty region first (integrity::resolve per block)
//! ```
//!
//! Every op runs on one of the pool's worker threads, which waits on the
//! member devices for it; simple before fast, for now.

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::admin::Imported;
use super::geometry::{
    DeviceRegions, Piece, Stripe, CHECKSUM_ENTRY_BYTES, CHUNK_BYTES, DATA_BLOCK_BYTES,
};
use super::integrity::{resolve, BlockSum, CopyState, DirtyLog, Resolution};
use super::volume_table::VolumeEntry;
use super::{Store, StoreInfo};
use crate::device::workers::Workers;
use crate::device::{run_sync, AlignedBuf, Completion, Device, DeviceOp, Extent, Outcome};
use crate::sched::IoClass;

/// Threads per pool that run ops. Each waits on the devices for its op, so
/// this bounds the pool's queue depth: clients commonly keep 32 in flight.
const WORKER_THREADS: usize = 64;
const LOCK_STRIPES: usize = 1024;
const PAGE_BYTES: u64 = 4096;
/// Checksum entries per 4 KiB page of the checksum region.
const SUMS_PER_PAGE: u64 = PAGE_BYTES / CHECKSUM_ENTRY_BYTES;
const BLOCKS_PER_CHUNK: u64 = CHUNK_BYTES / DATA_BLOCK_BYTES;

struct Member {
    device: Arc<dyn Device>,
    regions: DeviceRegions,
}

struct GroupState {
    /// One entry per 4 KiB block of the group's data region.
    sums: Vec<BlockSum>,
    /// Checksum pages changed since they were last written.
    dirty_pages: BTreeSet<u64>,
    log: DirtyLog,
}

struct Group {
    members: Vec<Member>,
    state: Mutex<GroupState>,
}

/// One pool, opened: every volume of it shares this.
pub struct PoolData {
    name: String,
    groups: Vec<Group>,
    stripe: Stripe,
    locks: Vec<Arc<RwLock<()>>>,
    repairs: AtomicU64,
    rotational: bool,
    workers: Workers,
}

fn io_err(what: String) -> io::Error {
    io::Error::other(what)
}

/// Run ops on several devices at once and wait for all.
fn run_all(ops: Vec<(Arc<dyn Device>, DeviceOp)>) -> Vec<Outcome> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let count = ops.len();
    for (index, (device, op)) in ops.into_iter().enumerate() {
        let sender = sender.clone();
        device.submit(
            op,
            Box::new(move |outcome| drop(sender.send((index, outcome)))),
        );
    }
    let mut outcomes: Vec<Option<Outcome>> = (0..count).map(|_| None).collect();
    for _ in 0..count {
        let (index, outcome) = receiver.recv().expect("devices complete every op");
        outcomes[index] = Some(outcome);
    }
    outcomes
        .into_iter()
        .map(|o| o.expect("every op answered"))
        .collect()
}

fn read_at(device: &dyn Device, offset: u64, length: u64) -> io::Result<AlignedBuf> {
    let outcome = run_sync(
        device,
        DeviceOp::Read {
            offset,
            buf: AlignedBuf::new(length as usize),
        },
    );
    outcome.result?;
    Ok(outcome.buf.expect("reads return their buffer"))
}

fn write_at(device: &dyn Device, offset: u64, bytes: &[u8], durable: bool) -> io::Result<()> {
    let mut buf = AlignedBuf::new(bytes.len());
    buf.as_mut_slice().copy_from_slice(bytes);
    run_sync(
        device,
        DeviceOp::Write {
            offset,
            buf,
            durable,
        },
    )
    .result
}

impl PoolData {
    /// Open an ONLINE pool: load checksums and logs, recover dirty regions.
    pub fn open(pool: &Imported) -> io::Result<Arc<PoolData>> {
        if pool.state() != "ONLINE" {
            return Err(io_err(format!(
                "pool {:?} is {}; serving needs every member ONLINE for now",
                pool.label.pool_name,
                pool.state()
            )));
        }
        let mut groups = Vec::new();
        let mut chunks_per_group = u64::MAX;
        for devices in &pool.devices {
            let mut members = Vec::new();
            for device in devices.iter().flatten() {
                let regions = DeviceRegions::plan(device.info().size_bytes)
                    .ok_or_else(|| io_err("a member is too small".into()))?;
                chunks_per_group = chunks_per_group.min(regions.data_chunks());
                members.push(Member {
                    device: Arc::clone(device),
                    regions,
                });
            }
            groups.push(members);
        }
        let stripe = Stripe {
            groups: groups.len(),
            chunks_per_group,
        };
        let blocks = (chunks_per_group * BLOCKS_PER_CHUNK) as usize;
        let mut opened = Vec::new();
        for members in groups {
            let sums = load_sums(&members, blocks)?;
            let dirty = load_dirty(&members, chunks_per_group)?;
            opened.push(Group {
                members,
                state: Mutex::new(GroupState {
                    sums,
                    dirty_pages: BTreeSet::new(),
                    log: DirtyLog::from_disk(dirty),
                }),
            });
        }
        let rotational = opened
            .iter()
            .flat_map(|g| &g.members)
            .any(|m| m.device.info().rotational);
        let data = Arc::new(PoolData {
            name: pool.label.pool_name.clone(),
            groups: opened,
            stripe,
            locks: (0..LOCK_STRIPES)
                .map(|_| Arc::new(RwLock::new(())))
                .collect(),
            repairs: AtomicU64::new(0),
            rotational,
            workers: Workers::start("weir-pool", WORKER_THREADS)?,
        });
        for (index, group) in data.groups.iter().enumerate() {
            let dirty: Vec<u64> = group.state.lock().log.dirty_regions().collect();
            if !dirty.is_empty() {
                tracing::info!(
                    pool = data.name,
                    group = index,
                    regions = dirty.len(),
                    "recovering dirty regions"
                );
            }
            for chunk in dirty {
                data.recover_chunk(group, chunk)?;
            }
            data.flush_group(group)?;
        }
        Ok(data)
    }

    pub fn repairs(&self) -> u64 {
        self.repairs.load(Ordering::Relaxed)
    }

    /// Make every copy of one chunk agree, block by block.
    fn recover_chunk(&self, group: &Group, chunk: u64) -> io::Result<()> {
        let page = chunk * BLOCKS_PER_CHUNK / SUMS_PER_PAGE;
        let mut copies = Vec::new();
        for m in &group.members {
            let data = read_at(
                m.device.as_ref(),
                m.regions.data.0 + chunk * CHUNK_BYTES,
                CHUNK_BYTES,
            );
            let sums = read_at(
                m.device.as_ref(),
                m.regions.checksums.0 + page * PAGE_BYTES,
                PAGE_BYTES,
            );
            copies.push((data.ok(), sums.ok()));
        }
        let first_in_page = (chunk * BLOCKS_PER_CHUNK % SUMS_PER_PAGE) as usize;
        let mut resolved = vec![0u8; CHUNK_BYTES as usize];
        let mut state = group.state.lock();
        for block in 0..BLOCKS_PER_CHUNK as usize {
            let range = block * DATA_BLOCK_BYTES as usize..(block + 1) * DATA_BLOCK_BYTES as usize;
            let states: Vec<CopyState> = copies
                .iter()
                .map(|(data, sums)| {
                    let stored = sums.as_ref().map_or(BlockSum::Data(0), |s| {
                        let at = (first_in_page + block) * CHECKSUM_ENTRY_BYTES as usize;
                        BlockSum::decode(s.as_slice()[at..at + 8].try_into().expect("8 bytes"))
                    });
                    CopyState {
                        readable: data.is_some() && sums.is_some(),
                        stored,
                        actual: data
                            .as_ref()
                            .map_or(0, |d| crc32c::crc32c(&d.as_slice()[range.clone()])),
                    }
                })
                .collect();
            let index = (chunk * BLOCKS_PER_CHUNK) as usize + block;
            match resolve(&states) {
                Resolution::Data { source, sum } => {
                    let data = copies[source]
                        .0
                        .as_ref()
                        .expect("resolved copies are readable");
                    resolved[range]
                        .copy_from_slice(&data.as_slice()[block * 4096..(block + 1) * 4096]);
                    state.sums[index] = sum;
                }
                Resolution::Zero => state.sums[index] = BlockSum::Zero,
                Resolution::Unreadable => {
                    return Err(io_err(format!(
                        "{}: chunk {chunk}: no copy readable",
                        self.name
                    )))
                }
            }
            state.dirty_pages.insert(index as u64 / SUMS_PER_PAGE);
        }
        drop(state);
        for m in &group.members {
            write_at(
                m.device.as_ref(),
                m.regions.data.0 + chunk * CHUNK_BYTES,
                &resolved,
                false,
            )?;
        }
        Ok(())
    }

    /// Persist changed checksum pages, flush every member, clear quiet regions.
    fn flush_group(&self, group: &Group) -> io::Result<()> {
        let (covered, pages) = {
            let mut state = group.state.lock();
            let covered = state.log.start_flush();
            let pages: Vec<(u64, Vec<u8>)> = std::mem::take(&mut state.dirty_pages)
                .into_iter()
                .map(|page| (page, page_bytes(&state.sums, page)))
                .collect();
            (covered, pages)
        };
        write_pages(group, |r| r.checksums.0, &pages, false, "checksum write")?;
        let flushes = group
            .members
            .iter()
            .map(|m| (Arc::clone(&m.device), DeviceOp::Flush))
            .collect();
        check_all(run_all(flushes), "flush")?;
        let cleared = group.state.lock().log.after_flush(&covered);
        if !cleared.is_empty() {
            // Losing a clear only means an extra recovery: no durability needed.
            self.write_log_bits(group, &cleared, false)?;
        }
        Ok(())
    }

    /// Write the log blocks holding `regions`' bits to every member.
    fn write_log_bits(&self, group: &Group, regions: &[u64], durable: bool) -> io::Result<()> {
        let blocks: BTreeSet<u64> = regions.iter().map(|r| r / (PAGE_BYTES * 8)).collect();
        let images: Vec<(u64, Vec<u8>)> = {
            let state = group.state.lock();
            blocks
                .iter()
                .map(|&block| {
                    let mut bytes = vec![0u8; PAGE_BYTES as usize];
                    for bit in 0..PAGE_BYTES * 8 {
                        if state.log.is_dirty(block * PAGE_BYTES * 8 + bit) {
                            bytes[(bit / 8) as usize] |= 1 << (bit % 8);
                        }
                    }
                    (block, bytes)
                })
                .collect()
        };
        write_pages(
            group,
            |r| r.dirty_log.0,
            &images,
            durable,
            "dirty log write",
        )
    }

    /// The lock stripes covering `pieces`, in a deadlock-free order.
    fn stripes(&self, pieces: &[Piece]) -> Vec<usize> {
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

    fn write(&self, logical: u64, data: &[u8], durable: bool) -> io::Result<()> {
        let pieces = self.stripe.map(logical, data.len() as u64);
        let stripes = self.stripes(&pieces);
        let _guards: Vec<_> = stripes.iter().map(|&s| self.locks[s].write()).collect();
        self.announce(&pieces)?;
        let mut ops = Vec::new();
        for piece in &pieces {
            let bytes =
                &data[piece.range_offset as usize..(piece.range_offset + piece.length) as usize];
            for m in &self.groups[piece.group].members {
                let mut buf = AlignedBuf::new(bytes.len());
                buf.as_mut_slice().copy_from_slice(bytes);
                let offset = m.regions.data.0 + piece.data_offset;
                ops.push((
                    Arc::clone(&m.device),
                    DeviceOp::Write {
                        offset,
                        buf,
                        durable: false,
                    },
                ));
            }
        }
        let written = check_all(run_all(ops), "write");
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
                self.flush_group(&self.groups[group])?;
            }
        }
        Ok(())
    }

    /// Set the log bits of the regions `pieces` touch, durably where new.
    fn announce(&self, pieces: &[Piece]) -> io::Result<()> {
        for piece in pieces {
            let group = &self.groups[piece.group];
            let newly = group.state.lock().log.before_write(Self::regions_of(piece));
            if !newly.is_empty() {
                self.write_log_bits(group, &newly, true)?;
            }
        }
        Ok(())
    }

    fn touched_groups(&self, pieces: &[Piece]) -> BTreeSet<usize> {
        pieces.iter().map(|p| p.group).collect()
    }

    /// Mark whole blocks as zero: no data I/O.
    fn zero(&self, logical: u64, length: u64) -> io::Result<()> {
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

    fn read(&self, logical: u64, out: &mut [u8]) -> io::Result<bool> {
        let pieces = self.stripe.map(logical, out.len() as u64);
        let stripes = self.stripes(&pieces);
        let _guards: Vec<_> = stripes.iter().map(|&s| self.locks[s].read()).collect();
        let mut all_zero = true;
        for piece in &pieces {
            let target =
                &mut out[piece.range_offset as usize..(piece.range_offset + piece.length) as usize];
            all_zero &= self.read_piece(piece, target)?;
        }
        Ok(all_zero)
    }

    /// Fill `out` with the piece's verified data; true if it is all zero blocks.
    fn read_piece(&self, piece: &Piece, out: &mut [u8]) -> io::Result<bool> {
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
        // Spread reads over the copies by chunk, so a sequential reader uses all.
        let copies = group.members.len();
        let preferred = (piece.data_offset / CHUNK_BYTES) as usize % copies;
        let member = &group.members[preferred];
        let whole = read_at(
            member.device.as_ref(),
            member.regions.data.0 + piece.data_offset,
            piece.length,
        );
        for (i, sum) in sums.iter().enumerate() {
            let range = i * DATA_BLOCK_BYTES as usize..(i + 1) * DATA_BLOCK_BYTES as usize;
            if *sum == BlockSum::Zero {
                out[range].fill(0);
                continue;
            }
            if let Ok(data) = &whole {
                let block = &data.as_slice()[range.clone()];
                if sum.verifies(block) {
                    out[range].copy_from_slice(block);
                    continue;
                }
            }
            // This copy failed (EIO or checksum): try the others, heal it.
            let block_offset = piece.data_offset + (i as u64) * DATA_BLOCK_BYTES;
            let good = (1..copies)
                .map(|step| &group.members[(preferred + step) % copies])
                .find_map(|m| {
                    read_at(
                        m.device.as_ref(),
                        m.regions.data.0 + block_offset,
                        DATA_BLOCK_BYTES,
                    )
                    .ok()
                    .filter(|b| sum.verifies(b.as_slice()))
                });
            let Some(good) = good else {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            };
            out[range].copy_from_slice(good.as_slice());
            let healed = write_at(
                member.device.as_ref(),
                member.regions.data.0 + block_offset,
                good.as_slice(),
                true,
            );
            self.repairs.fetch_add(1, Ordering::Relaxed);
            match healed {
                Ok(()) => tracing::warn!(
                    pool = self.name,
                    group = piece.group,
                    member = preferred,
                    block_offset,
                    "repaired a bad block from another copy"
                ),
                Err(err) => {
                    tracing::warn!(pool = self.name, error = %err, "cannot rewrite a bad block")
                }
            }
        }
        Ok(false)
    }

    /// The common read without a worker thread: one piece, its chunk lock
    /// free, the device read submitted from the caller's thread and
    /// verified in its completion. Anything else (a lock held, a bad block,
    /// an error) goes back to the caller for the worker path.
    fn read_fast(
        self: &Arc<Self>,
        logical: u64,
        buf: AlignedBuf,
        done: Completion,
    ) -> Result<(), (AlignedBuf, Completion)> {
        let pieces = self.stripe.map(logical, buf.len() as u64);
        let [piece] = pieces[..] else {
            return Err((buf, done));
        };
        let mut guards = Vec::new();
        for stripe in self.stripes(&pieces) {
            match self.locks[stripe].try_read_arc() {
                Some(guard) => guards.push(guard),
                None => return Err((buf, done)),
            }
        }
        let group = &self.groups[piece.group];
        let first = (piece.data_offset / DATA_BLOCK_BYTES) as usize;
        let sums: Vec<BlockSum> =
            group.state.lock().sums[first..first + buf.len() / DATA_BLOCK_BYTES as usize].to_vec();
        if sums.iter().all(|s| *s == BlockSum::Zero) {
            let mut buf = buf;
            buf.as_mut_slice().fill(0);
            drop(guards);
            done(Outcome {
                result: Ok(()),
                buf: Some(buf),
                hole: true,
            });
            return Ok(());
        }
        let copies = group.members.len();
        let member = &group.members[(piece.data_offset / CHUNK_BYTES) as usize % copies];
        let offset = member.regions.data.0 + piece.data_offset;
        let pool = Arc::clone(self);
        member.device.submit(
            DeviceOp::Read { offset, buf },
            Box::new(move |mut outcome: Outcome| {
                drop(guards);
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
                if verified {
                    drop(pool);
                    return done(outcome);
                }
                // A bad copy or an error: the worker path reads, heals, answers.
                let buf = outcome
                    .buf
                    .take()
                    .unwrap_or_else(|| AlignedBuf::new(piece.length as usize));
                let workers_pool = Arc::clone(&pool);
                drop(pool);
                let job_pool = Arc::clone(&workers_pool);
                workers_pool.workers.run(Box::new(move || {
                    let outcome = job_pool.read_outcome(logical, buf);
                    drop(job_pool);
                    done(outcome)
                }));
            }),
        );
        Ok(())
    }

    fn read_outcome(&self, logical: u64, mut buf: AlignedBuf) -> Outcome {
        match self.read(logical, buf.as_mut_slice()) {
            Ok(hole) => Outcome {
                result: Ok(()),
                buf: Some(buf),
                hole,
            },
            Err(err) => Outcome::done(Err(err)),
        }
    }

    fn flush(&self) -> io::Result<()> {
        for group in &self.groups {
            self.flush_group(group)?;
        }
        Ok(())
    }

    fn zero_blocks(&self, logical: u64, length: u64) -> Vec<bool> {
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

impl PoolData {
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    pub fn chunks_per_group(&self) -> u64 {
        self.stripe.chunks_per_group
    }

    pub fn data_bytes_per_group(&self) -> u64 {
        self.stripe.chunks_per_group * CHUNK_BYTES
    }

    /// Read every allocated block of every copy of one chunk, verify it,
    /// and rewrite bad copies from a good one. Chunks that hold no data
    /// cost no I/O.
    pub fn scrub_chunk(&self, group_index: usize, chunk: u64) -> io::Result<ScrubResult> {
        let group = &self.groups[group_index];
        let stripe = ((chunk as usize) * self.stripe.groups + group_index) % LOCK_STRIPES;
        let _guard = self.locks[stripe].write();
        let first = (chunk * BLOCKS_PER_CHUNK) as usize;
        let sums: Vec<BlockSum> =
            group.state.lock().sums[first..first + BLOCKS_PER_CHUNK as usize].to_vec();
        let mut result = ScrubResult::default();
        if sums.iter().all(|s| *s == BlockSum::Zero) {
            return Ok(result);
        }
        let ops = group
            .members
            .iter()
            .map(|m| {
                let buf = AlignedBuf::new(CHUNK_BYTES as usize);
                (
                    Arc::clone(&m.device),
                    DeviceOp::Read {
                        offset: m.regions.data.0 + chunk * CHUNK_BYTES,
                        buf,
                    },
                )
            })
            .collect();
        let copies: Vec<Option<AlignedBuf>> = run_all(ops)
            .into_iter()
            .map(|o| o.result.ok().and(o.buf))
            .collect();
        result.bytes_read = copies.iter().flatten().count() as u64 * CHUNK_BYTES;
        for (block, sum) in sums.iter().enumerate() {
            if *sum == BlockSum::Zero {
                continue;
            }
            let range = block * DATA_BLOCK_BYTES as usize..(block + 1) * DATA_BLOCK_BYTES as usize;
            let good: Vec<bool> = copies
                .iter()
                .map(|c| {
                    c.as_ref()
                        .is_some_and(|c| sum.verifies(&c.as_slice()[range.clone()]))
                })
                .collect();
            let Some(source) = good.iter().position(|g| *g) else {
                result.unrecoverable += 1;
                continue;
            };
            let data = copies[source]
                .as_ref()
                .expect("good copies were read")
                .as_slice()[range.clone()]
            .to_vec();
            for (index, ok) in good.iter().enumerate() {
                if *ok {
                    continue;
                }
                let m = &group.members[index];
                let offset = m.regions.data.0 + chunk * CHUNK_BYTES + range.start as u64;
                write_at(m.device.as_ref(), offset, &data, true)?;
                result.repaired += 1;
                self.repairs.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(result)
    }
}

impl Drop for PoolData {
    /// A clean close: flush, then clear the dirty-region log, so that the
    /// next open has nothing to recover.
    fn drop(&mut self) {
        for group in &self.groups {
            let closed = self.flush_group(group).and_then(|()| {
                let cleared = group.state.lock().log.clear_after_final_flush();
                if cleared.is_empty() {
                    Ok(())
                } else {
                    self.write_log_bits(group, &cleared, true)
                }
            });
            if let Err(err) = closed {
                tracing::warn!(pool = self.name, error = %err, "unclean close: the next open recovers");
            }
        }
    }
}

/// Write 4 KiB `pages` (index, bytes) of one metadata region, whose start
/// `region_at` gives per member, to every member of the group.
fn write_pages(
    group: &Group,
    region_at: impl Fn(&DeviceRegions) -> u64,
    pages: &[(u64, Vec<u8>)],
    durable: bool,
    what: &str,
) -> io::Result<()> {
    let mut ops = Vec::new();
    for m in &group.members {
        for (page, bytes) in pages {
            let mut buf = AlignedBuf::new(bytes.len());
            buf.as_mut_slice().copy_from_slice(bytes);
            let offset = region_at(&m.regions) + page * PAGE_BYTES;
            ops.push((
                Arc::clone(&m.device),
                DeviceOp::Write {
                    offset,
                    buf,
                    durable,
                },
            ));
        }
    }
    check_all(run_all(ops), what)
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
        bytes[i * 8..i * 8 + 8].copy_from_slice(&sum.encode());
    }
    bytes
}

fn check_all(outcomes: Vec<Outcome>, what: &str) -> io::Result<()> {
    for outcome in outcomes {
        if let Err(err) = outcome.result {
            return Err(io::Error::new(err.kind(), format!("{what}: {err}")));
        }
    }
    Ok(())
}

/// Checksums of the group's blocks, from the first member that reads.
fn load_sums(members: &[Member], blocks: usize) -> io::Result<Vec<BlockSum>> {
    let bytes = (blocks as u64 * CHECKSUM_ENTRY_BYTES).next_multiple_of(PAGE_BYTES);
    let mut last_err = io_err("no members".into());
    for m in members {
        match read_at(m.device.as_ref(), m.regions.checksums.0, bytes) {
            Ok(buf) => {
                return Ok(buf.as_slice()[..blocks * 8]
                    .chunks(8)
                    .map(|c| BlockSum::decode(c.try_into().expect("8 bytes")))
                    .collect())
            }
            Err(err) => last_err = err,
        }
    }
    Err(last_err)
}

/// Regions any member marks dirty.
fn load_dirty(members: &[Member], chunks: u64) -> io::Result<Vec<u64>> {
    let bytes = chunks.div_ceil(8).next_multiple_of(PAGE_BYTES);
    let mut dirty = BTreeSet::new();
    for m in members {
        let buf = read_at(m.device.as_ref(), m.regions.dirty_log.0, bytes)?;
        for chunk in 0..chunks {
            if buf.as_slice()[(chunk / 8) as usize] & (1 << (chunk % 8)) != 0 {
                dirty.insert(chunk);
            }
        }
    }
    Ok(dirty.into_iter().collect())
}

/// One volume of an opened pool, as the server's volume layer sees it.
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

    fn submit(&self, _class: IoClass, op: DeviceOp, done: Completion) {
        let (offset, length) = op.range();
        assert!(
            offset + length <= self.info.size_bytes,
            "op past the volume: {op:?}"
        );
        let base = self.first_byte;
        let (op, done) = match op {
            DeviceOp::Read { offset, buf } => match self.pool.read_fast(base + offset, buf, done) {
                Ok(()) => return,
                Err((buf, done)) => (DeviceOp::Read { offset, buf }, done),
            },
            other => (other, done),
        };
        let pool = Arc::clone(&self.pool);
        self.pool.workers.run(Box::new(move || {
            let outcome = match op {
                DeviceOp::Read { offset, buf } => pool.read_outcome(base + offset, buf),
                DeviceOp::Write {
                    offset,
                    buf,
                    durable,
                } => Outcome {
                    result: pool.write(base + offset, buf.as_slice(), durable),
                    buf: Some(buf),
                    hole: false,
                },
                DeviceOp::Flush => Outcome::done(pool.flush()),
                DeviceOp::Discard { offset, length }
                | DeviceOp::WriteZeroes { offset, length, .. } => {
                    Outcome::done(pool.zero(base + offset, length))
                }
            };
            // Let go of the pool before answering: the last reference must
            // drop on the server's thread, never on one of these workers
            // (closing the pool joins them).
            drop(pool);
            done(outcome)
        }));
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
