//! Who holds a pool's devices: a stamp in every member's label naming the
//! process that serves the pool, with a heartbeat.
//!
//! The flock in `device::ownership` stops a second server on the same
//! machine through the same path. It cannot see a server on another
//! machine that reaches the same disk (a shared SAN LUN, an iSCSI or
//! NBD-exported disk), nor one on this machine that opened the disk
//! through another path (a second loop device over the same file, a
//! multipath alias). The stamp covers those: a holder rewrites the first
//! label copy every few seconds with a higher beat, so anyone can tell a
//! live holder (its beat advances) from a dead one (it stays put), as
//! ZFS multihost does with its uberblock writes. A clean close clears it.
//!
//! Sans-IO: stamps in and out of label bytes, and the judgement of one.
//!
//! ```text
//!  stamp (inside the label, before its checksum):
//!   0 state (1: held) | 4 machine id (16) | 20 boot id (16) | 36 pid namespace (8)
//!   | 44 pid (4) | 48 beat interval ms (4) | 52 beat (8) | 60 host name length (1)
//!   | 61 host name (up to 51 bytes)
//! ```

use std::time::Duration;

/// Bytes a stamp takes in a label.
pub const STAMP_BYTES: usize = 112;
const HOST_NAME_BYTES_MAX: usize = STAMP_BYTES - 61;
/// How often a serving process beats: one 4 KiB write per member.
pub const BEAT_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// /etc/machine-id, or a hash of the host name where there is none.
    pub machine_id: u128,
    /// Changes at every boot: a stamp from an earlier boot is dead.
    pub boot_id: u128,
    /// The pid namespace's inode: pids compare only within one.
    pub pid_namespace: u64,
    pub pid: u32,
    pub interval_ms: u32,
    pub beat: u64,
    pub host: String,
}

/// What a stamp found on a device means to this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// This process's own stamp.
    Ours,
    /// Its holder is provably gone, for the reason given.
    Gone(String),
    /// Its holder may be alive: only a heartbeat that stops tells.
    Held,
}

impl Holder {
    pub fn encode_into(&self, b: &mut [u8]) {
        assert_eq!(b.len(), STAMP_BYTES, "a stamp slot");
        b.fill(0);
        b[0] = 1;
        b[4..20].copy_from_slice(&self.machine_id.to_be_bytes());
        b[20..36].copy_from_slice(&self.boot_id.to_be_bytes());
        b[36..44].copy_from_slice(&self.pid_namespace.to_be_bytes());
        b[44..48].copy_from_slice(&self.pid.to_be_bytes());
        b[48..52].copy_from_slice(&self.interval_ms.to_be_bytes());
        b[52..60].copy_from_slice(&self.beat.to_be_bytes());
        let host = truncate_utf8(&self.host, HOST_NAME_BYTES_MAX).as_bytes();
        b[60] = host.len() as u8;
        b[61..61 + host.len()].copy_from_slice(host);
    }

    /// The stamp in `b`, or None where no one holds the device (a label
    /// written on release, or by a version of weir without stamps).
    pub fn decode(b: &[u8]) -> Option<Holder> {
        if b.len() != STAMP_BYTES || b[0] != 1 {
            return None;
        }
        let host_len = (b[60] as usize).min(HOST_NAME_BYTES_MAX);
        Some(Holder {
            machine_id: u128::from_be_bytes(b[4..20].try_into().ok()?),
            boot_id: u128::from_be_bytes(b[20..36].try_into().ok()?),
            pid_namespace: u64::from_be_bytes(b[36..44].try_into().ok()?),
            pid: u32::from_be_bytes(b[44..48].try_into().ok()?),
            interval_ms: u32::from_be_bytes(b[48..52].try_into().ok()?),
            beat: u64::from_be_bytes(b[52..60].try_into().ok()?),
            host: String::from_utf8_lossy(&b[61..61 + host_len]).into_owned(),
        })
    }

