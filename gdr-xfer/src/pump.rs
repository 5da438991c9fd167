//! Posting: notifications that are due, then slices of the pending transfers, on the lanes of
//! the active rails, as far as their send queues have room.
//!
//! Slices are cut from the front transfer (its retry ranges first: ranges whose rail failed),
//! up to [`CHUNK`] per `ibv_post_send`, all of one local segment; only the last request of a
//! chunk is signalled. Each chunk goes to the rail with the lowest cost (its queued bytes over
//! its measured throughput, see [`crate::rail`]) among the active rails with room, so a faster
//! or emptier rail takes more; a transfer of at most `stripe_min` bytes keeps to the rail its
//! first chunk went to. The caller's thread pumps when it submits (so nothing waits for another
//! thread while the queues have room); the progress threads pump whenever completions free
//! room.

use std::sync::atomic::Ordering;
use std::time::Instant;

use gdr::mr::RemoteSlice;
use gdr::qp::{BatchOp, RdmaPiece};
use gdr::wr::SendRequest;

use crate::connection::{Connection, Posted, Queues, CHUNK};
use crate::notify::FLAG_PROBE;
use crate::transfer::{Cursor, NotifyState, TransferState};

impl Connection {
    /// Posts notifications that are due, then slices of the pending transfers, as far as the
    /// send queues have room. A post the provider refuses fails the rail it was for.
    pub(crate) fn pump(&self, q: &mut Queues) {
        if q.closed {
            self.bury(q);
            return;
        }
        if let Err((rail, detail)) = self.pump_notifications(q) {
            self.rail_failed(q, rail, None, detail);
        }
        loop {
            match self.pump_slices(q) {
                Ok(()) => break,
                // The failure re-queued what the rail carried: post it elsewhere.
                Err((rail, detail)) => self.rail_failed(q, rail, None, detail),
            }
            if q.closed || !q.rails.iter().any(|r| r.is_active()) {
                break;
            }
        }
        self.bury(q);
    }

    /// Destroys the queue pairs of failed rails (see `Queues::graveyard`).
    fn bury(&self, q: &mut Queues) {
        if !q.graveyard.is_empty() {
            for (rail, qps) in std::mem::take(&mut q.graveyard) {
                self.forget_qps(rail, qps);
            }
        }
    }

    pub(crate) fn room(&self, q: &Queues, lane: usize) -> u64 {
        match &q.lanes[lane].qp {
            Some(qp) => self.max_send.saturating_sub(qp.send_outstanding()),
            None => 0,
        }
    }

    /// Posts a message (a notification or a probe) on rail `rail`'s first lane, from send
    /// slot `slot`. Returns its wr_id; `Ok(None)` when the queue is full.
    fn post_message(
        &self,
        q: &mut Queues,
        rail: usize,
        slot: u16,
        flags: u8,
        id: u64,
        data: &[u8],
    ) -> Result<Option<u64>, String> {
        let lane = rail * self.qps_per_rail;
        let staged = self.notify[rail]
            .stage(slot, flags, id, data)
            .map_err(|e| e.to_string())?;
        let Some(qp) = &q.lanes[lane].qp else {
            return Ok(None);
        };
        let seq = self.ids.wr.fetch_add(1, Ordering::AcqRel);
        match qp.post_send(&SendRequest::send(&[staged]).id(seq)) {
            Ok(()) => Ok(Some(seq)),
            Err(gdr::Error::QueueFull { .. }) => Ok(None),
            Err(e) => Err(format!("posting a message on QP {:#x}: {e}", qp.qp_num())),
        }
    }

    /// Posts the probe that re-admits rail `rail` (its new queue pairs are connected).
    pub(crate) fn post_probe(&self, q: &mut Queues, rail: usize) -> Result<(), String> {
        let slot = q.rails[rail]
            .free_notify_slots
            .pop()
            .ok_or("no notification slot for the probe")?;
        match self.post_message(q, rail, slot, FLAG_PROBE, 0, &[])? {
            Some(seq) => {
                q.lanes[rail * self.qps_per_rail]
                    .posted
                    .push_back(Posted::Probe { seq, slot });
                Ok(())
            }
            None => Err("the new queue pair's send queue is full".into()),
        }
    }

