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
