//! The progress of a pass over a pool (a scrub, a resilver): the time left
//! at the rate so far.

/// ", ETA N s": the time left for `total` chunks at the rate the first
/// `done` took `seconds` at; empty before there is a rate.
pub fn eta(done: u64, total: u64, seconds: f64) -> String {
    if done == 0 || seconds <= 0.0 {
        return String::new();
    }
    let left = total.saturating_sub(done) as f64 * seconds / done as f64;
    format!(", ETA {left:.0} s")
}

#[cfg(test)]
mod tests {
    use super::eta;

    #[test]
    fn the_time_left_follows_the_rate_so_far() {
        assert_eq!(eta(0, 100, 5.0), "", "no rate yet");
        assert_eq!(eta(25, 100, 10.0), ", ETA 30 s");
        assert_eq!(eta(100, 100, 10.0), ", ETA 0 s");
    }
}
