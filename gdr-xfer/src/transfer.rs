//! A transfer in flight: its plan, its progress, and the handle the caller holds.
//!
//! The handle ([`Transfer`]) only observes: dropping it (or the future it is) never cancels
//! anything the NIC may still do and never frees memory the NIC may still use. The engine keeps
//! the transfer's state until every request it posted has completed; the requests themselves
//! hold the registrations they use (gdr's rule), so memory is released exactly when the last
//! request using it completed, and not before.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use gdr::WcStatus;

use crate::descriptor::Op;
use crate::error::{Error, Hint, Result};
use crate::segment::SegmentInner;

/// A run: bytes contiguous on both sides, after merging adjacent descriptors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    /// Index into the transfer's local segment slices.
    pub(crate) local: u32,
    /// Offset in that segment.
    pub(crate) local_offset: u64,
    /// Remote address, and the index of the remote segment in the transfer's key table.
    pub(crate) remote_addr: u64,
    pub(crate) remote: u32,
    pub(crate) len: u64,
}

/// A position in a transfer's runs: run index and byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cursor {
    pub(crate) run: usize,
    pub(crate) offset: u64,
}

/// Where a transfer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Still moving data (or waiting for its notification to be sent).
    Pending,
    /// Every byte landed (and the notification, if any, was delivered to the peer's NIC).
    Done,
    /// It failed; [`Transfer::wait`] says why.
    Failed,
}

/// Why a transfer failed, kept so each observer gets a full [`Error`].
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    Timeout {
        after: Duration,
    },
    PeerLost {
        reason: String,
    },
    Slice {
        qp_num: u32,
        status: WcStatus,
        vendor_err: u32,
    },
    /// Every rail to the peer is paused (failed and not yet re-admitted).
    NoRail {
        detail: String,
    },
    AgentClosed,
    /// A copy between GPU memory and a bounce buffer failed (staged segments).
    Staging {
        detail: String,
    },
}

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
    /// Slices posted again on another rail after their rail failed (each landed once in the
    /// end: retries write or read the same bytes).
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

