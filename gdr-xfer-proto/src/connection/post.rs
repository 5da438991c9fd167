//! Posting: notifications that are due, then requests of the pending transfers, on the lanes of
//! the active rails, as far as their send queues have room.
//!
//! Requests are cut from the front transfer (its retry ranges first), up to [`CHUNK`] per
//! post ([`STRIPE_CHUNK`] on several rails), all of one local segment; only the last of a batch is signalled. Each batch goes to the
//! rail with the lowest cost (its queued bytes over its measured throughput; a rail not measured
//! yet is assumed as fast as the fastest measured one) among the active rails with room, so a
//! faster or emptier rail takes more; a transfer of at most `stripe_min`
//! bytes keeps to the rail its first batch went to.

use std::time::Instant;

use super::Connection;
use crate::config::{stripe_chunk, CHUNK};
use crate::fault::{DriverError, RailFault, Rejection, Step, Unposted};
use crate::io::{Header, Io, LaneRef, Pieces, PostResult};
use crate::lane::{Lane, Posted};
use crate::rail::RailLink;
use crate::run::{cut, Cursor};
use crate::transfer::{Failure, NotifyState, TransferKey};

/// What a posting attempt for the front transfer ended with, acted on once its borrows end.
enum Next {
    /// Go on with the next transfer (the front one is fully posted or gone).
    Pop,
    /// Post more of the same transfer (lanes may have more room).
    Again,
    /// No lane has room: stop posting.
    Stall,
    /// The transfer's own request is bad: it fails.
    Reject(TransferKey, Rejection),
    /// A lane is broken: its rail fails (what it carried is queued again).
    RailFailed(usize, RailFault),
}

impl<I: Io> Connection<I> {
    /// Posts notifications that are due, then requests of the pending transfers.
    pub(crate) fn pump(&mut self, now: Instant, io: &mut I) {
        self.unposted_since = None;
        if self.is_closed() {
            return;
        }
        self.pump_notifications(now, io);
        loop {
            match self.pump_front(now, io) {
                Next::Pop => {
                    self.pending.pop_front();
                }
                Next::Again => {}
                Next::Stall => return,
                Next::Reject(key, why) => {
                    self.pending.pop_front();
                    if let Some(t) = self.transfers.get_mut(key) {
                        t.queued = false;
                    }
                    self.stop(now, key, Failure::Rejected { why });
                }
                Next::RailFailed(rail, why) => {
                    self.rail_failed(now, io, rail, None, why);
                    if !self.rails.iter().any(RailLink::is_active) {
                        return;
                    }
                }
            }
        }
    }

    /// The room on lane `li` (0 without a queue pair, or when the driver found it full).
    fn room(cfg_depth: u64, lane: &Lane) -> u64 {
        if lane.gen.is_none() || lane.full {
            0
        } else {
            cfg_depth.saturating_sub(lane.outstanding)
        }
    }

    /// The lane for the next batch of `bytes` bytes: on the cheapest active rail with room
    /// among the preferred ones (`mask`; any active rail when none of those is), only `pin`'s
    /// rail when given, round robin among that rail's lanes. Returns it and its room.
    fn pick_lane(&self, pin: Option<usize>, mask: u32, bytes: u64) -> Option<(usize, u64)> {
        let w = self.cfg.lanes_per_rail;
        let depth = self.cfg.send_depth;
        if self.cfg.rails == 1 {
            // One rail: no choice to weigh, round robin over its lanes.
            if !self.rails[0].is_active() {
                return None;
            }
            let start = self.rails[0].next_lane;
            return (0..w)
                .map(|k| (start + k) % w)
                .map(|l| (l, Self::room(depth, &self.lanes[l])))
                .find(|&(_, room)| room > 0);
        }
        let bit = |r: usize| if r < 32 { 1u32 << r } else { 0 };
        let preferred_up =
            (0..self.cfg.rails).any(|r| mask & bit(r) != 0 && self.rails[r].is_active());
        // A pinned transfer keeps to its rail even when a preferred one came back (it was
        // pinned while those were down): the pin wins over the preference.
        let pin_wins = pin.is_some() && !cfg!(gdr_mutant = "mask_over_pin");
        let mask = if preferred_up && !pin_wins {
            mask
        } else {
            u32::MAX
        };
        // What an unmeasured rail is assumed to carry: the fastest measured active rail's rate.
        let measured_best = (0..self.cfg.rails)
            .filter(|&r| self.rails[r].is_active())
            .filter_map(|r| self.rails[r].measured_throughput())
            .reduce(f64::max);
        let mut best: Option<(f64, usize, u64)> = None;
        for r in 0..self.cfg.rails {
            if !self.rails[r].is_active() || pin.is_some_and(|p| p != r) || mask & bit(r) == 0 {
                continue;
            }
            let base = r * w;
            let start = self.rails[r].next_lane;
            let Some((lane, room)) = (0..w)
                .map(|k| base + (start + k) % w)
                .map(|l| (l, Self::room(depth, &self.lanes[l])))
                .find(|&(_, room)| room > 0)
            else {
                continue;
            };
            let cost = self.rails[r].cost_among(bytes, measured_best);
            if best.is_none_or(|(c, _, _)| cost < c) {
                best = Some((cost, lane, room));
            }
        }
        best.map(|(_, l, room)| (l, room))
    }

