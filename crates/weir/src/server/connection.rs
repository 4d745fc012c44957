//! One client connection: the handshake, then the transmission loop.
//!
//! ```text
//!  socket ─read─> [this thread] decode ─> validate ─> volume.op(.., done)
//!                                                            │ (this thread's ring, or any thread)
//!  socket <─write─ outbox <──────────────────────────────────┘
//!                   (sent by this thread, woken by others; by the reply thread for backlogs)
//! ```
//!
//! Requests run concurrently and are answered as they finish. The thread
//! owns a [`ThreadRing`]: io_uring devices put its ops there, and whenever
//! it would block (on the socket, on the budget) it reaps that ring
//! instead, so a request and its reply never change threads. The budget
//! bounds bytes and requests in flight; when the client stops, the loop
//! waits for everything in flight to be answered before closing.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_nbd::consts::FLAG_READ_ONLY;
use weir_nbd::consts::{REQUEST_HEADER_BYTES, STATE_HOLE, STATE_ZERO};
use weir_nbd::{
    Command, Handshake, Negotiated, Progress, RequestHeader, Session, TlsMode, Verdict,
};

use super::access::Client;
use super::budget::Budget;
use super::exports::{ClientView, Export, Exports};
use super::idle_spin::IdleSpin;
use super::outbox::{Body, Outbox, Reply};
use super::read_buffer::ReadBuffer;
use super::shared_budget::Source;
use super::spin_trial::SpinTrial;
use super::split_read;
use super::stream::Stream;
use crate::cache::LocalPauses;
use crate::device::{AlignedBuf, ThreadRing};
use crate::volume::{Done, Volume};

/// A handshake must finish within this, however its bytes trickle in: a
/// client sending a byte every few seconds would otherwise hold its
/// connection slot for good.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests in flight per connection.
const REQUESTS_IN_FLIGHT_MAX: u32 = 256;
/// Extents returned for one BLOCK_STATUS request.
const EXTENTS_PER_REPLY_MAX: usize = 1024;
const READ_BUFFER_BYTES: usize = 256 * 1024;

pub fn serve(stream: Stream, exports: Arc<Exports>) {
    let peer = stream.peer();
    match handshake(stream, &exports) {
        Ok(Some((stream, negotiated))) => {
            tracing::debug!(peer, export = negotiated.export.name, "client connected");
            transmission(stream, &exports, negotiated, &peer)
        }
        Ok(None) => tracing::debug!(peer, "client ended the handshake"),
        Err(reason) => tracing::warn!(peer, "handshake failed: {reason}"),
    }
}

fn handshake(stream: Stream, exports: &Exports) -> Result<Option<(Stream, Negotiated)>, String> {
    handshake_within(stream, exports, HANDSHAKE_TIMEOUT)
}

