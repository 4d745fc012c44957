//! Metadata that heals like data: damaged checksum entries and dirty-log
//! pages on one copy.

use super::{close, pattern, read, Fixture, CHUNK_BYTES};
use crate::pool::geometry::{DeviceRegions, CHECKSUM_ENTRY_BYTES};

use super::DISK_BYTES;

fn regions() -> DeviceRegions {
    DeviceRegions::plan(DISK_BYTES).expect("fits")
}

#[test]
fn a_corrupt_checksum_entry_on_one_copy_is_outvoted_at_open_and_rewritten() {
    let fixture = Fixture::new(1, 2);
    let data = pattern(5, CHUNK_BYTES as usize);
    let pool = fixture.open();
    pool.write(0, &data, true).unwrap();
    close(pool);
    // Block 3's entry on the first member: one bit of its crc.
    let entry = regions().checksums.0 + 3 * CHECKSUM_ENTRY_BYTES;
    fixture.disks[0].flip_bit(entry + 1, 4);
    let pool = fixture.open();
    assert_eq!(read(&pool, 0, data.len()).unwrap(), data);
    assert_eq!(pool.repairs(), 0, "the data was never in doubt");
    // The open rewrote the page: both copies hold the same entries again.
    let page = regions().checksums.0;
    assert_eq!(
        fixture.disks[0].peek(page, 4096),
        fixture.disks[1].peek(page, 4096)
    );
}

#[test]
fn the_same_entry_corrupt_on_every_copy_is_rebuilt_from_the_data() {
    let fixture = Fixture::new(1, 2);
    let data = pattern(6, CHUNK_BYTES as usize);
    let pool = fixture.open();
    pool.write(0, &data, true).unwrap();
    close(pool);
    let entry = regions().checksums.0 + 7 * CHECKSUM_ENTRY_BYTES;
    fixture.disks[0].flip_bit(entry + 6, 0);
    fixture.disks[1].flip_bit(entry + 2, 5);
    let pool = fixture.open();
    assert_eq!(read(&pool, 0, data.len()).unwrap(), data);
}

#[test]
fn a_scrub_rewrites_a_checksum_page_damaged_while_serving() {
    let fixture = Fixture::new(1, 2);
    let data = pattern(7, 2 * CHUNK_BYTES as usize);
    let pool = fixture.open();
    pool.write(0, &data, true).unwrap();
    let entry = regions().checksums.0 + 300 * CHECKSUM_ENTRY_BYTES;
    fixture.disks[1].flip_bit(entry + 5, 2);
    for chunk in 0..pool.chunks_per_group() {
        pool.scrub_chunk(0, chunk).unwrap();
    }
    assert_eq!(pool.metadata_repairs(), 1);
    let page = regions().checksums.0;
    assert_eq!(
        fixture.disks[0].peek(page, 4096),
        fixture.disks[1].peek(page, 4096)
    );
    close(pool);
    let pool = fixture.open();
    assert_eq!(read(&pool, 0, data.len()).unwrap(), data);
}

#[test]
fn a_dirty_log_page_damaged_on_one_copy_loses_no_bit() {
    let fixture = Fixture::new(1, 2);
    let data = pattern(8, CHUNK_BYTES as usize);
    let pool = fixture.open();
    pool.write(0, &pattern(9, CHUNK_BYTES as usize), true)
        .unwrap();
    // An unflushed write, then a crash: region 0 must be recovered even
    // though one copy of its log bit is gone.
    pool.write(0, &data, false).unwrap();
    pool.crash();
    fixture.disks[0].flip_bit(regions().dirty_log.0, 0);
    let pool = fixture.open();
    let found = read(&pool, 0, data.len()).expect("recovered");
    let start = fixture.data_start();
    assert_eq!(
        fixture.disks[0].peek(start, data.len()),
        fixture.disks[1].peek(start, data.len())
    );
    assert_eq!(found, data);
}
