//! One device operation on a file descriptor, shared by the I/O engines:
//! the blocking system calls of the thread engine, and the pieces io_uring
//! needs to build and finish the same operation.

use std::io;
use std::os::fd::RawFd;

use super::{DeviceOp, Outcome};

/// fallocate mode for a discard or write-zeroes.
pub(super) fn fallocate_mode(op: &DeviceOp) -> libc::c_int {
    match op {
        DeviceOp::WriteZeroes {
            may_unmap: false, ..
        } => libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        _ => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    }
}

/// A discard the device cannot do is not an error: discard is advisory.
pub(super) fn forgive_unsupported_discard(op: &DeviceOp, result: io::Result<()>) -> io::Result<()> {
    match (op, &result) {
        (DeviceOp::Discard { .. }, Err(err)) if err.raw_os_error() == Some(libc::EOPNOTSUPP) => {
            Ok(())
        }
        _ => result,
    }
}

/// Run `op` with blocking system calls (the fallback engine).
pub(super) fn execute_blocking(fd: RawFd, op: &mut DeviceOp) -> io::Result<()> {
    let check = |rc: libc::ssize_t| {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc as usize)
        }
    };
    match op {
        DeviceOp::Read { offset, buf } => {
            let mut done = 0;
            while done < buf.len() {
                let rest = &mut buf.as_mut_slice()[done..];
                // SAFETY: `rest` is valid writable memory of rest.len() bytes.
                let got = check(unsafe {
                    libc::pread(
                        fd,
                        rest.as_mut_ptr().cast(),
                        rest.len(),
                        (*offset + done as u64) as libc::off_t,
                    )
                })?;
                if got == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "read past end of device",
                    ));
                }
                done += got;
            }
            Ok(())
        }
        DeviceOp::Write {
            offset,
            buf,
            durable,
        } => {
            let flags = if *durable { libc::RWF_DSYNC } else { 0 };
            let mut done = 0;
            while done < buf.len() {
                let rest = &buf.as_slice()[done..];
                let iov = libc::iovec {
                    iov_base: rest.as_ptr() as *mut _,
                    iov_len: rest.len(),
                };
                // SAFETY: iov points at `rest`, valid for reads for its length.
                let put = check(unsafe {
                    libc::pwritev2(fd, &iov, 1, (*offset + done as u64) as libc::off_t, flags)
                })?;
                if put == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "device accepted no bytes",
                    ));
                }
                done += put;
            }
            Ok(())
        }
        // SAFETY: plain system calls on a descriptor we own.
        DeviceOp::Flush => check(unsafe { libc::fdatasync(fd) } as libc::ssize_t).map(drop),
        DeviceOp::Discard { offset, length } | DeviceOp::WriteZeroes { offset, length, .. } => {
            let (offset, length) = (*offset, *length);
            let mode = fallocate_mode(op);
            // SAFETY: as above.
            let rc =
                unsafe { libc::fallocate(fd, mode, offset as libc::off_t, length as libc::off_t) };
            forgive_unsupported_discard(op, check(rc as libc::ssize_t).map(drop))
        }
    }
}

/// Finish an op executed by an engine: hand the buffer back with the result.
pub(super) fn outcome(op: DeviceOp, result: io::Result<()>) -> Outcome {
    let buf = match op {
        DeviceOp::Read { buf, .. } => Some(buf),
        _ => None,
    };
    Outcome {
        result,
        buf,
        hole: false,
    }
}
