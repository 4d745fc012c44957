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

#[test]
fn a_4k_read_takes_about_100_us_on_the_ssd() {
    let mut ssd = Flash::new(FlashParams::sata_ssd(64 * GIB));
    ssd.submit(io(1, IoKind::Read, 12345 * 4096, 4096), 0);
    let t = drain(&mut ssd)[0].1;
    assert!(
        (80 * NANOS_PER_US..=120 * NANOS_PER_US).contains(&t),
        "{t} ns"
    );
}

#[test]
fn reads_on_different_dies_overlap_and_on_one_die_queue() {
    let p = FlashParams::sata_ssd(64 * GIB);
    let mut ssd = Flash::new(p.clone());
    // Pages 0 and 1 are on different dies; 0 and `dies` share die 0.
    ssd.submit(io(1, IoKind::Read, 0, 4096), 0);
    ssd.submit(io(2, IoKind::Read, p.page_bytes, 4096), 0);
    let apart = drain(&mut ssd).iter().map(|x| x.1).max().unwrap();
    let mut ssd = Flash::new(p.clone());
    ssd.submit(io(1, IoKind::Read, 0, 4096), 0);
    ssd.submit(io(2, IoKind::Read, p.page_bytes * p.dies as u64, 4096), 0);
    let same = drain(&mut ssd).iter().map(|x| x.1).max().unwrap();
    assert!(
        same >= apart + p.read_page_ns / 2,
        "same die {same} vs apart {apart}"
    );
}

#[test]
fn a_write_burst_puts_reads_behind_programs() {
    let p = FlashParams::sata_ssd(64 * GIB);
    let mut idle = Flash::new(p.clone());
    idle.submit(io(1, IoKind::Read, 0, 4096), 0);
    let idle_read = drain(&mut idle)[0].1;

    let mut busy = Flash::new(p.clone());
    for i in 0..32u64 {
        busy.submit(
            io(100 + i, IoKind::Write, GIB + i * (512 << 10), 512 << 10),
            0,
        );
    }
    // Let the buffer fill, then read.
    let mut done = Vec::new();
    let later = 20 * NANOS_PER_MS;
    busy.advance(later, &mut done);
    busy.submit(io(1, IoKind::Read, 0, 4096), later);
    let read_done = drain(&mut busy).iter().find(|(id, _)| *id == 1).unwrap().1;
    assert!(
        read_done - later > 5 * idle_read,
        "read took {} ns",
        read_done - later
    );
}

#[test]
fn flush_waits_for_the_buffer_unless_power_loss_protected() {
    let mut p = FlashParams::sata_ssd(64 * GIB);
    let mut ssd = Flash::new(p.clone());
    ssd.submit(io(1, IoKind::Write, 0, 1 << 20), 0);
    ssd.submit(io(2, IoKind::Flush, 0, 0), 0);
    let flush = drain(&mut ssd).iter().find(|(id, _)| *id == 2).unwrap().1;
    assert!(flush >= p.program_ns + p.flush_ns);
    p.plp = true;
    let mut ssd = Flash::new(p);
    ssd.submit(io(1, IoKind::Write, 0, 1 << 20), 0);
    ssd.submit(io(2, IoKind::Flush, 0, 0), 0);
    let flush = drain(&mut ssd).iter().find(|(id, _)| *id == 2).unwrap().1;
    assert!(flush < NANOS_PER_MS);
}

#[test]
fn tags_bound_the_commands_in_progress() {
    let mut p = FlashParams::nvme(64 * GIB);
    p.tags = 2;
    let mut nvme = Flash::new(p);
    for i in 0..5 {
        nvme.submit(io(i, IoKind::Read, i * 4096, 4096), 0);
    }
    assert_eq!(nvme.in_flight(), 5);
    assert_eq!(nvme.running.len(), 2);
    assert_eq!(drain(&mut nvme).len(), 5);
    assert_eq!(nvme.in_flight(), 0);
}
