//! `weir scrub`, offline: read every allocated block of every copy, chunk
//! by chunk in LBA order, verify it, and rewrite bad copies from good ones.
//! The position is checkpointed in `DATA_DIR/scrub-POOL.json`, so an
//! interrupted scrub resumes where it stopped.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::admin;
use super::mirror::PoolData;

/// Checkpoint after this many chunks (and at the end).
const CHECKPOINT_EVERY_CHUNKS: u64 = 64;
const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScrubState {
    #[default]
    Running,
    Finished,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Checkpoint {
    pub state: ScrubState,
    /// Next (group, chunk) to scrub.
    pub group: usize,
    pub chunk: u64,
    pub chunks_done: u64,
    pub chunks_total: u64,
    pub bytes_read: u64,
    pub repaired: u64,
    pub unrecoverable: u64,
    pub seconds: f64,
}

fn checkpoint_path(pool: &str, data_dir: &Path) -> PathBuf {
    data_dir.join(format!("scrub-{pool}.json"))
}

fn load(pool: &str, data_dir: &Path) -> anyhow::Result<Option<Checkpoint>> {
    let path = checkpoint_path(pool, data_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            Ok(Some(serde_json::from_str(&text).with_context(|| {
                format!("{} is damaged", path.display())
            })?))
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn save(pool: &str, data_dir: &Path, checkpoint: &Checkpoint) -> anyhow::Result<()> {
    let path = checkpoint_path(pool, data_dir);
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(checkpoint)?)?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
}

pub fn describe(pool: &str, c: &Checkpoint) -> String {
    let percent = if c.chunks_total == 0 {
        100.0
    } else {
        100.0 * c.chunks_done as f64 / c.chunks_total as f64
    };
    let rate = if c.seconds > 0.0 {
        c.bytes_read as f64 / c.seconds / 1e6
    } else {
        0.0
    };
    let eta = if c.chunks_done > 0 && c.state == ScrubState::Running {
        let left = (c.chunks_total - c.chunks_done) as f64 * c.seconds / c.chunks_done as f64;
        format!(", ETA {left:.0} s")
    } else {
        String::new()
    };
    let state = match c.state {
        ScrubState::Running => "running",
        ScrubState::Finished => "finished",
    };
    format!(
        "scrub {pool}: {state}, {percent:.1}% ({} of {} chunks), {rate:.0} MB/s{eta}, {} repaired, {} unrecoverable",
        c.chunks_done, c.chunks_total, c.repaired, c.unrecoverable
    )
}

/// Run (or resume) a scrub of `pool` to the end, showing progress.
pub fn start(pool: &str, data_dir: &Path) -> anyhow::Result<Checkpoint> {
    let _lock = admin::lock_data_dir(data_dir)?;
    let imported = admin::import_registered(pool, data_dir, true)?;
    let data = PoolData::open(&imported).with_context(|| format!("cannot open pool {pool:?}"))?;
    let total = data.groups() as u64 * data.chunks_per_group();
    let mut c = match load(pool, data_dir)? {
        Some(previous)
            if previous.state == ScrubState::Running && previous.chunks_total == total =>
        {
            eprintln!(
                "resuming the scrub of {pool} at {} of {total} chunks",
                previous.chunks_done
            );
            previous
        }
        _ => Checkpoint {
            chunks_total: total,
            ..Checkpoint::default()
        },
    };
    let started = Instant::now();
    let seconds_before = c.seconds;
    let mut last_progress = Instant::now();
    let tty = std::io::stderr().is_terminal();
    while c.group < data.groups() {
        while c.chunk < data.chunks_per_group() {
            let result = data.scrub_chunk(c.group, c.chunk)?;
            c.bytes_read += result.bytes_read;
            c.repaired += result.repaired;
            c.unrecoverable += result.unrecoverable;
            c.chunk += 1;
            c.chunks_done += 1;
            c.seconds = seconds_before + started.elapsed().as_secs_f64();
            if c.chunks_done % CHECKPOINT_EVERY_CHUNKS == 0 {
                save(pool, data_dir, &c)?;
            }
            if last_progress.elapsed() >= PROGRESS_INTERVAL {
                last_progress = Instant::now();
                let line = describe(pool, &c);
                if tty {
                    eprint!("\r{line}\x1b[K");
                } else {
                    eprintln!("{line}");
                }
            }
        }
        c.group += 1;
        c.chunk = 0;
    }
    c.state = ScrubState::Finished;
    c.seconds = seconds_before + started.elapsed().as_secs_f64();
    save(pool, data_dir, &c)?;
    if tty {
        eprintln!();
    }
    let _ = std::io::stderr().flush();
    Ok(c)
}

pub fn status(pool: &str, data_dir: &Path) -> anyhow::Result<String> {
    Ok(match load(pool, data_dir)? {
        Some(c) => describe(pool, &c),
        None => format!("scrub {pool}: never run"),
    })
}
