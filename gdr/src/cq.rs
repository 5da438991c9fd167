//! Completion queues: batch polling, typed completions, and event-driven waits through a
//! completion channel.
//!
//! Polling a completion is what releases the regions its work request kept alive (soundness
//! rule 1): a queue pair registers its in-flight table with its completion queues, and
//! [`CompletionQueue::poll`] hands each reaped completion back to it.

use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gdr_sys::ibv;

use crate::device::Context;
use crate::error::{Error, Hint, Result};
use crate::wr::InFlight;

/// Status of a work completion (`ibv_wc_status`), every value mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    /// Success.
    #[default]
    Success,
    /// Local length error: a receive buffer was too small, or a message too long.
    LocalLength,
    /// Local QP operation error (e.g. inline data too long).
    LocalQpOperation,
    /// Local EE context operation error.
    LocalEecOperation,
    /// Local protection error: an SGE's lkey or range does not match a region.
    LocalProtection,
    /// Flushed: the QP went to the error state before this request ran.
    WrFlush,
    /// Memory window bind error.
    MwBind,
    /// Unexpected response from the responder.
    BadResponse,
    /// Local access error (e.g. a read into a region without LOCAL_WRITE).
    LocalAccess,
    /// Remote invalid request (e.g. an opcode the remote QP does not allow).
    RemoteInvalidRequest,
    /// Remote access error: rkey, range or remote access flags wrong.
    RemoteAccess,
    /// Remote operation error.
    RemoteOperation,
    /// Transport retry counter exceeded: the peer did not answer.
    RetryExceeded,
    /// RNR retry counter exceeded: the peer had no receive posted.
    RnrRetryExceeded,
    /// Local RDD violation.
    LocalRddViolation,
    /// Remote invalid RD request.
    RemoteInvalidRdRequest,
    /// Remote aborted.
    RemoteAbort,
    /// Invalid EE context number.
    InvalidEecn,
    /// Invalid EE context state.
    InvalidEecState,
    /// Fatal error.
    Fatal,
    /// Response timeout.
    ResponseTimeout,
    /// General error.
    General,
    /// Tag matching error.
    TagMatching,
    /// Tag matching rendezvous incomplete.
    TagMatchingRndvIncomplete,
    /// A status this version does not know.
    Unknown(u32),
}

impl WcStatus {
    /// From `ibv_wc_status`.
    pub fn from_raw(v: u32) -> Self {
        use WcStatus::*;
        match v {
            0 => Success,
            1 => LocalLength,
            2 => LocalQpOperation,
            3 => LocalEecOperation,
            4 => LocalProtection,
            5 => WrFlush,
            6 => MwBind,
            7 => BadResponse,
            8 => LocalAccess,
            9 => RemoteInvalidRequest,
            10 => RemoteAccess,
            11 => RemoteOperation,
            12 => RetryExceeded,
            13 => RnrRetryExceeded,
            14 => LocalRddViolation,
            15 => RemoteInvalidRdRequest,
            16 => RemoteAbort,
            17 => InvalidEecn,
            18 => InvalidEecState,
            19 => Fatal,
            20 => ResponseTimeout,
            21 => General,
            22 => TagMatching,
            23 => TagMatchingRndvIncomplete,
            other => Unknown(other),
        }
    }

