//! The admin endpoint's HTTP: tiny_http reads requests (each connection on
//! its own, so a slow client does not hold up the others) and this module
//! turns them into `Request`s for the router and `Response`s back.

use std::net::TcpListener;
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

/// Serve until `stop` is set, handling one request at a time on this thread.
pub fn serve(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    handle: impl Fn(&Request) -> Response,
) -> std::io::Result<()> {
    let server = tiny_http::Server::from_listener(listener, None).map_err(std::io::Error::other)?;
    while !stop.load(Ordering::SeqCst) {
        let Some(incoming) = server.recv_timeout(STOP_POLL)? else {
            continue;
        };
        let request = Request::parse(incoming.method().as_str(), incoming.url());
        let response = handle(&request);
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
}
