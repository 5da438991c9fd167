//! The core's I/O on gdr: queue pairs per lane, posts, receive slots, renewals, and what a core
//! call leaves for the connection to do once it let go of the core ([`Deferred`]).
//!
//! Every lane keeps its current queue pair and, during a renewal, the offered one (each known
//! by the generation the core gave it). A queue pair the core destroys is routed nowhere at
//! once (gdr drops completions of destroyed queue pairs) and destroyed at the end of the core
//! call, before any outcome reported in that call is made visible: so when a caller sees an
//! outcome, `ibv_destroy_qp` has returned for every queue pair that carried the transfer's
//! requests without completing them.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use gdr::mr::RemoteSlice;
use gdr::qp::{BatchOp, Endpoint, QueuePair, RdmaPiece};
use gdr::wr::SendRequest;
use gdr_xfer_proto::{
    ConnId, Control, Event, Header, Io, LaneRef, Op, Outcome, Pieces, PostResult, Receipt,
};

use crate::error::{Error, Foreign, Hint};
use crate::notify::{NoteQueue, NotifyPool, SlotOwner};
use crate::rail::Rails;
use crate::segment::SegmentInner;
use crate::transfer::TransferCell;

/// A batch of RDMA requests, in gdr's own form (nothing converted when it is posted).
#[derive(Default)]
pub(crate) struct Batch(pub(crate) Vec<RdmaPiece>);

impl Pieces for Batch {
    fn clear(&mut self) {
        self.0.clear();
    }

