//! A store with a write-back cache in front: the glue between the
//! sans-IO [`DirtyMap`] and the store beneath it.

use std::cell::RefCell;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use super::busy::BusyClock;
use super::dirty_map::{spans_cover, Bytes, DirtyMap, Ready, Span, Writeback};
use super::flusher::{Flusher, TickStats, Ticked};
use super::waiting::{Entry, Waiter};
use super::{Admission, Charge};
use crate::device::{AlignedBuf, Completion, DeviceOp, Extent, Outcome, WriteBuf};
use crate::metrics::CacheReport;
use crate::pool::{Store, StoreInfo};
use crate::sched::IoClass;

/// Bytes being written back per volume at once, at most. The device queue
/// decides how much of it reaches the device beside client reads; this
/// only bounds the memory copied out: sixteen full runs.
const WRITEBACK_BYTES_MAX: u64 = 16 * RUN_BYTES_MAX;
/// Writebacks in flight per volume. Each is a write to every mirror copy;
/// at this many, the writebacks a connection thread starts fit in its own
/// io_uring (240 ops) instead of spilling onto the device's ring thread,
/// which then carries every later one alone. Deep enough to keep a flash
/// device busy with scattered 4 KiB pieces.
pub const WRITEBACK_RUNS_MAX: usize = 64;
/// Writeback in flight is at most this share of the dirty budget.
const WRITEBACK_BUDGET_SHARE: u64 = 8;

/// Writeback bytes in flight at once per volume under a budget of
/// `limit_bytes`. A run joined from several writes is a copy, charged to
/// the budget; the bytes in flight are also held to a share of it, so
/// that writeback never holds most of the budget and memory stays
/// proportional to the budget the operator set.
pub fn writeback_bytes_max(limit_bytes: u64) -> u64 {
    (limit_bytes / WRITEBACK_BUDGET_SHARE).clamp(RUN_BYTES_MAX, WRITEBACK_BYTES_MAX)
}

/// Adjacent dirty pieces are joined into writes of up to this size: large
/// enough to stream on every device, small enough not to hold a reader
/// behind one write for long.
pub const RUN_BYTES_MAX: u64 = 1 << 20;

/// A cached write's buffer, charged to the budget while it lives.
struct CacheBytes {
    buf: WriteBuf,
    _charge: Held,
}

/// Bytes charged to the server's budget and counted as the volume's own
/// while they live: who holds the budget decides who waits for room.
struct Held {
    _budget: Charge,
    volume: Arc<AtomicU64>,
    bytes: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.volume.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl Bytes for CacheBytes {
    fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }

    fn write_buf(&self) -> Option<WriteBuf> {
        Some(self.buf.clone())
    }
}

/// A run that is one cached write's bytes, shared rather than copied.
fn shared_run(spans: &[Span], start: u64, end: u64) -> Option<WriteBuf> {
    let [span] = spans else { return None };
    if (span.start, span.end) != (start, end) {
        return None;
    }
    let buf = span.data.write_buf()?;
    Some(buf.slice(span.data_at, (end - start) as usize))
}

/// An op that goes to the store itself, in order with the cached data.
struct Direct {
    class: IoClass,
    op: DeviceOp,
    done: Completion,
}

type Map = DirtyMap<Completion, Direct>;

/// A client write waiting for room in the budget, unanswered.
struct Waiting {
    store: std::sync::Weak<CachedStore>,
    /// The bytes its volume holds in the budget.
    held: Arc<AtomicU64>,
    offset: u64,
    buf: WriteBuf,
    done: Completion,
}

impl Waiter for Waiting {
    fn bytes(&self) -> u64 {
        self.buf.len() as u64
    }

    fn volume(&self) -> usize {
        self.store.as_ptr() as usize
    }