    /// What to check when a request completes with this status.
    pub fn hint(self) -> Option<&'static str> {
        use WcStatus::*;
        Some(match self {
            Success => return None,
            LocalLength => "the receive buffer is smaller than the message, or the message exceeds the port's max_msg_sz",
            LocalProtection => "an SGE's address/length is outside its region or the region belongs to another protection domain",
            LocalAccess => "the local region lacks LOCAL_WRITE (needed for receives, reads and atomics)",
            WrFlush => "the queue pair entered the error state earlier; look at the first failed completion, then reset() and reconnect",
            RemoteAccess => "the remote region's rkey, address range or access flags (REMOTE_WRITE/READ/ATOMIC) do not allow this request",
            RemoteInvalidRequest => "the remote QP does not allow this operation (its access flags) or the message is too long for it",
            RemoteOperation => "the responder failed to complete the operation (its QP may be in the error state)",
            RetryExceeded => "the peer did not acknowledge in time: is the peer process alive, is the GID/route right (RoCE v2 GID index, IP reachability), are the QPs connected to each other?",
            RnrRetryExceeded => "the peer had no receive posted for a send: post receives before the sender starts, or raise rnr_retry",
            BadResponse => "unexpected transport response: peers disagree about the connection (PSN/QPN)",
            _ => "see ibv_poll_cq(3)",
        })
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WcStatus::Unknown(v) => write!(f, "unknown status {v}"),
            // SAFETY: ibv_wc_status_str accepts any value and returns a static string.
            s => {
                let raw = s.raw();
                let c = unsafe { std::ffi::CStr::from_ptr(ibv::ibv_wc_status_str(raw)) };
                f.write_str(&c.to_string_lossy())
            }
        }
    }
}

impl WcStatus {
    fn raw(self) -> u32 {
        use WcStatus::*;
        match self {
            Success => 0,
            LocalLength => 1,
            LocalQpOperation => 2,
            LocalEecOperation => 3,
            LocalProtection => 4,
            WrFlush => 5,
            MwBind => 6,
            BadResponse => 7,
            LocalAccess => 8,
            RemoteInvalidRequest => 9,
            RemoteAccess => 10,
            RemoteOperation => 11,
            RetryExceeded => 12,
            RnrRetryExceeded => 13,
            LocalRddViolation => 14,
            RemoteInvalidRdRequest => 15,
            RemoteAbort => 16,
            InvalidEecn => 17,
            InvalidEecState => 18,
            Fatal => 19,
            ResponseTimeout => 20,
            General => 21,
            TagMatching => 22,
            TagMatchingRndvIncomplete => 23,
            Unknown(v) => v,
        }
    }
}

/// What a completed work request was (`ibv_wc_opcode`). Only meaningful on success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    /// A send (with or without immediate).
    #[default]
    Send,
    /// An RDMA write (with or without immediate), on the sender.
    RdmaWrite,
    /// An RDMA read.
    RdmaRead,
    /// Compare and swap.
    CompareSwap,
    /// Fetch and add.
    FetchAdd,
    /// Memory window bind.
    BindMw,
    /// Local invalidate.
    LocalInvalidate,
    /// A received send.
    Recv,
    /// A received RDMA write with immediate (consumed a receive request).
    RecvRdmaWithImm,
    /// Another opcode.
    Other(u32),
}

impl WcOpcode {
    /// From `ibv_wc_opcode`.
    pub fn from_raw(v: u32) -> Self {
        use ibv::ibv_wc_opcode::*;
        match v {
            IBV_WC_SEND => WcOpcode::Send,
            IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            IBV_WC_COMP_SWAP => WcOpcode::CompareSwap,
            IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
            IBV_WC_BIND_MW => WcOpcode::BindMw,
            IBV_WC_LOCAL_INV => WcOpcode::LocalInvalidate,
            IBV_WC_RECV => WcOpcode::Recv,
            IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            other => WcOpcode::Other(other),
        }
    }
}

/// One reaped work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    /// The id the application gave the request.
    pub wr_id: u64,
    /// Success or the error.
    pub status: WcStatus,
    /// What the request was (valid on success).
    pub opcode: WcOpcode,
    /// Bytes received (receives) or transferred (reads/atomics).
    pub byte_len: u32,
    /// Immediate data, host byte order, when the sender attached one.
    pub imm: Option<u32>,
    /// The local queue pair number.
    pub qp_num: u32,
    /// Provider-specific error code.
    pub vendor_err: u32,
    /// Whether it completes a receive request (as opposed to a send-queue request).
    pub is_recv: bool,
}

