//! Rails: the RDMA ports an agent moves data on, and what each connection knows of each rail
//! (its state, its cool-down, its measured throughput, its counters).
//!
//! An agent opens every port its device selection allows (in the order of the selection) as
//! rails `0..n`; rail `r` of one agent talks to rail `r` of its peer, so two agents share
//! `min(n, m)` rails. Each rail has its own context, protection domain, completion queue and
//! progress thread; every segment is registered on every rail.
//!
//! Per connection, a rail is [`RailState::Active`] (carries slices), [`RailState::Paused`]
//! (it failed: its queue pairs were destroyed and what they carried was posted again on the
//! other rails; it waits for its cool-down), [`RailState::Renewing`] (new queue pairs offered
//! to the peer) or [`RailState::Probing`] (new queue pairs connected, a probe message in
//! flight). A successful probe re-admits it; a failed one pauses it again with twice the
//! cool-down (from [`FIRST_COOLDOWN`] up to [`MAX_COOLDOWN`]; back to the first after
//! [`HEALTHY`] of service).
//!
//! # Which rails a transfer uses
//!
//! The rails nearest the memory: for the location of a transfer's (first) local segment, the
//! agent's rails are ranked by [`gdr::doctor::rank_rails`], the function `gdr doctor` ranks and
//! prints them with (PCIe path class to the GPU, or NUMA node of host memory, then port rate),
//! so the engine and the doctor never disagree; a transfer stripes over the agent's best-ranked
//! rails for its memory ([`preferred_rails`]). When none of those is active, it uses any active
//! rail (a further rail is slower, not wrong).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use gdr::device::Context;
use gdr::doctor::{MemoryLocation, Report};
use gdr::pd::ProtectionDomain;
use gdr::CompletionQueue;

/// The first cool-down of a rail that failed.
pub(crate) const FIRST_COOLDOWN: Duration = Duration::from_millis(200);
/// The longest cool-down.
pub(crate) const MAX_COOLDOWN: Duration = Duration::from_secs(5);
/// Service time after which a rail's next failure starts from the first cool-down again.
pub(crate) const HEALTHY: Duration = Duration::from_secs(10);
/// How often the throughput estimate takes a sample.
pub(crate) const SAMPLE: Duration = Duration::from_millis(20);
/// The throughput a rail is credited with before it was measured (bytes per second): equal
/// for all rails, so that unmeasured rails share by queued bytes alone.
const UNMEASURED: f64 = 1.0e9;
/// The lowest estimate (bytes per second): a stalled rail is slow, not infinitely slow.
const MIN_RATE: f64 = 1.0e3;
/// How much of the throughput sums survives a sample (about ten samples of memory).
const DECAY: f64 = 0.9;

/// This machine's doctor report, read once per process (the topology does not change while
/// it runs; which rails work is the engine's own bookkeeping). `None` when it cannot be read.
fn host_report() -> Option<&'static Report> {
    static REPORT: OnceLock<Option<Report>> = OnceLock::new();
    REPORT
        .get_or_init(
            || match gdr::doctor::host_report(std::path::Path::new("/")) {
                Ok(r) => Some(r),
                Err(e) => {
                    log::warn!(
                        "reading this host's topology for rail choice: {e}; every rail is equal"
                    );
                    None
                }
            },
        )
        .as_ref()
}

/// The doctor's name for a segment location.
pub(crate) fn memory_location(location: crate::Location) -> MemoryLocation {
    match location {
        crate::Location::Cpu { numa: None } => MemoryLocation::Any,
        crate::Location::Cpu { numa: Some(n) } => {
            MemoryLocation::Numa(i32::try_from(n).unwrap_or(-1))
        }
        crate::Location::Cuda { ordinal } => MemoryLocation::Gpu { ordinal },
    }
}

