//! Readahead in front of each volume's store.
//!
//! ```text
//!   volume ─> ReadaheadStore ─┬─ READ: from read-ahead data if it holds the
//!                             │        range (or waits for the read-ahead
//!                             │        in flight that will), else the store;
//!                             │        either way the read feeds `streams`
//!                             ├─ WRITE / TRIM / zero: drops what it
//!                             │        overlaps, then the store
//!                             └─ a stream's next window: async-read ──> store
//!                                      (a deep client's: sync-read)
//! ```
//!
//! weir reads with O_DIRECT, so nothing below it reads ahead; clients spread
//! one sequential stream over several connections and requests complete
//! out of order, so a reader's stream is only visible on the volume.
//! [`streams`] recognises streams and sizes their windows from the rate
//! each window brings; [`store`] holds the data under the server-wide
//! [`ReadaheadBudget`], and `fetches` finds the read-aheads in flight by
//! the range they cover.

mod deep;
mod fetches;
mod store;
pub mod streams;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use store::{Clock, ReadaheadCounters, ReadaheadStore};

/// Whether a volume reads ahead for the sequential streams it sees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadaheadMode {
    #[default]
    On,
    Off,
}

/// Read-ahead memory is at most this share of RAM unless configured.
const RAM_SHARE: u64 = 64;

/// One bound on read-ahead memory for the whole server.
#[derive(Debug)]
pub struct ReadaheadBudget {
    limit: u64,
    held: AtomicU64,
}

impl ReadaheadBudget {
    /// `configured`: the operator's limit in bytes, if any.
    pub fn new(configured: Option<u64>) -> Arc<ReadaheadBudget> {
        Arc::new(ReadaheadBudget {
            limit: configured.unwrap_or_else(|| crate::cache::ram_bytes() / RAM_SHARE),
            held: AtomicU64::new(0),
        })
    }

    pub fn limit_bytes(&self) -> u64 {
        self.limit
    }

    pub fn held_bytes(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    fn hold(&self, bytes: u64) {
        self.held.fetch_add(bytes, Ordering::Relaxed);
    }

    fn release(&self, bytes: u64) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
    }
}