impl Completion {
    /// Whether the request succeeded.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }

    /// `Ok(self)` on success, otherwise an [`Error::Completion`] with the status's hint.
    pub fn result(&self) -> Result<&Self> {
        if self.is_ok() {
            Ok(self)
        } else {
            Err(Error::Completion {
                wr_id: self.wr_id,
                queue: if self.is_recv {
                    crate::qp::WorkQueue::Recv
                } else {
                    crate::qp::WorkQueue::Send
                },
                status: self.status,
                qp_num: self.qp_num,
                vendor_err: self.vendor_err,
                hint: self.status.hint().map(Hint::new).unwrap_or_default(),
            })
        }
    }
}

/// A completion channel: lets a thread sleep until a completion queue has an event.
struct Channel(NonNull<ibv::ibv_comp_channel>);

/// Completion queues a queue pair reports into keep its in-flight table here, keyed by QP number.
pub(crate) type Registry = Mutex<Vec<(u32, Arc<InFlight>)>>;

/// A completion queue (`ibv_cq`), optionally with its own completion channel.
pub struct CompletionQueue {
    cq: NonNull<ibv::ibv_cq>,
    channel: Option<Channel>,
    depth: u32,
    pub(crate) registry: Registry,
    ctx: Arc<Context>,
}

// SAFETY: ibv_cq may be polled and armed from any thread (providers lock internally); our own
// state is behind a Mutex.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("device", &self.ctx.name())
            .field("depth", &self.depth)
            .field("channel", &self.channel.is_some())
            .finish()
    }
}

/// Completions fetched from the device per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

impl CompletionQueue {
    /// A completion queue with room for `depth` completions, polled only.
    pub fn new(ctx: &Arc<Context>, depth: u32) -> Result<Arc<CompletionQueue>> {
        Self::create(ctx, depth, false)
    }

    /// A completion queue with its own completion channel, for [`CompletionQueue::wait`].
    pub fn with_channel(ctx: &Arc<Context>, depth: u32) -> Result<Arc<CompletionQueue>> {
        Self::create(ctx, depth, true)
    }

    fn create(ctx: &Arc<Context>, depth: u32, with_channel: bool) -> Result<Arc<CompletionQueue>> {
        if depth == 0 {
            return Err(Error::invalid(
                "completion queue depth 0",
                "use at least the sum of the queue depths it serves",
            ));
        }
        let channel = if with_channel {
            // SAFETY: valid context.
            let ch = unsafe { ibv::ibv_create_comp_channel(ctx.as_raw()) };
            let ch = NonNull::new(ch).ok_or_else(|| {
                Error::verbs_errno(
                    "ibv_create_comp_channel",
                    format!("device={}", ctx.name()),
                    Hint::NONE,
                )
            })?;
            Some(Channel(ch))
        } else {
            None
        };
        let ch_ptr = channel
            .as_ref()
            .map_or(std::ptr::null_mut(), |c| c.0.as_ptr());
        // SAFETY: valid context; the channel (if any) lives as long as the CQ (dropped after it).
        let cq = unsafe {
            ibv::ibv_create_cq(ctx.as_raw(), depth as i32, std::ptr::null_mut(), ch_ptr, 0)
        };
        let cq = match NonNull::new(cq) {
            Some(cq) => cq,
            None => {
                let e = Error::verbs_errno(
                    "ibv_create_cq",
                    format!("device={}, cqe={depth}", ctx.name()),
                    "the depth may exceed the device's max_cqe (`ibv_devinfo -v`)",
                );
                if let Some(ch) = channel {
                    // SAFETY: created above, not used by any CQ.
                    unsafe { ibv::ibv_destroy_comp_channel(ch.0.as_ptr()) };
                }
                return Err(e);
            }
        };
        // SAFETY: the CQ is valid; `cqe` is the real size the provider allocated.
        let real = unsafe { (*cq.as_ptr()).cqe }.max(0) as u32;
        Ok(Arc::new(CompletionQueue {
            cq,
            channel,
            depth: real,
            registry: Mutex::new(Vec::new()),
            ctx: ctx.clone(),
        }))
    }

