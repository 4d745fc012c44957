//! Pool behaviour on simulated disks: healing, narrowing, faults, replace.
//! The seeded whole-pool simulation is in `tests/seeds.rs`.

mod disk;
mod seeds;

use std::sync::Arc;

use disk::SimDisk;

use super::{Health, PoolData, CHUNK_BYTES, DATA_BLOCK_BYTES};
use crate::device::Device;
use crate::pool::admin::import_devices;
use crate::pool::geometry::DeviceRegions;
use crate::pool::label::{Label, Layout};
use crate::pool::members::write_labels;
use crate::sched::IoClass;

const DISK_BYTES: u64 = 8 << 20;

/// A labelled pool of `groups` mirror groups with `copies` members each.
struct Fixture {
    disks: Vec<Arc<SimDisk>>,
    names: Vec<String>,
    copies: usize,
}

impl Fixture {
    fn new(groups: usize, copies: usize) -> Fixture {
        let names: Vec<String> = (0..groups * copies).map(|i| format!("disk{i}")).collect();
        let disks: Vec<Arc<SimDisk>> = names
            .iter()
            .map(|n| Arc::new(SimDisk::new(n, DISK_BYTES)))
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
            write_labels(disk.as_ref(), &label, &[0, 1]).expect("label");
        }
        Fixture {
            disks,
            names,
            copies,
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
            .map(|(_, (n, d))| (n.clone(), Arc::clone(d) as Arc<dyn Device>))
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

fn pattern(seed: u8, length: usize) -> Vec<u8> {
    (0..length)
        .map(|i| seed.wrapping_add((i / 4096) as u8).wrapping_mul(31) ^ (i as u8))
        .collect()
}

fn read(pool: &PoolData, offset: u64, length: usize) -> std::io::Result<Vec<u8>> {
    let mut out = vec![0u8; length];
    pool.read(offset, &mut out, IoClass::SyncRead)?;
    Ok(out)
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
    drop(pool);

    // Reopened without it, the pool is DEGRADED and still serves.
    let pool = fixture.open_without(&[1]);
    assert_eq!(pool.state_name(), "DEGRADED");
    assert_eq!(read(&pool, 3 * CHUNK_BYTES, second.len()).unwrap(), second);

    // A blank disk takes its place and is resilvered.
    let fresh = Arc::new(SimDisk::new("fresh", DISK_BYTES));
    pool.attach_replacement(0, 1, Arc::clone(&fresh) as Arc<dyn Device>, "fresh", 999)
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
    drop(pool);

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
