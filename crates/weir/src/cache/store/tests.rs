use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use super::*;
use crate::cache::{DirtyBudget, Flusher};

/// A store in memory that completes inline and can be told to fail writes.
struct MemStore {
    info: StoreInfo,
    bytes: Mutex<Vec<u8>>,
    fail_writes: AtomicBool,
    writes: AtomicU64,
    /// While set, writes wait in `held` until `release`.
    hold: AtomicBool,
    held: Mutex<Vec<(u64, WriteBuf, Completion)>>,
}

impl MemStore {
    fn new(size: usize) -> Arc<MemStore> {
        Arc::new(MemStore {
            info: StoreInfo {
                size_bytes: size as u64,
                block_bytes: 4096,
                rotational: false,
                read_devices: 1,
                description: "test".into(),
            },
            bytes: Mutex::new(vec![0; size]),
            fail_writes: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            hold: AtomicBool::new(false),
            held: Mutex::new(Vec::new()),
        })
    }

    fn release(&self) {
        self.hold.store(false, Ordering::SeqCst);
        let held = std::mem::take(&mut *self.held.lock().unwrap());
        for (offset, buf, done) in held {
            self.submit(
                IoClass::SyncWrite,
                DeviceOp::Write {
                    offset,
                    buf,
                    durable: false,
                },
                done,
            );
        }
    }

    /// Complete the held writes and go on holding later ones.
    fn complete_held(&self) {
        let held = std::mem::take(&mut *self.held.lock().unwrap());
        for (offset, buf, done) in held {
            let o = offset as usize;
            self.bytes.lock().unwrap()[o..o + buf.len()].copy_from_slice(buf.as_slice());
            done(Outcome::done(Ok(())));
        }
    }

    fn at(&self, offset: usize, len: usize) -> Vec<u8> {
        self.bytes.lock().unwrap()[offset..offset + len].to_vec()
    }
}

impl Store for MemStore {
    fn info(&self) -> &StoreInfo {
        &self.info
    }

    fn submit(&self, _class: IoClass, op: DeviceOp, done: Completion) {
        let mut bytes = self.bytes.lock().unwrap();
        match op {
            DeviceOp::Read { offset, mut buf } => {
                let o = offset as usize;
                let len = buf.len();
                buf.as_mut_slice().copy_from_slice(&bytes[o..o + len]);
                drop(bytes);
                done(Outcome {
                    result: Ok(()),
                    buf: Some(buf),
                    hole: false,
                })
            }
            DeviceOp::Write { offset, buf, .. } => {
                if self.hold.load(Ordering::SeqCst) {
                    drop(bytes);
                    self.held.lock().unwrap().push((offset, buf, done));
                    return;
                }
                if self.fail_writes.load(Ordering::SeqCst) {
                    drop(bytes);
                    return done(Outcome::done(Err(io::Error::from_raw_os_error(libc::EIO))));
                }
                self.writes.fetch_add(1, Ordering::SeqCst);
                let o = offset as usize;
                bytes[o..o + buf.len()].copy_from_slice(buf.as_slice());
                drop(bytes);
                done(Outcome::done(Ok(())))
            }
            DeviceOp::Discard { offset, length } | DeviceOp::WriteZeroes { offset, length, .. } => {
                bytes[offset as usize..(offset + length) as usize].fill(0);
                drop(bytes);
                done(Outcome::done(Ok(())))
            }
            DeviceOp::Flush => {
                drop(bytes);
                done(Outcome::done(Ok(())))
            }
        }
    }

    fn extents(&self, _offset: u64, length: u64, _max: usize) -> io::Result<Vec<Extent>> {
        Ok(vec![Extent { length, hole: true }])
    }
}

fn run(cache: &CachedStore, class: IoClass, op: DeviceOp) -> Outcome {
    let (tx, rx) = mpsc::channel();
    cache.submit(
        class,
        op,
        Box::new(move |outcome| {
            tx.send(outcome).unwrap();
        }),
    );
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("op answered")
}

fn filled(value: u8, len: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::new(len);
    buf.as_mut_slice().fill(value);
    buf
}

fn write(cache: &CachedStore, offset: u64, value: u8, len: usize, durable: bool) -> io::Result<()> {
    let op = DeviceOp::Write {
        offset,
        buf: filled(value, len).into(),
        durable,
    };
    run(cache, IoClass::SyncWrite, op).result
}

/// Send a write without waiting for its answer: whether it succeeded
/// arrives on the returned channel.
fn write_unanswered(
    cache: &CachedStore,
    offset: u64,
    value: u8,
    len: usize,
) -> mpsc::Receiver<bool> {
    let (tx, rx) = mpsc::channel();
    let op = DeviceOp::Write {
        offset,
        buf: filled(value, len).into(),
        durable: false,
    };
    cache.submit(
        IoClass::SyncWrite,
        op,
        Box::new(move |outcome| tx.send(outcome.result.is_ok()).unwrap()),
    );
    rx
}

