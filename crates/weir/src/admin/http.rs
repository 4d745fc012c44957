//! The admin endpoint's HTTP: tiny_http reads requests (each connection on
//! its own, so a slow client does not hold up the others), this module
//! checks who sent them, and each is answered on a thread of its own, so a
//! slow call does not hold up the others either.

use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the serving loop looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);
/// Requests answered at once; more get 503 at once.
const HANDLERS_MAX: usize = 8;
/// A call not done by then is answered 504 and goes on in the server (a
/// replace that checks a device's holder waits 11 s, far below this).
const CALL_TIME_MAX: Duration = Duration::from_secs(30);

/// What the endpoint listens on, and so what a request must show.
pub enum Bound {
    /// The socket's mode admits only the server's user.
    Unix,
    /// Loopback TCP: requests name this address as their Host and carry
    /// the token.
    Loopback { addr: SocketAddr, token: String },
    /// TCP under TLS: requests carry the token. The certificate ties the
    /// name a client dialled to this server, so a rebound DNS name cannot
    /// reach it and the Host needs no check.
    Tls { token: String },
}

pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Query parameters, percent-decoded, in order.
    pub query: Vec<(String, String)>,
    /// The Host, Origin, Authorization and Accept headers, if sent.
    pub host: Option<String>,
    pub origin: Option<String>,
    pub authorization: Option<String>,
    pub accept: Option<String>,
}

impl Request {
    /// `url` is the request target: a path with an optional query.
    pub fn parse(method: &str, url: &str) -> Request {
        let (path, query) = url.split_once('?').unwrap_or((url, ""));
        Request {
            method: method.to_string(),
            path: percent_encoding::percent_decode_str(path)
                .decode_utf8_lossy()
                .into_owned(),
            query: form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect(),
            host: None,
            origin: None,
            authorization: None,
            accept: None,
        }
    }

    /// Why a request that reached `bound` is refused before routing, if it
    /// is, with the HTTP status. A web page can make a browser send a
    /// request to a local port: as a cross-site form POST (the browser adds
    /// Origin), or through a DNS name rebound to 127.0.0.1 (the Host is that
    /// name). The CLI sends neither an Origin nor a Host other than the
    /// address it dialled, and over TCP it sends the token.
    pub fn refusal(&self, bound: &Bound) -> Option<(u16, &'static str)> {
        if self.origin.is_some() {
            return Some((
                403,
                "requests from web pages (with an Origin header) are refused",
            ));
        }
        let (addr, token) = match bound {
            Bound::Unix => return None,
            Bound::Loopback { addr, token } => (Some(addr), token),
            Bound::Tls { token } => (None, token),
        };
        if let (Some(addr), Some(host)) = (addr, self.host.as_deref()) {
            let port = addr.port().to_string();
            let (name, host_port) = host.rsplit_once(':').unwrap_or((host, ""));
            let local = matches!(name, "localhost" | "127.0.0.1" | "[::1]")
                || name.trim_start_matches('[').trim_end_matches(']') == addr.ip().to_string();
            if !local || host_port != port {
                return Some((403, "the Host header names another server"));
            }
        }
        let shown = self
            .authorization
            .as_deref()
            .and_then(|value| value.strip_prefix("Bearer "));
        if !shown.is_some_and(|shown| constant_time_eq(shown.as_bytes(), token.as_bytes())) {
            return Some((
                401,
                "missing or wrong token: send Authorization: Bearer with the token in DATA_DIR/admin.token",
            ));
        }
        None
    }

    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Response {
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }

    pub fn json(body: String) -> Response {
        Response {
            status: 200,
            content_type: "application/json",
            body,
        }
    }
}

/// Compare without stopping at the first difference: how long a refusal
/// takes says nothing about how much of the token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serve until `stop` is set. Each request is answered on a thread of its
/// own, at most `HANDLERS_MAX` at once, within `CALL_TIME_MAX`; a request
/// whose handler panics is answered 500 and logged, and the endpoint goes
/// on.
pub fn serve(server: tiny_http::Server, bound: Bound, stop: Arc<AtomicBool>, handle: Handler) {
    serve_within(server, bound, stop, handle, CALL_TIME_MAX)
}

