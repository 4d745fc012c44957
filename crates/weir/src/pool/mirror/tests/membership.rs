//! Membership that cannot go backwards: members that miss writes and
//! come back, and labels that are lost.

use super::{close, pattern, read, Fixture, CHUNK_BYTES};
use crate::device::Device;
use crate::pool::mirror::Health;

#[test]
fn a_member_absent_at_start_up_returns_stale_and_is_rebuilt_never_read() {
    let fixture = Fixture::new(1, 2);
    let length = 2 * CHUNK_BYTES as usize;
    let old = pattern(1, length);
    let new = pattern(2, length);
    let pool = fixture.open();
    pool.write(0, &old, true).unwrap();
    close(pool);

    // Member 0 is away for one run of the server, which writes NEW.
    let pool = fixture.open_without(&[0]);
    assert_eq!(pool.state_name(), "DEGRADED");
    pool.write(0, &new, true).unwrap();
    close(pool);

    // It returns holding OLD: it must not serve, nor be a repair source.
    let pool = fixture.open();
    assert_eq!(pool.groups[0].slots[0].health(), Health::Resilvering);
    assert_eq!(read(&pool, 0, length).unwrap(), new);
    for chunk in 0..pool.chunks_per_group() {
        pool.scrub_chunk(0, chunk).unwrap();
    }
    assert_eq!(read(&pool, 0, length).unwrap(), new);
    pool.resilver_now(0, 0);
    assert_eq!(pool.groups[0].slots[0].health(), Health::Online);
    let start = fixture.data_start();
    assert_eq!(fixture.disks[0].peek(start, length), new, "rebuilt");
    close(pool);

    // Whole again: a restart finds both members current.
    let pool = fixture.open();
    assert_eq!(pool.state_name(), "ONLINE");
    assert_eq!(read(&pool, 0, length).unwrap(), new);
}

#[test]
fn a_member_whose_labels_are_destroyed_is_unavailable_and_the_pool_serves() {
    let fixture = Fixture::new(1, 2);
    let data = pattern(3, CHUNK_BYTES as usize);
    let pool = fixture.open();
    pool.write(0, &data, true).unwrap();
    close(pool);
    let disk = &fixture.disks[0];
    let end = disk.info().size_bytes - 4096;
    for offset in [0, end] {
        disk.flip_bit(offset, 0);
    }
    let pool = fixture.open();
    assert_eq!(pool.state_name(), "DEGRADED");
    assert_eq!(pool.groups[0].slots[0].health(), Health::Faulted);
    assert_eq!(read(&pool, 0, data.len()).unwrap(), data);
    pool.write(0, &pattern(4, 4096), true).unwrap();
}

#[test]
fn labels_damaged_under_a_serving_pool_are_rewritten_or_fault_their_member() {
    let fixture = Fixture::new(1, 2);
    let pool = fixture.open();
    let end = fixture.disks[0].info().size_bytes - 4096;
    // One copy on member 0: rewritten from the pool's record.
    fixture.disks[0].flip_bit(100, 1);
    pool.check_labels();
    assert_eq!(pool.groups[0].slots[0].health(), Health::Online);
    let reread = crate::pool::members::read_labels(fixture.disks[0].as_ref());
    assert!(reread.iter().all(Result::is_ok), "both copies valid again");
    // Both copies on member 1: it is faulted, and the pool serves.
    fixture.disks[1].flip_bit(100, 1);
    fixture.disks[1].flip_bit(end + 100, 1);
    pool.check_labels();
    assert_eq!(pool.groups[0].slots[1].health(), Health::Faulted);
    pool.write(0, &pattern(5, 4096), true).unwrap();
    assert_eq!(read(&pool, 0, 4096).unwrap(), pattern(5, 4096));
}
