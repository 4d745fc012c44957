//! Latency statistics with bounded memory: a log-linear histogram (32
//! steps per power of two, so percentiles are within about 3%), plus the
//! log2 buckets the reports print.

use serde::{Deserialize, Serialize};

const SUB_BUCKET_BITS: u32 = 5;
const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
/// Covers latencies up to 2^40 ns (about 18 minutes).
const POWERS: usize = 41;
/// Printed log2 buckets: bucket i holds [2^i, 2^(i+1)) us; 0 also holds < 1 us.
pub const LOG2_BUCKETS: usize = 32;

#[derive(Clone, Debug)]
pub struct LatencyStats {
    counts: Vec<u64>,
    log2_us: [u64; LOG2_BUCKETS],
    count: u64,
    sum_ns: u128,
    max_ns: u64,
}

impl Default for LatencyStats {
    fn default() -> Self {
        LatencyStats {
            counts: vec![0; POWERS * SUB_BUCKETS],
            log2_us: [0; LOG2_BUCKETS],
            count: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

fn index_of(ns: u64) -> usize {
    if ns < SUB_BUCKETS as u64 {
        return ns as usize;
    }
    let power = 63 - ns.leading_zeros(); // >= SUB_BUCKET_BITS
    let shift = power - SUB_BUCKET_BITS;
    let sub = ((ns >> shift) as usize) & (SUB_BUCKETS - 1);
    let index = (shift as usize + 1) * SUB_BUCKETS + sub;
    index.min(POWERS * SUB_BUCKETS - 1)
}

/// The largest value that lands in bucket `index`.
fn upper_of(index: usize) -> u64 {
    if index < SUB_BUCKETS {
        return index as u64;
    }
    let shift = (index / SUB_BUCKETS - 1) as u32;
    let sub = (index % SUB_BUCKETS) as u64;
    ((SUB_BUCKETS as u64 + sub + 1) << shift) - 1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
}

impl LatencyStats {
    pub fn record(&mut self, ns: u64) {
        self.counts[index_of(ns)] += 1;
        let us = ns / 1000;
        let bucket = if us == 0 {
            0
        } else {
            63 - us.leading_zeros() as usize
        };
        self.log2_us[bucket.min(LOG2_BUCKETS - 1)] += 1;
        self.count += 1;
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The latency at quantile `q` (0..=1), in ns; 0 when empty.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return upper_of(index).min(self.max_ns);
            }
        }
        self.max_ns
    }

    /// All figures in microseconds.
    pub fn summary_us(&self) -> LatencySummary {
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencySummary {
            mean: if self.count == 0 {
                0.0
            } else {
                self.sum_ns as f64 / self.count as f64 / 1000.0
            },
            p50: us(self.quantile_ns(0.50)),
            p90: us(self.quantile_ns(0.90)),
            p99: us(self.quantile_ns(0.99)),
            p99_9: us(self.quantile_ns(0.999)),
            max: us(self.max_ns),
        }
    }

    /// Counts per log2 bucket of microseconds: bucket i is [2^i, 2^(i+1)) us.
    pub fn log2_us(&self) -> Vec<u64> {
        self.log2_us.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_the_bucket_precision() {
        let mut stats = LatencyStats::default();
        for ns in 1..=100_000u64 {
            stats.record(ns * 1000);
        }
        for q in [0.5, 0.9, 0.99] {
            let exact = q * 100_000_000.0;
            let got = stats.quantile_ns(q) as f64;
            assert!((got - exact).abs() / exact < 0.04, "q{q}: {got} vs {exact}");
        }
        assert_eq!(stats.summary_us().max, 100_000.0);
    }

    #[test]
    fn log2_buckets_count_every_sample() {
        let mut stats = LatencyStats::default();
        stats.record(500); // < 1 us: bucket 0
        stats.record(3_000); // 3 us: bucket 1
        stats.record(1_500_000); // 1.5 ms: bucket 10
        let buckets = stats.log2_us();
        assert_eq!(buckets.iter().sum::<u64>(), 3);
        assert_eq!(buckets[0], 1);
        assert_eq!(buckets[1], 1);
        assert_eq!(buckets[10], 1);
    }
}
