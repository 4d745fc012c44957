//! The CLI's side of the admin endpoint: find the running server of a data
//! directory and ask it on its Unix socket, which the server opens
//! whatever else it listens on.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use super::{ADDRESS_FILE, UNIX_PREFIX};

const TIMEOUT: Duration = Duration::from_secs(60);
/// `/metrics` of a large pool is the longest answer; far below this.
const BODY_BYTES_MAX: u64 = 64 << 20;

/// A server's admin endpoint, found through its data directory.
pub struct AdminClient {
    socket: PathBuf,
}

impl AdminClient {
    /// The endpoint of the server that holds `data_dir`: its Unix socket,
    /// the first line of `admin.addr`.
    pub fn for_data_dir(data_dir: &Path) -> anyhow::Result<AdminClient> {
        let path = data_dir.join(ADDRESS_FILE);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "a weir server holds {} but its admin endpoint is not known ({} is missing; is it running with --admin none?)",
                data_dir.display(),
                path.display()
            )
        })?;
        let socket = text
            .lines()
            .find_map(|line| line.trim().strip_prefix(UNIX_PREFIX))
            .with_context(|| format!("{} names no Unix socket", path.display()))?;
        Ok(AdminClient {
            socket: socket.into(),
        })
    }

    /// `METHOD path?query`; the body of a 200 answer, else the server's reason.
    pub fn call(&self, method: &str, path: &str, query: &[(&str, &str)]) -> anyhow::Result<String> {
        if !matches!(method, "GET" | "POST") {
            bail!("the admin endpoint takes GET and POST, not {method}");
        }
        let (status, body) = call_unix(&self.socket, method, path, query).with_context(|| {
            format!(
                "cannot reach the server's admin endpoint at {}",
                self.socket.display()
            )
        })?;
        if status != 200 {
            bail!("{}", body.trim_end());
        }
        Ok(body)
    }
}

/// One request over the Unix socket. ureq has no Unix-socket transport; a
/// request line and an answer read to the end of the connection is all
/// this needs.
fn call_unix(
    socket: &Path,
    method: &str,
    path: &str,
    query: &[(&str, &str)],
) -> anyhow::Result<(u16, String)> {
    let mut target = path.to_string();
    if !query.is_empty() {
        let encoded = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(query)
            .finish();
        target = format!("{target}?{encoded}");
    }
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    write!(
        stream,
        "{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.take(BODY_BYTES_MAX).read_to_end(&mut raw)?;
    parse_answer(&raw)
}

/// Status and body of an HTTP/1.1 answer, plain or chunked.
fn parse_answer(raw: &[u8]) -> anyhow::Result<(u16, String)> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("the admin endpoint's answer has no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut body = &raw[split + 4..];
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .context("the admin endpoint's answer has no status")?;
    let chunked = head.lines().any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    if !chunked {
        return Ok((status, String::from_utf8_lossy(body).into_owned()));
    }
    let mut decoded = Vec::new();
    loop {
        let end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("a chunk of the admin endpoint's answer has no size")?;
        let size_text = String::from_utf8_lossy(&body[..end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .context("a chunk size is not hex")?;
        body = &body[end + 2..];
        if size == 0 {
            break;
        }
        let chunk = body.get(..size).context("the answer ends inside a chunk")?;
        decoded.extend_from_slice(chunk);
        body = body.get(size + 2..).unwrap_or_default();
    }
    Ok((status, String::from_utf8_lossy(&decoded).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_plain_and_chunked() {
        let plain = b"HTTP/1.1 409 Conflict\r\nContent-Length: 4\r\n\r\nnope";
        assert_eq!(parse_answer(plain).unwrap(), (409, "nope".into()));
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_answer(chunked).unwrap(), (200, "abcde".into()));
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n").is_err());
    }
}
