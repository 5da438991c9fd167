//! Reliable-connected queue pairs: a builder, the [`Endpoint`] peers exchange, the
//! INIT -> RTR -> RTS handshake, posting with every check done first, and recovery from the
//! error state.
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
use std::hash::{BuildHasher, Hasher};
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use gdr_sys::ibv;

use crate::cq::CompletionQueue;
use crate::device::{Gid, LinkLayer, Mtu};
use crate::error::{Error, Hint, Result};
use crate::mr::{AccessFlags, LocalSlice, MemoryKind};
use crate::pd::ProtectionDomain;
use crate::wr::{lock, Data, InFlight, Operation, RecvRequest, Ring, SendRequest, RECV_BIT};

mod prepared;
pub use prepared::PreparedSend;

/// Most scatter/gather entries one request may carry.
pub const MAX_SGE: usize = 16;

/// Most requests [`QueuePair::post_send_list`] hands to the provider in one call (one doorbell);
/// longer lists take several calls.
pub const LIST_CHUNK: usize = 32;

/// Most scatter/gather entries of the requests in one provider call.
pub const LIST_SGES: usize = 4 * MAX_SGE;

/// One of a queue pair's two work queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkQueue {
    /// The send queue: writes, reads, sends, atomics.
    Send,
    /// The receive queue: receives.
    Recv,
}

impl fmt::Display for WorkQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WorkQueue::Send => "send",
            WorkQueue::Recv => "receive",
        })
    }
}

/// What a peer needs to connect its queue pair to ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number the peer must expect (24 bits).
    pub psn: u32,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// GID (RoCE: the address the peer routes to).
    pub gid: Gid,
    /// The GID's index in our table (informational for the peer).
    pub gid_index: u32,
    /// Our path MTU limit.
    pub mtu: Mtu,
    /// Our port (informational).
    pub port: u8,
}

impl Endpoint {
    /// Checks values that came from a peer.
    pub fn validate(&self) -> Result<()> {
        if self.qpn == 0 || self.qpn >= 1 << 24 {
            return Err(Error::protocol(format!(
                "peer endpoint has invalid QP number {:#x} (must be 1..2^24)",
                self.qpn
            )));
        }
        if self.psn >= 1 << 24 {
            return Err(Error::protocol(format!(
                "peer endpoint has invalid PSN {:#x} (24 bits)",
                self.psn
            )));
        }
        if self.gid.is_zero() && self.lid == 0 {
            return Err(Error::protocol("peer endpoint has neither a GID nor a LID"));
        }
        Ok(())
    }
}

/// Queue pair state (`ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Reset.
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error: every request completes with a flush error.
    Error,
    /// Unknown.
    Unknown,
}

impl QpState {
    fn from_raw(v: u32) -> Self {
        match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Error,
            _ => QpState::Unknown,
        }
    }
}

/// Settings of a queue pair. Defaults follow perftest and NCCL.
#[derive(Debug, Clone)]
pub struct QpConfig {
    /// Send queue depth (default 128).
    pub max_send_wr: u32,
    /// Receive queue depth (default 128).
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send request (default 4, at most [`MAX_SGE`]).
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive request (default 4, at most [`MAX_SGE`]).
    pub max_recv_sge: u32,
    /// Inline data bytes (default 64).
    pub max_inline_data: u32,
    /// Port (default 1).
    pub port: u8,
    /// GID index; `None` picks RoCE v2 IPv4 on Ethernet ports, 0 on InfiniBand.
    pub gid_index: Option<u32>,
    /// Path MTU cap; `None` uses the port's active MTU (and the peer's, whichever is smaller).
    pub mtu: Option<Mtu>,
    /// Local ACK timeout exponent: 4.096 us * 2^timeout (default 14, about 67 ms).
    pub timeout: u8,
    /// Transport retries (default 7).
    pub retry_count: u8,
    /// RNR retries (default 7 = infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code (default 12).
    pub min_rnr_timer: u8,
    /// Outstanding reads/atomics; `None` takes the device's maximum (capped at 16).
    pub max_rd_atomic: Option<u8>,
    /// What peers may do through this queue pair (default remote write, read and atomics; each
    /// region's own access flags still apply).
    pub access: AccessFlags,
    /// Initial PSN; `None` draws a random one.
    pub psn: Option<u32>,
    /// Traffic class (RoCE DSCP << 2).
    pub traffic_class: u8,
    /// Service level.
    pub service_level: u8,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
            port: 1,
            gid_index: None,
            mtu: None,
            timeout: 14,
            retry_count: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: None,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            psn: None,
            traffic_class: 0,
            service_level: 0,
        }
    }
}

