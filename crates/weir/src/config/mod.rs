//! `weir serve` settings: the TOML file, the command line over it, and the
//! embedded default used when neither names an export.
//!
//! ```toml
//! listen = ["127.0.0.1:10809"]   # "none" serves no TCP
//! socket = "/run/weir.sock"
//! data_dir = "./weir-data"
//! max_block_size = "32M"
//! max_in_flight = "2G"           # request bytes in flight, all clients together
//! io_engine = "auto"             # auto | uring | threads
//! log_level = "info"
//! admin = "unix"                # DATA_DIR/admin.sock; or it and ADDR (TLS off: loopback only); "none"
//! shutdown_grace_seconds = 30    # then connections whose clients stall are closed
//! pid_file = "/run/weir.pid"     # written once serving, removed at exit
//! cache = "writeback"            # writeback | writethrough, for every volume
//! cache_dirty_max = "1G"         # dirty-memory limit; default: ~1 s of writeback
//! readahead = "on"               # on | off, for every volume
//! tls = "off"                    # off | on | require (see access.rs)
//! tls_certificates = "./weir-data/tls"
//! tls_verify_peer = false
//!
//! [[export]]
//! name = "disk"
//! device = "/dev/sdb"            # PATH, file:PATH or mem:SIZE
//! readonly = false
//! description = "scratch disk"
//! cache = "writethrough"         # this export only
//! readahead = "off"              # this export only
//! allow = ["10.0.0.0/8"]         # who may use it (see access.rs)
//!
//! [[volume]]
//! name = "tank/db"               # a pool volume
//! cache = "writethrough"
//! readahead = "off"
//! ```

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

mod access;
pub use access::{TlsConfig, TlsSetting};

use crate::cache::CacheMode;
use crate::device::{DeviceSpec, IoEngine};
use crate::readahead::ReadaheadMode;
use crate::server::access::Policy;
use crate::units::parse_bytes;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:10809";
/// The admin endpoint (pool status, scrub, replace, /metrics): a Unix
/// socket in the data directory by default.
pub const DEFAULT_ADMIN: &str = "unix";
pub const DEFAULT_DATA_DIR: &str = "./weir-data";
pub const DEFAULT_EXPORT_NAME: &str = "default";
pub const DEFAULT_VOLUME_BYTES: u64 = 1 << 30;
pub const DEFAULT_MAX_BLOCK_BYTES: u32 = 32 << 20;
/// How long a shutdown waits for clients to take their last replies.
pub const DEFAULT_SHUTDOWN_GRACE_SECONDS: u64 = 30;
const MAX_BLOCK_BYTES_LIMIT: u64 = 128 << 20;
const MIN_BLOCK_BYTES_LIMIT: u64 = 64 << 10;
const CACHE_DIRTY_MIN_BYTES: u64 = 1 << 20;
const DEFAULT_MAX_IN_FLIGHT_BYTES: u64 = 2 << 30;
/// One address may hold a quarter of the in-flight bytes, and must fit
/// the largest request in it.
const IN_FLIGHT_BLOCKS_MIN: u64 = 4;

/// The config file, as written. Unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<OneOrMany>,
    pub socket: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub max_block_size: Option<Size>,
    pub max_in_flight: Option<Size>,
    pub io_engine: Option<IoEngine>,
    pub log_level: Option<String>,
    pub admin: Option<String>,
    pub shutdown_grace_seconds: Option<u64>,
    pub pid_file: Option<PathBuf>,
    pub cache: Option<CacheMode>,
    pub cache_dirty_max: Option<Size>,
    pub readahead: Option<ReadaheadMode>,
    pub tls: Option<TlsSetting>,
    pub tls_certificates: Option<PathBuf>,
    pub tls_verify_peer: Option<bool>,
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportConfig>,
    #[serde(default, rename = "volume")]
    pub volumes: Vec<VolumeConfig>,
}

/// Settings for one pool volume, by its export name (POOL/VOLUME).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeConfig {
    pub name: String,
    pub cache: Option<CacheMode>,
    pub readahead: Option<ReadaheadMode>,
    #[serde(default)]
    pub tls_only: bool,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub readonly_for: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportConfig {
    pub name: String,
    pub device: String,
    #[serde(default)]
    pub readonly: bool,
    #[serde(default)]
    pub description: Option<String>,
    pub cache: Option<CacheMode>,
    pub readahead: Option<ReadaheadMode>,
    #[serde(default)]
    pub tls_only: bool,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub readonly_for: Vec<String>,
}

