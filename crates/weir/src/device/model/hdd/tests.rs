use super::*;

const GIB: u64 = 1 << 30;

fn drive() -> Hdd {
    Hdd::new(HddParams::new(64 * GIB))
}

fn read(id: u64, offset: u64, length: u64) -> ModelIo {
    ModelIo {
        id,
        kind: IoKind::Read,
        offset,
        length,
    }
}

/// Run until everything submitted completes; (id, time) in completion order.
fn drain(model: &mut Hdd) -> Vec<(u64, Nanos)> {
    let mut done = Vec::new();
    while let Some(at) = model.next_event() {
        model.advance(at, &mut done);
    }
    done
}

#[test]
fn seek_curve_is_monotonic_with_the_documented_points() {
    let p = HddParams::new(64 * GIB);
    let mut last = 0;
    for step in 1..=100 {
        let t = p.seek_ns(step as f64 / 100.0);
        assert!(t > last, "seek time must grow with distance");
        last = t;
    }
    assert_eq!(p.seek_ns(0.0), 0);
    let ms = |f: f64| p.seek_ns(f) as f64 / NANOS_PER_MS as f64;
    assert!((ms(1.0) - 16.0).abs() < 0.01, "full stroke ~16 ms");
    assert!(ms(0.0001) < 1.2, "track to track ~1 ms");
}

#[test]
fn media_rate_falls_to_half_at_the_inner_edge() {
    let p = HddParams::new(64 * GIB);
    assert_eq!(p.media_rate_at(0), 250_000_000);
    let inner = p.media_rate_at(64 * GIB - 1) as f64;
    assert!((inner / 125e6 - 1.0).abs() < 0.01);
}

#[test]
fn a_read_waits_for_its_sector_to_come_round() {
    // Two reads of the same track one after another: the second costs at
    // most one revolution beyond the first, and never less than zero.
    let mut hdd = drive();
    hdd.submit(read(1, 10 * GIB, 4096), 0);
    let first = drain(&mut hdd)[0].1;
    let p = hdd.params().clone();
    // Same offset again, far from any cache: forget cached ranges by
    // reading elsewhere first.
    hdd.submit(read(2, 40 * GIB, 4096), first);
    let second = drain(&mut hdd)[0].1;
    let service = second - first;
    let seek = p.seek_ns(30.0 / 64.0);
    assert!(service >= seek + p.command_overhead_ns);
    assert!(service <= seek + p.command_overhead_ns + p.rotation_ns + NANOS_PER_MS);
}

#[test]
fn a_sequential_reader_is_served_from_the_read_ahead_cache() {
    let mut hdd = drive();
    let mut now = 0;
    let mut times = Vec::new();
    for i in 0..20u64 {
        hdd.submit(read(i, i << 20, 1 << 20), now);
        let done = drain(&mut hdd)[0].1;
        times.push(done - now);
        now = done + 20 * NANOS_PER_US;
    }
    // After the first read, each 1 MiB arrives at the media rate (~4.2 ms
    // at 250 MB/s), with no seek or rotational miss.
    let rate_ms = 1e3 * (1 << 20) as f64 / 250e6;
    for t in &times[2..] {
        let ms = *t as f64 / NANOS_PER_MS as f64;
        assert!(ms < rate_ms * 1.2, "sequential 1 MiB took {ms} ms");
    }
}

#[test]
fn a_large_read_the_media_is_still_reading_sends_its_bytes_as_they_arrive() {
    let mut hdd = drive();
    hdd.submit(read(1, 0, 1 << 20), 0);
    let first = drain(&mut hdd)[0].1;
    let length = 8u64 << 20;
    hdd.submit(read(2, 1 << 20, length), first);
    let done = drain(&mut hdd)[0].1;
    let rate = hdd.params().media_rate_at(1 << 20);
    let media = transfer_nanos(length, rate);
    let link = transfer_nanos(length, hdd.params().interface_bytes_per_sec);
    // The link sends each byte as the media delivers it: the read ends
    // with the media, not a whole link transfer after it.
    assert!(done - first >= media, "{} < {media}", done - first);
    assert!(
        done - first < media + link / 8,
        "{} ns: media {media}, link {link}",
        done - first
    );
}

