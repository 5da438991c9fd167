//! The simulated world: agents with memory and connections, their applications submitting,
//! cancelling and consuming, the faults drawn from the seed, and the event loop that checks
//! the engine's promises after every step.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::io::{SimCodec, SimIo, SimLocal};
use super::net::{rkey, Net, Payload, QpState, SEG, SEGS};
use super::rng::Rng;
use super::staging::{SRun, SimJob, SimStageIo, SimStager, StageEvent, CHILD, COPY, GPU_SEG};
use super::xfers::{Kind, Misuse, XRun, XState, Xfer, GRAIN};
use super::{FaultClass, Report, TraceHash};
use crate::config::Config;
use crate::connection::Connection;
use crate::endpoint::{ConnId, Endpoint};
use crate::fault::{DriverError, Lost, TextError};
use crate::handshake::{self, Offer, Settings, Shape};
use crate::io::{Action, Event, Header, Io, LaneRef, Op, Receipt, SendCompletion, Status};
use crate::peer_table::{PeerTable, TableError};
use crate::rail::MAX_COOLDOWN;
use crate::run::Run;
use crate::staged::{ChildStats, StagedJob, StagedRun};
use crate::staging::{Chunk, PipelineConfig};
use crate::transfer::{Failure, Outcome, Spec, TransferKey};
use crate::wire::Message;

mod app;
mod event;
mod locals;
mod tables;

pub(crate) use event::Ev;
use event::Scheduled;

/// One agent's connection to one peer.
struct Conn {
    core: Connection<SimIo>,
    io: SimIo,
    timer: Option<Duration>,
    inbox: VecDeque<Receipt>,
    /// Staged transfers to this peer.
    jobs: Vec<SimJob>,
    /// Which connection between the two agents it is (0, then one more after each reconnection).
    inc: u32,
    /// Its number in its agent's endpoint.
    id: ConnId,
    /// When its agent let it go.
    let_go_at: Option<Duration>,
    /// Its agent is leaving ([`Connection::leave`]): once it holds no transfer, it says
    /// goodbye and closes.
    leaving: bool,
}

/// The scenario a seed draws.
#[derive(Debug, Clone)]
pub(crate) struct Params {
    pub(crate) class: FaultClass,
    pub(crate) agents: usize,
    pub(crate) cfg: Config,
    pub(crate) transfers_per_pair: u32,
    pub(crate) slow_consumer: bool,
    /// Percent of transfers that are staged, and the stagers' settings (bounce buffers'
    /// size and number, tickets at once, and how ranges are cut).
    pub(crate) staged_pct: u64,
    pub(crate) stager: PipelineConfig,
    /// Each agent's queue pairs per rail and settings (receive slots and the largest
    /// notification differ between agents): every connection is configured by the
    /// handshake's negotiation between the two, as the driver configures it.
    pub(crate) agent_settings: Vec<(usize, Settings)>,
    /// Whether runs may disconnect and reconnect two agents (unless `GDR_SIM_RECONNECT=0`).
    pub(crate) reconnect: bool,
}

pub(crate) struct World {
    p: Params,
    rng: Rng,
    base: Instant,
    now: Duration,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    net: Rc<RefCell<Net>>,
    conns: Vec<Vec<Option<Conn>>>,
    /// Each agent's endpoint (the peer's index and incarnation for a connection; (segment,
    /// epoch) for each of its own registrations, [`locals`]): every send completion is routed
    /// through it, by rail and queue pair number, as the driver does.
    endpoints: Vec<Endpoint<(usize, u32), (usize, u32)>>,
    /// `agent`'s table of `peer`'s segments ([`tables`]).
    tables: Vec<Vec<PeerTable>>,
    /// Connections let go and replaced by a newer one between the same agents, until their
    /// endpoint lets them go: (agent, peer, connection).
    retired: Vec<(usize, usize, Conn)>,
    /// The incarnation of the newest connection between two agents.
    inc: Vec<Vec<u32>>,
    /// Whether two agents parted ([`Ev::Leave`]) and did not connect again yet: transfers
    /// between them meanwhile are no innocent ones (they may meet the goodbye).
    parted: Vec<Vec<bool>>,
    stagers: Vec<SimStager>,
    /// How many times each agent restarted (its stager's incarnation).
    incarnations: Vec<u64>,
    /// When each agent's staging step is next due (if one is scheduled).
    stage_at: Vec<Option<Duration>>,
    /// When the last control message from `a` to `b` is delivered (in order per direction).
    control_at: Vec<Vec<Duration>>,
    flagged: Vec<bool>,
    pub(crate) report: Report,
    /// Whether the faults healed ([`Ev::Heal`]): the liveness phase.
    healed: bool,
    /// The transfers submitted in the liveness phase: each must succeed.
    liveness: Vec<usize>,
    /// Every event's time, order and kind, and every outcome, hashed: two runs of a seed are
    /// the same run when their hashes are ([`Report::trace_hash`]).
    trace_hash: TraceHash,
    pub(crate) trace: VecDeque<String>,
    pub(crate) verbose: bool,
}

/// Most events a run may take before it counts as not settling.
const MAX_EVENTS: u64 = 2_000_000;
/// Latest virtual time.
const MAX_TIME: Duration = Duration::from_secs(300);
/// When the faults heal ([`Ev::Heal`]).
const HEAL_AT: Duration = Duration::from_millis(600);
/// Room beyond the rails' recovery before the liveness phase's transfers.
const LIVENESS_MARGIN: Duration = Duration::from_millis(200);
/// Transfers per connected pair in the liveness phase.
const LIVENESS_TRANSFERS: u32 = 3;
/// The timer and poll granularity the simulated driver adds to the outcome bound.
const SLACK: Duration = Duration::from_millis(1);