    /// The number of completions it can hold (as the provider rounded it).
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The raw `ibv_cq`.
    pub fn as_raw(&self) -> *mut ibv::ibv_cq {
        self.cq.as_ptr()
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Reaps up to `out.len()` completions without blocking; returns how many were written.
    ///
    /// Each reaped completion releases the regions of its work request (and of the unsignalled
    /// requests before it on the same queue). Completions of requests that gdr signalled on its
    /// own (to bound the unsignalled run) are consumed here, unless they failed.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let mut filled = 0;
        let mut wcs: [MaybeUninit<ibv::ibv_wc>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        while filled < out.len() {
            let want = (out.len() - filled).min(POLL_BATCH);
            // SAFETY: `wcs` has room for `want` entries; the provider initialises the first `n`.
            let n =
                unsafe { ibv::ibv_poll_cq(self.cq.as_ptr(), want as i32, wcs.as_mut_ptr().cast()) };
            if n < 0 {
                return Err(Error::verbs(
                    "ibv_poll_cq",
                    format!("device={}", self.ctx.name()),
                    -n,
                    "the CQ overran: make it deeper than the sum of the queues it serves",
                ));
            }
            if n == 0 {
                break;
            }
            let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
            for wc in &wcs[..n as usize] {
                // SAFETY: the first `n` entries were written by ibv_poll_cq.
                let wc = unsafe { wc.assume_init_ref() };
                if let Some(c) = self.translate(&registry, wc) {
                    out[filled] = c;
                    filled += 1;
                }
            }
            if (n as usize) < want {
                break;
            }
        }
        Ok(filled)
    }

    fn translate(&self, registry: &[(u32, Arc<InFlight>)], wc: &ibv::ibv_wc) -> Option<Completion> {
        let status = WcStatus::from_raw(wc.status);
        let inflight = registry
            .iter()
            .find(|(qpn, _)| *qpn == wc.qp_num)
            .map(|(_, f)| f);
        let Some(inflight) = inflight else {
            log::debug!(
                "completion for unknown or destroyed QP {} dropped",
                wc.qp_num
            );
            return None;
        };
        let done = inflight.complete(wc.wr_id)?;
        if status == WcStatus::Success && !done.user_signaled {
            return None;
        }
        let has_imm = wc.wc_flags & ibv::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        Some(Completion {
            wr_id: done.user_wr_id,
            status,
            opcode: WcOpcode::from_raw(wc.opcode),
            byte_len: wc.byte_len,
            // SAFETY: with IBV_WC_WITH_IMM the union holds immediate data (network byte order).
            imm: has_imm
                .then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })),
            qp_num: wc.qp_num,
            vendor_err: wc.vendor_err,
            is_recv: done.is_recv,
        })
    }

    /// Polls until at least `n` completions have been reaped or `timeout` passes; returns them.
    /// Sleeps on the completion channel when there is one, spins otherwise.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Result<Vec<Completion>> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::with_capacity(n);
        let mut buf = [Completion::default(); 16];
        while got.len() < n {
            let k = self.poll(&mut buf[..(n - got.len()).min(16)])?;
            got.extend_from_slice(&buf[..k]);
            if got.len() >= n {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "waiting for {n} completions on {} ({} arrived)",
                        self.ctx.name(),
                        got.len()
                    ),
                    millis: timeout.as_millis() as u64,
                    hint: Hint::new(
                        "is the peer alive and connected? were the requests posted signalled?",
                    ),
                });
            }
            if k == 0 {
                if self.channel.is_some() {
                    self.arm()?;
                    // Re-poll after arming so a completion that raced the arm is not missed.
                    let k = self.poll(&mut buf[..(n - got.len()).min(16)])?;
                    got.extend_from_slice(&buf[..k]);
                    if k == 0 {
                        self.wait(deadline - now)?;
                    }
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        Ok(got)
    }

    /// Requests an event on the channel for the next completion (`ibv_req_notify_cq`).
    pub fn arm(&self) -> Result<()> {
        if self.channel.is_none() {
            return Err(Error::invalid(
                "arm() on a completion queue without a channel",
                "create it with CompletionQueue::with_channel",
            ));
        }
        // SAFETY: valid CQ.
        let rc = unsafe { ibv::ibv_req_notify_cq(self.cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(Error::verbs(
                "ibv_req_notify_cq",
                format!("device={}", self.ctx.name()),
                rc,
                Hint::NONE,
            ));
        }
        Ok(())
    }

    /// Sleeps until the armed completion queue has an event or `timeout` passes. Returns whether
    /// an event arrived. Call [`CompletionQueue::arm`] first and poll afterwards.
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        let ch = self.channel.as_ref().ok_or_else(|| {
            Error::invalid(
                "wait() on a completion queue without a channel",
                "create it with CompletionQueue::with_channel",
            )
        })?;
        // SAFETY: the channel is valid while self lives.
        let fd = unsafe { (*ch.0.as_ptr()).fd };
        if !wait_readable(fd, timeout, "completion channel")? {
            return Ok(false);
        }
        let mut cq: *mut ibv::ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: the fd is readable, so ibv_get_cq_event does not block; out-pointers are valid.
        let rc = unsafe { ibv::ibv_get_cq_event(ch.0.as_ptr(), &mut cq, &mut ctx) };
        if rc != 0 {
            return Err(Error::verbs_errno(
                "ibv_get_cq_event",
                format!("device={}", self.ctx.name()),
                Hint::NONE,
            ));
        }
        // SAFETY: acknowledges the one event we just took from this CQ.
        unsafe { ibv::ibv_ack_cq_events(cq, 1) };
        Ok(true)
    }

    pub(crate) fn register(&self, qpn: u32, inflight: Arc<InFlight>) {
        self.registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((qpn, inflight));
    }

    pub(crate) fn unregister(&self, qpn: u32) {
        self.registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(q, _)| *q != qpn);
    }
}

