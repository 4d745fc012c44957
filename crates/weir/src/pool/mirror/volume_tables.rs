//! The pool's volume table while the pool is open: held in memory, changed
//! whole, and written durably to every member that takes writes before a
//! change is kept. A member that joins (replace, online, a stale member
//! rebuilt) gets the table before any data, from memory, so that it never
//! copies an older table from a member that missed a change.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::io_ops::{read_at, run_all, run_one, write_op};
use super::{io_err, Attached, Group, Health, PoolData};
use crate::pool::geometry::VOLUME_TABLE_BYTES;
use crate::pool::volume_table::VolumeTable;
use crate::sched::IoClass;

/// The table the pool opens with, as `load` found it.
pub(super) struct Loaded {
    pub table: VolumeTable,
    /// Members taking writes (members being rebuilt too) whose copy is
    /// not the table (damaged, or behind), to be rewritten.
    pub heal: Vec<Arc<Attached>>,
    /// Every complete copy is damaged or unreadable: the table is not
    /// known.
    pub unreadable: bool,
}

/// What one member's table region holds.
enum Found {
    /// Never written.
    Blank,
    /// Unreadable, or not a valid table.
    Damaged,
    Valid(VolumeTable),
}

impl Found {
    fn valid(&self) -> Option<&VolumeTable> {
        match self {
            Found::Valid(table) => Some(table),
            _ => None,
        }
    }
}

/// The newest valid table among the complete copies.
pub(super) fn load(groups: &[Group]) -> Loaded {
    let read = |attached: &Arc<Attached>| {
        let region = attached.regions.volume_table.0;
        match read_at(attached, IoClass::SyncRead, region, VOLUME_TABLE_BYTES) {
            Err(_) => Found::Damaged,
            Ok(buf) if buf.as_slice().iter().all(|b| *b == 0) => Found::Blank,
            Ok(buf) => VolumeTable::decode(buf.as_slice()).map_or(Found::Damaged, Found::Valid),
        }
    };
    // (complete copy, member, what it holds) for every member taking writes.
    let mut copies = Vec::new();
    for group in groups {
        let readable: Vec<usize> = group.readable().into_iter().map(|(m, _)| m).collect();
        for (m, attached) in group.writable() {
            let found = read(&attached);
            copies.push((readable.contains(&m), attached, found));
        }
    }
    let complete = || copies.iter().filter(|(complete, _, _)| *complete);
    let table = VolumeTable::newest(complete().map(|(_, _, found)| found.valid().cloned()));
    let any_valid = complete().any(|(_, _, found)| found.valid().is_some());
    // Every change reaches every complete copy, so a blank complete copy
    // means no table was ever written; only when every complete copy is
    // damaged is the table lost here.
    let any_blank = complete().any(|(_, _, found)| matches!(found, Found::Blank));
    let heal = copies
        .iter()
        .filter(|(_, _, found)| any_valid && found.valid() != Some(&table))
        .map(|(_, attached, _)| Arc::clone(attached))
        .collect();
    Loaded {
        table,
        heal,
        unreadable: !any_valid && !any_blank,
    }
}

impl PoolData {
    /// The volume table as the pool serves it.
    pub fn volume_table(&self) -> VolumeTable {
        self.volume_table.lock().clone()
    }

    /// Change the table: `change` edits a copy, which goes to the next
    /// generation and is written to every member that takes writes. It is
    /// kept once at least one complete copy holds it; a member whose write
    /// fails is faulted, as for data. On an error nothing changes.
    pub fn change_volume_table<T>(
        &self,
        change: impl FnOnce(&mut VolumeTable) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let mut table = self.volume_table.lock();
        if self.volume_table_unreadable.load(Ordering::SeqCst) {
            anyhow::bail!("{}", self.unreadable_table_text());
        }
        let mut next = table.clone();
        let answer = change(&mut next)?;
        next.generation = table.generation + 1;
        if !next.fits() {
            anyhow::bail!(
                "pool {}: the volume table would not fit its region; delete a volume or shorten descriptions",
                self.name
            );
        }
        let bytes = next.encode();
        let mut targets = Vec::new();
        for (g, group) in self.groups.iter().enumerate() {
            for (m, slot) in group.slots.iter().enumerate() {
                if slot.health() == Health::Faulted {
                    continue;
                }
                if let Some(attached) = slot.attached() {
                    targets.push((g, m, slot.health(), attached));
                }
            }
        }
        let ops = targets
            .iter()
            .map(|(_, _, _, attached)| {
                let op = write_op(attached.regions.volume_table.0, &bytes, true);
                (Arc::clone(attached), IoClass::SyncWrite, op)
            })
            .collect();
        let outcomes = run_all(ops);
        let mut complete_copies = 0;
        let mut failure = None;
        for ((g, m, health, _), outcome) in targets.iter().zip(outcomes) {
            match outcome.result {
                Ok(()) if *health == Health::Online => complete_copies += 1,
                Ok(()) => {}
                Err(err) => {
                    self.fault(*g, *m, &format!("cannot write the volume table: {err}"));
                    failure.get_or_insert(err);
                }
            }
        }
        if complete_copies == 0 {
            let why = failure.map_or("no member takes writes".to_string(), |e| e.to_string());
            anyhow::bail!("pool {}: cannot write the volume table: {why}", self.name);
        }
        *table = next;
        Ok(answer)
    }

