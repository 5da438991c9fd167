//! The one error type of `gdr`.
//!
//! Every failure names the call that failed, the values that matter, the operating system's or
//! driver's text for the code, and, where one is known, a hint that says how to fix it.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use crate::cq::WcStatus;
pub use crate::qp::{DropCause, QpState, WorkQueue};

/// A fix hint attached to an error: printed after the message as `hint: ...`. Read it with
/// [`Hint::text`] or [`Error::hint`]; its representation is private.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hint(Option<Cow<'static, str>>);

impl Hint {
    /// No hint.
    pub const NONE: Hint = Hint(None);

    /// A hint with the given text.
    pub fn new(text: impl Into<Cow<'static, str>>) -> Self {
        Hint(Some(text.into()))
    }

    /// The hint's text, if any.
    pub fn text(&self) -> Option<&str> {
        self.0.as_deref()
    }
}

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(h) => write!(f, "; hint: {h}"),
            None => Ok(()),
        }
    }
}

impl From<&'static str> for Hint {
    fn from(s: &'static str) -> Self {
        Hint::new(s)
    }
}

impl From<String> for Hint {
    fn from(s: String) -> Self {
        Hint::new(s)
    }
}

/// Everything that can go wrong in `gdr`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A libibverbs or librdmacm call returned an error. The operating system's error is the
    /// [`std::error::Error::source`]; [`Error::errno`] gives its number.
    #[error("{call}({args}) failed: {} (errno {}){hint}", errno_text(os_errno(.source)), os_errno(.source))]
    Verbs {
        /// The C function, e.g. `ibv_reg_mr`.
        call: &'static str,
        /// The arguments that matter, already formatted, e.g. `len=4096, access=LOCAL_WRITE`.
        args: String,
        /// The errno as an I/O error (`raw_os_error()` is the positive errno value).
        #[source]
        source: std::io::Error,
        /// How to fix it.
        hint: Hint,
    },

    /// A CUDA driver call returned an error.
    #[error("{call}({args}) failed: {name} ({}){hint}", *.result as i32)]
    Cuda {
        /// The driver function, e.g. `cuPointerGetAttributes`.
        call: &'static str,
        /// The arguments that matter.
        args: String,
        /// The driver's `CUresult`.
        result: gdr_sys::cuda::CUresult,
        /// The `CUresult` name, e.g. `CUDA_ERROR_INVALID_VALUE`.
        name: String,
        /// How to fix it.
        hint: Hint,
    },

    /// The CUDA driver library cannot be used at all (absent, too old, or no device).
    #[error("CUDA driver unavailable: {reason}{hint}")]
    CudaUnavailable {
        /// What was missing.
        reason: String,
        /// How to fix it.
        hint: Hint,
    },

    /// No RDMA device matched the request.
    #[error("no RDMA device matches {wanted:?} (available: {}){hint}", list_or_none(.available))]
    DeviceNotFound {
        /// What was asked for (a name, `name:port`, or a selection list).
        wanted: String,
        /// The devices that exist.
        available: Vec<String>,
        /// How to fix it.
        hint: Hint,
    },

    /// A range lies outside the region or buffer it must lie in. Nothing was posted.
    #[error("{what}: range offset={offset} len={len} lies outside [0, {limit}){hint}")]
    OutOfBounds {
        /// Which range (e.g. `local slice of write`, `remote slice`).
        what: Cow<'static, str>,
        /// Start of the requested range, relative to the region.
        offset: u64,
        /// Length of the requested range.
        len: u64,
        /// Length of the region.
        limit: u64,
        /// How to fix it.
        hint: Hint,
    },

    /// An argument was rejected before any call was made.
    #[error("invalid argument: {what}{hint}")]
    InvalidArgument {
        /// What was wrong, with the values.
        what: String,
        /// How to fix it.
        hint: Hint,
    },

    /// A local slice's region is registered with another protection domain than the queue
    /// pair's: nothing was posted.
    #[error("{call}: a local slice's region is registered with another protection domain{hint}")]
    ForeignRegion {
        /// The refused call, e.g. `post_send`.
        call: &'static str,
        /// How to fix it.
        hint: Hint,
    },

    /// The NIC would write a local region registered without the access that needs: nothing
    /// was posted.
    #[error("{call}: the NIC writes this local region but it was registered without {} (it has {}){hint}", flag_names(*.needed), flag_names(*.have))]
    MissingAccess {
        /// The refused call, e.g. `post_send`.
        call: &'static str,
        /// The access the operation needs.
        needed: crate::mr::AccessFlags,
        /// The access the region was registered with.
        have: crate::mr::AccessFlags,
        /// How to fix it.
        hint: Hint,
    },

    /// An address given as GPU memory is host memory (pinned or pageable), or no memory CUDA
    /// knows: nothing was registered. Register host memory as host memory.
    #[error("{address:#x} is {kind} memory, not GPU device memory (cuPointerGetAttributes){hint}")]
    NotGpuMemory {
        /// The address.
        address: u64,
        /// What CUDA says it is.
        kind: crate::cuda::PointerType,
        /// How to fix it.
        hint: Hint,
    },

    /// The device, driver or kernel lacks a capability the operation needs.
    #[error("unsupported: {what}{hint}")]
    Unsupported {
        /// The capability and where it is missing.
        what: String,
        /// How to fix it.
        hint: Hint,
    },

    /// A peer sent something malformed or incompatible; the connection should be dropped.
    #[error("protocol error from {peer}: {detail}{hint}")]
    Protocol {
        /// The peer's address, or [`UNKNOWN_PEER`] where the bytes came without one (a
        /// decoder handed a buffer).
        peer: String,
        /// What was wrong with the message.
        detail: String,
        /// How to fix it.
        hint: Hint,
    },

    /// The peer went away: it closed the connection (or reset it) before the exchange
    /// finished.
    #[error("peer {peer} lost: {reason}{hint}")]
    PeerLost {
        /// The peer's address.
        peer: String,
        /// What was under way and how the connection ended.
        reason: String,
        /// How to fix it.
        hint: Hint,
    },

    /// A work queue has no free slot: nothing was posted. Reap completions, then post again.
    #[error("{queue} queue of QP {qp_num:#x} full: {outstanding} requests in flight, {requested} more asked for (capacity {capacity}){hint}")]
    QueueFull {
        /// Which queue.
        queue: WorkQueue,
        /// The queue pair number.
        qp_num: u32,
        /// Requests posted whose completions have not been reaped.
        outstanding: u64,
        /// The queue's depth.
        capacity: u64,
        /// How many requests the refused call wanted to post.
        requested: usize,
        /// How to fix it.
        hint: Hint,
    },

    /// The queue pair is not in a state that takes this kind of request: nothing was posted.
    #[error("QP {qp_num:#x} in state {state:?} cannot take {queue}-queue requests{hint}")]
    QpNotReady {
        /// The queue pair number.
        qp_num: u32,
        /// The queue posted to.
        queue: WorkQueue,
        /// The state gdr last moved the queue pair to.
        state: QpState,
        /// How to fix it.
        hint: Hint,
    },

    /// A device event ended an operation before its completion (a queue pair's fatal error,
    /// reported by `ibv_get_async_event`).
    #[error("{} ({:?}) ended the operation before its completion{hint}", .event.kind, .event.subject)]
    DeviceEvent {
        /// The event.
        event: crate::device::AsyncEvent,
        /// How to fix it.
        hint: Hint,
    },

    /// A work request completed with an error status.
    #[error("work request {wr_id} ({queue} queue of QP {qp_num:#x}) completed with {status} ({status:?}, vendor error {vendor_err:#x}){hint}")]
    Completion {
        /// The `wr_id` the application gave the failed request.
        wr_id: u64,
        /// The queue the request was posted to.
        queue: WorkQueue,
        /// The completion's status.
        status: WcStatus,
        /// The local queue pair number.
        qp_num: u32,
        /// Provider-specific error code.
        vendor_err: u32,
        /// How to fix it.
        hint: Hint,
    },

    /// A request ended without a completion: its queue pair was reset or destroyed while it was
    /// in flight, so the device will never report it (its memory was released). An awaited
    /// request (`gdr::aio`) resolves with this. Whether it ran, wholly, partly or not at all,
    /// is unknown.
    #[error("work request {wr_id} ({queue} queue of QP {qp_num:#x}) ended without a completion: the queue pair was {cause} while it was in flight{hint}")]
    RequestDropped {
        /// The `wr_id` of the request (the one the async layer gave it, for its own posts).
        wr_id: u64,
        /// The queue the request was posted to.
        queue: WorkQueue,
        /// The queue pair number.
        qp_num: u32,
        /// What ended it.
        cause: DropCause,
        /// How to fix it.
        hint: Hint,
    },

    /// rdma_cm reported another event than the connection step waited for: the address or
    /// route did not resolve, the peer rejected the connection or did not answer.
    #[error("{step}: expected {expected}, got {got} ({}){hint}", cm_status_text(*.status))]
    CmEvent {
        /// The step, e.g. `rdma_resolve_addr`.
        step: String,
        /// The event it waited for, e.g. `RDMA_CM_EVENT_ADDR_RESOLVED`.
        expected: String,
        /// The event that came, e.g. `RDMA_CM_EVENT_REJECTED`.
        got: String,
        /// The event's status: a negative errno, or the transport's reason (for a rejection,
        /// the consumer reject reason).
        status: i32,
        /// How to fix it.
        hint: Hint,
    },

    /// A wait ran out of time.
    #[error("{what} timed out after {after:?}{hint}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The time allowed.
        after: Duration,
        /// How to fix it.
        hint: Hint,
    },

    /// An I/O error outside verbs (sysfs, TCP, files).
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path or address.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The peer of a [`Error::Protocol`] made from bytes alone, before a link names it.
pub const UNKNOWN_PEER: &str = "unknown peer";

