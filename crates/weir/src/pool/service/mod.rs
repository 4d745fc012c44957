//! The operations on opened pools: status, scrub, replace, metrics, and
//! pools and volumes created and removed (live.rs). The running server
//! answers them on its admin endpoint; with no server up, the CLI opens
//! the pool and runs the same code in its own process.

mod live;

pub use live::{Attachments, VolumeHost};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use parking_lot::{Mutex, RwLock};

use super::import::{identity, open_member};
use super::mirror::select::ReadPolicy;
use super::mirror::PoolData;
use super::scrub::{self, Checkpoint, Scrub, ScrubState};
use super::vacancy::check_free;
use crate::metrics::{CacheReport, ReadaheadReport, Sample};
use crate::sched::Mode;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScrubAction {
    Start,
    Pause,
    Resume,
    Stop,
}

impl ScrubAction {
    pub fn parse(text: &str) -> Option<ScrubAction> {
        match text {
            "start" => Some(ScrubAction::Start),
            "pause" => Some(ScrubAction::Pause),
            "resume" => Some(ScrubAction::Resume),
            "stop" => Some(ScrubAction::Stop),
            _ => None,
        }
    }
}

pub struct PoolService {
    data_dir: PathBuf,
    pools: RwLock<Vec<Arc<PoolData>>>,
    scrubs: Mutex<HashMap<String, Scrub>>,
    /// Write-back caches by export name (POOL/VOLUME for pool volumes).
    caches: Mutex<Vec<(String, Arc<dyn CacheReport>)>>,
    readaheads: Mutex<Vec<(String, Arc<dyn ReadaheadReport>)>>,
    /// Registered pools that did not open, with the reason: UNAVAIL.
    unavailable: RwLock<Vec<(String, String)>>,
    /// Where pools' volumes are served; none in the CLI.
    host: Option<Arc<dyn VolumeHost>>,
    /// Pools and volumes change one at a time.
    changes: Mutex<()>,
}

impl PoolService {
    /// Take over opened pools; with `resume_background`, finish
    /// interrupted resilvers and scrubs.
    pub fn new(data_dir: &Path, pools: Vec<Arc<PoolData>>, resume_background: bool) -> PoolService {
        let service = PoolService {
            data_dir: data_dir.to_path_buf(),
            pools: RwLock::new(Vec::new()),
            scrubs: Mutex::new(HashMap::new()),
            caches: Mutex::new(Vec::new()),
            readaheads: Mutex::new(Vec::new()),
            unavailable: RwLock::new(Vec::new()),
            host: None,
            changes: Mutex::new(()),
        };
        for pool in pools {
            service.adopt(pool, resume_background);
        }
        service
    }

    /// Serve `pool` from now on: its heartbeat, and with
    /// `resume_background` its interrupted resilvers and scrub.
    fn adopt(&self, pool: Arc<PoolData>, resume_background: bool) {
        pool.keep_beating();
        if resume_background {
            pool.start_resilvers();
            pool.watch_labels();
            match scrub::load(pool.name(), &self.data_dir) {
                Ok(Some(c))
                    if c.state == ScrubState::Running
                        && c.chunks_total == Checkpoint::new(&pool).chunks_total =>
                {
                    tracing::info!(
                        pool = pool.name(),
                        "resuming the interrupted scrub at {} of {} chunks",
                        c.chunks_done,
                        c.chunks_total
                    );
                    self.scrubs
                        .lock()
                        .insert(pool.name().into(), Scrub::spawn(&pool, &self.data_dir, c));
                }
                Ok(_) => {}
                Err(err) => tracing::warn!(pool = pool.name(), "{err:#}"),
            }
        }
        self.pools.write().push(pool);
    }

    /// Show registered pools that did not open as UNAVAIL, with why.
    pub fn with_unavailable(self, unavailable: Vec<(String, String)>) -> PoolService {
        *self.unavailable.write() = unavailable;
        self
    }

    /// Serve the volumes of pools created, imported or changed from now on
    /// through `host`.
    pub fn with_host(mut self, host: Arc<dyn VolumeHost>) -> PoolService {
        self.host = Some(host);
        self
    }

    pub fn pool(&self, name: &str) -> anyhow::Result<Arc<PoolData>> {
        if let Some((_, why)) = self.unavailable.read().iter().find(|(n, _)| n == name) {
            bail!("pool {name} is UNAVAIL: {why}");
        }
        self.pools
            .read()
            .iter()
            .find(|p| p.name() == name)
            .cloned()
            .with_context(|| format!("no pool named {name:?} is open"))
    }

