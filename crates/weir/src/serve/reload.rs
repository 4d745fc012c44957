//! SIGHUP: read the configuration again and apply what can change while
//! serving: exports added, removed or changed, and pool volumes' own
//! settings (access, cache, readahead). A changed export's clients are
//! disconnected as for a volume deleted, and reconnect to the new one.
//! Listen addresses, TLS, limits and the data directory change only at a
//! restart; a reload says which of them it left as they were. A
//! configuration that does not parse is refused whole, and the server goes
//! on as it was.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::host::ExportHost;
use crate::config::{ServeArgs, ServeConfig};
use crate::pool::service::{PoolService, VolumeHost};

const POLL: Duration = Duration::from_millis(200);

/// Apply a reload each time `requested` is set, until `stop` is.
pub fn watch(
    args: ServeArgs,
    host: Arc<ExportHost>,
    service: Arc<PoolService>,
    requested: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("weir-reload".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if requested.swap(false, Ordering::SeqCst) {
                    match load(&args, &service) {
                        Err(err) => {
                            tracing::error!("configuration not reloaded, nothing changed: {err:#}")
                        }
                        Ok(new) => match apply(new, &host, &service) {
                            Ok(summary) => tracing::info!("configuration reloaded: {summary}"),
                            Err(err) => tracing::error!(
                                "configuration reload stopped part way (what came before stays applied): {err:#}"
                            ),
                        },
                    }
                }
                std::thread::sleep(POLL);
            }
        })
}

/// The configuration as the file says now, checked as at start.
fn load(args: &ServeArgs, service: &PoolService) -> anyhow::Result<Arc<ServeConfig>> {
    if args.config.is_none() {
        anyhow::bail!("the server was started without --config; there is no file to read again");
    }
    let new = ServeConfig::resolve(args)?;
    let pool_volumes = service.volume_names();
    if let Some(spec) = new.exports.iter().find(|s| pool_volumes.contains(&s.name)) {
        anyhow::bail!("export {:?} is also a pool volume", spec.name);
    }
    Ok(Arc::new(new))
}

fn apply(
    new: Arc<ServeConfig>,
    host: &ExportHost,
    service: &PoolService,
) -> anyhow::Result<String> {
    let old = host.config();
    let pool_volumes = service.volume_names();
    let restart_only = [
        ("listen", old.listen != new.listen),
        ("socket", old.socket != new.socket),
        ("data_dir", old.data_dir != new.data_dir),
        (
            "max_block_bytes",
            old.max_block_bytes != new.max_block_bytes,
        ),
        (
            "max_in_flight_bytes",
            old.max_in_flight_bytes != new.max_in_flight_bytes,
        ),
        ("admin", old.admin != new.admin),
        ("tls", old.tls.setting != new.tls.setting),
        ("io_engine", old.io_engine != new.io_engine),
        (
            "cache_dirty_max_bytes",
            old.cache_dirty_max_bytes != new.cache_dirty_max_bytes,
        ),
    ];
    for (setting, _) in restart_only.iter().filter(|(_, changed)| *changed) {
        tracing::warn!("{setting} changed in the configuration: it takes effect at the next start");
    }
    host.set_config(Arc::clone(&new));
    let (mut added, mut removed, mut changed) = (0, 0, 0);
    for spec in &old.exports {
        if !new.exports.iter().any(|s| s.name == spec.name) {
            service.forget_export(&spec.name);
            host.remove(&spec.name)?;
            removed += 1;
        }
    }
    for spec in &new.exports {
        match old.exports.iter().find(|s| s.name == spec.name) {
            Some(before) if before == spec => continue,
            Some(_) => {
                service.forget_export(&spec.name);
                host.remove(&spec.name)?;
                changed += 1;
            }
            None => added += 1,
        }
        super::add_device(host, service, spec)?;
    }
    for name in &pool_volumes {
        let same = old.cache_of(name) == new.cache_of(name)
            && old.readahead_of(name) == new.readahead_of(name)
            && old.volume_policy(name) == new.volume_policy(name);
        if !same {
            service.serve_volume_again(name)?;
            changed += 1;
        }
    }
    Ok(format!(
        "{added} export(s) added, {removed} removed, {changed} changed"
    ))
}
