//! The outbox: replies waiting for the socket.
//!
//! ```text
//!  completion on the reader thread ──push (no wake)──┐
//!  completion on any other thread ──push + wake──────┤
//!                                                    ▼
//!                     queue ──drain──> socket (one writer at a time)
//!                       ▲  drained by the reader before it blocks,
//!                       └─ and by the writer thread when woken
//! ```
//!
//! The reader writing its own replies saves a thread handoff per request
//! (most of the latency at queue depth 1). Completions from device threads
//! never write to the socket themselves: a client that stops reading must
//! not stall a device shared with other clients.

use std::cell::Cell;
use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::net::Shutdown;
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
    },
    /// `(length, flags)` extents of `base:allocation`.
    BlockStatus(Vec<(u32, u32)>),
}

pub struct Reply {
    pub handle: u64,
    pub body: Body,
    /// Budget the request holds, released once the reply is sent.
    pub budget_bytes: u64,
}

struct Queue {
    replies: VecDeque<Reply>,
    /// Read payload bytes among `replies`.
    payload_bytes: usize,
    /// The writer thread was woken for what is queued; the reader leaves
    /// sending to it rather than hold up reading.
    writer_called: bool,
    closed: bool,
}

struct Socket {
    stream: Stream,
    alive: bool,
}

pub struct Outbox {
    connection: u64,
    structured: bool,
    peer: String,
    budget: Arc<Budget>,
    queue: Mutex<Queue>,
    ready: Condvar,
    socket: Mutex<Socket>,
}

impl Outbox {
    pub fn new(
        connection: u64,
        stream: Stream,
        structured: bool,
        budget: Arc<Budget>,
        peer: String,
    ) -> Arc<Self> {
        assert_ne!(connection, 0, "connection ids start at 1");
        Arc::new(Outbox {
            connection,
            structured,
            peer,
            budget,
            queue: Mutex::new(Queue {
                replies: VecDeque::new(),
                payload_bytes: 0,
                writer_called: false,
                closed: false,
            }),
            ready: Condvar::new(),
            socket: Mutex::new(Socket {
                stream,
                alive: true,
            }),
        })
    }

    /// Mark the calling thread as this connection's reader.
    pub fn enter_reader(&self) {
        READER_OF.with(|r| r.set(self.connection));
    }

    pub fn spawn_writer(self: &Arc<Self>) -> io::Result<JoinHandle<()>> {
        let outbox = Arc::clone(self);
        std::thread::Builder::new()
            .name("weir-reply".into())
            .spawn(move || loop {
                {
                    let mut queue = outbox.queue.lock();
                    while queue.replies.is_empty() && !queue.closed {
                        outbox.ready.wait(&mut queue);
                    }
                    if queue.replies.is_empty() && queue.closed {
                        return;
                    }
                }
                outbox.drain();
            })
    }

    pub fn push(&self, reply: Reply) {
        let call_writer = {
            let mut queue = self.queue.lock();
            queue.payload_bytes += payload_bytes(&reply);
            queue.replies.push_back(reply);
            // The reader drains before it blocks, so a short queue can wait
            // for it; a long one goes to the writer thread so that reading
            // and writing overlap at high queue depths and with large reads.
            let call = READER_OF.with(Cell::get) != self.connection
                || queue.replies.len() >= READER_KEEPS_REPLIES_MAX
                || queue.payload_bytes >= READER_KEEPS_BYTES_MAX;
            queue.writer_called |= call;
            call
        };
        if call_writer {
            self.ready.notify_one();
        }
    }

    /// The reader's send: what is queued, unless the writer thread has been
    /// called for it or is already sending (it re-checks the queue before
    /// it sleeps, so nothing is left behind).
    pub fn drain_unless_busy(&self) {
        if self.queue.lock().writer_called {
            return;
        }
        if let Some(socket) = self.socket.try_lock() {
            self.drain_locked(socket);
        }
    }

    /// Write out everything queued (blocking on this client's socket only).
    pub fn drain(&self) {
        self.drain_locked(self.socket.lock());
    }

    fn drain_locked(&self, mut socket: parking_lot::MutexGuard<'_, Socket>) {
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
            if socket.alive {
                if let Err(err) = send(&mut socket.stream, self.structured, &batch) {
                    tracing::info!(peer = self.peer, error = %err, "client went away while replies were pending");
                    socket.alive = false;
                    // Unblock the reader too; it will wind the connection down.
                    socket.stream.shutdown(Shutdown::Both);
                }
            }
            for reply in batch {
                self.budget.release(reply.budget_bytes);
            }
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

fn send(stream: &mut Stream, structured: bool, batch: &[Reply]) -> io::Result<()> {
    let headers: Vec<Vec<u8>> = batch.iter().map(|r| header(r, structured)).collect();
    let mut slices = Vec::with_capacity(batch.len() * 2);
    for (reply, header) in batch.iter().zip(&headers) {
        slices.push(IoSlice::new(header));
        if let Body::Read { data, .. } = &reply.body {
            if !(structured && data.hole) {
                slices.push(IoSlice::new(data.bytes()));
            }
        }
    }
    write_all_vectored(stream, &mut slices)
}

/// The bytes before any read data, or the whole reply.
fn header(reply: &Reply, structured: bool) -> Vec<u8> {
    let handle = reply.handle;
    match (&reply.body, structured) {
        (Body::Ok, _) => reply::simple(handle, 0).to_vec(),
        (Body::Error { errno, .. }, false) => reply::simple(handle, errno.wire()).to_vec(),
        (Body::Error { errno, message }, true) => reply::error_chunk(handle, errno.wire(), message),
        (Body::Read { .. }, false) => reply::simple(handle, 0).to_vec(),
        (Body::Read { offset, data }, true) if data.hole => {
            reply::offset_hole(handle, *offset, data.len as u32, true)
        }
        (Body::Read { offset, data }, true) => {
            reply::offset_data_header(handle, *offset, data.len as u32, true)
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