/// Builds a [`QueuePair`]; see [`QpConfig`] for the settings and defaults.
pub struct QueuePairBuilder {
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    cfg: QpConfig,
}

macro_rules! setter {
    ($(#[$m:meta])* $name:ident: $t:ty) => {
        $(#[$m])*
        pub fn $name(mut self, v: $t) -> Self {
            self.cfg.$name = v;
            self
        }
    };
}

impl QueuePairBuilder {
    setter!(/// Send queue depth.
        max_send_wr: u32);
    setter!(/// Receive queue depth.
        max_recv_wr: u32);
    setter!(/// SGEs per send request.
        max_send_sge: u32);
    setter!(/// SGEs per receive request.
        max_recv_sge: u32);
    setter!(/// Inline bytes.
        max_inline_data: u32);
    setter!(/// Port number.
        port: u8);
    setter!(/// Local ACK timeout exponent.
        timeout: u8);
    setter!(/// Transport retry count.
        retry_count: u8);
    setter!(/// RNR retry count (7 = infinite).
        rnr_retry: u8);
    setter!(/// Minimum RNR NAK timer code.
        min_rnr_timer: u8);
    setter!(/// Remote access allowed through this QP.
        access: AccessFlags);
    setter!(/// Traffic class.
        traffic_class: u8);
    setter!(/// Service level.
        service_level: u8);

    /// Uses GID `index` instead of the automatic RoCE v2 choice.
    pub fn gid_index(mut self, index: u32) -> Self {
        self.cfg.gid_index = Some(index);
        self
    }

    /// Caps the path MTU.
    pub fn mtu(mut self, mtu: Mtu) -> Self {
        self.cfg.mtu = Some(mtu);
        self
    }

    /// Sets the initial PSN (24 bits).
    pub fn psn(mut self, psn: u32) -> Self {
        self.cfg.psn = Some(psn);
        self
    }

    /// Sets outstanding reads/atomics.
    pub fn max_rd_atomic(mut self, n: u8) -> Self {
        self.cfg.max_rd_atomic = Some(n);
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, cfg: QpConfig) -> Self {
        self.cfg = cfg;
        self
    }

    /// Creates the queue pair and moves it to INIT (receives may be posted from now on).
    pub fn build(self) -> Result<QueuePair> {
        QueuePair::create(self.pd, self.send_cq, self.recv_cq, self.cfg)
    }
}

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

fn random_psn() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() as u32) & 0x00ff_ffff
}

/// `ibv_qp_attr_mask` bits as names, e.g. `STATE|AV|PATH_MTU`.
fn mask_names(mask: u32) -> String {
    const NAMES: [&str; 21] = [
        "STATE",
        "CUR_STATE",
        "EN_SQD_ASYNC_NOTIFY",
        "ACCESS_FLAGS",
        "PKEY_INDEX",
        "PORT",
        "QKEY",
        "AV",
        "PATH_MTU",
        "TIMEOUT",
        "RETRY_CNT",
        "RNR_RETRY",
        "RQ_PSN",
        "MAX_QP_RD_ATOMIC",
        "ALT_PATH",
        "MIN_RNR_TIMER",
        "SQ_PSN",
        "MAX_DEST_RD_ATOMIC",
        "PATH_MIG_STATE",
        "CAP",
        "DEST_QPN",
    ];
    let mut parts: Vec<String> = (0..32)
        .filter(|b| mask & (1 << b) != 0)
        .map(|b| {
            NAMES
                .get(b)
                .map_or_else(|| format!("bit{b}"), |n| n.to_string())
        })
        .collect();
    if parts.is_empty() {
        parts.push("0".into());
    }
    parts.join("|")
}

