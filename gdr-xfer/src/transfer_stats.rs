//! What a finished transfer did, as the caller sees it.

use std::time::Duration;

use gdr_xfer_proto::Stats;

/// What a finished transfer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Bytes moved.
    pub bytes: u64,
    /// Descriptors (or blocks) the caller gave.
    pub descriptors: u64,
    /// Runs after merging descriptors contiguous on both sides.
    pub runs: u64,
    /// Work requests posted (runs cut into slices of at most the slice size).
    pub slices: u64,
    /// Queue pairs that carried slices.
    pub qps_used: u32,
    /// Rails that carried slices.
    pub rails_used: u32,
    /// Slices posted again after their rail failed (each landed once in the end: retries
    /// write or read the same bytes).
    pub retried_slices: u64,
    /// From submission until the last slice was posted.
    pub time_to_post: Duration,
    /// From submission until the transfer finished.
    pub time_to_complete: Duration,
    /// Time the caller's thread spent checking and merging the descriptors (before posting).
    pub plan_time: Duration,
    /// Time the caller's thread spent in the submitting call (checking, merging, and posting
    /// what fitted).
    pub submit_time: Duration,
}

impl TransferStats {
    /// The core's figures, with the times the caller's thread spent.
    pub(crate) fn from_core(s: &Stats, descriptors: u64) -> TransferStats {
        TransferStats {
            bytes: s.bytes,
            descriptors,
            runs: s.runs,
            slices: s.slices,
            qps_used: s.lanes_mask.count_ones(),
            rails_used: s.rails_mask.count_ones(),
            retried_slices: s.retried_slices,
            time_to_post: s
                .posted_at
                .map_or(Duration::ZERO, |t| t.saturating_duration_since(s.started)),
            time_to_complete: s.done_at.saturating_duration_since(s.started),
            plan_time: Duration::ZERO,
            submit_time: Duration::ZERO,
        }
    }
}
