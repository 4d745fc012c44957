//! A thread's own io_uring, for connection threads.
//!
//! While a `ThreadRing` is entered on a thread, io_uring devices submit that
//! thread's ops to it instead of handing them to the device's ring thread.
//! The thread then waits on the ring (and on its socket, through a poll op
//! in the same ring) and runs completions itself. A request at queue depth 1
//! then costs the same wakeups as in a single-threaded event loop: one for
//! the request, one for its completion.
//!
//! The ring is set up with `SINGLE_ISSUER | DEFER_TASKRUN | TASKRUN_FLAG`
//! where the kernel has them, so completions are only posted when this
//! thread asks for them and never interrupt it mid-read, and a thread can
//! see from shared memory that some are pending ([`ThreadRing::wait_spinning`]).
//!
//! A thread that is about to block waiting for an op it submits
//! (`device::run_sync`, for administration) wraps the wait in
//! [`without_thread_ring`]: nobody would reap its own ring while it
//! sleeps. The data path never blocks that way (see volume/).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring};

use super::super::{Completion, DeviceOp, Outcome};
use super::flight::{Flight, Step, TOKEN_FIRST_RESERVED};
use super::reserve::Reserve;

/// Thread rings that have device ops in flight, process-wide: a ring alone
/// may hold a reserve.
static RINGS_WITH_DEVICE_OPS: AtomicUsize = AtomicUsize::new(0);

const RING_ENTRIES: u32 = 256;
/// Ops in one thread ring at once; past this, ops go to the device thread.
const IN_FLIGHT_MAX: usize = RING_ENTRIES as usize - 16;
const POLL_TOKEN: u64 = TOKEN_FIRST_RESERVED + 1;
const WAKE_TOKEN: u64 = TOKEN_FIRST_RESERVED + 2;

thread_local! {
    static CURRENT: RefCell<Option<Rc<RefCell<State>>>> = const { RefCell::new(None) };
    static BLOCKING_DEPTH: Cell<u32> = const { Cell::new(0) };
}

struct State {
    ring: IoUring,
    flight: Flight,
    /// Entries that found the submission queue full.
    overflow: VecDeque<squeue::Entry>,
    /// Entries held back from the device (see `reserve`).
    held: VecDeque<squeue::Entry>,
    reserve: Reserve,
    /// Whether this ring counts in `RINGS_WITH_DEVICE_OPS`.
    counted_busy: bool,
    poll_armed: bool,
    /// A descriptor other threads make readable to end this thread's
    /// waits (see [`ThreadRing::watch_wake`]), and whether its poll is armed.
    wake_fd: Option<RawFd>,
    wake_armed: bool,
    /// Ops ever submitted through this ring.
    submitted_total: u64,
    /// Ops ever finished on this ring.
    completed_total: u64,
}

