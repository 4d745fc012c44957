//! The write-back cache's torture test: a seeded run of writes (some FUA),
//! reads, flushes, zeroing and trims through a `CachedStore` over a
//! simulated store that completes writes in any order, fails writes on
//! demand (EIO, or ENOSPC as from a full disk), and loses power: unflushed
//! writes, completed or in flight, land in any subset and torn sector by
//! sector. After every step reads must return the newest bytes; after
//! every power loss each block must hold what the last FLUSH or FUA
//! covering it promised, or a newer write, never anything else. A failed
//! write-back must fail every later FLUSH. A second volume shares the
//! budget and writes beside it, so writes wait for room the other volume
//! holds or frees; after a power loss the budget must count nothing and
//! every write of that volume must have had its answer.
//!
//! `WEIR_CACHE_SEEDS=N` runs N seeds (default 300); `WEIR_CACHE_SEED=S`
//! runs one.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use super::CachedStore;
use crate::cache::{DirtyBudget, Flusher};
use crate::device::{AlignedBuf, Completion, DeviceOp, Extent, Outcome};
use crate::pool::{Store, StoreInfo};
use crate::rng::Rng;
use crate::sched::IoClass;

const BLOCK: usize = 4096;
const SECTOR: usize = 512;
const BLOCKS: u64 = 64;
const STEPS: usize = 150;

/// A store whose writes wait until the test completes them.
struct SimStore {
    info: StoreInfo,
    state: Mutex<SimState>,
    /// Store writes still to fail, and with which errno.
    failing: AtomicU32,
    fail_errno: AtomicU32,
}

#[derive(Default)]
struct SimState {
    /// What reads return: every completed write applied.
    volatile: Vec<u8>,
    /// What survives a power loss for sure: flushed writes.
    durable: Vec<u8>,
    /// Per sector, the values completed writes left there since the last
    /// flush (or FUA write) covered it: a power loss leaves one of them,
    /// or the durable value.
    unflushed: HashMap<u64, Vec<Vec<u8>>>,
    /// Writes the store has not completed: (offset, bytes, FUA, done).
    held: Vec<(u64, Vec<u8>, bool, Completion)>,
}

impl SimStore {
    fn new() -> Arc<SimStore> {
        let bytes = BLOCKS as usize * BLOCK;
        Arc::new(SimStore {
            info: StoreInfo {
                size_bytes: bytes as u64,
                block_bytes: BLOCK as u32,
                rotational: false,
                read_devices: 1,
                description: "sim".into(),
            },
            state: Mutex::new(SimState {
                volatile: vec![0; bytes],
                durable: vec![0; bytes],
                ..SimState::default()
            }),
            failing: AtomicU32::new(0),
            fail_errno: AtomicU32::new(0),
        })
    }

    /// Complete one held write, chosen at random; false if none is held.
    fn complete_one(&self, rng: &mut Rng) -> bool {
        let (offset, bytes, fua, done) = {
            let mut state = self.state.lock().unwrap();
            if state.held.is_empty() {
                return false;
            }
            let index = rng.below(state.held.len() as u64) as usize;
            state.held.swap_remove(index)
        };
        if self.failing.load(Ordering::SeqCst) > 0 {
            self.failing.fetch_sub(1, Ordering::SeqCst);
            let errno = self.fail_errno.load(Ordering::SeqCst) as i32;
            // A failed write may have landed in part, as on a real device.
            let mut state = self.state.lock().unwrap();
            let cut = rng.below(bytes.len() as u64 / SECTOR as u64 + 1) as usize * SECTOR;
            let at = offset as usize;
            state.volatile[at..at + cut].copy_from_slice(&bytes[..cut]);
            state.note_unflushed(offset, &bytes[..cut]);
            drop(state);
            return {
                done(Outcome::done(Err(io::Error::from_raw_os_error(errno))));
                true
            };
        }
        {
            let mut state = self.state.lock().unwrap();
            let at = offset as usize;
            state.volatile[at..at + bytes.len()].copy_from_slice(&bytes);
            if fua {
                state.durable[at..at + bytes.len()].copy_from_slice(&bytes);
                for sector in 0..(bytes.len() / SECTOR) as u64 {
                    state.unflushed.remove(&(offset / SECTOR as u64 + sector));
                }
            } else {
                state.note_unflushed(offset, &bytes);
            }
        }
        done(Outcome::done(Ok(())));
        true
    }

