//! Floors of device time for background classes in the adaptive mode.
//! While interactive I/O keeps a device busy, writeback, resilver and
//! scrub each still earn a share of that device's time, and spend it on
//! their own I/Os. Shares are device time, so a floor means the same on a
//! disk and on flash; what an I/O costs comes from measuring the device.
//! See docs/scheduler.md.

use super::estimate::{Ewma, LinearCost};
use super::{ClassActivity, IoClass, CLASSES};
use crate::device::model::Nanos;

/// The classes with a floor, in the order they are served when several
/// have earned an I/O: resilver before scrub, since a pool being
/// resilvered is missing a copy.
pub const FLOORED: [IoClass; 3] = [IoClass::AsyncWrite, IoClass::Resilver, IoClass::Scrub];

/// Writeback's share: half, so that a writer and a reader who both want
/// the whole device split it, and writeback held back by a reader that
/// never pauses still drains the cache at about half its idle rate
/// instead of stopping (the cache's writers would stop with it).
const WRITEBACK_SHARE: f64 = 0.5;
/// A scrub held back by interactive work should still finish within about
/// this many times its idle duration: its share is the device time that
/// moving an eighth of its idle rate costs, as measured.
const SCRUB_SLOWDOWN_MAX: f64 = 8.0;
/// A resilver's bound is tighter (a third of its idle rate), because
/// until it ends the pool is missing a copy.
const RESILVER_SLOWDOWN_MAX: f64 = 3.0;
/// However dear a scrub's or resilver's bytes are beside interactive
/// work, its floor takes at most half the device.
const STREAM_SHARE_MAX: f64 = 0.5;
/// Floors due at once never take more than this share together:
/// interactive work keeps the larger part of the device.
const FLOORS_TOTAL_MAX: f64 = 0.6;
/// A run takes at most this share of an interactive I/O's slack: one
/// that arrives behind it keeps the rest for its own queueing.
const RUN_SLACK_SHARE: f64 = 0.5;
/// The most I/Os in one run, however long the slack.
const RUN_IOS_MAX: u64 = 8;
/// Credit saved while a class waits is capped at a run, or at this many
/// of its I/Os if more: after a long wait it may send a short run back to
/// back, never a long one.
const CREDIT_IOS_MAX: f64 = 4.0;
/// How fast the least cost per byte a class showed drifts up, per I/O:
/// about 10% over a hundred.
const BEST_DRIFT: f64 = 1.001;
/// How far a cheaper sample moves it down.
const BEST_STEP_DOWN: f64 = 0.25;
/// Device time a class took beyond its floor (in the gaps interactive
/// work leaves, or at idle depth) is remembered for up to this long: the
/// floor holds over any second, so a class that has had more than its
/// share lately is not owed more, and one starved after such a spell is
/// owed again within a second. Forgetting it whenever nothing was held
/// back gave a scrub that streamed in a QD1 HDD reader's pauses floor
/// runs on top, and the reader's p99 went from 0.6x zfs's to 1.5x.
const DEBT_WINDOW_NS: f64 = 1e9;

/// What the device has shown, for classes not measured yet and for
/// sizing runs.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Device {
    /// What one background I/O costs (ns).
    pub background_io: Option<f64>,
    /// How much longer than its clean latency an interactive I/O may take
    /// (ns).
    pub slack: Option<f64>,
    /// How many interactive I/Os are in the device.
    pub interactive_active: u32,
    /// The device moves a head and serves one I/O at a time.
    pub rotational: bool,
    /// Interactive latency with no background beside it is being taken
    /// again. On a disk the scrub's and resilver's floors wait meanwhile:
    /// kept in the drive beside every read, their I/Os left no read
    /// clean, the target was never taken again, and background got no
    /// depth beyond the floor for as long as the reader ran (a resilver
    /// beside a 128 KiB QD2 reader on HDD mirrors moved a ninth of its
    /// idle rate instead of a third, and the reader got 0.74x the IOPS).
    /// Writeback's floor goes on: writeback goes by the depth too, beside
    /// interactive I/O, and with the target taken again an open-loop HDD
    /// reader beside a 1 MiB writer had a p99 of 27x its idle one
    /// instead of 7.8x.
    pub measuring_clean: bool,
}

