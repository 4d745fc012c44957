//! The cache's one background thread: it releases writers' paused
//! replies when their pause ends, and on every tick lets each cache's
//! written pieces settle and start background writeback, and measures
//! the writeback rate that sizes the budget, over the time writeback was
//! busy.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::budget::DirtyBudget;
use super::pauses::{self, PausedReplies, Reply, RELEASE_SLACK};
use super::waiting::WaitingWrites;

/// What one tick saw, for the rate that sizes the budget.
pub struct TickStats {
    /// Bytes this cache has written to the store, ever: write-back, and
    /// writes larger than the budget.
    pub written_bytes: u64,
    /// Time since the last tick during which this cache had writes to the
    /// store in flight.
    pub busy: Duration,
    /// The cache's volume, the budget bytes it holds, and whether a
    /// client wrote to it since the last tick.
    pub volume: usize,
    pub held_bytes: u64,
    pub wrote: bool,
}

/// A volume written within this long counts as writing, for the headroom
/// the largest holder of the budget leaves to the others.
const WRITING_WITHIN: Duration = Duration::from_secs(1);

/// Busy time below this says too little about the devices' rate. Short:
/// a device that takes a paced writer's writes into its own cache is busy
/// for a fraction of a millisecond per write, and only its samples can
/// lift an estimate that a slower workload left behind.
pub const RATE_BUSY_MIN: Duration = Duration::from_millis(1);

/// Whether a tick's writeback says how fast the devices take writes: it
/// ran long enough, and either for most of the tick or while writers
/// were being paced (when nobody is near the budget, a writeback that ran
/// one write at a time understates what the devices could take, and the
/// budget does not matter).
pub fn rate_sample_counts(busy: Duration, tick: Duration, pressure: bool) -> bool {
    busy >= RATE_BUSY_MIN && (pressure || busy >= tick / 2)
}

/// A cache the flusher ticks.
pub trait Ticked: Send + Sync {
    /// Let what was written so far settle and start background writeback.
    fn tick(&self) -> TickStats;
}

/// A cached piece waits at least one tick for neighbours before
/// background writeback takes it (Linux flushes dirty pages after 5 s;
/// a block cache wants its memory back sooner).
pub const TICK: Duration = Duration::from_millis(100);

#[derive(Default)]
struct State {
    paused: PausedReplies,
    caches: Vec<Weak<dyn Ticked>>,
    /// When each volume was last seen written, within `WRITING_WITHIN`.
    last_written: HashMap<usize, Instant>,
    stop: bool,
    /// When the thread, asleep, wakes by itself (None while it runs).
    sleeps_until: Option<Instant>,
}

