//! The I/O boundary: what the core asks its driver to do and what the driver tells the core
//! (completions, control messages, time).
//!
//! The core never calls the operating system, a device or a clock. The I/O whose answer it
//! needs at once (a post, queue pairs made and connected, a receive slot posted, the driver's
//! bounds) it performs through its driver's [`Io`], synchronously and in order; everything
//! else (queue pairs destroyed, control messages, outcomes, notifications, events) it leaves
//! in its action queue, in order, for the driver to carry out after the call
//! ([`crate::Connection::poll_action`], [`Action`]). Everything else the core needs arrives as
//! arguments (`now`, completions). The driver in `gdr-xfer` implements [`Io`] with gdr's queue
//! pairs; the simulation ([`crate::sim`]) implements it with simulated ones, and both carry out
//! the same actions in the same order.

use crate::control::Control;
use crate::fault::{DriverError, RailFault, RailReports};
use crate::transfer::{Outcome, TransferKey};

/// One queue pair incarnation of a lane: the lane's index in the connection (rail-major, `rail *
/// lanes_per_rail + i`) and the generation the core gave the queue pair. A generation is never
/// reused on a connection, so a completion of a destroyed queue pair is recognised as stale even
/// when its number was reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaneRef {
    /// The lane.
    pub lane: usize,
    /// The queue pair's generation.
    pub gen: u64,
}

/// The result of a post (`E`: the driver's error, [`Io::Error`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostResult<E> {
    /// Every request was posted.
    Posted,
    /// Nothing was posted: the send queue had no room (try again after a completion).
    Full,
    /// Nothing was posted because the request itself is wrong (memory of another protection
    /// domain, a range outside its registration): only its transfer fails.
    Rejected(E),
    /// The queue pair is broken (the provider refused a request, or it is not ready): the first
    /// `posted` requests went and complete as usual; the lane's rail fails.
    Broken {
        /// Requests of the batch that were posted.
        posted: usize,
        /// What the provider said.
        error: E,
    },
}

/// Where the core writes the requests of one batch before [`Io::post_rdma`] posts them: the
/// driver's own representation, so that nothing is converted per request.
pub trait Pieces {
    /// Empties it.
    fn clear(&mut self);
    /// Appends one request of `len` bytes between `local_offset` of the batch's local segment
    /// and `remote_addr`. Returns `false` when the remote range overflows (the request is not
    /// added).
    fn push(
        &mut self,
        local_offset: u64,
        remote_addr: u64,
        len: u64,
        rkey: u32,
        wr_id: u64,
    ) -> bool;
    /// Requests in it.
    fn len(&self) -> usize;
    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The direction of a one-sided transfer, seen from the initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Local memory is written into the peer's memory (RDMA WRITE).
    Write,
    /// The peer's memory is read into local memory (RDMA READ).
    Read,
}

/// The first bytes of every message sent on a lane (a notification or a probe): flags and the
/// sender's id for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// [`Header::PROBE`] or 0.
    pub flags: u8,
    /// The notification's number on its connection (0 for a probe).
    pub id: u64,
}

impl Header {
    /// Bytes of the header on the wire: flags u8, id u64 (big-endian).
    pub const LEN: usize = 9;
    /// The flag of a rail probe (never delivered to the application).
    pub const PROBE: u8 = 1;

    /// The header's bytes.
    pub fn encode(self) -> [u8; Header::LEN] {
        let mut b = [0u8; Header::LEN];
        b[0] = self.flags;
        b[1..].copy_from_slice(&self.id.to_be_bytes());
        b
    }

    /// Splits a received message into its header and payload; `None` when it is shorter than a
    /// header.
    pub fn decode(msg: &[u8]) -> Option<(Header, &[u8])> {
        let (head, data) = msg.split_at_checked(Header::LEN)?;
        let mut id = [0u8; 8];
        id.copy_from_slice(&head[1..]);
        Some((
            Header {
                flags: head[0],
                id: u64::from_be_bytes(id),
            },
            data,
        ))
    }
}

