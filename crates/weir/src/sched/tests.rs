//! The queue's modes on hand-made sequences of I/Os.

use super::*;

/// A background class the depth, passes and pieces govern. A scrub or a
/// resilver beside interactive work goes by its floor alone (floor.rs).
const BACKGROUND: IoClass = IoClass::Trim;

fn io(id: u64, class: IoClass, offset: u64, length: u64) -> QueuedIo {
    QueuedIo {
        id,
        class,
        offset,
        length,
        write: false,
    }
}

fn drain(queue: &mut IoQueue, now: u64) -> Vec<Dispatch> {
    std::iter::from_fn(|| queue.next_to_issue(now)).collect()
}

/// Ten 4 KiB reads one after another from `now`, each taking
/// `latency_ns`, with nothing else in the queue: clean samples for the
/// adaptive mode. Returns the time after the last.
fn clean_reads(queue: &mut IoQueue, mut now: u64, latency_ns: u64) -> u64 {
    for id in 0..10 {
        queue.enqueue(io(id, IoClass::SyncRead, id << 20, 4096), now);
        let d = queue.next_to_issue(now).unwrap();
        now += latency_ns;
        queue.complete(d.id, now);
    }
    now
}

/// An adaptive queue on flash that has measured both kinds of I/O: a
/// 4 KiB read takes 100 us alone, a 1 MiB scrub read 2 ms. Large scrub
/// reads now go in pieces. Returns the queue and the time.
fn flash_queue_with_measured_scrub() -> (IoQueue, u64) {
    let mut queue = IoQueue::new(Mode::Adaptive, false);
    let mut now = clean_reads(&mut queue, 0, 100_000);
    queue.enqueue(io(100, BACKGROUND, 0, 1 << 20), now);
    let d = queue.next_to_issue(now).unwrap();
    assert_eq!(d.length, 1 << 20, "no per-byte cost measured yet: whole");
    now += 2_000_000;
    assert_eq!(queue.complete(d.id, now).len(), 1);
    (queue, now)
}

#[test]
fn fifo_sends_everything_at_once_in_order() {
    let mut queue = IoQueue::new(Mode::Fifo, true);
    for id in 0..5 {
        queue.enqueue(io(id, BACKGROUND, (5 - id) << 20, 1 << 20), 0);
    }
    let ids: Vec<u64> = drain(&mut queue, 0).iter().map(|d| d.id).collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
}

#[test]
fn background_classes_go_in_lba_order_and_adjacent_reads_merge() {
    let mut queue = IoQueue::new(Mode::Zfs, true);
    // Out of order, adjacent, with one 16 KiB gap (filled) and one far away.
    queue.enqueue(io(1, IoClass::Scrub, 256 << 10, 128 << 10), 0);
    queue.enqueue(io(2, IoClass::Scrub, 0, 128 << 10), 0);
    queue.enqueue(io(3, IoClass::Scrub, 128 << 10, 128 << 10), 0);
    queue.enqueue(io(4, IoClass::Scrub, (400 << 10) + (16 << 10), 64 << 10), 0);
    queue.enqueue(io(5, IoClass::Scrub, 100 << 20, 4096), 0);
    let first = queue.next_to_issue(0).expect("one");
    assert_eq!(first.offset, 0);
    assert_eq!(
        first.ios.iter().map(|i| i.id).collect::<Vec<_>>(),
        vec![2, 3, 1, 4]
    );
    assert_eq!(first.length, (400 << 10) + (16 << 10) + (64 << 10));
    let done = queue.complete(first.id, 10);
    assert_eq!(done.len(), 4);
}

#[test]
fn read_ahead_goes_in_arrival_order_on_flash_and_in_lba_order_on_a_disk() {
    // Two streams' read-ahead: the higher stream's came first; the lower
    // stream's next window arrives while its first is queued.
    let order = |rotational: bool| {
        let mut queue = IoQueue::new(Mode::Zfs, rotational);
        queue.enqueue(io(1, IoClass::AsyncRead, 2 << 30, 1 << 20), 0);
        queue.enqueue(io(2, IoClass::AsyncRead, 0, 1 << 20), 0);
        queue.enqueue(io(3, IoClass::AsyncRead, 4 << 20, 1 << 20), 0);
        let mut ids = Vec::new();
        while let Some(d) = queue.next_to_issue(0) {
            ids.extend(d.ios.iter().map(|i| i.id));
            queue.complete(d.id, 0);
        }
        ids
    };
    assert_eq!(order(false), [1, 2, 3]);
    assert_eq!(order(true), [2, 3, 1]);
}

#[test]
fn zfs_lets_one_scrub_io_beside_interactive_reads_and_three_alone() {
    let mut queue = IoQueue::new(Mode::Zfs, true);
    for id in 0..8 {
        queue.enqueue(io(100 + id, IoClass::Scrub, (id * 8) << 20, 1 << 20), 0);
    }
    // Alone, scrub runs at its minimum (1) until five completions have
    // built the non-interactive credit up to zfs_vdev_nia_delay; then at
    // its maximum (3).
    let mut active = drain(&mut queue, 0);
    assert_eq!(active.len(), 1);
    for step in 1..=5 {
        let d = active.pop().unwrap();
        queue.complete(d.id, step);
        active.extend(drain(&mut queue, step));
    }
    assert_eq!(active.len(), 3, "credit reached: scrub max_active");
    // With a sync read active, scrub is held to min(credit, 1).
    let mut queue = IoQueue::new(Mode::Zfs, true);
    queue.enqueue(io(1, IoClass::SyncRead, 0, 4096), 0);
    for id in 0..4 {
        queue.enqueue(io(10 + id, IoClass::Scrub, (id * 8) << 20, 1 << 20), 0);
    }
    let issued = drain(&mut queue, 0);
    let scrubs = issued.iter().filter(|d| d.class == IoClass::Scrub).count();
    assert!(issued.iter().any(|d| d.class == IoClass::SyncRead));
    assert_eq!(scrubs, 1, "one scrub I/O beside an interactive read");
}

