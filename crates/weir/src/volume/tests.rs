use super::*;
use crate::device::mem::MemDevice;
use crate::pool::SingleDevice;
use crate::sched::DeviceQueue;
use std::sync::mpsc;

const SIZE: u64 = 1 << 20;

fn volume() -> Arc<Volume> {
    let device = Arc::new(MemDevice::with_block_bytes(SIZE, 512));
    Arc::new(Volume::new(
        Arc::new(SingleDevice::new(DeviceQueue::new(device))),
        false,
    ))
}

fn wait<T: Send + 'static>(start: impl FnOnce(Done<T>)) -> io::Result<T> {
    let (tx, rx) = mpsc::channel();
    start(Box::new(move |result| tx.send(result).unwrap()));
    rx.recv().unwrap()
}

fn buf_of(bytes: &[u8]) -> AlignedBuf {
    let mut buf = AlignedBuf::new(bytes.len());
    buf.as_mut_slice().copy_from_slice(bytes);
    buf
}

fn read(volume: &Volume, offset: u64, len: u32) -> Vec<u8> {
    wait(|done| volume.read(offset, len, done))
        .unwrap()
        .bytes()
        .to_vec()
}

/// A tiny deterministic generator so failures reproduce.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn unaligned_operations_match_a_reference_model() {
    let volume = volume();
    let mut model = vec![0u8; SIZE as usize];
    let mut rng = Lcg(42);
    for step in 0..400 {
        let offset = rng.next() % (SIZE - 20_000);
        let len = 1 + (rng.next() % 10_000) as u32;
        let range = offset as usize..offset as usize + len as usize;
        match rng.next() % 4 {
            0 | 1 => {
                let fill = (step % 251) as u8 + 1;
                let data = vec![fill; len as usize];
                wait(|done| volume.write(offset, buf_of(&data), step % 3 == 0, done)).unwrap();
                model[range].copy_from_slice(&data);
            }
            2 => {
                wait(|done| volume.write_zeroes(offset, len, false, step % 2 == 0, false, done))
                    .unwrap();
                model[range].fill(0);
            }
            _ => assert_eq!(
                read(&volume, offset, len),
                &model[range],
                "step {step} at {offset}+{len}"
            ),
        }
    }
    assert_eq!(read(&volume, 0, SIZE as u32), model);
}

#[test]
fn trim_keeps_partial_edge_blocks() {
    let volume = volume();
    wait(|done| volume.write(0, buf_of(&[7u8; 4096]), false, done)).unwrap();
    wait(|done| volume.trim(100, 2000, false, done)).unwrap();
    let after = read(&volume, 0, 4096);
    assert!(
        after[..512].iter().all(|b| *b == 7),
        "the partial head block survives"
    );
    assert!(
        after[512..2048].iter().all(|b| *b == 0),
        "whole blocks inside are discarded"
    );
    assert!(
        after[2048..].iter().all(|b| *b == 7),
        "the partial tail block survives"
    );
}

#[test]
fn concurrent_unaligned_writes_to_one_block_are_not_lost() {
    let volume = volume();
    let threads: Vec<_> = (0..8u8)
        .map(|i| {
            let volume = Arc::clone(&volume);
            std::thread::spawn(move || {
                for round in 0..30u8 {
                    let data = vec![i * 30 + round; 60];
                    wait(|done| volume.write(u64::from(i) * 60, buf_of(&data), false, done))
                        .unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let block = read(&volume, 0, 480);
    for i in 0..8u8 {
        let piece = &block[i as usize * 60..(i as usize + 1) * 60];
        assert!(
            piece.iter().all(|b| *b == i * 30 + 29),
            "writer {i}'s last write survived"
        );
    }
}

#[test]
fn holes_are_reported_for_unwritten_ranges() {
    let volume = volume();
    wait(|done| volume.write(65536, buf_of(&[1u8; 512]), false, done)).unwrap();
    let data = wait(|done| volume.read(0, 4096, done)).unwrap();
    assert!(data.hole);
    let extents = volume.extents(0, 3 * 65536, 16).unwrap();
    assert_eq!(
        extents.iter().map(|e| e.hole).collect::<Vec<_>>(),
        vec![true, false, true]
    );
}

#[test]
fn a_write_behind_a_held_range_returns_at_once_and_finishes_on_release() {
    // The connection thread calls these: none may wait for a lock, or it
    // would stop reading requests (and reaping the ring) behind it.
    let volume = volume();
    let (tx, rx) = mpsc::channel();
    volume.locks.lock_then(
        0,
        4096,
        true,
        Box::new(move |guard| tx.send(guard).unwrap()),
    );
    let held = rx.try_recv().expect("nothing else holds it");
    let (done_tx, done_rx) = mpsc::channel();
    for (offset, len) in [(100u64, 60usize), (0, 512)] {
        let done_tx = done_tx.clone();
        let data = buf_of(&vec![9u8; len]);
        volume.write(
            offset,
            data,
            false,
            Box::new(move |r| done_tx.send(r).unwrap()),
        );
    }
    let zeroed = done_tx.clone();
    volume.write_zeroes(
        0,
        4096,
        false,
        true,
        false,
        Box::new(move |r| zeroed.send(r).unwrap()),
    );
    let trimmed = done_tx;
    volume.trim(0, 4096, false, Box::new(move |r| trimmed.send(r).unwrap()));
    assert!(done_rx.try_recv().is_err(), "all four wait for the range");
    drop(held);
    for _ in 0..4 {
        done_rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("answered once the range is free")
            .unwrap();
    }
}
