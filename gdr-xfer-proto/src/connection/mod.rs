//! A connection to one peer, as a state machine: transfers submitted, requests posted on its
//! lanes, completions credited, deadlines enforced, rails failed over and renewed,
//! notifications sent and received. Driven by calls with time passed in; every piece of I/O
//! goes through the driver's [`Io`].
//!
//! See [`Connection`].

mod complete;
mod failover;
mod post;
mod renew;

use std::collections::{BTreeSet, VecDeque};
use std::time::Instant;

use crate::config::Config;
use crate::fault::{DriverError, RailReport, RailReports, Rejection};
use crate::io::{Action, Event, Io, LaneRef};
use crate::lane::Lane;
use crate::notify::Seen;
use crate::rail::{RailCounters, RailLink, RailState};
use crate::run::Cursor;
use crate::slab::Slab;
use crate::transfer::{Failure, NotifyState, Outcome, Phase, Spec, Transfer, TransferKey};

/// Whether the connection takes new transfers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Open,
    /// The peer went away, or this side leaves; what is in flight goes on until the driver
    /// closes it. New transfers fail with the failure kept.
    Closing(Failure),
    Closed(Failure),
}

/// A renewal we offered the peer for one rail: the queue pairs created for it.
#[derive(Debug)]
struct Offer {
    epoch: u32,
    lanes: Vec<LaneRef>,
}

/// One rail's receive slots: which are posted on the current queue pair, and how many
/// delivered messages the application has not taken yet (those slots stay unposted: the
/// peer's next messages wait, which bounds what a fast sender makes us hold).
#[derive(Debug)]
struct RecvSlots {
    gen: Option<u64>,
    armed: Vec<bool>,
    held: u16,
}

/// A connection's core: a state machine driven by calls with the time passed in, doing its
/// I/O through its driver's [`Io`].
///
/// # Outcomes a caller can trust
///
/// A transfer's outcome is reported (as an [`Action::Finished`]) only once none of its requests
/// can touch its memory any more: every request it posted was credited by a completion, or the
/// queue pair carrying it was destroyed. A transfer that stops early (its deadline passed, it
/// was cancelled, one of its requests failed, the peer or every rail was lost) first stops
/// posting, then waits for its requests in flight. Those still in flight [`Config::quiesce`]
/// later are *fenced*: the queue pairs carrying them are destroyed (the other transfers'
/// requests on them are posted again on new ones) and the rail is renewed with the peer at
/// once. For a WRITE the outcome also waits until the peer confirmed that its side of those
/// queue pairs is gone (its answer to the renewal), at most [`Config::quiesce`] more. So an
/// outcome comes at most [`Config::outcome_bound`] after the deadline (plus the driver's timer
/// granularity), and whatever it says, the memory is quiet.
///
/// # One caller's mistake fails only its own transfer
///
/// A request the driver refuses for its own reason ([`crate::PostResult::Rejected`]) or that completes
/// with a request error ([`crate::Status::RequestError`]) fails its transfer only: the first posts
/// nothing; the second broke its queue pair, so the rail is renewed at once (not paused) and
/// the other transfers' requests are posted again.
///
/// ```text
/// submit ──> pending ──> posted on lanes ──> credited by completions ──> finished (Ok)
///               │              │
///               │   deadline, cancel, request error, no rail, close
///               └──────────────┴──> stopped: nothing more posted; in-flight requests are
///                                   credited, or fenced after `quiesce`; WRITEs whose queue
///                                   pairs were destroyed wait for the peer (or `quiesce`)
///                                   ──> finished (Err; Ok if everything had landed, except
///                                   after a cancel, which always ends Cancelled)
/// ```
pub struct Connection<I: Io> {
    cfg: Config,
    transfers: Slab<Transfer<I>>,
    /// Transfers with requests not yet posted, oldest first.
    pending: VecDeque<TransferKey>,
    /// Since when a transfer was queued without posting ([`Connection::submit_inline_up_to`]) and
    /// no pump has run: the next timer posts it, if nothing else did first.
    unposted_since: Option<Instant>,
    /// Transfers whose data is done and whose notification waits for a send slot.
    notify_due: VecDeque<TransferKey>,
    /// Deadlines of active transfers.
    deadlines: BTreeSet<(Instant, TransferKey)>,
    /// Transfers that stopped, or completed, and wait for their requests to be retired or
    /// for their peer to confirm ([`Connection::try_finish`]).
    settling: Vec<TransferKey>,
    /// `rails x lanes_per_rail`, rail-major.
    lanes: Vec<Lane>,
    rails: Vec<RailLink>,
    offers: Vec<Option<Offer>>,
    recv: Vec<RecvSlots>,
    next_wr: u64,
    next_gen: u64,
    next_notify_id: u64,
    seen: Seen,
    /// Notifications delivered and not taken yet.
    untaken: u32,
    /// Since when no rail is usable (transfers wait one quiesce time for one to come back:
    /// the peer may be renewing it already, e.g. after its own request broke the queue pairs
    /// both sides share).
    no_rail_since: Option<Instant>,
    /// Whether this outage already failed the transfers.
    no_rail_failed: bool,
    state: State,
    /// What the driver is left to carry out, in order ([`Connection::poll_action`]).
    actions: VecDeque<Action<I>>,
}

