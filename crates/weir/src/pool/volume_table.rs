//! The volume table: every volume of a pool, with the run of logical
//! chunks reserved for it. One copy on every member, in the
//! `volume_table` region; the valid copy with the highest generation wins.
//!
//! ```text
//!  0 magic "WEIRVOLT" | 8 generation | 16 count | 20 entries ... | last 4 bytes: crc32c
//!  entry: name length (1) | name (up to 64) | size bytes (8) | block bytes (4)
//!         | first chunk (8) | chunks (8)
//! ```

use super::geometry::{CHUNK_BYTES, VOLUME_TABLE_BYTES};

const MAGIC: &[u8; 8] = b"WEIRVOLT";
const NAME_BYTES_MAX: usize = 64;
const ENTRY_BYTES_MAX: usize = 1 + NAME_BYTES_MAX + 8 + 4 + 8 + 8;
const HEADER_BYTES: usize = 20;
/// Volumes one table holds.
pub const VOLUMES_MAX: usize = (VOLUME_TABLE_BYTES as usize - HEADER_BYTES - 4) / ENTRY_BYTES_MAX;
const _: () = assert!(
    VOLUMES_MAX >= 500,
    "the table should hold hundreds of volumes"
);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeEntry {
    pub name: String,
    pub size_bytes: u64,
    pub block_bytes: u32,
    pub first_chunk: u64,
    pub chunks: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeTable {
    pub generation: u64,
    pub volumes: Vec<VolumeEntry>,
}

pub fn check_volume_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid volume name {name:?}: 1-{NAME_BYTES_MAX} letters, digits, '-', '_' or '.'"
        ))
    }
}

impl VolumeTable {
    pub fn encode(&self) -> Vec<u8> {
        assert!(
            self.volumes.len() <= VOLUMES_MAX,
            "too many volumes for one table"
        );
        let mut b = vec![0u8; VOLUME_TABLE_BYTES as usize];
        b[0..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&self.generation.to_be_bytes());
        b[16..20].copy_from_slice(&(self.volumes.len() as u32).to_be_bytes());
        let mut at = HEADER_BYTES;
        for v in &self.volumes {
            let name = v.name.as_bytes();
            assert!(
                check_volume_name(&v.name).is_ok(),
                "names are checked on the way in"
            );
            b[at] = name.len() as u8;
            b[at + 1..at + 1 + name.len()].copy_from_slice(name);
            at += 1 + name.len();
            for field in [
                v.size_bytes.to_be_bytes().as_slice(),
                &v.block_bytes.to_be_bytes(),
            ] {
                b[at..at + field.len()].copy_from_slice(field);
                at += field.len();
            }
            for field in [v.first_chunk, v.chunks] {
                b[at..at + 8].copy_from_slice(&field.to_be_bytes());
                at += 8;
            }
        }
        let crc_at = b.len() - 4;
        let crc = crc32c::crc32c(&b[..crc_at]);
        b[crc_at..].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// None for a blank region, or one that is damaged.
    pub fn decode(b: &[u8]) -> Option<VolumeTable> {
        if b.len() != VOLUME_TABLE_BYTES as usize || &b[0..8] != MAGIC {
            return None;
        }
        let crc_at = b.len() - 4;
        if crc32c::crc32c(&b[..crc_at]) != u32::from_be_bytes(b[crc_at..].try_into().ok()?) {
            return None;
        }
        let generation = u64::from_be_bytes(b[8..16].try_into().ok()?);
        let count = u32::from_be_bytes(b[16..20].try_into().ok()?) as usize;
        if count > VOLUMES_MAX {
            return None;
        }
        let mut at = HEADER_BYTES;
        let mut volumes = Vec::with_capacity(count);
        for _ in 0..count {
            let len = b[at] as usize;
            let name = String::from_utf8(b.get(at + 1..at + 1 + len)?.to_vec()).ok()?;
            check_volume_name(&name).ok()?;
            at += 1 + len;
            let u64_at = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
            let size_bytes = u64_at(at);
            let block_bytes = u32::from_be_bytes(b[at + 8..at + 12].try_into().ok()?);
            let first_chunk = u64_at(at + 12);
            let chunks = u64_at(at + 20);
            at += 28;
            if chunks.checked_mul(CHUNK_BYTES)? < size_bytes {
                return None;
            }
            volumes.push(VolumeEntry {
                name,
                size_bytes,
                block_bytes,
                first_chunk,
                chunks,
            });
        }
        Some(VolumeTable {
            generation,
            volumes,
        })
    }

    /// The newest valid copy among the members' copies; an empty table
    /// (generation 0) if none is valid, as on a new pool.
    pub fn newest(copies: impl IntoIterator<Item = Option<VolumeTable>>) -> VolumeTable {
        copies
            .into_iter()
            .flatten()
            .max_by_key(|t| t.generation)
            .unwrap_or_default()
    }

    pub fn find(&self, name: &str) -> Option<&VolumeEntry> {
        self.volumes.iter().find(|v| v.name == name)
    }

    pub fn taken(&self) -> Vec<(u64, u64)> {
        self.volumes
            .iter()
            .map(|v| (v.first_chunk, v.chunks))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> VolumeTable {
        VolumeTable {
            generation: 3,
            volumes: vec![
                VolumeEntry {
                    name: "db".into(),
                    size_bytes: 10 << 30,
                    block_bytes: 4096,
                    first_chunk: 0,
                    chunks: 10 << 10,
                },
                VolumeEntry {
                    name: "vm-1.img".into(),
                    size_bytes: 1_000_000,
                    block_bytes: 16384,
                    first_chunk: 10 << 10,
                    chunks: 1,
                },
            ],
        }
    }

    #[test]
    fn tables_round_trip_and_damage_is_detected() {
        let bytes = table().encode();
        assert_eq!(VolumeTable::decode(&bytes), Some(table()));
        let mut damaged = bytes.clone();
        damaged[30] ^= 1;
        assert_eq!(VolumeTable::decode(&damaged), None);
        assert_eq!(
            VolumeTable::decode(&vec![0; VOLUME_TABLE_BYTES as usize]),
            None
        );
    }

    #[test]
    fn the_newest_valid_copy_wins() {
        let mut older = table();
        older.generation = 2;
        older.volumes.pop();
        let newest = VolumeTable::newest([Some(older), None, Some(table())]);
        assert_eq!(newest, table());
        assert_eq!(VolumeTable::newest([None, None]), VolumeTable::default());
    }

    #[test]
    fn a_full_table_still_fits() {
        let mut full = VolumeTable::default();
        for i in 0..VOLUMES_MAX {
            full.volumes.push(VolumeEntry {
                name: format!("{i:0>64}"),
                size_bytes: 1,
                block_bytes: 4096,
                first_chunk: i as u64,
                chunks: 1,
            });
        }
        assert_eq!(VolumeTable::decode(&full.encode()), Some(full));
    }
}
