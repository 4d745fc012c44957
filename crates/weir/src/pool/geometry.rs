//! Where things live on a pool's devices, and where a volume's bytes land.
//! Sans-IO arithmetic, asserted.
//!
//! ```text
//!  member device:
//!   0      4K          68K                 +checksums       +dirty log     1 MiB-aligned           end-4K
//!   [label][volume table][checksums: 8 B per data block][dirty-region bitmap][data ............][label]
//!
//!  pool logical space: the groups' data regions striped in 1 MiB chunks
//!   chunk c -> group c % groups, chunk c / groups within that group's data region
//!  volume: a contiguous run of logical chunks, reserved at creation
//! ```

use super::label::LABEL_BYTES;

/// Stripe unit across mirror groups, and the dirty-region granularity.
pub const CHUNK_BYTES: u64 = 1 << 20;
/// Data blocks are checksummed in units of this size.
pub const DATA_BLOCK_BYTES: u64 = 4096;
/// A checksum entry: crc32c and flags.
pub const CHECKSUM_ENTRY_BYTES: u64 = 8;
pub const VOLUME_TABLE_BYTES: u64 = 64 << 10;
const ALIGN_BYTES: u64 = 4096;

/// The regions of one member device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRegions {
    pub volume_table: (u64, u64),
    pub checksums: (u64, u64),
    pub dirty_log: (u64, u64),
    pub data: (u64, u64),
}

impl DeviceRegions {
    /// The largest data region that fits on `device_bytes` with its own
    /// checksums and dirty log; None if not even one chunk fits.
    pub fn plan(device_bytes: u64) -> Option<DeviceRegions> {
        let label = LABEL_BYTES as u64;
        let table_at = label;
        let sums_at = table_at + VOLUME_TABLE_BYTES;
        let usable_end = (device_bytes / ALIGN_BYTES).checked_sub(1)? * ALIGN_BYTES; // label B
                                                                                     // Per data chunk: the chunk itself, its checksums, and one bit.
        let per_chunk = CHUNK_BYTES + CHUNK_BYTES / DATA_BLOCK_BYTES * CHECKSUM_ENTRY_BYTES;
        let mut chunks = usable_end.saturating_sub(sums_at) / per_chunk;
        loop {
            if chunks == 0 {
                return None;
            }
            let sums_bytes = (chunks * CHUNK_BYTES / DATA_BLOCK_BYTES * CHECKSUM_ENTRY_BYTES)
                .next_multiple_of(ALIGN_BYTES);
            let log_at = sums_at + sums_bytes;
            let log_bytes = chunks.div_ceil(8).next_multiple_of(ALIGN_BYTES);
            let data_at = (log_at + log_bytes).next_multiple_of(CHUNK_BYTES);
            let data_bytes = chunks * CHUNK_BYTES;
            if data_at + data_bytes <= usable_end {
                return Some(DeviceRegions {
                    volume_table: (table_at, VOLUME_TABLE_BYTES),
                    checksums: (sums_at, sums_bytes),
                    dirty_log: (log_at, log_bytes),
                    data: (data_at, data_bytes),
                });
            }
            chunks -= 1;
        }
    }

    pub fn data_chunks(&self) -> u64 {
        self.data.1 / CHUNK_BYTES
    }

    /// Where the checksum entry of the data block at `data_offset` (bytes
    /// from the start of the data region) lives on the device.
    pub fn checksum_offset(&self, data_offset: u64) -> u64 {
        assert!(data_offset < self.data.1, "offset past the data region");
        self.checksums.0 + data_offset / DATA_BLOCK_BYTES * CHECKSUM_ENTRY_BYTES
    }
}

/// A piece of a logical range on one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub group: usize,
    /// Bytes from the start of each member's data region.
    pub data_offset: u64,
    pub length: u64,
    /// Where the piece starts within the logical range asked for.
    pub range_offset: u64,
}

/// The pool's logical space: `groups` data regions of `chunks_per_group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stripe {
    pub groups: usize,
    pub chunks_per_group: u64,
}

impl Stripe {
    pub fn logical_bytes(&self) -> u64 {
        self.groups as u64 * self.chunks_per_group * CHUNK_BYTES
    }

