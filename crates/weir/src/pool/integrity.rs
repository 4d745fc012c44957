//! Block checksums and the dirty-region log: the sans-IO rules that keep a
//! mirror honest across reads and crashes (see docs/on-disk.md).
//!
//! ```text
//!  checksum entry (8 bytes): crc32c | flags (bit 0: the block holds data)
//!                            flags 0: the block reads as zeroes, no I/O
//!
//!  dirty-region log:  write into clean region r ──> set bit r, persist it, then write
//!                     flush done ──> regions untouched since the previous flush clear
//!  recovery, per block of a dirty region: a copy whose data matches its own
//!  checksum wins (first member first); none does: the first readable copy,
//!  checksum recomputed. Then every copy gets that block and checksum.
//! ```

use std::collections::{BTreeMap, BTreeSet};

use super::geometry::CHECKSUM_ENTRY_BYTES;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockSum {
    /// Never written, trimmed or zeroed: reads as zeroes without device I/O.
    Zero,
    Data(u32),
}

const FLAG_DATA: u32 = 1;
/// The entry carries `check`: written by every current version of weir.
const FLAG_CHECKED: u32 = 2;
const CHECK_SHIFT: u32 = 8;

/// An entry that fails its own check: its copy of the checksum page was
/// damaged (or written to the wrong place), so the entry is taken from
/// another copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CorruptEntry;

/// 24 bits tying an entry to its block: a flipped bit, or an entry of
/// another block written here by a misdirected page write, fails it.
fn entry_check(index: u64, crc: u32, flags: u32) -> u32 {
    let mut bytes = [0u8; 13];
    bytes[..8].copy_from_slice(&index.to_be_bytes());
    bytes[8..12].copy_from_slice(&crc.to_be_bytes());
    bytes[12] = flags as u8;
    crc32c::crc32c(&bytes) & 0x00ff_ffff
}

impl BlockSum {
    pub fn of(data: &[u8]) -> BlockSum {
        BlockSum::Data(crc32c::crc32c(data))
    }

    /// The entry of the group's block `index`. A zero block is all zero
    /// bytes, as a checksum region that was never written reads.
    pub fn encode(self, index: u64) -> [u8; CHECKSUM_ENTRY_BYTES as usize] {
        let mut out = [0u8; 8];
        if let BlockSum::Data(crc) = self {
            let flags = FLAG_DATA | FLAG_CHECKED;
            let flags = flags | entry_check(index, crc, flags) << CHECK_SHIFT;
            out[..4].copy_from_slice(&crc.to_be_bytes());
            out[4..].copy_from_slice(&flags.to_be_bytes());
        }
        out
    }

    /// Decode the entry of block `index`. Entries written before entries
    /// carried a check (flags exactly "data") are taken as they are.
    pub fn decode(
        bytes: &[u8; CHECKSUM_ENTRY_BYTES as usize],
        index: u64,
    ) -> Result<BlockSum, CorruptEntry> {
        let crc = u32::from_be_bytes(bytes[..4].try_into().expect("4 bytes"));
        let flags = u32::from_be_bytes(bytes[4..].try_into().expect("4 bytes"));
        match flags {
            0 if crc == 0 => Ok(BlockSum::Zero),
            FLAG_DATA if crc != 0 => Ok(BlockSum::Data(crc)),
            _ if flags & 0xff == FLAG_DATA | FLAG_CHECKED
                && flags >> CHECK_SHIFT == entry_check(index, crc, flags) =>
            {
                Ok(BlockSum::Data(crc))
            }
            _ => Err(CorruptEntry),
        }
    }

    /// Whether `data`, read from the device, is what this entry promises.
    pub fn verifies(self, data: &[u8]) -> bool {
        match self {
            // A zero block is never read from the device.
            BlockSum::Zero => true,
            BlockSum::Data(crc) => crc32c::crc32c(data) == crc,
        }
    }
}

/// One copy of a block as recovery finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyState {
    /// The read succeeded.
    pub readable: bool,
    /// The checksum entry stored on that copy's device; None if it fails
    /// its own check.
    pub stored: Option<BlockSum>,
    /// crc32c of the data read (meaningless if unreadable).
    pub actual: u32,
}

/// What recovery writes back to every copy of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Copy `source`'s data, with this checksum.
    Data { source: usize, sum: BlockSum },
    /// Every copy says zero: keep it zero.
    Zero,
    /// No copy could be read: the block stays as it is and reads will fail.
    Unreadable,
}