    /// Power loss: each sector keeps its durable value or one that a
    /// completed or in-flight write left since.
    fn power_loss(&self, rng: &mut Rng) {
        let mut state = self.state.lock().unwrap();
        let held: Vec<(u64, Vec<u8>)> = state.held.drain(..).map(|(o, b, _, _)| (o, b)).collect();
        for (offset, bytes) in held {
            state.note_unflushed(offset, &bytes);
        }
        let unflushed = std::mem::take(&mut state.unflushed);
        let mut disk = state.durable.clone();
        for (sector, values) in unflushed {
            let pick = rng.below(values.len() as u64 + 1) as usize;
            if let Some(value) = values.get(pick) {
                let at = sector as usize * SECTOR;
                disk[at..at + SECTOR].copy_from_slice(value);
            }
        }
        state.durable = disk.clone();
        state.volatile = disk;
    }
}

impl SimState {
    fn note_unflushed(&mut self, offset: u64, bytes: &[u8]) {
        for (s, sector) in bytes.chunks(SECTOR).enumerate() {
            let index = offset / SECTOR as u64 + s as u64;
            self.unflushed
                .entry(index)
                .or_default()
                .push(sector.to_vec());
        }
    }
}

impl Store for SimStore {
    fn info(&self) -> &StoreInfo {
        &self.info
    }

    fn submit(&self, _class: IoClass, op: DeviceOp, done: Completion) {
        let mut state = self.state.lock().unwrap();
        match op {
            DeviceOp::Read { offset, mut buf } => {
                let at = offset as usize;
                let len = buf.len();
                buf.as_mut_slice()
                    .copy_from_slice(&state.volatile[at..at + len]);
                drop(state);
                done(Outcome {
                    result: Ok(()),
                    buf: Some(buf),
                    hole: false,
                })
            }
            DeviceOp::Write {
                offset,
                buf,
                durable,
            } => {
                let bytes = buf.as_slice().to_vec();
                state.held.push((offset, bytes, durable, done));
            }
            DeviceOp::Discard { offset, length } | DeviceOp::WriteZeroes { offset, length, .. } => {
                state
                    .held
                    .push((offset, vec![0; length as usize], false, done));
            }
            DeviceOp::Flush => {
                state.durable = state.volatile.clone();
                state.unflushed.clear();
                drop(state);
                done(Outcome::done(Ok(())))
            }
        }
    }

    fn extents(&self, _offset: u64, length: u64, _max: usize) -> io::Result<Vec<Extent>> {
        Ok(vec![Extent {
            length,
            hole: false,
        }])
    }
}

/// What each block may hold.
#[derive(Clone, Default)]
struct Block {
    latest: Vec<u8>,
    /// Values since the last promise, and the promised one first: after a
    /// power loss each sector must match one of them.
    allowed: Vec<Vec<u8>>,
}

struct Run {
    rng: Rng,
    store: Arc<SimStore>,
    cache: Arc<CachedStore>,
    flusher: Arc<Flusher>,
    /// Another volume on the same budget: its writes take room the
    /// volume under test waits for, and its writeback makes room.
    neighbour_store: Arc<SimStore>,
    neighbour: Arc<CachedStore>,
    /// Its writes' answers: whether each succeeded.
    neighbour_answers: (mpsc::Sender<bool>, mpsc::Receiver<bool>),
    neighbour_sent: usize,
    blocks: HashMap<u64, Block>,
    /// A write-back failed: every flush must fail until the crash.
    failed: bool,
    /// Store writes were made to fail: client writes may fail too.
    faults: bool,
    history: Vec<String>,
}

impl Run {
    fn block(&mut self, index: u64) -> &mut Block {
        self.blocks.entry(index).or_insert_with(|| Block {
            latest: vec![0; BLOCK],
            allowed: vec![vec![0; BLOCK]],
        })
    }

