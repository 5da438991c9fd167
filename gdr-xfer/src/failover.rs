//! Completions, rail failures and rail renewals of a connection.
//!
//! # Failover
//!
//! An error completion on a lane (link down, retries exceeded, a flushed request), or a post
//! the provider refuses, fails that lane's rail for this peer: the rail is paused, its queue
//! pairs are destroyed at once (after `ibv_destroy_qp` the NIC no longer touches their memory,
//! so nothing of the old requests can land after their retry), and every range they carried
//! that was not credited is queued to be posted again, first, on the other active rails
//! (writes and reads of the same bytes: idempotent). A notification in flight there is sent
//! again; the target drops a repeat by its id. A request error (a bad remote key, a protection
//! error) fails the transfer it belongs to instead: posting it elsewhere would fail the same
//! way. When no rail is left active, every pending transfer fails with
//! [`Error::NoRail`](crate::Error::NoRail); the connection stays, and rails come back.
//!
//! # Renewal and probe
//!
//! After its cool-down, the side that paused a rail creates new queue pairs for it and offers
//! them (`RailRenew`, over the control link); the peer destroys its old ones, connects new ones
//! and answers (`RailRenewed`), and takes the rail back into service. The offering side
//! connects its queue pairs and sends a probe message on the rail: its success completion
//! re-admits the rail; a failure pauses it again, with a longer cool-down. When both sides
//! offer at once, the connecting side's offer wins.

use std::sync::Arc;
use std::time::Instant;

use gdr::qp::QueuePair;
use gdr::{Completion, WcStatus};

use crate::connection::{Connection, Lane, Offer, Posted, Queues};
use crate::notify::{split_recv_wr_id, Notification, FLAG_PROBE};
use crate::rail::RailState;
use crate::transfer::{Failure, NotifyState};
use crate::wire::{Message, RailRenew};

/// How long an offer waits for the peer's answer (the control link normally answers within
/// milliseconds; an offer lost with a stalled link is made again after the cool-down).
const RENEW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Statuses that say the request itself was wrong, not the rail: the transfer fails.
fn is_request_error(status: WcStatus) -> bool {
    matches!(
        status,
        WcStatus::RemoteAccess
            | WcStatus::LocalProtection
            | WcStatus::LocalLength
            | WcStatus::RemoteInvalidRequest
    )
}

impl Connection {
    /// Whether a completion belongs to the current queue pair of lane `li` (not to one that
    /// was replaced, whose number may have been reused).
    fn is_current(&self, q: &Queues, li: usize, qp_num: u32) -> bool {
        q.lanes
            .get(li)
            .and_then(|l| l.qp.as_ref())
            .is_some_and(|qp| qp.qp_num() == qp_num)
    }

