//! Finding a pool on its devices: read every label, take the pool most
//! devices belong to at its newest generation, rewrite stale or damaged
//! label copies, and match members to the layout. Also `weir pool import`,
//! which registers a pool found on devices.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};

use super::data_dir::lock_data_dir;
use super::label::{choose, Label};
use super::members::{read_labels, write_labels};
use super::read_policy::ReadPolicy;
use super::registry::{RegisteredPool, Registry, REGISTRY_FILE};
use super::takeover::check_holders;
use crate::device::{self, Device, DeviceSpec, IoEngine};
use crate::sched::Mode;

pub(crate) fn open_member(text: &str) -> anyhow::Result<Arc<dyn Device>> {
    let spec = DeviceSpec::parse(text).map_err(anyhow::Error::msg)?;
    let volatile = match &spec {
        DeviceSpec::Mem { .. } => true,
        DeviceSpec::Model(model) => model.store == crate::device::model::spec::ModelStore::Mem,
        DeviceSpec::File(_) | DeviceSpec::Rbd(_) => false,
    };
    if volatile {
        bail!("{text}: pools need devices that keep their data (a file, a block device, an rbd image, or a model with store=file:PATH)");
    }
    // A file's error names its path already.
    device::open(&spec, false, IoEngine::Auto).map_err(|err| match spec {
        DeviceSpec::File(_) => anyhow::Error::new(err).context("cannot open"),
        _ => anyhow::Error::new(err).context(format!("cannot open {text}")),
    })
}

/// The same device named twice, perhaps by different paths.
pub(crate) fn identity(text: &str) -> String {
    if text.starts_with("model:") || text.starts_with("rbd:") {
        return text.to_string();
    }
    let path = text.strip_prefix("file:").unwrap_or(text);
    std::fs::canonicalize(path).map_or_else(|_| text.to_string(), |p| p.display().to_string())
}

pub(crate) fn random_id() -> anyhow::Result<u128> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("cannot read /dev/urandom")?;
    Ok(u128::from_be_bytes(bytes))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    Online,
    /// Its label is older than the pool's: it missed changes.
    Stale,
    /// Not found among the devices given.
    Unavail,
    /// Joined by `pool replace`; its copy is being rebuilt.
    Resilvering,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Online => "ONLINE",
            MemberState::Stale => "STALE",
            MemberState::Unavail => "UNAVAIL",
            MemberState::Resilvering => "RESILVERING",
        }
    }
}

pub struct Imported {
    pub label: Label,
    /// Per group, per member: where it was found and its state.
    pub members: Vec<Vec<(Option<String>, MemberState)>>,
    /// Per group, per member: the open device, if present and current.
    pub devices: Vec<Vec<Option<Arc<dyn Device>>>>,
    /// Per group, per member: the open device, if present and stale (its
    /// label's generation is behind the pool's). Serving rebuilds it.
    pub stale_devices: Vec<Vec<Option<Arc<dyn Device>>>>,
    /// Devices given that are not members now, and why (no valid label,
    /// or another pool's): they are never written.
    pub refused: Vec<String>,
    /// Label copies rewritten because they were stale or damaged.
    pub repaired_labels: Vec<String>,
    /// The device queues' mode, from the registry.
    pub sched: Mode,
    /// How mirrors choose the copy for a read, from the registry.
    pub read_policy: ReadPolicy,
}

impl Imported {
    pub fn state(&self) -> &'static str {
        let group_ok =
            |g: &Vec<(Option<String>, MemberState)>| g.iter().any(|m| m.1 == MemberState::Online);
        if self
            .members
            .iter()
            .flatten()
            .all(|m| m.1 == MemberState::Online)
        {
            "ONLINE"
        } else if self.members.iter().all(group_ok) {
            "DEGRADED"
        } else {
            "UNAVAIL"
        }
    }
}