    fn volume_holds(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    fn enter(self: Box<Self>, entry: Entry) {
        let Waiting {
            store,
            held: _,
            offset,
            buf,
            done,
        } = *self;
        let Some(store) = store.upgrade() else {
            return done(failed_outcome());
        };
        match entry {
            Entry::Fail => done(failed_outcome()),
            _ if store.failed() => done(failed_outcome()),
            Entry::Through => store.write_through(offset, buf, done),
            Entry::Cache => store.cache_write(offset, buf, done, false),
        }
    }
}

pub struct CachedStore {
    inner: Arc<dyn Store>,
    map: Mutex<Map>,
    flusher: Arc<Flusher>,
    /// Bytes written to the store for the cache: write-back, and writes
    /// that went through, larger than the budget.
    written_bytes: AtomicU64,
    /// Bytes of the budget this volume's cached writes and write-back
    /// copies hold.
    held_bytes: Arc<AtomicU64>,
    /// A client wrote since the last tick.
    wrote: AtomicBool,
    /// When writes counted in `written_bytes` were in flight, since `born`.
    busy: Mutex<BusyClock>,
    born: Instant,
    me: std::sync::Weak<CachedStore>,
}

fn failed_outcome() -> Outcome {
    Outcome::done(Err(io::Error::from_raw_os_error(libc::EIO)))
}

impl CachedStore {
    pub fn new(inner: Arc<dyn Store>, flusher: &Arc<Flusher>) -> Arc<CachedStore> {
        let store = Arc::new_cyclic(|me| CachedStore {
            inner,
            map: Mutex::new(DirtyMap::default()),
            flusher: Arc::clone(flusher),
            written_bytes: AtomicU64::new(0),
            held_bytes: Arc::default(),
            wrote: AtomicBool::new(false),
            busy: Mutex::new(BusyClock::default()),
            born: Instant::now(),
            me: me.clone(),
        });
        let weak: std::sync::Weak<CachedStore> = Arc::downgrade(&store);
        flusher.register(weak);
        store
    }

    fn map(&self) -> MutexGuard<'_, Map> {
        self.map.lock()
    }

    /// Cached bytes not yet in the store.
    pub fn dirty_bytes(&self) -> u64 {
        self.map().dirty_bytes()
    }

    /// A write-back failed: flushes fail from then on.
    pub fn failed(&self) -> bool {
        self.map().failed()
    }

    /// Write everything back and flush the store; for shutdown. Writes
    /// still waiting for room go through first, so the flush covers them.
    pub fn write_back_all(&self) -> io::Result<()> {
        self.flusher
            .waiting()
            .release_volume(self.volume_id(), Entry::Through);
        let (tx, rx) = mpsc::channel();
        self.flush(Box::new(move |outcome| {
            let _ = tx.send(outcome.result);
        }));
        rx.recv()
            .unwrap_or_else(|_| Err(io::Error::other("flush dropped")))
    }

    fn read(&self, class: IoClass, offset: u64, buf: AlignedBuf, done: Completion) {
        let end = offset + buf.len() as u64;
        let spans = self.map().spans(offset, end);
        if spans_cover(&spans, offset, end) {
            let mut buf = buf;
            overlay(&spans, buf.as_mut_slice(), offset);
            return done(Outcome {
                result: Ok(()),
                buf: Some(buf),
                hole: false,
            });
        }
        let op = DeviceOp::Read { offset, buf };
        if spans.is_empty() {
            return self.inner.submit(class, op, done);
        }
        // Pieces written back while the read is in flight were copied
        // into `spans` first, so the read sees them either way.
        self.inner.submit(
            class,
            op,
            Box::new(move |mut outcome| {
                if outcome.result.is_ok() {
                    if let Some(buf) = outcome.buf.as_mut() {
                        if outcome.hole {
                            buf.as_mut_slice().fill(0);
                        }
                        overlay(&spans, buf.as_mut_slice(), offset);
                        outcome.hole = false;
                    }
                }
                done(outcome)
            }),
        );
    }

    fn write(&self, offset: u64, buf: WriteBuf, done: Completion) {
        if !self.wrote.load(Ordering::Relaxed) {
            self.wrote.store(true, Ordering::Relaxed);
        }
        let volume = self.volume_id();
        match self.flusher.budget().admit_for(buf.len() as u64, volume) {
            Admission::Cache => self.cache_write(offset, buf, done, true),
            Admission::Wait => self.flusher.waiting().wait(Box::new(Waiting {
                store: self.me.clone(),
                held: Arc::clone(&self.held_bytes),
                offset,
                buf,
                done,
            })),
            Admission::Through => self.write_through(offset, buf, done),
        }
    }

    /// A write larger than the limit goes through: it is paced by the
    /// devices and holds no more memory than the request did. It is
    /// write-back that could not be deferred, so it goes in write-back's
    /// class, where the device queue holds it back from readers as it
    /// does the rest.
    fn write_through(&self, offset: u64, buf: WriteBuf, done: Completion) {
        let op = DeviceOp::Write {
            offset,
            buf,
            durable: false,
        };
        self.direct(IoClass::AsyncWrite, op, done);
    }

