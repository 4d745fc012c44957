//! A device for deterministic pool tests: sparse pages in memory, a
//! volatile write cache that a simulated power loss drops or tears, and
//! injected faults. Every op completes on the caller's thread, so a test
//! driven by one seeded generator replays exactly. A pool opens the disk
//! through a handle (`SimDisk::handle`) that a power loss cuts: what the
//! crashed pool's threads still send afterwards fails and lands nowhere,
//! as a machine without power writes nothing.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::device::{Completion, Device, DeviceInfo, DeviceOp, Extent, Outcome};
use crate::rng::Rng;

const PAGE: usize = 4096;
pub const SECTOR: usize = 512;

#[derive(Default)]
struct State {
    durable: HashMap<u64, Box<[u8; PAGE]>>,
    /// Writes not yet flushed, oldest first: (offset, bytes).
    volatile: Vec<(u64, Vec<u8>)>,
    /// 4 KiB pages whose reads fail until rewritten.
    bad_pages: BTreeSet<u64>,
    /// The next write inside `[start, end)` lands `delta` bytes away
    /// (forward if that fits, else backward).
    misdirect: Option<(u64, u64, u64)>,
    vanished: bool,
    /// Writes starting in this range wait in `gate` instead of completing.
    hold: Option<(u64, u64)>,
    /// Pages written or reserved: a sparse file's allocation.
    allocated: BTreeSet<u64>,
    /// With a limit, a write that needs more pages lands up to the first
    /// page that does not fit and fails with ENOSPC (a full file system).
    pages_max: Option<usize>,
    /// Power losses so far: a handle opened before the last one is cut.
    power_epoch: u64,
    /// Ops refused because their handle was cut.
    refused_after_power_loss: u64,
}

/// A write held at its disk: the disk, the power epoch of the handle it
/// came through (none if sent to the disk itself), the op, its completion.
type HeldWrite = (Arc<SimDisk>, Option<u64>, DeviceOp, Completion);

/// Writes held back from several disks, completed together when any of
/// them is asked to flush: a write in flight across flushes, made exact.
#[derive(Default)]
pub struct Gate {
    held: Mutex<Vec<HeldWrite>>,
    /// Flushes pass held writes by until this is set.
    armed: std::sync::atomic::AtomicBool,
    /// Runs after the held writes complete and before the flush does.
    after_release: Mutex<Option<Box<dyn Fn() + Send>>>,
}

impl Gate {
    pub fn held(&self) -> usize {
        self.held.lock().len()
    }

    /// The next flush completes the held writes, then runs `hook`.
    pub fn arm(&self, hook: impl Fn() + Send + 'static) {
        *self.after_release.lock() = Some(Box::new(hook));
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Complete whatever is still held, now.
    pub fn open_now(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.release();
    }

    fn release(&self) {
        if !self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let held = std::mem::take(&mut *self.held.lock());
        if held.is_empty() {
            return;
        }
        for (disk, epoch, op, done) in held {
            disk.state.lock().hold = None;
            disk.submit_from(epoch, op, done);
        }
        if let Some(hook) = self.after_release.lock().take() {
            hook();
        }
    }
}

pub struct SimDisk {
    info: DeviceInfo,
    state: Mutex<State>,
    gate: Mutex<Option<(Arc<Gate>, std::sync::Weak<SimDisk>)>>,
}

impl SimDisk {
    pub fn new(name: &str, size_bytes: u64) -> SimDisk {
        SimDisk::of_kind(name, size_bytes, false)
    }

    /// A disk that says it is rotational or flash: the pool's queues and
    /// read selection take other paths for each.
    pub fn of_kind(name: &str, size_bytes: u64, rotational: bool) -> SimDisk {
        SimDisk {
            info: DeviceInfo {
                size_bytes,
                logical_block_bytes: SECTOR as u32,
                rotational,
                description: format!("sim disk {name}"),
            },
            state: Mutex::new(State::default()),
            gate: Mutex::new(None),
        }
    }

    /// A handle for a pool to open the disk by: the next power loss cuts
    /// it, so that nothing the pool sends after it reaches the disk.
    pub fn handle(self: &Arc<Self>) -> Arc<dyn Device> {
        Arc::new(Handle {
            epoch: self.state.lock().power_epoch,
            disk: Arc::clone(self),
        })
    }

    /// Ops from handles cut by a power loss, refused so far.
    pub fn refused_after_power_loss(&self) -> u64 {
        self.state.lock().refused_after_power_loss
    }

    /// Stop holding writes (those held stay held until their gate opens).
    pub fn release_hold(&self) {
        self.state.lock().hold = None;
        *self.gate.lock() = None;
    }

    /// Hold the next writes at or past `offset` in `gate` until a flush
    /// reaches any disk of the gate.
    pub fn hold_writes(self: &Arc<Self>, gate: &Arc<Gate>, offset: u64) {
        self.hold_writes_in(gate, offset, u64::MAX);
    }