#[test]
fn adaptive_cuts_background_when_interactive_latency_rises_and_keeps_a_share() {
    let mut queue = IoQueue::new(Mode::Adaptive, true);
    // Clean interactive samples: 1 ms each, no background around.
    let mut now = clean_reads(&mut queue, 0, 1_000_000);
    // Reads beside a scrub I/O take 10 ms, alone 1 ms. Depth is cut to
    // zero, yet background still gets one I/O per share window.
    for id in 0..50 {
        queue.enqueue(io(1000 + id, BACKGROUND, id << 20, 1 << 20), now);
    }
    let mut scrub_issued = 0;
    let mut slow_reads = 0;
    for id in 0..200 {
        queue.enqueue(io(100 + id, IoClass::SyncRead, (id * 7) << 20, 4096), now);
        let ds = drain(&mut queue, now);
        let beside = ds.iter().any(|d| d.class == BACKGROUND);
        scrub_issued += ds.iter().filter(|d| d.class == BACKGROUND).count();
        slow_reads += usize::from(beside);
        now += if beside { 10_000_000 } else { 1_000_000 };
        for d in ds {
            queue.complete(d.id, now);
        }
    }
    assert!(scrub_issued > 0, "background never starves");
    assert!(
        slow_reads < 40,
        "background was cut: {slow_reads} of 200 reads had a scrub I/O beside them"
    );
}

#[test]
fn adaptive_sends_large_background_reads_in_pieces_and_completes_them_once() {
    let (mut queue, mut now) = flash_queue_with_measured_scrub();
    // Now measured: 1 MiB in 2 ms is ~1.9 ns a byte; half the slack
    // (50 us) buys ~26 KiB pieces.
    queue.enqueue(io(101, BACKGROUND, 1 << 20, 1 << 20), now);
    let mut pieces = 0;
    let mut covered = 0;
    let mut completed = Vec::new();
    while completed.is_empty() {
        let d = queue.next_to_issue(now).expect("the rest is sent");
        assert!(
            d.length < 1 << 20 && d.length.is_multiple_of(4096),
            "a piece: {}",
            d.length
        );
        assert_eq!(d.offset, (1 << 20) + covered);
        covered += d.length;
        pieces += 1;
        now += 50_000;
        completed = queue.complete(d.id, now);
    }
    assert_eq!(covered, 1 << 20, "the pieces cover the I/O exactly");
    assert!(pieces > 10, "{pieces} pieces");
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0].id, 101);
    assert_eq!(completed[0].length, 1 << 20, "the whole I/O comes back");
    assert!(queue.next_to_issue(now).is_none());
}

#[test]
fn adaptive_sends_read_ahead_whole_where_it_cuts_a_scrub_read() {
    let (mut queue, now) = flash_queue_with_measured_scrub();
    // Long after the reads, so that the device is background's.
    let now = now + 10_000_000;
    queue.enqueue(io(101, BACKGROUND, 1 << 20, 1 << 20), now);
    let scrub = queue.next_to_issue(now).expect("the scrub goes");
    assert!(
        scrub.length < 1 << 20,
        "the scrub read is cut: {}",
        scrub.length
    );
    queue.enqueue(io(102, IoClass::AsyncRead, 4 << 20, 1 << 20), now);
    let readahead = drain(&mut queue, now)
        .into_iter()
        .find(|d| d.class == IoClass::AsyncRead)
        .expect("the read-ahead goes");
    assert_eq!(readahead.length, 1 << 20, "read-ahead goes whole");
    assert_eq!(readahead.ios.len(), 1);
}

#[test]
fn switching_modes_with_ios_in_flight_completes_them_in_the_mode_that_issued_them() {
    let mut queue = IoQueue::new(Mode::Adaptive, true);
    queue.enqueue(io(1, IoClass::SyncRead, 0, 4096), 0);
    queue.enqueue(io(2, BACKGROUND, 1 << 20, 1 << 20), 0);
    let first = drain(&mut queue, 0);
    assert!(!first.is_empty());
    // Switch while they are in the device; more arrive under zfs.
    queue.set_mode(Mode::Zfs, 1);
    queue.enqueue(io(3, BACKGROUND, 8 << 20, 1 << 20), 1);
    queue.enqueue(io(4, IoClass::SyncRead, 4096, 4096), 1);
    let mut in_device: Vec<u64> = first.iter().map(|d| d.id).collect();
    in_device.extend(drain(&mut queue, 1).iter().map(|d| d.id));
    queue.set_mode(Mode::Adaptive, 2);
    let mut completed = Vec::new();
    let mut now = 2;
    loop {
        if let Some(id) = in_device.pop() {
            now += 1000;
            completed.extend(queue.complete(id, now).into_iter().map(|i| i.id));
        } else if let Some(deadline) = queue.next_deadline(now) {
            // Held with nothing in the device: the driver's timer asks again.
            now = deadline;
        } else {
            break;
        }
        in_device.extend(drain(&mut queue, now).iter().map(|d| d.id));
    }
    completed.sort_unstable();
    assert_eq!(completed, vec![1, 2, 3, 4], "every I/O completes once");
    assert_eq!(queue.active_total(), 0);
    assert_eq!(queue.waiting_total(), 0);
}

