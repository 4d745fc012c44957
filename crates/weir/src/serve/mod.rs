//! `weir serve`: open the pools and exports, serve them until SIGINT or
//! SIGTERM, then write every cached write back and close the pools.
//!
//! ```text
//!  config ─> pools (PoolService) ─┐
//!  --export devices ──────────────┼─> ExportHost (host.rs): cache, readahead
//!                                 │        └─> Exports ─> server (listeners, connections)
//!  admin endpoint ─> PoolService ─┘   (volumes created and removed while serving)
//! ```

mod host;
mod reload;

use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;

use crate::admin::AdminEndpoint;
use crate::cache::{DirtyBudget, Flusher};
use crate::config::{ServeArgs, ServeConfig, TlsSetting};
use crate::pool::service::{PoolService, VolumeHost};
use crate::server::tls::Tls;
use crate::server::{self, Exports, Listeners};
use host::ExportHost;

pub fn run(args: &ServeArgs, init_logging: impl FnOnce(&str)) -> anyhow::Result<()> {
    let config = Arc::new(ServeConfig::resolve(args)?);
    init_logging(&config.log_level);
    // With nothing else to serve, weir serves the demo pool, creating it
    // first. A data directory from before pools (default.img) keeps
    // serving that file.
    let registry = crate::pool::registry::path_in(&config.data_dir);
    let legacy_default = config.data_dir.join("default.img");
    if config.exports.is_empty() && !registry.exists() && !legacy_default.exists() {
        crate::pool::create::create_demo(&config.data_dir)?;
    }
    // Pools live in the data directory only if it has a registry; the lock
    // keeps offline pool commands away while this server runs, and they
    // go through its admin endpoint instead.
    let mut data_dir_lock = if registry.exists() {
        Some(crate::pool::data_dir::lock_data_dir(&config.data_dir)?)
    } else {
        None
    };
    let opened = crate::pool::volumes::open_all(&config.data_dir)?;
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
    let tls = load_tls(&config)?;
    let mut exports = Exports::new(Vec::new(), config.max_block_bytes)
        .with_in_flight_max(config.max_in_flight_bytes);
    if let Some(tls) = tls.clone() {
        exports = exports.with_tls(tls);
    }
    let exports = Arc::new(exports);
    let flusher = Flusher::start(DirtyBudget::new(config.cache_dirty_max_bytes));
    let host = Arc::new(ExportHost::new(
        Arc::clone(&exports),
        Arc::clone(&config),
        Arc::clone(&flusher),
    ));
    let service = PoolService::new(&config.data_dir, opened.pools, true)
        .with_unavailable(opened.unavailable)
        .with_host(Arc::clone(&host) as Arc<dyn VolumeHost>);
    let service = Arc::new(service);
    let served = start_and_serve(
        args,
        &config,
        &mut data_dir_lock,
        &host,
        &service,
        &exports,
        tls,
    );
    // Whether serving ended or never began: every cached write goes to
    // the devices, then the pools close cleanly (scrubs save their
    // position) once the exports that hold their volumes are gone.
    host.write_back_all();
    flusher.stop();
    service.close();
    drop(host);
    drop(exports);
    drop(service);
    // Offline pool commands wait until the pools have closed.
    drop(data_dir_lock);
    served
}

