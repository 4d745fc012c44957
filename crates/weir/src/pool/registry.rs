//! The registry, `DATA_DIR/pools.toml`: which device specs make up each
//! pool, with the settings and the highest generation this data directory
//! served it at, as ZFS's cache file does. The labels are the truth; the
//! registry says where to look for them.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::read_policy::ReadPolicy;
use crate::sched::Mode;

pub(super) const REGISTRY_FILE: &str = "pools.toml";

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Registry {
    #[serde(default)]
    pub(super) pool: Vec<RegisteredPool>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RegisteredPool {
    pub(super) name: String,
    pub(super) id: String,
    pub(super) devices: Vec<String>,
    /// The device queues' mode (fifo, zfs, adaptive); absent: adaptive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) sched: Option<String>,
    /// How mirrors choose the copy for a read; absent: latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) read_policy: Option<String>,
    /// The highest label generation this data directory has served the
    /// pool at: devices found behind it miss writes a newer member holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) generation: Option<u64>,
}

impl Registry {
    pub(super) fn load(data_dir: &Path) -> anyhow::Result<Registry> {
        let path = path_in(data_dir);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                toml::from_str(&text).with_context(|| format!("{} is damaged", path.display()))
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Registry::default()),
            Err(err) => Err(err).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    pub(super) fn entry_mut(&mut self, pool: &str) -> anyhow::Result<&mut RegisteredPool> {
        self.pool
            .iter_mut()
            .find(|p| p.name == pool)
            .with_context(|| format!("no pool named {pool:?} in the registry"))
    }

    pub(super) fn save(&self, data_dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create {}", data_dir.display()))?;
        let path = path_in(data_dir);
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, toml::to_string(self)?)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot replace {}", path.display()))
    }
}

/// Where a data directory keeps its registry of pools: a directory with
/// one serves pools, one without serves its exports alone.
pub fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join(REGISTRY_FILE)
}

/// Names of the registered pools, in registration order.
pub fn registered_pools(data_dir: &Path) -> anyhow::Result<Vec<String>> {
    Ok(Registry::load(data_dir)?
        .pool
        .into_iter()
        .map(|p| p.name)
        .collect())
}

/// Ids of the registered pools (32 hex digits).
pub fn registered_ids(data_dir: &Path) -> anyhow::Result<Vec<String>> {
    Ok(Registry::load(data_dir)?
        .pool
        .into_iter()
        .map(|p| p.id)
        .collect())
}

/// Record that the member at `index` (layout order) is now `text`.
pub fn set_member_spec(
    data_dir: &Path,
    pool: &str,
    index: usize,
    text: &str,
) -> anyhow::Result<()> {
    let mut registry = Registry::load(data_dir)?;
    let slot = registry
        .entry_mut(pool)?
        .devices
        .get_mut(index)
        .with_context(|| format!("pool {pool:?} has no member {index} in the registry"))?;
    *slot = text.to_string();
    registry.save(data_dir)
}

/// Remember that `pool` has been served at label `generation`, so that an
/// import finding only devices behind it refuses them. Concurrent callers
/// in this process take turns.
pub fn record_generation(data_dir: &Path, pool: &str, generation: u64) -> anyhow::Result<()> {
    static TURN: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _turn = TURN.lock();
    let mut registry = Registry::load(data_dir)?;
    let entry = registry.entry_mut(pool)?;
    if entry.generation.is_some_and(|seen| seen >= generation) {
        return Ok(());
    }
    entry.generation = Some(generation);
    registry.save(data_dir)
}

/// Record how the mirrors of `pool` choose the copy for a read.
pub fn set_pool_read_policy(data_dir: &Path, pool: &str, policy: ReadPolicy) -> anyhow::Result<()> {
    let mut registry = Registry::load(data_dir)?;
    registry.entry_mut(pool)?.read_policy = Some(policy.name().to_string());
    registry.save(data_dir)
}

/// Record the device queues' mode of `pool` in the registry.
pub fn set_pool_sched(data_dir: &Path, pool: &str, mode: Mode) -> anyhow::Result<()> {
    let mut registry = Registry::load(data_dir)?;
    registry.entry_mut(pool)?.sched = Some(mode.name().to_string());
    registry.save(data_dir)
}