#[test]
fn a_split_io_whose_rest_waits_when_the_mode_turns_fifo_still_completes_once() {
    let (mut queue, now) = flash_queue_with_measured_scrub();
    queue.enqueue(io(101, BACKGROUND, 1 << 20, 1 << 20), now);
    let first = queue.next_to_issue(now).expect("a first piece");
    assert_eq!(first.piece_of, Some(101));
    assert!(first.length < 1 << 20);
    // The rest waits; the mode changes under it.
    queue.set_mode(Mode::Fifo, now);
    let rest = queue.next_to_issue(now).expect("the rest goes at once");
    assert_eq!(rest.piece_of, Some(101), "as the I/O's last piece");
    assert_eq!(rest.offset, (1 << 20) + first.length);
    assert_eq!(rest.offset + rest.length, 2 << 20, "all of the rest");
    assert!(queue.next_to_issue(now).is_none());
    assert!(
        queue.complete(rest.id, now + 1).is_empty(),
        "a piece is still out"
    );
    let done = queue.complete(first.id, now + 2);
    assert_eq!(done.len(), 1);
    assert_eq!((done[0].id, done[0].length), (101, 1 << 20));
    assert_eq!(queue.active_total(), 0);
    assert_eq!(queue.waiting_total(), 0);
}

#[test]
fn adaptive_sends_one_background_io_at_a_time_until_it_has_measured_one() {
    let mut queue = IoQueue::new(Mode::Adaptive, true);
    queue.enqueue(io(1, IoClass::SyncRead, 0, 4096), 0);
    for id in 0..4 {
        queue.enqueue(io(10 + id, BACKGROUND, (id + 1) << 20, 1 << 20), 0);
    }
    let first = drain(&mut queue, 0);
    let read = first
        .iter()
        .find(|d| d.class == IoClass::SyncRead)
        .expect("the read goes at once");
    let beside = first.iter().filter(|d| d.class == BACKGROUND).count();
    assert!(beside <= 1, "nothing measured: at most one beside the read");
    queue.complete(read.id, 1_000);
    let after = drain(&mut queue, 1_000);
    assert_eq!(
        beside + after.len(),
        1,
        "one background I/O out once the read is done, not all four"
    );
    assert!(
        drain(&mut queue, 2_000).is_empty(),
        "still one while it is out"
    );
}

/// Scrub I/Os sent while a read was in the device, over reads 20-99 of a
/// pattern where each read takes 1 ms and is followed by `gap_ns` with
/// background alone.
fn background_passing_reads(gap_ns: u64) -> usize {
    let mut queue = IoQueue::new(Mode::Adaptive, true);
    light_then(&mut queue, gap_ns).1
}

/// Runs that pattern on `queue`; returns the time and the count.
fn light_then(queue: &mut IoQueue, gap_ns: u64) -> (u64, usize) {
    let queue = &mut *queue;
    let mut now = clean_reads(queue, 0, 1_000_000);
    for id in 0..2000 {
        queue.enqueue(io(1000 + id, BACKGROUND, id << 20, 1 << 20), now);
    }
    let mut passed = 0;
    for id in 0..100 {
        queue.enqueue(io(100 + id, IoClass::SyncRead, (id * 7) << 20, 4096), now);
        let with_read = drain(queue, now);
        assert_eq!(
            with_read[0].class,
            IoClass::SyncRead,
            "interactive goes first"
        );
        if id >= 20 {
            passed += with_read.iter().filter(|d| d.class == BACKGROUND).count();
        }
        now += 1_000_000;
        for d in with_read {
            queue.complete(d.id, now);
        }
        if gap_ns > 0 {
            let alone = drain(queue, now);
            now += gap_ns;
            for d in alone {
                queue.complete(d.id, now);
            }
        }
    }
    (now, passed)
}

#[test]
fn adaptive_lets_background_pass_dense_interactive_work_only() {
    assert_eq!(
        background_passing_reads(10_000_000),
        0,
        "gaps ten times the busy periods: background waits for the read"
    );
    assert!(
        background_passing_reads(0) > 0,
        "back-to-back reads: background passes them as far as the depth allows"
    );
}

#[test]
fn adaptive_passes_a_saturating_load_that_follows_a_light_one() {
    let mut queue = IoQueue::new(Mode::Adaptive, true);
    let (mut now, passed) = light_then(&mut queue, 10_000_000);
    assert_eq!(passed, 0);
    // Now reads overlap, so one is always in the device: the busy period
    // never ends, and background must pass it once it outlasts the gaps.
    let mut in_device = Vec::new();
    let mut scrub_beside = 0;
    for id in 0..200 {
        queue.enqueue(io(5000 + id, IoClass::SyncRead, (id * 13) << 20, 4096), now);
        let ds = drain(&mut queue, now);
        scrub_beside += ds.iter().filter(|d| d.class == BACKGROUND).count();
        in_device.extend(ds.iter().map(|d| d.id));
        now += 1_000_000;
        // Everything but the newest read completes.
        let newest = in_device.pop().expect("the read was sent");
        for id in in_device.drain(..) {
            queue.complete(id, now);
        }
        in_device.push(newest);
    }
    assert!(scrub_beside > 0, "a saturating reader starved the scrub");
}

