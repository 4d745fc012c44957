//! TLS and per-export access settings: flags, TOML keys, and the checks
//! that keep them consistent with each other.
//!
//! ```toml
//! tls = "require"                 # off | on | require
//! tls_certificates = "/etc/weir/tls"
//! tls_verify_peer = true
//!
//! [[export]]
//! name = "vm17"
//! device = "/dev/vg/vm17"
//! tls_only = true                 # with tls = "on": this export needs TLS
//! allow = ["cert:vm17.example", "10.0.0.0/8"]
//! readonly_for = ["cert:backup"]
//! ```

use std::path::PathBuf;

use anyhow::bail;
use serde::Deserialize;
use weir_nbd::TlsMode;

use crate::server::access::{Policy, Rule};

/// `--tls`: nbdkit's meanings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TlsSetting {
    /// No TLS: STARTTLS is refused.
    #[default]
    Off,
    /// TLS for clients that ask; `tls_only` exports need it.
    On,
    /// TLS for every client before anything else.
    Require,
}

impl TlsSetting {
    pub fn mode(self) -> TlsMode {
        match self {
            TlsSetting::Off => TlsMode::Off,
            TlsSetting::On => TlsMode::On,
            TlsSetting::Require => TlsMode::Require,
        }
    }
}

/// TLS as `weir serve` will offer it.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsConfig {
    pub setting: TlsSetting,
    /// ca-cert.pem, server-cert.pem and server-key.pem.
    pub certificates: PathBuf,
    pub verify_peer: bool,
}

/// Build a policy from an export's or volume's TOML keys.
pub fn policy_from_keys(
    tls_only: bool,
    allow: &[String],
    readonly_for: &[String],
) -> anyhow::Result<Policy> {
    let rules = |texts: &[String], key: &str| {
        texts
            .iter()
            .map(|text| Rule::parse(text).map_err(|e| anyhow::anyhow!("{key}: {e}")))
            .collect::<anyhow::Result<Vec<_>>>()
    };
    Ok(Policy {
        tls_only,
        allow: rules(allow, "allow")?,
        read_only: rules(readonly_for, "readonly_for")?,
    })
}

/// Apply one `--export`/`--volume` option if it is an access option:
/// `tls-only`, `allow=RULE` or `readonly-for=RULE`. None: not one of them.
pub fn apply_flag_option(policy: &mut Policy, option: &str) -> Option<Result<(), String>> {
    let parsed = match option.split_once('=') {
        None if option == "tls-only" => {
            policy.tls_only = true;
            return Some(Ok(()));
        }
        Some(("allow", rule)) => Rule::parse(rule).map(|rule| policy.allow.push(rule)),
        Some(("readonly-for", rule)) => Rule::parse(rule).map(|rule| policy.read_only.push(rule)),
        _ => return None,
    };
    Some(parsed)
}

/// Whether `option` is an access option (for splitting model specs).
pub fn is_flag_option(option: &str) -> bool {
    option == "tls-only" || option.starts_with("allow=") || option.starts_with("readonly-for=")
}

/// Refuse settings that could never admit anyone as written.
pub fn check(tls: &TlsConfig, name: &str, policy: &Policy) -> anyhow::Result<()> {
    if policy.tls_only && tls.setting == TlsSetting::Off {
        bail!("{name:?} is TLS-only, but TLS is off (give --tls on or --tls require)");
    }
    let names_certificates = policy
        .allow
        .iter()
        .chain(&policy.read_only)
        .any(|rule| matches!(rule, Rule::CertName(_)));
    if names_certificates && !tls.verify_peer {
        bail!(
            "{name:?} names client certificates, which are only asked for with \
             --tls-verify-peer"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_options_build_a_policy() {
        let mut policy = Policy::default();
        for option in [
            "tls-only",
            "allow=cert:a",
            "allow=10.0.0.0/8",
            "readonly-for=::1",
        ] {
            assert_eq!(apply_flag_option(&mut policy, option), Some(Ok(())));
        }
        assert!(policy.tls_only);
        assert_eq!(policy.allow.len(), 2);
        assert_eq!(policy.read_only.len(), 1);
        assert_eq!(apply_flag_option(&mut policy, "cache=writeback"), None);
        assert!(matches!(
            apply_flag_option(&mut policy, "allow=vm1"),
            Some(Err(_))
        ));
    }

    #[test]
    fn settings_that_admit_no_one_are_refused() {
        let mut tls = TlsConfig {
            setting: TlsSetting::Off,
            certificates: PathBuf::new(),
            verify_peer: false,
        };
        let tls_only = Policy {
            tls_only: true,
            ..Policy::default()
        };
        assert!(check(&tls, "a", &tls_only).is_err());
        tls.setting = TlsSetting::On;
        assert!(check(&tls, "a", &tls_only).is_ok());
        let by_name = policy_from_keys(false, &[], &["cert:backup".into()]).unwrap();
        assert!(check(&tls, "a", &by_name).is_err());
        tls.verify_peer = true;
        assert!(check(&tls, "a", &by_name).is_ok());
    }
}
