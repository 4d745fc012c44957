//! Whether a device with no weir label is free to become a pool member.
//!
//! A missing label does not make a device spare: a path mistyped in
//! `pool create` or `pool replace` may name a database file or another
//! system's disk, and labelling and resilvering it destroys that data. So
//! a file must hold nothing but zeros (a sparse file from `truncate -s`
//! holds none at all), and a block device must be blank where partition
//! tables, filesystems, LVM and ZFS keep their labels: its first and last
//! MiB. An RBD image, like a file, must hold nothing but zeros where it
//! is allocated. Anything else needs `--force`.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use anyhow::{bail, Context};

use super::label::{choose, LabelError};
use super::members::read_labels;
use super::takeover::check_named_holders;
use crate::device::{run_sync, AlignedBuf, Device, DeviceOp};

/// Smaller devices cannot hold labels, metadata and useful data.
pub const DEVICE_BYTES_MIN: u64 = 64 << 20;

/// Refuse `device` (named `text`) as a new member unless it is large
/// enough and free: no weir label (or one of `own_pool`, the pool it
/// rejoins) and no one else's data. `force` takes a labelled or used
/// device anyway, never one too small.
pub fn check_free(
    text: &str,
    device: &dyn Device,
    own_pool: Option<u128>,
    force: bool,
) -> anyhow::Result<()> {
    let size = device.info().size_bytes;
    if size < DEVICE_BYTES_MIN {
        bail!("{text} is too small: {size} bytes, a pool member needs at least {DEVICE_BYTES_MIN}");
    }
    match choose(read_labels(device)) {
        Ok(found) if Some(found.label.pool_id) == own_pool => Ok(()),
        Err(LabelError::NotALabel) => match occupied(text, device)? {
            Some(why) if force => {
                tracing::warn!(
                    device = text,
                    "taking a device that is in use (--force): {why}"
                );
                Ok(())
            }
            Some(why) => bail!("{text} is in use: {why}; use --force to take it"),
            None => Ok(()),
        },
        _ if force => {
            // Never another live server's member, --force or not.
            check_named_holders(&[(text, device)], true)?;
            tracing::warn!(device = text, "overwriting an existing label (--force)");
            Ok(())
        }
        Ok(found) => bail!(
            "{text} belongs to pool {:?} (generation {}); use --force to take it",
            found.label.pool_name,
            found.label.generation
        ),
        Err(err) => bail!("{text} has a damaged weir label ({err}); use --force to take it"),
    }
}

/// How much of each end of a block device must be blank.
const BLOCK_DEVICE_ENDS_BYTES: u64 = 1 << 20;
const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// Why the device `text` names may not be taken without `--force`, or
/// None if it may. Device models are the simulator's and are not checked.
fn occupied(text: &str, device: &dyn Device) -> anyhow::Result<Option<String>> {
    if text.starts_with("rbd:") {
        return occupied_where_allocated(device);
    }
    occupied_path(text)
}

/// `occupied` for a path, or a device of the simulator's.
fn occupied_path(text: &str) -> anyhow::Result<Option<String>> {
    if text.starts_with("model:") || text.starts_with("mem:") {
        return Ok(None);
    }
    let path = Path::new(text.strip_prefix("file:").unwrap_or(text));
    let mut file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let kind = file.metadata()?.file_type();
    if kind.is_block_device() {
        let size = file.seek(SeekFrom::End(0))?;
        let head = size.min(BLOCK_DEVICE_ENDS_BYTES);
        let tail_start = size.saturating_sub(BLOCK_DEVICE_ENDS_BYTES).max(head);
        for (start, end) in [(0, head), (tail_start, size)] {
            if let Some(at) = first_nonzero(&mut file, start, end)? {
                return Ok(Some(format!(
                    "it is not blank at byte {at} (a partition table, filesystem or other data)"
                )));
            }
        }
        return Ok(None);
    }
    let size = file.metadata()?.len();
    let mut at = 0;
    while let Some(data) = next_data(&file, at)? {
        let end = next_hole(&file, data)?.min(size);
        if let Some(found) = first_nonzero(&mut file, data, end)? {
            return Ok(Some(format!("it holds data (at byte {found})")));
        }
        at = end;
    }
    Ok(None)
}