/// An adaptive queue on a rotating device that has measured a 4 KiB read
/// at 10 ms alone, after 40 back-to-back reads with a scrub queued, and
/// the scrub I/Os it then sends to the device.
/// Returns the queue, the time, those pieces and the next free I/O id.
fn rotating_queue_after_dense_reads() -> (IoQueue, u64, Vec<Dispatch>, u64) {
    let mut queue = IoQueue::new(Mode::Adaptive, true);
    let mut now = clean_reads(&mut queue, 0, 10_000_000);
    for id in 0..2000 {
        queue.enqueue(io(1000 + id, BACKGROUND, id << 16, 1 << 16), now);
    }
    // Back-to-back reads, each 10 ms: dense interactive work.
    for id in 0..40 {
        queue.enqueue(io(100 + id, IoClass::SyncRead, (id * 7) << 30, 4096), now);
        let issued = drain(&mut queue, now);
        now += 10_000_000;
        for d in issued {
            queue.complete(d.id, now);
        }
    }
    let at_device = drain(&mut queue, now);
    (queue, now, at_device, 10_000)
}

#[test]
fn adaptive_sends_nothing_behind_a_lone_read_the_drive_is_serving() {
    // The scrub was held back beside the dense reads (the old rule let one
    // I/O pass each read here). With no background at the device, a piece
    // sent now would be served after the read, away from the head, and the
    // reader's next read would wait for its seek back.
    let (mut queue, now, at_device, id) = rotating_queue_after_dense_reads();
    for d in &at_device {
        queue.complete(d.id, now);
    }
    queue.enqueue(io(id, IoClass::SyncRead, 3 << 30, 4096), now);
    let with_read = drain(&mut queue, now);
    assert_eq!(
        with_read.iter().map(|d| d.class).collect::<Vec<_>>(),
        [IoClass::SyncRead],
        "no background beside a read the drive is already serving"
    );
    // Once the read is done and the drive is free, the scrub goes on.
    queue.complete(with_read[0].id, now + 10_000_000);
    let after = drain(&mut queue, now + 10_000_000);
    assert!(!after.is_empty() && after.iter().all(|d| d.class == BACKGROUND));
}

#[test]
fn adaptive_fills_a_gap_in_dense_interactive_work_but_not_in_light_work() {
    // Dense: back-to-back 10 ms reads stop (a mirror's reader moved to the
    // other copy). Right away background keeps its controlled depth; once
    // the gap has lasted a read's service time, it gets the full depth.
    let (mut queue, now, at_device, _) = rotating_queue_after_dense_reads();
    let full = adaptive::BACKGROUND_DEPTH_MAX as usize;
    assert!(
        at_device.len() < full,
        "{} background I/Os at once right after the reads",
        at_device.len()
    );
    let in_gap = drain(&mut queue, now + 11_000_000);
    assert_eq!(at_device.len() + in_gap.len(), full, "the gap is filled");
    // Light: 1 ms reads with 10 ms gaps. Eleven service times after the
    // last read the device is still not opened: the next read would find
    // it full.
    let mut queue = IoQueue::new(Mode::Adaptive, true);
    let (now, _) = light_then(&mut queue, 10_000_000);
    let in_gap = drain(&mut queue, now + 1_100_000);
    assert!(
        in_gap.len() < full,
        "{} background I/Os in a gap of light work",
        in_gap.len()
    );
}

#[test]
fn adaptive_does_not_take_a_clients_turnaround_for_a_pause() {
    // Flash through NBD: each 4 KiB read takes 100 us in the device, and
    // the client sends the next 120 us after the last one ends. That is
    // dense work whose gaps are longer than a service time, but they are
    // the client's turnaround, not a pause: background must not fill them.
    let mut queue = IoQueue::new(Mode::Adaptive, false);
    let mut now = clean_reads(&mut queue, 0, 100_000);
    for id in 0..2000 {
        queue.enqueue(io(1000 + id, BACKGROUND, id << 16, 1 << 16), now);
    }
    let mut in_device = Vec::new();
    for id in 0..60 {
        queue.enqueue(io(100 + id, IoClass::SyncRead, (id * 7) << 30, 4096), now);
        in_device.extend(drain(&mut queue, now).into_iter().map(|d| d.id));
        now += 100_000;
        for id in in_device.drain(..) {
            queue.complete(id, now);
        }
        now += 120_000;
    }
    // The last gap has just lasted a turnaround.
    let in_turnaround = drain(&mut queue, now);
    let full = adaptive::BACKGROUND_DEPTH_MAX as usize;
    assert!(
        in_turnaround.len() < full,
        "{} background I/Os in a turnaround",
        in_turnaround.len()
    );
    // A gap of ten turnarounds is a pause: background fills it, to what
    // the next read may find ahead of it.
    let in_pause = drain(&mut queue, now + 1_200_000);
    assert!(!in_pause.is_empty(), "nothing in the pause");
    // Once the reads count as gone, the device is background's.
    let idle = drain(&mut queue, now + 100 * 100_000);
    assert!(
        in_turnaround.len() + in_pause.len() + idle.len() >= full,
        "idle: {} + {} + {}",
        in_turnaround.len(),
        in_pause.len(),
        idle.len()
    );
}

