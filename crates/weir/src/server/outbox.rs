//! The outbox: replies waiting for the socket.
//!
//! ```text
//!  completion on the reader thread ──push (no wake)──────────┐
//!  completion on any other thread ──push + wake the reader───┤
//!                                                            ▼
//!                     queue ──drain──> socket (one writer at a time)
//!                       ▲  drained by the reader before it blocks or
//!                       │  when woken, never blocking on the socket;
//!                       └─ by the writer thread for long queues and
//!                          for a client that stops reading
//! ```
//!
//! The reader writing its own replies saves a thread handoff per request
//! (most of the latency at queue depth 1). A reply finished on another
//! thread (a device thread, the cache's writeback) wakes the reader through
//! an eventfd that all its waits watch, so a connection holds one thread
//! unless its client falls behind or its replies are long. Completions
//! from device threads never write to the socket themselves: a client that
//! stops reading must not stall a device shared with other clients.

use std::cell::Cell;
use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use weir_nbd::{reply, Errno};

use super::budget::Budget;
use super::stream::Stream;
use crate::volume::ReadData;

/// Replies gathered into one write at most.
const BATCH_REPLIES_MAX: usize = 64;

/// Replies (and their bytes) the reader leaves queued for itself before
/// waking the writer: past these, sending would hold up reading. Small
/// replies are cheap to send in one batch and waking the writer costs a
/// context switch: at 4 replies, 4 KiB memory writes at depth 32 ran at
/// about 145k IOPS; at 64, about 180k (and reads 180k -> 230k).
const READER_KEEPS_REPLIES_MAX: usize = BATCH_REPLIES_MAX;
const READER_KEEPS_BYTES_MAX: usize = 128 * 1024;

thread_local! {
    /// The connection whose reader runs on this thread (0: none).
    static READER_OF: Cell<u64> = const { Cell::new(0) };
}

pub enum Body {
    Ok,
    Error {
        errno: Errno,
        message: String,
    },
    Read {
        offset: u64,
        data: ReadData,
        /// The reply's last chunk (always, without structured replies:
        /// only structured replies send a read in pieces).
        last: bool,
    },
    /// `(length, flags)` extents of `base:allocation`.
    BlockStatus(Vec<(u32, u32)>),
}

impl Body {
    /// The error reply to a `what` that failed with `err`, logged unless
    /// it is only unsupported.
    pub fn failed(err: &io::Error, what: &'static str) -> Body {
        let errno = Errno::from_os(err.raw_os_error().unwrap_or(libc::EIO));
        if errno != Errno::NotSup {
            tracing::warn!(error = %err, "{what} failed");
        }
        Body::Error {
            errno,
            message: format!("{what}: {err}"),
        }
    }
}

pub struct Reply {
    pub handle: u64,
    pub body: Body,
    /// Budget the request holds, released once the reply is sent.
    pub budget_bytes: u64,
}

impl Reply {
    /// The last reply to its request: a read sent in pieces has others.
    fn ends_request(&self) -> bool {
        !matches!(self.body, Body::Read { last: false, .. })
    }
}

struct Queue {
    replies: VecDeque<Reply>,
    /// Read payload bytes among `replies`.
    payload_bytes: usize,
    /// The writer thread was woken for what is queued; the reader leaves
    /// sending to it rather than hold up reading.
    writer_called: bool,
    /// The writer thread runs (it starts when first called and ends after
    /// `WRITER_IDLE_EXIT` without work).
    writer_alive: bool,
    closed: bool,
}

struct Socket {
    stream: Stream,
    alive: bool,
    /// A batch the reader began to send when the socket filled, and how
    /// many of its bytes went out: the writer thread sends the rest first.
    partial: Option<(Vec<Reply>, usize)>,
}

/// Replies the reader seals for TLS at once; larger batches go to the
/// writer thread, which seals them a step at a time.
const TLS_SEAL_NOW_BYTES_MAX: usize = 1 << 20;

/// A writer thread with nothing to send for this long ends; a connection
/// whose reader sends its own replies holds no second thread.
const WRITER_IDLE_EXIT: std::time::Duration = std::time::Duration::from_secs(2);

pub struct Outbox {
    me: std::sync::Weak<Outbox>,
    writer: Mutex<Option<JoinHandle<()>>>,
    connection: u64,
    structured: bool,
    peer: String,
    budget: Arc<Budget>,
    queue: Mutex<Queue>,
    ready: Condvar,
    socket: Mutex<Socket>,
    /// Written to call the reader; every wait of the reader watches it.
    reader_wake: OwnedFd,
    /// The reader has been called and has not yet taken the call: later
    /// callers need not write `reader_wake` again.
    reader_called: AtomicBool,
    /// Replies sent (or dropped with their client) and their budget
    /// released, ever.
    released_total: AtomicU64,
}