/// Keeps the reload watcher running while serving; on any way out, stops
/// it and waits, so that its references to the pools are gone before they
/// close.
struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Export the volumes, start the admin endpoint and the listeners, and
/// serve until a signal. The caller closes everything, however this ends.
fn start_and_serve(
    args: &ServeArgs,
    config: &Arc<ServeConfig>,
    data_dir_lock: &mut Option<std::fs::File>,
    host: &Arc<ExportHost>,
    service: &Arc<PoolService>,
    exports: &Arc<Exports>,
    tls: Option<Tls>,
) -> anyhow::Result<()> {
    let pool_volumes = service.volume_names();
    if let Some(name) = pool_volumes
        .iter()
        .find(|name| config.exports.iter().any(|spec| spec.name == **name))
    {
        anyhow::bail!(
            "export {name:?} is both an --export and a pool volume; rename the export (clients could not tell which one they reach)"
        );
    }
    // --export devices first: the first export is the default one.
    let registry = crate::pool::registry::path_in(&config.data_dir);
    let specs = if config.exports.is_empty() && !registry.exists() {
        vec![config.embedded_default()?]
    } else {
        config.exports.clone()
    };
    for spec in &specs {
        add_device(host, service, spec)?;
    }
    service.serve_all_volumes()?;
    // A server of --export devices alone holds the directory too when it
    // is free, for the endpoint its exports' metrics are read from (once
    // they are served: a server that fails to start leaves nothing
    // behind). One that another server holds leaves this server without
    // an endpoint, not without its exports.
    let holds_pools = data_dir_lock.is_some();
    if !holds_pools && config.admin.is_some() {
        *data_dir_lock = hold_if_free(&config.data_dir);
    }
    let admin = match (&config.admin, &data_dir_lock) {
        (Some(listen), Some(_)) => {
            let started =
                AdminEndpoint::start(listen, &config.data_dir, Arc::clone(service), tls.as_ref());
            match started {
                Ok(endpoint) => Some(endpoint),
                // Pools need their endpoint for every change while served.
                Err(err) if holds_pools => return Err(err),
                Err(err) => {
                    tracing::warn!("serving the exports with no admin endpoint: {err:#}");
                    None
                }
            }
        }
        _ => None,
    };

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("cannot install signal handlers")?;
    }
    let reload_requested = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&reload_requested))
        .context("cannot install signal handlers")?;
    let reloads = Watcher {
        stop: Arc::clone(&stop),
        thread: Some(reload::watch(
            args.clone(),
            Arc::clone(host),
            Arc::clone(service),
            reload_requested,
            Arc::clone(&stop),
        )?),
    };
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
    match exports.all().first() {
        Some(first) => print_connect_hint(&listeners, &first.name),
        None => println!(
            "weir {} serving no volume yet: create one with weir volume create POOL/NAME --size SIZE --data-dir {}",
            env!("CARGO_PKG_VERSION"),
            config.data_dir.display()
        ),
    }
    // Readiness for a service manager (Type=notify); without one, nothing.
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    let served = server::serve(listeners, Arc::clone(exports), &stop, config.shutdown_grace);
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    // No pool or volume changes from here on (the serve loop may also have
    // ended on an error, with no signal).
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    drop(admin);
    drop(reloads);
    drop(pid_file);
    served
}

/// Serve an `--export` device, its cache and readahead shown by the pool
/// service's status and metrics.
fn add_device(
    host: &ExportHost,
    service: &PoolService,
    spec: &crate::config::ExportSpec,
) -> anyhow::Result<()> {
    let attachments = host.add_device(spec)?;
    if let Some(cache) = attachments.cache {
        service.add_cache(&spec.name, cache);
    }
    if let Some(readahead) = attachments.readahead {
        service.add_readahead(&spec.name, readahead);
    }
    Ok(())
}

/// The data directory's lock, made with the directory if need be, or
/// `None` with the reason logged: another server holds it, or it cannot
/// be made. Exports are served either way.
fn hold_if_free(data_dir: &std::path::Path) -> Option<std::fs::File> {
    let lock = std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create data directory {}", data_dir.display()))
        .and_then(|()| crate::pool::data_dir::try_lock_data_dir(data_dir));
    let why = match lock {
        Ok(Some(lock)) => return Some(lock),
        Ok(None) => "another weir serve holds it".to_string(),
        Err(err) => format!("{err:#}"),
    };
    tracing::warn!(
        data_dir = %data_dir.display(),
        "no admin endpoint (no /metrics, weir iostat or online pool commands): {why}; give this server a --data-dir of its own for one"
    );
    None
}

fn load_tls(config: &ServeConfig) -> anyhow::Result<Option<Tls>> {
    if config.tls.setting == TlsSetting::Off {
        return Ok(None);
    }
    let tls = &config.tls;
    let loaded = Tls::load(tls.setting.mode(), &tls.certificates, tls.verify_peer)
        .context("cannot set up TLS")?;
    tracing::info!(
        certificates = %tls.certificates.display(),
        verify_peer = tls.verify_peer,
        "TLS {:?}",
        tls.setting
    );
    Ok(Some(loaded))
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
