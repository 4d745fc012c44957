//! Readahead over a store whose reads take their bytes when submitted and
//! complete only when the test releases them: a read-ahead can land after
//! a write that overtook it, which is the case that must never return
//! old bytes.

use std::sync::{Arc, Mutex};

use super::*;
use crate::rng::Rng;

const SIZE: usize = 8 << 20;
const BLOCK: u64 = 4096;

struct HeldStore {
    info: StoreInfo,
    bytes: Mutex<Vec<u8>>,
    held: Mutex<Vec<(Completion, Outcome)>>,
    reads: AtomicU64,
    /// Reads in the device: (offset, length, class).
    in_device: Arc<Mutex<Vec<(u64, u64, IoClass)>>>,
    promoted: Mutex<Vec<(u64, u64)>>,
}

impl HeldStore {
    fn new() -> Arc<HeldStore> {
        Arc::new(HeldStore {
            info: StoreInfo {
                size_bytes: SIZE as u64,
                block_bytes: BLOCK as u32,
                rotational: true,
                read_devices: 1,
                description: "held".into(),
            },
            bytes: Mutex::new(vec![0; SIZE]),
            held: Mutex::new(Vec::new()),
            reads: AtomicU64::new(0),
            in_device: Arc::default(),
            promoted: Mutex::new(Vec::new()),
        })
    }

    /// Complete one held read, chosen by `rng`; false if none is held.
    fn release_one(&self, rng: &mut Rng) -> bool {
        self.release_one_failing(rng, u64::MAX)
    }

    /// As `release_one`, but a read longer than `fail_longer_than` bytes
    /// (a read-ahead, where client reads are shorter) fails one time in
    /// three, as a device read that hits a bad sector.
    fn release_one_failing(&self, rng: &mut Rng, fail_longer_than: u64) -> bool {
        let (done, mut outcome) = {
            let mut held = self.held.lock().unwrap();
            if held.is_empty() {
                return false;
            }
            let i = rng.below(held.len() as u64) as usize;
            held.swap_remove(i)
        };
        let length = outcome.buf.as_ref().map_or(0, |b| b.len() as u64);
        if length > fail_longer_than && rng.below(3) == 0 {
            outcome.result = Err(io::Error::from_raw_os_error(libc::EIO));
        }
        done(outcome);
        true
    }
}

impl Store for HeldStore {
    fn info(&self) -> &StoreInfo {
        &self.info
    }

    fn submit(&self, class: IoClass, op: DeviceOp, done: Completion) {
        match op {
            DeviceOp::Read { offset, mut buf } => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                let entry = (offset, buf.len() as u64, class);
                self.in_device.lock().unwrap().push(entry);
                let in_device = Arc::clone(&self.in_device);
                let done: Completion = Box::new(move |outcome| {
                    in_device.lock().unwrap().retain(|e| *e != entry);
                    done(outcome)
                });
                let at = offset as usize;
                let len = buf.len();
                buf.as_mut_slice()
                    .copy_from_slice(&self.bytes.lock().unwrap()[at..at + len]);
                let outcome = Outcome {
                    result: Ok(()),
                    buf: Some(buf),
                    hole: false,
                };
                self.held.lock().unwrap().push((done, outcome));
            }
            DeviceOp::Write { offset, buf, .. } => {
                let at = offset as usize;
                self.bytes.lock().unwrap()[at..at + buf.len()].copy_from_slice(buf.as_slice());
                done(Outcome::done(Ok(())));
            }
            DeviceOp::Discard { offset, length } | DeviceOp::WriteZeroes { offset, length, .. } => {
                let (at, len) = (offset as usize, length as usize);
                self.bytes.lock().unwrap()[at..at + len].fill(0);
                done(Outcome::done(Ok(())));
            }
            DeviceOp::Flush => done(Outcome::done(Ok(()))),
        }
    }

    fn promote(&self, offset: u64, length: u64) {
        self.promoted.lock().unwrap().push((offset, length));
    }

    fn extents(&self, _offset: u64, length: u64, _max: usize) -> io::Result<Vec<Extent>> {
        Ok(vec![Extent {
            length,
            hole: false,
        }])
    }
}

/// Read through `store`, releasing held reads in random order until the
/// read is answered.
fn read(store: &ReadaheadStore, held: &HeldStore, rng: &mut Rng, offset: u64, len: u64) -> Vec<u8> {
    read_failing(store, held, rng, offset, len, u64::MAX)
}