    /// Handles a send-queue completion of lane `li`.
    pub(crate) fn on_send_completion(&self, li: usize, c: &Completion) {
        let mut q = self.lock();
        if !self.is_current(&q, li, c.qp_num) || c.wr_id < q.lanes[li].first_wr {
            log::trace!(
                "peer {}: stale completion {} of QP {:#x} ignored",
                self.name,
                c.wr_id,
                c.qp_num
            );
            return;
        }
        let rail = li / self.qps_per_rail;
        if c.status != WcStatus::Success {
            if !q.closed {
                log::warn!(
                    "peer {}: request {} on QP {:#x} (rail {rail}, {}) completed with {} (vendor error {:#x})",
                    self.name,
                    c.wr_id,
                    c.qp_num,
                    self.rail_names[rail].0,
                    c.status,
                    c.vendor_err
                );
            }
            let why = format!(
                "a request on QP {:#x} completed with {}",
                c.qp_num, c.status
            );
            self.rail_failed(&mut q, rail, Some(c), why);
            self.pump(&mut q);
            return;
        }
        let s = c.wr_id;
        let mut due = Vec::new();
        let (mut bytes, mut slices) = (0, 0);
        let lane = &mut q.lanes[li];
        let mut freed = Vec::new();
        let mut probed = false;
        while let Some(front) = lane.posted.front() {
            match front {
                Posted::Slices {
                    first,
                    last,
                    transfer,
                    bytes: b,
                    ..
                } if *last <= s => {
                    let n = last - first + 1;
                    let mut p = transfer.lock();
                    if transfer.credit(&mut p, n) {
                        due.push(transfer.clone());
                    }
                    drop(p);
                    bytes += b;
                    slices += n;
                    lane.posted.pop_front();
                }
                Posted::Notify {
                    seq,
                    transfer,
                    slot,
                } if *seq <= s => {
                    let mut p = transfer.lock();
                    p.notify = NotifyState::Delivered;
                    transfer.finish(&mut p, Ok(()));
                    drop(p);
                    freed.push(*slot);
                    lane.posted.pop_front();
                }
                Posted::Probe { seq, slot } if *seq <= s => {
                    freed.push(*slot);
                    probed = true;
                    lane.posted.pop_front();
                }
                _ => break,
            }
        }
        let r = &mut q.rails[rail];
        r.completed(bytes, slices);
        r.free_notify_slots.extend(freed);
        if probed && r.state == RailState::Probing {
            r.readmit(Instant::now());
            r.stats.readmissions += 1;
            log::info!(
                "peer {}: rail {rail} ({}:{}) re-admitted after a successful probe",
                self.name,
                self.rail_names[rail].0,
                self.rail_names[rail].1
            );
        }
        q.notify_due.extend(due);
        self.pump(&mut q);
    }

