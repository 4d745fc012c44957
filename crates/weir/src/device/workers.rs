//! Threads running jobs from one queue: the blocking-call fallback engine,
//! the pool's blocking writes, flushes and slow reads, and the memory
//! device's large copies run on these. Threads start when a job finds none
//! idle (up to a bound) and end after `IDLE_EXIT` without work, so an idle
//! server holds none of them.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::Arc;
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// A worker with nothing to do for this long ends; a burst of work
/// shorter than this apart reuses the same threads.
const IDLE_EXIT: Duration = Duration::from_secs(2);

struct Queue {
    pending: VecDeque<Job>,
    stopping: bool,
    /// Workers waiting for a job.
    idle: usize,
    /// Workers running, by thread; each removes itself when it ends.
    threads: HashMap<ThreadId, JoinHandle<()>>,
    /// Names the next thread.
    spawned: u64,
}

struct Shared {
    name: String,
    max_threads: usize,
    queue: Mutex<Queue>,
    wake: Condvar,
}

pub(crate) struct Workers {
    shared: Arc<Shared>,
}

impl Workers {
    /// Workers named `{name}-{n}`, at most `max_threads` at once.
    pub(crate) fn start(name: &str, max_threads: usize) -> io::Result<Workers> {
        if max_threads == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a worker pool needs at least one thread",
            ));
        }
        Ok(Workers {
            shared: Arc::new(Shared {
                name: name.to_string(),
                max_threads,
                queue: Mutex::new(Queue {
                    pending: VecDeque::new(),
                    stopping: false,
                    idle: 0,
                    threads: HashMap::new(),
                    spawned: 0,
                }),
                wake: Condvar::new(),
            }),
        })
    }

    pub(crate) fn run(&self, job: Job) {
        let mut queue = self.shared.queue.lock();
        queue.pending.push_back(job);
        // Jobs beyond the idle workers get a new thread while the bound
        // allows; the rest wait for a worker to finish.
        if queue.pending.len() > queue.idle && queue.threads.len() < self.shared.max_threads {
            if let Err(err) = spawn(&self.shared, &mut queue) {
                if queue.threads.is_empty() {
                    // No thread will ever take it: run it here.
                    let job = queue.pending.pop_back().expect("just queued");
                    drop(queue);
                    tracing::warn!(error = %err, "cannot start a worker thread; running the job inline");
                    job();
                    return;
                }
                tracing::warn!(error = %err, "cannot start another worker thread");
            }
        }
        self.shared.wake.notify_one();
    }

    /// Worker threads running now (for tests and the thread count).
    #[cfg(test)]
    fn threads(&self) -> usize {
        self.shared.queue.lock().threads.len()
    }
}

/// Start a worker; its handle is recorded under the queue's lock, which
/// the thread needs before it can end, so it never ends unrecorded.
fn spawn(shared: &Arc<Shared>, queue: &mut Queue) -> io::Result<()> {
    let index = queue.spawned;
    queue.spawned += 1;
    let worker = Arc::clone(shared);
    let handle = std::thread::Builder::new()
        .name(format!("{}-{index}", shared.name))
        .spawn(move || work(&worker))?;
    queue.threads.insert(handle.thread().id(), handle);
    Ok(())
}

fn work(shared: &Shared) {
    let me = std::thread::current().id();
    let mut queue = shared.queue.lock();
    loop {
        if let Some(job) = queue.pending.pop_front() {
            drop(queue);
            job();
            queue = shared.queue.lock();
            continue;
        }
        if queue.stopping {
            break;
        }
        queue.idle += 1;
        let waited = shared.wake.wait_for(&mut queue, IDLE_EXIT);
        queue.idle -= 1;
        if waited.timed_out() && queue.pending.is_empty() {
            break;
        }
    }
    // Detach: nobody needs to join a thread that has ended on its own.
    queue.threads.remove(&me);
}

impl Drop for Workers {
    /// Runs every queued job, then joins the threads.
    fn drop(&mut self) {
        let threads: Vec<JoinHandle<()>> = {
            let mut queue = self.shared.queue.lock();
            queue.stopping = true;
            queue.threads.drain().map(|(_, handle)| handle).collect()
        };
        self.shared.wake.notify_all();
        for thread in threads {
            crate::join::join_unless_current(thread);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    #[test]
    fn every_job_runs_on_at_most_the_bound_of_threads() {
        let workers = Workers::start("test-bound", 4).unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (done, finished) = mpsc::channel();
        for _ in 0..64 {
            let (running, most, done) = (Arc::clone(&running), Arc::clone(&most), done.clone());
            workers.run(Box::new(move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
                running.fetch_sub(1, Ordering::SeqCst);
                done.send(()).unwrap();
            }));
        }
        for _ in 0..64 {
            finished.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        let most = most.load(Ordering::SeqCst);
        assert!((2..=4).contains(&most), "{most} jobs ran at once");
        assert!(workers.threads() <= 4);
    }

    #[test]
    fn idle_threads_end_and_new_work_starts_them_again() {
        let workers = Workers::start("test-idle", 8).unwrap();
        assert_eq!(workers.threads(), 0, "no thread before any work");
        let (done, finished) = mpsc::channel();
        for _ in 0..3 {
            let done = done.clone();
            workers.run(Box::new(move || {
                std::thread::sleep(Duration::from_millis(20));
                done.send(()).unwrap();
            }));
        }
        for _ in 0..3 {
            finished.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        assert!(workers.threads() >= 1);
        let deadline = std::time::Instant::now() + IDLE_EXIT * 4;
        while workers.threads() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "idle workers never ended"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        workers.run(Box::new(move || done.send(()).unwrap()));
        finished.recv_timeout(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn dropping_runs_every_queued_job_first() {
        let workers = Workers::start("test-drop", 1).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..20 {
            let ran = Arc::clone(&ran);
            workers.run(Box::new(move || {
                std::thread::sleep(Duration::from_millis(1));
                ran.fetch_add(1, Ordering::SeqCst);
            }));
        }
        drop(workers);
        assert_eq!(ran.load(Ordering::SeqCst), 20);
    }

    #[test]
    fn a_job_may_drop_the_last_handle_of_its_own_pool() {
        let workers = Arc::new(Mutex::new(Some(Workers::start("test-self", 2).unwrap())));
        let (done, finished) = mpsc::channel();
        let own = Arc::clone(&workers);
        let pool = workers.lock();
        pool.as_ref().unwrap().run(Box::new(move || {
            drop(own.lock().take());
            done.send(()).unwrap();
        }));
        drop(pool);
        finished.recv_timeout(Duration::from_secs(10)).unwrap();
    }
}
