//! `weir volume create|list|delete|resize`: the volume table of an open
//! pool (the running server's, or one opened here when none runs), with
//! space reserved at creation; and opening every pool for serving.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};

use super::geometry::{allocate, DeviceRegions, Stripe, CHUNK_BYTES, VOLUME_TABLE_BYTES};
use super::import::Imported;
use super::mirror::PoolData;
use super::volume_table::{
    check_volume_name, PropertyChanges, VolumeEntry, VolumeTable, VOLUMES_MAX,
};
use crate::device::{run_sync, AlignedBuf, Device, DeviceOp};
use crate::units::format_bytes;

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

/// The block size and size a volume may have.
fn check_shape(size_bytes: u64, block_bytes: u32) -> anyhow::Result<()> {
    if !block_bytes.is_power_of_two() || !(4096..=128 << 10).contains(&block_bytes) {
        bail!("the block size must be a power of two from 4K to 128K");
    }
    if size_bytes == 0 || !size_bytes.is_multiple_of(u64::from(block_bytes)) {
        bail!("the size must be a positive multiple of the block size ({block_bytes} bytes)");
    }
    Ok(())
}

/// Create `volume` on an open pool: space reserved, zeroed durably, then
/// the table written; until the table is, the volume does not exist.
pub fn create_in(
    pool: &Arc<PoolData>,
    volume: &str,
    size_bytes: u64,
    block_bytes: u32,
) -> anyhow::Result<VolumeEntry> {
    check_volume_name(volume).map_err(anyhow::Error::msg)?;
    check_shape(size_bytes, block_bytes)?;
    let pool_name = pool.name().to_string();
    let total = pool.logical_bytes() / CHUNK_BYTES;
    let table = pool.volume_table();
    if table.find(volume).is_some() {
        bail!("{pool_name}/{volume} already exists");
    }
    if table.volumes.len() >= VOLUMES_MAX {
        bail!("pool {pool_name:?} holds its maximum of {VOLUMES_MAX} volumes");
    }
    let place = |table: &VolumeTable| {
        allocate(&table.taken(), total, size_bytes).with_context(|| {
            let used: u64 = table.taken().iter().map(|t| t.1).sum();
            format!(
                "pool {pool_name:?} has no room for {} ({} of {} reserved)",
                format_bytes(size_bytes),
                format_bytes(used * CHUNK_BYTES),
                format_bytes(total * CHUNK_BYTES)
            )
        })
    };
    let (first_chunk, chunks) = place(&table)?;
    pool.zero_durably(first_chunk * CHUNK_BYTES, chunks * CHUNK_BYTES)
        .with_context(|| format!("cannot clear the space for {pool_name}/{volume}"))?;
    let entry = VolumeEntry {
        name: volume.into(),
        size_bytes,
        block_bytes,
        first_chunk,
        chunks,
        properties: Default::default(),
    };
    pool.change_volume_table(|table| {
        // Another change may have come between: the space must still be free.
        if table.find(volume).is_some() {
            bail!("{pool_name}/{volume} already exists");
        }
        if place(table)? != (first_chunk, chunks) {
            bail!("pool {pool_name:?} changed while {volume} was being created; try again");
        }
        table.volumes.push(entry.clone());
        Ok(())
    })?;
    Ok(entry)
}

/// Remove `volume` from an open pool's table; its space is free for the
/// next volume, which zeroes it first. The caller has stopped its I/O.
pub fn delete_in(pool: &PoolData, volume: &str) -> anyhow::Result<VolumeEntry> {
    pool.change_volume_table(|table| {
        let index = table
            .volumes
            .iter()
            .position(|v| v.name == volume)
            .with_context(|| format!("no volume {}/{volume}", pool.name()))?;
        Ok(table.volumes.remove(index))
    })
}

/// `weir volume set`: change properties of `volume` on an open pool.
pub fn set_properties_in(
    pool: &PoolData,
    volume: &str,
    changes: &PropertyChanges,
) -> anyhow::Result<VolumeEntry> {
    pool.change_volume_table(|table| {
        let entry = table
            .volumes
            .iter_mut()
            .find(|v| v.name == volume)
            .with_context(|| format!("no volume {}/{volume}", pool.name()))?;
        changes.apply(&mut entry.properties);
        Ok(entry.clone())
    })
}

/// `weir volume set` with no server.
pub fn set_properties(
    name: &str,
    changes: &PropertyChanges,
    data_dir: &Path,
) -> anyhow::Result<()> {
    let (pool_name, volume) = split_name(name)?;
    let _lock = crate::pool::data_dir::lock_data_dir(data_dir)?;
    let pool = open_here(pool_name, data_dir)?;
    let set = set_properties_in(&pool, volume, changes);
    pool.close();
    set.map(drop)
}

/// Give `volume` a new size. It grows in place into the chunks after it
/// when they are free (the new part reads as zeroes); it shrinks by
/// giving up its last chunks. The caller has stopped its I/O.
pub fn resize_in(
    pool: &Arc<PoolData>,
    volume: &str,
    size_bytes: u64,
) -> anyhow::Result<VolumeEntry> {
    let name = format!("{}/{volume}", pool.name());
    let entry = pool
        .volume_table()
        .find(volume)
        .cloned()
        .with_context(|| format!("no volume {name}"))?;
    check_shape(size_bytes, entry.block_bytes)?;
    let chunks = size_bytes.div_ceil(CHUNK_BYTES);
    let total = pool.logical_bytes() / CHUNK_BYTES;
    let fits = |table: &VolumeTable| {
        let end = entry.first_chunk + chunks;
        end <= total
            && table
                .volumes
                .iter()
                .filter(|v| v.name != volume)
                .all(|v| v.first_chunk >= end || v.first_chunk + v.chunks <= entry.first_chunk)
    };
    if !fits(&pool.volume_table()) {
        bail!(
            "{name} cannot grow to {}: the space after it is taken or past the pool's end",
            format_bytes(size_bytes)
        );
    }
    if size_bytes > entry.size_bytes {
        let from = entry.first_chunk * CHUNK_BYTES + entry.size_bytes;
        pool.zero_durably(from, size_bytes - entry.size_bytes)
            .with_context(|| format!("cannot clear the space {name} grows into"))?;
    }
    pool.change_volume_table(|table| {
        if !fits(table) {
            bail!(
                "pool {} changed while {name} was being resized; try again",
                pool.name()
            );
        }
        let found = table
            .volumes
            .iter_mut()
            .find(|v| v.name == volume)
            .with_context(|| format!("no volume {name}"))?;
        found.size_bytes = size_bytes;
        found.chunks = chunks;
        Ok(found.clone())
    })
}