/// Send a client read through `store`: its bytes land in the slot once
/// it is answered.
fn send_read(store: &ReadaheadStore, offset: u64, length: u64) -> Arc<Mutex<Option<Vec<u8>>>> {
    let slot = Arc::new(Mutex::new(None));
    let answer = Arc::clone(&slot);
    store.submit(
        IoClass::SyncRead,
        DeviceOp::Read {
            offset,
            buf: AlignedBuf::new(length as usize),
        },
        Box::new(move |outcome| {
            outcome.result.expect("read");
            *answer.lock().unwrap() = Some(outcome.buf.expect("data").as_slice().to_vec());
        }),
    );
    slot
}

/// As `read`, with read-aheads failing as `release_one_failing` says.
fn read_failing(
    store: &ReadaheadStore,
    held: &HeldStore,
    rng: &mut Rng,
    offset: u64,
    len: u64,
    fail_longer_than: u64,
) -> Vec<u8> {
    let slot = send_read(store, offset, len);
    loop {
        if let Some(bytes) = slot.lock().unwrap().take() {
            return bytes;
        }
        assert!(
            held.release_one_failing(rng, fail_longer_than),
            "a read that nothing will answer"
        );
    }
}

/// As `read`, asking for pieces of at most `piece_bytes`; checks that the
/// pieces cover the read once each.
fn read_in_pieces(
    store: &ReadaheadStore,
    held: &HeldStore,
    rng: &mut Rng,
    offset: u64,
    len: u64,
    piece_bytes: u64,
) -> Vec<u8> {
    let got = Arc::new(Mutex::new((vec![0u8; len as usize], 0u64)));
    let answer = Arc::clone(&got);
    store.read_in_pieces(
        offset,
        len,
        piece_bytes,
        Arc::new(move |at, bytes, outcome| {
            outcome.result.expect("read");
            let buf = outcome.buf.expect("data");
            assert_eq!(buf.len() as u64, bytes, "a piece's buffer is its length");
            let mut got = answer.lock().unwrap();
            let from = (at - offset) as usize;
            got.0[from..from + bytes as usize].copy_from_slice(buf.as_slice());
            got.1 += bytes;
        }),
    );
    loop {
        {
            let got = got.lock().unwrap();
            if got.1 >= len {
                assert_eq!(got.1, len, "pieces covered the read more than once");
                return got.0.clone();
            }
        }
        assert!(held.release_one(rng), "a read that nothing will answer");
    }
}

/// `store` held at most `limit` bytes read ahead, and once dropped it
/// holds none of the budget.
fn drop_within_budget(store: Arc<ReadaheadStore>, limit: u64, seed: u64) {
    let budget = Arc::clone(&store.budget);
    assert!(budget.held_bytes() <= limit, "seed {seed}: over the budget");
    drop(store);
    assert_eq!(budget.held_bytes(), 0, "seed {seed}: memory held by no one");
}

fn write(store: &ReadaheadStore, offset: u64, bytes: &[u8]) {
    let mut buf = AlignedBuf::new(bytes.len());
    buf.as_mut_slice().copy_from_slice(bytes);
    let op = DeviceOp::Write {
        offset,
        buf: buf.into(),
        durable: false,
    };
    store.submit(
        IoClass::SyncWrite,
        op,
        Box::new(|o| o.result.expect("write")),
    );
}

/// 100 reads of 64 KiB in order, whole or in pieces of `piece_bytes`:
/// exact bytes, and most answered from read-ahead in fewer, larger reads.
fn a_stream_is_answered_from_read_ahead(piece_bytes: Option<u64>) {
    let held = HeldStore::new();
    let store = ReadaheadStore::new(held.clone(), &ReadaheadBudget::new(Some(64 << 20)));
    let mut rng = Rng::new(1);
    let pattern: Vec<u8> = (0..SIZE).map(|i| (i / 4096) as u8 ^ (i as u8)).collect();
    write(&store, 0, &pattern);
    let length = 64 << 10;
    for i in 0..100 {
        let offset = i * length;
        let got = match piece_bytes {
            None => read(&store, &held, &mut rng, offset, length),
            Some(piece) => read_in_pieces(&store, &held, &mut rng, offset, length, piece),
        };
        assert_eq!(got, pattern[offset as usize..(offset + length) as usize]);
    }
    let counters = store.counters();
    // On a volume this small any read lands next to one of those
    // tracked, so 16 reads in a row confirm a stream.
    assert!(counters.hits.load(Ordering::Relaxed) >= 80, "{counters:?}");
    assert!(
        held.reads.load(Ordering::Relaxed) < 100,
        "fewer, larger reads"
    );
}

