//! Sequential streams, recognised per volume from the reads themselves.
//!
//! A read continues a stream when it lands near the stream's frontier (the
//! end of its furthest read), from whichever connection it came: clients
//! spread one stream over several connections and a server completes
//! requests out of order, so reads a little behind the frontier count too
//! (Linux's context readahead has the same idea: the stream is what was
//! read, not who read it). A stream's second read confirms it; from then
//! on it reads the next window each time the reader gets halfway into
//! what was read ahead. The volume's streams grow toward one window, for
//! as long as doubling pays: the streams' combined rate over each window
//! is measured against the window before, and after two windows that
//! brought less than `GROWTH_GAIN_MIN` more, it goes back to the window
//! before the last doubling (unless that paid after all) and settles. A
//! disk that seeks between streams keeps gaining until each window's
//! transfer outweighs its seek; a drive that serves the streams as fast
//! at any window stops early. More established streams than when it
//! settled, or a second gone by, make it try larger again; a second with
//! no stream reading starts it over. The memory the caller gives is
//! shared among the streams reading, and one stream takes less of it
//! while other reads arrive (on flash, none). A stream that reaches
//! read-ahead data evicted before it got there has its window halved and
//! stops the growth; a stream whose reader stopped leaves its data to go
//! first. Windows are whole requests of the stream's size.
//! A client that keeps several reads of a stream in flight gets read-ahead
//! only while a trial shows it pays (`deep`).
//!
//! Sans-IO: the caller reports reads and evictions and issues the ranges
//! this returns.

use std::collections::{BTreeMap, VecDeque};

use super::deep::{DeepTrial, TrialPace};
use crate::sched::LinearCost;

/// Streams tracked at once per volume; the least recently read goes.
const STREAMS_MAX: usize = 64;
/// How far behind its frontier a read may land and still continue the
/// stream, in requests of its size: requests spread over connections
/// reach the volume in any order within about the clients' queue depth.
const REORDER_REQUESTS: u64 = 32;
/// How far past its frontier a read may start, in requests of its size: a
/// reader that skips a request or two is still streaming.
const GAP_REQUESTS: u64 = 2;
/// Reads in a row, each right at the end of the one before, that confirm
/// a stream while read-ahead pays on the volume.
const CONFIRM_READS_FIRST: u64 = 2;
/// Confirmation doubles, up to `CONFIRM_READS_FIRST << CONFIRM_SHIFT_MAX`
/// reads, each time a stream's first window goes unread: random reads
/// confined to part of a volume land next to one of the tracked reads by
/// chance more often than the volume's size says (`confirm_reads_for`).
const CONFIRM_SHIFT_MAX: u32 = 3;
/// At most this share of random reads confirms a stream by landing side
/// by side with others by chance (each such stream reads a first window
/// of four requests), judged from how likely that is for reads of the
/// size seen: each tracked read offers `TIGHT_SLOTS` requests that
/// continue it.
const CHANCE_CONFIRMED_MAX: f64 = 0.001;
const TIGHT_SLOTS: f64 = (1 + 1 + GAP_REQUESTS + 1) as f64;
/// Confirmation halves again after this long with no window unread.
const CONFIRM_RELAX_NS: u64 = 10 * ACTIVE_NS;
/// A first window is judged unread once its stream has not read for this
/// many of its own intervals between reads (within `UNREAD_WAIT_MIN_NS`
/// and `ACTIVE_NS`): a reader that wants it comes back at its own pace.
const UNREAD_INTERVALS: u64 = 4;
const UNREAD_WAIT_MIN_NS: u64 = ACTIVE_NS / 100;
/// After this many reads since its confirmation, a stream whose frontier
/// moved on by more than `RUNAWAY_REQUESTS_PER_READ` requests per read is
/// not a reader's (one that skips `GAP_REQUESTS` at every read moves 3).
const RUNAWAY_READS: u64 = 4;
const RUNAWAY_REQUESTS_PER_READ: u64 = GAP_REQUESTS + 2;
/// A confirmed stream's first window, in requests of its size.
pub const FIRST_WINDOW_REQUESTS: u64 = 4;
/// A window keeps doubling while the stream's rate over a window grew by
/// at least this factor with the last doubling.
const GROWTH_GAIN_MIN: f64 = 1.1;
/// A doubling that brought at least this factor is followed by a
/// quadrupling.
const FAST_GROWTH_GAIN: f64 = 1.5;
/// A stream read within this long counts as reading when the memory for
/// windows is shared out.
const ACTIVE_NS: u64 = 1_000_000_000;
/// While reads that belong to no stream arrive, one stream's window is at
/// most this share of the memory: on a disk a window is one device read,
/// and a random reader beside the stream waits for it whole (beside one
/// 64 KiB QD1 stream on the HDD model, a 4 KiB QD1 random reader's p99
/// went from 112 to 345 ms when the stream's window could take a quarter
/// instead). Other streams gain from large windows as much as they wait.
const STREAM_MEMORY_SHARE_BESIDE_OTHERS: u64 = 8;
/// On a disk beside others' reads, a window may take the disk for at most
/// this share of the time between those reads: each of them then waits
/// for at most that much read-ahead. With an eighth of the memory a
/// 4 KiB QD1 random reader beside a 64 KiB stream on the HDD model got
/// 10 reads a second (27 with readahead off), and beside a reader of 20
/// random reads a second its p99 went from 43 to 273 ms. With a quarter
/// of the gap: 25 reads a second while the stream reads 25 MB/s (1.8
/// without readahead), and a p99 of 56 ms beside 20 reads a second.
const WINDOW_SHARE_OF_OTHERS_GAP: f64 = 0.25;
/// Reads that continued no stream within `ACTIVE_NS` that make "others
/// reading": fewer are streams starting.
const OTHER_READS: usize = 4;
/// Reads that make a stream established: more established streams than
/// when the volume's window settled make it grow again.
const ESTABLISHED_READS: u64 = 16;
/// Reads in a row with no other of the stream in flight before a client
/// that kept several in flight counts as reading one at a time again: one
/// that sends its reads in batches has a single one in flight between
/// batches now and then, and is still deep. A deep client's read-ahead is
/// decided by trial (`DeepTrial`).
const DEEP_CLIENT_READS: u64 = 64;
/// A deep client's windows are at least this many times the reads it
/// keeps in flight.
const DEEP_WINDOW_DEPTHS: u64 = 2;
// Reads answered from data already held do not count toward those: each
// is answered before the next request of a batch is read, so a deep
// client looks like a QD1 one while it reads through held data (a 1 MiB
// QD8 reader passing another reader's read-ahead planned windows doubling
// from 4 to 129 MiB within a millisecond, then waited behind them).
/// A settled window is tried larger again after this long: the streams
/// and the device's other work change, and a window settled on rates
/// that no longer hold (readers gone, or readers that found their data
/// already held) would otherwise stay for good.
const SETTLED_RETRY_NS: u64 = ACTIVE_NS;

/// A range to read ahead for `stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub stream: u64,
    pub start: u64,
    pub end: u64,
    /// Nothing is read ahead of the reader: its next read waits for the
    /// start of this range.
    pub urgent: bool,
    /// For a client that keeps several reads of the stream in flight:
    /// the range stands for reads it would have sent itself, and it waits
    /// for the whole of it.
    pub deep: bool,
    /// Others read the volume at random meanwhile: the window is bounded
    /// by the time between their reads.
    pub beside_others: bool,
}

