//! One dirty-memory budget for the whole server, shared by every volume's
//! write-back cache.
//!
//! Every cached byte is charged while its buffer lives (a [`Charge`] drops
//! with it), so the count is memory actually held, writeback copies
//! included. The limit is about one second of writeback at the rate the
//! devices have shown, within a floor and a share of RAM, unless the
//! operator set one. Writers are slowed smoothly from half the limit on
//! ([`pause_for`]). A write that would pass the limit waits, unanswered,
//! until writeback has made room for it, behind every write already
//! waiting ([`Admission`]): its buffer is already in memory, the wait is
//! as long as writeback takes to free its size, and it never queues
//! behind the writeback backlog on the device as a write sent through
//! would. Only a write larger than the whole limit is written through.
//!
//! A drive with a volatile write cache takes writes at interface speed
//! until that cache fills, then at the media's speed: an HDD taking random
//! 4 KiB writes shows 70 MB/s for half a second and then under 1 MB/s. The
//! rate estimate therefore believes a slower sample at once and a faster
//! one slowly, and the limit grows by at most [`LIMIT_GROWTH_PER_SECOND`],
//! so that such a burst cannot raise the limit to many seconds of what the
//! media takes (every one of which a FLUSH would then wait for).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The limit is never set below this from measurement. Below it, every
/// write is under pressure and goes out alone, unjoined: on an HDD a
/// sequential writer then measures the disk at a tenth of its streaming
/// rate, and the limit sized from that rate never grows back. On an HDD
/// taking random 4 KiB writes at under 1 MB/s, a few seconds of
/// write-back.
const LIMIT_FLOOR_BYTES: u64 = 4 << 20;
/// The limit before any writeback rate has been measured.
const LIMIT_INITIAL_BYTES: u64 = 4 << 20;
/// The measured limit holds this long a burst of writeback.
const LIMIT_SECONDS: f64 = 1.0;
/// The limit grows by at most this factor per second of measurement (it
/// shrinks as write-back drains, [`next_limit`]): longer than a drive's
/// write cache takes to fill at interface speed, short beside the seconds
/// a fast device's limit takes to reach its share of RAM.
pub const LIMIT_GROWTH_PER_SECOND: f64 = 2.0;
/// Dirty memory never exceeds this share of RAM unless configured.
const RAM_SHARE: u64 = 8;
/// Writers are not slowed below this share of the limit.
const PAUSE_FROM: f64 = 0.5;
/// The longest pause one write gets (Linux's balance_dirty_pages pauses
/// up to 200 ms); past the limit, a write waits for room instead.
const PAUSE_MAX: Duration = Duration::from_millis(100);
/// While several volumes write, the one holding the most of the budget
/// leaves this share of it to the others: a volume that holds nothing
/// then finds room at once, instead of waiting for the next room anyone
/// frees (one write to the slowest disk).
const HEADROOM_SHARE: u64 = 8;
/// The writeback rate assumed until one is measured (bytes/s); the
/// first sample replaces it.
const RATE_INITIAL: f64 = 100e6;
/// Weight of a new rate sample above the estimate.
const RATE_RISE_WEIGHT: f64 = 0.25;
/// Weight of a new rate sample below the estimate: a device that slowed
/// down (its write cache full, a reader taking its time) is believed
/// within a few samples.
const RATE_FALL_WEIGHT: f64 = 0.5;

/// What to do with a client write of some size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Cache it now.
    Cache,
    /// Wait for room, behind the writes already waiting.
    Wait,
    /// Larger than the whole limit: write it through.
    Through,
}

/// Bytes of dirty memory held by one buffer; released on drop.
pub struct Charge {
    budget: Arc<DirtyBudget>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

pub struct DirtyBudget {
    used: AtomicU64,
    limit: AtomicU64,
    /// Set by the operator: never changed by measurement.
    configured: bool,
    ram_cap: u64,
    /// The measured writeback rate in bytes/s, as `f64` bits: read on
    /// every cached write, so it takes no lock.
    rate_bits: AtomicU64,
    /// No sample has replaced `RATE_INITIAL` yet.
    unmeasured: AtomicBool,
    /// Client writes waiting for room, over every cache.
    waiting: AtomicUsize,
    /// The volume that leaves headroom to the others (0: none).
    leaves_headroom: AtomicUsize,
}

impl DirtyBudget {
    /// `configured`: the operator's limit in bytes, if any.
    pub fn new(configured: Option<u64>) -> Arc<DirtyBudget> {
        let ram_cap = ram_bytes() / RAM_SHARE;
        let limit = configured.unwrap_or(LIMIT_INITIAL_BYTES.min(ram_cap));
        Arc::new(DirtyBudget {
            used: AtomicU64::new(0),
            limit: AtomicU64::new(limit),
            configured: configured.is_some(),
            ram_cap,
            rate_bits: AtomicU64::new(RATE_INITIAL.to_bits()),
            unmeasured: AtomicBool::new(true),
            waiting: AtomicUsize::new(0),
            leaves_headroom: AtomicUsize::new(0),
        })
    }

