//! The server's export table as pools see it: each volume gets its store
//! stack (write-back cache, readahead) and is offered to clients, and a
//! volume removed is closed to clients and written back before it goes.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use parking_lot::{Mutex, RwLock};

use crate::cache::{CacheMode, CachedStore, Flusher};
use crate::config::{ExportSpec, ServeConfig};
use crate::device;
use crate::pool::service::{Attachments, VolumeHost};
use crate::pool::volume_table::{VolumeCache, VolumeProperties};
use crate::pool::{SingleDevice, Store};
use crate::readahead::{ReadaheadBudget, ReadaheadMode, ReadaheadStore};
use crate::sched::{DeviceQueue, Mode};
use crate::server::access::Policy;
use crate::server::{Export, Exports};
use crate::volume::Volume;

/// How an export is offered: what it says of itself, whether clients may
/// write, the cache mode when not the configuration's, and who may use it.
struct Shape<'a> {
    description: &'a str,
    read_only: bool,
    cache: Option<CacheMode>,
    policy: Policy,
}

/// Clients of a volume being removed get at most this long to take their
/// last replies, so that the admin call ends within its own limit.
const REMOVE_GRACE_MAX: Duration = Duration::from_secs(10);

pub struct ExportHost {
    exports: Arc<Exports>,
    /// Swapped whole by a reload (reload.rs).
    config: RwLock<Arc<ServeConfig>>,
    flusher: Arc<Flusher>,
    readahead_budget: Arc<ReadaheadBudget>,
    /// Write-back caches by export name, written back at removal and exit.
    caches: Mutex<Vec<(String, Arc<CachedStore>)>>,
}

impl ExportHost {
    pub fn new(exports: Arc<Exports>, config: Arc<ServeConfig>, flusher: Arc<Flusher>) -> Self {
        ExportHost {
            exports,
            config: RwLock::new(config),
            flusher,
            readahead_budget: ReadaheadBudget::new(None),
            caches: Mutex::new(Vec::new()),
        }
    }

    pub fn config(&self) -> Arc<ServeConfig> {
        Arc::clone(&self.config.read())
    }

    pub fn set_config(&self, config: Arc<ServeConfig>) {
        *self.config.write() = config;
    }

    /// Serve an `--export` device.
    pub fn add_device(&self, spec: &ExportSpec) -> anyhow::Result<Attachments> {
        let config = self.config();
        let device = device::open(&spec.device, spec.read_only, config.io_engine)
            .with_context(|| format!("cannot open export {:?}", spec.name))?;
        // Write-back and readahead are background I/O: the adaptive queue
        // keeps them from raising client reads' latency. Without either,
        // nothing needs a mode.
        let write_back = !spec.read_only && config.cache_of(&spec.name) == CacheMode::Writeback;
        let mode = if write_back || config.readahead_of(&spec.name) == ReadaheadMode::On {
            Mode::Adaptive
        } else {
            Mode::Fifo
        };
        let store = Arc::new(SingleDevice::new(DeviceQueue::with_mode(device, mode)));
        let shape = Shape {
            description: &spec.description,
            read_only: spec.read_only,
            cache: None,
            policy: spec.policy.clone(),
        };
        self.serve(&spec.name, store, shape)
    }

    /// Put the cache and readahead in front of `store` as the settings of
    /// export `name` say, and offer it to clients.
    fn serve(
        &self,
        name: &str,
        store: Arc<dyn Store>,
        shape: Shape,
    ) -> anyhow::Result<Attachments> {
        let config = self.config();
        let Shape {
            description,
            read_only,
            cache: cache_mode,
            policy,
        } = shape;
        let mut attachments = Attachments::default();
        let mut store = store;
        let mut cache = None;
        let cache_mode = cache_mode.unwrap_or_else(|| config.cache_of(name));
        if !read_only && cache_mode == CacheMode::Writeback {
            let cached = CachedStore::new(store, &self.flusher);
            attachments.cache = Some(Arc::clone(&cached) as _);
            cache = Some(Arc::clone(&cached));
            store = cached;
        }
        // Readahead sits above the cache: what it holds was read through
        // the cache, and a write drops it before the cache takes the write.
        if config.readahead_of(name) == ReadaheadMode::On {
            let readahead = ReadaheadStore::new(store, &self.readahead_budget);
            attachments.readahead = Some(Arc::clone(&readahead) as _);
            store = readahead;
        }
        let volume = Volume::new(store, read_only);
        tracing::info!(
            export = name,
            size_bytes = volume.size_bytes(),
            read_only = volume.caps().read_only,
            "exporting {}",
            volume.description()
        );
        self.exports
            .add(Export::new(name, description, volume, policy))?;
        if let Some(cache) = cache {
            self.caches.lock().push((name.to_string(), cache));
        }
        Ok(attachments)
    }

    /// Every cached write to the devices (at exit).
    pub fn write_back_all(&self) {
        for (name, cache) in self.caches.lock().drain(..) {
            write_back(&name, &cache);
        }
    }
}

fn write_back(name: &str, cache: &CachedStore) {
    let dirty = cache.dirty_bytes();
    match cache.write_back_all() {
        Ok(()) => tracing::info!(export = name, dirty_bytes = dirty, "cache written back"),
        Err(err) => tracing::error!(export = name, "cache write-back failed: {err}"),
    }
}

impl VolumeHost for ExportHost {
    fn add(
        &self,
        name: &str,
        store: Arc<dyn Store>,
        properties: &VolumeProperties,
    ) -> anyhow::Result<Attachments> {
        let policy = self.config().volume_policy(name);
        let cache = properties.cache.map(|cache| match cache {
            VolumeCache::Writeback => CacheMode::Writeback,
            VolumeCache::Writethrough => CacheMode::Writethrough,
        });
        let shape = Shape {
            description: &properties.description,
            read_only: properties.read_only,
            cache,
            policy,
        };
        self.serve(name, store, shape)
    }

    fn remove(&self, name: &str) -> anyhow::Result<()> {
        let Some(export) = self.exports.remove(name) else {
            // Never served (it could not be at start): nothing to stop.
            tracing::debug!(export = name, "not served; nothing to remove");
            return Ok(());
        };
        let clients = export.connection_count();
        let grace = self.config().shutdown_grace.min(REMOVE_GRACE_MAX);
        if !export.retire(grace) {
            anyhow::bail!("{name}: connections still open after their sockets were closed");
        }
        let cache = {
            let mut caches = self.caches.lock();
            let index = caches.iter().position(|(n, _)| n == name);
            index.map(|i| caches.remove(i).1)
        };
        if let Some(cache) = cache {
            cache
                .write_back_all()
                .with_context(|| format!("{name}: cached writes cannot be written back"))?;
        }
        flush(&export.volume).with_context(|| format!("{name}: the final flush failed"))?;
        tracing::info!(export = name, clients, "export removed");
        // Waits a moment for the last request's completion to let go.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&export) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

fn flush(volume: &Volume) -> std::io::Result<()> {
    if volume.caps().read_only {
        return Ok(());
    }
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    volume.flush(Box::new(move |result: std::io::Result<()>| {
        drop(sender.send(result))
    }));
    receiver
        .recv()
        .unwrap_or_else(|_| Err(std::io::Error::other("the flush was dropped")))
}
