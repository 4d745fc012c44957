//! Member health: which copies are read, which are written, and taking a
//! failing member out of service without ever trusting its copy again.
//!
//! A write error faults the member at once: its copy of that block is now
//! stale, and only the generation on the other members' labels keeps an
//! import from trusting it. Read errors are repaired by rewriting the block
//! from another copy; a member whose reads keep failing is faulted too. The
//! last complete copy of a group is never faulted: its errors go to the
//! client instead.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Attached, Group, PoolData, Slot};
use crate::pool::label::Label;
use crate::pool::members::write_labels;

/// Read errors (each a block no rewrite cured, or an I/O that failed)
/// after which a member is faulted.
const READ_ERRORS_TO_FAULT: u64 = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Health {
    /// Holds a complete copy: read and written.
    Online = 0,
    /// Joined by `pool replace`: written, not read until its copy is whole.
    Resilvering = 1,
    /// Out of service (failed, missing, or replaced).
    Faulted = 2,
}

impl Health {
    pub fn name(self) -> &'static str {
        match self {
            Health::Online => "ONLINE",
            Health::Resilvering => "RESILVERING",
            Health::Faulted => "FAULTED",
        }
    }

    fn from_u8(value: u8) -> Health {
        match value {
            0 => Health::Online,
            1 => Health::Resilvering,
            _ => Health::Faulted,
        }
    }
}

impl Slot {
    pub(super) fn health(&self) -> Health {
        Health::from_u8(self.health.load(Ordering::SeqCst))
    }

    pub(super) fn set_health(&self, health: Health) {
        self.health.store(health as u8, Ordering::SeqCst)
    }

    pub(super) fn attached(&self) -> Option<Arc<Attached>> {
        self.attached.read().clone()
    }
}

impl Group {
    fn members_where(&self, keep: impl Fn(Health) -> bool) -> Vec<(usize, Arc<Attached>)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| keep(s.health()))
            .filter_map(|(i, s)| s.attached().map(|a| (i, a)))
            .collect()
    }

    /// Members holding a complete copy: reads come from these.
    pub(super) fn readable(&self) -> Vec<(usize, Arc<Attached>)> {
        self.members_where(|h| h == Health::Online)
    }

    /// Members whose copy of `chunk` is whole: complete copies, and copies
    /// being rebuilt that the resilver has passed.
    pub(super) fn readable_at(&self, chunk: u64) -> Vec<(usize, Arc<Attached>)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| match s.health() {
                Health::Online => true,
                Health::Resilvering => chunk < s.resilvered_chunks.load(Ordering::SeqCst),
                Health::Faulted => false,
            })
            .filter_map(|(i, s)| s.attached().map(|a| (i, a)))
            .collect()
    }

    /// Members that receive writes: complete copies and those being rebuilt.
    pub(super) fn writable(&self) -> Vec<(usize, Arc<Attached>)> {
        self.members_where(|h| h != Health::Faulted)
    }

    /// A member is out of service or still being rebuilt.
    pub(super) fn missing_a_member(&self) -> bool {
        self.slots.iter().any(|s| s.health() != Health::Online)
    }

    pub(super) fn state_name(&self) -> &'static str {
        let online = self
            .slots
            .iter()
            .filter(|s| s.health() == Health::Online)
            .count();
        if online == self.slots.len() {
            "ONLINE"
        } else if online > 0 {
            "DEGRADED"
        } else {
            "UNAVAIL"
        }
    }
}

impl PoolData {
    /// `weir pool clear`: forget the error counts of every member, or of
    /// the one named; the number of members cleared.
    pub fn clear_errors(&self, device: Option<&str>) -> Option<usize> {
        let only = match device {
            Some(name) => Some(self.find_member(name)?),
            None => None,
        };
        let mut cleared = 0;
        for (g, group) in self.groups.iter().enumerate() {
            for (m, slot) in group.slots.iter().enumerate() {
                if only.is_none_or(|place| place == (g, m)) {
                    slot.counters.clear_errors();
                    cleared += 1;
                }
            }
        }
        Some(cleared)
    }

    /// Errors counted on any member since it joined or was cleared.
    pub fn error_count(&self) -> u64 {
        self.groups
            .iter()
            .flat_map(|g| &g.slots)
            .map(|s| s.counters.errors())
            .sum()
    }

    pub fn pool_id(&self) -> u128 {
        self.config.lock().pool_id
    }

    /// Whether a member of the pool is being resilvered.
    pub fn resilvering(&self) -> bool {
        self.groups
            .iter()
            .flat_map(|g| &g.slots)
            .any(|s| s.health() == Health::Resilvering)
    }