impl World {
    pub(crate) fn new(seed: u64, class: Option<FaultClass>) -> World {
        let mut rng = Rng::new(seed);
        let class = class.unwrap_or(match seed % 4 {
            0 => FaultClass::Clean,
            1 => FaultClass::Lanes,
            2 => FaultClass::Links,
            _ => FaultClass::Kill,
        });
        let agents = if class == FaultClass::Kill {
            3
        } else {
            2 + rng.index(2)
        };
        let mut cfg = Config::new(1 + rng.index(2), 1 + rng.index(2));
        cfg.send_depth = rng.range(3, 17);
        cfg.slice_size = 64 * rng.range(2, 17);
        cfg.stripe_min = 64 * rng.range(0, 64);
        cfg.recv_slots = rng.range(1, 5) as u16;
        cfg.send_slots = cfg.recv_slots;
        // Mostly none buffered, so that held slots and the peers' waits are exercised.
        cfg.recv_buffered = if rng.percent(70) {
            0
        } else {
            rng.range(1, 8) as u32
        };
        cfg.notify_max = rng.range(8, 64) as u32;
        cfg.quiesce = Duration::from_millis(rng.range(15, 60));
        cfg.renew_timeout = Duration::from_millis(rng.range(40, 150));
        let agent_settings = (0..agents)
            .map(|_| {
                let lanes = 1 + rng.index(2);
                (
                    lanes,
                    Settings {
                        send_depth: cfg.send_depth,
                        slice_size: cfg.slice_size,
                        stripe_min: cfg.stripe_min,
                        notify_slots: rng.range(1, 5) as u16,
                        notify_queue: cfg.recv_buffered,
                        notify_max: rng.range(8, 64) as u32,
                        quiesce: cfg.quiesce,
                        renew_timeout: cfg.renew_timeout,
                    },
                )
            })
            .collect();
        let p = Params {
            agent_settings,
            reconnect: !std::env::var("GDR_SIM_RECONNECT").is_ok_and(|v| v == "0"),
            class,
            agents,
            cfg,
            transfers_per_pair: rng.range(4, 14) as u32,
            slow_consumer: rng.percent(30),
            staged_pct: if rng.percent(50) {
                rng.range(10, 60)
            } else {
                0
            },
            stager: stager_config(&mut rng),
        };
        let mut net = Net::new(agents, p.cfg.rails, Rng::new(rng.next_u64()));
        if class == FaultClass::Lanes {
            net.create_fail = 8;
        }
        let failing: Vec<Option<u64>> = (0..agents)
            .map(|_| failing_copy(&mut rng, &p.stager))
            .collect();
        let mut w = World {
            rng,
            base: Instant::now(),
            now: Duration::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            net: Rc::new(RefCell::new(net)),
            conns: (0..agents)
                .map(|_| (0..agents).map(|_| None).collect())
                .collect(),
            endpoints: (0..agents)
                .map(|a| locals::registered(a, p.cfg.rails, agents))
                .collect(),
            retired: Vec::new(),
            inc: vec![vec![0; agents]; agents],
            parted: vec![vec![false; agents]; agents],
            tables: vec![vec![PeerTable::new(); agents]; agents],
            stagers: failing
                .into_iter()
                .map(|f| SimStager::new(p.stager, 0, f))
                .collect(),
            incarnations: vec![0; agents],
            stage_at: vec![None; agents],
            control_at: vec![vec![Duration::ZERO; agents]; agents],
            flagged: Vec::new(),
            report: Report::default(),
            healed: false,
            liveness: Vec::new(),
            trace_hash: TraceHash::default(),
            trace: VecDeque::new(),
            verbose: false,
            p,
        };
        w.connect_all();
        w.plan();
        w
    }

    /// Keeps a trace of the last events (and the network's notes).
    pub(crate) fn set_verbose(&mut self, on: bool) {
        self.verbose = on;
        self.net.borrow_mut().trace = on.then(Vec::new);
    }

    pub(crate) fn params(&self) -> &Params {
        &self.p
    }

    fn at(&mut self, delay: Duration, ev: Ev) {
        let at = self.now + delay;
        self.push(at, ev);
    }

    fn push(&mut self, at: Duration, ev: Ev) {
        self.seq += 1;
        self.queue.push(Scheduled {
            at,
            seq: self.seq,
            ev,
        });
    }

    fn instant(&self) -> Instant {
        self.base + self.now
    }

    fn us(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_micros(self.rng.range(lo, hi))
    }

    /// Connects every pair of agents (the one of the lower index initiates).
    fn connect_all(&mut self) {
        for a in 0..self.p.agents {
            for b in a + 1..self.p.agents {
                self.connect_pair(a, b);
            }
        }
    }

    /// Connects `a` (the initiator) and `b`: the handshake's negotiation between their
    /// settings, both cores, their queue pairs, receives posted, the segment tables exchanged,
    /// each connection admitted by its agent's endpoint (under the pair's current
    /// incarnation).
    fn connect_pair(&mut self, a: usize, b: usize) {
        let inc = self.inc[a][b];
        let (ca, cb) = self.negotiate(a, b);
        let mut ios = [
            SimIo::new(
                self.net.clone(),
                (a, b, inc),
                ca.notify_max as usize + Header::LEN,
                ca.send_depth as usize,
            ),
            SimIo::new(
                self.net.clone(),
                (b, a, inc),
                cb.notify_max as usize + Header::LEN,
                cb.send_depth as usize,
            ),
        ];
        let mut routes = [Vec::new(), Vec::new()];
        for lane in 0..ca.lanes() {
            let rail = lane / ca.lanes_per_rail;
            let l = LaneRef {
                lane,
                gen: lane as u64,
            };
            let qa = ios[0].add_qp(rail, l);
            let qb = ios[1].add_qp(rail, l);
            routes[0].push((rail, qa as u32, l));
            routes[1].push((rail, qb as u32, l));
            ios[0].connect(qa, qb);
            ios[1].connect(qb, qa);
            if lane % ca.lanes_per_rail == 0 {
                for (io, slots) in ios.iter_mut().zip([ca.recv_slots, cb.recv_slots]) {
                    for slot in 0..slots {
                        io.arm_recv(l, slot).expect("a new queue pair");
                    }
                }
            }
        }
        let mut ids = [ConnId(0); 2];
        for (k, (me, other)) in [(a, b), (b, a)].into_iter().enumerate() {
            ids[k] = self.endpoints[me]
                .admit(&format!("agent {other}"), (other, inc), &routes[k])
                .unwrap_or_else(|e| panic!("agent {me} refused agent {other}: {e}"));
        }
        self.exchange_tables(a, b, ca.rails);
        for (me, id) in [(a, ids[0]), (b, ids[1])] {
            if !self.endpoints[me].ready(id) {
                self.net.borrow_mut().violation(format!(
                    "agent {me}: a connection just admitted is not ready"
                ));
            }
        }
        let [ia, ib] = ios;
        let now = self.instant();
        for (me, other, cfg, io, id) in [(a, b, ca, ia, ids[0]), (b, a, cb, ib, ids[1])] {
            self.conns[me][other] = Some(Conn {
                core: Connection::new(cfg, now),
                io,
                timer: None,
                inbox: VecDeque::new(),
                jobs: Vec::new(),
                inc,
                id,
                let_go_at: None,
                leaving: false,
            });
        }
    }

