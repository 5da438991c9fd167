//! Which queue pair a completion belongs to: the completion queue's registry of queue pairs, and
//! the tombstones of incarnations whose completions may still be queued (see [`crate::inflight`]
//! for how a completion is attributed).

use std::sync::{Arc, Weak};
use std::task::Waker;

use crate::inflight::{self, decode, Done, InFlight};
use crate::qp::{DropCause, WorkQueue};

/// Who must hear when a queue pair's requests end without completions (the async layer, whose
/// futures wait for them). A completion queue has at most one.
pub(crate) trait Watcher: Send + Sync {
    /// The requests of QP `qp_num`'s `queue` that were in flight ended for `cause`: `in_flight`
    /// yields each one's application `wr_id` and whether the async layer posted it. With
    /// [`DropCause::Destroyed`] nothing of the queue pair can complete any more. Called under
    /// the completion queue's and the queue pair's locks, so no completion, post or poll
    /// interleaves; it must take no lock of theirs, and push the wakers it would wake to `wake`
    /// (the caller wakes them once its locks are released).
    fn requests_dropped(
        &self,
        qp_num: u32,
        queue: WorkQueue,
        cause: DropCause,
        in_flight: &mut dyn Iterator<Item = (u64, bool)>,
        wake: &mut Vec<Waker>,
    );
}

/// Everything a completion queue needs to attribute completions, behind its one lock: polling
/// holds it from `ibv_poll_cq` until every polled completion has retired its request, so two
/// threads polling one queue retire requests in the order the device completed them.
#[derive(Default)]
pub(crate) struct Dispatch {
    /// Queue pairs reporting into this completion queue, by QP number.
    live: Vec<(u32, Arc<InFlight>)>,
    /// (QP number, tag) of incarnations that were destroyed or reset: completions carrying them
    /// may still be queued. Cleared when a poll finds the queue empty (nothing older is left).
    tombstones: Vec<(u32, u32)>,
    /// Completions reaped but not yet handed out (a `wait_for` that timed out puts back what it
    /// had gathered): the next poll returns them first.
    pub(crate) backlog: std::collections::VecDeque<super::Completion>,
    /// The async completion queue delivering this queue's completions, if any.
    pub(crate) watcher: Option<Weak<dyn Watcher>>,
}

/// How a polled completion was attributed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Attribution {
    /// It retired one of a live queue pair's requests.
    Retired(Done),
    /// It belongs to an incarnation that was destroyed or reset: dropped, nothing released.
    Stale,
    /// No live or buried incarnation matches: dropped, nothing released.
    Unknown,
}

impl Dispatch {
    /// The watcher, while it lives.
    pub(crate) fn watcher(&self) -> Option<Arc<dyn Watcher>> {
        self.watcher.as_ref().and_then(Weak::upgrade)
    }

    /// Registers the live incarnation of `qpn`.
    pub(crate) fn register(&mut self, qpn: u32, inflight: Arc<InFlight>) {
        self.live.retain(|(q, _)| *q != qpn);
        self.live.push((qpn, inflight));
    }

    /// Removes `qpn` (destroyed); buries its incarnation `tag` when completions of it may still
    /// be queued (`Some`: requests were in flight).
    pub(crate) fn unregister(&mut self, qpn: u32, tag: Option<u32>) {
        self.live.retain(|(q, _)| *q != qpn);
        if let Some(tag) = tag {
            self.bury(qpn, tag);
        }
    }

    /// How many incarnations are buried (for tests).
    #[cfg(test)]
    pub(crate) fn buried(&self) -> usize {
        self.tombstones.len()
    }

    /// Remembers that completions of `(qpn, tag)` may still be queued.
    pub(crate) fn bury(&mut self, qpn: u32, tag: u32) {
        if !self.is_buried(qpn, tag) {
            self.tombstones.push((qpn, tag));
        }
    }

    /// Whether completions of `(qpn, tag)` may still be queued.
    pub(crate) fn is_buried(&self, qpn: u32, tag: u32) -> bool {
        self.tombstones.contains(&(qpn, tag))
    }

    /// The queue was found empty: every completion of a buried incarnation has been consumed.
    pub(crate) fn drained(&mut self) {
        self.tombstones.clear();
    }

