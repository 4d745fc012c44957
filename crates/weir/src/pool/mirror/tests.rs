//! Pool behaviour on simulated disks: healing, narrowing, faults, replace.
//! The torture test, a seeded whole-pool simulation under every
//! recoverable fault, is in `tests/torture.rs`.

#![cfg_attr(not(test), allow(dead_code, unused_imports))]

mod disk;
#[cfg(test)]
mod membership;
#[cfg(test)]
mod metadata;
#[cfg(test)]
mod races;
#[cfg(test)]
mod space;
pub(crate) mod torture;

use std::sync::Arc;

use disk::SimDisk;

use super::select::ReadPolicy;
use super::{Health, PoolData, CHUNK_BYTES, DATA_BLOCK_BYTES};
use crate::pool::geometry::DeviceRegions;
use crate::pool::import::import_devices;
use crate::pool::label::{Label, Layout};
use crate::pool::members::write_labels;
use crate::rng::Rng;
use crate::sched::IoClass;
use std::sync::atomic::Ordering;

const DISK_BYTES: u64 = 8 << 20;

/// A labelled pool of `groups` mirror groups with `copies` members each.
struct Fixture {
    disks: Vec<Arc<SimDisk>>,
    names: Vec<String>,
    copies: usize,
    /// The disks say they are rotational.
    rotational: bool,
}

impl Fixture {
    fn new(groups: usize, copies: usize) -> Fixture {
        Fixture::of_kind(groups, copies, false)
    }

    /// A pool whose disks say they are rotational, or flash.
    fn of_kind(groups: usize, copies: usize, rotational: bool) -> Fixture {
        let names: Vec<String> = (0..groups * copies).map(|i| format!("disk{i}")).collect();
        let disks: Vec<Arc<SimDisk>> = names
            .iter()
            .map(|n| Arc::new(SimDisk::of_kind(n, DISK_BYTES, rotational)))
            .collect();
        let layout = Layout {
            groups: (0..groups)
                .map(|g| {
                    (0..copies)
                        .map(|m| (100 + g * copies + m) as u128)
                        .collect()
                })
                .collect(),
        };
        for (i, disk) in disks.iter().enumerate() {
            let label = Label {
                pool_id: 7,
                pool_name: "sim".into(),
                device_id: 100 + i as u128,
                generation: 1,
                device_bytes: DISK_BYTES,
                block_bytes: 4096,
                layout: layout.clone(),
                resilvering: false,
            };
            write_labels(disk.as_ref(), &label, None, &[0, 1]).expect("label");
        }
        Fixture {
            disks,
            names,
            copies,
            rotational,
        }
    }

    /// Import from the disks not in `absent` and open (one worker thread).
    fn open_without(&self, absent: &[usize]) -> Arc<PoolData> {
        let opened = self
            .names
            .iter()
            .zip(&self.disks)
            .enumerate()
            .filter(|(i, _)| !absent.contains(i))
            .map(|(_, (n, d))| (n.clone(), SimDisk::handle(d)))
            .collect();
        let imported = import_devices(&self.names, opened, true).expect("import");
        PoolData::open_with_workers(&imported, 1).expect("open")
    }

    fn open(&self) -> Arc<PoolData> {
        self.open_without(&[])
    }

    fn data_start(&self) -> u64 {
        DeviceRegions::plan(DISK_BYTES).expect("fits").data.0
    }
}

/// Close `pool` cleanly on this thread before the disks are opened again.
fn close(pool: Arc<PoolData>) {
    assert!(
        PoolData::close_when_released(pool, std::time::Duration::from_secs(10)),
        "a completion still holds the pool"
    );
}

fn pattern(seed: u8, length: usize) -> Vec<u8> {
    (0..length)
        .map(|i| seed.wrapping_add((i / 4096) as u8).wrapping_mul(31) ^ (i as u8))
        .collect()
}

/// A client read, its copy left to the selector.
fn any_copy() -> super::read::ReadSource {
    super::read::ReadSource::Client { requester: 0 }
}

fn read(pool: &Arc<PoolData>, offset: u64, length: usize) -> std::io::Result<Vec<u8>> {
    let mut out = vec![0u8; length];
    pool.read(offset, &mut out, IoClass::SyncRead, &any_copy())?;
    Ok(out)
}

/// Device operations of `class` sent to each member of group 0 so far.
fn ops_of(pool: &Arc<PoolData>, class: IoClass) -> Vec<u64> {
    pool.groups[0]
        .writable()
        .iter()
        .map(|(_, attached)| attached.queue.counters(class).ops.load(Ordering::Relaxed))
        .collect()
}