fn floored(class: IoClass) -> bool {
    FLOORED.contains(&class)
}

/// Whether a class's I/Os follow one another on the device (a scrub or
/// resilver reads each device in LBA order), so that a run of them pays
/// the fixed cost once. Writeback's runs are wherever the writers wrote.
pub(super) fn streams(class: IoClass) -> bool {
    matches!(class, IoClass::Resilver | IoClass::Scrub)
}

/// Whether `class` counts against the other floors' total: it has I/O
/// waiting for its floor, or on a disk, any I/O in the drive, which holds
/// the one head meanwhile. On flash a class with nothing queued waits for
/// nothing: counting writeback's lone write at its whole share cut a
/// resilver beside it on SSD mirrors to 0.17 of its idle rate, and left a
/// cached writer's p99 at 2.3 s beside a scrub (1.2 s without it).
fn claims(queued: &[ClassActivity; CLASSES], class: IoClass, device: Device) -> bool {
    queued[class as usize].queued > 0 || device.rotational
}

/// Whether writeback already has what its floor keeps in the device: one
/// I/O, or on flash beside a scrub or resilver, as many bytes as they
/// have there. A flash drive moves the transfers it holds over its link
/// in turn, so one 64 KiB write beside a scrub's 1 MiB reads got a sliver
/// of the link whatever its floor owed it: on SSD mirrors beside a reader
/// and a resilver, writeback moved 2 MB/s and a cached writer at 7 MB/s
/// waited seconds for the dirty budget. A disk serves one I/O at a time,
/// so its floor's device time is already what each class gets, and more
/// writes there each add a seek. Beside readers alone it stays one I/O:
/// more in flight put a 64 KiB QD4 reader's p99 at 59x its idle one on
/// flash instead of 10x.
fn writeback_has_its_place(queued: &[ClassActivity; CLASSES], device: Device) -> bool {
    let writeback = queued[IoClass::AsyncWrite as usize];
    let streaming_bytes: u64 = if device.rotational {
        0
    } else {
        FLOORED
            .iter()
            .filter(|c| streams(**c))
            .map(|c| queued[*c as usize].active_bytes)
            .sum()
    };
    writeback.active > 0 && writeback.active_bytes >= streaming_bytes
}

/// Where an I/O stands in a floor run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RunPosition {
    /// Not sent by the floor.
    Outside = 0,
    /// The first of a run: it pays the fixed cost of getting there.
    First = 1,
    /// A later one, which follows the one before it.
    Next = 2,
    /// Sent with no interactive work present: what the class costs when
    /// it has the device.
    Idle = 3,
}

impl RunPosition {
    pub fn from_bits(bits: u64) -> RunPosition {
        match bits & 3 {
            1 => RunPosition::First,
            2 => RunPosition::Next,
            3 => RunPosition::Idle,
            _ => RunPosition::Outside,
        }
    }
}

/// One class's floor.
#[derive(Clone, Copy, Debug, Default)]
struct ClassFloor {
    /// Device time (ns) earned and not spent; below zero, time spent
    /// beyond the floor by I/Os something else let go.
    credit: f64,
    /// Held back beside interactive work: credit accrues.
    accruing: bool,
    /// What one of its I/Os of a given length costs the device.
    cost: LinearCost,
    /// The length of its I/Os: what the floor saves for. A scrub's or
    /// resilver's longest (the rest are pieces of those; the floor sends
    /// whole ones), writeback's last.
    length: u64,
    /// I/Os left in the run being sent.
    run_left: u64,
    /// What the I/Os in the device were charged at issue (ns), and how
    /// many there are: each completion trades its share of that for the
    /// device time it took.
    pending_charge: f64,
    pending_ios: u64,
    /// Device time (ns) of the first I/O of a floor run and of each one
    /// after it: what sizes runs.
    first_time: Ewma,
    next_time: Ewma,
    /// Device time per byte (ns) of its I/Os sent with the device to
    /// itself.
    idle_per_byte: Ewma,
    /// About the least device time per byte (ns) its I/Os took lately,
    /// drifting up slowly: what its bytes cost when the device streams
    /// them, for a class that has never had the device to itself.
    best_per_byte: f64,
}