fn serve_within(
    server: tiny_http::Server,
    bound: Bound,
    stop: Arc<AtomicBool>,
    handle: Handler,
    call_time_max: Duration,
) {
    let busy = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::SeqCst) {
        let incoming = match server.recv_timeout(STOP_POLL) {
            Ok(Some(incoming)) => incoming,
            Ok(None) => continue,
            Err(err) => {
                tracing::warn!(error = %err, "admin endpoint: accepting a request failed");
                continue;
            }
        };
        let mut request = Request::parse(incoming.method().as_str(), incoming.url());
        let header = |name: &'static str| {
            incoming
                .headers()
                .iter()
                .find(|h| h.field.equiv(name))
                .map(|h| h.value.as_str().to_string())
        };
        request.host = header("Host");
        request.origin = header("Origin");
        request.authorization = header("Authorization");
        request.accept = header("Accept");
        if let Some((status, reason)) = request.refusal(&bound) {
            tracing::warn!(path = %request.path, host = ?request.host, origin = ?request.origin,
                "admin request refused: {reason}");
            respond(incoming, Response::text(status, format!("{reason}\n")));
            continue;
        }
        if busy.fetch_add(1, Ordering::SeqCst) >= HANDLERS_MAX {
            busy.fetch_sub(1, Ordering::SeqCst);
            respond(
                incoming,
                Response::text(503, "too many admin requests at once\n"),
            );
            continue;
        }
        let handle = Arc::clone(&handle);
        let done = Arc::clone(&busy);
        let spawned = std::thread::Builder::new()
            .name("weir-admin-call".into())
            .spawn(move || {
                answer_within(incoming, request, handle, call_time_max);
                done.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(err) = spawned {
            busy.fetch_sub(1, Ordering::SeqCst);
            tracing::error!(error = %err, "admin endpoint: cannot start a thread for a request");
        }
    }
}

/// Run the handler on a thread of its own and answer with its response,
/// or with 504 once `limit` has passed; either way, return only when the
/// handler is done, so that it keeps its place among `HANDLERS_MAX`.
fn answer_within(incoming: tiny_http::Request, request: Request, handle: Handler, limit: Duration) {
    let (method, path) = (request.method.clone(), request.path.clone());
    let (done, finished) = std::sync::mpsc::sync_channel(1);
    let worker = std::thread::Builder::new()
        .name("weir-admin-call".into())
        .spawn(move || {
            let response =
                catch_unwind(AssertUnwindSafe(|| handle(&request))).unwrap_or_else(|_| {
                    tracing::error!(method = %request.method, path = %request.path,
                        "admin request failed inside the server");
                    Response::text(500, "the request failed inside the server; see its log\n")
                });
            let _ = done.send(response);
        });
    if worker.is_err() {
        respond(
            incoming,
            Response::text(503, "the server cannot start a thread for the request\n"),
        );
        return;
    }
    match finished.recv_timeout(limit) {
        Ok(response) => respond(incoming, response),
        Err(_) => {
            tracing::warn!(%method, %path, "admin request still running after {} s: answered 504", limit.as_secs());
            respond(
                incoming,
                Response::text(
                    504,
                    format!(
                        "the request did not finish within {} s; it goes on in the server (see its log and `weir pool status`)\n",
                        limit.as_secs()
                    ),
                ),
            );
            let _ = finished.recv();
        }
    }
}