    /// The handshake between initiator `a` and acceptor `b`, through the core's negotiation:
    /// both sides' configurations.
    fn negotiate(&self, a: usize, b: usize) -> (Config, Config) {
        let rails = self.p.cfg.rails;
        let offer = |i: usize, shape: Shape| {
            let (_, s) = &self.p.agent_settings[i];
            Offer {
                name: format!("agent {i}"),
                shape,
                notify_slots: s.notify_slots,
                notify_max: s.notify_max,
            }
        };
        let offered = Shape {
            rails,
            lanes_per_rail: self.p.agent_settings[a].0,
        };
        let from_a = offer(a, offered);
        let answered = handshake::answer(&format!("agent {b}"), rails, &from_a)
            .unwrap_or_else(|e| panic!("agent {b} refused agent {a}'s hello: {e}"));
        let from_b = offer(b, answered);
        let agreed = handshake::agree(&format!("agent {a}"), offered, &from_b)
            .unwrap_or_else(|e| panic!("agent {a} refused agent {b}'s answer: {e}"));
        (
            self.p.agent_settings[a].1.config(agreed, &from_b, true),
            self.p.agent_settings[b].1.config(agreed, &from_a, false),
        )
    }

    /// The applications' first submissions and the faults of the run.
    fn plan(&mut self) {
        for a in 0..self.p.agents {
            for b in 0..self.p.agents {
                if a != b {
                    let d = self.us(0, 3000);
                    let left = self.p.transfers_per_pair;
                    self.at(
                        d,
                        Ev::Submit {
                            agent: a,
                            peer: b,
                            left,
                        },
                    );
                }
            }
        }
        let horizon = 120_000;
        // Every class: slow paths, and peers deregistering segments under transfers.
        for _ in 0..self.rng.range(0, 4) {
            let d = self.us(0, horizon);
            let q = self.p.cfg.quiesce.as_micros() as u64;
            let until = self.us(0, 3 * q);
            self.at(d, Ev::Stall { until });
        }
        if self.rng.percent(40) {
            let d = self.us(0, horizon);
            let agent = self.rng.index(self.p.agents);
            let seg = self.rng.index(SEGS);
            self.at(d, Ev::Deregister { agent, seg });
        }
        for _ in 0..self.rng.range(0, 3) {
            let d = self.us(0, horizon);
            let agent = self.rng.index(self.p.agents);
            self.at(d, Ev::ForeignCalls { agent });
        }
        match self.p.class {
            FaultClass::Clean => {}
            FaultClass::Lanes => {
                for _ in 0..self.rng.range(1, 5) {
                    let d = self.us(0, horizon);
                    self.at(d, Ev::Doom);
                }
            }
            FaultClass::Links => {
                for _ in 0..self.rng.range(1, 4) {
                    let d = self.us(0, horizon);
                    let rail = self.rng.index(self.p.cfg.rails);
                    let up_after = self.us(1000, 300_000);
                    self.at(d, Ev::LinkDown { rail, up_after });
                }
            }
            FaultClass::Kill => {
                let d = self.us(0, horizon);
                self.at(d, Ev::Kill { agent: 2 });
            }
        }
        // Half the runs disconnect two agents and connect them again: the leaving side's
        // transfers stop and report once quiet, then a goodbye, then a new handshake under the
        // same names while the old connection may still drain (`GDR_SIM_RECONNECT=0`: none).
        if self.p.reconnect
            && self.p.class != FaultClass::Kill
            && self.p.staged_pct == 0
            && self.rng.percent(50)
        {
            let d = self.us(0, horizon);
            let agent = self.rng.index(self.p.agents);
            let peer = (agent + 1 + self.rng.index(self.p.agents - 1)) % self.p.agents;
            self.at(d, Ev::Leave { agent, peer });
        }
        // Every fault has ended by then (links are up within 300 ms of going down); the heal
        // stops those that would persist, and once the rails had time to come back (a paused
        // rail's longest cool-down, a renewal, a probe), every pair still connected submits
        // transfers that must all succeed.
        self.at(HEAL_AT, Ev::Heal);
        let back = HEAL_AT + MAX_COOLDOWN + self.p.cfg.renew_timeout * 2 + LIVENESS_MARGIN;
        for a in 0..self.p.agents {
            for b in 0..self.p.agents {
                if a != b {
                    let d = self.us(0, 3000);
                    self.at(
                        back + d,
                        Ev::Submit {
                            agent: a,
                            peer: b,
                            left: LIVENESS_TRANSFERS,
                        },
                    );
                }
            }
        }
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        if self.verbose {
            let l = format!("{:>12?} {}", self.now, line());
            self.trace.push_back(l);
            if self.trace.len() > 200_000 {
                self.trace.pop_front();
            }
        }
    }

    /// Runs until nothing is left to happen; the first violation ends it.
    pub(crate) fn run(&mut self) -> Result<(), String> {
        while let Some(s) = self.queue.pop() {
            if s.at > MAX_TIME || self.report.events > MAX_EVENTS {
                return Err(format!(
                    "the simulation did not settle: {} events, {:?} of virtual time",
                    self.report.events, s.at
                ));
            }
            self.now = s.at;
            self.net.borrow_mut().now = s.at;
            self.report.events += 1;
            self.trace_hash
                .note(&(s.at, s.seq, std::mem::discriminant(&s.ev)));
            self.handle(s.ev);
            let notes = self.net.borrow_mut().trace.as_mut().map(std::mem::take);
            for n in notes.into_iter().flatten() {
                self.log(|| n);
            }
            self.drain_net();
            self.watchdog();
            let v = std::mem::take(&mut self.net.borrow_mut().violations);
            if let Some(first) = v.into_iter().next() {
                return Err(first);
            }
        }
        self.report.virtual_time = self.now;
        let r = self.final_checks();
        self.report.trace_hash = self.trace_hash.finish();
        r
    }