/// Write `byte` over the disk's first 4 KiB through `device`.
fn write_page(device: &dyn crate::device::Device, byte: u8) -> std::io::Result<()> {
    let mut buf = crate::device::AlignedBuf::new(4096);
    buf.as_mut_slice().fill(byte);
    let op = crate::device::DeviceOp::Write {
        offset: 0,
        buf: buf.into(),
        durable: false,
    };
    crate::device::run_sync(device, op).result
}

#[test]
fn a_power_loss_cuts_the_handles_opened_before_it() {
    let disk = Arc::new(SimDisk::new("d", 1 << 20));
    let before = disk.handle();
    write_page(before.as_ref(), 1).expect("a live handle writes");
    disk.power_loss(&mut Rng::new(1));
    let after = disk.handle();
    let refused = write_page(before.as_ref(), 2).expect_err("a cut handle writes nothing");
    assert_eq!(refused.raw_os_error(), Some(libc::ENXIO));
    assert_eq!(disk.refused_after_power_loss(), 1);
    let page = disk.peek(0, 4096);
    assert!(
        page.iter().all(|b| *b == page[0]) && page[0] != 2,
        "the cut handle's write reached the disk"
    );
    write_page(after.as_ref(), 3).expect("a handle made after the power loss writes");
    assert!(disk.peek(0, 4096).iter().all(|b| *b == 3));
}

#[test]
fn the_log_write_a_write_needs_goes_in_that_write_s_class() {
    let fixture = Fixture::new(1, 2);
    let pool = fixture.open();
    let data = pattern(3, DATA_BLOCK_BYTES as usize);
    let write = |offset: u64, class: IoClass| {
        let mut buf = crate::device::AlignedBuf::new(data.len());
        buf.as_mut_slice().copy_from_slice(&data);
        let outcome =
            super::io_ops::wait(|done| pool.write_submit(offset, buf.into(), false, class, done));
        outcome.result.expect("write");
    };
    let sync_before = ops_of(&pool, IoClass::SyncWrite);
    let async_before = ops_of(&pool, IoClass::AsyncWrite);
    // Writeback into a region no write has touched: its log bit must be
    // durable first, and that log write is writeback as well.
    write(0, IoClass::AsyncWrite);
    assert_eq!(
        ops_of(&pool, IoClass::SyncWrite),
        sync_before,
        "no client-class I/O"
    );
    for (after, before) in ops_of(&pool, IoClass::AsyncWrite).iter().zip(&async_before) {
        assert!(
            after - before >= 2,
            "the log page and the data: {before} -> {after}"
        );
    }
    // A client's write to another new region takes the client's class.
    write(2 * CHUNK_BYTES, IoClass::SyncWrite);
    for (after, before) in ops_of(&pool, IoClass::SyncWrite).iter().zip(&sync_before) {
        assert!(
            after - before >= 2,
            "the log page and the data: {before} -> {after}"
        );
    }
    assert_eq!(read(&pool, 0, data.len()).unwrap(), data);
    assert_eq!(read(&pool, 2 * CHUNK_BYTES, data.len()).unwrap(), data);
}

#[test]
fn a_failed_read_is_narrowed_to_the_bad_blocks_and_only_they_are_repaired() {
    let fixture = Fixture::new(1, 2);
    let pool = fixture.open();
    let data = pattern(1, CHUNK_BYTES as usize);
    pool.write(0, &data, true).unwrap();
    // Chunk 0 is read from member 0; two of its 256 blocks fail to read.
    let start = fixture.data_start();
    fixture.disks[0].make_bad(start + 5 * DATA_BLOCK_BYTES);
    fixture.disks[0].make_bad(start + 200 * DATA_BLOCK_BYTES);
    assert_eq!(read(&pool, 0, data.len()).unwrap(), data);
    assert_eq!(pool.repairs(), 2, "only the two bad blocks are rewritten");
    let slot = &pool.groups[0].slots[0];
    assert_eq!(slot.health(), Health::Online);
    // Healed: the same read now costs no repair.
    assert_eq!(read(&pool, 0, data.len()).unwrap(), data);
    assert_eq!(pool.repairs(), 2);
}