    pub fn charge(self: &Arc<Self>, bytes: u64) -> Charge {
        self.used.fetch_add(bytes, Ordering::Relaxed);
        Charge {
            budget: Arc::clone(self),
            bytes,
        }
    }

    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit_bytes(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Whether `bytes` more would pass the limit.
    pub fn would_exceed(&self, bytes: u64) -> bool {
        self.used_bytes() + bytes > self.limit_bytes()
    }

    /// What to do with a new client write of `bytes`. A write that must
    /// wait is counted as waiting until [`admitted`](Self::admitted).
    pub fn admit(&self, bytes: u64) -> Admission {
        self.admit_for(bytes, 0)
    }

    /// [`admit`](Self::admit) for a write to `volume` (non-zero).
    pub fn admit_for(&self, bytes: u64, volume: usize) -> Admission {
        if self.too_large(bytes) {
            return Admission::Through;
        }
        if self.waiting.load(Ordering::Relaxed) == 0 && self.fits_for(bytes, volume) {
            return Admission::Cache;
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Admission::Wait
    }

    /// Whether a write of `bytes` at the head of a waiting queue fits now.
    pub fn fits(&self, bytes: u64) -> bool {
        !self.would_exceed(bytes)
    }

    /// [`fits`](Self::fits) for a write to `volume`: short of the headroom
    /// if that volume leaves it, unless the write is larger than what is
    /// left without the headroom (it would never fit, and wait forever).
    pub fn fits_for(&self, bytes: u64, volume: usize) -> bool {
        let limit = self.limit_bytes();
        let headroom = if volume != 0 && volume == self.leaves_headroom.load(Ordering::Relaxed) {
            limit / HEADROOM_SHARE
        } else {
            0
        };
        let cap = if bytes > limit - headroom {
            limit
        } else {
            limit - headroom
        };
        self.used_bytes() + bytes <= cap
    }

    /// `volume` (non-zero) leaves headroom to the others from now on; or
    /// none does.
    pub fn set_leaves_headroom(&self, volume: Option<usize>) {
        self.leaves_headroom
            .store(volume.unwrap_or(0), Ordering::Relaxed);
    }

    /// Whether a write of `bytes` could not fit even in an empty cache
    /// (the limit can shrink under a write that waits).
    pub fn too_large(&self, bytes: u64) -> bool {
        bytes > self.limit_bytes()
    }

    /// A waiting write left its queue (cached, failed or sent through).
    pub fn admitted(&self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// Client writes waiting for room.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Writers are held back: some wait for room, or replies are paused.
    /// Writeback's completions are then what answers them.
    pub fn pacing(&self) -> bool {
        self.waiting() > 0 || self.used_bytes() as f64 > self.limit_bytes() as f64 * PAUSE_FROM
    }

    /// Writeback should run without waiting for pieces to settle.
    pub fn under_pressure(&self) -> bool {
        self.used_bytes() as f64 >= self.limit_bytes() as f64 * PAUSE_FROM / 2.0
    }

    /// How long to hold the reply to a cached write of `bytes`.
    pub fn pause(&self, bytes: u64) -> Duration {
        pause_for(
            self.used_bytes(),
            self.limit_bytes(),
            bytes,
            self.rate_bytes_per_second(),
        )
    }

    /// Writeback moved `bytes` while it was busy for `busy`, over a tick
    /// of `tick`: a sample of the rate the devices take. The limit grows
    /// by the tick's length, the rate by the busy time.
    pub fn record_rate(&self, bytes: u64, busy: Duration, tick: Duration) {
        if busy.is_zero() || bytes == 0 {
            return;
        }
        let sample = bytes as f64 / busy.as_secs_f64();
        let first = self.unmeasured.swap(false, Ordering::Relaxed);
        let mut rate = 0.0;
        let _ = self
            .rate_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                rate = if first {
                    sample
                } else {
                    next_rate(f64::from_bits(bits), sample)
                };
                Some(rate.to_bits())
            });
        if !self.configured {
            let target = ((rate * LIMIT_SECONDS) as u64).clamp(LIMIT_FLOOR_BYTES, self.ram_cap);
            let used = self.used_bytes();
            let _ = self
                .limit
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |limit| {
                    Some(next_limit(limit, target, tick, bytes, used))
                });
        }
    }

