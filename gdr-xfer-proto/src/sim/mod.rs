//! Deterministic simulation of the core (feature `sim`).
//!
//! Agents with real memory connect over simulated RC queue pairs (requests executed one at a
//! time and in order per queue pair, packets that take time on the wire, remote keys checked,
//! receives needed for SENDs, errors that flush a queue pair), driven by [`crate::Connection`]
//! cores exactly as `gdr-xfer` drives them, and stagers that are the core's bounce-slot machine
//! ([`crate::staging::Pipeline`]) over simulated copies. Everything random (sizes, timings, which faults,
//! when) comes from one seed, with a virtual clock, so a seed replays exactly.
//!
//! Faults drawn (by the seed's class, `seed % 4`): slow paths that hold a queue pair's requests
//! past the quiesce time, peers deregistering segments under transfers (request errors),
//! misuse (local memory of another agent, notifications longer than the peer takes), tight
//! deadlines in every phase, cancellations, slow notification consumers, a stager's copy that
//! fails (before the faults heal; its bounce buffer is broken for good); then lane failures
//! and failing queue pair creation (`Lanes`), links down and up (`Links`), or an agent killed
//! (`Kill`).
//!
//! Checked after every step:
//! - no request reads or writes a transfer's memory after the transfer reported its outcome
//!   (every DMA is checked as it happens);
//! - a notification reaches the peer only after every byte of its transfer landed, and is
//!   delivered to the application once;
//! - every transfer reported done has every byte exactly where asked;
//! - every transfer reaches its outcome by its deadline plus [`crate::Config::outcome_bound`];
//! - every completion (send and receive) is routed by its agent's [`crate::Endpoint`] (by rail
//!   and queue pair number, as the driver routes them) to the connection, incarnation and lane
//!   whose queue pair it completed on, or nowhere once that queue pair was destroyed; a
//!   connection let go (its peer vanished or said goodbye) goes only once every completion
//!   queued for it before then was handled, and what it still carried fails then, as in the
//!   driver; every outcome comes once no live queue pair holds one of the transfer's requests;
//! - half the runs of the first three classes (without staged transfers) disconnect two agents
//!   and connect them again: the leaving side's transfers stop and report once neither side's
//!   memory can be touched by them ([`crate::Connection::leave`]), then it says goodbye and
//!   closes, and a new handshake under the same names follows while the old connection may
//!   still drain (`GDR_SIM_RECONNECT=0`: none);
//! - every agent's table of a peer (the core's [`crate::PeerTable`], fed the peer's
//!   announcements through the wire format, in order with its other control messages) accepts
//!   every honest message; applications plan from it, so a transfer planned before a
//!   deregistration reached the table uses stale keys and is no innocent transfer;
//! - the core never posts beyond a send queue's depth; no panic;
//! - without link faults, a transfer with nothing wrong with it (a generous deadline, no
//!   misuse, not cancelled, its keys valid) succeeds, whatever the others do; when an agent
//!   dies, transfers between the survivors are unaffected;
//! - liveness: at 600 ms every fault has ended and those that would persist heal (queue pairs
//!   are created again, none is slow or doomed); once the rails had time to come back (the
//!   longest cool-down, two renewal timeouts, a margin), every pair still connected submits
//!   plain transfers, and each must succeed;
//! - at the end, every transfer of a live agent has its outcome and no core holds one.

mod io;
mod net;
mod rng;
mod staging;
mod world;
mod xfers;

use std::collections::BTreeMap;
use std::time::Duration;

pub use io::{SimIo, SimLocal, SimPieces};
pub use rng::Rng;

/// A trace's hash (FNV-1a over what [`std::hash::Hash`] writes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TraceHash(u64);

