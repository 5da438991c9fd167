//! Reliable-connected queue pairs: a builder ([`config`](QpConfig)), the [`Endpoint`] peers
//! exchange, the state machine (INIT -> RTR -> RTS, the error state and `reset`), posting with
//! every check done first, and prepared requests.
//!
//! ```no_run
//! use gdr::{cq::CompletionQueue, device::Context, pd::ProtectionDomain, qp::QueuePair};
//! let ctx = Context::open("rxe0")?;
//! let pd = ProtectionDomain::new(&ctx)?;
//! let cq = CompletionQueue::new(&ctx, 256)?;
//! let qp = QueuePair::builder(&pd, &cq, &cq).max_send_wr(128).build()?;
//! let mine = qp.endpoint();          // send this to the peer (see gdr::connect)
//! # let theirs = mine;
//! qp.connect(&theirs)?;              // RTR + RTS from the peer's endpoint
//! # Ok::<(), gdr::Error>(())
//! ```

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use gdr_sys::ibv;

use crate::cq::dispatch::Dispatch;
use crate::cq::{lock_both, CompletionQueue, CqLocks};
use crate::device::LinkLayer;
use crate::error::{Error, Hint, Result};
use crate::inflight::{lock, InFlight, Ring};
use crate::pd::ProtectionDomain;
use crate::return_code;
use state::random_psn;

pub(crate) mod batch;
mod config;
mod endpoint;
mod post;
mod prepared;
mod state;

pub use batch::{BatchOp, RdmaPiece};
pub use config::{QpConfig, QueuePairBuilder};
pub use endpoint::Endpoint;
pub use prepared::PreparedSend;
pub use state::{DropCause, QpState, WorkQueue};

/// Most scatter/gather entries one request may carry.
pub const MAX_SGE: usize = 16;

/// Most requests [`QueuePair::post_send_list`] hands to the provider in one call (one doorbell);
/// longer lists take several calls.
pub const LIST_CHUNK: usize = 32;

/// Most scatter/gather entries of the requests in one provider call.
pub const LIST_SGES: usize = 4 * MAX_SGE;

/// A reliable-connected queue pair. Keeps its protection domain and completion queues alive, and
/// every posted request's regions until the request's completion is reaped.
pub struct QueuePair {
    qp: NonNull<ibv::ibv_qp>,
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    inflight: Arc<InFlight>,
    cfg: QpConfig,
    local: std::sync::Mutex<Endpoint>,
    link_layer: LinkLayer,
    max_rd_atomic: u8,
    port: u8,
}

// SAFETY: posting and modifying a QP are thread-safe in libibverbs; our bookkeeping is behind
// mutexes.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("device", &self.pd.context().name())
            .field("endpoint", &self.endpoint())
            .finish()
    }
}

impl QueuePair {
    /// A builder for a queue pair on `pd` with the given completion queues (may be the same).
    pub fn builder(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
    ) -> QueuePairBuilder {
        QueuePairBuilder {
            pd: pd.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            cfg: QpConfig::default(),
        }
    }