    #[inline]
    fn push(
        &mut self,
        local_offset: u64,
        remote_addr: u64,
        len: u64,
        rkey: u32,
        wr_id: u64,
    ) -> bool {
        let Some(remote) = RemoteSlice::new(remote_addr, len, rkey) else {
            return false;
        };
        let Ok(offset) = usize::try_from(local_offset) else {
            return false;
        };
        self.0.push(RdmaPiece {
            offset,
            remote,
            wr_id,
        });
        true
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// What a core call left to do ([`gdr_xfer_proto::Action`]), taken from the core in its order
/// while it is locked and carried out in that order once it is unlocked.
pub(crate) enum Deferred {
    /// Queue pairs the core destroyed, already out of the lanes and routed nowhere: dropping
    /// them destroys them (`ibv_destroy_qp`).
    Destroyed(Vec<QueuePair>),
    /// A transfer's outcome.
    Finished(Arc<TransferCell>, Outcome),
    /// A notification for the application.
    Delivered(Vec<u8>, Receipt),
    /// A control message for the peer.
    Control(Control<Vec<Endpoint>>),
}

/// Where the lanes route the queue pairs they make and destroy: the agent's endpoint
/// ([`gdr_xfer_proto::Endpoint`]) under its lock. The lanes hold it weakly (it holds their
/// connection) and know nothing else of the agent.
pub(crate) trait Routing: Send + Sync {
    /// Routes rail `rail`'s queue pairs `(number, lane)` to connection `id`.
    fn route(&self, rail: usize, id: ConnId, qps: &[(u32, LaneRef)]);
    /// Forgets the routes of destroyed queue pairs `(rail, number, lane)` of connection `id`
    /// (those still naming them: a reused number routed anew keeps its route).
    fn unroute(&self, id: ConnId, qps: &[(usize, u32, LaneRef)]);
}

impl<C: Clone + Send, S: Send> Routing for Mutex<gdr_xfer_proto::Endpoint<C, S>> {
    fn route(&self, rail: usize, id: ConnId, qps: &[(u32, LaneRef)]) {
        let mut e = self.lock().unwrap_or_else(|p| p.into_inner());
        for &(n, lane) in qps {
            e.route(rail, n, id, lane);
        }
    }

    fn unroute(&self, id: ConnId, qps: &[(usize, u32, LaneRef)]) {
        let mut e = self.lock().unwrap_or_else(|p| p.into_inner());
        for &(rail, n, lane) in qps {
            e.unroute(rail, n, id, lane);
        }
    }
}

/// The queue pairs of one connection and its notification buffers: the core's [`Io`].
pub(crate) struct Lanes {
    pub(crate) peer: String,
    /// The connection's number in the agent's endpoint, once admitted (its queue pairs are
    /// routed under it).
    pub(crate) id: Arc<OnceLock<ConnId>>,
    /// The agent's rails, to make queue pairs on.
    pub(crate) rails: Arc<Rails>,
    /// The agent's endpoint, to route the queue pairs made and destroyed (held weakly: it
    /// holds the connection).
    pub(crate) endpoint: Weak<dyn Routing>,
    /// The agent's notifications: its bound decides whether a slot may be buffered or armed.
    pub(crate) notes: Arc<NoteQueue>,
    /// The connection, for the notification queue to post its slots again once the bound
    /// lets it ([`NoteQueue::may_arm`]).
    pub(crate) conn: Weak<dyn SlotOwner>,
    pub(crate) per_rail: usize,
    /// Per lane, its queue pairs by generation (the current one, and an offered one during a
    /// renewal).
    pub(crate) qps: Vec<Vec<(u64, QueuePair)>>,
    pub(crate) notify: Vec<NotifyPool>,
    /// The connection's part of the agent's notification bound.
    pub(crate) ledger: Arc<crate::notify::SlotLedger>,
    pub(crate) batch: Batch,
}

impl Lanes {
    /// A post on a lane without that queue pair (destroyed, or never made): the lane is broken.
    fn no_qp(lane: LaneRef) -> PostResult<Error> {
        PostResult::Broken {
            posted: 0,
            error: Self::no_qp_error(lane),
        }
    }

    /// A lane without a queue pair of its generation (destroyed, or never made).
    fn no_qp_error(lane: LaneRef) -> Error {
        Error::invalid(
            format!(
                "lane {} has no queue pair of generation {}",
                lane.lane, lane.gen
            ),
            "the engine names only queue pairs it made (a bug in gdr-xfer if seen)",
        )
    }

    fn qp(&self, lane: LaneRef) -> Option<&QueuePair> {
        self.qps
            .get(lane.lane)?
            .iter()
            .find(|(g, _)| *g == lane.gen)
            .map(|(_, q)| q)
    }

    /// The queue pair numbers of the lanes' current queue pairs (`lanes`: the core's view).
    pub(crate) fn qp_nums(&self, lanes: &[Option<LaneRef>]) -> Vec<u32> {
        lanes
            .iter()
            .flatten()
            .filter_map(|l| self.qp(*l).map(QueuePair::qp_num))
            .collect()
    }
}

/// How a gdr error refusing a post maps to the core's view: the request's own fault (nothing
/// posted), a full queue (nothing posted), or a broken queue pair.
fn post_error(e: gdr::Error) -> PostResult<Error> {
    match e {
        gdr::Error::InvalidArgument { .. } | gdr::Error::OutOfBounds { .. } => {
            PostResult::Rejected(Error::Gdr(e))
        }
        gdr::Error::QueueFull { .. } => PostResult::Full,
        e => PostResult::Broken {
            posted: 0,
            error: Error::Gdr(e),
        },
    }
}

impl Io for Lanes {
    type Local = Arc<SegmentInner>;
    type Handle = Arc<TransferCell>;
    type Endpoints = Vec<Endpoint>;
    type Pieces = Batch;
    type Error = Error;

    #[inline]
    fn pieces(&mut self) -> &mut Batch {
        &mut self.batch
    }

    fn post_rdma(&mut self, lane: LaneRef, op: Op, local: &Arc<SegmentInner>) -> PostResult<Error> {
        let rail = lane.lane / self.per_rail;
        let Some(qp) = self.qp(lane) else {
            return Self::no_qp(lane);
        };
        let Some(slice) = local.whole.get(rail) else {
            return PostResult::Rejected(Error::ForeignObject {
                call: "posting on a rail",
                object: Foreign::Segment(local.info.id),
                hint: Hint::new(
                    "the segment is not registered on this rail: it belongs to another agent, or is staged",
                ),
            });
        };
        let op = match op {
            Op::Write => BatchOp::Write,
            Op::Read => BatchOp::Read,
        };
        match qp.post_rdma_batch(op, slice, &self.batch.0) {
            Ok(()) => PostResult::Posted,
            Err(e) => post_error(e),
        }
    }

    fn post_message(
        &mut self,
        lane: LaneRef,
        wr_id: u64,
        slot: u16,
        header: Header,
        data: &[u8],
    ) -> PostResult<Error> {
        let rail = lane.lane / self.per_rail;
        let Some(pool) = self.notify.get(rail) else {
            return PostResult::Rejected(Error::invalid(
                format!("no notification buffers on rail {rail}"),
                "the engine posts messages only on its rails (a bug in gdr-xfer if seen)",
            ));
        };
        let staged = match pool.stage(slot, header, data) {
            Ok(s) => s,
            Err(e) => return PostResult::Rejected(e),
        };
        let Some(qp) = self.qp(lane) else {
            return Self::no_qp(lane);
        };
        match qp.post_send(&SendRequest::send(&[staged]).id(wr_id)) {
            Ok(()) => PostResult::Posted,
            Err(e) => post_error(e),
        }
    }

    fn buffer_notification(&mut self) -> bool {
        // The agent's bound across its connections.
        self.notes.try_buffer()
    }

    fn may_arm_recv(&mut self) -> bool {
        self.notes.may_arm(&self.ledger, &self.conn)
    }

    fn arm_recv(&mut self, lane: LaneRef, slot: u16) -> Result<(), Error> {
        let rail = lane.lane / self.per_rail;
        let qp = self.qp(lane).ok_or_else(|| Self::no_qp_error(lane))?;
        let pool = self.notify.get(rail).ok_or_else(|| {
            Error::invalid(
                format!("no notification buffers on rail {rail}"),
                "the engine arms slots only on its rails (a bug in gdr-xfer if seen)",
            )
        })?;
        pool.post_recv(qp, lane.gen, slot)
    }

    fn create_lanes(&mut self, rail: usize, lanes: &[LaneRef]) -> Result<Vec<Endpoint>, Error> {
        let endpoint = self.endpoint.upgrade().ok_or(Error::AgentClosed)?;
        let qps = self.rails.create_qps(rail, lanes.len())?;
        let endpoints = qps.iter().map(QueuePair::endpoint).collect();
        // Routed before anything can complete on them (once admitted: before, the connection
        // has no queue pair but its first, which admission routes).
        if let Some(&id) = self.id.get() {
            let nums: Vec<(u32, LaneRef)> = qps
                .iter()
                .map(QueuePair::qp_num)
                .zip(lanes.iter().copied())
                .collect();
            endpoint.route(rail, id, &nums);
        }
        for (l, qp) in lanes.iter().zip(qps) {
            if let Some(slot) = self.qps.get_mut(l.lane) {
                slot.push((l.gen, qp));
            }
        }
        Ok(endpoints)
    }

    fn connect_lanes(
        &mut self,
        _rail: usize,
        lanes: &[LaneRef],
        remote: &Vec<Endpoint>,
    ) -> Result<(), Error> {
        for (l, e) in lanes.iter().zip(remote) {
            let qp = self.qp(*l).ok_or_else(|| Self::no_qp_error(*l))?;
            qp.connect(e)?;
        }
        Ok(())
    }

    fn endpoint_count(&self, endpoints: &Vec<Endpoint>) -> usize {
        endpoints.len()
    }
}

impl Lanes {
    /// Takes the queue pairs of `lanes` out of the lanes and routes them nowhere (the core
    /// destroyed them, [`gdr_xfer_proto::Action::DestroyLanes`]); dropping them destroys them.
    pub(crate) fn take_destroyed(&mut self, lanes: &[LaneRef]) -> Vec<QueuePair> {
        let mut gone = Vec::with_capacity(lanes.len());
        for l in lanes {
            let Some(slot) = self.qps.get_mut(l.lane) else {
                continue;
            };
            if let Some(i) = slot.iter().position(|(g, _)| *g == l.gen) {
                let (_, qp) = slot.swap_remove(i);
                gone.push((l.lane / self.per_rail, *l, qp));
            }
        }
        if let (Some(endpoint), Some(&id)) = (self.endpoint.upgrade(), self.id.get()) {
            let nums: Vec<(usize, u32, LaneRef)> = gone
                .iter()
                .map(|(rail, lane, qp)| (*rail, qp.qp_num(), *lane))
                .collect();
            endpoint.unroute(id, &nums);
        }
        gone.into_iter().map(|(_, _, qp)| qp).collect()
    }

    /// Logs an event of the core ([`gdr_xfer_proto::Action::Event`]).
    pub(crate) fn log(&self, event: Event) {
        let p = &self.peer;
        match event {
            Event::RailPaused { rail, why, requeued } => {
                log::warn!("peer {p}: rail {rail} paused ({requeued} requests to post again): {why}")
            }
            Event::NoRail { rails } => log::warn!("peer {p}: no rail left: {rails}"),
            Event::Renewing { rail, epoch, fence } => log::info!(
                "peer {p}: renewing rail {rail}, epoch {epoch}{}",
                if fence { " (fence)" } else { "" }
            ),
            Event::RenewedByPeer { rail, epoch } => {
                log::info!("peer {p}: rail {rail} renewed at the peer's request (epoch {epoch})")
            }
            Event::RenewalFailed { rail, why } => log::warn!("peer {p}: renewing rail {rail}: {why}"),
            Event::Readmitted { rail } => {
                log::info!("peer {p}: rail {rail} re-admitted after a successful probe")
            }
            Event::Fenced { transfer, rails } => log::warn!(
                "peer {p}: transfer {transfer:?} stopped with requests still in flight after the quiesce time: fencing rails {rails:#b}"
            ),
            Event::Ignored { what } => log::warn!("peer {p}: ignored {what}"),
            Event::RearmFailed { lane, error } => {
                log::error!("peer {p}: posting a notification slot on lane {}: {error}", lane.lane)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lanes' routes go into the endpoint they were given, under their connection's
    /// number, and an unroute of a number reused since leaves the newer route alone.
    #[test]
    fn the_lanes_route_and_unroute_through_the_endpoint_they_hold() {
        type E = Mutex<gdr_xfer_proto::Endpoint<&'static str, ()>>;
        let endpoint: Arc<E> = Arc::new(Mutex::new(gdr_xfer_proto::Endpoint::new(1, 2, 4)));
        let (a, b) = {
            let mut e = endpoint.lock().unwrap();
            (
                e.admit("a", "a", &[]).unwrap(),
                e.admit("b", "b", &[]).unwrap(),
            )
        };
        let lane = |lane, gen| LaneRef { lane, gen };
        let routing: Arc<dyn Routing> = endpoint.clone();
        routing.route(1, a, &[(7, lane(2, 5)), (8, lane(3, 5))]);
        // Number 7 was destroyed and given again, to b.
        routing.route(1, b, &[(7, lane(0, 9))]);
        routing.unroute(a, &[(1, 7, lane(2, 5)), (1, 8, lane(3, 5))]);
        let e = endpoint.lock().unwrap();
        assert_eq!(e.lookup(1, 7), Some((&"b", lane(0, 9))));
        assert_eq!(e.lookup(1, 8), None);
        assert_eq!(e.lookup(0, 7), None, "rail 0 is another completion queue");
        drop(e);
        // Held weakly: once the agent lets go of its endpoint, the lanes route nothing.
        let weak: Weak<dyn Routing> = Arc::downgrade(&routing);
        drop((routing, endpoint));
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn a_refused_post_keeps_gdrs_error_as_it_was() {
        let e = gdr::Error::OutOfBounds {
            what: "local slice of write".into(),
            offset: 4096,
            len: 8192,
            limit: 8192,
            hint: gdr::Hint::NONE,
        };
        let PostResult::Rejected(Error::Gdr(gdr::Error::OutOfBounds { offset, len, .. })) =
            post_error(e)
        else {
            panic!("an out-of-bounds post is the request's own fault");
        };
        assert_eq!((offset, len), (4096, 8192));
        let e = gdr::Error::verbs("ibv_post_send", "qp 0x11", libc::EINVAL, gdr::Hint::NONE);
        assert!(matches!(
            post_error(e),
            PostResult::Broken {
                posted: 0,
                error: Error::Gdr(gdr::Error::Verbs { .. })
            }
        ));
        // What the core keeps of it: the same error, downcast back.
        let kept = gdr_xfer_proto::DriverError::new(Error::Gdr(gdr::Error::invalid(
            "a range",
            gdr::Hint::NONE,
        )));
        assert!(matches!(
            kept.downcast_ref::<Error>(),
            Some(Error::Gdr(gdr::Error::InvalidArgument { .. }))
        ));
    }
}