    /// As `hold_writes`, for writes starting in `[start, end)` only.
    pub fn hold_writes_in(self: &Arc<Self>, gate: &Arc<Gate>, start: u64, end: u64) {
        self.state.lock().hold = Some((start, end));
        *self.gate.lock() = Some((Arc::clone(gate), Arc::downgrade(self)));
    }

    /// Flip one bit of stored data, silently.
    pub fn flip_bit(&self, offset: u64, bit: u8) {
        let mut state = self.state.lock();
        state.apply_all_volatile();
        let page = state.page_mut(offset / PAGE as u64);
        page[(offset % PAGE as u64) as usize] ^= 1 << (bit % 8);
    }

    /// Reads of the 4 KiB page at `offset` fail until it is rewritten.
    pub fn make_bad(&self, offset: u64) {
        self.state.lock().bad_pages.insert(offset / PAGE as u64);
    }

    /// The next write inside `[start, end)` lands `delta` bytes away.
    pub fn misdirect_next(&self, start: u64, end: u64, delta: u64) {
        self.state.lock().misdirect = Some((start, end, delta));
    }

    /// Cancel a misdirection that has not happened yet.
    pub fn disarm(&self) {
        self.state.lock().misdirect = None;
    }

    /// Whether reads of the 4 KiB page at `offset` fail.
    pub fn is_bad(&self, offset: u64) -> bool {
        self.state
            .lock()
            .bad_pages
            .contains(&(offset / PAGE as u64))
    }

    /// From now on the disk holds at most `pages` allocated pages.
    pub fn fill_at(&self, pages: usize) {
        self.state.lock().pages_max = Some(pages);
    }

    pub fn allocated_pages(&self) -> usize {
        self.state.lock().allocated.len()
    }

    pub fn vanish(&self) {
        self.state.lock().vanished = true;
    }

    /// Power loss: each unflushed write survives whole, is lost, or is
    /// torn (a random subset of its sectors lands).
    pub fn power_loss(&self, rng: &mut Rng) {
        let mut state = self.state.lock();
        state.power_epoch += 1;
        for (offset, bytes) in std::mem::take(&mut state.volatile) {
            match rng.below(3) {
                0 => state.apply(offset, &bytes),
                1 => {}
                _ => {
                    for (i, sector) in bytes.chunks(SECTOR).enumerate() {
                        if rng.below(2) == 0 {
                            state.apply(offset + (i * SECTOR) as u64, sector);
                        }
                    }
                }
            }
        }
    }

    /// The stored bytes (cache included), bypassing faults: for checks.
    pub fn peek(&self, offset: u64, length: usize) -> Vec<u8> {
        let mut out = vec![0u8; length];
        self.state.lock().read_into(offset, &mut out);
        out
    }
}

impl State {
    /// Whether an op through a handle made at power epoch `epoch` (none:
    /// sent to the disk itself) is refused because a power loss has cut
    /// that handle since; a refusal is counted.
    fn refuses(&mut self, epoch: Option<u64>) -> bool {
        let cut = epoch.is_some_and(|epoch| epoch != self.power_epoch);
        self.refused_after_power_loss += u64::from(cut);
        cut
    }

    fn page_mut(&mut self, page: u64) -> &mut [u8; PAGE] {
        self.durable
            .entry(page)
            .or_insert_with(|| Box::new([0u8; PAGE]))
    }

    fn apply(&mut self, offset: u64, bytes: &[u8]) {
        let mut at = 0;
        while at < bytes.len() {
            let pos = offset + at as u64;
            let within = (pos % PAGE as u64) as usize;
            let take = (PAGE - within).min(bytes.len() - at);
            self.page_mut(pos / PAGE as u64)[within..within + take]
                .copy_from_slice(&bytes[at..at + take]);
            at += take;
        }
    }

    fn apply_all_volatile(&mut self) {
        for (offset, bytes) in std::mem::take(&mut self.volatile) {
            self.apply(offset, &bytes);
        }
    }

    fn read_into(&self, offset: u64, out: &mut [u8]) {
        let mut at = 0;
        while at < out.len() {
            let pos = offset + at as u64;
            let within = (pos % PAGE as u64) as usize;
            let take = (PAGE - within).min(out.len() - at);
            match self.durable.get(&(pos / PAGE as u64)) {
                Some(page) => out[at..at + take].copy_from_slice(&page[within..within + take]),
                None => out[at..at + take].fill(0),
            }
            at += take;
        }
        let end = offset + out.len() as u64;
        for (w_offset, bytes) in &self.volatile {
            let w_end = w_offset + bytes.len() as u64;
            let (from, to) = (offset.max(*w_offset), end.min(w_end));
            if from < to {
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&bytes[(from - w_offset) as usize..(to - w_offset) as usize]);
            }
        }
    }

