//! The fallback engine: a few threads making blocking system calls. Used
//! where io_uring is unavailable (old kernels, seccomp sandboxes).

use std::io;
use std::os::fd::RawFd;

use super::fd_ops::{execute_blocking, outcome};
use super::workers::Workers;
use super::{Completion, DeviceOp};

const WORKERS: usize = 8;

pub(super) struct ThreadEngine {
    fd: RawFd,
    workers: Workers,
}

impl ThreadEngine {
    pub(super) fn start(fd: RawFd) -> io::Result<ThreadEngine> {
        Ok(ThreadEngine {
            fd,
            workers: Workers::start("weir-io", WORKERS)?,
        })
    }

    pub(super) fn submit(&self, mut op: DeviceOp, done: Completion) {
        let fd = self.fd;
        self.workers.run(Box::new(move || {
            let result = execute_blocking(fd, &mut op);
            done(outcome(op, result));
        }));
    }
}