    /// Posts batches of the front pending transfer while lanes have room.
    fn pump_front(&mut self, now: Instant, io: &mut I) -> Next {
        let Some(&key) = self.pending.front() else {
            return Next::Stall;
        };
        let rails = self.cfg.rails;
        let w = self.cfg.lanes_per_rail;
        let slice = self.cfg.slice_size;
        let chunk = if rails > 1 {
            stripe_chunk(slice)
        } else {
            CHUNK as u64
        };
        let end_hint = slice * chunk;
        let Some(t) = self.transfers.get(key) else {
            return Next::Pop;
        };
        if !t.is_active() || t.all_posted() {
            if let Some(t) = self.transfers.get_mut(key) {
                t.queued = false;
            }
            return Next::Pop;
        }
        let mut progressed = false;
        for _ in 0..self.lanes.len() {
            let Some(t) = self.transfers.get(key) else {
                return Next::Pop;
            };
            let pin = t.rail_pin.filter(|&r| self.rails[r].is_active());
            let Some((li, room)) = self.pick_lane(pin, t.rail_mask, end_hint.min(t.bytes)) else {
                break;
            };
            let rail = li / w;
            let room = room.min(chunk) as usize;
            let Some(lane) = self.lanes[li].current(li) else {
                break;
            };
            // Cut up to `room` requests, all of one local segment: from a retry range first,
            // else from the transfer's cursor.
            let t = self.transfers.get_mut(key).expect("looked up above");
            t.rail_pin = pin;
            if t.rail_pin.is_none() && t.bytes <= self.cfg.stripe_min {
                t.rail_pin = Some(rail);
            }
            let retrying = !t.retry.is_empty();
            let (from, to) = match t.retry.last() {
                Some(&r) => r,
                None => (t.next, Cursor::new(t.runs.len(), 0)),
            };
            let first = self.next_wr;
            let pieces = io.pieces();
            pieces.clear();
            let runs = &t.runs;
            let rkeys = &t.rkeys;
            let cut = cut(
                runs,
                |seg| rkeys.get(seg as usize * rails + rail).copied().unwrap_or(0),
                slice,
                from,
                to,
                room,
                first,
                pieces,
            );
            let (reached, bytes) = match cut {
                Ok(c) => c,
                Err(why) => return Next::Reject(key, why),
            };
            let n = io.pieces().len();
            if n == 0 {
                break;
            }
            let Some(local) = runs
                .get(from.run)
                .and_then(|r| t.locals.get(r.local as usize))
            else {
                return Next::Reject(key, Rejection::UnknownLocal { run: from.run });
            };
            match io.post_rdma(lane, t.op, local) {
                PostResult::Posted => {}
                PostResult::Full => {
                    self.lanes[li].full = true;
                    continue;
                }
                PostResult::Rejected(e) => {
                    return Next::Reject(key, Rejection::Driver(DriverError::new(e)))
                }
                // The requests that went are destroyed with the queue pair when the rail fails,
                // and the whole range is posted again.
                PostResult::Broken { error, .. } => {
                    return Next::RailFailed(rail, RailFault::driver(Step::Post, error))
                }
            }
            self.next_wr += n as u64;
            let last = first + n as u64 - 1;
            self.record(
                now, lane, rail, bytes, n as u64, key, first, last, from, reached,
            );
            let t = self.transfers.get_mut(key).expect("looked up above");
            if retrying {
                let idx = t.retry.len() - 1;
                if reached == to {
                    t.retry.pop();
                } else {
                    t.retry[idx].0 = reached;
                }
                for r in &mut self.rails {
                    if let Some(at) = r.failed_at.take() {
                        r.stats.last_failover = Some(now.saturating_duration_since(at));
                    }
                }
            } else {
                t.next = reached;
            }
            progressed = true;
            if t.all_posted() {
                break;
            }
        }
        let Some(t) = self.transfers.get_mut(key) else {
            return Next::Pop;
        };
        if t.all_posted() {
            t.posted_at.get_or_insert(now);
            t.queued = false;
            if cfg!(gdr_mutant = "notify_before_data") && t.notify_state == NotifyState::Waiting {
                // The bug the simulation must find: the notification before the data landed.
                self.notify_due.push_back(key);
            }
            return Next::Pop;
        }
        if progressed {
            Next::Again
        } else {
            // No lane has room.
            Next::Stall
        }
    }

