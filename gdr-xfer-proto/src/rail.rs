//! What a connection keeps about one rail: its state, its cool-down, its measured throughput,
//! its counters.
//!
//! Per connection, a rail is [`RailState::Active`] (carries requests), [`RailState::Paused`]
//! (it failed: its queue pairs were destroyed and what they carried was posted again on the
//! other rails; it waits for its cool-down), [`RailState::Renewing`] (new queue pairs offered
//! to the peer) or [`RailState::Probing`] (new queue pairs connected, a probe message in
//! flight). A successful probe re-admits it; a failed one pauses it again with twice the
//! cool-down (from [`FIRST_COOLDOWN`] up to [`MAX_COOLDOWN`]; back to the first after
//! [`HEALTHY`] of service). A *fence* (a stopped transfer's requests outlived the quiesce time)
//! renews an active rail at once, without pausing it or counting an error.

use std::time::{Duration, Instant};

use crate::fault::RailFault;

/// The first cool-down of a rail that failed.
pub const FIRST_COOLDOWN: Duration = Duration::from_millis(200);
/// The longest cool-down.
pub const MAX_COOLDOWN: Duration = Duration::from_secs(5);
/// Service time after which a rail's next failure starts from the first cool-down again.
pub const HEALTHY: Duration = Duration::from_secs(10);
/// How often the throughput estimate takes a sample.
pub const SAMPLE: Duration = Duration::from_millis(20);
/// The throughput a rail is credited with before it was measured, while no rail of the
/// connection is measured (bytes per second): equal for all rails, so that unmeasured rails
/// share by queued bytes alone.
const UNMEASURED: f64 = 1.0e9;
/// The lowest estimate (bytes per second): a stalled rail is slow, not infinitely slow.
const MIN_RATE: f64 = 1.0e3;
/// How much of the throughput sums survives a sample (about ten samples of memory).
const DECAY: f64 = 0.9;

/// Where a rail to a peer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailState {
    /// It carries requests.
    Active,
    /// It failed; it waits for its cool-down before it is renewed.
    Paused,
    /// New queue pairs were offered to the peer; waiting for its answer.
    Renewing,
    /// New queue pairs are connected; a probe is in flight.
    Probing,
}

/// Counters of one rail to one peer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RailCounters {
    /// Bytes of requests completed on it.
    pub bytes: u64,
    /// Requests completed on it.
    pub slices: u64,
    /// Error completions (or failed posts, renewals) that paused it.
    pub errors: u64,
    /// Requests it carried when it failed or was fenced, posted again.
    pub retries: u64,
    /// Times its queue pairs were replaced.
    pub renewals: u64,
    /// Times it came back into service.
    pub readmissions: u64,
    /// Times it was fenced (renewed at once to end a stopped transfer's requests).
    pub fences: u64,
    /// Bytes posted on it and not completed yet.
    pub inflight_bytes: u64,
    /// Moving average of its completed bytes per second (0 until measured).
    pub throughput: f64,
    /// Why it last failed.
    pub last_error: Option<RailFault>,
    /// From its last failure until the requests it carried were posted again.
    pub last_failover: Option<Duration>,
}

/// What a connection keeps about one rail.
#[derive(Debug, Clone)]
pub(crate) struct RailLink {
    pub(crate) state: RailState,
    /// Paused: when the cool-down ends. Renewing: when the offer times out.
    pub(crate) until: Instant,
    pub(crate) cooldown: Duration,
    pub(crate) active_since: Option<Instant>,
    /// The epoch of our latest renewal offer.
    pub(crate) epoch: u32,
    /// Whether the renewal in progress is a fence (the rail did not fail).
    pub(crate) fencing: bool,
    /// Send slots the peer has receives for on this rail.
    pub(crate) free_send_slots: Vec<u16>,
    /// Lane to try first for the next batch (round robin inside the rail).
    pub(crate) next_lane: usize,
    /// When it failed, until what it carried was posted again.
    pub(crate) failed_at: Option<Instant>,
    pub(crate) stats: RailCounters,
    /// Whether `stats.throughput` is a measurement.
    measured: bool,
    window_bytes: u64,
    next_sample: Instant,
    /// Time the rail had bytes in flight during the current window, and since when it has.
    busy: Duration,
    busy_since: Option<Instant>,
    acc_bytes: f64,
    acc_busy: f64,
}

