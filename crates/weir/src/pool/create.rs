//! `weir pool create`: check the devices (large enough, not another
//! pool's, each named once), label them at generation 1 and register the
//! pool; and the embedded demo pool `weir serve` makes on first start.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};

use super::import::{identity, open_member, random_id};
use super::label::{Label, Layout};
use super::layout::{check_pool_name, parse_layout};
use super::members::{reserve_metadata, write_labels};
use super::registry::{RegisteredPool, Registry};
use super::vacancy::check_free;

const METADATA_BLOCK_BYTES: u32 = 4096;

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
            super::registry::path_in(data_dir).display()
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
        check_free(text, device.as_ref(), None, force)?;
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
        write_labels(device.as_ref(), &label, None, &[0, 1])
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