    /// Submit `op` and complete store writes until it is answered.
    fn run(&mut self, class: IoClass, op: DeviceOp) -> Result<Outcome, String> {
        let (tx, rx) = mpsc::channel();
        self.cache
            .submit(class, op, Box::new(move |o| tx.send(o).unwrap()));
        for _ in 0..100_000 {
            if let Ok(outcome) = rx.try_recv() {
                return Ok(outcome);
            }
            // The room a write waits for may be the other volume's.
            let (first, second) = if self.rng.below(2) == 0 {
                (&self.neighbour_store, &self.store)
            } else {
                (&self.store, &self.neighbour_store)
            };
            let completed = first.complete_one(&mut self.rng) || second.complete_one(&mut self.rng);
            if !completed {
                self.flusher.tick_caches();
            }
        }
        Err("an op was never answered".into())
    }

    fn random_range(&mut self) -> (u64, u64) {
        let first = self.rng.below(BLOCKS);
        let count = 1 + self.rng.below((BLOCKS - first).min(8));
        (first, count)
    }

    fn write(&mut self) -> Result<(), String> {
        let (first, count) = self.random_range();
        let fua = self.rng.below(6) == 0;
        let mut buf = AlignedBuf::new(count as usize * BLOCK);
        for word in buf.as_mut_slice().chunks_mut(8) {
            word.copy_from_slice(&self.rng.next_u64().to_le_bytes());
        }
        let data = buf.as_slice().to_vec();
        self.history
            .push(format!("write {first}+{count} fua={fua}"));
        let op = DeviceOp::Write {
            offset: first * BLOCK as u64,
            buf: buf.into(),
            durable: fua,
        };
        let outcome = self.run(IoClass::SyncWrite, op)?;
        match outcome.result {
            Ok(()) => {
                for (i, bytes) in data.chunks(BLOCK).enumerate() {
                    let block = self.block(first + i as u64);
                    block.latest = bytes.to_vec();
                    if fua {
                        block.allowed = vec![bytes.to_vec()];
                    } else {
                        block.allowed.push(bytes.to_vec());
                    }
                }
            }
            Err(_) if self.faults => {
                // Failed as a whole: each block holds old or new bytes.
                for (i, bytes) in data.chunks(BLOCK).enumerate() {
                    self.block(first + i as u64).allowed.push(bytes.to_vec());
                }
                self.note_failure_read_back(first, count)?;
            }
            Err(err) => return Err(format!("a cached write failed: {err}")),
        }
        Ok(())
    }

    /// After a failed direct write the blocks hold old or new bytes; the
    /// next read tells which, and that becomes the latest.
    fn note_failure_read_back(&mut self, first: u64, count: u64) -> Result<(), String> {
        let found = self.read_raw(first, count)?;
        for (i, bytes) in found.chunks(BLOCK).enumerate() {
            let block = self.block(first + i as u64);
            let legal = bytes.chunks(SECTOR).enumerate().all(|(s, sector)| {
                let range = s * SECTOR..(s + 1) * SECTOR;
                block.latest[range.clone()] == *sector
                    || block.allowed.iter().any(|a| a[range.clone()] == *sector)
            });
            if !legal {
                return Err(format!(
                    "block {} holds bytes never written",
                    first + i as u64
                ));
            }
            block.latest = bytes.to_vec();
        }
        Ok(())
    }

    fn read_raw(&mut self, first: u64, count: u64) -> Result<Vec<u8>, String> {
        let op = DeviceOp::Read {
            offset: first * BLOCK as u64,
            buf: AlignedBuf::new(count as usize * BLOCK),
        };
        let outcome = self.run(IoClass::SyncRead, op)?;
        outcome.result.map_err(|e| format!("read failed: {e}"))?;
        Ok(outcome.buf.expect("a read's buffer").as_slice().to_vec())
    }