    fn create(
        pd: Arc<ProtectionDomain>,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
        cfg: QpConfig,
    ) -> Result<QueuePair> {
        let ctx = pd.context().clone();
        for (cq, which) in [(&send_cq, "send"), (&recv_cq, "receive")] {
            if !Arc::ptr_eq(cq.context(), &ctx) {
                return Err(Error::invalid(
                    format!(
                        "the {which} completion queue belongs to {}, the protection domain to {}",
                        cq.context().name(),
                        ctx.name()
                    ),
                    "create all objects of a queue pair on one device context",
                ));
            }
        }
        if cfg.max_send_sge as usize > MAX_SGE || cfg.max_recv_sge as usize > MAX_SGE {
            return Err(Error::invalid(
                format!(
                    "max_send_sge={} max_recv_sge={}: gdr supports at most {MAX_SGE}",
                    cfg.max_send_sge, cfg.max_recv_sge
                ),
                Hint::NONE,
            ));
        }
        if cfg.max_send_wr == 0 {
            return Err(Error::invalid(
                "max_send_wr=0",
                "a queue pair needs at least one send slot",
            ));
        }
        let port_num = cfg.port.unwrap_or_else(|| ctx.port());
        let port = ctx.query_port(port_num)?;
        let gid = match cfg.gid_index {
            Some(i) => ctx.gid(port_num, i)?,
            None if port.link_layer == LinkLayer::InfiniBand => ctx.gid(port_num, 0)?,
            None => ctx.default_gid(port_num)?,
        };
        let dev = ctx.query_device()?;
        let max_rd_atomic = cfg
            .max_rd_atomic
            .unwrap_or_else(|| dev.max_qp_init_rd_atom.clamp(1, 16) as u8);

        // SAFETY: plain old data; all-zero is valid.
        let mut init: ibv::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.as_raw();
        init.recv_cq = recv_cq.as_raw();
        init.cap.max_send_wr = cfg.max_send_wr;
        init.cap.max_recv_wr = cfg.max_recv_wr.max(1);
        init.cap.max_send_sge = cfg.max_send_sge.max(1);
        init.cap.max_recv_sge = cfg.max_recv_sge.max(1);
        init.cap.max_inline_data = cfg.max_inline_data;
        init.qp_type = ibv::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        // SAFETY: valid PD and CQs (kept alive by the Arcs the QP stores); init is filled.
        let qp = unsafe { ibv::ibv_create_qp(pd.as_raw(), &mut init) };
        let qp = return_code::non_null(
            "ibv_create_qp",
            qp,
            || {
                format!(
                "device={}, max_send_wr={}, max_recv_wr={}, max_send_sge={}, max_recv_sge={}, max_inline_data={}",
                ctx.name(), cfg.max_send_wr, cfg.max_recv_wr, cfg.max_send_sge, cfg.max_recv_sge, cfg.max_inline_data
            )
            },
            |_| {
                Hint::new(format!("the device allows max_qp_wr={}, max_sge={}; inline limits are provider-specific", dev.max_qp_wr, dev.max_sge))
            },
        )?;
        // SAFETY: the QP is valid.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        let mtu = cfg.mtu.map_or(port.active_mtu, |m| m.min(port.active_mtu));
        let psn = cfg.psn.map_or_else(random_psn, |p| p & 0x00ff_ffff);
        let local = Endpoint {
            qpn,
            psn,
            lid: port.lid,
            gid: gid.gid,
            gid_index: gid.index,
            mtu,
            port: port_num,
        };
        // Register the new incarnation of `qpn` with its completion queues under a tag that no
        // completion still queued there carries (the number may be a reused one).
        let registered = {
            let mut cqs = lock_both(&send_cq, &recv_cq);
            Dispatch::new_tag(&cqs.all(), qpn).map(|tag| {
                let inflight = Arc::new(InFlight::new(
                    tag,
                    cfg.max_send_wr,
                    init.cap.max_send_sge,
                    cfg.max_recv_wr.max(1),
                    init.cap.max_recv_sge,
                ));
                for d in cqs.iter_mut() {
                    d.register(qpn, inflight.clone());
                }
                inflight
            })
        };
        let inflight = match registered {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: created above, never used.
                let rc = unsafe { ibv::ibv_destroy_qp(qp.as_ptr()) };
                return_code::teardown("ibv_destroy_qp", format_args!("qpn={qpn:#x}"), rc);
                return Err(e);
            }
        };
        let qp = QueuePair {
            qp,
            pd,
            send_cq,
            recv_cq,
            inflight,
            cfg,
            local: std::sync::Mutex::new(local),
            link_layer: port.link_layer,
            max_rd_atomic,
            port: port_num,
        };
        qp.init()?;
        log::debug!(
            "created RC QP {qpn:#x} on {} port {} GID[{}]={}",
            ctx.name(),
            port_num,
            local.gid_index,
            local.gid
        );
        Ok(qp)
    }

    /// Our endpoint, to send to the peer.
    pub fn endpoint(&self) -> Endpoint {
        *self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The queue pair number.
    pub fn qp_num(&self) -> u32 {
        self.endpoint().qpn
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The send completion queue.
    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }

    /// The receive completion queue.
    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }

    /// The port it uses.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// Requests in flight on the send queue (posted, completion not yet reaped).
    pub fn send_outstanding(&self) -> u64 {
        lock(&self.inflight.send).outstanding()
    }

    /// Requests in flight on the receive queue.
    pub fn recv_outstanding(&self) -> u64 {
        lock(&self.inflight.recv).outstanding()
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// The raw `ibv_qp`.
    pub fn as_raw(&self) -> *mut ibv::ibv_qp {
        self.qp.as_ptr()
    }

    /// Tells the async completion queues watching this queue pair's completion queues that the
    /// requests in flight in `send` and `recv` ended for `cause` (their futures must not wait for
    /// completions that will never come). The caller holds `cqs` and both rings; it wakes the
    /// returned wakers once it has released them.
    fn tell_watchers(
        &self,
        cqs: &CqLocks<'_>,
        qpn: u32,
        send: &Ring,
        recv: &Ring,
        cause: DropCause,
    ) -> Vec<std::task::Waker> {
        let mut wake = Vec::new();
        for (cq, ring, queue) in [
            (&self.send_cq, send, WorkQueue::Send),
            (&self.recv_cq, recv, WorkQueue::Recv),
        ] {
            if let Some(w) = cqs.of(cq).watcher() {
                w.requests_dropped(qpn, queue, cause, &mut ring.in_flight(), &mut wake);
            }
        }
        wake
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let qpn = self.qp_num();
        // SAFETY: the QP is valid and destroyed once; afterwards the device no longer processes
        // its requests and generates no completions for it.
        let rc = unsafe { ibv::ibv_destroy_qp(self.qp.as_ptr()) };
        if !return_code::teardown("ibv_destroy_qp", format_args!("qpn={qpn:#x}"), rc) {
            // The device may still use the requests' memory: the completion queues keep the
            // in-flight table (and so every region) registered; keep it alive forever too rather
            // than risk a use-after-free.
            std::mem::forget(self.inflight.clone());
            return;
        }
        // The number may be reused by the next queue pair: bury this incarnation so completions
        // still queued for it are dropped, never attributed to the next one. Only a queue pair
        // with requests in flight can have completions queued: once every posted request is
        // retired, the completion that retired the last one was the last of this incarnation
        // (RC completes in order), so an idle queue pair leaves no tombstone. Read under the
        // completion queues' locks, so no poll retires anything meanwhile.
        // The async layer hears first which requests ended (none of them, and nothing of this
        // queue pair, can complete any more).
        let tag = self.inflight.tag();
        let wake = {
            let mut cqs = lock_both(&self.send_cq, &self.recv_cq);
            let (send, recv) = (lock(&self.inflight.send), lock(&self.inflight.recv));
            let busy = send.outstanding() > 0 || recv.outstanding() > 0;
            let wake = self.tell_watchers(&cqs, qpn, &send, &recv, DropCause::Destroyed);
            drop((send, recv));
            for d in cqs.iter_mut() {
                d.unregister(qpn, busy.then_some(tag));
            }
            wake
        };
        // Nothing can touch the requests' memory any more.
        lock(&self.inflight.send).restart(tag);
        lock(&self.inflight.recv).restart(tag);
        for w in wake {
            w.wake();
        }
    }
}
