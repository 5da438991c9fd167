//! Rail renewal with the peer, over the control link.
//!
//! After its cool-down (or at once, for a fence), the side that lost a rail's queue pairs
//! creates new ones and offers them ([`Control::Renew`]); the peer destroys its old ones,
//! creates and connects new ones, takes the rail back into service and answers
//! ([`Control::Renewed`]), or says it could not ([`Control::Refused`]). The offering side
//! connects its queue pairs and sends a probe message on the rail: its success re-admits the
//! rail; a failure pauses it again, with a longer cool-down. When both sides offer at once, the
//! connecting side's offer wins.

use std::time::Instant;

use super::{Connection, Offer};
use crate::control::Control;
use crate::fault::{RailFault, Step};
use crate::io::{Action, Event, Io, LaneRef};
use crate::lane::Lane;
use crate::rail::RailState;

impl<I: Io> Connection<I> {
    /// New queue pair references for rail `rail`'s lanes (fresh generations).
    fn new_refs(&mut self, rail: usize) -> Vec<LaneRef> {
        let w = self.cfg.lanes_per_rail;
        (rail * w..(rail + 1) * w)
            .map(|lane| {
                let gen = self.next_gen;
                self.next_gen += 1;
                LaneRef { lane, gen }
            })
            .collect()
    }

    /// Creates queue pairs for rail `rail` through the driver and posts the receive slots on
    /// the first (those not held for the application).
    fn create(
        &mut self,
        io: &mut I,
        rail: usize,
    ) -> Result<(Vec<LaneRef>, I::Endpoints), RailFault> {
        let refs = self.new_refs(rail);
        let endpoints = io
            .create_lanes(rail, &refs)
            .map_err(|e| RailFault::driver(Step::Create, e))?;
        let recv = &mut self.recv[rail];
        recv.gen = refs.first().map(|l| l.gen);
        // The slots posted on the old queue pair move to the new one, one for one.
        let moved = recv.armed.iter().filter(|a| **a).count();
        recv.armed.iter_mut().for_each(|a| *a = false);
        self.arm_free_slots(io, rail, moved);
        Ok((refs, endpoints))
    }

    /// Offers new queue pairs for rail `rail` (`fence`: the rail did not fail; it counts as
    /// usable meanwhile). A failure to make them pauses the rail.
    pub(crate) fn offer(&mut self, now: Instant, io: &mut I, rail: usize, fence: bool) {
        match self.create(io, rail) {
            Ok((lanes, endpoints)) => {
                let r = &mut self.rails[rail];
                r.epoch = r.epoch.wrapping_add(1);
                r.state = RailState::Renewing;
                r.fencing = fence;
                r.until = now + self.cfg.renew_timeout;
                let epoch = r.epoch;
                self.offers[rail] = Some(Offer { epoch, lanes });
                self.actions
                    .push_back(Action::Event(Event::Renewing { rail, epoch, fence }));
                self.actions.push_back(Action::SendControl(Control::Renew {
                    rail,
                    epoch,
                    endpoints,
                }));
            }
            Err(why) => self.renewal_failed(now, rail, why),
        }
    }

    /// A renewal of rail `rail` failed: the rail pauses (a longer cool-down), and every
    /// transfer fails if no rail is left for a quiesce time.
    fn renewal_failed(&mut self, now: Instant, rail: usize, why: RailFault) {
        self.actions.push_back(Action::Event(Event::RenewalFailed {
            rail,
            why: why.clone(),
        }));
        self.rails[rail].pause(now, why);
        self.check_rails(now);
    }

    /// Starts the renewals that are due (cool-down over) and gives up those the peer did not
    /// answer in time.
    pub(crate) fn renewals_due(&mut self, now: Instant, io: &mut I) {
        for rail in 0..self.cfg.rails {
            let r = &self.rails[rail];
            match r.state {
                RailState::Paused if now >= r.until => self.offer(now, io, rail, false),
                RailState::Renewing if now >= r.until => {
                    self.drop_offer(rail);
                    self.renewal_failed(now, rail, RailFault::Unanswered);
                }
                _ => {}
            }
        }
    }

    /// Puts `lanes` in place of rail `rail`'s current queue pairs (those are destroyed first,
    /// what they carried queued again).
    fn install(&mut self, now: Instant, rail: usize, lanes: &[LaneRef]) {
        self.retire_lanes(now, rail, None);
        for l in lanes {
            self.lanes[l.lane] = Lane::new(l.gen);
        }
        self.rails[rail].stats.renewals += 1;
    }