    fn drain_net(&mut self) {
        let out = std::mem::take(&mut self.net.borrow_mut().out);
        for (at, ev) in out {
            self.push(at, ev);
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Exec { qp, token } => {
                self.log(|| format!("exec qp {qp}"));
                self.net.borrow_mut().exec(qp, token)
            }
            Ev::Arrive {
                qp,
                token,
                payload,
                lose_ack,
                xfer,
            } => self
                .net
                .borrow_mut()
                .arrive(qp, token, payload, lose_ack, xfer),
            Ev::Ack { qp, token, data } => self.net.borrow_mut().ack(qp, token, data),
            Ev::Fail { qp, token, status } => self.net.borrow_mut().fail(qp, token, status),
            Ev::Cqe { agent, peer, c } => {
                self.log(|| format!("cqe {agent}->{peer} {c:?}"));
                if let Some((p, inc)) = self.route(agent, c.qp_num as usize, c.lane) {
                    self.report.routed += 1;
                    self.call_inc(agent, p, inc, |core, io, now| {
                        core.handle_send_completion(now, io, c)
                    });
                }
                self.polled(agent, false);
            }
            Ev::Recv {
                agent,
                peer,
                qp,
                lane,
                slot,
                msg,
            } => {
                self.log(|| {
                    format!(
                        "recv {agent}<-{peer} {lane:?} slot {slot} ok={}",
                        msg.is_some()
                    )
                });
                if let Some((p, inc)) = self.route(agent, qp, lane) {
                    self.call_inc(agent, p, inc, |core, io, now| {
                        core.handle_recv(now, io, lane, slot, msg.as_deref())
                    });
                }
                self.polled(agent, false);
            }
            Ev::Timer { agent, peer } => self.on_timer(agent, peer),
            Ev::Poll { agent } => {
                self.polled(agent, true);
                if self.endpoints[agent].draining() > 0 && self.net.borrow().alive[agent] {
                    let d = self.us(500, 5000);
                    self.at(d, Ev::Poll { agent });
                }
            }
            Ev::Control {
                from,
                to,
                inc,
                bytes,
            } => self.on_control(from, to, inc, &bytes),
            Ev::Submit { agent, peer, left } => self.submit(agent, peer, left),
            Ev::Cancel { xfer } => self.on_cancel(xfer),
            Ev::PostQueued { agent, peer } => {
                self.log(|| format!("post queued {agent}->{peer}"));
                self.call(agent, peer, |core, io, now| core.post_queued(now, io));
            }
            Ev::Consume { agent, peer } => {
                let r = self.conns[agent][peer]
                    .as_mut()
                    .and_then(|c| c.inbox.pop_front());
                if let Some(r) = r {
                    self.call(agent, peer, |core, io, _| core.consumed(io, r));
                }
            }
            Ev::Stall { until } => {
                if let Some(q) = self.random_ready_qp() {
                    let mut net = self.net.borrow_mut();
                    let now = net.now;
                    net.qps[q].slow_until = now + until;
                    self.report.stalls += 1;
                }
            }
            Ev::Doom => {
                if let Some(q) = self.random_ready_qp() {
                    self.net.borrow_mut().qps[q].doomed = true;
                    self.report.lane_faults += 1;
                }
            }
            Ev::Deregister { agent, seg } => self.on_deregister(agent, seg),
            Ev::ForeignCalls { agent } => self.on_foreign_calls(agent),
            Ev::LinkDown { rail, up_after } => {
                self.log(|| format!("link {rail} down"));
                self.net.borrow_mut().link_up[rail] = false;
                self.report.link_faults += 1;
                self.at(up_after, Ev::LinkUp { rail });
            }
            Ev::LinkUp { rail } => {
                self.log(|| format!("link {rail} up"));
                self.net.borrow_mut().link_up[rail] = true;
            }
            Ev::Kill { agent } => self.kill(agent),
            Ev::Heal => self.heal(),
            Ev::Leave { agent, peer } => self.leave(agent, peer),
            Ev::Join { a, b } => self.join(a, b),
            Ev::CopyDone { agent, copy } => self.on_copy_done(agent, copy),
            Ev::StageStep { agent } => {
                if self.stage_at[agent] == Some(self.now) {
                    self.stage_at[agent] = None;
                }
                self.stage_step(agent);
            }
            Ev::Lost { agent, peer } => {
                let why = Lost::Link {
                    error: DriverError::new(TextError(format!("agent {peer} vanished"))),
                };
                self.on_lost(agent, peer, why)
            }
        }
    }

    /// The timer of `agent`'s connection to `peer`: the core's timeout, if it is due.
    fn on_timer(&mut self, agent: usize, peer: usize) {
        // The progress threads poll at least every tick.
        self.polled(agent, true);
        let due = self.conns[agent][peer]
            .as_ref()
            .is_some_and(|c| c.timer.is_some_and(|t| t <= self.now));
        if due {
            if self.verbose {
                let dump = format!("{:#?}", self.conns[agent][peer].as_ref().map(|c| &c.core));
                self.log(|| format!("timer {agent}->{peer}: {dump}"));
            }
            if let Some(c) = self.conns[agent][peer].as_mut() {
                c.timer = None;
            }
            self.call(agent, peer, |core, io, now| core.handle_timeout(now, io));
        }
    }

