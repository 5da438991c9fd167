//! Metrics through the `metrics` facade (feature `metrics`): whatever recorder the application
//! installs (a Prometheus exporter, statsd, ...) receives them; without one they cost a check.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `gdr_xfer_transfers_total` | counter | `peer`, `op`, `outcome` | transfers by outcome (`ok`, `timeout`, `cancelled`, `peer_lost`, `no_rail`, `rejected`, `request_error`, `agent_closed`, `staging_failed`) |
//! | `gdr_xfer_bytes_total` | counter | `peer`, `op` | bytes of the transfers that succeeded |
//! | `gdr_xfer_transfer_duration_seconds` | histogram | `op` | submission to outcome, of those that succeeded |
//! | `gdr_xfer_post_duration_seconds` | histogram | `op` | submission until the last request was posted |
//! | `gdr_xfer_plan_duration_seconds` | histogram | `op` | checking and merging the descriptors |
//! | `gdr_xfer_rail_bytes_total` | counter | `peer`, `rail`, `device` | bytes completed on the rail |
//! | `gdr_xfer_rail_errors_total` | counter | `peer`, `rail`, `device` | error completions that failed the rail over |
//! | `gdr_xfer_rail_renewals_total` | counter | `peer`, `rail`, `device` | queue pair renewals offered |
//! | `gdr_xfer_rail_fences_total` | counter | `peer`, `rail`, `device` | fences |
//! | `gdr_xfer_rail_active` | gauge | `peer`, `rail`, `device` | 1 while the rail carries traffic |
//! | `gdr_xfer_rail_throughput_bytes_per_second` | gauge | `peer`, `rail`, `device` | measured throughput |
//!
//! Transfers are recorded at their outcome (a staged transfer once, not per chunk), rails once a
//! second per peer by the progress thread's timers.

use gdr_xfer_proto::{Failure, Op};

use crate::rail::{RailState, RailStats};
use crate::transfer_stats::TransferStats;

fn op_label(op: Op) -> &'static str {
    match op {
        Op::Write => "write",
        Op::Read => "read",
    }
}

/// The `outcome` label of a result.
pub(crate) fn outcome_label(outcome: &Result<TransferStats, Failure>) -> &'static str {
    match outcome {
        Ok(_) => "ok",
        Err(Failure::Timeout { .. }) => "timeout",
        Err(Failure::Cancelled) => "cancelled",
        Err(Failure::PeerLost { .. }) => "peer_lost",
        Err(Failure::NoRail { .. }) => "no_rail",
        Err(Failure::Rejected { .. }) => "rejected",
        Err(Failure::SliceFailed { .. }) => "request_error",
        Err(Failure::AgentClosed) => "agent_closed",
        Err(Failure::StagingFailed { .. }) => "staging_failed",
    }
}

/// A caller's transfer reached `outcome`.
pub(crate) fn transfer_finished(peer: &str, op: Op, outcome: &Result<TransferStats, Failure>) {
    let op = op_label(op);
    metrics::counter!(
        "gdr_xfer_transfers_total",
        "peer" => peer.to_string(),
        "op" => op,
        "outcome" => outcome_label(outcome)
    )
    .increment(1);
    if let Ok(s) = outcome {
        metrics::counter!("gdr_xfer_bytes_total", "peer" => peer.to_string(), "op" => op)
            .increment(s.bytes);
        metrics::histogram!("gdr_xfer_transfer_duration_seconds", "op" => op)
            .record(s.time_to_complete.as_secs_f64());
        metrics::histogram!("gdr_xfer_post_duration_seconds", "op" => op)
            .record(s.time_to_post.as_secs_f64());
    }
}

/// A caller's transfer was planned in `plan` seconds.
pub(crate) fn transfer_planned(op: Op, plan: std::time::Duration) {
    metrics::histogram!("gdr_xfer_plan_duration_seconds", "op" => op_label(op))
        .record(plan.as_secs_f64());
}

/// The rails of `peer` now.
pub(crate) fn rails(peer: &str, rails: &[RailStats]) {
    for r in rails {
        let labels = [
            ("peer", peer.to_string()),
            ("rail", r.rail.to_string()),
            ("device", r.device.clone()),
        ];
        metrics::counter!("gdr_xfer_rail_bytes_total", &labels).absolute(r.bytes);
        metrics::counter!("gdr_xfer_rail_errors_total", &labels).absolute(r.errors);
        metrics::counter!("gdr_xfer_rail_renewals_total", &labels).absolute(r.renewals);
        metrics::counter!("gdr_xfer_rail_fences_total", &labels).absolute(r.fences);
        metrics::gauge!("gdr_xfer_rail_active", &labels).set(if r.state == RailState::Active {
            1.0
        } else {
            0.0
        });
        metrics::gauge!("gdr_xfer_rail_throughput_bytes_per_second", &labels).set(r.throughput);
    }
}
