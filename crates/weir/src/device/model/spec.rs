//! `model:KIND,size=SIZE[,store=mem|file:PATH][,seed=N][,param=value...]`
//!
//! Every model parameter can be overridden by name (see `docs/devices.md`
//! for the list); faults (`bad=`, `flip=`, `slow=`, `vanish_at=`) and a
//! run-time `control=PATH` file go in the same list.

use std::path::PathBuf;

use super::faults::FaultPlan;
use super::flash::{Flash, FlashParams};
use super::hdd::{Hdd, HddParams};
use super::power_loss::PowerLoss;
use super::{Nanos, TimingModel, NANOS_PER_MS, NANOS_PER_US};
use crate::units::parse_bytes;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    Hdd,
    Ssd,
    Nvme,
}

impl ModelKind {
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Hdd => "hdd",
            ModelKind::Ssd => "ssd",
            ModelKind::Nvme => "nvme",
        }
    }
}

/// Where a model keeps its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelStore {
    Mem,
    File(PathBuf),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Timing {
    Hdd(HddParams),
    Flash(FlashParams),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub kind: ModelKind,
    pub size_bytes: u64,
    pub store: ModelStore,
    pub seed: u64,
    pub timing: Timing,
    pub faults: FaultPlan,
    /// A file the real-time engine polls for fault commands.
    pub control: Option<PathBuf>,
    /// Track unflushed writes so that a `powerloss` command can undo them.
    pub power_loss: Option<PowerLoss>,
    /// The spec as written, for logs.
    pub text: String,
}

impl ModelSpec {
    /// Parse what follows `model:`.
    pub fn parse(text: &str) -> Result<ModelSpec, String> {
        let mut parts = text.split(',');
        let kind = match parts.next().unwrap_or_default() {
            "hdd" => ModelKind::Hdd,
            "ssd" => ModelKind::Ssd,
            "nvme" => ModelKind::Nvme,
            other => {
                return Err(format!(
                    "unknown model kind {other:?} (known: hdd, ssd, nvme)"
                ))
            }
        };
        let mut pairs = Vec::new();
        for part in parts {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("model parameter {part:?}: want KEY=VALUE"))?;
            pairs.push((key.trim(), value.trim()));
        }
        let size_bytes = match pairs.iter().find(|(k, _)| *k == "size") {
            Some((_, v)) => parse_bytes(v)?,
            None => return Err("a model needs size=SIZE".into()),
        };
        if size_bytes < 1 << 20 {
            return Err("a model needs size of at least 1M".into());
        }
        let mut spec = ModelSpec {
            kind,
            size_bytes,
            store: ModelStore::Mem,
            seed: 1,
            timing: match kind {
                ModelKind::Hdd => Timing::Hdd(HddParams::new(size_bytes)),
                ModelKind::Ssd => Timing::Flash(FlashParams::sata_ssd(size_bytes)),
                ModelKind::Nvme => Timing::Flash(FlashParams::nvme(size_bytes)),
            },
            faults: FaultPlan::default(),
            control: None,
            power_loss: None,
            text: format!("model:{text}"),
        };
        for (key, value) in pairs {
            spec.set(key, value)
                .map_err(|e| format!("model parameter {key}={value}: {e}"))?;
        }
        spec.faults.seed = spec.seed;
        Ok(spec)
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "size" => return Ok(()),
            "store" => {
                self.store = match value {
                    "mem" => ModelStore::Mem,
                    _ => match value.strip_prefix("file:") {
                        Some(path) if !path.is_empty() => ModelStore::File(path.into()),
                        _ => return Err("want store=mem or store=file:PATH".into()),
                    },
                };
                return Ok(());
            }
            "seed" => {
                self.seed = value.parse().map_err(|_| "want an integer".to_string())?;
                return Ok(());
            }
            "control" => {
                self.control = Some(value.into());
                return Ok(());
            }
            "power_loss" => {
                self.power_loss = Some(PowerLoss::parse(value)?);
                return Ok(());
            }
            _ => {}
        }
        if self.faults.parse_param(key, value)? {
            return Ok(());
        }
        let known = match &mut self.timing {
            Timing::Hdd(p) => set_hdd(p, key, value)?,
            Timing::Flash(p) => set_flash(p, key, value)?,
        };
        if !known {
            return Err(format!("unknown parameter for model:{}", self.kind.name()));
        }
        Ok(())
    }

    pub fn timing_model(&self) -> Box<dyn TimingModel> {
        match &self.timing {
            Timing::Hdd(p) => Box::new(Hdd::new(p.clone())),
            Timing::Flash(p) => Box::new(Flash::new(p.clone(), self.seed)),
        }
    }

    /// Bytes the drive can hold acknowledged but not durable: what a
    /// power loss can take.
    pub fn volatile_bytes(&self) -> u64 {
        match &self.timing {
            Timing::Hdd(p) if p.write_cache => p.write_cache_bytes,
            Timing::Hdd(_) => 0,
            Timing::Flash(p) if p.plp => 0,
            Timing::Flash(p) => p.write_buffer_bytes,
        }
    }

    pub fn rotational(&self) -> bool {
        self.kind == ModelKind::Hdd
    }
}

fn number<T: std::str::FromStr>(value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("invalid number {value:?}"))
}

fn micros(value: &str) -> Result<Nanos, String> {
    Ok((number::<f64>(value)? * NANOS_PER_US as f64) as Nanos)
}

fn millis(value: &str) -> Result<Nanos, String> {
    Ok((number::<f64>(value)? * NANOS_PER_MS as f64) as Nanos)
}

