//! The `weir pool`, `weir volume` and `weir scrub` command lines. Pool
//! and volume operations go to the running server's admin endpoint when a
//! server holds the data directory, and work on the devices directly when
//! none does, with the same output.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::progress::{chunks_in, Progress};
use crate::admin::client::AdminClient;
use crate::pool::mirror::select::ReadPolicy;
use crate::pool::scrub::{self, Checkpoint, ScrubState};
use crate::pool::service::{PoolService, ScrubAction};
use crate::pool::volume_table::PropertyChanges;
use crate::pool::volumes;

const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Label devices as a new pool: `weir pool create tank mirror A B [mirror C D]`, or single devices.
    Create(CreateArgs),
    /// Show each pool (or one): state, members, error counters, scrub and resilver progress.
    Status(StatusArgs),
    /// One line per pool: size, space its volumes reserve, free, health.
    List(ListArgs),
    /// Forget the error counts of every member of a pool, or of one, once their cause is dealt with.
    Clear(ClearArgs),
    /// Forget a pool in this data directory (a running server first disconnects its volumes' clients and closes it); its devices keep it, for `weir pool import` here or on another machine.
    Export(PoolNameArgs),
    /// Erase a pool's labels from its devices and forget it, so the devices are free (a running server first disconnects its volumes' clients and closes it; the data is not wiped).
    Destroy(PoolNameArgs),
    /// Take a member out of service on the running server (it gets no I/O; the pool serves DEGRADED) until `online` or a restart.
    Offline(MemberArgs),
    /// Bring a member taken offline back: what it missed is rebuilt from the dirty-region log.
    Online(OnlineArgs),
    /// Put NEW in place of member OLD (failed or not) and resilver onto it.
    Replace(ReplaceArgs),
    /// Register the pool found on these devices by their labels (disks moved, or a registry lost); with no devices, list the pools found in /dev and the data directory (or --dir).
    Import(ImportArgs),
    /// Show or set the device queues' mode: fifo, zfs or adaptive (at run time when served).
    Sched(SchedArgs),
    /// Show or set how mirrors choose the copy for a read: pid, round-robin, least-pending or latency (at run time when served).
    ReadPolicy(ReadPolicyArgs),
}