    pub fn state_name(&self) -> &'static str {
        let states: Vec<&str> = self.groups.iter().map(Group::state_name).collect();
        if states.iter().all(|s| *s == "ONLINE") {
            "ONLINE"
        } else if states.contains(&"UNAVAIL") {
            "UNAVAIL"
        } else {
            "DEGRADED"
        }
    }

    /// Take a member out of service. False if it holds its group's last
    /// complete copy (then it stays, and its errors reach the client).
    pub(super) fn fault(&self, group: usize, member: usize, why: &str) -> bool {
        let mut config = self.config.lock();
        let slots = &self.groups[group].slots;
        let slot = &slots[member];
        match slot.health() {
            Health::Faulted => return true,
            Health::Online => {
                let others = slots
                    .iter()
                    .enumerate()
                    .any(|(i, s)| i != member && s.health() == Health::Online);
                if !others {
                    tracing::error!(
                        pool = self.name,
                        group,
                        member,
                        "not faulting the last complete copy of its group: {why}"
                    );
                    return false;
                }
            }
            Health::Resilvering => {}
        }
        slot.set_health(Health::Faulted);
        config.generation += 1;
        tracing::error!(
            pool = self.name,
            group,
            member,
            device = slot.spec.read().as_str(),
            generation = config.generation,
            "member FAULTED: {why}"
        );
        if let Err(err) = self.write_member_labels(&config) {
            tracing::error!(pool = self.name, error = %err, "cannot record the fault in the other members' labels");
        }
        true
    }

    /// Count a write error on a member; true if it is now out of service.
    /// A member out of space is not failing: it stays, and the error goes
    /// to the client as ENOSPC.
    pub(super) fn note_write_error(&self, group: usize, member: usize, err: &io::Error) -> bool {
        let slot = &self.groups[group].slots[member];
        slot.counters.write_errors.fetch_add(1, Ordering::Relaxed);
        if is_out_of_space(err) {
            tracing::warn!(
                pool = self.name,
                group,
                member,
                device = slot.spec.read().as_str(),
                "member out of space: {err}"
            );
            return false;
        }
        self.fault(group, member, &format!("write error: {err}"))
    }

    pub(super) fn note_read_error(&self, group: usize, member: usize, err: &io::Error) {
        let slot = &self.groups[group].slots[member];
        let errors = slot.counters.read_errors.fetch_add(1, Ordering::Relaxed) + 1;
        if errors >= READ_ERRORS_TO_FAULT && slot.health() != Health::Faulted {
            self.fault(
                group,
                member,
                &format!("{errors} read errors, the last: {err}"),
            );
        }
    }

    /// Settle a write that went to several members of one group: failed
    /// members are faulted, and the write stands if a copy took it and
    /// every member that failed is out of service.
    pub(super) fn settle_writes(
        &self,
        group: usize,
        results: Vec<(usize, io::Result<()>)>,
        what: &str,
    ) -> io::Result<()> {
        let written = results.iter().any(|(_, r)| r.is_ok());
        let mut failure = None;
        for (member, result) in results {
            let Err(err) = result else { continue };
            // All copies failing is the device path's trouble, not one member's.
            if !written || !self.note_write_error(group, member, &err) {
                failure.get_or_insert_with(|| match err.raw_os_error() {
                    // The errno is what the client is told: keep it.
                    Some(errno) if is_out_of_space(&err) => io::Error::from_raw_os_error(errno),
                    _ => io::Error::new(err.kind(), format!("{what}: {err}")),
                });
            }
        }
        match failure {
            Some(err) => Err(err),
            None if written => Ok(()),
            None => Err(io::Error::other(format!("{what}: no member to write to"))),
        }
    }

    /// Write every in-service member's labels from `config` (both copies).
    pub(super) fn write_member_labels(&self, config: &Label) -> io::Result<()> {
        self.rewrite_member_labels(config)?;
        self.note_generation(config.generation);
        Ok(())
    }

    /// `write_member_labels` for a configuration already recorded: the
    /// stamp changes, the generation does not.
    pub(super) fn rewrite_member_labels(&self, config: &Label) -> io::Result<()> {
        let stamp = self.stamp();
        let mut failure = None;
        for (g, group) in self.groups.iter().enumerate() {
            for (m, slot) in group.slots.iter().enumerate() {
                let health = slot.health();
                let Some(attached) = slot.attached().filter(|_| health != Health::Faulted) else {
                    continue;
                };
                let label = member_label(config, g, m, attached.device(), health);
                if let Err(err) = write_labels(attached.device(), &label, stamp.as_ref(), &[0, 1]) {
                    failure.get_or_insert(err);
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

/// The label member `m` of group `g` carries under `config`.
pub(super) fn member_label(
    config: &Label,
    g: usize,
    m: usize,
    device: &dyn crate::device::Device,
    health: Health,
) -> Label {
    Label {
        device_id: config.layout.groups[g][m],
        device_bytes: device.info().size_bytes,
        resilvering: health == Health::Resilvering,
        ..config.clone()
    }
}

/// ENOSPC and its kin: the device is fine, its file system is full.
pub(super) fn is_out_of_space(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)
    )
}