    fn pump_notifications(&self, q: &mut Queues) -> Result<(), (usize, String)> {
        while let Some(t) = q.notify_due.front().cloned() {
            if t.lock().outcome.is_some() {
                q.notify_due.pop_front();
                continue;
            }
            // The first active rail whose first lane has room and a free slot.
            let Some(rail) = (0..self.nrails).find(|&r| {
                q.rails[r].is_active()
                    && !q.rails[r].free_notify_slots.is_empty()
                    && self.room(q, r * self.qps_per_rail) > 0
            }) else {
                return Ok(());
            };
            let Some(slot) = q.rails[rail].free_notify_slots.pop() else {
                return Ok(());
            };
            let id = {
                let mut p = t.lock();
                if p.notify_id == 0 {
                    p.notify_id = q.next_notify_id;
                    q.next_notify_id += 1;
                }
                p.notify_id
            };
            let data = t.notify.as_deref().unwrap_or(&[]);
            match self.post_message(q, rail, slot, 0, id, data) {
                Ok(Some(seq)) => {
                    q.lanes[rail * self.qps_per_rail]
                        .posted
                        .push_back(Posted::Notify {
                            seq,
                            transfer: t.clone(),
                            slot,
                        });
                    t.lock().notify = NotifyState::Posted;
                    q.notify_due.pop_front();
                }
                Ok(None) => {
                    q.rails[rail].free_notify_slots.push(slot);
                    return Ok(());
                }
                Err(e) => {
                    q.rails[rail].free_notify_slots.push(slot);
                    return Err((rail, e));
                }
            }
        }
        Ok(())
    }

    /// The lane for the next chunk of `bytes` bytes: on the cheapest active rail with room
    /// among the preferred ones (`mask`; any active rail when none of those is), only `pin`'s
    /// rail when given, round robin among that rail's lanes.
    fn pick_lane(
        &self,
        q: &Queues,
        pin: Option<usize>,
        mask: u32,
        bytes: u64,
    ) -> Option<(usize, u64)> {
        if self.nrails == 1 {
            // One rail: no choice to weigh, round robin over its lanes.
            if !q.rails[0].is_active() {
                return None;
            }
            let start = q.rails[0].next_lane;
            return (0..self.qps_per_rail)
                .map(|k| (start + k) % self.qps_per_rail)
                .map(|l| (l, self.room(q, l)))
                .find(|&(_, room)| room > 0);
        }
        let preferred_up = (0..self.nrails).any(|r| mask & (1 << r) != 0 && q.rails[r].is_active());
        let mask = if preferred_up { mask } else { u32::MAX };
        let mut best: Option<(f64, usize, u64)> = None;
        for r in 0..self.nrails {
            if !q.rails[r].is_active() || pin.is_some_and(|p| p != r) || mask & (1 << r) == 0 {
                continue;
            }
            let base = r * self.qps_per_rail;
            let start = q.rails[r].next_lane;
            let Some((lane, room)) = (0..self.qps_per_rail)
                .map(|k| base + (start + k) % self.qps_per_rail)
                .map(|l| (l, self.room(q, l)))
                .find(|&(_, room)| room > 0)
            else {
                continue;
            };
            let cost = q.rails[r].cost(bytes);
            if best.is_none_or(|(c, _, _)| cost < c) {
                best = Some((cost, lane, room));
            }
        }
        best.map(|(_, l, room)| (l, room))
    }

    fn pump_slices(&self, q: &mut Queues) -> Result<(), (usize, String)> {
        let mut pieces = std::mem::take(&mut q.scratch);
        let result = self.pump_slices_with(q, &mut pieces);
        pieces.clear();
        q.scratch = pieces;
        result
    }

