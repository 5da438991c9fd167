//! The connection to a peer: its queue pairs, its segment table, the queues of transfers to it,
//! and the posting and completion accounting behind them.
//!
//! # Posting and completion accounting
//!
//! Transfers to a peer wait in one FIFO. Posting ([`Connection::pump`]) takes slices from the
//! front transfer and posts them in chunks of up to [`CHUNK`] requests, one `ibv_post_send` per
//! chunk, to the peer's queue pairs in turn, as far as their send queues have room; only the
//! last request of a chunk is signalled. The caller's thread pumps when it submits (so nothing
//! waits for another thread while the queues have room); the progress thread pumps whenever
//! completions free room.
//!
//! Every send-queue request of a queue pair gets the next number of that queue pair's sequence
//! as its `wr_id`; a record per chunk says which transfer the numbers belong to. A successful
//! completion with number `s` means every request up to `s` on that queue pair completed (RC
//! completes in order), so the records up to `s` are credited to their transfers. An error
//! completion breaks the connection: every transfer pending to the peer fails, and the queue
//! pairs go to the error state (gdr keeps the memory of their requests until the NIC is done).

use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::Instant;

use gdr::connect::TcpLink;
use gdr::mr::{LocalSlice, RemoteSlice};
use gdr::qp::{BatchOp, QueuePair, RdmaPiece};
use gdr::wr::SendRequest;
use gdr::{Completion, WcStatus};

use crate::agent::AgentShared;
use crate::notify::{Notification, NotifyPool};
use crate::transfer::{Failure, NotifyState, TransferState};
use crate::wire::{Message, SegmentInfo};

/// Most requests per `ibv_post_send` call (one doorbell), and between two signalled ones.
pub(crate) const CHUNK: usize = 32;

/// What a run of sequence numbers on one queue pair belongs to.
enum Posted {
    Slices {
        first: u64,
        last: u64,
        transfer: Arc<TransferState>,
    },
    Notify {
        seq: u64,
        transfer: Arc<TransferState>,
        slot: u16,
    },
}

#[derive(Default)]
struct QpTrack {
    next_seq: u64,
    posted: VecDeque<Posted>,
}

/// The mutable part of a peer: its transfers and what each queue pair carries.
pub(crate) struct Queues {
    /// Transfers with slices not yet posted, in submission order.
    pending: VecDeque<Arc<TransferState>>,
    /// Transfers whose data is done and whose notification waits for a send slot.
    notify_due: VecDeque<Arc<TransferState>>,
    /// Every unfinished transfer (for deadlines and for failing them all at once).
    active: Vec<Arc<TransferState>>,
    tracks: Vec<QpTrack>,
    next_qp: usize,
    free_notify_slots: Vec<u16>,
    /// Set when the peer is lost: nothing is posted any more.
    closed: bool,
    /// The pieces of the batch being posted (kept to post without allocating).
    scratch: Vec<RdmaPiece>,
}

/// Everything about one connected peer.
pub(crate) struct Connection {
    pub(crate) name: String,
    pub(crate) agent: Weak<AgentShared>,
    pub(crate) qps: Vec<QueuePair>,
    pub(crate) max_send: u64,
    pub(crate) slice_size: u64,
    pub(crate) remote: RwLock<HashMap<u32, SegmentInfo>>,
    /// The largest notification the peer accepts.
    pub(crate) peer_notify_max: u32,
    pub(crate) notify: NotifyPool,
    pub(crate) writer: Mutex<TcpLink>,
    /// A clone of the control socket, to shut it down (which ends the reader thread).
    pub(crate) socket: TcpStream,
    lost: AtomicBool,
    /// Set when the peer went away (its goodbye, or its socket closed): new transfers are
    /// refused at once; those in flight are failed once the completions already queued were
    /// handled (see `AgentShared::remove_peer_after_drain`).
    closing: Mutex<Option<String>>,
    /// Set once both sides exchanged their tables: the peer is visible to the application.
    ready: AtomicBool,
    lost_reason: Mutex<Option<String>>,
    queues: Mutex<Queues>,
}