    /// Copy a write into the map and answer it: after the budget's pause
    /// if `paced`, else at once (a write that waited for room has been
    /// paced by the wait).
    fn cache_write(&self, offset: u64, buf: WriteBuf, done: Completion, paced: bool) {
        let length = buf.len() as u64;
        let budget = Arc::clone(self.flusher.budget());
        let bytes = Arc::new(CacheBytes {
            buf,
            _charge: self.charge(length),
        });
        let mut map = self.map();
        if map.failed() {
            drop(map);
            return done(failed_outcome());
        }
        map.write(offset, bytes);
        self.pump_locked(map);
        let pause = if paced {
            budget.pause(length)
        } else {
            Duration::ZERO
        };
        if pause.is_zero() {
            done(Outcome::done(Ok(())));
        } else {
            self.flusher
                .after(pause, Box::new(move || done(Outcome::done(Ok(())))));
        }
    }

    /// Let in the waiting writes that fit now, this volume's and every
    /// other's (the budget is shared), in the order `waiting` keeps; if
    /// write-back to this volume has failed, fail its own (the room they
    /// wait for may never come).
    fn admit_waiting(&self) {
        let waiting = self.flusher.waiting();
        if self.flusher.budget().waiting() == 0 {
            return;
        }
        if self.failed() {
            waiting.release_volume(self.volume_id(), Entry::Fail);
        }
        waiting.admit();
    }

    /// Charge `bytes` to the budget, as this volume's.
    fn charge(&self, bytes: u64) -> Held {
        self.held_bytes.fetch_add(bytes, Ordering::Relaxed);
        Held {
            _budget: self.flusher.budget().charge(bytes),
            volume: Arc::clone(&self.held_bytes),
            bytes,
        }
    }

    /// This cache's place in the server's queue of waiting writes.
    fn volume_id(&self) -> usize {
        self as *const CachedStore as usize
    }

    fn busy_start(&self) {
        self.busy.lock().start(self.born.elapsed());
    }

    fn busy_end(&self) {
        self.busy.lock().end(self.born.elapsed());
    }

    fn direct(&self, class: IoClass, op: DeviceOp, done: Completion) {
        let (start, length) = op.range();
        let mut map = self.map();
        if map.failed() {
            drop(map);
            return done(failed_outcome());
        }
        let urgent = class != IoClass::AsyncWrite;
        map.direct(start, start + length, urgent, Direct { class, op, done });
        self.pump_locked(map);
    }

    fn flush(&self, done: Completion) {
        let mut map = self.map();
        if map.failed() {
            drop(map);
            tracing::debug!("flush refused: an earlier write-back to this volume failed");
            return done(failed_outcome());
        }
        map.flush(done);
        self.pump_locked(map);
    }

    /// Start what may start, on the calling thread: the checksums and
    /// copies of the writebacks it starts are paid by whichever thread
    /// wrote, completed or ticked, so writeback spreads over the threads
    /// that make it instead of queueing behind one. Choices are made under
    /// the map's lock, so threads pumping at once start disjoint work. A
    /// completion that arrives inline while this thread pumps the same
    /// store does not recurse: the outer call runs once more.
    fn pump(&self) {
        self.pump_from(None);
    }

    /// [`pump`](Self::pump) with the map already locked by the caller,
    /// which has just changed it: the lock every request takes is taken
    /// once, not twice.
    fn pump_locked(&self, map: MutexGuard<'_, Map>) {
        self.pump_from(Some(map));
    }

    fn pump_from(&self, mut map: Option<MutexGuard<'_, Map>>) {
        let Some(_guard) = PumpGuard::enter(self) else {
            return;
        };
        loop {
            self.pump_once(map.take());
            // Writebacks that finished made room for writes waiting for it.
            self.admit_waiting();
            if !PumpGuard::again(self) {
                return;
            }
        }
    }

    fn writeback_bytes_max(&self) -> u64 {
        writeback_bytes_max(self.flusher.budget().limit_bytes())
    }