/// Negotiate until the client picks an export (returning the stream it
/// continues on, encrypted if it started TLS), leaves, or fails.
fn handshake_within(
    mut stream: Stream,
    exports: &Exports,
    timeout: Duration,
) -> Result<Option<(Stream, Negotiated)>, String> {
    let deadline = Instant::now() + timeout;
    let late = || format!("handshake not finished within {timeout:?}");
    let peer = stream.peer();
    let mut machine = Handshake::with_tls(exports.tls().map_or(TlsMode::Off, |tls| tls.mode));
    let mut client = Client {
        address: stream.peer_ip(),
        cert_names: Vec::new(),
    };
    let mut buf = [0u8; 8192];
    loop {
        // Reads and writes (a client that does not read our replies) both
        // end at the deadline, the TLS handshake's included.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late());
        }
        stream
            .set_read_timeout(Some(left))
            .and_then(|()| stream.set_write_timeout(Some(left)))
            .map_err(|e| e.to_string())?;
        stream
            .write_all(&machine.take_output())
            .and_then(|()| stream.flush())
            .map_err(|e| format!("write failed: {e}"))?;
        let got = match stream.read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(got) => got,
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(late())
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(format!("read failed: {err}")),
        };
        let view = ClientView {
            exports,
            client: &client,
        };
        let progress = machine.receive(&buf[..got], &view);
        for refusal in machine.take_refusals() {
            tracing::info!(peer, "refused {refusal}");
        }
        let progress = progress.map_err(|e| {
            // A refusal sent before closing (an oversize option's
            // ERR_TOO_BIG) reaches the client if it still reads.
            let _ = stream
                .write_all(&machine.take_output())
                .and_then(|()| stream.flush());
            e.to_string()
        })?;
        match progress {
            Progress::NeedMore => {}
            Progress::StartTls => {
                stream
                    .write_all(&machine.take_output())
                    .map_err(|e| format!("write failed: {e}"))?;
                let tls = exports
                    .tls()
                    .expect("STARTTLS is acknowledged only with TLS on");
                stream = tls
                    .accept(stream)
                    .map_err(|e| format!("TLS handshake failed: {e}"))?;
                if let Some(der) = stream.tls().and_then(|tls| tls.peer_certificate()) {
                    client.cert_names = Client::names_in_certificate(&der);
                }
                tracing::debug!(peer, certificate = ?client.cert_names, "TLS started");
                machine.tls_started();
            }
            Progress::Done(negotiated) => {
                stream
                    .write_all(&machine.take_output())
                    .and_then(|()| stream.flush())
                    .map_err(|e| format!("write failed: {e}"))?;
                return Ok(Some((stream, negotiated)));
            }
            Progress::Aborted => {
                // The spec lets a client hang up without reading the ACK.
                let _ = stream
                    .write_all(&machine.take_output())
                    .and_then(|()| stream.flush());
                return Ok(None);
            }
        }
    }
}

static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

/// Queues one reply and carries the request's budget with it.
#[derive(Clone)]
struct Replier {
    outbox: Arc<Outbox>,
}

impl Replier {
    fn send(&self, handle: u64, budget_bytes: u64, body: Body) {
        self.outbox.push(Reply {
            handle,
            body,
            budget_bytes,
        });
    }

    fn on_done(&self, handle: u64, budget_bytes: u64, what: &'static str) -> Done<()> {
        let replier = self.clone();
        Box::new(move |result| replier.send(handle, budget_bytes, result_body(result, what)))
    }
}

impl split_read::ChunkSink for Replier {
    fn push(&self, reply: Reply) {
        self.outbox.push(reply)
    }
}

/// What the reader does instead of sleeping: release the write replies
/// whose pause is over, send queued replies, then reap its own ring, or
/// wait for the next paused reply or a call from another thread (a reply
/// finished there, or budget released). It always makes progress or
/// waits for it, so the caller loops and never sleeps on its own.
fn make_progress(outbox: &Outbox, ring: Option<&ThreadRing>, pauses: Option<&LocalPauses>) -> bool {
    let next_release = pauses.and_then(LocalPauses::release_due);
    if outbox.drain_unless_busy() {
        // Budget came back: the caller looks again before anyone waits.
        return true;
    }
    match (ring, next_release) {
        // The ring watches the outbox's wake descriptor too.
        (Some(ring), None) if ring.in_flight() > 0 => {
            ring.wait(None);
        }
        (Some(ring), Some(at)) if ring.in_flight() > 0 => ring.wait_until(at),
        (_, at) => {
            wait_for(None, outbox, at);
        }
    }
    true
}

/// What ended a [`wait_for`].
#[derive(PartialEq)]
enum Woken {
    /// The socket has data (or an error to report).
    Socket,
    /// Another thread called, the deadline passed, or a signal came.
    Other,
}

