//! A 7200 rpm SATA hard drive, as a timing state machine.
//!
//! ```text
//!  submit ──> queue (arrival order; the drive sees the first `tags`)
//!               │ pick: 1. a request older than age_limit (oldest first)
//!               │       2. a read the read-ahead stream or a cache segment holds
//!               │       3. shortest positioning time (seek + rotation)
//!               │          among the `reorder_window` oldest
//!               ▼
//!            one head: seek(f) = 1.0 + 12.5·√f + 2.5·f ms, wait for the
//!            sector to come round, transfer at the zone's media rate
//!               │ after a media read the head keeps reading ahead into a
//!               ▼ stream buffer while nothing else needs it
//!            write cache: writes land at interface speed and are
//!            destaged when the drive is idle, when it is full, or on flush
//! ```
//!
//! Rule 2 is what real firmware does, as measured on real drives: a
//! sequential reader keeps hitting the stream, so a queued random read
//! waits until it ages past the limit (1-4 s on real drives).
//!
//! Geometry is deliberately simple: the head's radial position is the
//! offset's fraction of the device, the media rate falls linearly from the
//! outer edge to half of it at the inner edge, and a sector's angle is its
//! place within a track of that zone's length.

use std::collections::VecDeque;

use super::{
    slowed, transfer_nanos, IoKind, ModelIo, Nanos, TimingModel, NANOS_PER_MS, NANOS_PER_US,
};

#[derive(Clone, Debug, PartialEq)]
pub struct HddParams {
    pub size_bytes: u64,
    pub rotation_ns: Nanos,
    /// Seek time t(f) = a + b·√f + c·f ms for a fraction f of full stroke.
    pub seek_base_ms: f64,
    pub seek_sqrt_ms: f64,
    pub seek_linear_ms: f64,
    pub write_settle_ns: Nanos,
    pub command_overhead_ns: Nanos,
    pub outer_rate_bytes_per_sec: u64,
    /// Media rate at the inner edge as a fraction of the outer one.
    pub inner_rate_fraction: f64,
    /// Host link speed, for cache hits and cached writes.
    pub interface_bytes_per_sec: u64,
    /// Requests the drive accepts at once (NCQ tags).
    pub tags: usize,
    /// How many of the oldest queued requests the firmware compares for
    /// the shortest positioning time (its time to decide is limited).
    pub reorder_window: usize,
    /// A request waiting longer than this is served next.
    pub age_limit_ns: Nanos,
    /// How far the head reads ahead of the last sequential read.
    pub readahead_bytes: u64,
    /// Cached ranges kept apart from the active stream.
    pub cache_segments: usize,
    pub cache_segment_bytes_max: u64,
    pub write_cache: bool,
    pub write_cache_bytes: u64,
}

impl HddParams {
    pub fn new(size_bytes: u64) -> HddParams {
        HddParams {
            size_bytes,
            rotation_ns: 8_333_333,
            seek_base_ms: 1.0,
            seek_sqrt_ms: 12.5,
            seek_linear_ms: 2.5,
            write_settle_ns: 500 * NANOS_PER_US,
            command_overhead_ns: 50 * NANOS_PER_US,
            outer_rate_bytes_per_sec: 250_000_000,
            inner_rate_fraction: 0.5,
            interface_bytes_per_sec: 600_000_000,
            tags: 32,
            reorder_window: 16,
            age_limit_ns: 2_000 * NANOS_PER_MS,
            readahead_bytes: 2 << 20,
            cache_segments: 16,
            cache_segment_bytes_max: 4 << 20,
            write_cache: true,
            write_cache_bytes: 32 << 20,
        }
    }

    /// Seek time for a fraction `f` of full stroke; 0 stays on the track.
    pub fn seek_ns(&self, f: f64) -> Nanos {
        if f <= 0.0 {
            return 0;
        }
        let ms = self.seek_base_ms + self.seek_sqrt_ms * f.sqrt() + self.seek_linear_ms * f;
        (ms * NANOS_PER_MS as f64) as Nanos
    }

    /// Radial position of `offset`, 0 (outer edge) to 1 (inner edge).
    fn radius(&self, offset: u64) -> f64 {
        offset as f64 / self.size_bytes.max(1) as f64
    }