#[derive(Debug)]
struct Stream {
    id: u64,
    /// End of the furthest read.
    frontier: u64,
    /// Reads that continued it, the first included.
    reads: u64,
    /// Bytes to keep read ahead of the frontier; 0 until confirmed.
    window: u64,
    /// Read ahead (or requested) up to here.
    ahead_end: u64,
    last_read: u64,
    last_read_ns: u64,
    first_read_ns: u64,
    /// The stream's client reads not yet answered.
    outstanding: u32,
    /// Its client kept several reads in flight lately: until this many
    /// reads, read-ahead goes by `deep`'s trial.
    deep_until_reads: u64,
    deep: Option<DeepTrial>,
    /// Where its earliest read-ahead data dropped unread began: reaching
    /// it shows the window outgrew the memory (thrashing).
    evicted_from: Option<u64>,
    /// Reads of it came in a row, each right at the end of the one
    /// before, as many times as the volume asked when they did.
    confirmed: bool,
    /// Its reads and frontier when it was confirmed.
    confirmed_with: (u64, u64),
    /// Its first window (range, and when it was planned), until a read
    /// lands in it: if none does, the stream was chance adjacency.
    first_window_unread: Option<(u64, u64, u64)>,
}

/// The window every stream of the volume grows toward, judged by what the
/// streams read together: a stream judged alone gains whenever its window
/// outgrows another's (it takes the other's share of the device), so each
/// would grow at the other's cost and the first to stop would be left the
/// smaller share.
#[derive(Debug, Default)]
struct Growth {
    window: u64,
    /// When the window last changed size, and the streams' bytes then.
    measured_since: Option<(u64, u64)>,
    /// The rate (bytes/ns) the streams showed over the last window judged.
    rate_before: Option<f64>,
    /// The window before the last doubling and the rate it last showed:
    /// where the growth goes back to unless the doubling paid.
    previous: Option<(u64, f64)>,
    /// The last window brought no gain; one more such and it settles.
    held_once: bool,
    /// Doubling stopped paying.
    settled: bool,
    /// Established streams when it settled; `u64::MAX` once read-ahead
    /// was evicted unread: memory, not the streams, stopped it then.
    settled_with: u64,
    /// When it settled: it is tried larger again `SETTLED_RETRY_NS` later.
    settled_at_ns: u64,
}

impl Growth {
    /// A stream planned a window: double the window if the last doubling
    /// paid. Each window's rate is compared with the one judged before it,
    /// not with the best ever seen: a window that found its data already
    /// held (read ahead for an earlier reader) reads far faster than the
    /// device, and measured against that nothing would ever pay again. A
    /// window that brought no gain is measured once more before the growth
    /// settles, so that one slow window (the device busy with another
    /// stream's start) does not stop it. `advanced` counts the bytes the
    /// streams have read so far, `established` the streams reading that
    /// have lasted: more of them than when it settled reopen it, since the
    /// window that pays grows with the streams a disk seeks between, and
    /// so does time (`SETTLED_RETRY_NS`), unless memory stopped it.
    fn on_plan(
        &mut self,
        advanced: u64,
        established: u64,
        reading: u64,
        window_max: u64,
        now_ns: u64,
    ) {
        let retry = self.settled_with != u64::MAX
            && now_ns.saturating_sub(self.settled_at_ns) >= SETTLED_RETRY_NS;
        if self.settled && (established > self.settled_with || retry) {
            self.settled = false;
            self.held_once = false;
            self.rate_before = None;
            self.previous = None;
            self.measured_since = Some((now_ns, advanced));
        }
        if self.settled {
            return;
        }
        let Some((since, advanced_then)) = self.measured_since else {
            self.measured_since = Some((now_ns, advanced));
            self.window = (self.window * 2).min(window_max);
            return;
        };
        // Judge once each of the `reading` streams has read about half a
        // window: each device read is about half a window, so that is one
        // read of each and the seeks between them. Judged sooner, with
        // many streams, the rate hung on which of them happened to read
        // (eight 256 KiB QD1 streams on a fast HDD model settled at 4 MiB
        // and read 96 MB/s; judged over a round, 127).
        let judged_after = self.window * reading.max(2) / 2;
        if advanced - advanced_then < judged_after || now_ns <= since {
            return;
        }
        let rate = (advanced - advanced_then) as f64 / (now_ns - since) as f64;
        self.measured_since = Some((now_ns, advanced));
        let before = self.rate_before.replace(rate).unwrap_or(0.0);
        if rate < before * GROWTH_GAIN_MIN {
            if self.held_once {
                // Back to the window before the last doubling unless the
                // doubling paid after all (so that retries do not drift
                // upward): on a disk that streams by itself, a larger one
                // only made each read wait longer for all of its bytes.
                if let Some((window, previous_rate)) = self.previous {
                    if rate < previous_rate * GROWTH_GAIN_MIN {
                        self.window = window.min(window_max);
                    }
                }
                self.settled = true;
                self.settled_with = established;
                self.settled_at_ns = now_ns;
            }
            self.held_once = true;
            return;
        }
        self.held_once = false;
        // A doubling that paid nearly in proportion says each window's
        // fixed cost (a seek) still dominates: grow by four, as Linux
        // ramps a small window, so the streams spend less of their time
        // at sizes that cannot pay.
        let factor = if before > 0.0 && rate >= before * FAST_GROWTH_GAIN {
            4
        } else {
            2
        };
        self.previous = Some((self.window, rate));
        self.window = (self.window * factor).min(window_max);
    }
}

impl Stream {
    /// Not a stream after all: it reads nothing ahead until reads in a
    /// row confirm it again.
    fn forget_confirmation(&mut self) {
        self.first_window_unread = None;
        self.confirmed = false;
        self.reads = 1;
        self.window = 0;
        self.ahead_end = self.frontier;
    }

    fn continued_by(&self, offset: u64, length: u64) -> bool {
        // Until reads in a row confirm it, a stream is continued only
        // right at its end: random reads landing near one of the streams
        // tracked must not start read-ahead. Once confirmed, reads that
        // arrive early or late by up to a client's queue of requests
        // still belong to it.
        let (behind, ahead) = if !self.confirmed {
            (length, GAP_REQUESTS * length)
        } else {
            let reorder = (REORDER_REQUESTS * length).max(self.window);
            (reorder, reorder)
        };
        offset <= self.frontier + ahead && offset + length >= self.frontier.saturating_sub(behind)
    }
}

#[derive(Debug, Default)]
pub struct Streams {
    /// The device seeks (a disk): read-ahead beside other readers saves
    /// the stream its seeks. On flash it would only take the others'
    /// device time: see `on_read`.
    seeking: bool,
    streams: Vec<Stream>,
    growth: Growth,
    /// Bytes the streams that read ahead have moved their frontiers by.
    advanced: u64,
    /// When the last `OTHER_READS` reads that continued no stream came.
    other_reads_ns: VecDeque<u64>,
    /// Streams are confirmed by `CONFIRM_READS_FIRST << confirm_shift`
    /// reads in a row.
    confirm_shift: u32,
    /// When a first window last went unread.
    unread_at_ns: u64,
    /// What a window costs the device by its length (ns), from the
    /// windows served: its cost per byte is the rate a window streams at,
    /// without the seek before it. Measured on a disk only, where a
    /// stream's windows go one at a time.
    window_cost: LinearCost,
    /// What deep streams' trials learned, by the power of two their
    /// reads' length falls in (at most 64 entries).
    trial_paces: BTreeMap<u32, TrialPace>,
    reads: u64,
    next_id: u64,
}

