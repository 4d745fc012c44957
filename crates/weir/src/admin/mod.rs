//! The admin endpoint of a running server (HTTP): the CLI's pool commands
//! talk to it when a server holds the data directory, and Prometheus
//! scrapes `/metrics`.
//!
//! ```text
//!  GET  /v1/status[?pool=P][&verbose=1]    pool status, as `weir pool status [-v]`
//!  GET  /v1/scrub?pool=P                   scrub progress (JSON)
//!  POST /v1/scrub/{start,pause,resume,stop}?pool=P
//!  POST /v1/replace?pool=P&old=DEV&new=DEV[&force=1]
//!  POST /v1/sched?pool=P&mode=fifo|zfs|adaptive   the device queues' mode
//!  POST /v1/read-policy?pool=P&policy=pid|round-robin|least-pending|latency
//!  GET  /v1/iostat                         per device and class counters (JSON)
//!  GET  /metrics                           Prometheus text
//! ```
//!
//! By default it listens on `DATA_DIR/admin.sock`, which only the server's
//! user can open. On a loopback TCP address instead, every request must
//! carry `Authorization: Bearer TOKEN`, the token the server writes to
//! `DATA_DIR/admin.token` (mode 0600) at start: another local user, or a web
//! page the browser lets reach the port, does not have it. Where it listens
//! is written to `DATA_DIR/admin.addr`, which is how the CLI finds it.

pub mod client;
pub mod http;
pub mod iostat;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context;

use crate::config::AdminListen;
use crate::pool::mirror::select::ReadPolicy;
use crate::pool::service::{PoolService, ScrubAction};
use crate::sched::Mode;
use http::{Bound, Request, Response};

pub const ADDRESS_FILE: &str = "admin.addr";
pub const TOKEN_FILE: &str = "admin.token";
pub const SOCKET_FILE: &str = "admin.sock";
/// `admin.addr` names a Unix socket with this prefix.
pub const UNIX_PREFIX: &str = "unix:";

/// The running endpoint; dropping it stops the thread and removes the
/// files it wrote.
pub struct AdminEndpoint {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    files: Vec<PathBuf>,
    /// Where it listens, as written to `admin.addr`.
    pub address: String,
}

impl AdminEndpoint {
    pub fn start(
        listen: &AdminListen,
        data_dir: &Path,
        service: Arc<PoolService>,
    ) -> anyhow::Result<AdminEndpoint> {
        let mut files = Vec::new();
        let (server, bound, address) = match listen {
            AdminListen::Unix => {
                let path = std::path::absolute(data_dir.join(SOCKET_FILE))?;
                if path.exists() {
                    if UnixStream::connect(&path).is_ok() {
                        anyhow::bail!("{} is in use by another server", path.display());
                    }
                    std::fs::remove_file(&path)
                        .with_context(|| format!("cannot replace {}", path.display()))?;
                }
                let server = tiny_http::Server::http_unix(&path).map_err(|e| {
                    anyhow::anyhow!(
                        "cannot listen on {} for the admin endpoint: {e}",
                        path.display()
                    )
                })?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
                files.push(path.clone());
                (
                    server,
                    Bound::Unix,
                    format!("{UNIX_PREFIX}{}", path.display()),
                )
            }
            AdminListen::Tcp(addr) => {
                // A token keeps other local users and web pages out; it
                // does not keep the network out, which could watch it go by.
                if !addr.ip().is_loopback() {
                    anyhow::bail!(
                        "the admin endpoint listens on loopback addresses only (127.0.0.1, ::1) or on its Unix socket, not {addr}"
                    );
                }
                let listener = std::net::TcpListener::bind(addr)
                    .with_context(|| format!("cannot listen on {addr} for the admin endpoint"))?;
                let addr = listener.local_addr()?;
                let token = new_token()?;
                let token_path = data_dir.join(TOKEN_FILE);
                write_private(&token_path, &format!("{token}\n"))?;
                files.push(token_path);
                let server = tiny_http::Server::from_listener(listener, None)
                    .map_err(|e| anyhow::anyhow!("admin endpoint on {addr}: {e}"))?;
                (server, Bound::Tcp { addr, token }, addr.to_string())
            }
        };
        let address_file = data_dir.join(ADDRESS_FILE);
        write_private(&address_file, &format!("{address}\n"))?;
        files.push(address_file);
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("weir-admin".into())
            .spawn(move || {
                let route = move |request: &Request| route(&service, request);
                http::serve(server, bound, thread_stop, Arc::new(route));
            })?;
        tracing::info!(address, "admin endpoint listening");
        Ok(AdminEndpoint {
            stop,
            thread: Some(thread),
            files,
            address,
        })
    }
}

