//! A transfer the caller submitted: the handle it observes, and the cell the engine reports the
//! outcome into.
//!
//! The handle ([`Transfer`]) only observes: dropping it (or the future it is) never stops
//! anything the NIC may still do and never frees memory the NIC may still use. The outcome is
//! reported only when none of the transfer's requests can touch its memory any more (see
//! [`gdr_xfer_proto::Connection`]): from then on the caller may reuse both its local memory and
//! the remote range, whatever the outcome says.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use gdr::WcStatus;
pub(crate) use gdr_xfer_proto::Failure;
use gdr_xfer_proto::TransferKey;

use crate::config::TICK;
use crate::descriptor::Op;
use crate::error::{Error, Hint, Result};
use crate::transfer_stats::TransferStats;

/// Where a transfer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Still moving data (or waiting for its notification to be sent, or for its requests in
    /// flight to be retired after it stopped).
    Pending,
    /// Every byte landed (and the notification, if any, was delivered to the peer's NIC).
    Done,
    /// It failed; [`Transfer::wait`] says why. Its memory is quiet.
    Failed,
}

/// What runs a transfer on the core: its connection. (A trait, so that a transfer's handle
/// does not depend on the connection it runs on.)
pub(crate) trait RunsTransfers: Send + Sync {
    /// Stops the transfer `key`.
    fn stop(&self, key: TransferKey);
    /// Runs the timers (deadlines, fences) at `now`.
    fn tick(&self, now: Instant);
}

/// What runs a staged transfer: the staging driver.
pub(crate) trait RunsJobs: Send + Sync {
    /// Stops job `job`.
    fn stop_job(&self, job: u64);
}

/// How a transfer can be stopped: its key on its connection, or (staged) its job.
#[derive(Clone)]
pub(crate) enum Stopper {
    None,
    Core(Weak<dyn RunsTransfers>, TransferKey),
    Staged(Weak<dyn RunsJobs>, u64),
}

impl Stopper {
    /// Transfer `key` of `conn`.
    pub(crate) fn core<C: RunsTransfers + 'static>(conn: &Arc<C>, key: TransferKey) -> Self {
        let weak: Weak<C> = Arc::downgrade(conn);
        Stopper::Core(weak, key)
    }

    /// Job `job` of `driver`.
    pub(crate) fn staged<D: RunsJobs + 'static>(driver: &Arc<D>, job: u64) -> Self {
        let weak: Weak<D> = Arc::downgrade(driver);
        Stopper::Staged(weak, job)
    }
}

struct CellState {
    outcome: Option<std::result::Result<TransferStats, Failure>>,
    waker: Option<Waker>,
    submit_time: Duration,
    plan_time: Duration,
    stopper: Stopper,
    /// Counts the transfer in its agent until its outcome (a caller's transfer, not a staged
    /// transfer's child).
    pending: Option<Pending>,
}

/// One of the caller's transfers counted as pending in its agent ([`crate::Agent::shutdown`]
/// waits for the count to reach zero): from before submission until the outcome is recorded,
/// or the transfer is refused.
pub(crate) struct Pending(Arc<AtomicUsize>);

