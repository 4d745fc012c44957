//! Scrub: read every allocated block of every copy, each copy chunk by
//! chunk in LBA order on its own (four chunks in flight per copy), verify
//! it, and rewrite bad copies from good ones, on threads of its own while
//! the pool serves. It can be
//! paused, resumed and stopped;
//! its position is checkpointed in `DATA_DIR/scrub-POOL.json`, so a scrub
//! cut short by a restart resumes where it was.
//!
//! ```text
//!  start ──> running ──pause──> paused ──resume──> running ──> finished
//!               │                  │
//!               └──────stop────────┴──> stopped     (shutdown: saved as running)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::Context;
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

pub use super::mirror::select::COPY_LEAD_MAX_CHUNKS;
use super::mirror::{CopyScrub, PoolData, ScrubResult};

/// Checkpoint after this many chunks (and at every change of state).
const CHECKPOINT_EVERY_CHUNKS: u64 = 64;
/// Chunks scrubbed at once on each copy, by as many worker threads, each
/// taking the copy's next chunk as it finishes one: four 1 MiB reads in
/// flight per device (OpenZFS keeps 4 MiB of scrub I/O per leaf by
/// default). With one, a flash device idles between reads, and the device
/// queue has nothing to schedule.
const CHUNKS_IN_FLIGHT: u64 = 4;
/// A copy held by the lead looks at commands this often.
const LEAD_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

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
    /// When it started and, once finished, when it ended (Unix seconds);
    /// absent in checkpoints an older weir saved.
    #[serde(default)]
    pub started_unix: Option<u64>,
    #[serde(default)]
    pub ended_unix: Option<u64>,
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

pub(super) fn checkpoint_path(pool: &str, data_dir: &Path) -> PathBuf {
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
    let eta = if c.state == ScrubState::Running {
        super::progress::eta(c.chunks_done, c.chunks_total, c.seconds)
    } else {
        String::new()
    };
    let when = |unix: u64| {
        humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix),
        )
    };
    let mut dates = String::new();
    if let Some(started) = c.started_unix {
        dates.push_str(&format!(", started {}", when(started)));
    }
    if let Some(ended) = c.ended_unix.filter(|_| c.state == ScrubState::Finished) {
        dates.push_str(&format!(", finished {}", when(ended)));
    }
    format!(
        "scrub {pool}: {}, {percent:.1}% ({} of {} chunks), {rate:.0} MB/s{eta}, {} repaired, {} unrecoverable{dates}",
        c.state.name(),
        c.chunks_done,
        c.chunks_total,
        c.repaired,
        c.unrecoverable
    )
}

/// Now, in Unix seconds.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
        checkpoint.started_unix.get_or_insert_with(unix_now);
        checkpoint.ended_unix = None;
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
            control.checkpoint.ended_unix = Some(unix_now());
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

/// One copy's place in a group's scrub.
#[derive(Default)]
struct CopyCursor {
    next: u64,
    reading: BTreeSet<u64>,
}

impl CopyCursor {
    /// The lowest chunk of this copy not yet scrubbed.
    fn low(&self) -> u64 {
        self.reading.first().copied().unwrap_or(self.next)
    }
}

/// A group's scrub in progress: every copy's cursor, the chunks given the
/// repairing scrub (so that a chunk bad on two copies is repaired and
/// counted once), and the bytes read of chunks some copy has still to
/// read. Those count once every copy is past them, so that the bytes in
/// the checkpoint are those of its position: a copy reading ahead is not
/// progress yet, and a restart does not count them twice.
struct Window {
    copies: Vec<(usize, CopyCursor)>,
    repaired: BTreeSet<u64>,
    bytes_ahead: BTreeMap<u64, u64>,
    since_save: u64,
}

impl Window {
    /// The lowest chunk not yet scrubbed on every copy: the checkpoint.
    fn low(&self, end: u64) -> u64 {
        self.copies
            .iter()
            .map(|(_, c)| c.low())
            .min()
            .unwrap_or(end)
    }
}