/// A device with an allocation map (an RBD image): any allocated byte
/// that is not zero.
fn occupied_where_allocated(device: &dyn Device) -> anyhow::Result<Option<String>> {
    const EXTENTS_PER_CALL: usize = 1024;
    let size = device.info().size_bytes;
    let mut at = 0;
    while at < size {
        let extents = device.extents(at, size - at, EXTENTS_PER_CALL)?;
        if extents.is_empty() {
            break;
        }
        for extent in extents {
            if !extent.hole {
                let mut start = at;
                while start < at + extent.length {
                    let length = (at + extent.length - start).min(SCAN_CHUNK_BYTES as u64);
                    let buf = AlignedBuf::new(length as usize);
                    let outcome = run_sync(device, DeviceOp::Read { offset: start, buf });
                    outcome.result?;
                    let buf = outcome.buf.expect("reads return their buffer");
                    if let Some(i) = buf.as_slice().iter().position(|b| *b != 0) {
                        return Ok(Some(format!(
                            "it holds data (at byte {})",
                            start + i as u64
                        )));
                    }
                    start += length;
                }
            }
            at += extent.length;
        }
    }
    Ok(None)
}

/// The first byte of `[start, end)` that is not zero.
fn first_nonzero(file: &mut File, start: u64, end: u64) -> anyhow::Result<Option<u64>> {
    let mut buf = vec![0u8; SCAN_CHUNK_BYTES];
    file.seek(SeekFrom::Start(start))?;
    let mut at = start;
    while at < end {
        let want = ((end - at) as usize).min(buf.len());
        let got = file.read(&mut buf[..want])?;
        if got == 0 {
            break;
        }
        if let Some(i) = buf[..got].iter().position(|b| *b != 0) {
            return Ok(Some(at + i as u64));
        }
        at += got as u64;
    }
    Ok(None)
}

fn next_data(file: &File, from: u64) -> std::io::Result<Option<u64>> {
    seek(file, from, libc::SEEK_DATA)
}

fn next_hole(file: &File, from: u64) -> std::io::Result<u64> {
    Ok(seek(file, from, libc::SEEK_HOLE)?.unwrap_or(u64::MAX))
}

/// lseek with SEEK_DATA or SEEK_HOLE; None past the last data.
fn seek(file: &File, from: u64, whence: libc::c_int) -> std::io::Result<Option<u64>> {
    // SAFETY: lseek on an open descriptor; it only moves the file offset.
    let at = unsafe { libc::lseek(file.as_raw_fd(), from as libc::off_t, whence) };
    if at >= 0 {
        return Ok(Some(at as u64));
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENXIO) {
        Ok(None)
    } else {
        Err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(tmp: &Path, name: &str, size: u64, data: &[(u64, &[u8])]) -> String {
        let path = tmp.join(name);
        let mut file = File::create(&path).unwrap();
        file.set_len(size).unwrap();
        for (offset, bytes) in data {
            file.seek(SeekFrom::Start(*offset)).unwrap();
            file.write_all(bytes).unwrap();
        }
        path.display().to_string()
    }

    #[test]
    fn a_sparse_or_zeroed_file_is_free_and_one_with_data_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let sparse = file_with(tmp.path(), "sparse", 256 << 20, &[]);
        assert_eq!(occupied_path(&sparse).unwrap(), None);
        let zeros = vec![0u8; 3 << 20];
        let zeroed = file_with(tmp.path(), "zeroed", 8 << 20, &[(1 << 20, &zeros)]);
        assert_eq!(occupied_path(&zeroed).unwrap(), None);
        let used = file_with(
            tmp.path(),
            "used",
            256 << 20,
            &[(100 << 20, b"a database page")],
        );
        let why = occupied_path(&format!("file:{used}"))
            .unwrap()
            .expect("occupied");
        assert!(why.contains(&(100u64 << 20).to_string()), "{why}");
    }

    #[test]
    fn models_are_not_checked() {
        assert_eq!(occupied_path("model:hdd,size=1G").unwrap(), None);
    }

    #[test]
    fn allocated_data_that_is_not_zero_is_found() {
        use crate::device::mem::MemDevice;
        let device = MemDevice::new(64 << 20);
        assert_eq!(occupied_where_allocated(&device).unwrap(), None);
        let write = |offset: u64, byte: u8| {
            let mut buf = AlignedBuf::new(4096);
            buf.as_mut_slice().fill(byte);
            let op = DeviceOp::Write {
                offset,
                buf: buf.into(),
                durable: false,
            };
            run_sync(&device, op).result.unwrap();
        };
        write(3 << 20, 0);
        assert_eq!(occupied_where_allocated(&device).unwrap(), None);
        write((40 << 20) + 4096, 7);
        let why = occupied_where_allocated(&device)
            .unwrap()
            .expect("occupied");
        assert!(why.contains(&((40u64 << 20) + 4096).to_string()), "{why}");
    }
}
