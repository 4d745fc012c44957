//! A TLS connection shared by the reader and the reply senders.
//!
//! ```text
//!  reader:  socket ─read─> stash ─> session (decrypt) ─> plaintext
//!  senders: plaintext ─> session (seal) ─> wire.pending ─send─> socket
//!           (under `wire`, so records leave in the order they were sealed)
//! ```
//!
//! A connection's requests are read on one thread and its replies sent
//! from others, so the rustls session sits behind a lock held only to
//! decrypt or seal, never across a socket call: a client that stops
//! reading blocks the sender, not the reader, as on a plaintext socket.

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use parking_lot::Mutex;
use rustls::ServerConnection;

use super::socket::Socket;

/// Plaintext sealed per step of a blocking send: bounds the ciphertext
/// held beside the replies it encrypts.
const SEAL_STEP_BYTES: usize = 256 * 1024;
/// Raw bytes read from the socket at once.
const STASH_READ_BYTES: usize = 64 * 1024;

struct Shared {
    session: Mutex<ServerConnection>,
    wire: Mutex<Wire>,
}

/// Ciphertext sealed and not yet on the socket.
#[derive(Default)]
struct Wire {
    pending: Vec<u8>,
    sent: usize,
}

impl Wire {
    fn is_empty(&self) -> bool {
        self.sent == self.pending.len()
    }
}

pub struct TlsStream {
    socket: Socket,
    shared: Arc<Shared>,
    /// Raw bytes read and not yet given to the session (reader only).
    stash: Vec<u8>,
    /// Where socket reads land (reader only; allocated on first read).
    landing: Vec<u8>,
}

impl TlsStream {
    pub fn new(socket: Socket, mut session: ServerConnection) -> TlsStream {
        // Senders seal a step or a batch at a time and drain it at once.
        session.set_buffer_limit(None);
        TlsStream {
            socket,
            shared: Arc::new(Shared {
                session: Mutex::new(session),
                wire: Mutex::new(Wire::default()),
            }),
            stash: Vec::new(),
            landing: Vec::new(),
        }
    }

    pub fn socket(&self) -> &Socket {
        &self.socket
    }

    pub fn try_clone(&self) -> io::Result<TlsStream> {
        Ok(TlsStream {
            socket: self.socket.try_clone()?,
            shared: Arc::clone(&self.shared),
            stash: Vec::new(),
            landing: Vec::new(),
        })
    }

    /// The client certificate's DER, if it sent one.
    pub fn peer_certificate(&self) -> Option<Vec<u8>> {
        let session = self.shared.session.lock();
        let certs = session.peer_certificates()?;
        certs.first().map(|cert| cert.to_vec())
    }

    /// Whether a read would return without the socket: plaintext is
    /// decrypted and waiting, or the client has closed.
    pub fn readable_now(&mut self) -> bool {
        let mut session = self.shared.session.lock();
        match feed(&mut self.stash, &mut session) {
            Ok(state) => state.plaintext_bytes_to_read() > 0 || state.peer_has_closed(),
            Err(_) => true, // the read reports it
        }
    }

    /// Send whatever the session has sealed (a key update, an alert)
    /// behind what senders already queued.
    fn send_session_output(&mut self) -> io::Result<()> {
        let shared = Arc::clone(&self.shared);
        let mut wire = shared.wire.lock();
        self.drain_session(&mut wire);
        self.flush_blocking(&mut wire)
    }

    fn drain_session(&self, wire: &mut Wire) {
        if wire.is_empty() {
            wire.pending.clear();
            wire.sent = 0;
        }
        let mut session = self.shared.session.lock();
        while session.wants_write() {
            // Writing into a Vec cannot fail.
            let _ = session.write_tls(&mut wire.pending);
        }
    }