impl Streams {
    /// Streams on a device that seeks (`seeking`) or on flash.
    pub fn new(seeking: bool) -> Streams {
        Streams {
            seeking,
            ..Streams::default()
        }
    }

    /// A read of `length` bytes at `offset`, at `now_ns`: the stream it
    /// belongs to (the caller reports it [`answered`](Self::answered)) and
    /// what to read ahead now, if anything. `memory` is what the caller
    /// will hold read ahead for this volume, shared out between the
    /// streams reading now (so two streams on a disk may each read far
    /// enough ahead to outweigh the seeks between them, and many streams
    /// stay within the bound); `align` the block size ranges are rounded
    /// to, `size` the volume's end.
    pub fn on_read(
        &mut self,
        offset: u64,
        length: u64,
        memory: u64,
        align: u64,
        size: u64,
        now_ns: u64,
    ) -> (u64, Option<Plan>) {
        self.reads += 1;
        let now = self.reads;
        self.judge_first_windows(now_ns);
        let recent = |s: &&Stream| now_ns.saturating_sub(s.last_read_ns) < ACTIVE_NS;
        let reading = self
            .streams
            .iter()
            .filter(|s| s.confirmed)
            .filter(recent)
            .count() as u64;
        // The window was judged by the streams that read then: once none
        // has read for a while, whoever streams next is judged afresh. A
        // window settled by other readers says little about the next
        // ones, and it settles early when readers find their data
        // already held.
        if reading == 0 {
            self.growth = Growth::default();
        }
        // Random reads that land next to each other by chance make short
        // streams; a stream that lasted this long is a reader's.
        let established = self
            .streams
            .iter()
            .filter(|s| s.reads >= ESTABLISHED_READS)
            .filter(recent)
            .count() as u64;
        // A stream's first read continues none either: a few such reads
        // are streams starting, more are someone reading elsewhere.
        let others_reading = self.other_reads_ns.len() == OTHER_READS
            && self
                .other_reads_ns
                .front()
                .is_some_and(|at| now_ns.saturating_sub(*at) < ACTIVE_NS);
        // The streams reading share the whole memory: what a stream holds
        // unread never exceeds its window (it reads up to its frontier
        // plus the window), and data already read goes first when room
        // is needed. On a disk each window is one seek between streams,
        // so the larger the windows the less of its time goes to seeks
        // (two 64 KiB QD1 streams on the HDD model read 0.80 of its
        // sequential rate in 5 s with the whole memory, 0.77 with half).
        let mut window_max = memory / reading.max(1);
        // Set while the others' reads bound the window by time: the streams'
        // rate then says nothing about the window that pays, and judged by
        // it the window settled small and stayed so after they stopped (two
        // streams on a served HDD model, after random readers, read 0.04-0.08
        // of its rate instead of about 0.7 in two runs of four).
        let mut bounded_by_others = false;
        if others_reading {
            window_max = window_max.min(memory / STREAM_MEMORY_SHARE_BESIDE_OTHERS);
            if let Some(bytes) = self.window_beside_others() {
                bounded_by_others = bytes < window_max;
                window_max = window_max.min(bytes);
            }
        }
        // Never below a confirmed stream's first window: a stream that
        // reads nothing ahead would never show the device's costs again.
        // Whole requests: a window that ends inside one leaves the read
        // there half in the data held and half in the next read-ahead,
        // so it goes to the device on its own, between the two.
        let window_max = window_max.max(FIRST_WINDOW_REQUESTS * length);
        let window_max = window_max - window_max % length.max(1);
        let end = offset + length;
        let confirm_reads = self.confirm_reads_for(length, size);
        let Some(stream) = self
            .streams
            .iter_mut()
            .filter(|s| s.continued_by(offset, length))
            // A confirmed stream before a lone read that happens to end
            // here (a random reader's, say): that would take the stream's
            // reads and read its window again from the start.
            .min_by_key(|s| (!s.confirmed, s.frontier.abs_diff(offset)))
        else {
            if self.other_reads_ns.len() == OTHER_READS {
                self.other_reads_ns.pop_front();
            }
            self.other_reads_ns.push_back(now_ns);
            return (self.start_stream(end, now, now_ns), None);
        };
        stream.last_read = now;
        stream.last_read_ns = now_ns;
        stream.reads += 1;
        stream.outstanding += 1;
        if stream
            .first_window_unread
            .is_some_and(|(start, end, _)| offset < end && start < offset + length)
        {
            stream.first_window_unread = None;
        }
        if !stream.confirmed && stream.reads >= confirm_reads {
            stream.confirmed = true;
            stream.confirmed_with = (stream.reads, stream.frontier);
            // Its first read continued no stream and was counted as
            // someone reading elsewhere: it was this stream starting.
            if let Some(at) = self
                .other_reads_ns
                .iter()
                .position(|&at| at == stream.first_read_ns)
            {
                self.other_reads_ns.remove(at);
            }
        }
        let id = stream.id;
        // The frontier follows every read, so that a stream read at depth
        // is not left behind where a later reader would take it up.
        let advanced = end.saturating_sub(stream.frontier);
        stream.frontier = stream.frontier.max(end);
        // A reader reads on from where it was, a request at a time (or a
        // few, skipping some): a confirmed stream whose frontier runs
        // ahead faster is random reads landing within its reorder window
        // (4 MiB reads on a 4 GiB volume always find one), each pushing it
        // on and planning a window nobody reads.
        let (reads_then, frontier_then) = stream.confirmed_with;
        let reads_since = stream.reads.saturating_sub(reads_then);
        if stream.confirmed
            && reads_since >= RUNAWAY_READS
            && stream.frontier - frontier_then > RUNAWAY_REQUESTS_PER_READ * length * reads_since
        {
            stream.forget_confirmation();
            self.first_window_went_unread(now_ns);
            return (id, None);
        }
        if stream.evicted_from.is_some_and(|at| end > at) {
            Self::thrashed(&mut self.growth, stream);
        }
        // A client that keeps several reads of the stream in flight drives
        // the device as deep as it likes: read-ahead pays only if its
        // reads are too small for the device, and a trial tells.
        if stream.outstanding > 1 {
            stream.deep_until_reads = stream.reads + DEEP_CLIENT_READS;
        }
        if stream.reads >= stream.deep_until_reads {
            stream.deep = None;
        }
        if !stream.confirmed {
            return (id, None);
        }
        if stream.reads < stream.deep_until_reads {
            let (frontier, ahead_end) = (stream.frontier, stream.ahead_end);
            let streaming_rate = self
                .window_cost
                .parts()
                .and_then(|(_, ns_per_byte)| (ns_per_byte > 0.0).then(|| 1.0 / ns_per_byte));
            let size_class = length.max(1).ilog2();
            let trial_paces = &mut self.trial_paces;
            let trial = stream.deep.get_or_insert_with(|| {
                let pace = trial_paces.get(&size_class).copied().unwrap_or_default();
                DeepTrial::new(frontier, ahead_end, now_ns, pace)
            });
            trial.note_depth(stream.outstanding);
            let reads_ahead = trial.on_read(frontier, ahead_end, now_ns, streaming_rate);
            trial_paces.insert(size_class, trial.pace());
            // On a disk beside other streams it reads ahead whatever the
            // trial says: its windows then take turns with theirs, one at
            // a time each (see the store's gate). Its own reads, sent as
            // they come, would always have one right where the head is,
            // and the drive would serve nothing else until its own age
            // limit (two 64 KiB streams four deep on the HDD model read
            // 22 and 139 MB/s, 80 and 92 taking turns; two 1 MiB ones 175
            // and 34, 85 and 90, with the longest wait 0.9 s instead of
            // 2.4). Beside random reads it does not: its windows would be
            // held to a quarter of their gaps, and read ahead that way it
            // moved 15 MB/s instead of 143 beside a 4 KiB QD1 random
            // reader.
            let takes_turns = self.seeking && reading > 1;
            if !(reads_ahead || takes_turns) {
                return (id, None);
            }
        }
        // A deep client's window covers at least twice the reads it keeps
        // in flight: a smaller one, read one at a time on a disk, makes
        // its reads wait behind each other instead of going beside each
        // other (4 KiB reads sixteen at a time on the HDD model went at
        // 0.4x their rate without read-ahead).
        let first_requests = stream.deep.as_ref().map_or(FIRST_WINDOW_REQUESTS, |trial| {
            FIRST_WINDOW_REQUESTS.max(DEEP_WINDOW_DEPTHS * trial.depth())
        });
        let window_max = window_max.max(first_requests * length);
        // On flash, a stream beside other readers reads only what its
        // client asks for. Read-ahead there gains by keeping more of the
        // drive busy, and that is the others' share: on the SSD model a
        // 64 KiB QD1 random reader beside a 64 KiB QD1 stream fell to a
        // fifth of its rate (a larger read waits for the link behind a
        // whole read-ahead piece), a 4 KiB one lost 6%. On a disk the
        // stream's seeks cost the others more than its read-ahead does.
        if others_reading && !self.seeking {
            return (id, None);
        }
        self.advanced += advanced;
        let first_window = (first_requests * length).min(window_max);
        let target = self.growth.window.clamp(first_window, window_max);
        let urgent = stream.ahead_end <= stream.frontier;
        stream.ahead_end = stream.ahead_end.max(stream.frontier);
        // A stream starts at the first window and doubles with each plan
        // up to the volume's.
        let first = stream.window == 0;
        stream.window = if first {
            first_window
        } else {
            stream.window.min(target)
        };
        // Halfway through what is read ahead: read the next window now.
        if stream.ahead_end - stream.frontier > stream.window / 2 {
            return (id, None);
        }
        let start = stream.ahead_end.next_multiple_of(align).min(size);
        let until = (stream.frontier + stream.window)
            .next_multiple_of(align)
            .min(size);
        if until <= start {
            return (id, None);
        }
        stream.ahead_end = until;
        if first {
            stream.first_window_unread = Some((start, until, now_ns));
        }
        let plan = Plan {
            stream: stream.id,
            start,
            end: until,
            urgent,
            deep: stream.reads < stream.deep_until_reads,
            beside_others: others_reading,
        };
        if self.growth.window == 0 {
            self.growth.window = first_window;
        }
        if !bounded_by_others {
            self.growth
                .on_plan(self.advanced, established, reading, window_max, now_ns);
        }
        let target = self.growth.window.clamp(first_window, window_max);
        stream.window = (stream.window * 2).min(target);
        (id, Some(plan))
    }

