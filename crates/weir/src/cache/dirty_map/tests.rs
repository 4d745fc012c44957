use super::*;
use crate::rng::Rng;

struct Vec8(Vec<u8>);

impl Bytes for Vec8 {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

fn data(value: u8, len: usize) -> Arc<dyn Bytes> {
    Arc::new(Vec8(vec![value; len]))
}

type Map = DirtyMap<u32, u32>;

fn read(map: &Map, disk: &[u8], start: u64, end: u64) -> Vec<u8> {
    let mut buf = disk[start as usize..end as usize].to_vec();
    for span in map.spans(start, end) {
        span.copy_into(&mut buf, start);
    }
    buf
}

#[test]
fn newer_writes_win_and_reads_see_every_cached_byte() {
    let mut map = Map::default();
    map.write(0, data(1, 8));
    map.write(4, data(2, 8));
    map.write(2, data(3, 2));
    let disk = vec![9u8; 16];
    assert_eq!(
        read(&map, &disk, 0, 16),
        [1, 1, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 9, 9, 9, 9]
    );
    assert!(map.covers(0, 12));
    assert!(!map.covers(0, 13));
    assert_eq!(map.dirty_bytes(), 12);
    assert_eq!(map.dirty_ranges(0, 16), vec![(0, 12)]);
}

#[test]
fn adjacent_pieces_go_out_as_one_run_and_leave_on_success() {
    let mut map = Map::default();
    map.write(0, data(1, 4));
    map.write(4, data(2, 4));
    map.write(100, data(3, 4));
    let runs = map.next_writebacks(8, u64::MAX, 1 << 20, true);
    assert_eq!(runs.len(), 2);
    assert_eq!((runs[0].start, runs[0].end), (0, 8));
    assert_eq!((runs[1].start, runs[1].end), (100, 104));
    for run in &runs {
        map.writeback_done(run.id, true);
    }
    assert!(map.is_clean());
    assert_eq!(map.dirty_bytes(), 0);
}

#[test]
fn without_pressure_only_settled_pieces_go_out() {
    let mut map = Map::default();
    map.write(0, data(1, 4));
    assert!(map.next_writebacks(8, u64::MAX, 1 << 20, false).is_empty());
    map.settle();
    map.write(100, data(2, 4));
    let runs = map.next_writebacks(8, u64::MAX, 1 << 20, false);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].start, 0);
}

#[test]
fn a_flush_waits_for_earlier_writes_even_when_newer_bytes_replace_them() {
    let mut map = Map::default();
    map.write(0, data(1, 4));
    map.flush(10);
    assert!(map.ready().flushes.is_empty());
    // A newer write replaces the bytes before they went out: the flush
    // now waits for the newer bytes.
    map.write(0, data(2, 4));
    assert!(map.ready().flushes.is_empty());
    let runs = map.next_writebacks(8, u64::MAX, 1 << 20, false);
    assert_eq!(runs.len(), 1, "the flush makes the piece urgent");
    assert!(runs[0].urgent);
    map.writeback_done(runs[0].id, true);
    assert_eq!(map.ready().flushes, vec![10]);
}

#[test]
fn bytes_replacing_a_piece_in_flight_wait_for_it_and_the_flush_needs_only_the_old_write() {
    let mut map = Map::default();
    map.write(0, data(1, 4));
    let first = map.next_writebacks(8, u64::MAX, 1 << 20, true);
    map.flush(10);
    map.write(0, data(2, 4));
    // The newer bytes overlap a write in flight: they wait.
    assert!(map.next_writebacks(8, u64::MAX, 1 << 20, true).is_empty());
    assert!(map.ready().flushes.is_empty());
    map.writeback_done(first[0].id, true);
    // The answered write is in the store; the newer one came after the
    // flush was sent and need not be.
    assert_eq!(map.ready().flushes, vec![10]);
    assert_eq!(map.dirty_bytes(), 4);
    let second = map.next_writebacks(8, u64::MAX, 1 << 20, true);
    assert_eq!(second.len(), 1);
}

#[test]
fn the_bytes_ahead_of_a_write_past_the_budget_go_first_but_in_the_background() {
    let mut map = Map::default();
    map.write(0, data(1, 8));
    map.write(100, data(3, 8));
    map.direct(2, 6, false, 7);
    let runs = map.next_writebacks(1, u64::MAX, 1 << 20, false);
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].start, runs[0].end),
        (0, 8),
        "the bytes ahead of the direct op first"
    );
    assert!(
        !runs[0].urgent,
        "no client waits on a write larger than the budget"
    );
}

