//! The events of the simulation and their order in its queue (time, then insertion).

use super::*;

/// Everything that happens in the simulation.
#[derive(Debug)]
pub(crate) enum Ev {
    Exec {
        qp: usize,
        token: u64,
    },
    Arrive {
        qp: usize,
        token: u64,
        payload: Payload,
        lose_ack: bool,
        xfer: Option<usize>,
    },
    Ack {
        qp: usize,
        token: u64,
        data: Option<Vec<u8>>,
    },
    Fail {
        qp: usize,
        token: u64,
        status: Status,
    },
    Cqe {
        agent: usize,
        peer: usize,
        c: SendCompletion,
    },
    Recv {
        agent: usize,
        peer: usize,
        /// The queue pair it completed on (the endpoint routes it by its number).
        qp: usize,
        lane: LaneRef,
        slot: u16,
        msg: Option<Vec<u8>>,
    },
    Timer {
        agent: usize,
        peer: usize,
    },
    /// `agent`'s progress threads poll (while a connection it let go drains).
    Poll {
        agent: usize,
    },
    Control {
        from: usize,
        to: usize,
        /// The incarnation of the connection it was sent on (a later connection between the
        /// same agents has its own control link: it never sees this one's messages).
        inc: u32,
        /// The encoded [`crate::wire::Message`].
        bytes: Vec<u8>,
    },
    Submit {
        agent: usize,
        peer: usize,
        left: u32,
    },
    Cancel {
        xfer: usize,
    },
    /// The application's post thread posts what `agent` queued for `peer`.
    PostQueued {
        agent: usize,
        peer: usize,
    },
    Consume {
        agent: usize,
        peer: usize,
    },
    /// A random ready queue pair's head request waits until `until` from now.
    Stall {
        until: Duration,
    },
    /// A random ready queue pair's next request fails.
    Doom,
    Deregister {
        agent: usize,
        seg: usize,
    },
    /// `agent` is handed another agent's segments, and a stale handle of its own, by calls
    /// that deregister and carve ([`super::locals`]): each must be refused, nothing changed.
    ForeignCalls {
        agent: usize,
    },
    LinkDown {
        rail: usize,
        up_after: Duration,
    },
    LinkUp {
        rail: usize,
    },
    Kill {
        agent: usize,
    },
    /// The faults heal: the liveness phase begins.
    Heal,
    /// `agent` disconnects from `peer` (a goodbye).
    Leave {
        agent: usize,
        peer: usize,
    },
    /// `a` connects to `b` again, once both let their last connection go.
    Join {
        a: usize,
        b: usize,
    },
    Lost {
        agent: usize,
        peer: usize,
    },
    /// A copy of `agent`'s stager (GPU to bounce buffer, or back) completes.
    CopyDone {
        agent: usize,
        copy: u64,
    },
    /// `agent`'s staging driver runs its jobs.
    StageStep {
        agent: usize,
    },
}

pub(super) struct Scheduled {
    pub(super) at: Duration,
    pub(super) seq: u64,
    pub(super) ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}
