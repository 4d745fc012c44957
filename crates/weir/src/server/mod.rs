//! Listening, accepting and shutting down.
//!
//! ```text
//!  TCP / Unix listeners ──accept──> one thread per connection (connection.rs)
//!          ▲                                   │
//!   SIGINT/SIGTERM: stop accepting, half-close every connection's read side,
//!   wait for in-flight replies (for the grace; then close the connections
//!   whose clients stopped reading), flush every volume, exit 0.
//! ```

pub mod access;
mod activation;
mod budget;
mod connection;
pub mod exports;
mod idle_spin;
mod outbox;
mod read_buffer;
mod shared_budget;
mod socket;
mod spin_trial;
mod split_read;
pub mod stream;
pub mod tls;
mod tls_stream;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::Context;
use parking_lot::{Condvar, Mutex};

pub use exports::{Export, Exports};
use socket::Socket;
use stream::Stream;

/// How often the accept loop looks at the shutdown flag.
const ACCEPT_POLL: Duration = Duration::from_millis(200);
/// Connections served at once; more are accepted and closed with a log line.
const CONNECTIONS_MAX: usize = 1024;
/// Connections from one TCP address at once: a quarter of the slots, so
/// that one host (idle or hostile) cannot take them all. Idle NBD
/// connections are legitimate and cheap (kernel clients keep theirs for
/// days), so they are bounded, not cut; multi-conn clients open a handful
/// each (nbdcopy 4, qemu up to 16).
const CONNECTIONS_PER_ADDRESS_MAX: usize = CONNECTIONS_MAX / 4;

pub struct Listeners {
    tcp: Vec<TcpListener>,
    /// Each Unix socket, its path, and whether weir made the socket file
    /// (and so removes it at exit) or inherited it.
    unix: Vec<(UnixListener, PathBuf, bool)>,
}

impl Listeners {
    /// Bind every address and the Unix socket (replacing a stale socket file).
    pub fn bind(tcp: &[SocketAddr], unix: Option<&PathBuf>) -> anyhow::Result<Listeners> {
        let tcp = tcp
            .iter()
            .map(|addr| TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let unix = match unix {
            None => Vec::new(),
            Some(path) => {
                if path.exists() {
                    if UnixStream::connect(path).is_ok() {
                        anyhow::bail!("{} is in use by another server", path.display());
                    }
                    std::fs::remove_file(path)
                        .with_context(|| format!("cannot replace {}", path.display()))?;
                }
                let listener = UnixListener::bind(path)
                    .with_context(|| format!("cannot listen on {}", path.display()))?;
                vec![(listener, path.clone(), true)]
            }
        };
        for listener in &tcp {
            listener.set_nonblocking(true)?;
        }
        for (listener, _, _) in &unix {
            listener.set_nonblocking(true)?;
        }
        Ok(Listeners { tcp, unix })
    }

    pub fn tcp_addrs(&self) -> Vec<SocketAddr> {
        self.tcp
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    pub fn unix_paths(&self) -> Vec<&PathBuf> {
        self.unix.iter().map(|(_, path, _)| path).collect()
    }
}

/// Raise the soft limit on open files to the hard one: each connection
/// holds a few descriptors (its socket and clones of it, a wake eventfd,
/// maybe an io_uring), and 1,024 connections need more than the usual
/// soft limit of 1,024. Returns the limit now in force.
pub fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

/// Live connections: a handle to half-close each, and a count to wait on.
#[derive(Default)]
struct Registry {
    live: Mutex<HashMap<u64, Stream>>,
    /// Connections per TCP peer address; taken inside `live`'s lock.
    per_address: Mutex<HashMap<IpAddr, usize>>,
    emptied: Condvar,
}

/// After the grace, connections still open get this long to notice that
/// their sockets were closed (at shutdown, and for one removed export).
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Serve until `stop` is set, then shut down gracefully: connections get
/// `grace` to take their last replies; a client that stops reading cannot
/// hold the server up for longer.
pub fn serve(
    listeners: Listeners,
    exports: Arc<Exports>,
    stop: &AtomicBool,
    grace: Duration,
) -> anyhow::Result<()> {
    let registry = Arc::new(Registry::default());
    let mut next_id = 0u64;
    let mut fds: Vec<libc::pollfd> = listeners
        .tcp
        .iter()
        .map(|l| l.as_raw_fd())
        .collect::<Vec<_>>()
        .into_iter()
        .chain(listeners.unix.iter().map(|(l, _, _)| l.as_raw_fd()))
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while !stop.load(Ordering::SeqCst) {
        // SAFETY: `fds` is a valid array of pollfd for its length.
        let ready = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                ACCEPT_POLL.as_millis() as i32,
            )
        };
        if ready <= 0 {
            continue; // timeout, or EINTR from the shutdown signal
        }
        for stream in accept_ready(&listeners) {
            next_id += 1;
            admit(stream, next_id, &registry, &exports);
        }
    }
    let live = registry.live.lock().len();
    tracing::info!("shutting down: no new connections; finishing {live} connection(s)");
    for stream in registry.live.lock().values() {
        stream.shutdown(Shutdown::Read);
    }
    if !wait_for_connections(&registry, grace) {
        let live = registry.live.lock();
        tracing::warn!(
            "{} connection(s) still unfinished after {grace:?} (their clients are not reading \
             replies): closing them; requests already sent to the devices complete",
            live.len()
        );
        for stream in live.values() {
            stream.shutdown(Shutdown::Both);
        }
        drop(live);
        if !wait_for_connections(&registry, CLOSE_WAIT) {
            tracing::error!("connections still open after closing their sockets; exiting anyway");
        }
    }
    for (_, path, made) in &listeners.unix {
        if *made {
            let _ = std::fs::remove_file(path);
        }
    }
    flush_all(&exports)
}

