//! Read-aheads in flight, found by id and by the range they cover.
//!
//! A 4 KiB stream on flash keeps a window of many megabytes in the device
//! in pieces of a few client reads, tens of thousands of them at once, and
//! every client read asks which of them covers it. A scan per read here,
//! and one per landing among the data held (see `store`), kept the
//! server's threads busy under the lock: 4 KiB reads eight deep on a
//! served NVMe model read 153-173 MB/s with both, 526-560 MB/s without.
//! Ranges are looked up by start instead, going back no further than the
//! longest read-ahead in flight can reach.

use std::collections::{BTreeMap, BTreeSet};

use crate::device::{AlignedBuf, Completion};

pub(super) struct Waiting {
    pub offset: u64,
    pub buf: AlignedBuf,
    pub done: Completion,
}

pub(super) struct Fetch {
    pub start: u64,
    pub end: u64,
    pub stream: u64,
    /// End of the window it is a piece of.
    pub window_end: u64,
    /// A write overlapped it while in flight: its bytes may be older.
    pub stale: bool,
    /// Sent as a client read, or promoted to one since.
    pub urgent: bool,
    pub waiting: Vec<Waiting>,
}

#[derive(Default)]
pub(super) struct Fetches {
    by_id: BTreeMap<u64, Fetch>,
    /// (start, id) of every fetch in `by_id`.
    by_start: BTreeSet<(u64, u64)>,
    /// (length, id) of every fetch in `by_id`: no fetch starting further
    /// back than the longest reaches a given offset.
    by_length: BTreeSet<(u64, u64)>,
}

impl Fetches {
    pub fn insert(&mut self, id: u64, fetch: Fetch) {
        self.remove(id);
        self.by_start.insert((fetch.start, id));
        self.by_length.insert((fetch.end - fetch.start, id));
        self.by_id.insert(id, fetch);
    }

    pub fn remove(&mut self, id: u64) -> Option<Fetch> {
        let fetch = self.by_id.remove(&id)?;
        self.by_start.remove(&(fetch.start, id));
        self.by_length.remove(&(fetch.end - fetch.start, id));
        Some(fetch)
    }

    pub fn get(&self, id: u64) -> Option<&Fetch> {
        self.by_id.get(&id)
    }

    /// Ids of the fetches overlapping `[start, end)`, by start.
    fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = u64> + '_ {
        let longest = self.by_length.last().map_or(0, |&(length, _)| length);
        let from = start.saturating_sub(longest);
        self.by_start
            .range((from, 0)..(end, 0))
            .map(|&(_, id)| id)
            .filter(move |id| self.by_id[id].end > start)
    }

    /// A fetch not stale that covers all of `[start, end)`.
    pub fn covering_mut(&mut self, start: u64, end: u64) -> Option<&mut Fetch> {
        let id = self.overlapping(start, end).find(|id| {
            let f = &self.by_id[id];
            !f.stale && f.start <= start && end <= f.end
        })?;
        self.by_id.get_mut(&id)
    }

    /// Mark the fetches overlapping `[start, end)` stale.
    pub fn mark_stale(&mut self, start: u64, end: u64) {
        let ids: Vec<u64> = self.overlapping(start, end).collect();
        for id in ids {
            self.by_id.get_mut(&id).expect("listed above").stale = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetch(start: u64, end: u64) -> Fetch {
        Fetch {
            start,
            end,
            stream: 1,
            window_end: end,
            stale: false,
            urgent: false,
            waiting: Vec::new(),
        }
    }

    /// The fetches `covering_mut` and `mark_stale` find are exactly those a
    /// scan of all of them finds, over ranges of mixed lengths that overlap.
    #[test]
    fn lookups_by_range_match_a_scan() {
        let mut rng = crate::rng::Rng::new(7);
        let mut fetches = Fetches::default();
        let mut all: BTreeMap<u64, (u64, u64, bool)> = BTreeMap::new();
        for id in 0..3000u64 {
            let start = rng.below(1 << 20) * 512;
            let length = 512 * (1 + rng.below(if id % 10 == 0 { 4096 } else { 32 }));
            fetches.insert(id, fetch(start, start + length));
            all.insert(id, (start, start + length, false));
            if rng.below(3) == 0 {
                let gone = rng.below(id + 1);
                assert_eq!(fetches.remove(gone).is_some(), all.remove(&gone).is_some());
            }
            let at = rng.below(1 << 20) * 512;
            let end = at + 512 * (1 + rng.below(16));
            if rng.below(8) == 0 {
                fetches.mark_stale(at, end);
                for f in all.values_mut() {
                    if f.0 < end && at < f.1 {
                        f.2 = true;
                    }
                }
            }
            let found = fetches.covering_mut(at, end).map(|f| (f.start, f.end));
            let any = all
                .values()
                .any(|&(s, e, stale)| !stale && s <= at && end <= e);
            assert_eq!(found.is_some(), any, "[{at}, {end})");
            if let Some((s, e)) = found {
                assert!(s <= at && end <= e);
            }
        }
    }
}
