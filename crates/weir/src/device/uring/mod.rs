//! The io_uring engine.
//!
//! ```text
//!  connection thread with a ThreadRing ──SQE──> its own ring ──CQE──> done (same thread)
//!  any other thread ──push──> queue ──(eventfd if asleep)──> device ring thread ──CQE──> done
//! ```
//!
//! A connection thread that runs a [`ThreadRing`] submits to and reaps from
//! its own ring: no thread handoff between the request and its reply.
//! Everyone else (slow paths that block, background work) goes through one
//! ring thread per device.
//!
//! The ring thread sleeps in `submit_and_wait`; an eventfd read is always
//! armed in the ring so that new work wakes it. Submitters only write the
//! eventfd when the thread says it is (about to be) asleep.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;

use io_uring::{opcode, squeue, types, IoUring};
use parking_lot::Mutex;

use super::{Completion, DeviceOp};
use flight::{Flight, Step, TOKEN_FIRST_RESERVED};

mod flight;
mod reserve;
mod thread_ring;

pub use thread_ring::{without_thread_ring, ThreadRing};

const RING_ENTRIES: u32 = 256;
/// Ops in the ring at once; the rest wait in the thread's backlog.
const IN_FLIGHT_MAX: usize = RING_ENTRIES as usize - 1;
const WAKE_TOKEN: u64 = TOKEN_FIRST_RESERVED;

struct Shared {
    queue: Mutex<Vec<(DeviceOp, Completion)>>,
    queued: AtomicUsize,
    sleeping: AtomicBool,
    stopping: AtomicBool,
    wake_fd: OwnedFd,
}

impl Shared {
    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.wake_fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

pub(super) struct UringEngine {
    fd: RawFd,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl UringEngine {
    pub(super) fn start(fd: RawFd) -> io::Result<UringEngine> {
        let ring = IoUring::new(RING_ENTRIES)?;
        // SAFETY: eventfd returns a new descriptor that we then own.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(Vec::new()),
            queued: AtomicUsize::new(0),
            sleeping: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            // SAFETY: `raw` is a fresh descriptor owned by nobody else.
            wake_fd: unsafe { OwnedFd::from_raw_fd(raw) },
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("weir-uring".into())
            .spawn(move || RingThread::new(ring, fd, thread_shared).run())?;
        Ok(UringEngine {
            fd,
            shared,
            thread: Some(thread),
        })
    }

    pub(super) fn submit(&self, op: DeviceOp, done: Completion) {
        let Err((op, done)) = thread_ring::try_submit(self.fd, op, done) else {
            return;
        };
        self.shared.queue.lock().push((op, done));
        self.shared.queued.fetch_add(1, SeqCst);
        if self.shared.sleeping.load(SeqCst) {
            self.shared.wake();
        }
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        self.shared.stopping.store(true, SeqCst);
        self.shared.wake();
        if let Some(thread) = self.thread.take() {
            crate::join::join_unless_current(thread);
        }
    }
}

struct RingThread {
    ring: IoUring,
    fd: RawFd,
    shared: Arc<Shared>,
    flight: Flight,
    backlog: VecDeque<(DeviceOp, Completion)>,
    // The eventfd read's target; boxed so its address is stable while the
    // kernel may write to it.
    wake_buf: Box<u64>,
    wake_armed: bool,
}

impl RingThread {
    fn new(ring: IoUring, fd: RawFd, shared: Arc<Shared>) -> Self {
        RingThread {
            ring,
            fd,
            shared,
            flight: Flight::default(),
            backlog: VecDeque::new(),
            wake_buf: Box::new(0),
            wake_armed: false,
        }
    }

    fn run(mut self) {
        loop {
            if self.shared.queued.load(SeqCst) > 0 {
                let batch = std::mem::take(&mut *self.shared.queue.lock());
                self.shared.queued.fetch_sub(batch.len(), SeqCst);
                self.backlog.extend(batch);
            }
            while self.flight.in_flight() < IN_FLIGHT_MAX {
                let Some((op, done)) = self.backlog.pop_front() else {
                    break;
                };
                let entry = self.flight.start(self.fd, op, done);
                self.push(entry);
            }
            if !self.wake_armed {
                let entry = opcode::Read::new(
                    types::Fd(self.shared.wake_fd.as_raw_fd()),
                    self.wake_buf_ptr(),
                    8,
                )
                .build()
                .user_data(WAKE_TOKEN);
                self.push(entry);
                self.wake_armed = true;
            }
            let idle = self.flight.in_flight() == 0 && self.backlog.is_empty();
            if idle && self.shared.stopping.load(SeqCst) && self.shared.queued.load(SeqCst) == 0 {
                return;
            }
            // Dekker handshake with `submit`: announce sleep, then re-check.
            self.shared.sleeping.store(true, SeqCst);
            let wait = self.shared.queued.load(SeqCst) == 0 && !self.shared.stopping.load(SeqCst);
            let result = if wait {
                self.ring.submit_and_wait(1)
            } else {
                self.ring.submit()
            };
            self.shared.sleeping.store(false, SeqCst);
            if let Err(err) = result {
                if err.raw_os_error() != Some(libc::EINTR)
                    && err.raw_os_error() != Some(libc::EBUSY)
                {
                    tracing::error!(error = %err, "io_uring submit failed");
                }
            }
            self.reap();
        }
    }

    fn wake_buf_ptr(&mut self) -> *mut u8 {
        (&mut *self.wake_buf as *mut u64).cast()
    }

    fn push(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: every buffer an entry points to (slot buffers, the
            // wake buffer) stays alive and unmoved until its CQE is reaped:
            // slots are only emptied in `reap`, and `wake_buf` is boxed.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            // Queue full: hand what we have to the kernel and retry.
            let _ = self.ring.submit();
        }
    }

    fn reap(&mut self) {
        let completions: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|cqe| (cqe.user_data(), cqe.result()))
            .collect();
        for (token, result) in completions {
            if token == WAKE_TOKEN {
                self.wake_armed = false;
                continue;
            }
            match self.flight.complete(token, result) {
                Step::Resubmit(entry) => self.push(entry),
                Step::Finished(done, outcome) => done(outcome),
            }
        }
    }
}