impl Outbox {
    pub fn new(
        connection: u64,
        stream: Stream,
        structured: bool,
        budget: Arc<Budget>,
        peer: String,
    ) -> io::Result<Arc<Self>> {
        assert_ne!(connection, 0, "connection ids start at 1");
        // SAFETY: eventfd returns a new descriptor or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let reader_wake = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Arc::new_cyclic(|me| Outbox {
            me: me.clone(),
            writer: Mutex::new(None),
            connection,
            structured,
            peer,
            budget,
            queue: Mutex::new(Queue {
                replies: VecDeque::new(),
                payload_bytes: 0,
                writer_called: false,
                writer_alive: false,
                closed: false,
            }),
            ready: Condvar::new(),
            socket: Mutex::new(Socket {
                stream,
                alive: true,
                partial: None,
            }),
            reader_wake,
            reader_called: AtomicBool::new(false),
            released_total: AtomicU64::new(0),
        }))
    }

    /// The descriptor that becomes readable when the reader is called.
    pub fn reader_wake_fd(&self) -> RawFd {
        self.reader_wake.as_raw_fd()
    }

    /// No reply is still to come: nothing can call the reader until it
    /// reads another request.
    pub fn nothing_pending(&self) -> bool {
        self.budget.idle()
    }

    /// Whether the reader has been called since it last drained.
    pub fn reader_called(&self) -> bool {
        self.reader_called.load(Ordering::SeqCst)
    }

    /// Call the reader: replies wait for it, or budget it may wait for
    /// has been released.
    fn wake_reader(&self) {
        if !self.reader_called.swap(true, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd.
            unsafe { libc::write(self.reader_wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    /// Take a call: clear the eventfd first, then the flag, so a call
    /// made in between writes the eventfd again rather than being lost.
    fn take_reader_call(&self) {
        if self.reader_called.load(Ordering::SeqCst) {
            let mut count: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 from our non-blocking
            // eventfd.
            unsafe {
                libc::read(
                    self.reader_wake.as_raw_fd(),
                    (&mut count as *mut u64).cast(),
                    8,
                )
            };
            self.reader_called.store(false, Ordering::SeqCst);
        }
    }

    fn on_reader_thread(&self) -> bool {
        READER_OF.with(Cell::get) == self.connection
    }

    /// Mark the calling thread as this connection's reader.
    pub fn enter_reader(&self) {
        READER_OF.with(|r| r.set(self.connection));
    }

    /// Wake the writer thread, starting it if none runs. The caller has
    /// set `writer_called`.
    fn wake_writer(&self) {
        {
            let mut queue = self.queue.lock();
            if queue.writer_alive {
                drop(queue);
                self.ready.notify_one();
                return;
            }
            queue.writer_alive = true;
        }
        let Some(outbox) = self.me.upgrade() else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("weir-reply".into())
            .spawn(move || outbox.writer_loop());
        match spawned {
            Ok(handle) => {
                // The one it replaces has ended: joining it is immediate.
                if let Some(old) = self.writer.lock().replace(handle) {
                    crate::join::join_unless_current(old);
                }
            }
            Err(err) => {
                tracing::warn!(peer = self.peer, error = %err, "cannot start a reply writer; the reader sends");
                let mut queue = self.queue.lock();
                queue.writer_alive = false;
                queue.writer_called = false;
            }
        }
    }

    fn writer_loop(&self) {
        loop {
            {
                let mut queue = self.queue.lock();
                // Called with nothing queued: the reader left a batch it
                // could only begin to send.
                let idle = |q: &Queue| q.replies.is_empty() && !q.writer_called;
                while idle(&queue) && !queue.closed {
                    if self
                        .ready
                        .wait_for(&mut queue, WRITER_IDLE_EXIT)
                        .timed_out()
                        && idle(&queue)
                    {
                        queue.writer_alive = false;
                        return;
                    }
                }
                if idle(&queue) && queue.closed {
                    queue.writer_alive = false;
                    return;
                }
            }
            self.drain();
        }
    }

    /// After `close`: wait for the writer thread, if one runs, to end.
    pub fn join_writer(&self) {
        let writer = self.writer.lock().take();
        if let Some(writer) = writer {
            let _ = writer.join();
        }
    }

    pub fn push(&self, reply: Reply) {
        let on_reader = self.on_reader_thread();
        let call_writer = {
            let mut queue = self.queue.lock();
            queue.payload_bytes += payload_bytes(&reply);
            queue.replies.push_back(reply);
            // The reader drains before it blocks, so a short queue can wait
            // for it (called, if this is another thread); a long one goes
            // to the writer thread so that reading and writing overlap at
            // high queue depths and with large reads.
            let call = queue.replies.len() >= READER_KEEPS_REPLIES_MAX
                || queue.payload_bytes >= READER_KEEPS_BYTES_MAX;
            queue.writer_called |= call;
            call
        };
        if call_writer {
            self.wake_writer();
        } else if !on_reader {
            self.wake_reader();
        }
    }

    /// The reader's send: what is queued, unless the writer thread has been
    /// called for it or is already sending (it re-checks the queue before
    /// it sleeps, so nothing is left behind). It never blocks on the
    /// socket: the reader also reaps its ring, whose completions release
    /// locks that other clients wait for, so a client that stops reading
    /// its replies leaves them to the writer thread. Returns whether any
    /// reply's budget was released meanwhile (by this thread or another).
    pub fn drain_unless_busy(&self) -> bool {
        let released_before = self.released_total.load(Ordering::SeqCst);
        self.take_reader_call();
        if !self.queue.lock().writer_called {
            if let Some(socket) = self.socket.try_lock() {
                self.drain_locked(socket, false);
            }
        }
        self.released_total.load(Ordering::SeqCst) != released_before
    }

    /// Write out everything queued (blocking on this client's socket only).
    pub fn drain(&self) {
        self.drain_locked(self.socket.lock(), true);
    }

    /// Hand what is left to the writer thread.
    fn call_writer(&self) {
        self.queue.lock().writer_called = true;
        self.wake_writer();
    }

    fn drain_locked(&self, mut socket: parking_lot::MutexGuard<'_, Socket>, blocking: bool) {
        if let Some((batch, sent)) = socket.partial.take() {
            if !blocking {
                socket.partial = Some((batch, sent));
                return self.call_writer();
            }
            self.finish(&mut socket, batch, sent);
        }
        loop {
            let batch: Vec<Reply> = {
                let mut queue = self.queue.lock();
                let take = queue.replies.len().min(BATCH_REPLIES_MAX);
                let batch: Vec<Reply> = queue.replies.drain(..take).collect();
                queue.payload_bytes -= batch.iter().map(payload_bytes).sum::<usize>();
                if queue.replies.is_empty() {
                    queue.writer_called = false;
                }
                batch
            };
            if batch.is_empty() {
                return;
            }
            if !blocking && socket.alive {
                match send_some(&socket.stream, self.structured, &batch) {
                    Ok((sent, total)) if sent < total || socket.stream.holds_unsent() => {
                        socket.partial = Some((batch, sent));
                        return self.call_writer();
                    }
                    Ok(_) => self.release(batch),
                    Err(err) => {
                        self.went_away(&mut socket, &err);
                        self.release(batch);
                    }
                }
                continue;
            }
            self.finish(&mut socket, batch, 0);
        }
    }

    /// Send `batch` from byte `sent` on, blocking, then release its budget.
    fn finish(&self, socket: &mut Socket, batch: Vec<Reply>, sent: usize) {
        if socket.alive {
            if let Err(err) = send(&mut socket.stream, self.structured, &batch, sent) {
                self.went_away(socket, &err);
            }
        }
        self.release(batch);
    }

    fn went_away(&self, socket: &mut Socket, err: &io::Error) {
        tracing::info!(peer = self.peer, error = %err, "client went away while replies were pending");
        socket.alive = false;
        // Unblock the reader too; it will wind the connection down.
        socket.stream.shutdown(Shutdown::Both);
    }

    fn release(&self, batch: Vec<Reply>) {
        if batch.is_empty() {
            return;
        }
        for reply in batch {
            if reply.ends_request() {
                self.budget.release(reply.budget_bytes);
            } else {
                self.budget.release_bytes(reply.budget_bytes);
            }
        }
        self.released_total.fetch_add(1, Ordering::SeqCst);
        // The reader may be waiting for this budget.
        if !self.on_reader_thread() {
            self.wake_reader();
        }
    }

    /// No more replies will be pushed; the writer thread exits when empty.
    pub fn close(&self) {
        self.queue.lock().closed = true;
        self.ready.notify_all();
    }
}

fn payload_bytes(reply: &Reply) -> usize {
    match &reply.body {
        Body::Read { data, .. } => data.len,
        _ => 0,
    }
}

/// The bytes of one reply's payload that go on the wire after its header.
fn payload(reply: &Reply, structured: bool) -> Option<&[u8]> {
    match &reply.body {
        Body::Read { data, .. } if !(structured && data.hole) => Some(data.bytes()),
        _ => None,
    }
}

/// Send `batch` from byte `skip` on, blocking until all is written.
fn send(stream: &mut Stream, structured: bool, batch: &[Reply], skip: usize) -> io::Result<()> {
    let headers: Vec<Vec<u8>> = batch.iter().map(|r| header(r, structured)).collect();
    let mut slices = Vec::with_capacity(batch.len() * 2);
    for (reply, header) in batch.iter().zip(&headers) {
        slices.push(IoSlice::new(header));
        if let Some(bytes) = payload(reply, structured) {
            slices.push(IoSlice::new(bytes));
        }
    }
    let mut slices = &mut slices[..];
    IoSlice::advance_slices(&mut slices, skip);
    write_all_vectored(stream, slices)?;
    stream.flush()
}

/// Send as much of `batch` as the socket takes now, without blocking:
/// the bytes sent, and the batch's whole length.
fn send_some(stream: &Stream, structured: bool, batch: &[Reply]) -> io::Result<(usize, usize)> {
    let headers: Vec<Vec<u8>> = batch.iter().map(|r| header(r, structured)).collect();
    if let Stream::Tls(tls) = stream {
        let mut slices = Vec::with_capacity(batch.len() * 2);
        for (reply, header) in batch.iter().zip(&headers) {
            slices.push(IoSlice::new(header));
            if let Some(bytes) = payload(reply, structured) {
                slices.push(IoSlice::new(bytes));
            }
        }
        let total = slices.iter().map(|s| s.len()).sum();
        return Ok((tls.send_now(&slices, TLS_SEAL_NOW_BYTES_MAX)?, total));
    }
    let mut iovecs = Vec::with_capacity(batch.len() * 2);
    let mut push = |bytes: &[u8]| {
        iovecs.push(libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        })
    };
    for (reply, header) in batch.iter().zip(&headers) {
        push(header);
        if let Some(bytes) = payload(reply, structured) {
            push(bytes);
        }
    }
    let total: usize = iovecs.iter().map(|v| v.iov_len).sum();
    let mut sent = 0;
    let mut first = 0;
    while sent < total {
        let slice = &mut iovecs[first..];
        let count = slice.len().min(libc::UIO_MAXIOV as usize);
        // SAFETY: every iovec points into `headers` or a reply's buffer,
        // both borrowed for this call; the message struct lives on the stack.
        let result = unsafe {
            let mut message: libc::msghdr = std::mem::zeroed();
            message.msg_iov = slice.as_mut_ptr();
            message.msg_iovlen = count as _;
            libc::sendmsg(
                stream.as_raw_fd(),
                &message,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if result < 0 {
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::WouldBlock => return Ok((sent, total)),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(err),
            }
        }
        let mut written = result as usize;
        sent += written;
        // Step past what went out, trimming a slice that went out in part.
        while written > 0 {
            let iov = &mut iovecs[first];
            if written >= iov.iov_len {
                written -= iov.iov_len;
                first += 1;
            } else {
                // SAFETY: `written` < `iov_len`: still inside the same buffer.
                iov.iov_base = unsafe { (iov.iov_base as *mut u8).add(written) } as *mut _;
                iov.iov_len -= written;
                written = 0;
            }
        }
    }
    Ok((sent, total))
}

/// The bytes before any read data, or the whole reply.
fn header(reply: &Reply, structured: bool) -> Vec<u8> {
    let handle = reply.handle;
    match (&reply.body, structured) {
        (Body::Ok, _) => reply::simple(handle, 0).to_vec(),
        (Body::Error { errno, .. }, false) => reply::simple(handle, errno.wire()).to_vec(),
        (Body::Error { errno, message }, true) => reply::error_chunk(handle, errno.wire(), message),
        (Body::Read { .. }, false) => reply::simple(handle, 0).to_vec(),
        (Body::Read { offset, data, last }, true) if data.hole => {
            reply::offset_hole(handle, *offset, data.len as u32, *last)
        }
        (Body::Read { offset, data, last }, true) => {
            reply::offset_data_header(handle, *offset, data.len as u32, *last)
        }
        (Body::BlockStatus(extents), _) => {
            reply::block_status(handle, weir_nbd::consts::BASE_ALLOCATION_ID, extents, true)
        }
    }
}

fn write_all_vectored(stream: &mut Stream, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !slices.is_empty() {
        match stream.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => IoSlice::advance_slices(&mut slices, written),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}
