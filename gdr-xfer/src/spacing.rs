//! The average spacing of events (completions found, rounds that moved work), recent ones
//! weighing most: what tells a polling loop whether polling on pays. The progress threads and
//! the staging driver both poll only while the work they wait for tends to come sooner than the
//! agent's `busy_poll`.
//!
//! The average is unknown until two events were seen, and the first gap is taken as it is: an
//! average seeded with "infinitely far apart" takes about a hundred events to come down to
//! microseconds, and where a connection signals one completion per 128 requests (a software
//! NIC at a few hundred Mb/s) that is longer than a whole benchmark run, so the documented
//! polling never started.

use std::time::{Duration, Instant};

/// The spacing of events seen so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct Spacing {
    /// When the last event was seen.
    last: Option<Instant>,
    /// The average gap between events (ns; each new gap weighs a quarter), `None` before the
    /// second event.
    avg_ns: Option<u64>,
}

impl Spacing {
    /// No event seen yet.
    pub(crate) fn new() -> Spacing {
        Spacing::default()
    }

    /// An event at `now`. An instant before the last one (clocks read on other threads) counts
    /// as no gap.
    pub(crate) fn record(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let gap =
                u64::try_from(now.saturating_duration_since(last).as_nanos()).unwrap_or(u64::MAX);
            self.avg_ns = Some(match self.avg_ns {
                Some(avg) => avg / 4 * 3 + gap / 4,
                None => gap,
            });
        }
        self.last = Some(now);
    }

    /// Whether the last event was less than `budget` before `now`.
    pub(crate) fn recent(&self, now: Instant, budget: Duration) -> bool {
        self.last
            .is_some_and(|t| now.saturating_duration_since(t) < budget)
    }

    /// Whether events come, on average, less than `budget` apart (false until two were seen).
    pub(crate) fn closer_than(&self, budget: Duration) -> bool {
        self.avg_ns
            .is_some_and(|g| u128::from(g) < budget.as_nanos())
    }

    /// Both: polling on at `now` pays for a loop that may poll for `budget` after an event.
    pub(crate) fn polling_pays(&self, now: Instant, budget: Duration) -> bool {
        self.recent(now, budget) && self.closer_than(budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn two_events_make_an_average_and_the_first_gap_counts_whole() {
        let t0 = Instant::now();
        let mut s = Spacing::new();
        assert!(!s.polling_pays(t0, Duration::MAX), "nothing seen yet");
        s.record(t0);
        assert!(s.recent(t0 + 10 * US, 200 * US));
        assert!(!s.closer_than(Duration::MAX), "one event is no spacing");
        // Events 100 ms apart (one signalled completion per 128 READs on Soft-RoCE): a loop
        // allowed to poll for a second polls from the second event on.
        let ms100 = Duration::from_millis(100);
        s.record(t0 + ms100);
        assert!(s.polling_pays(t0 + ms100 + 10 * US, Duration::from_secs(1)));
        assert!(!s.polling_pays(t0 + ms100 + 10 * US, 200 * US));
    }

    #[test]
    fn the_average_follows_the_events_and_no_instant_breaks_it() {
        let t0 = Instant::now();
        let mut s = Spacing::new();
        for k in 0..10u32 {
            s.record(t0 + 10 * US * k);
        }
        assert!(s.closer_than(200 * US));
        // Gaps of 2 ms: a quarter weight each, past 200 us after one.
        s.record(t0 + 90 * US + 2000 * US);
        assert!(!s.closer_than(200 * US));
        // An instant before the last event: no panic, no overflow, counted as no gap.
        s.record(t0);
        assert!(s.recent(t0, 200 * US));
        // The longest gaps and budgets: no overflow either.
        let mut s = Spacing::new();
        s.record(t0);
        s.record(t0 + Duration::from_secs(3600));
        assert!(s.closer_than(Duration::MAX));
        assert!(!s.closer_than(Duration::ZERO));
        assert!(!s.recent(t0, Duration::ZERO));
    }
}