#[test]
fn a_sequential_reader_is_answered_from_read_ahead() {
    a_stream_is_answered_from_read_ahead(None);
}

#[test]
fn a_stream_read_in_pieces_is_one_reader_and_is_answered_from_read_ahead() {
    // Four pieces in the device at once, read by read: counted as four
    // reads in flight, the stream would get no read-ahead at all.
    a_stream_is_answered_from_read_ahead(Some(16 << 10));
}

#[test]
fn reads_never_return_bytes_older_than_an_answered_write() {
    for seed in 0..200 {
        let held = HeldStore::new();
        let store = ReadaheadStore::new(held.clone(), &ReadaheadBudget::new(Some(2 << 20)));
        let mut rng = Rng::new(seed);
        let mut reference = vec![0u8; SIZE];
        let blocks = SIZE as u64 / BLOCK;
        let mut cursor = 0u64;
        for step in 0..300u64 {
            match rng.below(10) {
                0..=5 => {
                    // A sequential reader (sometimes jumping), some random.
                    let count = 1 + rng.below(16);
                    if rng.below(8) == 0 || cursor + count > blocks {
                        cursor = rng.below(blocks - count);
                    }
                    let (offset, len) = (cursor * BLOCK, count * BLOCK);
                    cursor += count;
                    let got = if rng.below(2) == 0 {
                        read(&store, &held, &mut rng, offset, len)
                    } else {
                        let piece = BLOCK * (1 + rng.below(4));
                        read_in_pieces(&store, &held, &mut rng, offset, len, piece)
                    };
                    let want = &reference[offset as usize..(offset + len) as usize];
                    assert!(
                        got == want,
                        "seed {seed} step {step}: read {offset}+{len} returned old bytes"
                    );
                }
                6..=8 => {
                    let count = 1 + rng.below(32);
                    let first = rng.below(blocks - count);
                    let bytes: Vec<u8> = (0..count * BLOCK).map(|_| rng.below(256) as u8).collect();
                    write(&store, first * BLOCK, &bytes);
                    let at = (first * BLOCK) as usize;
                    reference[at..at + bytes.len()].copy_from_slice(&bytes);
                }
                _ if rng.below(2) == 0 => {
                    // A client's hint: read ahead in the background.
                    let count = 1 + rng.below(128);
                    let first = rng.below(blocks - count);
                    store.prefetch(first * BLOCK, count * BLOCK);
                }
                _ => {
                    let count = 1 + rng.below(64);
                    let first = rng.below(blocks - count);
                    let op = DeviceOp::Discard {
                        offset: first * BLOCK,
                        length: count * BLOCK,
                    };
                    store.submit(IoClass::Trim, op, Box::new(|o| o.result.expect("trim")));
                    let at = (first * BLOCK) as usize;
                    reference[at..at + (count * BLOCK) as usize].fill(0);
                }
            }
            // Read-ahead in flight lands now and then, late.
            if rng.below(3) == 0 {
                held.release_one(&mut rng);
            }
        }
        while held.release_one(&mut rng) {}
        assert!(store.state().use_index_matches(), "seed {seed}");
        drop_within_budget(store, 2 << 20, seed);
    }
}

/// A client read sent and not yet answered, with the bytes it must get.
struct ReadInFlight {
    offset: u64,
    length: u64,
    want: Vec<u8>,
    got: Arc<Mutex<Option<Vec<u8>>>>,
}