/// Background depth once reads have stopped, on a device where the i-th
/// of n 4 KiB writebacks sent at once completes `finish_ns(i, n)` after
/// they were sent, after clean 4 KiB reads of `read_ns`.
fn idle_writeback_depth(
    rotational: bool,
    read_ns: u64,
    finish_ns: impl Fn(u64, u64) -> u64,
) -> usize {
    let mut queue = IoQueue::new(Mode::Adaptive, rotational);
    let mut now = clean_reads(&mut queue, 0, read_ns);
    // Long after the reads: interactive work is gone.
    now += 1_000_000_000;
    for id in 0..4000 {
        queue.enqueue(io(1000 + id, IoClass::AsyncWrite, id << 12, 4096), now);
    }
    let mut most = 0;
    for _ in 0..400 {
        let sent: Vec<u64> = drain(&mut queue, now).into_iter().map(|d| d.id).collect();
        let n = sent.len() as u64;
        most = most.max(sent.len());
        let mut last = now;
        for (i, id) in sent.into_iter().enumerate() {
            last = now + finish_ns(i as u64, n);
            queue.complete(id, last);
        }
        now = last;
    }
    most
}

#[test]
fn adaptive_idle_writeback_fills_a_parallel_device_but_not_a_serial_one() {
    let floor = adaptive::BACKGROUND_DEPTH_MAX as usize;
    // Flash that overlaps small writes: a batch of n takes 20 us plus
    // 1 us per write. Eight lone writes' time of work in the device is
    // over a hundred of them.
    let parallel = idle_writeback_depth(false, 100_000, |_, n| 20_000 + n * 1_000);
    assert!(parallel > 4 * floor, "parallel device: depth {parallel}");
    assert!(parallel <= adaptive::IDLE_DEPTH_CEILING as usize);
    // A device that serves writes one after another, 1 ms each: no deeper
    // than eight.
    let serial = idle_writeback_depth(false, 100_000, |i, _| (i + 1) * 1_000_000);
    assert_eq!(serial, floor, "serial device");
    // A disk: eight, whatever its writes seem to overlap (a lone write
    // after a read pays the seek that streaming writes do not).
    let disk = idle_writeback_depth(true, 8_000_000, |_, n| 8_000_000 + n * 1_000);
    assert_eq!(disk, floor, "rotational device");
}

/// A closed-loop reader that never pauses (its next read waits as the
/// last completes) beside a queue of 1 MiB writeback on a serial device:
/// a read takes 10 ms, a writeback 10 ms. Returns the device time each
/// class got.
fn dense_reader_beside(class: IoClass) -> (u64, u64) {
    let mut queue = IoQueue::new(Mode::Adaptive, true);
    let mut now = clean_reads(&mut queue, 0, 10_000_000);
    for id in 0..400 {
        let mut write = io(10_000 + id, class, id << 20, 1 << 20);
        write.write = true;
        queue.enqueue(write, now);
    }
    let (mut read_ns, mut background_ns) = (0, 0);
    for id in 0..400 {
        queue.enqueue(io(100 + id, IoClass::SyncRead, (id * 7) << 20, 4096), now);
        // The device serves what was sent one at a time, 10 ms each.
        for d in drain(&mut queue, now) {
            now += 10_000_000;
            if d.class.is_sync() {
                read_ns += 10_000_000;
            } else {
                background_ns += 10_000_000;
            }
            queue.complete(d.id, now);
        }
    }
    (read_ns, background_ns)
}

#[test]
fn adaptive_floors_writeback_resilver_and_scrub_beside_a_reader_that_never_pauses() {
    let (read_ns, writeback_ns) = dense_reader_beside(IoClass::AsyncWrite);
    let share = writeback_ns as f64 / (read_ns + writeback_ns) as f64;
    assert!(
        (0.35..=0.6).contains(&share),
        "writeback got {share:.2} of the device"
    );
    // A scrub's floor is what an eighth of its idle rate costs: here its
    // bytes cost the same beside reads as alone, so an eighth of the time.
    let (read_ns, scrub_ns) = dense_reader_beside(IoClass::Scrub);
    let share = scrub_ns as f64 / (read_ns + scrub_ns) as f64;
    assert!(
        (0.1..=0.2).contains(&share),
        "scrub got {share:.3} of the device"
    );
    // A resilver's, a third.
    let (read_ns, resilver_ns) = dense_reader_beside(IoClass::Resilver);
    let share = resilver_ns as f64 / (read_ns + resilver_ns) as f64;
    assert!(
        (0.2..=0.35).contains(&share),
        "resilver got {share:.3} of the device"
    );
}

/// What a reader that never pauses (its next read goes as the last one
/// completes) and a resilver got on a device that serves one I/O at a
/// time in order, 10 ms each: the resilver I/O sent behind a read is
/// still there when the next read comes. With `stuck`, another
/// background I/O never leaves the device, so no read is ever clean.
struct BesideResilver {
    /// The most reads in a row that found no resilver I/O in the device
    /// and saw none sent while they were there.
    alone_in_a_row: u32,
    /// The resilver's share of the device time after the first 1000 reads.
    late_share: f64,
}

