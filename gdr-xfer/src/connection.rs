//! The connection to a peer: its segment table, its control link, and its core
//! ([`gdr_xfer_proto::Connection`]) with the queue pairs that core drives ([`Lanes`]).
//!
//! Every call into the core goes through [`Connection::drive`]: the core is locked, called with
//! the time and the lanes, and the actions the call left ([`gdr_xfer_proto::Action`]) are taken
//! in the core's order and carried out in that order once the core is unlocked
//! ([`crate::lanes::Deferred`]): queue pairs destroyed before the outcomes they protect,
//! notifications delivered, control messages sent under the writer lock taken before the core
//! was released (so that messages leave in the order the core produced them).
//!
//! Lock order: the core, then the writer, then the agent's endpoint (a leaf: the handshake
//! admits a connection and takes the agent's segment table under it while holding the
//! writer); never the other way round; a transfer cell's lock is never held while taking any
//! of these. Whether the peer is going or gone is the core's state alone, and whether the
//! application sees the peer is the endpoint's: the connection keeps no copy of either.

use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, Weak};
use std::time::Instant;

use gdr::connect::TcpLink;
use gdr::{Completion, WcStatus};
use gdr_xfer_proto::{
    Action, Config, ConnId, Connection as Core, DriverError, Endpoint, Failure, LaneRef, Lost,
    PeerTable, Receipt, SendCompletion, Spec, Status, TableError, TransferKey,
};

use crate::error::Error;
use crate::lanes::{Deferred, Lanes};
use crate::notify::{
    split_recv_wr_id, Arrival, Delivered, NoteQueue, Notification, SlotLedger, SlotOwner,
};
use crate::rail::{RailStats, Rails};
use crate::segment::Segment;
use crate::transfer::RunsTransfers;
use crate::wakers::Wakers;
use crate::wire::Message;

/// The agent's endpoint ([`gdr_xfer_proto::Endpoint`]) under its one lock: shared by the agent
/// and its connections' lanes (which route their new queue pairs in it, and hold it weakly:
/// it holds the connections).
pub(crate) type SharedEndpoint = Mutex<Endpoint<Arc<Connection>, Segment>>;

/// Locks the endpoint (a lock poisoned by a panic elsewhere is taken as it is: every change
/// to the endpoint is one call of the core's, complete or not begun).
pub(crate) fn lock_endpoint(
    e: &SharedEndpoint,
) -> MutexGuard<'_, Endpoint<Arc<Connection>, Segment>> {
    e.lock().unwrap_or_else(|p| p.into_inner())
}

/// The core and the lanes it drives, under one lock.
pub(crate) struct Driven {
    pub(crate) core: Core<Lanes>,
    pub(crate) io: Lanes,
}

/// Everything about one connected peer.
pub(crate) struct Connection {
    pub(crate) name: String,
    /// Its number in the agent's endpoint, once admitted (shared with its lanes, which route
    /// their queue pairs under it).
    id: Arc<OnceLock<ConnId>>,
    /// Its number in the process (never given again): what a prepared list is tied to.
    pub(crate) serial: u64,
    /// The number of the agent it belongs to (another agent's calls refuse it).
    pub(crate) agent_id: u64,
    /// The agent's notifications: this connection delivers into it.
    notes: Arc<NoteQueue>,
    /// Rails shared with the peer.
    pub(crate) nrails: usize,
    pub(crate) qps_per_rail: usize,
    /// (device, port) of each shared rail.
    pub(crate) rail_names: Vec<(String, u8)>,
    pub(crate) remote: RwLock<PeerTable>,
    /// The async waits for a segment of this peer, woken when its table changes or the peer
    /// goes ([`crate::futures`]).
    pub(crate) table_wakers: Wakers,
    /// What the agent's notification bound knows of this connection ([`crate::notify::NoteQueue`]).
    pub(crate) ledger: Arc<SlotLedger>,
    /// The largest notification that can be sent to the peer (the smaller of its limit and
    /// our send slots).
    pub(crate) notify_max: u32,
    pub(crate) writer: Mutex<TcpLink>,
    /// A clone of the control socket, to shut it down (which ends the reader thread).
    pub(crate) socket: TcpStream,
    /// The core and its lanes. Whether the peer is going or gone, and why, is the core's
    /// ([`Core::gone_reason`]); whether it is ready, the endpoint's.
    driven: Mutex<Driven>,
    /// When the rails were last handed to the metrics recorder.
    #[cfg(feature = "metrics")]
    metrics_at: Mutex<Option<Instant>>,
}

