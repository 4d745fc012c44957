//! The union of a set of byte ranges, kept as disjoint runs, so that
//! "does anything in the set overlap this range" costs one tree lookup
//! however many ranges went in. Ranges are only added; the owner clears
//! and refills it when ranges leave.

use std::collections::BTreeMap;

#[derive(Default)]
pub struct RangeUnion {
    /// Disjoint, non-touching runs: start -> end.
    runs: BTreeMap<u64, u64>,
}

impl RangeUnion {
    pub fn clear(&mut self) {
        self.runs.clear();
    }

    /// Add `[start, end)`, merging the runs it overlaps or touches.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut start, mut end) = (start, end);
        if let Some((&s, &e)) = self.runs.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
            }
        }
        let absorbed: Vec<u64> = self.runs.range(start..=end).map(|(s, _)| *s).collect();
        for s in absorbed {
            let e = self.runs.remove(&s).expect("listed");
            end = end.max(e);
        }
        self.runs.insert(start, end);
    }

    /// Whether `[start, end)` shares a byte with a run.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        start < end
            && self
                .runs
                .range(..end)
                .next_back()
                .is_some_and(|(_, &e)| e > start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_queries_match_a_brute_force_set() {
        let mut rng = crate::rng::Rng::new(7);
        for _ in 0..50 {
            let mut union = RangeUnion::default();
            let mut ranges = Vec::new();
            for _ in 0..40 {
                let start = rng.below(1000);
                let end = start + rng.below(60);
                union.insert(start, end);
                ranges.push((start, end));
                let (qs, qe) = (rng.below(1000), rng.below(1000));
                let (qs, qe) = (qs.min(qe), qs.max(qe));
                let expected = qs < qe && ranges.iter().any(|&(s, e)| s < e && s < qe && qs < e);
                assert_eq!(
                    union.overlaps(qs, qe),
                    expected,
                    "[{qs}, {qe}) in {ranges:?}"
                );
            }
            let runs: Vec<(u64, u64)> = union.runs.iter().map(|(s, e)| (*s, *e)).collect();
            assert!(
                runs.windows(2).all(|w| w[0].1 < w[1].0),
                "runs disjoint: {runs:?}"
            );
        }
    }
}