    fn pump_slices_with(
        &self,
        q: &mut Queues,
        pieces: &mut Vec<RdmaPiece>,
    ) -> Result<(), (usize, String)> {
        let end_hint = self.slice_size * CHUNK as u64;
        while let Some(t) = q.pending.front().cloned() {
            let mut p = t.lock();
            if p.outcome.is_some() || t.all_posted(&p) {
                p.queued = false;
                drop(p);
                q.pending.pop_front();
                continue;
            }
            let op = match t.op {
                crate::Op::Write => BatchOp::Write,
                crate::Op::Read => BatchOp::Read,
            };
            let mut progressed = false;
            for _ in 0..q.lanes.len() {
                if p.rail_pin.is_some_and(|r| !q.rails[r].is_active()) {
                    p.rail_pin = None;
                }
                let Some((li, room)) =
                    self.pick_lane(q, p.rail_pin, t.rail_mask, end_hint.min(t.bytes))
                else {
                    break;
                };
                let rail = li / self.qps_per_rail;
                if p.rail_pin.is_none() && t.bytes <= self.stripe_min {
                    p.rail_pin = Some(rail);
                }
                let room = room.min(CHUNK as u64) as usize;
                // Cut up to `room` slices, all of one local segment (one batch is one local
                // slice): from a retry range first, else from the transfer's cursor.
                let retrying = !p.retry.is_empty();
                let (from, to) = match p.retry.last() {
                    Some(&(from, to)) => (from, to),
                    None => (
                        Cursor {
                            run: p.next_run,
                            offset: p.run_offset,
                        },
                        Cursor {
                            run: t.runs.len(),
                            offset: 0,
                        },
                    ),
                };
                pieces.clear();
                // The batch's numbers, agent-wide: `room` reserved, the first `n` used (the
                // numbers of a queue pair only need to increase).
                let first = self.ids.wr.fetch_add(room as u64, Ordering::AcqRel);
                let (reached, bytes) =
                    cut(&t, self.slice_size, rail, from, to, room, first, pieces)
                        .map_err(|e| (rail, e))?;
                let n = pieces.len();
                if n == 0 {
                    break;
                }
                let local = &p.locals[t.runs[from.run].local as usize].whole[rail];
                let qp = q.lanes[li]
                    .qp
                    .as_ref()
                    .ok_or((rail, "no queue pair".to_string()))?;
                if let Err(e) = qp.post_rdma_batch(op, local, pieces) {
                    return Err((
                        rail,
                        format!("posting {n} requests on QP {:#x}: {e}", qp.qp_num()),
                    ));
                }
                q.rails[rail].next_lane = (li % self.qps_per_rail + 1) % self.qps_per_rail;
                q.rails[rail].posted(bytes);
                q.lanes[li].posted.push_back(Posted::Slices {
                    first,
                    last: first + n as u64 - 1,
                    transfer: t.clone(),
                    from,
                    to: reached,
                    bytes,
                });
                if retrying {
                    let now = Instant::now();
                    for r in &mut q.rails {
                        if let Some(at) = r.failed_at.take() {
                            r.stats.last_failover = Some(now.duration_since(at));
                        }
                    }
                    let last = p.retry.len() - 1;
                    if reached == to {
                        p.retry.pop();
                    } else {
                        p.retry[last].0 = reached;
                    }
                } else {
                    p.next_run = reached.run;
                    p.run_offset = reached.offset;
                }
                p.slices_posted += n as u64;
                p.qps_mask |= 1 << (li % 32);
                p.rails_mask |= 1 << rail;
                progressed = true;
                if t.all_posted(&p) {
                    break;
                }
            }
            if t.all_posted(&p) {
                p.posted_at.get_or_insert_with(Instant::now);
                p.queued = false;
                drop(p);
                q.pending.pop_front();
                continue;
            }
            if !progressed {
                break;
            }
        }
        Ok(())
    }
}