fn qp_err(call: &'static str, qpn: u32, what: &str, rc: i32, hint: impl Into<Hint>) -> Error {
    Error::verbs(call, format!("qpn={qpn:#x}, {what}"), rc.abs(), hint)
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
        let port = ctx.query_port(cfg.port)?;
        let gid = match cfg.gid_index {
            Some(i) => ctx.gid(cfg.port, i)?,
            None if port.link_layer == LinkLayer::InfiniBand => ctx.gid(cfg.port, 0)?,
            None => ctx.default_gid(cfg.port)?,
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
        let qp = NonNull::new(qp).ok_or_else(|| {
            Error::verbs_errno(
                "ibv_create_qp",
                format!(
                    "device={}, max_send_wr={}, max_recv_wr={}, max_send_sge={}, max_recv_sge={}, max_inline_data={}",
                    ctx.name(), cfg.max_send_wr, cfg.max_recv_wr, cfg.max_send_sge, cfg.max_recv_sge, cfg.max_inline_data
                ),
                format!("the device allows max_qp_wr={}, max_sge={}; inline limits are provider-specific", dev.max_qp_wr, dev.max_sge),
            )
        })?;
        // SAFETY: the QP is valid.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        let inflight = Arc::new(InFlight::new(
            cfg.max_send_wr,
            init.cap.max_send_sge,
            cfg.max_recv_wr.max(1),
            init.cap.max_recv_sge,
        ));
        let mtu = cfg.mtu.map_or(port.active_mtu, |m| m.min(port.active_mtu));
        let psn = cfg.psn.map_or_else(random_psn, |p| p & 0x00ff_ffff);
        let local = Endpoint {
            qpn,
            psn,
            lid: port.lid,
            gid: gid.gid,
            gid_index: gid.index,
            mtu,
            port: cfg.port,
        };
        send_cq.register(qpn, inflight.clone());
        if !Arc::ptr_eq(&send_cq, &recv_cq) {
            recv_cq.register(qpn, inflight.clone());
        }
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
        };
        qp.to_init()?;
        log::debug!(
            "created RC QP {qpn:#x} on {} port {} GID[{}]={}",
            ctx.name(),
            local.port,
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

    /// The configuration it was built with.
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// The raw `ibv_qp`.
    pub fn as_raw(&self) -> *mut ibv::ibv_qp {
        self.qp.as_ptr()
    }

    /// The current state, as the device reports it.
    pub fn state(&self) -> Result<QpState> {
        // SAFETY: plain old data.
        let mut attr: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: plain old data.
        let mut init: ibv::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid QP and output structs.
        let rc = unsafe {
            ibv::ibv_query_qp(
                self.qp.as_ptr(),
                &mut attr,
                ibv::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        if rc != 0 {
            return Err(qp_err(
                "ibv_query_qp",
                self.qp_num(),
                "mask=STATE",
                rc,
                Hint::NONE,
            ));
        }
        Ok(QpState::from_raw(attr.qp_state))
    }

    fn modify(
        &self,
        attr: &mut ibv::ibv_qp_attr,
        mask: ibv::ibv_qp_attr_mask,
        target: QpState,
        hint: impl Fn(i32) -> Hint,
    ) -> Result<()> {
        // SAFETY: valid QP; `attr` is filled for every bit of `mask`.
        let rc = unsafe { ibv::ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32) };
        if rc == 0 {
            return Ok(());
        }
        let errno = if rc < 0 { -rc } else { rc };
        let from = self
            .state()
            .map(|s| format!("{s:?}"))
            .unwrap_or_else(|_| "unknown".into());
        Err(qp_err(
            "ibv_modify_qp",
            self.qp_num(),
            &format!("{from} -> {target:?}, mask={}", mask_names(mask.0)),
            errno,
            hint(errno),
        ))
    }

    /// Applies attributes computed elsewhere (by `rdma_init_qp_attr` for rdma_cm connections).
    pub(crate) fn apply(
        &self,
        attr: &mut ibv::ibv_qp_attr,
        mask: i32,
        target: QpState,
    ) -> Result<()> {
        self.modify(attr, ibv::ibv_qp_attr_mask(mask as u32), target, |_| {
            Hint::new("rdma_cm computed these attributes; is the queue pair on the cm_id's device and port?")
        })
    }

    fn to_init(&self) -> Result<()> {
        use ibv::ibv_qp_attr_mask as M;
        // SAFETY: plain old data.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = self.cfg.port;
        a.qp_access_flags = self.cfg.access.bits()
            & (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC)
                .bits();
        self.modify(&mut a, M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS, QpState::Init, |_| {
            Hint::new("RESET -> INIT needs a valid port and access flags; a QP in another state must be reset() first")
        })
    }

    /// Connects to the peer's endpoint: INIT -> RTR -> RTS. Post receives before the peer may
    /// send. After an error, [`QueuePair::reset`] and connect again.
    pub fn connect(&self, remote: &Endpoint) -> Result<()> {
        use ibv::ibv_qp_attr_mask as M;
        remote.validate()?;
        let local = self.endpoint();
        if self.link_layer == LinkLayer::Ethernet && remote.gid.is_zero() {
            return Err(Error::protocol(
                "peer endpoint on a RoCE fabric has an empty GID",
            ));
        }
        let mtu = local.mtu.min(remote.mtu);
        // SAFETY: plain old data.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = mtu.raw();
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = self.max_rd_atomic;
        a.min_rnr_timer = self.cfg.min_rnr_timer;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.sl = self.cfg.service_level;
        a.ah_attr.port_num = self.cfg.port;
        if self.link_layer != LinkLayer::InfiniBand || remote.lid == 0 {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ibv::ibv_gid { raw: remote.gid.0 };
            a.ah_attr.grh.sgid_index = local.gid_index as u8;
            a.ah_attr.grh.hop_limit = 64;
            a.ah_attr.grh.traffic_class = self.cfg.traffic_class;
        }
        let roce = self.link_layer == LinkLayer::Ethernet;
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_AV | M::IBV_QP_PATH_MTU | M::IBV_QP_DEST_QPN | M::IBV_QP_RQ_PSN | M::IBV_QP_MAX_DEST_RD_ATOMIC | M::IBV_QP_MIN_RNR_TIMER,
            QpState::Rtr,
            |errno| match errno {
                libc::EINVAL => Hint::new(format!(
                    "RTR needs the QP in INIT (reset() after an error) and values the port accepts: path MTU {mtu}, max_dest_rd_atomic {}, GID index {}",
                    self.max_rd_atomic, local.gid_index
                )),
                libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ENODEV | libc::EADDRNOTAVAIL | libc::ETIMEDOUT if roce => Hint::new(format!(
                    "no route from GID[{}]={} to the peer's GID {}: use the RoCE v2 GID whose IP is reachable (`show_gids`), check IP addresses/VLAN, and that both sides use RoCE v2",
                    local.gid_index, local.gid, remote.gid
                )),
                _ => Hint::NONE,
            },
        )?;
        // SAFETY: plain old data.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv::ibv_qp_state::IBV_QPS_RTS;
        a.timeout = self.cfg.timeout;
        a.retry_cnt = self.cfg.retry_count;
        a.rnr_retry = self.cfg.rnr_retry;
        a.sq_psn = local.psn;
        a.max_rd_atomic = self.max_rd_atomic;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            QpState::Rts,
            |_| {
                Hint::new(
                    "RTS needs the QP in RTR; timeout <= 31, retry_count <= 7, rnr_retry <= 7",
                )
            },
        )?;
        log::debug!(
            "QP {:#x} connected to {:#x} (MTU {mtu})",
            local.qpn,
            remote.qpn
        );
        Ok(())
    }

    /// Moves the queue pair to the error state: outstanding requests complete with flush errors.
    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: plain old data.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv::ibv_qp_state::IBV_QPS_ERR;
        self.modify(
            &mut a,
            ibv::ibv_qp_attr_mask::IBV_QP_STATE,
            QpState::Error,
            |_| Hint::NONE,
        )
    }

    /// The way back from the error state: RESET (the device drops every outstanding request and
    /// their regions are released), a new PSN, INIT. Then exchange endpoints and
    /// [`QueuePair::connect`] again; the peer must reset too.
    pub fn reset(&self) -> Result<()> {
        // SAFETY: plain old data.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv::ibv_qp_state::IBV_QPS_RESET;
        self.modify(
            &mut a,
            ibv::ibv_qp_attr_mask::IBV_QP_STATE,
            QpState::Reset,
            |_| Hint::NONE,
        )?;
        // In RESET the device no longer touches any request's memory.
        lock(&self.inflight.send).clear();
        lock(&self.inflight.recv).clear();
        self.local.lock().unwrap_or_else(|p| p.into_inner()).psn = random_psn();
        self.to_init()
    }

    /// Requests in flight on the send queue (posted, completion not yet reaped).
    pub fn send_outstanding(&self) -> u64 {
        lock(&self.inflight.send).outstanding()
    }

    /// Requests in flight on the receive queue.
    pub fn recv_outstanding(&self) -> u64 {
        lock(&self.inflight.recv).outstanding()
    }

    fn check_slices(
        &self,
        what: &str,
        slices: &[LocalSlice],
        max: u32,
        need_write: bool,
    ) -> Result<()> {
        if slices.len() > max as usize {
            return Err(Error::invalid(
                format!(
                    "{what}: {} scatter/gather entries, the queue pair allows {max}",
                    slices.len()
                ),
                "raise max_send_sge/max_recv_sge in the builder",
            ));
        }
        for s in slices {
            if s.pd != Arc::as_ptr(&self.pd) as usize {
                return Err(Error::invalid(
                    format!("{what}: a local slice's region is registered with another protection domain"),
                    "register the memory with the queue pair's protection domain",
                ));
            }
            if s.len > u32::MAX as usize {
                return Err(Error::invalid(
                    format!("{what}: slice of {} bytes exceeds 4 GiB per SGE", s.len),
                    Hint::NONE,
                ));
            }
            if need_write && !s.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(Error::invalid(
                    format!("{what}: the NIC writes this local region but it was registered without LOCAL_WRITE ({:?})", s.access),
                    "register it with AccessFlags::LOCAL_WRITE",
                ));
            }
        }
        Ok(())
    }

    fn check_send(&self, req: &SendRequest<'_>) -> Result<()> {
        let op = req.op;
        let total = req.data_len() as u64;
        match req.data {
            Data::Slices(s) => {
                self.check_slices("post_send", s, self.cfg.max_send_sge, op.writes_local())?;
                if req.inline {
                    if let Some(g) = s
                        .iter()
                        .find(|s| matches!(s.kind(), MemoryKind::Gpu { .. }))
                    {
                        return Err(Error::invalid(
                            format!("inline {op:?} from GPU memory ({:?}): the CPU would have to read device memory", g.kind()),
                            "post it without .inline(); the NIC reads GPU memory directly",
                        ));
                    }
                }
            }
            Data::Inline(_) if op.writes_local() => {
                return Err(Error::invalid(
                    format!("{op:?} cannot be inline: the NIC writes its local buffer"),
                    Hint::NONE,
                ));
            }
            Data::Inline(_) => {}
        }
        if req.inline {
            if op.writes_local() {
                return Err(Error::invalid(
                    format!("{op:?} cannot be inline"),
                    Hint::NONE,
                ));
            }
            if total > u64::from(self.cfg.max_inline_data) {
                return Err(Error::invalid(
                    format!(
                        "inline data of {total} bytes exceeds the queue pair's max_inline_data={}",
                        self.cfg.max_inline_data
                    ),
                    "raise max_inline_data in the builder or post from a registered region",
                ));
            }
        }
        match (op.has_remote(), req.remote) {
            (true, None) => {
                return Err(Error::invalid(
                    format!("{op:?} needs a remote slice"),
                    Hint::NONE,
                ))
            }
            (true, Some(r)) => {
                if op.is_atomic() {
                    if total != 8 || r.len() != 8 {
                        return Err(Error::invalid(
                            format!("atomic {op:?}: local {total} bytes, remote {} bytes; both must be exactly 8", r.len()),
                            Hint::NONE,
                        ));
                    }
                    if !r.addr().is_multiple_of(8) {
                        return Err(Error::invalid(
                            format!(
                                "atomic {op:?}: remote address {:#x} is not 8-byte aligned",
                                r.addr()
                            ),
                            Hint::NONE,
                        ));
                    }
                } else if r.len() != total {
                    return Err(Error::invalid(
                        format!(
                            "{op:?}: local data is {total} bytes but the remote slice is {} bytes",
                            r.len()
                        ),
                        "slice both sides to the same length",
                    ));
                }
            }
            (false, _) => {}
        }
        Ok(())
    }

    /// Posts one send-queue request after checking it (bounds were checked when the slices were
    /// made; here: protection domain, SGE count, access flags, lengths, alignment, inline
    /// limits, GPU memory never inline). The regions stay alive until the completion is reaped.
    pub fn post_send(&self, req: &SendRequest<'_>) -> Result<()> {
        // One request: the same steps as a list, without the list's bookkeeping (this is the
        // latency path).
        self.check_send(req)?;
        let mut ring = lock(&self.inflight.send);
        if ring.outstanding() >= ring.capacity() {
            return Err(queue_full(&ring, 1));
        }
        let mut sges = [const { MaybeUninit::<ibv::ibv_sge>::uninit() }; MAX_SGE];
        let sig = req.signaled || ring.signal_due(ring.since_signal);
        let (seq, num_sge) = stage_one(&mut ring, 0, req, &mut sges);
        let mut wr = send_wr(req, seq, sig, sges[0].as_mut_ptr(), num_sge);
        // SAFETY: `wr` (with a null `next`) and its SGEs live across the call; every SGE lies
        // inside a registered region of our PD that the ring now keeps alive, or is inline data
        // the provider copies during the call.
        unsafe { self.post_staged(ring, &mut wr, sig, req.op, req.data_len()) }
    }

    /// Rings the doorbell for the one request `wr` just staged in `ring` (its `wr_id` is its
    /// sequence number): commits it when the provider takes it, unstages it and returns the
    /// error otherwise. `op` and `bytes` only feed the error message.
    ///
    /// # Safety
    /// `wr.next` is null, and every scatter/gather entry of `wr` lies inside a registered region
    /// of this queue pair's protection domain that stays alive until the request's completion is
    /// reaped (or the queue pair is reset), or is inline data valid during the call.
    unsafe fn post_staged(
        &self,
        mut ring: std::sync::MutexGuard<'_, Ring>,
        wr: &mut ibv::ibv_send_wr,
        signaled: bool,
        op: Operation,
        bytes: usize,
    ) -> Result<()> {
        let seq = wr.wr_id;
        let mut bad: *mut ibv::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is valid for `self`'s lifetime; the request's memory is the caller's
        // contract.
        let rc = unsafe { ibv::ibv_post_send(self.qp.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            ring.unstage(seq);
            drop(ring);
            return Err(self.post_error(op, bytes, rc, 0, 1));
        }
        ring.commit(signaled);
        Ok(())
    }

    /// Posts several send-queue requests with one doorbell per [`LIST_CHUNK`] requests (one
    /// `ibv_post_send` call with a linked list), in order. Every request is checked as in
    /// [`QueuePair::post_send`], and the send queue must have room for all of them, before any
    /// is posted: a check failure posts nothing.
    ///
    /// Posting a list costs the CPU and the NIC less than posting its requests one by one (one
    /// doorbell write instead of one per request; on Soft-RoCE one system call instead of one per
    /// request). If the provider itself refuses a request, the ones before it were posted and
    /// complete as usual; the error says how many.
    pub fn post_send_list(&self, reqs: &[SendRequest<'_>]) -> Result<()> {
        if let [one] = reqs {
            return self.post_send(one);
        }
        for req in reqs {
            self.check_send(req)?;
        }
        let mut ring = lock(&self.inflight.send);
        let free = ring.capacity() - ring.outstanding();
        if reqs.len() as u64 > free {
            return Err(queue_full(&ring, reqs.len()));
        }
        let mut done = 0;
        while done < reqs.len() {
            done += self.post_chunk(&mut ring, &reqs[done..], done, reqs.len())?;
        }
        Ok(())
    }

    /// Posts the longest prefix of `reqs` that fits one call (at most [`LIST_CHUNK`] requests
    /// and [`LIST_SGES`] scatter/gather entries); returns its length. `before` and `total` only
    /// feed the error message.
    fn post_chunk(
        &self,
        ring: &mut Ring,
        reqs: &[SendRequest<'_>],
        before: usize,
        total: usize,
    ) -> Result<usize> {
        let mut wrs = [const { MaybeUninit::<ibv::ibv_send_wr>::uninit() }; LIST_CHUNK];
        let mut sges = [const { MaybeUninit::<ibv::ibv_sge>::uninit() }; LIST_SGES];
        let mut signaled = [false; LIST_CHUNK];
        let (mut n, mut used) = (0usize, 0usize);
        let mut since = ring.since_signal;
        for req in reqs {
            let k = match req.data {
                Data::Slices(s) => s.len(),
                Data::Inline(_) => 1,
            };
            if n == LIST_CHUNK || used + k > LIST_SGES {
                break;
            }
            let sig = req.signaled || ring.signal_due(since);
            since = if sig { 0 } else { since + 1 };
            let (seq, num_sge) = stage_one(ring, n as u64, req, &mut sges[used..used + k]);
            wrs[n].write(send_wr(req, seq, sig, sges[used].as_mut_ptr(), num_sge));
            signaled[n] = sig;
            n += 1;
            used += k;
        }
        let base = wrs[0].as_mut_ptr();
        for i in 1..n {
            // SAFETY: entries 0..n were initialised above; `wrs` outlives the post below.
            unsafe { (*wrs[i - 1].as_mut_ptr()).next = wrs[i].as_mut_ptr() };
        }
        let mut bad: *mut ibv::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is valid; the n linked requests (entries 0..n, the last one's `next` is
        // null) and their SGEs live across the call; every SGE lies inside a registered region
        // of our PD that the ring now keeps alive; inline data is copied during the call.
        let rc = unsafe { ibv::ibv_post_send(self.qp.as_ptr(), base, &mut bad) };
        if rc == 0 {
            for &sig in &signaled[..n] {
                ring.commit(sig);
            }
            return Ok(n);
        }
        // The requests before `bad` were posted. A `bad` outside the list (a provider that does
        // not set it) counts as "all posted": keeping regions alive longer is always sound.
        let failed = (0..n)
            .find(|&i| std::ptr::eq(wrs[i].as_ptr(), bad))
            .unwrap_or(n);
        for &sig in &signaled[..failed] {
            ring.commit(sig);
        }
        for i in failed..n {
            ring.unstage(ring.head + (i - failed) as u64);
        }
        let req = &reqs[failed.min(n - 1)];
        Err(self.post_error(req.op, req.data_len(), rc, before + failed, total))
    }

    /// The error of a refused `ibv_post_send` of `op` with `bytes` of data: `posted` of `total`
    /// requests went out before it.
    fn post_error(
        &self,
        op: Operation,
        bytes: usize,
        rc: i32,
        posted: usize,
        total: usize,
    ) -> Error {
        let state = self
            .state()
            .map(|s| format!("{s:?}"))
            .unwrap_or_else(|_| "unknown".into());
        let which = if total == 1 {
            String::new()
        } else {
            format!(
                ", request {} of {total} refused, {posted} posted",
                posted + 1
            )
        };
        qp_err(
            "ibv_post_send",
            self.qp_num(),
            &format!("op={op:?}, bytes={bytes}, state={state}{which}"),
            rc,
            match rc.abs() {
                libc::EINVAL => "sends need the QP in RTS (connect() first; reset() after an error), and values within the QP's caps",
                libc::ENOMEM => "the device's send queue is full: poll completions before posting more",
                _ => "see ibv_post_send(3)",
            },
        )
    }

    /// Posts one receive request; its slices need LOCAL_WRITE.
    pub fn post_recv(&self, req: &RecvRequest<'_>) -> Result<()> {
        self.check_slices("post_recv", req.local, self.cfg.max_recv_sge, true)?;
        let mut ring = lock(&self.inflight.recv);
        if ring.outstanding() >= ring.capacity() {
            return Err(Error::invalid(
                format!(
                    "receive queue full: {} receives posted (max_recv_wr={})",
                    ring.outstanding(),
                    ring.capacity()
                ),
                "reap receive completions first or raise max_recv_wr",
            ));
        }
        // SAFETY: plain old data.
        let mut sges: [ibv::ibv_sge; MAX_SGE] = unsafe { std::mem::zeroed() };
        for (g, s) in sges.iter_mut().zip(req.local) {
            *g = sge(s);
        }
        let seq = ring.stage(0, req.wr_id, true, req.local.iter().map(|s| &s.region));
        // SAFETY: plain old data.
        let mut wr: ibv::ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = seq | RECV_BIT;
        wr.sg_list = sges.as_mut_ptr();
        wr.num_sge = req.local.len() as i32;
        let mut bad: *mut ibv::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: valid QP; `wr`/`sges` live across the call; the regions are kept alive by the ring.
        let rc = unsafe { ibv::ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            ring.unstage(seq);
            return Err(qp_err(
                "ibv_post_recv",
                self.qp_num(),
                &format!("sges={}", req.local.len()),
                rc,
                "receives can be posted from INIT on; not in RESET or after destroy",
            ));
        }
        ring.commit(true);
        Ok(())
    }
}

/// The "send queue full" error: `more` requests asked for.
fn queue_full(ring: &Ring, more: usize) -> Error {
    Error::invalid(
        format!(
            "send queue full: {} requests in flight, {more} more asked for (max_send_wr={})",
            ring.outstanding(),
            ring.capacity()
        ),
        "poll the completion queue before posting more; signal requests periodically",
    )
}

/// The provider's scatter/gather entry for `s`.
fn sge(s: &LocalSlice) -> ibv::ibv_sge {
    ibv::ibv_sge {
        addr: s.addr(),
        length: s.len as u32,
        lkey: s.lkey(),
    }
}

/// Writes `req`'s scatter/gather entries into `sges` (which has room for them); returns the
/// slices whose regions the request uses and the entry count the provider gets (0 for a request
/// without data, e.g. a zero-byte write with immediate).
fn write_sges<'r>(
    req: &SendRequest<'r>,
    sges: &mut [MaybeUninit<ibv::ibv_sge>],
) -> (&'r [LocalSlice], usize) {
    let (slices, k): (&'r [LocalSlice], usize) = match req.data {
        Data::Slices(s) => {
            for (g, s) in sges.iter_mut().zip(s) {
                g.write(sge(s));
            }
            (s, s.len())
        }
        Data::Inline(b) => {
            sges[0].write(ibv::ibv_sge {
                addr: b.as_ptr() as u64,
                length: b.len() as u32,
                lkey: 0,
            });
            (&[], 1)
        }
    };
    (slices, if req.data_len() == 0 { 0 } else { k })
}

/// Writes `req`'s scatter/gather entries into `sges` (which has room for them) and stages it in
/// the ring as the `ahead`-th request of the post; returns its sequence number and SGE count.
fn stage_one(
    ring: &mut Ring,
    ahead: u64,
    req: &SendRequest<'_>,
    sges: &mut [MaybeUninit<ibv::ibv_sge>],
) -> (u64, usize) {
    let (slices, num_sge) = write_sges(req, sges);
    let seq = ring.stage(
        ahead,
        req.wr_id,
        req.signaled,
        slices.iter().map(|s| &s.region),
    );
    (seq, num_sge)
}

/// The provider's form of `req`, with sequence number `seq` as its id and `num_sge` entries at
/// `sges`.
fn send_wr(
    req: &SendRequest<'_>,
    seq: u64,
    signaled: bool,
    sges: *mut ibv::ibv_sge,
    num_sge: usize,
) -> ibv::ibv_send_wr {
    // SAFETY: plain old data (null `next`, zero flags).
    let mut wr: ibv::ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = seq;
    wr.sg_list = sges;
    wr.num_sge = num_sge as i32;
    let mut flags = 0u32;
    if signaled {
        flags |= ibv::ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if req.fence {
        flags |= ibv::ibv_send_flags::IBV_SEND_FENCE.0;
    }
    if req.solicited {
        flags |= ibv::ibv_send_flags::IBV_SEND_SOLICITED.0;
    }
    if req.inline {
        flags |= ibv::ibv_send_flags::IBV_SEND_INLINE.0;
    }
    wr.send_flags = flags;
    use ibv::ibv_wr_opcode::*;
    let (opcode, imm) = match req.op {
        Operation::Write => (IBV_WR_RDMA_WRITE, None),
        Operation::WriteWithImm(i) => (IBV_WR_RDMA_WRITE_WITH_IMM, Some(i)),
        Operation::Read => (IBV_WR_RDMA_READ, None),
        Operation::Send => (IBV_WR_SEND, None),
        Operation::SendWithImm(i) => (IBV_WR_SEND_WITH_IMM, Some(i)),
        Operation::CompareSwap { .. } => (IBV_WR_ATOMIC_CMP_AND_SWP, None),
        Operation::FetchAdd { .. } => (IBV_WR_ATOMIC_FETCH_AND_ADD, None),
    };
    wr.opcode = opcode;
    if let Some(i) = imm {
        wr.imm_data_invalidated_rkey_union.imm_data = i.to_be();
    }
    if let Some(r) = req.remote {
        match req.op {
            Operation::CompareSwap { compare, swap } => {
                wr.wr.atomic = ibv::atomic_t {
                    remote_addr: r.addr(),
                    compare_add: compare,
                    swap,
                    rkey: r.rkey(),
                };
            }
            Operation::FetchAdd { add } => {
                wr.wr.atomic = ibv::atomic_t {
                    remote_addr: r.addr(),
                    compare_add: add,
                    swap: 0,
                    rkey: r.rkey(),
                };
            }
            _ => {
                wr.wr.rdma = ibv::rdma_t {
                    remote_addr: r.addr(),
                    rkey: r.rkey(),
                }
            }
        }
    }
    wr
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let qpn = self.qp_num();
        // SAFETY: the QP is valid and destroyed once; afterwards the device no longer processes
        // its requests, so releasing their regions below is sound.
        let rc = unsafe { ibv::ibv_destroy_qp(self.qp.as_ptr()) };
        self.send_cq.unregister(qpn);
        self.recv_cq.unregister(qpn);
        if rc != 0 {
            // The device may still use the requests' memory: keep it alive forever rather than
            // risk a use-after-free.
            log::error!(
                "ibv_destroy_qp({qpn:#x}) failed: {}; leaking its in-flight regions",
                crate::error::errno_text(rc.abs())
            );
            std::mem::forget(self.inflight.clone());
        } else {
            lock(&self.inflight.send).clear();
            lock(&self.inflight.recv).clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_validation_rejects_peer_garbage() {
        let ok = Endpoint {
            qpn: 0x11,
            psn: 0x123456,
            lid: 0,
            gid: Gid([0xfe; 16]),
            gid_index: 1,
            mtu: Mtu::B1024,
            port: 1,
        };
        assert!(ok.validate().is_ok());
        for bad in [
            Endpoint { qpn: 0, ..ok },
            Endpoint { qpn: 1 << 24, ..ok },
            Endpoint { psn: 1 << 24, ..ok },
            Endpoint {
                gid: Gid::default(),
                lid: 0,
                ..ok
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(Error::Protocol { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn attribute_masks_are_named() {
        use ibv::ibv_qp_attr_mask as M;
        let m = M::IBV_QP_STATE
            | M::IBV_QP_AV
            | M::IBV_QP_PATH_MTU
            | M::IBV_QP_DEST_QPN
            | M::IBV_QP_RQ_PSN
            | M::IBV_QP_MAX_DEST_RD_ATOMIC
            | M::IBV_QP_MIN_RNR_TIMER;
        assert_eq!(
            mask_names(m.0),
            "STATE|AV|PATH_MTU|RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN"
        );
        assert_eq!(mask_names(0), "0");
    }

    #[test]
    fn psn_is_24_bits() {
        for _ in 0..100 {
            assert!(random_psn() < 1 << 24);
        }
    }
}