/// Two clients on a disk each keep several sequential reads in flight, so
/// their windows go as client reads and take turns, while writes land
/// over read-aheads in flight and reads complete in any order. A write
/// never overlaps a client read in flight, so each read must get exactly
/// the bytes there when it was sent.
#[test]
fn deep_readers_on_a_disk_never_get_bytes_older_than_an_answered_write() {
    let mut hits = 0;
    for seed in 0..100 {
        let held = HeldStore::new();
        let store = ReadaheadStore::new(held.clone(), &ReadaheadBudget::new(Some(2 << 20)));
        let mut rng = Rng::new(seed);
        let mut reference = vec![0u8; SIZE];
        let blocks = SIZE as u64 / BLOCK;
        let half = blocks / 2;
        let mut cursors = [0, half];
        let mut in_flight: Vec<ReadInFlight> = Vec::new();
        for step in 0..400u64 {
            match rng.below(10) {
                0..=6 if in_flight.len() < 16 => {
                    let k = rng.below(2) as usize;
                    let count = 4;
                    if cursors[k] + count > (k as u64 + 1) * half {
                        cursors[k] = k as u64 * half;
                    }
                    let (offset, length) = (cursors[k] * BLOCK, count * BLOCK);
                    cursors[k] += count;
                    let want = reference[offset as usize..(offset + length) as usize].to_vec();
                    in_flight.push(ReadInFlight {
                        offset,
                        length,
                        want,
                        got: send_read(&store, offset, length),
                    });
                }
                7..=8 => {
                    let count = 1 + rng.below(32);
                    let (start, end) = {
                        let first = rng.below(blocks - count);
                        (first * BLOCK, (first + count) * BLOCK)
                    };
                    let clear = in_flight
                        .iter()
                        .all(|r| r.offset + r.length <= start || end <= r.offset);
                    if clear {
                        let bytes: Vec<u8> = (start..end).map(|_| rng.below(256) as u8).collect();
                        write(&store, start, &bytes);
                        reference[start as usize..end as usize].copy_from_slice(&bytes);
                    }
                }
                _ => {
                    held.release_one(&mut rng);
                }
            }
            if rng.below(2) == 0 {
                held.release_one(&mut rng);
            }
            in_flight.retain(|r| match r.got.lock().unwrap().take() {
                Some(got) => {
                    assert!(
                        got == r.want,
                        "seed {seed} step {step}: read {}+{} returned old bytes",
                        r.offset,
                        r.length
                    );
                    false
                }
                None => true,
            });
        }
        while held.release_one(&mut rng) {}
        for r in in_flight {
            let got = r
                .got
                .lock()
                .unwrap()
                .take()
                .expect("every read is answered");
            assert!(
                got == r.want,
                "seed {seed}: read {}+{} returned old bytes",
                r.offset,
                r.length
            );
        }
        hits += store.counters().hits.load(Ordering::Relaxed);
        drop_within_budget(store, 2 << 20, seed);
    }
    assert!(hits > 0, "no read was answered from read-ahead");
}

#[test]
fn on_a_disk_a_stream_keeps_two_pieces_of_one_window_in_the_device_and_a_waiting_reader_promotes_them(
) {
    let held = HeldStore::new();
    let store = ReadaheadStore::new(held.clone(), &ReadaheadBudget::new(Some(64 << 20)));
    let mut rng = Rng::new(5);
    let length = 64 << 10;
    for i in 0..96 {
        read(&store, &held, &mut rng, i * length, length);
        let mut in_device: Vec<_> = held
            .in_device
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, len, _)| *len > length)
            .map(|&(offset, len, _)| (offset, len))
            .collect();
        in_device.sort_unstable();
        assert!(in_device.len() <= 2, "read {i}: {in_device:?}");
        if let [(a, a_len), (b, _)] = in_device[..] {
            assert_eq!(a + a_len, b, "read {i}: pieces of one window");
        }
    }
    let promoted = held.promoted.lock().unwrap();
    assert!(!promoted.is_empty(), "readers waited for read-ahead");
    assert!(
        promoted.iter().all(|(_, len)| *len > length),
        "what is promoted is read-ahead: {promoted:?}"
    );
}

