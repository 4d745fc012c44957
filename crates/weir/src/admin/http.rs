//! Just enough HTTP/1.1 for a localhost admin endpoint: one request per
//! connection, no bodies, answers closed after sending. Parsing is sans-IO.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest request head accepted; ours are a line and a few headers.
const HEAD_BYTES_MAX: usize = 16 << 10;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
const ACCEPT_POLL: Duration = Duration::from_millis(100);

#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Query parameters, percent-decoded, in order.
    pub query: Vec<(String, String)>,
}

impl Request {
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

    fn encode(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            409 => "Conflict",
            _ => "Error",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        out.extend_from_slice(self.body.as_bytes());
        out
    }
}

/// Parse a request head (everything up to the blank line).
pub fn parse_request(head: &str) -> Result<Request, String> {
    let line = head.lines().next().ok_or("empty request")?;
    let mut words = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (words.next(), words.next(), words.next())
    else {
        return Err(format!("malformed request line {line:?}"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(format!("unsupported protocol {version:?}"));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((percent_decode(k)?, percent_decode(v)?))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Request {
        method: method.to_string(),
        path: percent_decode(path)?,
        query,
    })
}

pub fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent escape in {text:?}"))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            other => {
                out.push(other);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("{text:?} is not UTF-8"))
}

pub fn percent_encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~/:".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Serve until `stop` is set, one request at a time on this thread.
pub fn serve(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    handle: impl Fn(&Request) -> Response,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(err) = answer(stream, &handle) {
                    tracing::debug!(error = %err, "admin request failed");
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(ACCEPT_POLL)
            }
            Err(err) => tracing::warn!(error = %err, "admin endpoint: accept failed"),
        }
    }
    Ok(())
}

fn answer(mut stream: TcpStream, handle: &impl Fn(&Request) -> Response) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > HEAD_BYTES_MAX {
            return stream.write_all(&Response::text(400, "request too large\n").encode());
        }
    }
    let response = match std::str::from_utf8(&head)
        .map_err(|_| "request is not UTF-8".to_string())
        .and_then(parse_request)
    {
        Ok(request) => handle(&request),
        Err(why) => Response::text(400, format!("{why}\n")),
    };
    stream.write_all(&response.encode())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_with_decoded_queries() {
        let request = parse_request(
            "POST /v1/replace?pool=tank&old=%2Ftmp%2Fa%20b&new=c HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .unwrap();
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/v1/replace");
        assert_eq!(request.param("old"), Some("/tmp/a b"));
        assert_eq!(request.param("missing"), None);
        assert!(parse_request("GET /\r\n\r\n").is_err());
        assert!(parse_request("GET / SPDY/3\r\n\r\n").is_err());
        assert!(parse_request("GET /?a=%zz HTTP/1.1\r\n\r\n").is_err());
    }

    #[test]
    fn encoding_round_trips() {
        let text = "model:hdd,size=1G,store=file:/tmp/x y&z";
        assert_eq!(percent_decode(&percent_encode(text)).unwrap(), text);
    }
}