/// Waits until `fd` is readable or `timeout` passes; returns whether it became readable.
pub(crate) fn wait_readable(fd: libc::c_int, timeout: Duration, what: &str) -> Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    if rc < 0 {
        return Err(Error::io(
            format!("poll on the {what}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(rc > 0)
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc to it, so none is alive any more.
        let rc = unsafe { ibv::ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            log::warn!(
                "ibv_destroy_cq({}) failed: {}",
                self.ctx.name(),
                crate::error::errno_text(rc.abs())
            );
        }
        if let Some(ch) = self.channel.take() {
            // SAFETY: the CQ that used the channel is gone.
            unsafe { ibv::ibv_destroy_comp_channel(ch.0.as_ptr()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_round_trips_and_failures_have_hints() {
        for v in 0..=23u32 {
            let s = WcStatus::from_raw(v);
            assert_ne!(s, WcStatus::Unknown(v), "{v} is mapped");
            assert_eq!(s.raw(), v);
            assert_eq!(s.hint().is_none(), v == 0);
        }
        assert_eq!(WcStatus::from_raw(99), WcStatus::Unknown(99));
        assert_eq!(WcStatus::RemoteAccess.to_string(), "remote access error");
    }

    #[test]
    fn failed_completion_becomes_error_with_hint() {
        let c = Completion {
            wr_id: 9,
            status: WcStatus::RetryExceeded,
            ..Default::default()
        };
        let e = c.result().unwrap_err().to_string();
        assert!(e.starts_with("work request 9 (send queue of QP 0x0) completed with transport retry counter exceeded (RetryExceeded"), "{e}");
        assert!(e.contains("hint: the peer did not acknowledge"), "{e}");
        assert!(Completion::default().result().is_ok());
    }
}
