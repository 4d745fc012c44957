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
//!  GET  /v1/list                           pool list
//!  POST /v1/clear?pool=P[&device=DEV]      forget members' error counts
//!  POST /v1/{offline,online}?pool=P&device=DEV   a member out of service and back
//!  POST /v1/pool/create?name=P&layout=WORDS[&force=1]   WORDS: the layout, one per line
//!  POST /v1/pool/import?devices=DEVS[&force=1]          DEVS: one per line
//!  POST /v1/pool/{export,destroy}?pool=P
//!  GET  /v1/volume/list[?pool=P]
//!  POST /v1/volume/create?name=P/V&size=BYTES&block=BYTES
//!  POST /v1/volume/resize?name=P/V&size=BYTES
//!  POST /v1/volume/delete?name=P/V
//!  POST /v1/volume/set?name=P/V[&read_only=on|off][&cache=writeback|writethrough|default][&description=TEXT]
//!  GET  /metrics                           Prometheus text
//! ```
//!
//! It listens on `DATA_DIR/admin.sock`, which only the server's user can
//! open. With a TCP address as well, every request there must carry
//! `Authorization: Bearer TOKEN`, the token the server writes to
//! `DATA_DIR/admin.token` (mode 0600) at start: another local user, or a web
//! page the browser lets reach the port, does not have it. TCP runs under
//! TLS when the server has certificates, and without them only on loopback
//! (tcp_front.rs). Where it listens is written to `DATA_DIR/admin.addr`,
//! the Unix socket first, which is how the CLI finds it.

pub mod client;
pub mod http;
pub mod iostat;
mod tcp_front;

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
use crate::pool::volume_table::PropertyChanges;
use crate::sched::Mode;
use crate::server::tls::Tls;
use http::{Bound, Handler, Request, Response};

pub const ADDRESS_FILE: &str = "admin.addr";
pub const TOKEN_FILE: &str = "admin.token";
pub const SOCKET_FILE: &str = "admin.sock";
/// The HTTP server behind the TCP front: requests through it need the token.
const TCP_SOCKET_FILE: &str = "admin-tcp.sock";
/// `admin.addr` names a Unix socket with this prefix.
pub const UNIX_PREFIX: &str = "unix:";

/// The running endpoint; dropping it stops the thread and removes the
/// files it wrote.
pub struct AdminEndpoint {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    files: Vec<PathBuf>,
    /// Where it listens, as written to `admin.addr`, on one line.
    pub address: String,
}

impl AdminEndpoint {
    pub fn start(
        listen: &AdminListen,
        data_dir: &Path,
        service: Arc<PoolService>,
        tls: Option<&Tls>,
    ) -> anyhow::Result<AdminEndpoint> {
        let stop = Arc::new(AtomicBool::new(false));
        let route: Handler = Arc::new(move |request: &Request| route(&service, request));
        let mut endpoint = AdminEndpoint {
            stop,
            threads: Vec::new(),
            files: Vec::new(),
            address: String::new(),
        };
        let socket = std::path::absolute(data_dir.join(SOCKET_FILE))?;
        endpoint.serve_http(&socket, Bound::Unix, &route)?;
        let mut lines = vec![format!("{UNIX_PREFIX}{}", socket.display())];
        if let AdminListen::Tcp(addr) = listen {
            // A token keeps other local users and web pages out; only TLS
            // keeps the network from watching it go by.
            if tls.is_none() && !addr.ip().is_loopback() {
                anyhow::bail!(
                    "the admin endpoint listens on {addr}, which is not loopback, only under TLS: \
                     start with --tls on and certificates in --tls-certificates, \
                     or use a loopback address (127.0.0.1, ::1) or the Unix socket"
                );
            }
            let listener = std::net::TcpListener::bind(addr)
                .with_context(|| format!("cannot listen on {addr} for the admin endpoint"))?;
            let addr = listener.local_addr()?;
            let token = new_token()?;
            let token_path = data_dir.join(TOKEN_FILE);
            write_private(&token_path, &format!("{token}\n"))?;
            endpoint.files.push(token_path);
            let bound = match tls {
                Some(_) => Bound::Tls { token },
                None => Bound::Loopback { addr, token },
            };
            let inner = std::path::absolute(data_dir.join(TCP_SOCKET_FILE))?;
            endpoint.serve_http(&inner, bound, &route)?;
            let (tls, stop) = (tls.cloned(), Arc::clone(&endpoint.stop));
            let scheme = if tls.is_some() { "https" } else { "http" };
            endpoint.threads.push(
                std::thread::Builder::new()
                    .name("weir-admin-tcp".into())
                    .spawn(move || tcp_front::serve(listener, tls, inner, stop))?,
            );
            lines.push(format!("{scheme}://{addr}"));
        }
        let address_file = data_dir.join(ADDRESS_FILE);
        write_private(&address_file, &(lines.join("\n") + "\n"))?;
        endpoint.files.push(address_file);
        endpoint.address = lines.join(" ");
        tracing::info!(address = endpoint.address, "admin endpoint listening");
        Ok(endpoint)
    }

