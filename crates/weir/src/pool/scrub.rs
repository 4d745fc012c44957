//! Scrub: read every allocated block of every copy, chunk by chunk in LBA
//! order (four chunks in flight), verify it, and rewrite bad copies from
//! good ones, on threads of its own while the pool serves. It can be
//! paused, resumed and stopped;
//! its position is checkpointed in `DATA_DIR/scrub-POOL.json`, so a scrub
//! cut short by a restart resumes where it was.
//!
//! ```text
//!  start ──> running ──pause──> paused ──resume──> running ──> finished
//!               │                  │
//!               └──────stop────────┴──> stopped     (shutdown: saved as running)
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::Context;
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

use super::mirror::PoolData;

/// Checkpoint after this many chunks (and at every change of state).
const CHECKPOINT_EVERY_CHUNKS: u64 = 64;
/// Chunks scrubbed at once, by as many worker threads, each taking the
/// next chunk as it finishes one: four 1 MiB reads in flight per device
/// (OpenZFS keeps 4 MiB of scrub I/O per leaf by default). With one, a
/// flash device idles between reads, and the device queue has nothing to
/// schedule.
const CHUNKS_IN_FLIGHT: u64 = 4;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScrubState {
    /// Running, or cut short by a restart (it resumes).
    #[default]
    Running,
    Paused,
    /// Stopped by the user; the next start begins again.
    Stopped,
    Finished,
}

impl ScrubState {
    pub fn name(self) -> &'static str {
        match self {
            ScrubState::Running => "running",
            ScrubState::Paused => "paused",
            ScrubState::Stopped => "stopped",
            ScrubState::Finished => "finished",
        }
    }
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
    /// Time spent scrubbing (pauses excluded).
    pub seconds: f64,
}

impl Checkpoint {
    pub fn new(pool: &PoolData) -> Checkpoint {
        Checkpoint {
            chunks_total: pool.groups() as u64 * pool.chunks_per_group(),
            ..Checkpoint::default()
        }
    }

    /// Whether it can go on from here (a resume, or a start after a restart).
    pub fn unfinished(&self) -> bool {
        matches!(self.state, ScrubState::Running | ScrubState::Paused)
    }
}

fn checkpoint_path(pool: &str, data_dir: &Path) -> PathBuf {
    data_dir.join(format!("scrub-{pool}.json"))
}