    pub fn pools(&self) -> Vec<Arc<PoolData>> {
        self.pools.read().clone()
    }

    /// Show the readahead of export `name` in metrics.
    pub fn add_readahead(&self, name: &str, readahead: Arc<dyn ReadaheadReport>) {
        self.readaheads.lock().push((name.to_string(), readahead));
    }

    /// Show the write-back cache of export `name` in status and metrics.
    pub fn add_cache(&self, name: &str, cache: Arc<dyn CacheReport>) {
        self.caches.lock().push((name.to_string(), cache));
    }

    /// A line per cached volume of `pool`.
    fn cache_lines(&self, pool: &str) -> String {
        let mut out = String::new();
        for (name, cache) in self.caches.lock().iter() {
            let Some(volume) = name.strip_prefix(pool).and_then(|n| n.strip_prefix('/')) else {
                continue;
            };
            if cache.failed() {
                out.push_str(&format!(
                    "volume {volume}: FAILED: a write-back failed; every write and FLUSH returns EIO until restart ({} cached)\n",
                    crate::units::format_bytes(cache.dirty_bytes())
                ));
            } else {
                out.push_str(&format!(
                    "volume {volume}: write-back cache, {} not yet on the devices\n",
                    crate::units::format_bytes(cache.dirty_bytes())
                ));
            }
        }
        out
    }

    pub fn status(&self, name: Option<&str>, verbose: bool) -> anyhow::Result<String> {
        let mut out = String::new();
        for (pool, why) in self.unavailable.read().iter() {
            if name.is_none_or(|n| n == pool) {
                out.push_str(&crate::pool::status::unavailable_text(pool, why));
                out.push('\n');
            }
        }
        let pools: Vec<Arc<PoolData>> = match name {
            Some(_) if !out.is_empty() => vec![],
            Some(name) => vec![self.pool(name)?],
            None => self.pools(),
        };
        for pool in pools {
            let scan = self
                .scrub_status(pool.name())?
                .map(|c| scrub::describe(pool.name(), &c));
            out.push_str(&pool.status_text(scan.as_deref(), verbose));
            if pool.volume_table_unreadable() {
                out.push_str(&format!("volumes: {}\n", pool.unreadable_table_text()));
            }
            out.push_str(&self.cache_lines(pool.name()));
            out.push('\n');
        }
        if out.is_empty() {
            out.push_str("no pools\n");
        }
        Ok(out)
    }

    /// `weir pool list` on the served pools and those that did not open.
    pub fn list(&self) -> String {
        let mut rows: Vec<crate::pool::list::Row> = self
            .pools()
            .iter()
            .map(|pool| crate::pool::list::Row {
                name: pool.name().to_string(),
                size_bytes: Some(pool.logical_bytes()),
                allocated_bytes: Some(pool.allocated_bytes()),
                health: pool.state_name().to_string(),
            })
            .collect();
        rows.extend(
            self.unavailable
                .read()
                .iter()
                .map(|(name, _)| crate::pool::list::Row {
                    name: name.clone(),
                    size_bytes: None,
                    allocated_bytes: None,
                    health: "UNAVAIL".into(),
                }),
        );
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        crate::pool::list::render(&rows)
    }

    /// `weir pool offline`: take a member out of service.
    pub fn offline(&self, name: &str, device: &str) -> anyhow::Result<String> {
        let pool = self.pool(name)?;
        let (group, member) = self.member_of(&pool, name, device)?;
        pool.take_offline(group, member)
            .with_context(|| format!("cannot take {device} offline"))?;
        Ok(format!(
            "pool {name}: {device} is OFFLINE; the pool serves DEGRADED until weir pool online {name} {device}\n"
        ))
    }

    /// `weir pool online`: bring a member taken offline back.
    pub fn online(&self, name: &str, device: &str) -> anyhow::Result<String> {
        let pool = self.pool(name)?;
        let (group, member) = self.member_of(&pool, name, device)?;
        pool.bring_online(group, member)
            .with_context(|| format!("cannot bring {device} online"))?;
        Ok(format!(
            "pool {name}: {device} is back; what it missed is being rebuilt\n"
        ))
    }

    fn member_of(
        &self,
        pool: &PoolData,
        name: &str,
        device: &str,
    ) -> anyhow::Result<(usize, usize)> {
        pool.find_member(&identity(device))
            .or_else(|| pool.find_member(device))
            .with_context(|| format!("pool {name} has no member {device}"))
    }