    /// Handles a receive completion (a notification or a probe) of lane `li`.
    pub(crate) fn on_recv_completion(&self, li: usize, c: &Completion) -> Option<Notification> {
        let mut q = self.lock();
        let (gen, slot) = split_recv_wr_id(c.wr_id);
        if !self.is_current(&q, li, c.qp_num) || q.lanes[li].gen != gen {
            return None;
        }
        let rail = li / self.qps_per_rail;
        if c.status != WcStatus::Success {
            if !q.closed {
                let why = format!(
                    "a receive on QP {:#x} completed with {}",
                    c.qp_num, c.status
                );
                self.rail_failed(&mut q, rail, None, why);
                self.pump(&mut q);
            }
            return None;
        }
        let pool = &self.notify[rail];
        if slot >= pool.slots {
            return None;
        }
        let msg = pool.take(slot, c.byte_len);
        if let Some(qp) = &q.lanes[li].qp {
            if let Err(e) = pool.post_recv(qp, gen, slot) {
                if !q.closed {
                    log::error!(
                        "peer {}: reposting notification slot {slot}: {e}",
                        self.name
                    );
                }
            }
        }
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                log::error!("peer {}: reading notification slot {slot}: {e}", self.name);
                return None;
            }
        };
        if msg.flags & FLAG_PROBE != 0 || !q.seen.first_time(msg.id) {
            return None;
        }
        Some(Notification {
            peer: self.name.clone(),
            data: msg.data,
        })
    }

    /// Rail `rail` failed (`cause`: the error completion, if one): pauses it, destroys its
    /// queue pairs and queues what they carried to be posted again (a request error fails its
    /// transfer instead). Fails every transfer when no rail is left.
    pub(crate) fn rail_failed(
        &self,
        q: &mut Queues,
        rail: usize,
        cause: Option<&Completion>,
        why: String,
    ) {
        if q.closed {
            return;
        }
        let now = Instant::now();
        if q.rails[rail].state == RailState::Paused && q.lanes_down(rail, self.qps_per_rail) {
            return;
        }
        log::warn!(
            "peer {}: rail {rail} ({}:{}) paused: {why}",
            self.name,
            self.rail_names[rail].0,
            self.rail_names[rail].1
        );
        q.rails[rail].pause(now, why);
        // An offer in flight is void: its queue pairs go with it.
        q.offers[rail] = None;
        let bad_request = cause.filter(|c| is_request_error(c.status));
        let range = rail * self.qps_per_rail..(rail + 1) * self.qps_per_rail;
        let old = self.requeue_lanes(q, range, bad_request);
        q.rails[rail].free_notify_slots.clear();
        if old.requeued > 0 {
            q.rails[rail].failed_at = Some(now);
        }
        q.rails[rail].stats.retries += old.requeued;
        // Destroyed once the pump re-posted what they carried (see `Queues::graveyard`).
        q.graveyard.push((rail, old.qps));
        if !q.rails.iter().any(|r| r.is_active()) {
            let detail = self.rails_down_detail(q);
            log::warn!("peer {}: no rail left: {detail}", self.name);
            self.fail_all(q, &Failure::NoRail { detail });
        }
    }

    /// Takes the queue pairs of lanes `range` out (to destroy) and queues what they carried
    /// to be posted again; the transfer of the request `bad_request` names fails instead.
    fn requeue_lanes(
        &self,
        q: &mut Queues,
        range: std::ops::Range<usize>,
        bad_request: Option<&Completion>,
    ) -> Requeued {
        let mut out = Requeued::default();
        let mut again = Vec::new();
        for li in range {
            let lane = &mut q.lanes[li];
            out.qps.extend(lane.qp.take());
            for rec in lane.posted.drain(..) {
                match rec {
                    Posted::Slices {
                        first,
                        last,
                        transfer,
                        from,
                        to,
                        ..
                    } => {
                        let mut p = transfer.lock();
                        if p.outcome.is_some() {
                            continue;
                        }
                        if let Some(c) = bad_request.filter(|c| (first..=last).contains(&c.wr_id)) {
                            transfer.finish(
                                &mut p,
                                Err(Failure::Slice {
                                    qp_num: c.qp_num,
                                    status: c.status,
                                    vendor_err: c.vendor_err,
                                }),
                            );
                            continue;
                        }
                        p.retry.push((from, to));
                        p.retried_slices += last - first + 1;
                        out.requeued += last - first + 1;
                        if !p.queued {
                            p.queued = true;
                            drop(p);
                            again.push(transfer);
                        }
                    }
                    Posted::Notify { transfer, .. } => {
                        let mut p = transfer.lock();
                        if p.outcome.is_none() {
                            p.notify = NotifyState::Waiting;
                            drop(p);
                            q.notify_due.push_front(transfer);
                        }
                    }
                    Posted::Probe { .. } => {}
                }
            }
        }
        // Oldest first, ahead of what waits to be posted for the first time.
        for t in again.into_iter().rev() {
            q.pending.push_front(t);
        }
        out
    }

    /// Destroys replaced queue pairs and forgets their numbers (their completions still
    /// queued then route nowhere, or to a reuse of the number, which ignores them as stale).
    pub(crate) fn forget_qps(&self, rail: usize, qps: Vec<QueuePair>) {
        if qps.is_empty() {
            return;
        }
        if let Some(a) = self.agent.upgrade() {
            a.unroute(
                rail,
                &qps.iter().map(|q| q.qp_num()).collect::<Vec<_>>(),
                self,
            );
        }
        drop(qps);
    }

    /// Starts the renewals that are due (cool-down over) and gives up those the peer did not
    /// answer; returns the offers to send.
    pub(crate) fn renewals_due(&self, q: &mut Queues, now: Instant) -> Vec<Message> {
        let mut msgs = Vec::new();
        for rail in 0..self.nrails {
            match q.rails[rail].state {
                RailState::Paused if now >= q.rails[rail].until => match self.offer(q, rail) {
                    Ok(m) => msgs.push(m),
                    Err(e) => {
                        q.rails[rail].pause(now, format!("renewing: {e}"));
                    }
                },
                RailState::Renewing if now >= q.rails[rail].until => {
                    q.offers[rail] = None;
                    q.rails[rail].pause(now, "the peer did not answer the renewal".into());
                }
                _ => {}
            }
        }
        msgs
    }

    /// New lanes for rail `rail`, their receives posted (the probe and notifications land
    /// there), offered to the peer.
    fn offer(&self, q: &mut Queues, rail: usize) -> Result<Message, String> {
        let lanes = self.new_lanes(rail)?;
        let r = &mut q.rails[rail];
        r.epoch = r.epoch.wrapping_add(1);
        r.state = RailState::Renewing;
        r.until = Instant::now() + RENEW_TIMEOUT.min(self.connect_timeout());
        let endpoints = lanes
            .iter()
            .filter_map(|l| l.qp.as_ref().map(|qp| qp.endpoint()))
            .collect();
        let epoch = r.epoch;
        q.offers[rail] = Some(Offer { epoch, lanes });
        log::info!(
            "peer {}: renewing rail {rail} ({}:{}), epoch {epoch}",
            self.name,
            self.rail_names[rail].0,
            self.rail_names[rail].1
        );
        Ok(Message::RailRenew(RailRenew {
            rail: rail as u8,
            epoch,
            endpoints,
        }))
    }

    fn connect_timeout(&self) -> std::time::Duration {
        self.agent
            .upgrade()
            .map_or(std::time::Duration::from_secs(10), |a| {
                a.config.connect_timeout
            })
    }

    /// `qps_per_rail` new queue pairs on rail `rail`, receives posted on the first.
    fn new_lanes(&self, rail: usize) -> Result<Vec<Lane>, String> {
        let agent = self.agent.upgrade().ok_or("the agent is gone")?;
        let qps = agent
            .create_qps(rail, self.qps_per_rail)
            .map_err(|e| e.to_string())?;
        let lanes: Vec<Lane> = qps.into_iter().map(|qp| Lane::new(qp, &self.ids)).collect();
        if let Some(qp) = &lanes[0].qp {
            self.notify[rail]
                .post_all(qp, lanes[0].gen)
                .map_err(|e| e.to_string())?;
        }
        Ok(lanes)
    }

    /// Destroys rail `rail`'s queue pairs at once and queues what they carried to be posted
    /// again (a renewal replacing them: the rail did not fail, nothing is paused).
    fn retire_lanes(&self, q: &mut Queues, rail: usize) {
        let range = rail * self.qps_per_rail..(rail + 1) * self.qps_per_rail;
        let old = self.requeue_lanes(q, range, None);
        q.rails[rail].stats.retries += old.requeued;
        self.forget_qps(rail, old.qps);
    }

    /// Puts `lanes` in place of rail `rail`'s (whose queue pairs are destroyed, what they
    /// carried queued again), and routes their completions here.
    fn install(self: &Arc<Self>, q: &mut Queues, rail: usize, lanes: Vec<Lane>) {
        self.retire_lanes(q, rail);
        let range = rail * self.qps_per_rail..(rail + 1) * self.qps_per_rail;
        let nums: Vec<(u32, usize)> = lanes
            .iter()
            .zip(range.clone())
            .filter_map(|(l, li)| l.qp.as_ref().map(|qp| (qp.qp_num(), li)))
            .collect();
        for (li, lane) in range.zip(lanes) {
            q.lanes[li] = lane;
        }
        q.rails[rail].stats.renewals += 1;
        if let Some(a) = self.agent.upgrade() {
            a.route_qps(self, &nums);
        }
    }

    /// The peer offers new queue pairs for a rail: connect ours to them, take the rail back
    /// into service, and answer with ours.
    pub(crate) fn on_rail_renew(self: &Arc<Self>, r: RailRenew) -> Option<Message> {
        let rail = usize::from(r.rail);
        let mut q = self.lock();
        if q.closed || rail >= self.nrails || r.endpoints.len() != self.qps_per_rail {
            log::warn!(
                "peer {}: renewal of rail {rail} with {} queue pairs refused ({} rails of {} shared)",
                self.name,
                r.endpoints.len(),
                self.nrails,
                self.qps_per_rail
            );
            return None;
        }
        if q.offers[rail].is_some() {
            if self.initiator {
                // Both renewed at once: ours wins; the peer answers it.
                return None;
            }
            q.offers[rail] = None;
        }
        // The old queue pairs go first, before the new ones post receives into the same slots
        // (`install` then finds nothing left to retire).
        self.retire_lanes(&mut q, rail);
        let refused = Some(Message::RailRefused {
            rail: r.rail,
            epoch: r.epoch,
        });
        let lanes = match self.new_lanes(rail) {
            Ok(l) => l,
            Err(e) => {
                self.rail_failed(&mut q, rail, None, format!("answering a renewal: {e}"));
                self.pump(&mut q);
                return refused;
            }
        };
        let endpoints = lanes
            .iter()
            .filter_map(|l| l.qp.as_ref().map(|qp| qp.endpoint()))
            .collect();
        // Installed (routed) before connected: nothing can complete on them before.
        self.install(&mut q, rail, lanes);
        if let Err(err) = self.connect_lanes(&q, rail, &r.endpoints) {
            self.rail_failed(&mut q, rail, None, format!("connecting a renewal: {err}"));
            self.pump(&mut q);
            return refused;
        }
        let slots = self.notify[rail].slots;
        if !q.rails[rail].is_active() {
            // Back in service (the peer's probe follows on these queue pairs).
            q.rails[rail].stats.readmissions += 1;
        }
        q.rails[rail].admit(Instant::now(), slots);
        log::info!(
            "peer {}: rail {rail} renewed at the peer's request (epoch {})",
            self.name,
            r.epoch
        );
        self.pump(&mut q);
        Some(Message::RailRenewed(RailRenew {
            rail: r.rail,
            epoch: r.epoch,
            endpoints,
        }))
    }

    /// The peer could not carry out our offer for rail `rail`: the rail stays paused, with a
    /// longer cool-down.
    pub(crate) fn on_rail_refused(&self, rail: usize, epoch: u32) {
        let mut q = self.lock();
        if q.closed || rail >= self.nrails {
            return;
        }
        if q.offers[rail].as_ref().is_some_and(|o| o.epoch == epoch) {
            q.offers[rail] = None;
            q.rails[rail].pause(Instant::now(), "the peer could not renew it".into());
            log::info!(
                "peer {}: renewal of rail {rail} (epoch {epoch}) refused by the peer",
                self.name
            );
        }
    }

    /// The peer answered our offer: connect, install, probe.
    pub(crate) fn on_rail_renewed(self: &Arc<Self>, r: RailRenew) {
        let rail = usize::from(r.rail);
        let mut q = self.lock();
        if q.closed || rail >= self.nrails {
            return;
        }
        let offer = match q.offers[rail].take() {
            Some(o) if o.epoch == r.epoch && r.endpoints.len() == o.lanes.len() => o,
            other => {
                // Not the answer to our current offer (an old one, or none): ignore it.
                q.offers[rail] = other;
                return;
            }
        };
        self.install(&mut q, rail, offer.lanes);
        if let Err(err) = self.connect_lanes(&q, rail, &r.endpoints) {
            self.rail_failed(&mut q, rail, None, format!("connecting a renewal: {err}"));
            self.pump(&mut q);
            return;
        }
        let slots = self.notify[rail].slots;
        let link = &mut q.rails[rail];
        link.free_notify_slots = (0..slots).rev().collect();
        link.state = RailState::Probing;
        if let Err(e) = self.post_probe(&mut q, rail) {
            self.rail_failed(&mut q, rail, None, format!("posting the probe: {e}"));
            self.pump(&mut q);
        }
    }
}

impl Connection {
    /// Connects rail `rail`'s lanes to the peer's endpoints.
    fn connect_lanes(
        &self,
        q: &Queues,
        rail: usize,
        endpoints: &[gdr::qp::Endpoint],
    ) -> gdr::Result<()> {
        let lanes = &q.lanes[rail * self.qps_per_rail..(rail + 1) * self.qps_per_rail];
        for (lane, e) in lanes.iter().zip(endpoints) {
            if let Some(qp) = &lane.qp {
                qp.connect(e)?;
            }
        }
        Ok(())
    }
}

/// What [`Connection::requeue_lanes`] took out.
#[derive(Default)]
struct Requeued {
    qps: Vec<QueuePair>,
    requeued: u64,
}

impl Queues {
    /// Whether every lane of `rail` is without a queue pair.
    pub(crate) fn lanes_down(&self, rail: usize, per_rail: usize) -> bool {
        self.lanes[rail * per_rail..(rail + 1) * per_rail]
            .iter()
            .all(|l| l.qp.is_none())
    }
}
