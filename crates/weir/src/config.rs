//! `weir serve` settings: the TOML file, the command line over it, and the
//! embedded default used when neither names an export.
//!
//! ```toml
//! listen = ["127.0.0.1:10809"]   # "none" serves no TCP
//! socket = "/run/weir.sock"
//! data_dir = "./weir-data"
//! max_block_size = "32M"
//! io_engine = "auto"             # auto | uring | threads
//! log_level = "info"
//! admin = "127.0.0.1:10810"     # "none": no admin endpoint
//! shutdown_grace_seconds = 30    # then connections whose clients stall are closed
//!
//! [[export]]
//! name = "disk"
//! device = "/dev/sdb"            # PATH, file:PATH or mem:SIZE
//! readonly = false
//! description = "scratch disk"
//! ```

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::device::{DeviceSpec, IoEngine};
use crate::units::parse_bytes;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:10809";
/// The admin endpoint (pool status, scrub, replace, /metrics): localhost only by default.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:10810";
pub const DEFAULT_DATA_DIR: &str = "./weir-data";
pub const DEFAULT_EXPORT_NAME: &str = "default";
pub const DEFAULT_VOLUME_BYTES: u64 = 1 << 30;
pub const DEFAULT_MAX_BLOCK_BYTES: u32 = 32 << 20;
/// How long a shutdown waits for clients to take their last replies.
pub const DEFAULT_SHUTDOWN_GRACE_SECONDS: u64 = 30;
const MAX_BLOCK_BYTES_LIMIT: u64 = 128 << 20;
const MIN_BLOCK_BYTES_LIMIT: u64 = 64 << 10;

/// The config file, as written. Unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<OneOrMany>,
    pub socket: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub max_block_size: Option<Size>,
    pub io_engine: Option<IoEngine>,
    pub log_level: Option<String>,
    pub admin: Option<String>,
    pub shutdown_grace_seconds: Option<u64>,
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportConfig>,
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
}

/// Flags from the command line; each mirrors a config key.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(short, long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// TCP address to listen on (repeatable; "none" for no TCP) [default: 127.0.0.1:10809].
    #[arg(short, long, value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Also listen on this Unix socket.
    #[arg(short, long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Export a file or device: NAME=SPEC[,readonly] (repeatable). SPEC is PATH, file:PATH, mem:SIZE or model:KIND,size=SIZE[,param=value...] (docs/devices.md).
    #[arg(short, long, value_name = "NAME=SPEC[,readonly]")]
    pub export: Vec<String>,
    /// Where the embedded default volume lives [default: ./weir-data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Largest read or write accepted, e.g. 32M [default: 32M].
    #[arg(long, value_name = "SIZE")]
    pub max_block_size: Option<String>,
    /// How file devices are driven [default: auto].
    #[arg(long, value_enum)]
    pub io_engine: Option<IoEngine>,
    /// Log level: error, warn, info, debug, trace [default: info; RUST_LOG overrides].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Admin endpoint for pool commands and /metrics ("none" to turn it off) [default: 127.0.0.1:10810].
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// On SIGINT/SIGTERM, how long to wait for clients to read their last replies before closing their connections [default: 30].
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_grace_seconds: Option<u64>,
}

/// One export, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSpec {
    pub name: String,
    pub device: DeviceSpec,
    pub read_only: bool,
    pub description: String,
}

/// Everything `weir serve` needs, validated.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: Vec<SocketAddr>,
    pub socket: Option<PathBuf>,
    pub data_dir: PathBuf,
    pub max_block_bytes: u32,
    pub io_engine: IoEngine,
    pub log_level: String,
    /// None: no admin endpoint.
    pub admin: Option<SocketAddr>,
    pub shutdown_grace: std::time::Duration,
    /// Empty means: serve the embedded default.
    pub exports: Vec<ExportSpec>,
}

impl ServeConfig {
    pub fn resolve(args: &ServeArgs) -> anyhow::Result<ServeConfig> {
        let file = match &args.config {
            Some(path) => load(path)?,
            None => FileConfig::default(),
        };
        let listen_text: Vec<String> = if !args.listen.is_empty() {
            args.listen.clone()
        } else {
            match file.listen {
                Some(OneOrMany::One(one)) => vec![one],
                Some(OneOrMany::Many(many)) => many,
                None => vec![DEFAULT_LISTEN.to_string()],
            }
        };
        let listen = parse_listen(&listen_text)?;
        let socket = args.socket.clone().or(file.socket);
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
        let admin = parse_listen(std::slice::from_ref(&admin_text))
            .with_context(|| "the admin address")?
            .pop();
        let shutdown_grace = std::time::Duration::from_secs(
            args.shutdown_grace_seconds
                .or(file.shutdown_grace_seconds)
                .unwrap_or(DEFAULT_SHUTDOWN_GRACE_SECONDS),
        );
        Ok(ServeConfig {
            admin,
            shutdown_grace,
            listen,
            socket,
            data_dir: args
                .data_dir
                .clone()
                .or(file.data_dir)
                .unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
            max_block_bytes: max_block as u32,
            io_engine: args.io_engine.or(file.io_engine).unwrap_or_default(),
            log_level: args
                .log_level
                .clone()
                .or(file.log_level)
                .unwrap_or_else(|| "info".into()),
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
        })
    }
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

/// `NAME=SPEC[,readonly]`
pub fn parse_export_flag(text: &str) -> anyhow::Result<ExportSpec> {
    let (name, rest) = text
        .split_once('=')
        .with_context(|| format!("--export {text:?}: want NAME=SPEC[,readonly]"))?;
    check_name(name)?;
    // A model spec has commas of its own; export options come last.
    let (device_text, options) = if rest.starts_with("model:") {
        match rest.rsplit_once(',') {
            Some((head, "readonly" | "ro")) => (head, vec!["readonly"]),
            _ => (rest, vec![]),
        }
    } else {
        let mut parts = rest.split(',');
        let device = parts.next().unwrap_or_default();
        (device, parts.collect())
    };
    let device =
        DeviceSpec::parse(device_text).map_err(|e| anyhow::anyhow!("--export {text:?}: {e}"))?;
    let mut read_only = false;
    for option in options {
        match option {
            "readonly" | "ro" => read_only = true,
            other => bail!("--export {text:?}: unknown option {other:?} (known: readonly)"),
        }
    }
    Ok(ExportSpec {
        name: name.into(),
        description: String::new(),
        device,
        read_only,
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
                description: "A".into()
            }]
        );
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
}
