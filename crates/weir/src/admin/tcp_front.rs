//! The admin endpoint's TCP side: accept a connection, run the TLS
//! handshake when the server has certificates, and pass the plaintext to
//! the HTTP server on a private Unix socket, where every request must
//! carry the token. Bounded: at most `CONNECTIONS_MAX` connections, a
//! handshake within `HANDSHAKE_TIME_MAX`, and a connection that sends or
//! takes nothing for `IDLE_TIME_MAX` is closed.
//!
//! tiny_http's own TLS needs an older rustls than the NBD side uses; this
//! front reuses the NBD side's TLS instead of carrying two.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::server::stream::Stream;
use crate::server::tls::Tls;

const CONNECTIONS_MAX: usize = 64;
const HANDSHAKE_TIME_MAX: Duration = Duration::from_secs(10);
const IDLE_TIME_MAX: Duration = Duration::from_secs(60);
/// How often the accept loop looks at its stop flag.
const STOP_POLL_MS: i32 = 100;

/// Accept on `listener` until `stop` is set, passing each connection to
/// the HTTP server at `inner`.
pub fn serve(listener: TcpListener, tls: Option<Tls>, inner: PathBuf, stop: Arc<AtomicBool>) {
    // A connection reset between poll and accept must not leave accept
    // waiting for the next one, past a stop. Accepted sockets do not
    // inherit the flag.
    if let Err(err) = listener.set_nonblocking(true) {
        tracing::error!(error = %err, "admin endpoint: cannot make the TCP listener non-blocking");
        return;
    }
    let tls = tls.map(Arc::new);
    let open = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::SeqCst) {
        if !wait_readable(&listener) {
            continue;
        }
        let socket = match listener.accept() {
            Ok((socket, _)) => socket,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
            Err(err) => {
                tracing::warn!(error = %err, "admin endpoint: accepting a connection failed");
                std::thread::sleep(Duration::from_millis(STOP_POLL_MS as u64));
                continue;
            }
        };
        let peer = socket
            .peer_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string());
        if open.fetch_add(1, Ordering::SeqCst) >= CONNECTIONS_MAX {
            open.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(
                peer,
                "admin connection refused: {CONNECTIONS_MAX} already open"
            );
            continue;
        }
        let (tls, inner, done) = (tls.clone(), inner.clone(), Arc::clone(&open));
        let spawned = std::thread::Builder::new()
            .name("weir-admin-tcp".into())
            .spawn(move || {
                if let Err(err) = relay(socket, tls.as_deref(), &inner) {
                    tracing::debug!(peer, error = %err, "admin connection ended");
                }
                done.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            open.fetch_sub(1, Ordering::SeqCst);
            tracing::error!("admin endpoint: cannot start a thread for a connection");
        }
    }
}

/// Whether the listener has a connection waiting, within the stop poll.
fn wait_readable(listener: &TcpListener) -> bool {
    let mut poll = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd that lives across the call.
    unsafe { libc::poll(&mut poll, 1, STOP_POLL_MS) > 0 }
}

/// One connection: handshake, then bytes both ways until either side
/// closes or goes idle.
fn relay(socket: TcpStream, tls: Option<&Tls>, inner: &Path) -> io::Result<()> {
    socket.set_read_timeout(Some(HANDSHAKE_TIME_MAX))?;
    socket.set_write_timeout(Some(HANDSHAKE_TIME_MAX))?;
    let mut client = Stream::tcp(socket);
    if let Some(tls) = tls {
        client = tls.accept(client)?;
    }
    client.set_read_timeout(Some(IDLE_TIME_MAX))?;
    client.set_write_timeout(Some(IDLE_TIME_MAX))?;
    let server = UnixStream::connect(inner)?;
    server.set_read_timeout(Some(IDLE_TIME_MAX))?;
    server.set_write_timeout(Some(IDLE_TIME_MAX))?;
    let (mut from_client, mut to_server) = (client.try_clone()?, server.try_clone()?);
    let upstream = std::thread::Builder::new()
        .name("weir-admin-tcp".into())
        .spawn(move || {
            let result = pump(&mut from_client, &mut to_server);
            let _ = to_server.shutdown(Shutdown::Write);
            result
        })?;
    let (mut from_server, mut to_client) = (server, client);
    let result = pump(&mut from_server, &mut to_client);
    if let Some(tls) = to_client.tls() {
        let _ = tls.close_notify();
    }
    to_client.shutdown(Shutdown::Both);
    let _ = from_server.shutdown(Shutdown::Both);
    let upstream = upstream.join().unwrap_or(Ok(()));
    result.and(upstream)
}

/// Copy until end of file, flushing after each piece (TLS holds sealed
/// bytes until a flush).
fn pump(from: &mut impl Read, to: &mut impl Write) -> io::Result<()> {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        to.write_all(&buf[..n])?;
        to.flush()?;
    }
}
