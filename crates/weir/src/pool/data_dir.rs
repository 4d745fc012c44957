//! The data directory's lock: one `weir serve` per data directory, and
//! offline commands that change a pool only while none runs.

use std::path::Path;

use anyhow::Context;

/// Exclusive use of a data directory: `weir serve` holds it while it runs,
/// and the offline commands that change a pool take it. Released when the
/// file is dropped.
pub fn lock_data_dir(data_dir: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    try_lock_data_dir(data_dir)?.with_context(|| {
        format!(
            "{} is in use by a running weir serve with no admin endpoint (admin = \"none\"); stop it, or start it with one so that it takes this change",
            data_dir.display()
        )
    })
}

/// Refuse a data directory that does not exist, for commands that only
/// read one: a mistyped `--data-dir` must not pass for one with no pools.
pub fn check_exists(data_dir: &Path) -> anyhow::Result<()> {
    if !data_dir.is_dir() {
        anyhow::bail!(
            "{} does not exist: no pools are registered there (is --data-dir right?)",
            data_dir.display()
        );
    }
    Ok(())
}

/// `Ok(None)` when another process holds the directory. A directory that
/// does not exist is an error, not made: a mistyped `--data-dir` must not
/// pass for a directory with no pools.
pub fn try_lock_data_dir(data_dir: &Path) -> anyhow::Result<Option<std::fs::File>> {
    use std::os::fd::AsRawFd;
    check_exists(data_dir)?;
    let path = data_dir.join("weir.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    Ok((rc == 0).then_some(file))
}
