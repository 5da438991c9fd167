//! The queue pair's state machine: RESET -> INIT -> RTR -> RTS, the error state, and the way back
//! (`reset`).
//!
//! gdr tracks the state it last moved the queue pair to, under the locks of both work queues, and
//! refuses to post where the device would not take a request (a send before RTS, anything in
//! RESET or after `disconnect`): providers such as rxe queue a request first and fail its
//! doorbell afterwards, so a post the provider refuses may still run later. Every transition
//! holds both work queues' locks, so no post interleaves with it.

use std::fmt;
use std::hash::{BuildHasher, Hasher};

use gdr_sys::ibv;
use gdr_sys::ibv::ibv_qp_state as S;

use super::{Endpoint, QueuePair};
use crate::cq::dispatch::Dispatch;
use crate::cq::lock_both;
use crate::device::LinkLayer;
use crate::error::{Error, Hint, Result};
use crate::inflight::{lock, Ring};
use crate::mr::AccessFlags;
use crate::raw_enum::constants;
use crate::return_code;

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

/// Why requests in flight ended without a completion ([`crate::Error::RequestDropped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropCause {
    /// [`QueuePair::reset`]: the device dropped every request in flight, and completions it
    /// had queued for them are discarded.
    Reset,
    /// The queue pair was destroyed (dropped) while the requests were in flight.
    Destroyed,
}

impl fmt::Display for DropCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DropCause::Reset => "reset",
            DropCause::Destroyed => "destroyed",
        })
    }
}

/// Queue pair state (`ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

constants!(QpState: u32 {
    Reset = S::IBV_QPS_RESET,
    Init = S::IBV_QPS_INIT,
    Rtr = S::IBV_QPS_RTR,
    Rts = S::IBV_QPS_RTS,
    Sqd = S::IBV_QPS_SQD,
    Sqe = S::IBV_QPS_SQE,
    Error = S::IBV_QPS_ERR,
    Unknown = S::IBV_QPS_UNKNOWN,
});

impl QpState {
    /// From `ibv_qp_state`; values this version does not know are [`QpState::Unknown`].
    pub fn from_raw(v: u32) -> Self {
        Self::from_constant(v).unwrap_or(QpState::Unknown)
    }

    /// The `ibv_qp_state` value.
    pub fn raw(self) -> u32 {
        self.constant().unwrap_or(S::IBV_QPS_UNKNOWN)
    }

    /// Whether send-queue requests may be posted (RTS).
    pub fn can_send(self) -> bool {
        self == QpState::Rts
    }

    /// Whether receives may be posted (INIT, RTR, RTS).
    pub fn can_receive(self) -> bool {
        matches!(self, QpState::Init | QpState::Rtr | QpState::Rts)
    }
}

/// Both work queues of a queue pair, locked (send first) for a state transition.
pub(super) struct Rings<'a> {
    pub(super) send: std::sync::MutexGuard<'a, Ring>,
    pub(super) recv: std::sync::MutexGuard<'a, Ring>,
}

impl Rings<'_> {
    /// Records the state gdr moved the queue pair to.
    pub(super) fn set(&mut self, state: QpState) {
        self.send.state = state;
        self.recv.state = state;
    }
}