impl RailLink {
    pub(crate) fn new(send_slots: u16, now: Instant) -> RailLink {
        RailLink {
            state: RailState::Active,
            until: now,
            cooldown: FIRST_COOLDOWN,
            active_since: Some(now),
            epoch: 0,
            fencing: false,
            free_send_slots: (0..send_slots).rev().collect(),
            next_lane: 0,
            failed_at: None,
            stats: RailCounters::default(),
            measured: false,
            window_bytes: 0,
            next_sample: now + SAMPLE,
            busy: Duration::ZERO,
            busy_since: None,
            acc_bytes: 0.0,
            acc_busy: 0.0,
        }
    }

    pub(crate) fn is_active(&self) -> bool {
        self.state == RailState::Active
    }

    /// Whether it carries requests now or will without a failure: active, or being renewed by
    /// a fence.
    pub(crate) fn is_usable(&self) -> bool {
        self.is_active() || (self.fencing && self.state != RailState::Paused)
    }

    /// Marks it failed at `now`: paused for its cool-down, which grows for the next time
    /// (unless it had served [`HEALTHY`] since it was last admitted).
    pub(crate) fn pause(&mut self, now: Instant, why: RailFault) {
        if self
            .active_since
            .is_some_and(|t| now.saturating_duration_since(t) >= HEALTHY)
        {
            self.cooldown = FIRST_COOLDOWN;
        }
        self.state = RailState::Paused;
        self.fencing = false;
        self.until = now + self.cooldown;
        self.cooldown = (self.cooldown * 2).min(MAX_COOLDOWN);
        self.active_since = None;
        self.stats.errors += 1;
        self.stats.last_error = Some(why);
        self.stats.inflight_bytes = 0;
        self.busy_since = None;
        self.free_send_slots.clear();
    }

    /// Takes it back into service with fresh send slots: active, and unmeasured (its queue
    /// pairs, and perhaps its path, are new).
    pub(crate) fn admit(&mut self, now: Instant, send_slots: u16) {
        self.state = RailState::Active;
        self.fencing = false;
        self.active_since = Some(now);
        self.measured = false;
        self.window_bytes = 0;
        self.next_sample = now + SAMPLE;
        self.busy = Duration::ZERO;
        self.busy_since = None;
        self.acc_bytes = 0.0;
        self.acc_busy = 0.0;
        self.stats.inflight_bytes = 0;
        self.free_send_slots = (0..send_slots).rev().collect();
    }

    /// Counts `bytes` posted on it.
    pub(crate) fn posted(&mut self, bytes: u64, now: Instant) {
        if self.stats.inflight_bytes == 0 {
            self.busy_since = Some(now);
        }
        self.stats.inflight_bytes += bytes;
    }

    /// Credits completed bytes.
    pub(crate) fn completed(&mut self, bytes: u64, slices: u64, now: Instant) {
        self.stats.bytes += bytes;
        self.stats.slices += slices;
        self.stats.inflight_bytes = self.stats.inflight_bytes.saturating_sub(bytes);
        self.window_bytes += bytes;
        if self.stats.inflight_bytes == 0 {
            if let Some(t) = self.busy_since.take() {
                self.busy += now.saturating_duration_since(t);
            }
        }
    }

    /// When the next throughput sample is due.
    pub(crate) fn next_sample(&self) -> Instant {
        self.next_sample
    }