    fn pump_once(&self, map: Option<MutexGuard<'_, Map>>) {
        let pressure = self.flusher.budget().under_pressure();
        let (writebacks, ready) = {
            let mut map = map.unwrap_or_else(|| self.map());
            let room = self
                .writeback_bytes_max()
                .saturating_sub(map.writeback_bytes_in_flight());
            let runs = WRITEBACK_RUNS_MAX.saturating_sub(map.writebacks_in_flight());
            let writebacks = map.next_writebacks(runs, room, RUN_BYTES_MAX, pressure);
            (writebacks, map.ready())
        };
        let Ready { flushes, directs } = ready;
        for writeback in writebacks {
            self.submit_writeback(writeback);
        }
        for done in flushes {
            self.inner.submit(IoClass::SyncWrite, DeviceOp::Flush, done);
        }
        for (id, direct) in directs {
            let me = self.me.upgrade().expect("a cache pumps while it lives");
            // Writes larger than the budget count in the rate the budget is
            // sized by: they are write-back the devices took, and counting
            // only the cached part would read a device kept busy by them as
            // slow.
            let stored = match &direct.op {
                DeviceOp::Write { buf, .. } => buf.len() as u64,
                _ => 0,
            };
            if stored > 0 {
                self.busy_start();
            }
            self.inner.submit(
                direct.class,
                direct.op,
                Box::new(move |outcome| {
                    if stored > 0 {
                        me.busy_end();
                    }
                    if outcome.result.is_ok() {
                        me.written_bytes.fetch_add(stored, Ordering::Relaxed);
                    }
                    me.map().direct_done(id);
                    (direct.done)(outcome);
                    me.pump();
                }),
            );
        }
    }

    fn submit_writeback(&self, writeback: Writeback) {
        let Writeback {
            id,
            start,
            end,
            spans,
            urgent,
        } = writeback;
        let length = end - start;
        // A run of several writes is joined into one buffer, charged to
        // the budget while it lives; a run of one write's bytes shares them.
        let (buf, charge) = match shared_run(&spans, start, end) {
            Some(buf) => (buf, None),
            None => {
                let mut buf = AlignedBuf::new(length as usize);
                overlay(&spans, buf.as_mut_slice(), start);
                (buf.into(), Some(self.charge(length)))
            }
        };
        drop(spans);
        // A flush or a direct op waits on this one: a client is waiting.
        let class = if urgent {
            IoClass::SyncWrite
        } else {
            IoClass::AsyncWrite
        };
        let me = self.me.upgrade().expect("a cache pumps while it lives");
        let op = DeviceOp::Write {
            offset: start,
            buf,
            durable: false,
        };
        self.busy_start();
        // Writeback no client waits on is reaped by the device threads, not
        // by the thread that pumped: a connection thread with ops on its own
        // ring sleeps on that ring instead of polling its socket, and its
        // client's next request waits for the wake-up. Writeback a client
        // does wait on stays on this thread's ring: for a flush, and while
        // writers are paced, where its completions make the room their
        // replies come from (from a device thread, each reply would cost its
        // connection a wake-up instead).
        let background = !urgent && !self.flusher.budget().pacing();
        let submit = |op, done| {
            if background {
                crate::device::without_thread_ring(|| self.inner.submit(class, op, done))
            } else {
                self.inner.submit(class, op, done)
            }
        };
        submit(
            op,
            Box::new(move |outcome| {
                me.busy_end();
                drop(charge);
                let ok = outcome.result.is_ok();
                if let Err(err) = &outcome.result {
                    tracing::error!(
                        offset = start,
                        length,
                        "write-back failed: {err}; the volume fails every flush from now on"
                    );
                } else {
                    me.written_bytes.fetch_add(length, Ordering::Relaxed);
                }
                let mut map = me.map();
                map.writeback_done(id, ok);
                if !map.failed() {
                    return me.pump_locked(map);
                }
                let (flushes, directs) = map.take_waiting();
                drop(map);
                for done in flushes {
                    done(failed_outcome());
                }
                for direct in directs {
                    (direct.done)(failed_outcome());
                }
                me.pump();
            }),
        );
    }
}

thread_local! {
    /// Stores this thread is pumping, each with whether it must pump again.
    static PUMPING: RefCell<Vec<(usize, bool)>> = const { RefCell::new(Vec::new()) };
}

/// Marks a store as being pumped on this thread until dropped.
struct PumpGuard {
    key: usize,
}

impl PumpGuard {
    /// None if this thread is already pumping `store`; that call is then
    /// told to run again.
    fn enter(store: &CachedStore) -> Option<PumpGuard> {
        let key = store as *const CachedStore as usize;
        PUMPING.with(|pumping| {
            let mut pumping = pumping.borrow_mut();
            if let Some(entry) = pumping.iter_mut().find(|(k, _)| *k == key) {
                entry.1 = true;
                return None;
            }
            pumping.push((key, false));
            Some(PumpGuard { key })
        })
    }