#[test]
fn a_vanished_member_is_faulted_the_pool_keeps_serving_and_a_replacement_resilvers() {
    let mut fixture = Fixture::new(1, 2);
    let pool = fixture.open();
    let first = pattern(2, 2 * CHUNK_BYTES as usize);
    pool.write(0, &first, true).unwrap();
    fixture.disks[1].vanish();
    let second = pattern(3, CHUNK_BYTES as usize);
    pool.write(3 * CHUNK_BYTES, &second, false).unwrap();
    pool.flush_all().unwrap();
    assert_eq!(pool.groups[0].slots[1].health(), Health::Faulted);
    assert_eq!(pool.state_name(), "DEGRADED");
    assert_eq!(read(&pool, 0, first.len()).unwrap(), first);
    close(pool);

    // Reopened without it, the pool is DEGRADED and still serves.
    let pool = fixture.open_without(&[1]);
    assert_eq!(pool.state_name(), "DEGRADED");
    assert_eq!(read(&pool, 3 * CHUNK_BYTES, second.len()).unwrap(), second);

    // A blank disk takes its place and is resilvered.
    let fresh = Arc::new(SimDisk::new("fresh", DISK_BYTES));
    pool.attach_replacement(0, 1, fresh.handle(), "fresh", 999)
        .unwrap();
    assert_eq!(pool.groups[0].slots[1].health(), Health::Resilvering);
    pool.resilver_now(0, 1);
    assert_eq!(pool.groups[0].slots[1].health(), Health::Online);
    assert_eq!(pool.state_name(), "ONLINE");
    let start = fixture.data_start();
    let chunks = 4 * CHUNK_BYTES as usize;
    assert_eq!(
        fixture.disks[0].peek(start, chunks),
        fresh.peek(start, chunks),
        "the new copy equals the old one"
    );
    close(pool);

    // After a restart the replacement is a full member, found by its label.
    fixture.disks[1] = fresh;
    fixture.names[1] = "fresh".into();
    let pool = fixture.open();
    assert_eq!(pool.state_name(), "ONLINE");
    assert_eq!(read(&pool, 0, first.len()).unwrap(), first);
    assert_eq!(fixture.copies, 2);
}

#[test]
fn the_last_complete_copy_is_never_faulted() {
    let fixture = Fixture::new(1, 2);
    let pool = fixture.open();
    fixture.disks[0].vanish();
    fixture.disks[1].vanish();
    assert!(pool.write(0, &pattern(4, 4096), false).is_err());
    // Every copy failing is not one member's fault: both stay.
    assert_eq!(pool.state_name(), "ONLINE");
}

#[test]
fn bad_checksums_on_one_copy_never_reach_a_reader_and_every_bad_block_is_healed() {
    let fixture = Fixture::new(1, 2);
    let pool = fixture.open();
    assert_eq!(pool.read_policy(), ReadPolicy::Latency, "the default");
    let length = (pool.chunks_per_group() * CHUNK_BYTES) as usize;
    let mut rng = Rng::new(6);
    let data: Vec<u8> = (0..length).map(|_| rng.next_u64() as u8).collect();
    pool.write(0, &data, true).unwrap();
    // One bit flipped in each of 40 blocks of copy 0, behind the pool's
    // back: the copy the selector starts on (equal copies stay on the
    // first until it fails).
    let start = fixture.data_start();
    let blocks = length as u64 / DATA_BLOCK_BYTES;
    let mut bad = std::collections::BTreeSet::new();
    while bad.len() < 40 {
        bad.insert(rng.below(blocks));
    }
    for block in &bad {
        let at = start + block * DATA_BLOCK_BYTES + rng.below(DATA_BLOCK_BYTES);
        fixture.disks[0].flip_bit(at, rng.below(8) as u8);
    }
    // Client reads of 4-64 KiB all over the volume, from 4 requesters.
    for i in 0..3000 {
        let first = rng.below(blocks);
        let count = (1 + rng.below(16)).min(blocks - first);
        let (offset, len) = (
            first * DATA_BLOCK_BYTES,
            (count * DATA_BLOCK_BYTES) as usize,
        );
        let mut out = vec![0u8; len];
        let source = super::read::ReadSource::Client { requester: i % 4 };
        pool.read(offset, &mut out, IoClass::SyncRead, &source)
            .unwrap();
        assert!(
            out == data[offset as usize..offset as usize + len],
            "read {i} at {offset}"
        );
    }
    let by_reads = pool.repairs();
    assert!(
        by_reads >= 1,
        "the reads met a bad block on copy 0 and healed it"
    );
    let estimates = pool.groups[0].selector.lock().estimates(pool.clock_ns());
    assert!(estimates[1].reads > 0, "then copy 1 served: {estimates:?}");
    // The blocks the reads did not meet on copy 0, the scrub heals.
    let chunks = pool.chunks_per_group();
    let by_scrub: u64 = (0..chunks)
        .map(|c| pool.scrub_chunk(0, c).unwrap().repaired)
        .sum();
    assert_eq!(
        by_reads + by_scrub,
        bad.len() as u64,
        "each bad block, once"
    );
    assert_eq!(
        fixture.disks[0].peek(start, length),
        fixture.disks[1].peek(start, length),
        "the copies agree again"
    );
    let again: u64 = (0..chunks)
        .map(|c| pool.scrub_chunk(0, c).unwrap().repaired)
        .sum();
    assert_eq!(again, 0);
}