#[test]
fn room_is_made_from_data_passed_then_stopped_streams_then_least_recently_used() {
    const MIB: u64 = 1 << 20;
    const SECOND_NS: u64 = 1_000_000_000;
    let budget = ReadaheadBudget::new(Some(4 * MIB));
    let mut state = State::default();
    let length = 64 << 10;
    let on_read = |state: &mut State, offset: u64, now_ns: u64| {
        let (id, _) = state
            .streams
            .on_read(offset, length, 64 * MIB, BLOCK, 1 << 30, now_ns);
        state.streams.answered(id);
        id
    };
    // A stream that stopped two seconds ago, and one reading now.
    let mut stopped = 0;
    for i in 0..3 {
        stopped = on_read(&mut state, (512 * MIB) + i * length, i);
    }
    let now = 2 * SECOND_NS;
    let mut reading = 0;
    for i in 0..16 {
        reading = on_read(&mut state, i * length, now + i);
    }
    let window = state.streams.window_at(16 * length).unwrap();
    let segments = [
        // (start, stream, read up to, last use)
        (0, reading, MIB, 4),
        (512 * MIB, stopped, 512 * MIB, 5),
        (MIB, reading, MIB + 256 * 1024, 3),
        (2 * MIB, reading, 2 * MIB, 2),
    ];
    for (start, stream, read_end, last_use) in segments {
        budget.hold(MIB);
        state.hold_segment(
            start,
            Segment {
                end: start + MIB,
                buf: AlignedBuf::new(MIB as usize),
                stream,
                read_end,
                last_use,
            },
        );
        if read_end >= start + MIB {
            state.passed.push_back(start);
        }
    }
    let held = |state: &State| state.segments.keys().copied().collect::<Vec<_>>();
    let mut wasted = 0;
    assert!(state.make_room(MIB, &budget, &mut wasted, now + 100));
    assert_eq!(wasted, 0, "the segment its reader passed went first");
    assert_eq!(held(&state), [MIB, 2 * MIB, 512 * MIB]);
    assert!(state.make_room(2 * MIB, &budget, &mut wasted, now + 100));
    assert_eq!(wasted, MIB, "then the stopped stream's");
    assert_eq!(held(&state), [MIB, 2 * MIB]);
    assert!(state.make_room(3 * MIB, &budget, &mut wasted, now + 100));
    assert_eq!(held(&state), [MIB], "then the least recently used");
    assert_eq!(wasted, 2 * MIB);
    assert!(
        !state.make_room(5 * MIB, &budget, &mut wasted, now + 100),
        "more than the bound"
    );
    assert_eq!(wasted, 2 * MIB + 768 * 1024, "only what was unread counts");
    assert_eq!(
        state.streams.window_at(16 * length),
        Some(window),
        "the window holds until the reader reaches what went"
    );
    let mut offset = 16 * length;
    while offset <= MIB + 256 * 1024 {
        on_read(&mut state, offset, now + 200);
        offset += length;
    }
    assert!(state.streams.window_at(offset).unwrap() <= window / 2);
}

#[test]
fn passes_over_the_same_range_read_their_bytes_and_hold_no_overlapping_data() {
    for seed in 0..50 {
        // Half the seeds with read-aheads that fail now and then: their
        // readers go to the device themselves.
        let fail_longer_than = if seed % 2 == 0 { u64::MAX } else { 128 << 10 };
        let held = HeldStore::new();
        let store = ReadaheadStore::new(held.clone(), &ReadaheadBudget::new(Some(4 << 20)));
        let mut rng = Rng::new(seed);
        let pattern: Vec<u8> = (0..SIZE).map(|i| (i / 4096) as u8 ^ (i as u8)).collect();
        write(&store, 0, &pattern);
        // Passes of different request sizes and starting points, one after
        // another and two at once, so windows land over each other's.
        let passes: [(u64, u64); 3] = [(0, 64 << 10), (32 << 10, 128 << 10), (4096, 16 << 10)];
        for (start, length) in passes {
            let mut a = start;
            let mut b = start + (1 << 20);
            while b + length <= SIZE as u64 {
                for offset in [a, b] {
                    let got =
                        read_failing(&store, &held, &mut rng, offset, length, fail_longer_than);
                    assert_eq!(got, pattern[offset as usize..(offset + length) as usize]);
                }
                a += length;
                b += length;
            }
            let state = store.state();
            let mut end = 0;
            for (&s, segment) in &state.segments {
                assert!(s >= end, "seed {seed}: segments overlap at {s}");
                end = segment.end;
            }
            assert!(state.use_index_matches(), "seed {seed}");
        }
    }
}

