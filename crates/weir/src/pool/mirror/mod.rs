//! Serving volumes from a pool: mirrored writes, checksummed reads that heal
//! a bad copy from a good one, the dirty-region log that makes a crash
//! recoverable (docs/on-disk.md), and members that fail and are replaced.
//!
//! ```text
//!  PoolVolume (a Store, volume.rs) ──> PoolData: groups striped by 1 MiB chunk
//!     write.rs:    lock blocks ─> log bits durable (new regions, log_commit.rs)
//!                  ─> data to every writable member ─> checksums in memory
//!                  (persisted at FLUSH / FUA, flush_queue.rs)
//!     read.rs:     lock blocks shared ─> select.rs picks a copy (ONLINE, or
//!                  resilvered past the chunk) ─> verify every 4 KiB block ─> a
//!                  bad block comes from another copy and is rewritten; an EIO
//!                  is narrowed by halving; no good copy: EIO
//!     metadata.rs: checksum pages, log bits, flush; recovery at open
//!     health.rs:   per-member state and error counters; a write error faults
//!                  the member (labels of the others move to a new generation)
//!     repair.rs:   scrub one chunk; replace a member and resilver onto it
//!     offline.rs:  a member the operator takes out of service and back
//!     labels.rs:   members' labels re-read while serving
//!     heartbeat.rs: this process's stamp in the labels, beaten while open
//!     status.rs:   `pool status` and /metrics, live
//! ```
//!
//! Every device I/O goes through the member's `sched::DeviceQueue` tagged
//! with its class. Requests are submitted from the caller's thread and
//! continue in their completions; only steps that block (a flush, settling
//! a failed write, healing a read) run on the pool's worker threads.

mod flush_queue;
mod health;
mod heartbeat;
mod io_ops;
mod labels;
mod log_commit;
mod metadata;
mod offline;
mod read;
mod repair;
pub mod select;
mod status;
mod volume;
mod volume_tables;
mod write;

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod tests;

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::geometry::{DeviceRegions, Stripe, CHECKSUM_ENTRY_BYTES, CHUNK_BYTES, DATA_BLOCK_BYTES};
use super::import::{Imported, MemberState};
use super::integrity::{BlockSum, DirtyLog};
use super::label::Label;
use crate::device::workers::Workers;
use crate::device::Device;
use crate::range_lock::ShardedRangeLocks;
use crate::sched::{DeviceQueue, Mode};
use select::{MirrorSelector, ReadPolicy};

pub use health::Health;
pub use repair::{CopyScrub, ScrubResult};
pub use volume::PoolVolume;

/// Most threads a pool runs for steps that block (see `workers`).
const WORKER_THREADS: usize = 64;
/// Tables of the pool's block locks: one per chunk, modulo this, so that
/// requests to different chunks rarely share one.
const LOCK_SHARDS: usize = 64;
const PAGE_BYTES: u64 = 4096;
/// Checksum entries per 4 KiB page of the checksum region.
const SUMS_PER_PAGE: u64 = PAGE_BYTES / CHECKSUM_ENTRY_BYTES;
const BLOCKS_PER_CHUNK: u64 = CHUNK_BYTES / DATA_BLOCK_BYTES;

/// A member's device, opened, with where its regions are.
struct Attached {
    queue: DeviceQueue,
    regions: DeviceRegions,
}

impl Attached {
    fn new(device: Arc<dyn Device>, mode: Mode) -> io::Result<Arc<Attached>> {
        let regions = DeviceRegions::plan(device.info().size_bytes)
            .ok_or_else(|| io_err("a member is too small for the pool format".into()))?;
        // Pools created before metadata was reserved get it now; without
        // room, data writes still work until the file system fills.
        if let Err(err) = crate::pool::members::reserve_metadata(device.as_ref()) {
            tracing::warn!(device = device.info().description.as_str(), error = %err, "cannot reserve space for the pool's metadata");
        }
        Ok(Arc::new(Attached {
            queue: DeviceQueue::with_mode(device, mode),
            regions,
        }))
    }

    fn device(&self) -> &dyn Device {
        self.queue.device().as_ref()
    }
}

