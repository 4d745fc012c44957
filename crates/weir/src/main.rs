//! The `weir` command line.

use std::io::{IsTerminal, Write};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;

use weir::admin::AdminEndpoint;
use weir::cache::{CacheMode, CachedStore, DirtyBudget, Flusher};
use weir::cli::{Cli, Command};
use weir::config::{ServeArgs, ServeConfig, TlsSetting};
use weir::device;
use weir::pool::service::PoolService;
use weir::pool::{SingleDevice, Store};
use weir::readahead::{ReadaheadBudget, ReadaheadMode, ReadaheadStore};
use weir::sched::{DeviceQueue, Mode};
use weir::server::access::Policy;
use weir::server::tls::Tls;
use weir::server::{self, Export, Exports, Listeners};
use weir::volume::Volume;

fn main() {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Bench(_) | Command::Reference(_)) {
        owner_only_files();
    }
    let result = match cli.command {
        Command::Serve(args) => serve(&args),
        Command::Bench(command) => weir::cli::bench::main(command),
        Command::Pool(command) => {
            init_logging("warn");
            weir::cli::pool::main(command)
        }
        Command::Volume(command) => {
            init_logging("warn");
            weir::cli::pool::volume_main(command)
        }
        Command::Scrub(command) => {
            init_logging("warn");
            weir::cli::pool::scrub_main(command)
        }
        Command::Iostat(args) => {
            init_logging("warn");
            weir::admin::iostat::main(args)
        }
        Command::Reference(args) => weir::cli::reference::main(&args),
    };
    if let Err(err) = result {
        eprintln!("weir: error: {err:#}");
        std::process::exit(1);
    }
}