    /// Answer HTTP on the Unix socket `path` (mode 0600), as `bound` says.
    fn serve_http(&mut self, path: &Path, bound: Bound, route: &Handler) -> anyhow::Result<()> {
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                anyhow::bail!("{} is in use by another server", path.display());
            }
            std::fs::remove_file(path)
                .with_context(|| format!("cannot replace {}", path.display()))?;
        }
        let server = tiny_http::Server::http_unix(path).map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {} for the admin endpoint: {e}",
                path.display()
            )
        })?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        self.files.push(path.to_path_buf());
        let (stop, route) = (Arc::clone(&self.stop), Arc::clone(route));
        self.threads.push(
            std::thread::Builder::new()
                .name("weir-admin".into())
                .spawn(move || http::serve(server, bound, stop, route))?,
        );
        Ok(())
    }
}

impl Drop for AdminEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
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
        ("GET", "/v1/list") => Ok(Response::text_ok(service.list())),
        ("POST", "/v1/offline") => pool_param(request).and_then(|pool| {
            let device = request.param("device").context("missing device=DEV")?;
            service.offline(pool, device).map(Response::text_ok)
        }),
        ("POST", "/v1/online") => pool_param(request).and_then(|pool| {
            let device = request.param("device").context("missing device=DEV")?;
            service.online(pool, device).map(Response::text_ok)
        }),
        ("POST", "/v1/clear") => pool_param(request)
            .and_then(|pool| service.clear(pool, request.param("device")))
            .map(Response::text_ok),
        ("POST", "/v1/pool/create") => request
            .param("name")
            .context("missing name=POOL")
            .and_then(|name| {
                let layout = lines(request.param("layout").context("missing layout=DEVICES")?);
                service.create_pool(name, &layout, request.param("force") == Some("1"))
            })
            .map(Response::text_ok),
        ("POST", "/v1/pool/import") => request
            .param("devices")
            .context("missing devices=DEVICES")
            .and_then(|devices| {
                service.import_pool(&lines(devices), request.param("force") == Some("1"))
            })
            .map(Response::text_ok),
        ("POST", "/v1/pool/export") => pool_param(request)
            .and_then(|pool| service.export_pool(pool))
            .map(Response::text_ok),
        ("POST", "/v1/pool/destroy") => pool_param(request)
            .and_then(|pool| service.destroy_pool(pool))
            .map(Response::text_ok),
        ("GET", "/v1/volume/list") => service
            .volume_list(request.param("pool"))
            .map(Response::text_ok),
        ("POST", "/v1/volume/create") => volume_param(request)
            .and_then(|name| {
                let size = bytes_param(request, "size")?;
                let block = match request.param("block") {
                    Some(_) => bytes_param(request, "block")?,
                    None => 4096,
                };
                let block = u32::try_from(block).context("block= is too large")?;
                service.create_volume(name, size, block)
            })
            .map(Response::text_ok),
        ("POST", "/v1/volume/resize") => volume_param(request)
            .and_then(|name| service.resize_volume(name, bytes_param(request, "size")?))
            .map(Response::text_ok),
        ("POST", "/v1/volume/set") => volume_param(request)
            .and_then(|name| {
                let changes = PropertyChanges::parse(
                    request.param("read_only"),
                    request.param("cache"),
                    request.param("description"),
                )
                .map_err(anyhow::Error::msg)?;
                service.set_volume_properties(name, &changes)
            })
            .map(Response::text_ok),
        ("POST", "/v1/volume/delete") => volume_param(request)
            .and_then(|name| service.delete_volume(name))
            .map(Response::text_ok),
        ("GET", "/metrics") => {
            // Prometheus asks for OpenMetrics; anyone else gets the older
            // text format, which every tool reads.
            let openmetrics = request
                .accept
                .as_deref()
                .is_some_and(|accept| accept.contains("application/openmetrics-text"));
            let body = service.metrics();
            Ok(if openmetrics {
                Response {
                    status: 200,
                    content_type: crate::metrics::CONTENT_TYPE,
                    body,
                }
            } else {
                Response {
                    status: 200,
                    content_type: crate::metrics::PROMETHEUS_TEXT_CONTENT_TYPE,
                    body: crate::metrics::to_prometheus_text(&body),
                }
            })
        }
        (
            _,
            "/v1/status" | "/v1/scrub" | "/v1/replace" | "/v1/sched" | "/v1/read-policy"
            | "/v1/iostat" | "/v1/list" | "/v1/clear" | "/v1/offline" | "/v1/online" | "/metrics"
            | "/v1/pool/create" | "/v1/pool/import" | "/v1/pool/export" | "/v1/pool/destroy"
            | "/v1/volume/list" | "/v1/volume/create" | "/v1/volume/resize" | "/v1/volume/delete"
            | "/v1/volume/set",
        ) => return Response::text(405, "wrong method\n"),
        _ => return Response::text(404, format!("no such endpoint {}\n", request.path)),
    };
    result.unwrap_or_else(|err| Response::text(409, format!("{err:#}\n")))
}

fn pool_param(request: &Request) -> anyhow::Result<&str> {
    request.param("pool").context("missing pool=NAME")
}

fn volume_param(request: &Request) -> anyhow::Result<&str> {
    request.param("name").context("missing name=POOL/VOLUME")
}

/// A count of bytes, as a number or with a unit (`10G`).
fn bytes_param(request: &Request, key: &str) -> anyhow::Result<u64> {
    let text = request
        .param(key)
        .with_context(|| format!("missing {key}=BYTES"))?;
    crate::units::parse_bytes(text).map_err(|err| anyhow::anyhow!("{key}={text:?}: {err}"))
}

/// Devices and layout words travel one per line.
fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(String::from)
        .collect()
}

impl Response {
    fn text_ok(body: String) -> Response {
        Response::text(200, body)
    }
}