#[test]
fn a_direct_op_goes_after_older_bytes_and_before_newer_ones() {
    let mut map = Map::default();
    map.write(0, data(1, 8));
    map.direct(2, 6, true, 7);
    assert!(map.ready().directs.is_empty(), "older bytes first");
    map.write(4, data(2, 4));
    let runs = map.next_writebacks(8, u64::MAX, 1 << 20, false);
    assert_eq!(runs.len(), 1, "only the older bytes are urgent");
    assert_eq!((runs[0].start, runs[0].end), (0, 4));
    assert!(runs[0].urgent, "a client waits on the direct op");
    assert!(map.ready().directs.is_empty(), "writeback in flight");
    map.writeback_done(runs[0].id, true);
    let ready = map.ready();
    assert_eq!(ready.directs.len(), 1);
    let (id, token) = ready.directs[0];
    assert_eq!(token, 7);
    // The newer bytes over the direct op's range wait for it.
    assert!(map.next_writebacks(8, u64::MAX, 1 << 20, true).is_empty());
    map.direct_done(id);
    assert_eq!(map.next_writebacks(8, u64::MAX, 1 << 20, true).len(), 1);
}

#[test]
fn waiting_direct_ops_move_exactly_when_what_blocks_them_goes() {
    let mut map = Map::default();
    // Three direct ops wait: one behind cached bytes, one behind it, and
    // one behind bytes elsewhere.
    map.write(0, data(1, 8));
    map.write(100, data(2, 8));
    map.direct(0, 4, false, 10);
    map.direct(2, 6, false, 11);
    map.direct(100, 104, false, 12);
    // One that blocks on nothing goes at once, past those that wait.
    map.direct(50, 54, false, 13);
    let tokens = |ready: Ready<u32, u32>| ready.directs.iter().map(|d| d.1).collect::<Vec<_>>();
    assert_eq!(tokens(map.ready()), vec![13]);
    let runs = map.next_writebacks(8, u64::MAX, 1 << 20, false);
    assert_eq!(runs.len(), 2, "the bytes ahead of both groups go out");
    let first = runs.iter().find(|r| r.start == 0).expect("run at 0").id;
    let second = runs.iter().find(|r| r.start == 100).expect("run at 100").id;
    // The run elsewhere finishing moves only the op behind it.
    map.writeback_done(second, true);
    assert_eq!(tokens(map.ready()), vec![12]);
    assert!(map.ready().directs.is_empty(), "nothing else changed");
    // The first run finishing frees the op behind it; the one behind
    // that op waits for it to be in the store, then goes.
    map.writeback_done(first, true);
    let ready = map.ready();
    assert_eq!(
        ready.directs.iter().map(|d| d.1).collect::<Vec<_>>(),
        vec![10]
    );
    assert!(map.ready().directs.is_empty(), "overlaps the op in flight");
    map.direct_done(ready.directs[0].0);
    assert_eq!(tokens(map.ready()), vec![11]);
    map.check_invariants();
}

#[test]
fn a_newer_write_over_the_bytes_a_direct_op_waits_for_lets_it_go() {
    let mut map = Map::default();
    map.write(0, data(1, 8));
    map.direct(0, 8, false, 7);
    assert!(map.ready().directs.is_empty(), "older bytes first");
    // Newer bytes replace the older ones: nothing older is left for the
    // direct op to follow, and the newer bytes wait for it instead.
    map.write(0, data(2, 8));
    assert_eq!(map.ready().directs.len(), 1);
    assert!(map.next_writebacks(8, u64::MAX, 1 << 20, true).is_empty());
}

#[test]
fn a_failed_writeback_keeps_its_bytes_and_fails_the_map() {
    let mut map = Map::default();
    map.write(0, data(1, 4));
    map.flush(3);
    let runs = map.next_writebacks(8, u64::MAX, 1 << 20, true);
    map.writeback_done(runs[0].id, false);
    assert!(map.failed());
    assert_eq!(read(&map, &[0; 4], 0, 4), [1; 4]);
    assert!(map.ready().flushes.is_empty());
    assert_eq!(map.take_waiting(), (vec![3], vec![]));
    assert!(map.next_writebacks(8, u64::MAX, 1 << 20, true).is_empty());
}