fn read(cache: &CachedStore, offset: u64, len: usize) -> Vec<u8> {
    let op = DeviceOp::Read {
        offset,
        buf: AlignedBuf::new(len),
    };
    let outcome = run(cache, IoClass::SyncRead, op);
    outcome.result.unwrap();
    outcome.buf.unwrap().as_slice().to_vec()
}

fn flush(cache: &CachedStore) -> io::Result<()> {
    run(cache, IoClass::SyncWrite, DeviceOp::Flush).result
}

fn setup(limit: Option<u64>) -> (Arc<MemStore>, Arc<CachedStore>, Arc<Flusher>) {
    let store = MemStore::new(1 << 20);
    let flusher = Flusher::start(DirtyBudget::new(limit));
    let cache = CachedStore::new(Arc::clone(&store) as Arc<dyn Store>, &flusher);
    (store, cache, flusher)
}

#[test]
fn writes_are_answered_from_memory_read_back_and_reach_the_store_on_flush() {
    let (store, cache, flusher) = setup(Some(64 << 20));
    write(&cache, 8192, 7, 4096, false).unwrap();
    assert_eq!(read(&cache, 8192, 4096), vec![7; 4096]);
    assert_eq!(read(&cache, 4096, 8192)[4096..], vec![7; 4096]);
    let extents = cache.extents(0, 16384, 16).unwrap();
    assert_eq!(
        extents,
        vec![
            Extent {
                length: 8192,
                hole: true
            },
            Extent {
                length: 4096,
                hole: false
            },
            Extent {
                length: 4096,
                hole: true
            },
        ]
    );
    flush(&cache).unwrap();
    assert_eq!(store.at(8192, 4096), vec![7; 4096]);
    assert_eq!(cache.dirty_bytes(), 0);
    flusher.stop();
}

#[test]
fn fua_and_zeroing_reach_the_store_before_they_are_answered_in_order_with_cached_bytes() {
    let (store, cache, flusher) = setup(Some(64 << 20));
    write(&cache, 0, 1, 8192, false).unwrap();
    write(&cache, 4096, 2, 4096, true).unwrap();
    assert_eq!(store.at(4096, 4096), vec![2; 4096]);
    let zero = DeviceOp::WriteZeroes {
        offset: 0,
        length: 4096,
        may_unmap: false,
    };
    run(&cache, IoClass::SyncWrite, zero).result.unwrap();
    assert_eq!(store.at(0, 4096), vec![0; 4096]);
    assert_eq!(read(&cache, 0, 8192)[..4096], vec![0; 4096]);
    flush(&cache).unwrap();
    assert_eq!(store.at(0, 8192)[4096..], vec![2; 4096]);
    flusher.stop();
}

#[test]
fn a_failed_write_back_fails_every_later_flush_and_fua_but_reads_still_see_the_bytes() {
    let (store, cache, flusher) = setup(Some(64 << 20));
    write(&cache, 0, 5, 4096, false).unwrap();
    store.fail_writes.store(true, Ordering::SeqCst);
    assert!(flush(&cache).is_err());
    assert!(cache.failed());
    store.fail_writes.store(false, Ordering::SeqCst);
    assert!(flush(&cache).is_err(), "the failure stays latched");
    assert!(write(&cache, 8192, 1, 4096, true).is_err());
    assert_eq!(read(&cache, 0, 4096), vec![5; 4096]);
    flusher.stop();
}

#[test]
fn a_write_past_the_budget_waits_unanswered_until_writeback_makes_room() {
    let (store, cache, flusher) = setup(Some(1 << 20));
    store.hold.store(true, Ordering::SeqCst);
    // Three quarters of the budget are dirty, so their write-back starts
    // at once (sharing the cached bytes) and the store holds it.
    write(&cache, 0, 3, 768 << 10, false).unwrap();
    assert_eq!(store.held.lock().unwrap().len(), 1);
    assert_eq!(
        flusher.budget().used_bytes(),
        768 << 10,
        "a run of one write's bytes is not copied"
    );
    let rx = write_unanswered(&cache, 0, 4, 384 << 10);
    assert!(rx
        .recv_timeout(std::time::Duration::from_millis(200))
        .is_err());
    assert_eq!(flusher.budget().waiting(), 1);
    assert_eq!(
        store.held.lock().unwrap().len(),
        1,
        "only the write-back reached the store"
    );
    // The write-back completes, its memory is freed, and the waiting write
    // is cached and answered.
    store.release();
    assert!(rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap());
    assert_eq!(flusher.budget().waiting(), 0);
    assert_eq!(read(&cache, 0, 4096), vec![4; 4096]);
    flush(&cache).unwrap();
    assert_eq!(store.at(0, 4096), vec![4; 4096], "the newer write, last");
    assert_eq!(store.at(600 << 10, 4096), vec![3; 4096]);
    assert_eq!(cache.dirty_bytes(), 0);
    flusher.stop();
}