    pub fn rate_bytes_per_second(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::Relaxed))
    }
}

/// The rate estimate after `sample`: quick to fall, slower to rise.
fn next_rate(old: f64, sample: f64) -> f64 {
    let weight = if sample < old {
        RATE_FALL_WEIGHT
    } else {
        RATE_RISE_WEIGHT
    };
    old + weight * (sample - old)
}

/// The limit `elapsed` after it was `limit`, heading for `target`, when
/// writeback drained `drained` bytes meanwhile and `used` are dirty now.
/// Up by at most [`LIMIT_GROWTH_PER_SECOND`]. Down by half of what
/// drained, and at once to that half above what is dirty: a limit that
/// fell below the dirty memory at once would leave every writer waiting
/// until writeback had drained the difference (seconds on an HDD), where
/// this way writers keep half the writeback rate while dirty memory
/// falls.
fn next_limit(limit: u64, target: u64, elapsed: Duration, drained: u64, used: u64) -> u64 {
    if target >= limit {
        let ceiling = limit as f64 * LIMIT_GROWTH_PER_SECOND.powf(elapsed.as_secs_f64());
        return target.min(ceiling as u64);
    }
    let half = drained / 2;
    target.max((used + half).min(limit.saturating_sub(half)))
}

/// The pause for a write of `bytes` when `used` of `limit` is dirty and
/// writeback runs at `rate` bytes/s. None below half the limit; above,
/// it grows with the fill f (0 to 1 over the upper half) as
/// `bytes / rate * f / (1 - f)`: at f = 1/2 writers are paced at the
/// writeback rate, and the pause rises steeply, but continuously, to
/// `PAUSE_MAX` near the limit.
pub fn pause_for(used: u64, limit: u64, bytes: u64, rate: f64) -> Duration {
    let from = limit as f64 * PAUSE_FROM;
    if (used as f64) <= from || limit == 0 {
        return Duration::ZERO;
    }
    let fill = ((used as f64 - from) / (limit as f64 - from)).min(0.999);
    let seconds = bytes as f64 / rate.max(1.0) * fill / (1.0 - fill);
    Duration::from_secs_f64(seconds).min(PAUSE_MAX)
}