/// What a new connection is made of.
pub(crate) struct Parts {
    pub(crate) name: String,
    pub(crate) agent_id: u64,
    pub(crate) rails: Arc<Rails>,
    pub(crate) endpoint: Weak<SharedEndpoint>,
    pub(crate) notes: Arc<NoteQueue>,
    pub(crate) config: Config,
    pub(crate) rail_names: Vec<(String, u8)>,
    /// Per lane (rail-major), its queue pair: generation `i` for lane `i` (the core's start).
    pub(crate) qps: Vec<gdr::qp::QueuePair>,
    pub(crate) notify: Vec<crate::notify::NotifyPool>,
    pub(crate) writer: TcpLink,
    pub(crate) socket: TcpStream,
}

impl Connection {
    pub(crate) fn new(p: Parts) -> Arc<Connection> {
        let cfg = p.config;
        let notify_max = cfg.notify_max;
        let nrails = cfg.rails;
        let qps_per_rail = cfg.lanes_per_rail;
        let ledger = Arc::new(SlotLedger::default());
        let id = Arc::new(OnceLock::new());
        Arc::new_cyclic(|me| {
            let core = Core::new(cfg, Instant::now());
            let io = Lanes {
                peer: p.name.clone(),
                id: id.clone(),
                rails: p.rails,
                endpoint: p.endpoint,
                notes: p.notes.clone(),
                conn: me.clone() as Weak<dyn SlotOwner>,
                per_rail: qps_per_rail,
                qps: p
                    .qps
                    .into_iter()
                    .enumerate()
                    .map(|(i, qp)| vec![(i as u64, qp)])
                    .collect(),
                notify: p.notify,
                ledger: ledger.clone(),
                batch: Default::default(),
            };
            Connection {
                name: p.name,
                id,
                serial: {
                    static CONNECTIONS: AtomicU64 = AtomicU64::new(1);
                    CONNECTIONS.fetch_add(1, Ordering::Relaxed)
                },
                agent_id: p.agent_id,
                notes: p.notes,
                nrails,
                qps_per_rail,
                rail_names: p.rail_names,
                remote: RwLock::new(PeerTable::new()),
                table_wakers: Wakers::default(),
                ledger,
                notify_max,
                writer: Mutex::new(p.writer),
                socket: p.socket,
                driven: Mutex::new(Driven { core, io }),
                #[cfg(feature = "metrics")]
                metrics_at: Mutex::new(None),
            }
        })
    }

    fn lock(&self) -> MutexGuard<'_, Driven> {
        self.driven.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls the core, then does what the call left to do (see the module documentation).
    pub(crate) fn drive<R>(&self, f: impl FnOnce(&mut Core<Lanes>, &mut Lanes, Instant) -> R) -> R {
        let mut g = self.lock();
        let d = &mut *g;
        let r = f(&mut d.core, &mut d.io, Instant::now());
        if !d.core.has_actions() {
            return r;
        }
        // Taken in the core's order while it is locked: a destroyed queue pair leaves the lanes
        // (and the routes) now, and is destroyed below, before whatever follows it.
        let mut deferred = Vec::new();
        let mut control = false;
        while let Some(a) = d.core.poll_action() {
            deferred.push(match a {
                Action::DestroyLanes(lanes) => Deferred::Destroyed(d.io.take_destroyed(&lanes)),
                Action::Finished(cell, outcome) => Deferred::Finished(cell, outcome),
                Action::Deliver(data, receipt) => Deferred::Delivered(data, receipt),
                Action::SendControl(msg) => {
                    control = true;
                    Deferred::Control(msg)
                }
                Action::Event(e) => {
                    d.io.log(e);
                    continue;
                }
            });
        }
        let me = d.io.conn.clone();
        let writer = control.then(|| self.writer.lock().unwrap_or_else(|p| p.into_inner()));
        drop(g);
        self.carry_out(deferred, writer, me);
        r
    }

