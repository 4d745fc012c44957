//! Pools and volumes created, changed and removed while the server runs:
//! a new volume is served at once, a removed one stops taking clients and
//! closes its connections once their replies are out, and a pool leaves
//! only after its volumes have. The CLI runs the volume changes on a pool
//! it opens itself when no server runs.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};

use super::PoolService;
use crate::metrics::{CacheReport, ReadaheadReport};
use crate::pool::mirror::{PoolData, PoolVolume};
use crate::pool::volume_table::{PropertyChanges, VolumeEntry, VolumeProperties};
use crate::pool::volumes::{self, split_name};
use crate::pool::Store;
use crate::units::format_bytes;

/// Where the server serves pool volumes: its export table.
pub trait VolumeHost: Send + Sync {
    /// Serve `store` as export `name` (POOL/VOLUME) from now on, as its
    /// properties say.
    fn add(
        &self,
        name: &str,
        store: Arc<dyn Store>,
        properties: &VolumeProperties,
    ) -> anyhow::Result<Attachments>;
    /// Stop serving `name`: no new clients, open connections closed once
    /// their replies are out, cached writes on the devices. When it
    /// returns, nothing of the server holds the volume's store.
    fn remove(&self, name: &str) -> anyhow::Result<()>;
}

/// What the host put in front of a volume, for status and metrics.
#[derive(Default)]
pub struct Attachments {
    pub cache: Option<Arc<dyn CacheReport>>,
    pub readahead: Option<Arc<dyn ReadaheadReport>>,
}

/// How long a pool being closed may stay held by requests finishing.
const POOL_RELEASE_WAIT: Duration = Duration::from_secs(30);

impl PoolService {
    /// Serve every volume of every open pool (at start).
    pub fn serve_all_volumes(&self) -> anyhow::Result<()> {
        for pool in self.pools() {
            for entry in pool.volume_table().volumes {
                self.serve_volume(&pool, &entry)?;
            }
        }
        Ok(())
    }

    /// Every volume of the open pools, POOL/VOLUME.
    pub fn volume_names(&self) -> Vec<String> {
        self.pools()
            .iter()
            .flat_map(|pool| {
                let pool_name = pool.name().to_string();
                pool.volume_table()
                    .volumes
                    .into_iter()
                    .map(move |v| format!("{pool_name}/{}", v.name))
            })
            .collect()
    }

    fn serve_volume(&self, pool: &Arc<PoolData>, entry: &VolumeEntry) -> anyhow::Result<()> {
        let Some(host) = &self.host else {
            return Ok(());
        };
        let name = format!("{}/{}", pool.name(), entry.name);
        let store = Arc::new(PoolVolume::new(Arc::clone(pool), entry)?);
        let attachments = host.add(&name, store, &entry.properties)?;
        if let Some(cache) = attachments.cache {
            self.add_cache(&name, cache);
        }
        if let Some(readahead) = attachments.readahead {
            self.add_readahead(&name, readahead);
        }
        Ok(())
    }

    /// Forget the cache and readahead reports of export `name`.
    pub fn forget_export(&self, name: &str) {
        self.caches.lock().retain(|(n, _)| n != name);
        self.readaheads.lock().retain(|(n, _)| n != name);
    }

    /// Serve volume POOL/NAME anew, with the settings the host has now
    /// (a configuration reload); its clients reconnect.
    pub fn serve_volume_again(&self, name: &str) -> anyhow::Result<()> {
        let _change = self.changes.lock();
        let (pool, _, entry) = self.existing_volume(name)?;
        self.unserve_volume(name)?;
        self.serve_volume(&pool, &entry)
    }

    fn unserve_volume(&self, name: &str) -> anyhow::Result<()> {
        self.forget_export(name);
        match &self.host {
            Some(host) => host.remove(name),
            None => Ok(()),
        }
    }