    pub fn media_rate_at(&self, offset: u64) -> u64 {
        let f = self.radius(offset);
        let rate =
            self.outer_rate_bytes_per_sec as f64 * (1.0 - (1.0 - self.inner_rate_fraction) * f);
        rate.max(1.0) as u64
    }

    fn track_bytes_at(&self, offset: u64) -> u64 {
        (self.media_rate_at(offset) as u128 * self.rotation_ns as u128 / 1_000_000_000) as u64
    }

    /// Where in a revolution `offset` passes under the head, 0..1.
    fn angle_of(&self, offset: u64) -> f64 {
        let track = self.track_bytes_at(offset).max(1);
        (offset % track) as f64 / track as f64
    }

    fn head_angle_at(&self, now: Nanos) -> f64 {
        (now % self.rotation_ns) as f64 / self.rotation_ns as f64
    }
}

#[derive(Clone, Copy, Debug)]
struct Queued {
    io: ModelIo,
    arrived: Nanos,
}

/// What the head is doing until `done_at`.
#[derive(Clone, Copy, Debug)]
struct Service {
    /// None for the drive's own work (destaging its write cache).
    host: Option<Queued>,
    done_at: Nanos,
}

/// The head reading ahead after a read: bytes past `origin` arrive at the
/// media rate from `origin_time`, up to `limit`.
#[derive(Clone, Copy, Debug)]
struct Stream {
    cached_start: u64,
    origin: u64,
    origin_time: Nanos,
    limit: u64,
    rate: u64,
}

impl Stream {
    fn available_at(&self, end: u64) -> Nanos {
        if end <= self.origin {
            0
        } else {
            self.origin_time + transfer_nanos(end - self.origin, self.rate)
        }
    }

    fn reached(&self, now: Nanos) -> u64 {
        if now <= self.origin_time {
            return self.origin;
        }
        let read =
            (u128::from(now - self.origin_time) * u128::from(self.rate) / 1_000_000_000) as u64;
        (self.origin + read).min(self.limit)
    }

    /// The stream will deliver `[offset, ..)` without a seek.
    fn holds_start(&self, offset: u64) -> bool {
        offset >= self.cached_start && offset <= self.limit
    }
}

pub struct Hdd {
    params: HddParams,
    queue: VecDeque<Queued>,
    current: Option<Service>,
    /// Where the head is when it is not streaming.
    head_offset: u64,
    stream: Option<Stream>,
    /// Recently read ranges, most recent last.
    segments: VecDeque<(u64, u64)>,
    /// Written ranges not yet on the media, oldest first.
    dirty: VecDeque<(u64, u64)>,
    dirty_bytes: u64,
    slowdown: f64,
}

impl Hdd {
    pub fn new(params: HddParams) -> Hdd {
        assert!(params.tags > 0 && params.rotation_ns > 0);
        Hdd {
            params,
            queue: VecDeque::new(),
            current: None,
            head_offset: 0,
            stream: None,
            segments: VecDeque::new(),
            dirty: VecDeque::new(),
            dirty_bytes: 0,
            slowdown: 1.0,
        }
    }

    pub fn params(&self) -> &HddParams {
        &self.params
    }

    /// Where the head is at `now` (a stream moves it).
    fn head_at(&self, now: Nanos) -> u64 {
        self.stream.map_or(self.head_offset, |s| s.reached(now))
    }

    /// Seek plus rotational wait to reach `offset` starting at `start`.
    fn positioning_ns(&self, offset: u64, start: Nanos, write: bool) -> Nanos {
        let p = &self.params;
        let head = self.head_at(start);
        let distance = head.abs_diff(offset);
        let seek = if distance < p.track_bytes_at(offset) {
            0
        } else {
            p.seek_ns(distance as f64 / p.size_bytes as f64)
        };
        let settle = if write { p.write_settle_ns } else { 0 };
        let arrive = start + p.command_overhead_ns + seek + settle;
        let wait = (p.angle_of(offset) - p.head_angle_at(arrive)).rem_euclid(1.0);
        p.command_overhead_ns + seek + settle + (wait * p.rotation_ns as f64) as Nanos
    }