    /// A control message from `from` arrives at `to`, through the real decoder.
    fn on_control(&mut self, from: usize, to: usize, inc: u32, bytes: &[u8]) {
        // Sent on an earlier connection between the two: its control link is closed.
        if self.conns[to][from].as_ref().is_none_or(|c| c.inc != inc) {
            return;
        }
        let msg = match Message::<SimCodec>::decode(&format!("agent {from}"), bytes)
            .map(Message::into_control)
        {
            Ok(Ok(control)) => control,
            Ok(Err(Message::Bye(reason))) => {
                self.log(|| format!("bye {from}->{to}: {reason}"));
                let why = Lost::Message {
                    why: TableError::Goodbye { reason },
                };
                return self.on_lost(to, from, why);
            }
            Ok(Err(table)) => {
                self.log(|| format!("table {from}->{to} {table:?}"));
                return self.apply_table(from, to, table);
            }
            Err(e) => panic!("agent {to} received a control message it cannot decode: {e}"),
        };
        self.log(|| format!("control {from}->{to} {msg:?}"));
        self.call(to, from, |core, io, now| core.handle_control(now, io, msg));
    }

    /// The application cancels transfer `xfer`, if it is still live.
    fn on_cancel(&mut self, xfer: usize) {
        let (agent, peer, key, live) = {
            let net = self.net.borrow();
            let x = &net.xfers.list[xfer];
            (x.agent, x.peer, x.key, x.state == XState::Live)
        };
        if let (Some(key), true) = (key, live) {
            self.log(|| format!("cancel {xfer}"));
            self.call(agent, peer, |core, io, now| {
                core.cancel(now, io, key);
            });
        }
    }

    /// A queue pair in the ready state, drawn from the seed (none if there is none).
    fn random_ready_qp(&mut self) -> Option<usize> {
        let net = self.net.borrow();
        let ready: Vec<usize> = (0..net.qps.len())
            .filter(|&q| net.qps[q].state == QpState::Ready)
            .collect();
        drop(net);
        (!ready.is_empty()).then(|| ready[self.rng.index(ready.len())])
    }

    /// `agent` deregisters segment `seg`: its keys change, and transfers using it as their
    /// remote side may now fail (not innocent any more).
    fn on_deregister(&mut self, agent: usize, seg: usize) {
        let old = self.net.borrow().key_epoch[agent][seg];
        self.reregister(agent, seg, old);
        self.announce_reregistration(agent, seg, old, old + 1);
        let mut net = self.net.borrow_mut();
        net.key_epoch[agent][seg] += 1;
        for x in &mut net.xfers.list {
            if x.peer == agent
                && x.state == XState::Live
                && x.runs.iter().any(|r| r.remote / SEG == seg)
            {
                x.innocent = false;
            }
        }
        self.report.deregistrations += 1;
    }

    /// Copy `copy` of `agent`'s stager completes.
    fn on_copy_done(&mut self, agent: usize, copy: u64) {
        if self.net.borrow().alive[agent] {
            let mut net = self.net.borrow_mut();
            self.stagers[agent].copy_done(&mut net, agent, copy);
            drop(net);
            self.stage_soon(agent);
        }
    }

    /// `agent` notices that `peer` vanished: first its connection is closing, a little later
    /// (`close`) it is closed.
    fn on_lost(&mut self, agent: usize, peer: usize, why: Lost) {
        let failure = Failure::PeerLost { why };
        self.spoil_pair(agent, peer);
        // As the driver does when a peer goes: new transfers are refused at once, and the
        // endpoint lets the connection go; once every completion queued before was handled it
        // hands it back, and what is still in flight fails then ([`World::polled`]).
        let now_at = self.now;
        let Some(c) = self.conns[agent][peer].as_mut() else {
            return;
        };
        if c.let_go_at.is_some() {
            return;
        }
        c.core.closing(failure.clone());
        c.let_go_at = Some(now_at);
        let id = c.id;
        let now = self.endpoints[agent].let_go(id, Some(failure));
        if let Some(f) = now {
            self.call(agent, peer, |core, _, now| core.close(now, f));
        }
        let d = self.us(100, 2000);
        self.at(d, Ev::Poll { agent });
    }

    /// Transfers live between `agent` and `peer` when their connection goes are no innocent
    /// ones (they fail with the connection).
    fn spoil_pair(&mut self, agent: usize, peer: usize) {
        let mut net = self.net.borrow_mut();
        for x in &mut net.xfers.list {
            if x.state == XState::Live
                && ((x.agent, x.peer) == (agent, peer) || (x.agent, x.peer) == (peer, agent))
            {
                x.innocent = false;
            }
        }
    }

    /// `agent` disconnects from `peer`, as the driver does: its transfers stop (each reports
    /// once neither side's memory can be touched by it, [`Connection::leave`]); once none is
    /// left it says goodbye, closes and lets the connection go ([`World::finish_leave`]). The
    /// two connect again a little later.
    fn leave(&mut self, agent: usize, peer: usize) {
        let live = self.conns[agent][peer]
            .as_ref()
            .is_some_and(|c| c.let_go_at.is_none() && !c.leaving && c.core.gone().is_none());
        if !live || !self.net.borrow().alive[agent] || !self.net.borrow().alive[peer] {
            return;
        }
        self.log(|| format!("leave {agent}->{peer}"));
        self.parted[agent][peer] = true;
        self.parted[peer][agent] = true;
        self.report.reconnections += 1;
        self.spoil_pair(agent, peer);
        if let Some(c) = self.conns[agent][peer].as_mut() {
            c.leaving = true;
        }
        self.call(agent, peer, |core, _, now| {
            core.leave(
                now,
                Failure::PeerLost {
                    why: Lost::Disconnected,
                },
            )
        });
    }

    /// The leaving connection holds no transfer any more: goodbye, close, let go.
    fn finish_leave(&mut self, agent: usize, peer: usize) {
        let Some(c) = self.conns[agent][peer].as_mut() else {
            return;
        };
        c.leaving = false;
        let inc = c.inc;
        let bye = Message::<SimCodec>::Bye(format!("agent {agent} closed the connection"))
            .encode()
            .expect("a goodbye encodes");
        self.send_control(agent, peer, inc, bye);
        self.call(agent, peer, |core, _, now| {
            core.close(
                now,
                Failure::PeerLost {
                    why: Lost::Disconnected,
                },
            )
        });
        if let Some(mut c) = self.conns[agent][peer].take() {
            c.let_go_at = Some(self.now);
            if let Some(f) = self.endpoints[agent].let_go(c.id, None) {
                c.core.close(self.instant(), f);
            }
            self.retired.push((agent, peer, c));
        }
        let d = self.us(100, 2000);
        self.at(d, Ev::Poll { agent });
        let d = self.us(2000, 20_000);
        self.at(
            d,
            Ev::Join {
                a: agent.min(peer),
                b: agent.max(peer),
            },
        );
    }