/// Wait until `socket` (if given) is readable, the outbox's reader is
/// called, or `deadline` passes.
fn wait_for(socket: Option<RawFd>, outbox: &Outbox, deadline: Option<Instant>) -> Woken {
    if outbox.reader_called() {
        return Woken::Other;
    }
    let mut polls = [
        libc::pollfd {
            fd: outbox.reader_wake_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: socket.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let timeout_ms = deadline.map_or(-1, |at| {
        let left = at.saturating_duration_since(Instant::now());
        left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
    });
    let count: libc::nfds_t = if socket.is_some() { 2 } else { 1 };
    // SAFETY: `count` valid pollfds for the duration of the call.
    let ready = unsafe { libc::poll(polls.as_mut_ptr(), count, timeout_ms) };
    // An interrupted poll is not data: the caller releases what is due and
    // waits again rather than block in a read with replies still held.
    if ready > 0 && count == 2 && polls[1].revents != 0 {
        Woken::Socket
    } else {
        Woken::Other
    }
}

/// The socket as the reader sees it: before each read that may block, it
/// sends queued replies and reaps its ring until the socket has data.
///
/// When the requests since the last read completed without device I/O (a
/// memory device), it polls the socket briefly before sleeping (see
/// `idle_spin`). When they went to a device, it reads at once: on a 2-CPU VM
/// measured, polling then made depth-1 reads from a file 15-30% slower
/// (the polling vCPU competes with the host's own I/O work), while polling
/// doubled them from memory. Whether it polls the ring for device
/// completions is measured per connection (see `spin_trial`): that wins at
/// depth 32 and loses at depth 1 to 8.
struct SocketReader<'a> {
    stream: Stream,
    fd: RawFd,
    outbox: &'a Outbox,
    ring: Option<&'a ThreadRing>,
    /// Write replies this thread holds for the cache's pause.
    pauses: Option<&'a LocalPauses>,
    spin: IdleSpin,
    /// The ring's `submitted_total` at the last read.
    ring_submitted_seen: u64,
    /// Whether to poll the ring for device completions before sleeping.
    ring_trial: SpinTrial,
    /// The ring's `completed_total` at the last wait.
    ring_completed_seen: u64,
}

impl SocketReader<'_> {
    /// `recv` without sleeping for the spin window, then a blocking read.
    /// Under TLS the spin only peeks: raw bytes are not requests until TLS
    /// has decrypted them, which the stream's read does.
    fn read_polling(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let tls = self.stream.is_tls();
        let window = self.spin.window();
        let slot = (!window.is_zero())
            .then(crate::spin_slots::try_take)
            .flatten();
        if slot.is_some() {
            let deadline = Instant::now() + window;
            // A call from another thread ends the spin: replies wait.
            while !self.outbox.reader_called() {
                let (flags, length) = if tls {
                    (libc::MSG_DONTWAIT | libc::MSG_PEEK, 1)
                } else {
                    (libc::MSG_DONTWAIT, buf.len())
                };
                // SAFETY: `buf` is valid for writes of `length` <= its length.
                let got = unsafe { libc::recv(self.fd, buf.as_mut_ptr().cast(), length, flags) };
                if got >= 0 && tls {
                    drop(slot);
                    return self.stream.read(buf);
                }
                if got >= 0 {
                    return Ok(got as usize);
                }
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EAGAIN | libc::EINTR) => {}
                    _ => return Err(err),
                }
                if Instant::now() >= deadline {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        drop(slot);
        self.read_blocking(buf)
    }

    /// Sleep until the socket has data, sending the replies other threads
    /// call for meanwhile, then read.
    fn read_blocking(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            self.outbox.drain_unless_busy();
            // With every reply sent, no call can come: one blocking read
            // costs a system call less than a poll and a read (at depth 1
            // on a file, 10 us of the 90 us a write takes on a 2-vCPU VM).
            if self.outbox.nothing_pending() || self.stream.readable_now() {
                return self.stream.read(buf);
            }
            if wait_for(Some(self.fd), self.outbox, None) == Woken::Socket {
                return self.stream.read(buf);
            }
        }
    }
}

