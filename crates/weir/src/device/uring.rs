//! The io_uring engine: one thread per device owns a ring.
//!
//! ```text
//!  submitters ──push──> queue ──(eventfd if the ring sleeps)──> ring thread
//!                                                              │ SQE per op, resubmits short transfers
//!                                                              └─ CQE ──> done(outcome)
//! ```
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

use super::file::{fallocate_mode, forgive_unsupported_discard, outcome};
use super::{Completion, DeviceOp};

const RING_ENTRIES: u32 = 256;
/// Ops in the ring at once; the rest wait in the thread's backlog.
const IN_FLIGHT_MAX: usize = RING_ENTRIES as usize - 1;
const WAKE_TOKEN: u64 = u64::MAX;

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
            shared,
            thread: Some(thread),
        })
    }

    pub(super) fn submit(&self, op: DeviceOp, done: Completion) {
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
            let _ = thread.join();
        }
    }
}

struct Slot {
    op: DeviceOp,
    done: Completion,
    /// Bytes already transferred (short reads and writes are resubmitted).
    progress: usize,
}

struct RingThread {
    ring: IoUring,
    fd: RawFd,
    shared: Arc<Shared>,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    backlog: VecDeque<(DeviceOp, Completion)>,
    in_flight: usize,
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
            slots: Vec::new(),
            free: Vec::new(),
            backlog: VecDeque::new(),
            in_flight: 0,
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
            while self.in_flight < IN_FLIGHT_MAX {
                let Some((op, done)) = self.backlog.pop_front() else {
                    break;
                };
                let index = self.free.pop().unwrap_or_else(|| {
                    self.slots.push(None);
                    self.slots.len() - 1
                });
                self.slots[index] = Some(Slot {
                    op,
                    done,
                    progress: 0,
                });
                self.in_flight += 1;
                self.push_slot(index);
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
            let idle = self.in_flight == 0 && self.backlog.is_empty();
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

    fn push_slot(&mut self, index: usize) {
        let fd = types::Fd(self.fd);
        let slot = self.slots[index].as_mut().expect("slot in flight");
        let progress = slot.progress;
        let entry = match &mut slot.op {
            DeviceOp::Read { offset, buf } => {
                let len = (buf.len() - progress) as u32;
                // SAFETY: progress < buf.len(), so the pointer stays inside the buffer.
                let ptr = unsafe { buf.as_mut_ptr().add(progress) };
                opcode::Read::new(fd, ptr, len)
                    .offset(*offset + progress as u64)
                    .build()
            }
            DeviceOp::Write {
                offset,
                buf,
                durable,
            } => {
                let len = (buf.len() - progress) as u32;
                // SAFETY: as above.
                let ptr = unsafe { buf.as_mut_ptr().add(progress) };
                let flags = if *durable { libc::RWF_DSYNC } else { 0 };
                opcode::Write::new(fd, ptr, len)
                    .offset(*offset + progress as u64)
                    .rw_flags(flags)
                    .build()
            }
            DeviceOp::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            op @ (DeviceOp::Discard { .. } | DeviceOp::WriteZeroes { .. }) => {
                let (offset, length) = op.range();
                opcode::Fallocate::new(fd, length)
                    .offset(offset)
                    .mode(fallocate_mode(op))
                    .build()
            }
        };
        self.push(entry.user_data(index as u64));
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
            let index = token as usize;
            let slot = self.slots[index]
                .as_mut()
                .expect("completion for an empty slot");
            let result = if result < 0 {
                Err(io::Error::from_raw_os_error(-result))
            } else {
                let transfer_len = match &slot.op {
                    DeviceOp::Read { buf, .. } | DeviceOp::Write { buf, .. } => buf.len(),
                    _ => 0,
                };
                slot.progress += result as usize;
                if transfer_len > 0 && result == 0 {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "device transferred no bytes",
                    ))
                } else if slot.progress < transfer_len {
                    self.push_slot(index);
                    continue;
                } else {
                    Ok(())
                }
            };
            let slot = self.slots[index].take().expect("slot checked above");
            self.free.push(index);
            self.in_flight -= 1;
            let result = forgive_unsupported_discard(&slot.op, result);
            (slot.done)(outcome(slot.op, result));
        }
    }
}