/// How a send-queue request completed, as far as the core needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// It succeeded.
    Success,
    /// The request itself was wrong (a bad remote key, a protection error): its transfer fails;
    /// posting it elsewhere would fail the same way.
    RequestError,
    /// The queue pair or the path failed (retries exceeded, flushed, ...): its rail fails over.
    LaneError,
}

/// A send-queue completion, as the driver hands it over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendCompletion {
    /// The queue pair it completed on.
    pub lane: LaneRef,
    /// The request's id.
    pub wr_id: u64,
    /// How it completed.
    pub status: Status,
    /// The provider's status code and vendor error, and the queue pair number, for reports.
    pub raw_status: u32,
    /// The provider's vendor error.
    pub vendor_err: u32,
    /// The queue pair's number.
    pub qp_num: u32,
}

/// A receive slot's message, handed back to the core when the application took it, so that the
/// slot is posted again ([`crate::Connection::consumed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    /// The lane the message arrived on.
    pub lane: LaneRef,
    /// Its receive slot.
    pub slot: u16,
    /// Whether the slot waits for the application (the buffer was full when it arrived).
    pub holds: bool,
}

/// Things worth a log line or a counter, reported as [`Action::Event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A rail failed for this peer and was paused; what it carried is posted elsewhere.
    RailPaused {
        /// The rail.
        rail: usize,
        /// Why.
        why: RailFault,
        /// Requests it carried, to post again.
        requeued: u64,
    },
    /// No rail is left: every pending transfer failed.
    NoRail {
        /// Each rail's state and last error.
        rails: RailReports,
    },
    /// New queue pairs were offered to the peer for a rail.
    Renewing {
        /// The rail.
        rail: usize,
        /// The offer's epoch.
        epoch: u32,
        /// Whether it fences a stopped transfer's requests (the rail did not fail).
        fence: bool,
    },
    /// The peer renewed a rail (its offer was accepted).
    RenewedByPeer {
        /// The rail.
        rail: usize,
        /// The offer's epoch.
        epoch: u32,
    },
    /// A renewal failed or was refused or not answered.
    RenewalFailed {
        /// The rail.
        rail: usize,
        /// Why.
        why: RailFault,
    },
    /// A rail's probe succeeded: it carries requests again.
    Readmitted {
        /// The rail.
        rail: usize,
    },
    /// A stopped transfer's requests were still in flight after the quiesce time: the queue
    /// pairs carrying them were destroyed (their other requests are posted again).
    Fenced {
        /// The transfer.
        transfer: TransferKey,
        /// The rails fenced.
        rails: u32,
    },
    /// A control message made no sense (an answer to nothing, a rail we do not share).
    Ignored {
        /// What and why.
        what: String,
    },
    /// A notification slot could not be posted again.
    RearmFailed {
        /// The lane.
        lane: LaneRef,
        /// What the driver said.
        error: DriverError,
    },
}

/// What the core leaves its driver to carry out after a call, in order
/// ([`crate::Connection::poll_action`]): the I/O whose answer the core does not need.
///
/// The order is the promise: a [`Action::DestroyLanes`] comes before every outcome it
/// protects, so a driver that carries out each action before the next one (at the latest
/// before it makes the next one visible) makes no outcome visible while a queue pair that
/// carried the transfer's requests may still touch its memory.
pub enum Action<I: Io + ?Sized> {
    /// Destroy the queue pairs of these lanes: once carried out, the NIC touches none of the
    /// memory their requests used. Their completions are routed nowhere from now on.
    DestroyLanes(Vec<LaneRef>),
    /// Send a control message to the peer.
    SendControl(Control<I::Endpoints>),
    /// A transfer reached its outcome: none of its requests will touch its memory again.
    Finished(I::Handle, Outcome),
    /// A notification from the peer, in arrival order; give the receipt back through
    /// [`crate::Connection::consumed`] once the application took it.
    Deliver(Vec<u8>, Receipt),
    /// Something worth a log line or a counter.
    Event(Event),
}

