//! The write-back cache in front of each volume's store.
//!
//! ```text
//!   volume ─> CachedStore ─┬─ WRITE: copied into the dirty map, answered
//!                          │          (after a pause near the budget;
//!                          │          past it, once writeback made room)
//!                          ├─ READ: store read with cached bytes laid over
//!                          ├─ FLUSH: waits for every earlier write to reach
//!                          │          the store, then flushes the store
//!                          ├─ FUA / zero / trim: straight to the store,
//!                          │          after older cached bytes in range
//!                          └─ writeback: runs of adjacent pieces, in the
//!                                     async-write class ──> store
//! ```
//!
//! NBD lets a server keep writes in memory until FLUSH (or FUA), and
//! clients expect it: a WRITE answered from memory costs a memcpy
//! instead of the devices' latency. The rules that keep it safe live in
//! [`dirty_map`]; the server-wide memory limit and writer pacing in
//! `budget`; the background thread in `flusher`; paused replies in
//! `pauses`, released by the connection thread that read the write.
//! Writeback goes to the device queues as async-write, which the adaptive
//! scheduler holds back from client reads by the read latency it measures.

mod budget;
pub(crate) mod busy;
pub mod dirty_map;
pub(crate) mod flusher;
mod pauses;
pub(crate) mod store;
mod waiting;

pub use budget::{ram_bytes, Admission, Charge, DirtyBudget};
pub use flusher::{Flusher, TICK as SETTLE_TICK};
pub use pauses::LocalPauses;
pub use store::{writeback_bytes_max, CachedStore, RUN_BYTES_MAX, WRITEBACK_RUNS_MAX};

/// Whether a volume keeps writes in memory until FLUSH.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Answer writes from memory; FLUSH and FUA make them durable.
    #[default]
    Writeback,
    /// Answer writes once every copy has them.
    Writethrough,
}
