//! `weir pool import` with no devices: look in directories for devices
//! that carry weir labels and show the pools they make up, as
//! `zpool import` does; `weir pool import NAME` then imports one of them
//! by name or id.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::bail;

use super::label::{choose, Label};
use super::members::read_labels;
use super::vacancy::DEVICE_BYTES_MIN;
use crate::device::{DeviceSpec, IoEngine};

/// One pool seen on the devices scanned.
pub struct Found {
    pub name: String,
    pub id: u128,
    /// The newest label among its devices: the layout they should make up.
    pub label: Label,
    /// Each device with its label's generation and device id.
    pub devices: Vec<(String, u64, u128)>,
}

impl Found {
    /// Devices at the pool's newest generation, by member id.
    fn current(&self) -> Vec<&(String, u64, u128)> {
        self.devices
            .iter()
            .filter(|(_, generation, _)| *generation == self.label.generation)
            .collect()
    }

    /// ONLINE if every member is here and current; DEGRADED if every
    /// mirror group has one; UNAVAIL otherwise.
    pub fn state(&self) -> &'static str {
        let current = self.current();
        let here = |id: &u128| current.iter().any(|(_, _, d)| d == id);
        let groups = &self.label.layout.groups;
        if groups.iter().flatten().all(here) {
            "ONLINE"
        } else if groups.iter().all(|g| g.iter().any(here)) {
            "DEGRADED"
        } else {
            "UNAVAIL"
        }
    }

    /// The devices to import it from.
    pub fn device_paths(&self) -> Vec<String> {
        self.devices
            .iter()
            .map(|(path, _, _)| path.clone())
            .collect()
    }
}

/// Files and block devices directly in `dirs` (not below) that carry a
/// weir label, grouped by pool, but for the pools with an id in
/// `registered` (this data directory has them). Devices that cannot be
/// opened (in use by a server, not readable) are left out.
pub fn scan(dirs: &[PathBuf], registered: &[String]) -> Vec<Found> {
    let mut pools: BTreeMap<u128, Found> = BTreeMap::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            tracing::warn!(dir = %dir.display(), "cannot read the directory; not scanned");
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let Some(label) = label_of(&path) else {
                continue;
            };
            if registered.contains(&format!("{:032x}", label.pool_id)) {
                continue;
            }
            let text = path.display().to_string();
            let found = pools.entry(label.pool_id).or_insert_with(|| Found {
                name: label.pool_name.clone(),
                id: label.pool_id,
                label: label.clone(),
                devices: Vec::new(),
            });
            if label.generation > found.label.generation {
                found.name = label.pool_name.clone();
                found.label = label.clone();
            }
            if !found.devices.iter().any(|(p, _, _)| *p == text) {
                found
                    .devices
                    .push((text, label.generation, label.device_id));
            }
        }
    }
    pools.into_values().collect()
}

/// The label on `path`, if it is a file of pool size or a block device
/// that carries one.
fn label_of(path: &Path) -> Option<Label> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path).ok()?;
    let kind = meta.file_type();
    let plausible = kind.is_block_device() || (kind.is_file() && meta.len() >= DEVICE_BYTES_MIN);
    if !plausible {
        return None;
    }
    let spec = DeviceSpec::File(path.to_path_buf());
    let device = crate::device::open(&spec, true, IoEngine::Auto).ok()?;
    choose(read_labels(device.as_ref())).ok().map(|c| c.label)
}

/// What `weir pool import` with no devices prints: the pools found that
/// this data directory does not have already.
/// `dirs_given`: the directories were named with --dir, and the command
/// it suggests names them too.
pub fn render(found: &[Found], dirs: &[PathBuf], dirs_given: bool) -> String {
    let scanned: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    if found.is_empty() {
        return format!("no pools to import in {}\n", scanned.join(", "));
    }
    let mut out = String::new();
    for pool in found {
        let _ = writeln!(out, "   pool: {}", pool.name);
        let _ = writeln!(out, "     id: {:032x}", pool.id);
        let _ = writeln!(out, "  state: {}", pool.state());
        let action = if pool.state() == "UNAVAIL" {
            "a mirror group has no current member here; look for the missing devices".to_string()
        } else {
            let mut command = format!("weir pool import {}", pool.name);
            for dir in dirs.iter().filter(|_| dirs_given) {
                let _ = write!(command, " --dir {}", dir.display());
            }
            command
        };
        let _ = writeln!(out, " action: {action}");
        let _ = writeln!(out, " config:");
        for (path, generation, _) in &pool.devices {
            let note = if *generation < pool.label.generation {
                " (behind: missed writes)"
            } else {
                ""
            };
            let _ = writeln!(out, "\t{path}{note}");
        }
        let members = pool.label.layout.groups.iter().flatten().count();
        let current = pool.current().len();
        if current < members {
            let _ = writeln!(
                out,
                "\t({} of {members} members not found)",
                members - current
            );
        }
        out.push('\n');
    }
    out
}

/// The devices of the pool named `name` (or with that id) among `found`.
pub fn devices_of(found: &[Found], name: &str, dirs: &[PathBuf]) -> anyhow::Result<Vec<String>> {
    let matches: Vec<&Found> = found
        .iter()
        .filter(|p| p.name == name || format!("{:032x}", p.id) == name)
        .collect();
    match matches.as_slice() {
        [one] => Ok(one.device_paths()),
        [] => {
            let scanned: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            bail!(
                "no pool named {name:?} on the devices in {} (weir pool import with no argument lists what is there; --dir adds a directory)",
                scanned.join(", ")
            )
        }
        _ => bail!(
            "several pools are named {name:?}: import one by its id (weir pool import lists them)"
        ),
    }
}