/// Scrub group `from.0` from chunk `from.1` to its end, until done or a
/// command other than run. Each copy has `CHUNKS_IN_FLIGHT` workers of
/// its own, each taking that copy's next chunk as it finishes one, and
/// runs at most `COPY_LEAD_MAX_CHUNKS` ahead of the slowest copy. The
/// checkpoint's position is the lowest chunk not yet done on every copy,
/// so a restart redoes at most the lead.
fn scrub_window(pool: &PoolData, shared: &Shared, from: (usize, u64)) {
    let (group, start) = from;
    let end = pool.chunks_per_group();
    let slots = pool.scrub_copies(group);
    let window = Mutex::new(Window {
        copies: slots
            .iter()
            .map(|slot| {
                let cursor = CopyCursor {
                    next: start,
                    ..CopyCursor::default()
                };
                (*slot, cursor)
            })
            .collect(),
        repaired: BTreeSet::new(),
        bytes_ahead: BTreeMap::new(),
        since_save: 0,
    });
    let moved = Condvar::new();
    let started = Instant::now();
    let seconds_before = shared.control.lock().checkpoint.seconds;
    let running = || shared.control.lock().command == Command::Run && !pool.is_closing();
    let worker = |copy: usize| loop {
        if !running() {
            return;
        }
        let taken = {
            let mut w = window.lock();
            let next = w.copies[copy].1.next;
            if next >= end {
                return;
            }
            if next >= w.low(end) + COPY_LEAD_MAX_CHUNKS {
                // Held by the lead; the command is looked at again first
                // (not under this lock: completions take the control lock
                // before it).
                moved.wait_for(&mut w, LEAD_WAIT);
                None
            } else {
                let cursor = &mut w.copies[copy].1;
                cursor.next += 1;
                cursor.reading.insert(next);
                let positions: Vec<(usize, u64)> =
                    w.copies.iter().map(|(slot, c)| (*slot, c.next)).collect();
                Some((w.copies[copy].0, next, positions))
            }
        };
        let Some((slot, chunk, positions)) = taken else {
            continue;
        };
        // Not under the window's lock: readers take the selector's.
        pool.note_scrub_positions(group, Some(&positions));
        let mut found = ScrubResult::default();
        let mut gone = false;
        match pool.scrub_copy(group, slot, chunk) {
            CopyScrub::Clean(bytes) => found.bytes_read = bytes,
            CopyScrub::Gone => gone = true,
            CopyScrub::Suspect => {
                if window.lock().repaired.insert(chunk) {
                    match pool.scrub_chunk_repair(group, chunk) {
                        Ok(result) => found = result,
                        Err(err) => tracing::error!(
                            pool = shared.pool,
                            group,
                            chunk,
                            error = %err,
                            "scrub: chunk failed"
                        ),
                    }
                }
            }
        }
        let mut control = shared.control.lock();
        let c = &mut control.checkpoint;
        c.repaired += found.repaired;
        c.unrecoverable += found.unrecoverable;
        let mut w = window.lock();
        *w.bytes_ahead.entry(chunk).or_default() += found.bytes_read;
        let cursor = &mut w.copies[copy].1;
        cursor.reading.remove(&chunk);
        if gone {
            // Its copy is no longer whole: nothing more to scrub on it.
            cursor.next = end;
            cursor.reading.clear();
        }
        let low = w.low(end);
        let ahead = w.bytes_ahead.split_off(&low);
        c.bytes_read += std::mem::replace(&mut w.bytes_ahead, ahead)
            .values()
            .sum::<u64>();
        if low >= end {
            (c.group, c.chunk) = (group + 1, 0);
        } else {
            (c.group, c.chunk) = (group, low);
            w.repaired = w.repaired.split_off(&low);
        }
        c.chunks_done = c.group as u64 * end + c.chunk;
        c.seconds = seconds_before + started.elapsed().as_secs_f64();
        w.since_save += 1;
        if w.since_save >= CHECKPOINT_EVERY_CHUNKS {
            w.since_save = 0;
            shared.save(c);
        }
        moved.notify_all();
    };
    if slots.is_empty() || start >= end {
        // No copy to read (or nothing left): the group counts as scrubbed.
        let mut control = shared.control.lock();
        let c = &mut control.checkpoint;
        (c.group, c.chunk) = (group + 1, 0);
        c.chunks_done = c.group as u64 * end;
        return;
    }
    std::thread::scope(|scope| {
        for copy in 0..slots.len() {
            for _ in 0..CHUNKS_IN_FLIGHT {
                scope.spawn(move || worker(copy));
            }
        }
    });
    pool.note_scrub_positions(group, None);
}
