//! Files and block devices, opened with O_DIRECT so the page cache never
//! reorders or delays I/O behind weir's back (DESIGN principle 1).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::ownership::Ownership;
use super::threads::ThreadEngine;
use super::uring::UringEngine;
use super::{push_extent, Completion, Device, DeviceInfo, DeviceOp, Extent, IoEngine};

/// `_IOR(0x12, 114, size_t)`: size of a block device in bytes.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// Alignment assumed where the kernel cannot tell us (safe for any device).
const FALLBACK_ALIGN_BYTES: u32 = 4096;

enum Engine {
    Uring(UringEngine),
    Threads(ThreadEngine),
}

pub struct FileDevice {
    // Keeps the descriptor the engines use open; declared after `engine`
    // so the engine threads stop before the file closes.
    engine: Engine,
    file: File,
    info: DeviceInfo,
    /// Held for as long as the device is open: no other process opens it
    /// meanwhile.
    _ownership: Ownership,
}

impl FileDevice {
    pub fn open(path: &Path, read_only: bool, engine: IoEngine) -> io::Result<FileDevice> {
        let open = |direct: bool| {
            let flags = libc::O_CLOEXEC | if direct { libc::O_DIRECT } else { 0 };
            OpenOptions::new()
                .read(true)
                .write(!read_only)
                .custom_flags(flags)
                .open(path)
        };
        let (file, direct) = match open(true) {
            Ok(file) => (file, true),
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(path = %path.display(), "filesystem refuses O_DIRECT; using buffered I/O");
                (open(false)?, false)
            }
            Err(err) => return Err(err),
        };
        let meta = file.metadata()?;
        let is_block = meta.file_type().is_block_device();
        if !is_block && !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            ));
        }
        let ownership = Ownership::take(path, &file, !read_only)?;
        let fd = file.as_raw_fd();
        let (raw_size, align, rotational) = if is_block {
            (
                block_device_size(fd)?,
                block_device_sector(fd)?,
                block_device_rotational(meta.rdev()),
            )
        } else {
            (
                meta.len(),
                if direct { dio_alignment(fd) } else { 1 },
                false,
            )
        };
        let size_bytes = raw_size - raw_size % u64::from(align);
        if size_bytes != raw_size {
            tracing::warn!(path = %path.display(), raw_size, size_bytes, "size is not a multiple of the {align}-byte block; the tail is not exported");
        }
        let (engine, engine_name) = match engine {
            IoEngine::Threads => (Engine::Threads(ThreadEngine::start(fd)?), "threads"),
            IoEngine::Uring | IoEngine::Auto => match UringEngine::start(fd) {
                Ok(ring) => (Engine::Uring(ring), "io_uring"),
                Err(err) if engine == IoEngine::Auto => {
                    tracing::warn!(error = %err, "io_uring unavailable; falling back to a thread pool");
                    (Engine::Threads(ThreadEngine::start(fd)?), "threads")
                }
                Err(err) => return Err(err),
            },
        };
        let description = format!(
            "{} {} ({engine_name}, {})",
            if is_block { "block device" } else { "file" },
            path.display(),
            if direct { "O_DIRECT" } else { "buffered" }
        );
        let info = DeviceInfo {
            size_bytes,
            logical_block_bytes: align,
            rotational,
            description,
        };
        Ok(FileDevice {
            engine,
            file,
            info,
            _ownership: ownership,
        })
    }
}

impl Device for FileDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&self, op: DeviceOp, done: Completion) {
        op.assert_valid(&self.info);
        match &self.engine {
            Engine::Uring(ring) => ring.submit(op, done),
            Engine::Threads(pool) => pool.submit(op, done),
        }
    }

    fn reserve(&self, offset: u64, length: u64) -> io::Result<()> {
        assert!(
            offset + length <= self.info.size_bytes,
            "reserve past the end"
        );
        if self.file.metadata()?.file_type().is_block_device() {
            return Ok(());
        }
        // SAFETY: fallocate reads no memory; the descriptor is open for
        // as long as `self`.
        let result = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                length as libc::off_t,
            )
        };
        if result == 0 {
            return Ok(());
        }
        match io::Error::last_os_error() {
            // A file system that cannot allocate ahead allocates on write.
            err if err.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            err => Err(err),
        }
    }

    fn extents(&self, offset: u64, length: u64, extents_max: usize) -> io::Result<Vec<Extent>> {
        let fd = self.file.as_raw_fd();
        let end = offset + length;
        let mut extents = Vec::new();
        let mut at = offset;
        while at < end && extents.len() < extents_max {
            let data = match seek(fd, at, libc::SEEK_DATA) {
                Ok(data) => data.min(end),
                Err(err) if err.raw_os_error() == Some(libc::ENXIO) => end, // only a hole remains
                Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {
                    push_extent(&mut extents, end - at, false); // no hole support: all data
                    break;
                }
                Err(err) => return Err(err),
            };
            push_extent(&mut extents, data - at, true);
            if data >= end {
                break;
            }
            let hole = seek(fd, data, libc::SEEK_HOLE)?.min(end);
            push_extent(&mut extents, hole - data, false);
            at = hole;
        }
        Ok(extents)
    }
}

fn seek(fd: RawFd, offset: u64, whence: libc::c_int) -> io::Result<u64> {
    // SAFETY: lseek on a descriptor we own; no memory is involved.
    let at = unsafe { libc::lseek(fd, offset as libc::off_t, whence) };
    if at < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(at as u64)
    }
}

fn block_device_size(fd: RawFd) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
    let rc = unsafe { libc::ioctl(fd, BLKGETSIZE64 as _, &mut size as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

fn block_device_sector(fd: RawFd) -> io::Result<u32> {
    let mut sector: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer.
    let rc = unsafe { libc::ioctl(fd, libc::BLKSSZGET as _, &mut sector as *mut libc::c_int) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((sector as u32).max(512))
}

fn block_device_rotational(rdev: u64) -> bool {
    queue_attribute(rdev, "rotational").is_some_and(|text| text == "1")
}

/// An attribute of the request queue behind block device `dev`. A
/// partition has no queue of its own; its disk's is the one that counts.
fn queue_attribute(dev: u64, name: &str) -> Option<String> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    ["queue", "../queue"].iter().find_map(|queue| {
        std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/{queue}/{name}"))
            .ok()
            .map(|text| text.trim().to_string())
    })
}

/// The file offset alignment O_DIRECT needs, from statx where the kernel
/// reports it.
fn dio_alignment(fd: RawFd) -> u32 {
    // SAFETY: statx fills the zeroed struct; the empty path with
    // AT_EMPTY_PATH refers to `fd` itself.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc == 0
        && stx.stx_mask & libc::STATX_DIOALIGN != 0
        && stx.stx_dio_offset_align.is_power_of_two()
    {
        stx.stx_dio_offset_align.max(stx.stx_dio_mem_align).max(512)
    } else {
        FALLBACK_ALIGN_BYTES
    }
}