    /// Whether a nested call asked `store` to be pumped again (and clear it).
    fn again(store: &CachedStore) -> bool {
        let key = store as *const CachedStore as usize;
        PUMPING.with(|pumping| {
            let mut pumping = pumping.borrow_mut();
            let entry = pumping
                .iter_mut()
                .find(|(k, _)| *k == key)
                .expect("entered");
            std::mem::take(&mut entry.1)
        })
    }
}

impl Drop for PumpGuard {
    fn drop(&mut self) {
        PUMPING.with(|pumping| pumping.borrow_mut().retain(|(k, _)| *k != self.key));
    }
}

fn overlay(spans: &[Span], buf: &mut [u8], buf_start: u64) {
    for span in spans {
        span.copy_into(buf, buf_start);
    }
}

/// `inner`, the store's map of `[offset, ..)`, with the ranges in `dirty`
/// marked as data.
fn overlay_extents(inner: Vec<Extent>, offset: u64, dirty: &[(u64, u64)]) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::with_capacity(inner.len());
    let mut push = |length: u64, hole: bool| {
        if length == 0 {
            return;
        }
        match out.last_mut() {
            Some(last) if last.hole == hole => last.length += length,
            _ => out.push(Extent { length, hole }),
        }
    };
    let mut at = offset;
    for extent in inner {
        let end = at + extent.length;
        if !extent.hole {
            push(extent.length, false);
        } else {
            let mut cursor = at;
            for &(s, e) in dirty {
                let (s, e) = (s.max(at), e.min(end));
                if s >= e {
                    continue;
                }
                push(s - cursor, true);
                push(e - s, false);
                cursor = e;
            }
            push(end - cursor, true);
        }
        at = end;
    }
    out
}

impl Drop for CachedStore {
    /// A store dropped with writes still waiting (its volume removed)
    /// fails them: nothing is left to write them to.
    fn drop(&mut self) {
        self.flusher
            .waiting()
            .release_volume(self.volume_id(), Entry::Fail);
    }
}

impl Ticked for CachedStore {
    fn tick(&self) -> TickStats {
        self.map().settle();
        self.pump();
        TickStats {
            written_bytes: self.written_bytes.load(Ordering::Relaxed),
            busy: self.busy.lock().take(self.born.elapsed()),
            volume: self.volume_id(),
            held_bytes: self.held_bytes.load(Ordering::Relaxed),
            wrote: self.wrote.swap(false, Ordering::Relaxed),
        }
    }
}

impl CacheReport for CachedStore {
    fn dirty_bytes(&self) -> u64 {
        CachedStore::dirty_bytes(self)
    }

    fn failed(&self) -> bool {
        CachedStore::failed(self)
    }

    fn budget_bytes(&self) -> (u64, u64) {
        let budget = self.flusher.budget();
        (budget.used_bytes(), budget.limit_bytes())
    }

    fn budget_waiting_writes(&self) -> usize {
        self.flusher.budget().waiting()
    }
}

impl Store for CachedStore {
    fn info(&self) -> &StoreInfo {
        self.inner.info()
    }

    fn submit(&self, class: IoClass, op: DeviceOp, done: Completion) {
        match op {
            DeviceOp::Read { offset, buf } => self.read(class, offset, buf, done),
            DeviceOp::Write {
                offset,
                buf,
                durable: false,
            } => self.write(offset, buf, done),
            DeviceOp::Flush => self.flush(done),
            op @ (DeviceOp::Write { durable: true, .. }
            | DeviceOp::Discard { .. }
            | DeviceOp::WriteZeroes { .. }) => self.direct(class, op, done),
        }
    }

    fn promote(&self, offset: u64, length: u64) {
        self.inner.promote(offset, length)
    }

    fn read_piece_bytes(&self) -> Option<u64> {
        self.inner.read_piece_bytes()
    }

    fn extents(&self, offset: u64, length: u64, extents_max: usize) -> io::Result<Vec<Extent>> {
        let dirty = self.map().dirty_ranges(offset, offset + length);
        let inner = self.inner.extents(offset, length, extents_max)?;
        let mut out = overlay_extents(inner, offset, &dirty);
        out.truncate(extents_max.max(1));
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod torture;
