//! A job's connections in virtual time: consecutive requests go to the
//! next of N server threads round-robin, and each thread hands its request
//! to the volume after a random delay (waking up, reading the header). A
//! thread keeps its own requests in order; across threads they reach the
//! volume reordered, as they do from a multi-connection client.

use crate::device::model::Nanos;
use crate::rng::Rng;

/// The longest a server thread takes to hand a request on: a wake-up on a
/// busy machine. Delays are uniform below it.
pub const HAND_ON_MAX_NS: Nanos = 100_000;

pub struct ServerThreads {
    rng: Rng,
    turn: usize,
    /// When each thread handed on its last request.
    last_handed: Vec<Nanos>,
}

impl ServerThreads {
    pub fn new(threads: u32, seed: u64) -> ServerThreads {
        ServerThreads {
            rng: Rng::new(seed),
            turn: 0,
            last_handed: vec![0; threads.max(1) as usize],
        }
    }

    /// A request sent at `now`: when it reaches the volume.
    pub fn hand_on(&mut self, now: Nanos) -> Nanos {
        let thread = self.turn;
        self.turn = (self.turn + 1) % self.last_handed.len();
        let at = (now + self.rng.below(HAND_ON_MAX_NS + 1)).max(self.last_handed[thread]);
        self.last_handed[thread] = at;
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_keeps_its_order_and_threads_reorder() {
        let mut threads = ServerThreads::new(4, 7);
        let handed: Vec<Nanos> = (0..4000).map(|i| threads.hand_on(i * 10_000)).collect();
        for (i, at) in handed.iter().enumerate() {
            assert!(*at >= i as Nanos * 10_000 && *at <= i as Nanos * 10_000 + HAND_ON_MAX_NS);
            if i >= 4 {
                assert!(*at >= handed[i - 4], "thread order kept at {i}");
            }
        }
        let reordered = handed.windows(2).filter(|w| w[1] < w[0]).count();
        assert!(reordered > 100, "only {reordered} of 4000 reordered");
        let mut one = ServerThreads::new(1, 7);
        let handed: Vec<Nanos> = (0..4000).map(|i| one.hand_on(i * 10_000)).collect();
        assert!(handed.windows(2).all(|w| w[1] >= w[0]));
    }
}