/// Flags from the command line; each mirrors a config key.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(short, long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// TCP address to listen on (repeatable; "none" for no TCP) [default: 127.0.0.1:10809, unless --socket is given].
    #[arg(short, long, value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Listen on this Unix socket (beside TCP only if --listen names an address).
    #[arg(short, long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Export a file or device: NAME=SPEC[,readonly][,cache=MODE][,readahead=on|off][,tls-only][,allow=RULE...][,readonly-for=RULE...] (repeatable). SPEC is PATH, file:PATH, mem:SIZE, model:KIND,size=SIZE[,param=value...] (docs/devices.md) or rbd:POOL/IMAGE[,conf=PATH][,id=NAME][,cluster=NAME] (docs/ceph.md); RULE is an address or network, or cert:NAME (docs/security.md).
    #[arg(short, long, value_name = "NAME=SPEC[,OPTION...]")]
    pub export: Vec<String>,
    /// Where the embedded default volume lives [default: ./weir-data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Largest read or write accepted, e.g. 32M [default: 32M].
    #[arg(long, value_name = "SIZE")]
    pub max_block_size: Option<String>,
    /// Request and reply bytes in flight on all connections together, at least 4x the largest block; one client address may hold a quarter [default: 1/8 of RAM, at most 2G].
    #[arg(long, value_name = "SIZE")]
    pub max_in_flight: Option<String>,
    /// How file devices are driven [default: auto].
    #[arg(long, value_enum)]
    pub io_engine: Option<IoEngine>,
    /// Log level: off, error, warn, info, debug, trace, or TARGET=LEVEL directives [default: info; RUST_LOG overrides].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Admin endpoint for pool commands and /metrics: "unix" (DATA_DIR/admin.sock, mode 0600); HOST:PORT, the socket and TCP too, where requests need the token in DATA_DIR/admin.token, under TLS when --tls is on (and only then on a non-loopback address); or "none" [default: unix].
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// On SIGINT/SIGTERM, how long to wait for clients to read their last replies before closing their connections [default: 30].
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_grace_seconds: Option<u64>,
    /// Write the server's pid to this file once it serves; removed at exit.
    #[arg(long, value_name = "PATH")]
    pub pid_file: Option<PathBuf>,
    /// Answer writes from memory until FLUSH or FUA (writeback), or once the devices have them (writethrough), for every volume [default: writeback].
    #[arg(long, value_enum, value_name = "MODE")]
    pub cache: Option<CacheMode>,
    /// Settings of one pool volume: POOL/VOLUME[,cache=MODE][,readahead=on|off][,tls-only][,allow=RULE...][,readonly-for=RULE...] (repeatable).
    #[arg(long, value_name = "POOL/VOLUME,OPTION...")]
    pub volume: Vec<String>,
    /// Dirty memory all write-back caches may hold together, e.g. 512M [default: about 1 s of the devices' measured write-back rate, at most 1/8 of RAM].
    #[arg(long, value_name = "SIZE")]
    pub cache_dirty_max: Option<String>,
    /// Read ahead for sequential streams, recognised per volume across connections, for every volume [default: on].
    #[arg(long, value_enum, value_name = "MODE")]
    pub readahead: Option<ReadaheadMode>,
    /// NBD over TLS (STARTTLS): off; on, for clients that ask and for tls-only exports; or require, for every client [default: off].
    #[arg(long, value_enum, value_name = "MODE")]
    pub tls: Option<TlsSetting>,
    /// Directory with server-cert.pem, server-key.pem and (for --tls-verify-peer) ca-cert.pem [default: DATA_DIR/tls].
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Require TLS clients to present a certificate signed by ca-cert.pem.
    #[arg(long)]
    pub tls_verify_peer: bool,
}

/// One export, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSpec {
    pub name: String,
    pub device: DeviceSpec,
    pub read_only: bool,
    pub description: String,
    /// None: the server's default.
    pub cache: Option<CacheMode>,
    /// None: the server's default.
    pub readahead: Option<ReadaheadMode>,
    pub policy: Policy,
}