/// The machine's memory in bytes.
pub fn ram_bytes() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page <= 0 {
        return 1 << 30;
    }
    pages as u64 * page as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_volume_leaving_headroom_keeps_out_of_it_but_a_write_larger_than_the_rest_still_fits() {
        let budget = DirtyBudget::new(Some(8 << 20));
        let held = budget.charge(6 << 20);
        let volume = 7;
        assert!(budget.fits_for(3 << 19, volume));
        budget.set_leaves_headroom(Some(volume));
        assert!(
            !budget.fits_for(3 << 19, volume),
            "7.5 MiB is past 7/8 of 8 MiB"
        );
        assert!(
            budget.fits_for(3 << 19, volume + 1),
            "another volume has the whole budget"
        );
        drop(held);
        assert!(
            budget.fits_for(15 << 19, volume),
            "7.5 MiB never fits under 7 MiB: it gets the whole budget"
        );
        budget.set_leaves_headroom(None);
        assert!(budget.fits_for(8 << 20, volume));
    }

    #[test]
    fn no_pause_below_half_and_a_rising_continuous_pause_above() {
        let limit = 100 << 20;
        let rate = 100e6;
        assert_eq!(pause_for(limit / 2, limit, 1 << 20, rate), Duration::ZERO);
        let mut last = Duration::ZERO;
        for percent in 51..100 {
            let pause = pause_for(limit * percent / 100, limit, 1 << 20, rate);
            assert!(pause >= last, "pause falls at {percent}%");
            // Continuous: no step bigger than 20 ms per 1% of fill.
            assert!(
                pause - last <= Duration::from_millis(20),
                "step at {percent}%"
            );
            last = pause;
        }
        assert_eq!(last, PAUSE_MAX);
        // At three quarters a writer is paced at the writeback rate.
        let at_pace = pause_for(limit * 3 / 4, limit, 1 << 20, rate);
        let per_write = Duration::from_secs_f64((1 << 20) as f64 / rate);
        assert!(at_pace.abs_diff(per_write) < Duration::from_micros(100));
    }

    #[test]
    fn charges_are_released_on_drop_and_the_limit_follows_the_rate() {
        let budget = DirtyBudget::new(None);
        let charge = budget.charge(4096);
        assert_eq!(budget.used_bytes(), 4096);
        drop(charge);
        assert_eq!(budget.used_bytes(), 0);
        for _ in 0..40 {
            budget.record_rate(500 << 20, Duration::from_secs(1), Duration::from_secs(1));
        }
        let limit = budget.limit_bytes();
        let expected = (500u64 << 20).min(budget.ram_cap);
        assert!(limit.abs_diff(expected) < expected / 100, "{limit}");
        let fixed = DirtyBudget::new(Some(8 << 20));
        fixed.record_rate(500 << 20, Duration::from_secs(1), Duration::from_secs(1));
        assert_eq!(fixed.limit_bytes(), 8 << 20);
    }

    #[test]
    fn writers_are_paced_past_half_the_limit_or_while_one_waits() {
        let budget = DirtyBudget::new(Some(8 << 20));
        let half = budget.charge(4 << 20);
        assert!(!budget.pacing(), "at half the limit no reply is paused");
        let more = budget.charge(4096);
        assert!(budget.pacing(), "past half, replies are paused");
        drop((half, more));
        assert!(!budget.pacing());
        assert!(matches!(budget.admit(16 << 20), Admission::Through));
        let full = budget.charge(8 << 20);
        assert!(matches!(budget.admit(4096), Admission::Wait));
        drop(full);
        assert!(budget.pacing(), "a write waits for room");
        budget.admitted();
        assert!(!budget.pacing());
    }

    #[test]
    fn a_drive_cache_filling_at_interface_speed_does_not_raise_the_limit_far() {
        // Four 100 ms ticks at 72 MB/s while a drive's write cache fills,
        // then the media's 1 MB/s.
        let budget = DirtyBudget::new(None);
        let tick = Duration::from_millis(100);
        let mut highest = 0;
        for _ in 0..4 {
            budget.record_rate(7_200_000, tick, tick);
            highest = highest.max(budget.limit_bytes());
        }
        assert!(
            highest < 24 << 20,
            "the burst raised the limit to {highest}"
        );
        for _ in 0..20 {
            budget.record_rate(100_000, tick, tick);
        }
        // Nothing is dirty here, so the limit falls at once.
        assert_eq!(budget.limit_bytes(), LIMIT_FLOOR_BYTES);
        assert!(budget.rate_bytes_per_second() < 2e6);
        // A sustained fast device still reaches its second of writeback.
        for _ in 0..100 {
            budget.record_rate(15_000_000, tick, tick);
        }
        let limit = budget.limit_bytes();
        assert!(limit.abs_diff(150_000_000) < 1_500_000, "{limit}");
    }

    #[test]
    fn a_falling_limit_leaves_writers_half_of_what_drains() {
        // The limit rose to 16 MiB and writers filled it; then the device
        // shows 1 MB/s. Each tick writeback drains its 100 KB and waiting
        // writers take whatever room the limit leaves.
        let budget = DirtyBudget::new(None);
        let tick = Duration::from_millis(100);
        for _ in 0..20 {
            budget.record_rate(5_000_000, tick, tick);
        }
        let start = budget.limit_bytes();
        assert!(start >= 12 << 20, "{start}");
        let mut dirty = vec![budget.charge(start)];
        let drained = 100_000;
        let mut ticks_without_room = 0;
        for _ in 0..400 {
            let held = budget.used_bytes() - drained;
            dirty = vec![budget.charge(held)];
            budget.record_rate(drained, tick, tick);
            let room = budget.limit_bytes().saturating_sub(budget.used_bytes());
            if room < drained / 2 {
                ticks_without_room += 1;
            }
            dirty.push(budget.charge(room));
        }
        assert_eq!(ticks_without_room, 0);
        assert_eq!(budget.limit_bytes(), LIMIT_FLOOR_BYTES);
        drop(dirty);
    }
}