/// A store and the cache in front of it.
type Volume = (Arc<MemStore>, Arc<CachedStore>);

/// Two volumes on a 1 MiB budget and a flusher that never ticks.
fn two_volumes() -> (Arc<Flusher>, [Volume; 2]) {
    let flusher = Flusher::manual(DirtyBudget::new(Some(1 << 20)));
    let volume = || {
        let store = MemStore::new(1 << 20);
        let cache = CachedStore::new(Arc::clone(&store) as Arc<dyn Store>, &flusher);
        (store, cache)
    };
    let volumes = [volume(), volume()];
    (flusher, volumes)
}

#[test]
fn a_write_waiting_for_room_is_answered_when_another_volumes_writeback_makes_it() {
    // No flusher thread: nothing ticks, so only the other volume's
    // writeback completing can let the waiting write in.
    let (flusher, [(busy_store, busy), (idle_store, idle)]) = two_volumes();
    busy_store.hold.store(true, Ordering::SeqCst);
    write(&busy, 0, 3, 768 << 10, false).unwrap();
    let rx = write_unanswered(&idle, 0, 4, 384 << 10);
    assert!(rx
        .recv_timeout(std::time::Duration::from_millis(200))
        .is_err());
    assert_eq!(flusher.budget().waiting(), 1);
    busy_store.release();
    assert!(rx
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("answered once the other volume's writeback made room"));
    assert_eq!(flusher.budget().waiting(), 0);
    assert_eq!(read(&idle, 0, 4096), vec![4; 4096]);
    flush(&idle).unwrap();
    flush(&busy).unwrap();
    assert_eq!(idle_store.at(0, 4096), vec![4; 4096]);
    assert_eq!(busy_store.at(0, 4096), vec![3; 4096]);
}

#[test]
fn room_goes_first_to_the_waiting_volume_that_holds_least_of_the_budget() {
    let (flusher, [(a_store, a), (b_store, b)]) = two_volumes();
    a_store.hold.store(true, Ordering::SeqCst);
    b_store.hold.store(true, Ordering::SeqCst);
    // The first volume holds 768 KiB, the second 128 KiB, each being
    // written back and held there.
    write(&a, 0, 1, 512 << 10, false).unwrap();
    write(&a, 512 << 10, 1, 256 << 10, false).unwrap();
    write(&b, 0, 2, 128 << 10, false).unwrap();
    let a_older = write_unanswered(&a, 0, 3, 256 << 10);
    let b_newer = write_unanswered(&b, 0, 4, 256 << 10);
    assert_eq!(flusher.budget().waiting(), 2);
    // The second volume's write-back frees 128 KiB: room for one of the
    // two, and the first volume's is older, but that volume holds more.
    b_store.complete_held();
    assert!(b_newer
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("the volume holding least goes first"));
    assert!(a_older
        .recv_timeout(std::time::Duration::from_millis(200))
        .is_err());
    assert_eq!(flusher.budget().waiting(), 1);
    b_store.release();
    a_store.release();
    assert!(a_older
        .recv_timeout(std::time::Duration::from_secs(5))
        .unwrap());
    flush(&a).unwrap();
    flush(&b).unwrap();
    assert_eq!(a_store.at(0, 4096), vec![3; 4096]);
    assert_eq!(a_store.at(600 << 10, 4096), vec![1; 4096]);
    assert_eq!(b_store.at(0, 4096), vec![4; 4096]);
    assert_eq!(flusher.budget().waiting(), 0);
    assert_eq!(flusher.budget().used_bytes(), 0);
}

