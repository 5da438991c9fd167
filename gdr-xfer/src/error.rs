//! The error type of gdr-xfer: every failure is a matchable variant that names what failed, the
//! values that matter and, where one is known, how to fix it.

use std::time::Duration;

pub use gdr::Hint;

use crate::side::Side;
use gdr_xfer_proto::{DriverError, Lost, RailReports, Rejection, SegmentId};

/// Everything that can go wrong in gdr-xfer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A gdr call failed (device, registration, queue pair, completion). gdr's errors of the
    /// concepts both crates name ([`gdr::Error::InvalidArgument`], `Timeout`, `Io`,
    /// `Protocol`, `PeerLost`) arrive as this enum's variant of the same name instead, so one
    /// match arm catches the concept whichever layer found it.
    #[error(transparent)]
    Gdr(gdr::Error),

    /// An argument is invalid; nothing was done.
    #[error("{what}{hint}")]
    InvalidArgument {
        /// What is wrong, with the values.
        what: String,
        /// How to fix it.
        hint: Hint,
    },

    /// Something is larger than its bound (a notification, a name, a directory key or value);
    /// nothing was sent or stored.
    #[error("{what} is {len} bytes, over the {max}-byte bound{hint}")]
    TooLarge {
        /// What, with the names that identify it.
        what: String,
        /// Its length.
        len: u64,
        /// The bound.
        max: u64,
        /// How to fix it.
        hint: Hint,
    },

    /// A range (of a descriptor, a sub-segment, a read or write) does not lie inside its
    /// segment; nothing was done.
    #[error("{}{side} range {offset}..+{len} lies outside segment {segment} ({segment_len} bytes){hint}", descriptor_prefix(*.index))]
    OutOfSegment {
        /// Position of the descriptor in its list; `None` for a range that is no descriptor's
        /// ([`crate::Agent::register_within`], [`crate::Segment::read`], [`crate::Segment::write`]).
        index: Option<usize>,
        /// Which side's range or block.
        side: Side,
        /// The segment's id.
        segment: SegmentId,
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
        segment: SegmentId,
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
        segment: SegmentId,
        /// How to fix it.
        hint: Hint,
    },

    /// A call was given an object that another agent made (a segment, a peer), or a prepared
    /// remote list of another connection (another agent's, or an earlier connection to a peer of
    /// the same name): refused before anything changed; the agent, its connections and the
    /// other agent are unaffected.
    #[error("{call}: {object}{hint}")]
    ForeignObject {
        /// The call that refused it (`"Agent::register_within"`, ...).
        call: &'static str,
        /// What the object is, and whose.
        object: Foreign,
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
    #[error("transfer to {peer:?}: a request was refused: {why}{hint}")]
    Rejected {
        /// The peer's name.
        peer: String,
        /// Why: the transfer's own fault, or what gdr said when it refused a request
        /// ([`Rejection::Driver`]: an [`Error`] of gdr-xfer, [`DriverError::downcast_ref`]).
        ///
        /// [`Rejection::Driver`]: gdr_xfer_proto::Rejection::Driver
        /// [`DriverError::downcast_ref`]: gdr_xfer_proto::DriverError::downcast_ref
        why: Rejection,
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
        /// Which side's range or block.
        side: Side,
        /// The largest block index of that side.
        block: u64,
        /// The segment's id.
        segment: SegmentId,
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
    #[error("peer {peer:?} lost: {why}{hint}")]
    PeerLost {
        /// The peer's name.
        peer: String,
        /// Why the connection ended, as a value: this agent disconnected, the peer said
        /// goodbye (its words) or broke the protocol, the control link or the handshake failed
        /// (the underlying error, `#[source]`), the directory lost its record.
        #[source]
        why: Lost,
        /// How to fix it.
        hint: Hint,
    },

    /// A peer sent something malformed or hostile; it was refused before anything used it.
    #[error("protocol error from {peer}: {detail}{hint}")]
    Protocol {
        /// The peer's name or address.
        peer: String,
        /// What was wrong.
        detail: String,
        /// How to fix it.
        hint: Hint,
    },

    /// A deadline passed.
    #[error("{what} timed out after {after:?}{hint}")]
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
    #[error("transfer to {peer:?}: no rail left: {rails}{hint}")]
    NoRail {
        /// The peer's name.
        peer: String,
        /// Each rail's state and why it was last paused (its [`RailFault`](crate::RailFault)),
        /// in rail order.
        rails: RailReports,
        /// How to fix it.
        hint: Hint,
    },

    /// The agent was dropped; its transfers were failed and its connections closed.
    #[error("the agent was shut down")]
    AgentClosed,

    /// Staging GPU memory through host bounce buffers failed (a copy the driver refused, the
    /// bounce buffers could not be made); the transfer's memory was held until every copy and
    /// request using it had ended.
    #[error("staged transfer to {peer} failed: {error}{hint}")]
    StagingFailed {
        /// The peer of the transfer.
        peer: String,
        /// What failed: an [`Error`] of gdr-xfer (a copy's [`Error::Gdr`] from the CUDA
        /// driver), [`DriverError::downcast_ref`] gives it back.
        ///
        /// [`DriverError::downcast_ref`]: gdr_xfer_proto::DriverError::downcast_ref
        #[source]
        error: DriverError,
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

    /// A directory name is held by someone else (another agent, through another directory's
    /// lease or through this same directory), or a key is another lease's: nothing was put, and
    /// the holder's records are untouched. A name belongs to the agent that published it first
    /// until it withdraws (shutdown, drop) or its lease ends.
    #[error("{call}: the name {name:?} is taken: {key:?} is held by {}{hint}", holder_text(*.holder_lease))]
    NameTaken {
        /// The call refused (`Agent::publish`, `EtcdDirectory::claim`, `EtcdDirectory::put`,
        /// `EtcdDirectory::put_claimed`).
        call: &'static str,
        /// The name asked for: the agent's name, or the scope or key (relative to the
        /// directory's prefix) of a directory call.
        name: String,
        /// The etcd key found held (prefix included, as `etcdctl get` takes it).
        key: String,
        /// The holder's etcd lease (`etcdctl lease list` shows it in hex); 0 when the key is
        /// bound to no lease.
        holder_lease: i64,
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

/// `descriptor N: ` for a descriptor's error, nothing for another range's.
pub(crate) fn descriptor_prefix(index: Option<usize>) -> String {
    index.map_or_else(String::new, |i| format!("descriptor {i}: "))
}

/// Who holds a taken directory name, for [`Error::NameTaken`].
fn holder_text(lease: i64) -> String {
    if lease == 0 {
        "a record bound to no lease".into()
    } else {
        format!("etcd lease {lease:#x}")
    }
}

/// The hint of [`Error::PeerLost`].
pub(crate) const PEER_LOST_HINT: &str =
    "the peer's process exited, its link failed or its directory record went (its log says which); connect again once it is back (Agent::connect, wait_peer)";

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
            hint: Hint::NONE,
        }
    }
}

impl From<gdr::Error> for Error {
    fn from(e: gdr::Error) -> Self {
        match e {
            gdr::Error::InvalidArgument { what, hint } => Error::InvalidArgument { what, hint },
            gdr::Error::Timeout { what, after, hint } => Error::Timeout { what, after, hint },
            gdr::Error::Io { what, source } => Error::Io { what, source },
            gdr::Error::Protocol { peer, detail, hint } => Error::Protocol { peer, detail, hint },
            gdr::Error::PeerLost { peer, reason, hint } => Error::PeerLost {
                peer: peer.clone(),
                why: Lost::Link {
                    error: DriverError::new(gdr::Error::PeerLost {
                        peer,
                        reason,
                        hint: gdr::Hint::NONE,
                    }),
                },
                hint,
            },
            other => Error::Gdr(other),
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

/// An object of another agent or connection, as [`Error::ForeignObject`] names it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Foreign {
    /// A segment registered by another agent (its id there).
    Segment(SegmentId),
    /// The handle of another agent's connection (the peer's name).
    Peer(String),
    /// A remote list prepared on another connection (the name of the peer it was prepared
    /// for): another agent's, or an earlier connection to a peer of that name, whose segment
    /// ids may name other memory now.
    RemoteList(String),
}

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Foreign::Segment(id) => write!(f, "segment {id} belongs to another agent"),
            Foreign::Peer(name) => write!(f, "peer {name:?} is another agent's connection"),
            Foreign::RemoteList(name) => write!(
                f,
                "the remote list was prepared on another connection to {name:?} (another agent's, or an earlier one)"
            ),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A range's error names its descriptor only when there is one.
    #[test]
    fn out_of_segment_names_a_descriptor_only_for_one() {
        let e = |index| Error::OutOfSegment {
            index,
            side: Side::Local,
            segment: SegmentId::new(3),
            offset: 4000,
            len: 200,
            segment_len: 4096,
            hint: Hint::NONE,
        };
        assert_eq!(
            e(None).to_string(),
            "local range 4000..+200 lies outside segment 3 (4096 bytes)"
        );
        assert_eq!(
            e(Some(2)).to_string(),
            "descriptor 2: local range 4000..+200 lies outside segment 3 (4096 bytes)"
        );
    }

    /// The concepts both crates name arrive from gdr as gdr-xfer's variant of the same name,
    /// with every field and the same message; the others stay wrapped.
    #[test]
    fn shared_concepts_from_gdr_arrive_as_the_same_variant() {
        let timeout = gdr::Error::Timeout {
            what: "waiting for 1 completions".into(),
            after: Duration::from_millis(250),
            hint: Hint::new("is the peer alive?"),
        };
        let text = timeout.to_string();
        let e = Error::from(timeout);
        assert_eq!(e.to_string(), text);
        assert!(
            matches!(&e, Error::Timeout { after, hint, .. }
                if *after == Duration::from_millis(250) && hint.text() == Some("is the peer alive?")),
            "{e:?}"
        );
        let e = Error::from(gdr::Error::invalid("len 0", "pass a length"));
        assert!(
            matches!(&e, Error::InvalidArgument { what, .. } if what == "len 0"),
            "{e:?}"
        );
        let e = Error::from(gdr::Error::io(
            "reading x",
            std::io::Error::from_raw_os_error(libc::ENOENT),
        ));
        assert!(
            matches!(&e, Error::Io { what, .. } if what == "reading x"),
            "{e:?}"
        );
        let e = Error::from(gdr::Error::protocol("bad kind").from_peer("10.0.0.2:7000"));
        assert!(
            matches!(&e, Error::Protocol { peer, detail, .. } if peer == "10.0.0.2:7000" && detail == "bad kind"),
            "{e:?}"
        );
        let e = Error::from(gdr::Error::PeerLost {
            peer: "10.0.0.2:7000".into(),
            reason: "closed".into(),
            hint: Hint::NONE,
        });
        assert!(
            matches!(&e, Error::PeerLost { why: Lost::Link { error }, .. } if error.to_string().contains("closed")),
            "{e:?}"
        );
        let e = Error::from(gdr::Error::unsupported("no dma-buf", Hint::NONE));
        assert!(
            matches!(&e, Error::Gdr(gdr::Error::Unsupported { .. })),
            "{e:?}"
        );
    }
}
