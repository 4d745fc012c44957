//! Sequential streams, recognised per volume from the reads themselves.
//!
//! A read continues a stream when it lands near the stream's frontier (the
//! end of its furthest read), from whichever connection it came: clients
//! spread one stream over several connections and a server completes
//! requests out of order, so reads a little behind the frontier count too
//! (Linux's context readahead has the same idea: the stream is what was
//! read, not who read it). A stream's second read confirms it; from then
//! on it reads ahead by a window that doubles each time the reader gets
//! halfway into what was read ahead, for as long as doubling pays: the
//! stream's rate over each window is measured, and after two windows that
//! brought less than `GROWTH_GAIN_MIN` more, the window stays. A disk that
//! seeks between streams keeps gaining until each window's transfer
//! outweighs its seek; a drive that serves the stream as fast at any
//! window stops early. The caller bounds it by memory. Read-ahead data
//! that is evicted unread halves its stream's window and stops its growth.
//! A client that keeps several reads of a stream in flight gets none.
//!
//! Sans-IO: the caller reports reads and evictions and issues the ranges
//! this returns.

/// Streams tracked at once per volume; the least recently read goes.
const STREAMS_MAX: usize = 64;
/// How far behind its frontier a read may land and still continue the
/// stream, in requests of its size: requests spread over connections
/// reach the volume in any order within about the clients' queue depth.
const REORDER_REQUESTS: u64 = 32;
/// How far past its frontier a read may start, in requests of its size: a
/// reader that skips a request or two is still streaming.
const GAP_REQUESTS: u64 = 2;
/// A confirmed stream's first window, in requests of its size.
pub const FIRST_WINDOW_REQUESTS: u64 = 4;
/// A window keeps doubling while the stream's rate over a window grew by
/// at least this factor with the last doubling.
const GROWTH_GAIN_MIN: f64 = 1.1;

/// A range to read ahead for `stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub stream: u64,
    pub start: u64,
    pub end: u64,
    /// Nothing is read ahead of the reader: its next read waits for the
    /// start of this range.
    pub urgent: bool,
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
    /// When the window last changed size, and the frontier then.
    measured_since: Option<(u64, u64)>,
    /// The best rate (bytes/ns) the stream has shown over a window.
    rate_before: Option<f64>,
    /// The last window brought no gain; one more such and it settles.
    held_once: bool,
    /// Doubling stopped paying.
    settled: bool,
    /// The stream's client reads not yet answered.
    outstanding: u32,
}

impl Stream {
    /// A window's worth was planned: double it if the last doubling paid.
    /// A window that brought no gain is measured once more before the
    /// stream settles, so that one slow window (the device busy with
    /// another stream's start) does not stop it.
    fn grow(&mut self, window_max: u64, now_ns: u64) {
        if self.settled {
            return;
        }
        let Some((since, frontier_then)) = self.measured_since else {
            self.measured_since = Some((now_ns, self.frontier));
            self.window = (self.window * 2).min(window_max);
            return;
        };
        // Judge a window only once the reader went through a whole one.
        if self.frontier - frontier_then < self.window || now_ns <= since {
            return;
        }
        let rate = (self.frontier - frontier_then) as f64 / (now_ns - since) as f64;
        self.measured_since = Some((now_ns, self.frontier));
        let best = self.rate_before.unwrap_or(0.0);
        if rate < best * GROWTH_GAIN_MIN {
            if self.held_once {
                self.settled = true;
            }
            self.held_once = true;
            self.rate_before = Some(best.max(rate));
            return;
        }
        self.held_once = false;
        self.rate_before = Some(rate);
        self.window = (self.window * 2).min(window_max);
    }

