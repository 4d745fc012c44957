//! Crash consistency where requests overlap: a write in flight across
//! flushes, made exact with a `Gate` on the disks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::disk::Gate;
use super::{pattern, read, Fixture, CHUNK_BYTES, DATA_BLOCK_BYTES};
use crate::pool::integrity::BlockSum;

fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_write_that_completes_during_a_flush_is_recovered_after_a_crash() {
    let fixture = Fixture::new(1, 2);
    let pool = fixture.open();
    let length = 2 * CHUNK_BYTES as usize;
    let old = pattern(1, length);
    pool.write(0, &old, true).unwrap();

    // The new write reaches neither disk until the second flush below.
    let gate = Arc::new(Gate::default());
    for disk in &fixture.disks {
        disk.hold_writes(&gate, fixture.data_start());
    }
    let new = pattern(2, length);
    let writer = {
        let (pool, new) = (Arc::clone(&pool), new.clone());
        std::thread::spawn(move || pool.write(0, &new, false))
    };
    // One write per chunk per copy.
    wait_until("every copy's writes held", || gate.held() == 4);
    pool.flush_all().unwrap();

    // The second flush takes its checksum pages, then the write completes
    // (its checksums change in memory), then the flush completes.
    let new_sum = BlockSum::of(&new[..DATA_BLOCK_BYTES as usize]);
    let watched = Arc::clone(&pool);
    gate.arm(move || {
        wait_until("the write's checksums in memory", || {
            watched.groups[0].state.lock().sums[0] == new_sum
        })
    });
    pool.flush_all().unwrap();
    writer.join().unwrap().unwrap();

    // kill -9: every completed write is on the disks, nothing more.
    pool.crash();
    let pool = fixture.open();
    let found = read(&pool, 0, length).expect("every block reads after recovery");
    for (b, block) in found.chunks(DATA_BLOCK_BYTES as usize).enumerate() {
        let range = b * DATA_BLOCK_BYTES as usize..(b + 1) * DATA_BLOCK_BYTES as usize;
        assert!(
            *block == old[range.clone()] || *block == new[range],
            "block {b} holds neither the old nor the new data"
        );
    }
}

/// A block as one writer wrote it: `tag` in every 4-byte word.
fn tagged_block(tag: u32) -> Vec<u8> {
    tag.to_le_bytes().repeat(DATA_BLOCK_BYTES as usize / 4)
}

/// Every block of `data` is zeroes or one writer's whole block.
fn whole_blocks(data: &[u8]) -> Result<(), usize> {
    for (b, block) in data.chunks(DATA_BLOCK_BYTES as usize).enumerate() {
        let tag = u32::from_le_bytes(block[..4].try_into().unwrap());
        if block != tagged_block(tag).as_slice() {
            return Err(b);
        }
    }
    Ok(())
}

#[test]
fn concurrent_writes_zeroes_and_flushes_over_the_same_blocks_keep_every_copy_in_step() {
    // Two groups of two copies: requests cross chunk and group boundaries.
    let fixture = Fixture::new(2, 2);
    let pool = fixture.open();
    let region_blocks = 4 * CHUNK_BYTES / DATA_BLOCK_BYTES;
    let threads: Vec<_> = (0..4u32)
        .map(|thread| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let mut rng = crate::rng::Rng::new(u64::from(thread) + 1);
                for op in 0..300u32 {
                    let count = 1 + rng.below(24);
                    let first = rng.below(region_blocks - count);
                    let (offset, length) = (first * DATA_BLOCK_BYTES, count * DATA_BLOCK_BYTES);
                    match rng.below(10) {
                        0..=4 => {
                            let data: Vec<u8> = (0..count as u32)
                                .flat_map(|b| tagged_block((thread << 24) | (op << 8) | b))
                                .collect();
                            pool.write(offset, &data, rng.below(8) == 0).unwrap();
                        }
                        5 => pool.zero(offset, length).unwrap(),
                        6 => pool.flush_all().unwrap(),
                        _ => {
                            let found = read(&pool, offset, length as usize).unwrap();
                            if let Err(b) = whole_blocks(&found) {
                                panic!(
                                    "thread {thread} op {op}: block {} is torn",
                                    first + b as u64
                                );
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let length = (region_blocks * DATA_BLOCK_BYTES) as usize;
    let settled = read(&pool, 0, length).expect("every block reads");
    whole_blocks(&settled).expect("no torn block");
    pool.flush_all().unwrap();
    // Each group's two copies hold the same bytes: overlapping writes
    // reached them in the same order.
    let per_group = (2 * CHUNK_BYTES) as usize;
    for group in 0..2 {
        let a = fixture.disks[group * 2].peek(fixture.data_start(), per_group);
        let b = fixture.disks[group * 2 + 1].peek(fixture.data_start(), per_group);
        assert!(a == b, "group {group}: the copies differ");
    }
    pool.crash();
    let pool = fixture.open();
    let recovered = read(&pool, 0, length).expect("every block reads after recovery");
    assert!(recovered == settled, "flushed data changed across a crash");
}

/// Two writes to one dirty-log region: the first sets the region's bit
/// and writes the log; the second finds the bit already set in memory.
/// Its data must still wait until the log write that carries the bit is
/// durable, or a crash in between leaves new data under old checksums in
/// a region that recovery does not visit.
#[test]
fn a_write_waits_for_its_regions_log_bit_to_be_durable_when_another_write_set_it() {
    let fixture = Fixture::new(1, 2);
    let pool = fixture.open();
    let regions = crate::pool::geometry::DeviceRegions::plan(super::DISK_BYTES).expect("fits");
    let gate = Arc::new(Gate::default());
    for disk in &fixture.disks {
        let (log_at, log_bytes) = regions.dirty_log;
        disk.hold_writes_in(&gate, log_at, log_at + log_bytes);
    }
    let block = DATA_BLOCK_BYTES as usize;
    let first = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || pool.write(0, &pattern(1, block), false))
    };
    // The log page, on both copies.
    wait_until("the first write's log write held", || gate.held() == 2);
    let second = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || pool.write(DATA_BLOCK_BYTES, &pattern(2, block), false))
    };
    std::thread::sleep(Duration::from_millis(100));
    let at = fixture.data_start() + DATA_BLOCK_BYTES;
    for disk in &fixture.disks {
        assert!(
            disk.peek(at, block) != pattern(2, block),
            "the second write reached a disk before its region's log bit was durable"
        );
    }
    gate.open_now();
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
    for disk in &fixture.disks {
        assert!(disk.peek(at, block) == pattern(2, block));
    }
}
