//! Device spec strings, usable wherever a path is: `PATH`, `file:PATH`,
//! `mem:SIZE`, `model:KIND,size=SIZE[,...]` (see `model::spec`),
//! `rbd:POOL/IMAGE[,...]` (see `rbd::spec`).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

use super::file::FileDevice;
use super::mem::MemDevice;
use super::model::realtime::ModelDevice;
use super::model::ModelSpec;
use super::rbd::{RbdDevice, RbdSpec};
use super::Device;
use crate::units::parse_bytes;

#[derive(Clone, Debug, PartialEq)]
pub enum DeviceSpec {
    File(PathBuf),
    Mem { size_bytes: u64 },
    Model(Box<ModelSpec>),
    Rbd(Box<RbdSpec>),
}

impl DeviceSpec {
    pub fn parse(text: &str) -> Result<DeviceSpec, String> {
        if let Some(model) = text.strip_prefix("model:") {
            return Ok(DeviceSpec::Model(Box::new(ModelSpec::parse(model)?)));
        }
        if let Some(rbd) = text.strip_prefix("rbd:") {
            return Ok(DeviceSpec::Rbd(Box::new(RbdSpec::parse(rbd)?)));
        }
        if let Some(size) = text.strip_prefix("mem:") {
            let size_bytes = parse_bytes(size)?;
            if size_bytes == 0 {
                return Err("mem: device needs a non-zero size".into());
            }
            return Ok(DeviceSpec::Mem { size_bytes });
        }
        let path = text.strip_prefix("file:").unwrap_or(text);
        if path.is_empty() {
            return Err("empty device path".into());
        }
        Ok(DeviceSpec::File(PathBuf::from(path)))
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::File(path) => write!(f, "{}", path.display()),
            DeviceSpec::Mem { size_bytes } => write!(f, "mem:{size_bytes}"),
            DeviceSpec::Model(spec) => write!(f, "{}", spec.text),
            DeviceSpec::Rbd(spec) => write!(f, "{}", spec.text),
        }
    }
}

/// How file devices are driven.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum IoEngine {
    /// io_uring, falling back to threads (with a log line) if unavailable.
    #[default]
    Auto,
    /// io_uring or fail.
    Uring,
    /// Blocking system calls on a thread pool.
    Threads,
}

pub fn open(spec: &DeviceSpec, read_only: bool, engine: IoEngine) -> io::Result<Arc<dyn Device>> {
    Ok(match spec {
        DeviceSpec::File(path) => Arc::new(
            FileDevice::open(path, read_only, engine)
                .map_err(|err| io::Error::new(err.kind(), format!("{}: {err}", path.display())))?,
        ),
        DeviceSpec::Mem { size_bytes } => Arc::new(MemDevice::new(*size_bytes)),
        DeviceSpec::Model(spec) => Arc::new(ModelDevice::open(spec, read_only)?),
        DeviceSpec::Rbd(spec) => Arc::new(
            RbdDevice::open(spec, read_only)
                .map_err(|err| io::Error::new(err.kind(), format!("{}: {err}", spec.text)))?,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(
            DeviceSpec::parse("mem:2G"),
            Ok(DeviceSpec::Mem {
                size_bytes: 2 << 30
            })
        );
        assert_eq!(
            DeviceSpec::parse("file:/x"),
            Ok(DeviceSpec::File("/x".into()))
        );
        assert_eq!(
            DeviceSpec::parse("/dev/sdb"),
            Ok(DeviceSpec::File("/dev/sdb".into()))
        );
        assert!(DeviceSpec::parse("mem:0").is_err());
        assert!(DeviceSpec::parse("mem:lots").is_err());
        assert!(DeviceSpec::parse("").is_err());
        assert!(matches!(
            DeviceSpec::parse("model:hdd,size=1G,tags=4"),
            Ok(DeviceSpec::Model(_))
        ));
        assert!(DeviceSpec::parse("model:hdd,size=1G,tags=x").is_err());
        assert!(matches!(
            DeviceSpec::parse("rbd:rbd/disk,conf=/c.conf"),
            Ok(DeviceSpec::Rbd(_))
        ));
        assert!(DeviceSpec::parse("rbd:disk").is_err());
    }
}
