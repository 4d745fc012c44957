use super::*;

const GIB: u64 = 1 << 30;

fn io(id: u64, kind: IoKind, offset: u64, length: u64) -> ModelIo {
    ModelIo {
        id,
        kind,
        offset,
        length,
    }
}

fn drain(model: &mut Flash) -> Vec<(u64, Nanos)> {
    let mut done = Vec::new();
    while let Some(at) = model.next_event() {
        model.advance(at, &mut done);
    }
    done
}

/// The SATA SSD with no read retries, so that single reads are exact.
fn steady_ssd() -> FlashParams {
    let mut p = FlashParams::sata_ssd(64 * GIB);
    p.read_retry_ppm = 0;
    p
}

#[test]
fn a_4k_read_takes_about_100_us_on_the_ssd() {
    // Page 1 is a middle page: the mean read time.
    let mut ssd = Flash::new(steady_ssd(), 1);
    ssd.submit(io(1, IoKind::Read, 16 << 10, 4096), 0);
    let t = drain(&mut ssd)[0].1;
    assert!(
        (80 * NANOS_PER_US..=120 * NANOS_PER_US).contains(&t),
        "{t} ns"
    );
}

#[test]
fn pages_read_faster_or_slower_by_their_type() {
    let p = steady_ssd();
    let read = |page: u64| {
        let mut ssd = Flash::new(p.clone(), 1);
        ssd.submit(io(1, IoKind::Read, page * p.page_bytes, 4096), 0);
        drain(&mut ssd)[0].1
    };
    let (lower, middle, upper) = (read(3), read(4), read(5));
    assert!(lower < middle && middle < upper, "{lower} {middle} {upper}");
    assert!(upper - lower >= p.read_page_ns / 2);
}

#[test]
fn reads_on_different_dies_overlap_and_on_one_die_queue() {
    let p = steady_ssd();
    let dies = p.dies as u64;
    // Pages 0 and 3 are lower pages on different dies; 0 and 3 * dies
    // are lower pages on die 0.
    let pair = |second: u64| {
        let mut ssd = Flash::new(p.clone(), 1);
        ssd.submit(io(1, IoKind::Read, 0, 4096), 0);
        ssd.submit(io(2, IoKind::Read, second * p.page_bytes, 4096), 0);
        drain(&mut ssd).iter().map(|x| x.1).max().unwrap()
    };
    let (apart, same) = (pair(3), pair(3 * dies));
    assert!(
        same >= apart + p.read_page_ns / 4,
        "same die {same} vs apart {apart}"
    );
}

#[test]
fn a_write_stream_puts_some_reads_behind_programs_and_leaves_most_alone() {
    let p = steady_ssd();
    let mut idle = Flash::new(p.clone(), 1);
    idle.submit(io(1, IoKind::Read, 16 << 10, 4096), 0);
    let idle_read = drain(&mut idle)[0].1;

    let mut busy = Flash::new(p.clone(), 1);
    // 48 MiB of writes, leaving tags free for the reads: the buffer
    // stays full and the dies program.
    for i in 0..24u64 {
        busy.submit(io(1000 + i, IoKind::Write, GIB + i * (2 << 20), 2 << 20), 0);
    }
    let mut done = Vec::new();
    let later = 40 * NANOS_PER_MS;
    busy.advance(later, &mut done);
    // One read on every die at once.
    for die in 0..p.dies as u64 {
        busy.submit(io(die, IoKind::Read, die * p.page_bytes, 4096), later);
    }
    let mut reads: Vec<Nanos> = drain(&mut busy)
        .into_iter()
        .filter(|(id, _)| *id < 1000)
        .map(|(_, at)| at - later)
        .collect();
    reads.sort_unstable();
    let (median, slowest) = (reads[reads.len() / 2], reads[reads.len() - 1]);
    assert!(slowest > 5 * idle_read, "slowest read {slowest} ns");
    assert!(median < 20 * idle_read, "median read {median} ns");
}

#[test]
fn a_program_booked_for_later_does_not_hide_the_one_running_now() {
    // Two dies. Write A (one program unit) lands in the buffer at about
    // 0.5 ms and programs die 0 until about 3 ms. Write B, sent just
    // after, waits for the link behind A and lands at about 4.3 ms; one of
    // its programs is booked on die 0 from then. A read of die 0 at 1 ms
    // must still wait for A's program.
    let mut p = steady_ssd();
    p.dies = 2;
    let mut ssd = Flash::new(p.clone(), 1);
    ssd.submit(io(1, IoKind::Write, GIB, p.program_bytes), 0);
    ssd.submit(io(2, IoKind::Write, 2 * GIB, 2 << 20), 10 * NANOS_PER_US);
    let mut done = Vec::new();
    let read_at = NANOS_PER_MS;
    ssd.advance(read_at, &mut done);
    ssd.submit(io(3, IoKind::Read, 0, 4096), read_at);
    let read_done = drain(&mut ssd)
        .into_iter()
        .find(|(id, _)| *id == 3)
        .expect("the read completes")
        .1;
    let program_end = read_at + p.program_ns / 2;
    assert!(
        read_done > program_end,
        "the read finished {} us after it was sent, inside A's program",
        (read_done - read_at) / NANOS_PER_US
    );
}

