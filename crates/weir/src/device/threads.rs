//! The fallback engine: a few threads making blocking system calls. Used
//! where io_uring is unavailable (old kernels, seccomp sandboxes).

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use super::file::{execute_blocking, outcome};
use super::{Completion, DeviceOp};

const WORKERS: usize = 8;

struct Queue {
    pending: VecDeque<(DeviceOp, Completion)>,
    stopping: bool,
}

pub(super) struct ThreadEngine {
    shared: Arc<(Mutex<Queue>, Condvar)>,
    workers: Vec<JoinHandle<()>>,
}

impl ThreadEngine {
    pub(super) fn start(fd: RawFd) -> io::Result<ThreadEngine> {
        let shared = Arc::new((
            Mutex::new(Queue {
                pending: VecDeque::new(),
                stopping: false,
            }),
            Condvar::new(),
        ));
        let workers = (0..WORKERS)
            .map(|index| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("weir-io-{index}"))
                    .spawn(move || worker(fd, &shared))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(ThreadEngine { shared, workers })
    }

    pub(super) fn submit(&self, op: DeviceOp, done: Completion) {
        let (queue, wake) = &*self.shared;
        queue.lock().pending.push_back((op, done));
        wake.notify_one();
    }
}

fn worker(fd: RawFd, shared: &(Mutex<Queue>, Condvar)) {
    let (queue, wake) = shared;
    loop {
        let (mut op, done) = {
            let mut guard = queue.lock();
            loop {
                if let Some(item) = guard.pending.pop_front() {
                    break item;
                }
                if guard.stopping {
                    return;
                }
                wake.wait(&mut guard);
            }
        };
        let result = execute_blocking(fd, &mut op);
        done(outcome(op, result));
    }
}

impl Drop for ThreadEngine {
    fn drop(&mut self) {
        self.shared.0.lock().stopping = true;
        self.shared.1.notify_all();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}