impl State {
    fn push(&mut self, entry: squeue::Entry) {
        // SAFETY: every buffer an entry points to lives in `flight` (or is
        // absent, for polls) until its CQE has been reaped.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            self.overflow.push_back(entry);
        }
    }

    /// Watch the wake descriptor, if there is one, unless already armed.
    fn arm_wake(&mut self) {
        if let (Some(fd), false) = (self.wake_fd, self.wake_armed) {
            let poll = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
                .build()
                .user_data(WAKE_TOKEN);
            self.push(poll);
            self.wake_armed = true;
        }
    }

    /// Watch `fd` for data through a poll op, unless one is armed.
    fn arm_poll(&mut self, fd: RawFd) {
        if !self.poll_armed {
            let poll = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
                .build()
                .user_data(POLL_TOKEN);
            self.push(poll);
            self.poll_armed = true;
        }
    }

    /// Ops in the kernel's hands (submitted or queued to be).
    fn device_ops(&self) -> usize {
        self.flight.in_flight() - self.held.len()
    }

    /// Keep `RINGS_WITH_DEVICE_OPS` true of this ring.
    fn update_busy(&mut self) {
        let busy = self.flight.in_flight() > 0;
        if busy != self.counted_busy {
            self.counted_busy = busy;
            if busy {
                RINGS_WITH_DEVICE_OPS.fetch_add(1, Ordering::Relaxed);
            } else {
                RINGS_WITH_DEVICE_OPS.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// How many ops the device may have now.
    fn device_cap(&mut self) -> usize {
        self.reserve
            .note_rings_busy(RINGS_WITH_DEVICE_OPS.load(Ordering::Relaxed));
        self.reserve.device_cap()
    }

    /// Pass held entries to the device while the reserve allows.
    fn release_held(&mut self) -> bool {
        let mut released = false;
        let cap = self.device_cap();
        while !self.held.is_empty() && self.device_ops() < cap {
            let entry = self.held.pop_front().expect("checked non-empty");
            self.push(entry);
            released = true;
        }
        released
    }

    /// Move overflowed entries into the submission queue while it has room.
    fn refill(&mut self) {
        while let Some(entry) = self.overflow.pop_front() {
            // SAFETY: as in `push`.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                self.overflow.push_front(entry);
                return;
            }
        }
    }
}

impl Drop for State {
    /// A thread that unwinds with ops in flight must not leave other rings
    /// believing it busy (they would never hold a reserve again).
    fn drop(&mut self) {
        if self.counted_busy {
            RINGS_WITH_DEVICE_OPS.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// This thread's ring; ops submitted on this thread go to it until it drops.
pub struct ThreadRing {
    state: Rc<RefCell<State>>,
}

impl ThreadRing {
    /// Create a ring and route this thread's io_uring ops to it.
    pub fn enter() -> io::Result<ThreadRing> {
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .build(RING_ENTRIES)
            .or_else(|_| {
                IoUring::builder()
                    .setup_single_issuer()
                    .setup_defer_taskrun()
                    .build(RING_ENTRIES)
            })
            .or_else(|_| IoUring::new(RING_ENTRIES))?;
        let state = Rc::new(RefCell::new(State {
            ring,
            flight: Flight::default(),
            overflow: VecDeque::new(),
            held: VecDeque::new(),
            reserve: Reserve::default(),
            counted_busy: false,
            poll_armed: false,
            wake_fd: None,
            wake_armed: false,
            submitted_total: 0,
            completed_total: 0,
        }));
        CURRENT.with(|current| {
            let mut current = current.borrow_mut();
            assert!(current.is_none(), "one thread ring per thread");
            *current = Some(Rc::clone(&state));
        });
        Ok(ThreadRing { state })
    }

    /// Let `fd` becoming readable end every wait on this ring, as a
    /// completion does: other threads write to it to call this thread.
    /// The caller clears it (reads it) before it waits again, or the next
    /// wait returns at once. `fd` must outlive the ring.
    pub fn watch_wake(&self, fd: RawFd) {
        self.state.borrow_mut().wake_fd = Some(fd);
    }

    /// Ops ever submitted through this ring: a caller can tell whether its
    /// recent work went to a device.
    pub fn submitted_total(&self) -> u64 {
        self.state.borrow().submitted_total
    }

    /// Ops ever finished on this ring: a caller can measure its rate.
    pub fn completed_total(&self) -> u64 {
        self.state.borrow().completed_total
    }

    /// Whether waits can end at a deadline (the kernel takes a timeout
    /// with `io_uring_enter`, Linux 5.11).
    pub fn has_deadlines(&self) -> bool {
        self.state.borrow().ring.params().is_feature_ext_arg()
    }

    /// Ops submitted through this ring and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.state.borrow().flight.in_flight()
    }

    /// Submit what is queued and sleep until at least one op completes or,
    /// with `readable`, until that descriptor has data. Completions run on
    /// this thread before it returns. Returns whether `readable` is ready.
    ///
    /// Callers wait only while ops are in flight or `readable` is given;
    /// otherwise nothing would ever wake the thread.
    pub fn wait(&self, readable: Option<RawFd>) -> bool {
        wait(&self.state, readable, None)
    }

    /// As [`wait`](Self::wait), but first watch the ring's shared memory
    /// for up to `window` for a completion (or `readable`'s poll) to be
    /// pending, so that one arriving soon is taken without sleeping; and
    /// sleep no later than `deadline`.
    pub fn wait_spinning(
        &self,
        readable: Option<RawFd>,
        window: Duration,
        deadline: Option<Instant>,
    ) -> bool {
        if !window.is_zero() {
            spin_until_pending(&self.state, readable, window);
        }
        wait(&self.state, readable, deadline)
    }

    /// As [`wait`](Self::wait) with no socket, returning by `deadline`.
    pub fn wait_until(&self, deadline: Instant) {
        wait(&self.state, None, Some(deadline));
    }
}

impl Drop for ThreadRing {
    fn drop(&mut self) {
        // Buffers in flight belong to the kernel until their CQEs arrive.
        finish_current_ring();
        CURRENT.with(|current| current.borrow_mut().take());
    }
}

/// Panics if the kernel refuses the ring itself: every op's buffer would
/// be stuck in limbo, and nothing sensible can continue.
fn wait(state: &RefCell<State>, readable: Option<RawFd>, deadline: Option<Instant>) -> bool {
    let mut fired = false;
    let finished: Vec<(Completion, Outcome)> = {
        let mut state = state.borrow_mut();
        assert!(
            readable.is_some()
                || state.flight.in_flight() > 0
                || deadline.is_some()
                || state.wake_fd.is_some(),
            "waiting on an idle ring would never return"
        );
        if let Some(fd) = readable {
            state.arm_poll(fd);
        }
        state.arm_wake();
        state.refill();
        match deadline {
            None => enter(&state.ring, 1),
            Some(deadline) => enter_until(&state.ring, deadline),
        }
        let completions: Vec<(u64, i32)> = state
            .ring
            .completion()
            .map(|cqe| (cqe.user_data(), cqe.result()))
            .collect();
        let mut finished = Vec::with_capacity(completions.len());
        let mut submit_now = false;
        for (token, result) in completions {
            if token == POLL_TOKEN {
                state.poll_armed = false;
                fired = true;
                continue;
            }
            if token == WAKE_TOKEN {
                state.wake_armed = false;
                continue;
            }
            match state.flight.complete(token, result) {
                Step::Resubmit(entry) => {
                    state.push(entry);
                    submit_now = true;
                }
                Step::Finished(done, outcome) => finished.push((done, outcome)),
            }
        }
        state.completed_total += finished.len() as u64;
        let device_ops_left = state.device_ops();
        state.reserve.reaped(finished.len(), device_ops_left);
        // Held ops go to the device before any completion runs (and
        // queues its reply): the device works while the client turns round.
        submit_now |= state.release_held();
        state.update_busy();
        if submit_now {
            // The caller may block elsewhere next; the rest of a short
            // transfer, and released ops, must not wait for it.
            state.refill();
            enter(&state.ring, 0);
        }
        finished
    };
    for (done, outcome) in finished {
        done(outcome);
    }
    // A poll armed before an earlier blocking read may report data that
    // read already took; only trust readiness that holds now.
    fired && readable.is_some_and(readable_now)
}

/// Submit what is queued, then watch the ring's shared memory (no system
/// calls) until a completion is pending or `window` has passed, if a
/// polling slot is free (`spin_slots`). With
/// `DEFER_TASKRUN` a finished op is only flagged (`TASKRUN_FLAG`) until the
/// next `io_uring_enter` posts it, so the flag counts as pending too.
fn spin_until_pending(state: &RefCell<State>, readable: Option<RawFd>, window: Duration) {
    let mut state = state.borrow_mut();
    if let Some(fd) = readable {
        state.arm_poll(fd);
    }
    state.arm_wake();
    state.refill();
    if !state.ring.submission().is_empty() {
        enter(&state.ring, 0);
    }
    let Some(_slot) = crate::spin_slots::try_take() else {
        return;
    };
    let deadline = Instant::now() + window;
    while !state.ring.submission().taskrun()
        && state.ring.completion().is_empty()
        && Instant::now() < deadline
    {
        std::hint::spin_loop();
    }
}

/// Submit the queue and wait for `want` completions. Transient refusals
/// (a signal, a full completion queue, memory pressure) just return: the
/// caller's loop comes back.
fn enter(ring: &IoUring, want: usize) {
    match ring.submit_and_wait(want) {
        Ok(_) => {}
        Err(err)
            if matches!(
                err.raw_os_error(),
                Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
            ) => {}
        Err(err) => panic!("io_uring_enter on a thread ring failed: {err}"),
    }
}

/// As `enter(ring, 1)`, but return by `deadline` (io_uring's extended
/// argument, Linux 5.11).
fn enter_until(ring: &IoUring, deadline: Instant) {
    let left = deadline.saturating_duration_since(Instant::now());
    let timeout = types::Timespec::from(left);
    let args = types::SubmitArgs::new().timespec(&timeout);
    match ring.submitter().submit_with_args(1, &args) {
        Ok(_) => {}
        Err(err)
            if matches!(
                err.raw_os_error(),
                Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
            ) => {}
        Err(err) => panic!("io_uring_enter on a thread ring failed: {err}"),
    }
}

/// Queue `op` on this thread's ring, or hand it back when there is none (or
/// it is full, or the thread is about to block on it).
pub(super) fn try_submit(
    fd: RawFd,
    op: DeviceOp,
    done: Completion,
) -> Result<(), (DeviceOp, Completion)> {
    if BLOCKING_DEPTH.with(Cell::get) > 0 {
        return Err((op, done));
    }
    CURRENT.with(|current| {
        let current = current.borrow();
        let Some(state) = current.as_ref() else {
            return Err((op, done));
        };
        let Ok(mut state) = state.try_borrow_mut() else {
            return Err((op, done));
        };
        if state.flight.in_flight() >= IN_FLIGHT_MAX {
            return Err((op, done));
        }
        let entry = state.flight.start(fd, op, done);
        state.update_busy();
        let outstanding = state.flight.in_flight();
        state.reserve.note_depth(outstanding);
        if state.device_ops() > state.device_cap() {
            state.held.push_back(entry);
        } else {
            state.push(entry);
        }
        state.submitted_total += 1;
        Ok(())
    })
}

/// Run `f` with this thread's ring out of the way: the ops it submits go
/// to device threads that complete them unaided. For ops the thread will
/// block on, and for background work it should not wait on its ring for.
pub fn without_thread_ring<T>(f: impl FnOnce() -> T) -> T {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            BLOCKING_DEPTH.with(|depth| depth.set(depth.get() - 1));
        }
    }
    if BLOCKING_DEPTH.with(Cell::get) == 0 {
        finish_current_ring();
    }
    BLOCKING_DEPTH.with(|depth| depth.set(depth.get() + 1));
    let _restore = Restore;
    f()
}

/// Complete everything on this thread's ring. A thread about to sleep on a
/// lock or an op must not leave ops behind that only it can reap: their
/// completions may be what releases the lock.
fn finish_current_ring() {
    let Some(state) = CURRENT.with(|current| current.borrow().clone()) else {
        return;
    };
    while state.borrow().flight.in_flight() > 0 {
        wait(&state, None, None);
    }
}

fn readable_now(fd: RawFd) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no timeout.
    unsafe { libc::poll(&mut poll, 1, 0) > 0 }
}

#[cfg(test)]
mod tests;