/// `Result<T, gdr::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A verbs error from a positive errno value.
    pub fn verbs(
        call: &'static str,
        args: impl Into<String>,
        errno: i32,
        hint: impl Into<Hint>,
    ) -> Self {
        Error::Verbs {
            call,
            args: args.into(),
            source: std::io::Error::from_raw_os_error(errno.saturating_abs()),
            hint: hint.into(),
        }
    }

    /// A verbs error from the thread's current `errno` (for calls that return NULL or -1).
    pub fn verbs_errno(call: &'static str, args: impl Into<String>, hint: impl Into<Hint>) -> Self {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        Error::verbs(call, args, errno, hint)
    }

    /// An I/O error: `what` was being done, with the path or address.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// An invalid-argument error.
    pub fn invalid(what: impl Into<String>, hint: impl Into<Hint>) -> Self {
        Error::InvalidArgument {
            what: what.into(),
            hint: hint.into(),
        }
    }

    /// An unsupported-capability error.
    pub fn unsupported(what: impl Into<String>, hint: impl Into<Hint>) -> Self {
        Error::Unsupported {
            what: what.into(),
            hint: hint.into(),
        }
    }

    /// A protocol error from a peer the caller does not know ([`UNKNOWN_PEER`]; a link that
    /// knows its peer names it with [`Error::from_peer`]).
    pub fn protocol(detail: impl Into<String>) -> Self {
        Error::Protocol {
            peer: UNKNOWN_PEER.to_string(),
            detail: detail.into(),
            hint: Hint::NONE,
        }
    }

    /// The error with its peer named: a [`Error::Protocol`] or [`Error::PeerLost`] made where
    /// the peer was not known gets `peer`; any other error is returned as it is.
    pub fn from_peer(mut self, peer: impl fmt::Display) -> Self {
        if let Error::Protocol { peer: p, .. } | Error::PeerLost { peer: p, .. } = &mut self {
            if p == UNKNOWN_PEER {
                *p = peer.to_string();
            }
        }
        self
    }

    /// The errno of a [`Error::Verbs`], if this is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Verbs { source, .. } => source.raw_os_error(),
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The hint, if the error carries one.
    pub fn hint(&self) -> Option<&str> {
        match self {
            Error::Verbs { hint, .. }
            | Error::Cuda { hint, .. }
            | Error::CudaUnavailable { hint, .. }
            | Error::DeviceNotFound { hint, .. }
            | Error::OutOfBounds { hint, .. }
            | Error::InvalidArgument { hint, .. }
            | Error::Unsupported { hint, .. }
            | Error::Protocol { hint, .. }
            | Error::PeerLost { hint, .. }
            | Error::CmEvent { hint, .. }
            | Error::ForeignRegion { hint, .. }
            | Error::MissingAccess { hint, .. }
            | Error::NotGpuMemory { hint, .. }
            | Error::QueueFull { hint, .. }
            | Error::QpNotReady { hint, .. }
            | Error::DeviceEvent { hint, .. }
            | Error::Completion { hint, .. }
            | Error::RequestDropped { hint, .. }
            | Error::Timeout { hint, .. } => hint.text(),
            Error::Io { .. } => None,
        }
    }
}

