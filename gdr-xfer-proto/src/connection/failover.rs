//! Rail failures, fences and the retirement of queue pairs.
//!
//! An error completion on a lane (link down, retries exceeded, a flushed request), or a post
//! the driver reports broken, fails that lane's rail for this peer: the rail is paused, its
//! queue pairs are destroyed at once (after which the NIC no longer touches their memory), and
//! every range they carried that was not credited is queued to be posted again, first, on the
//! other active rails (writes and reads of the same bytes: idempotent). A notification in
//! flight there is sent again; the target drops a repeat by its id.
//!
//! A request error (a bad remote key, a protection error) fails only the transfer it belongs
//! to; its queue pair is in error, so the rail is renewed at once, like a fence: not paused,
//! no error counted, the other transfers' requests posted again on the new queue pairs.
//!
//! When no rail has been usable (active, or being renewed by a fence) for a quiesce time,
//! every transfer fails with [`Failure::NoRail`]; until then they wait, since a rail may come
//! back (our renewal after its cool-down, or the peer's: a request error on the peer's side
//! breaks the queue pairs both sides share, and ours then see their retries exceeded). The
//! connection stays, and rails come back after their cool-down.

use std::time::Instant;

use super::Connection;
use crate::fault::RailFault;
use crate::io::{Action, Event, Io, LaneRef, SendCompletion, Status};
use crate::lane::Posted;
use crate::rail::RailLink;
use crate::transfer::{Failure, NotifyState, Phase, TransferKey};

impl<I: Io> Connection<I> {
    /// Rail `rail` failed (`cause`: the error completion, if one).
    pub(crate) fn rail_failed(
        &mut self,
        now: Instant,
        io: &mut I,
        rail: usize,
        cause: Option<SendCompletion>,
        why: RailFault,
    ) {
        if self.is_closed() {
            return;
        }
        if let Some(c) = cause.filter(|c| c.status == Status::RequestError) {
            // The request's own fault: fail its transfer, renew the rail at once.
            let failure = Failure::SliceFailed {
                qp_num: c.qp_num,
                status: c.raw_status,
                vendor_err: c.vendor_err,
            };
            let culprit = self.lanes[c.lane.lane]
                .posted
                .iter()
                .find(|r| r.last() >= c.wr_id)
                .and_then(Posted::transfer);
            if let Some(key) = culprit {
                self.stop(now, key, failure);
            }
            if self.rails[rail].is_active() {
                self.renew_now(now, io, rail);
                return;
            }
        }
        let gone = self.lanes[rail * self.cfg.lanes_per_rail..(rail + 1) * self.cfg.lanes_per_rail]
            .iter()
            .all(|l| l.gen.is_none());
        if self.rails[rail].state == crate::rail::RailState::Paused && gone {
            return;
        }
        self.rails[rail].pause(now, why.clone());
        self.drop_offer(rail);
        let requeued = self.retire_lanes(now, rail, None);
        if requeued > 0 {
            self.rails[rail].failed_at = Some(now);
        }
        self.rails[rail].stats.retries += requeued;
        self.actions.push_back(Action::Event(Event::RailPaused {
            rail,
            why,
            requeued,
        }));
        self.check_rails(now);
    }

    /// Notes when no rail is usable any more, and fails every transfer once none has been for
    /// a quiesce time (a rail that comes back meanwhile, renewed by us or by the peer, carries
    /// them on).
    pub(crate) fn check_rails(&mut self, now: Instant) {
        if self.rails.iter().any(RailLink::is_usable) {
            self.no_rail_since = None;
            self.no_rail_failed = false;
            return;
        }
        let since = *self.no_rail_since.get_or_insert(now);
        if now < since + self.cfg.quiesce || self.transfers.len() == 0 || self.no_rail_failed {
            return;
        }
        self.no_rail_failed = true;
        let rails = self.rail_reports();
        self.actions.push_back(Action::Event(Event::NoRail {
            rails: rails.clone(),
        }));
        self.fail_all(now, &Failure::NoRail { rails });
    }