    /// Data read ahead for `stream` from `start` on was dropped before
    /// anyone read it. The window shrinks only if the stream then reads
    /// there (see `thrashed`): a stream whose reader stopped left its data
    /// unread, and that says nothing about the streams reading now.
    pub fn evicted(&mut self, stream: u64, start: u64) {
        if let Some(s) = self.streams.iter_mut().find(|s| s.id == stream) {
            s.evicted_from = Some(s.evicted_from.map_or(start, |at| at.min(start)));
        }
    }

    /// The stream read where its read-ahead had been dropped: halve its
    /// window, stop the volume's growth for good (memory, not the device,
    /// limits it now), and read ahead again from the reader.
    fn thrashed(growth: &mut Growth, stream: &mut Stream) {
        stream.evicted_from = None;
        stream.window /= 2;
        stream.ahead_end = stream.frontier;
        growth.window = growth.window.min(stream.window);
        growth.settled = true;
        growth.settled_with = u64::MAX;
    }

    /// The window of the stream that `offset` would continue, for tests and
    /// reports.
    pub fn window_at(&self, offset: u64) -> Option<u64> {
        self.streams
            .iter()
            .find(|s| s.frontier == offset)
            .map(|s| s.window)
    }

    fn stream(&self, id: u64) -> Option<&Stream> {
        self.streams.iter().find(|s| s.id == id)
    }

    /// A window of `bytes` took `ns` in the device, from its sending to
    /// its landing.
    pub fn window_served(&mut self, bytes: u64, ns: u64) {
        if bytes > 0 && ns > 0 {
            self.window_cost.record(bytes as f64, ns as f64);
        }
    }

    /// On a disk, the largest window beside others' reads: what it streams
    /// in `WINDOW_SHARE_OF_OTHERS_GAP` of the time between their reads.
    /// None on flash (where it reads nothing ahead beside others) or
    /// until windows of two sizes have been served.
    fn window_beside_others(&self) -> Option<u64> {
        if !self.seeking || self.other_reads_ns.len() < 2 {
            return None;
        }
        let (_, ns_per_byte) = self.window_cost.parts()?;
        if ns_per_byte <= 0.0 {
            return None;
        }
        let first = *self.other_reads_ns.front()?;
        let last = *self.other_reads_ns.back()?;
        let gap_ns = (last - first) as f64 / (self.other_reads_ns.len() - 1) as f64;
        Some((gap_ns * WINDOW_SHARE_OF_OTHERS_GAP / ns_per_byte) as u64)
    }

    /// Whether `stream` is still tracked and read within the last
    /// `ACTIVE_NS` before `now_ns`.
    pub fn reading(&self, stream: u64, now_ns: u64) -> bool {
        self.stream(stream)
            .is_some_and(|s| now_ns.saturating_sub(s.last_read_ns) < ACTIVE_NS)
    }

    /// The end of `stream`'s furthest read.
    pub fn frontier(&self, stream: u64) -> Option<u64> {
        self.stream(stream).map(|s| s.frontier)
    }

    /// Whether `stream` has read at or after `since_ns`.
    pub fn read_since(&self, stream: u64, since_ns: u64) -> bool {
        self.stream(stream)
            .is_some_and(|s| s.last_read_ns >= since_ns)
    }

    /// What `stream` had planned from `start` on was not read ahead: its
    /// next read plans from there.
    pub fn rewind(&mut self, stream: u64, start: u64) {
        if let Some(s) = self.streams.iter_mut().find(|s| s.id == stream) {
            s.ahead_end = s.ahead_end.min(start).max(s.frontier);
        }
    }

    /// The read `on_read` just gave `stream` is answered from data held
    /// (`own`: read ahead for this stream): it says nothing about how many
    /// reads its client keeps in flight.
    pub fn held_read(&mut self, stream: u64, own: bool) {
        if let Some(s) = self.streams.iter_mut().find(|s| s.id == stream) {
            if s.deep_until_reads >= s.reads {
                s.deep_until_reads += 1;
            }
            if let Some(trial) = &mut s.deep {
                trial.held_read(own);
            }
        }
    }

    /// A client read that `on_read` gave `stream` was answered.
    pub fn answered(&mut self, stream: u64) {
        if let Some(s) = self.streams.iter_mut().find(|s| s.id == stream) {
            s.outstanding = s.outstanding.saturating_sub(1);
        }
    }