/// The C library's text for an errno value, e.g. `Cannot allocate memory`.
pub fn errno_text(errno: i32) -> String {
    let mut s = std::io::Error::from_raw_os_error(errno).to_string();
    // std appends " (os error N)"; we print the number ourselves.
    if let Some(i) = s.find(" (os error") {
        s.truncate(i);
    }
    s
}

/// Access flags by name, e.g. `LOCAL_WRITE | REMOTE_READ` (`none` for no flag).
fn flag_names(flags: crate::mr::AccessFlags) -> String {
    let names: Vec<&str> = flags.iter_names().map(|(name, _)| name).collect();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(" | ")
    }
}

/// An rdma_cm event's status as text: a negative errno's text, else `status N`.
fn cm_status_text(status: i32) -> String {
    if status < 0 {
        errno_text(status.saturating_neg())
    } else {
        format!("status {status}")
    }
}

/// The errno of an I/O error made from one (0 for any other).
fn os_errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_error_names_call_args_errno_and_hint() {
        let e = Error::verbs("ibv_reg_mr", "len=4096", libc::ENOMEM, "raise ulimit -l");
        assert_eq!(
            e.to_string(),
            "ibv_reg_mr(len=4096) failed: Cannot allocate memory (errno 12); hint: raise ulimit -l"
        );
        assert_eq!(e.errno(), Some(libc::ENOMEM));
        assert_eq!(e.hint(), Some("raise ulimit -l"));
    }

    #[test]
    fn negative_errno_is_normalised() {
        let e = Error::verbs("ibv_modify_qp", "", -libc::EINVAL, Hint::NONE);
        assert_eq!(e.errno(), Some(libc::EINVAL));
        assert!(
            e.to_string().ends_with("Invalid argument (errno 22)"),
            "{e}"
        );
    }

    #[test]
    fn missing_access_names_the_flags() {
        let e = Error::MissingAccess {
            call: "post_send",
            needed: crate::mr::AccessFlags::LOCAL_WRITE,
            have: crate::mr::AccessFlags::REMOTE_READ | crate::mr::AccessFlags::REMOTE_WRITE,
            hint: Hint::NONE,
        };
        assert_eq!(
            e.to_string(),
            "post_send: the NIC writes this local region but it was registered without LOCAL_WRITE (it has REMOTE_WRITE | REMOTE_READ)"
        );
    }

    #[test]
    fn device_not_found_lists_what_exists() {
        let e = Error::DeviceNotFound {
            wanted: "mlx5_9".into(),
            available: vec![],
            hint: Hint::new("load rdma_rxe"),
        };
        assert_eq!(
            e.to_string(),
            "no RDMA device matches \"mlx5_9\" (available: none); hint: load rdma_rxe"
        );
    }
}