    fn read(&mut self) -> Result<(), String> {
        let (first, count) = self.random_range();
        let found = self.read_raw(first, count)?;
        for (i, bytes) in found.chunks(BLOCK).enumerate() {
            let index = first + i as u64;
            if self.block(index).latest != bytes {
                return Err(format!(
                    "block {index} read back other bytes than the newest"
                ));
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), String> {
        self.history.push("flush".into());
        let outcome = self.run(IoClass::SyncWrite, DeviceOp::Flush)?;
        match (outcome.result, self.failed) {
            (Ok(()), false) => {
                for block in self.blocks.values_mut() {
                    block.allowed = vec![block.latest.clone()];
                }
                Ok(())
            }
            (Ok(()), true) => Err("a flush succeeded after a write-back failed".into()),
            (Err(_), true) => Ok(()),
            (Err(err), false) => {
                if self.cache.failed() {
                    self.failed = true;
                    self.history
                        .push("  write-back failed: flushes fail".into());
                    Ok(())
                } else {
                    Err(format!("a flush failed: {err}"))
                }
            }
        }
    }

    fn zero(&mut self) -> Result<(), String> {
        let (first, count) = self.random_range();
        let trim = self.rng.below(2) == 0;
        self.history
            .push(format!("zero {first}+{count} trim={trim}"));
        let (offset, length) = (first * BLOCK as u64, count * BLOCK as u64);
        let op = if trim {
            DeviceOp::Discard { offset, length }
        } else {
            DeviceOp::WriteZeroes {
                offset,
                length,
                may_unmap: false,
            }
        };
        let outcome = self.run(IoClass::SyncWrite, op)?;
        match outcome.result {
            Ok(()) => {
                for i in 0..count {
                    let block = self.block(first + i);
                    block.latest = vec![0; BLOCK];
                    block.allowed.push(vec![0; BLOCK]);
                }
                Ok(())
            }
            Err(_) => {
                for i in 0..count {
                    self.block(first + i).allowed.push(vec![0; BLOCK]);
                }
                self.note_failure_read_back(first, count)
            }
        }
    }

    /// A write to the other volume, not waited for: it may wait for room.
    /// At most the smallest budget, so that it never goes through to the
    /// store, where a power loss would leave it unanswered.
    fn neighbour_write(&mut self) {
        let length = (1 + self.rng.below(4)) as usize * BLOCK;
        let offset = self.rng.below(BLOCKS - 8) * BLOCK as u64;
        let mut buf = AlignedBuf::new(length);
        buf.as_mut_slice().fill(self.rng.below(256) as u8);
        self.history
            .push(format!("other volume: write {offset}+{length}"));
        let op = DeviceOp::Write {
            offset,
            buf: buf.into(),
            durable: false,
        };
        let tx = self.neighbour_answers.0.clone();
        self.neighbour.submit(
            IoClass::SyncWrite,
            op,
            Box::new(move |outcome| {
                let _ = tx.send(outcome.result.is_ok());
            }),
        );
        self.neighbour_sent += 1;
    }

    fn fail_writes(&mut self) {
        let count = 1 + self.rng.below(3) as u32;
        let errno = if self.rng.below(2) == 0 {
            libc::EIO
        } else {
            libc::ENOSPC
        };
        self.history
            .push(format!("the next {count} store writes fail ({errno})"));
        self.store.fail_errno.store(errno as u32, Ordering::SeqCst);
        self.store.failing.store(count, Ordering::SeqCst);
        self.faults = true;
    }

    /// Power loss, then a new cache over what the store kept.
    fn crash(&mut self) -> Result<(), String> {
        self.history.push("power loss".into());
        self.store.failing.store(0, Ordering::SeqCst);
        self.store.power_loss(&mut self.rng);
        self.neighbour_store.power_loss(&mut self.rng);
        let budget = Arc::clone(self.flusher.budget());
        self.flusher = Flusher::manual(Arc::clone(&budget));
        self.cache = CachedStore::new(Arc::clone(&self.store) as Arc<dyn Store>, &self.flusher);
        self.neighbour = CachedStore::new(
            Arc::clone(&self.neighbour_store) as Arc<dyn Store>,
            &self.flusher,
        );
        // The caches that lost power are gone, and with them every byte
        // and waiting write they held in the budget; each write waiting
        // there was failed, none was left unanswered.
        if budget.used_bytes() != 0 || budget.waiting() != 0 {
            return Err(format!(
                "after power loss the budget still counts {} bytes and {} waiting writes",
                budget.used_bytes(),
                budget.waiting()
            ));
        }
        let answered = self.neighbour_answers.1.try_iter().count();
        if answered != self.neighbour_sent {
            return Err(format!(
                "the other volume's writes: {} sent, {answered} answered",
                self.neighbour_sent
            ));
        }
        self.neighbour_sent = 0;
        self.failed = false;
        self.faults = false;
        let found = self.store.state.lock().unwrap().durable.clone();
        for index in 0..BLOCKS {
            let bytes = &found[index as usize * BLOCK..(index as usize + 1) * BLOCK];
            let block = self.block(index);
            let legal = bytes.chunks(SECTOR).enumerate().all(|(s, sector)| {
                let range = s * SECTOR..(s + 1) * SECTOR;
                block.allowed.iter().any(|a| a[range.clone()] == *sector)
            });
            if !legal {
                return Err(format!(
                    "after power loss block {index} holds bytes no flush allowed"
                ));
            }
            *block = Block {
                latest: bytes.to_vec(),
                allowed: vec![bytes.to_vec()],
            };
        }
        Ok(())
    }

    fn step(&mut self) -> Result<(), String> {
        match self.rng.below(44) {
            0..=13 => self.write()?,
            14..=21 => self.read()?,
            22..=25 => self.flush()?,
            26..=27 => self.zero()?,
            28..=32 => {
                for _ in 0..self.rng.below(6) {
                    self.store.complete_one(&mut self.rng);
                }
            }
            33..=35 => {
                self.flusher.tick_caches();
            }
            36 => self.fail_writes(),
            37..=38 => self.crash()?,
            39..=41 => self.neighbour_write(),
            42 => {
                for _ in 0..self.rng.below(6) {
                    self.neighbour_store.complete_one(&mut self.rng);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
fn run_seed(seed: u64) -> Result<(), String> {
    run(Rng::new(seed))
}

/// One whole run, every decision drawn from `rng` (seeded, or scripted by
/// a fuzzer).
pub(crate) fn run(mut rng: Rng) -> Result<(), String> {
    // A small budget makes writes wait for room, a tiny one sends the
    // larger writes (up to 32 KiB) through to the store.
    let limit = [16 << 10, 64 << 10, 4 << 20][rng.below(3) as usize];
    let store = SimStore::new();
    let flusher = Flusher::manual(DirtyBudget::new(Some(limit)));
    let cache = CachedStore::new(Arc::clone(&store) as Arc<dyn Store>, &flusher);
    let neighbour_store = SimStore::new();
    let neighbour = CachedStore::new(Arc::clone(&neighbour_store) as Arc<dyn Store>, &flusher);
    let mut run = Run {
        rng,
        store,
        cache,
        flusher,
        neighbour_store,
        neighbour,
        neighbour_answers: mpsc::channel(),
        neighbour_sent: 0,
        blocks: HashMap::new(),
        failed: false,
        faults: false,
        history: vec![format!("budget {limit}")],
    };
    let result = (0..STEPS)
        .try_for_each(|_| run.step())
        .and_then(|()| run.crash());
    result.map_err(|why| {
        if std::env::var("WEIR_SIM_HISTORY").is_ok() {
            format!("{why}\n{}", run.history.join("\n"))
        } else {
            why
        }
    })
}

#[test]
fn every_seed_keeps_flushed_writes_and_reads_the_newest_bytes() {
    let seeds: Vec<u64> = match std::env::var("WEIR_CACHE_SEED") {
        Ok(seed) => vec![seed.parse().expect("WEIR_CACHE_SEED is a number")],
        Err(_) => {
            let count: u64 = std::env::var("WEIR_CACHE_SEEDS")
                .map_or(300, |n| n.parse().expect("WEIR_CACHE_SEEDS is a number"));
            (0..count).collect()
        }
    };
    let failures: Vec<String> = seeds
        .iter()
        .filter_map(|&seed| {
            run_seed(seed)
                .err()
                .map(|why| format!("seed {seed}: {why}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
