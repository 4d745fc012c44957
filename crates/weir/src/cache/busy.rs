//! Time during which writeback had at least one write in flight.
//!
//! The rate that sizes the dirty budget is bytes written back over this
//! time, not over the clock: a writer the budget paces offers less than
//! the devices take, and its writeback idles between writes. Over the
//! clock, that rate would measure the pacing and keep the budget as small
//! as it found it; over busy time it measures how fast the devices answer.

use std::time::Duration;

#[derive(Debug, Default)]
pub struct BusyClock {
    in_flight: usize,
    since: Duration,
    total: Duration,
    reported: Duration,
}

impl BusyClock {
    /// A write went out at `now` (time since any fixed start).
    pub fn start(&mut self, now: Duration) {
        if self.in_flight == 0 {
            self.since = now;
        }
        self.in_flight += 1;
    }

    /// A write finished at `now`.
    pub fn end(&mut self, now: Duration) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            self.total += now.saturating_sub(self.since);
        }
    }

    /// Busy time since the last call.
    pub fn take(&mut self, now: Duration) -> Duration {
        let open = if self.in_flight > 0 {
            now.saturating_sub(self.since)
        } else {
            Duration::ZERO
        };
        let total = self.total + open;
        let busy = total.saturating_sub(self.reported);
        self.reported = total;
        busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_writes_count_once_and_an_open_interval_is_split_at_each_take() {
        let ms = Duration::from_millis;
        let mut clock = BusyClock::default();
        clock.start(ms(10));
        clock.start(ms(15));
        clock.end(ms(20));
        clock.end(ms(30));
        clock.start(ms(50));
        assert_eq!(clock.take(ms(60)), ms(30));
        clock.end(ms(70));
        assert_eq!(clock.take(ms(100)), ms(10));
        assert_eq!(clock.take(ms(200)), Duration::ZERO);
    }
}