/// Cuts up to `max` slices of at most `slice_size` bytes from `from` towards `to` (`from <
/// to`), all of the local segment of `from`'s run, into `pieces` (wr_ids `first..`). Returns
/// where it stopped and the bytes cut. (The hot loop of posting: one bound per run, the remote
/// key looked up only when the remote segment changes.)
#[allow(clippy::too_many_arguments)]
fn cut(
    t: &TransferState,
    slice_size: u64,
    rail: usize,
    from: Cursor,
    to: Cursor,
    max: usize,
    first: u64,
    pieces: &mut Vec<RdmaPiece>,
) -> Result<(Cursor, u64), String> {
    // The runs `from` to `to`: the last one partly when `to` is inside it.
    let end_run = if to.offset == 0 { to.run } else { to.run + 1 };
    let runs = &t.runs[from.run..end_run];
    let last = runs.len().saturating_sub(1);
    let Some(head) = runs.first() else {
        return Ok((from, 0));
    };
    let local = head.local;
    let mut remote_seg = head.remote;
    let mut rkey = t.rkey(head, rail);
    let mut bytes = 0;
    let mut off = from.offset;
    // Pieces cut so far (`pieces` starts empty), kept out of the vector's length field.
    let mut n = pieces.len();
    for (i, run) in runs.iter().enumerate() {
        if run.local != local {
            return Ok((
                Cursor {
                    run: from.run + i,
                    offset: 0,
                },
                bytes,
            ));
        }
        if run.remote != remote_seg {
            remote_seg = run.remote;
            rkey = t.rkey(run, rail);
        }
        let end = if i == last && to.offset != 0 {
            to.offset
        } else {
            run.len
        };
        while off < end {
            if n >= max {
                return Ok((
                    Cursor {
                        run: from.run + i,
                        offset: off,
                    },
                    bytes,
                ));
            }
            // Up to the range's end (a retry range may end inside a run).
            let len = (end - off).min(slice_size);
            // In range: the plan checked the run against both segments.
            let remote = RemoteSlice::new(run.remote_addr + off, len, rkey)
                .ok_or("a remote range overflows")?;
            pieces.push(RdmaPiece {
                offset: (run.local_offset + off) as usize,
                remote,
                wr_id: first + n as u64,
            });
            n += 1;
            bytes += len;
            off += len;
        }
        off = 0;
    }
    Ok((to, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::Run;
    use std::time::Duration;

    fn run(local: u32, remote: u32, remote_addr: u64, len: u64) -> Run {
        Run {
            local,
            local_offset: 0x1000,
            remote_addr,
            remote,
            len,
        }
    }

    /// Runs A (100 KiB), B (16 KiB, another remote segment), C (another local segment);
    /// slices of 64 KiB; keys per (remote segment, rail).
    fn state() -> TransferState {
        let runs = vec![
            run(0, 0, 0x10_0000, 100 << 10),
            run(0, 1, 0x20_0000, 16 << 10),
            run(1, 0, 0x30_0000, 16 << 10),
        ];
        let rkeys = vec![0xa0, 0xa1, 0xb0, 0xb1];
        TransferState::new(
            crate::Op::Write,
            "p".into(),
            Duration::from_secs(1),
            Vec::new(),
            runs,
            rkeys,
            2,
            64 << 10,
            3,
            None,
        )
    }

    fn at(run: usize, offset: u64) -> Cursor {
        Cursor { run, offset }
    }

    fn cut_all(from: Cursor, to: Cursor, max: usize, rail: usize) -> (Cursor, u64, Vec<RdmaPiece>) {
        let t = state();
        let mut pieces = Vec::new();
        let (c, b) = cut(&t, 64 << 10, rail, from, to, max, 100, &mut pieces).unwrap();
        (c, b, pieces)
    }

    #[test]
    fn cutting_stops_at_a_local_segment_change_and_numbers_the_pieces() {
        let end = at(3, 0);
        let (c, bytes, p) = cut_all(at(0, 0), end, 32, 0);
        assert_eq!(
            c,
            at(2, 0),
            "C belongs to another local segment: next batch"
        );
        assert_eq!(bytes, 116 << 10);
        let got: Vec<_> = p
            .iter()
            .map(|x| {
                (
                    x.offset,
                    x.remote.addr(),
                    x.remote.len(),
                    x.remote.rkey(),
                    x.wr_id,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (0x1000, 0x10_0000, 64 << 10, 0xa0, 100),
                (
                    0x1000 + (64 << 10),
                    0x10_0000 + (64 << 10),
                    36 << 10,
                    0xa0,
                    101
                ),
                // B's remote segment has its own key.
                (0x1000, 0x20_0000, 16 << 10, 0xb0, 102),
            ]
        );
        // On rail 1, the rail-1 keys.
        let (_, _, p) = cut_all(at(0, 0), end, 32, 1);
        assert_eq!(
            p.iter().map(|x| x.remote.rkey()).collect::<Vec<_>>(),
            [0xa1, 0xa1, 0xb1]
        );
        // From C on: C alone, to the end.
        let (c, bytes, p) = cut_all(at(2, 0), end, 32, 0);
        assert_eq!((c, bytes, p.len()), (end, 16 << 10, 1));
    }

    #[test]
    fn cutting_stops_at_the_room_and_at_a_retry_range_end() {
        let end = at(3, 0);
        // Room for one: the cursor stops inside A, at the slice boundary.
        let (c, bytes, p) = cut_all(at(0, 0), end, 1, 0);
        assert_eq!((c, bytes, p.len()), (at(0, 64 << 10), 64 << 10, 1));
        // Resuming there gives the rest of A, then B.
        let (c, _, p) = cut_all(c, end, 32, 0);
        assert_eq!((c, p.len()), (at(2, 0), 2));
        assert_eq!(p[0].remote.len(), 36 << 10);
        // A retry range ending inside a run: exactly that range, the same slices as first cut.
        let (c, bytes, p) = cut_all(at(0, 0), at(0, 64 << 10), 32, 0);
        assert_eq!((c, bytes, p.len()), (at(0, 64 << 10), 64 << 10, 1));
        // A range ending at a run boundary.
        let (c, bytes, p) = cut_all(at(0, 64 << 10), at(1, 0), 32, 0);
        assert_eq!((c, bytes, p.len()), (at(1, 0), 36 << 10, 1));
        // Room exhausted exactly at the end of a run: the next call starts at the next run.
        let (c, _, p) = cut_all(at(0, 0), end, 2, 0);
        assert_eq!((c, p.len()), (at(1, 0), 2));
    }
}
