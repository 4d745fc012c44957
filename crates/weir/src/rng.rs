//! A small seeded generator (SplitMix64): the simulator's only source of
//! randomness, so one seed reproduces a run byte for byte on any machine.
//! A scripted generator draws from given bytes first (a fuzzer's input, so
//! that its mutations steer every decision), then from a seed made of them.

/// One SplitMix64 step applied to `x`: a well-mixed hash of it.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
    /// Bytes still to be drawn before the seeded sequence.
    script: std::collections::VecDeque<u8>,
}

/// Bytes a scripted draw takes: every decision depends on few input bytes.
const SCRIPT_DRAW_BYTES: usize = 2;

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng {
            state: seed,
            script: Default::default(),
        }
    }

    /// Draws that come from `bytes`, two per draw, then from a seed mixed
    /// from all of them.
    pub fn scripted(bytes: &[u8]) -> Rng {
        let seed = bytes
            .iter()
            .fold(0x5eed_u64, |acc, byte| mix(acc ^ u64::from(*byte)));
        Rng {
            state: seed,
            script: bytes.iter().copied().collect(),
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        if self.script.len() >= SCRIPT_DRAW_BYTES {
            // The bytes become the top of the draw, which `below` maps
            // onto its range; the rest is filled from the sequence.
            let mut top = 0u64;
            for _ in 0..SCRIPT_DRAW_BYTES {
                top = top << 8 | u64::from(self.script.pop_front().unwrap_or(0));
            }
            let shift = 64 - 8 * SCRIPT_DRAW_BYTES as u32;
            return top << shift | (self.next_seeded() >> (64 - shift));
        }
        self.next_seeded()
    }

    fn next_seeded(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state.wrapping_sub(0x9e37_79b9_7f4a_7c15))
    }

    /// Uniform in `[0, bound)`; `bound` must be positive.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "empty range");
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed with the given mean (Poisson arrivals).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(42);
        assert_eq!(a, (0..8).map(|_| r.next_u64()).collect::<Vec<_>>());
        let mut other = Rng::new(43);
        assert_ne!(a[0], other.next_u64());
    }

    #[test]
    fn a_script_steers_draws_then_the_sequence_goes_on() {
        let mut low = Rng::scripted(&[0, 0, 0xff, 0xff]);
        assert_eq!(low.below(10), 0);
        assert_eq!(low.below(10), 9);
        // Past the script: the same bytes give the same sequence.
        let mut again = Rng::scripted(&[0, 0, 0xff, 0xff]);
        again.below(10);
        again.below(10);
        assert_eq!(low.next_u64(), again.next_u64());
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = Rng::new(1);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let x = r.below(10);
            seen[x as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }
}