    fn pages(offset: u64, length: u64) -> std::ops::Range<u64> {
        offset / PAGE as u64..(offset + length).div_ceil(PAGE as u64)
    }
}

/// The disk as a pool opens it: cut by the next power loss.
struct Handle {
    disk: Arc<SimDisk>,
    /// The disk's power losses when the handle was made.
    epoch: u64,
}

impl Device for Handle {
    fn info(&self) -> &DeviceInfo {
        &self.disk.info
    }

    fn submit(&self, op: DeviceOp, done: Completion) {
        self.disk.submit_from(Some(self.epoch), op, done);
    }

    fn reserve(&self, offset: u64, length: u64) -> io::Result<()> {
        if self.disk.state.lock().refuses(Some(self.epoch)) {
            return Err(io::Error::from_raw_os_error(libc::ENXIO));
        }
        self.disk.reserve(offset, length)
    }

    fn extents(&self, offset: u64, length: u64, extents_max: usize) -> io::Result<Vec<Extent>> {
        self.disk.extents(offset, length, extents_max)
    }
}

impl SimDisk {
    /// Serve `op`, sent through a handle made at power epoch `epoch` (or
    /// straight to the disk, by the test itself, with none).
    fn submit_from(&self, epoch: Option<u64>, op: DeviceOp, done: Completion) {
        op.assert_valid(&self.info);
        let gate = self.gate.lock().clone();
        if let Some((gate, me)) = gate {
            let held = matches!(op, DeviceOp::Write { offset, .. }
                if self.state.lock().hold.is_some_and(|(start, end)| (start..end).contains(&offset)));
            if held {
                let me = me.upgrade().expect("a disk outlives its ops");
                gate.held.lock().push((me, epoch, op, done));
                return;
            }
            if matches!(op, DeviceOp::Flush) {
                gate.release();
            }
        }
        let mut state = self.state.lock();
        let cut = state.refuses(epoch);
        let outcome = if state.vanished || cut {
            Outcome::done(Err(io::Error::from_raw_os_error(libc::ENXIO)))
        } else {
            match op {
                DeviceOp::Read { offset, mut buf } => {
                    let length = buf.len() as u64;
                    if State::pages(offset, length).any(|p| state.bad_pages.contains(&p)) {
                        Outcome::done(Err(io::Error::from_raw_os_error(libc::EIO)))
                    } else {
                        state.read_into(offset, buf.as_mut_slice());
                        Outcome {
                            result: Ok(()),
                            buf: Some(buf),
                            hole: false,
                        }
                    }
                }
                DeviceOp::Write {
                    offset,
                    buf,
                    durable,
                } => {
                    let length = buf.len() as u64;
                    let landing = match state.misdirect {
                        Some((start, end, delta)) if offset >= start && offset + length <= end => {
                            state.misdirect = None;
                            if offset + delta + length <= end {
                                offset + delta
                            } else if offset >= start + delta {
                                offset - delta
                            } else {
                                offset
                            }
                        }
                        _ => offset,
                    };
                    // The pages that fit, in order; the rest fail for space.
                    let mut fits = 0;
                    for page in State::pages(landing, length) {
                        let room = state
                            .pages_max
                            .is_none_or(|max| state.allocated.len() < max);
                        if !state.allocated.contains(&page) && !room {
                            break;
                        }
                        state.allocated.insert(page);
                        state.bad_pages.remove(&page);
                        fits = (page + 1) * PAGE as u64 - landing;
                    }
                    let bytes = &buf.as_slice()[..(fits.min(length)) as usize];
                    if durable {
                        // Stronger than FUA needs, and still legal.
                        state.apply_all_volatile();
                        state.apply(landing, bytes);
                    } else {
                        state.volatile.push((landing, bytes.to_vec()));
                    }
                    let result = if (bytes.len() as u64) < length {
                        Err(io::Error::from_raw_os_error(libc::ENOSPC))
                    } else {
                        Ok(())
                    };
                    Outcome {
                        result,
                        buf: None,
                        hole: false,
                    }
                }
                DeviceOp::Flush => {
                    state.apply_all_volatile();
                    Outcome::done(Ok(()))
                }
                DeviceOp::Discard { .. } | DeviceOp::WriteZeroes { .. } => {
                    Outcome::done(Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)))
                }
            }
        };
        drop(state);
        done(outcome)
    }
}

impl Device for SimDisk {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&self, op: DeviceOp, done: Completion) {
        self.submit_from(None, op, done);
    }

    fn reserve(&self, offset: u64, length: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        for page in State::pages(offset, length) {
            let room = state
                .pages_max
                .is_none_or(|max| state.allocated.len() < max);
            if !state.allocated.contains(&page) && !room {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            state.allocated.insert(page);
        }
        Ok(())
    }

    fn extents(&self, _offset: u64, length: u64, _extents_max: usize) -> io::Result<Vec<Extent>> {
        Ok(vec![Extent {
            length,
            hole: false,
        }])
    }
}
