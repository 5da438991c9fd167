//! The connection to a peer: its lanes (queue pairs, per shared rail), its segment table, the
//! queues of transfers to it, and its lifecycle.
//!
//! # Lanes, sequence numbers and records
//!
//! A connection has `qps_per_peer` queue pairs on each rail it shares with the peer; each is a
//! *lane*. Every send-queue request gets an agent-wide increasing number as its `wr_id`; a
//! record per chunk of requests says which transfer (and which range of its runs) the numbers
//! belong to. A successful completion with number `s` on a lane means every request up to `s`
//! on that lane completed (RC completes in order), so the records up to `s` are credited.
//!
//! A queue pair is replaced when its rail fails ([`crate::failover`]). Its completions still
//! queued are recognised as stale, and ignored, by the queue pair number and the lane's first
//! number (a replacement gets numbers above every earlier one); receive completions carry
//! the queue pair's generation.
//!
//! Posting is in [`crate::pump`], completions and failover in [`crate::failover`].

use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::Instant;

use gdr::connect::TcpLink;
use gdr::qp::{QueuePair, RdmaPiece};

use crate::agent::AgentShared;
use crate::notify::{NotifyPool, Seen};
use crate::rail::{RailLink, RailStats};
use crate::transfer::{Cursor, Failure, NotifyState, TransferState};
use crate::wire::{Message, SegmentInfo};

/// Most requests per `ibv_post_send` call (one doorbell), and between two signalled ones.
pub(crate) const CHUNK: usize = 32;

/// Agent-wide numbers: work request ids and queue pair generations, both only increasing.
#[derive(Default)]
pub(crate) struct Ids {
    pub(crate) wr: AtomicU64,
    pub(crate) gen: AtomicU64,
}

/// What a run of sequence numbers on one lane belongs to.
pub(crate) enum Posted {
    Slices {
        first: u64,
        last: u64,
        transfer: Arc<TransferState>,
        /// The range of the transfer's runs these requests cover (to post again elsewhere).
        from: Cursor,
        to: Cursor,
        bytes: u64,
    },
    Notify {
        seq: u64,
        transfer: Arc<TransferState>,
        slot: u16,
    },
    Probe {
        seq: u64,
        slot: u16,
    },
}

/// One queue pair of a connection, on one rail.
pub(crate) struct Lane {
    /// `None` while its rail is down (destroyed at the failure, replaced at the renewal).
    pub(crate) qp: Option<QueuePair>,
    /// The queue pair's generation (agent-wide), in its receive wr_ids.
    pub(crate) gen: u64,
    /// The lowest wr_id the queue pair can have given: completions below are stale.
    pub(crate) first_wr: u64,
    pub(crate) posted: VecDeque<Posted>,
}

impl Lane {
    pub(crate) fn new(qp: QueuePair, ids: &Ids) -> Lane {
        Lane {
            qp: Some(qp),
            gen: ids.gen.fetch_add(1, Ordering::AcqRel),
            first_wr: ids.wr.load(Ordering::Acquire),
            posted: VecDeque::new(),
        }
    }
}

/// A renewal we offered the peer for one rail.
pub(crate) struct Offer {
    pub(crate) epoch: u32,
    pub(crate) lanes: Vec<Lane>,
}

/// The mutable part of a peer: its transfers, lanes and rails.
pub(crate) struct Queues {
    /// Transfers with slices not yet posted, oldest first.
    pub(crate) pending: VecDeque<Arc<TransferState>>,
    /// Transfers whose data is done and whose notification waits for a send slot.
    pub(crate) notify_due: VecDeque<Arc<TransferState>>,
    /// Every unfinished transfer (for deadlines and for failing them all at once).
    pub(crate) active: Vec<Arc<TransferState>>,
    /// `rails x qps_per_rail` lanes, rail-major.
    pub(crate) lanes: Vec<Lane>,
    pub(crate) rails: Vec<RailLink>,
    pub(crate) offers: Vec<Option<Offer>>,
    pub(crate) next_notify_id: u64,
    /// Notification ids delivered from the peer.
    pub(crate) seen: Seen,
    /// Set when the peer is lost: nothing is posted any more.
    pub(crate) closed: bool,
    /// The pieces of the batch being posted (kept to post without allocating).
    pub(crate) scratch: Vec<RdmaPiece>,
    /// Queue pairs of failed rails (rail, queue pairs), destroyed at the end of the pump that
    /// posts what they carried elsewhere: after the re-posts left, before the queues are
    /// unlocked (so before any of those re-posts can be seen complete). Destroying a queue
    /// pair with much in flight can take a while in the provider.
    pub(crate) graveyard: Vec<(usize, Vec<QueuePair>)>,
}

