//! The error type of gdr-xfer: every failure is a matchable variant that names what failed, the
//! values that matter and, where one is known, how to fix it.

use std::time::Duration;

pub use gdr::Hint;

/// Everything that can go wrong in gdr-xfer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A gdr call failed (device, registration, queue pair, completion).
    #[error(transparent)]
    Gdr(#[from] gdr::Error),

    /// An argument is invalid; nothing was done.
    #[error("{what}{hint}")]
    InvalidArgument {
        /// What is wrong, with the values.
        what: String,
        /// How to fix it.
        hint: Hint,
    },

    /// A descriptor does not lie inside its segment; nothing was posted.
    #[error("descriptor {index}: {side} range {offset}..+{len} lies outside segment {segment} ({segment_len} bytes){hint}")]
    OutOfSegment {
        /// Position of the descriptor (or block) in the list.
        index: usize,
        /// `"local"` or `"remote"`.
        side: &'static str,
        /// The segment's id.
        segment: u32,
        /// Offset of the range in the segment.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// The segment's length.
        segment_len: u64,
        /// How to fix it.
        hint: Hint,
    },

    /// A segment id names no segment (never registered, or deregistered since).
    #[error("{owner} has no segment {segment}{hint}")]
    UnknownSegment {
        /// The agent whose segment table was searched (`"local"` for our own).
        owner: String,
        /// The segment id.
        segment: u32,
        /// How to fix it.
        hint: Hint,
    },

    /// A transfer's local side is a segment of another agent (another protection domain);
    /// nothing was posted, no other transfer was affected.
    #[error("descriptor {index}: segment {segment} belongs to another agent{hint}")]
    ForeignSegment {
        /// Position of the descriptor (or table) in the request.
        index: usize,
        /// The segment's id (in its own agent).
        segment: u32,
        /// How to fix it.
        hint: Hint,
    },

    /// The transfer was cancelled ([`crate::Transfer::cancel`]); its memory is quiet.
    #[error("transfer to {peer:?} cancelled")]
    Cancelled {
        /// The peer's name.
        peer: String,
    },

    /// The engine refused to post one of the transfer's requests for the request's own reason
    /// (gdr refused its memory); only this transfer failed.
    #[error("transfer to {peer:?}: a request was refused: {detail}{hint}")]
    Rejected {
        /// The peer's name.
        peer: String,
        /// What gdr said.
        detail: String,
        /// How to fix it.
        hint: Hint,
    },

    /// The lengths of a descriptor's two sides differ; nothing was posted.
    #[error(
        "descriptor {index}: local length {local_len} differs from remote length {remote_len}"
    )]
    LengthMismatch {
        /// Position of the descriptor in the list.
        index: usize,
        /// Length of the local side.
        local_len: u64,
        /// Length of the remote side.
        remote_len: u64,
    },

    /// An index into a prepared list or block table is out of range; nothing was posted.
    #[error("{list}: index {index} is out of range (length {len})")]
    IndexOutOfRange {
        /// Which list.
        list: &'static str,
        /// The index.
        index: u64,
        /// The list's length.
        len: u64,
    },

    /// A block of a pool ([`crate::PoolTable`]), or of a [`crate::BlockTable`] whose base
    /// leaves no whole block in its segment, does not lie inside the segment; nothing was
    /// posted.
    #[error("pool {pool}: {side} block {block} ({block_len} bytes at {offset}) lies outside segment {segment} ({segment_len} bytes){hint}")]
    BlockOutOfSegment {
        /// The pool's position in its table (0 for a block table).
        pool: usize,
        /// `"local"` or `"remote"`.
        side: &'static str,
        /// The largest block index of that side.
        block: u64,
        /// The segment's id.
        segment: u32,
        /// Where that block starts in the segment (saturated on overflow).
        offset: u64,
        /// Bytes per block.
        block_len: u64,
        /// The segment's length.
        segment_len: u64,
        /// How to fix it.
        hint: Hint,
    },

    /// No peer of that name is known (not connected, or not found in the directory).
    #[error("no peer named {name:?}{hint}")]
    UnknownPeer {
        /// The name.
        name: String,
        /// How to fix it.
        hint: Hint,
    },

    /// The peer is gone: its connection closed, a queue pair failed, or its directory lease
    /// ended. Every transfer pending to it fails with this error.
    #[error("peer {peer:?} lost: {reason}")]
    PeerLost {
        /// The peer's name.
        peer: String,
        /// Why gdr-xfer considers it lost.
        reason: String,
    },

    /// A peer sent something malformed or hostile; it was refused before anything used it.
    #[error("protocol error from {peer}: {detail}")]
    Protocol {
        /// The peer's name or address.
        peer: String,
        /// What was wrong.
        detail: String,
    },

    /// A deadline passed.
    #[error("{what} did not finish within {after:?}{hint}")]
    Timeout {
        /// What timed out.
        what: String,
        /// The time allowed.
        after: Duration,
        /// How to fix it.
        hint: Hint,
    },

    /// A request of the transfer completed with an error that names the request (a remote
    /// key the peer no longer honours, a protection error): only this transfer failed; the
    /// queue pairs it broke were renewed and the other transfers went on.
    #[error("transfer to {peer:?}: a request on QP {qp_num:#x} completed with {status} (vendor error {vendor_err:#x}){hint}")]
    SliceFailed {
        /// The peer's name.
        peer: String,
        /// The queue pair.
        qp_num: u32,
        /// The completion status.
        status: gdr::WcStatus,
        /// The provider's vendor error code.
        vendor_err: u32,
        /// How to fix it.
        hint: Hint,
    },

    /// Every rail to the peer failed (link down, retries exceeded) and none was re-admitted
    /// yet; pending transfers to it failed. The connection stays: rails come back after a
    /// successful probe.
    #[error("transfer to {peer:?}: no rail left: {detail}{hint}")]
    NoRail {
        /// The peer's name.
        peer: String,
        /// The rails and why each is paused.
        detail: String,
        /// How to fix it.
        hint: Hint,
    },

    /// The agent was dropped; its transfers were failed and its connections closed.
    #[error("the agent was shut down")]
    AgentClosed,

    /// Staging GPU memory through host bounce buffers failed (a copy the driver refused, the
    /// bounce buffers could not be made); the transfer's memory was held until every copy and
    /// request using it had ended.
    #[error("staged transfer to {peer} failed: {detail}{hint}")]
    StagingFailed {
        /// The peer of the transfer.
        peer: String,
        /// What failed (the copy engine's error text).
        detail: String,
        /// How to fix it.
        hint: Hint,
    },

    /// The metadata directory (etcd) failed.
    #[error("directory {op} {key:?} failed: {detail}{hint}")]
    Directory {
        /// The operation (`put`, `get`, `watch`, `lease grant`, ...).
        op: &'static str,
        /// The key or prefix.
        key: String,
        /// The client's error text.
        detail: String,
        /// How to fix it.
        hint: Hint,
    },

    /// An operating-system call failed (sockets, threads).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Results of gdr-xfer.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::InvalidArgument`].
    pub fn invalid(what: impl Into<String>, hint: impl Into<Hint>) -> Self {
        Error::InvalidArgument {
            what: what.into(),
            hint: hint.into(),
        }
    }

    /// An [`Error::Io`].
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// An [`Error::Protocol`].
    pub fn protocol(peer: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Protocol {
            peer: peer.into(),
            detail: detail.into(),
        }
    }
}

impl From<gdr_xfer_proto::wire::WireError> for Error {
    fn from(e: gdr_xfer_proto::wire::WireError) -> Self {
        use gdr_xfer_proto::wire::WireError;
        match e {
            WireError::Invalid { what, hint } => Error::invalid(what, hint),
            WireError::Protocol { peer, detail } => Error::protocol(peer, detail),
        }
    }
}

impl From<gdr_xfer_proto::ParseLocationError> for Error {
    fn from(e: gdr_xfer_proto::ParseLocationError) -> Self {
        Error::invalid(
            format!("memory location {:?}", e.input),
            gdr_xfer_proto::ParseLocationError::HINT,
        )
    }
}
