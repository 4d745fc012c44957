//! Latency statistics with bounded memory: an HDR histogram (three
//! significant digits, so percentiles are within 0.1%), plus the log2
//! buckets that reports and `weir iostat -w` print.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Printed log2 buckets: bucket i holds [2^i, 2^(i+1)) us; 0 also holds < 1 us.
pub const LOG2_BUCKETS: usize = 32;
const SIGNIFICANT_DIGITS: u8 = 3;

#[derive(Clone, Debug)]
pub struct LatencyStats {
    histogram: Histogram<u64>,
    log2_us: [u64; LOG2_BUCKETS],
    sum_ns: u128,
    /// Exact, where the histogram only keeps three digits.
    max_ns: u64,
}

impl Default for LatencyStats {
    fn default() -> Self {
        LatencyStats {
            histogram: Histogram::new(SIGNIFICANT_DIGITS).expect("valid precision"),
            log2_us: [0; LOG2_BUCKETS],
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

/// Bucket i's lower bound, 2^i us, as people write it.
pub fn bucket_label(i: usize) -> String {
    let us = 1u64 << i;
    if us >= 1_000_000 {
        format!("{}s", us / 1_000_000)
    } else if us >= 1000 {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
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
        // The histogram grows to cover whatever it sees (it is built
        // auto-resizing), so recording cannot fail.
        self.histogram
            .record(ns)
            .expect("an auto-resizing histogram takes any value");
        let us = ns / 1000;
        let bucket = if us == 0 {
            0
        } else {
            63 - us.leading_zeros() as usize
        };
        self.log2_us[bucket.min(LOG2_BUCKETS - 1)] += 1;
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The latency at quantile `q` (0..=1), in ns; 0 when empty.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.histogram.is_empty() {
            return 0;
        }
        self.histogram.value_at_quantile(q).min(self.max_ns)
    }

    /// All figures in microseconds.
    pub fn summary_us(&self) -> LatencySummary {
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencySummary {
            mean: if self.count() == 0 {
                0.0
            } else {
                self.sum_ns as f64 / self.count() as f64 / 1000.0
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
            assert!(
                (got - exact).abs() / exact < 0.002,
                "q{q}: {got} vs {exact}"
            );
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