    fn in_segment(&self, offset: u64, end: u64) -> bool {
        self.segments.iter().any(|&(s, e)| offset >= s && end <= e)
    }

    fn is_cache_read(&self, io: &ModelIo) -> bool {
        io.kind == IoKind::Read
            && (self.stream.is_some_and(|s| s.holds_start(io.offset))
                || self.in_segment(io.offset, io.offset + io.length))
    }

    /// The request the firmware serves next at `now`, as a queue index.
    fn pick(&self, now: Nanos) -> Option<usize> {
        let visible = self.queue.len().min(self.params.tags);
        if visible == 0 {
            return None;
        }
        // A flush is not queued (SATA FLUSH CACHE): it waits for what came before.
        if self.queue[0].io.kind == IoKind::Flush {
            return Some(0);
        }
        let candidates = (0..visible).take_while(|&i| self.queue[i].io.kind != IoKind::Flush);
        let starved = candidates
            .clone()
            .find(|&i| now.saturating_sub(self.queue[i].arrived) >= self.params.age_limit_ns);
        if starved.is_some() {
            return starved;
        }
        if let Some(hit) = candidates
            .clone()
            .find(|&i| self.is_cache_read(&self.queue[i].io))
        {
            return Some(hit);
        }
        candidates
            .take(self.params.reorder_window.max(1))
            .min_by_key(|&i| self.cost_estimate(&self.queue[i].io, now))
    }

    fn cost_estimate(&self, io: &ModelIo, now: Nanos) -> Nanos {
        match io.kind {
            IoKind::Write if self.params.write_cache => 0,
            IoKind::Discard | IoKind::Flush => 0,
            IoKind::Read | IoKind::Write => {
                self.positioning_ns(io.offset, now, io.kind == IoKind::Write)
            }
        }
    }

    /// Stop the stream at `now`, keeping what it read as a segment.
    fn stop_stream(&mut self, now: Nanos) {
        if let Some(stream) = self.stream.take() {
            let reached = stream.reached(now);
            self.head_offset = reached;
            self.remember_segment(stream.cached_start, reached);
        }
    }

    fn remember_segment(&mut self, start: u64, end: u64) {
        let start = start.max(end.saturating_sub(self.params.cache_segment_bytes_max));
        if start >= end || self.params.cache_segments == 0 {
            return;
        }
        self.segments.push_back((start, end));
        while self.segments.len() > self.params.cache_segments {
            self.segments.pop_front();
        }
    }

    /// Move the head to `[offset, offset + length)` and transfer it.
    fn media_op(&mut self, offset: u64, length: u64, write: bool, now: Nanos) -> Nanos {
        let positioning = self.positioning_ns(offset, now, write);
        self.stop_stream(now);
        let rate = self.params.media_rate_at(offset);
        let done = now + slowed(positioning + transfer_nanos(length, rate), self.slowdown);
        self.head_offset = offset + length;
        if write {
            self.forget_cached(offset, offset + length);
        }
        done
    }

    /// Cached copies of a range that is being overwritten are stale.
    fn forget_cached(&mut self, start: u64, end: u64) {
        self.segments.retain(|&(s, e)| e <= start || s >= end);
        if let Some(stream) = self.stream {
            if stream.cached_start < end && stream.limit > start {
                self.stream = None;
            }
        }
    }

