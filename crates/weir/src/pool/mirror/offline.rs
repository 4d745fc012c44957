//! `weir pool offline` and `online`: an operator takes a member out of
//! service (to move a cable, swap a controller) and brings it back.
//!
//! Offline is a fault the operator asked for: the member gets no I/O, the
//! pool serves DEGRADED, and the labels of the others move to a new
//! generation. While a member is out of service no bit of its group's
//! dirty-region log clears, so the log holds every region written
//! meanwhile; online rebuilds it in place from those regions alone, as a
//! member that returns stale after a restart is. Offline lasts until
//! online or the next restart, which finds the member stale and rebuilds
//! it the same way.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{io_err, Health, PoolData, Slot};

impl PoolData {
    /// Take member (`group`, `member`), ONLINE, out of service.
    pub fn take_offline(&self, group: usize, member: usize) -> io::Result<()> {
        let slot = &self.groups[group].slots[member];
        if slot.health() != Health::Online {
            return Err(io_err(format!(
                "the member is {}; only an ONLINE member can be taken offline",
                slot.health().name()
            )));
        }
        slot.offline.store(true, Ordering::SeqCst);
        if !self.fault(group, member, "taken offline by the operator") {
            slot.offline.store(false, Ordering::SeqCst);
            return Err(io_err(
                "the member holds its group's only complete copy".into(),
            ));
        }
        Ok(())
    }

    /// Bring an offline member back and rebuild, in the background, what
    /// it missed.
    pub fn bring_online(self: &Arc<Self>, group: usize, member: usize) -> io::Result<()> {
        self.rejoin(group, member)?;
        self.spawn_resilver(group, member);
        Ok(())
    }

    /// `bring_online` up to the rebuild, which the caller runs.
    pub(super) fn rejoin(&self, group: usize, member: usize) -> io::Result<()> {
        let slot = &self.groups[group].slots[member];
        if !slot.offline.load(Ordering::SeqCst) {
            return Err(io_err(
                "the member was not taken offline; weir pool replace POOL DEVICE rebuilds it in place"
                    .into(),
            ));
        }
        let device = slot
            .attached()
            .map(|attached| Arc::clone(attached.queue.device()))
            .ok_or_else(|| io_err("the member has no device".into()))?;
        let spec = slot.spec.read().clone();
        let id = self.config.lock().layout.groups[group][member];
        self.attach_replacement(group, member, device, &spec, id)?;
        // Attached whole before it left: the dirty-region log holds all it
        // missed.
        slot.resilver_dirty_only.store(true, Ordering::SeqCst);
        slot.offline.store(false, Ordering::SeqCst);
        Ok(())
    }
}

impl Slot {
    /// Its state as status and metrics show it: OFFLINE for a member the
    /// operator took out of service.
    pub(super) fn state_name(&self) -> &'static str {
        if self.health() == Health::Faulted && self.offline.load(Ordering::SeqCst) {
            "OFFLINE"
        } else {
            self.health().name()
        }
    }
}