#[derive(Debug, Default)]
pub(super) struct Floors {
    class: [ClassFloor; CLASSES],
    /// When credit was last counted.
    at: Nanos,
}

impl ClassFloor {
    /// What an I/O of `length` costs (ns): the fitted cost, else what a
    /// background I/O on the device costs.
    fn io_cost(&self, length: u64, device: Device) -> Option<f64> {
        self.cost.cost(length).or(device.background_io)
    }

    /// I/Os in a run of this class, and the run's cost (ns). A scrub's or
    /// resilver's run lasts about half an interactive I/O's slack, so that
    /// one arriving behind it still meets its target, and pays the fixed cost
    /// of getting there (an HDD's seek) once: its I/Os follow one another.
    /// Until a later I/O's time is known, runs are of two where the slack
    /// has room for more than one, to measure it.
    fn run(&self, class: IoClass, device: Device) -> Option<(u64, f64)> {
        let one = self.io_cost(self.length, device)?;
        if !streams(class) {
            return Some((1, one));
        }
        let first = self.first_time.get().unwrap_or(one);
        let Some(slack) = device
            .slack
            .map(|slack| slack * RUN_SLACK_SHARE)
            .filter(|slack| *slack > first)
        else {
            return Some((1, first));
        };
        let Some(next) = self.next_time.get().filter(|next| *next > 0.0) else {
            return Some((2, 2.0 * first));
        };
        let ios = (1 + ((slack - first) / next).floor() as u64).min(RUN_IOS_MAX);
        Some((ios, first + next * (ios - 1) as f64))
    }

    /// The share of device time the class is guaranteed while held back.
    /// A scrub's or resilver's is what a run costs per byte over what a
    /// byte costs with the device to itself, over its slowdown bound: on
    /// flash about the bound's inverse, on a disk, where each run pays a
    /// seek, more.
    fn share(&self, class: IoClass, device: Device) -> f64 {
        let slowdown = match class {
            IoClass::AsyncWrite => return WRITEBACK_SHARE,
            IoClass::Resilver => RESILVER_SLOWDOWN_MAX,
            IoClass::Scrub => SCRUB_SLOWDOWN_MAX,
            _ => return 0.0,
        };
        let base = 1.0 / slowdown;
        if self.length == 0 {
            return base;
        }
        // Until the class has had the device to itself, its cheapest
        // recent bytes stand for what it costs then.
        let idle = self
            .idle_per_byte
            .get()
            .or((self.best_per_byte > 0.0).then_some(self.best_per_byte));
        let (Some(idle), Some((ios, cost))) = (idle, self.run(class, device)) else {
            return base;
        };
        if idle <= 0.0 {
            return base;
        }
        let run_per_byte = cost / (ios * self.length) as f64;
        (base * run_per_byte / idle).clamp(base, STREAM_SHARE_MAX)
    }

    fn credit_max(&self, class: IoClass, device: Device) -> Option<f64> {
        let one = self.io_cost(self.length, device)?;
        let (_, run) = self.run(class, device)?;
        Some(run.max(one * CREDIT_IOS_MAX))
    }
}

