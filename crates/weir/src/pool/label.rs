//! Device labels: who a device belongs to and where it sits in its pool.
//! Sans-IO: bytes in, a label (or a reason) out.
//!
//! ```text
//!  device:  [label A: 4 KiB][ ... pool metadata and data ... ][label B: last 4 KiB]
//!
//!  label:   0 magic "WEIRLBL1" | 8 version | 12 block bytes | 16 pool id | 32 device id
//!           48 generation | 56 device bytes | 64 group, member | 68 groups, members per group
//!           72 name length | 73 pool name (up to 64 bytes) | 137 flags (bit 0: this
//!           device is being resilvered) | 140 member ids, 16 bytes each,
//!           group by group | 3980 holder stamp (112 bytes, see holder.rs)
//!           | 4092 crc32c of bytes 0..4092
//! ```
//!
//! Two copies, at both ends of the device, so that neither a wiped
//! partition table nor a clobbered tail loses the pool. Every change writes
//! both with a higher generation; on import the valid copy with the higher
//! generation wins and a stale or corrupt one is rewritten.

use std::fmt;

use super::holder::{Holder, STAMP_BYTES};

/// Copies a mirror may have: the read selector holds sets of copies as
/// bits of a `u64`, so that choosing allocates nothing on the read path.
pub const COPIES_MAX: usize = 64;

pub const LABEL_BYTES: usize = 4096;
const MAGIC: &[u8; 8] = b"WEIRLBL1";
const VERSION: u32 = 1;
const NAME_BYTES_MAX: usize = 64;
const FLAGS_AT: usize = 137;
const FLAG_RESILVERING: u8 = 1;
const MEMBERS_AT: usize = 140;
const CRC_AT: usize = LABEL_BYTES - 4;
const STAMP_AT: usize = CRC_AT - STAMP_BYTES;
/// Member ids that fit between `MEMBERS_AT` and the holder stamp.
pub const MEMBERS_MAX: usize = (STAMP_AT - MEMBERS_AT) / 16;

/// The shape of a pool: mirror groups striped together, each member a
/// device id. Every group has the same number of copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub groups: Vec<Vec<u128>>,
}

impl Layout {
    pub fn validate(&self) -> Result<(), LabelError> {
        let copies = self.groups.first().map_or(0, Vec::len);
        if self.groups.is_empty() || copies == 0 {
            return Err(LabelError::Layout(
                "a pool needs at least one device".into(),
            ));
        }
        if self.groups.iter().any(|g| g.len() != copies) {
            return Err(LabelError::Layout(
                "every mirror group needs the same number of copies".into(),
            ));
        }
        if copies > COPIES_MAX {
            return Err(LabelError::Layout(format!(
                "at most {COPIES_MAX} copies in a mirror, got {copies}"
            )));
        }
        let mut ids: Vec<u128> = self.groups.iter().flatten().copied().collect();
        if ids.len() > MEMBERS_MAX || self.groups.len() > u16::MAX as usize {
            return Err(LabelError::Layout(format!(
                "at most {MEMBERS_MAX} devices in a pool"
            )));
        }
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(LabelError::Layout("a device is listed twice".into()));
        }
        Ok(())
    }

    /// Where `device` sits: (group, member).
    pub fn place_of(&self, device: u128) -> Option<(usize, usize)> {
        self.groups
            .iter()
            .enumerate()
            .find_map(|(g, members)| members.iter().position(|m| *m == device).map(|m| (g, m)))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub pool_id: u128,
    pub pool_name: String,
    pub device_id: u128,
    /// Raised on every change of the pool's configuration.
    pub generation: u64,
    /// The device's size when it was labelled.
    pub device_bytes: u64,
    pub block_bytes: u32,
    pub layout: Layout,
    /// This device joined by `pool replace` and its copy is not complete
    /// yet: it must not be read, and the resilver starts over on import.
    pub resilvering: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelError {
    /// No label magic: a blank device, or one that never was weir's.
    NotALabel,
    /// The magic is there but the checksum does not match.
    Corrupt,
    UnsupportedVersion(u32),
    /// The label decodes but describes an impossible pool.
    Layout(String),
    /// The device is smaller than two labels (a file truncated, say).
    TooSmall(u64),
}

impl fmt::Display for LabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelError::NotALabel => write!(f, "no weir label"),
            LabelError::Corrupt => write!(f, "label checksum mismatch"),
            LabelError::UnsupportedVersion(v) => {
                write!(f, "label format version {v} is not supported")
            }
            LabelError::Layout(why) => write!(f, "invalid pool layout: {why}"),
            LabelError::TooSmall(bytes) => {
                write!(f, "no weir label: the device holds only {bytes} bytes")
            }
        }
    }
}

impl std::error::Error for LabelError {}

/// Byte offsets of the two label copies on a device of `device_bytes`.
pub fn label_offsets(device_bytes: u64) -> [u64; 2] {
    let last = (device_bytes / LABEL_BYTES as u64).saturating_sub(1) * LABEL_BYTES as u64;
    [0, last]
}

