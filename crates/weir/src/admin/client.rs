//! The CLI's side of the admin endpoint: find the running server of a data
//! directory and ask it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};

use super::http::percent_encode;
use super::ADDRESS_FILE;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A server's admin endpoint, found through its data directory.
pub struct AdminClient {
    addr: String,
}

impl AdminClient {
    /// The endpoint of the server that holds `data_dir`.
    pub fn for_data_dir(data_dir: &Path) -> anyhow::Result<AdminClient> {
        let path = data_dir.join(ADDRESS_FILE);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "a weir server holds {} but its admin endpoint is not known ({} is missing; is it running with --admin none?)",
                data_dir.display(),
                path.display()
            )
        })?;
        Ok(AdminClient {
            addr: text.trim().to_string(),
        })
    }

    /// `METHOD path?query`; the body of a 200 answer, else the server's reason.
    pub fn call(&self, method: &str, path: &str, query: &[(&str, &str)]) -> anyhow::Result<String> {
        let query: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{k}={}", percent_encode(v)))
            .collect();
        let target = if query.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{}", query.join("&"))
        };
        let mut stream = TcpStream::connect(&self.addr).with_context(|| {
            format!("cannot reach the server's admin endpoint at {}", self.addr)
        })?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        write!(
            stream,
            "{method} {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        )?;
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .context("reading the admin endpoint's answer")?;
        let (head, body) = answer
            .split_once("\r\n\r\n")
            .context("malformed answer from the admin endpoint")?;
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("malformed status line from the admin endpoint")?;
        if status != 200 {
            bail!("{}", body.trim_end());
        }
        Ok(body.to_string())
    }
}