#[test]
fn a_disk_stream_whose_reader_stopped_sends_no_more_windows() {
    let mut state = State::default();
    let length = 64 << 10;
    let read = |state: &mut State, i: u64, now_ns: u64| {
        let (id, plan) =
            state
                .streams
                .on_read(i * length, length, 64 << 20, BLOCK, 1 << 30, now_ns);
        state.streams.answered(id);
        plan
    };
    // A reader that runs ahead through what is held plans three windows
    // while the first is in the disk: one goes, two wait for it.
    let mut plans = Vec::new();
    let mut sent = Vec::new();
    let mut i = 0;
    while plans.len() < 3 {
        if let Some(plan) = read(&mut state, i, 10 + i) {
            let id = plans.len() as u64 + 1;
            state.fetches.insert(id, fetch(&plan));
            plans.push((id, plan));
            sent.extend(state.gate(vec![(id, plan)], true, 10 + i));
        }
        i += 1;
    }
    let stream = plans[0].1.stream;
    assert_eq!(ids(&sent), [1]);
    // The reader read while the first was in the disk: the next goes.
    state.fetches.remove(1);
    read(&mut state, i, 150);
    assert_eq!(ids(&state.landed(stream, plans[0].1.end, false, 200)), [2]);
    // It did not read while the second was: the third is dropped, and the
    // stream reads ahead from its start again when its reader returns.
    state.fetches.remove(2);
    assert!(state.landed(stream, plans[1].1.end, false, 300).is_empty());
    assert!(state.fetches.get(3).is_none());
    assert!(state.held.is_empty() && state.turns.is_empty());
    let dropped = plans[2].1;
    let next = (i + 1..i + 64)
        .find_map(|j| read(&mut state, j, 400 + j))
        .expect("it reads ahead again");
    assert_eq!(next.start, dropped.start);
}

fn fetch(plan: &Plan) -> Fetch {
    Fetch {
        start: plan.start,
        end: plan.end,
        stream: plan.stream,
        window_end: plan.end,
        stale: false,
        urgent: false,
        waiting: Vec::new(),
    }
}

fn ids(pieces: &[(u64, Plan)]) -> Vec<u64> {
    pieces.iter().map(|(id, _)| *id).collect()
}

/// Registers a window of `stream` at `start` in `pieces` pieces of 1 MiB
/// and returns them.
fn window(state: &mut State, stream: u64, start: u64, pieces: u64) -> Vec<(u64, Plan)> {
    let end = start + (pieces << 20);
    (0..pieces)
        .map(|k| {
            state.next_id += 1;
            let piece = Plan {
                stream,
                start: start + (k << 20),
                end: start + ((k + 1) << 20),
                urgent: false,
                deep: false,
                beside_others: false,
            };
            state.fetches.insert(
                state.next_id,
                Fetch {
                    window_end: end,
                    ..fetch(&piece)
                },
            );
            (state.next_id, piece)
        })
        .collect()
}

/// Lands `piece` and returns what goes next.
fn land(state: &mut State, (id, piece): (u64, Plan), now_ns: u64) -> Vec<(u64, Plan)> {
    state.fetches.remove(id);
    state.landed(piece.stream, piece.end, true, now_ns)
}

#[test]
fn on_a_disk_streams_read_ahead_in_turns() {
    let mut state = State::default();
    // Three streams each plan a window: one goes, the others wait in the
    // order they came.
    let first: Vec<_> = (1..=3).map(|s| window(&mut state, s, s << 30, 1)).collect();
    assert_eq!(ids(&state.gate(first[0].clone(), true, 100)), [1]);
    assert!(state.gate(first[1].clone(), true, 101).is_empty());
    assert!(state.gate(first[2].clone(), true, 102).is_empty());
    // Stream 1's lands: stream 2 goes, and stream 1's next waits behind
    // stream 3, which waited longer.
    assert_eq!(ids(&land(&mut state, first[0][0], 200)), [2]);
    let again = window(&mut state, 1, (1 << 30) + (1 << 20), 1);
    assert!(state.gate(again.clone(), true, 210).is_empty());
    assert_eq!(ids(&land(&mut state, first[1][0], 300)), [3]);
    assert_eq!(ids(&land(&mut state, first[2][0], 400)), [again[0].0]);
    // A stream alone on the disk never waits.
    assert!(land(&mut state, again[0], 500).is_empty());
    assert!(state.turns.is_empty() && state.waiting.is_empty());
    let alone = window(&mut state, 2, (2 << 30) + (1 << 20), 1);
    assert_eq!(ids(&state.gate(alone.clone(), true, 600)), [alone[0].0]);
}