    /// Rewrite the copies `load` found wrong, from the table in memory.
    pub(super) fn heal_volume_tables(&self, copies: &[Arc<Attached>]) {
        for attached in copies {
            match self.write_volume_table_to(attached) {
                Ok(()) => {
                    self.metadata_repairs.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        pool = self.name,
                        "a member's volume table was damaged or behind: rewritten"
                    );
                }
                Err(err) => {
                    tracing::error!(pool = self.name, error = %err, "cannot rewrite a member's volume table")
                }
            }
        }
    }

    /// A scrub's look at the group's copies of the table: one that is
    /// damaged or differs is rewritten from memory. Held against changes
    /// meanwhile.
    pub(super) fn scrub_volume_tables(&self, group_index: usize) {
        let table = self.volume_table.lock();
        if table.generation == 0 && table.volumes.is_empty()
            || self.volume_table_unreadable.load(Ordering::SeqCst)
        {
            return; // never written, or not known
        }
        if !table.fits() {
            return; // an older format's table, rewritten at its next change
        }
        let expected = table.encode();
        for (member, attached) in self.groups[group_index].readable() {
            let copy = read_at(
                &attached,
                IoClass::Scrub,
                attached.regions.volume_table.0,
                VOLUME_TABLE_BYTES,
            );
            if copy.is_ok_and(|copy| copy.as_slice() == expected.as_slice()) {
                continue;
            }
            let op = write_op(attached.regions.volume_table.0, &expected, true);
            match run_one(&attached, IoClass::Scrub, op).result {
                Ok(()) => {
                    self.metadata_repairs.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        pool = self.name,
                        group = group_index,
                        member,
                        "scrub: volume table copy damaged: rewritten"
                    );
                }
                Err(err) => {
                    drop(table);
                    self.fault(
                        group_index,
                        member,
                        &format!("cannot rewrite the volume table: {err}"),
                    );
                    return;
                }
            }
        }
    }

    /// Why the table cannot change, when no member it opened with holds a
    /// readable copy.
    pub fn unreadable_table_text(&self) -> String {
        format!(
            "pool {}: the volume table is damaged on every member in service, so its volumes are not served and it cannot change; bring back a member that was away (its copy is read at the next start)",
            self.name
        )
    }

    pub fn volume_table_unreadable(&self) -> bool {
        self.volume_table_unreadable.load(Ordering::SeqCst)
    }

    /// Give a joining member the table, before it gets any data. With the
    /// table unknown, the member keeps its own copy.
    pub(super) fn write_volume_table_to(&self, attached: &Arc<Attached>) -> io::Result<()> {
        let table = self.volume_table.lock();
        if self.volume_table_unreadable.load(Ordering::SeqCst) {
            return Ok(());
        }
        if !table.fits() {
            return Err(io_err(
                "the volume table (an older format's) does not fit this format; change a volume first".into(),
            ));
        }
        let op = write_op(attached.regions.volume_table.0, &table.encode(), true);
        run_one(attached, IoClass::Resilver, op)
            .result
            .map_err(|err| io_err(format!("cannot write the volume table: {err}")))
    }
}

/// Zeroing runs this much logical space at a time, so that the blocks it
/// holds stay few.
const ZERO_STEP_BYTES: u64 = 1 << 30;

impl PoolData {
    /// Zero a run of logical space durably (the checksums record zeroes;
    /// no data is written), before a volume takes it: a new volume never
    /// shows what a deleted one held. Waits; call it from a thread that
    /// owns no ring (admin and CLI threads).
    pub fn zero_durably(self: &Arc<Self>, logical: u64, length: u64) -> io::Result<()> {
        let wait = |submit: &dyn Fn(crate::device::Completion)| {
            let (sender, receiver) = std::sync::mpsc::sync_channel(1);
            submit(Box::new(move |outcome| drop(sender.send(outcome.result))));
            receiver
                .recv()
                .unwrap_or_else(|_| Err(io_err("the pool dropped a request".into())))
        };
        let end = logical + length;
        let mut at = logical;
        while at < end {
            let step = ZERO_STEP_BYTES.min(end - at);
            wait(&|done| self.zero_submit(at, step, IoClass::SyncWrite, done))?;
            at += step;
        }
        wait(&|done| self.flush_submit(done))
    }
}
