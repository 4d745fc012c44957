//! Device timing models: an HDD, a SATA SSD and an NVMe drive as pure state
//! machines. Given a request and `now`, a model decides when it completes;
//! it never reads a clock, sleeps or touches data.
//!
//! ```text
//!   submit(io, now) ──> [ model: queue, head / dies, caches ] ──> next_event()
//!                                                            └──> advance(now) -> completed ids
//! ```
//!
//! Two drivers run a model: `realtime::ModelDevice` inside `weir serve`
//! (absolute deadlines on a clock, data in a real store), and the
//! virtual-time simulator in `crate::sim` (no threads, no sleeps).

pub mod faults;
pub mod flash;
pub mod hdd;
pub mod power_loss;
pub mod realtime;
pub mod spec;

pub use spec::{ModelKind, ModelSpec};

/// Time in nanoseconds since the driver started.
pub type Nanos = u64;

pub const NANOS_PER_US: Nanos = 1_000;
pub const NANOS_PER_MS: Nanos = 1_000_000;
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

/// What a request does, as far as timing goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    Flush,
    Discard,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelIo {
    /// Chosen by the driver; unique among requests in flight.
    pub id: u64,
    pub kind: IoKind,
    pub offset: u64,
    pub length: u64,
}

/// A device's timing, as a state machine.
///
/// Contract: `submit` and `advance` take non-decreasing `now`. A request
/// completes at most once, at a time no earlier than its submission. After
/// `advance(now)`, `next_event()` is either `None` (nothing in flight) or
/// later than `now`.
pub trait TimingModel: Send {
    fn submit(&mut self, io: ModelIo, now: Nanos);
    /// When the model next has something to do, if anything is in flight.
    fn next_event(&self) -> Option<Nanos>;
    /// Run up to `now`, appending `(id, completed_at)` of every request done
    /// by then, in completion order.
    fn advance(&mut self, now: Nanos, done: &mut Vec<(u64, Nanos)>);
    /// Requests submitted and not yet completed.
    fn in_flight(&self) -> usize;
    /// Multiply the time of work started from now on (fault injection: a
    /// device that is slow for a while). 1.0 is normal speed.
    fn set_slowdown(&mut self, factor: f64);
}

/// `ns` stretched by a slowdown factor.
pub fn slowed(ns: Nanos, factor: f64) -> Nanos {
    if factor == 1.0 {
        ns
    } else {
        (ns as f64 * factor) as Nanos
    }
}

/// Time to move `bytes` at `bytes_per_sec`, rounded up.
pub fn transfer_nanos(bytes: u64, bytes_per_sec: u64) -> Nanos {
    assert!(bytes_per_sec > 0, "a transfer rate must be positive");
    ((u128::from(bytes) * u128::from(NANOS_PER_SEC)).div_ceil(u128::from(bytes_per_sec))) as Nanos
}