    /// `a` connects to `b` again, once both let their last connection go (each endpoint refuses
    /// a second connection of one name, as the driver's handshake is then refused and tried
    /// again); until then it tries again every few milliseconds.
    fn join(&mut self, a: usize, b: usize) {
        let net_alive = {
            let n = self.net.borrow();
            n.alive[a] && n.alive[b]
        };
        if !net_alive {
            return;
        }
        // A side is free once its last connection was let go and holds no staged job.
        let side_free = |c: &Option<Conn>| {
            c.as_ref()
                .is_none_or(|c| c.let_go_at.is_some() && c.jobs.is_empty())
        };
        let free = side_free(&self.conns[a][b])
            && side_free(&self.conns[b][a])
            && self.endpoints[a].peer(&format!("agent {b}")).is_none()
            && self.endpoints[b].peer(&format!("agent {a}")).is_none();
        if !free {
            let d = self.us(1000, 5000);
            self.at(d, Ev::Join { a, b });
            return;
        }
        self.log(|| format!("join {a}<->{b}"));
        for (x, y) in [(a, b), (b, a)] {
            if let Some(c) = self.conns[x][y].take() {
                self.retired.push((x, y, c));
            }
        }
        let inc = self.inc[a][b] + 1;
        self.inc[a][b] = inc;
        self.inc[b][a] = inc;
        self.connect_pair(a, b);
        self.parted[a][b] = false;
        self.parted[b][a] = false;
    }

    /// `agent`'s progress thread polled its completion queues: when nothing is queued for it
    /// (`strict`: nothing at this very instant either, for a poll that is no completion's),
    /// they are drained, and the connections its endpoint lets go now must have no completion
    /// queued before they were let go still unhandled.
    fn polled(&mut self, agent: usize, strict: bool) {
        // Every poll drains what is visible (the completions of this instant are handled in
        // order; one may still wait at this very instant for a poll that is no completion's).
        let last = self.net.borrow().cq_at[agent];
        if strict && last == self.now {
            return;
        }
        for rail in 0..self.p.cfg.rails {
            for ((peer, inc), failure) in self.endpoints[agent].drained(rail) {
                let at = self.conn_mut(agent, peer, inc).and_then(|c| c.let_go_at);
                let early = {
                    let net = self.net.borrow();
                    self.queue.iter().any(|e| {
                        let qp = match &e.ev {
                            Ev::Cqe { agent: a, c, .. } if *a == agent => c.qp_num as usize,
                            Ev::Recv { agent: a, qp, .. } if *a == agent => *qp,
                            _ => return false,
                        };
                        let q = &net.qps[qp];
                        q.peer == peer && q.inc == inc && at.is_some_and(|t| e.at <= t)
                    })
                };
                if early {
                    self.net.borrow_mut().violation(format!(
                        "agent {agent}'s endpoint let its connection to {peer} go with a completion queued before that still unhandled"
                    ));
                }
                self.report.conns_gone += 1;
                self.log(|| format!("agent {agent} let its connection to {peer} go"));
                if let Some(f) = failure {
                    self.call_inc(agent, peer, inc, |core, _, now| core.close(now, f));
                }
            }
        }
    }

    /// The connection and lane a completion of queue pair `qp` of `agent` is routed to by the
    /// agent's endpoint ((peer, incarnation)), checked against the queue pair's own; `None`
    /// when it is routed nowhere (destroyed, or its connection gone).
    fn route(&mut self, agent: usize, qp: usize, lane: LaneRef) -> Option<(usize, u32)> {
        let (rail, owner) = {
            let net = self.net.borrow();
            let q = &net.qps[qp];
            (q.rail, (q.peer, q.inc, q.lane))
        };
        let Some((&(peer, inc), routed)) = self.endpoints[agent].lookup(rail, qp as u32) else {
            self.report.routed_nowhere += 1;
            self.log(|| format!("completion of qp {qp} routed nowhere"));
            return None;
        };
        if (peer, inc, routed) != owner || routed != lane {
            self.net.borrow_mut().violation(format!(
                "agent {agent}'s endpoint routed a completion of queue pair {qp} (connection {:?}) to agent {peer}'s connection {inc}, {routed:?}",
                owner
            ));
        }
        Some((peer, inc))
    }

    /// Calls the core of `agent`'s connection to `peer` (if both live), then acts on what it
    /// produced.
    fn call(
        &mut self,
        agent: usize,
        peer: usize,
        f: impl FnOnce(&mut Connection<SimIo>, &mut SimIo, Instant),
    ) {
        let Some(inc) = self.conns[agent][peer].as_ref().map(|c| c.inc) else {
            return;
        };
        self.call_inc(agent, peer, inc, f);
    }

    /// As [`World::call`], for incarnation `inc` of the connection (the current one, or one
    /// let go and replaced, still draining).
    fn call_inc(
        &mut self,
        agent: usize,
        peer: usize,
        inc: u32,
        f: impl FnOnce(&mut Connection<SimIo>, &mut SimIo, Instant),
    ) {
        let now = self.instant();
        let Some(c) = self.conn_mut(agent, peer, inc) else {
            return;
        };
        f(&mut c.core, &mut c.io, now);
        self.settle(agent, peer, inc);
    }

    /// Incarnation `inc` of `agent`'s connection to `peer`, if it is still there.
    fn conn_mut(&mut self, agent: usize, peer: usize, inc: u32) -> Option<&mut Conn> {
        if self.conns[agent][peer]
            .as_ref()
            .is_some_and(|c| c.inc == inc)
        {
            return self.conns[agent][peer].as_mut();
        }
        self.retired
            .iter_mut()
            .find(|(a, p, c)| *a == agent && *p == peer && c.inc == inc)
            .map(|(_, _, c)| c)
    }