/// Find a pool on `texts`: every device must carry a label of one pool,
/// and none may be held by another live process (takeover.rs; `force`
/// takes devices whose holder's heartbeat is seen to have stopped).
/// With `repair`, damaged or stale label copies of current members are
/// rewritten (only when this process owns the data directory).
pub fn import(texts: &[String], repair: bool, force: bool) -> anyhow::Result<Imported> {
    let mut opened = Vec::new();
    let mut skipped = Vec::new();
    for text in texts {
        match open_member(text) {
            Ok(device) => opened.push((text.clone(), device)),
            // Another server owns it: importing without it would serve the
            // pool degraded beside that server and let the copies diverge.
            Err(err) if in_use(&err) => return Err(err),
            Err(err) => {
                tracing::warn!(device = text.as_str(), "skipping: {err:#}");
                skipped.push(format!("{err:#}"));
            }
        }
    }
    if opened.is_empty() && !skipped.is_empty() {
        bail!(
            "none of its devices could be opened ({})",
            skipped.join("; ")
        );
    }
    check_holders(&opened, force)?;
    import_devices(texts, opened, repair)
}

pub(super) fn in_use(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::WouldBlock)
    })
}

/// `import` on devices already open; `texts` is the registered list, in
/// layout order, which names members that are missing.
pub fn import_devices(
    texts: &[String],
    opened: Vec<(String, Arc<dyn Device>)>,
    repair: bool,
) -> anyhow::Result<Imported> {
    // (spec, device, chosen label, label copies to rewrite)
    type Found = (String, Arc<dyn Device>, Label, Vec<usize>);
    let mut found: Vec<Found> = Vec::new();
    // Devices that are not members now: never written, shown in status.
    let mut refused = Vec::new();
    for (text, device) in opened {
        match choose(read_labels(device.as_ref())) {
            Ok(chosen) => found.push((text, device, chosen.label, chosen.stale)),
            Err(err) => refused.push(format!("{text}: {err}")),
        }
    }
    // The pool is the one most of the labelled devices belong to.
    let Some(newest) = found
        .iter()
        .max_by_key(|f| {
            let votes = found.iter().filter(|o| o.2.pool_id == f.2.pool_id).count();
            (votes, f.2.generation)
        })
        .map(|f| f.2.clone())
    else {
        match refused.first() {
            Some(why) => bail!("no device carries a valid weir label ({why})"),
            None => bail!("none of the devices could be opened"),
        }
    };
    found.retain(|f| {
        let ours = f.2.pool_id == newest.pool_id;
        if !ours {
            refused.push(format!(
                "{}: belongs to pool {:?}, not {:?}",
                f.0, f.2.pool_name, newest.pool_name
            ));
        }
        ours
    });
    for why in &refused {
        tracing::warn!(pool = newest.pool_name.as_str(), "not a member: {why}");
    }
    let mut repaired_labels = Vec::new();
    let mut members = Vec::new();
    let mut devices = Vec::new();
    let mut stale_devices = Vec::new();
    // Devices are registered in layout order, which names missing members.
    let flat_len: usize = newest.layout.groups.iter().map(Vec::len).sum();
    let mut flat_index = 0;
    for group in &newest.layout.groups {
        let mut states = Vec::new();
        let mut opened = Vec::new();
        let mut stale_opened = Vec::new();
        for id in group {
            let registered = (texts.len() == flat_len).then(|| texts[flat_index].clone());
            flat_index += 1;
            let current = found
                .iter()
                .find(|f| f.2.device_id == *id && f.2.generation == newest.generation);
            opened.push(current.map(|f| Arc::clone(&f.1)));
            let behind = found
                .iter()
                .find(|f| f.2.device_id == *id && f.2.generation < newest.generation);
            stale_opened.push(behind.map(|f| Arc::clone(&f.1)));
            match found.iter().find(|f| f.2.device_id == *id) {
                None => states.push((registered, MemberState::Unavail)),
                Some((text, _, label, _)) if label.generation < newest.generation => {
                    states.push((Some(text.clone()), MemberState::Stale))
                }
                Some((text, device, label, stale)) => {
                    if repair && !stale.is_empty() {
                        write_labels(device.as_ref(), label, None, stale)
                            .with_context(|| format!("cannot repair the label of {text}"))?;
                        repaired_labels.push(text.clone());
                    }
                    let state = if label.resilvering {
                        MemberState::Resilvering
                    } else {
                        MemberState::Online
                    };
                    states.push((Some(text.clone()), state));
                }
            }
        }
        members.push(states);
        devices.push(opened);
        stale_devices.push(stale_opened);
    }
    Ok(Imported {
        label: newest,
        members,
        devices,
        stale_devices,
        refused,
        repaired_labels,
        sched: Mode::default(),
        read_policy: ReadPolicy::default(),
    })
}

