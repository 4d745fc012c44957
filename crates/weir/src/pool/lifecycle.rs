//! `weir pool export` and `weir pool destroy`: a pool leaves this data
//! directory. Export only forgets it here (its devices keep it, for
//! `weir pool import` on this machine or another); destroy also erases
//! its labels, so that its devices are free for a new pool. A running
//! server closes the pool first (service/live.rs); without one, the CLI
//! takes the data directory's lock.

use std::path::Path;

use anyhow::{bail, Context};

use super::data_dir::lock_data_dir;
use super::import::{identity, in_use, open_member};
use super::label::choose;
use super::members::{erase_labels, read_labels};
use super::registry::{RegisteredPool, Registry};

/// Forget `name` in `data_dir`; its devices are untouched.
pub fn export(name: &str, data_dir: &Path) -> anyhow::Result<String> {
    let _lock = lock_data_dir(data_dir)?;
    export_held(name, data_dir)
}

/// `export` by the holder of the data directory's lock (the server).
pub fn export_held(name: &str, data_dir: &Path) -> anyhow::Result<String> {
    let pool = unregister(name, data_dir)?;
    let devices: Vec<&str> = pool
        .devices
        .iter()
        .map(String::as_str)
        .filter(|d| !d.starts_with("missing:"))
        .collect();
    Ok(format!(
        "pool {name} exported: its devices keep it; import it with weir pool import {}\n",
        devices.join(" ")
    ))
}

/// Erase the labels of `name`'s members and forget it. A device that no
/// longer carries this pool's label (taken by another pool since) is left
/// alone, and one that cannot be opened is named.
pub fn destroy(name: &str, data_dir: &Path) -> anyhow::Result<String> {
    let _lock = lock_data_dir(data_dir)?;
    destroy_held(name, data_dir)
}

/// `destroy` by the holder of the data directory's lock (the server).
pub fn destroy_held(name: &str, data_dir: &Path) -> anyhow::Result<String> {
    let registry = Registry::load(data_dir)?;
    let pool = registry
        .pool
        .iter()
        .find(|p| p.name == name)
        .with_context(|| {
            format!(
                "no pool named {name:?} in {}",
                super::registry::path_in(data_dir).display()
            )
        })?
        .clone();
    let mut opened = Vec::new();
    for text in pool.devices.iter().filter(|d| !d.starts_with("missing:")) {
        match open_member(&identity(text)) {
            Ok(device) => opened.push((text.clone(), device)),
            Err(err) if in_use(&err) => return Err(err),
            Err(err) => tracing::warn!(device = text.as_str(), "{err:#}"),
        }
    }
    // Never another live server's members, wherever it runs.
    super::takeover::check_holders(&opened, false)?;
    let mut out = String::new();
    for (text, device) in &opened {
        let ours = choose(read_labels(device.as_ref()))
            .is_ok_and(|found| format!("{:032x}", found.label.pool_id) == pool.id);
        if !ours {
            out.push_str(&format!("{text}: not this pool's now; left alone\n"));
            continue;
        }
        erase_labels(device.as_ref())
            .with_context(|| format!("cannot erase the labels of {text}"))?;
        out.push_str(&format!("{text}: labels erased\n"));
    }
    unregister(name, data_dir)?;
    if opened.len() < pool.devices.len() {
        out.push_str("devices that could not be opened keep their labels\n");
    }
    out.push_str(&format!("pool {name} destroyed\n"));
    Ok(out)
}

fn unregister(name: &str, data_dir: &Path) -> anyhow::Result<RegisteredPool> {
    let mut registry = Registry::load(data_dir)?;
    let Some(index) = registry.pool.iter().position(|p| p.name == name) else {
        bail!(
            "no pool named {name:?} in {}",
            super::registry::path_in(data_dir).display()
        );
    };
    let pool = registry.pool.remove(index);
    registry.save(data_dir)?;
    let _ = std::fs::remove_file(super::scrub::checkpoint_path(name, data_dir));
    Ok(pool)
}