    /// Applies a control message from the peer.
    pub fn handle_control(&mut self, now: Instant, io: &mut I, msg: Control<I::Endpoints>) {
        if self.is_closed() {
            return;
        }
        match msg {
            Control::Renew {
                rail,
                epoch,
                endpoints,
            } => self.on_renew(now, io, rail, epoch, endpoints),
            Control::Renewed {
                rail,
                epoch,
                endpoints,
            } => self.on_renewed(now, io, rail, epoch, endpoints),
            Control::Refused { rail, epoch } => self.on_refused(now, rail, epoch),
        }
        self.pump(now, io);
    }

    /// The peer offers new queue pairs for a rail (its old ones are gone): replace ours,
    /// connect them, take the rail back into service, and answer.
    fn on_renew(
        &mut self,
        now: Instant,
        io: &mut I,
        rail: usize,
        epoch: u32,
        theirs: I::Endpoints,
    ) {
        let w = self.cfg.lanes_per_rail;
        if rail >= self.cfg.rails || io.endpoint_count(&theirs) != w {
            self.actions.push_back(Action::Event(Event::Ignored {
                what: format!(
                    "a renewal of rail {rail} with {} queue pairs ({} rails of {w} shared)",
                    io.endpoint_count(&theirs),
                    self.cfg.rails
                ),
            }));
            return;
        }
        if self.offers[rail].is_some() {
            if self.cfg.initiator {
                // Both renewed at once: ours wins; the peer answers it.
                return;
            }
            self.drop_offer(rail);
        }
        // Ours go first, before the new ones take the receive slots; the peer's side of the
        // old queue pairs is gone already, so nothing of them can still land there.
        self.retire_lanes(now, rail, None);
        self.rail_quiet(now, rail);
        let refused = Control::Refused { rail, epoch };
        let (lanes, ours) = match self.create(io, rail) {
            Ok(x) => x,
            Err(why) => {
                self.rail_failed(now, io, rail, None, why);
                self.actions.push_back(Action::SendControl(refused));
                return;
            }
        };
        self.install(now, rail, &lanes);
        if let Err(e) = io.connect_lanes(rail, &lanes, &theirs) {
            let why = RailFault::driver(Step::Connect, e);
            self.rail_failed(now, io, rail, None, why);
            self.actions.push_back(Action::SendControl(refused));
            return;
        }
        if !self.rails[rail].is_active() {
            self.rails[rail].stats.readmissions += 1;
        }
        let slots = self.cfg.send_slots;
        self.rails[rail].admit(now, slots);
        self.actions
            .push_back(Action::Event(Event::RenewedByPeer { rail, epoch }));
        self.actions
            .push_back(Action::SendControl(Control::Renewed {
                rail,
                epoch,
                endpoints: ours,
            }));
    }

    /// The peer refused our offer: the rail stays paused, with a longer cool-down.
    fn on_refused(&mut self, now: Instant, rail: usize, epoch: u32) {
        if rail >= self.cfg.rails || self.offers[rail].as_ref().is_none_or(|o| o.epoch != epoch) {
            self.actions.push_back(Action::Event(Event::Ignored {
                what: format!("a refusal of renewal {epoch} of rail {rail}, never offered"),
            }));
            return;
        }
        self.drop_offer(rail);
        // The peer destroyed its side of the old queue pairs before refusing.
        self.rail_quiet(now, rail);
        self.renewal_failed(now, rail, RailFault::Refused);
    }

    /// The peer answered our offer: connect, install, probe.
    fn on_renewed(
        &mut self,
        now: Instant,
        io: &mut I,
        rail: usize,
        epoch: u32,
        theirs: I::Endpoints,
    ) {
        let matches = rail < self.cfg.rails
            && self.offers[rail]
                .as_ref()
                .is_some_and(|o| o.epoch == epoch && o.lanes.len() == io.endpoint_count(&theirs));
        if !matches {
            self.actions.push_back(Action::Event(Event::Ignored {
                what: format!("an answer to renewal {epoch} of rail {rail}, never offered"),
            }));
            return;
        }
        let Some(offer) = self.offers[rail].take() else {
            return;
        };
        self.install(now, rail, &offer.lanes);
        // The peer's side of the old queue pairs is gone.
        self.rail_quiet(now, rail);
        if let Err(e) = io.connect_lanes(rail, &offer.lanes, &theirs) {
            let why = RailFault::driver(Step::Connect, e);
            self.rail_failed(now, io, rail, None, why);
            return;
        }
        let slots = self.cfg.send_slots;
        let r = &mut self.rails[rail];
        r.free_send_slots = (0..slots).rev().collect();
        r.state = RailState::Probing;
        if let Err(why) = self.post_probe(io, rail) {
            self.rail_failed(now, io, rail, None, why);
        }
    }
}