/// The rails (bit `i` = rail `i` of `rails`) a transfer from memory at `memory` stripes over:
/// those of the best tier [`gdr::doctor::rank_rails`] gives among the agent's rails in
/// `report`. A rail the report does not list counts as best (nothing says it is worse); no
/// report, or no rail found, gives every rail.
pub(crate) fn preferred_rails(
    report: Option<&Report>,
    rails: &[(String, u8)],
    memory: &MemoryLocation,
) -> u32 {
    let all = if rails.len() >= 32 {
        u32::MAX
    } else {
        (1u32 << rails.len()) - 1
    };
    let Some(report) = report else {
        return all;
    };
    let ranked = gdr::doctor::rank_rails(report, memory, None);
    let tiers: Vec<Option<u32>> = rails
        .iter()
        .map(|(name, port)| {
            ranked
                .iter()
                .find(|r| r.nic == *name && r.port == u32::from(*port))
                .map(|r| r.tier)
        })
        .collect();
    let Some(best) = tiers.iter().flatten().min().copied() else {
        return all;
    };
    tiers
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_none_or(|t| t == best))
        .fold(0, |m, (i, _)| m | (1 << i))
}

/// [`preferred_rails`] on this machine's report.
pub(crate) fn preferred_rails_here(rails: &[(String, u8)], location: crate::Location) -> u32 {
    preferred_rails(host_report(), rails, &memory_location(location))
}

/// One of the agent's rails.
pub(crate) struct AgentRail {
    pub(crate) ctx: Arc<Context>,
    pub(crate) port: u8,
    pub(crate) pd: Arc<ProtectionDomain>,
    pub(crate) cq: Arc<CompletionQueue>,
}

/// Where a rail to a peer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailState {
    /// It carries slices.
    Active,
    /// It failed; it waits for its cool-down before it is renewed.
    Paused,
    /// New queue pairs were offered to the peer; waiting for its answer.
    Renewing,
    /// New queue pairs are connected; a probe is in flight.
    Probing,
}

/// Telemetry of one rail to one peer (see [`Peer::rail_stats`](crate::Peer::rail_stats)).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RailStats {
    /// The rail's position in the agent's rail list.
    pub rail: usize,
    /// The RDMA device.
    pub device: String,
    /// Its port.
    pub port: u8,
    /// Where it stands.
    pub state: RailState,
    /// Bytes of slices completed on it.
    pub bytes: u64,
    /// Slices completed on it.
    pub slices: u64,
    /// Error completions (or failed posts) that paused it.
    pub errors: u64,
    /// Slices it carried when it failed, posted again on another rail.
    pub retries: u64,
    /// Times its queue pairs were replaced.
    pub renewals: u64,
    /// Times it came back into service (its probe succeeded, or the peer renewed it).
    pub readmissions: u64,
    /// Bytes posted on it and not completed yet.
    pub inflight_bytes: u64,
    /// Moving average of its completed bytes per second (0 until measured).
    pub throughput: f64,
    /// Why it last failed.
    pub last_error: Option<String>,
    /// From its last failure until the slices it carried were posted again (nothing was
    /// posted again: the transfers had none in flight there).
    pub last_failover: Option<Duration>,
}

/// What a connection keeps about one rail.
pub(crate) struct RailLink {
    pub(crate) state: RailState,
    /// Paused: when the cool-down ends. Renewing: when the offer times out.
    pub(crate) until: Instant,
    pub(crate) cooldown: Duration,
    pub(crate) active_since: Option<Instant>,
    /// The epoch of our latest renewal offer.
    pub(crate) epoch: u32,
    /// Notification send slots the peer has receives for on this rail.
    pub(crate) free_notify_slots: Vec<u16>,
    /// Lane to try first for the next chunk (round robin inside the rail).
    pub(crate) next_lane: usize,
    /// When it failed, until what it carried was posted again.
    pub(crate) failed_at: Option<Instant>,
    pub(crate) stats: RailCounters,
    /// Whether `stats.throughput` is a measurement (reset when the rail is re-admitted: its
    /// queue pairs and perhaps its path are new).
    measured: bool,
    window_bytes: u64,
    /// When the next sample is due.
    next_sample: Instant,
    /// Time the rail had bytes in flight during the current window, and since when it has
    /// (`None`: idle). Throughput is bytes over busy time: a fast rail that idles while
    /// transfers wait for a slow one is not mistaken for a slow one.
    busy: Duration,
    busy_since: Option<Instant>,
    /// Decayed sums of completed bytes and busy seconds (the estimate is their ratio).
    acc_bytes: f64,
    acc_busy: f64,
}

