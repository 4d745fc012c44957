//! Estimates the queue modes and the mirror's read selector keep from
//! completions: decaying averages, and a cost that grows with length.

/// Weight of a new sample in a decaying average (1/8, as TCP's srtt).
const EWMA_WEIGHT: f64 = 0.125;

/// A decaying average of latencies (ns).
#[derive(Clone, Copy, Debug, Default)]
pub struct Ewma {
    value: f64,
    samples: u32,
}

impl Ewma {
    pub fn record(&mut self, sample: f64) {
        self.value = if self.samples == 0 {
            sample
        } else {
            self.value + EWMA_WEIGHT * (sample - self.value)
        };
        self.samples = self.samples.saturating_add(1);
    }

    pub fn get(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.value)
    }
}

/// A cost that grows with length, `fixed + per_byte * length`, drawn
/// through two points: the decaying mean cost of the long I/Os and of the
/// short ones (under half as long). A ratio of cost to bytes would charge
/// a small I/O's fixed part (a seek, a flash drive's write commit) to
/// every byte of a large one. Two points rather than a least-squares fit
/// over all samples, because one length usually dominates (a stream of
/// small pieces with now and then a whole I/O) and would drown the other.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinearCost {
    long: CostPoint,
    short: CostPoint,
}

/// Decaying means of length (bytes) and cost (ns).
#[derive(Clone, Copy, Debug, Default)]
struct CostPoint {
    length: Ewma,
    cost: Ewma,
}

impl CostPoint {
    fn record(&mut self, length: f64, cost: f64) {
        self.length.record(length);
        self.cost.record(cost);
    }

    fn get(&self) -> Option<(f64, f64)> {
        Some((self.length.get()?, self.cost.get()?))
    }

    fn samples(&self) -> u32 {
        self.cost.samples
    }
}

impl LinearCost {
    pub fn record(&mut self, length: f64, cost: f64) {
        match self.long.length.get() {
            Some(long) if length * 2.0 < long => self.short.record(length, cost),
            Some(long) if length > long * 2.0 => {
                // A new longest: the old long I/Os are now the short ones.
                self.short = self.long;
                self.long = CostPoint::default();
                self.long.record(length, cost);
            }
            _ => self.long.record(length, cost),
        }
    }

    /// The fixed cost (ns) and the cost per byte, once both a long and a
    /// short length have been seen.
    pub fn parts(&self) -> Option<(f64, f64)> {
        self.parts_after(1)
    }

    /// The same, once each point holds at least `samples_min` samples: a
    /// point drawn through one sample carries that sample's accident (the
    /// first read of a device, a seek across it) for as long as no other
    /// I/O of its length comes.
    pub fn parts_after(&self, samples_min: u32) -> Option<(f64, f64)> {
        if self.long.samples() < samples_min || self.short.samples() < samples_min {
            return None;
        }
        let (long_length, long_cost) = self.long.get()?;
        let (short_length, short_cost) = self.short.get()?;
        if long_length <= short_length {
            return None;
        }
        let per_byte = ((long_cost - short_cost) / (long_length - short_length)).max(0.0);
        let fixed = (short_cost - per_byte * short_length).max(0.0);
        Some((fixed, per_byte))
    }

    /// The length of the long I/Os, once any has been seen.
    pub fn longest(&self) -> Option<f64> {
        self.long.length.get()
    }

    /// The fitted cost of `length` bytes; with one length so far, its
    /// cost scaled by length.
    pub fn cost(&self, length: u64) -> Option<f64> {
        if let Some((fixed, per_byte)) = self.parts() {
            return Some(fixed + per_byte * length as f64);
        }
        let (long_length, long_cost) = self.long.get()?;
        (long_length > 0.0).then(|| long_cost * length as f64 / long_length)
    }
}