pub struct Flusher {
    state: Mutex<State>,
    wake: Condvar,
    budget: Arc<DirtyBudget>,
    /// Every cache's writes waiting for room in the budget, in one queue.
    waiting: WaitingWrites,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Flusher {
    pub fn start(budget: Arc<DirtyBudget>) -> Arc<Flusher> {
        let flusher = Arc::new(Flusher {
            state: Mutex::default(),
            wake: Condvar::new(),
            waiting: WaitingWrites::new(Arc::clone(&budget)),
            budget,
            thread: Mutex::new(None),
        });
        let weak = Arc::downgrade(&flusher);
        let handle = std::thread::Builder::new()
            .name("weir-writeback".into())
            .spawn(move || run(weak))
            .expect("spawn the writeback thread");
        *flusher.thread.lock().expect("flusher lock") = Some(handle);
        flusher
    }

    /// A flusher with no thread: replies are never paused and caches are
    /// only ticked by whoever holds them. For tests that drive a cache
    /// step by step.
    pub fn manual(budget: Arc<DirtyBudget>) -> Arc<Flusher> {
        Arc::new(Flusher {
            state: Mutex::new(State {
                stop: true,
                ..State::default()
            }),
            wake: Condvar::new(),
            waiting: WaitingWrites::new(Arc::clone(&budget)),
            budget,
            thread: Mutex::new(None),
        })
    }

    pub fn budget(&self) -> &Arc<DirtyBudget> {
        &self.budget
    }

    pub fn waiting(&self) -> &WaitingWrites {
        &self.waiting
    }

    pub fn register(&self, cache: Weak<dyn Ticked>) {
        let mut state = self.state.lock().expect("flusher lock");
        state.caches.push(cache);
    }

    /// Tick every cache, and choose which volume leaves headroom. Returns
    /// the bytes the caches have written to their stores, ever, and the
    /// longest time one was busy since the last tick: caches write to
    /// devices in parallel, or share them, so the longest stands for the
    /// union of theirs.
    pub fn tick_caches(&self) -> (u64, Duration) {
        let caches: Vec<Arc<dyn Ticked>> = {
            let mut state = self.state.lock().expect("flusher lock");
            state.caches.retain(|c| c.strong_count() > 0);
            state.caches.iter().filter_map(Weak::upgrade).collect()
        };
        let stats: Vec<TickStats> = caches.iter().map(|cache| cache.tick()).collect();
        self.choose_headroom(&stats, Instant::now());
        let written = stats.iter().map(|s| s.written_bytes).sum();
        let busy = stats.iter().map(|s| s.busy).max().unwrap_or_default();
        (written, busy)
    }

    /// While more than one volume writes, the writing volume holding the
    /// most of the budget leaves headroom to the others; one volume alone
    /// has it all. A volume only draining what it wrote earlier is passed
    /// over: capping it leaves no room to anyone.
    fn choose_headroom(&self, stats: &[TickStats], now: Instant) {
        let mut state = self.state.lock().expect("flusher lock");
        for s in stats.iter().filter(|s| s.wrote) {
            state.last_written.insert(s.volume, now);
        }
        state.last_written.retain(|volume, at| {
            now.duration_since(*at) <= WRITING_WITHIN && stats.iter().any(|s| s.volume == *volume)
        });
        let holder = (state.last_written.len() >= 2)
            .then(|| {
                stats
                    .iter()
                    .filter(|s| s.held_bytes > 0 && state.last_written.contains_key(&s.volume))
                    .max_by_key(|s| s.held_bytes)
                    .map(|s| s.volume)
            })
            .flatten();
        drop(state);
        self.budget.set_leaves_headroom(holder);
    }

    /// Run `reply` after `pause`: on this thread if it releases its own
    /// paused replies, else on the flusher's.
    pub fn after(&self, pause: Duration, reply: Reply) {
        let at = Instant::now() + pause;
        let Err(reply) = pauses::hold_here(at, reply) else {
            return;
        };
        let mut state = self.state.lock().expect("flusher lock");
        if state.stop {
            drop(state);
            return reply();
        }
        state.paused.hold(at, reply);
        // Wake the thread only if it would otherwise release this reply
        // late; a running thread looks at the heap before it sleeps.
        let wake = state
            .sleeps_until
            .is_some_and(|until| at + RELEASE_SLACK < until);
        drop(state);
        if wake {
            self.wake.notify_one();
        }
    }

    /// End the thread, releasing every paused reply first.
    pub fn stop(&self) {
        self.state.lock().expect("flusher lock").stop = true;
        self.wake.notify_one();
        if let Some(handle) = self.thread.lock().expect("flusher lock").take() {
            let _ = handle.join();
        }
    }
}

fn run(weak: Weak<Flusher>) {
    let mut next_tick = Instant::now() + TICK;
    let mut last_written = 0u64;
    let mut last_tick = Instant::now();
    loop {
        let Some(flusher) = weak.upgrade() else {
            return;
        };
        let (due, stop) = {
            let mut state = flusher.state.lock().expect("flusher lock");
            let now = Instant::now();
            let wait_until = state
                .paused
                .next_at()
                .map_or(next_tick, |at| at.min(next_tick));
            if wait_until > now + RELEASE_SLACK && !state.stop {
                state.sleeps_until = Some(wait_until);
                let (guard, _) = flusher
                    .wake
                    .wait_timeout(state, wait_until - now)
                    .expect("flusher lock");
                state = guard;
                state.sleeps_until = None;
            }
            let due = if state.stop {
                state.paused.take_all()
            } else {
                state.paused.take_due(Instant::now() + RELEASE_SLACK)
            };
            (due, state.stop)
        };
        for reply in due {
            reply();
        }
        if stop {
            return;
        }
        if Instant::now() >= next_tick {
            let pressure = flusher.budget.under_pressure();
            let (written, busy) = flusher.tick_caches();
            let now = Instant::now();
            if written > last_written && rate_sample_counts(busy, now - last_tick, pressure) {
                flusher
                    .budget
                    .record_rate(written - last_written, busy, now - last_tick);
            }
            last_written = written;
            last_tick = now;
            next_tick = now + TICK;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(volume: usize, held_bytes: u64, wrote: bool) -> TickStats {
        TickStats {
            written_bytes: 0,
            busy: Duration::ZERO,
            volume,
            held_bytes,
            wrote,
        }
    }

    #[test]
    fn the_largest_holder_among_the_writing_volumes_leaves_headroom() {
        let budget = DirtyBudget::new(Some(8 << 20));
        let flusher = Flusher::manual(Arc::clone(&budget));
        let held = budget.charge(6 << 20);
        let now = Instant::now();
        // Volume 1 holds the most but only drains what it wrote before;
        // volumes 2 and 3 write, and 2 holds more of the two.
        flusher.choose_headroom(
            &[
                stats(1, 5 << 20, false),
                stats(2, 1 << 20, true),
                stats(3, 4096, true),
            ],
            now,
        );
        assert!(
            !budget.fits_for(3 << 19, 2),
            "volume 2 keeps out of the last eighth"
        );
        assert!(budget.fits_for(3 << 19, 1));
        assert!(budget.fits_for(3 << 19, 3));
        // Volume 3 alone still writes a second later: nobody leaves headroom.
        let later = now + WRITING_WITHIN + Duration::from_millis(1);
        flusher.choose_headroom(
            &[
                stats(1, 5 << 20, false),
                stats(2, 1 << 20, false),
                stats(3, 4096, true),
            ],
            later,
        );
        assert!(budget.fits_for(3 << 19, 2));
        drop(held);
    }

    #[test]
    fn a_paced_writers_short_writeback_counts_and_an_idle_one_does_not() {
        let ms = Duration::from_millis;
        // Writes landing in a drive's cache: busy 2 ms of the tick. They
        // say how fast the device is while writers are paced...
        assert!(rate_sample_counts(ms(2), TICK, true));
        // ...but not when nobody is near the budget.
        assert!(!rate_sample_counts(ms(2), TICK, false));
        assert!(rate_sample_counts(ms(60), TICK, false));
        // Too short to say anything.
        assert!(!rate_sample_counts(Duration::from_micros(500), TICK, true));
    }

    #[test]
    fn samples_over_busy_time_lift_an_estimate_a_slow_workload_left_behind() {
        let budget = DirtyBudget::new(None);
        let tick = TICK;
        // Random writes to a disk: 0.3 MB/s, busy all the time.
        for _ in 0..30 {
            budget.record_rate(30_000, tick, tick);
        }
        assert!(budget.rate_bytes_per_second() < 0.5e6);
        // A paced sequential writer: 640 KiB per tick, each write taking
        // 0.3 ms in the drive's cache, 6 ms of busy time.
        for _ in 0..30 {
            budget.record_rate(640 << 10, Duration::from_millis(6), tick);
        }
        assert!(budget.rate_bytes_per_second() > 50e6);
        assert!(budget.limit_bytes() > 8 << 20, "{}", budget.limit_bytes());
    }
}