    fn continued_by(&self, offset: u64, length: u64) -> bool {
        // Until a second read confirms it, a stream is continued only
        // right at its end: random reads landing near one of the streams
        // tracked must not start read-ahead. Once confirmed, reads that
        // arrive early or late by up to a client's queue of requests
        // still belong to it.
        let (behind, ahead) = if self.reads < 2 {
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
    streams: Vec<Stream>,
    reads: u64,
    next_id: u64,
}

impl Streams {
    /// A read of `length` bytes at `offset`, at `now_ns`: the stream it
    /// belongs to (the caller reports it [`answered`](Self::answered)) and
    /// what to read ahead now, if anything. `window_max` is the most the
    /// caller will hold ahead of one stream (at least the first window),
    /// `align` the block size ranges are rounded to, `size` the volume's
    /// end.
    pub fn on_read(
        &mut self,
        offset: u64,
        length: u64,
        window_max: u64,
        align: u64,
        size: u64,
        now_ns: u64,
    ) -> (u64, Option<Plan>) {
        self.reads += 1;
        let now = self.reads;
        // Never below a confirmed stream's first window: a stream that
        // reads nothing ahead would never show the device's costs again.
        let window_max = window_max.max(FIRST_WINDOW_REQUESTS * length);
        let end = offset + length;
        let Some(stream) = self
            .streams
            .iter_mut()
            .filter(|s| s.continued_by(offset, length))
            .min_by_key(|s| s.frontier.abs_diff(offset))
        else {
            return (self.start_stream(end, now), None);
        };
        stream.last_read = now;
        stream.reads += 1;
        stream.outstanding += 1;
        let id = stream.id;
        // The frontier follows every read, so that a stream read at depth
        // is not left behind where a later reader would take it up.
        stream.frontier = stream.frontier.max(end);
        // A client that keeps several reads of the stream in flight drives
        // the device as deep as it likes: reading ahead would only add a
        // wait (and a copy) between it and the device.
        if stream.outstanding > 1 {
            return (id, None);
        }
        let urgent = stream.ahead_end <= stream.frontier;
        stream.ahead_end = stream.ahead_end.max(stream.frontier);
        if stream.window == 0 {
            stream.window = (FIRST_WINDOW_REQUESTS * length).min(window_max);
        }
        stream.window = stream.window.min(window_max);
        if stream.window == 0 {
            return (id, None);
        }
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
        let plan = Plan {
            stream: stream.id,
            start,
            end: until,
            urgent,
        };
        stream.grow(window_max, now_ns);
        (id, Some(plan))
    }

    /// Data read ahead for `stream` was dropped before anyone read it.
    pub fn wasted(&mut self, stream: u64) {
        if let Some(s) = self.streams.iter_mut().find(|s| s.id == stream) {
            s.window /= 2;
            s.settled = true;
        }
    }

    /// The window of the stream that `offset` would continue, for tests and
    /// reports.
    pub fn window_at(&self, offset: u64) -> Option<u64> {
        self.streams
            .iter()
            .find(|s| s.frontier == offset)
            .map(|s| s.window)
    }

    /// A client read that `on_read` gave `stream` was answered.
    pub fn answered(&mut self, stream: u64) {
        if let Some(s) = self.streams.iter_mut().find(|s| s.id == stream) {
            s.outstanding = s.outstanding.saturating_sub(1);
        }
    }

    fn start_stream(&mut self, frontier: u64, now: u64) -> u64 {
        if self.streams.len() >= STREAMS_MAX {
            let oldest = self
                .streams
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| s.last_read)
                .map(|(i, _)| i)
                .expect("streams is full");
            self.streams.swap_remove(oldest);
        }
        self.next_id += 1;
        self.streams.push(Stream {
            id: self.next_id,
            frontier,
            reads: 1,
            window: 0,
            ahead_end: frontier,
            last_read: now,
            measured_since: None,
            rate_before: None,
            held_once: false,
            settled: false,
            outstanding: 1,
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
                if let Some(plan) = read(&mut streams, base + i * length, length) {
                    assert!(plan.start >= base && plan.end <= base + (1 << 29));
                    planned[k] += plan.end - plan.start;
                }
            }
        }
        assert_eq!(streams.streams.len(), 2);
        assert!(planned.iter().all(|p| *p >= 90 * length), "{planned:?}");
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

    #[test]
    fn wasted_read_ahead_halves_the_window() {
        let mut streams = Streams::default();
        let length = 64 * KIB;
        let mut last = None;
        for i in 0..50 {
            last = read(&mut streams, i * length, length).or(last);
        }
        let before = streams.window_at(50 * length).unwrap();
        streams.wasted(last.unwrap().stream);
        assert_eq!(streams.window_at(50 * length), Some(before / 2));
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
        assert_eq!(streams.window_at(400 * length), Some(MAX));
    }

    #[test]
    fn a_client_with_reads_in_flight_on_the_stream_gets_no_read_ahead() {
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