pub(crate) struct Progress {
    /// The local segments the runs name, while there is something left to post: released when
    /// the transfer finishes (requests in flight hold what they use themselves), so a finished
    /// transfer's handle keeps no memory registered.
    pub(crate) locals: Vec<Arc<SegmentInner>>,
    /// Next run to post, and the offset in it.
    pub(crate) next_run: usize,
    pub(crate) run_offset: u64,
    /// Ranges posted on a rail that failed before they completed, to post again.
    pub(crate) retry: Vec<(Cursor, Cursor)>,
    /// Whether the transfer is in its connection's pending queue.
    pub(crate) queued: bool,
    /// The rail a small transfer keeps to (chosen at its first post).
    pub(crate) rail_pin: Option<usize>,
    pub(crate) retried_slices: u64,
    pub(crate) rails_mask: u32,
    /// The notification's number on its connection (for the target to drop a repeat sent
    /// again after a rail failed).
    pub(crate) notify_id: u64,
    pub(crate) slices_posted: u64,
    pub(crate) slices_done: u64,
    /// Notification: not needed / waiting for the data / posted / delivered.
    pub(crate) notify: NotifyState,
    pub(crate) outcome: Option<std::result::Result<(), Failure>>,
    pub(crate) waker: Option<Waker>,
    pub(crate) qps_mask: u32,
    pub(crate) posted_at: Option<Instant>,
    pub(crate) done_at: Option<Instant>,
    pub(crate) submit_time: Duration,
    pub(crate) plan_time: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotifyState {
    None,
    Waiting,
    Posted,
    Delivered,
}

pub(crate) struct TransferState {
    pub(crate) op: Op,
    pub(crate) peer: String,
    pub(crate) started: Instant,
    pub(crate) timeout: Duration,
    pub(crate) deadline: Option<Instant>,
    pub(crate) runs: Vec<Run>,
    /// Remote keys: `rails` per remote segment of the runs.
    pub(crate) rkeys: Vec<u32>,
    pub(crate) rails: usize,
    /// The rails it prefers (nearest its memory; bit per rail).
    pub(crate) rail_mask: u32,
    pub(crate) slices_total: u64,
    pub(crate) bytes: u64,
    pub(crate) descriptors: u64,
    pub(crate) notify: Option<Vec<u8>>,
    pub(crate) progress: Mutex<Progress>,
    pub(crate) cond: Condvar,
}

impl TransferState {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        op: Op,
        peer: String,
        timeout: Duration,
        locals: Vec<Arc<SegmentInner>>,
        runs: Vec<Run>,
        rkeys: Vec<u32>,
        rails: usize,
        slice_size: u64,
        descriptors: u64,
        notify: Option<Vec<u8>>,
    ) -> TransferState {
        let started = Instant::now();
        let mut bytes = 0u64;
        let mut slices_total = 0u64;
        for r in &runs {
            bytes += r.len;
            // Most runs are one block no longer than a slice: no division for them.
            slices_total += if r.len <= slice_size {
                1
            } else {
                r.len.div_ceil(slice_size)
            };
        }
        let notify_state = if notify.is_some() {
            NotifyState::Waiting
        } else {
            NotifyState::None
        };
        TransferState {
            op,
            peer,
            started,
            timeout,
            deadline: started.checked_add(timeout),
            runs,
            rkeys,
            rails: rails.max(1),
            rail_mask: u32::MAX,
            slices_total,
            bytes,
            descriptors,
            notify,
            progress: Mutex::new(Progress {
                locals,
                next_run: 0,
                run_offset: 0,
                retry: Vec::new(),
                queued: false,
                rail_pin: None,
                retried_slices: 0,
                rails_mask: 0,
                notify_id: 0,
                slices_posted: 0,
                slices_done: 0,
                notify: notify_state,
                outcome: None,
                waker: None,
                qps_mask: 0,
                posted_at: None,
                done_at: None,
                submit_time: Duration::ZERO,
                plan_time: Duration::ZERO,
            }),
            cond: Condvar::new(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the outcome (the first one wins) and wakes every waiter.
    pub(crate) fn finish(&self, p: &mut Progress, outcome: std::result::Result<(), Failure>) {
        if p.outcome.is_some() {
            return;
        }
        if let Err(f) = &outcome {
            log::debug!("transfer to {} failed: {f:?}", self.peer);
        }
        p.outcome = Some(outcome);
        p.done_at = Some(Instant::now());
        p.locals = Vec::new();
        if let Some(w) = p.waker.take() {
            w.wake();
        }
        self.cond.notify_all();
    }

    /// Credits `n` completed slices; finishes the transfer when all data (and the notification)
    /// is done. Returns whether the notification is now due.
    pub(crate) fn credit(&self, p: &mut Progress, n: u64) -> bool {
        p.slices_done += n;
        if p.slices_done < self.slices_total || p.outcome.is_some() {
            return false;
        }
        match p.notify {
            NotifyState::None => {
                self.finish(p, Ok(()));
                false
            }
            NotifyState::Waiting => true,
            NotifyState::Posted | NotifyState::Delivered => false,
        }
    }

    pub(crate) fn all_posted(&self, p: &Progress) -> bool {
        p.next_run >= self.runs.len() && p.retry.is_empty()
    }

    /// The remote key of run `run` on rail `rail`.
    pub(crate) fn rkey(&self, run: &Run, rail: usize) -> u32 {
        self.rkeys[run.remote as usize * self.rails + rail]
    }

    fn stats(&self, p: &Progress) -> TransferStats {
        TransferStats {
            bytes: self.bytes,
            descriptors: self.descriptors,
            runs: self.runs.len() as u64,
            slices: self.slices_total,
            qps_used: p.qps_mask.count_ones(),
            rails_used: p.rails_mask.count_ones(),
            retried_slices: p.retried_slices,
            time_to_post: p
                .posted_at
                .map_or(Duration::ZERO, |t| t.duration_since(self.started)),
            time_to_complete: p
                .done_at
                .map_or(Duration::ZERO, |t| t.duration_since(self.started)),
            plan_time: p.plan_time,
            submit_time: p.submit_time,
        }
    }

    pub(crate) fn error(&self, f: &Failure) -> Error {
        match f {
            Failure::Timeout { after } => Error::Timeout {
                what: format!("{:?} transfer of {} bytes to {}", self.op, self.bytes, self.peer),
                after: *after,
                hint: Hint::new(
                    "is the peer alive and its link up? raise the transfer's timeout for large transfers",
                ),
            },
            Failure::PeerLost { reason } => Error::PeerLost {
                peer: self.peer.clone(),
                reason: reason.clone(),
            },
            Failure::Slice {
                qp_num,
                status,
                vendor_err,
            } => Error::SliceFailed {
                peer: self.peer.clone(),
                qp_num: *qp_num,
                status: *status,
                vendor_err: *vendor_err,
                hint: Hint::new(match status {
                    WcStatus::RemoteAccess => {
                        "the peer deregistered the segment or its key is stale: refresh the peer's segments"
                    }
                    WcStatus::RetryExceeded => "the peer or the link is gone",
                    _ => "the connection to the peer is broken: connect again",
                }),
            },
            Failure::NoRail { detail } => Error::NoRail {
                peer: self.peer.clone(),
                detail: detail.clone(),
                hint: Hint::new(
                    "every rail to the peer failed: check the links (gdr doctor, ibstat); the agent re-admits a rail once a probe on it succeeds",
                ),
            },
            Failure::AgentClosed => Error::AgentClosed,
            Failure::Staging { detail } => Error::StagingFailed {
                peer: self.peer.clone(),
                detail: detail.clone(),
                hint: Hint::new(
                    "the GPU or its driver refused a copy: check the device (nvidia-smi) and the memory's lifetime",
                ),
            },
        }
    }

    fn result(&self, p: &Progress) -> Option<Result<TransferStats>> {
        match &p.outcome {
            None => None,
            Some(Ok(())) => Some(Ok(self.stats(p))),
            Some(Err(f)) => Some(Err(self.error(f))),
        }
    }
}

/// A transfer the caller submitted. Observe it with [`status`](Transfer::status), block on it
/// with [`wait`](Transfer::wait), or `.await` it (it is a [`Future`]; any executor).
///
/// Dropping it does not cancel the transfer: the engine finishes it (or fails it at its
/// deadline) and releases its memory once the NIC is done with it.
pub struct Transfer {
    pub(crate) state: Arc<TransferState>,
}

impl std::fmt::Debug for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer")
            .field("op", &self.state.op)
            .field("peer", &self.state.peer)
            .field("bytes", &self.state.bytes)
            .field("status", &self.status())
            .finish()
    }
}

impl Transfer {
    /// Where it stands, without blocking.
    pub fn status(&self) -> Status {
        match &self.state.lock().outcome {
            None => Status::Pending,
            Some(Ok(())) => Status::Done,
            Some(Err(_)) => Status::Failed,
        }
    }