impl Read for SocketReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let next_release = self.pauses.and_then(LocalPauses::release_due);
            self.outbox.drain_unless_busy();
            if self.stream.readable_now() {
                break;
            }
            match self.ring {
                Some(ring) if ring.in_flight() > 0 => {
                    let window = self.ring_trial.window();
                    let ready = ring.wait_spinning(Some(self.fd), window, next_release);
                    let completed = ring.completed_total();
                    self.ring_trial
                        .record(completed - self.ring_completed_seen, Instant::now());
                    self.ring_completed_seen = completed;
                    if ready {
                        break;
                    }
                }
                // Replies are held: wait for the client no longer than
                // the next is due.
                _ => match next_release {
                    Some(at) => {
                        if wait_for(Some(self.fd), self.outbox, Some(at)) == Woken::Socket {
                            break;
                        }
                    }
                    None => break,
                },
            }
        }
        let submitted = self.ring.map_or(0, ThreadRing::submitted_total);
        let went_to_device = submitted != self.ring_submitted_seen;
        self.ring_submitted_seen = submitted;
        if went_to_device {
            return self.read_blocking(buf);
        }
        let started = Instant::now();
        let result = self.read_polling(buf);
        self.spin.record(started.elapsed());
        result
    }
}

fn result_body(result: io::Result<()>, what: &'static str) -> Body {
    match result {
        Ok(()) => Body::Ok,
        Err(err) => Body::failed(&err, what),
    }
}

fn transmission(stream: Stream, exports: &Exports, negotiated: Negotiated, peer: &str) {
    // Gone since the handshake (removed through the admin endpoint).
    let Some(export) = exports.find(&negotiated.export.name) else {
        return tracing::info!(
            peer,
            export = negotiated.export.name,
            "export removed: closing"
        );
    };
    let volume = Arc::clone(&export.volume);
    let session = Session {
        size_bytes: volume.size_bytes(),
        // The export's own, or this client's by the export's policy.
        read_only: volume.caps().read_only
            || negotiated.export.transmission_flags & FLAG_READ_ONLY != 0,
        payload_bytes_max: exports.payload_bytes_max(),
        structured_replies: negotiated.structured_replies,
        base_allocation: negotiated.base_allocation,
    };
    let setup = stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(None))
        .and_then(|()| stream.try_clone());
    let writer_stream = match setup {
        Ok(clone) => clone,
        Err(err) => return tracing::warn!(peer, error = %err, "cannot set up connection"),
    };
    let mut budget = Budget::new(
        2 * u64::from(session.payload_bytes_max),
        REQUESTS_IN_FLIGHT_MAX,
    );
    if let Some(shared) = exports.in_flight() {
        budget = budget.within(Arc::clone(shared), Source::of(stream.peer_ip()));
    }
    let budget = Arc::new(budget);
    let id = NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed);
    match stream.try_clone().map(|handle| export.attach(id, handle)) {
        Ok(true) => {}
        Ok(false) => return tracing::info!(peer, export = export.name, "export removed: closing"),
        Err(err) => return tracing::warn!(peer, error = %err, "cannot set up connection"),
    }
    let _attached = Attached {
        export: &export,
        id,
    };
    let outbox = match Outbox::new(
        id,
        writer_stream,
        session.structured_replies,
        Arc::clone(&budget),
        peer.into(),
    ) {
        Ok(outbox) => outbox,
        Err(err) => return tracing::warn!(peer, error = %err, "cannot set up connection"),
    };
    outbox.enter_reader();
    let ring = ThreadRing::enter()
        .inspect_err(
            |err| tracing::debug!(peer, error = %err, "no thread ring; device threads reap"),
        )
        .ok();
    if let Some(ring) = &ring {
        ring.watch_wake(outbox.reader_wake_fd());
    }
    // This thread releases its writes' paused replies itself where its
    // waits can end on time; else the cache's flusher thread does.
    let pauses = ring
        .as_ref()
        .is_none_or(ThreadRing::has_deadlines)
        .then(LocalPauses::enter);
    let replier = Replier {
        outbox: Arc::clone(&outbox),
    };
    let mut closer = stream.is_tls().then(|| stream.try_clone().ok()).flatten();
    let socket = SocketReader {
        fd: stream.as_raw_fd(),
        stream,
        outbox: &outbox,
        ring: ring.as_ref(),
        pauses: pauses.as_ref(),
        spin: IdleSpin::default(),
        ring_submitted_seen: 0,
        ring_trial: SpinTrial::new(Instant::now()),
        ring_completed_seen: 0,
    };
    let mut reader = ReadBuffer::with_capacity(
        READ_BUFFER_BYTES,
        io::Cursor::new(negotiated.leftover).chain(socket),
    );
    let progress = || make_progress(&outbox, ring.as_ref(), pauses.as_ref());
    let tend = || {
        if let Some(pauses) = pauses.as_ref() {
            pauses.release_due();
        }
        outbox.drain_unless_busy();
    };
    let ended = requests(
        &mut reader,
        &volume,
        &session,
        &budget,
        &replier,
        &progress,
        &tend,
    );
    match ended {
        Ok(why) => tracing::debug!(peer, "connection closed: {why}"),
        Err(why) => tracing::warn!(peer, "dropping connection: {why}"),
    }
    budget.wait_idle(progress);
    drop(reader);
    // Replies of other connections' writes this thread may still hold.
    drop(pauses);
    outbox.drain();
    drop(ring);
    outbox.close();
    outbox.join_writer();
    if let Some(tls) = closer.as_mut().and_then(Stream::tls) {
        // Every reply is out: tell the client the stream ends here.
        let _ = tls.close_notify();
    }
}