    fn serve_read(&mut self, io: &ModelIo, now: Nanos) -> Nanos {
        let p = &self.params;
        let end = io.offset + io.length;
        let iface = transfer_nanos(io.length, p.interface_bytes_per_sec);
        if let Some(stream) = self.stream.as_mut().filter(|s| s.holds_start(io.offset)) {
            if stream.reached(now) >= stream.limit && end > stream.limit {
                // The buffer had filled and the head had paused: resume here.
                stream.origin = stream.limit;
                stream.origin_time = now;
            }
            stream.limit = stream.limit.max(end + p.readahead_bytes);
            // The buffer holds one segment: what lies further back is gone.
            stream.cached_start = stream
                .cached_start
                .max(end.saturating_sub(p.cache_segment_bytes_max));
            // Bytes go over the link as the media delivers them, as on a
            // miss: the link is faster than the media, so the read ends
            // when the media reaches its end, or when the link has sent
            // it all from its first byte, whichever is later.
            let first = stream
                .available_at(io.offset)
                .max(now + p.command_overhead_ns);
            return (first + slowed(iface, self.slowdown)).max(stream.available_at(end));
        }
        if self.in_segment(io.offset, end) {
            return now + slowed(p.command_overhead_ns + iface, self.slowdown);
        }
        let done = self.media_op(io.offset, io.length, false, now);
        self.stream = Some(Stream {
            cached_start: io.offset,
            origin: end,
            origin_time: done,
            limit: end + self.params.readahead_bytes,
            rate: self
                .params
                .media_rate_at(end.min(self.params.size_bytes - 1)),
        });
        done
    }

    fn serve_write(&mut self, io: &ModelIo, now: Nanos) -> Nanos {
        if !self.params.write_cache {
            return self.media_op(io.offset, io.length, true, now);
        }
        // A full cache makes room first, at media speed.
        let mut at = now;
        while self.dirty_bytes + io.length > self.params.write_cache_bytes {
            let Some(done) = self.destage_one(at) else {
                break;
            };
            at = done;
        }
        self.forget_cached(io.offset, io.offset + io.length);
        self.dirty.push_back((io.offset, io.length));
        self.dirty_bytes += io.length;
        let cost = self.params.command_overhead_ns
            + transfer_nanos(io.length, self.params.interface_bytes_per_sec);
        at + slowed(cost, self.slowdown)
    }

    /// Write the oldest cached write to the media; when it is done.
    fn destage_one(&mut self, now: Nanos) -> Option<Nanos> {
        let (offset, length) = self.dirty.pop_front()?;
        self.dirty_bytes -= length;
        Some(self.media_op(offset, length, true, now))
    }

    fn serve(&mut self, io: &ModelIo, now: Nanos) -> Nanos {
        match io.kind {
            IoKind::Read => self.serve_read(io, now),
            IoKind::Write => self.serve_write(io, now),
            IoKind::Flush => {
                let mut at = now;
                while let Some(done) = self.destage_one(at) {
                    at = done;
                }
                at + self.params.command_overhead_ns
            }
            IoKind::Discard => now + self.params.command_overhead_ns,
        }
    }

    /// The head is free at `now`: start the next request, or destage.
    fn start_next(&mut self, now: Nanos) {
        assert!(
            self.current.is_none(),
            "the head serves one request at a time"
        );
        if let Some(index) = self.pick(now) {
            let queued = self.queue.remove(index).expect("picked index exists");
            let done_at = self.serve(&queued.io, now).max(now);
            self.current = Some(Service {
                host: Some(queued),
                done_at,
            });
        } else if let Some(done_at) = self.destage_one(now) {
            self.current = Some(Service {
                host: None,
                done_at,
            });
        }
    }
}

impl TimingModel for Hdd {
    fn submit(&mut self, io: ModelIo, now: Nanos) {
        assert!(
            io.offset
                .checked_add(io.length)
                .is_some_and(|end| end <= self.params.size_bytes),
            "request past the end of the drive: {io:?}"
        );
        self.queue.push_back(Queued { io, arrived: now });
        if self.current.is_none() {
            self.start_next(now);
        }
    }

    fn next_event(&self) -> Option<Nanos> {
        self.current.map(|service| service.done_at)
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<(u64, Nanos)>) {
        while let Some(service) = self.current.filter(|s| s.done_at <= now) {
            self.current = None;
            if let Some(host) = service.host {
                done.push((host.io.id, service.done_at));
            }
            self.start_next(service.done_at);
        }
    }

    fn in_flight(&self) -> usize {
        self.queue.len() + usize::from(self.current.is_some_and(|s| s.host.is_some()))
    }

    fn set_slowdown(&mut self, factor: f64) {
        assert!(factor >= 1.0, "a slowdown cannot speed the drive up");
        self.slowdown = factor;
    }
}

#[cfg(test)]
mod tests;