    /// The outcome if it finished, without blocking.
    pub fn poll_result(&self) -> Option<Result<TransferStats>> {
        let p = self.state.lock();
        self.state.result(&p)
    }

    /// Blocks until it finishes or `timeout` passes. Waiting less than the transfer's own
    /// deadline and giving up does not cancel it: the returned [`Error::Timeout`] only says the
    /// wait ended; wait again or drop the handle.
    ///
    /// # Errors
    /// The transfer's failure ([`Error::Timeout`] at its deadline, [`Error::PeerLost`],
    /// [`Error::SliceFailed`], [`Error::AgentClosed`]), or [`Error::Timeout`] when this wait
    /// ended first.
    pub fn wait(&self, timeout: Duration) -> Result<TransferStats> {
        let end = Instant::now().checked_add(timeout);
        let mut p = self.state.lock();
        loop {
            if let Some(r) = self.state.result(&p) {
                return r;
            }
            let left = match end {
                Some(e) => e.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return Err(Error::Timeout {
                    what: format!("waiting for a transfer to {}", self.state.peer),
                    after: timeout,
                    hint: Hint::new("the transfer goes on until its own deadline: wait again"),
                });
            }
            p = self
                .state
                .cond
                .wait_timeout(p, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Bytes the transfer moves.
    pub fn bytes(&self) -> u64 {
        self.state.bytes
    }

    /// Its direction.
    pub fn op(&self) -> Op {
        self.state.op
    }

    /// The peer's name.
    pub fn peer(&self) -> &str {
        &self.state.peer
    }

    /// Its deadline, relative to submission.
    pub fn timeout(&self) -> Duration {
        self.state.timeout
    }
}

impl Future for Transfer {
    type Output = Result<TransferStats>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut p = self.state.lock();
        if let Some(r) = self.state.result(&p) {
            return Poll::Ready(r);
        }
        match &p.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => p.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}