    /// Carries out what a core call left, in the core's order (each before the next is made
    /// visible): queue pairs destroyed, outcomes reported, notifications delivered, control
    /// messages sent (a failed send loses the peer once the rest is done).
    fn carry_out(
        &self,
        deferred: Vec<Deferred>,
        mut writer: Option<MutexGuard<'_, TcpLink>>,
        me: Weak<dyn SlotOwner>,
    ) {
        let mut failed = None;
        for item in deferred {
            match item {
                // The NIC no longer touches their memory once they are destroyed.
                Deferred::Destroyed(qps) => drop(qps),
                Deferred::Finished(cell, outcome) => cell.finish_core(outcome),
                Deferred::Delivered(data, receipt) => self.notes.push(Delivered {
                    notification: Notification {
                        peer: self.name.clone(),
                        data,
                    },
                    from: Some(Arrival {
                        conn: me.clone(),
                        receipt,
                        ledger: self.ledger.clone(),
                    }),
                }),
                Deferred::Control(msg) => {
                    let Some(w) = writer.as_mut().filter(|_| failed.is_none()) else {
                        continue;
                    };
                    if let Err(e) = Message::from_control(msg)
                        .encode()
                        .map_err(Error::from)
                        .and_then(|b| w.send_bytes(&b).map_err(Error::from))
                    {
                        failed = Some(e);
                    }
                }
            }
        }
        drop(writer);
        if let Some(e) = failed {
            self.lose(link_failed(e));
        }
    }

    /// Its number in the agent's endpoint, once admitted.
    pub(crate) fn id(&self) -> Option<ConnId> {
        self.id.get().copied()
    }

    /// Records the number the endpoint admitted it under (once).
    pub(crate) fn set_id(&self, id: ConnId) {
        let _ = self.id.set(id);
    }

    /// Whether it was closed ([`Connection::lose`]).
    pub(crate) fn is_lost(&self) -> bool {
        self.lock().core.is_closed()
    }

    /// Marks the peer as going without failing what is in flight yet: new transfers are
    /// refused at once; those in flight fail once the completions already queued were handled
    /// ([`gdr_xfer_proto::Connection::closing`]).
    pub(crate) fn set_closing(&self, failure: Failure) {
        self.drive(|core, _, _| core.closing(failure));
        self.seal_notes();
        self.table_wakers.wake_all();
    }

    /// This agent leaves the connection while the peer is up (a disconnect, a shutdown): new
    /// transfers are refused and those in flight stop, each reporting once neither side's
    /// memory can be touched by it ([`gdr_xfer_proto::Connection::leave`]). Does not wait:
    /// [`Connection::wait_left`] does.
    pub(crate) fn start_leaving(&self, failure: Failure) {
        self.drive(|core, _, now| core.leave(now, failure));
    }

