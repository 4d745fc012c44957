//! Pool administration without a running server: create a pool on
//! devices (labels), import it back from its devices, and report its state.
//!
//! ```text
//!  weir pool create tank mirror A B  ──> check A, B (size, not another pool's, distinct)
//!                                        ──> label both (generation 1) ──> registry
//!  weir pool status tank            ──> registry ──> import: read labels, pick the
//!                                        newest valid copy, rewrite stale copies,
//!                                        match members to the layout
//! ```
//!
//! The registry (`DATA_DIR/pools.toml`) remembers which device specs make up
//! each pool, as ZFS's cache file does; the labels are the truth.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::label::{choose, Label, LabelError, Layout};
use super::members::{read_labels, reserve_metadata, write_labels};
use crate::device::{self, Device, DeviceSpec, IoEngine};
use crate::pool::mirror::select::{ReadPolicy, COPIES_MAX};
use crate::sched::Mode;

/// Smaller devices cannot hold labels, metadata and useful data.
pub const DEVICE_BYTES_MIN: u64 = 64 << 20;
const REGISTRY_FILE: &str = "pools.toml";
const METADATA_BLOCK_BYTES: u32 = 4096;

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Registry {
    #[serde(default)]
    pool: Vec<RegisteredPool>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisteredPool {
    name: String,
    id: String,
    devices: Vec<String>,
    /// The device queues' mode (fifo, zfs, adaptive); absent: adaptive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sched: Option<String>,
    /// How mirrors choose the copy for a read; absent: latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    read_policy: Option<String>,
    /// The highest label generation this data directory has served the
    /// pool at: devices found behind it miss writes a newer member holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    generation: Option<u64>,
}

impl Registry {
    fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(REGISTRY_FILE)
    }

    fn load(data_dir: &Path) -> anyhow::Result<Registry> {
        let path = Self::path(data_dir);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                toml::from_str(&text).with_context(|| format!("{} is damaged", path.display()))
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Registry::default()),
            Err(err) => Err(err).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    fn entry_mut(&mut self, pool: &str) -> anyhow::Result<&mut RegisteredPool> {
        self.pool
            .iter_mut()
            .find(|p| p.name == pool)
            .with_context(|| format!("no pool named {pool:?} in the registry"))
    }

    fn save(&self, data_dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create {}", data_dir.display()))?;
        let path = Self::path(data_dir);
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, toml::to_string(self)?)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot replace {}", path.display()))
    }
}

/// `[mirror] A B [mirror C D ...]`: mirror groups, or single devices striped.
pub fn parse_layout(words: &[String]) -> anyhow::Result<Vec<Vec<String>>> {
    if words.is_empty() {
        bail!("name at least one device");
    }
    if words[0] != "mirror" {
        if let Some(word) = words.iter().find(|w| *w == "mirror") {
            bail!("{word:?} after plain devices: give every group as `mirror DEV DEV...`");
        }
        return Ok(words.iter().map(|w| vec![w.clone()]).collect());
    }
    let mut groups: Vec<Vec<String>> = Vec::new();
    for word in words {
        if word == "mirror" {
            groups.push(Vec::new());
        } else {
            groups
                .last_mut()
                .expect("starts with mirror")
                .push(word.clone());
        }
    }
    if let Some(small) = groups.iter().find(|g| g.len() < 2) {
        bail!("a mirror needs at least two devices, got {small:?}");
    }
    if groups.iter().any(|g| g.len() != groups[0].len()) {
        bail!("every mirror needs the same number of devices");
    }
    if groups[0].len() > COPIES_MAX {
        bail!(
            "a mirror of at most {COPIES_MAX} devices, got {}",
            groups[0].len()
        );
    }
    Ok(groups)
}

fn check_pool_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        bail!("invalid pool name {name:?}: 1-64 letters, digits, '-', '_' or '.'");
    }
    Ok(())
}

