//! The admin endpoint's HTTP: tiny_http reads requests (each connection on
//! its own, so a slow client does not hold up the others) and this module
//! turns them into `Request`s for the router and `Response`s back.

use std::net::{SocketAddr, TcpListener};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the serving loop looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Query parameters, percent-decoded, in order.
    pub query: Vec<(String, String)>,
    /// The Host and Origin headers, if sent.
    pub host: Option<String>,
    pub origin: Option<String>,
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
        }
    }

    /// Why a request that reached `bound` is refused before routing, if it
    /// is. A web page can make a browser send a request to a local port:
    /// as a cross-site form POST (the browser adds Origin), or through a
    /// DNS name rebound to 127.0.0.1 (the Host is that name). The CLI sends
    /// neither an Origin nor a Host other than the address it dialled.
    pub fn refusal(&self, bound: SocketAddr) -> Option<&'static str> {
        if self.origin.is_some() {
            return Some("requests from web pages (with an Origin header) are refused");
        }
        let host = self.host.as_deref()?;
        let port = bound.port().to_string();
        let (name, host_port) = host.rsplit_once(':').unwrap_or((host, ""));
        let local = matches!(name, "localhost" | "127.0.0.1" | "[::1]")
            || name.trim_start_matches('[').trim_end_matches(']') == bound.ip().to_string();
        if local && host_port == port {
            None
        } else {
            Some("the Host header names another server")
        }
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

/// Serve until `stop` is set, routing one request at a time on this thread
/// (tiny_http reads each connection on its own). A request whose handler
/// panics is answered 500 and logged; the endpoint goes on.
pub fn serve(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    handle: impl Fn(&Request) -> Response,
) -> std::io::Result<()> {
    let bound = listener.local_addr()?;
    let server = tiny_http::Server::from_listener(listener, None).map_err(std::io::Error::other)?;
    while !stop.load(Ordering::SeqCst) {
        let Some(incoming) = server.recv_timeout(STOP_POLL)? else {
            continue;
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
        let response = match request.refusal(bound) {
            Some(reason) => {
                tracing::warn!(path = %request.path, host = ?request.host, origin = ?request.origin,
                    "admin request refused: {reason}");
                Response::text(403, format!("{reason}\n"))
            }
            None => catch_unwind(AssertUnwindSafe(|| handle(&request))).unwrap_or_else(|_| {
                tracing::error!(method = %request.method, path = %request.path,
                    "admin request failed inside the server");
                Response::text(500, "the request failed inside the server; see its log\n")
            }),
        };
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
    Ok(())
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

    #[test]
    fn requests_from_web_pages_and_other_hosts_are_refused() {
        let bound: SocketAddr = "127.0.0.1:10810".parse().unwrap();
        let with = |host: Option<&str>, origin: Option<&str>| Request {
            host: host.map(String::from),
            origin: origin.map(String::from),
            ..Request::parse("POST", "/v1/replace?pool=tank")
        };
        for host in [None, Some("127.0.0.1:10810"), Some("localhost:10810")] {
            assert_eq!(with(host, None).refusal(bound), None, "{host:?}");
        }
        for (host, origin) in [
            (Some("127.0.0.1:10810"), Some("https://example.com")),
            (Some("attacker.example:10810"), None),
            (Some("127.0.0.1:80"), None),
        ] {
            assert!(
                with(host, origin).refusal(bound).is_some(),
                "{host:?} {origin:?}"
            );
        }
        let v6: SocketAddr = "[::1]:7000".parse().unwrap();
        assert_eq!(with(Some("[::1]:7000"), None).refusal(v6), None);
    }
}