    /// Streams whose first window went unread for `ACTIVE_NS` were reads
    /// that landed next to each other by chance: confirm later streams by
    /// more reads. A stream that read into its windows and then stopped
    /// (its reader reached the end) says nothing of the kind.
    fn judge_first_windows(&mut self, now_ns: u64) {
        let mut unread = 0;
        for stream in &mut self.streams {
            let Some((_, _, planned_ns)) = stream.first_window_unread else {
                continue;
            };
            let interval = stream.last_read_ns.saturating_sub(stream.first_read_ns)
                / stream.reads.max(2).saturating_sub(1);
            let wait = (UNREAD_INTERVALS * interval).clamp(UNREAD_WAIT_MIN_NS, ACTIVE_NS);
            if now_ns.saturating_sub(planned_ns) >= wait {
                stream.forget_confirmation();
                unread += 1;
            }
        }
        for _ in 0..unread {
            self.first_window_went_unread(now_ns);
        }
        if unread == 0
            && self.confirm_shift > 0
            && now_ns.saturating_sub(self.unread_at_ns) >= CONFIRM_RELAX_NS
        {
            self.confirm_shift -= 1;
            self.unread_at_ns = now_ns;
        }
    }

    fn first_window_went_unread(&mut self, now_ns: u64) {
        self.confirm_shift = (self.confirm_shift + 1).min(CONFIRM_SHIFT_MAX);
        self.unread_at_ns = now_ns;
    }

    /// Reads in a row that confirm a stream now.
    pub fn confirm_reads(&self) -> u64 {
        CONFIRM_READS_FIRST << self.confirm_shift
    }

    /// Reads in a row that confirm a stream of reads of `length` on a
    /// volume of `size`: at least enough that random reads of that size
    /// chain so far by chance for at most `CHANCE_CONFIRMED_MAX` of them.
    /// A 4 KiB read on 4 GiB lands next to one of the 64 reads tracked
    /// once in 3000 reads; a 4 MiB one, every third.
    fn confirm_reads_for(&self, length: u64, size: u64) -> u64 {
        let chance =
            (STREAMS_MAX as f64 * TIGHT_SLOTS * length as f64 / size.max(1) as f64).min(0.99);
        let by_chance = 1 + (CHANCE_CONFIRMED_MAX.ln() / chance.ln()).ceil().max(1.0) as u64;
        let most = CONFIRM_READS_FIRST << CONFIRM_SHIFT_MAX;
        self.confirm_reads().max(by_chance.min(most))
    }

    fn start_stream(&mut self, frontier: u64, now: u64, now_ns: u64) -> u64 {
        if self.streams.len() >= STREAMS_MAX {
            let oldest = self
                .streams
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| s.last_read)
                .map(|(i, _)| i)
                .expect("streams is full");
            let gone = self.streams.swap_remove(oldest);
            if gone.first_window_unread.is_some() {
                self.first_window_went_unread(now_ns);
            }
        }
        self.next_id += 1;
        self.streams.push(Stream {
            id: self.next_id,
            frontier,
            reads: 1,
            window: 0,
            ahead_end: frontier,
            last_read: now,
            last_read_ns: now_ns,
            first_read_ns: now_ns,
            outstanding: 1,
            evicted_from: None,
            deep_until_reads: 0,
            deep: None,
            confirmed: false,
            confirmed_with: (0, 0),
            first_window_unread: None,
        });
        self.next_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    const KIB: u64 = 1024;
    const MAX: u64 = 1024 * KIB;
    const SIZE: u64 = 1 << 40;

    /// A read at a clock where the stream moves 1 byte per ns, so that
    /// every doubling pays.
    fn read(streams: &mut Streams, offset: u64, length: u64) -> Option<Plan> {
        let (stream, plan) = streams.on_read(offset, length, MAX, 4096, SIZE, offset + length);
        streams.answered(stream);
        plan
    }

    #[test]
    fn streams_after_a_pause_are_judged_afresh() {
        let mut streams = Streams::default();
        let length = 64 * KIB;
        let memory = 1 << 30;
        // A stream whose rate rises with the window grows it far.
        let mut now = 0;
        for i in 0..4000 {
            let window = streams.window_at(i * length).unwrap_or(0).max(length);
            now += length + 10_000_000 * length / window;
            let (stream, _) = streams.on_read(i * length, length, memory, 4096, SIZE, now);
            streams.answered(stream);
        }
        assert!(
            streams.growth.window >= 64 << 20,
            "{}",
            streams.growth.window
        );
        // Two seconds later another stream starts at the first window.
        now += 2 * ACTIVE_NS;
        let base = 8 << 30;
        for i in 0..3 {
            let (stream, _) = streams.on_read(base + i * length, length, memory, 4096, SIZE, now);
            streams.answered(stream);
        }
        assert!(streams.growth.window <= 2 * FIRST_WINDOW_REQUESTS * length);
    }

    #[test]
    fn a_sequential_reader_stays_ahead_within_the_bound() {
        let mut streams = Streams::default();
        let length = 64 * KIB;
        assert_eq!(read(&mut streams, 0, length), None, "one read is no stream");
        let mut ahead = 0;
        let mut sizes = Vec::new();
        for i in 1..200 {
            let offset = i * length;
            if let Some(plan) = read(&mut streams, offset, length) {
                assert!(plan.start >= offset + length, "ahead of the reader");
                assert!(plan.start >= ahead, "never the same range twice");
                assert!(plan.end - (offset + length) <= MAX, "within the bound");
                ahead = plan.end;
                sizes.push(plan.end - plan.start);
            }
            assert!(ahead > offset + length, "the reader never catches up");
        }
        assert_eq!(sizes[0], FIRST_WINDOW_REQUESTS * length);
    }

    #[test]
    fn reads_spread_over_connections_and_reordered_are_one_stream() {
        let mut streams = Streams::default();
        let mut rng = Rng::new(7);
        let length = 64 * KIB;
        let mut planned = 0;
        // Four connections with a request each in flight: every batch of
        // four consecutive reads arrives shuffled.
        for batch in 0..64u64 {
            let mut order: Vec<u64> = (0..4).map(|k| batch * 4 + k).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            for index in order {
                if let Some(plan) = read(&mut streams, index * length, length) {
                    planned += plan.end - plan.start;
                }
            }
        }
        assert_eq!(streams.streams.len(), 1, "one stream");
        assert!(planned >= 200 * length, "read ahead: {planned}");
    }

    #[test]
    fn two_interleaved_streams_each_read_ahead() {
        let mut streams = Streams::default();
        let length = 64 * KIB;
        let second = 1 << 30;
        let mut planned = [0u64; 2];
        for i in 0..100 {
            for (k, base) in [0, second].into_iter().enumerate() {
                // Each stream moves 1 byte per ns, on one clock.
                let now_ns = (2 * i + k as u64 + 1) * length;
                let (stream, plan) =
                    streams.on_read(base + i * length, length, MAX, 4096, SIZE, now_ns);
                streams.answered(stream);
                if let Some(plan) = plan {
                    assert!(plan.start >= base && plan.end <= base + (1 << 29));
                    planned[k] += plan.end - plan.start;
                }
            }
        }
        assert_eq!(streams.streams.len(), 2);
        assert!(planned.iter().all(|p| *p >= 90 * length), "{planned:?}");
    }

    #[test]
    fn beside_random_reads_a_stream_window_stays_within_an_eighth() {
        let memory = 64 << 20;
        let length = 64 * KIB;
        let mut rng = Rng::new(3);
        let mut streams = Streams::new(true);
        let mut now = 0;
        for i in 0..4000 {
            // The stream's rate rises with its window: it keeps doubling.
            let window = streams.window_at(i * length).unwrap_or(length);
            now += length + 10_000_000 * length / window.max(length);
            let (stream, _) = streams.on_read(i * length, length, memory, 4096, SIZE, now);
            streams.answered(stream);
            if i % 8 == 0 {
                let offset = (1 << 30) + rng.below(1 << 18) * 4096;
                let (other, _) = streams.on_read(offset, 4096, memory, 4096, SIZE, now);
                streams.answered(other);
            }
        }
        assert_eq!(streams.window_at(4000 * length), Some(memory / 8));
    }