/// Writes, flushes, direct ops and writebacks in random order, with
/// store writes completing out of order, against a model of what each
/// byte must hold: reads always see the newest bytes, and at a crash the
/// store holds, for every byte, the last write answered before the last
/// finished flush or something newer.
#[test]
fn random_histories_keep_reads_exact_and_flushes_durable() {
    const SPACE: u64 = 64;
    for seed in 0..400 {
        let mut rng = Rng::new(seed);
        let mut map = Map::default();
        // Volatile store, and what the store has made durable.
        let mut disk = vec![0u8; SPACE as usize];
        let mut durable = disk.clone();
        // The newest generation per byte, and per byte the generation
        // each flush promised.
        let mut newest = vec![0u64; SPACE as usize];
        let mut promised = vec![0u64; SPACE as usize];
        // Store writes in flight: (id, start, bytes, generation of a direct op)
        let mut flying: Vec<(u64, u64, Vec<u8>, Option<u64>)> = Vec::new();
        let mut flush_marks: Vec<(u32, Vec<u64>)> = Vec::new();
        let mut directs: Vec<(u32, u64, Vec<u8>, u64)> = Vec::new();
        let mut gen_of_value = vec![0u64; 256];
        let mut next_value = 1u8;
        let mut flush_token = 0u32;
        for _ in 0..200 {
            match rng.below(10) {
                0..=3 => {
                    let start = rng.below(SPACE - 1);
                    let len = 1 + rng.below((SPACE - start).min(8));
                    let value = next_value;
                    next_value = next_value.wrapping_add(1).max(1);
                    let gen = map.write(start, data(value, len as usize));
                    gen_of_value[value as usize] = gen;
                    for b in start..start + len {
                        newest[b as usize] = gen;
                    }
                }
                4 => {
                    flush_token += 1;
                    map.flush(flush_token);
                    flush_marks.push((flush_token, newest.clone()));
                }
                5 => {
                    let start = rng.below(SPACE - 1);
                    let len = 1 + rng.below((SPACE - start).min(8));
                    let value = next_value;
                    next_value = next_value.wrapping_add(1).max(1);
                    let gen = map.direct(
                        start,
                        start + len,
                        value.is_multiple_of(2),
                        u32::from(value),
                    );
                    gen_of_value[value as usize] = gen;
                    directs.push((u32::from(value), start, vec![value; len as usize], gen));
                }
                6..=7 => {
                    let pressure = rng.below(2) == 0;
                    if rng.below(3) == 0 {
                        map.settle();
                    }
                    for run in map.next_writebacks(
                        1 + rng.below(4) as usize,
                        1 + rng.below(32),
                        16,
                        pressure,
                    ) {
                        let mut bytes = vec![0u8; (run.end - run.start) as usize];
                        for span in &run.spans {
                            span.copy_into(&mut bytes, run.start);
                        }
                        flying.push((run.id, run.start, bytes, None));
                    }
                }
                _ => {
                    if !flying.is_empty() {
                        let (id, start, bytes, direct) =
                            flying.swap_remove(rng.below(flying.len() as u64) as usize);
                        disk[start as usize..start as usize + bytes.len()].copy_from_slice(&bytes);
                        if let Some(gen) = direct {
                            // Answered now: later reads must see it.
                            for b in start..start + bytes.len() as u64 {
                                newest[b as usize] = newest[b as usize].max(gen);
                            }
                            map.direct_done(id);
                        } else {
                            map.writeback_done(id, true);
                        }
                    }
                }
            }
            let ready = map.ready();
            map.check_invariants();
            for (id, token) in ready.directs {
                let index = directs.iter().position(|d| d.0 == token).unwrap();
                let (_, start, bytes, gen) = directs.swap_remove(index);
                flying.push((id, start, bytes, Some(gen)));
            }
            for token in ready.flushes {
                // The store flush: everything it has is durable.
                durable.copy_from_slice(&disk);
                let index = flush_marks.iter().position(|f| f.0 == token).unwrap();
                let (_, marks) = flush_marks.remove(index);
                for (p, m) in promised.iter_mut().zip(marks) {
                    *p = (*p).max(m);
                }
            }
            // Reads see the newest cached write, or the store where no
            // cached write is newer than what the store has.
            let seen = read(&map, &disk, 0, SPACE);
            for b in 0..SPACE as usize {
                let gen = gen_of_value[seen[b] as usize];
                assert!(
                    gen >= newest[b] || seen[b] == 0 && newest[b] == 0,
                    "seed {seed}: byte {b} reads generation {gen}, newest {}",
                    newest[b]
                );
            }
            // A crash now keeps `durable`: every promise must hold.
            for b in 0..SPACE as usize {
                let gen = gen_of_value[durable[b] as usize];
                assert!(
                    gen >= promised[b],
                    "seed {seed}: byte {b} durable generation {gen}, promised {}",
                    promised[b]
                );
            }
        }
    }
}