pub(crate) fn open_member(text: &str) -> anyhow::Result<Arc<dyn Device>> {
    let spec = DeviceSpec::parse(text).map_err(anyhow::Error::msg)?;
    let volatile = match &spec {
        DeviceSpec::Mem { .. } => true,
        DeviceSpec::Model(model) => model.store == crate::device::model::spec::ModelStore::Mem,
        DeviceSpec::File(_) => false,
    };
    if volatile {
        bail!("{text}: pools need devices that keep their data (a file, a block device, or a model with store=file:PATH)");
    }
    device::open(&spec, false, IoEngine::Auto).with_context(|| format!("cannot open {text}"))
}

/// The same device named twice, perhaps by different paths.
pub(crate) fn identity(text: &str) -> String {
    if text.starts_with("model:") {
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

pub fn create(
    name: &str,
    layout_words: &[String],
    force: bool,
    data_dir: &Path,
) -> anyhow::Result<()> {
    check_pool_name(name)?;
    let groups = parse_layout(layout_words)?;
    let mut registry = Registry::load(data_dir)?;
    if registry.pool.iter().any(|p| p.name == name) {
        bail!(
            "a pool named {name:?} already exists (see {})",
            Registry::path(data_dir).display()
        );
    }
    let texts: Vec<&String> = groups.iter().flatten().collect();
    let mut seen = BTreeMap::new();
    for text in &texts {
        if let Some(first) = seen.insert(identity(text), text) {
            bail!("{text} is listed twice (also as {first})");
        }
    }
    let mut devices = Vec::new();
    for text in &texts {
        let device = open_member(text)?;
        let size = device.info().size_bytes;
        if size < DEVICE_BYTES_MIN {
            bail!("{text} is too small: {size} bytes, a pool member needs at least {DEVICE_BYTES_MIN}");
        }
        match choose(read_labels(device.as_ref())) {
            Err(LabelError::NotALabel) => {}
            _ if force => tracing::warn!(
                device = text.as_str(),
                "overwriting an existing label (--force)"
            ),
            Ok(found) => bail!(
                "{text} belongs to pool {:?} (generation {}); use --force to take it",
                found.label.pool_name,
                found.label.generation
            ),
            Err(err) => bail!("{text} has a damaged weir label ({err}); use --force to take it"),
        }
        devices.push(device);
    }
    let pool_id = random_id()?;
    let ids = (0..devices.len())
        .map(|_| random_id())
        .collect::<anyhow::Result<Vec<u128>>>()?;
    let mut next = ids.iter();
    let layout = Layout {
        groups: groups
            .iter()
            .map(|g| {
                g.iter()
                    .map(|_| *next.next().expect("one id per device"))
                    .collect()
            })
            .collect(),
    };
    for ((device, text), id) in devices.iter().zip(&texts).zip(&ids) {
        let label = Label {
            pool_id,
            pool_name: name.into(),
            device_id: *id,
            generation: 1,
            device_bytes: device.info().size_bytes,
            block_bytes: METADATA_BLOCK_BYTES,
            layout: layout.clone(),
            resilvering: false,
        };
        reserve_metadata(device.as_ref())
            .with_context(|| format!("cannot reserve space for the pool's metadata on {text}"))?;
        write_labels(device.as_ref(), &label, &[0, 1])
            .with_context(|| format!("cannot label {text}"))?;
    }
    registry.pool.push(RegisteredPool {
        name: name.into(),
        id: format!("{pool_id:032x}"),
        // Absolute paths, so that status works from any directory.
        devices: texts.iter().map(|t| identity(t)).collect(),
        sched: None,
        read_policy: None,
        generation: None,
    });
    registry.save(data_dir)
}

/// The embedded default: pool `demo`, a 2-way mirror of two sparse 1 GiB
/// files in the data directory, with one volume `demo/default` filling it.
pub const DEMO_POOL: &str = "demo";
pub const DEMO_VOLUME: &str = "demo/default";
const DEMO_DEVICE_BYTES: u64 = 1 << 30;

pub fn create_demo(data_dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create data directory {}", data_dir.display()))?;
    let mut members = vec!["mirror".to_string()];
    for index in 0..2 {
        let path = data_dir.join(format!("{DEMO_POOL}-{index}.img"));
        let file = std::fs::File::create_new(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        file.set_len(DEMO_DEVICE_BYTES)?;
        members.push(identity(&path.display().to_string()));
    }
    create(DEMO_POOL, &members, false, data_dir)?;
    let regions =
        super::geometry::DeviceRegions::plan(DEMO_DEVICE_BYTES).expect("1 GiB holds a pool");
    super::volumes::create(DEMO_VOLUME, regions.data.1, 4096, data_dir)?;
    tracing::info!(data_dir = %data_dir.display(), "created the demo pool: a mirror of two sparse 1 GiB files");
    Ok(())
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
    fn name(self) -> &'static str {
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

/// Find a pool on `texts`: every device must carry a label of one pool.
/// With `repair`, damaged or stale label copies of current members are
/// rewritten (only when this process owns the data directory).
pub fn import(texts: &[String], repair: bool) -> anyhow::Result<Imported> {
    let mut opened = Vec::new();
    for text in texts {
        match open_member(text) {
            Ok(device) => opened.push((text.clone(), device)),
            Err(err) => tracing::warn!(device = text.as_str(), "skipping: {err:#}"),
        }
    }
    import_devices(texts, opened, repair)
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
                        write_labels(device.as_ref(), label, stale)
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
pub fn import_new(texts: &[String], data_dir: &Path) -> anyhow::Result<String> {
    let _lock = lock_data_dir(data_dir)?;
    let identities: Vec<String> = texts.iter().map(|t| identity(t)).collect();
    let found = import(&identities, true)?;
    if let Some(why) = found.refused.first() {
        bail!("{why}");
    }
    let name = found.label.pool_name.clone();
    let mut registry = Registry::load(data_dir)?;
    if registry.pool.iter().any(|p| p.name == name) {
        bail!(
            "a pool named {name:?} is already registered in {}",
            Registry::path(data_dir).display()
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

/// Names of the registered pools, in registration order.
pub fn registered_pools(data_dir: &Path) -> anyhow::Result<Vec<String>> {
    Ok(Registry::load(data_dir)?
        .pool
        .into_iter()
        .map(|p| p.name)
        .collect())
}

/// Import the registered pool `name` from its devices.
pub fn import_registered(name: &str, data_dir: &Path, repair: bool) -> anyhow::Result<Imported> {
    let registry = Registry::load(data_dir)?;
    let Some(pool) = registry.pool.iter().find(|p| p.name == name) else {
        bail!(
            "no pool named {name:?} in {}",
            Registry::path(data_dir).display()
        );
    };
    import_entry(pool, repair)
}

/// Import a registered pool from its devices, with the settings its
/// registry entry keeps.
fn import_entry(pool: &RegisteredPool, repair: bool) -> anyhow::Result<Imported> {
    let name = &pool.name;
    let mut imported = import(&pool.devices, repair).with_context(|| format!("pool {name:?}"))?;
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

/// Exclusive use of a data directory: `weir serve` holds it while it runs,
/// and the offline commands that change a pool take it. Released when the
/// file is dropped.
pub fn lock_data_dir(data_dir: &Path) -> anyhow::Result<std::fs::File> {
    try_lock_data_dir(data_dir)?.with_context(|| {
        format!(
            "{} is in use by a running weir serve; stop it first (creating pools, importing them and changing volumes are done with the server stopped)",
            data_dir.display()
        )
    })
}

/// `Ok(None)` when another process holds the directory.
pub fn try_lock_data_dir(data_dir: &Path) -> anyhow::Result<Option<std::fs::File>> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let path = data_dir.join("weir.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    Ok((rc == 0).then_some(file))
}

/// `weir pool status`: every registered pool, or one, imported and shown.
/// Label copies are repaired only if no server holds the directory.
pub fn status(name: Option<&str>, data_dir: &Path) -> anyhow::Result<String> {
    let lock = try_lock_data_dir(data_dir)?;
    let repair = lock.is_some();
    let registry = Registry::load(data_dir)?;
    let pools: Vec<&RegisteredPool> = registry
        .pool
        .iter()
        .filter(|p| name.is_none_or(|n| p.name == n))
        .collect();
    if pools.is_empty() {
        match name {
            Some(name) => bail!(
                "no pool named {name:?} in {}",
                Registry::path(data_dir).display()
            ),
            None => return Ok("no pools\n".into()),
        }
    }
    let mut out = String::new();
    for pool in pools {
        render(&mut out, &import_entry(pool, repair)?);
    }
    Ok(out)
}

fn render(out: &mut String, pool: &Imported) {
    let label = &pool.label;
    let _ = writeln!(out, "  pool: {}", label.pool_name);
    let _ = writeln!(out, "    id: {:032x}", label.pool_id);
    let _ = writeln!(out, " state: {}", pool.state());
    let _ = writeln!(out, " sched: {}", pool.sched.name());
    let _ = writeln!(out, " reads: {}", pool.read_policy.name());
    for why in &pool.refused {
        let _ = writeln!(out, "  note: not a member: {why}");
    }
    for text in &pool.repaired_labels {
        let _ = writeln!(
            out,
            "  note: rewrote a stale or damaged label copy on {text}"
        );
    }
    let _ = writeln!(out, "config:\n\n\t{:<40} STATE", "NAME");
    let _ = writeln!(out, "\t{:<40} {}", label.pool_name, pool.state());
    let copies = label.layout.groups[0].len();
    for (index, group) in pool.members.iter().enumerate() {
        let indent = if copies > 1 {
            let online = group.iter().any(|m| m.1 == MemberState::Online);
            let all = group.iter().all(|m| m.1 == MemberState::Online);
            let state = if all {
                "ONLINE"
            } else if online {
                "DEGRADED"
            } else {
                "UNAVAIL"
            };
            let _ = writeln!(out, "\t  {:<38} {state}", format!("mirror-{index}"));
            "    "
        } else {
            "  "
        };
        for (member, (text, state)) in group.iter().enumerate() {
            let shown = text.clone().unwrap_or_else(|| {
                format!("(missing: {:032x})", label.layout.groups[index][member])
            });
            let width = 40 - indent.len();
            let _ = writeln!(out, "\t{indent}{shown:<width$} {}", state.name());
        }
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn layouts_parse_as_mirrors_or_single_devices() {
        assert_eq!(
            parse_layout(&words("a b")).unwrap(),
            vec![vec!["a"], vec!["b"]]
        );
        assert_eq!(
            parse_layout(&words("mirror a b mirror c d")).unwrap(),
            vec![vec!["a", "b"], vec!["c", "d"]]
        );
        for bad in [
            "",
            "mirror a",
            "a mirror b c",
            "mirror a b mirror c d e",
            "mirror",
        ] {
            assert!(
                parse_layout(&words(bad)).is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn a_mirror_wider_than_the_selector_can_weigh_is_refused() {
        let devices = |n: usize| {
            (0..n)
                .map(|i| format!("d{i}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert!(parse_layout(&words(&format!("mirror {}", devices(COPIES_MAX)))).is_ok());
        let err = parse_layout(&words(&format!("mirror {}", devices(COPIES_MAX + 1))))
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 64"), "{err}");
    }

    #[test]
    fn pool_names_are_checked() {
        assert!(check_pool_name("tank-1.b_2").is_ok());
        for bad in ["", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_pool_name(bad).is_err());
        }
    }
}