/// Connection `id` counts as `export`'s while this lives.
struct Attached<'a> {
    export: &'a Export,
    id: u64,
}

impl Drop for Attached<'_> {
    fn drop(&mut self) {
        self.export.detach(self.id);
    }
}

/// Serve requests until the client leaves. `Ok` is a clean end, `Err` a
/// reason worth a warning.
fn requests<R: Read>(
    reader: &mut R,
    volume: &Arc<Volume>,
    session: &Session,
    budget: &Budget,
    replier: &Replier,
    progress: &dyn Fn() -> bool,
    tend: &dyn Fn(),
) -> Result<&'static str, String> {
    let acquire = |bytes: u64| budget.acquire(bytes, progress, tend);
    loop {
        let mut raw = [0u8; REQUEST_HEADER_BYTES];
        match read_header(reader, &mut raw) {
            Ok(true) => {}
            Ok(false) => return Ok("client closed the connection"),
            Err(err) => return Err(format!("disconnected mid-request header: {err}")),
        }
        let header = RequestHeader::decode(&raw).map_err(|e| e.to_string())?;
        let handle = header.handle;
        let command = match weir_nbd::request::validate(&header, session) {
            Verdict::Run(command) => command,
            Verdict::Disconnect { reason } => {
                return Err(format!(
                    "{reason} ({} bytes announced at offset {}): closed without reading it",
                    header.length, header.offset
                ))
            }
            Verdict::Reject {
                errno,
                reason,
                discard_bytes,
            } => {
                tracing::info!(
                    handle,
                    kind = header.kind,
                    offset = header.offset,
                    length = header.length,
                    "rejecting request with {}: {reason}",
                    errno.name()
                );
                discard(reader, discard_bytes)
                    .map_err(|e| format!("disconnected mid-payload: {e}"))?;
                acquire(0);
                replier.send(
                    handle,
                    0,
                    Body::Error {
                        errno,
                        message: reason.into(),
                    },
                );
                continue;
            }
        };
        match command {
            Command::Disconnect => return Ok("client sent NBD_CMD_DISC"),
            Command::Read { offset, length } => {
                let bytes = u64::from(length);
                acquire(bytes);
                let replier = replier.clone();
                // Only structured replies can answer a read in pieces.
                let piece = session
                    .structured_replies
                    .then(|| volume.read_piece_bytes(length))
                    .flatten();
                if let Some(piece) = piece {
                    split_read::read(volume, replier, handle, offset, length, piece);
                    continue;
                }
                volume.read(
                    offset,
                    length,
                    Box::new(move |result| {
                        let body = match result {
                            Ok(data) => Body::Read {
                                offset,
                                data,
                                last: true,
                            },
                            Err(err) => Body::failed(&err, "read"),
                        };
                        replier.send(handle, bytes, body)
                    }),
                );
            }
            Command::Write {
                offset,
                length,
                fua,
            } => {
                let bytes = u64::from(length);
                acquire(bytes);
                let mut data = AlignedBuf::new(length as usize);
                if let Err(err) = reader.read_exact(data.as_mut_slice()) {
                    budget.release(bytes);
                    return Err(format!("disconnected mid-write payload: {err}"));
                }
                volume.write(offset, data, fua, replier.on_done(handle, bytes, "write"));
            }
            Command::Flush => {
                acquire(0);
                volume.flush(replier.on_done(handle, 0, "flush"));
            }
            Command::Trim {
                offset,
                length,
                fua,
            } => {
                acquire(0);
                volume.trim(offset, length, fua, replier.on_done(handle, 0, "trim"));
            }
            Command::WriteZeroes {
                offset,
                length,
                fua,
                may_trim,
                fast_only,
            } => {
                acquire(0);
                let done = replier.on_done(handle, 0, "write zeroes");
                volume.write_zeroes(offset, length, fua, may_trim, fast_only, done);
            }
            Command::Cache { offset, length } => {
                // A hint: read-ahead reads the range in the background, and
                // the reply does not wait for it (the spec lets a server
                // ignore the hint altogether).
                acquire(0);
                volume.prefetch(offset, u64::from(length));
                replier.send(handle, 0, Body::Ok);
            }
            Command::BlockStatus {
                offset,
                length,
                one_extent,
            } => {
                acquire(0);
                let extents_max = if one_extent { 1 } else { EXTENTS_PER_REPLY_MAX };
                let body = match volume.extents(offset, length, extents_max) {
                    Ok(extents) => Body::BlockStatus(status_extents(&extents, length)),
                    Err(err) => Body::failed(&err, "block status"),
                };
                replier.send(handle, 0, body);
            }
        }
    }
}