/// What weir creates for a volume's data (the data directory, member and
/// export files, pools.toml, admin.addr, the Unix socket) is its owner's
/// alone: mode 0600, directories 0700. Another local user who could read a
/// member file would read every volume on it. An operator who wants a
/// group to reach the socket changes its mode after start.
fn owner_only_files() {
    // SAFETY: umask only sets the process's file mode creation mask.
    unsafe {
        libc::umask(0o077);
    }
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let config = ServeConfig::resolve(args)?;
    init_logging(&config.log_level);
    // With nothing else to serve, weir serves the demo pool, creating it
    // first. A data directory from before pools (default.img) keeps
    // serving that file.
    let registry = config.data_dir.join("pools.toml");
    let legacy_default = config.data_dir.join("default.img");
    if config.exports.is_empty() && !registry.exists() && !legacy_default.exists() {
        weir::pool::create::create_demo(&config.data_dir)?;
    }
    // Pools live in the data directory only if it has a registry; the lock
    // keeps offline pool commands away while this server runs.
    let _data_dir_lock = if config.data_dir.join("pools.toml").exists() {
        Some(weir::pool::data_dir::lock_data_dir(&config.data_dir)?)
    } else {
        None
    };
    let opened = weir::pool::volumes::open_all(&config.data_dir)?;
    // Other pools are served beside one that cannot open; with none open
    // and nothing else to serve, there is nothing to start for.
    if opened.pools.is_empty() && !opened.unavailable.is_empty() && config.exports.is_empty() {
        let reasons: Vec<String> = opened
            .unavailable
            .iter()
            .map(|(pool, why)| format!("pool {pool}: {why}"))
            .collect();
        anyhow::bail!(
            "no pool can be opened and no --export is given: nothing to serve ({})",
            reasons.join("; ")
        );
    }
    let pool_volumes = opened.volumes;
    let service = Arc::new(
        PoolService::new(&config.data_dir, opened.pools, true).with_unavailable(opened.unavailable),
    );
    let tls = match config.tls.setting {
        TlsSetting::Off => None,
        _ => {
            let tls = &config.tls;
            let loaded = Tls::load(tls.setting.mode(), &tls.certificates, tls.verify_peer)
                .context("cannot set up TLS")?;
            tracing::info!(
                certificates = %tls.certificates.display(),
                verify_peer = tls.verify_peer,
                "TLS {:?}",
                tls.setting
            );
            Some(loaded)
        }
    };
    let admin = match &config.admin {
        Some(listen) if service.has_pools() => Some(AdminEndpoint::start(
            listen,
            &config.data_dir,
            Arc::clone(&service),
            tls.as_ref(),
        )?),
        _ => None,
    };
    let specs = if config.exports.is_empty() && pool_volumes.is_empty() {
        vec![config.embedded_default()?]
    } else {
        config.exports.clone()
    };
    let flusher = Flusher::start(DirtyBudget::new(config.cache_dirty_max_bytes));
    let mut caches: Vec<(String, Arc<CachedStore>)> = Vec::new();
    let mut cached = |name: &str, store: Arc<dyn Store>, read_only: bool| -> Arc<dyn Store> {
        if read_only || config.cache_of(name) == CacheMode::Writethrough {
            return store;
        }
        let cache = CachedStore::new(store, &flusher);
        caches.push((name.to_string(), Arc::clone(&cache)));
        cache
    };
    // Readahead sits above the cache: what it holds was read through the
    // cache, and a write drops it before the cache takes the write.
    let readahead_budget = ReadaheadBudget::new(None);
    let mut readaheads: Vec<(String, Arc<ReadaheadStore>)> = Vec::new();
    let mut read_ahead = |name: &str, store: Arc<dyn Store>| -> Arc<dyn Store> {
        match config.readahead_of(name) {
            ReadaheadMode::On => {
                let readahead = ReadaheadStore::new(store, &readahead_budget);
                readaheads.push((name.to_string(), Arc::clone(&readahead)));
                readahead
            }
            ReadaheadMode::Off => store,
        }
    };
    let mut exports = Vec::with_capacity(specs.len() + pool_volumes.len());
    for spec in &specs {
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
        let store = cached(&spec.name, store, spec.read_only);
        let volume = Volume::new(read_ahead(&spec.name, store), spec.read_only);
        exports.push(export(
            &spec.name,
            &spec.description,
            volume,
            spec.policy.clone(),
        ));
    }
    if let Some((name, _)) = pool_volumes
        .iter()
        .find(|(name, _)| specs.iter().any(|spec| spec.name == *name))
    {
        anyhow::bail!(
            "export {name:?} is both an --export and a pool volume; rename the export (clients could not tell which one they reach)"
        );
    }
    for (name, store) in pool_volumes {
        let store = cached(&name, store, false);
        let volume = Volume::new(read_ahead(&name, store), false);
        exports.push(export(&name, "", volume, config.volume_policy(&name)));
    }
    for (name, readahead) in &readaheads {
        service.add_readahead(
            name,
            Arc::clone(readahead) as Arc<dyn weir::metrics::ReadaheadReport>,
        );
    }
    for (name, cache) in &caches {
        service.add_cache(
            name,
            Arc::clone(cache) as Arc<dyn weir::metrics::CacheReport>,
        );
    }
    let first_export = exports[0].name.clone();
    let mut exports = Exports::new(exports, config.max_block_bytes)
        .with_in_flight_max(config.max_in_flight_bytes);
    if let Some(tls) = tls {
        exports = exports.with_tls(tls);
    }
    let exports = Arc::new(exports);

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("cannot install signal handlers")?;
    }
    let open_files = server::raise_open_file_limit();
    if open_files < 8192 {
        tracing::warn!(
            "at most {open_files} open files (ulimit -n): fewer than 1,024 clients may connect"
        );
    }
    let listeners = match Listeners::inherited()? {
        Some(inherited) => {
            tracing::info!(
                "serving on the sockets the service manager passed (LISTEN_FDS); listen and socket are not used"
            );
            inherited
        }
        None => Listeners::bind(&config.listen, config.socket.as_ref())?,
    };
    let pid_file = config.pid_file.as_deref().map(PidFile::write).transpose()?;
    print_connect_hint(&listeners, &first_export);
    // Readiness for a service manager (Type=notify); without one, nothing.
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    let served = server::serve(listeners, exports, &stop, config.shutdown_grace);
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    // Every cached write goes to the devices before the pools close.
    for (name, cache) in &caches {
        let dirty = cache.dirty_bytes();
        match cache.write_back_all() {
            Ok(()) => tracing::info!(export = name, dirty_bytes = dirty, "cache written back"),
            Err(err) => tracing::error!(export = name, "cache write-back failed: {err}"),
        }
    }
    flusher.stop();
    drop(caches);
    // Scrubs save their position; then the pools close cleanly as they drop.
    service.close();
    drop(admin);
    drop(service);
    drop(pid_file);
    served
}

/// The pid file: written once the server serves, removed when it stops.
struct PidFile(std::path::PathBuf);

impl PidFile {
    fn write(path: &std::path::Path) -> anyhow::Result<PidFile> {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write the pid file {}", path.display()))?;
        Ok(PidFile(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn export(name: &str, description: &str, volume: Volume, policy: Policy) -> Export {
    tracing::info!(
        export = name,
        size_bytes = volume.size_bytes(),
        read_only = volume.caps().read_only,
        "exporting {}",
        volume.description()
    );
    Export {
        name: name.into(),
        description: description.into(),
        volume: Arc::new(volume),
        policy,
    }
}

/// One line telling the user how to connect.
fn print_connect_hint(listeners: &Listeners, export: &str) {
    let mut uris: Vec<String> = listeners
        .tcp_addrs()
        .iter()
        .map(|addr| format!("nbd://{addr}/{export}"))
        .collect();
    for path in listeners.unix_paths() {
        uris.push(format!("nbd+unix:///{export}?socket={}", path.display()));
    }
    let mut out = std::io::stdout();
    let _ = writeln!(
        out,
        "weir {} serving {} — try: nbdinfo '{}'",
        env!("CARGO_PKG_VERSION"),
        uris.join(" and "),
        uris[0]
    );
    let _ = out.flush();
}