/// Decide one block of a dirty region. Copies are in member order.
pub fn resolve(copies: &[CopyState]) -> Resolution {
    assert!(!copies.is_empty(), "a block has at least one copy");
    let consistent = |c: &CopyState| match c.stored {
        Some(BlockSum::Data(crc)) => c.readable && crc == c.actual,
        _ => false,
    };
    if let Some(index) = copies.iter().position(consistent) {
        return Resolution::Data {
            source: index,
            sum: BlockSum::Data(copies[index].actual),
        };
    }
    // Every entry that checks out says zero (a damaged one says nothing):
    // the block was trimmed or never written, whatever its data holds.
    let mut entries = copies.iter().filter_map(|c| c.stored).peekable();
    if entries.peek().is_some() && entries.all(|s| s == BlockSum::Zero) {
        return Resolution::Zero;
    }
    // Torn everywhere: any readable copy is a legal outcome for an
    // unflushed write; make the copies agree on the first one.
    match copies.iter().position(|c| c.readable) {
        Some(index) => Resolution::Data {
            source: index,
            sum: BlockSum::Data(copies[index].actual),
        },
        None => Resolution::Unreadable,
    }
}

/// The dirty-region log of one mirror group, in memory; the caller
/// persists the bits it is told to, before the writes that need them.
#[derive(Clone, Debug, Default)]
pub struct DirtyLog {
    /// Regions whose bit is set (in memory and, once persisted, on disk).
    dirty: BTreeSet<u64>,
    /// Regions written since the last completed flush.
    written: BTreeSet<u64>,
    /// Writes started and not yet completed, per region.
    in_flight: BTreeMap<u64, u32>,
}

impl DirtyLog {
    /// Regions found dirty on disk at import (recovery works through them).
    pub fn from_disk(dirty: impl IntoIterator<Item = u64>) -> DirtyLog {
        DirtyLog {
            dirty: dirty.into_iter().collect(),
            ..DirtyLog::default()
        }
    }

    /// A write touches `regions`. Returns the regions whose bit must be
    /// made durable before the write may start (empty: go ahead).
    pub fn before_write(&mut self, regions: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let mut newly = Vec::new();
        for region in regions {
            self.written.insert(region);
            *self.in_flight.entry(region).or_default() += 1;
            if self.dirty.insert(region) {
                newly.push(region);
            }
        }
        newly
    }

    /// Regions a sequential writer reaches next. For each newly dirty
    /// region that follows a dirty one, the next `ahead` regions (below
    /// `end`) are set too, so that one durable write of the log covers
    /// several regions of the stream; returns those newly set. Setting a
    /// bit early costs no more than recovering that region after a crash,
    /// and a flush clears it if no write came.
    pub fn mark_ahead(&mut self, newly: &[u64], ahead: u64, end: u64) -> Vec<u64> {
        let mut marked = Vec::new();
        for &region in newly {
            if region == 0 || !self.dirty.contains(&(region - 1)) {
                continue;
            }
            for next in region + 1..(region + 1 + ahead).min(end) {
                if self.dirty.insert(next) {
                    marked.push(next);
                }
            }
        }
        marked
    }

    /// The write that `before_write(regions)` announced has completed.
    /// Its regions count as written in the interval it completed in too:
    /// a flush that captured checksum pages before this completion did not
    /// persist its checksums, so only the next flush may clear them.
    pub fn after_write(&mut self, regions: impl IntoIterator<Item = u64>) {
        for region in regions {
            self.written.insert(region);
            let count = self
                .in_flight
                .get_mut(&region)
                .expect("write was announced");
            *count -= 1;
            if *count == 0 {
                self.in_flight.remove(&region);
            }
        }
    }

    /// A flush completed on every copy; it covered every write that had
    /// completed when it started. Returns regions that can be cleared:
    /// dirty, with no write started or completed since the flush before
    /// this one started, and none in flight. Every write to such a region
    /// completed before the previous flush took its checksum pages, so that
    /// flush made its data and checksums durable on every copy.
    pub fn after_flush(&mut self, written_before_flush: &BTreeSet<u64>) -> Vec<u64> {
        let clear: Vec<u64> = self
            .dirty
            .iter()
            .copied()
            .filter(|r| {
                !written_before_flush.contains(r)
                    && !self.written.contains(r)
                    && !self.in_flight.contains_key(r)
            })
            .collect();
        for region in &clear {
            self.dirty.remove(region);
        }
        clear
    }

    /// Take the set of regions written so far, as a flush starts.
    pub fn start_flush(&mut self) -> BTreeSet<u64> {
        std::mem::take(&mut self.written)
    }

    /// A flush failed: the regions it took still need a flush.
    pub fn restore_written(&mut self, written: BTreeSet<u64>) {
        self.written.extend(written);
    }