#[test]
fn on_a_disk_a_window_goes_two_pieces_at_a_time_and_keeps_its_turn() {
    let mut state = State::default();
    let one = window(&mut state, 1, 0, 3);
    let other = window(&mut state, 2, 1 << 30, 1);
    assert_eq!(
        ids(&state.gate(one.clone(), true, 100)),
        [one[0].0, one[1].0]
    );
    assert!(state.gate(other.clone(), true, 110).is_empty());
    // Each piece of stream 1's window that lands sends the next; stream 2
    // waits for the whole of it, and stream 1's next window waits behind
    // stream 2.
    assert_eq!(ids(&land(&mut state, one[0], 200)), [one[2].0]);
    let next = window(&mut state, 1, 3 << 20, 1);
    assert!(state.gate(next.clone(), true, 210).is_empty());
    assert!(land(&mut state, one[1], 300).is_empty());
    assert_eq!(ids(&land(&mut state, one[2], 400)), [other[0].0]);
    assert_eq!(ids(&land(&mut state, other[0], 500)), [next[0].0]);
}

#[test]
fn on_a_disk_a_deep_clients_turn_takes_its_next_window_along() {
    let mut state = State::default();
    let deep = |mut w: Vec<(u64, Plan)>| {
        for (_, plan) in &mut w {
            plan.deep = true;
        }
        w
    };
    let first = deep(window(&mut state, 1, 0, 1));
    let second = deep(window(&mut state, 1, 1 << 20, 1));
    let third = deep(window(&mut state, 1, 2 << 20, 1));
    let other = window(&mut state, 2, 1 << 30, 1);
    assert_eq!(ids(&state.gate(first.clone(), true, 100)), [first[0].0]);
    assert!(state.gate(second.clone(), true, 101).is_empty());
    assert!(state.gate(other.clone(), true, 102).is_empty());
    assert!(state.gate(third.clone(), true, 103).is_empty());
    // The second window goes in the first's turn; then stream 2's turn
    // comes before the third.
    assert_eq!(ids(&land(&mut state, first[0], 200)), [second[0].0]);
    assert_eq!(ids(&land(&mut state, second[0], 300)), [other[0].0]);
    assert_eq!(ids(&land(&mut state, other[0], 400)), [third[0].0]);
}

#[test]
fn on_a_mirror_each_disk_serves_a_window() {
    let mut state = State {
        read_devices: 2,
        ..State::default()
    };
    let windows: Vec<_> = (1..=3).map(|s| window(&mut state, s, s << 30, 1)).collect();
    assert_eq!(ids(&state.gate(windows[0].clone(), true, 100)), [1]);
    assert_eq!(ids(&state.gate(windows[1].clone(), true, 101)), [2]);
    assert!(state.gate(windows[2].clone(), true, 102).is_empty());
    assert_eq!(ids(&land(&mut state, windows[1][0], 200)), [3]);
}

#[test]
fn a_prefetched_range_is_read_once_in_the_background_and_dropped_by_a_write() {
    let held = HeldStore::new();
    let store = ReadaheadStore::new(held.clone(), &ReadaheadBudget::new(Some(8 << 20)));
    let mut rng = Rng::new(3);
    let pattern: Vec<u8> = (0..SIZE)
        .map(|i| (i / 4096) as u8 ^ (i as u8 >> 1))
        .collect();
    write(&store, 0, &pattern);
    store.prefetch(1 << 20, 512 << 10);
    assert_eq!(
        *held.in_device.lock().unwrap(),
        vec![(1 << 20, 512 << 10, IoClass::AsyncRead)],
        "one background read of the range"
    );
    // Asked again while it is in flight: nothing more is read.
    store.prefetch(1 << 20, 256 << 10);
    assert_eq!(held.reads.load(Ordering::Relaxed), 1);
    while held.release_one(&mut rng) {}
    for at in [1 << 20, (1 << 20) + (128 << 10), (1 << 20) + (448 << 10)] {
        let got = read(&store, &held, &mut rng, at, 64 << 10);
        assert_eq!(got, pattern[at as usize..at as usize + (64 << 10)]);
    }
    assert_eq!(
        held.reads.load(Ordering::Relaxed),
        1,
        "the reads found it held"
    );
    // A write drops what it overlaps: the next read goes to the store.
    let new = vec![0xa5u8; 4096];
    write(&store, (1 << 20) + 8192, &new);
    let got = read(&store, &held, &mut rng, 1 << 20, 16 << 10);
    assert_eq!(&got[8192..12288], &new[..]);
    assert_eq!(held.reads.load(Ordering::Relaxed), 2);
    // A hint larger than its share of the memory is cut to the share.
    store.prefetch(4 << 20, 4 << 20);
    let longest = held.in_device.lock().unwrap().iter().map(|e| e.1).max();
    assert_eq!(longest, Some(1 << 20), "an eighth of 8 MiB");
    while held.release_one(&mut rng) {}
}