/// The counters of [`RailStats`].
#[derive(Default)]
pub(crate) struct RailCounters {
    pub(crate) bytes: u64,
    pub(crate) slices: u64,
    pub(crate) errors: u64,
    pub(crate) retries: u64,
    pub(crate) renewals: u64,
    pub(crate) readmissions: u64,
    pub(crate) inflight_bytes: u64,
    pub(crate) throughput: f64,
    pub(crate) last_error: Option<String>,
    pub(crate) last_failover: Option<Duration>,
}

impl RailLink {
    pub(crate) fn new(notify_slots: u16, now: Instant) -> RailLink {
        RailLink {
            state: RailState::Active,
            until: now,
            cooldown: FIRST_COOLDOWN,
            active_since: Some(now),
            epoch: 0,
            free_notify_slots: (0..notify_slots).rev().collect(),
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

    /// Marks it failed at `now`: paused for its cool-down, which grows for the next time
    /// (unless it had served [`HEALTHY`] since it was last admitted).
    pub(crate) fn pause(&mut self, now: Instant, why: String) {
        if self
            .active_since
            .is_some_and(|t| now.duration_since(t) >= HEALTHY)
        {
            self.cooldown = FIRST_COOLDOWN;
        }
        self.state = RailState::Paused;
        self.until = now + self.cooldown;
        self.cooldown = (self.cooldown * 2).min(MAX_COOLDOWN);
        self.active_since = None;
        self.stats.errors += 1;
        self.stats.last_error = Some(why);
        self.stats.inflight_bytes = 0;
        self.busy_since = None;
    }

    /// Admits it (a probe succeeded, or the peer renewed it).
    pub(crate) fn admit(&mut self, now: Instant, notify_slots: u16) {
        self.readmit(now);
        self.free_notify_slots = (0..notify_slots).rev().collect();
    }

    /// Takes it back into service (its probe succeeded): active, and unmeasured (its queue
    /// pairs, and perhaps its path, are new).
    pub(crate) fn readmit(&mut self, now: Instant) {
        self.state = RailState::Active;
        self.active_since = Some(now);
        self.measured = false;
        self.window_bytes = 0;
        self.next_sample = now + SAMPLE;
        self.busy = Duration::ZERO;
        self.busy_since = None;
        self.acc_bytes = 0.0;
        self.acc_busy = 0.0;
    }

    /// Counts `bytes` posted on it (reads the clock only when the rail was idle).
    pub(crate) fn posted(&mut self, bytes: u64) {
        if self.stats.inflight_bytes == 0 {
            self.busy_since = Some(Instant::now());
        }
        self.stats.inflight_bytes += bytes;
    }

    /// Credits completed bytes.
    pub(crate) fn completed(&mut self, bytes: u64, slices: u64) {
        self.stats.bytes += bytes;
        self.stats.slices += slices;
        self.stats.inflight_bytes = self.stats.inflight_bytes.saturating_sub(bytes);
        self.window_bytes += bytes;
        if self.stats.inflight_bytes == 0 {
            if let Some(t) = self.busy_since.take() {
                self.busy += t.elapsed();
            }
        }
    }

    /// Takes a throughput sample when [`SAMPLE`] has passed. The estimate is the bytes
    /// completed over the time the rail had bytes in flight, both summed with an exponential
    /// decay (a time constant of about ten samples), so that completions arriving in bursts
    /// (a chunk completes at once) do not swing it. An idle rail keeps its estimate; a rail
    /// with work that completes nothing sinks towards zero: it is stalled, and the scheduler
    /// avoids it. The first estimate needs completed bytes.
    pub(crate) fn sample(&mut self, now: Instant) {
        // A comparison, not a subtraction: this runs at every tick.
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
    /// its measured throughput (an unmeasured rail is assumed fast, so it gets measured).
    pub(crate) fn cost(&self, bytes: u64) -> f64 {
        let t = if self.measured {
            self.stats.throughput
        } else {
            UNMEASURED
        };
        (self.stats.inflight_bytes + bytes) as f64 / t
    }

    pub(crate) fn snapshot(&self, rail: usize, device: String, port: u8) -> RailStats {
        let c = &self.stats;
        RailStats {
            rail,
            device,
            port,
            state: self.state,
            bytes: c.bytes,
            slices: c.slices,
            errors: c.errors,
            retries: c.retries,
            renewals: c.renewals,
            readmissions: c.readmissions,
            inflight_bytes: c.inflight_bytes,
            throughput: c.throughput,
            last_error: c.last_error.clone(),
            last_failover: c.last_failover,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Report {
        let path = format!(
            "{}/../gdr/tests/fixtures/doctor/snapshots/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap();
        gdr::doctor::diagnose(&gdr::topology::Snapshot::from_json(&text, &path).unwrap())
    }

    #[test]
    fn a_transfer_stripes_over_the_rails_the_doctor_ranks_best_for_its_memory() {
        // The fixed DGX: GPU 0 shares a PCIe switch with mlx5_0, GPU 1 with mlx5_1.
        let report = fixture("dgx-a100-fixed.json");
        let rails = vec![("mlx5_0".to_string(), 1), ("mlx5_1".to_string(), 1)];
        let gpu =
            |ordinal| preferred_rails(Some(&report), &rails, &MemoryLocation::Gpu { ordinal });
        assert_eq!(gpu(0), 0b01, "GPU 0's memory goes over mlx5_0 only");
        assert_eq!(gpu(1), 0b10, "GPU 1's memory goes over mlx5_1 only");
        // The doctor's table says the same (its best NIC per GPU).
        for g in &report.gpus {
            let want = if g.best_nic.as_deref() == Some("mlx5_0") {
                0b01
            } else {
                0b10
            };
            assert_eq!(gpu(g.cuda_ordinal.unwrap() as u32), want, "{g:?}");
        }
        // Rails in the other order: the mask follows the agent's rail numbers.
        let swapped = vec![rails[1].clone(), rails[0].clone()];
        assert_eq!(
            preferred_rails(Some(&report), &swapped, &MemoryLocation::Gpu { ordinal: 0 }),
            0b10
        );
        // Host memory with no NUMA preference, no report, an unknown rail: every rail.
        assert_eq!(preferred_rails(None, &rails, &MemoryLocation::Any), 0b11);
        let odd = vec![("rxe9".to_string(), 1), ("mlx5_1".to_string(), 1)];
        assert_eq!(
            preferred_rails(Some(&report), &odd, &MemoryLocation::Gpu { ordinal: 1 }),
            0b11,
            "a rail the report does not know is not ranked worse"
        );
        assert_eq!(
            preferred_rails(Some(&report), &odd, &MemoryLocation::Gpu { ordinal: 0 }),
            0b11,
            "the best known rail (mlx5_1, SYS) and the unknown one"
        );
    }

    #[test]
    fn cooldowns_grow_and_reset_after_healthy_service() {
        let t0 = Instant::now();
        let mut r = RailLink::new(4, t0);
        r.pause(t0, "x".into());
        assert_eq!(r.until, t0 + FIRST_COOLDOWN);
        r.admit(t0, 4);
        r.pause(t0 + Duration::from_millis(1), "y".into());
        assert_eq!(
            r.until,
            t0 + Duration::from_millis(1) + FIRST_COOLDOWN * 2,
            "a rail that fails again soon waits twice as long"
        );
        for _ in 0..20 {
            r.pause(t0, "z".into());
        }
        assert_eq!(r.cooldown, MAX_COOLDOWN);
        r.admit(t0, 4);
        r.pause(t0 + HEALTHY, "later".into());
        assert_eq!(r.until, t0 + HEALTHY + FIRST_COOLDOWN);
        assert_eq!(r.stats.errors, 23);
        assert_eq!(r.free_notify_slots.len(), 4);
    }

    #[test]
    fn the_cheaper_rail_is_the_faster_or_emptier_one() {
        let t0 = Instant::now();
        let (mut fast, mut slow) = (RailLink::new(1, t0), RailLink::new(1, t0));
        assert_eq!(fast.cost(100), slow.cost(100), "unmeasured rails are equal");
        fast.stats.inflight_bytes = 10;
        assert!(fast.cost(100) > slow.cost(100), "queued bytes count");
        for (r, bytes) in [(&mut fast, 4_000_000u64), (&mut slow, 1_000_000)] {
            r.stats.inflight_bytes = 0;
            r.posted(bytes);
            r.completed(bytes, 1);
            // Busy from t0 until now (the completion); the sample comes after the window.
            r.busy = Duration::from_millis(40);
            r.sample(t0 + Duration::from_millis(40));
        }
        assert!(fast.stats.throughput > 3.0 * slow.stats.throughput);
        fast.stats.inflight_bytes = 3_000_000;
        slow.stats.inflight_bytes = 1_000_000;
        assert!(fast.cost(65536) < slow.cost(65536));
        // An idle rail keeps its estimate.
        let before = slow.stats.throughput;
        slow.stats.inflight_bytes = 0;
        slow.sample(t0 + Duration::from_secs(5));
        assert_eq!(slow.stats.throughput, before);
        // A stalled rail (work queued, nothing completing) sinks towards the floor and costs
        // more than any working one; re-admitted, it is unmeasured (assumed fast) again.
        slow.posted(1 << 20);
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
        assert!(slow.cost(65536) > 100.0 * fast.cost(65536));
        slow.admit(t0, 1);
        slow.stats.inflight_bytes = 0;
        assert!(slow.cost(65536) < fast.cost(65536));
        // Idle time does not count: a fast rail that waited between short bursts keeps its
        // speed (4 MB in 10 ms of busy time in a 1 s window is 400 MB/s, not 4 MB/s).
        // Bursty completions do not swing it: a rail completing 2 MB every 100 ms, busy all
        // along, reads 20 MB/s whatever the phase of the samples.
        let mut steady = RailLink::new(1, t0);
        steady.posted(1 << 30);
        steady.busy_since = Some(t0);
        let mut seen = Vec::new();
        for k in 1..=50u32 {
            let at = t0 + SAMPLE * k;
            if k % 5 == 0 {
                steady.completed(2_000_000, 1);
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
        bursty.posted(4_000_000);
        bursty.busy_since = None;
        bursty.busy = Duration::from_millis(10);
        bursty.completed(4_000_000, 1);
        bursty.sample(t0 + Duration::from_secs(1));
        assert!(
            (bursty.stats.throughput - 4.0e8).abs() < 1.0,
            "{}",
            bursty.stats.throughput
        );
        // An unmeasured rail with work but nothing completed yet stays unmeasured.
        let mut fresh = RailLink::new(1, t0);
        fresh.posted(1 << 20);
        fresh.busy_since = Some(t0);
        fresh.sample(t0 + SAMPLE);
        assert_eq!(fresh.cost(0), (1u64 << 20) as f64 / UNMEASURED);
    }
}