    /// Sends an encoded control message from `from` to `to`, after the ones sent before (one
    /// ordered link per direction).
    fn send_control(&mut self, from: usize, to: usize, inc: u32, bytes: Vec<u8>) {
        let d = self.us(30, 1500);
        let at = (self.now + d).max(self.control_at[from][to] + Duration::from_nanos(1));
        self.control_at[from][to] = at;
        self.push(
            at,
            Ev::Control {
                from,
                to,
                inc,
                bytes,
            },
        );
    }

    /// Acts on what a core call produced: control messages sent, outcomes checked,
    /// notifications queued for the application, the timer set.
    fn settle(&mut self, agent: usize, peer: usize, inc: u32) {
        let current = self.conns[agent][peer]
            .as_ref()
            .is_some_and(|c| c.inc == inc);
        let Some(c) = self.conn_mut(agent, peer, inc) else {
            return;
        };
        // The core's actions, carried out in its order, as the driver does: a destruction at
        // once (nothing executes on those queue pairs any more), the rest below.
        let mut actions = Vec::new();
        while let Some(a) = c.core.poll_action() {
            if let Action::DestroyLanes(lanes) = &a {
                c.io.destroy_lanes(lanes);
            }
            actions.push(a);
        }
        let mut out = std::mem::take(&mut c.io.out);
        let next = c.core.poll_timeout();
        let id = c.id;
        let endpoint = &mut self.endpoints[agent];
        for (rail, n, lane) in out.routed.drain(..) {
            endpoint.route(rail, n, id, lane);
        }
        for (rail, n, lane) in out.unrouted.drain(..) {
            endpoint.unroute(rail, n, id, lane);
        }
        'actions: for action in actions {
            match action {
                Action::DestroyLanes(_) => {}
                Action::SendControl(msg) => {
                    if !self.net.borrow().alive[peer] {
                        continue 'actions;
                    }
                    let bytes = match Message::<SimCodec>::from_control(msg).encode() {
                        Ok(bytes) => bytes,
                        Err(e) => {
                            panic!("agent {agent} sent a control message it cannot encode: {e}")
                        }
                    };
                    self.send_control(agent, peer, inc, bytes);
                }
                Action::Finished(x, o) => {
                    self.check_quiet_at_outcome(x);
                    if x & CHILD != 0 {
                        self.child_finished(agent, peer, x & !CHILD, o);
                        continue 'actions;
                    }
                    self.log(|| format!("outcome {x}: {:?}", o.result));
                    self.trace_hash
                        .note(&(x, o.result.as_ref().err().map(failure_kind)));
                    let bound = self.p.cfg.outcome_bound() + SLACK;
                    let mut net = self.net.borrow_mut();
                    let alive = net.alive[peer];
                    let now = self.now;
                    let Net { xfers, mem, .. } = &mut *net;
                    let mut v = xfers.outcome(x, &o.result, mem, alive, bound, now);
                    let t = &xfers.list[x];
                    if let (Err(f), true, true) =
                        (&o.result, t.innocent, self.p.class == FaultClass::Clean)
                    {
                        v.push(format!(
                            "transfer {x} had nothing wrong with it, yet failed with {f:?} (one caller's mistake or a fault harmed it)"
                        ));
                    }
                    if let (Err(f), true, FaultClass::Kill) = (&o.result, t.innocent, self.p.class)
                    {
                        if !matches!(f, Failure::PeerLost { .. }) && t.peer != 2 && t.agent != 2 {
                            v.push(format!(
                                "transfer {x} between two surviving agents failed with {f:?} when another agent died"
                            ));
                        }
                    }
                    if let Err(f) = &o.result {
                        if self.liveness.contains(&x) {
                            v.push(format!(
                                "transfer {x}, submitted after the faults healed and the rails had time to come back, failed with {f:?}"
                            ));
                        }
                    }
                    if o.result.is_ok() && self.liveness.contains(&x) {
                        self.report.liveness_done += 1;
                    }
                    match &o.result {
                        Ok(()) => self.report.done += 1,
                        Err(f) => *self.report.failed.entry(failure_kind(f)).or_default() += 1,
                    }
                    net.violations.extend(v);
                }
                Action::Deliver(data, receipt) => {
                    if data.len() >= 8 {
                        let x = u64::from_be_bytes(data[..8].try_into().expect("8 bytes")) as usize;
                        let mut net = self.net.borrow_mut();
                        if let Some(t) = net.xfers.list.get_mut(x) {
                            t.deliveries += 1;
                            if t.deliveries > 1 {
                                net.violation(format!(
                                    "transfer {x}'s notification was delivered twice"
                                ));
                            }
                        }
                    }
                    self.report.notifications += 1;
                    let d = if self.p.slow_consumer {
                        self.us(500, 30_000)
                    } else {
                        self.us(0, 100)
                    };
                    if let Some(c) = self.conn_mut(agent, peer, inc) {
                        c.inbox.push_back(receipt);
                    }
                    self.at(d, Ev::Consume { agent, peer });
                }
                Action::Event(e) => match e {
                    Event::Fenced { .. } => self.report.fences += 1,
                    Event::Renewing { .. } => self.report.renewals += 1,
                    Event::RailPaused { .. } => self.report.rail_pauses += 1,
                    _ => {}
                },
            }
        }
        let done_leaving = current
            && self.conns[agent][peer]
                .as_ref()
                .is_some_and(|c| c.leaving && c.core.transfers() == 0);
        if done_leaving {
            self.finish_leave(agent, peer);
            return;
        }
        if let (Some(t), true) = (next, current) {
            let at = t.saturating_duration_since(self.base).max(self.now);
            let c = self.conns[agent][peer].as_mut().expect("checked above");
            if c.timer.is_none_or(|cur| at < cur || cur < self.now) {
                c.timer = Some(at);
                self.push(at, Ev::Timer { agent, peer });
            }
        }
    }
    /// When transfer `x` reports its outcome, no queue pair still holds one of its requests:
    /// the core destroyed those carrying it before (in its action order), or they completed.
    fn check_quiet_at_outcome(&mut self, x: usize) {
        if x & CHILD != 0 {
            return;
        }
        let mut net = self.net.borrow_mut();
        let holding = net
            .qps
            .iter()
            .position(|q| q.state != QpState::Destroyed && q.sq.iter().any(|w| w.xfer == Some(x)));
        if let Some(q) = holding {
            net.violation(format!(
                "transfer {x} reported its outcome while queue pair {q} still held one of its requests"
            ));
        }
    }

    /// The faults heal: queue pairs are created again, none is slow or doomed any more; from
    /// now on the applications submit only plain transfers, each of which must succeed.
    fn heal(&mut self) {
        self.log(|| "heal".to_string());
        self.healed = true;
        for s in &mut self.stagers {
            s.no_more_failures();
        }
        let mut net = self.net.borrow_mut();
        net.create_fail = 0;
        for q in &mut net.qps {
            q.doomed = false;
            q.slow_until = Duration::ZERO;
        }
        for up in &mut net.link_up {
            *up = true;
        }
    }

    /// Kills `agent`: its queue pairs vanish, its cores stop; its peers notice a little later.
    fn kill(&mut self, agent: usize) {
        self.log(|| format!("kill {agent}"));
        self.report.kills += 1;
        {
            let mut net = self.net.borrow_mut();
            net.alive[agent] = false;
            for q in &mut net.qps {
                if q.agent == agent {
                    q.state = QpState::Destroyed;
                    q.sq.clear();
                    q.busy = None;
                }
            }
        }
        self.incarnations[agent] += 1;
        self.stagers[agent] = SimStager::new(self.p.stager, self.incarnations[agent], None);
        for p in 0..self.p.agents {
            self.conns[agent][p] = None;
            if p != agent && self.conns[p][agent].is_some() {
                let d = self.us(500, 20_000);
                self.at(
                    d,
                    Ev::Lost {
                        agent: p,
                        peer: agent,
                    },
                );
            }
        }
    }

    /// Every live transfer reaches its outcome by its deadline plus the bound.
    fn watchdog(&mut self) {
        let bound = self.staged_bound();
        let net = self.net.borrow();
        if self.flagged.len() < net.xfers.list.len() {
            self.flagged.resize(net.xfers.list.len(), false);
        }
        let mut late = Vec::new();
        for (x, t) in net.xfers.list.iter().enumerate() {
            if t.state == XState::Live && !self.flagged[x] && net.alive[t.agent] {
                if let Some(d) = t.deadline {
                    if self.now > d + bound {
                        late.push(x);
                    }
                }
            }
        }
        drop(net);
        for &x in &late {
            let (a, p) = {
                let net = self.net.borrow();
                (net.xfers.list[x].agent, net.xfers.list[x].peer)
            };
            if let Some(c) = self.conns[a][p].as_ref() {
                let dump = format!("{:#?}", c.core);
                self.log(|| format!("agent {a}'s core for peer {p}: {dump}"));
            }
        }
        let mut net = self.net.borrow_mut();
        for x in late {
            self.flagged[x] = true;
            net.violation(format!(
                "transfer {x} has no outcome {bound:?} after its deadline"
            ));
        }
    }

    fn final_checks(&mut self) -> Result<(), String> {
        let net = self.net.borrow();
        for (x, t) in net.xfers.list.iter().enumerate() {
            if t.state == XState::Live && net.alive[t.agent] {
                return Err(match t.kind {
                    Kind::App => format!("transfer {x} never reached an outcome"),
                    Kind::Child { parent } => {
                        format!("child {x} of staged transfer {parent} never reached an outcome")
                    }
                });
            }
        }
        let current = self
            .conns
            .iter()
            .enumerate()
            .flat_map(|(a, row)| row.iter().enumerate().map(move |(p, c)| (a, p, c)))
            .filter_map(|(a, p, c)| c.as_ref().map(|c| (a, p, c)));
        let replaced = self.retired.iter().map(|(a, p, c)| (*a, *p, c));
        for (a, p, c) in current.chain(replaced) {
            {
                {
                    if !c.jobs.is_empty() {
                        return Err(format!(
                            "agent {a}'s connection to {p} still has {} staged jobs",
                            c.jobs.len()
                        ));
                    }
                    if c.core.transfers() > 0 {
                        return Err(format!(
                            "agent {a}'s connection to {p} still holds {} transfers",
                            c.core.transfers()
                        ));
                    }
                }
            }
        }
        drop(net);
        self.tables_converged()?;
        let net = self.net.borrow();
        self.report.dmas = net.dmas;
        self.report.copy_failures = net.copy_failures;
        if net.overposts > 0 {
            return Err(format!(
                "the core posted beyond a send queue's depth {} times",
                net.overposts
            ));
        }
        Ok(())
    }
}