impl Label {
    /// The label's bytes, with `holder`'s stamp if a process holds the
    /// device.
    pub fn encode(&self, holder: Option<&Holder>) -> Result<Vec<u8>, LabelError> {
        self.layout.validate()?;
        if self.layout.place_of(self.device_id).is_none() {
            return Err(LabelError::Layout(
                "the device is not in its own layout".into(),
            ));
        }
        let name = self.pool_name.as_bytes();
        if name.is_empty() || name.len() > NAME_BYTES_MAX {
            return Err(LabelError::Layout(format!(
                "pool names are 1-{NAME_BYTES_MAX} bytes"
            )));
        }
        let (group, member) = self.layout.place_of(self.device_id).expect("checked above");
        let mut b = vec![0u8; LABEL_BYTES];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_be_bytes());
        b[12..16].copy_from_slice(&self.block_bytes.to_be_bytes());
        b[16..32].copy_from_slice(&self.pool_id.to_be_bytes());
        b[32..48].copy_from_slice(&self.device_id.to_be_bytes());
        b[48..56].copy_from_slice(&self.generation.to_be_bytes());
        b[56..64].copy_from_slice(&self.device_bytes.to_be_bytes());
        b[64..66].copy_from_slice(&(group as u16).to_be_bytes());
        b[66..68].copy_from_slice(&(member as u16).to_be_bytes());
        b[68..70].copy_from_slice(&(self.layout.groups.len() as u16).to_be_bytes());
        b[70..72].copy_from_slice(&(self.layout.groups[0].len() as u16).to_be_bytes());
        b[72] = name.len() as u8;
        b[73..73 + name.len()].copy_from_slice(name);
        if self.resilvering {
            b[FLAGS_AT] |= FLAG_RESILVERING;
        }
        for (i, id) in self.layout.groups.iter().flatten().enumerate() {
            let at = MEMBERS_AT + i * 16;
            b[at..at + 16].copy_from_slice(&id.to_be_bytes());
        }
        if let Some(holder) = holder {
            holder.encode_into(&mut b[STAMP_AT..CRC_AT]);
        }
        let crc = crc32c::crc32c(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&crc.to_be_bytes());
        Ok(b)
    }

    pub fn decode(b: &[u8]) -> Result<Label, LabelError> {
        if b.len() < LABEL_BYTES || &b[0..8] != MAGIC {
            return Err(LabelError::NotALabel);
        }
        let u16_at = |at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
        let u32_at = |at: usize| u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let u128_at = |at: usize| u128::from_be_bytes(b[at..at + 16].try_into().expect("16 bytes"));
        if crc32c::crc32c(&b[..CRC_AT]) != u32_at(CRC_AT) {
            return Err(LabelError::Corrupt);
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(LabelError::UnsupportedVersion(version));
        }
        let (groups, members) = (u16_at(68) as usize, u16_at(70) as usize);
        if groups * members > MEMBERS_MAX {
            return Err(LabelError::Layout("more members than a label holds".into()));
        }
        let name_len = b[72] as usize;
        if name_len > NAME_BYTES_MAX {
            return Err(LabelError::Layout("pool name too long".into()));
        }
        if b[FLAGS_AT] & !FLAG_RESILVERING != 0 {
            return Err(LabelError::Layout(format!(
                "unknown label flags {:#04x}",
                b[FLAGS_AT]
            )));
        }
        let pool_name = String::from_utf8(b[73..73 + name_len].to_vec())
            .map_err(|_| LabelError::Layout("pool name is not UTF-8".into()))?;
        let layout = Layout {
            groups: (0..groups)
                .map(|g| {
                    (0..members)
                        .map(|m| u128_at(MEMBERS_AT + (g * members + m) * 16))
                        .collect()
                })
                .collect(),
        };
        layout.validate()?;
        let label = Label {
            pool_id: u128_at(16),
            pool_name,
            device_id: u128_at(32),
            generation: u64_at(48),
            device_bytes: u64_at(56),
            block_bytes: u32_at(12),
            layout,
            resilvering: b[FLAGS_AT] & FLAG_RESILVERING != 0,
        };
        let place = (u16_at(64) as usize, u16_at(66) as usize);
        if label.layout.place_of(label.device_id) != Some(place) {
            return Err(LabelError::Layout(
                "the device's place disagrees with the layout".into(),
            ));
        }
        Ok(label)
    }
}

/// The holder stamp in label bytes that `Label::decode` accepted.
pub fn decode_holder(b: &[u8]) -> Option<Holder> {
    Holder::decode(b.get(STAMP_AT..CRC_AT)?)
}

/// What the two copies on one device say.
#[derive(Debug, PartialEq, Eq)]
pub struct Chosen {
    pub label: Label,
    /// Copies (0: start, 1: end) that are missing, corrupt or older and
    /// should be rewritten from `label`.
    pub stale: Vec<usize>,
}

/// Pick the label of a device from its two copies: the valid one with the
/// higher generation. `Err(NotALabel)` when neither copy is a label at all.
pub fn choose(copies: [Result<Label, LabelError>; 2]) -> Result<Chosen, LabelError> {
    let best = copies
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.as_ref().ok().map(|l| (i, l)))
        .max_by_key(|(_, l)| l.generation);
    match best {
        Some((_, label)) => {
            let stale = (0..2)
                .filter(|&i| copies[i].as_ref().ok() != Some(label))
                .collect();
            Ok(Chosen {
                label: label.clone(),
                stale,
            })
        }
        None => {
            // Both bad: report the more telling failure.
            let [a, b] = copies.map(|c| c.expect_err("no valid copy"));
            Err(if a == LabelError::NotALabel { b } else { a })
        }
    }
}

#[cfg(test)]
mod tests;