/// Wire extents for `base:allocation`: never empty, never past `length`.
fn status_extents(extents: &[crate::device::Extent], length: u32) -> Vec<(u32, u32)> {
    let mut left = u64::from(length);
    let mut out = Vec::with_capacity(extents.len().max(1));
    for extent in extents {
        let take = extent.length.min(left);
        if take == 0 {
            break;
        }
        out.push((
            take as u32,
            if extent.hole {
                STATE_HOLE | STATE_ZERO
            } else {
                0
            },
        ));
        left -= take;
    }
    if out.is_empty() {
        out.push((length, 0));
    }
    out
}

/// Read a request header; `Ok(false)` on a clean end of stream before it.
fn read_header(reader: &mut impl Read, raw: &mut [u8; REQUEST_HEADER_BYTES]) -> io::Result<bool> {
    let mut got = 0;
    while got < raw.len() {
        match reader.read(&mut raw[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(true)
}

/// Skip a rejected request's payload without buffering it.
fn discard(reader: &mut impl Read, bytes: u32) -> io::Result<()> {
    let copied = io::copy(&mut reader.take(u64::from(bytes)), &mut io::sink())?;
    if copied < u64::from(bytes) {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::socket::Socket;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_handshake_that_trickles_is_closed_at_its_deadline() {
        let (server, mut client) = UnixStream::pair().unwrap();
        let trickle = std::thread::spawn(move || {
            // Client flags, then an option header a byte at a time: each
            // byte comes well within the deadline, the whole never does.
            let mut bytes = vec![0, 0, 0, 1];
            bytes.extend_from_slice(&weir_nbd::consts::IHAVEOPT.to_be_bytes());
            for byte in bytes {
                if client.write_all(&[byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(40));
            }
        });
        let device = Arc::new(crate::device::mem::MemDevice::new(1 << 20));
        let store = crate::pool::SingleDevice::new(crate::sched::DeviceQueue::new(device));
        let volume = Volume::new(Arc::new(store), false);
        let export = crate::server::Export::new("a", "", volume, Default::default());
        let exports = Exports::new(vec![export], 1 << 20);
        let started = Instant::now();
        let result = handshake_within(
            Stream::Plain(Socket::Unix(server)),
            &exports,
            Duration::from_millis(200),
        );
        let err = result
            .map(|_| ())
            .expect_err("a trickling handshake must not finish");
        assert!(err.contains("not finished within"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2), "{err}");
        trickle.join().unwrap();
    }
}