impl Drop for AdminEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for file in &self.files {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// 32 random bytes from the kernel, in hex.
fn new_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .context("cannot read /dev/urandom for the admin token")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Write `text` to a file only its owner can read.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .with_context(|| format!("cannot write {}", path.display()))
}

fn route(service: &PoolService, request: &Request) -> Response {
    let result = match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/v1/status") => service
            .status(request.param("pool"), request.param("verbose") == Some("1"))
            .map(Response::text_ok),
        ("GET", "/v1/scrub") => pool_param(request).and_then(|pool| {
            let checkpoint = service.scrub_status(pool)?;
            Ok(Response::json(serde_json::to_string(&checkpoint)?))
        }),
        ("POST", path) if path.starts_with("/v1/scrub/") => {
            let verb = &path["/v1/scrub/".len()..];
            match ScrubAction::parse(verb) {
                None => return Response::text(404, format!("no scrub action {verb:?}\n")),
                Some(action) => pool_param(request).and_then(|pool| {
                    let checkpoint = service.scrub(pool, action)?;
                    Ok(Response::json(serde_json::to_string(&Some(checkpoint))?))
                }),
            }
        }
        ("POST", "/v1/replace") => pool_param(request).and_then(|pool| {
            let old = request.param("old").context("missing old=DEVICE")?;
            let new = request.param("new").context("missing new=DEVICE")?;
            let force = request.param("force") == Some("1");
            service
                .replace(pool, old, new, force)
                .map(Response::text_ok)
        }),
        ("POST", "/v1/sched") => pool_param(request).and_then(|pool| {
            let text = request
                .param("mode")
                .context("missing mode=fifo|zfs|adaptive")?;
            let mode = Mode::parse(text)
                .with_context(|| format!("unknown mode {text:?}: want fifo, zfs or adaptive"))?;
            service.set_sched(pool, mode).map(Response::text_ok)
        }),
        ("POST", "/v1/read-policy") => pool_param(request).and_then(|pool| {
            let text = request
                .param("policy")
                .with_context(|| format!("missing policy={}", ReadPolicy::names()))?;
            let policy = ReadPolicy::parse(text).with_context(|| {
                format!("unknown read policy {text:?}: want {}", ReadPolicy::names())
            })?;
            service.set_read_policy(pool, policy).map(Response::text_ok)
        }),
        ("GET", "/v1/iostat") => Ok(Response::json(service.iostat().to_string())),
        ("GET", "/metrics") => Ok(Response {
            status: 200,
            content_type: crate::metrics::CONTENT_TYPE,
            body: service.metrics(),
        }),
        (
            _,
            "/v1/status" | "/v1/scrub" | "/v1/replace" | "/v1/sched" | "/v1/read-policy"
            | "/v1/iostat" | "/metrics",
        ) => return Response::text(405, "wrong method\n"),
        _ => return Response::text(404, format!("no such endpoint {}\n", request.path)),
    };
    result.unwrap_or_else(|err| Response::text(409, format!("{err:#}\n")))
}

fn pool_param(request: &Request) -> anyhow::Result<&str> {
    request.param("pool").context("missing pool=NAME")
}

impl Response {
    fn text_ok(body: String) -> Response {
        Response::text(200, body)
    }
}
