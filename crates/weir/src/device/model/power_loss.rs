//! What a power loss does to writes the drive acknowledged but had not yet
//! made durable: the log of their previous contents, bounded by the drive's
//! volatile cache, and the plan for undoing them.
//!
//! ```text
//!  write (not FUA) ──> record(offset, old bytes)     bytes_max = the drive's write cache
//!  flush           ──> flushed(): all durable        (older entries fall out: destaged)
//!  power loss      ──> restores(): newest first, the old bytes to put back
//!                        drop: whole writes vanish; tear: each write keeps
//!                        only its first half (in 512-byte sectors; a
//!                        one-sector write lands whole)
//! ```
//!
//! Sans-IO: the real-time engine reads the old bytes and writes them back.

use std::collections::VecDeque;

use crate::device::AlignedBuf;

/// A single sector is written atomically; a tear falls between sectors.
pub const SECTOR_BYTES: u64 = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerLoss {
    /// Unflushed writes are lost whole.
    Drop,
    /// Unflushed writes land partly: their first half survives.
    Tear,
}

impl PowerLoss {
    pub fn parse(text: &str) -> Result<PowerLoss, String> {
        match text {
            "drop" => Ok(PowerLoss::Drop),
            "tear" => Ok(PowerLoss::Tear),
            _ => Err("want power_loss=drop or power_loss=tear".into()),
        }
    }
}

pub struct UnflushedLog {
    mode: PowerLoss,
    bytes_max: u64,
    /// (offset, contents before the write), oldest first.
    entries: VecDeque<(u64, AlignedBuf)>,
    bytes: u64,
}

impl UnflushedLog {
    /// `bytes_max`: how much the drive can hold unflushed (its write cache).
    pub fn new(mode: PowerLoss, bytes_max: u64) -> UnflushedLog {
        UnflushedLog {
            mode,
            bytes_max,
            entries: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Whether a write of `length` bytes would be kept at all.
    pub fn tracks(&self, length: u64) -> bool {
        length <= self.bytes_max
    }

    /// A write is acknowledged; `old` is what the range held before it.
    pub fn record(&mut self, offset: u64, old: AlignedBuf) {
        let length = old.len() as u64;
        if !self.tracks(length) {
            return;
        }
        self.bytes += length;
        self.entries.push_back((offset, old));
        // The drive destages its oldest writes to make room.
        while self.bytes > self.bytes_max {
            let (_, oldest) = self.entries.pop_front().expect("bytes counted");
            self.bytes -= oldest.len() as u64;
        }
    }

    pub fn flushed(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    pub fn unflushed_bytes(&self) -> u64 {
        self.bytes
    }

    /// What to write back at a power loss, newest write first, so that
    /// the oldest contents win where writes overlapped.
    pub fn restores(&self) -> Vec<(u64, &[u8])> {
        self.entries
            .iter()
            .rev()
            .filter_map(|(offset, old)| {
                let bytes = old.as_slice();
                let keep = match self.mode {
                    PowerLoss::Drop => 0,
                    // A single sector is atomic: it lands whole.
                    PowerLoss::Tear if bytes.len() as u64 <= SECTOR_BYTES => bytes.len(),
                    PowerLoss::Tear => {
                        (bytes.len() as u64 / 2 / SECTOR_BYTES * SECTOR_BYTES) as usize
                    }
                };
                (keep < bytes.len()).then(|| (offset + keep as u64, &bytes[keep..]))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(len: usize, fill: u8) -> AlignedBuf {
        let mut b = AlignedBuf::new(len);
        b.as_mut_slice().fill(fill);
        b
    }

    #[test]
    fn drop_restores_whole_writes_newest_first() {
        let mut log = UnflushedLog::new(PowerLoss::Drop, 1 << 20);
        log.record(0, buf(4096, 1));
        log.record(4096, buf(8192, 2));
        let r = log.restores();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].0, r[0].1.len()), (4096, 8192));
        assert_eq!((r[1].0, r[1].1.len()), (0, 4096));
        log.flushed();
        assert!(log.restores().is_empty());
    }

    #[test]
    fn tear_keeps_the_first_half_in_whole_sectors() {
        let mut log = UnflushedLog::new(PowerLoss::Tear, 1 << 20);
        log.record(8192, buf(4096, 1));
        log.record(0, buf(512, 2)); // one sector: atomic, lands whole
        let r = log.restores();
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].0, r[0].1.len()), (8192 + 2048, 2048));
    }

    #[test]
    fn the_log_holds_no_more_than_the_write_cache() {
        let mut log = UnflushedLog::new(PowerLoss::Drop, 8192);
        for i in 0..4 {
            log.record(i * 4096, buf(4096, i as u8));
        }
        assert_eq!(log.unflushed_bytes(), 8192);
        let offsets: Vec<u64> = log.restores().iter().map(|r| r.0).collect();
        assert_eq!(
            offsets,
            vec![12288, 8192],
            "the oldest writes were destaged"
        );
        assert!(!log.tracks(16384));
    }
}