impl Floors {
    /// Count the credit each class earned since the last call: its share
    /// of the time it spent backlogged beside interactive work.
    pub fn accrue(
        &mut self,
        queued: &[ClassActivity; CLASSES],
        interactive_present: bool,
        now: Nanos,
        device: Device,
    ) {
        let elapsed = now.saturating_sub(self.at) as f64;
        self.at = now;
        for class in FLOORED {
            let floor = &mut self.class[class as usize];
            let activity = queued[class as usize];
            floor.accruing = interactive_present && (activity.queued > 0 || activity.active > 0);
        }
        let shares = FLOORED.map(|c| self.class[c as usize].share(c, device));
        let total: f64 = FLOORED
            .iter()
            .zip(shares)
            .filter(|(c, _)| self.class[**c as usize].accruing && claims(queued, **c, device))
            .map(|(_, share)| share)
            .sum();
        let scale = if total > FLOORS_TOTAL_MAX {
            FLOORS_TOTAL_MAX / total
        } else {
            1.0
        };
        for (class, share) in FLOORED.into_iter().zip(shares) {
            let floor = &mut self.class[class as usize];
            let Some(max) = floor.credit_max(class, device) else {
                continue;
            };
            if floor.accruing {
                floor.credit = (floor.credit + elapsed * share * scale).min(max);
            } else {
                // Nothing held back: saved credit is not owed.
                floor.credit = floor.credit.min(0.0);
            }
            floor.credit = floor.credit.max(-share * DEBT_WINDOW_NS);
        }
    }

    /// The floored class that may send an I/O now: one in a run; on a
    /// disk with interactive I/O in it, one still owed device time with
    /// fewer of its I/Os there than its presence allows; else one whose
    /// credit pays for a whole run.
    pub fn due(&mut self, queued: &[ClassActivity; CLASSES], device: Device) -> Option<IoClass> {
        let serial_wait = device.rotational && device.interactive_active > 0;
        for class in FLOORED {
            let activity = queued[class as usize];
            let floor = &mut self.class[class as usize];
            if activity.queued == 0 {
                // A run is what was there to send at once: I/Os that
                // arrive later would each reach a drive already at their
                // place, which serves them ahead of waiting reads (an
                // HDD reader at QD2 waited 60-80 ms behind such a
                // trickle).
                floor.run_left = 0;
                continue;
            }
            if floor.run_left > 0 {
                return Some(class);
            }
            if device.rotational && device.measuring_clean && streams(class) {
                continue;
            }
            // On a disk with reads waiting, the class keeps a few I/Os in
            // the drive while its floor is owed, which the drive serves
            // when their place is the cheapest to reach (as zfs keeps a
            // scrub I/O in the device): one beside one or two reads, more
            // beside more, since those already wait for one another. Runs
            // sent as credit came back instead kept an HDD reader at QD2
            // waiting behind one after another (p99 1.3x zfs's in the
            // simulator); one at most left a scrub beside a QD8 reader at
            // 7% of its idle rate.
            let presence = (device.interactive_active / 2).max(1);
            let writeback_full = !streams(class) && writeback_has_its_place(queued, device);
            if writeback_full || (serial_wait && activity.active >= presence) {
                continue;
            }
            if serial_wait && floor.credit > 0.0 {
                floor.run_left = 1;
                return Some(class);
            }
            if let Some((ios, cost)) = floor.run(class, device) {
                if floor.credit >= cost {
                    floor.run_left = ios;
                    return Some(class);
                }
            }
        }
        None
    }