    /// Takes a throughput sample when [`SAMPLE`] has passed. The estimate is the bytes
    /// completed over the time the rail had bytes in flight, both summed with an exponential
    /// decay, so that completions arriving in bursts do not swing it. An idle rail keeps its
    /// estimate; a rail with work that completes nothing sinks towards zero: it is stalled, and
    /// the scheduler avoids it.
    pub(crate) fn sample(&mut self, now: Instant) {
        if now < self.next_sample {
            return;
        }
        self.next_sample = now + SAMPLE;
        let mut busy = self.busy;
        if let Some(t) = self.busy_since {
            busy += now.saturating_duration_since(t);
            self.busy_since = Some(now);
        }
        if !busy.is_zero() {
            self.acc_bytes = DECAY * self.acc_bytes + self.window_bytes as f64;
            self.acc_busy = DECAY * self.acc_busy + busy.as_secs_f64();
            if self.acc_bytes > 0.0 {
                self.measured = true;
            }
            if self.measured {
                self.stats.throughput = (self.acc_bytes / self.acc_busy).max(MIN_RATE);
            }
        }
        self.window_bytes = 0;
        self.busy = Duration::ZERO;
    }

    /// The scheduler's cost of adding `bytes` to this rail: the time its queued bytes take at
    /// its measured throughput. An unmeasured rail is assumed fast, so it gets measured: as fast
    /// as the fastest measured one (`measured_best`) when there is one, else [`UNMEASURED`]. A rail
    /// taken back into service after a failure is unmeasured; credited with 1 GB/s beside rails
    /// measured at a fraction of that (Soft-RoCE: tens of MB/s), it drew a whole 16 MiB paged
    /// write before its first sample (the cluster tier's t1 saw `rails_used: 1`).
    pub(crate) fn cost_among(&self, bytes: u64, measured_best: Option<f64>) -> f64 {
        let t = if self.measured {
            self.stats.throughput
        } else {
            measured_best.unwrap_or(UNMEASURED)
        };
        (self.stats.inflight_bytes + bytes) as f64 / t
    }