    #[test]
    fn on_flash_a_stream_reads_ahead_only_while_no_one_else_reads() {
        let length = 64 * KIB;
        let mut rng = Rng::new(5);
        let mut streams = Streams::new(false);
        let mut planned = [0u64; 2];
        for i in 0..2000u64 {
            let now = i * 2_000_000;
            // A random reader beside the stream for the first two seconds.
            let beside = i < 1000;
            if beside {
                let offset = (1 << 30) + rng.below(1 << 18) * 4096;
                let (other, _) = streams.on_read(offset, 4096, MAX, 4096, SIZE, now);
                streams.answered(other);
            }
            let (stream, plan) = streams.on_read(i * length, length, MAX, 4096, SIZE, now);
            streams.answered(stream);
            if let Some(plan) = plan {
                planned[usize::from(!beside)] += plan.end - plan.start;
            }
        }
        // The first plans come before the random reads make "others"
        // (the stream's own first read stops counting once it is
        // confirmed): a few requests of its first 1000 reads.
        assert!(planned[0] <= 12 * length, "{planned:?}");
        // A second after the random reader stops, the stream reads ahead
        // again: about 500 of its reads remain by then.
        assert!(planned[1] >= 400 * length, "{planned:?}");
    }

    #[test]
    fn streams_starting_together_are_not_others_reading() {
        // Each stream's first read continues none, as a random read does;
        // four of them within a second would make "others reading", and
        // on flash no stream would read ahead until a second had passed.
        let length = 64 * KIB;
        let mut streams = Streams::new(false);
        let mut planned = [0u64; 4];
        for i in 0..200u64 {
            for (k, planned) in planned.iter_mut().enumerate() {
                let offset = (k as u64) * (1 << 30) + i * length;
                let now = (i * 4 + k as u64) * 1_000_000;
                let (stream, plan) = streams.on_read(offset, length, MAX, 4096, SIZE, now);
                streams.answered(stream);
                *planned += plan.map_or(0, |p| p.end - p.start);
            }
        }
        assert!(planned.iter().all(|p| *p >= 100 * length), "{planned:?}");
    }

    #[test]
    fn on_a_disk_a_window_beside_others_takes_a_quarter_of_their_gap() {
        let length = 64 * KIB;
        let memory = 1 << 30;
        let mut rng = Rng::new(11);
        let mut streams = Streams::new(true);
        // Windows stream at 4 ns a byte (250 MB/s) after a 10 ms seek.
        for bytes in [1u64 << 20, 8 << 20] {
            streams.window_served(bytes, 10_000_000 + 4 * bytes);
        }
        let mut largest = 0;
        let mut now = 0;
        let mut next_other = 0;
        for i in 0..4000u64 {
            // The stream's rate rises with its window: it keeps doubling.
            let window = streams.window_at(i * length).unwrap_or(length);
            now += 4 * length + 10_000_000 * length / window.max(length);
            // Someone else reads every 40 ms.
            if now >= next_other {
                next_other = now + 40_000_000;
                let offset = (1 << 39) + rng.below(1 << 20) * 4096;
                let (other, _) = streams.on_read(offset, 4096, memory, 4096, SIZE, now);
                streams.answered(other);
            }
            let (stream, plan) = streams.on_read(i * length, length, memory, 4096, SIZE, now);
            streams.answered(stream);
            if let Some(plan) = plan.filter(|_| i >= 400) {
                largest = largest.max(plan.end - plan.start);
            }
        }
        // A quarter of 40 ms at 250 MB/s: 2.5 MB.
        assert!(largest > 0 && largest <= 2_500_000, "{largest}");
        // The same on flash: no cap from the disk's costs.
        let mut flash = Streams::new(false);
        flash.window_served(1 << 20, 1_000_000);
        flash.window_served(8 << 20, 3_000_000);
        assert_eq!(flash.window_beside_others(), None);
    }

    #[test]
    fn random_reads_read_nothing_ahead() {
        let mut streams = Streams::default();
        let mut rng = Rng::new(11);
        let blocks = (64 << 30) / 4096;
        let mut planned = 0;
        for _ in 0..100_000 {
            let offset = rng.below(blocks) * 4096;
            if let Some(plan) = read(&mut streams, offset, 4096) {
                planned += plan.end - plan.start;
            }
        }
        // A chance neighbour among the 64 streams may start one window.
        assert!(planned <= 64 * KIB, "read ahead {planned} bytes");
        assert!(streams.streams.len() <= STREAMS_MAX);
    }

    /// `count` random reads of `length` within the first `region` bytes
    /// of a volume of `volume` bytes, one every 35 ms from `start_ns`:
    /// the bytes planned.
    fn random_reads(
        streams: &mut Streams,
        rng: &mut Rng,
        (region, volume): (u64, u64),
        count: u64,
        length: u64,
        start_ns: u64,
    ) -> u64 {
        let mut planned = 0;
        for i in 0..count {
            let offset = rng.below(region / length) * length;
            let now_ns = start_ns + i * 35_000_000;
            let (stream, plan) = streams.on_read(offset, length, 1 << 30, 4096, volume, now_ns);
            streams.answered(stream);
            planned += plan.map_or(0, |p| p.end - p.start);
        }
        planned
    }

    #[test]
    fn large_random_reads_read_nothing_ahead() {
        // 4 MiB reads on 4 GiB: one in three lands next to one of the 64
        // reads tracked, so streams are confirmed by more reads in a row.
        // On a disk: on flash, random reads beside a stream stop its
        // read-ahead anyway.
        let mut streams = Streams::new(true);
        let mut rng = Rng::new(5);
        let length = 4 << 20;
        let planned = random_reads(&mut streams, &mut rng, (4 << 30, 4 << 30), 2000, length, 0);
        assert!(
            planned <= 2 * 4 * length,
            "read ahead {} MiB",
            planned >> 20
        );
    }

    #[test]
    fn windows_left_unread_make_streams_confirm_by_more_reads() {
        // Random reads within 4 GiB of a 64 TiB volume land side by side
        // far more often than the volume's size says.
        // On a disk: on flash, random reads beside a stream stop its
        // read-ahead anyway.
        let mut streams = Streams::new(true);
        let mut rng = Rng::new(5);
        let length = 4 << 20;
        let area = (4 << 30, 1 << 46);
        assert_eq!(
            streams.confirm_reads_for(length, area.1),
            CONFIRM_READS_FIRST
        );
        let first = random_reads(&mut streams, &mut rng, area, 200, length, 0);
        assert!(streams.confirm_reads() > CONFIRM_READS_FIRST);
        let later = random_reads(&mut streams, &mut rng, area, 2000, length, 200 * 35_000_000);
        assert!(first > 0, "chance neighbours read ahead at first");
        // Per read, a quarter as much after the first 200 reads.
        assert!(
            later / 2000 <= first / 200 / 4,
            "then less: {} MiB in 2000 reads after {} MiB in 200",
            later >> 20,
            first >> 20
        );
    }