    /// An I/O of `class` went to the device, by the floor or otherwise: it
    /// spends its cost, so the floor is a share of device time however
    /// the rest of the queue sends it. A scrub's or resilver's I/Os follow
    /// one another, so only the first of a floor run pays the fixed cost
    /// as well as its bytes: charging it to every piece the queue cut a
    /// read into counted a 1 MiB read as 16 seeks, and the floor never
    /// came due beside an HDD reader at QD4.
    pub fn issued(
        &mut self,
        class: IoClass,
        length: u64,
        device: Device,
        interactive_present: bool,
    ) -> RunPosition {
        if !floored(class) {
            return RunPosition::Outside;
        }
        let floor = &mut self.class[class as usize];
        if streams(class) {
            floor.length = floor.length.max(length);
        } else if length > 0 {
            floor.length = length;
        }
        let position = match floor.run(class, device) {
            Some((ios, _)) if floor.run_left >= ios => RunPosition::First,
            _ if floor.run_left > 0 => RunPosition::Next,
            _ if !interactive_present => RunPosition::Idle,
            _ => RunPosition::Outside,
        };
        let estimate = match position {
            RunPosition::Next => floor.next_time.get(),
            RunPosition::First => floor.first_time.get(),
            RunPosition::Outside | RunPosition::Idle => None,
        };
        let cost = estimate
            .or_else(|| floor.io_cost(length, device))
            .unwrap_or(0.0);
        floor.credit -= cost;
        floor.pending_charge += cost;
        floor.pending_ios += 1;
        floor.run_left = floor.run_left.saturating_sub(1);
        position
    }

    /// An I/O of `class` took `device_time` (ns) of the device: from the
    /// device's previous completion, or from its issue if later, to its
    /// own completion. It was charged an estimate at issue; the floor
    /// keeps what the device really spent, so that a fitted cost that
    /// counts seeks into every byte does not starve the class.
    pub fn charge(&mut self, class: IoClass, length: u64, device_time: f64, position: RunPosition) {
        let floor = &mut self.class[class as usize];
        if floor.pending_ios == 0 {
            return;
        }
        if length > 0 && position != RunPosition::Outside {
            let per_byte = device_time / length as f64;
            let best = floor.best_per_byte;
            floor.best_per_byte = if best <= 0.0 {
                per_byte
            } else if per_byte < best {
                // A quarter of the way down: one I/O that finished just
                // after another (and so seems to have cost nothing) must
                // not decide it alone.
                best + BEST_STEP_DOWN * (per_byte - best)
            } else {
                (best * BEST_DRIFT).min(per_byte)
            };
        }
        match position {
            RunPosition::First => floor.first_time.record(device_time),
            RunPosition::Next => floor.next_time.record(device_time),
            RunPosition::Idle if length > 0 => {
                floor.idle_per_byte.record(device_time / length as f64)
            }
            RunPosition::Idle | RunPosition::Outside => {}
        }
        let estimate = floor.pending_charge / floor.pending_ios as f64;
        floor.pending_charge -= estimate;
        floor.pending_ios -= 1;
        floor.credit += estimate - device_time;
    }

    /// What an I/O of `class` and `length` cost the device (ns).
    pub fn completed(&mut self, class: IoClass, length: u64, cost: f64) {
        if floored(class) {
            self.class[class as usize].cost.record(length as f64, cost);
        }
    }

    /// `class`'s floor now: its share of device time and its credit (ns),
    /// for a class with a floor.
    pub fn report(&self, class: IoClass, device: Device) -> Option<(f64, f64)> {
        floored(class).then(|| {
            let floor = &self.class[class as usize];
            (floor.share(class, device), floor.credit)
        })
    }

    /// The fitted fixed cost and cost per byte of `class`'s I/Os.
    pub fn cost_parts(&self, class: IoClass) -> Option<(f64, f64)> {
        self.class[class as usize].cost.parts()
    }

    /// When, after `now`, the next class's credit pays for its run.
    pub fn next_deadline(&self, now: Nanos, device: Device) -> Option<Nanos> {
        FLOORED
            .iter()
            .filter_map(|class| {
                let floor = &self.class[*class as usize];
                if !floor.accruing {
                    return None;
                }
                let (_, cost) = floor.run(*class, device)?;
                let short = cost - floor.credit;
                let rate = floor.share(*class, device).min(FLOORS_TOTAL_MAX);
                (short > 0.0).then(|| now.saturating_add((short / rate).ceil() as Nanos))
            })
            .min()
    }
}
