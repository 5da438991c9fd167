//! Work completion status and opcode, each tied once to the `ibv_wc_status` / `ibv_wc_opcode`
//! constants by one table.

use std::fmt;

use gdr_sys::ibv;
use gdr_sys::ibv::ibv_wc_opcode as O;
use gdr_sys::ibv::ibv_wc_status as S;

use crate::raw_enum::constants;

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

constants!(WcStatus: u32 {
    Success = S::IBV_WC_SUCCESS,
    LocalLength = S::IBV_WC_LOC_LEN_ERR,
    LocalQpOperation = S::IBV_WC_LOC_QP_OP_ERR,
    LocalEecOperation = S::IBV_WC_LOC_EEC_OP_ERR,
    LocalProtection = S::IBV_WC_LOC_PROT_ERR,
    WrFlush = S::IBV_WC_WR_FLUSH_ERR,
    MwBind = S::IBV_WC_MW_BIND_ERR,
    BadResponse = S::IBV_WC_BAD_RESP_ERR,
    LocalAccess = S::IBV_WC_LOC_ACCESS_ERR,
    RemoteInvalidRequest = S::IBV_WC_REM_INV_REQ_ERR,
    RemoteAccess = S::IBV_WC_REM_ACCESS_ERR,
    RemoteOperation = S::IBV_WC_REM_OP_ERR,
    RetryExceeded = S::IBV_WC_RETRY_EXC_ERR,
    RnrRetryExceeded = S::IBV_WC_RNR_RETRY_EXC_ERR,
    LocalRddViolation = S::IBV_WC_LOC_RDD_VIOL_ERR,
    RemoteInvalidRdRequest = S::IBV_WC_REM_INV_RD_REQ_ERR,
    RemoteAbort = S::IBV_WC_REM_ABORT_ERR,
    InvalidEecn = S::IBV_WC_INV_EECN_ERR,
    InvalidEecState = S::IBV_WC_INV_EEC_STATE_ERR,
    Fatal = S::IBV_WC_FATAL_ERR,
    ResponseTimeout = S::IBV_WC_RESP_TIMEOUT_ERR,
    General = S::IBV_WC_GENERAL_ERR,
    TagMatching = S::IBV_WC_TM_ERR,
    TagMatchingRndvIncomplete = S::IBV_WC_TM_RNDV_INCOMPLETE,
});

impl WcStatus {
    /// From `ibv_wc_status`.
    pub fn from_raw(v: u32) -> Self {
        Self::from_constant(v).unwrap_or(WcStatus::Unknown(v))
    }

    /// The `ibv_wc_status` value.
    pub fn raw(self) -> u32 {
        match self {
            WcStatus::Unknown(v) => v,
            s => s.constant().unwrap_or(u32::MAX),
        }
    }

    /// What to check when a request completes with this status.
    pub fn hint(self) -> Option<&'static str> {
        use WcStatus::*;
        Some(match self {
            Success => return None,
            LocalLength => "the receive buffer is smaller than the message, or the message exceeds the port's max_msg_sz",
            LocalQpOperation => "the local queue pair could not process the request: its port's link may be down (Soft-RoCE: the netdev), or the request exceeds the QP's limits (inline size, SGEs)",
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
            s => {
                // SAFETY: ibv_wc_status_str accepts any value and returns a static
                // NUL-terminated string.
                let c = unsafe { std::ffi::CStr::from_ptr(ibv::ibv_wc_status_str(s.raw())) };
                f.write_str(&c.to_string_lossy())
            }
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

constants!(WcOpcode: u32 {
    Send = O::IBV_WC_SEND,
    RdmaWrite = O::IBV_WC_RDMA_WRITE,
    RdmaRead = O::IBV_WC_RDMA_READ,
    CompareSwap = O::IBV_WC_COMP_SWAP,
    FetchAdd = O::IBV_WC_FETCH_ADD,
    BindMw = O::IBV_WC_BIND_MW,
    LocalInvalidate = O::IBV_WC_LOCAL_INV,
    Recv = O::IBV_WC_RECV,
    RecvRdmaWithImm = O::IBV_WC_RECV_RDMA_WITH_IMM,
});

impl WcOpcode {
    /// From `ibv_wc_opcode`.
    pub fn from_raw(v: u32) -> Self {
        Self::from_constant(v).unwrap_or(WcOpcode::Other(v))
    }

    /// The `ibv_wc_opcode` value.
    pub fn raw(self) -> u32 {
        match self {
            WcOpcode::Other(v) => v,
            o => o.constant().unwrap_or(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_round_trips_and_failures_have_hints() {
        for &(raw, s) in WcStatus::CONSTANTS {
            assert_eq!(WcStatus::from_raw(raw), s);
            assert_eq!(s.raw(), raw);
            assert_eq!(s.hint().is_none(), s == WcStatus::Success);
        }
        for v in 0..=23u32 {
            assert!(
                !matches!(WcStatus::from_raw(v), WcStatus::Unknown(_)),
                "{v} is mapped"
            );
        }
        assert_eq!(WcStatus::from_raw(99), WcStatus::Unknown(99));
        assert_eq!(WcStatus::Unknown(99).raw(), 99);
        assert_eq!(WcStatus::RemoteAccess.to_string(), "remote access error");
        assert_eq!(WcStatus::Unknown(99).to_string(), "unknown status 99");
    }

    #[test]
    fn every_opcode_round_trips() {
        for &(raw, o) in WcOpcode::CONSTANTS {
            assert_eq!(WcOpcode::from_raw(raw), o);
            assert_eq!(o.raw(), raw);
        }
        assert_eq!(WcOpcode::from_raw(7), WcOpcode::Other(7));
        assert_eq!(WcOpcode::Other(7).raw(), 7);
    }
}