impl Connection {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: String,
        agent: Weak<AgentShared>,
        qps: Vec<QueuePair>,
        slice_size: u64,
        peer_notify_max: u32,
        notify: NotifyPool,
        writer: TcpLink,
        socket: TcpStream,
    ) -> Connection {
        let max_send = qps.first().map_or(1, |q| u64::from(q.config().max_send_wr));
        let tracks = qps.iter().map(|_| QpTrack::default()).collect();
        let free_notify_slots = (0..notify.slots).rev().collect();
        Connection {
            name,
            agent,
            max_send,
            slice_size,
            qps,
            remote: RwLock::new(HashMap::new()),
            peer_notify_max,
            notify,
            writer: Mutex::new(writer),
            socket,
            lost: AtomicBool::new(false),
            closing: Mutex::new(None),
            ready: AtomicBool::new(false),
            lost_reason: Mutex::new(None),
            queues: Mutex::new(Queues {
                pending: VecDeque::new(),
                notify_due: VecDeque::new(),
                active: Vec::new(),
                tracks,
                next_qp: 0,
                free_notify_slots,
                closed: false,
                scratch: Vec::with_capacity(CHUNK),
            }),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
        if let Some(a) = self.agent.upgrade() {
            a.notify_peers_changed();
        }
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Why the peer was lost, if it was.
    pub(crate) fn lost_reason(&self) -> Option<String> {
        self.lost_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Marks the peer as gone without failing what is in flight yet (see `closing`).
    pub(crate) fn set_closing(&self, reason: String) {
        let mut c = self.closing.lock().unwrap_or_else(|p| p.into_inner());
        c.get_or_insert(reason);
    }

    /// Why the peer is gone, if it is (closing or lost).
    pub(crate) fn gone_reason(&self) -> Option<String> {
        self.lost_reason().or_else(|| {
            self.closing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        })
    }

    /// Queues a transfer and posts what fits now.
    pub(crate) fn submit(&self, t: Arc<TransferState>) -> Result<(), Failure> {
        let mut q = self.lock();
        if q.closed || self.gone_reason().is_some() {
            return Err(Failure::PeerLost {
                reason: self
                    .gone_reason()
                    .unwrap_or_else(|| "connection closed".into()),
            });
        }
        q.active.push(t.clone());
        if t.slices_total == 0 {
            // Nothing to move (cannot happen through the public API, which refuses empty
            // lists); finish it right away.
            let mut p = t.lock();
            t.credit(&mut p, 0);
            if p.notify == NotifyState::Waiting {
                drop(p);
                q.notify_due.push_back(t);
            }
        } else {
            q.pending.push_back(t);
        }
        self.pump(&mut q);
        Ok(())
    }

    /// Posts notifications that are due, then slices of the pending transfers, as far as the
    /// send queues have room.
    pub(crate) fn pump(&self, q: &mut Queues) {
        if q.closed {
            return;
        }
        if let Err(detail) = self
            .pump_notifications(q)
            .and_then(|()| self.pump_slices(q))
        {
            self.lose_locked(q, Failure::Post { detail });
        }
    }

    fn room(&self, qi: usize) -> u64 {
        self.max_send
            .saturating_sub(self.qps[qi].send_outstanding())
    }

    fn pump_notifications(&self, q: &mut Queues) -> Result<(), String> {
        while let Some(t) = q.notify_due.front().cloned() {
            if t.lock().outcome.is_some() {
                q.notify_due.pop_front();
                continue;
            }
            if self.room(0) == 0 {
                return Ok(());
            }
            let Some(slot) = q.free_notify_slots.pop() else {
                return Ok(());
            };
            let data = t.notify.as_deref().unwrap_or(&[]);
            let staged = self.notify.stage(slot, data).map_err(|e| e.to_string())?;
            let seq = q.tracks[0].next_seq;
            let sges: Vec<LocalSlice> = staged.into_iter().collect();
            match self.qps[0].post_send(&SendRequest::send(&sges).id(seq)) {
                Ok(()) => {}
                Err(gdr::Error::QueueFull { .. }) => {
                    q.free_notify_slots.push(slot);
                    return Ok(());
                }
                Err(e) => return Err(format!("posting a notification: {e}")),
            }
            q.tracks[0].next_seq += 1;
            q.tracks[0].posted.push_back(Posted::Notify {
                seq,
                transfer: t.clone(),
                slot,
            });
            t.lock().notify = NotifyState::Posted;
            q.notify_due.pop_front();
        }
        Ok(())
    }

    fn pump_slices(&self, q: &mut Queues) -> Result<(), String> {
        let mut pieces = std::mem::take(&mut q.scratch);
        let result = self.pump_slices_with(q, &mut pieces);
        pieces.clear();
        q.scratch = pieces;
        result
    }

    fn pump_slices_with(&self, q: &mut Queues, pieces: &mut Vec<RdmaPiece>) -> Result<(), String> {
        let nqp = self.qps.len();
        while let Some(t) = q.pending.front().cloned() {
            let mut p = t.lock();
            if p.outcome.is_some() || t.all_posted(&p) {
                drop(p);
                q.pending.pop_front();
                continue;
            }
            let op = match t.op {
                crate::Op::Write => BatchOp::Write,
                crate::Op::Read => BatchOp::Read,
            };
            let mut progressed = false;
            for _ in 0..nqp {
                let qi = q.next_qp;
                q.next_qp = (q.next_qp + 1) % nqp;
                let room = self.room(qi).min(CHUNK as u64) as usize;
                if room == 0 {
                    continue;
                }
                // Cut up to `room` slices from the transfer's cursor, all of one local segment
                // (one batch is one local slice).
                pieces.clear();
                let local = t.runs[p.next_run].local;
                let first = q.tracks[qi].next_seq;
                while pieces.len() < room && p.next_run < t.runs.len() {
                    let run = &t.runs[p.next_run];
                    if run.local != local {
                        break;
                    }
                    let len = (run.len - p.run_offset).min(self.slice_size);
                    // In range: the plan checked the run against both segments.
                    let remote = RemoteSlice::new(run.remote_addr + p.run_offset, len, run.rkey)
                        .ok_or("a remote range overflows")?;
                    pieces.push(RdmaPiece {
                        offset: (run.local_offset + p.run_offset) as usize,
                        remote,
                        wr_id: first + pieces.len() as u64,
                    });
                    p.run_offset += len;
                    if p.run_offset == run.len {
                        p.next_run += 1;
                        p.run_offset = 0;
                    }
                }
                let n = pieces.len();
                if let Err(e) = self.qps[qi].post_rdma_batch(op, &p.locals[local as usize], pieces)
                {
                    return Err(format!(
                        "posting {n} requests on QP {:#x}: {e}",
                        self.qps[qi].qp_num()
                    ));
                }
                q.tracks[qi].next_seq += n as u64;
                q.tracks[qi].posted.push_back(Posted::Slices {
                    first,
                    last: first + n as u64 - 1,
                    transfer: t.clone(),
                });
                p.slices_posted += n as u64;
                p.qps_mask |= 1 << qi;
                progressed = true;
                if t.all_posted(&p) {
                    break;
                }
            }
            if t.all_posted(&p) {
                p.posted_at = Some(Instant::now());
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

    /// Handles a send-queue completion of queue pair `qi`.
    pub(crate) fn on_send_completion(&self, qi: usize, c: &Completion) {
        let mut q = self.lock();
        if c.status != WcStatus::Success {
            if !q.closed {
                log::warn!(
                    "peer {}: request {} on QP {:#x} completed with {} (vendor error {:#x}): the connection is broken",
                    self.name,
                    c.wr_id,
                    c.qp_num,
                    c.status,
                    c.vendor_err
                );
            }
            self.lose_locked(
                &mut q,
                Failure::Slice {
                    qp_num: c.qp_num,
                    status: c.status,
                    vendor_err: c.vendor_err,
                },
            );
            return;
        }
        let s = c.wr_id;
        let mut due = Vec::new();
        let mut freed = Vec::new();
        let track = &mut q.tracks[qi];
        while let Some(front) = track.posted.front_mut() {
            match front {
                Posted::Slices {
                    first,
                    last,
                    transfer,
                } if *first <= s => {
                    let done = (*last).min(s) - *first + 1;
                    let mut p = transfer.lock();
                    if transfer.credit(&mut p, done) {
                        due.push(transfer.clone());
                    }
                    drop(p);
                    if *last <= s {
                        track.posted.pop_front();
                    } else {
                        *first = s + 1;
                        break;
                    }
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
                    track.posted.pop_front();
                }
                _ => break,
            }
        }
        q.free_notify_slots.extend(freed);
        q.notify_due.extend(due);
        self.pump(&mut q);
    }

    /// Handles a receive completion (a notification) of the first queue pair.
    pub(crate) fn on_recv_completion(&self, c: &Completion) -> Option<Notification> {
        if c.status != WcStatus::Success {
            if !self.is_lost() {
                let mut q = self.lock();
                self.lose_locked(
                    &mut q,
                    Failure::Slice {
                        qp_num: c.qp_num,
                        status: c.status,
                        vendor_err: c.vendor_err,
                    },
                );
            }
            return None;
        }
        let Ok(slot) = u16::try_from(c.wr_id) else {
            return None;
        };
        if slot >= self.notify.slots {
            return None;
        }
        let data = match self.notify.take(slot, c.byte_len) {
            Ok(d) => d,
            Err(e) => {
                log::error!("peer {}: reading notification slot {slot}: {e}", self.name);
                Vec::new()
            }
        };
        if let Err(e) = self.notify.post_recv(&self.qps[0], slot) {
            if !self.is_lost() {
                log::error!(
                    "peer {}: reposting notification slot {slot}: {e}",
                    self.name
                );
            }
        }
        Some(Notification {
            peer: self.name.clone(),
            data,
        })
    }

    /// Fails transfers past their deadline, forgets finished ones, and posts what fits (room
    /// may have been freed by completions gdr consumed on its own).
    pub(crate) fn tick(&self, now: Instant) -> bool {
        let mut q = self.lock();
        q.active.retain(|t| {
            let mut p = t.lock();
            if p.outcome.is_some() {
                return false;
            }
            if t.deadline.is_some_and(|d| now >= d) {
                t.finish(&mut p, Err(Failure::Timeout { after: t.timeout }));
                return false;
            }
            true
        });
        self.pump(&mut q);
        !q.active.is_empty()
    }

    /// Marks the peer lost: every unfinished transfer fails with `failure`, nothing more is
    /// posted, the queue pairs move to the error state (their requests complete as flushed;
    /// gdr keeps their memory until then), and the control socket is shut down.
    pub(crate) fn lose(&self, failure: Failure) {
        let mut q = self.lock();
        self.lose_locked(&mut q, failure);
    }

    fn lose_locked(&self, q: &mut Queues, failure: Failure) {
        if q.closed {
            return;
        }
        q.closed = true;
        let reason = match &failure {
            Failure::PeerLost { reason } => reason.clone(),
            Failure::Slice { status, qp_num, .. } => {
                format!("a request on QP {qp_num:#x} completed with {status}")
            }
            Failure::Post { detail } => detail.clone(),
            Failure::Timeout { after } => format!("timed out after {after:?}"),
            Failure::AgentClosed => "the agent was shut down".into(),
        };
        *self.lost_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
        self.lost.store(true, Ordering::Release);
        for t in q.active.drain(..) {
            let mut p = t.lock();
            t.finish(&mut p, Err(failure.clone()));
        }
        q.pending.clear();
        q.notify_due.clear();
        for track in &mut q.tracks {
            track.posted.clear();
        }
        for qp in &self.qps {
            if let Err(e) = qp.disconnect() {
                log::debug!(
                    "peer {}: moving QP {:#x} to error: {e}",
                    self.name,
                    qp.qp_num()
                );
            }
        }
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }

    /// Sends a control message to the peer; a failure loses the peer.
    pub(crate) fn send_control(&self, msg: &Message) {
        let result = msg.encode().map_err(|e| e.to_string()).and_then(|bytes| {
            self.writer
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .send_bytes(&bytes)
                .map_err(|e| e.to_string())
        });
        if let Err(e) = result {
            self.lose(Failure::PeerLost {
                reason: format!("control connection: {e}"),
            });
        }
    }

    /// Applies a control message from the peer (after the handshake). An error means the peer
    /// must be dropped.
    pub(crate) fn apply(&self, msg: Message) -> Result<(), String> {
        let mut table = self.remote.write().unwrap_or_else(|p| p.into_inner());
        apply_to(&mut table, msg)
    }
}

/// Most segments a peer may announce: a hostile peer cannot grow our table without bound.
pub(crate) const MAX_REMOTE_SEGMENTS: usize = 1 << 20;

/// Applies a peer's control message to its segment table: announcements add (an id announced
/// twice, or past [`MAX_REMOTE_SEGMENTS`], is the peer lying: an error, nothing of that message
/// is kept), removals remove (unknown ids are ignored: a removal may cross an announcement),
/// a goodbye or a second handshake message is an error.
pub(crate) fn apply_to(table: &mut HashMap<u32, SegmentInfo>, msg: Message) -> Result<(), String> {
    match msg {
        Message::Segments(list) => {
            if table.len() + list.len() > MAX_REMOTE_SEGMENTS {
                return Err(format!(
                    "announced more than {MAX_REMOTE_SEGMENTS} segments"
                ));
            }
            let mut seen = std::collections::HashSet::with_capacity(list.len());
            for s in &list {
                if table.contains_key(&s.id) || !seen.insert(s.id) {
                    return Err(format!("announced segment {} twice", s.id));
                }
            }
            for s in list {
                table.insert(s.id, s);
            }
            Ok(())
        }
        Message::Removed(ids) => {
            for id in ids {
                table.remove(&id);
            }
            Ok(())
        }
        Message::Bye(reason) => Err(format!("the peer said goodbye: {reason}")),
        Message::Hello(_) | Message::Ready => {
            Err("unexpected handshake message after the handshake".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::location::Location;

    fn seg(id: u32) -> SegmentInfo {
        SegmentInfo {
            id,
            name: format!("s{id}"),
            addr: 0x1000 * u64::from(id),
            len: 4096,
            rkey: id,
            location: Location::Cpu { numa: None },
        }
    }

    #[test]
    fn a_peer_that_lies_about_its_segments_is_dropped_and_changes_nothing() {
        let mut t = HashMap::new();
        apply_to(&mut t, Message::Segments(vec![seg(1), seg(2)])).unwrap();
        // The same id again, in a later message or twice in one: refused, nothing added.
        let e = apply_to(&mut t, Message::Segments(vec![seg(3), seg(1)])).unwrap_err();
        assert!(e.contains("segment 1 twice"), "{e}");
        let e = apply_to(&mut t, Message::Segments(vec![seg(4), seg(4)])).unwrap_err();
        assert!(e.contains("segment 4 twice"), "{e}");
        assert_eq!(t.len(), 2);
        assert!(!t.contains_key(&3) && !t.contains_key(&4));
        // Removals of unknown ids are harmless; known ones go.
        apply_to(&mut t, Message::Removed(vec![2, 99])).unwrap();
        assert_eq!(t.keys().copied().collect::<Vec<_>>(), [1]);
        // A removed id announced again is a new segment (ids are never reused by honest peers,
        // and a dishonest one only redirects its own memory).
        apply_to(&mut t, Message::Segments(vec![seg(2)])).unwrap();
        // Goodbye and handshake messages end the connection.
        assert!(apply_to(&mut t, Message::Bye("x".into())).is_err());
        assert!(apply_to(&mut t, Message::Ready).is_err());
    }

    #[test]
    fn a_peer_cannot_grow_the_table_without_bound() {
        let mut t: HashMap<u32, SegmentInfo> = (0..MAX_REMOTE_SEGMENTS as u32 - 1)
            .map(|i| (i, seg(i)))
            .collect();
        let e = apply_to(
            &mut t,
            Message::Segments(vec![seg(u32::MAX - 1), seg(u32::MAX)]),
        )
        .unwrap_err();
        assert!(e.contains("more than"), "{e}");
        assert_eq!(t.len(), MAX_REMOTE_SEGMENTS - 1);
        apply_to(&mut t, Message::Segments(vec![seg(u32::MAX)])).unwrap();
    }
}