fn reader_beside_resilver(reads_max: u64, stuck: bool) -> BesideResilver {
    let mut queue = IoQueue::new(Mode::Adaptive, true);
    let mut now = clean_reads(&mut queue, 0, 10_000_000);
    if stuck {
        queue.enqueue(io(9_999, BACKGROUND, 1 << 40, 4096), now);
        assert_eq!(drain(&mut queue, now).len(), 1, "the stuck I/O goes");
    }
    for id in 0..4000 {
        queue.enqueue(io(10_000 + id, IoClass::Resilver, id << 20, 1 << 20), now);
    }
    let mut device = std::collections::VecDeque::new();
    let mut reads = 0;
    queue.enqueue(io(100, IoClass::SyncRead, 0, 4096), now);
    device.extend(drain(&mut queue, now));
    let (mut read_ns, mut resilver_ns) = (0u64, 0u64);
    let (mut alone_run, mut alone_in_a_row) = (0, 0);
    let mut read_alone = false;
    while reads < reads_max {
        let d: Dispatch = device.pop_front().expect("the reader keeps a read queued");
        now += 10_000_000;
        queue.complete(d.id, now);
        let late = u64::from(reads >= 1000);
        if d.class.is_sync() {
            read_ns += late * 10_000_000;
            reads += 1;
            if read_alone {
                alone_run += 1;
                alone_in_a_row = alone_in_a_row.max(alone_run);
            } else {
                alone_run = 0;
            }
            read_alone = device.is_empty();
            queue.enqueue(
                io(100 + reads, IoClass::SyncRead, (reads * 7) << 20, 4096),
                now,
            );
        } else {
            resilver_ns += late * 10_000_000;
        }
        let sent = drain(&mut queue, now);
        read_alone &= sent.iter().all(|s| s.class.is_sync());
        device.extend(sent);
    }
    BesideResilver {
        alone_in_a_row,
        late_share: resilver_ns as f64 / (read_ns + resilver_ns) as f64,
    }
}

#[test]
fn a_floor_waits_while_the_clean_latency_is_measured_again() {
    // Long enough that the clean latency is due to be taken again.
    let run = reader_beside_resilver(2000, false);
    // Clean samples need reads with no background beside them. A floor
    // that kept sending while they were wanted left none, and background
    // got no depth again, only its floor.
    assert!(
        run.alone_in_a_row >= 8,
        "at most {} reads in a row went alone",
        run.alone_in_a_row
    );
    // The floor still holds.
    assert!(
        (0.2..=0.4).contains(&run.late_share),
        "resilver got {:.3} of the device",
        run.late_share
    );
}

#[test]
fn a_floor_waits_for_clean_samples_only_so_long() {
    // No read is ever clean: the floor must not wait for one forever.
    let run = reader_beside_resilver(3000, true);
    assert!(
        (0.2..=0.4).contains(&run.late_share),
        "resilver got {:.3} of the device",
        run.late_share
    );
}

/// The rate (bytes per second) at which `measured`'s I/Os complete over
/// two seconds beside a QD1 reader of 4 KiB that never pauses (its next
/// read goes as the last one completes), on an adaptive flash queue that
/// has measured clean reads of 100 us and holds the background `queued`
/// put in it. `done_at` says when the device finishes a dispatch sent at
/// a time, given the dispatches in it with when each is done;
/// `completed` hears every background completion, to queue more.
fn rate_beside_reader(
    measured: IoClass,
    queued: impl FnOnce(&mut IoQueue, u64),
    mut done_at: impl FnMut(&Dispatch, u64, &[(u64, Dispatch)]) -> u64,
    mut completed: impl FnMut(&mut IoQueue, &Dispatch, u64),
) -> f64 {
    let mut queue = IoQueue::new(Mode::Adaptive, false);
    let start = clean_reads(&mut queue, 0, 100_000);
    let mut now = start;
    queued(&mut queue, now);
    let mut next_read = 1 << 40;
    queue.enqueue(io(next_read, IoClass::SyncRead, 7 << 30, 4096), now);
    let mut in_device: Vec<(u64, Dispatch)> = Vec::new();
    let mut moved = 0u64;
    while now < start + 2_000_000_000 {
        for d in drain(&mut queue, now) {
            let done = done_at(&d, now, &in_device);
            in_device.push((done, d));
        }
        let first = (0..in_device.len())
            .min_by_key(|i| in_device[*i].0)
            .expect("the reader always has a read in the device");
        let (done, d) = in_device.swap_remove(first);
        now = done;
        queue.complete(d.id, now);
        if d.class == measured {
            moved += d.length;
        }
        if d.class.is_sync() {
            next_read += 1;
            queue.enqueue(
                io(next_read, IoClass::SyncRead, (next_read * 7) << 30, 4096),
                now,
            );
        } else {
            completed(&mut queue, &d, now);
        }
    }
    moved as f64 / ((now - start) as f64 / 1e9)
}

/// Writeback's rate beside the reader: `rate_beside_reader` with
/// nothing queued on completions.
fn writeback_rate_beside_reader(
    queued: impl FnOnce(&mut IoQueue, u64),
    done_at: impl FnMut(&Dispatch, u64, &[(u64, Dispatch)]) -> u64,
) -> f64 {
    rate_beside_reader(IoClass::AsyncWrite, queued, done_at, |_, _, _| {})
}

