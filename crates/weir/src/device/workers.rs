//! A few threads running jobs from one queue: the blocking-call fallback
//! engine and the memory device's large copies both run on these.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

pub(crate) type Job = Box<dyn FnOnce() + Send>;

struct Queue {
    pending: VecDeque<Job>,
    stopping: bool,
}

pub(crate) struct Workers {
    shared: Arc<(Mutex<Queue>, Condvar)>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Start `count` threads named `{name}-{index}`.
    pub(crate) fn start(name: &str, count: usize) -> io::Result<Workers> {
        let shared = Arc::new((
            Mutex::new(Queue {
                pending: VecDeque::new(),
                stopping: false,
            }),
            Condvar::new(),
        ));
        let threads = (0..count)
            .map(|index| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("{name}-{index}"))
                    .spawn(move || work(&shared))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Workers { shared, threads })
    }

    pub(crate) fn run(&self, job: Job) {
        let (queue, wake) = &*self.shared;
        queue.lock().pending.push_back(job);
        wake.notify_one();
    }
}

fn work(shared: &(Mutex<Queue>, Condvar)) {
    let (queue, wake) = shared;
    loop {
        let job = {
            let mut guard = queue.lock();
            loop {
                if let Some(job) = guard.pending.pop_front() {
                    break job;
                }
                if guard.stopping {
                    return;
                }
                wake.wait(&mut guard);
            }
        };
        job();
    }
}

impl Drop for Workers {
    /// Runs every queued job, then joins the threads.
    fn drop(&mut self) {
        self.shared.0.lock().stopping = true;
        self.shared.1.notify_all();
        for thread in self.threads.drain(..) {
            crate::join::join_unless_current(thread);
        }
    }
}