    /// Records a batch posted on `lane`.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        now: Instant,
        lane: LaneRef,
        rail: usize,
        bytes: u64,
        n: u64,
        key: TransferKey,
        first: u64,
        last: u64,
        from: Cursor,
        to: Cursor,
    ) {
        let w = self.cfg.lanes_per_rail;
        let l = &mut self.lanes[lane.lane];
        l.outstanding += n;
        l.posted.push_back(Posted::Slices {
            first,
            last,
            transfer: key,
            from,
            to,
            bytes,
        });
        self.rails[rail].next_lane = (lane.lane % w + 1) % w;
        self.rails[rail].posted(bytes, now);
        if let Some(t) = self.transfers.get_mut(key) {
            t.inflight += n;
            t.lanes_mask |= 1 << (lane.lane % 32);
            if rail < 32 {
                t.rails_mask |= 1 << rail;
            }
        }
    }

    /// Posts the notifications that are due, on the first active rail whose first lane has
    /// room and a free send slot.
    fn pump_notifications(&mut self, now: Instant, io: &mut I) {
        let w = self.cfg.lanes_per_rail;
        let depth = self.cfg.send_depth;
        while let Some(&key) = self.notify_due.front() {
            let due = self
                .transfers
                .get(key)
                .is_some_and(|t| t.is_active() && t.notify_state == NotifyState::Waiting);
            if !due {
                self.notify_due.pop_front();
                continue;
            }
            let Some(rail) = (0..self.cfg.rails).find(|&r| {
                self.rails[r].is_active()
                    && !self.rails[r].free_send_slots.is_empty()
                    && Self::room(depth, &self.lanes[r * w]) > 0
            }) else {
                return;
            };
            let Some(lane) = self.lanes[rail * w].current(rail * w) else {
                return;
            };
            let Some(slot) = self.rails[rail].free_send_slots.pop() else {
                return;
            };
            let t = self.transfers.get_mut(key).expect("checked above");
            if t.notify_id == 0 {
                t.notify_id = self.next_notify_id;
                self.next_notify_id += 1;
            }
            let seq = self.next_wr;
            let header = Header {
                flags: 0,
                id: t.notify_id,
            };
            let data = t.notify.as_deref().unwrap_or(&[]);
            match io.post_message(lane, seq, slot, header, data) {
                PostResult::Posted => {
                    self.next_wr += 1;
                    t.notify_state = NotifyState::Posted;
                    t.inflight += 1;
                    let l = &mut self.lanes[lane.lane];
                    l.outstanding += 1;
                    l.posted.push_back(Posted::Notify {
                        seq,
                        transfer: key,
                        slot,
                    });
                    self.notify_due.pop_front();
                }
                PostResult::Full => {
                    self.rails[rail].free_send_slots.push(slot);
                    self.lanes[lane.lane].full = true;
                }
                PostResult::Rejected(e) => {
                    self.rails[rail].free_send_slots.push(slot);
                    self.notify_due.pop_front();
                    let why = Rejection::Driver(DriverError::new(e));
                    self.stop(now, key, Failure::Rejected { why });
                }
                PostResult::Broken { error, .. } => {
                    self.rails[rail].free_send_slots.push(slot);
                    let why = RailFault::driver(Step::Post, error);
                    self.rail_failed(now, io, rail, None, why);
                }
            }
        }
    }

    /// Posts the probe that re-admits rail `rail` (its new queue pairs are connected).
    pub(crate) fn post_probe(&mut self, io: &mut I, rail: usize) -> Result<(), RailFault> {
        let li = rail * self.cfg.lanes_per_rail;
        let unposted = |why| RailFault::ProbeUnposted { why };
        let lane = self.lanes[li]
            .current(li)
            .ok_or(unposted(Unposted::NoQueuePair))?;
        let slot = self.rails[rail]
            .free_send_slots
            .pop()
            .ok_or(unposted(Unposted::NoSendSlot))?;
        let seq = self.next_wr;
        let header = Header {
            flags: Header::PROBE,
            id: 0,
        };
        match io.post_message(lane, seq, slot, header, &[]) {
            PostResult::Posted => {
                self.next_wr += 1;
                let l = &mut self.lanes[li];
                l.outstanding += 1;
                l.posted.push_back(Posted::Probe { seq, slot });
                Ok(())
            }
            PostResult::Full => Err(unposted(Unposted::QueueFull)),
            PostResult::Rejected(error) | PostResult::Broken { error, .. } => {
                Err(RailFault::driver(Step::Probe, error))
            }
        }
    }
}
