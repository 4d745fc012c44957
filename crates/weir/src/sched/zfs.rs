//! The OpenZFS vdev queue's choice of class, as it stands after PR 11166
//! (module/zfs/vdev_queue.c), with its default tunables: per-class minimum
//! and maximum active I/Os, a device-wide maximum, round-robin over classes
//! below their minimum, and the non-interactive credit that lets scrub and
//! resilver in while interactive I/O is active. Written from the behaviour
//! described there; the peer weir's adaptive mode is measured against.

use super::{ClassActivity, IoClass, CLASSES};

/// zfs_vdev_max_active
const MAX_ACTIVE: u32 = 1000;
/// zfs_vdev_nia_credit, zfs_vdev_nia_delay
const NIA_CREDIT: i32 = 5;
const NIA_DELAY: i32 = 5;
/// zfs_dirty_data_max (its cap) and the async-write ramp between
/// zfs_vdev_async_write_active_min_dirty_percent (30) and _max_ (60). The
/// queue knows no dirty data of its own, so queued async-write bytes stand
/// in for it.
const DIRTY_MAX_BYTES: u64 = 4 << 30;
const DIRTY_MIN_PERCENT: u64 = 30;
const DIRTY_MAX_PERCENT: u64 = 60;

/// OpenZFS's priority order, which its round-robin and scans follow.
const ORDER: [IoClass; CLASSES] = [
    IoClass::SyncRead,
    IoClass::SyncWrite,
    IoClass::AsyncRead,
    IoClass::AsyncWrite,
    IoClass::Scrub,
    IoClass::Trim,
    IoClass::Resilver,
];

/// (min, max) active per class: zfs_vdev_*_min_active / _max_active.
/// Resilver uses the rebuild numbers.
fn limits(class: IoClass) -> (u32, u32) {
    match class {
        IoClass::SyncRead | IoClass::SyncWrite => (10, 10),
        IoClass::AsyncRead => (1, 3),
        IoClass::AsyncWrite => (2, 10),
        IoClass::Scrub | IoClass::Resilver => (1, 3),
        IoClass::Trim => (1, 2),
    }
}

#[derive(Debug, Default)]
pub struct Zfs {
    /// Interactive I/Os active (vq_ia_active).
    ia_active: u32,
    /// Non-interactive credit (vq_nia_credit); it may go below zero.
    nia_credit: i32,
    /// Index into ORDER of the class last chosen (vq_last_prio).
    last: usize,
}

impl Zfs {
    fn min_active(&self, class: IoClass) -> u32 {
        let (min, _) = limits(class);
        if class.is_interactive() || self.ia_active == 0 {
            min
        } else {
            self.nia_credit.min(min as i32).max(0) as u32
        }
    }

    fn max_active(&self, class: IoClass, async_write_bytes: u64) -> u32 {
        let (min, max) = limits(class);
        if class == IoClass::AsyncWrite {
            let low = DIRTY_MAX_BYTES * DIRTY_MIN_PERCENT / 100;
            let high = DIRTY_MAX_BYTES * DIRTY_MAX_PERCENT / 100;
            return if async_write_bytes < low {
                min
            } else if async_write_bytes > high {
                max
            } else {
                ((async_write_bytes - low) * u64::from(max - min) / (high - low)) as u32 + min
            };
        }
        if class.is_interactive() {
            max
        } else if self.ia_active > 0 {
            self.nia_credit.min(min as i32).max(0) as u32
        } else if self.nia_credit < NIA_DELAY {
            min.max(1)
        } else {
            max
        }
    }

    /// vdev_queue_class_to_issue
    pub fn class_to_issue(
        &mut self,
        queued: &[ClassActivity; CLASSES],
        async_write_bytes: u64,
    ) -> Option<IoClass> {
        let active = |class: IoClass| queued[class as usize].active;
        if queued.iter().map(|c| c.active).sum::<u32>() >= MAX_ACTIVE {
            return None;
        }
        for n in 0..CLASSES {
            let index = (self.last + n + 1) % CLASSES;
            let class = ORDER[index];
            if queued[class as usize].queued > 0 && active(class) < self.min_active(class) {
                self.last = index;
                return Some(class);
            }
        }
        for (index, &class) in ORDER.iter().enumerate() {
            if queued[class as usize].queued > 0
                && active(class) < self.max_active(class, async_write_bytes)
            {
                self.last = index;
                return Some(class);
            }
        }
        None
    }

    /// vdev_queue_pending_add
    pub fn issued(&mut self, class: IoClass) {
        if class.is_interactive() {
            self.ia_active += 1;
            if self.ia_active == 1 {
                self.nia_credit = 1;
            }
        } else if self.ia_active > 0 {
            self.nia_credit -= 1;
        }
    }

    /// vdev_queue_pending_remove
    pub fn completed(&mut self, class: IoClass) {
        if class.is_interactive() {
            self.ia_active -= 1;
            self.nia_credit = if self.ia_active == 0 { 0 } else { NIA_CREDIT };
        } else if self.ia_active == 0 {
            self.nia_credit += 1;
        }
    }
}