    #[test]
    fn a_stream_after_large_random_reads_reads_ahead_once_confirmed() {
        // On a disk: on flash, random reads beside a stream stop its
        // read-ahead anyway.
        let mut streams = Streams::new(true);
        let mut rng = Rng::new(5);
        let length = 4 << 20;
        let volume = 4 << 30;
        random_reads(&mut streams, &mut rng, (volume, volume), 300, length, 0);
        let confirm = streams.confirm_reads_for(length, volume);
        assert!(confirm > CONFIRM_READS_FIRST);
        // Once the random reads are over a second old, the stream is the
        // only reader (on flash it would read nothing ahead beside others).
        let mut now_ns = 300 * 35_000_000 + 2 * ACTIVE_NS;
        let mut planned_at = None;
        for i in 0..64 {
            now_ns += 30_000_000;
            let (stream, plan) = streams.on_read(i * length, length, 1 << 30, 4096, volume, now_ns);
            streams.answered(stream);
            if plan.is_some() && planned_at.is_none() {
                planned_at = Some(i + 1);
            }
        }
        assert_eq!(
            planned_at,
            Some(confirm),
            "read ahead once {confirm} reads confirm it"
        );
    }

    #[test]
    fn read_ahead_dropped_unread_halves_the_window_when_its_reader_gets_there() {
        let mut streams = Streams::default();
        let length = 64 * KIB;
        let mut last = None;
        for i in 0..50 {
            last = read(&mut streams, i * length, length).or(last);
        }
        let plan = last.unwrap();
        let before = streams.window_at(50 * length).unwrap();
        streams.evicted(plan.stream, plan.start);
        assert_eq!(
            streams.window_at(50 * length),
            Some(before),
            "a stream that never reads there again keeps its window"
        );
        let mut again = None;
        for i in 50..plan.start / length + 1 {
            again = read(&mut streams, i * length, length).or(again);
        }
        let at = plan.start / length + 1;
        assert!(streams.window_at(at * length).unwrap() <= before / 2);
        assert!(
            again.is_some_and(|p| p.start < plan.end),
            "the dropped range is read ahead again: {again:?}"
        );
    }

    #[test]
    fn the_window_stops_growing_once_doubling_no_longer_pays() {
        let mut streams = Streams::default();
        let length = 64 * KIB;
        // The device gives the stream the same rate at any window.
        for i in 0..400 {
            let (stream, _) = streams.on_read(i * length, length, 1 << 40, 4096, SIZE, i * 1000);
            streams.answered(stream);
        }
        let window = streams.window_at(400 * length).unwrap();
        assert!(window <= 4 * FIRST_WINDOW_REQUESTS * length, "{window}");
        // One whose rate rises with the window keeps doubling to the bound.
        let mut streams = Streams::default();
        for i in 0..400 {
            let offset = i * length;
            let stream_time = (offset as f64).powf(0.5) as u64 * 1000;
            let (stream, _) = streams.on_read(offset, length, MAX, 4096, SIZE, stream_time);
            streams.answered(stream);
        }
        assert_eq!(
            streams.window_at(400 * length),
            Some(MAX),
            "all the memory, for one stream"
        );
    }

    #[test]
    fn a_window_that_reads_slower_than_a_smaller_one_goes_back_to_it() {
        let mut streams = Streams::default();
        let length = 64 * KIB;
        let fastest = 1024 * KIB;
        let mut now = 0;
        for i in 0..4000 {
            let offset = i * length;
            // Bytes cost least at one window, more at each doubling or
            // halving away from it.
            let window = streams.window_at(offset).unwrap_or(0).max(length);
            let doublings_away = (window.max(fastest) / window.min(fastest)).ilog2();
            now += length * (10 + 5 * u64::from(doublings_away));
            let (stream, _) = streams.on_read(offset, length, 1 << 40, 4096, SIZE, now);
            streams.answered(stream);
        }
        assert_eq!(streams.window_at(4000 * length), Some(fastest));
    }

    /// Two streams read in turn, the second joining after a quarter of the
    /// rounds; the device serves bytes at a rate that rises with the
    /// window (each window pays one fixed cost).
    fn two_streams_on_a_seeking_device(memory: u64, rounds: u64) -> (Streams, [u64; 2]) {
        let mut streams = Streams::new(true);
        let length = 64 * KIB;
        let second = 1 << 30;
        let mut now = 0;
        for i in 0..rounds {
            for base in [0, second] {
                if base == second && i < rounds / 4 {
                    continue;
                }
                let window = streams.window_at(base + i * length).unwrap_or(length);
                // 1 ns per byte, plus a 10 ms seek per window.
                now += length + 10_000_000 * length / window.max(length);
                let offset = base + i * length;
                let (stream, _) = streams.on_read(offset, length, memory, 4096, SIZE, now);
                streams.answered(stream);
            }
        }
        let windows = [0, second].map(|base| streams.window_at(base + rounds * length).unwrap());
        (streams, windows)
    }

    #[test]
    fn streams_on_one_volume_grow_to_the_same_window() {
        // The first grows alone (up to all the memory); the second joins
        // and both end at half of it each.
        let (_, windows) = two_streams_on_a_seeking_device(256 << 20, 4000);
        assert_eq!(windows, [128 << 20; 2]);
    }

    #[test]
    fn a_window_settled_by_one_stream_grows_again_when_two_seek_between_them() {
        let mut streams = Streams::default();
        let length = 64 * KIB;
        let memory = 1 << 30;
        // One stream that reads as fast at any window settles early.
        let mut now = 0;
        for i in 0..2000 {
            now += 10 * length;
            let (stream, _) = streams.on_read(i * length, length, memory, 4096, SIZE, now);
            streams.answered(stream);
        }
        let settled = streams.growth.window;
        assert!(streams.growth.settled && settled <= 4 << 20, "{settled}");
        // Two new streams on a disk, right after: each window pays a 10 ms
        // seek.
        for i in 0..4000 {
            for base in [4 << 30, 8 << 30] {
                let offset = base + i * length;
                let window = streams.window_at(offset).unwrap_or(length);
                now += length + 10_000_000 * length / window.max(length);
                let (stream, _) = streams.on_read(offset, length, memory, 4096, SIZE, now);
                streams.answered(stream);
            }
        }
        assert!(
            streams.growth.window >= 8 * settled,
            "{} after {settled}",
            streams.growth.window
        );
    }

    #[test]
    fn a_lone_read_ending_where_a_stream_reads_does_not_take_it_over() {
        let mut streams = Streams::default();
        let length = 64 * KIB;
        // A random reader's read, by chance just ahead of a stream.
        let (lone, _) = streams.on_read(20 * length, length, MAX, 4096, SIZE, 1);
        streams.answered(lone);
        let mut ids = Vec::new();
        for i in 0..40 {
            let (id, _) = streams.on_read(i * length, length, MAX, 4096, SIZE, 2 + i);
            streams.answered(id);
            ids.push(id);
        }
        assert!(ids.iter().all(|id| *id == ids[0] && *id != lone), "{ids:?}");
    }

    #[test]
    fn streams_reading_at_once_share_the_memory() {
        let memory = 1 << 40;
        let (_, alone) = two_streams_on_a_seeking_device(memory, 4000);
        let memory = 64 << 20;
        let (_, windows) = two_streams_on_a_seeking_device(memory, 4000);
        assert!(alone[0] > memory, "unbounded, they grow further: {alone:?}");
        // The memory shared by two streams.
        assert_eq!(windows, [memory / 2; 2]);
    }