    /// `weir volume create POOL/NAME --size S`: reserved, zeroed, served.
    pub fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_bytes: u32,
    ) -> anyhow::Result<String> {
        let _change = self.changes.lock();
        let (pool_name, volume) = split_name(name)?;
        let pool = self.pool(pool_name)?;
        let entry = volumes::create_in(&pool, volume, size_bytes, block_bytes)?;
        self.serve_volume(&pool, &entry)
            .with_context(|| format!("{name} was created but cannot be served"))?;
        Ok(format!(
            "volume {name} created: {}, block size {}\n",
            format_bytes(entry.size_bytes),
            format_bytes(u64::from(entry.block_bytes))
        ))
    }

    /// The pool of volume POOL/NAME, the volume's name and its entry.
    fn existing_volume<'a>(
        &self,
        name: &'a str,
    ) -> anyhow::Result<(Arc<PoolData>, &'a str, VolumeEntry)> {
        let (pool_name, volume) = split_name(name)?;
        let pool = self.pool(pool_name)?;
        let entry = pool
            .volume_table()
            .find(volume)
            .cloned()
            .with_context(|| format!("no volume {name}"))?;
        Ok((pool, volume, entry))
    }

    /// `weir volume delete POOL/NAME`: its clients are disconnected, its
    /// cached writes land, then its space is freed.
    pub fn delete_volume(&self, name: &str) -> anyhow::Result<String> {
        let _change = self.changes.lock();
        let (pool, volume, entry) = self.existing_volume(name)?;
        self.unserve_volume(name)?;
        if let Err(err) = volumes::delete_in(&pool, volume) {
            self.serve_volume(&pool, &entry)?;
            return Err(err);
        }
        Ok(format!("volume {name} deleted\n"))
    }

    /// `weir volume resize POOL/NAME --size S`. Its clients are
    /// disconnected (NBD cannot tell them the new size) and see it when
    /// they reconnect.
    pub fn resize_volume(&self, name: &str, size_bytes: u64) -> anyhow::Result<String> {
        let _change = self.changes.lock();
        let (pool, volume, entry) = self.existing_volume(name)?;
        self.unserve_volume(name)?;
        let resized = volumes::resize_in(&pool, volume, size_bytes);
        let served = resized.as_ref().unwrap_or(&entry);
        self.serve_volume(&pool, served)?;
        let resized = resized?;
        Ok(volumes::resized_text(
            name,
            entry.size_bytes,
            resized.size_bytes,
        ))
    }

    /// `weir volume set POOL/NAME`: properties changed and kept with the
    /// pool; the volume is served anew with them (its clients reconnect).
    pub fn set_volume_properties(
        &self,
        name: &str,
        changes: &PropertyChanges,
    ) -> anyhow::Result<String> {
        let _change = self.changes.lock();
        let (pool, volume, _) = self.existing_volume(name)?;
        let entry = volumes::set_properties_in(&pool, volume, changes)?;
        self.unserve_volume(name)?;
        self.serve_volume(&pool, &entry)?;
        Ok(volumes::render_list(&[(name.to_string(), entry)]))
    }

    /// `weir volume list [POOL]` on the open pools.
    pub fn volume_list(&self, pool_filter: Option<&str>) -> anyhow::Result<String> {
        let pools = match pool_filter {
            Some(name) => vec![self.pool(name)?],
            None => self.pools(),
        };
        let mut rows = Vec::new();
        for pool in pools {
            for v in pool.volume_table().volumes {
                rows.push((format!("{}/{}", pool.name(), v.name), v));
            }
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(volumes::render_list(&rows))
    }

    /// `weir pool create`, on the running server: labelled, registered,
    /// opened and served.
    pub fn create_pool(
        &self,
        name: &str,
        layout: &[String],
        force: bool,
    ) -> anyhow::Result<String> {
        let _change = self.changes.lock();
        crate::pool::create::create(name, layout, force, &self.data_dir)?;
        self.open_registered(name)?;
        self.status(Some(name), false)
    }

    /// `weir pool import DEV...`, on the running server.
    pub fn import_pool(&self, devices: &[String], force: bool) -> anyhow::Result<String> {
        let _change = self.changes.lock();
        let name = crate::pool::import::register_found(devices, &self.data_dir, force)?;
        self.open_registered(&name)?;
        self.status(Some(&name), false)
    }

    /// Open a pool just registered and serve its volumes.
    fn open_registered(&self, name: &str) -> anyhow::Result<()> {
        let opened = volumes::open_registered(name, &self.data_dir)
            .with_context(|| format!("pool {name} is registered but cannot be opened"))?;
        self.adopt(Arc::clone(&opened), true);
        for entry in opened.volume_table().volumes {
            self.serve_volume(&opened, &entry)?;
        }
        Ok(())
    }

    /// `weir pool export`, on the running server: its volumes leave, it
    /// closes cleanly, and this data directory forgets it.
    pub fn export_pool(&self, name: &str) -> anyhow::Result<String> {
        let _change = self.changes.lock();
        self.close_pool(name)?;
        crate::pool::lifecycle::export_held(name, &self.data_dir).inspect_err(|_| self.reopen(name))
    }

    /// After a failed export or destroy, serve the pool again.
    fn reopen(&self, name: &str) {
        if let Err(err) = self.open_registered(name) {
            tracing::error!(pool = name, "cannot serve the pool again: {err:#}");
            self.unavailable
                .write()
                .push((name.to_string(), format!("{err:#}")));
        }
    }

    /// `weir pool destroy`, on the running server.
    pub fn destroy_pool(&self, name: &str) -> anyhow::Result<String> {
        let _change = self.changes.lock();
        self.close_pool(name)?;
        crate::pool::lifecycle::destroy_held(name, &self.data_dir)
            .inspect_err(|_| self.reopen(name))
    }

    /// Stop serving pool `name` and close it; an UNAVAIL pool is only
    /// forgotten here.
    fn close_pool(&self, name: &str) -> anyhow::Result<()> {
        let was_unavailable = {
            let mut unavailable = self.unavailable.write();
            let before = unavailable.len();
            unavailable.retain(|(n, _)| n != name);
            unavailable.len() != before
        };
        if was_unavailable {
            return Ok(());
        }
        let pool = self.pool(name)?;
        if !crate::pool::registry::registered_pools(&self.data_dir)?
            .iter()
            .any(|p| p == name)
        {
            bail!("pool {name} is served but not in this data directory's registry");
        }
        for entry in pool.volume_table().volumes {
            self.unserve_volume(&format!("{name}/{}", entry.name))?;
        }
        if let Some(scrub) = self.scrubs.lock().remove(name) {
            scrub.shutdown();
        }
        pool.close();
        self.pools.write().retain(|p| p.name() != name);
        if !PoolData::close_when_released(pool, POOL_RELEASE_WAIT) {
            tracing::error!(
                pool = name,
                "still held after {POOL_RELEASE_WAIT:?}; it closes when its last request ends"
            );
        }
        tracing::info!(pool = name, "pool closed");
        Ok(())
    }
}