impl<I: Io + ?Sized> std::fmt::Debug for Action<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::DestroyLanes(l) => f.debug_tuple("DestroyLanes").field(l).finish(),
            Action::SendControl(c) => match c {
                Control::Renew { rail, epoch, .. } => {
                    write!(f, "SendControl(Renew rail {rail} epoch {epoch})")
                }
                Control::Renewed { rail, epoch, .. } => {
                    write!(f, "SendControl(Renewed rail {rail} epoch {epoch})")
                }
                Control::Refused { rail, epoch } => {
                    write!(f, "SendControl(Refused rail {rail} epoch {epoch})")
                }
            },
            Action::Finished(_, o) => f.debug_tuple("Finished").field(&o.result).finish(),
            Action::Deliver(d, r) => write!(f, "Deliver({} bytes, {r:?})", d.len()),
            Action::Event(e) => f.debug_tuple("Event").field(e).finish(),
        }
    }
}

/// The driver of a connection: the I/O whose answers the core needs at once (posts, queue
/// pairs made and connected, receive slots posted, the driver's bounds). Calls happen inside
/// the core's methods, in order; the driver carries each one out before it returns. Everything
/// else the core leaves in its action queue ([`Action`]).
pub trait Io {
    /// A local segment of a transfer (kept by the core until the transfer's outcome).
    type Local;
    /// What the caller observes a transfer through (given back with its outcome).
    type Handle;
    /// One rail's queue pair endpoints, as carried in renewal messages.
    type Endpoints;
    /// The batch under construction.
    type Pieces: Pieces;
    /// What the driver's calls fail with. The core keeps it as the driver made it
    /// ([`DriverError`]) in the outcomes and events it causes.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The batch buffer (the core clears it before each batch).
    fn pieces(&mut self) -> &mut Self::Pieces;
    /// Posts the batch in [`Io::pieces`] on `lane`: `op` between `local` and the peer; only
    /// the last request is signalled.
    fn post_rdma(&mut self, lane: LaneRef, op: Op, local: &Self::Local) -> PostResult<Self::Error>;
    /// Posts a message (header, then `data`) from send slot `slot` on `lane`, as request
    /// `wr_id`.
    fn post_message(
        &mut self,
        lane: LaneRef,
        wr_id: u64,
        slot: u16,
        header: Header,
        data: &[u8],
    ) -> PostResult<Self::Error>;
    /// Posts receive slot `slot` on `lane`.
    ///
    /// # Errors
    /// What failed.
    fn arm_recv(&mut self, lane: LaneRef, slot: u16) -> Result<(), Self::Error>;
    /// A notification arrived and the connection's own bound ([`crate::Config::recv_buffered`])
    /// lets it be kept without holding its receive slot: whether the driver's bound across its
    /// connections lets it too. `true` takes one place of that bound, which the driver gives
    /// back when the application takes the notification (its [`Receipt`] says `holds:
    /// false`); `false` makes it hold its slot until taken, like one over the connection's
    /// bound. The default has no bound of its own.
    fn buffer_notification(&mut self) -> bool {
        true
    }
    /// Whether receive slots may be posted now beyond those given back one for one (a taken
    /// notification's slot, the slots a renewal moves to new queue pairs): the driver's bound
    /// across its connections. When it answers `false`, the slots stay unposted until the
    /// driver calls [`crate::Connection::rearm`]. The default always lets them be posted.
    fn may_arm_recv(&mut self) -> bool {
        true
    }
    /// Creates one queue pair per entry of `lanes` (all of rail `rail`), posts every receive
    /// slot on the first, and returns their endpoints.
    ///
    /// # Errors
    /// What failed (nothing is left created then).
    fn create_lanes(
        &mut self,
        rail: usize,
        lanes: &[LaneRef],
    ) -> Result<Self::Endpoints, Self::Error>;
    /// Connects the queue pairs of `lanes` to the peer's `remote` endpoints, in order.
    ///
    /// # Errors
    /// What failed.
    fn connect_lanes(
        &mut self,
        rail: usize,
        lanes: &[LaneRef],
        remote: &Self::Endpoints,
    ) -> Result<(), Self::Error>;
    /// How many endpoints `endpoints` holds.
    fn endpoint_count(&self, endpoints: &Self::Endpoints) -> usize;
}
