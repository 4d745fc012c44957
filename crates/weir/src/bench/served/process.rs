//! The `weir serve` processes a bench starts: the weir binary, its
//! temporary directories, waiting for it to answer, and stopping it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::bench::nbd_client;

/// A temporary directory removed with all it holds on drop; named
/// `weir-bench-PID-WHAT-*` so that `remove_stale` can find it after a kill.
pub struct Dir(tempfile::TempDir);

impl Dir {
    pub fn new_in(parent: &Path, what: &str) -> std::io::Result<Dir> {
        tempfile::Builder::new()
            .prefix(&format!("weir-bench-{}-{what}-", std::process::id()))
            .tempdir_in(parent)
            .map(Dir)
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// Removes what benches that were killed left in `parent`: their
/// `weir-bench-PID-*` directories, where no process PID runs any more.
/// In memory those files would otherwise hold their room until reboot.
pub fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("weir-bench-"))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

pub fn weir() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("cannot find the weir binary")
}

/// Run `weir ARGS` to completion; its stderr is the error.
pub fn weir_cli(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(weir()?)
        .args(args)
        .output()
        .context("cannot run weir")?;
    if !out.status.success() {
        bail!(
            "weir {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

pub fn wait_for_server(uri: &str, socket: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    // A full handshake, so the server sees a client, not a probe.
    while nbd_client::connect(uri).is_err() {
        if Instant::now() > deadline {
            bail!("weir serve did not come up on {}", socket.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Asks a server to stop (SIGTERM: it finishes its requests and closes
/// its pool) and waits for it.
pub fn stop(child: &mut Child) {
    // SAFETY: signalling our own child process.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let _ = child.wait();
}