    /// Destroys rail `rail`'s queue pairs (through the driver) and queues what they carried
    /// to be posted again; what stopped transfers had on them is forgotten (they may finish
    /// now). `bad`: a completion whose transfer is failing (its requests are not posted
    /// again). Returns the requests queued again.
    pub(crate) fn retire_lanes(
        &mut self,
        now: Instant,
        rail: usize,
        bad: Option<TransferKey>,
    ) -> u64 {
        let w = self.cfg.lanes_per_rail;
        let mut refs: Vec<LaneRef> = Vec::new();
        let mut again: Vec<TransferKey> = Vec::new();
        let mut settle: Vec<TransferKey> = Vec::new();
        let mut requeued = 0;
        let mut bytes = 0;
        for li in rail * w..(rail + 1) * w {
            let lane = &mut self.lanes[li];
            if let Some(gen) = lane.gen.take() {
                refs.push(LaneRef { lane: li, gen });
            }
            lane.outstanding = 0;
            lane.full = false;
            for rec in lane.posted.drain(..) {
                if let Posted::Slices { bytes: b, .. } = rec {
                    bytes += b;
                }
                let Some(key) = rec.transfer() else {
                    continue;
                };
                let Some(t) = self.transfers.get_mut(key) else {
                    continue;
                };
                t.inflight = t.inflight.saturating_sub(rec.count());
                let towards_peer = match rec {
                    Posted::Slices { .. } => t.op == crate::io::Op::Write,
                    Posted::Notify { .. } => true,
                    Posted::Probe { .. } => false,
                };
                if towards_peer {
                    // They may still be on the wire towards the peer's memory (or its
                    // notification slots).
                    t.awaiting_peer |= 1 << rail.min(31);
                    t.quiet_at = Some(now + self.cfg.quiesce);
                }
                if !t.is_active() || bad == Some(key) {
                    settle.push(key);
                    continue;
                }
                match rec {
                    Posted::Slices { from, to, .. } => {
                        t.retry.push((from, to));
                        t.retried_slices += rec.count();
                        requeued += rec.count();
                        if !t.queued {
                            t.queued = true;
                            again.push(key);
                        }
                    }
                    Posted::Notify { .. } => {
                        t.notify_state = NotifyState::Waiting;
                        self.notify_due.push_front(key);
                    }
                    Posted::Probe { .. } => {}
                }
            }
        }
        let r = &mut self.rails[rail].stats;
        r.inflight_bytes = r.inflight_bytes.saturating_sub(bytes);
        // The receive slots were posted on the first of them (unless a renewal's new queue
        // pairs have them already).
        let recv = &mut self.recv[rail];
        if refs.iter().any(|l| recv.gen == Some(l.gen)) {
            recv.gen = None;
            recv.armed.iter_mut().for_each(|a| *a = false);
        }
        if !refs.is_empty() {
            self.actions.push_back(Action::DestroyLanes(refs.clone()));
        }
        // Oldest first, ahead of what waits to be posted for the first time.
        for key in again.into_iter().rev() {
            self.pending.push_front(key);
        }
        settle.sort_unstable();
        settle.dedup();
        for key in settle {
            self.try_finish(now, key);
        }
        requeued
    }

    /// Renews an active rail at once without counting a failure (a fence, or a queue pair a
    /// request error broke): its queue pairs are destroyed, what they carried is queued again,
    /// and new ones are offered to the peer.
    pub(crate) fn renew_now(&mut self, now: Instant, io: &mut I, rail: usize) {
        let requeued = self.retire_lanes(now, rail, None);
        let r = &mut self.rails[rail];
        r.stats.retries += requeued;
        r.stats.fences += 1;
        if requeued > 0 {
            r.failed_at = Some(now);
        }
        self.offer(now, io, rail, true);
    }

    /// A stopped transfer's requests outlived the quiesce time: the rails carrying them are
    /// renewed at once ([`Connection::renew_now`]), which destroys the queue pairs (a WRITE then
    /// waits for the peer's side, [`Connection::rail_quiet`], or one more quiesce time).
    pub(crate) fn fence(&mut self, now: Instant, io: &mut I, key: TransferKey) {
        let w = self.cfg.lanes_per_rail;
        let mut rails = 0u32;
        for (li, lane) in self.lanes.iter().enumerate() {
            if lane.posted.iter().any(|r| r.transfer() == Some(key)) {
                rails |= 1 << (li / w).min(31);
            }
        }
        let Some(t) = self.transfers.get_mut(key) else {
            return;
        };
        if let Phase::Stopping { fenced, .. } = &mut t.phase {
            *fenced = true;
        }
        self.actions.push_back(Action::Event(Event::Fenced {
            transfer: key,
            rails,
        }));
        for rail in 0..self.cfg.rails.min(32) {
            if rails & (1 << rail) != 0 {
                if self.rails[rail].is_active() {
                    self.renew_now(now, io, rail);
                } else {
                    self.retire_lanes(now, rail, None);
                }
            }
        }
        self.check_rails(now);
    }

    /// The peer confirmed that its side of rail `rail`'s old queue pairs is gone (it made a
    /// renewal, or answered ours): transfers waiting for that may finish.
    pub(crate) fn rail_quiet(&mut self, now: Instant, rail: usize) {
        if rail >= 32 {
            return;
        }
        let bit = 1u32 << rail;
        // Active transfers too: one that completes later must not wait any more.
        for key in self.transfers.keys() {
            if let Some(t) = self.transfers.get_mut(key) {
                if t.awaiting_peer & bit != 0 {
                    t.awaiting_peer &= !bit;
                    self.try_finish(now, key);
                }
            }
        }
    }

    /// Forgets our offer for rail `rail`, destroying its queue pairs.
    pub(crate) fn drop_offer(&mut self, rail: usize) {
        if let Some(o) = self.offers[rail].take() {
            self.actions
                .push_back(Action::DestroyLanes(o.lanes.clone()));
            let recv = &mut self.recv[rail];
            if o.lanes.first().is_some_and(|l| recv.gen == Some(l.gen)) {
                recv.gen = None;
                recv.armed.iter_mut().for_each(|a| *a = false);
            }
        }
    }
}