#[derive(Args)]
pub struct ImportArgs {
    /// The pool's devices (members not given are registered as missing);
    /// or the name or id of a pool found in the --dir directories; none:
    /// list the pools found there.
    #[arg(num_args = 0..)]
    devices: Vec<String>,
    /// A directory to look in for devices that carry weir labels (files
    /// and block devices directly in it), again for more [default: /dev
    /// and the data directory].
    #[arg(long = "dir")]
    dirs: Vec<PathBuf>,
    /// Take devices whose label names another weir as holder once its
    /// heartbeat is seen to have stopped (a server that crashed on another
    /// host). A holder whose heartbeat goes on is never taken.
    #[arg(long)]
    force: bool,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct ReplaceArgs {
    pool: String,
    /// The member to replace: its device spec as registered, or its device id.
    old: String,
    /// The new device [default: OLD itself, rebuilt in place].
    new: Option<String>,
    /// Take a device that carries another pool's label or holds other data.
    #[arg(long)]
    force: bool,
    /// Wait for the resilver to finish (always, without a running server).
    #[arg(long)]
    wait: bool,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct CreateArgs {
    /// The pool's name.
    name: String,
    /// `mirror DEV DEV... [mirror DEV DEV...]`, or `DEV...` for single devices.
    #[arg(required = true, num_args = 1..)]
    layout: Vec<String>,
    /// Take devices that carry another pool's label or hold other data.
    #[arg(long)]
    force: bool,
    /// Where the pool registry (pools.toml) lives.
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct StatusArgs {
    name: Option<String>,
    /// Also how the mirrors choose the copy for a read: each member's share, reads in flight, service times.
    #[arg(short, long)]
    verbose: bool,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct ListArgs {
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct PoolNameArgs {
    pool: String,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct MemberArgs {
    pool: String,
    /// The member: its device spec as registered, or its device id.
    device: String,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct OnlineArgs {
    #[command(flatten)]
    member: MemberArgs,
    /// Wait for the rebuild to finish.
    #[arg(long)]
    wait: bool,
}

#[derive(Args)]
pub struct ClearArgs {
    pool: String,
    /// Only this member: its device spec as registered, or its device id.
    device: Option<String>,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

pub fn main(command: PoolCommand) -> anyhow::Result<()> {
    match command {
        PoolCommand::List(args) => {
            let server_up = crate::pool::data_dir::try_lock_data_dir(&args.data_dir)?.is_none();
            if server_up {
                let client = AdminClient::for_data_dir(&args.data_dir)?;
                print!("{}", client.call("GET", "/v1/list", &[])?);
            } else {
                print!("{}", crate::pool::list::offline(&args.data_dir)?);
            }
            Ok(())
        }
        PoolCommand::Export(args) => {
            let text = match running_server(&args.data_dir)? {
                Some(client) => client.call("POST", "/v1/pool/export", &[("pool", &args.pool)])?,
                None => crate::pool::lifecycle::export(&args.pool, &args.data_dir)?,
            };
            print!("{text}");
            Ok(())
        }
        PoolCommand::Destroy(args) => {
            let text = match running_server(&args.data_dir)? {
                Some(client) => client.call("POST", "/v1/pool/destroy", &[("pool", &args.pool)])?,
                None => crate::pool::lifecycle::destroy(&args.pool, &args.data_dir)?,
            };
            print!("{text}");
            Ok(())
        }
        PoolCommand::Offline(args) => {
            let client = served(&args.data_dir, "take a member offline")?;
            let query = [
                ("pool", args.pool.as_str()),
                ("device", args.device.as_str()),
            ];
            print!("{}", client.call("POST", "/v1/offline", &query)?);
            Ok(())
        }
        PoolCommand::Online(args) => {
            let member = &args.member;
            let client = served(&member.data_dir, "bring a member online")?;
            let query = [
                ("pool", member.pool.as_str()),
                ("device", member.device.as_str()),
            ];
            print!("{}", client.call("POST", "/v1/online", &query)?);
            if args.wait {
                wait_for_served_resilver(&client, &member.pool)?;
            }
            Ok(())
        }
        PoolCommand::Clear(args) => {
            let server_up = crate::pool::data_dir::try_lock_data_dir(&args.data_dir)?.is_none();
            if !server_up {
                anyhow::bail!(
                    "no weir serve holds {}: error counts live in the running server and start at zero with it",
                    args.data_dir.display()
                );
            }
            let client = AdminClient::for_data_dir(&args.data_dir)?;
            let mut query = vec![("pool", args.pool.as_str())];
            if let Some(device) = &args.device {
                query.push(("device", device.as_str()));
            }
            print!("{}", client.call("POST", "/v1/clear", &query)?);
            Ok(())
        }
        PoolCommand::Create(args) => {
            if let Some(client) = running_server(&args.data_dir)? {
                let layout = absolute_devices(&args.layout);
                let mut query = vec![("name", args.name.as_str()), ("layout", layout.as_str())];
                if args.force {
                    query.push(("force", "1"));
                }
                print!("{}", client.call("POST", "/v1/pool/create", &query)?);
                return Ok(());
            }
            let lock = crate::pool::data_dir::lock_data_dir(&args.data_dir)?;
            crate::pool::create::create(&args.name, &args.layout, args.force, &args.data_dir)?;
            drop(lock);
            print!(
                "{}",
                crate::pool::status::status(Some(&args.name), &args.data_dir)?
            );
            Ok(())
        }
        PoolCommand::Status(args) => {
            // crate::pool::status::status takes the lock itself (to repair labels).
            let server_up = crate::pool::data_dir::try_lock_data_dir(&args.data_dir)?.is_none();
            if server_up {
                let client = AdminClient::for_data_dir(&args.data_dir)?;
                let mut query: Vec<(&str, &str)> =
                    args.name.iter().map(|n| ("pool", n.as_str())).collect();
                if args.verbose {
                    query.push(("verbose", "1"));
                }
                print!("{}", client.call("GET", "/v1/status", &query)?);
            } else {
                print!(
                    "{}",
                    crate::pool::status::status(args.name.as_deref(), &args.data_dir)?
                );
            }
            Ok(())
        }
        PoolCommand::Replace(args) => replace(&args),
        PoolCommand::Sched(args) => sched(&args),
        PoolCommand::ReadPolicy(args) => read_policy(&args),
        PoolCommand::Import(mut args) => {
            let by_name = args.devices.len() == 1 && !Path::new(&args.devices[0]).exists();
            if args.devices.is_empty() || by_name {
                let dirs_given = !args.dirs.is_empty();
                if !dirs_given {
                    args.dirs = vec![PathBuf::from("/dev"), args.data_dir.clone()];
                }
                let registered = crate::pool::registry::registered_ids(&args.data_dir)?;
                let found = crate::pool::scan::scan(&args.dirs, &registered);
                if !by_name {
                    print!(
                        "{}",
                        crate::pool::scan::render(&found, &args.dirs, dirs_given)
                    );
                    return Ok(());
                }
                args.devices = crate::pool::scan::devices_of(&found, &args.devices[0], &args.dirs)?;
            }
            if let Some(client) = running_server(&args.data_dir)? {
                let devices = absolute_devices(&args.devices);
                let mut query = vec![("devices", devices.as_str())];
                if args.force {
                    query.push(("force", "1"));
                }
                print!("{}", client.call("POST", "/v1/pool/import", &query)?);
                return Ok(());
            }
            let name = crate::pool::import::import_new(&args.devices, &args.data_dir, args.force)?;
            print!(
                "{}",
                crate::pool::status::status(Some(&name), &args.data_dir)?
            );
            Ok(())
        }
    }
}

fn replace(args: &ReplaceArgs) -> anyhow::Result<()> {
    let Some(lock) = crate::pool::data_dir::try_lock_data_dir(&args.data_dir)? else {
        let client = AdminClient::for_data_dir(&args.data_dir)?;
        let mut query = vec![
            ("pool", args.pool.as_str()),
            ("old", args.old.as_str()),
            ("new", args.new.as_deref().unwrap_or(&args.old)),
        ];
        if args.force {
            query.push(("force", "1"));
        }
        print!("{}", client.call("POST", "/v1/replace", &query)?);
        if args.wait {
            wait_for_served_resilver(&client, &args.pool)?;
        }
        return Ok(());
    };
    let service = open_local(&args.pool, &args.data_dir, false)?;
    print!(
        "{}",
        service.replace(
            &args.pool,
            &args.old,
            args.new.as_deref().unwrap_or(&args.old),
            args.force,
        )?
    );
    wait_for_resilver(|| {
        let status = service.status(Some(&args.pool), false)?;
        Ok((service.resilvering(&args.pool)?, status))
    })?;
    service.close();
    drop(service);
    drop(lock);
    print!(
        "{}",
        crate::pool::status::status(Some(&args.pool), &args.data_dir)?
    );
    Ok(())
}

/// The admin endpoint of the server holding `data_dir`; None when no
/// server runs there (the command works on the devices itself).
fn running_server(data_dir: &Path) -> anyhow::Result<Option<AdminClient>> {
    if !data_dir.is_dir() {
        return Ok(None);
    }
    match crate::pool::data_dir::try_lock_data_dir(data_dir)? {
        Some(_free) => Ok(None),
        None => AdminClient::for_data_dir(data_dir).map(Some),
    }
}

/// Device paths as the server, whose working directory is its own, can
/// open them; one per line. `mirror`, device models, memory devices and
/// rbd images stay as given.
fn absolute_devices(words: &[String]) -> String {
    words
        .iter()
        .map(|word| {
            let path = word.strip_prefix("file:").unwrap_or(word);
            let kept = ["model:", "mem:", "rbd:"];
            if word == "mirror" || kept.iter().any(|prefix| word.starts_with(prefix)) {
                word.clone()
            } else {
                std::path::absolute(path).map_or_else(|_| word.clone(), |p| p.display().to_string())
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The running server's admin endpoint, for what only a serving pool has.
fn served(data_dir: &Path, what: &str) -> anyhow::Result<AdminClient> {
    if crate::pool::data_dir::try_lock_data_dir(data_dir)?.is_some() {
        anyhow::bail!(
            "no weir serve holds {}: only a served pool has members in service to {what}",
            data_dir.display()
        );
    }
    AdminClient::for_data_dir(data_dir)
}

/// `wait_for_resilver` on the running server's status of `pool`.
fn wait_for_served_resilver(client: &AdminClient, pool: &str) -> anyhow::Result<()> {
    wait_for_resilver(|| {
        let status = client.call("GET", "/v1/status", &[("pool", pool)])?;
        Ok((status.contains("RESILVERING"), status))
    })
}

/// Poll until the resilver ends, showing its progress.
fn wait_for_resilver(poll: impl Fn() -> anyhow::Result<(bool, String)>) -> anyhow::Result<()> {
    let progress = Progress::new();
    loop {
        let (busy, status) = poll()?;
        if let Some(line) = status.lines().find(|l| l.starts_with("resilver:")) {
            progress.show("resilver", line, chunks_in(line));
        }
        if !busy {
            progress.finish();
            // That status may have been read across the resilver's end (its
            // state line before, its members after): read it again, settled.
            let (_, status) = poll()?;
            if let Some(stopped) = status
                .lines()
                .find_map(|l| l.strip_prefix("resilver: resilver of "))
            {
                anyhow::bail!("resilver of {stopped}");
            }
            let state = status
                .lines()
                .find_map(|l| l.trim().strip_prefix("state:"))
                .unwrap_or("?")
                .trim();
            eprintln!("resilver: finished; pool {state}");
            return Ok(());
        }
        std::thread::sleep(PROGRESS_INTERVAL);
    }
}

/// Open one registered pool in this process (no server holds the directory).
fn open_local(pool: &str, data_dir: &Path, resume_background: bool) -> anyhow::Result<PoolService> {
    let imported = crate::pool::import::import_registered(pool, data_dir, true)?;
    let data = crate::pool::mirror::PoolData::open(&imported)
        .with_context(|| format!("cannot open pool {pool:?}"))?;
    data.record_generations_in(data_dir);
    Ok(PoolService::new(data_dir, vec![data], resume_background))
}

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Reserve space for a volume: `weir volume create tank/db --size 10G`.
    Create(VolumeCreateArgs),
    /// Every volume of every registered pool (or of one).
    List(VolumeListArgs),
    /// Remove a volume and free its space (a running server disconnects its clients first).
    Delete(VolumeDeleteArgs),
    /// Change a volume's size (a running server disconnects its clients, who see the new size when they reconnect).
    Resize(VolumeResizeArgs),
    /// Set a volume's properties, kept with the pool: read-only, its cache mode, its description (a running server serves it anew; its clients reconnect).
    Set(VolumeSetArgs),
}

#[derive(Args)]
pub struct VolumeSetArgs {
    /// POOL/NAME
    name: String,
    /// on: clients may only read it.
    #[arg(long, value_name = "on|off")]
    read_only: Option<String>,
    /// Its own cache mode, over the server's; default: the server's again.
    #[arg(long, value_name = "writeback|writethrough|default")]
    cache: Option<String>,
    /// Shown to clients that list exports (up to 32 bytes).
    #[arg(long)]
    description: Option<String>,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct VolumeCreateArgs {
    /// POOL/NAME
    name: String,
    #[arg(long, value_parser = crate::units::parse_bytes)]
    size: u64,
    /// 4K to 128K, a power of two.
    #[arg(long, default_value = "4K", value_parser = crate::units::parse_bytes)]
    block_size: u64,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct VolumeListArgs {
    pool: Option<String>,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct VolumeResizeArgs {
    /// POOL/NAME
    name: String,
    /// The new size: it grows into free space right after the volume, or shrinks.
    #[arg(long, value_parser = crate::units::parse_bytes)]
    size: u64,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct VolumeDeleteArgs {
    /// POOL/NAME
    name: String,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

pub fn volume_main(command: VolumeCommand) -> anyhow::Result<()> {
    match command {
        VolumeCommand::Create(args) => {
            let block = u32::try_from(args.block_size).unwrap_or(u32::MAX);
            let Some(client) = running_server(&args.data_dir)? else {
                volumes::create(&args.name, args.size, block, &args.data_dir)?;
                print!(
                    "{}",
                    volumes::list(args.name.split('/').next(), &args.data_dir)?
                );
                return Ok(());
            };
            let (size, block) = (args.size.to_string(), block.to_string());
            let query = [
                ("name", args.name.as_str()),
                ("size", size.as_str()),
                ("block", block.as_str()),
            ];
            client.call("POST", "/v1/volume/create", &query)?;
            let pool = args.name.split('/').next().unwrap_or_default();
            print!(
                "{}",
                client.call("GET", "/v1/volume/list", &[("pool", pool)])?
            );
        }
        VolumeCommand::List(args) => {
            let text = match running_server(&args.data_dir)? {
                Some(client) => {
                    let query: Vec<(&str, &str)> =
                        args.pool.iter().map(|p| ("pool", p.as_str())).collect();
                    client.call("GET", "/v1/volume/list", &query)?
                }
                None => volumes::list(args.pool.as_deref(), &args.data_dir)?,
            };
            print!("{text}");
        }
        VolumeCommand::Delete(args) => match running_server(&args.data_dir)? {
            Some(client) => {
                print!(
                    "{}",
                    client.call("POST", "/v1/volume/delete", &[("name", &args.name)])?
                );
            }
            None => {
                volumes::delete(&args.name, &args.data_dir)?;
                println!("volume {} deleted", args.name);
            }
        },
        VolumeCommand::Set(args) => {
            let changes = PropertyChanges::parse(
                args.read_only.as_deref(),
                args.cache.as_deref(),
                args.description.as_deref(),
            )
            .map_err(anyhow::Error::msg)?;
            match running_server(&args.data_dir)? {
                Some(client) => {
                    let mut query = vec![("name", args.name.as_str())];
                    for (key, value) in [
                        ("read_only", &args.read_only),
                        ("cache", &args.cache),
                        ("description", &args.description),
                    ] {
                        if let Some(value) = value {
                            query.push((key, value.as_str()));
                        }
                    }
                    print!("{}", client.call("POST", "/v1/volume/set", &query)?);
                }
                None => {
                    volumes::set_properties(&args.name, &changes, &args.data_dir)?;
                    let pool = args.name.split('/').next();
                    let listed = volumes::list(pool, &args.data_dir)?;
                    let mut lines = listed.lines();
                    let header = lines.next().unwrap_or_default();
                    let row = lines
                        .find(|l| l.split_whitespace().next() == Some(args.name.as_str()))
                        .unwrap_or_default();
                    print!("{header}\n{row}\n");
                }
            }
        }
        VolumeCommand::Resize(args) => match running_server(&args.data_dir)? {
            Some(client) => {
                let size = args.size.to_string();
                let query = [("name", args.name.as_str()), ("size", size.as_str())];
                print!("{}", client.call("POST", "/v1/volume/resize", &query)?);
            }
            None => print!(
                "{}",
                volumes::resize(&args.name, args.size, &args.data_dir)?
            ),
        },
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum ScrubCommand {
    /// Start a scrub (or resume a paused or interrupted one). Without a server, runs to the end here.
    Start(ScrubArgs),
    /// Pause a running scrub, keeping its position.
    Pause(ScrubArgs),
    /// Go on with a paused scrub.
    Resume(ScrubArgs),
    /// Stop a scrub; the next start begins again.
    Stop(ScrubArgs),
    /// Progress of the running scrub, or the last one's result.
    Status(ScrubArgs),
}

#[derive(Args)]
pub struct ScrubArgs {
    pool: String,
    /// Wait for the scrub to end, showing its progress (always, without a running server).
    #[arg(long)]
    wait: bool,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

pub fn scrub_main(command: ScrubCommand) -> anyhow::Result<()> {
    let (action, args) = match command {
        ScrubCommand::Start(args) => (Some(ScrubAction::Start), args),
        ScrubCommand::Pause(args) => (Some(ScrubAction::Pause), args),
        ScrubCommand::Resume(args) => (Some(ScrubAction::Resume), args),
        ScrubCommand::Stop(args) => (Some(ScrubAction::Stop), args),
        ScrubCommand::Status(args) => (None, args),
    };
    let pool = args.pool.as_str();
    let last = match crate::pool::data_dir::try_lock_data_dir(&args.data_dir)? {
        None => {
            let client = AdminClient::for_data_dir(&args.data_dir)?;
            let ask = |path: &str, method: &str| -> anyhow::Result<Option<Checkpoint>> {
                let body = client.call(method, path, &[("pool", pool)])?;
                serde_json::from_str(&body).context("malformed scrub progress from the server")
            };
            let mut checkpoint = match action {
                Some(action) => ask(&format!("/v1/scrub/{}", action_name(action)), "POST")?,
                None => ask("/v1/scrub", "GET")?,
            };
            if args.wait && action.is_some() {
                checkpoint = wait_for_scrub(pool, || ask("/v1/scrub", "GET"))?;
            }
            checkpoint
        }
        Some(_lock) => match action {
            None => {
                if !crate::pool::registry::registered_pools(&args.data_dir)?
                    .iter()
                    .any(|p| p == pool)
                {
                    anyhow::bail!("no pool named {pool:?} in {}", args.data_dir.display());
                }
                scrub::load(pool, &args.data_dir)?
            }
            Some(ScrubAction::Pause | ScrubAction::Stop) => {
                // Nothing runs without a server: mark the saved scrub.
                let service = open_local(pool, &args.data_dir, false)?;
                Some(service.scrub(pool, action.expect("matched"))?)
            }
            Some(action) => {
                let service = open_local(pool, &args.data_dir, false)?;
                if let Some(previous) =
                    scrub::load(pool, &args.data_dir)?.filter(Checkpoint::unfinished)
                {
                    eprintln!(
                        "resuming the scrub of {pool} at {} of {} chunks",
                        previous.chunks_done, previous.chunks_total
                    );
                }
                service.scrub(pool, action)?;
                let last = wait_for_scrub(pool, || service.scrub_status(pool))?;
                service.close();
                last
            }
        },
    };
    match last {
        Some(c) => {
            println!("{}", scrub::describe(pool, &c));
            if c.unrecoverable > 0 && c.state == ScrubState::Finished {
                anyhow::bail!("{} blocks have no good copy left", c.unrecoverable);
            }
        }
        None => println!("scrub {pool}: never run"),
    }
    Ok(())
}

fn action_name(action: ScrubAction) -> &'static str {
    match action {
        ScrubAction::Start => "start",
        ScrubAction::Pause => "pause",
        ScrubAction::Resume => "resume",
        ScrubAction::Stop => "stop",
    }
}

/// Poll until the scrub is no longer running, showing its progress.
fn wait_for_scrub(
    pool: &str,
    poll: impl Fn() -> anyhow::Result<Option<Checkpoint>>,
) -> anyhow::Result<Option<Checkpoint>> {
    let progress = Progress::new();
    loop {
        let checkpoint = poll()?;
        let Some(c) = &checkpoint else {
            progress.finish();
            return Ok(None);
        };
        if c.state != ScrubState::Running {
            progress.finish();
            return Ok(checkpoint);
        }
        let line = scrub::describe(pool, c);
        progress.show("scrub", &line, Some((c.chunks_done, c.chunks_total)));
        std::thread::sleep(PROGRESS_INTERVAL);
    }
}

#[derive(Args)]
pub struct SchedArgs {
    pool: String,
    /// fifo, zfs or adaptive; without it, show the current mode.
    mode: Option<String>,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

/// `weir pool sched POOL [MODE]`: show or set the device queues' mode.
pub fn sched(args: &SchedArgs) -> anyhow::Result<()> {
    let mode = match &args.mode {
        None => None,
        Some(text) => Some(
            crate::sched::Mode::parse(text)
                .with_context(|| format!("unknown mode {text:?}: want fifo, zfs or adaptive"))?,
        ),
    };
    let setting = PoolSetting {
        status_key: "sched",
        endpoint: "/v1/sched",
        query_key: "mode",
        what: "device queues",
    };
    setting.show_or_set(
        &args.pool,
        &args.data_dir,
        mode.map(|m| m.name()),
        |imported| imported.sched.name(),
        || {
            crate::pool::registry::set_pool_sched(
                &args.data_dir,
                &args.pool,
                mode.expect("a mode to set"),
            )
        },
    )
}

#[derive(Args)]
pub struct ReadPolicyArgs {
    pool: String,
    /// pid, round-robin, least-pending or latency; without it, show the current policy.
    policy: Option<String>,
    #[arg(long, default_value = "./weir-data")]
    data_dir: PathBuf,
}

/// `weir pool read-policy POOL [POLICY]`: show or set how the mirrors
/// choose the copy for a read.
pub fn read_policy(args: &ReadPolicyArgs) -> anyhow::Result<()> {
    let policy = match &args.policy {
        None => None,
        Some(text) => Some(ReadPolicy::parse(text).with_context(|| {
            format!("unknown read policy {text:?}: want {}", ReadPolicy::names())
        })?),
    };
    let setting = PoolSetting {
        status_key: "reads",
        endpoint: "/v1/read-policy",
        query_key: "policy",
        what: "reads",
    };
    setting.show_or_set(
        &args.pool,
        &args.data_dir,
        policy.map(|p| p.name()),
        |imported| imported.read_policy.name(),
        || {
            let policy = policy.expect("a policy to set");
            crate::pool::registry::set_pool_read_policy(&args.data_dir, &args.pool, policy)
        },
    )
}

/// A pool setting kept in the registry: set in the registry when no server
/// runs, and through the admin endpoint (at once, and remembered) when one
/// does.
struct PoolSetting {
    /// Its line in `pool status`.
    status_key: &'static str,
    endpoint: &'static str,
    query_key: &'static str,
    /// What it governs, for the message.
    what: &'static str,
}

impl PoolSetting {
    fn show_or_set(
        &self,
        pool: &str,
        data_dir: &Path,
        value: Option<&'static str>,
        current: impl Fn(&crate::pool::import::Imported) -> &'static str,
        record: impl Fn() -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        match (crate::pool::data_dir::try_lock_data_dir(data_dir)?, value) {
            (Some(_lock), Some(value)) => {
                crate::pool::import::import_registered(pool, data_dir, false)?;
                record()?;
                println!("pool {pool}: {} will be {value} when served", self.what);
            }
            (Some(_lock), None) => {
                let imported = crate::pool::import::import_registered(pool, data_dir, false)?;
                println!("pool {pool}: {}", current(&imported));
            }
            (None, Some(value)) => {
                let client = AdminClient::for_data_dir(data_dir)?;
                let query = [("pool", pool), (self.query_key, value)];
                print!("{}", client.call("POST", self.endpoint, &query)?);
            }
            (None, None) => {
                let client = AdminClient::for_data_dir(data_dir)?;
                let status = client.call("GET", "/v1/status", &[("pool", pool)])?;
                let prefix = format!("{}: ", self.status_key);
                let line = status
                    .lines()
                    .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
                    .with_context(|| {
                        format!("the server's status has no {} line", self.status_key)
                    })?;
                println!("pool {pool}: {line}");
            }
        }
        Ok(())
    }
}