#[test]
fn once_the_spare_is_used_up_writes_slow_down_and_idle_time_reclaims_it() {
    let mut p = steady_ssd();
    p.spare_bytes = 64 << 20;
    let write_mb_s = |ssd: &mut Flash, from: Nanos, first_id: u64| {
        // 64 MiB, eight writes of 1 MiB in flight.
        let mut done = Vec::new();
        let mut next = 0u64;
        let mut now = from;
        let mut last = from;
        while next < 8 {
            ssd.submit(io(first_id + next, IoKind::Write, next << 20, 1 << 20), now);
            next += 1;
        }
        let mut finished = 0;
        while finished < 64 {
            now = ssd.next_event().unwrap();
            ssd.advance(now, &mut done);
            for _ in done.drain(..) {
                finished += 1;
                last = now;
                if next < 64 {
                    ssd.submit(io(first_id + next, IoKind::Write, next << 20, 1 << 20), now);
                    next += 1;
                }
            }
        }
        (64.0 * 1.048576e6 / ((last - from) as f64 / 1e9) / 1e6, last)
    };
    let mut ssd = Flash::new(p.clone(), 1);
    let (fresh, end) = write_mb_s(&mut ssd, 0, 0);
    let (used_up, end) = write_mb_s(&mut ssd, end, 100);
    assert!(
        used_up < 0.8 * fresh,
        "fresh {fresh:.0} MB/s, used up {used_up:.0}"
    );
    // A second of idle time reclaims the spare.
    let (rested, _) = write_mb_s(&mut ssd, end + 1_000_000_000, 200);
    assert!(
        rested > 0.9 * fresh,
        "fresh {fresh:.0} MB/s, rested {rested:.0}"
    );
}

#[test]
fn flush_waits_for_the_buffer_unless_power_loss_protected() {
    let mut p = FlashParams::sata_ssd(64 * GIB);
    let mut ssd = Flash::new(p.clone(), 1);
    ssd.submit(io(1, IoKind::Write, 0, 1 << 20), 0);
    ssd.submit(io(2, IoKind::Flush, 0, 0), 0);
    let flush = drain(&mut ssd).iter().find(|(id, _)| *id == 2).unwrap().1;
    assert!(flush >= p.program_ns + p.flush_ns);
    p.plp = true;
    let mut ssd = Flash::new(p, 1);
    ssd.submit(io(1, IoKind::Write, 0, 1 << 20), 0);
    ssd.submit(io(2, IoKind::Flush, 0, 0), 0);
    let flush = drain(&mut ssd).iter().find(|(id, _)| *id == 2).unwrap().1;
    assert!(flush < NANOS_PER_MS);
}

#[test]
fn tags_bound_the_commands_in_progress() {
    let mut p = FlashParams::nvme(64 * GIB);
    p.tags = 2;
    let mut nvme = Flash::new(p, 1);
    for i in 0..5 {
        nvme.submit(io(i, IoKind::Read, i * 4096, 4096), 0);
    }
    assert_eq!(nvme.in_flight(), 5);
    assert_eq!(nvme.running.len(), 2);
    assert_eq!(drain(&mut nvme).len(), 5);
    assert_eq!(nvme.in_flight(), 0);
}

#[test]
fn small_reads_together_move_no_faster_than_the_link() {
    // 16 KiB reads spread over every die, all sent at once: the dies
    // could read them far faster than the link carries them.
    let p = steady_ssd();
    let mut ssd = Flash::new(p.clone(), 1);
    let reads = 512;
    let length = 16 << 10;
    for id in 0..reads {
        ssd.submit(io(id, IoKind::Read, id * length, length), 0);
    }
    let last = drain(&mut ssd).iter().map(|(_, at)| *at).max().unwrap();
    let link_ns = transfer_nanos(reads * length, p.link_bytes_per_sec);
    assert!(
        last >= link_ns,
        "{reads} reads of {length} bytes done in {last} ns, the link needs {link_ns} ns"
    );
}

#[test]
fn a_small_read_goes_between_the_frames_of_a_large_transfer() {
    // A 4 MiB read takes the link for about 7.6 ms; a 4 KiB read sent
    // just after it waits for one frame, not the whole transfer.
    let p = steady_ssd();
    let mut ssd = Flash::new(p.clone(), 1);
    ssd.submit(io(1, IoKind::Read, 0, 4 << 20), 0);
    let small_at = 2 * NANOS_PER_MS;
    let mut done = Vec::new();
    ssd.advance(small_at, &mut done);
    ssd.submit(io(2, IoKind::Read, GIB + p.page_bytes, 4096), small_at);
    let done = drain(&mut ssd);
    let at = |id: u64| done.iter().find(|(i, _)| *i == id).unwrap().1;
    let frame = transfer_nanos(LINK_FRAME_BYTES, p.link_bytes_per_sec);
    assert!(
        at(2) < small_at + p.read_page_ns * 2 + frame + 50 * NANOS_PER_US,
        "the small read took {} us",
        (at(2) - small_at) / NANOS_PER_US
    );
    assert!(at(2) < at(1));
}

#[test]
fn a_small_transfer_booked_for_later_does_not_hold_back_a_large_one() {
    // A read whose die is busy until 5 ms has its transfer booked then; a
    // 1 ms write transfer ready now goes now, and one spanning that read
    // is longer by it.
    let mut link = Link::default();
    let small = 4 * NANOS_PER_US;
    let frame = 30 * NANOS_PER_US;
    link.book_small(0, 5 * NANOS_PER_MS, small, frame);
    assert_eq!(link.book_large(0, 0, NANOS_PER_MS), NANOS_PER_MS);
    let spanning = link.book_large(0, 4 * NANOS_PER_MS, 2 * NANOS_PER_MS);
    assert_eq!(spanning, 6 * NANOS_PER_MS + small);
}