impl Default for TraceHash {
    fn default() -> Self {
        TraceHash(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for TraceHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

impl TraceHash {
    /// Adds `v` to the trace.
    pub(crate) fn note(&mut self, v: &impl std::hash::Hash) {
        v.hash(self);
    }

    /// The hash so far.
    pub(crate) fn finish(&self) -> u64 {
        std::hash::Hasher::finish(self)
    }
}

/// The kind of faults a run draws (besides those every run draws).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultClass {
    /// Only slow paths, deregistrations, misuse, deadlines and cancels.
    Clean,
    /// Lane failures and failing queue pair creation too.
    Lanes,
    /// Links down and up.
    Links,
    /// An agent killed.
    Kill,
}

/// What one run did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Events processed.
    pub events: u64,
    /// Virtual time until nothing was left to happen.
    pub virtual_time: Duration,
    /// Transfers submitted, and those refused at submission.
    pub submitted: u64,
    /// Refused at submission.
    pub refused: u64,
    /// Done.
    pub done: u64,
    /// Failed, by kind.
    pub failed: BTreeMap<&'static str, u64>,
    /// Notifications delivered.
    pub notifications: u64,
    /// Fences, renewals offered, rails paused.
    pub fences: u64,
    /// Renewals offered.
    pub renewals: u64,
    /// Rails paused.
    pub rail_pauses: u64,
    /// Faults injected.
    pub stalls: u64,
    /// Lane faults.
    pub lane_faults: u64,
    /// Links cut.
    pub link_faults: u64,
    /// Agents killed.
    pub kills: u64,
    /// Segments deregistered.
    pub deregistrations: u64,
    /// DMAs checked.
    pub dmas: u64,
    /// Stager copies that failed (injected; each leaves its bounce buffer broken for good).
    pub copy_failures: u64,
    /// Staged transfers (through simulated bounce buffers).
    pub staged: u64,
    /// Messages (a notification without data).
    pub messages: u64,
    /// Send completions the endpoints routed to their connection.
    pub routed: u64,
    /// Send completions routed nowhere (their queue pair destroyed, their connection gone).
    pub routed_nowhere: u64,
    /// Connections the endpoints let go once drained.
    pub conns_gone: u64,
    /// Agents disconnected and connected again.
    pub reconnections: u64,
    /// Segment-table messages applied to a peer's table after the handshake.
    pub table_messages: u64,
    /// Transfers planned from a table that had not heard of a deregistration yet.
    pub stale_plans: u64,
    /// Calls handed another agent's segment (or a stale handle of the agent's own), each
    /// refused with nothing changed.
    pub foreign_refused: u64,
    /// Transfers submitted after the faults healed (the liveness phase), and those of them
    /// that succeeded (all must).
    pub liveness: u64,
    /// Of [`Report::liveness`], those that succeeded.
    pub liveness_done: u64,
    /// The hash of the run's trace: every event's time, order and kind, and every outcome
    /// (FNV-1a). A replay of the seed must give the same; over several runs, the wrapping sum
    /// of theirs (independent of the order they ran in).
    pub trace_hash: u64,
}

impl Report {
    /// Adds another run's counts.
    pub fn add(&mut self, o: &Report) {
        self.events += o.events;
        self.virtual_time += o.virtual_time;
        self.submitted += o.submitted;
        self.refused += o.refused;
        self.done += o.done;
        for (k, v) in &o.failed {
            *self.failed.entry(k).or_default() += v;
        }
        self.notifications += o.notifications;
        self.fences += o.fences;
        self.renewals += o.renewals;
        self.rail_pauses += o.rail_pauses;
        self.stalls += o.stalls;
        self.lane_faults += o.lane_faults;
        self.link_faults += o.link_faults;
        self.kills += o.kills;
        self.deregistrations += o.deregistrations;
        self.dmas += o.dmas;
        self.copy_failures += o.copy_failures;
        self.staged += o.staged;
        self.messages += o.messages;
        self.routed += o.routed;
        self.routed_nowhere += o.routed_nowhere;
        self.conns_gone += o.conns_gone;
        self.reconnections += o.reconnections;
        self.table_messages += o.table_messages;
        self.stale_plans += o.stale_plans;
        self.foreign_refused += o.foreign_refused;
        self.liveness += o.liveness;
        self.liveness_done += o.liveness_done;
        self.trace_hash = self.trace_hash.wrapping_add(o.trace_hash);
    }
}

/// A seed's violation: what broke, the scenario, and (when traced) the last events.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The seed.
    pub seed: u64,
    /// What broke.
    pub what: String,
    /// The scenario drawn.
    pub scenario: String,
    /// The last events (with [`run_traced`]).
    pub trace: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {}: {}", self.seed, self.what)?;
        writeln!(f, "  scenario: {}", self.scenario)?;
        for l in &self.trace {
            writeln!(f, "  {l}")?;
        }
        write!(f, "  replay: cargo xtask sim --seed {}", self.seed)
    }
}

fn run_inner(seed: u64, traced: bool) -> Result<Report, Violation> {
    let outcome = std::panic::catch_unwind(|| {
        let mut w = world::World::new(seed, None);
        w.set_verbose(traced);
        let r = w.run();
        let scenario = format!("{:?}", w.params());
        (
            r,
            w.report.clone(),
            scenario,
            w.trace.iter().cloned().collect::<Vec<_>>(),
        )
    });
    match outcome {
        Ok((Ok(()), report, _, _)) => Ok(report),
        Ok((Err(what), _, scenario, trace)) => Err(Violation {
            seed,
            what,
            scenario,
            trace,
        }),
        Err(p) => Err(Violation {
            seed,
            what: format!(
                "panic: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            ),
            scenario: String::new(),
            trace: Vec::new(),
        }),
    }
}

/// Runs the simulation of one seed.
///
/// # Errors
/// The first violation of the engine's promises (a panic counts as one).
pub fn run(seed: u64) -> Result<Report, Violation> {
    run_inner(seed, false)
}

/// As [`run`], keeping the last events for the report of a violation.
///
/// # Errors
/// As [`run`].
pub fn run_traced(seed: u64) -> Result<Report, Violation> {
    run_inner(seed, true)
}
