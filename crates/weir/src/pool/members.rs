//! Reading and writing the labels of a pool's member devices.

use std::io;

use super::geometry::DeviceRegions;
use super::holder::Holder;
use super::label::{decode_holder, label_offsets, Label, LabelError, LABEL_BYTES};
use crate::device::{run_sync, AlignedBuf, Device, DeviceOp};

/// Both label copies of `device`, each decoded or the reason it is not.
/// An I/O error reading a copy counts as that copy being corrupt.
pub fn read_labels(device: &dyn Device) -> [Result<Label, LabelError>; 2] {
    read_stamped_labels(device).map(|copy| copy.map(|(label, _)| label))
}

/// Both label copies of `device` with the holder each names.
pub fn read_stamped_labels(
    device: &dyn Device,
) -> [Result<(Label, Option<Holder>), LabelError>; 2] {
    let size_bytes = device.info().size_bytes;
    if size_bytes < 2 * LABEL_BYTES as u64 {
        return [0, 1].map(|_| Err(LabelError::TooSmall(size_bytes)));
    }
    label_offsets(size_bytes).map(|offset| {
        let outcome = run_sync(
            device,
            DeviceOp::Read {
                offset,
                buf: AlignedBuf::new(LABEL_BYTES),
            },
        );
        match (outcome.result, outcome.buf) {
            (Ok(()), Some(buf)) => {
                Label::decode(buf.as_slice()).map(|label| (label, decode_holder(buf.as_slice())))
            }
            _ => Err(LabelError::Corrupt),
        }
    })
}

/// Write the copies listed in `which` (0: start, 1: end), stamped with
/// `holder`, each made durable before the next, so a crash leaves at
/// least one intact.
pub fn write_labels(
    device: &dyn Device,
    label: &Label,
    holder: Option<&Holder>,
    which: &[usize],
) -> io::Result<()> {
    let bytes = label
        .encode(holder)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let offsets = label_offsets(device.info().size_bytes);
    for &copy in which {
        let mut buf = AlignedBuf::new(LABEL_BYTES);
        buf.as_mut_slice().copy_from_slice(&bytes);
        let op = DeviceOp::Write {
            offset: offsets[copy],
            buf: buf.into(),
            durable: true,
        };
        run_sync(device, op).result?;
    }
    Ok(())
}

/// Zero both label copies: the device no longer belongs to any pool.
pub fn erase_labels(device: &dyn Device) -> io::Result<()> {
    for offset in label_offsets(device.info().size_bytes) {
        // Buffers are reused, not zeroed: this one may hold a label.
        let mut buf = AlignedBuf::new(LABEL_BYTES);
        buf.as_mut_slice().fill(0);
        let op = DeviceOp::Write {
            offset,
            buf: buf.into(),
            durable: true,
        };
        run_sync(device, op).result?;
    }
    Ok(())
}

/// Allocate a member's metadata (labels, volume table, checksums, dirty
/// log) so that on a sparse file a full file system can fail only data
/// writes, never a flush or a recovery.
pub fn reserve_metadata(device: &dyn Device) -> io::Result<()> {
    let size_bytes = device.info().size_bytes;
    let Some(regions) = DeviceRegions::plan(size_bytes) else {
        return Ok(());
    };
    device.reserve(0, regions.data.0)?;
    let tail = label_offsets(size_bytes)[1];
    device.reserve(tail, size_bytes - tail)
}