pub(super) fn random_psn() -> u32 {
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

impl QueuePair {
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
        return_code::check(
            "ibv_query_qp",
            rc,
            || format!("qpn={:#x}, mask=STATE", self.qp_num()),
            return_code::no_hint,
        )?;
        Ok(QpState::from_raw(attr.qp_state))
    }

    /// Locks both work queues (send first: the one order every path uses).
    pub(super) fn lock_rings(&self) -> Rings<'_> {
        Rings {
            send: lock(&self.inflight.send),
            recv: lock(&self.inflight.recv),
        }
    }

    fn modify(
        &self,
        attr: &mut ibv::ibv_qp_attr,
        mask: ibv::ibv_qp_attr_mask,
        target: QpState,
        hint: impl FnOnce(i32) -> Hint,
    ) -> Result<()> {
        // SAFETY: valid QP; `attr` is filled for every bit of `mask`.
        let rc = unsafe { ibv::ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32) };
        return_code::check(
            "ibv_modify_qp",
            rc,
            || {
                let from = self
                    .state()
                    .map(|s| format!("{s:?}"))
                    .unwrap_or_else(|_| "unknown".into());
                format!(
                    "qpn={:#x}, {from} -> {target:?}, mask={}",
                    self.qp_num(),
                    mask_names(mask.0)
                )
            },
            hint,
        )
    }

    /// Applies attributes computed elsewhere (by `rdma_init_qp_attr` for rdma_cm connections).
    pub(crate) fn apply(
        &self,
        attr: &mut ibv::ibv_qp_attr,
        mask: i32,
        target: QpState,
    ) -> Result<()> {
        let mut rings = self.lock_rings();
        self.modify(attr, ibv::ibv_qp_attr_mask(mask as u32), target, |_| {
            Hint::new("rdma_cm computed these attributes; is the queue pair on the cm_id's device and port?")
        })?;
        rings.set(target);
        Ok(())
    }

    /// The first transition, right after creation.
    pub(super) fn init(&self) -> Result<()> {
        let mut rings = self.lock_rings();
        self.to_init(&mut rings)
    }

    /// RESET -> INIT; the caller holds the rings.
    fn to_init(&self, rings: &mut Rings<'_>) -> Result<()> {
        use ibv::ibv_qp_attr_mask as M;
        // SAFETY: plain old data.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = self.port;
        a.qp_access_flags = self.cfg.access.bits()
            & (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC)
                .bits();
        self.modify(&mut a, M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS, QpState::Init, |_| {
            Hint::new("RESET -> INIT needs a valid port and access flags; a QP in another state must be reset() first")
        })?;
        rings.set(QpState::Init);
        Ok(())
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
        let mut rings = self.lock_rings();
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
        a.ah_attr.port_num = self.port;
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
        rings.set(QpState::Rtr);
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
        rings.set(QpState::Rts);
        drop(rings);
        log::debug!(
            "QP {:#x} connected to {:#x} (MTU {mtu})",
            local.qpn,
            remote.qpn
        );
        Ok(())
    }

    /// Moves the queue pair to the error state: outstanding requests complete with flush errors,
    /// and gdr refuses new posts until [`QueuePair::reset`].
    pub fn disconnect(&self) -> Result<()> {
        let mut rings = self.lock_rings();
        // SAFETY: plain old data.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = S::IBV_QPS_ERR;
        self.modify(
            &mut a,
            ibv::ibv_qp_attr_mask::IBV_QP_STATE,
            QpState::Error,
            return_code::no_hint,
        )?;
        rings.set(QpState::Error);
        Ok(())
    }

    /// The way back from the error state: RESET (the device drops every outstanding request and
    /// their regions are released), a new incarnation tag (completions still queued from before
    /// are dropped when polled, never attributed to new requests), a new PSN, INIT. Then
    /// exchange endpoints and [`QueuePair::connect`] again; the peer must reset too.
    ///
    /// Requests in flight end without a completion; their awaited futures (`gdr::aio`) resolve
    /// with [`Error::RequestDropped`].
    pub fn reset(&self) -> Result<()> {
        let mut wake = Vec::new();
        let outcome = self.reset_locked(&mut wake);
        // Every lock is released: a waker may run anything.
        for w in wake {
            w.wake();
        }
        outcome
    }

    /// [`QueuePair::reset`] under the locks; collects the wakers of the futures whose requests
    /// it dropped.
    fn reset_locked(&self, wake: &mut Vec<std::task::Waker>) -> Result<()> {
        // Completion queues first, then the rings: the order polling takes them in.
        let mut cqs = lock_both(&self.send_cq, &self.recv_cq);
        let mut rings = self.lock_rings();
        // SAFETY: plain old data.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = S::IBV_QPS_RESET;
        self.modify(
            &mut a,
            ibv::ibv_qp_attr_mask::IBV_QP_STATE,
            QpState::Reset,
            return_code::no_hint,
        )?;
        rings.set(QpState::Reset);
        // In RESET the device no longer touches any request's memory: release it, and retire
        // the old incarnation. First the async layer hears which requests ended, under the same
        // locks, so no completion or post interleaves.
        let qpn = self.qp_num();
        *wake = self.tell_watchers(&cqs, qpn, &rings.send, &rings.recv, DropCause::Reset);
        let old = rings.send.tag();
        // Completions of the old incarnation can be queued only if requests were in flight (see
        // QueuePair's Drop); a new tag is taken either way.
        if rings.send.outstanding() > 0 || rings.recv.outstanding() > 0 {
            for d in cqs.iter_mut() {
                d.bury(qpn, old);
            }
        }
        let tag = Dispatch::new_tag(&cqs.all(), qpn);
        drop(cqs);
        // With no new tag the rings stay empty under the old one and the state stays RESET
        // (nothing can be posted), so no queued completion can be attributed.
        let tag = tag.inspect_err(|_| {
            rings.send.restart(old);
            rings.recv.restart(old);
        })?;
        rings.send.restart(tag);
        rings.recv.restart(tag);
        self.local.lock().unwrap_or_else(|p| p.into_inner()).psn = random_psn();
        self.to_init(&mut rings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_round_trips() {
        for &(raw, s) in QpState::CONSTANTS {
            assert_eq!(QpState::from_raw(raw), s);
            assert_eq!(s.raw(), raw);
        }
        assert_eq!(QpState::from_raw(99), QpState::Unknown);
        assert!(QpState::Rts.can_send() && !QpState::Rtr.can_send());
        assert!(QpState::Init.can_receive() && !QpState::Reset.can_receive());
        assert!(!QpState::Error.can_receive() && !QpState::Error.can_send());
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