    /// `weir pool clear`: forget members' error counts.
    pub fn clear(&self, name: &str, device: Option<&str>) -> anyhow::Result<String> {
        let pool = self.pool(name)?;
        let cleared = pool
            .clear_errors(device.map(identity).as_deref())
            .or_else(|| pool.clear_errors(device))
            .with_context(|| format!("pool {name} has no member {}", device.unwrap_or("")))?;
        Ok(format!(
            "pool {name}: error counts of {cleared} member{} cleared\n",
            if cleared == 1 { "" } else { "s" }
        ))
    }

    /// The scrub's progress: live if one runs, else the last checkpoint.
    pub fn scrub_status(&self, name: &str) -> anyhow::Result<Option<Checkpoint>> {
        self.pool(name)?;
        if let Some(scrub) = self.scrubs.lock().get(name) {
            return Ok(Some(scrub.checkpoint()));
        }
        scrub::load(name, &self.data_dir)
    }

    pub fn scrub(&self, name: &str, action: ScrubAction) -> anyhow::Result<Checkpoint> {
        let pool = self.pool(name)?;
        let mut scrubs = self.scrubs.lock();
        let live = scrubs
            .get(name)
            .map(|s| s.checkpoint().state)
            .filter(|s| matches!(s, ScrubState::Running | ScrubState::Paused));
        match (action, live) {
            (ScrubAction::Start | ScrubAction::Resume, Some(ScrubState::Paused)) => {
                let scrub = &scrubs[name];
                scrub.resume();
                Ok(scrub.wait_while(ScrubState::Paused))
            }
            (ScrubAction::Start, Some(_)) => bail!("a scrub of {name} is already running"),
            (ScrubAction::Resume, Some(_)) => Ok(scrubs[name].checkpoint()),
            (ScrubAction::Start | ScrubAction::Resume, None) => {
                let previous = scrub::load(name, &self.data_dir)?;
                let fresh = Checkpoint::new(&pool);
                let from = match previous {
                    Some(c) if c.unfinished() && c.chunks_total == fresh.chunks_total => c,
                    _ if action == ScrubAction::Resume => {
                        bail!("no paused or interrupted scrub of {name} to resume")
                    }
                    _ => fresh,
                };
                let scrub = Scrub::spawn(&pool, &self.data_dir, from);
                let checkpoint = scrub.checkpoint();
                scrubs.insert(name.into(), scrub);
                Ok(checkpoint)
            }
            (ScrubAction::Pause, Some(ScrubState::Running)) => {
                let scrub = &scrubs[name];
                scrub.pause();
                Ok(scrub.wait_while(ScrubState::Running))
            }
            (ScrubAction::Pause, Some(_)) => Ok(scrubs[name].checkpoint()),
            (ScrubAction::Stop, Some(state)) => {
                let scrub = &scrubs[name];
                scrub.stop();
                Ok(scrub.wait_while(state))
            }
            (ScrubAction::Pause | ScrubAction::Stop, None) => {
                // Not running here: a paused or interrupted scrub on disk.
                match scrub::load(name, &self.data_dir)? {
                    Some(mut c) if c.unfinished() => {
                        c.state = if action == ScrubAction::Stop {
                            ScrubState::Stopped
                        } else {
                            ScrubState::Paused
                        };
                        scrub::save(name, &self.data_dir, &c)?;
                        Ok(c)
                    }
                    _ => bail!("no scrub of {name} is running"),
                }
            }
        }
    }

    /// `weir pool replace POOL OLD NEW`: NEW takes OLD's place and is
    /// resilvered in the background.
    pub fn replace(&self, name: &str, old: &str, new: &str, force: bool) -> anyhow::Result<String> {
        let pool = self.pool(name)?;
        let (group, member) = self.member_of(&pool, name, old)?;
        let new_text = identity(new);
        let specs = pool.member_specs();
        let copies = specs.len() / pool.groups();
        let index = group * copies + member;
        if specs
            .iter()
            .enumerate()
            .any(|(i, s)| *s == new_text && i != index)
        {
            bail!("{new} is already a member of pool {name}");
        }
        let device = open_member(new)?;
        // The member being replaced, or an old member of this pool, may
        // come back.
        check_free(new, device.as_ref(), Some(pool.pool_id()), force)?;
        pool.replace(
            group,
            member,
            device,
            &new_text,
            crate::pool::import::random_id()?,
        )
        .with_context(|| format!("cannot replace {old} with {new}"))?;
        crate::pool::registry::set_member_spec(&self.data_dir, name, index, &new_text)?;
        Ok(format!(
            "replacing {old} with {new} in pool {name}: resilver started\n"
        ))
    }