    fn flush_blocking(&mut self, wire: &mut Wire) -> io::Result<()> {
        while !wire.is_empty() {
            match self.socket.write(&wire.pending[wire.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => wire.sent += n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Send what the socket takes now; true when nothing is left.
    fn flush_now(&self, wire: &mut Wire) -> io::Result<bool> {
        while !wire.is_empty() {
            let rest = &wire.pending[wire.sent..];
            // SAFETY: `rest` is valid for reads of its length.
            let sent = unsafe {
                libc::send(
                    self.socket.as_raw_fd(),
                    rest.as_ptr().cast(),
                    rest.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if sent < 0 {
                let err = io::Error::last_os_error();
                match err.kind() {
                    io::ErrorKind::WouldBlock => return Ok(false),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(err),
                }
            }
            wire.sent += sent as usize;
        }
        Ok(true)
    }

    fn seal(&self, wire: &mut Wire, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        if wire.is_empty() {
            wire.pending.clear();
            wire.sent = 0;
        }
        let mut session = self.shared.session.lock();
        let mut taken = 0;
        for slice in slices {
            session.writer().write_all(slice)?;
            taken += slice.len();
        }
        while session.wants_write() {
            let _ = session.write_tls(&mut wire.pending);
        }
        Ok(taken)
    }

    /// Seal and send `slices` without blocking; returns the plaintext
    /// bytes taken: all of them, or none if earlier ciphertext is still
    /// waiting or the whole exceeds `limit` (the caller then sends them
    /// with a blocking write). What the socket did not take stays queued
    /// (see [`TlsStream::holds_unsent`]) for the next write or flush.
    pub fn send_now(&self, slices: &[IoSlice<'_>], limit: usize) -> io::Result<usize> {
        let mut wire = self.shared.wire.lock();
        let total: usize = slices.iter().map(|s| s.len()).sum();
        if !self.flush_now(&mut wire)? || total > limit {
            return Ok(0);
        }
        let taken = self.seal(&mut wire, slices)?;
        self.flush_now(&mut wire)?;
        Ok(taken)
    }

    /// Whether sealed bytes still wait for the socket.
    pub fn holds_unsent(&self) -> bool {
        !self.shared.wire.lock().is_empty()
    }

    /// Tell the client no more data follows.
    pub fn close_notify(&mut self) -> io::Result<()> {
        self.shared.session.lock().send_close_notify();
        self.send_session_output()
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let wants_write = {
                let mut session = self.shared.session.lock();
                let state = feed(&mut self.stash, &mut session)?;
                if state.plaintext_bytes_to_read() > 0 || state.peer_has_closed() {
                    return match session.reader().read(buf) {
                        Err(err) if err.kind() == io::ErrorKind::WouldBlock => Ok(0),
                        other => other,
                    };
                }
                session.wants_write()
            };
            if wants_write {
                self.send_session_output()?;
            }
            if self.landing.is_empty() {
                self.landing = vec![0; STASH_READ_BYTES];
            }
            match self.socket.read(&mut self.landing)? {
                // Closed without close_notify: the end of the stream all
                // the same for NBD, whose requests are self-delimiting.
                0 => return Ok(0),
                got => self.stash.extend_from_slice(&self.landing[..got]),
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Seal and send every byte of `slices`, a step at a time.
    fn write_vectored(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        let shared = Arc::clone(&self.shared);
        let mut wire = shared.wire.lock();
        self.flush_blocking(&mut wire)?;
        let mut written = 0;
        for slice in slices {
            for step in slice.chunks(SEAL_STEP_BYTES) {
                written += self.seal(&mut wire, &[IoSlice::new(step)])?;
                self.flush_blocking(&mut wire)?;
            }
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        let shared = Arc::clone(&self.shared);
        let mut wire = shared.wire.lock();
        self.drain_session(&mut wire);
        self.flush_blocking(&mut wire)
    }
}

/// Give the session what `stash` holds, as far as it takes it.
fn feed(stash: &mut Vec<u8>, session: &mut ServerConnection) -> io::Result<rustls::IoState> {
    let invalid = |e| io::Error::new(io::ErrorKind::InvalidData, e);
    while !stash.is_empty() && session.wants_read() {
        let mut slice = &stash[..];
        let took = session.read_tls(&mut slice)?;
        stash.drain(..took);
        session.process_new_packets().map_err(invalid)?;
        if took == 0 {
            break;
        }
    }
    session.process_new_packets().map_err(invalid)
}
