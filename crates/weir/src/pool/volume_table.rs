//! The volume table: every volume of a pool, with the run of logical
//! chunks reserved for it and its properties. One copy on every member,
//! in the `volume_table` region; the valid copy with the highest
//! generation wins.
//!
//! ```text
//!  0 magic "WEIRVOL2" | 8 generation | 16 count | 20 entries ... | last 4 bytes: crc32c
//!  entry: name length (1) | name (up to 64) | size bytes (8) | block bytes (4)
//!         | first chunk (8) | chunks (8) | flags (1) | description length (1)
//!         | description (up to 32)
//!  flags: bit 0 read-only; bits 1-2 cache (0 the server's, 1 writeback,
//!         2 writethrough); the others 0
//! ```
//!
//! Tables an older weir wrote (magic "WEIRVOLT") have entries without the
//! last three fields: their volumes have no properties set. They are
//! read, and written in this format at their next change.

use super::geometry::{CHUNK_BYTES, VOLUME_TABLE_BYTES};

const MAGIC: &[u8; 8] = b"WEIRVOL2";
/// The first format, with no properties.
const MAGIC_V1: &[u8; 8] = b"WEIRVOLT";
const NAME_BYTES_MAX: usize = 64;
pub const DESCRIPTION_BYTES_MAX: usize = 32;
const ENTRY_BYTES_MAX: usize = 1 + NAME_BYTES_MAX + 8 + 4 + 8 + 8 + 1 + 1 + DESCRIPTION_BYTES_MAX;
const HEADER_BYTES: usize = 20;
const TABLE_BYTES: usize = VOLUME_TABLE_BYTES as usize;
/// Volumes one table holds, whatever their names and descriptions.
pub const VOLUMES_MAX: usize = (TABLE_BYTES - HEADER_BYTES - 4) / ENTRY_BYTES_MAX;
const _: () = assert!(
    VOLUMES_MAX >= 500,
    "the table should hold hundreds of volumes"
);
const FLAG_READ_ONLY: u8 = 1;
const CACHE_SHIFT: u8 = 1;
const FLAGS_KNOWN: u8 = 0b111;

/// A volume's own cache setting, over the server's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeCache {
    Writeback,
    Writethrough,
}

/// What a volume carries beside its place: set with `weir volume set`,
/// kept with the pool, so it travels with `pool export` and `import`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeProperties {
    pub read_only: bool,
    /// None: the server's setting.
    pub cache: Option<VolumeCache>,
    /// Shown to NBD clients that list exports.
    pub description: String,
}

impl VolumeProperties {
    fn flags(&self) -> u8 {
        let cache = match self.cache {
            None => 0,
            Some(VolumeCache::Writeback) => 1,
            Some(VolumeCache::Writethrough) => 2,
        };
        u8::from(self.read_only) | cache << CACHE_SHIFT
    }

    fn from_flags(flags: u8, description: String) -> Option<VolumeProperties> {
        if flags & !FLAGS_KNOWN != 0 {
            return None;
        }
        let cache = match (flags >> CACHE_SHIFT) & 0b11 {
            0 => None,
            1 => Some(VolumeCache::Writeback),
            2 => Some(VolumeCache::Writethrough),
            _ => return None,
        };
        Some(VolumeProperties {
            read_only: flags & FLAG_READ_ONLY != 0,
            cache,
            description,
        })
    }
}

/// `weir volume set`: the properties to change; None leaves one as it is.
#[derive(Clone, Debug, Default)]
pub struct PropertyChanges {
    pub read_only: Option<bool>,
    /// Some(None): back to the server's setting.
    pub cache: Option<Option<VolumeCache>>,
    pub description: Option<String>,
}