/// Queue `count` writeback writes of `bytes` each.
fn queue_writeback(queue: &mut IoQueue, now: u64, count: u64, bytes: u64) {
    for id in 0..count {
        let mut write = io(10_000 + id, IoClass::AsyncWrite, id << 30, bytes);
        write.write = true;
        queue.enqueue(write, now);
    }
}

/// Writeback's rate beside the reader on a flash-like device that serves
/// reads and writes side by side: a 4 KiB read takes 100 us alone and
/// `read_beside_ns` with writeback in the device; a write takes 300 us of
/// firmware time plus 2 ns per byte.
fn writeback_rate_beside_reader_on_parallel_device(write_bytes: u64, read_beside_ns: u64) -> f64 {
    writeback_rate_beside_reader(
        |queue, now| queue_writeback(queue, now, 4000, write_bytes),
        |d, now, in_device| {
            let writes_in_device = in_device.iter().any(|(_, d)| d.write);
            now + match (d.class.is_sync(), writes_in_device) {
                (true, false) => 100_000,
                (true, true) => read_beside_ns,
                (false, _) => 300_000 + 2 * d.length,
            }
        },
    )
}

#[test]
fn adaptive_writeback_floor_counts_device_time_not_pieces_on_a_parallel_device() {
    // Reads three times slower beside writeback hold the controlled depth
    // at nothing; reads unharmed let writeback go by the depth, in pieces.
    // Either way the floor owes writeback half the device's time, and a
    // write shares the device with the read beside it, so writeback
    // should move most of what it moves alone. Charging whole writes by
    // the cost per byte of 4 KiB pieces (their fixed cost spread over
    // their few bytes) gave it about half, and 4 KiB pieces that each pay
    // the fixed cost gave it a tenth.
    for read_beside_ns in [300_000, 100_000] {
        for write_bytes in [1 << 20, 64 << 10] {
            let alone = write_bytes as f64 / ((300_000 + 2 * write_bytes) as f64 / 1e9);
            let rate = writeback_rate_beside_reader_on_parallel_device(write_bytes, read_beside_ns);
            assert!(
                rate >= 0.75 * alone,
                "{write_bytes} B writes, reads of {read_beside_ns} ns beside them: \
                 writeback moved {:.1} MB/s beside the reader, {:.1} alone",
                rate / 1e6,
                alone / 1e6
            );
        }
    }
}

#[test]
fn linear_cost_separates_fixed_cost_from_cost_per_byte() {
    let mut cost = estimate::LinearCost::default();
    assert_eq!(cost.cost(4096), None);
    cost.record(8192.0, 300_000.0 + 2.0 * 8192.0);
    // One length: its cost, scaled.
    let scaled = cost.cost(16384).unwrap();
    assert!((scaled - 2.0 * (300_000.0 + 2.0 * 8192.0)).abs() < 1.0);
    for _ in 0..4 {
        cost.record(1048576.0, 300_000.0 + 2.0 * 1048576.0);
        cost.record(8192.0, 300_000.0 + 2.0 * 8192.0);
    }
    let whole = cost.cost(1 << 20).unwrap();
    assert!(
        (whole - (300_000.0 + 2.0 * 1048576.0)).abs() < 1_000.0,
        "fitted {whole} ns"
    );
}

#[test]
fn linear_cost_waits_for_settled_points_before_drawing_its_line() {
    // A disk's first read pays a long seek: 520 KiB in 20 ms. Reads of
    // 1 MiB that follow stream at 2.7 ms each. Through that one sample the
    // line has no slope (reads would cost nothing per byte); settled
    // points draw no line until the short length has been timed again.
    let mut cost = estimate::LinearCost::default();
    cost.record(520_192.0, 20e6);
    for _ in 0..8 {
        cost.record(1048576.0, 2.7e6);
    }
    assert_eq!(cost.parts().map(|(_, per_byte)| per_byte), Some(0.0));
    assert_eq!(cost.parts_after(4), None);
    // Short reads that seek as far, timed a few times: a line again.
    for _ in 0..3 {
        cost.record(520_192.0, 20e6);
    }
    assert_eq!(cost.parts_after(4), cost.parts());
}

#[test]
fn adaptive_background_pieces_are_large_enough_to_pay_their_fixed_cost() {
    // Flash: a write costs 300 us of firmware commit plus 2 ns per byte.
    // Pieces sized by the cost per byte of the first whole write would be
    // a few KiB, each paying the commit; once the commit is told apart
    // from the cost per byte, no piece is shorter than the commit's worth
    // of bytes (150 KB).
    let mut queue = IoQueue::new(Mode::Adaptive, false);
    let mut now = clean_reads(&mut queue, 0, 100_000);
    let mut writes = Vec::new();
    for id in 0..6 {
        let mut write = io(100 + id, IoClass::AsyncWrite, id << 30, 1 << 20);
        write.write = true;
        queue.enqueue(write, now);
        let mut pieces = Vec::new();
        while let Some(d) = queue.next_to_issue(now) {
            pieces.push(d.length);
            now += 300_000 + 2 * d.length;
            queue.complete(d.id, now);
        }
        assert_eq!(pieces.iter().sum::<u64>(), 1 << 20);
        writes.push(pieces);
    }
    assert!(
        writes[1][0] < 1 << 16,
        "the first piece is sized by cost per byte: {writes:?}"
    );
    let last = writes.last().unwrap();
    assert!(
        last[..last.len() - 1].iter().all(|l| *l >= 140_000),
        "pieces of the last write after the fit: {last:?}"
    );
}