#[test]
fn while_two_volumes_write_the_one_holding_most_leaves_headroom_to_the_other() {
    let (flusher, [(a_store, a), (b_store, b)]) = two_volumes();
    a_store.hold.store(true, Ordering::SeqCst);
    b_store.hold.store(true, Ordering::SeqCst);
    write(&a, 0, 1, 768 << 10, false).unwrap();
    write(&b, 0, 2, 4096, false).unwrap();
    // Alone, the first volume's next write would fit: 972 KiB of 1 MiB.
    flusher.tick_caches();
    let a_next = write_unanswered(&a, 768 << 10, 3, 200 << 10);
    assert!(a_next
        .recv_timeout(std::time::Duration::from_millis(200))
        .is_err());
    // The second volume's fits at once in the eighth left to it.
    write(&b, 8192, 4, 200 << 10, false).unwrap();
    a_store.release();
    assert!(a_next
        .recv_timeout(std::time::Duration::from_secs(5))
        .unwrap());
    b_store.release();
    flush(&a).unwrap();
    flush(&b).unwrap();
    assert_eq!(a_store.at(768 << 10, 4096), vec![3; 4096]);
    assert_eq!(b_store.at(8192, 4096), vec![4; 4096]);
}

#[test]
fn one_volume_writing_alone_has_the_whole_budget() {
    let (flusher, [(a_store, a), _]) = two_volumes();
    a_store.hold.store(true, Ordering::SeqCst);
    write(&a, 0, 1, 768 << 10, false).unwrap();
    flusher.tick_caches();
    write(&a, 768 << 10, 3, 200 << 10, false).unwrap();
    a_store.release();
    flush(&a).unwrap();
}

#[test]
fn a_write_larger_than_the_budget_goes_through_after_older_cached_bytes() {
    let (store, cache, flusher) = setup(Some(512 << 10));
    store.hold.store(true, Ordering::SeqCst);
    write(&cache, 0, 3, 384 << 10, false).unwrap();
    let rx = write_unanswered(&cache, 0, 4, 768 << 10);
    // It waits for the older bytes in its range to reach the store first.
    assert!(rx
        .recv_timeout(std::time::Duration::from_millis(200))
        .is_err());
    store.release();
    assert!(rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap());
    assert_eq!(store.at(0, 4096), vec![4; 4096], "written through, last");
    assert_eq!(store.at((768 << 10) - 4096, 4096), vec![4; 4096]);
    assert_eq!(cache.dirty_bytes(), 0);
    assert_eq!(flusher.budget().used_bytes(), 0);
    flusher.stop();
}

#[test]
fn threads_writing_at_once_past_a_small_budget_read_their_newest_bytes_and_flush_them() {
    const THREADS: u64 = 4;
    const BLOCKS_EACH: u64 = 16;
    const ROUNDS: u64 = 300;
    const BLOCK: u64 = 4096;
    // A budget of half the blocks written: writers are paused, wait for
    // room past the limit, and writeback runs with and without pressure,
    // all at once.
    let (store, cache, flusher) = setup(Some(THREADS * BLOCKS_EACH * BLOCK / 2));
    let releasing = AtomicBool::new(true);
    std::thread::scope(|scope| {
        // Writes the store holds are completed on this thread, so that
        // completions (and the pumps they start) land on a thread other
        // than the writer's as well as inline.
        let releaser = scope.spawn(|| {
            let mut rng = crate::rng::Rng::new(7);
            while releasing.load(Ordering::SeqCst) {
                store.hold.store(rng.below(4) != 0, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_micros(200));
                store.release();
            }
        });
        let writers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (cache, store) = (Arc::clone(&cache), &store);
                scope.spawn(move || {
                    let mut rng = crate::rng::Rng::new(t);
                    let base = t * BLOCKS_EACH * BLOCK;
                    let mut newest = vec![0u8; BLOCKS_EACH as usize];
                    for round in 1..=ROUNDS {
                        let block = rng.below(BLOCKS_EACH);
                        let value = (round % 250 + 1) as u8;
                        let offset = base + block * BLOCK;
                        write(&cache, offset, value, BLOCK as usize, rng.below(10) == 0).unwrap();
                        newest[block as usize] = value;
                        let probe = rng.below(BLOCKS_EACH);
                        let seen = read(&cache, base + probe * BLOCK, BLOCK as usize);
                        assert_eq!(
                            seen,
                            vec![newest[probe as usize]; BLOCK as usize],
                            "thread {t} block {probe}"
                        );
                        if round % 20 == 0 || round == ROUNDS {
                            flush(&cache).unwrap();
                            for (block, value) in newest.iter().enumerate() {
                                let offset = base + block as u64 * BLOCK;
                                let stored = store.at(offset as usize, BLOCK as usize);
                                assert_eq!(
                                    stored,
                                    vec![*value; BLOCK as usize],
                                    "thread {t} block {block} after flush"
                                );
                            }
                        }
                    }
                })
            })
            .collect();
        let results: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
        releasing.store(false, Ordering::SeqCst);
        releaser.join().unwrap();
        for result in results {
            if let Err(panic) = result {
                std::panic::resume_unwind(panic);
            }
        }
    });
    assert_eq!(cache.dirty_bytes(), 0);
    flusher.stop();
}