impl<I: Io> std::fmt::Debug for Connection<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let transfers: Vec<String> = self
            .transfers
            .keys()
            .into_iter()
            .filter_map(|k| {
                let t = self.transfers.get(k)?;
                Some(format!(
                    "{k:?}: {:?} {}/{} slices, {} in flight, notify {:?}, next {:?}, {} retry ranges, {:?}, awaiting {:#x}",
                    t.op,
                    t.slices_done,
                    t.slices_total,
                    t.inflight,
                    t.notify_state,
                    t.next,
                    t.retry.len(),
                    t.phase,
                    t.awaiting_peer
                ))
            })
            .collect();
        let lanes: Vec<String> = self
            .lanes
            .iter()
            .map(|l| {
                format!(
                    "gen {:?}: {} outstanding, {} records, full {}",
                    l.gen,
                    l.outstanding,
                    l.posted.len(),
                    l.full
                )
            })
            .collect();
        let rails: Vec<String> = self
            .rails
            .iter()
            .map(|r| {
                format!(
                    "{:?} (fencing {}), {} send slots free",
                    r.state,
                    r.fencing,
                    r.free_send_slots.len()
                )
            })
            .collect();
        f.debug_struct("Connection")
            .field("state", &self.state)
            .field("transfers", &transfers)
            .field("pending", &self.pending)
            .field("notify_due", &self.notify_due)
            .field("settling", &self.settling)
            .field("lanes", &lanes)
            .field("rails", &rails)
            .finish()
    }
}

impl<I: Io> Connection<I> {
    /// A connection whose lanes already have queue pairs: lane `i` has generation `i` (see
    /// [`Connection::lanes`]), with every receive slot of each rail's first lane posted.
    pub fn new(cfg: Config, now: Instant) -> Connection<I> {
        let lanes = (0..cfg.lanes()).map(|i| Lane::new(i as u64)).collect();
        let rails = (0..cfg.rails)
            .map(|_| RailLink::new(cfg.send_slots, now))
            .collect();
        let recv = (0..cfg.rails)
            .map(|r| RecvSlots {
                gen: Some((r * cfg.lanes_per_rail) as u64),
                armed: vec![true; usize::from(cfg.recv_slots)],
                held: 0,
            })
            .collect();
        Connection {
            offers: (0..cfg.rails).map(|_| None).collect(),
            next_gen: cfg.lanes() as u64,
            cfg,
            transfers: Slab::new(),
            pending: VecDeque::new(),
            unposted_since: None,
            notify_due: VecDeque::new(),
            deadlines: BTreeSet::new(),
            settling: Vec::new(),
            lanes,
            rails,
            recv,
            next_wr: 1,
            next_notify_id: 1,
            seen: Seen::default(),
            untaken: 0,
            no_rail_since: None,
            no_rail_failed: false,
            state: State::Open,
            actions: VecDeque::new(),
        }
    }

    /// The next thing the last calls left the driver to carry out, in the order the core
    /// produced them ([`Action`]). The driver takes them all after every call into the core
    /// and carries each out before it makes the next visible: a queue pair destroyed before
    /// an outcome it protects, a control message after the destruction it announces.
    pub fn poll_action(&mut self) -> Option<Action<I>> {
        self.actions.pop_front()
    }

    /// Whether an action waits ([`Connection::poll_action`]).
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// Its settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The current queue pair of every lane (`None` while its rail has none).
    pub fn lanes(&self) -> Vec<Option<LaneRef>> {
        self.lanes
            .iter()
            .enumerate()
            .map(|(i, l)| l.current(i))
            .collect()
    }

    /// Each rail's state and counters.
    pub fn rails(&self) -> Vec<(RailState, RailCounters)> {
        self.rails
            .iter()
            .map(|r| (r.state, r.stats.clone()))
            .collect()
    }