fn failure_kind(f: &Failure) -> &'static str {
    match f {
        Failure::Timeout { .. } => "timeout",
        Failure::Cancelled => "cancelled",
        Failure::PeerLost { .. } => "peer lost",
        Failure::SliceFailed { .. } => "request error",
        Failure::NoRail { .. } => "no rail",
        Failure::Rejected { .. } => "rejected",
        Failure::AgentClosed => "agent closed",
        Failure::StagingFailed { .. } => "staging",
    }
}

/// A stager's settings drawn from the seed: a few bounce buffers of a few grains, one to three
/// tickets at once, and ranges cut in equal chunks, ramped from a shorter first piece, or (a
/// third of the seeds) for least time against a NIC of known rate, as gdr-xfer's agents cut them.
fn stager_config(rng: &mut Rng) -> PipelineConfig {
    let chunk_size = GRAIN * rng.range(1, 9) as usize;
    PipelineConfig {
        chunk_size,
        chunks: rng.range(1, 5) as usize,
        max_tickets: rng.range(1, 4) as usize,
        min_piece: 1,
        first_piece: if rng.percent(50) {
            chunk_size
        } else {
            rng.range(1, chunk_size as u64 + 1) as usize
        },
        nic_rate: if rng.percent(33) { 25_000_000_000 } else { 0 },
    }
}

/// Which copy of a stager fails, if one does: in a quarter of the seeds whose stagers have two
/// bounce buffers or more (a failed copy breaks its buffer for good, and the stager goes on
/// with the others), one of its first 30 copies.
fn failing_copy(rng: &mut Rng, stager: &PipelineConfig) -> Option<u64> {
    (stager.chunks >= 2 && rng.percent(25)).then(|| rng.range(1, 31))
}