    #[test]
    fn a_client_with_reads_in_flight_is_first_measured_without_read_ahead() {
        let mut streams = Streams::default();
        let length = 1 << 20;
        let mut outstanding = Vec::new();
        for i in 0..64 {
            let (stream, plan) = streams.on_read(i * length, length, MAX, 4096, SIZE, i);
            assert_eq!(plan, None, "read {i} came with eight others in flight");
            outstanding.push(stream);
            if outstanding.len() == 8 {
                streams.answered(outstanding.remove(0));
            }
        }
    }

    /// Reads `count` reads of `length` from `start` with eight in flight,
    /// `ns_per_read` apart from `now`: at which of them windows were
    /// planned.
    fn deep_reads(
        streams: &mut Streams,
        start: u64,
        length: u64,
        count: u64,
        now: &mut u64,
    ) -> Vec<u64> {
        let ns_per_read = 300_000;
        let mut outstanding = Vec::new();
        let mut planned_at = Vec::new();
        for i in 0..count {
            *now += ns_per_read;
            let offset = start + i * length;
            let (stream, plan) = streams.on_read(offset, length, 1 << 40, 4096, SIZE, *now);
            if plan.is_some() {
                planned_at.push(i);
            }
            outstanding.push(stream);
            if outstanding.len() == 8 {
                streams.answered(outstanding.remove(0));
            }
        }
        for stream in outstanding {
            streams.answered(stream);
        }
        planned_at
    }

    #[test]
    fn a_deep_clients_windows_stand_for_its_own_reads_and_a_one_at_a_time_readers_do_not() {
        let mut streams = Streams::default();
        let length = 1 << 20;
        let mut outstanding = Vec::new();
        let deep_plan = (0..1000u64).find_map(|i| {
            let (stream, plan) =
                streams.on_read(i * length, length, 1 << 40, 4096, SIZE, i * 300_000);
            outstanding.push(stream);
            if outstanding.len() == 8 {
                streams.answered(outstanding.remove(0));
            }
            plan
        });
        assert!(deep_plan.expect("a trial reads ahead").deep);
        let mut streams = Streams::default();
        let start = SIZE / 2;
        let one_at_a_time = (0..1000u64).find_map(|i| {
            let (stream, plan) =
                streams.on_read(start + i * length, length, 1 << 40, 4096, SIZE, i * 300_000);
            streams.answered(stream);
            plan
        });
        assert!(!one_at_a_time.expect("a stream reads ahead").deep);
    }

    #[test]
    fn a_deep_client_reading_the_volume_again_does_not_pay_for_the_first_trials_again() {
        let mut streams = Streams::default();
        let length = 1 << 20;
        let mut now = 0;
        // As fast with read-ahead as without: each trial loses, and the
        // stream waits longer before the next.
        let first = deep_reads(&mut streams, 0, length, 10_000, &mut now);
        assert!(
            first.first().is_some_and(|&i| i < 200),
            "first trial at {first:?}"
        );
        // The same client reads the volume again from the start: a new
        // stream, which starts at the pace the first one learned.
        let again = deep_reads(&mut streams, 0, length, 2_000, &mut now);
        assert!(again.is_empty(), "read ahead again at reads {again:?}");
    }

    /// Two clients each keeping eight reads of its own 64 KiB stream in
    /// flight, their reads interleaved, `rounds` reads each: how many
    /// read-aheads were planned.
    fn two_deep_streams(seeking: bool, rounds: u64) -> usize {
        let mut streams = Streams::new(seeking);
        let length = 64 << 10;
        let starts = [0, SIZE / 2];
        let mut outstanding: [Vec<u64>; 2] = Default::default();
        let mut plans = 0;
        for i in 0..rounds {
            for (k, start) in starts.iter().enumerate() {
                let now = (2 * i + k as u64) * 300_000;
                let (stream, plan) =
                    streams.on_read(start + i * length, length, 1 << 30, 4096, SIZE, now);
                plans += usize::from(plan.is_some());
                outstanding[k].push(stream);
                if outstanding[k].len() == 8 {
                    streams.answered(outstanding[k].remove(0));
                }
            }
        }
        plans
    }

    #[test]
    fn on_a_disk_deep_streams_beside_each_other_read_ahead_without_a_trial() {
        // A deep stream's trial first measures it for 64 reads without
        // read-ahead: on flash nothing is planned before then.
        assert_eq!(two_deep_streams(false, 60), 0);
        // On a disk each stream's windows take turns with the other's.
        assert!(two_deep_streams(true, 60) >= 2);
    }

    #[test]
    fn a_client_that_sends_reads_in_batches_is_deep_between_them() {
        let mut streams = Streams::default();
        let length = 1 << 20;
        let mut i = 0;
        // Batches of eight: all sent, then all answered, so the first of
        // each batch finds none of the stream's in flight. Its rate is
        // measured without read-ahead first: nothing is planned then.
        for _ in 0..8 {
            let mut batch = Vec::new();
            for _ in 0..8 {
                let (stream, plan) = streams.on_read(i * length, length, MAX, 4096, SIZE, i);
                assert_eq!(plan, None, "read {i}");
                batch.push(stream);
                i += 1;
            }
            for stream in batch {
                streams.answered(stream);
            }
        }
        // One read at a time from then on: read-ahead comes back.
        let planned = (i..i + DEEP_CLIENT_READS + 2)
            .any(|j| read(&mut streams, j * length, length).is_some());
        assert!(planned);
    }

    #[test]
    fn a_batching_client_reading_through_held_data_gets_no_windows() {
        let mut streams = Streams::default();
        let length = 1 << 20;
        let mut i = 0;
        // One batch the device answers: the stream is seen deep.
        let batch: Vec<u64> = (0..8)
            .map(|_| {
                let (stream, _) = streams.on_read(i * length, length, MAX, 4096, SIZE, i);
                i += 1;
                stream
            })
            .collect();
        for stream in batch {
            streams.answered(stream);
        }
        // Then data already held: each read is answered before the next
        // request of the batch is read, so one is in flight at a time.
        for _ in 0..4 * DEEP_CLIENT_READS {
            let (stream, plan) = streams.on_read(i * length, length, MAX, 4096, SIZE, i);
            assert_eq!(plan, None, "read {i} planned a window");
            streams.held_read(stream, false);
            streams.answered(stream);
            i += 1;
        }
    }

    #[test]
    fn a_stream_read_at_depth_keeps_its_frontier_with_its_reads() {
        let mut streams = Streams::default();
        let length = 1 << 20;
        let mut outstanding = Vec::new();
        for i in 0..64 {
            let (stream, _) = streams.on_read(i * length, length, MAX, 4096, SIZE, i);
            outstanding.push(stream);
            if outstanding.len() == 8 {
                streams.answered(outstanding.remove(0));
            }
        }
        for stream in outstanding {
            streams.answered(stream);
        }
        // A new reader at the start of what was read is a stream of its
        // own, not the deep one's from where it began.
        let (first, _) = streams.on_read(0, 64 << 10, MAX, 4096, SIZE, 100);
        assert_eq!(
            streams.window_at(64 * length),
            Some(0),
            "the deep stream's frontier"
        );
        streams.answered(first);
        assert_eq!(streams.streams.len(), 2);
    }

    #[test]
    fn plans_stop_at_the_end_of_the_volume() {
        let mut streams = Streams::default();
        let length = 64 * KIB;
        let size = 10 * length;
        for i in 0..10 {
            let (stream, plan) = streams.on_read(i * length, length, MAX, 4096, size, i);
            streams.answered(stream);
            if let Some(plan) = plan {
                assert!(plan.end <= size && plan.start < plan.end);
            }
        }
    }
}