fn mb_per_sec(value: &str) -> Result<u64, String> {
    let rate = (number::<f64>(value)? * 1e6) as u64;
    if rate == 0 {
        return Err("a rate must be positive".into());
    }
    Ok(rate)
}

/// A number from 0 to 1.
fn fraction(value: &str) -> Result<f64, String> {
    let x: f64 = number(value)?;
    if (0.0..=1.0).contains(&x) {
        Ok(x)
    } else {
        Err("want a number from 0 to 1".into())
    }
}

fn switch(value: &str) -> Result<bool, String> {
    match value {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err("want on or off".into()),
    }
}

fn positive<T: PartialOrd + Default>(value: T) -> Result<T, String> {
    if value > T::default() {
        Ok(value)
    } else {
        Err("must be positive".into())
    }
}

fn set_hdd(p: &mut HddParams, key: &str, value: &str) -> Result<bool, String> {
    match key {
        "rotation_ms" => p.rotation_ns = positive(millis(value)?)?,
        "seek_base_ms" => p.seek_base_ms = number(value)?,
        "seek_sqrt_ms" => p.seek_sqrt_ms = number(value)?,
        "seek_linear_ms" => p.seek_linear_ms = number(value)?,
        "settle_us" => p.write_settle_ns = micros(value)?,
        "overhead_us" => p.command_overhead_ns = micros(value)?,
        "outer_mb_s" => p.outer_rate_bytes_per_sec = mb_per_sec(value)?,
        "inner_fraction" => {
            let f: f64 = number(value)?;
            if !(f > 0.0 && f <= 1.0) {
                return Err("want a fraction in (0, 1]".into());
            }
            p.inner_rate_fraction = f;
        }
        "interface_mb_s" => p.interface_bytes_per_sec = mb_per_sec(value)?,
        "tags" => p.tags = positive(number(value)?)?,
        "reorder_window" => p.reorder_window = positive(number(value)?)?,
        "age_limit_ms" => p.age_limit_ns = millis(value)?,
        "readahead" => p.readahead_bytes = parse_bytes(value)?,
        "cache_segments" => p.cache_segments = number(value)?,
        "write_cache" => p.write_cache = switch(value)?,
        "write_cache_size" => p.write_cache_bytes = positive(parse_bytes(value)?)?,
        _ => return Ok(false),
    }
    Ok(true)
}

fn set_flash(p: &mut FlashParams, key: &str, value: &str) -> Result<bool, String> {
    match key {
        "dies" => p.dies = positive(number(value)?)?,
        "page" => p.page_bytes = positive(parse_bytes(value)?)?,
        "read_us" => p.read_page_ns = micros(value)?,
        "program" => p.program_bytes = positive(parse_bytes(value)?)?,
        "program_us" => p.program_ns = micros(value)?,
        "link_mb_s" => p.link_bytes_per_sec = mb_per_sec(value)?,
        "controller_us" => p.controller_ns = micros(value)?,
        "completion_us" => p.completion_ns = micros(value)?,
        "tags" => p.tags = positive(number(value)?)?,
        "write_buffer" => p.write_buffer_bytes = positive(parse_bytes(value)?)?,
        "plp" => p.plp = switch(value)?,
        "flush_us" => p.flush_ns = micros(value)?,
        "gc" => p.gc_every_programs = if switch(value)? { 4 } else { 0 },
        "erase_us" => p.erase_ns = micros(value)?,
        "gc_mb_s" => p.gc_bytes_per_sec = mb_per_sec(value)?,
        "spare" => p.spare_bytes = parse_bytes(value)?,
        "reclaim_mb_s" => p.reclaim_bytes_per_sec = mb_per_sec(value)?,
        "read_spread" => p.read_spread = fraction(value)?,
        "read_retry_ppm" => p.read_retry_ppm = number(value)?,
        "write_ack_us" => p.write_ack_ns = micros(value)?,
        _ => return Ok(false),
    }
    if p.write_buffer_bytes < 2 * p.program_bytes {
        return Err("write_buffer must hold at least two program units".into());
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_specs_parse_with_overrides_and_faults() {
        let spec =
            ModelSpec::parse("hdd,size=1G,write_cache=off,age_limit_ms=500,bad=0..4K,seed=9")
                .unwrap();
        assert_eq!(spec.kind, ModelKind::Hdd);
        assert_eq!(spec.size_bytes, 1 << 30);
        assert_eq!(spec.seed, 9);
        assert_eq!(spec.faults.seed, 9);
        assert_eq!(spec.faults.bad_ranges, vec![(0, 4096)]);
        let Timing::Hdd(p) = &spec.timing else {
            panic!("hdd timing expected")
        };
        assert!(!p.write_cache);
        assert_eq!(p.age_limit_ns, 500 * NANOS_PER_MS);

        let spec = ModelSpec::parse("nvme,size=4G,store=file:/tmp/x,dies=32").unwrap();
        assert_eq!(spec.store, ModelStore::File("/tmp/x".into()));
        let Timing::Flash(p) = &spec.timing else {
            panic!("flash timing expected")
        };
        assert_eq!(p.dies, 32);
    }

    #[test]
    fn bad_model_specs_name_the_problem() {
        for (text, needle) in [
            ("tape,size=1G", "unknown model kind"),
            ("hdd", "size=SIZE"),
            ("ssd,size=1G,dies=0", "dies=0"),
            ("ssd,size=1G,rotation_ms=8", "unknown parameter"),
            ("hdd,size=1G,store=disk", "store=mem"),
            ("hdd,size=1G,tags", "KEY=VALUE"),
        ] {
            let err = ModelSpec::parse(text).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
