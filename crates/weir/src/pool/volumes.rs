//! `weir volume create|list|delete`, offline: the volume table on every
//! member of a pool, with space reserved at creation.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};

use super::geometry::{allocate, DeviceRegions, Stripe, CHUNK_BYTES, VOLUME_TABLE_BYTES};
use super::import::Imported;
use super::volume_table::{check_volume_name, VolumeEntry, VolumeTable, VOLUMES_MAX};
use crate::device::{run_sync, AlignedBuf, Device, DeviceOp};

/// `POOL/NAME`
pub fn split_name(text: &str) -> anyhow::Result<(&str, &str)> {
    let (pool, volume) = text
        .split_once('/')
        .with_context(|| format!("{text:?}: want POOL/NAME"))?;
    check_volume_name(volume).map_err(anyhow::Error::msg)?;
    Ok((pool, volume))
}

/// Every present member, with its regions.
fn members(pool: &Imported) -> anyhow::Result<Vec<(Arc<dyn Device>, DeviceRegions)>> {
    let mut out = Vec::new();
    for device in pool.devices.iter().flatten().flatten() {
        let regions = DeviceRegions::plan(device.info().size_bytes)
            .context("a member is too small for the pool format")?;
        out.push((Arc::clone(device), regions));
    }
    Ok(out)
}

/// The pool's logical space: each group as large as its smallest member.
pub(super) fn stripe(pool: &Imported) -> anyhow::Result<Stripe> {
    let mut chunks_per_group = u64::MAX;
    for group in &pool.devices {
        for device in group.iter().flatten() {
            let regions = DeviceRegions::plan(device.info().size_bytes)
                .context("a member is too small for the pool format")?;
            chunks_per_group = chunks_per_group.min(regions.data_chunks());
        }
    }
    Ok(Stripe {
        groups: pool.devices.len(),
        chunks_per_group,
    })
}

/// The pool's volume table (the newest valid copy among its members).
pub fn read_table(pool: &Imported) -> anyhow::Result<VolumeTable> {
    let mut copies = Vec::new();
    for (device, regions) in members(pool)? {
        let outcome = run_sync(
            device.as_ref(),
            DeviceOp::Read {
                offset: regions.volume_table.0,
                buf: AlignedBuf::new(VOLUME_TABLE_BYTES as usize),
            },
        );
        copies.push(match (outcome.result, outcome.buf) {
            (Ok(()), Some(buf)) => VolumeTable::decode(buf.as_slice()),
            _ => None,
        });
    }
    Ok(VolumeTable::newest(copies))
}

fn write_table(pool: &Imported, table: &VolumeTable) -> anyhow::Result<()> {
    let bytes = table.encode();
    for (device, regions) in members(pool)? {
        let mut buf = AlignedBuf::new(bytes.len());
        buf.as_mut_slice().copy_from_slice(&bytes);
        let op = DeviceOp::Write {
            offset: regions.volume_table.0,
            buf: buf.into(),
            durable: true,
        };
        run_sync(device.as_ref(), op)
            .result
            .context("cannot write the volume table")?;
    }
    Ok(())
}

/// Configuration changes need every member: a missing one would miss them.
fn import_online(pool_name: &str, data_dir: &Path) -> anyhow::Result<Imported> {
    let pool = crate::pool::import::import_registered(pool_name, data_dir, true)?;
    if pool.state() != "ONLINE" {
        bail!(
            "pool {pool_name:?} is {}; volumes can be changed only while every member is ONLINE",
            pool.state()
        );
    }
    Ok(pool)
}

pub fn create(
    name: &str,
    size_bytes: u64,
    block_bytes: u32,
    data_dir: &Path,
) -> anyhow::Result<()> {
    let (pool_name, volume) = split_name(name)?;
    let _lock = crate::pool::data_dir::lock_data_dir(data_dir)?;
    if !block_bytes.is_power_of_two() || !(4096..=128 << 10).contains(&block_bytes) {
        bail!("the block size must be a power of two from 4K to 128K");
    }
    if size_bytes == 0 || !size_bytes.is_multiple_of(u64::from(block_bytes)) {
        bail!("the size must be a positive multiple of the block size ({block_bytes} bytes)");
    }
    let pool = import_online(pool_name, data_dir)?;
    let mut table = read_table(&pool)?;
    if table.find(volume).is_some() {
        bail!("{name} already exists");
    }
    if table.volumes.len() >= VOLUMES_MAX {
        bail!("pool {pool_name:?} holds its maximum of {VOLUMES_MAX} volumes");
    }
    let total = stripe(&pool)?.logical_bytes() / CHUNK_BYTES;
    let Some((first_chunk, chunks)) = allocate(&table.taken(), total, size_bytes) else {
        let used: u64 = table.taken().iter().map(|t| t.1).sum();
        bail!(
            "pool {pool_name:?} has no room for {size_bytes} bytes ({} MiB of {} MiB reserved)",
            used,
            total
        );
    };
    table.volumes.push(VolumeEntry {
        name: volume.into(),
        size_bytes,
        block_bytes,
        first_chunk,
        chunks,
    });
    table.generation += 1;
    write_table(&pool, &table)
}

