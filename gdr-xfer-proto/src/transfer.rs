//! A transfer inside the core: its runs, what of them is posted, completed or to post again,
//! and its outcome, reported once none of its requests can touch its memory any more.

use std::time::{Duration, Instant};

use crate::fault::{DriverError, Lost, RailReports, Rejection};
use crate::io::{Io, Op};
use crate::run::{Cursor, Run};

/// A transfer's key on its connection (a slot and its generation: never names a later
/// transfer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransferKey {
    pub(crate) index: u32,
    pub(crate) gen: u32,
}

/// Why a transfer failed: the core's outcome, plain data it can copy to every waiter and
/// compare in simulation. gdr-xfer reports each as the [`Error`] variant of the same name,
/// adding the peer's name and a fix hint (`gdr_xfer::Error`); it is not a second error type.
///
/// [`Error`]: https://docs.rs/gdr-xfer/latest/gdr_xfer/enum.Error.html
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Its deadline passed before it completed.
    Timeout {
        /// The time it was given.
        after: Duration,
    },
    /// The caller cancelled it.
    Cancelled,
    /// The peer is gone.
    PeerLost {
        /// Why.
        why: Lost,
    },
    /// One of its requests completed with an error that names the request, not the path (a bad
    /// remote key, a protection error).
    SliceFailed {
        /// The queue pair number.
        qp_num: u32,
        /// The provider's status code.
        status: u32,
        /// The provider's vendor error.
        vendor_err: u32,
    },
    /// Every rail to the peer failed and none is back yet.
    NoRail {
        /// Each rail's state and last error.
        rails: RailReports,
    },
    /// The transfer, or one of its requests, was refused for its own reason (a malformed
    /// transfer; memory of another protection domain, a range outside its registration);
    /// nothing else was affected.
    Rejected {
        /// Why.
        why: Rejection,
    },
    /// Its agent shut down.
    AgentClosed,
    /// A copy between GPU memory and a bounce buffer failed (staged transfers).
    StagingFailed {
        /// What the copy engine (or the staging driver) said.
        error: DriverError,
    },
}

/// What a transfer did, reported with its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Bytes it moves.
    pub bytes: u64,
    /// Runs (after merging).
    pub runs: u64,
    /// Requests its runs are cut into.
    pub slices: u64,
    /// Lanes that carried requests (bit per lane, modulo 32).
    pub lanes_mask: u32,
    /// Rails that carried requests (bit per rail).
    pub rails_mask: u32,
    /// Requests posted again after their rail failed or was fenced.
    pub retried_slices: u64,
    /// When it was submitted.
    pub started: Instant,
    /// When its last request was posted.
    pub posted_at: Option<Instant>,
    /// When its outcome was reached.
    pub done_at: Instant,
}

/// A transfer's outcome: `Ok` only when every byte landed (and its notification, if any, was
/// delivered to the peer's NIC). Either way, when it is reported none of the transfer's
/// requests will touch its local or remote memory again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Success, or why not.
    pub result: Result<(), Failure>,
    /// What it did.
    pub stats: Stats,
}

/// What a transfer is made of, for [`crate::Connection::submit`].
pub struct Spec<I: Io> {
    /// Direction.
    pub op: Op,
    /// The local segments its runs name (kept until its outcome).
    pub locals: Vec<I::Local>,
    /// The runs, checked against both segment tables by the caller. Empty only for a
    /// message: a transfer with a notification and no data, whose outcome is the
    /// notification's delivery to the peer's NIC.
    pub runs: Vec<Run>,
    /// Remote keys, `rails` per remote segment of the runs (rail-minor).
    pub rkeys: Vec<u32>,
    /// Deadline, from submission (`None`: none).
    pub timeout: Option<Duration>,
    /// A notification for the peer, delivered after every byte landed.
    pub notify: Option<Vec<u8>>,
    /// The rails it prefers (bit per rail; any active rail when none of those is).
    pub rail_mask: u32,
    /// What the caller observes it through.
    pub handle: I::Handle,
}

/// Where a notification stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotifyState {
    None,
    Waiting,
    Posted,
    Delivered,
    /// The transfer stopped before its notification was sent.
    Skipped,
}

/// Whether a transfer still moves data, or stopped and waits for its requests to be retired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Phase {
    Active,
    Stopping {
        failure: Failure,
        since: Instant,
        /// Whether its requests were fenced (their queue pairs destroyed).
        fenced: bool,
    },
}

pub(crate) struct Transfer<I: Io> {
    pub(crate) op: Op,
    pub(crate) locals: Vec<I::Local>,
    pub(crate) runs: Vec<Run>,
    pub(crate) rkeys: Vec<u32>,
    pub(crate) rail_mask: u32,
    pub(crate) handle: I::Handle,
    pub(crate) timeout: Option<Duration>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) started: Instant,
    pub(crate) notify: Option<Vec<u8>>,
    pub(crate) notify_state: NotifyState,
    /// The notification's number on its connection (for the target to drop a repeat sent
    /// again after a rail failed).
    pub(crate) notify_id: u64,
    pub(crate) bytes: u64,
    pub(crate) slices_total: u64,
    pub(crate) slices_done: u64,
    /// Requests (slices and the notification) posted and neither completed nor retired.
    pub(crate) inflight: u64,
    /// Next position to post.
    pub(crate) next: Cursor,
    /// Ranges posted on a lane that failed before they completed, to post again.
    pub(crate) retry: Vec<(Cursor, Cursor)>,
    /// Whether it is in the connection's pending queue.
    pub(crate) queued: bool,
    /// The rail a small transfer keeps to.
    pub(crate) rail_pin: Option<usize>,
    pub(crate) phase: Phase,
    /// Rails (bits) on which WRITE requests of it were retired by destroying their queue
    /// pairs: they may still have been on the wire, so the outcome waits until the peer
    /// confirmed its side of those queue pairs is gone, or until `quiet_at`.
    pub(crate) awaiting_peer: u32,
    /// When the last such destruction is a quiesce time old.
    pub(crate) quiet_at: Option<Instant>,
    pub(crate) lanes_mask: u32,
    pub(crate) rails_mask: u32,
    pub(crate) retried_slices: u64,
    pub(crate) posted_at: Option<Instant>,
}

impl<I: Io> Transfer<I> {
    pub(crate) fn all_posted(&self) -> bool {
        self.next.run >= self.runs.len() && self.retry.is_empty()
    }

    pub(crate) fn is_active(&self) -> bool {
        self.phase == Phase::Active
    }

    /// Whether every byte landed and the notification (if any) was delivered.
    pub(crate) fn is_complete(&self) -> bool {
        self.slices_done >= self.slices_total
            && matches!(
                self.notify_state,
                NotifyState::None | NotifyState::Delivered
            )
    }

    pub(crate) fn stats(&self, now: Instant) -> Stats {
        Stats {
            bytes: self.bytes,
            runs: self.runs.len() as u64,
            slices: self.slices_total,
            lanes_mask: self.lanes_mask,
            rails_mask: self.rails_mask,
            retried_slices: self.retried_slices,
            started: self.started,
            posted_at: self.posted_at,
            done_at: now,
        }
    }
}
