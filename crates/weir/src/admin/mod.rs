//! The admin endpoint of a running server (HTTP on localhost): the CLI's
//! pool commands talk to it when a server holds the data directory, and
//! Prometheus scrapes `/metrics`.
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
//! The bound address is written to `DATA_DIR/admin.addr`, which is how the
//! CLI finds it.

pub mod client;
pub mod http;
pub mod iostat;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context;

use crate::pool::mirror::select::ReadPolicy;
use crate::pool::service::{PoolService, ScrubAction};
use crate::sched::Mode;
use http::{Request, Response};

pub const ADDRESS_FILE: &str = "admin.addr";

/// The running endpoint; dropping it stops the thread and removes the
/// address file.
pub struct AdminEndpoint {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    address_file: PathBuf,
    pub addr: SocketAddr,
}

impl AdminEndpoint {
    pub fn start(
        addr: SocketAddr,
        data_dir: &Path,
        service: Arc<PoolService>,
    ) -> anyhow::Result<AdminEndpoint> {
        // Its calls change pools and are not authenticated: anyone who can
        // reach it owns every volume.
        if !addr.ip().is_loopback() {
            anyhow::bail!(
                "the admin endpoint listens on loopback addresses only (127.0.0.1, ::1), not {addr}: its calls are not authenticated"
            );
        }
        let listener = TcpListener::bind(addr)
            .with_context(|| format!("cannot listen on {addr} for the admin endpoint"))?;
        let addr = listener.local_addr()?;
        let address_file = data_dir.join(ADDRESS_FILE);
        std::fs::write(&address_file, format!("{addr}\n"))
            .with_context(|| format!("cannot write {}", address_file.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("weir-admin".into())
            .spawn(move || {
                let handled = http::serve(listener, thread_stop, |r| route(&service, r));
                if let Err(err) = handled {
                    tracing::error!(error = %err, "admin endpoint stopped");
                }
            })?;
        tracing::info!(%addr, "admin endpoint listening");
        Ok(AdminEndpoint {
            stop,
            thread: Some(thread),
            address_file,
            addr,
        })
    }
}

impl Drop for AdminEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.address_file);
    }
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
