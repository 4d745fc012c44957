//! The CLI's side of the admin endpoint: find the running server of a data
//! directory and ask it.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};

use super::ADDRESS_FILE;

const TIMEOUT: Duration = Duration::from_secs(60);
/// `/metrics` of a large pool is the longest answer; far below this.
const BODY_BYTES_MAX: u64 = 64 << 20;

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
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(TIMEOUT))
            .build()
            .into();
        let url = format!("http://{}{path}", self.addr);
        let pairs = query.iter().copied();
        let sent = match method {
            "GET" => agent.get(&url).query_pairs(pairs).call(),
            "POST" => agent.post(&url).query_pairs(pairs).send_empty(),
            other => bail!("the admin endpoint takes GET and POST, not {other}"),
        };
        let mut answer = sent.with_context(|| {
            format!("cannot reach the server's admin endpoint at {}", self.addr)
        })?;
        let status = answer.status();
        let body = answer
            .body_mut()
            .with_config()
            .limit(BODY_BYTES_MAX)
            .read_to_string()
            .context("reading the admin endpoint's answer")?;
        if status != 200 {
            bail!("{}", body.trim_end());
        }
        Ok(body)
    }
}
