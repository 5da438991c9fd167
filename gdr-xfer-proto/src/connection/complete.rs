//! Completions: send-queue completions credit what they cover (in order per lane), receive
//! completions bring notifications and probes.

use std::time::Instant;

use super::Connection;
use crate::fault::RailFault;
use crate::io::{Action, Event, Header, Io, LaneRef, Receipt, SendCompletion, Status};
use crate::lane::Posted;
use crate::rail::RailState;
use crate::transfer::{NotifyState, TransferKey};

impl<I: Io> Connection<I> {
    /// Whether `lane` is the current queue pair of its lane (not a destroyed one).
    fn is_current(&self, lane: LaneRef) -> bool {
        self.lanes
            .get(lane.lane)
            .is_some_and(|l| l.gen == Some(lane.gen))
    }

    /// Handles a send-queue completion. Success credits every record up to its number; a
    /// request error fails that request's transfer and renews the rail (its queue pair is in
    /// error); any other error fails the rail over. Completions of destroyed queue pairs are
    /// ignored.
    pub fn handle_send_completion(&mut self, now: Instant, io: &mut I, c: SendCompletion) {
        if !self.is_current(c.lane) || self.is_closed() {
            return;
        }
        let li = c.lane.lane;
        let rail = li / self.cfg.lanes_per_rail;
        if c.status != Status::Success {
            let why = RailFault::Completion {
                qp_num: c.qp_num,
                status: c.raw_status,
            };
            self.rail_failed(now, io, rail, Some(c), why);
            self.pump(now, io);
            return;
        }
        let mut bytes = 0;
        let mut slices = 0;
        let mut probed = false;
        let mut touched: Vec<TransferKey> = Vec::new();
        let lane = &mut self.lanes[li];
        lane.full = false;
        while let Some(rec) = lane.posted.front() {
            if rec.last() > c.wr_id {
                break;
            }
            let rec = *rec;
            lane.posted.pop_front();
            lane.outstanding = lane.outstanding.saturating_sub(rec.count());
            match rec {
                Posted::Slices {
                    transfer, bytes: b, ..
                } => {
                    let n = rec.count();
                    bytes += b;
                    slices += n;
                    if let Some(t) = self.transfers.get_mut(transfer) {
                        t.slices_done += n;
                        t.inflight = t.inflight.saturating_sub(n);
                        touched.push(transfer);
                    }
                }
                Posted::Notify { transfer, slot, .. } => {
                    self.rails[rail].free_send_slots.push(slot);
                    if let Some(t) = self.transfers.get_mut(transfer) {
                        t.notify_state = NotifyState::Delivered;
                        t.inflight = t.inflight.saturating_sub(1);
                        touched.push(transfer);
                    }
                }
                Posted::Probe { slot, .. } => {
                    self.rails[rail].free_send_slots.push(slot);
                    probed = true;
                }
            }
        }
        self.rails[rail].completed(bytes, slices, now);
        if probed && self.rails[rail].state == RailState::Probing {
            self.rails[rail].stats.readmissions += 1;
            let slots = self.cfg.send_slots;
            let r = &mut self.rails[rail];
            // The probe's slot came back above; the rail starts with all of them.
            r.admit(now, slots);
            self.actions
                .push_back(Action::Event(Event::Readmitted { rail }));
        }
        for key in touched {
            self.progressed(now, key);
        }
        self.pump(now, io);
    }

    /// After some of `key`'s requests completed: its notification becomes due once its data
    /// is complete; it finishes once everything is.
    fn progressed(&mut self, now: Instant, key: TransferKey) {
        let Some(t) = self.transfers.get(key) else {
            return;
        };
        if t.is_active()
            && t.slices_done >= t.slices_total
            && t.inflight == 0
            && t.notify_state == NotifyState::Waiting
        {
            // Every byte is acknowledged by the peer's NIC: the notification may go.
            if !self.notify_due.contains(&key) {
                self.notify_due.push_back(key);
            }
            return;
        }
        self.try_finish(now, key);
    }

    /// Handles a receive completion of `slot` on `lane`: `msg` is the message the slot holds
    /// (`None` when the completion failed). A notification seen for the first time is
    /// delivered (its slot stays unposted until the application took it:
    /// [`Connection::consumed`]); a probe, a repeat or a malformed message is dropped and its
    /// slot posted again; a failed receive fails the rail over.
    pub fn handle_recv(
        &mut self,
        now: Instant,
        io: &mut I,
        lane: LaneRef,
        slot: u16,
        msg: Option<&[u8]>,
    ) {
        if !self.is_current(lane) || self.is_closed() {
            return;
        }
        let rail = lane.lane / self.cfg.lanes_per_rail;
        let recv = &mut self.recv[rail];
        if recv.gen != Some(lane.gen) {
            return;
        }
        if let Some(a) = recv.armed.get_mut(usize::from(slot)) {
            *a = false;
        } else {
            return;
        }
        let Some(msg) = msg else {
            // The queue pair broke, for a reason its send queue may not tell (it may have had
            // nothing posted): renew the rail at once; if its path is broken, the renewal or
            // the probe fails and pauses it.
            if self.rails[rail].is_active() {
                self.renew_now(now, io, rail);
            } else {
                let why = RailFault::Receive { lane: lane.lane };
                self.rail_failed(now, io, rail, None, why);
            }
            self.pump(now, io);
            return;
        };
        let deliver = match Header::decode(msg) {
            Some((h, data)) if h.flags & Header::PROBE == 0 && self.seen.first_time(h.id) => {
                Some(data.to_vec())
            }
            Some(_) => None,
            None => {
                self.actions.push_back(Action::Event(Event::Ignored {
                    what: format!(
                        "a message of {} bytes on lane {}, shorter than its header",
                        msg.len(),
                        lane.lane
                    ),
                }));
                None
            }
        };
        // A slot that delivered nothing is posted again one for one; one whose notification is
        // kept without its slot is a new post, which the driver's bound may defer.
        let mut given_back = 1;
        if let Some(data) = deliver {
            self.untaken = self.untaken.saturating_add(1);
            let holds = self.untaken > self.cfg.recv_buffered || !io.buffer_notification();
            if holds {
                self.recv[rail].held += 1;
            }
            self.actions
                .push_back(Action::Deliver(data, Receipt { lane, slot, holds }));
            if holds {
                return;
            }
            given_back = 0;
        }
        self.arm_free_slots(io, rail, given_back);
    }
}