impl Pending {
    pub(crate) fn new(count: &Arc<AtomicUsize>) -> Pending {
        count.fetch_add(1, Ordering::SeqCst);
        Pending(count.clone())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Where the engine reports a transfer's outcome, and what its observers wait on.
pub(crate) struct TransferCell {
    pub(crate) op: Op,
    pub(crate) peer: String,
    pub(crate) bytes: u64,
    pub(crate) descriptors: u64,
    pub(crate) timeout: Duration,
    pub(crate) started: Instant,
    pub(crate) deadline: Option<Instant>,
    /// A message ([`crate::Peer::send_notification`]): a notification without data.
    message: std::sync::atomic::AtomicBool,
    state: Mutex<CellState>,
    cond: Condvar,
}

impl TransferCell {
    pub(crate) fn new(
        op: Op,
        peer: String,
        bytes: u64,
        descriptors: u64,
        timeout: Duration,
    ) -> TransferCell {
        let started = Instant::now();
        TransferCell {
            op,
            peer,
            bytes,
            descriptors,
            timeout,
            started,
            deadline: started.checked_add(timeout),
            message: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(CellState {
                outcome: None,
                waker: None,
                submit_time: Duration::ZERO,
                plan_time: Duration::ZERO,
                stopper: Stopper::None,
                pending: None,
            }),
            cond: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CellState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records how it can be stopped.
    pub(crate) fn set_stopper(&self, s: Stopper) {
        self.lock().stopper = s;
    }

    /// Marks it as a message (for the errors' wording).
    pub(crate) fn set_message(&self) {
        self.message.store(true, Ordering::Relaxed);
    }

    /// What it is, for errors: `Write transfer of 4096 bytes to decode-0`, `message to decode-0`.
    fn describe(&self) -> String {
        if self.message.load(Ordering::Relaxed) {
            format!("message to {}", self.peer)
        } else {
            format!(
                "{:?} transfer of {} bytes to {}",
                self.op, self.bytes, self.peer
            )
        }
    }

    /// Counts the transfer as pending until its outcome (at once uncounted if it has one).
    pub(crate) fn set_pending(&self, pending: Pending) {
        let mut st = self.lock();
        if st.outcome.is_none() {
            st.pending = Some(pending);
        }
    }

    /// Records the times the submitting thread spent.
    pub(crate) fn set_times(&self, plan: Duration, submit: Duration) {
        let mut st = self.lock();
        st.plan_time = plan;
        st.submit_time = submit;
        if let Some(Ok(s)) = &mut st.outcome {
            s.plan_time = plan;
            s.submit_time = submit;
        }
    }

    /// Records the outcome (the first one wins) and wakes every waiter.
    pub(crate) fn finish(&self, outcome: std::result::Result<TransferStats, Failure>) {
        let mut st = self.lock();
        if st.outcome.is_some() {
            return;
        }
        // A caller's transfer (a staged transfer's children are not counted).
        #[cfg(feature = "metrics")]
        if st.pending.is_some() {
            crate::metrics::transfer_finished(&self.peer, self.op, &outcome);
        }
        if let Err(f) = &outcome {
            log::debug!("transfer to {} failed: {f:?}", self.peer);
        }
        let outcome = outcome.map(|mut s| {
            s.plan_time = st.plan_time;
            s.submit_time = st.submit_time;
            s
        });
        st.outcome = Some(outcome);
        st.stopper = Stopper::None;
        st.pending = None;
        if let Some(w) = st.waker.take() {
            w.wake();
        }
        drop(st);
        self.cond.notify_all();
    }

    /// Records the core's outcome.
    pub(crate) fn finish_core(&self, o: gdr_xfer_proto::Outcome) {
        let r = match o.result {
            Ok(()) => Ok(TransferStats::from_core(&o.stats, self.descriptors)),
            Err(f) => Err(f),
        };
        self.finish(r);
    }

    /// The outcome, if it has one (the failure kept as it is).
    pub(crate) fn outcome(&self) -> Option<std::result::Result<TransferStats, Failure>> {
        self.lock().outcome.clone()
    }

    pub(crate) fn error(&self, f: &Failure) -> Error {
        let peer = self.peer.clone();
        match f {
            Failure::Timeout { after } => Error::Timeout {
                what: self.describe(),
                after: *after,
                hint: Hint::new(
                    "is the peer alive and its link up? raise the transfer's timeout for large transfers",
                ),
            },
            Failure::Cancelled => Error::Cancelled { peer },
            Failure::PeerLost { why } => Error::PeerLost {
                peer,
                why: why.clone(),
                hint: crate::error::PEER_LOST_HINT.into(),
            },
            Failure::SliceFailed {
                qp_num,
                status,
                vendor_err,
            } => {
                let status = WcStatus::from_raw(*status);
                Error::SliceFailed {
                    peer,
                    qp_num: *qp_num,
                    status,
                    vendor_err: *vendor_err,
                    hint: Hint::new(match status {
                        WcStatus::RemoteAccess => {
                            "the peer deregistered the segment or its key is stale: refresh the peer's segments"
                        }
                        _ => "the request was refused by the NIC: check its ranges and the segment's access",
                    }),
                }
            }
            Failure::NoRail { rails } => Error::NoRail {
                peer,
                rails: rails.clone(),
                hint: Hint::new(
                    "every rail to the peer failed: check the links (gdr doctor, ibstat); the agent re-admits a rail once a probe on it succeeds",
                ),
            },
            Failure::Rejected { why } => Error::Rejected {
                peer,
                why: why.clone(),
                hint: Hint::new(
                    "the request named memory gdr would not post (another agent's segment, a range outside its registration): only this transfer failed",
                ),
            },
            Failure::AgentClosed => Error::AgentClosed,
            Failure::StagingFailed { error } => Error::StagingFailed {
                peer,
                error: error.clone(),
                hint: Hint::new(
                    "the GPU or its driver refused a copy: check the device (nvidia-smi) and the memory's lifetime",
                ),
            },
        }
    }

    fn result(&self, st: &CellState) -> Option<Result<TransferStats>> {
        match &st.outcome {
            None => None,
            Some(Ok(s)) => Some(Ok(*s)),
            Some(Err(f)) => Some(Err(self.error(f))),
        }
    }
}

/// A transfer the caller submitted. Observe it with [`status`](Transfer::status), block on it
/// with [`wait`](Transfer::wait), stop it with [`cancel`](Transfer::cancel), or `.await` it
/// (it is a [`Future`]; any executor).
///
/// Its outcome, whatever it is, comes only when none of its requests can touch its memory any
/// more: from then on the local memory and the remote range may be reused. Dropping the handle
/// does not stop the transfer: the engine finishes it (or fails it at its deadline) and
/// releases its memory once the NIC is done with it, but the caller can no longer tell when
/// that is. To reuse the memory early, [`cancel`](Transfer::cancel) and then wait: the
/// `Cancelled` outcome (or the one that came first) is the moment. [`crate::Agent::shutdown`]
/// ends every transfer of an agent the same way.
pub struct Transfer {
    pub(crate) cell: Arc<TransferCell>,
}

impl std::fmt::Debug for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer")
            .field("op", &self.cell.op)
            .field("peer", &self.cell.peer)
            .field("bytes", &self.cell.bytes)
            .field("status", &self.status())
            .finish()
    }
}

impl Transfer {
    /// Where it stands, without blocking.
    pub fn status(&self) -> Status {
        match &self.cell.lock().outcome {
            None => Status::Pending,
            Some(Ok(_)) => Status::Done,
            Some(Err(_)) => Status::Failed,
        }
    }

    /// The outcome if it finished, without blocking.
    pub fn poll_result(&self) -> Option<Result<TransferStats>> {
        let st = self.cell.lock();
        self.cell.result(&st)
    }

    /// Blocks until it finishes or `timeout` passes. Waiting less than the transfer's own
    /// deadline and giving up does not cancel it: the returned [`Error::Timeout`] only says the
    /// wait ended; wait again, cancel it, or drop the handle.
    ///
    /// # Errors
    /// The transfer's failure ([`Error::Timeout`] at its deadline, [`Error::PeerLost`],
    /// [`Error::SliceFailed`], [`Error::NoRail`], [`Error::Cancelled`], [`Error::AgentClosed`],
    /// ...), or [`Error::Timeout`] when this wait ended first.
    pub fn wait(&self, timeout: Duration) -> Result<TransferStats> {
        let end = Instant::now().checked_add(timeout);
        let mut st = self.cell.lock();
        loop {
            if let Some(r) = self.cell.result(&st) {
                return r;
            }
            let now = Instant::now();
            let left = match end {
                Some(e) => e.saturating_duration_since(now),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return Err(Error::Timeout {
                    what: format!("waiting for a transfer to {}", self.cell.peer),
                    after: timeout,
                    hint: Hint::new(
                        "the transfer goes on until its own deadline: wait again, or cancel it",
                    ),
                });
            }
            // Past its deadline, the waiter drives the timers itself too: the outcome does not
            // depend on one engine thread staying alive.
            let overdue = self.cell.deadline.is_some_and(|d| now > d + TICK * 2);
            let slice = if overdue { left.min(TICK) } else { left };
            if overdue {
                let conn = match &st.stopper {
                    Stopper::Core(c, _) => c.upgrade(),
                    _ => None,
                };
                if let Some(c) = conn {
                    drop(st);
                    c.tick(Instant::now());
                    st = self.cell.lock();
                    continue;
                }
            }
            st = self
                .cell
                .cond
                .wait_timeout(st, slice)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Stops the transfer: nothing more of it is posted (its notification neither), and it
    /// finishes with [`Error::Cancelled`] once its requests in flight are retired, even when
    /// they all land (the notification is not sent then). Returns at once; [`Transfer::wait`]
    /// for the outcome, which says when the memory may be reused. Cancelling a finished
    /// transfer does nothing: it keeps its outcome.
    pub fn cancel(&self) {
        let stopper = self.cell.lock().stopper.clone();
        match stopper {
            Stopper::None => {}
            Stopper::Core(conn, key) => {
                if let Some(c) = conn.upgrade() {
                    c.stop(key);
                }
            }
            Stopper::Staged(driver, job) => {
                if let Some(d) = driver.upgrade() {
                    d.stop_job(job);
                }
            }
        }
    }

    /// Bytes the transfer moves.
    pub fn bytes(&self) -> u64 {
        self.cell.bytes
    }

    /// Its direction.
    pub fn op(&self) -> Op {
        self.cell.op
    }

    /// The peer's name.
    pub fn peer(&self) -> &str {
        &self.cell.peer
    }

    /// Its deadline, relative to submission.
    pub fn timeout(&self) -> Duration {
        self.cell.timeout
    }
}

impl Future for Transfer {
    type Output = Result<TransferStats>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.cell.lock();
        if let Some(r) = self.cell.result(&st) {
            return Poll::Ready(r);
        }
        match &st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}