pub fn load(pool: &str, data_dir: &Path) -> anyhow::Result<Option<Checkpoint>> {
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

pub fn save(pool: &str, data_dir: &Path, checkpoint: &Checkpoint) -> anyhow::Result<()> {
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
    format!(
        "scrub {pool}: {}, {percent:.1}% ({} of {} chunks), {rate:.0} MB/s{eta}, {} repaired, {} unrecoverable",
        c.state.name(),
        c.chunks_done,
        c.chunks_total,
        c.repaired,
        c.unrecoverable
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Command {
    Run,
    Pause,
    Stop,
    /// The server is stopping: save the position so that it resumes.
    Shutdown,
}

struct Control {
    command: Command,
    checkpoint: Checkpoint,
}

struct Shared {
    pool: String,
    data_dir: PathBuf,
    control: Mutex<Control>,
    wake: Condvar,
}

impl Shared {
    fn save(&self, checkpoint: &Checkpoint) {
        if let Err(err) = save(&self.pool, &self.data_dir, checkpoint) {
            tracing::warn!(
                pool = self.pool,
                "cannot save the scrub checkpoint: {err:#}"
            );
        }
    }
}

/// A scrub of one pool, on its own thread.
pub struct Scrub {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Scrub {
    /// Run a scrub from `checkpoint` (a fresh one, or one to resume).
    pub fn spawn(pool: &Arc<PoolData>, data_dir: &Path, mut checkpoint: Checkpoint) -> Scrub {
        checkpoint.state = ScrubState::Running;
        let shared = Arc::new(Shared {
            pool: pool.name().to_string(),
            data_dir: data_dir.to_path_buf(),
            control: Mutex::new(Control {
                command: Command::Run,
                checkpoint,
            }),
            wake: Condvar::new(),
        });
        shared.save(&shared.control.lock().checkpoint);
        let weak = Arc::downgrade(pool);
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("weir-scrub-{}", pool.name()))
            .spawn(move || run(weak, &thread_shared))
            .map_err(|err| tracing::error!(error = %err, "cannot start the scrub thread"))
            .ok();
        Scrub { shared, thread }
    }

    pub fn checkpoint(&self) -> Checkpoint {
        self.shared.control.lock().checkpoint.clone()
    }

    fn command(&self, command: Command) {
        let mut control = self.shared.control.lock();
        if control.checkpoint.state == ScrubState::Finished {
            return;
        }
        control.command = command;
        self.shared.wake.notify_all();
    }

    pub fn pause(&self) {
        self.command(Command::Pause);
    }

    pub fn resume(&self) {
        self.command(Command::Run);
    }

    pub fn stop(&self) {
        self.command(Command::Stop);
    }

    /// Wait until the state is not `from` any more (a command took effect).
    pub fn wait_while(&self, from: ScrubState) -> Checkpoint {
        let mut control = self.shared.control.lock();
        while control.checkpoint.state == from
            && self.thread.as_ref().is_some_and(|t| !t.is_finished())
        {
            self.shared
                .wake
                .wait_for(&mut control, std::time::Duration::from_millis(100));
        }
        control.checkpoint.clone()
    }

    /// Stop for a server shutdown, saving the position; waits for the thread.
    pub fn shutdown(mut self) {
        self.command(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(pool: Weak<PoolData>, shared: &Shared) {
    loop {
        let (group, chunk) = {
            let mut control = shared.control.lock();
            loop {
                match control.command {
                    Command::Run => break,
                    Command::Pause => {
                        if control.checkpoint.state != ScrubState::Paused {
                            control.checkpoint.state = ScrubState::Paused;
                            shared.save(&control.checkpoint);
                            shared.wake.notify_all();
                        }
                        shared.wake.wait(&mut control);
                    }
                    Command::Stop | Command::Shutdown => {
                        if control.command == Command::Stop {
                            control.checkpoint.state = ScrubState::Stopped;
                        } else if control.checkpoint.state == ScrubState::Paused {
                            // Stays paused across the restart.
                        } else {
                            control.checkpoint.state = ScrubState::Running;
                        }
                        shared.save(&control.checkpoint);
                        shared.wake.notify_all();
                        return;
                    }
                }
            }
            if control.checkpoint.state != ScrubState::Running {
                control.checkpoint.state = ScrubState::Running;
                shared.save(&control.checkpoint);
                shared.wake.notify_all();
            }
            (control.checkpoint.group, control.checkpoint.chunk)
        };
        let Some(pool) = pool.upgrade().filter(|p| !p.is_closing()) else {
            shared.save(&shared.control.lock().checkpoint);
            return;
        };
        if group >= pool.groups() {
            let mut control = shared.control.lock();
            control.checkpoint.state = ScrubState::Finished;
            shared.save(&control.checkpoint);
            shared.wake.notify_all();
            tracing::info!(
                pool = shared.pool,
                "{}",
                describe(&shared.pool, &control.checkpoint)
            );
            return;
        }
        scrub_window(&pool, shared, (group, chunk));
    }
}

/// The chunks handed out to workers and not yet done, and the next one.
struct Window {
    next: (usize, u64),
    in_progress: BTreeSet<(usize, u64)>,
    since_save: u64,
}

/// Scrub from `from` with `CHUNKS_IN_FLIGHT` workers, each taking the next
/// chunk as it finishes one, until the end or a command other than run.
/// The checkpoint's position is the lowest chunk not yet done, so a
/// restart redoes at most the chunks that were in flight.
fn scrub_window(pool: &PoolData, shared: &Shared, from: (usize, u64)) {
    let groups = pool.groups();
    let chunks_per_group = pool.chunks_per_group();
    let window = Mutex::new(Window {
        next: from,
        in_progress: BTreeSet::new(),
        since_save: 0,
    });
    let started = Instant::now();
    let seconds_before = shared.control.lock().checkpoint.seconds;
    let worker = || loop {
        if shared.control.lock().command != Command::Run || pool.is_closing() {
            return;
        }
        let (group, chunk) = {
            let mut w = window.lock();
            if w.next.0 >= groups {
                return;
            }
            let taken = w.next;
            w.next.1 += 1;
            if w.next.1 >= chunks_per_group {
                w.next = (w.next.0 + 1, 0);
            }
            w.in_progress.insert(taken);
            taken
        };
        let result = pool.scrub_chunk(group, chunk);
        let mut control = shared.control.lock();
        let c = &mut control.checkpoint;
        match result {
            Ok(result) => {
                c.bytes_read += result.bytes_read;
                c.repaired += result.repaired;
                c.unrecoverable += result.unrecoverable;
            }
            Err(err) => {
                tracing::error!(pool = shared.pool, group, chunk, error = %err, "scrub: chunk failed")
            }
        }
        let mut w = window.lock();
        w.in_progress.remove(&(group, chunk));
        (c.group, c.chunk) = w.in_progress.first().copied().unwrap_or(w.next);
        c.chunks_done += 1;
        c.seconds = seconds_before + started.elapsed().as_secs_f64();
        w.since_save += 1;
        if w.since_save >= CHECKPOINT_EVERY_CHUNKS {
            w.since_save = 0;
            shared.save(c);
        }
    };
    std::thread::scope(|scope| {
        for _ in 0..CHUNKS_IN_FLIGHT {
            scope.spawn(worker);
        }
    });
}
