//! Whether this process may take a pool's devices: the holder stamps on
//! them (holder.rs) judged against this process, and for a holder that
//! may be alive, the activity check `--force` runs: watch its heartbeat
//! for two beats, and take the devices only if it stood still.

use std::sync::{Arc, OnceLock};

use anyhow::bail;

use super::holder::{Holder, Standing, BEAT_INTERVAL};
use super::members::{read_stamped_labels, write_labels};
use crate::device::Device;

/// This process as a holder, with beat 0.
pub fn this_process() -> Holder {
    static ME: OnceLock<Holder> = OnceLock::new();
    ME.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        let machine_id = ["/etc/machine-id", "/var/lib/dbus/machine-id"]
            .iter()
            .find_map(|path| hex_id(&std::fs::read_to_string(path).ok()?))
            .unwrap_or_else(|| u128::from(crc32c::crc32c(host.as_bytes())));
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .and_then(|text| hex_id(&text))
            .unwrap_or(0);
        let pid_namespace = std::fs::metadata("/proc/self/ns/pid")
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap_or(0);
        Holder {
            machine_id,
            boot_id,
            pid_namespace,
            pid: std::process::id(),
            interval_ms: BEAT_INTERVAL.as_millis() as u32,
            beat: 0,
            host,
        }
    })
    .clone()
}

/// 32 hex digits, dashes allowed (a boot id has them).
fn hex_id(text: &str) -> Option<u128> {
    let digits: String = text.trim().chars().filter(|c| *c != '-').collect();
    (digits.len() == 32)
        .then(|| u128::from_str_radix(&digits, 16).ok())
        .flatten()
}

fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The newest stamp on a device's valid label copies.
fn stamp_of(device: &dyn Device) -> Option<Holder> {
    read_stamped_labels(device)
        .into_iter()
        .filter_map(|copy| copy.ok().and_then(|(_, holder)| holder))
        .max_by_key(|holder| holder.beat)
}

/// Refuse `devices` if a process other than this one may be writing any
/// of them. With `force`, a holder that may be alive is watched for two
/// beats: one that beats is never overridden; one that stood still is
/// taken over and its stamps cleared.
pub fn check_holders(devices: &[(String, Arc<dyn Device>)], force: bool) -> anyhow::Result<()> {
    let named: Vec<(&str, &dyn Device)> = devices
        .iter()
        .map(|(text, device)| (text.as_str(), device.as_ref()))
        .collect();
    check_named_holders(&named, force)
}

/// `check_holders` on borrowed devices.
pub fn check_named_holders(devices: &[(&str, &dyn Device)], force: bool) -> anyhow::Result<()> {
    let me = this_process();
    let mut held = Vec::new();
    for &(text, device) in devices {
        let Some(stamp) = stamp_of(device) else {
            continue;
        };
        match stamp.standing(&me, pid_alive) {
            Standing::Ours => {}
            Standing::Gone(why) => tracing::info!(device = text, "taking over: {why}"),
            Standing::Held => held.push((text, device, stamp)),
        }
    }
    let Some((text, _, first)) = held.first() else {
        return Ok(());
    };
    if !force {
        bail!(
            "{text} is held by weir {} (its label's heartbeat is written every {} s); \
             if that server is gone, --force takes the pool once the heartbeat is seen to stop",
            first.describe(),
            first.interval_ms / 1000
        );
    }
    let wait = held
        .iter()
        .map(|(_, _, stamp)| stamp.silence_needed())
        .max()
        .expect("one at least");
    tracing::warn!(
        "checking that the holder of {text} is gone: watching its heartbeat for {} s",
        wait.as_secs()
    );
    std::thread::sleep(wait);
    for (text, device, before) in &held {
        match stamp_of(*device) {
            Some(now) if now.same_holder(before) && now.beat == before.beat => {}
            Some(now) if !now.same_holder(&me) => bail!(
                "{text} is in use by weir {}: its heartbeat went on while we watched; \
                 a device that is being served is never taken, --force or not",
                now.describe()
            ),
            _ => bail!("{text} changed hands while we watched; try again"),
        }
    }
    for (text, device, before) in &held {
        tracing::warn!(
            device = *text,
            "taking over from weir {}: its heartbeat stopped",
            before.describe()
        );
        release(*device)
            .map_err(|err| anyhow::anyhow!("cannot clear the stamp on {text}: {err}"))?;
    }
    Ok(())
}

/// Rewrite a device's valid label copies without a holder stamp.
fn release(device: &dyn Device) -> std::io::Result<()> {
    let copies = read_stamped_labels(device);
    for (index, copy) in copies.iter().enumerate() {
        if let Ok((label, Some(_))) = copy {
            write_labels(device, label, None, &[index])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_and_boot_ids_parse_with_or_without_dashes() {
        assert_eq!(
            hex_id("3d1219c7c4c5404aaa1f6d2a48adfda4\n"),
            Some(0x3d1219c7c4c5404aaa1f6d2a48adfda4)
        );
        assert_eq!(
            hex_id("3442a729-ef25-4370-bb09-a7d91dbc55af"),
            Some(0x3442a729ef254370bb09a7d91dbc55af)
        );
        assert_eq!(hex_id("uninitialized"), None);
    }

    #[test]
    fn this_process_is_alive_and_its_own_holder() {
        let me = this_process();
        assert!(pid_alive(me.pid));
        assert_eq!(me.standing(&me, pid_alive), Standing::Ours);
        assert!(!pid_alive(u32::MAX));
    }
}