impl PropertyChanges {
    /// From the admin endpoint's or the command line's words: read-only
    /// `on`/`off`, cache `writeback`/`writethrough`/`default`.
    pub fn parse(
        read_only: Option<&str>,
        cache: Option<&str>,
        description: Option<&str>,
    ) -> Result<PropertyChanges, String> {
        let read_only = match read_only {
            None => None,
            Some("on") => Some(true),
            Some("off") => Some(false),
            Some(other) => return Err(format!("read-only {other:?}: want on or off")),
        };
        let cache = match cache {
            None => None,
            Some("writeback") => Some(Some(VolumeCache::Writeback)),
            Some("writethrough") => Some(Some(VolumeCache::Writethrough)),
            Some("default") => Some(None),
            Some(other) => {
                return Err(format!(
                    "cache {other:?}: want writeback, writethrough or default"
                ))
            }
        };
        if let Some(text) = description {
            check_description(text)?;
        }
        if read_only.is_none() && cache.is_none() && description.is_none() {
            return Err("nothing to set: give --read-only, --cache or --description".into());
        }
        Ok(PropertyChanges {
            read_only,
            cache,
            description: description.map(String::from),
        })
    }

    pub fn apply(&self, properties: &mut VolumeProperties) {
        if let Some(read_only) = self.read_only {
            properties.read_only = read_only;
        }
        if let Some(cache) = self.cache {
            properties.cache = cache;
        }
        if let Some(description) = &self.description {
            properties.description = description.clone();
        }
    }
}

impl VolumeCache {
    pub fn name(self) -> &'static str {
        match self {
            VolumeCache::Writeback => "writeback",
            VolumeCache::Writethrough => "writethrough",
        }
    }
}