#[test]
fn reads_use_a_resilvering_copy_only_where_the_resilver_has_been() {
    let fixture = Fixture::new(1, 2);
    let pool = fixture.open();
    let data = pattern(4, 4 * CHUNK_BYTES as usize);
    pool.write(0, &data, true).unwrap();
    pool.set_read_policy(ReadPolicy::RoundRobin);
    assert_eq!(pool.read_policy(), ReadPolicy::RoundRobin);
    // Member 1 is being rebuilt and has been copied up to chunk 2.
    let slot = &pool.groups[0].slots[1];
    slot.set_health(Health::Resilvering);
    slot.resilvered_chunks.store(2, Ordering::SeqCst);
    let reads_of_1 = || slot.counters.reads.load(Ordering::Relaxed);
    // Round-robin would give it every other 256 KiB; past chunk 2 it gets none.
    for round in 0..8 {
        let offset = 2 * CHUNK_BYTES + (round % 2) * CHUNK_BYTES;
        assert_eq!(
            read(&pool, offset, 256 << 10).unwrap(),
            data[offset as usize..][..256 << 10]
        );
    }
    assert_eq!(reads_of_1(), 0);
    for round in 0..8 {
        let offset = (round % 2) * CHUNK_BYTES;
        assert_eq!(
            read(&pool, offset, 256 << 10).unwrap(),
            data[offset as usize..][..256 << 10]
        );
    }
    assert_eq!(reads_of_1(), 4, "half the reads of the chunks it has");
}

#[test]
fn a_scrub_reading_each_copy_on_its_own_repairs_each_bad_block_once() {
    use crate::pool::scrub::{Checkpoint, Scrub, ScrubState};
    let fixture = Fixture::new(1, 2);
    let pool = fixture.open();
    let chunks = pool.chunks_per_group();
    assert!(chunks >= 3, "room for three bad chunks");
    let length = (chunks * CHUNK_BYTES) as usize;
    pool.write(0, &pattern(9, length), true).unwrap();
    // Copy 0 bad in chunk 0, copy 1 in chunk 1, both copies of one block
    // in chunk 2 (nothing good left of it).
    let start = fixture.data_start();
    let block_at = |chunk: u64, block: u64| start + chunk * CHUNK_BYTES + block * DATA_BLOCK_BYTES;
    fixture.disks[0].flip_bit(block_at(0, 3) + 17, 2);
    fixture.disks[1].flip_bit(block_at(1, 5) + 900, 6);
    fixture.disks[0].flip_bit(block_at(2, 7), 0);
    fixture.disks[1].flip_bit(block_at(2, 7) + 4000, 1);
    let dir = tempfile::tempdir().unwrap();
    let run = || {
        let scrub = Scrub::spawn(&pool, dir.path(), Checkpoint::new(&pool));
        let done = scrub.wait_while(ScrubState::Running);
        scrub.shutdown();
        done
    };
    let first = run();
    assert_eq!(first.state, ScrubState::Finished);
    assert_eq!(first.chunks_done, first.chunks_total);
    assert_eq!(first.repaired, 2, "one bad block on each copy: {first:?}");
    assert_eq!(
        first.unrecoverable, 1,
        "counted once, not per copy: {first:?}"
    );
    assert!(
        first.bytes_read >= 2 * chunks * CHUNK_BYTES,
        "every copy of every chunk read: {first:?}"
    );
    assert_eq!(
        fixture.disks[0].peek(start, 2 * CHUNK_BYTES as usize),
        fixture.disks[1].peek(start, 2 * CHUNK_BYTES as usize),
        "the repaired chunks agree"
    );
    let second = run();
    assert_eq!(
        (second.repaired, second.unrecoverable),
        (0, 1),
        "{second:?}"
    );
}