/// Everything `weir serve` needs, validated.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: Vec<SocketAddr>,
    pub socket: Option<PathBuf>,
    pub data_dir: PathBuf,
    pub max_block_bytes: u32,
    pub max_in_flight_bytes: u64,
    pub io_engine: IoEngine,
    pub log_level: String,
    /// None: no admin endpoint.
    pub admin: Option<AdminListen>,
    pub shutdown_grace: std::time::Duration,
    pub pid_file: Option<PathBuf>,
    /// Empty means: serve the embedded default.
    pub exports: Vec<ExportSpec>,
    /// The cache mode of volumes that name none.
    pub cache: CacheMode,
    /// Pool volumes' own settings, by export name.
    pub volume_settings: Vec<VolumeSettings>,
    /// The readahead mode of volumes that name none.
    pub readahead: ReadaheadMode,
    /// None: sized from measurement.
    pub cache_dirty_max_bytes: Option<u64>,
    pub tls: TlsConfig,
}

impl ServeConfig {
    pub fn resolve(args: &ServeArgs) -> anyhow::Result<ServeConfig> {
        let file = match &args.config {
            Some(path) => load(path)?,
            None => FileConfig::default(),
        };
        let socket = args.socket.clone().or(file.socket);
        // A socket alone serves only the socket, as qemu-nbd -k and
        // nbdkit -U do; the TCP default is for a server given neither.
        let listen_text: Vec<String> = if !args.listen.is_empty() {
            args.listen.clone()
        } else {
            match file.listen {
                Some(OneOrMany::One(one)) => vec![one],
                Some(OneOrMany::Many(many)) => many,
                None if socket.is_some() => vec![],
                None => vec![DEFAULT_LISTEN.to_string()],
            }
        };
        let listen = parse_listen(&listen_text)?;
        if listen.is_empty() && socket.is_none() {
            bail!("nothing to listen on: give --listen ADDR or --socket PATH");
        }
        let max_block = match (&args.max_block_size, file.max_block_size) {
            (Some(text), _) => parse_bytes(text).map_err(anyhow::Error::msg)?,
            (None, Some(Size::Bytes(bytes))) => bytes,
            (None, Some(Size::Text(text))) => parse_bytes(&text).map_err(anyhow::Error::msg)?,
            (None, None) => u64::from(DEFAULT_MAX_BLOCK_BYTES),
        };
        if !(MIN_BLOCK_BYTES_LIMIT..=MAX_BLOCK_BYTES_LIMIT).contains(&max_block) {
            bail!("max_block_size must be between 64K and 128M, not {max_block}");
        }
        let max_in_flight = match (&args.max_in_flight, file.max_in_flight) {
            (Some(text), _) => parse_bytes(text).map_err(anyhow::Error::msg)?,
            (None, Some(Size::Bytes(bytes))) => bytes,
            (None, Some(Size::Text(text))) => parse_bytes(&text).map_err(anyhow::Error::msg)?,
            (None, None) => (crate::cache::ram_bytes() / 8)
                .min(DEFAULT_MAX_IN_FLIGHT_BYTES)
                .max(IN_FLIGHT_BLOCKS_MIN * max_block),
        };
        if max_in_flight < IN_FLIGHT_BLOCKS_MIN * max_block {
            bail!(
                "max_in_flight must hold at least {IN_FLIGHT_BLOCKS_MIN} of the largest block \
                 ({max_block} bytes), not {max_in_flight}"
            );
        }
        let exports = if !args.export.is_empty() {
            args.export
                .iter()
                .map(|text| parse_export_flag(text))
                .collect::<anyhow::Result<Vec<_>>>()?
        } else {
            file.exports
                .iter()
                .map(export_from_config)
                .collect::<anyhow::Result<Vec<_>>>()?
        };
        for (i, export) in exports.iter().enumerate() {
            if exports[..i].iter().any(|e| e.name == export.name) {
                bail!("export {:?} is defined twice", export.name);
            }
        }
        let admin_text = args
            .admin
            .clone()
            .or(file.admin)
            .unwrap_or_else(|| DEFAULT_ADMIN.into());
        let admin = if admin_text == "unix" {
            Some(AdminListen::Unix)
        } else {
            parse_listen(std::slice::from_ref(&admin_text))
                .with_context(|| "the admin address (unix, HOST:PORT, or none)")?
                .pop()
                .map(AdminListen::Tcp)
        };
        let shutdown_grace = std::time::Duration::from_secs(
            args.shutdown_grace_seconds
                .or(file.shutdown_grace_seconds)
                .unwrap_or(DEFAULT_SHUTDOWN_GRACE_SECONDS),
        );
        let volume_settings = if !args.volume.is_empty() {
            args.volume
                .iter()
                .map(|text| parse_volume_flag(text))
                .collect::<anyhow::Result<Vec<_>>>()?
        } else {
            file.volumes
                .iter()
                .map(|v| {
                    let policy = access::policy_from_keys(v.tls_only, &v.allow, &v.readonly_for)
                        .with_context(|| format!("volume {:?}", v.name))?;
                    Ok(VolumeSettings {
                        name: v.name.clone(),
                        cache: v.cache,
                        readahead: v.readahead,
                        policy,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?
        };
        let cache_dirty_max_bytes = match (&args.cache_dirty_max, file.cache_dirty_max) {
            (Some(text), _) => Some(parse_bytes(text).map_err(anyhow::Error::msg)?),
            (None, Some(Size::Bytes(bytes))) => Some(bytes),
            (None, Some(Size::Text(text))) => Some(parse_bytes(&text).map_err(anyhow::Error::msg)?),
            (None, None) => None,
        };
        if cache_dirty_max_bytes.is_some_and(|b| b < CACHE_DIRTY_MIN_BYTES) {
            bail!("cache_dirty_max must be at least 1M");
        }
        let data_dir = args
            .data_dir
            .clone()
            .or(file.data_dir)
            .unwrap_or_else(|| DEFAULT_DATA_DIR.into());
        let tls = TlsConfig {
            setting: args.tls.or(file.tls).unwrap_or_default(),
            certificates: args
                .tls_certificates
                .clone()
                .or(file.tls_certificates)
                .unwrap_or_else(|| data_dir.join("tls")),
            verify_peer: args.tls_verify_peer || file.tls_verify_peer.unwrap_or(false),
        };
        if tls.verify_peer && tls.setting == TlsSetting::Off {
            bail!("--tls-verify-peer needs TLS: give --tls on or --tls require");
        }
        for export in &exports {
            access::check(&tls, &export.name, &export.policy)?;
        }
        for volume in &volume_settings {
            access::check(&tls, &volume.name, &volume.policy)?;
        }
        Ok(ServeConfig {
            tls,
            cache: args.cache.or(file.cache).unwrap_or_default(),
            readahead: args.readahead.or(file.readahead).unwrap_or_default(),
            volume_settings,
            cache_dirty_max_bytes,
            admin,
            shutdown_grace,
            pid_file: args.pid_file.clone().or(file.pid_file),
            listen,
            socket,
            data_dir,
            max_block_bytes: max_block as u32,
            max_in_flight_bytes: max_in_flight,
            io_engine: args.io_engine.or(file.io_engine).unwrap_or_default(),
            log_level: check_log_level(
                args.log_level
                    .clone()
                    .or(file.log_level)
                    .unwrap_or_else(|| "info".into()),
            )?,
            exports,
        })
    }

    /// The embedded default: a sparse 1 GiB volume file under the data
    /// directory, created on first use and reopened afterwards.
    pub fn embedded_default(&self) -> anyhow::Result<ExportSpec> {
        std::fs::create_dir_all(&self.data_dir)
            .with_context(|| format!("cannot create data directory {}", self.data_dir.display()))?;
        let path = self.data_dir.join(format!("{DEFAULT_EXPORT_NAME}.img"));
        if !path.exists() {
            let file = std::fs::File::create(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            file.set_len(DEFAULT_VOLUME_BYTES)?;
            tracing::info!(path = %path.display(), "created a sparse 1 GiB default volume");
        }
        Ok(ExportSpec {
            name: DEFAULT_EXPORT_NAME.into(),
            device: DeviceSpec::File(path),
            read_only: false,
            description: "weir embedded default volume".into(),
            cache: None,
            readahead: None,
            policy: Policy::default(),
        })
    }

    /// The cache mode of the export or pool volume `name`. A memory
    /// export writes through unless it names a mode itself: the cache
    /// hides a device's write latency, and memory has none to hide, so it
    /// would only add a copy and write-back (half the 1 MiB write rate).
    pub fn cache_of(&self, name: &str) -> CacheMode {
        let export = self.exports.iter().find(|e| e.name == name);
        let memory = export.is_some_and(|e| matches!(e.device, DeviceSpec::Mem { .. }));
        export
            .and_then(|e| e.cache)
            .or_else(|| self.volume(name).and_then(|v| v.cache))
            .or(memory.then_some(CacheMode::Writethrough))
            .unwrap_or(self.cache)
    }

    /// The readahead mode of the export or pool volume `name`. A memory
    /// export reads nothing ahead unless it names a mode itself: memory
    /// answers at once, so read-ahead would only add a copy.
    pub fn readahead_of(&self, name: &str) -> ReadaheadMode {
        let export = self.exports.iter().find(|e| e.name == name);
        let memory = export.is_some_and(|e| matches!(e.device, DeviceSpec::Mem { .. }));
        export
            .and_then(|e| e.readahead)
            .or_else(|| self.volume(name).and_then(|v| v.readahead))
            .or(memory.then_some(ReadaheadMode::Off))
            .unwrap_or(self.readahead)
    }

    /// Who may use the pool volume `name`.
    pub fn volume_policy(&self, name: &str) -> Policy {
        self.volume(name)
            .map(|v| v.policy.clone())
            .unwrap_or_default()
    }

    fn volume(&self, name: &str) -> Option<&VolumeSettings> {
        self.volume_settings.iter().find(|v| v.name == name)
    }
}

const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// A level, or `TARGET=LEVEL` directives separated by commas. A bare word
/// that is not a level would pass as a target name and silently hide every
/// other line, so it is refused.
fn check_log_level(text: String) -> anyhow::Result<String> {
    for directive in text.split(',') {
        let level = directive
            .rsplit_once('=')
            .map_or(directive, |(_, level)| level);
        if !LOG_LEVELS.contains(&level.trim().to_ascii_lowercase().as_str()) {
            bail!(
                "unknown log level {directive:?} in {text:?}: want one of {} or TARGET=LEVEL",
                LOG_LEVELS.join(", ")
            );
        }
    }
    Ok(text)
}

/// Where the admin endpoint listens.
#[derive(Debug, Clone, PartialEq)]
pub enum AdminListen {
    /// `DATA_DIR/admin.sock`, its owner's only.
    Unix,
    /// The socket, and this address, where every request carries the
    /// token in `DATA_DIR/admin.token`; under TLS when the server has it.
    Tcp(SocketAddr),
}

/// One pool volume's own settings; None: the server's default.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeSettings {
    pub name: String,
    pub cache: Option<CacheMode>,
    pub readahead: Option<ReadaheadMode>,
    pub policy: Policy,
}

fn parse_readahead_mode(text: &str) -> anyhow::Result<ReadaheadMode> {
    match text {
        "on" => Ok(ReadaheadMode::On),
        "off" => Ok(ReadaheadMode::Off),
        other => bail!("unknown readahead mode {other:?} (known: on, off)"),
    }
}

fn parse_cache_mode(text: &str) -> anyhow::Result<CacheMode> {
    match text {
        "writeback" => Ok(CacheMode::Writeback),
        "writethrough" => Ok(CacheMode::Writethrough),
        other => bail!("unknown cache mode {other:?} (known: writeback, writethrough)"),
    }
}

/// `POOL/VOLUME[,cache=MODE][,readahead=MODE][,ACCESS...]`
fn parse_volume_flag(text: &str) -> anyhow::Result<VolumeSettings> {
    const WANT: &str = "want POOL/VOLUME[,cache=MODE][,readahead=on|off][,tls-only][,allow=RULE][,readonly-for=RULE]";
    let mut parts = text.split(',');
    let name = parts.next().unwrap_or_default();
    if !name.contains('/') {
        bail!("--volume {text:?}: {WANT}");
    }
    let mut settings = VolumeSettings {
        name: name.to_string(),
        cache: None,
        readahead: None,
        policy: Policy::default(),
    };
    for option in parts {
        if let Some(applied) = access::apply_flag_option(&mut settings.policy, option) {
            applied.map_err(|e| anyhow::anyhow!("--volume {text:?}: {e}"))?;
            continue;
        }
        match option.split_once('=') {
            Some(("cache", value)) => {
                settings.cache =
                    Some(parse_cache_mode(value).with_context(|| format!("--volume {text:?}"))?)
            }
            Some(("readahead", value)) => {
                settings.readahead = Some(
                    parse_readahead_mode(value).with_context(|| format!("--volume {text:?}"))?,
                )
            }
            _ => bail!(
                "--volume {text:?}: unknown option {option:?} (known: cache=MODE, readahead=on|off, tls-only, allow=RULE, readonly-for=RULE)"
            ),
        }
    }
    if settings.cache.is_none()
        && settings.readahead.is_none()
        && settings.policy == Policy::default()
    {
        bail!("--volume {text:?}: no setting given ({WANT})");
    }
    Ok(settings)
}

fn load(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config {}", path.display()))
}

fn parse_listen(texts: &[String]) -> anyhow::Result<Vec<SocketAddr>> {
    let mut addrs = Vec::new();
    for text in texts {
        if text == "none" {
            continue;
        }
        let resolved = text
            .to_socket_addrs()
            .with_context(|| format!("invalid listen address {text:?} (want HOST:PORT)"))?
            .next()
            .with_context(|| format!("listen address {text:?} resolves to nothing"))?;
        addrs.push(resolved);
    }
    Ok(addrs)
}

fn check_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
        bail!("invalid export name {name:?}: 1-256 printable characters");
    }
    Ok(())
}

fn is_export_option(option: &str) -> bool {
    matches!(option, "readonly" | "ro")
        || option.starts_with("cache=")
        || option.starts_with("readahead=")
        || access::is_flag_option(option)
}

/// `NAME=SPEC[,readonly][,cache=MODE][,readahead=MODE]`
pub fn parse_export_flag(text: &str) -> anyhow::Result<ExportSpec> {
    let (name, rest) = text.split_once('=').with_context(|| {
        format!("--export {text:?}: want NAME=SPEC[,readonly][,cache=MODE][,readahead=MODE]")
    })?;
    check_name(name)?;
    // Model and rbd specs have commas of their own; export options come last.
    let (device_text, options) = if rest.starts_with("model:") || rest.starts_with("rbd:") {
        let mut head = rest;
        let mut options = Vec::new();
        while let Some((before, last)) = head.rsplit_once(',') {
            if !is_export_option(last) {
                break;
            }
            options.insert(0, last);
            head = before;
        }
        (head, options)
    } else {
        let mut parts = rest.split(',');
        let device = parts.next().unwrap_or_default();
        (device, parts.collect())
    };
    let device =
        DeviceSpec::parse(device_text).map_err(|e| anyhow::anyhow!("--export {text:?}: {e}"))?;
    let mut read_only = false;
    let mut cache = None;
    let mut readahead = None;
    let mut policy = Policy::default();
    for option in options {
        if let Some(applied) = access::apply_flag_option(&mut policy, option) {
            applied.map_err(|e| anyhow::anyhow!("--export {text:?}: {e}"))?;
            continue;
        }
        match option.split_once('=') {
            None if matches!(option, "readonly" | "ro") => read_only = true,
            Some(("cache", mode)) => {
                cache = Some(parse_cache_mode(mode).with_context(|| format!("--export {text:?}"))?)
            }
            Some(("readahead", mode)) => {
                readahead =
                    Some(parse_readahead_mode(mode).with_context(|| format!("--export {text:?}"))?)
            }
            _ => {
                bail!("--export {text:?}: unknown option {option:?} (known: readonly, cache=MODE, readahead=on|off, tls-only, allow=RULE, readonly-for=RULE)")
            }
        }
    }
    Ok(ExportSpec {
        name: name.into(),
        description: String::new(),
        device,
        read_only,
        cache,
        readahead,
        policy,
    })
}

fn export_from_config(export: &ExportConfig) -> anyhow::Result<ExportSpec> {
    check_name(&export.name)?;
    let device = DeviceSpec::parse(&export.device)
        .map_err(|e| anyhow::anyhow!("export {:?}: {e}", export.name))?;
    Ok(ExportSpec {
        name: export.name.clone(),
        device,
        read_only: export.readonly,
        description: export.description.clone().unwrap_or_default(),
        cache: export.cache,
        readahead: export.readahead,
        policy: access::policy_from_keys(export.tls_only, &export.allow, &export.readonly_for)
            .with_context(|| format!("export {:?}", export.name))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve_toml(text: &str) -> anyhow::Result<ServeConfig> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weir.toml");
        std::fs::write(&path, text).unwrap();
        ServeConfig::resolve(&ServeArgs {
            config: Some(path),
            ..Default::default()
        })
    }

    #[test]
    fn defaults_listen_on_localhost_with_embedded_volume() {
        let config = ServeConfig::resolve(&ServeArgs::default()).unwrap();
        assert_eq!(config.listen, vec![DEFAULT_LISTEN.parse().unwrap()]);
        assert!(config.exports.is_empty());
        assert_eq!(config.max_block_bytes, 32 << 20);
        assert_eq!(
            config.shutdown_grace,
            std::time::Duration::from_secs(DEFAULT_SHUTDOWN_GRACE_SECONDS)
        );
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = resolve_toml("listn = \"x\"").unwrap_err();
        assert!(format!("{err:#}").contains("listn"), "{err:#}");
        let err = resolve_toml("[[export]]\nname = \"a\"\ndevice = \"mem:1M\"\nread_only = true\n")
            .unwrap_err();
        assert!(format!("{err:#}").contains("read_only"), "{err:#}");
    }

    #[test]
    fn every_flag_has_a_config_key() {
        let config = resolve_toml(
            r#"
            listen = ["127.0.0.1:0", "[::1]:0"]
            socket = "/tmp/x.sock"
            data_dir = "/tmp/d"
            max_block_size = "64M"
            io_engine = "threads"
            log_level = "debug"
            admin = "none"
            shutdown_grace_seconds = 7
            [[export]]
            name = "a"
            device = "mem:1M"
            readonly = true
            description = "A"
            "#,
        )
        .unwrap();
        assert_eq!(config.listen.len(), 2);
        assert_eq!(config.socket, Some(PathBuf::from("/tmp/x.sock")));
        assert_eq!(config.data_dir, PathBuf::from("/tmp/d"));
        assert_eq!(config.max_block_bytes, 64 << 20);
        assert_eq!(config.io_engine, IoEngine::Threads);
        assert_eq!(config.log_level, "debug");
        assert_eq!(config.admin, None);
        assert_eq!(config.shutdown_grace, std::time::Duration::from_secs(7));
        assert_eq!(
            config.exports,
            vec![ExportSpec {
                name: "a".into(),
                device: DeviceSpec::Mem {
                    size_bytes: 1 << 20
                },
                read_only: true,
                description: "A".into(),
                cache: None,
                readahead: None,
                policy: Policy::default(),
            }]
        );
    }

    #[test]
    fn readahead_is_set_per_server_export_and_volume() {
        let spec = parse_export_flag("a=model:hdd,size=1G,readahead=on").unwrap();
        assert_eq!(spec.readahead, Some(ReadaheadMode::On));
        assert!(parse_export_flag("a=/tmp/x,readahead=maybe").is_err());
        let volume = parse_volume_flag("tank/db,readahead=on").unwrap();
        assert_eq!(volume.readahead, Some(ReadaheadMode::On));
        assert_eq!(volume.cache, None);
        assert!(parse_volume_flag("tank/db,readahead=1").is_err());
        let args = ServeArgs {
            export: vec![
                "a=/tmp/a,readahead=off".into(),
                "b=/tmp/b".into(),
                "m=mem:1M".into(),
                "n=mem:1M,readahead=on".into(),
            ],
            volume: vec!["tank/db,readahead=on".into()],
            ..Default::default()
        };
        let config = ServeConfig::resolve(&args).unwrap();
        assert_eq!(config.readahead_of("a"), ReadaheadMode::Off);
        assert_eq!(config.readahead_of("b"), ReadaheadMode::On, "the default");
        assert_eq!(config.readahead_of("m"), ReadaheadMode::Off, "memory");
        assert_eq!(config.readahead_of("n"), ReadaheadMode::On);
        assert_eq!(config.readahead_of("tank/db"), ReadaheadMode::On);
        assert_eq!(config.cache_of("tank/db"), CacheMode::Writeback);
    }

    #[test]
    fn export_flags_parse() {
        let spec = parse_export_flag("disk=/dev/sdb,readonly").unwrap();
        assert_eq!(spec.device, DeviceSpec::File("/dev/sdb".into()));
        assert!(spec.read_only);
        assert!(parse_export_flag("nodevice").is_err());
        assert!(parse_export_flag("=x").is_err());
        assert!(parse_export_flag("a=x,fast").is_err());
    }

    #[test]
    fn duplicate_exports_and_bad_sizes_are_refused() {
        let args = ServeArgs {
            export: vec!["a=mem:1M".into(), "a=mem:2M".into()],
            ..Default::default()
        };
        assert!(ServeConfig::resolve(&args).is_err());
        let args = ServeArgs {
            max_block_size: Some("1K".into()),
            ..Default::default()
        };
        assert!(ServeConfig::resolve(&args).is_err());
        let args = ServeArgs {
            listen: vec!["nonsense".into()],
            ..Default::default()
        };
        assert!(ServeConfig::resolve(&args).is_err());
    }

    #[test]
    fn a_log_level_is_a_level_or_target_directives_never_a_bare_word() {
        for good in ["info", "WARN", "off", "weir=debug,info", "weir::pool=trace"] {
            let args = ServeArgs {
                log_level: Some(good.into()),
                ..Default::default()
            };
            assert_eq!(ServeConfig::resolve(&args).unwrap().log_level, good);
        }
        for bad in ["foo", "inf", "weir=loud", "info,verbose"] {
            let args = ServeArgs {
                log_level: Some(bad.into()),
                ..Default::default()
            };
            let err = ServeConfig::resolve(&args).unwrap_err().to_string();
            assert!(err.contains("unknown log level"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_socket_alone_serves_only_the_socket() {
        let args = ServeArgs {
            socket: Some("/tmp/w.sock".into()),
            ..Default::default()
        };
        assert!(ServeConfig::resolve(&args).unwrap().listen.is_empty());
        let both = ServeArgs {
            socket: Some("/tmp/w.sock".into()),
            listen: vec!["127.0.0.1:10809".into()],
            ..Default::default()
        };
        assert_eq!(ServeConfig::resolve(&both).unwrap().listen.len(), 1);
        let neither = ServeArgs::default();
        assert_eq!(ServeConfig::resolve(&neither).unwrap().listen.len(), 1);
    }

    #[test]
    fn cache_modes_resolve_per_export_per_volume_and_by_default() {
        let args = ServeArgs {
            export: vec![
                "a=mem:1M,cache=writethrough".into(),
                "b=model:ssd,size=1G,cache=writethrough,readonly".into(),
                "c=/tmp/c.img".into(),
            ],
            volume: vec!["tank/db,cache=writethrough".into()],
            cache_dirty_max: Some("256M".into()),
            ..Default::default()
        };
        let config = ServeConfig::resolve(&args).unwrap();
        assert_eq!(config.cache_of("a"), CacheMode::Writethrough);
        assert_eq!(config.cache_of("b"), CacheMode::Writethrough);
        assert!(config.exports[1].read_only);
        assert_eq!(config.cache_of("c"), CacheMode::Writeback);
        assert_eq!(config.cache_of("tank/db"), CacheMode::Writethrough);
        assert_eq!(config.cache_of("tank/other"), CacheMode::Writeback);
        assert_eq!(config.cache_dirty_max_bytes, Some(256 << 20));

        let toml = resolve_toml(
            "cache = \"writethrough\"\n[[volume]]\nname = \"tank/db\"\ncache = \"writeback\"\n",
        )
        .unwrap();
        assert_eq!(toml.cache_of("tank/x"), CacheMode::Writethrough);
        assert_eq!(toml.cache_of("tank/db"), CacheMode::Writeback);
    }

    #[test]
    fn memory_exports_write_through_unless_they_say_otherwise() {
        let args = ServeArgs {
            export: vec![
                "m=mem:1M".into(),
                "n=mem:1M,cache=writeback".into(),
                "f=/tmp/x".into(),
            ],
            cache: Some(CacheMode::Writeback),
            ..Default::default()
        };
        let config = ServeConfig::resolve(&args).unwrap();
        assert_eq!(config.cache_of("m"), CacheMode::Writethrough);
        assert_eq!(config.cache_of("n"), CacheMode::Writeback);
        assert_eq!(config.cache_of("f"), CacheMode::Writeback);
    }

    #[test]
    fn bad_cache_settings_are_clear_errors() {
        for (export, volume, dirty, needle) in [
            ("a=mem:1M,cache=sometimes", "", "", "unknown cache mode"),
            ("", "tank/db,cache=never", "", "unknown cache mode"),
            ("", "tank/db", "", "no setting given"),
            ("", "", "100K", "at least 1M"),
        ] {
            let args = ServeArgs {
                export: [export]
                    .iter()
                    .filter(|e| !e.is_empty())
                    .map(|e| e.to_string())
                    .collect(),
                volume: [volume]
                    .iter()
                    .filter(|v| !v.is_empty())
                    .map(|v| v.to_string())
                    .collect(),
                cache_dirty_max: (!dirty.is_empty()).then(|| dirty.to_string()),
                ..Default::default()
            };
            let err = format!("{:#}", ServeConfig::resolve(&args).unwrap_err());
            assert!(err.contains(needle), "{err}");
        }
    }
}
