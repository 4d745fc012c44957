//! Steps that run one after another through callbacks: each starts when
//! the one before it has succeeded, and the first error ends the chain.
//! The volume's multi-step requests (zeroing the inside of a range, then
//! its edges, then a flush) are written as chains so that no thread waits.

use std::io;

use super::Done;

/// One step: it is handed the callback to call when it is done.
pub type Step = Box<dyn FnOnce(Done<()>) + Send>;

/// Run `steps` in order, then call `done` with the first error or `Ok`.
pub fn run(mut steps: Vec<Step>, done: Done<()>) {
    steps.reverse();
    next(steps, done);
}

fn next(mut reversed: Vec<Step>, done: Done<()>) {
    let Some(step) = reversed.pop() else {
        return done(Ok(()));
    };
    step(Box::new(move |result: io::Result<()>| match result {
        Ok(()) => next(reversed, done),
        Err(err) => done(Err(err)),
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn record(log: &Arc<Mutex<Vec<u32>>>, n: u32, fails: bool) -> Step {
        let log = Arc::clone(log);
        Box::new(move |done| {
            log.lock().unwrap().push(n);
            done(if fails {
                Err(io::Error::other("step failed"))
            } else {
                Ok(())
            })
        })
    }

    #[test]
    fn steps_run_in_order_and_the_first_error_stops_the_rest() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let result = Arc::new(Mutex::new(None));
        let sink = Arc::clone(&result);
        run(
            vec![
                record(&log, 1, false),
                record(&log, 2, true),
                record(&log, 3, false),
            ],
            Box::new(move |r| *sink.lock().unwrap() = Some(r.is_ok())),
        );
        assert_eq!(*log.lock().unwrap(), vec![1, 2]);
        assert_eq!(*result.lock().unwrap(), Some(false));
    }

    #[test]
    fn no_steps_is_success() {
        let result = Arc::new(Mutex::new(None));
        let sink = Arc::clone(&result);
        run(
            Vec::new(),
            Box::new(move |r| *sink.lock().unwrap() = Some(r.is_ok())),
        );
        assert_eq!(*result.lock().unwrap(), Some(true));
    }
}