pub fn delete(name: &str, data_dir: &Path) -> anyhow::Result<()> {
    let (pool_name, volume) = split_name(name)?;
    let _lock = crate::pool::data_dir::lock_data_dir(data_dir)?;
    let pool = import_online(pool_name, data_dir)?;
    let mut table = read_table(&pool)?;
    let before = table.volumes.len();
    table.volumes.retain(|v| v.name != volume);
    if table.volumes.len() == before {
        bail!("no volume {name}");
    }
    table.generation += 1;
    write_table(&pool, &table)
}

/// Every registered pool that opens, every volume of them named
/// `POOL/NAME`, and the pools that do not open with the reason. The
/// caller holds the data directory's lock.
pub struct Opened {
    pub pools: Vec<Arc<super::mirror::PoolData>>,
    pub volumes: Vec<(String, Arc<dyn super::Store>)>,
    /// (pool, why): UNAVAIL, not served; the others are.
    pub unavailable: Vec<(String, String)>,
}

/// Open every registered pool for serving. A pool that cannot open is
/// left out with its reason and the others are served: one pool's
/// missing disks must not take down every other pool's volumes.
pub fn open_all(data_dir: &Path) -> anyhow::Result<Opened> {
    let mut opened = Opened {
        pools: Vec::new(),
        volumes: Vec::new(),
        unavailable: Vec::new(),
    };
    for pool_name in crate::pool::registry::registered_pools(data_dir)? {
        match open_one(&pool_name, data_dir, &mut opened.volumes) {
            Ok(data) => opened.pools.push(data),
            Err(err) => {
                tracing::error!(
                    pool = pool_name,
                    "pool UNAVAIL, not served (the other pools are): {err:#}"
                );
                opened.unavailable.push((pool_name, format!("{err:#}")));
            }
        }
    }
    Ok(opened)
}

/// Open one pool and add its volumes to `volumes`.
fn open_one(
    pool_name: &str,
    data_dir: &Path,
    volumes: &mut Vec<(String, Arc<dyn super::Store>)>,
) -> anyhow::Result<Arc<super::mirror::PoolData>> {
    let pool = crate::pool::import::import_registered(pool_name, data_dir, true)?;
    let table = read_table(&pool)?;
    let data = super::mirror::PoolData::open(&pool)
        .with_context(|| format!("cannot open pool {pool_name:?}"))?;
    data.record_generations_in(data_dir);
    data.set_allocated_chunks(table.volumes.iter().map(|v| v.chunks).sum());
    if data.state_name() != "ONLINE" {
        tracing::warn!(
            pool = pool_name,
            state = data.state_name(),
            "serving a pool that is not ONLINE; see weir pool status"
        );
    }
    let mut found = Vec::new();
    for entry in &table.volumes {
        let volume = super::mirror::PoolVolume::new(Arc::clone(&data), entry)?;
        found.push((
            format!("{pool_name}/{}", entry.name),
            Arc::new(volume) as Arc<dyn super::Store>,
        ));
    }
    volumes.extend(found);
    Ok(data)
}

/// Every volume of every registered pool (or of one). A pool that cannot
/// be opened is skipped with a warning, unless it is the one asked for.
pub fn list(pool_filter: Option<&str>, data_dir: &Path) -> anyhow::Result<String> {
    crate::pool::data_dir::check_exists(data_dir)?;
    let mut out = format!("{:<40} {:>14} {:>8}\n", "NAME", "SIZE", "BLOCK");
    let registered = crate::pool::registry::registered_pools(data_dir)?;
    if let Some(filter) = pool_filter.filter(|f| !registered.iter().any(|p| p == f)) {
        bail!(
            "no pool named {filter:?} in {}",
            crate::pool::registry::Registry::path(data_dir).display()
        );
    }
    for pool_name in registered {
        if pool_filter.is_some_and(|f| f != pool_name) {
            continue;
        }
        let table = crate::pool::import::import_registered(&pool_name, data_dir, false)
            .and_then(|pool| read_table(&pool));
        let table = match table {
            Ok(table) => table,
            Err(err) if pool_filter.is_none() => {
                tracing::warn!(
                    pool = pool_name,
                    "pool UNAVAIL, its volumes not listed: {err:#}"
                );
                continue;
            }
            Err(err) => return Err(err),
        };
        for v in table.volumes {
            let _ = writeln!(
                out,
                "{:<40} {:>14} {:>8}",
                format!("{pool_name}/{}", v.name),
                v.size_bytes,
                v.block_bytes
            );
        }
    }
    Ok(out)
}