#[test]
fn promoted_read_ahead_goes_as_a_client_read_past_the_background_limit() {
    // A busy QD1 reader on a disk: background is held to its share, so a
    // read-ahead waits its turn behind the reader's reads.
    let mut queue = IoQueue::new(Mode::Adaptive, true);
    let mut now = clean_reads(&mut queue, 0, 10_000_000);
    queue.enqueue(io(100, IoClass::SyncRead, 900 << 20, 4096), now);
    let reader = queue.next_to_issue(now).expect("the reader goes");
    queue.enqueue(io(101, IoClass::AsyncRead, 4 << 20, 4 << 20), now);
    queue.enqueue(io(102, IoClass::AsyncRead, 64 << 20, 1 << 20), now);
    assert!(
        drain(&mut queue, now).is_empty(),
        "read-ahead waits beside a lone interactive read"
    );
    // A client now waits for the first read-ahead: it goes at once, as a
    // client read, and whole.
    assert_eq!(queue.promote((4 << 20) + 4096, 4096, now), 1);
    now += 1;
    let next = drain(&mut queue, now);
    assert_eq!((next[0].id, next[0].class), (101, IoClass::SyncRead));
    assert_eq!(next[0].length, 4 << 20);
    assert!(next[1..].iter().all(|d| d.class == IoClass::AsyncRead));
    queue.complete(reader.id, now + 1);
}

/// Writeback's rate, in 64 KiB writes, beside the reader and, with
/// `scrub`, a scrub of 1 MiB reads, on a device whose 4 KiB reads take
/// 100 us side by side with anything, and whose large transfers (writes,
/// scrub reads) move over one link in turn at 2 ns a byte, as a drive's
/// host link does.
fn writeback_rate_beside_scrub_on_a_shared_link(scrub: bool) -> f64 {
    let mut link_free_at = 0;
    writeback_rate_beside_reader(
        |queue, now| {
            queue_writeback(queue, now, 20_000, 64 << 10);
            for id in (0..20_000).filter(|_| scrub) {
                queue.enqueue(io(100_000 + id, IoClass::Scrub, id << 20, 1 << 20), now);
            }
        },
        |d, now, _| {
            if d.class.is_sync() {
                return now + 100_000;
            }
            link_free_at = link_free_at.max(now) + 2 * d.length;
            link_free_at
        },
    )
}

#[test]
fn writeback_keeps_as_many_bytes_in_the_device_as_a_scrub_beside_it() {
    // A drive moves the transfers it holds in turn: writeback that kept
    // one 64 KiB write there beside a scrub's runs of 1 MiB reads moved
    // 0.3 MB/s, a two-thousandth of what it moves beside the reader
    // alone. Matching the scrub's bytes it moves about 33 MB/s: the
    // scrub's floor is charged the time between completions, which the
    // reads beside it keep short, so it still takes most of the link.
    let alone = writeback_rate_beside_scrub_on_a_shared_link(false);
    let beside_scrub = writeback_rate_beside_scrub_on_a_shared_link(true);
    assert!(
        beside_scrub >= alone / 20.0,
        "writeback moved {:.1} MB/s beside the scrub, {:.1} MB/s without it",
        beside_scrub / 1e6,
        alone / 1e6
    );
}

/// A resilver's rate of 1 MiB reads beside the reader of
/// `rate_beside_reader` and, with `writer`, writeback of one 64 KiB
/// write at a time (the next is queued as the last completes), on a flash
/// device that serves one I/O at a time: a read in 100 us, a large
/// transfer at 2 ns a byte.
fn resilver_rate_beside_reader(writer: bool) -> f64 {
    let mut free_at = 0;
    let mut next_write = 1 << 41;
    rate_beside_reader(
        IoClass::Resilver,
        |queue, now| {
            for id in 0..20_000 {
                queue.enqueue(io(100_000 + id, IoClass::Resilver, id << 20, 1 << 20), now);
            }
            if writer {
                queue_writeback(queue, now, 1, 64 << 10);
            }
        },
        |d, now, _| {
            let service = if d.class.is_sync() {
                100_000
            } else {
                2 * d.length
            };
            free_at = free_at.max(now) + service;
            free_at
        },
        |queue, d, now| {
            if d.class == IoClass::AsyncWrite {
                next_write += 1;
                let mut write = io(next_write, IoClass::AsyncWrite, next_write << 16, 64 << 10);
                write.write = true;
                queue.enqueue(write, now);
            }
        },
    )
}

#[test]
fn writeback_with_nothing_waiting_leaves_the_resilver_its_floor_on_flash() {
    // Beside the reader alone the resilver gets its floor, a third of
    // the device (166 MB/s of 500). Writeback with one write in the
    // device and none waiting claims nothing of the floors' total, so the
    // resilver keeps 0.85 of that; counted at writeback's whole share,
    // the total went over its cap and the resilver's floor was scaled to
    // 0.72.
    let alone = resilver_rate_beside_reader(false);
    let beside_writer = resilver_rate_beside_reader(true);
    assert!(
        beside_writer >= alone * 0.8,
        "the resilver moved {:.1} MB/s beside the writer, {:.1} MB/s without it",
        beside_writer / 1e6,
        alone / 1e6
    );
}