    /// Whether `self` and `other` are the same holder (beats aside).
    pub fn same_holder(&self, other: &Holder) -> bool {
        self.machine_id == other.machine_id
            && self.boot_id == other.boot_id
            && self.pid_namespace == other.pid_namespace
            && self.pid == other.pid
    }

    /// Judge this stamp, found on a device, from the process `me`;
    /// `alive` says whether a pid of this pid namespace runs.
    pub fn standing(&self, me: &Holder, alive: impl Fn(u32) -> bool) -> Standing {
        if self.machine_id != me.machine_id {
            return Standing::Held;
        }
        if self.boot_id != me.boot_id {
            return Standing::Gone(format!(
                "it was held by process {} before this machine restarted",
                self.pid
            ));
        }
        if self.pid_namespace != me.pid_namespace {
            return Standing::Held;
        }
        if self.pid == me.pid {
            return Standing::Ours;
        }
        if alive(self.pid) {
            Standing::Held
        } else {
            Standing::Gone(format!("process {}, which held it, has exited", self.pid))
        }
    }

    /// "process 123 on host h": for messages.
    pub fn describe(&self) -> String {
        format!("process {} on host {:?}", self.pid, self.host)
    }

    /// How long a beat must stay put before its holder counts as gone:
    /// two missed beats and a second of slack.
    pub fn silence_needed(&self) -> Duration {
        let interval = Duration::from_millis(u64::from(self.interval_ms).max(1000));
        (interval * 2 + Duration::from_secs(1)).min(Duration::from_secs(120))
    }
}

fn truncate_utf8(text: &str, bytes: usize) -> &str {
    let mut end = text.len().min(bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: u32) -> Holder {
        Holder {
            machine_id: 0xaa,
            boot_id: 0xbb,
            pid_namespace: 4026531836,
            pid,
            interval_ms: 5000,
            beat: 9,
            host: "node-1".into(),
        }
    }

    #[test]
    fn stamps_round_trip_and_an_empty_slot_holds_no_one() {
        let mut b = [0u8; STAMP_BYTES];
        assert_eq!(Holder::decode(&b), None);
        let mut h = holder(42);
        h.host = "é".repeat(40);
        h.encode_into(&mut b);
        let back = Holder::decode(&b).expect("held");
        assert_eq!(back.host, "é".repeat(25), "cut at a character boundary");
        assert_eq!(
            Holder {
                host: h.host.clone(),
                ..back
            },
            h
        );
    }

    #[test]
    fn a_stamp_is_ours_gone_or_held() {
        let me = holder(42);
        let alive = |pid: u32| pid == 7;
        assert_eq!(holder(42).standing(&me, alive), Standing::Ours);
        assert_eq!(holder(7).standing(&me, alive), Standing::Held);
        assert!(
            matches!(holder(8).standing(&me, alive), Standing::Gone(why) if why.contains("8, which held it, has exited"))
        );
        let rebooted = Holder {
            boot_id: 0xbc,
            ..holder(7)
        };
        assert!(
            matches!(rebooted.standing(&me, alive), Standing::Gone(why) if why.contains("restarted"))
        );
        // Another machine, or another pid namespace: a pid says nothing.
        let foreign = Holder {
            machine_id: 0xab,
            ..holder(8)
        };
        assert_eq!(foreign.standing(&me, alive), Standing::Held);
        let contained = Holder {
            pid_namespace: 1,
            ..holder(8)
        };
        assert_eq!(contained.standing(&me, alive), Standing::Held);
    }

    #[test]
    fn silence_covers_two_beats_and_is_bounded() {
        assert_eq!(holder(1).silence_needed(), Duration::from_secs(11));
        let slow = Holder {
            interval_ms: u32::MAX,
            ..holder(1)
        };
        assert_eq!(slow.silence_needed(), Duration::from_secs(120));
    }
}