    /// Attributes a completion of QP `qpn` with provider id `wr_id`.
    pub(crate) fn attribute(&self, qpn: u32, wr_id: u64) -> Attribution {
        if let Some((_, f)) = self.live.iter().find(|(q, _)| *q == qpn) {
            if let Some(done) = f.complete(wr_id) {
                return Attribution::Retired(done);
            }
        }
        if self.is_buried(qpn, decode(wr_id).tag) {
            Attribution::Stale
        } else {
            Attribution::Unknown
        }
    }

    /// A tag for a new incarnation of `qpn` that no queued completion carries, in every one of
    /// `queues`.
    pub(crate) fn new_tag(queues: &[&Dispatch], qpn: u32) -> crate::Result<u32> {
        inflight::new_tag(qpn, |t| queues.iter().any(|d| d.is_buried(qpn, t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inflight::{encode, lock};

    fn qp(tag: u32) -> Arc<InFlight> {
        Arc::new(InFlight::new(tag, 8, 1, 8, 1))
    }

    /// Posts one signalled request on `f`'s send queue; returns its provider id.
    fn post(f: &InFlight, user: u64) -> u64 {
        let mut r = lock(&f.send);
        let seq = r.stage(0, user, true, std::iter::empty());
        r.commit(true);
        r.provider_id(seq)
    }

    #[test]
    fn a_reused_qp_number_never_receives_the_old_incarnations_completions() {
        let mut d = Dispatch::default();
        // QP 17, first incarnation: one request completes but is not polled before the destroy.
        let tag_a = Dispatch::new_tag(&[&d], 17).unwrap();
        let a = qp(tag_a);
        d.register(17, a.clone());
        let stale = post(&a, 1);
        d.unregister(17, Some(tag_a));
        // The provider reuses number 17. Its new incarnation posts; sequence numbers restart.
        let tag_b = Dispatch::new_tag(&[&d], 17).unwrap();
        assert_ne!(tag_b, tag_a);
        let b = qp(tag_b);
        d.register(17, b.clone());
        let live = post(&b, 2);
        assert_eq!(
            decode(stale).seq,
            decode(live).seq,
            "the same sequence number"
        );
        // The stale completion is polled first: it must not retire B's request.
        assert_eq!(d.attribute(17, stale), Attribution::Stale);
        assert_eq!(
            lock(&b.send).outstanding(),
            1,
            "B's request is still in flight"
        );
        assert_eq!(
            d.attribute(17, live),
            Attribution::Retired(Done {
                user_wr_id: 2,
                user_signaled: true,
                queue: WorkQueue::Send,
                owned: false,
            })
        );
        assert_eq!(lock(&b.send).outstanding(), 0);
    }

    #[test]
    fn tags_of_buried_incarnations_are_not_reused_until_the_queue_drains() {
        let mut d = Dispatch::default();
        let other = Dispatch::default();
        let t = Dispatch::new_tag(&[&d, &other], 3).unwrap();
        d.bury(3, t);
        for _ in 0..1000 {
            assert_ne!(Dispatch::new_tag(&[&d, &other], 3).unwrap(), t);
        }
        assert!(d.is_buried(3, t));
        d.drained();
        assert!(!d.is_buried(3, t));
    }

    #[test]
    fn only_queue_pairs_with_requests_in_flight_leave_tombstones() {
        let mut d = Dispatch::default();
        for qpn in 0..10_000u32 {
            d.register(qpn, qp(1));
            d.unregister(qpn, None);
        }
        assert_eq!(
            d.buried(),
            0,
            "idle queue pairs destroyed on a never-polled queue"
        );
        d.register(1, qp(2));
        d.unregister(1, Some(2));
        assert_eq!(d.buried(), 1);
    }

    #[test]
    fn completions_nobody_posted_release_nothing() {
        let mut d = Dispatch::default();
        let f = qp(9);
        d.register(5, f.clone());
        let id = post(&f, 1);
        // Unknown QP number, wrong tag, wrong queue, never-posted sequence number.
        assert_eq!(d.attribute(6, id), Attribution::Unknown);
        assert_eq!(
            d.attribute(5, encode(WorkQueue::Send, 10, 0)),
            Attribution::Unknown
        );
        assert_eq!(
            d.attribute(5, encode(WorkQueue::Recv, 9, 0)),
            Attribution::Unknown
        );
        assert_eq!(
            d.attribute(5, encode(WorkQueue::Send, 9, 1)),
            Attribution::Unknown
        );
        assert_eq!(d.attribute(5, u64::MAX), Attribution::Unknown);
        assert_eq!(lock(&f.send).outstanding(), 1, "still in flight");
        assert!(matches!(d.attribute(5, id), Attribution::Retired(_)));
    }
}
