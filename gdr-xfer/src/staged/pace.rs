//! How the staging driver waits between its rounds: it polls on while its work moves often (a
//! copy or a child finishing every few microseconds, as on a fast NIC), and sleeps, longer and
//! longer, while it does not.
//!
//! A sleep costs more than it says: Linux wakes a thread that asked for 20 us after 60-80 us
//! (the timer slack), and one hand-off late by that much leaves a 50 GB/s NIC idle for a whole
//! 1 MiB chunk. So while rounds that move something come closer together than the agent's
//! `busy_poll` (their average spacing, recent ones weighing most) and the last one is less than
//! `busy_poll` ago, the driver yields instead of sleeping, as the progress threads poll their
//! completion queues.

use std::time::{Duration, Instant};

use crate::spacing::Spacing;

/// What the driver does before its next round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Yield the processor and go on at once.
    Poll,
    /// Sleep this long.
    Sleep(Duration),
}

/// The driver's pacing state.
#[derive(Debug, Clone)]
pub(crate) struct Pace {
    busy_poll: Duration,
    /// The spacing of rounds that moved something.
    moves: Spacing,
    /// The next sleep.
    pause: Duration,
}

impl Pace {
    /// The shortest sleep (after a round that moved something).
    pub(crate) const SLEEP_MIN: Duration = Duration::from_micros(20);
    /// The longest sleep: rounds that find nothing changed double the sleep up to this.
    pub(crate) const SLEEP_MAX: Duration = Duration::from_millis(1);

    /// Pacing that polls for at most `busy_poll` after work moved (zero: always sleeps).
    pub(crate) fn new(busy_poll: Duration) -> Pace {
        Pace {
            busy_poll,
            moves: Spacing::new(),
            pause: Self::SLEEP_MIN,
        }
    }

    /// After a round that ended at `now` and moved something (`moved`) or not: what to do
    /// before the next one.
    pub(crate) fn after_round(&mut self, now: Instant, moved: bool) -> Wait {
        if moved {
            self.moves.record(now);
            self.pause = Self::SLEEP_MIN;
        }
        if self.moves.polling_pays(now, self.busy_poll) {
            return Wait::Poll;
        }
        let pause = self.pause;
        if !moved {
            self.pause = (pause * 2).min(Self::SLEEP_MAX);
        }
        Wait::Sleep(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn work_moving_every_few_microseconds_is_polled_for() {
        let t0 = Instant::now();
        let mut p = Pace::new(200 * US);
        // The first move: no spacing known yet, so the driver sleeps the shortest sleep.
        assert_eq!(p.after_round(t0, true), Wait::Sleep(Pace::SLEEP_MIN));
        // Moves 20 us apart: polled for.
        for k in 1..10u32 {
            assert_eq!(p.after_round(t0 + 20 * US * k, true), Wait::Poll, "{k}");
        }
        // Rounds that move nothing, within busy_poll of the last move: still polled.
        let last = t0 + 180 * US;
        assert_eq!(p.after_round(last + 150 * US, false), Wait::Poll);
        // Past busy_poll: sleeps, doubling up to the longest.
        let later = last + 250 * US;
        let sleeps: Vec<_> = (0..8).map(|_| p.after_round(later, false)).collect();
        assert_eq!(sleeps[0], Wait::Sleep(Pace::SLEEP_MIN));
        assert_eq!(sleeps[1], Wait::Sleep(Pace::SLEEP_MIN * 2));
        assert_eq!(sleeps[7], Wait::Sleep(Pace::SLEEP_MAX));
        // A move resets the sleep and polls again (the average spacing is still short).
        assert_eq!(p.after_round(later + 10 * US, true), Wait::Poll);
    }

    #[test]
    fn work_moving_rarely_or_no_busy_poll_sleeps() {
        let t0 = Instant::now();
        // Moves 1 ms apart (a slow link): never polled for.
        let mut p = Pace::new(200 * US);
        for k in 0..20u32 {
            let w = p.after_round(t0 + 1000 * US * k, true);
            assert_eq!(w, Wait::Sleep(Pace::SLEEP_MIN), "{k}");
        }
        // busy_poll zero: always sleeps, however often work moves.
        let mut p = Pace::new(Duration::ZERO);
        for k in 0..20u32 {
            assert_eq!(
                p.after_round(t0 + US * k, true),
                Wait::Sleep(Pace::SLEEP_MIN)
            );
        }
    }

    #[test]
    fn the_average_follows_the_work_and_time_never_breaks_it() {
        let t0 = Instant::now();
        let mut p = Pace::new(200 * US);
        for k in 0..10u32 {
            p.after_round(t0 + 10 * US * k, true);
        }
        assert_eq!(p.after_round(t0 + 95 * US, true), Wait::Poll);
        // The work slows to 2 ms apart: within a few moves the driver sleeps again.
        let mut at = t0 + 95 * US;
        let mut polled = 0;
        for _ in 0..10 {
            at += 2000 * US;
            if p.after_round(at, true) == Wait::Poll {
                polled += 1;
            }
        }
        assert_eq!(polled, 0, "a 2 ms gap is past busy_poll at once");
        // An instant before the last move (clocks read on other threads): no panic, no overflow.
        assert!(matches!(
            p.after_round(t0, true),
            Wait::Poll | Wait::Sleep(_)
        ));
        let mut p = Pace::new(Duration::MAX);
        p.after_round(t0, true);
        assert_eq!(
            p.after_round(t0 + Duration::from_secs(3600), true),
            Wait::Poll
        );
    }
}