/// Everything about one connected peer.
pub(crate) struct Connection {
    pub(crate) name: String,
    pub(crate) agent: Weak<AgentShared>,
    /// Whether we connected (the initiator's renewal wins when both sides renew a rail).
    pub(crate) initiator: bool,
    pub(crate) ids: Arc<Ids>,
    /// Rails shared with the peer.
    pub(crate) nrails: usize,
    pub(crate) qps_per_rail: usize,
    /// (device, port) of each shared rail.
    pub(crate) rail_names: Vec<(String, u8)>,
    pub(crate) max_send: u64,
    pub(crate) slice_size: u64,
    /// Transfers up to this many bytes stay on one rail.
    pub(crate) stripe_min: u64,
    pub(crate) remote: RwLock<HashMap<u32, SegmentInfo>>,
    /// The largest notification the peer accepts.
    pub(crate) peer_notify_max: u32,
    /// Notification buffers, one pool per shared rail.
    pub(crate) notify: Vec<NotifyPool>,
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

/// What a new connection is made of.
pub(crate) struct Parts {
    pub(crate) name: String,
    pub(crate) agent: Weak<AgentShared>,
    pub(crate) initiator: bool,
    pub(crate) ids: Arc<Ids>,
    pub(crate) lanes: Vec<Lane>,
    pub(crate) qps_per_rail: usize,
    pub(crate) rail_names: Vec<(String, u8)>,
    pub(crate) slice_size: u64,
    pub(crate) stripe_min: u64,
    pub(crate) peer_notify_max: u32,
    pub(crate) notify: Vec<NotifyPool>,
    pub(crate) writer: TcpLink,
    pub(crate) socket: TcpStream,
}

impl Connection {
    pub(crate) fn new(p: Parts) -> Connection {
        let max_send = p
            .lanes
            .first()
            .and_then(|l| l.qp.as_ref())
            .map_or(1, |q| u64::from(q.config().max_send_wr));
        let nrails = p.rail_names.len();
        let now = Instant::now();
        let slots = p.notify.first().map_or(0, |n| n.slots);
        Connection {
            name: p.name,
            agent: p.agent,
            initiator: p.initiator,
            ids: p.ids,
            nrails,
            qps_per_rail: p.qps_per_rail,
            rail_names: p.rail_names,
            max_send,
            slice_size: p.slice_size,
            stripe_min: p.stripe_min,
            remote: RwLock::new(HashMap::new()),
            peer_notify_max: p.peer_notify_max,
            notify: p.notify,
            writer: Mutex::new(p.writer),
            socket: p.socket,
            lost: AtomicBool::new(false),
            closing: Mutex::new(None),
            ready: AtomicBool::new(false),
            lost_reason: Mutex::new(None),
            queues: Mutex::new(Queues {
                pending: VecDeque::new(),
                notify_due: VecDeque::new(),
                active: Vec::new(),
                lanes: p.lanes,
                rails: (0..nrails).map(|_| RailLink::new(slots, now)).collect(),
                offers: (0..nrails).map(|_| None).collect(),
                next_notify_id: 1,
                seen: Seen::default(),
                closed: false,
                scratch: Vec::with_capacity(CHUNK),
                graveyard: Vec::new(),
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

    /// The queue pair numbers of the live lanes, rail-major.
    pub(crate) fn qp_nums(&self) -> Vec<u32> {
        let q = self.lock();
        q.lanes
            .iter()
            .filter_map(|l| l.qp.as_ref().map(|qp| qp.qp_num()))
            .collect()
    }

    /// Telemetry of every shared rail.
    pub(crate) fn rail_stats(&self) -> Vec<RailStats> {
        let q = self.lock();
        q.rails
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let (dev, port) = self.rail_names[i].clone();
                r.snapshot(i, dev, port)
            })
            .collect()
    }

    /// Why no rail is usable: each rail's state and last error.
    pub(crate) fn rails_down_detail(&self, q: &Queues) -> String {
        q.rails
            .iter()
            .enumerate()
            .map(|(i, r)| {
                format!(
                    "rail {i} ({}:{}) {:?}{}",
                    self.rail_names[i].0,
                    self.rail_names[i].1,
                    r.state,
                    r.stats
                        .last_error
                        .as_deref()
                        .map_or(String::new(), |e| format!(": {e}"))
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
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
        if !q.rails.iter().any(|r| r.is_active()) {
            return Err(Failure::NoRail {
                detail: self.rails_down_detail(&q),
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
            t.lock().queued = true;
            q.pending.push_back(t);
        }
        self.pump(&mut q);
        Ok(())
    }

    /// Fails transfers past their deadline, forgets finished ones, samples the rails'
    /// throughput, starts the renewals that are due, and posts what fits (room may have been
    /// freed by completions gdr consumed on its own). Returns the control messages to send
    /// (after the lock is released) and whether transfers remain.
    pub(crate) fn tick(&self, now: Instant) -> (Vec<Message>, bool) {
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
        for r in &mut q.rails {
            r.sample(now);
        }
        let msgs = if q.closed {
            Vec::new()
        } else {
            self.renewals_due(&mut q, now)
        };
        self.pump(&mut q);
        (msgs, !q.active.is_empty())
    }

    /// Marks the peer lost: every unfinished transfer fails with `failure`, nothing more is
    /// posted, the queue pairs move to the error state (their requests complete as flushed;
    /// gdr keeps their memory until then), and the control socket is shut down.
    pub(crate) fn lose(&self, failure: Failure) {
        let mut q = self.lock();
        self.lose_locked(&mut q, failure);
    }

    pub(crate) fn lose_locked(&self, q: &mut Queues, failure: Failure) {
        if q.closed {
            return;
        }
        q.closed = true;
        let reason = match &failure {
            Failure::PeerLost { reason } => reason.clone(),
            Failure::Slice { status, qp_num, .. } => {
                format!("a request on QP {qp_num:#x} completed with {status}")
            }
            Failure::NoRail { detail } => format!("no rail left: {detail}"),
            Failure::Timeout { after } => format!("timed out after {after:?}"),
            Failure::AgentClosed => "the agent was shut down".into(),
            Failure::Staging { detail } => format!("staging failed: {detail}"),
        };
        *self.lost_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
        self.lost.store(true, Ordering::Release);
        self.fail_all(q, &failure);
        for lane in &mut q.lanes {
            lane.posted.clear();
        }
        for lane in q
            .lanes
            .iter()
            .chain(q.offers.iter().flatten().flat_map(|o| o.lanes.iter()))
        {
            if let Some(qp) = &lane.qp {
                if let Err(e) = qp.disconnect() {
                    log::debug!(
                        "peer {}: moving QP {:#x} to error: {e}",
                        self.name,
                        qp.qp_num()
                    );
                }
            }
        }
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }

    /// Fails every unfinished transfer with `failure` and forgets the queues (records of
    /// requests in flight stay: their completions still free their slots).
    pub(crate) fn fail_all(&self, q: &mut Queues, failure: &Failure) {
        for t in q.active.drain(..) {
            let mut p = t.lock();
            t.finish(&mut p, Err(failure.clone()));
            p.queued = false;
        }
        q.pending.clear();
        q.notify_due.clear();
    }

    /// Sends a control message to the peer; a failure loses the peer. Never call it with the
    /// queues locked.
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

    /// Applies a control message from the peer (after the handshake); returns the answer to
    /// send, if any. An error means the peer must be dropped.
    pub(crate) fn apply(self: &Arc<Self>, msg: Message) -> Result<Option<Message>, String> {
        match msg {
            Message::RailRenew(r) => Ok(self.on_rail_renew(r)),
            Message::RailRenewed(r) => {
                self.on_rail_renewed(r);
                Ok(None)
            }
            Message::RailRefused { rail, epoch } => {
                self.on_rail_refused(usize::from(rail), epoch);
                Ok(None)
            }
            msg => self.apply_table(msg).map(|()| None),
        }
    }

    /// Applies a segment-table message (the handshake's; a rail renewal there is an error).
    pub(crate) fn apply_table(&self, msg: Message) -> Result<(), String> {
        let mut table = self.remote.write().unwrap_or_else(|p| p.into_inner());
        apply_to(&mut table, msg, self.nrails)
    }
}

/// Most segments a peer may announce: a hostile peer cannot grow our table without bound.
pub(crate) const MAX_REMOTE_SEGMENTS: usize = 1 << 20;

/// Applies a peer's control message to its segment table: announcements add (an id announced
/// twice, a segment without a key for each of the `rails` shared rails, or more than
/// [`MAX_REMOTE_SEGMENTS`], is the peer lying: an error, nothing of that message is kept),
/// removals remove (unknown ids are ignored: a removal may cross an announcement), a goodbye or
/// a handshake message is an error.
pub(crate) fn apply_to(
    table: &mut HashMap<u32, SegmentInfo>,
    msg: Message,
    rails: usize,
) -> Result<(), String> {
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
                if s.rkeys.len() < rails {
                    return Err(format!(
                        "announced segment {} with {} remote keys for {rails} shared rails",
                        s.id,
                        s.rkeys.len()
                    ));
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
        Message::RailRenew(_) | Message::RailRenewed(_) | Message::RailRefused { .. } => {
            Err("a rail renewal during the handshake".into())
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
            rkeys: vec![id, id + 1],
            location: Location::Cpu { numa: None },
        }
    }

    /// The engine's memory per transfer is what the crate docs say ("Memory the engine keeps
    /// per transfer"): a fixed record per run and one per chunk of up to [`CHUNK`] requests.
    #[test]
    fn the_records_per_run_and_per_chunk_are_the_documented_sizes() {
        let run = std::mem::size_of::<crate::transfer::Run>();
        let chunk = std::mem::size_of::<Posted>();
        eprintln!("run {run} B, chunk record {chunk} B");
        assert_eq!(run, 32);
        assert_eq!(chunk, 72);
        assert_eq!(CHUNK, 32);
    }

    #[test]
    fn a_peer_that_lies_about_its_segments_is_dropped_and_changes_nothing() {
        let mut t = HashMap::new();
        apply_to(&mut t, Message::Segments(vec![seg(1), seg(2)]), 2).unwrap();
        // The same id again, in a later message or twice in one: refused, nothing added.
        let e = apply_to(&mut t, Message::Segments(vec![seg(3), seg(1)]), 2).unwrap_err();
        assert!(e.contains("segment 1 twice"), "{e}");
        let e = apply_to(&mut t, Message::Segments(vec![seg(4), seg(4)]), 2).unwrap_err();
        assert!(e.contains("segment 4 twice"), "{e}");
        // Fewer keys than shared rails: the second rail could not address it.
        let mut short = seg(5);
        short.rkeys.truncate(1);
        let e = apply_to(&mut t, Message::Segments(vec![seg(6), short]), 2).unwrap_err();
        assert!(e.contains("1 remote keys for 2 shared rails"), "{e}");
        assert_eq!(t.len(), 2);
        assert!(!t.contains_key(&3) && !t.contains_key(&4) && !t.contains_key(&6));
        // Removals of unknown ids are harmless; known ones go.
        apply_to(&mut t, Message::Removed(vec![2, 99]), 2).unwrap();
        assert_eq!(t.keys().copied().collect::<Vec<_>>(), [1]);
        // A removed id announced again is a new segment (ids are never reused by honest peers,
        // and a dishonest one only redirects its own memory).
        apply_to(&mut t, Message::Segments(vec![seg(2)]), 2).unwrap();
        // Goodbye and handshake messages end the connection.
        assert!(apply_to(&mut t, Message::Bye("x".into()), 2).is_err());
        assert!(apply_to(&mut t, Message::Ready, 2).is_err());
    }

    #[test]
    fn a_peer_cannot_grow_the_table_without_bound() {
        let mut t: HashMap<u32, SegmentInfo> = (0..MAX_REMOTE_SEGMENTS as u32 - 1)
            .map(|i| (i, seg(i)))
            .collect();
        let e = apply_to(
            &mut t,
            Message::Segments(vec![seg(u32::MAX - 2), seg(u32::MAX - 1)]),
            1,
        )
        .unwrap_err();
        assert!(e.contains("more than"), "{e}");
        assert_eq!(t.len(), MAX_REMOTE_SEGMENTS - 1);
        apply_to(&mut t, Message::Segments(vec![seg(u32::MAX - 1)]), 1).unwrap();
    }
}