pub fn check_description(text: &str) -> Result<(), String> {
    if text.len() > DESCRIPTION_BYTES_MAX || text.chars().any(char::is_control) {
        return Err(format!(
            "a description is at most {DESCRIPTION_BYTES_MAX} bytes, without control characters"
        ));
    }
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeEntry {
    pub name: String,
    pub size_bytes: u64,
    pub block_bytes: u32,
    pub first_chunk: u64,
    pub chunks: u64,
    pub properties: VolumeProperties,
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
    /// Whether the table fits its region in this format (a table an older
    /// weir wrote with many long names may not, with the new fields).
    pub fn fits(&self) -> bool {
        let entries: usize = self
            .volumes
            .iter()
            .map(|v| 1 + v.name.len() + 28 + 2 + v.properties.description.len())
            .sum();
        HEADER_BYTES + entries + 4 <= TABLE_BYTES
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.fits(), "too many volumes for one table");
        let mut b = vec![0u8; TABLE_BYTES];
        b[0..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&self.generation.to_be_bytes());
        b[16..20].copy_from_slice(&(self.volumes.len() as u32).to_be_bytes());
        let mut at = HEADER_BYTES;
        let mut put = |bytes: &[u8]| {
            b[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        for v in &self.volumes {
            assert!(
                check_volume_name(&v.name).is_ok()
                    && check_description(&v.properties.description).is_ok(),
                "names and descriptions are checked on the way in"
            );
            put(&[v.name.len() as u8]);
            put(v.name.as_bytes());
            put(&v.size_bytes.to_be_bytes());
            put(&v.block_bytes.to_be_bytes());
            put(&v.first_chunk.to_be_bytes());
            put(&v.chunks.to_be_bytes());
            let description = v.properties.description.as_bytes();
            put(&[v.properties.flags(), description.len() as u8]);
            put(description);
        }
        let crc_at = b.len() - 4;
        let crc = crc32c::crc32c(&b[..crc_at]);
        b[crc_at..].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// None for a blank region, or one that is damaged.
    pub fn decode(b: &[u8]) -> Option<VolumeTable> {
        if b.len() != TABLE_BYTES {
            return None;
        }
        let with_properties = match &b[0..8] {
            m if m == MAGIC => true,
            m if m == MAGIC_V1 => false,
            _ => return None,
        };
        let crc_at = b.len() - 4;
        if crc32c::crc32c(&b[..crc_at]) != u32::from_be_bytes(b[crc_at..].try_into().ok()?) {
            return None;
        }
        let generation = u64::from_be_bytes(b[8..16].try_into().ok()?);
        let count = u32::from_be_bytes(b[16..20].try_into().ok()?) as usize;
        let mut at = HEADER_BYTES;
        let mut take = |len: usize| -> Option<&[u8]> {
            let bytes = b.get(at..at + len).filter(|_| at + len <= crc_at)?;
            at += len;
            Some(bytes)
        };
        let u64_of = |bytes: &[u8]| u64::from_be_bytes(bytes.try_into().expect("8 bytes"));
        let mut volumes = Vec::with_capacity(count.min(TABLE_BYTES / 30));
        for _ in 0..count {
            let len = take(1)?[0] as usize;
            let name = String::from_utf8(take(len)?.to_vec()).ok()?;
            check_volume_name(&name).ok()?;
            let size_bytes = u64_of(take(8)?);
            let block_bytes = u32::from_be_bytes(take(4)?.try_into().ok()?);
            let first_chunk = u64_of(take(8)?);
            let chunks = u64_of(take(8)?);
            if chunks.checked_mul(CHUNK_BYTES)? < size_bytes {
                return None;
            }
            let properties = if with_properties {
                let flags = take(1)?[0];
                let len = take(1)?[0] as usize;
                let description = String::from_utf8(take(len)?.to_vec()).ok()?;
                check_description(&description).ok()?;
                VolumeProperties::from_flags(flags, description)?
            } else {
                VolumeProperties::default()
            };
            volumes.push(VolumeEntry {
                name,
                size_bytes,
                block_bytes,
                first_chunk,
                chunks,
                properties,
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
                    properties: VolumeProperties::default(),
                },
                VolumeEntry {
                    name: "vm-1.img".into(),
                    size_bytes: 1_000_000,
                    block_bytes: 16384,
                    first_chunk: 10 << 10,
                    chunks: 1,
                    properties: VolumeProperties {
                        read_only: true,
                        cache: Some(VolumeCache::Writethrough),
                        description: "golden image".into(),
                    },
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
                properties: VolumeProperties {
                    read_only: true,
                    cache: Some(VolumeCache::Writeback),
                    description: "d".repeat(DESCRIPTION_BYTES_MAX),
                },
            });
        }
        assert!(full.fits());
        assert_eq!(VolumeTable::decode(&full.encode()), Some(full));
    }

    #[test]
    fn a_table_in_the_first_format_reads_with_no_properties() {
        // The first format, written by hand: one volume, no properties.
        let mut b = vec![0u8; TABLE_BYTES];
        b[0..8].copy_from_slice(MAGIC_V1);
        b[8..16].copy_from_slice(&7u64.to_be_bytes());
        b[16..20].copy_from_slice(&1u32.to_be_bytes());
        let mut entry = vec![2u8];
        entry.extend_from_slice(b"db");
        entry.extend_from_slice(&(1u64 << 20).to_be_bytes());
        entry.extend_from_slice(&4096u32.to_be_bytes());
        entry.extend_from_slice(&3u64.to_be_bytes());
        entry.extend_from_slice(&1u64.to_be_bytes());
        b[HEADER_BYTES..HEADER_BYTES + entry.len()].copy_from_slice(&entry);
        let crc = crc32c::crc32c(&b[..TABLE_BYTES - 4]);
        b[TABLE_BYTES - 4..].copy_from_slice(&crc.to_be_bytes());
        let table = VolumeTable::decode(&b).expect("a first-format table reads");
        assert_eq!(table.generation, 7);
        assert_eq!(table.volumes[0].name, "db");
        assert_eq!(table.volumes[0].first_chunk, 3);
        assert_eq!(table.volumes[0].properties, VolumeProperties::default());
        // Written again, it is in this format and reads back the same.
        assert_eq!(&table.encode()[0..8], MAGIC);
        assert_eq!(VolumeTable::decode(&table.encode()), Some(table));
    }

    #[test]
    fn unknown_flags_are_damage() {
        let mut bytes = table().encode();
        // The second entry's flags byte: header, first entry, then its own fields.
        let first = 1 + 2 + 28 + 2;
        let flags_at = HEADER_BYTES + first + 1 + "vm-1.img".len() + 28;
        assert_eq!(bytes[flags_at], 0b101);
        bytes[flags_at] |= 0b1000;
        let crc = crc32c::crc32c(&bytes[..TABLE_BYTES - 4]);
        bytes[TABLE_BYTES - 4..].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(VolumeTable::decode(&bytes), None);
    }
}
