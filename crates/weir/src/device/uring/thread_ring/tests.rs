use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::{self, ThreadId};
use std::time::Duration;

use super::*;
use crate::device::file::FileDevice;
use crate::device::{AlignedBuf, Device, IoEngine};
use crate::pool::SingleDevice;
use crate::sched::DeviceQueue;
use crate::volume::Volume;

const SIZE: u64 = 4 << 20;

fn file_device(dir: &tempfile::TempDir) -> Arc<FileDevice> {
    let path = dir.path().join("dev.img");
    std::fs::File::create(&path).unwrap().set_len(SIZE).unwrap();
    Arc::new(FileDevice::open(&path, false, IoEngine::Uring).unwrap())
}

fn filled(len: usize, byte: u8) -> AlignedBuf {
    let mut buf = AlignedBuf::new(len);
    buf.as_mut_slice().fill(byte);
    buf
}

/// Runs `f` on a fresh thread and fails the test if it hangs.
fn within_10s(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        f();
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("thread ring test hung or panicked");
}

#[test]
fn ops_complete_on_the_submitting_thread_with_their_data() {
    let dir = tempfile::tempdir().unwrap();
    let device = file_device(&dir);
    within_10s(move || {
        let ring = ThreadRing::enter().unwrap();
        let me = thread::current().id();
        let (tx, rx) = mpsc::channel::<(ThreadId, Outcome)>();
        for i in 0..64u64 {
            let tx = tx.clone();
            let op = DeviceOp::Write {
                offset: i * 65536,
                buf: filled(65536, i as u8 + 1).into(),
                durable: false,
            };
            device.submit(
                op,
                Box::new(move |o| tx.send((thread::current().id(), o)).unwrap()),
            );
        }
        assert_eq!(ring.in_flight(), 64, "ops went to the thread ring");
        while ring.in_flight() > 0 {
            ring.wait(None);
        }
        for _ in 0..64 {
            let (thread, outcome) = rx.try_recv().expect("every write completed");
            assert_eq!(thread, me);
            outcome.result.unwrap();
        }
        for i in 0..64u64 {
            let tx = tx.clone();
            let op = DeviceOp::Read {
                offset: i * 65536,
                buf: AlignedBuf::new(65536),
            };
            device.submit(
                op,
                Box::new(move |o| tx.send((thread::current().id(), o)).unwrap()),
            );
        }
        drop(ring); // finishes what is in flight
        for _ in 0..64 {
            let (thread, outcome) = rx
                .try_recv()
                .expect("dropping the ring finished every read");
            assert_eq!(thread, me);
            let buf = outcome.buf.unwrap();
            let first = buf.as_slice()[0];
            assert!(buf.as_slice().iter().all(|&b| b == first) && first >= 1);
        }
    });
}

#[test]
fn waiting_reports_a_readable_socket_while_ops_are_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let device = file_device(&dir);
    within_10s(move || {
        let (mut client, server) = UnixStream::pair().unwrap();
        let ring = ThreadRing::enter().unwrap();
        let op = DeviceOp::Read {
            offset: 0,
            buf: AlignedBuf::new(4096),
        };
        device.submit(op, Box::new(|o| o.result.unwrap()));
        // Nothing to read yet: waits return on the read's completion only.
        assert!(!ring.wait(Some(server.as_raw_fd())));
        assert_eq!(ring.in_flight(), 0);
        client.write_all(b"x").unwrap();
        device.submit(
            DeviceOp::Read {
                offset: 0,
                buf: AlignedBuf::new(4096),
            },
            Box::new(|o| o.result.unwrap()),
        );
        let mut readable = false;
        while !readable {
            readable = ring.wait(Some(server.as_raw_fd()));
        }
    });
}

#[test]
fn spinning_waits_take_completions_and_socket_data() {
    let dir = tempfile::tempdir().unwrap();
    let device = file_device(&dir);
    within_10s(move || {
        let (mut client, server) = UnixStream::pair().unwrap();
        let ring = ThreadRing::enter().unwrap();
        let window = Duration::from_millis(50);
        let (tx, rx) = mpsc::channel();
        for i in 0..8u64 {
            let tx = tx.clone();
            let op = DeviceOp::Read {
                offset: i * 4096,
                buf: AlignedBuf::new(4096),
            };
            device.submit(op, Box::new(move |o| tx.send(o.result.is_ok()).unwrap()));
        }
        let before = ring.completed_total();
        while ring.in_flight() > 0 {
            assert!(!ring.wait_spinning(Some(server.as_raw_fd()), window, None));
        }
        assert_eq!(ring.completed_total() - before, 8);
        assert_eq!(rx.try_iter().filter(|ok| *ok).count(), 8);
        // With an op in flight and data on the socket, a spinning wait
        // reports the socket once its poll completes.
        client.write_all(b"x").unwrap();
        device.submit(
            DeviceOp::Read {
                offset: 0,
                buf: AlignedBuf::new(4096),
            },
            Box::new(|o| o.result.unwrap()),
        );
        let mut readable = false;
        while !readable {
            readable = ring.wait_spinning(Some(server.as_raw_fd()), window, None);
        }
    });
}