/// Wait until every connection has ended, or `limit` has passed; true if
/// they all ended.
fn wait_for_connections(registry: &Registry, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    let mut live = registry.live.lock();
    while !live.is_empty() {
        if registry.emptied.wait_until(&mut live, deadline).timed_out() {
            return live.is_empty();
        }
    }
    true
}

fn accept_ready(listeners: &Listeners) -> Vec<Stream> {
    let mut accepted = Vec::new();
    for listener in &listeners.tcp {
        while let Ok((stream, _)) = listener.accept() {
            let _ = stream.set_nodelay(true);
            widen_send_buffer(&stream);
            accepted.push(Stream::Plain(Socket::Tcp(stream)));
        }
    }
    for (listener, _, _) in &listeners.unix {
        while let Ok((stream, _)) = listener.accept() {
            widen_send_buffer(&stream);
            accepted.push(Stream::Plain(Socket::Unix(stream)));
        }
    }
    accepted
}

/// Room in the kernel for a few large replies: with the default (about
/// 200 KiB) the reply thread sleeps and wakes several times per 1 MiB read.
/// The kernel caps it at net.core.wmem_max; a failure only costs speed.
const SEND_BUFFER_BYTES: libc::c_int = 4 << 20;

fn widen_send_buffer(stream: &impl std::os::fd::AsRawFd) {
    let size = SEND_BUFFER_BYTES;
    // SAFETY: a valid socket descriptor and a c_int option of its size.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

fn admit(stream: Stream, id: u64, registry: &Arc<Registry>, exports: &Arc<Exports>) {
    let blocking = match &stream {
        Stream::Plain(Socket::Tcp(s)) => s.set_nonblocking(false),
        Stream::Plain(Socket::Unix(s)) => s.set_nonblocking(false),
        Stream::Tls(_) => unreachable!("connections start in plaintext"),
    };
    let handle = blocking.and_then(|()| stream.try_clone());
    let handle = match handle {
        Ok(handle) => handle,
        Err(err) => return tracing::warn!(error = %err, "cannot set up accepted connection"),
    };
    let address = stream.peer_ip();
    {
        let mut live = registry.live.lock();
        if live.len() >= CONNECTIONS_MAX {
            tracing::warn!(
                peer = stream.peer(),
                "refusing connection: {CONNECTIONS_MAX} already open"
            );
            return;
        }
        if let Some(ip) = address {
            let mut per_address = registry.per_address.lock();
            let count = per_address.entry(ip).or_insert(0);
            if *count >= CONNECTIONS_PER_ADDRESS_MAX {
                tracing::warn!(
                    peer = stream.peer(),
                    "refusing connection: {CONNECTIONS_PER_ADDRESS_MAX} already open from {ip}"
                );
                return;
            }
            *count += 1;
        }
        live.insert(id, handle);
    }
    let registry = Arc::clone(registry);
    let exports = Arc::clone(exports);
    let spawned = std::thread::Builder::new()
        .name(format!("weir-conn-{id}"))
        .spawn(move || {
            connection::serve(stream, exports);
            let mut live = registry.live.lock();
            live.remove(&id);
            if let Some(ip) = address {
                let mut per_address = registry.per_address.lock();
                if let Some(count) = per_address.get_mut(&ip) {
                    *count -= 1;
                    if *count == 0 {
                        per_address.remove(&ip);
                    }
                }
            }
            registry.emptied.notify_all();
        });
    if let Err(err) = spawned {
        tracing::error!(error = %err, "cannot start a connection thread");
    }
}

fn flush_all(exports: &Exports) -> anyhow::Result<()> {
    for export in exports.all() {
        if export.volume.caps().read_only {
            continue;
        }
        let (tx, rx) = mpsc::channel();
        export.volume.flush(Box::new(move |result: io::Result<()>| {
            drop(tx.send(result))
        }));
        rx.recv()
            .context("flush lost")?
            .with_context(|| format!("flushing export {} at shutdown", export.name))?;
    }
    tracing::info!("all volumes flushed; exiting");
    Ok(())
}