    /// After a flush with nothing written since it started (a clean
    /// shutdown): every region without a write in flight clears.
    pub fn clear_after_final_flush(&mut self) -> Vec<u64> {
        assert!(
            self.written.is_empty(),
            "writes arrived after the final flush"
        );
        let clear: Vec<u64> = self
            .dirty
            .iter()
            .copied()
            .filter(|r| !self.in_flight.contains_key(r))
            .collect();
        for region in &clear {
            self.dirty.remove(region);
        }
        clear
    }

    pub fn is_dirty(&self, region: u64) -> bool {
        self.dirty.contains(&region)
    }

    pub fn dirty_regions(&self) -> impl Iterator<Item = u64> + '_ {
        self.dirty.iter().copied()
    }

    /// The dirty regions among `regions`.
    pub fn dirty_regions_in(
        &self,
        regions: std::ops::Range<u64>,
    ) -> impl Iterator<Item = u64> + '_ {
        self.dirty.range(regions).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_region_that_continues_a_dirty_one_marks_ahead_and_never_past_the_end() {
        let mut log = DirtyLog::default();
        let newly = log.before_write([10]);
        assert_eq!(
            log.mark_ahead(&newly, 4, 100),
            Vec::<u64>::new(),
            "no dirty predecessor"
        );
        let newly = log.before_write([11]);
        assert_eq!(log.mark_ahead(&newly, 4, 100), vec![12, 13, 14, 15]);
        assert!(log.before_write([12]).is_empty(), "already durable-marked");
        let newly = log.before_write([16]);
        assert_eq!(log.mark_ahead(&newly, 4, 18), vec![17], "stops at the end");
        log.after_write([10, 11, 12, 16]);
        // Marked but never written: the next flush clears them; the
        // written ones wait for the flush after it, as always.
        let first = log.start_flush();
        assert_eq!(log.after_flush(&first), vec![13, 14, 15, 17]);
        let second = log.start_flush();
        assert_eq!(log.after_flush(&second), vec![10, 11, 12, 16]);
    }

    #[test]
    fn checksum_entries_round_trip_and_verify() {
        let data = vec![7u8; 4096];
        let sum = BlockSum::of(&data);
        assert_eq!(BlockSum::decode(&sum.encode(5), 5), Ok(sum));
        assert_eq!(
            BlockSum::decode(&BlockSum::Zero.encode(5), 5),
            Ok(BlockSum::Zero)
        );
        assert_eq!(BlockSum::decode(&[0; 8], 9), Ok(BlockSum::Zero));
        assert!(sum.verifies(&data));
        let mut bad = data.clone();
        bad[4095] ^= 1;
        assert!(!sum.verifies(&bad));
    }

    #[test]
    fn a_damaged_or_misplaced_entry_fails_its_own_check() {
        let entry = BlockSum::Data(0xdead_beef).encode(77);
        for bit in 0..64 {
            let mut bad = entry;
            bad[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(BlockSum::decode(&bad, 77), Err(CorruptEntry), "bit {bit}");
        }
        assert_eq!(
            BlockSum::decode(&entry, 78),
            Err(CorruptEntry),
            "another block's entry"
        );
        for bit in 0..64 {
            let mut bad = [0u8; 8];
            bad[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(
                BlockSum::decode(&bad, 3),
                Err(CorruptEntry),
                "zero, bit {bit}"
            );
        }
        // An entry from before entries were checked: crc, then flags 1.
        let mut legacy = [0u8; 8];
        legacy[..4].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        legacy[7] = 1;
        assert_eq!(
            BlockSum::decode(&legacy, 3),
            Ok(BlockSum::Data(0x1234_5678))
        );
    }

    fn copy(readable: bool, stored: BlockSum, actual: u32) -> CopyState {
        CopyState {
            readable,
            stored: Some(stored),
            actual,
        }
    }

    #[test]
    fn recovery_takes_a_block_whose_entry_is_corrupt_from_a_consistent_copy() {
        let corrupt = CopyState {
            readable: true,
            stored: None,
            actual: 10,
        };
        let r = resolve(&[corrupt, copy(true, BlockSum::Data(10), 10)]);
        assert_eq!(
            r,
            Resolution::Data {
                source: 1,
                sum: BlockSum::Data(10)
            }
        );
        // The other copy's entry says zero: the block was trimmed.
        assert_eq!(
            resolve(&[corrupt, copy(true, BlockSum::Zero, 10)]),
            Resolution::Zero
        );
        // No entry checks out anywhere: the first readable copy, recomputed.
        let r = resolve(&[corrupt, corrupt]);
        assert_eq!(
            r,
            Resolution::Data {
                source: 0,
                sum: BlockSum::Data(10)
            }
        );
    }

    #[test]
    fn recovery_prefers_a_copy_that_matches_its_checksum() {
        // Member 0 torn (data new, checksum old); member 1 intact old.
        let old = BlockSum::Data(10);
        let r = resolve(&[copy(true, old, 99), copy(true, old, 10)]);
        assert_eq!(
            r,
            Resolution::Data {
                source: 1,
                sum: old
            }
        );
        // Both consistent: the first member wins.
        let new = BlockSum::Data(20);
        let r = resolve(&[copy(true, new, 20), copy(true, old, 10)]);
        assert_eq!(
            r,
            Resolution::Data {
                source: 0,
                sum: new
            }
        );
        // An unreadable copy is skipped.
        let r = resolve(&[copy(false, old, 0), copy(true, old, 10)]);
        assert_eq!(
            r,
            Resolution::Data {
                source: 1,
                sum: old
            }
        );
    }

    #[test]
    fn recovery_makes_torn_copies_agree_and_keeps_zero_blocks_zero() {
        let r = resolve(&[
            copy(true, BlockSum::Data(1), 5),
            copy(true, BlockSum::Data(2), 6),
        ]);
        assert_eq!(
            r,
            Resolution::Data {
                source: 0,
                sum: BlockSum::Data(5)
            }
        );
        assert_eq!(
            resolve(&[
                copy(true, BlockSum::Zero, 0),
                copy(false, BlockSum::Zero, 0)
            ]),
            Resolution::Zero
        );
        // A zero entry on one copy and a consistent write on the other: the write.
        let r = resolve(&[
            copy(true, BlockSum::Zero, 0),
            copy(true, BlockSum::Data(3), 3),
        ]);
        assert_eq!(
            r,
            Resolution::Data {
                source: 1,
                sum: BlockSum::Data(3)
            }
        );
        assert_eq!(
            resolve(&[
                copy(false, BlockSum::Data(1), 0),
                copy(false, BlockSum::Data(1), 0)
            ]),
            Resolution::Unreadable
        );
    }

    #[test]
    fn a_write_that_completes_during_a_flush_keeps_its_region_dirty_until_the_next() {
        // The write starts before flush 1 and completes while flush 2 runs,
        // after flush 2 took its checksum pages: flush 2 persisted neither
        // its checksums nor (perhaps) its data, so flush 2 must not clear it.
        let mut log = DirtyLog::default();
        assert_eq!(log.before_write([9]), vec![9]);
        let covered = log.start_flush();
        assert!(log.after_flush(&covered).is_empty(), "in flight");
        let covered = log.start_flush();
        log.after_write([9]);
        assert!(log.after_flush(&covered).is_empty(), "completed mid-flush");
        assert!(log.is_dirty(9));
        // Flush 3 took the pages after the write completed: it covers it,
        // and flush 4, quiet, clears the region.
        let covered = log.start_flush();
        assert!(log.after_flush(&covered).is_empty());
        let covered = log.start_flush();
        assert_eq!(log.after_flush(&covered), vec![9]);
    }

    #[test]
    fn the_log_persists_each_region_once_and_clears_after_a_quiet_flush() {
        let mut log = DirtyLog::default();
        assert_eq!(log.before_write([3, 4]), vec![3, 4]);
        assert_eq!(log.before_write([4, 5]), vec![5], "4 is already durable");
        log.after_write([3, 4]);
        log.after_write([4, 5]);
        // A flush covering those writes: they were written in its interval,
        // so nothing clears yet.
        let covered = log.start_flush();
        assert!(log.after_flush(&covered).is_empty());
        // Region 5 is written again; 3 and 4 stay quiet through the next
        // flush, which clears them (their writes were durable at the first).
        log.before_write([5]);
        let covered = log.start_flush();
        assert_eq!(log.after_flush(&covered), vec![3, 4]);
        assert!(log.is_dirty(5));
        // The write to 5 is still in flight: 5 stays dirty however many
        // flushes pass.
        for _ in 0..2 {
            let covered = log.start_flush();
            assert!(log.after_flush(&covered).is_empty());
        }
        // It completes: the next flush makes it durable, the one after clears.
        log.after_write([5]);
        let covered = log.start_flush();
        assert!(log.after_flush(&covered).is_empty());
        let covered = log.start_flush();
        assert_eq!(log.after_flush(&covered), vec![5]);
        // A clean shutdown clears everything once its final flush is done.
        log.before_write([7, 8]);
        log.after_write([7, 8]);
        let covered = log.start_flush();
        assert!(log.after_flush(&covered).is_empty());
        assert_eq!(log.clear_after_final_flush(), vec![7, 8]);
        assert!(!log.is_dirty(3));
        assert_eq!(
            log.before_write([3]),
            vec![3],
            "a cleared region is persisted again"
        );
    }
}