    /// Its throughput, when measured.
    pub(crate) fn measured_throughput(&self) -> Option<f64> {
        self.measured.then_some(self.stats.throughput)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cooldowns_grow_and_reset_after_healthy_service() {
        let t0 = Instant::now();
        let mut r = RailLink::new(4, t0);
        r.pause(t0, RailFault::Unanswered);
        assert_eq!(r.until, t0 + FIRST_COOLDOWN);
        r.admit(t0, 4);
        r.pause(t0 + Duration::from_millis(1), RailFault::Unanswered);
        assert_eq!(
            r.until,
            t0 + Duration::from_millis(1) + FIRST_COOLDOWN * 2,
            "a rail that fails again soon waits twice as long"
        );
        for _ in 0..20 {
            r.pause(t0, RailFault::Unanswered);
        }
        assert_eq!(r.cooldown, MAX_COOLDOWN);
        r.admit(t0, 4);
        r.pause(t0 + HEALTHY, RailFault::Unanswered);
        assert_eq!(r.until, t0 + HEALTHY + FIRST_COOLDOWN);
        assert_eq!(r.stats.errors, 23);
        assert!(
            r.free_send_slots.is_empty(),
            "a paused rail's queue pairs are gone, and its slots"
        );
        r.admit(t0, 4);
        assert_eq!(r.free_send_slots.len(), 4);
    }

    #[test]
    fn the_cheaper_rail_is_the_faster_or_emptier_one() {
        let t0 = Instant::now();
        let (mut fast, mut slow) = (RailLink::new(1, t0), RailLink::new(1, t0));
        assert_eq!(
            fast.cost_among(100, None),
            slow.cost_among(100, None),
            "unmeasured rails are equal"
        );
        fast.stats.inflight_bytes = 10;
        assert!(
            fast.cost_among(100, None) > slow.cost_among(100, None),
            "queued bytes count"
        );
        for (r, bytes) in [(&mut fast, 4_000_000u64), (&mut slow, 1_000_000)] {
            r.stats.inflight_bytes = 0;
            r.posted(bytes, t0);
            r.completed(bytes, 1, t0);
            // Busy from t0 until now (the completion); the sample comes after the window.
            r.busy = Duration::from_millis(40);
            r.sample(t0 + Duration::from_millis(40));
        }
        assert!(fast.stats.throughput > 3.0 * slow.stats.throughput);
        fast.stats.inflight_bytes = 3_000_000;
        slow.stats.inflight_bytes = 1_000_000;
        assert!(fast.cost_among(65536, None) < slow.cost_among(65536, None));
        // An idle rail keeps its estimate.
        let before = slow.stats.throughput;
        slow.stats.inflight_bytes = 0;
        slow.sample(t0 + Duration::from_secs(5));
        assert_eq!(slow.stats.throughput, before);
        // A stalled rail (work queued, nothing completing) sinks towards the floor and costs
        // more than any working one; re-admitted, it is unmeasured (assumed fast) again.
        slow.posted(1 << 20, t0);
        slow.busy_since = Some(t0 + Duration::from_secs(5));
        for k in 1..40 {
            slow.sample(t0 + Duration::from_secs(5) + SAMPLE * k);
        }
        assert!(
            slow.stats.throughput < fast.stats.throughput / 100.0,
            "{} vs {}",
            slow.stats.throughput,
            fast.stats.throughput
        );
        assert!(slow.cost_among(65536, None) > 100.0 * fast.cost_among(65536, None));
        slow.admit(t0, 1);
        slow.stats.inflight_bytes = 0;
        assert!(slow.cost_among(65536, None) < fast.cost_among(65536, None));
        // Idle time does not count: a fast rail that waited between short bursts keeps its
        // speed (4 MB in 10 ms of busy time in a 1 s window is 400 MB/s, not 4 MB/s).
        // Bursty completions do not swing it: a rail completing 2 MB every 100 ms, busy all
        // along, reads 20 MB/s whatever the phase of the samples.
        let mut steady = RailLink::new(1, t0);
        steady.posted(1 << 30, t0);
        steady.busy_since = Some(t0);
        let mut seen = Vec::new();
        for k in 1..=50u32 {
            let at = t0 + SAMPLE * k;
            if k % 5 == 0 {
                steady.completed(2_000_000, 1, at);
            }
            steady.sample(at);
            if k > 20 {
                seen.push(steady.stats.throughput);
            }
        }
        let (lo, hi) = seen
            .iter()
            .fold((f64::MAX, 0f64), |(l, h), &v| (l.min(v), h.max(v)));
        assert!(lo > 12.0e6 && hi < 30.0e6, "between {lo} and {hi}");
        let mut bursty = RailLink::new(1, t0);
        bursty.posted(4_000_000, t0);
        bursty.busy_since = None;
        bursty.busy = Duration::from_millis(10);
        bursty.completed(4_000_000, 1, t0);
        bursty.sample(t0 + Duration::from_secs(1));
        assert!(
            (bursty.stats.throughput - 4.0e8).abs() < 1.0,
            "{}",
            bursty.stats.throughput
        );
        // An unmeasured rail with work but nothing completed yet stays unmeasured.
        let mut fresh = RailLink::new(1, t0);
        fresh.posted(1 << 20, t0);
        fresh.busy_since = Some(t0);
        fresh.sample(t0 + SAMPLE);
        assert_eq!(fresh.cost_among(0, None), (1u64 << 20) as f64 / UNMEASURED);
        // Beside a rail measured at 50 MB/s, it is assumed that fast, not 1 GB/s: equal queues,
        // equal costs.
        let mut steady = RailLink::new(1, t0);
        steady.measured = true;
        steady.stats.throughput = 5.0e7;
        steady.stats.inflight_bytes = 1 << 20;
        let best = steady.measured_throughput();
        assert_eq!(best, Some(5.0e7));
        assert_eq!(fresh.measured_throughput(), None);
        assert_eq!(fresh.cost_among(0, best), steady.cost_among(0, best));
        assert!(fresh.cost_among(65536, best) > 10.0 * fresh.cost_among(65536, None));
    }
}

#[cfg(test)]
mod mutant_tests;
