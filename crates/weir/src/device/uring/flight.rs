//! Ops a ring has in flight, and the SQEs that carry them.
//!
//! Both ring owners (the per-device ring thread and a connection's thread
//! ring) keep their ops here: a slot holds the op's buffer still and unmoved
//! until its CQE arrives, and a short transfer is resubmitted for the rest.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types};

use super::super::fd_ops::{fallocate_mode, forgive_unsupported_discard, outcome};
use super::super::{Completion, DeviceOp, Outcome};

struct Slot {
    fd: RawFd,
    op: DeviceOp,
    done: Completion,
    /// Bytes already transferred.
    progress: usize,
}

/// What one CQE meant for its op.
pub(super) enum Step {
    /// The transfer was short: push `entry` again for the rest.
    Resubmit(squeue::Entry),
    /// The op is over: call `done` with the outcome (outside any borrow).
    Finished(Completion, Outcome),
}

#[derive(Default)]
pub(super) struct Flight {
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    in_flight: usize,
}

impl Flight {
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Take `op` in and return the SQE that starts it. The entry's
    /// user_data is the slot index; callers keep their own tokens above
    /// `TOKEN_FIRST_RESERVED`.
    pub(super) fn start(&mut self, fd: RawFd, op: DeviceOp, done: Completion) -> squeue::Entry {
        let index = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        assert!((index as u64) < TOKEN_FIRST_RESERVED, "slot index overflow");
        self.slots[index] = Some(Slot {
            fd,
            op,
            done,
            progress: 0,
        });
        self.in_flight += 1;
        self.entry(index)
    }

    /// The SQE for what is left of slot `index`.
    fn entry(&mut self, index: usize) -> squeue::Entry {
        let slot = self.slots[index].as_mut().expect("slot in flight");
        let fd = types::Fd(slot.fd);
        let progress = slot.progress;
        let entry = match &mut slot.op {
            DeviceOp::Read { offset, buf } => {
                let len = (buf.len() - progress) as u32;
                // SAFETY: progress < buf.len(), so the pointer stays inside the buffer.
                let ptr = unsafe { buf.as_mut_ptr().add(progress) };
                opcode::Read::new(fd, ptr, len)
                    .offset(*offset + progress as u64)
                    .build()
            }
            DeviceOp::Write {
                offset,
                buf,
                durable,
            } => {
                let len = (buf.len() - progress) as u32;
                // SAFETY: as above. The kernel only reads through it.
                let ptr = unsafe { buf.as_slice().as_ptr().add(progress) };
                let flags = if *durable { libc::RWF_DSYNC } else { 0 };
                opcode::Write::new(fd, ptr, len)
                    .offset(*offset + progress as u64)
                    .rw_flags(flags)
                    .build()
            }
            DeviceOp::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            op @ (DeviceOp::Discard { .. } | DeviceOp::WriteZeroes { .. }) => {
                let (offset, length) = op.range();
                opcode::Fallocate::new(fd, length)
                    .offset(offset)
                    .mode(fallocate_mode(op))
                    .build()
            }
        };
        entry.user_data(index as u64)
    }

    /// Account the CQE of slot `token` with kernel result `result`.
    pub(super) fn complete(&mut self, token: u64, result: i32) -> Step {
        let index = token as usize;
        let slot = self.slots[index]
            .as_mut()
            .expect("completion for an empty slot");
        let result = if result < 0 {
            Err(io::Error::from_raw_os_error(-result))
        } else {
            let transfer_len = match &slot.op {
                DeviceOp::Read { buf, .. } => buf.len(),
                DeviceOp::Write { buf, .. } => buf.len(),
                _ => 0,
            };
            slot.progress += result as usize;
            if transfer_len > 0 && result == 0 {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "device transferred no bytes",
                ))
            } else if slot.progress < transfer_len {
                return Step::Resubmit(self.entry(index));
            } else {
                Ok(())
            }
        };
        let slot = self.slots[index].take().expect("slot checked above");
        self.free.push(index);
        self.in_flight -= 1;
        let result = forgive_unsupported_discard(&slot.op, result);
        Step::Finished(slot.done, outcome(slot.op, result))
    }
}

/// user_data values from here up are the ring owners' own (wakeups, polls).
pub(super) const TOKEN_FIRST_RESERVED: u64 = u64::MAX - 15;