fn respond(incoming: tiny_http::Request, response: Response) {
    let content_type =
        tiny_http::Header::from_bytes(&b"Content-Type"[..], response.content_type.as_bytes())
            .expect("a valid header");
    let answer = tiny_http::Response::from_string(response.body)
        .with_status_code(response.status)
        .with_header(content_type);
    if let Err(err) = incoming.respond(answer) {
        tracing::debug!(error = %err, "admin request failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_with_decoded_queries() {
        let request = Request::parse("POST", "/v1/replace?pool=tank&old=%2Ftmp%2Fa%20b&new=c");
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/v1/replace");
        assert_eq!(request.param("old"), Some("/tmp/a b"));
        assert_eq!(request.param("new"), Some("c"));
        assert_eq!(request.param("missing"), None);
        assert_eq!(Request::parse("GET", "/metrics").query, vec![]);
    }

    fn tcp(addr: &str) -> Bound {
        Bound::Loopback {
            addr: addr.parse().unwrap(),
            token: "s3cret".into(),
        }
    }

    fn with(host: Option<&str>, origin: Option<&str>, token: Option<&str>) -> Request {
        Request {
            host: host.map(String::from),
            origin: origin.map(String::from),
            authorization: token.map(|t| format!("Bearer {t}")),
            ..Request::parse("POST", "/v1/replace?pool=tank")
        }
    }

    #[test]
    fn requests_from_web_pages_and_other_hosts_are_refused() {
        let bound = tcp("127.0.0.1:10810");
        for host in [None, Some("127.0.0.1:10810"), Some("localhost:10810")] {
            assert_eq!(
                with(host, None, Some("s3cret")).refusal(&bound),
                None,
                "{host:?}"
            );
        }
        for (host, origin) in [
            (Some("127.0.0.1:10810"), Some("https://example.com")),
            (Some("attacker.example:10810"), None),
            (Some("127.0.0.1:80"), None),
        ] {
            let refusal = with(host, origin, Some("s3cret")).refusal(&bound);
            assert_eq!(refusal.map(|r| r.0), Some(403), "{host:?} {origin:?}");
        }
        let v6 = tcp("[::1]:7000");
        assert_eq!(
            with(Some("[::1]:7000"), None, Some("s3cret")).refusal(&v6),
            None
        );
        // The Unix socket's mode admits only the server's user; web pages
        // are still refused.
        assert_eq!(with(None, None, None).refusal(&Bound::Unix), None);
        assert!(with(None, Some("null"), None)
            .refusal(&Bound::Unix)
            .is_some());
    }

    #[test]
    fn tcp_requests_need_the_token() {
        let bound = tcp("127.0.0.1:10810");
        for token in [None, Some("wrong"), Some("s3cre"), Some("s3cret2")] {
            let refusal = with(None, None, token).refusal(&bound);
            assert_eq!(refusal.map(|r| r.0), Some(401), "{token:?}");
        }
        let basic = Request {
            authorization: Some("Basic s3cret".into()),
            ..Request::parse("GET", "/metrics")
        };
        assert_eq!(basic.refusal(&bound).map(|r| r.0), Some(401));
    }

    /// `METHOD path` over a Unix socket; the status of the answer.
    fn status_of(socket: &std::path::Path, path: &str) -> u16 {
        use std::io::{Read, Write};
        let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn a_call_past_its_time_limit_is_answered_504_and_others_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("admin.sock");
        let server = tiny_http::Server::http_unix(&socket).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        // The slow call blocks until the test lets it go: its 504 must
        // come while it is still running.
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = std::sync::Mutex::new(released);
        let handler: Handler = Arc::new(move |request: &Request| {
            if request.path == "/slow" {
                let _ = released.lock().unwrap().recv();
            }
            Response::text(200, "done\n")
        });
        let serving = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                serve_within(
                    server,
                    Bound::Unix,
                    stop,
                    handler,
                    Duration::from_millis(300),
                )
            })
        };
        assert_eq!(status_of(&socket, "/slow"), 504);
        assert_eq!(status_of(&socket, "/fast"), 200);
        release.send(()).unwrap();
        stop.store(true, Ordering::SeqCst);
        serving.join().unwrap();
    }

    #[test]
    fn over_tls_any_host_may_be_named_but_the_token_and_no_origin_are_needed() {
        let bound = Bound::Tls {
            token: "s3cret".into(),
        };
        let named = with(Some("storage-7.example:10810"), None, Some("s3cret"));
        assert_eq!(named.refusal(&bound), None);
        let tokenless = with(Some("storage-7.example:10810"), None, None);
        assert_eq!(tokenless.refusal(&bound).map(|r| r.0), Some(401));
        let page = with(None, Some("https://example.com"), Some("s3cret"));
        assert_eq!(page.refusal(&bound).map(|r| r.0), Some(403));
    }
}