/// Counters of one member since the pool was opened.
#[derive(Default)]
struct MemberCounters {
    reads: AtomicU64,
    read_errors: AtomicU64,
    write_errors: AtomicU64,
    checksum_errors: AtomicU64,
    /// Blocks of this member rewritten from another copy.
    repaired: AtomicU64,
}

impl MemberCounters {
    /// Forget the errors seen (`weir pool clear`); reads keep counting.
    fn clear_errors(&self) {
        for counter in [
            &self.read_errors,
            &self.write_errors,
            &self.checksum_errors,
            &self.repaired,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
    }

    /// Errors seen since the member joined or was cleared.
    fn errors(&self) -> u64 {
        self.read_errors.load(Ordering::Relaxed)
            + self.write_errors.load(Ordering::Relaxed)
            + self.checksum_errors.load(Ordering::Relaxed)
    }
}

/// One place in a mirror group, and the device (if any) that fills it.
struct Slot {
    /// How the device was named (its registry entry), for status and replace.
    spec: RwLock<String>,
    attached: RwLock<Option<Arc<Attached>>>,
    health: std::sync::atomic::AtomicU8,
    counters: MemberCounters,
    /// While resilvering: chunks below this are copied.
    resilvered_chunks: AtomicU64,
    /// The member returned stale: its resilver copies only the regions the
    /// dirty-region log holds (all it missed), not every chunk.
    resilver_dirty_only: AtomicBool,
    resilver_started: Mutex<Option<std::time::Instant>>,
    /// Taken out of service by `weir pool offline`, until `online`.
    offline: AtomicBool,
}

struct GroupState {
    /// One entry per 4 KiB block of the group's data region.
    sums: Vec<BlockSum>,
    /// Checksum pages changed since they were last written.
    dirty_pages: BTreeSet<u64>,
    log: DirtyLog,
    /// Bumped whenever a region becomes newly dirty.
    log_version: u64,
    /// The `log_version` at which each region set since import became
    /// dirty: a write to it may start once an image at least that recent
    /// is durable, whoever set the bit.
    bit_versions: std::collections::HashMap<u64, u64>,
    /// Per log block: the `log_version` its last durable image included.
    /// A writer whose bits an earlier durable image already carried skips
    /// its own write (group commit for sequential writers).
    log_durable: std::collections::BTreeMap<u64, u64>,
}

struct Group {
    slots: Vec<Slot>,
    /// Which copy serves each client read.
    selector: Mutex<MirrorSelector>,
    state: Mutex<GroupState>,
    /// Held while metadata pages are computed and written, so that an older
    /// image of a page never lands after a newer one.
    metadata_io: Mutex<()>,
    /// Writes of the dirty-region log, one batch at a time.
    log_commits: log_commit::LogCommits,
}

/// One pool, opened: every volume of it shares this.
pub struct PoolData {
    /// This pool, for the log queue's completions (log_commit.rs).
    me: std::sync::Weak<PoolData>,
    name: String,
    groups: Vec<Group>,
    stripe: Stripe,
    /// Blocks held by writes (exclusive), reads, scrub and resilver;
    /// keyed by logical 4 KiB block (`block_keys`, `chunk_keys`).
    locks: ShardedRangeLocks,
    repairs: AtomicU64,
    /// Checksum pages rewritten on a copy where they were damaged.
    metadata_repairs: AtomicU64,
    rotational: bool,
    workers: Workers,
    flushes: flush_queue::FlushQueue,
    /// The pool's label as its current members carry it (per-device fields
    /// aside). Held across fault and replace, which change it.
    config: Mutex<Label>,
    /// Set when the pool closes: background work stops at its next step.
    closing: AtomicBool,
    /// Tests of crash recovery drop the pool as a crash would: no close.
    abandoned: AtomicBool,
    /// The members' queue mode.
    sched: Mutex<Mode>,
    /// The read selectors' clock starts here.
    opened: std::time::Instant,
    /// The data directory whose registry remembers each new generation.
    registry_dir: Mutex<Option<std::path::PathBuf>>,
    /// This process as the holder its members' labels name.
    holder: crate::pool::holder::Holder,
    /// Heartbeats written; the stamp's beat.
    beats: AtomicU64,
    /// Set once a clean close has cleared the stamps.
    released: AtomicBool,
    /// The volumes, as every member's table holds them (volume_tables.rs).
    volume_table: Mutex<crate::pool::volume_table::VolumeTable>,
    /// No member it opened with holds a readable table (volume_tables.rs).
    volume_table_unreadable: AtomicBool,
    /// How the last resilver since the pool opened ended.
    last_resilver: Mutex<Option<repair::ResilverResult>>,
}

fn io_err(what: String) -> io::Error {
    io::Error::other(what)
}

/// The same error again, for each of several waiters; the errno is kept,
/// as it is what a client is told.
fn copy_error(err: &io::Error) -> io::Error {
    match err.raw_os_error() {
        Some(errno) => io::Error::from_raw_os_error(errno),
        None => io::Error::new(err.kind(), err.to_string()),
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl PoolData {
    /// Open a pool whose every group has a complete copy: load checksums and
    /// logs, recover dirty regions. Missing and stale members start FAULTED.
    pub fn open(pool: &Imported) -> io::Result<Arc<PoolData>> {
        Self::open_with_workers(pool, WORKER_THREADS)
    }

    pub(crate) fn open_with_workers(pool: &Imported, workers: usize) -> io::Result<Arc<PoolData>> {
        if pool.state() == "UNAVAIL" {
            return Err(io_err(format!(
                "pool {:?} is UNAVAIL: a mirror group has no complete copy",
                pool.label.pool_name
            )));
        }
        let mut groups = Vec::new();
        let mut chunks_per_group = u64::MAX;
        for (g, devices) in pool.devices.iter().enumerate() {
            let mut slots = Vec::new();
            for (m, device) in devices.iter().enumerate() {
                let (spec, state) = &pool.members[g][m];
                let health = match state {
                    MemberState::Online => Health::Online,
                    MemberState::Resilvering => Health::Resilvering,
                    _ => Health::Faulted,
                };
                let attached = match device {
                    Some(device) if health != Health::Faulted => {
                        match Attached::new(Arc::clone(device), pool.sched) {
                            Ok(attached) => Some(attached),
                            Err(err) => {
                                tracing::error!(pool = pool.label.pool_name.as_str(), group = g, member = m, error = %err, "member FAULTED");
                                None
                            }
                        }
                    }
                    _ => None,
                };
                let health = if attached.is_some() {
                    health
                } else {
                    Health::Faulted
                };
                if let Some(a) = &attached {
                    chunks_per_group = chunks_per_group.min(a.regions.data_chunks());
                }
                slots.push(Slot {
                    spec: RwLock::new(spec.clone().unwrap_or_else(|| {
                        format!("(missing: {:032x})", pool.label.layout.groups[g][m])
                    })),
                    attached: RwLock::new(attached),
                    health: std::sync::atomic::AtomicU8::new(health as u8),
                    counters: MemberCounters::default(),
                    resilvered_chunks: AtomicU64::new(0),
                    resilver_started: Mutex::new(None),
                    resilver_dirty_only: AtomicBool::new(false),
                    offline: AtomicBool::new(false),
                });
            }
            if !slots.iter().any(|s| s.health() == Health::Online) {
                return Err(io_err(format!(
                    "pool {:?} is UNAVAIL: mirror group {g} has no complete copy that opens",
                    pool.label.pool_name
                )));
            }
            groups.push(slots);
        }
        let stripe = Stripe {
            groups: groups.len(),
            chunks_per_group,
        };
        let blocks = (chunks_per_group * BLOCKS_PER_CHUNK) as usize;
        let mut opened = Vec::new();
        for slots in groups {
            let copies = slots.len();
            let mut group = Group {
                slots,
                selector: Mutex::new(MirrorSelector::new(pool.read_policy, copies)),
                state: Mutex::new(GroupState {
                    sums: Vec::new(),
                    dirty_pages: BTreeSet::new(),
                    log: DirtyLog::default(),
                    log_version: 0,
                    bit_versions: Default::default(),
                    log_durable: Default::default(),
                }),
                metadata_io: Mutex::new(()),
                log_commits: Default::default(),
            };
            let loaded = metadata::load_sums(&group.readable(), blocks)?;
            let mut dirty = metadata::load_dirty(&group.readable(), chunks_per_group)?;
            if !loaded.heal_pages.is_empty() {
                tracing::warn!(
                    pool = pool.label.pool_name.as_str(),
                    pages = loaded.heal_pages.len(),
                    "checksum pages damaged or differing on a copy: rewriting them"
                );
            }
            // Blocks without a valid entry anywhere are resolved from their
            // data, as after a crash.
            dirty.extend(loaded.unknown_chunks);
            *group.state.get_mut() = GroupState {
                sums: loaded.sums,
                dirty_pages: loaded.heal_pages,
                log: DirtyLog::from_disk(dirty),
                log_version: 0,
                bit_versions: Default::default(),
                log_durable: Default::default(),
            };
            opened.push(group);
        }
        let rotational = opened
            .iter()
            .flat_map(|g| g.writable())
            .any(|(_, a)| a.device().info().rotational);
        let workers = Workers::start("weir-pool", workers)?;
        let loaded_table = volume_tables::load(&opened);
        let data = Arc::new_cyclic(|me| PoolData {
            me: me.clone(),
            name: pool.label.pool_name.clone(),
            groups: opened,
            stripe,
            locks: ShardedRangeLocks::new(LOCK_SHARDS, BLOCKS_PER_CHUNK),
            repairs: AtomicU64::new(0),
            metadata_repairs: AtomicU64::new(0),
            rotational,
            workers,
            flushes: Default::default(),
            config: Mutex::new(pool.label.clone()),
            closing: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            sched: Mutex::new(pool.sched),
            opened: std::time::Instant::now(),
            registry_dir: Mutex::new(None),
            holder: crate::pool::takeover::this_process(),
            beats: AtomicU64::new(0),
            released: AtomicBool::new(false),
            volume_table: Mutex::new(loaded_table.table),
            volume_table_unreadable: AtomicBool::new(loaded_table.unreadable),
            last_resilver: Mutex::new(None),
        });
        // Sealed before recovery writes anything the absent members miss.
        data.seal_membership()?;
        data.heal_volume_tables(&loaded_table.heal);
        if loaded_table.unreadable {
            tracing::error!(pool = data.name, "{}", data.unreadable_table_text());
        }
        data.hold();
        for index in 0..data.groups.len() {
            data.recover_group(index)?;
        }
        data.rebuild_stale_members(pool);
        Ok(data)
    }

    /// Serving without a member moves the pool to a new generation before
    /// any write, so that the member, should it return, is known to be
    /// behind and is never read or used as a repair source.
    fn seal_membership(&self) -> io::Result<()> {
        let absent = self
            .groups
            .iter()
            .flat_map(|g| &g.slots)
            .any(|s| s.health() == Health::Faulted);
        if !absent {
            return Ok(());
        }
        let mut config = self.config.lock();
        config.generation += 1;
        tracing::warn!(
            pool = self.name,
            generation = config.generation,
            "serving without a member: labels moved to a new generation"
        );
        self.write_member_labels(&config)
    }

    /// A member that returned behind the pool's generation is rebuilt in
    /// place, as a replacement for itself: written from now on, read only
    /// once a resilver (started with the pool's background work) has
    /// copied every region the dirty-region log marks, which holds every
    /// region written while it was away. A resilver cut short by a restart
    /// starts again over every chunk.
    fn rebuild_stale_members(&self, pool: &Imported) {
        for (g, devices) in pool.stale_devices.iter().enumerate() {
            for (m, device) in devices.iter().enumerate() {
                let Some(device) = device else { continue };
                let spec = pool.members[g][m]
                    .0
                    .clone()
                    .unwrap_or_else(|| device.info().description.clone());
                let id = pool.label.layout.groups[g][m];
                tracing::warn!(
                    pool = self.name,
                    group = g,
                    member = m,
                    device = spec.as_str(),
                    "a member returned behind the pool's generation: rebuilding it"
                );
                match self.attach_replacement(g, m, Arc::clone(device), &spec, id) {
                    Ok(()) => self.groups[g].slots[m]
                        .resilver_dirty_only
                        .store(true, Ordering::SeqCst),
                    Err(err) => {
                        tracing::error!(pool = self.name, device = spec.as_str(), error = %err, "cannot rebuild the stale member; it stays FAULTED")
                    }
                }
            }
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// From now on, record every generation the labels move to in the
    /// registry of `data_dir` (the current one at once).
    pub fn record_generations_in(&self, data_dir: &std::path::Path) {
        *self.registry_dir.lock() = Some(data_dir.to_path_buf());
        self.note_generation(self.config.lock().generation);
    }

    fn note_generation(&self, generation: u64) {
        let Some(dir) = self.registry_dir.lock().clone() else {
            return;
        };
        if let Err(err) = crate::pool::registry::record_generation(&dir, &self.name, generation) {
            tracing::warn!(pool = self.name, error = %err, "cannot record the pool's generation");
        }
    }

    /// Blocks rewritten from a good copy since the pool was opened.
    pub fn repairs(&self) -> u64 {
        self.repairs.load(Ordering::Relaxed)
    }

    /// Checksum pages rewritten on a damaged copy since the pool was opened.
    pub fn metadata_repairs(&self) -> u64 {
        self.metadata_repairs.load(Ordering::Relaxed)
    }

    /// Bytes of logical space: every group's data region.
    pub fn logical_bytes(&self) -> u64 {
        self.stripe.logical_bytes()
    }

    /// Bytes the pool's volumes reserve.
    pub fn allocated_bytes(&self) -> u64 {
        let table = self.volume_table.lock();
        table.volumes.iter().map(|v| v.chunks).sum::<u64>() * CHUNK_BYTES
    }

    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// Devices that serve the pool's reads side by side: every copy of
    /// every group.
    pub fn devices(&self) -> u32 {
        self.groups.iter().map(|g| g.slots.len() as u32).sum()
    }

    pub fn chunks_per_group(&self) -> u64 {
        self.stripe.chunks_per_group
    }

    pub fn sched(&self) -> Mode {
        *self.sched.lock()
    }

    /// Switch every member's queue to `mode`, now.
    pub fn set_sched(&self, mode: Mode) {
        *self.sched.lock() = mode;
        for group in &self.groups {
            for (_, member) in group.writable() {
                member.queue.set_mode(mode);
            }
        }
    }

    pub fn read_policy(&self) -> ReadPolicy {
        self.groups[0].selector.lock().policy()
    }

    /// Choose copies for reads by `policy` from now on.
    pub fn set_read_policy(&self, policy: ReadPolicy) {
        for group in &self.groups {
            group.selector.lock().set_policy(policy);
        }
    }

    /// Time since the pool was opened: the read selectors' clock.
    fn clock_ns(&self) -> u64 {
        self.opened.elapsed().as_nanos() as u64
    }

    /// Stop background work (scrub, resilver) at its next step.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Drop `pool` once this is its last reference, waiting at most `wait`
    /// for a request's completion to let go of it, so that the clean close
    /// (flush, clean logs, released labels) runs here and now: not later on
    /// a device's completion thread, which cannot wait on the devices and
    /// could rewrite labels after the pool is opened again. False if it was
    /// still held: it then closes when its last holder lets go.
    pub fn close_when_released(pool: Arc<Self>, wait: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + wait;
        while Arc::strong_count(&pool) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Arc::strong_count(&pool) == 1
    }

    /// Drop the pool as a crash would: nothing flushed, the log left dirty.
    #[cfg(any(test, feature = "fuzzing"))]
    fn crash(self: Arc<Self>) {
        self.closing.store(true, Ordering::SeqCst);
        self.abandoned.store(true, Ordering::SeqCst);
        drop(self);
    }
}

impl Drop for PoolData {
    /// A clean close: flush, then clear the dirty-region log, so that the
    /// next open has nothing to recover.
    fn drop(&mut self) {
        if self.abandoned.load(Ordering::SeqCst) {
            return;
        }
        for index in 0..self.groups.len() {
            if let Err(err) = self.close_group(index) {
                tracing::warn!(pool = self.name, error = %err, "unclean close: the next open recovers");
            }
        }
        self.release();
    }
}