    /// Waits until the connection holds no transfer (after [`Connection::start_leaving`]), or
    /// until `end`, running its timers meanwhile (the progress threads handle its completions).
    pub(crate) fn wait_left(&self, end: Instant) {
        loop {
            let now = Instant::now();
            if self.lock().core.transfers() == 0 || now >= end {
                return;
            }
            self.tick(now);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// How long a leaving connection may take to report every transfer: the core's bound after
    /// a stop, plus the timer period's slack.
    pub(crate) fn leave_bound(&self) -> std::time::Duration {
        self.lock().core.config().outcome_bound() + std::time::Duration::from_millis(100)
    }

    /// The connection closes: its notifications in the agent's queue hold no slot any more,
    /// and it posts no new one (the agent's bound, [`crate::notify::NoteQueue`]).
    fn seal_notes(&self) {
        self.notes.seal(&self.ledger);
    }

    /// Posts the receive slots the agent's bound deferred, as far as it lets now.
    pub(crate) fn rearm(&self) {
        self.drive(|core, io, _| core.rearm(io));
    }

    /// Posts the receive slots a new connection starts with, as far as the agent's bound lets
    /// (the others once it does).
    pub(crate) fn post_first_slots(&self) {
        self.drive(|core, io, _| {
            core.recv_slots_unposted();
            core.rearm(io);
        });
    }

    /// Why the peer is gone, if it is (closing or lost).
    pub(crate) fn gone(&self) -> Option<Failure> {
        self.lock().core.gone().cloned()
    }

    /// The queue pair numbers of the live lanes, rail-major.
    pub(crate) fn qp_nums(&self) -> Vec<u32> {
        let g = self.lock();
        g.io.qp_nums(&g.core.lanes())
    }

    /// The live lanes: (rail, queue pair number, lane) of every current queue pair.
    pub(crate) fn routes(&self) -> Vec<(usize, u32, LaneRef)> {
        let g = self.lock();
        let lanes: Vec<LaneRef> = g.core.lanes().into_iter().flatten().collect();
        lanes
            .into_iter()
            .filter_map(|l| {
                let qp =
                    g.io.qps
                        .get(l.lane)?
                        .iter()
                        .find(|(gen, _)| *gen == l.gen)?;
                Some((l.lane / self.qps_per_rail, qp.1.qp_num(), l))
            })
            .collect()
    }

    /// Telemetry of every shared rail.
    pub(crate) fn rail_stats(&self) -> Vec<RailStats> {
        let rails = self.lock().core.rails();
        rails
            .into_iter()
            .enumerate()
            .map(|(i, (state, c))| {
                let (device, port) = self.rail_names[i].clone();
                RailStats::new(i, device, port, state, c)
            })
            .collect()
    }

    /// Queues a transfer and posts what fits now.
    pub(crate) fn submit(&self, spec: Spec<Lanes>) -> Result<TransferKey, Failure> {
        self.drive(|core, io, now| core.submit(now, io, spec))
    }

    /// Queues a transfer and posts it now only when it moves at most `inline_max` bytes (see
    /// [`gdr_xfer_proto::Connection::submit_inline_up_to`]).
    pub(crate) fn submit_inline_up_to(
        &self,
        spec: Spec<Lanes>,
        inline_max: u64,
    ) -> Result<TransferKey, Failure> {
        self.drive(|core, io, now| core.submit_inline_up_to(now, io, spec, inline_max))
    }

    /// Posts what is queued and fits.
    pub(crate) fn post_queued(&self) {
        self.drive(|core, io, now| core.post_queued(now, io));
    }

    /// Cancels a transfer (see [`gdr_xfer_proto::Connection::cancel`]).
    pub(crate) fn cancel(&self, key: TransferKey) {
        self.drive(|core, io, now| {
            core.cancel(now, io, key);
        });
    }

    /// The application took a notification: its slot is posted again.
    pub(crate) fn consumed(&self, receipt: Receipt) {
        self.drive(|core, io, _| core.consumed(io, receipt));
    }

    /// Runs the core's timers when they are due.
    // Never inlined: `cargo xtask post-cost` counts the instructions under it (callgrind's
    // --toggle-collect needs the function to exist in the binary).
    #[inline(never)]
    pub(crate) fn tick(&self, now: Instant) {
        let due = self.lock().core.poll_timeout().is_some_and(|t| t <= now);
        if due {
            self.drive(|core, io, now| core.handle_timeout(now, io));
        }
        #[cfg(feature = "metrics")]
        self.export_rails(now);
    }

    /// Hands the rails' counters to the metrics recorder, once a second.
    #[cfg(feature = "metrics")]
    fn export_rails(&self, now: Instant) {
        {
            let mut at = self.metrics_at.lock().unwrap_or_else(|p| p.into_inner());
            if at.is_some_and(|t| {
                now.saturating_duration_since(t) < std::time::Duration::from_secs(1)
            }) {
                return;
            }
            *at = Some(now);
        }
        crate::metrics::rails(&self.name, &self.rail_stats());
    }

    /// Handles a send-queue completion of lane `lane`.
    // Never inlined: `cargo xtask post-cost` counts the instructions under it (callgrind's
    // --toggle-collect needs the function to exist in the binary).
    #[inline(never)]
    pub(crate) fn on_send_completion(&self, lane: LaneRef, c: &Completion) {
        let status = core_status(c.status);
        // Errors after the close are the flushes of its destroyed queue pairs.
        if status != Status::Success && !self.is_lost() {
            log::warn!(
                "peer {}: request {} on QP {:#x} (lane {}) completed with {} (vendor error {:#x})",
                self.name,
                c.wr_id,
                c.qp_num,
                lane.lane,
                c.status,
                c.vendor_err
            );
        }
        let sc = SendCompletion {
            lane,
            wr_id: c.wr_id,
            status,
            raw_status: c.status.raw(),
            vendor_err: c.vendor_err,
            qp_num: c.qp_num,
        };
        self.drive(|core, io, now| core.handle_send_completion(now, io, sc));
    }

    /// Handles a receive completion (a notification or a probe) of lane `lane`.
    // Never inlined: `cargo xtask post-cost` counts the instructions under it (callgrind's
    // --toggle-collect needs the function to exist in the binary).
    #[inline(never)]
    pub(crate) fn on_recv_completion(&self, lane: LaneRef, c: &Completion) {
        let (gen, slot) = split_recv_wr_id(c.wr_id);
        if gen != lane.gen {
            return;
        }
        self.drive(|core, io, now| {
            let rail = lane.lane / io.per_rail;
            let msg = if c.status == WcStatus::Success {
                match io.notify.get(rail).map(|p| p.read(slot, c.byte_len)) {
                    Some(Ok(m)) => Some(m),
                    Some(Err(e)) => {
                        log::error!("peer {}: reading notification slot {slot}: {e}", io.peer);
                        None
                    }
                    None => None,
                }
            } else {
                None
            };
            core.handle_recv(now, io, lane, slot, msg.as_deref());
        });
    }

    /// Marks the peer lost: every unfinished transfer fails with `failure` (once its queue
    /// pairs are destroyed, which is at once), nothing more is posted, and the control socket
    /// is shut down.
    pub(crate) fn lose(&self, failure: Failure) {
        self.drive(|core, _, now| core.close(now, failure));
        self.seal_notes();
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        self.table_wakers.wake_all();
    }

    /// Sends a control message to the peer; a failure loses the peer. Never call it with the
    /// core locked.
    pub(crate) fn send_control(&self, msg: &Message) {
        let result = msg.encode().map_err(Error::from).and_then(|bytes| {
            self.writer
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .send_bytes(&bytes)
                .map_err(Error::from)
        });
        if let Err(e) = result {
            self.lose(link_failed(e));
        }
    }

    /// Applies a control message from the peer (after the handshake). An error means the peer
    /// must be dropped.
    pub(crate) fn apply(&self, msg: Message) -> Result<(), TableError> {
        let control = match msg.into_control() {
            Ok(control) => control,
            Err(msg) => return self.apply_table(msg),
        };
        self.drive(|core, io, now| core.handle_control(now, io, control));
        Ok(())
    }

    /// Applies a segment-table message (the handshake's; a rail renewal there is an error).
    pub(crate) fn apply_table(&self, msg: Message) -> Result<(), TableError> {
        let mut table = self.remote.write().unwrap_or_else(|p| p.into_inner());
        let r = table.apply(msg, self.nrails);
        drop(table);
        self.table_wakers.wake_all();
        r
    }
}

/// The control link failed with `e`: the peer is lost, the error kept.
fn link_failed(e: Error) -> Failure {
    Failure::PeerLost {
        why: Lost::Link {
            error: DriverError::new(e),
        },
    }
}

/// What a send completion's status means to the core.
fn core_status(status: WcStatus) -> Status {
    match status {
        WcStatus::Success => Status::Success,
        // The request's own fault: posted elsewhere it would fail the same way.
        WcStatus::RemoteAccess
        | WcStatus::LocalProtection
        | WcStatus::LocalLength
        | WcStatus::LocalAccess => Status::RequestError,
        // Everything else is the path's or the queue pairs'. That includes a remote
        // invalid request: every request is checked against both segment tables before it
        // is posted, and a responder whose queue pair the peer is tearing down (a fence or
        // a renewal of its own) NAKs our requests still in flight with it (seen on rxe in
        // the cluster tier): the rail fails over and they are posted again.
        _ => Status::LaneError,
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Every way of closing seals it already; a connection dropped without closing (a
        // handshake that failed early) has nothing in the queue, but is sealed all the same.
        self.seal_notes();
    }
}

impl SlotOwner for Connection {
    fn consumed(&self, receipt: Receipt) {
        Connection::consumed(self, receipt);
    }

    fn rearm(&self) {
        Connection::rearm(self);
    }
}

impl RunsTransfers for Connection {
    fn stop(&self, key: TransferKey) {
        self.cancel(key);
    }

    fn tick(&self, now: Instant) {
        Connection::tick(self, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_requests_own_faults_fail_its_transfer_the_rest_fails_the_rail_over() {
        for s in [
            WcStatus::RemoteAccess,
            WcStatus::LocalProtection,
            WcStatus::LocalLength,
            WcStatus::LocalAccess,
        ] {
            assert_eq!(core_status(s), Status::RequestError, "{s:?}");
        }
        // A peer tearing its queue pair down (its own fence) NAKs what is in flight with
        // "remote invalid request" (rxe, cluster tier): not the request's fault.
        for s in [
            WcStatus::RemoteInvalidRequest,
            WcStatus::RetryExceeded,
            WcStatus::WrFlush,
            WcStatus::RnrRetryExceeded,
        ] {
            assert_eq!(core_status(s), Status::LaneError, "{s:?}");
        }
        assert_eq!(core_status(WcStatus::Success), Status::Success);
    }
}