/// `weir pool import DEV...`: register the pool whose labels the devices
/// carry (a registry lost, or disks moved from another machine). All must
/// belong to one pool, and every mirror group needs a current member among
/// them; members not given are registered as `missing:ID`, to be replaced.
pub fn import_new(texts: &[String], data_dir: &Path, force: bool) -> anyhow::Result<String> {
    let _lock = lock_data_dir(data_dir)?;
    register_found(texts, data_dir, force)
}

/// `import_new` by the holder of the data directory's lock (the server).
pub fn register_found(texts: &[String], data_dir: &Path, force: bool) -> anyhow::Result<String> {
    let identities: Vec<String> = texts.iter().map(|t| identity(t)).collect();
    let found = import(&identities, true, force)?;
    if let Some(why) = found.refused.first() {
        bail!("{why}");
    }
    let name = found.label.pool_name.clone();
    let mut registry = Registry::load(data_dir)?;
    if registry.pool.iter().any(|p| p.name == name) {
        bail!(
            "a pool named {name:?} is already registered in {}",
            super::registry::path_in(data_dir).display()
        );
    }
    if found.state() == "UNAVAIL" {
        bail!("pool {name:?} cannot be imported: a mirror group has no current member among the devices given");
    }
    let devices = found
        .members
        .iter()
        .zip(&found.label.layout.groups)
        .flat_map(|(members, ids)| {
            members
                .iter()
                .zip(ids)
                .map(|((text, state), id)| match (text, state) {
                    (
                        Some(text),
                        MemberState::Online | MemberState::Resilvering | MemberState::Stale,
                    ) => text.clone(),
                    _ => format!("missing:{id:032x}"),
                })
        })
        .collect();
    registry.pool.push(RegisteredPool {
        name: name.clone(),
        id: format!("{:032x}", found.label.pool_id),
        devices,
        sched: None,
        read_policy: None,
        generation: None,
    });
    registry.save(data_dir)?;
    Ok(name)
}

/// Import the registered pool `name` from its devices.
pub fn import_registered(name: &str, data_dir: &Path, repair: bool) -> anyhow::Result<Imported> {
    let registry = Registry::load(data_dir)?;
    let Some(pool) = registry.pool.iter().find(|p| p.name == name) else {
        bail!(
            "no pool named {name:?} in {}",
            super::registry::path_in(data_dir).display()
        );
    };
    import_entry(pool, repair)
}

/// Import a registered pool from its devices, with the settings its
/// registry entry keeps.
pub(super) fn import_entry(pool: &RegisteredPool, repair: bool) -> anyhow::Result<Imported> {
    let name = &pool.name;
    let mut imported =
        import(&pool.devices, repair, false).with_context(|| format!("pool {name:?}"))?;
    // The devices at its paths could all carry another pool's labels now.
    let found_id = format!("{:032x}", imported.label.pool_id);
    if found_id != pool.id {
        bail!(
            "pool {name:?}: its devices now belong to pool {:?} ({found_id}), not this one ({})",
            imported.label.pool_name,
            pool.id
        );
    }
    if let Some(seen) = pool
        .generation
        .filter(|seen| *seen > imported.label.generation)
    {
        bail!(
            "pool {name:?}: the devices found are at generation {}, behind the {seen} this \
             data directory served: a member holding newer writes is missing. Bring it back; \
             to serve the older data instead, remove the pool from {} and `weir pool import` \
             its devices",
            imported.label.generation,
            REGISTRY_FILE,
        );
    }
    if let Some(text) = &pool.sched {
        imported.sched = Mode::parse(text).with_context(|| {
            format!("pool {name:?}: unknown sched {text:?} in the registry (want fifo, zfs or adaptive)")
        })?;
    }
    if let Some(text) = &pool.read_policy {
        imported.read_policy = ReadPolicy::parse(text).with_context(|| {
            format!(
                "pool {name:?}: unknown read policy {text:?} in the registry (want {})",
                ReadPolicy::names()
            )
        })?;
    }
    Ok(imported)
}