    /// Split `[offset, offset + length)` of logical space into per-group pieces.
    pub fn map(&self, offset: u64, length: u64) -> Vec<Piece> {
        assert!(
            offset
                .checked_add(length)
                .is_some_and(|end| end <= self.logical_bytes()),
            "logical range past the pool"
        );
        let mut pieces = Vec::new();
        let mut at = offset;
        let end = offset + length;
        while at < end {
            let chunk = at / CHUNK_BYTES;
            let within = at % CHUNK_BYTES;
            let take = (CHUNK_BYTES - within).min(end - at);
            let groups = self.groups as u64;
            pieces.push(Piece {
                group: (chunk % groups) as usize,
                data_offset: (chunk / groups) * CHUNK_BYTES + within,
                length: take,
                range_offset: at - offset,
            });
            at += take;
        }
        pieces
    }
}

/// Reserve `bytes` for a new volume among `taken` runs of chunks
/// (`(first, count)`): the first gap that fits. None if the pool is full.
pub fn allocate(taken: &[(u64, u64)], total_chunks: u64, bytes: u64) -> Option<(u64, u64)> {
    let need = bytes.div_ceil(CHUNK_BYTES).max(1);
    let mut runs = taken.to_vec();
    runs.sort_unstable();
    let mut at = 0;
    for (first, count) in runs {
        if first >= at + need {
            break;
        }
        at = at.max(first + count);
    }
    (at + need <= total_chunks).then_some((at, need))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_fit_in_order_without_overlap() {
        for size in [64u64 << 20, 1 << 30, (10 << 30) + 12345] {
            let r = DeviceRegions::plan(size).unwrap();
            let order = [r.volume_table, r.checksums, r.dirty_log, r.data];
            assert_eq!(order[0].0, LABEL_BYTES as u64);
            for pair in order.windows(2) {
                assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{pair:?} overlap");
            }
            assert_eq!(r.data.0 % CHUNK_BYTES, 0);
            assert!(
                r.data.0 + r.data.1 <= size / 4096 * 4096 - 4096,
                "data runs into label B"
            );
            let blocks = r.data.1 / DATA_BLOCK_BYTES;
            assert!(r.checksums.1 >= blocks * CHECKSUM_ENTRY_BYTES);
            assert!(r.dirty_log.1 * 8 >= r.data_chunks());
            // The overhead is small: more than 97% of a 1 GiB device holds data.
            if size == 1 << 30 {
                assert!(r.data.1 as f64 / size as f64 > 0.97, "{r:?}");
            }
        }
        assert_eq!(DeviceRegions::plan(1 << 20), None);
    }

    #[test]
    fn checksum_entries_follow_the_data_blocks() {
        let r = DeviceRegions::plan(1 << 30).unwrap();
        assert_eq!(r.checksum_offset(0), r.checksums.0);
        assert_eq!(r.checksum_offset(4096 * 3 + 5), r.checksums.0 + 24);
    }

    #[test]
    fn logical_ranges_stripe_over_groups_by_chunk() {
        let stripe = Stripe {
            groups: 2,
            chunks_per_group: 10,
        };
        let pieces = stripe.map(CHUNK_BYTES - 4096, 2 * CHUNK_BYTES);
        assert_eq!(
            pieces,
            vec![
                Piece {
                    group: 0,
                    data_offset: CHUNK_BYTES - 4096,
                    length: 4096,
                    range_offset: 0
                },
                Piece {
                    group: 1,
                    data_offset: 0,
                    length: CHUNK_BYTES,
                    range_offset: 4096
                },
                Piece {
                    group: 0,
                    data_offset: CHUNK_BYTES,
                    length: CHUNK_BYTES - 4096,
                    range_offset: 4096 + CHUNK_BYTES
                },
            ]
        );
        assert_eq!(
            pieces.iter().map(|p| p.length).sum::<u64>(),
            2 * CHUNK_BYTES
        );
    }

    #[test]
    fn volumes_take_the_first_gap_that_fits() {
        assert_eq!(allocate(&[], 10, 3 * CHUNK_BYTES), Some((0, 3)));
        assert_eq!(allocate(&[(0, 3)], 10, 1), Some((3, 1)));
        assert_eq!(
            allocate(&[(0, 3), (5, 2)], 10, 2 * CHUNK_BYTES),
            Some((3, 2))
        );
        assert_eq!(
            allocate(&[(0, 3), (5, 2)], 10, 3 * CHUNK_BYTES),
            Some((7, 3))
        );
        assert_eq!(allocate(&[(0, 3), (5, 2)], 10, 4 * CHUNK_BYTES), None);
    }
}
