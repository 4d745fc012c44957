//! A member whose file system fills: ENOSPC to the client, never a fault.

use super::{pattern, read, Fixture, CHUNK_BYTES, DATA_BLOCK_BYTES};
use crate::pool::mirror::Health;

#[test]
fn a_full_member_returns_enospc_stays_online_and_every_block_still_reads() {
    let fixture = Fixture::new(1, 2);
    let pool = fixture.open();
    let flushed = pattern(1, CHUNK_BYTES as usize);
    pool.write(0, &flushed, true).unwrap();
    // Member 1 has room for 100 more data pages: a 2 MiB write tears.
    let full = &fixture.disks[1];
    full.fill_at(full.allocated_pages() + 100);
    let length = 2 * CHUNK_BYTES as usize;
    let torn = pattern(2, length);
    let err = pool.write(CHUNK_BYTES, &torn, false).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert_eq!(pool.groups[0].slots[1].health(), Health::Online);
    pool.flush_all().expect("a flush needs no new space");
    // Each block reads the new data or zeroes (what it held), never EIO.
    let found = read(&pool, CHUNK_BYTES, length).expect("readable");
    let block = DATA_BLOCK_BYTES as usize;
    for (b, got) in found.chunks(block).enumerate() {
        assert!(
            *got == torn[b * block..(b + 1) * block] || got.iter().all(|x| *x == 0),
            "block {b}"
        );
    }
    assert_eq!(read(&pool, 0, flushed.len()).unwrap(), flushed);
    // A crash and a recovery on the full disk: the pool opens.
    pool.crash();
    let pool = fixture.open();
    assert_eq!(read(&pool, 0, flushed.len()).unwrap(), flushed);
    read(&pool, CHUNK_BYTES, length).expect("readable after recovery");
    assert_eq!(pool.state_name(), "ONLINE");
}