#[test]
fn slow_path_behind_own_in_flight_write_does_not_deadlock() {
    // An aligned write holds its range lock until its completion is reaped;
    // an overlapping unaligned write on the same thread then waits for that
    // lock. Only this thread reaps its ring, so the slow path must not
    // block it: it returns at once and continues when the thread reaps the
    // first write.
    let dir = tempfile::tempdir().unwrap();
    let device: Arc<dyn Device> = file_device(&dir);
    let volume = Arc::new(Volume::new(
        Arc::new(SingleDevice::new(DeviceQueue::new(device))),
        false,
    ));
    within_10s(move || {
        let ring = ThreadRing::enter().unwrap();
        let (tx, rx) = mpsc::channel();
        let first = tx.clone();
        volume.write(
            0,
            filled(8192, 7),
            false,
            Box::new(move |r| first.send(r).unwrap()),
        );
        let mut patch = AlignedBuf::new(10);
        patch.as_mut_slice().fill(9);
        volume.write(100, patch, false, Box::new(move |r| tx.send(r).unwrap()));
        let mut answered = 0;
        while answered < 2 {
            match rx.try_recv() {
                Ok(result) => {
                    result.unwrap();
                    answered += 1;
                }
                Err(_) => {
                    assert!(ring.in_flight() > 0, "nothing left to reap");
                    ring.wait(None);
                }
            }
        }
        let (tx, rx) = mpsc::channel();
        volume.read(0, 200, Box::new(move |r| tx.send(r).unwrap()));
        drop(ring);
        let data = rx.try_recv().unwrap().unwrap();
        let bytes = data.bytes();
        assert!(bytes[..100].iter().all(|&b| b == 7));
        assert!(bytes[100..110].iter().all(|&b| b == 9));
        assert!(bytes[110..].iter().all(|&b| b == 7));
    });
}

#[test]
fn held_ops_reach_the_device_and_complete_with_their_data() {
    let dir = tempfile::tempdir().unwrap();
    let device = file_device(&dir);
    within_10s(move || {
        let ring = ThreadRing::enter().unwrap();
        ring.state.borrow_mut().reserve.fixed_cap = Some(3);
        let (tx, rx) = mpsc::channel::<Outcome>();
        for i in 0..32u64 {
            let tx = tx.clone();
            let op = DeviceOp::Write {
                offset: i * 4096,
                buf: filled(4096, i as u8 + 1).into(),
                durable: false,
            };
            device.submit(op, Box::new(move |o| tx.send(o).unwrap()));
        }
        assert_eq!(ring.in_flight(), 32);
        assert_eq!(ring.state.borrow().held.len(), 29, "all but 3 held back");
        while ring.in_flight() > 0 {
            ring.wait(None);
            assert!(ring.state.borrow().device_ops() <= 3);
        }
        for _ in 0..32 {
            rx.try_recv()
                .expect("every write completed")
                .result
                .unwrap();
        }
        for i in 0..32u64 {
            let tx = tx.clone();
            let op = DeviceOp::Read {
                offset: i * 4096,
                buf: AlignedBuf::new(4096),
            };
            device.submit(op, Box::new(move |o| tx.send(o).unwrap()));
        }
        while ring.in_flight() > 0 {
            ring.wait(None);
        }
        let mut seen = Vec::new();
        for _ in 0..32 {
            let outcome = rx.try_recv().expect("every read completed");
            outcome.result.unwrap();
            let data = outcome.buf.expect("a read returns its buffer");
            let byte = data.as_slice()[0];
            assert!(data.as_slice().iter().all(|&b| b == byte));
            seen.push(byte);
        }
        seen.sort_unstable();
        assert_eq!(seen, (1..=32).collect::<Vec<u8>>());
    });
}

#[test]
fn a_wait_with_a_deadline_returns_by_it_with_nothing_in_flight() {
    within_10s(|| {
        let (_client, server) = UnixStream::pair().unwrap();
        let ring = ThreadRing::enter().unwrap();
        assert!(
            ring.has_deadlines(),
            "this kernel takes io_uring_enter timeouts"
        );
        let started = std::time::Instant::now();
        ring.wait_until(started + Duration::from_millis(20));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(19),
            "returned early: {waited:?}"
        );
        // With a socket that never becomes readable, the deadline ends it too.
        let deadline = std::time::Instant::now() + Duration::from_millis(20);
        assert!(!ring.wait_spinning(Some(server.as_raw_fd()), Duration::ZERO, Some(deadline)));
        assert!(std::time::Instant::now() + Duration::from_millis(1) >= deadline);
    });
}

#[test]
fn another_thread_ends_a_wait_through_the_wake_descriptor() {
    within_10s(|| {
        let (_client, server) = UnixStream::pair().unwrap();
        // An eventfd stands for the outbox's: another thread writes it.
        // SAFETY: eventfd returns a new descriptor or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(raw >= 0);
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let wake = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let ring = ThreadRing::enter().unwrap();
        ring.watch_wake(wake.as_raw_fd());
        let caller = {
            let fd = wake.as_raw_fd();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(20));
                let one: u64 = 1;
                // SAFETY: writes 8 bytes from a live u64 to the eventfd.
                unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
            })
        };
        // Nothing in flight and a socket that stays silent: only the call
        // can end these waits.
        assert!(
            !ring.wait(Some(server.as_raw_fd())),
            "the socket had no data"
        );
        caller.join().unwrap();
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from the eventfd.
        let got = unsafe { libc::read(wake.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        assert_eq!((got, count), (8, 1), "the wake was written once");
        // Cleared, the next wait sleeps until the deadline again.
        let deadline = std::time::Instant::now() + Duration::from_millis(20);
        ring.wait_until(deadline);
        assert!(std::time::Instant::now() + Duration::from_millis(1) >= deadline);
    });
}