    /// Switch a pool's device queues to `mode` now, and remember it.
    pub fn set_sched(&self, name: &str, mode: Mode) -> anyhow::Result<String> {
        let pool = self.pool(name)?;
        pool.set_sched(mode);
        crate::pool::registry::set_pool_sched(&self.data_dir, name, mode)?;
        Ok(format!("pool {name}: device queues now {}\n", mode.name()))
    }

    /// Switch how a pool's mirrors choose the copy for a read, now, and
    /// remember it.
    pub fn set_read_policy(&self, name: &str, policy: ReadPolicy) -> anyhow::Result<String> {
        let pool = self.pool(name)?;
        pool.set_read_policy(policy);
        crate::pool::registry::set_pool_read_policy(&self.data_dir, name, policy)?;
        Ok(format!("pool {name}: reads now {}\n", policy.name()))
    }

    /// Per pool, member and class: the device queue's counters, as JSON.
    pub fn iostat(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .pools()
            .iter()
            .flat_map(|pool| pool.iostat_rows())
            .collect();
        serde_json::Value::Array(rows)
    }

    /// Every pool's metrics, in the Prometheus/OpenMetrics text format.
    pub fn metrics(&self) -> String {
        let mut samples = Vec::new();
        for (pool, _) in self.unavailable.read().iter() {
            crate::pool::status::state_samples(pool, "UNAVAIL", &mut samples);
        }
        for pool in self.pools() {
            crate::pool::status::state_samples(pool.name(), pool.state_name(), &mut samples);
            pool.metrics(&mut samples);
        }
        let caches = self.caches.lock();
        for (name, cache) in caches.iter() {
            let labels = vec![("volume", name.clone())];
            let dirty = cache.dirty_bytes() as f64;
            samples.push(Sample::gauge(
                "weir_volume_cache_dirty_bytes",
                labels.clone(),
                dirty,
            ));
            let failed = f64::from(u8::from(cache.failed()));
            samples.push(Sample::gauge("weir_volume_failed", labels, failed));
        }
        if let Some((_, cache)) = caches.first() {
            let (used, limit) = cache.budget_bytes();
            samples.push(Sample::gauge("weir_cache_dirty_bytes", vec![], used as f64));
            samples.push(Sample::gauge(
                "weir_cache_dirty_limit_bytes",
                vec![],
                limit as f64,
            ));
            samples.push(Sample::gauge(
                "weir_cache_waiting_writes",
                vec![],
                cache.budget_waiting_writes() as f64,
            ));
        }
        let readaheads = self.readaheads.lock();
        for (name, readahead) in readaheads.iter() {
            let labels = vec![("volume", name.clone())];
            let (hits, misses, bytes, wasted) = readahead.counts();
            for (family, value) in [
                ("weir_volume_readahead_hits", hits),
                ("weir_volume_readahead_misses", misses),
                ("weir_volume_readahead_bytes", bytes),
                ("weir_volume_readahead_wasted_bytes", wasted),
            ] {
                samples.push(Sample::counter(family, labels.clone(), value));
            }
        }
        if let Some((_, readahead)) = readaheads.first() {
            let (held, limit) = readahead.held_bytes();
            samples.push(Sample::gauge(
                "weir_readahead_held_bytes",
                vec![],
                held as f64,
            ));
            samples.push(Sample::gauge(
                "weir_readahead_limit_bytes",
                vec![],
                limit as f64,
            ));
        }
        crate::metrics::encode(&samples)
    }

    /// Whether any member of the pool is resilvering.
    pub fn resilvering(&self, name: &str) -> anyhow::Result<bool> {
        Ok(self.pool(name)?.resilvering())
    }

    /// For a server shutdown: scrubs save their position, background work stops.
    pub fn close(&self) {
        for (_, scrub) in self.scrubs.lock().drain() {
            scrub.shutdown();
        }
        for pool in self.pools() {
            pool.close();
        }
    }
}

impl Drop for PoolService {
    /// A request's completion may hold its pool for a moment after the
    /// request is answered. Each pool closes here, on this thread, once
    /// they let go: closing waits on the devices, which the thread of a
    /// device's completion could not do.
    fn drop(&mut self) {
        // The host's exports hold the pools' volumes, and so the pools:
        // they let go first, or every pool would wait out the deadline.
        drop(self.host.take());
        self.caches.get_mut().clear();
        self.readaheads.get_mut().clear();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for pool in self.pools.get_mut().drain(..) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let name = pool.name().to_string();
            if !PoolData::close_when_released(pool, left) {
                tracing::warn!(
                    pool = name,
                    "still held at shutdown; it closes when its last request ends"
                );
            }
        }
    }
}