/// Open `pool_name` in this process for a change (no server holds the
/// data directory; the caller holds its lock).
fn open_here(pool_name: &str, data_dir: &Path) -> anyhow::Result<Arc<PoolData>> {
    let imported = crate::pool::import::import_registered(pool_name, data_dir, true)?;
    let data =
        PoolData::open(&imported).with_context(|| format!("cannot open pool {pool_name:?}"))?;
    data.record_generations_in(data_dir);
    Ok(data)
}

/// `weir volume create` with no server: the pool opened here.
pub fn create(
    name: &str,
    size_bytes: u64,
    block_bytes: u32,
    data_dir: &Path,
) -> anyhow::Result<()> {
    let (pool_name, volume) = split_name(name)?;
    let _lock = crate::pool::data_dir::lock_data_dir(data_dir)?;
    let pool = open_here(pool_name, data_dir)?;
    let created = create_in(&pool, volume, size_bytes, block_bytes);
    pool.close();
    created.map(drop)
}

/// `weir volume delete` with no server.
pub fn delete(name: &str, data_dir: &Path) -> anyhow::Result<()> {
    let (pool_name, volume) = split_name(name)?;
    let _lock = crate::pool::data_dir::lock_data_dir(data_dir)?;
    let pool = open_here(pool_name, data_dir)?;
    let deleted = delete_in(&pool, volume);
    pool.close();
    deleted.map(drop)
}

/// `weir volume resize` with no server.
pub fn resize(name: &str, size_bytes: u64, data_dir: &Path) -> anyhow::Result<String> {
    let (pool_name, volume) = split_name(name)?;
    let _lock = crate::pool::data_dir::lock_data_dir(data_dir)?;
    let pool = open_here(pool_name, data_dir)?;
    let before = pool.volume_table().find(volume).map(|v| v.size_bytes);
    let resized = resize_in(&pool, volume, size_bytes);
    pool.close();
    Ok(resized_text(name, before.unwrap_or(0), resized?.size_bytes))
}

/// What `volume resize` prints.
pub fn resized_text(name: &str, before_bytes: u64, after_bytes: u64) -> String {
    format!(
        "volume {name} resized from {} to {}\n",
        format_bytes(before_bytes),
        format_bytes(after_bytes)
    )
}

/// Every registered pool that opens, and the pools that do not open with
/// the reason. The caller holds the data directory's lock.
pub struct Opened {
    pub pools: Vec<Arc<PoolData>>,
    /// (pool, why): UNAVAIL, not served; the others are.
    pub unavailable: Vec<(String, String)>,
}

/// Open every registered pool for serving. A pool that cannot open is
/// left out with its reason and the others are served: one pool's
/// missing disks must not take down every other pool's volumes.
pub fn open_all(data_dir: &Path) -> anyhow::Result<Opened> {
    let mut opened = Opened {
        pools: Vec::new(),
        unavailable: Vec::new(),
    };
    for pool_name in crate::pool::registry::registered_pools(data_dir)? {
        match open_registered(&pool_name, data_dir) {
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

/// Open one registered pool for serving.
pub fn open_registered(pool_name: &str, data_dir: &Path) -> anyhow::Result<Arc<PoolData>> {
    let data = open_here(pool_name, data_dir)?;
    if data.state_name() != "ONLINE" {
        tracing::warn!(
            pool = pool_name,
            state = data.state_name(),
            "serving a pool that is not ONLINE; see weir pool status"
        );
    }
    Ok(data)
}

/// The `volume list` table.
pub fn render_list(rows: &[(String, VolumeEntry)]) -> String {
    let mut out = format!(
        "{:<40} {:>14} {:>8} {:>3} {:<12} DESCRIPTION\n",
        "NAME", "SIZE", "BLOCK", "RO", "CACHE"
    );
    for (name, v) in rows {
        let p = &v.properties;
        let read_only = if p.read_only { "on" } else { "off" };
        let cache = p.cache.map_or("-", |c| c.name());
        let line = format!(
            "{name:<40} {:>14} {:>8} {read_only:>3} {cache:<12} {}",
            v.size_bytes, v.block_bytes, p.description
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// Every volume of every registered pool (or of one). A pool that cannot
/// be opened is skipped with a warning, unless it is the one asked for.
pub fn list(pool_filter: Option<&str>, data_dir: &Path) -> anyhow::Result<String> {
    crate::pool::data_dir::check_exists(data_dir)?;
    let mut rows = Vec::new();
    let registered = crate::pool::registry::registered_pools(data_dir)?;
    if let Some(filter) = pool_filter.filter(|f| !registered.iter().any(|p| p == f)) {
        bail!(
            "no pool named {filter:?} in {}",
            super::registry::path_in(data_dir).display()
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
            rows.push((format!("{pool_name}/{}", v.name), v));
        }
    }
    Ok(render_list(&rows))
}
