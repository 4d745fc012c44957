//! Joining a helper thread from a `Drop`, wherever that drop runs.
//!
//! A device's engine (ring thread, worker threads, model thread) is owned by
//! whatever holds the last reference to the device, and completions hold
//! such references. When the last one goes away inside a completion, the
//! owner is dropped on the very thread it would join; `JoinHandle::join`
//! then panics ("Resource deadlock avoided"). Such a thread has already been
//! told to stop, so it is left to finish on its own.

use std::thread::JoinHandle;

/// Joins `thread`, unless it is the calling thread, which is detached.
pub fn join_unless_current<T>(thread: JoinHandle<T>) {
    if thread.thread().id() == std::thread::current().id() {
        return;
    }
    let _ = thread.join();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_thread_dropping_its_own_handle_does_not_panic() {
        let (handle_tx, handle_rx) = mpsc::channel::<JoinHandle<()>>();
        let (done_tx, done_rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let own = handle_rx.recv().unwrap();
            join_unless_current(own);
            done_tx.send(()).unwrap();
        });
        handle_tx.send(thread).unwrap();
        done_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the thread finished without panicking");
    }

    #[test]
    fn another_thread_is_joined() {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            tx.send(()).unwrap();
        });
        join_unless_current(thread);
        assert!(
            rx.try_recv().is_ok(),
            "join returned before the thread ended"
        );
    }
}