#[test]
fn the_queue_serves_the_nearest_request_first() {
    let mut hdd = drive();
    // Occupy the head, then queue one far and one near request.
    hdd.submit(read(1, 0, 4096), 0);
    hdd.submit(read(2, 60 * GIB, 4096), 1);
    hdd.submit(read(3, 256 << 20, 4096), 2);
    let order: Vec<u64> = drain(&mut hdd).iter().map(|(id, _)| *id).collect();
    assert_eq!(order, vec![1, 3, 2]);
}

#[test]
fn a_sequential_stream_starves_a_random_read_until_the_age_limit() {
    let mut hdd = drive();
    let age_limit = hdd.params().age_limit_ns;
    // A scan keeps three 1 MiB reads queued; one random read waits among them.
    let mut next_scan = 0u64;
    let mut id = 100;
    for _ in 0..3 {
        hdd.submit(read(id, next_scan, 1 << 20), 0);
        id += 1;
        next_scan += 1 << 20;
    }
    hdd.submit(read(1, 50 * GIB, 4096), 0);
    let mut done = Vec::new();
    let random_done = loop {
        let at = hdd.next_event().expect("work remains");
        done.clear();
        hdd.advance(at, &mut done);
        if let Some((_, t)) = done.iter().find(|(i, _)| *i == 1) {
            break *t;
        }
        for _ in &done {
            hdd.submit(read(id, next_scan, 1 << 20), at);
            id += 1;
            next_scan += 1 << 20;
        }
    };
    assert!(
        random_done >= age_limit,
        "served after {random_done} ns, before the age limit"
    );
    assert!(
        random_done < age_limit + 100 * NANOS_PER_MS,
        "served long after the age limit"
    );
}

#[test]
fn cached_writes_are_fast_and_flush_destages_them() {
    let mut hdd = drive();
    for i in 0..8u64 {
        hdd.submit(
            ModelIo {
                id: i,
                kind: IoKind::Write,
                offset: i * 7 * GIB,
                length: 4096,
            },
            0,
        );
    }
    let writes = drain(&mut hdd);
    assert!(
        writes.iter().all(|(_, t)| *t < 2 * NANOS_PER_MS),
        "cached writes: {writes:?}"
    );
    let mut params = HddParams::new(64 * GIB);
    params.write_cache = false;
    let mut uncached = Hdd::new(params);
    uncached.submit(
        ModelIo {
            id: 1,
            kind: IoKind::Write,
            offset: 30 * GIB,
            length: 4096,
        },
        0,
    );
    assert!(
        drain(&mut uncached)[0].1 > 2 * NANOS_PER_MS,
        "an uncached write seeks"
    );

    // Writes, then a flush: the flush completes after the media writes.
    let mut hdd = drive();
    for i in 0..4u64 {
        hdd.submit(
            ModelIo {
                id: i,
                kind: IoKind::Write,
                offset: i * 13 * GIB,
                length: 4096,
            },
            0,
        );
    }
    hdd.submit(
        ModelIo {
            id: 9,
            kind: IoKind::Flush,
            offset: 0,
            length: 0,
        },
        0,
    );
    let done = drain(&mut hdd);
    let flush = done.iter().find(|(id, _)| *id == 9).unwrap().1;
    assert!(
        flush > 4 * 2 * NANOS_PER_MS,
        "flush after destaging four scattered writes"
    );
}

#[test]
fn slowdown_stretches_service_time() {
    let mut normal = drive();
    normal.submit(read(1, 20 * GIB, 4096), 0);
    let t1 = drain(&mut normal)[0].1;
    let mut slow = drive();
    slow.set_slowdown(10.0);
    slow.submit(read(1, 20 * GIB, 4096), 0);
    let t10 = drain(&mut slow)[0].1;
    assert!(t10 as f64 > 9.0 * t1 as f64 && (t10 as f64) < 11.0 * t1 as f64);
}