    /// Transfers not yet finished.
    pub fn transfers(&self) -> usize {
        self.transfers.len()
    }

    /// Why the connection no longer takes transfers, if it does not: the failure a new
    /// transfer gets ([`Failure::PeerLost`], or [`Failure::AgentClosed`] when its agent shuts
    /// down).
    pub fn gone(&self) -> Option<&Failure> {
        match &self.state {
            State::Open => None,
            State::Closing(f) | State::Closed(f) => Some(f),
        }
    }

    /// Whether it was closed ([`Connection::close`]).
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed(_))
    }

    /// Each rail's state and last error, for a [`Failure::NoRail`].
    fn rail_reports(&self) -> RailReports {
        RailReports(
            self.rails
                .iter()
                .enumerate()
                .map(|(rail, r)| RailReport {
                    rail,
                    state: r.state,
                    last_error: r.stats.last_error.clone(),
                })
                .collect(),
        )
    }

    /// Takes a transfer and posts what fits now.
    ///
    /// # Errors
    /// [`Failure::PeerLost`] when the connection is closing or closed, [`Failure::NoRail`]
    /// when no rail is usable, [`Failure::Rejected`] for a transfer that names segments or keys
    /// it does not have, an empty run, no run and no notification, or a notification longer
    /// than [`Config::notify_max`]; nothing is kept then.
    ///
    /// A transfer with a notification and no runs is a *message*: only the notification is
    /// sent, and its outcome is `Ok` once the peer's NIC took it.
    pub fn submit(
        &mut self,
        now: Instant,
        io: &mut I,
        spec: Spec<I>,
    ) -> Result<TransferKey, Failure> {
        let key = self.enqueue(now, spec)?;
        self.pump(now, io);
        Ok(key)
    }

    /// [`Connection::submit`] that posts at once only a transfer of at most `inline_max`
    /// bytes. A larger one is checked and queued (refused at once as `submit` would refuse
    /// it), and its requests are posted by the next [`Connection::post_queued`], completion or
    /// timer, whichever comes first ([`Connection::poll_timeout`] is due at once while such a
    /// transfer waits). For a caller whose thread must not spend the provider's post time (an
    /// event loop: a software NIC does the NIC's work inside the post call).
    pub fn submit_inline_up_to(
        &mut self,
        now: Instant,
        io: &mut I,
        spec: Spec<I>,
        inline_max: u64,
    ) -> Result<TransferKey, Failure> {
        let key = self.enqueue(now, spec)?;
        let bytes = self.transfers.get(key).map_or(0, |t| t.bytes);
        if bytes > inline_max {
            // Due at once for the timers: posted by the next tick at the latest.
            self.unposted_since.get_or_insert(now);
        } else {
            self.pump(now, io);
        }
        Ok(key)
    }

    /// Posts what is queued and fits (what a completion would post).
    pub fn post_queued(&mut self, now: Instant, io: &mut I) {
        self.pump(now, io);
    }

    /// Checks and queues a transfer.
    fn enqueue(&mut self, now: Instant, spec: Spec<I>) -> Result<TransferKey, Failure> {
        let rejected = |why: Rejection| Err(Failure::Rejected { why });
        if spec.runs.is_empty() && spec.notify.is_none() {
            return rejected(Rejection::Empty);
        }
        if let Some(n) = &spec.notify {
            if n.len() as u64 > u64::from(self.cfg.notify_max) {
                return rejected(Rejection::NotificationTooLong {
                    len: n.len(),
                    max: self.cfg.notify_max,
                });
            }
        }
        // One pass over the runs: checked, counted, and cut into requests (most runs are one
        // block no longer than a slice: no division for them).
        // One pass over the runs, without branches on the data: the largest segment indexes,
        // the smallest length, the bytes and the requests (most runs are one block no longer
        // than a slice: no division for them). Checked once after the loop.
        let slice = self.cfg.slice_size;
        let (mut max_local, mut max_remote, mut min_len) = (0u32, 0u32, u64::MAX);
        let mut bytes = 0u64;
        let mut slices_total = 0u64;
        for r in &spec.runs {
            max_local = max_local.max(r.local);
            max_remote = max_remote.max(r.remote);
            min_len = min_len.min(r.len);
            bytes = bytes.wrapping_add(r.len);
            slices_total += if r.len <= slice {
                1
            } else {
                r.len.div_ceil(slice)
            };
        }
        let locals = spec.locals.len() as u64;
        if min_len == 0 || (!spec.runs.is_empty() && u64::from(max_local) >= locals) {
            return rejected(Rejection::BadRun {
                min_len,
                max_local,
                locals,
            });
        }
        let remotes = if spec.runs.is_empty() {
            0
        } else {
            u64::from(max_remote) + 1
        };
        if (spec.rkeys.len() as u64) < remotes * self.cfg.rails as u64 {
            return rejected(Rejection::MissingKeys {
                keys: spec.rkeys.len(),
                remotes,
                rails: self.cfg.rails,
            });
        }
        // Bad input first: its error does not depend on the connection's state.
        if let Some(f) = self.gone() {
            return Err(f.clone());
        }
        if self.no_rail_for(now) {
            return Err(Failure::NoRail {
                rails: self.rail_reports(),
            });
        }
        let deadline = spec.timeout.and_then(|t| now.checked_add(t));
        let t = Transfer {
            op: spec.op,
            locals: spec.locals,
            runs: spec.runs,
            rkeys: spec.rkeys,
            rail_mask: spec.rail_mask,
            handle: spec.handle,
            timeout: spec.timeout,
            deadline,
            started: now,
            notify_state: if spec.notify.is_some() {
                NotifyState::Waiting
            } else {
                NotifyState::None
            },
            notify: spec.notify,
            notify_id: 0,
            bytes,
            slices_total,
            slices_done: 0,
            inflight: 0,
            next: Cursor::default(),
            retry: Vec::new(),
            queued: true,
            rail_pin: None,
            phase: Phase::Active,
            awaiting_peer: 0,
            quiet_at: None,
            lanes_mask: 0,
            rails_mask: 0,
            retried_slices: 0,
            posted_at: None,
        };
        let message = t.runs.is_empty();
        let key = self.transfers.insert(t);
        if let Some(d) = deadline {
            self.deadlines.insert((d, key));
        }
        if message {
            // Nothing to post but the notification: it is due at once.
            if let Some(t) = self.transfers.get_mut(key) {
                t.queued = false;
            }
            self.notify_due.push_back(key);
        } else {
            self.pending.push_back(key);
        }
        Ok(key)
    }

    /// Cancels a transfer: nothing more of it is posted; its outcome, [`Failure::Cancelled`],
    /// comes once its requests are retired, even when every one of them then succeeds (the
    /// caller asked for it to stop before it finished: its notification is never sent).
    /// Returns whether the transfer was still active (a finished one keeps its outcome).
    pub fn cancel(&mut self, now: Instant, io: &mut I, key: TransferKey) -> bool {
        let active = self.transfers.get(key).is_some_and(Transfer::is_active);
        if active {
            self.stop(now, key, Failure::Cancelled);
            self.pump(now, io);
        }
        active
    }

    /// Whether a transfer is still known (not finished).
    pub fn is_pending(&self, key: TransferKey) -> bool {
        self.transfers.get(key).is_some()
    }

    /// Stops a transfer: it posts nothing more, and reaches its outcome once its requests are
    /// retired ([`Connection::try_finish`]).
    fn stop(&mut self, now: Instant, key: TransferKey, failure: Failure) {
        let Some(t) = self.transfers.get_mut(key) else {
            return;
        };
        if !t.is_active() {
            return;
        }
        t.phase = Phase::Stopping {
            failure,
            since: now,
            fenced: false,
        };
        t.retry.clear();
        t.next = Cursor::new(t.runs.len(), 0);
        if t.notify_state == NotifyState::Waiting {
            // Never sent: the transfer did not complete.
            t.notify_state = NotifyState::Skipped;
        }
        if let Some(d) = t.deadline {
            self.deadlines.remove(&(d, key));
        }
        self.settling.push(key);
        if cfg!(gdr_mutant = "outcome_before_quiet") {
            // The bug the simulation must find: the outcome before the requests are retired.
            let t = self.transfers.get_mut(key).expect("just stopped");
            t.inflight = 0;
            t.awaiting_peer = 0;
        }
        self.try_finish(now, key);
    }

    /// Finishes a transfer whose requests are all retired and whose WRITEs cannot still be on
    /// the wire: success when everything landed, its failure otherwise. A transfer that is
    /// blocked waits in `settling` (its timer is in [`Connection::poll_timeout`]).
    pub(crate) fn try_finish(&mut self, now: Instant, key: TransferKey) {
        let Some(t) = self.transfers.get(key) else {
            return;
        };
        let result = match &t.phase {
            // A cancel asked for before the transfer finished wins over requests that still
            // landed: the caller is told what it asked for, once the memory is quiet.
            Phase::Stopping {
                failure: failure @ Failure::Cancelled,
                ..
            } => Err(failure.clone()),
            _ if t.is_complete() => Ok(()),
            Phase::Stopping { failure, .. } => Err(failure.clone()),
            Phase::Active => return,
        };
        let on_wire = t.awaiting_peer != 0
            && t.quiet_at.is_some_and(|q| q > now)
            && !cfg!(gdr_mutant = "no_peer_wait");
        if t.inflight > 0 || on_wire {
            if !self.settling.contains(&key) {
                self.settling.push(key);
            }
            return;
        }
        self.finish(now, key, result);
    }

    fn finish(&mut self, now: Instant, key: TransferKey, result: Result<(), Failure>) {
        let Some(t) = self.transfers.remove(key) else {
            return;
        };
        if let Some(d) = t.deadline {
            self.deadlines.remove(&(d, key));
        }
        if let Some(i) = self.settling.iter().position(|&k| k == key) {
            self.settling.swap_remove(i);
        }
        let stats = t.stats(now);
        self.actions
            .push_back(Action::Finished(t.handle, Outcome { result, stats }));
    }

    /// Stops every transfer with `failure` (each finishes once its requests are retired).
    fn fail_all(&mut self, now: Instant, failure: &Failure) {
        for key in self.transfers.keys() {
            self.stop(now, key, failure.clone());
        }
        self.pending.clear();
        self.notify_due.clear();
    }

    /// The peer is going away (it said goodbye, or its control link closed): new transfers are
    /// refused with `failure` (the first given stands); those in flight go on until
    /// [`Connection::close`].
    pub fn closing(&mut self, failure: Failure) {
        if self.state == State::Open {
            self.state = State::Closing(failure);
        }
    }

    /// This side closes the connection while the peer is still up (a disconnect): new
    /// transfers are refused, and every transfer stops with `failure` as if its deadline passed
    /// now. Nothing more is posted; requests in flight are credited by their completions, or
    /// fenced after [`Config::quiesce`] (a fenced WRITE also waits for the peer to confirm its
    /// side of the queue pairs is gone), so each outcome comes only once neither side's memory
    /// can be touched by the transfer, within [`Config::outcome_bound`]. A transfer whose every
    /// byte had landed reports success. Once [`Connection::transfers`] is 0 the driver says
    /// goodbye and closes ([`Connection::close`]); closing at once instead would report
    /// outcomes while requests already on the wire may still land in the peer's memory.
    pub fn leave(&mut self, now: Instant, failure: Failure) {
        if self.is_closed() {
            return;
        }
        self.closing(failure.clone());
        self.fail_all(now, &failure);
    }

    /// Closes the connection: every transfer stops with `failure`, every queue pair is
    /// destroyed (so their outcomes come at once), and nothing is posted any more. For a peer
    /// that is gone; while it is up, [`Connection::leave`] first.
    pub fn close(&mut self, now: Instant, failure: Failure) {
        if self.is_closed() {
            return;
        }
        self.state = State::Closed(failure.clone());
        self.fail_all(now, &failure);
        for rail in 0..self.cfg.rails {
            self.drop_offer(rail);
            self.retire_lanes(now, rail, None);
        }
        // The peer is gone or going: what it still receives is its own business.
        for key in self.transfers.keys() {
            if let Some(t) = self.transfers.get_mut(key) {
                t.awaiting_peer = 0;
            }
            self.try_finish(now, key);
        }
    }

    /// When [`Connection::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_closed() && self.transfers.len() == 0 {
            return None;
        }
        let mut next = self.deadlines.first().map(|&(d, _)| d);
        let mut at = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
        if let Some(t) = self.unposted_since {
            if !cfg!(gdr_mutant = "queued_waits_for_completions") {
                at(t);
            }
        }
        for &key in &self.settling {
            let Some(t) = self.transfers.get(key) else {
                continue;
            };
            if let Phase::Stopping {
                since,
                fenced: false,
                ..
            } = t.phase
            {
                if t.inflight > 0 {
                    at(since + self.cfg.quiesce);
                }
            }
            if t.awaiting_peer != 0 && t.inflight == 0 {
                if let Some(q) = t.quiet_at {
                    at(q);
                }
            }
        }
        if let Some(since) = self.no_rail_since {
            if !self.no_rail_failed && self.transfers.len() > 0 {
                at(since + self.cfg.quiesce);
            }
        }
        for r in &self.rails {
            if matches!(r.state, RailState::Paused | RailState::Renewing) && !self.is_closed() {
                at(r.until);
            }
            if r.stats.inflight_bytes > 0 {
                at(r.next_sample());
            }
        }
        next
    }

    /// Fails transfers past their deadline, fences stopped transfers whose requests outlived
    /// the quiesce time, finishes those whose wait for the peer is over, samples the rails'
    /// throughput, starts the renewals that are due, and posts what fits.
    pub fn handle_timeout(&mut self, now: Instant, io: &mut I) {
        while let Some(&(d, key)) = self.deadlines.first() {
            if d > now {
                break;
            }
            self.deadlines.pop_first();
            let after = self.transfers.get(key).and_then(|t| t.timeout);
            if let Some(after) = after {
                self.stop(now, key, Failure::Timeout { after });
            }
        }
        for key in self.settling.clone() {
            let Some(t) = self.transfers.get(key) else {
                continue;
            };
            if let Phase::Stopping {
                since,
                fenced: false,
                ..
            } = t.phase
            {
                if t.inflight > 0 && now >= since + self.cfg.quiesce {
                    self.fence(now, io, key);
                }
            }
            self.try_finish(now, key);
        }
        for r in &mut self.rails {
            r.sample(now);
        }
        if !self.is_closed() {
            self.renewals_due(now, io);
            self.check_rails(now);
        }
        self.pump(now, io);
    }

    /// Whether no rail has been usable for a quiesce time (transfers fail with
    /// [`Failure::NoRail`] then).
    fn no_rail_for(&self, now: Instant) -> bool {
        !self.rails.iter().any(RailLink::is_usable)
            && self
                .no_rail_since
                .is_some_and(|s| now >= s + self.cfg.quiesce)
    }

    /// The application took a delivered notification: its receive slot is posted again (on
    /// the rail's current queue pair, if it still has one).
    pub fn consumed(&mut self, io: &mut I, receipt: Receipt) {
        self.untaken = self.untaken.saturating_sub(1);
        if !receipt.holds {
            return;
        }
        let rail = receipt.lane.lane / self.cfg.lanes_per_rail;
        let Some(slots) = self.recv.get_mut(rail) else {
            return;
        };
        slots.held = slots.held.saturating_sub(1);
        self.arm_free_slots(io, rail, 1);
    }

    /// Posts every receive slot that is free and not held for the application, as far as the
    /// driver lets ([`Io::may_arm_recv`]): the driver calls it once slots it deferred may be
    /// posted.
    pub fn rearm(&mut self, io: &mut I) {
        for rail in 0..self.recv.len() {
            self.arm_free_slots(io, rail, 0);
        }
    }

    /// The driver did not post the receive slots a new connection starts with (every slot of
    /// every rail, posted before [`Connection::new`]): they count as free, and the next
    /// [`Connection::rearm`] posts them.
    pub fn recv_slots_unposted(&mut self) {
        for r in &mut self.recv {
            r.armed.iter_mut().for_each(|a| *a = false);
        }
    }

    /// Posts the receive slots of rail `rail` that are free and not held for the application:
    /// `given_back` of them at once (slots given back one for one), the others only when the
    /// driver lets ([`Io::may_arm_recv`]).
    fn arm_free_slots(&mut self, io: &mut I, rail: usize, given_back: usize) {
        if self.is_closed() {
            return;
        }
        let slots = &mut self.recv[rail];
        let Some(gen) = slots.gen else {
            return;
        };
        let lane = LaneRef {
            lane: rail * self.cfg.lanes_per_rail,
            gen,
        };
        let armed = slots.armed.iter().filter(|a| **a).count();
        let want = usize::from(self.cfg.recv_slots).saturating_sub(usize::from(slots.held));
        let mut missing = want.saturating_sub(armed);
        if missing > given_back && !io.may_arm_recv() {
            missing = given_back;
        }
        for (slot, a) in slots.armed.iter_mut().enumerate() {
            if missing == 0 {
                break;
            }
            if !*a {
                match io.arm_recv(lane, slot as u16) {
                    Ok(()) => *a = true,
                    Err(e) => {
                        let error = DriverError::new(e);
                        self.actions
                            .push_back(Action::Event(Event::RearmFailed { lane, error }));
                        return;
                    }
                }
                missing -= 1;
            }
        }
    }
}

pub use crate::io::Receipt;

#[cfg(test)]
mod scripted;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod mutant_tests;
