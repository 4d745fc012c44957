//! Injected faults, as a plan the drivers consult: which reads fail, which
//! bits read back flipped, when the device is slow, when it is gone.
//! Sans-IO: every question takes `now`.
//!
//! Set at start through the model spec (`bad=`, `flip=`, `slow=`,
//! `vanish_at=`) and at run time through [`FaultPlan::apply_command`]
//! (the real-time engine reads commands from a control file).

use super::{Nanos, NANOS_PER_SEC};
use crate::units::parse_bytes;

/// A latency multiplier over a window of time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowWindow {
    pub factor: f64,
    pub from: Nanos,
    pub until: Nanos,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    /// `[start, end)` byte ranges whose reads fail (latent sector errors).
    pub bad_ranges: Vec<(u64, u64)>,
    /// Bytes that read back with one bit flipped, silently.
    pub flipped_bytes: Vec<u64>,
    pub slow: Vec<SlowWindow>,
    /// From then on every I/O fails.
    pub vanish_at: Option<Nanos>,
    /// Writes starting in `[start, end)` land at `target + (offset - start)`.
    pub misdirects: Vec<(u64, u64, u64)>,
    /// Picks which bit a flip inverts.
    pub seed: u64,
}

impl FaultPlan {
    /// Take a spec parameter if it names a fault. `Ok(false)`: not a fault.
    pub fn parse_param(&mut self, key: &str, value: &str) -> Result<bool, String> {
        match key {
            "bad" => self.bad_ranges.push(parse_range(value)?),
            "flip" => self.flipped_bytes.push(parse_bytes(value)?),
            "slow" => self.slow.push(parse_slow(value)?),
            "vanish_at" => self.vanish_at = Some(parse_seconds(value)?),
            "misdirect" => self.misdirects.push(parse_misdirect(value)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A run-time command: `bad START..END`, `flip OFFSET`,
    /// `misdirect START..END>TARGET`,
    /// `slow FACTOR@FROM..UNTIL` (seconds since start), `slow FACTOR` (from
    /// now on), `vanish`, `heal` (clear everything).
    pub fn apply_command(&mut self, line: &str, now: Nanos) -> Result<(), String> {
        let mut words = line.split_whitespace();
        let verb = words.next().unwrap_or_default();
        let arg = words.next();
        match (verb, arg) {
            ("bad", Some(range)) => self.bad_ranges.push(parse_range(range)?),
            ("flip", Some(offset)) => self.flipped_bytes.push(parse_bytes(offset)?),
            ("misdirect", Some(text)) => self.misdirects.push(parse_misdirect(text)?),
            ("slow", Some(text)) if text.contains('@') => self.slow.push(parse_slow(text)?),
            ("slow", Some(factor)) => self.slow.push(SlowWindow {
                factor: parse_factor(factor)?,
                from: now,
                until: Nanos::MAX,
            }),
            ("vanish", None) => self.vanish_at = Some(now),
            ("heal", None) => {
                *self = FaultPlan {
                    seed: self.seed,
                    ..FaultPlan::default()
                }
            }
            _ => return Err(format!("unknown fault command {line:?}")),
        }
        Ok(())
    }

    pub fn latency_factor(&self, now: Nanos) -> f64 {
        self.slow
            .iter()
            .filter(|w| now >= w.from && now < w.until)
            .map(|w| w.factor)
            .fold(1.0, f64::max)
    }

    pub fn vanished(&self, now: Nanos) -> bool {
        self.vanish_at.is_some_and(|at| now >= at)
    }

    pub fn read_fails(&self, offset: u64, length: u64) -> bool {
        let end = offset + length;
        self.bad_ranges.iter().any(|&(s, e)| s < end && e > offset)
    }

    /// Where a write of `length` bytes aimed at `offset` really lands on a
    /// device of `size_bytes` (itself, unless misdirected).
    pub fn write_target(&self, offset: u64, length: u64, size_bytes: u64) -> u64 {
        self.misdirects
            .iter()
            .find(|&&(start, end, _)| offset >= start && offset < end)
            .map(|&(start, _, target)| target + (offset - start))
            .filter(|landed| {
                landed
                    .checked_add(length)
                    .is_some_and(|end| end <= size_bytes)
            })
            .unwrap_or(offset)
    }

    /// Apply the plan's bit flips to data read from `offset`.
    pub fn corrupt(&self, offset: u64, data: &mut [u8]) {
        for &at in &self.flipped_bytes {
            if at >= offset && at < offset + data.len() as u64 {
                data[(at - offset) as usize] ^= self.flip_mask(at);
            }
        }
    }

    fn flip_mask(&self, at: u64) -> u8 {
        let bit = crate::rng::mix(self.seed ^ at) % 8;
        1 << bit
    }
}

fn parse_range(text: &str) -> Result<(u64, u64), String> {
    let (start, end) = text
        .split_once("..")
        .ok_or_else(|| format!("want START..END, got {text:?}"))?;
    let (start, end) = (parse_bytes(start)?, parse_bytes(end)?);
    if start >= end {
        return Err(format!("empty range {text:?}"));
    }
    Ok((start, end))
}

/// `START..END>TARGET`
fn parse_misdirect(text: &str) -> Result<(u64, u64, u64), String> {
    let (range, target) = text
        .split_once('>')
        .ok_or_else(|| format!("want START..END>TARGET, got {text:?}"))?;
    let (start, end) = parse_range(range)?;
    Ok((start, end, parse_bytes(target)?))
}

fn parse_seconds(text: &str) -> Result<Nanos, String> {
    let seconds: f64 = text
        .trim_end_matches('s')
        .parse()
        .map_err(|_| format!("want seconds, got {text:?}"))?;
    if !(seconds >= 0.0 && seconds.is_finite()) {
        return Err(format!("want seconds, got {text:?}"));
    }
    Ok((seconds * NANOS_PER_SEC as f64) as Nanos)
}

fn parse_factor(text: &str) -> Result<f64, String> {
    let factor: f64 = text
        .trim_end_matches('x')
        .parse()
        .map_err(|_| format!("want a factor like 10, got {text:?}"))?;
    if !(factor >= 1.0 && factor.is_finite()) {
        return Err(format!(
            "a slowdown factor must be at least 1, got {text:?}"
        ));
    }
    Ok(factor)
}

/// `FACTOR@FROM..UNTIL`, times in seconds since start.
fn parse_slow(text: &str) -> Result<SlowWindow, String> {
    let (factor, window) = text
        .split_once('@')
        .ok_or_else(|| format!("want FACTOR@FROM..UNTIL, got {text:?}"))?;
    let (from, until) = window
        .split_once("..")
        .ok_or_else(|| format!("want FACTOR@FROM..UNTIL, got {text:?}"))?;
    let window = SlowWindow {
        factor: parse_factor(factor)?,
        from: parse_seconds(from)?,
        until: parse_seconds(until)?,
    };
    if window.from >= window.until {
        return Err(format!("empty window in {text:?}"));
    }
    Ok(window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_params_build_a_plan() {
        let mut plan = FaultPlan::default();
        assert!(plan.parse_param("bad", "4K..8K").unwrap());
        assert!(plan.parse_param("slow", "10@1..2.5").unwrap());
        assert!(plan.parse_param("vanish_at", "30").unwrap());
        assert!(!plan.parse_param("tags", "4").unwrap());
        assert!(plan.parse_param("bad", "8K..4K").is_err());
        assert!(plan.parse_param("slow", "0.5@1..2").is_err());
        assert!(plan.read_fails(8191, 1));
        assert!(!plan.read_fails(8192, 4096));
        assert_eq!(plan.latency_factor(NANOS_PER_SEC / 2), 1.0);
        assert_eq!(plan.latency_factor(2 * NANOS_PER_SEC), 10.0);
        assert_eq!(plan.latency_factor(3 * NANOS_PER_SEC), 1.0);
        assert!(!plan.vanished(29 * NANOS_PER_SEC));
        assert!(plan.vanished(30 * NANOS_PER_SEC));
    }

    #[test]
    fn misdirected_writes_land_elsewhere_inside_the_device() {
        let mut plan = FaultPlan::default();
        assert!(plan.parse_param("misdirect", "0..1M>2M").unwrap());
        assert_eq!(plan.write_target(4096, 4096, 8 << 20), (2 << 20) + 4096);
        assert_eq!(
            plan.write_target(1 << 20, 4096, 8 << 20),
            1 << 20,
            "outside the range"
        );
        assert_eq!(
            plan.write_target(4096, 4096, 2 << 20),
            4096,
            "would fall off the end"
        );
        assert!(plan.parse_param("misdirect", "0..1M").is_err());
    }

    #[test]
    fn flips_are_one_bit_and_deterministic() {
        let plan = FaultPlan {
            flipped_bytes: vec![100],
            seed: 7,
            ..FaultPlan::default()
        };
        let mut a = vec![0u8; 4096];
        plan.corrupt(0, &mut a);
        let mut b = vec![0u8; 4096];
        plan.corrupt(0, &mut b);
        assert_eq!(a, b);
        assert_eq!(a.iter().map(|x| x.count_ones()).sum::<u32>(), 1);
        assert_ne!(a[100], 0);
        let mut outside = vec![0u8; 64];
        plan.corrupt(4096, &mut outside);
        assert!(outside.iter().all(|x| *x == 0));
    }

    #[test]
    fn commands_change_the_plan_at_run_time() {
        let mut plan = FaultPlan::default();
        plan.apply_command("slow 10", 5).unwrap();
        assert_eq!(plan.latency_factor(4), 1.0);
        assert_eq!(plan.latency_factor(6), 10.0);
        plan.apply_command("vanish", 7).unwrap();
        assert!(plan.vanished(7));
        plan.apply_command("heal", 8).unwrap();
        assert!(!plan.vanished(9));
        assert_eq!(plan.latency_factor(9), 1.0);
        assert!(plan.apply_command("explode", 9).is_err());
    }
}
