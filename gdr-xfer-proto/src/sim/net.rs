//! The simulated network: RC queue pairs that execute their requests one at a time and in
//! order, packets that take time on the wire, responders that check remote keys and need
//! posted receives, memory that is really read and written, and the faults the world injects.
//!
//! Every DMA is checked against the engine's promises as it happens ([`Net::touch`]).

use std::collections::VecDeque;
use std::time::Duration;

use super::rng::Rng;
use super::world::Ev;
use super::xfers::Xfers;
use crate::io::{LaneRef, SendCompletion, Status};

/// Bytes of one segment of an agent's memory.
pub(crate) const SEG: usize = 16 * 1024;
/// Segments per agent that peers may address (its GPU memory and its bounce buffers follow
/// them: [`super::staging::GPU_SEG`], [`super::staging::BOUNCE_SEG`]).
pub(crate) const SEGS: usize = 4;
/// Bytes of an agent's memory: its segments, its GPU memory, its bounce buffers.
pub(crate) const MEM: usize = SEG * (SEGS + 2);
/// Time a packet is on the wire (one way), at most.
pub(crate) const WIRE: (u64, u64) = (5, 200);
/// How long a requester retries before its request fails (longer than any packet lives).
pub(crate) const RETRY: Duration = Duration::from_millis(4);
/// Transmissions of a request before it fails, [`RETRY`] apart in all.
pub(crate) const TRIES: u32 = 4;
/// How long a SEND waits between tries when the responder has no receive posted.
pub(crate) const RNR: Duration = Duration::from_micros(300);
/// From a completion to the driver's poll that hands it to the core.
pub(crate) const POLL: (u64, u64) = (1, 40);

/// A queue pair's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QpState {
    Created,
    Ready,
    Error,
    Destroyed,
}

/// What a request does.
#[derive(Debug, Clone)]
pub(crate) enum WrKind {
    Write {
        local: usize,
        remote: u64,
        len: usize,
        rkey: u32,
    },
    Read {
        local: usize,
        remote: u64,
        len: usize,
        rkey: u32,
    },
    Send {
        bytes: Vec<u8>,
    },
}

/// A posted request.
#[derive(Debug, Clone)]
pub(crate) struct Wr {
    pub(crate) wr_id: u64,
    pub(crate) signaled: bool,
    pub(crate) kind: WrKind,
    /// The simulated transfer whose memory it uses (found from the memory's reservation when
    /// it was posted).
    pub(crate) xfer: Option<usize>,
}

/// A simulated queue pair.
#[derive(Debug)]
pub(crate) struct SimQp {
    pub(crate) agent: usize,
    pub(crate) peer: usize,
    pub(crate) rail: usize,
    pub(crate) lane: LaneRef,
    /// The incarnation of the connection it belongs to.
    pub(crate) inc: u32,
    pub(crate) remote: Option<usize>,
    pub(crate) state: QpState,
    pub(crate) sq: VecDeque<Wr>,
    /// The token of the head request's execution in progress.
    pub(crate) busy: Option<u64>,
    pub(crate) recv: VecDeque<u16>,
    /// The head request does not start before this (a slow peer or path).
    pub(crate) slow_until: Duration,
    /// Its next request fails (a lane fault).
    pub(crate) doomed: bool,
    /// Transmissions of the head request that got no answer.
    pub(crate) tries: u32,
}

/// What travels to the responder.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    Write { addr: u64, data: Vec<u8>, rkey: u32 },
    ReadReq { addr: u64, len: usize, rkey: u32 },
    Send { bytes: Vec<u8> },
}

/// The network and the agents' memory.
pub(crate) struct Net {
    pub(crate) now: Duration,
    pub(crate) qps: Vec<SimQp>,
    pub(crate) mem: Vec<Vec<u8>>,
    pub(crate) key_epoch: Vec<Vec<u32>>,
    pub(crate) alive: Vec<bool>,
    pub(crate) link_up: Vec<bool>,
    pub(crate) xfers: Xfers,
    pub(crate) violations: Vec<String>,
    /// Events to schedule (absolute times).
    pub(crate) out: Vec<(Duration, Ev)>,
    pub(crate) rng: Rng,
    next_token: u64,
    /// Percent of queue pair creations that fail.
    pub(crate) create_fail: u64,
    /// Posts the core made beyond a queue's depth (its room model was wrong).
    pub(crate) overposts: u64,
    pub(crate) dmas: u64,
    /// Stager copies that failed (injected).
    pub(crate) copy_failures: u64,
    /// Per agent, when its completion queue last handed a completion to the driver:
    /// completions are polled in the order they were queued.
    pub(crate) cq_at: Vec<Duration>,
    /// Lines for the world's trace (when it keeps one).
    pub(crate) trace: Option<Vec<String>>,
}

/// The remote key of segment `seg` of agent `agent` on rail `rail` at epoch `epoch`.
pub(crate) fn rkey(agent: usize, seg: usize, rail: usize, epoch: u32) -> u32 {
    1 + (agent as u32) * 1_000_000 + (seg as u32) * 10_000 + (rail as u32) * 1_000 + epoch % 1000
}

impl Net {
    pub(crate) fn new(agents: usize, rails: usize, rng: Rng) -> Net {
        Net {
            now: Duration::ZERO,
            qps: Vec::new(),
            mem: vec![vec![0u8; MEM]; agents],
            key_epoch: vec![vec![0; SEGS]; agents],
            alive: vec![true; agents],
            link_up: vec![true; rails],
            xfers: Xfers::new(agents),
            violations: Vec::new(),
            out: Vec::new(),
            rng,
            next_token: 1,
            create_fail: 0,
            overposts: 0,
            dmas: 0,
            copy_failures: 0,
            cq_at: vec![Duration::ZERO; agents],
            trace: None,
        }
    }

    pub(crate) fn at(&mut self, delay: Duration, ev: Ev) {
        self.out.push((self.now + delay, ev));
    }

    fn us(&mut self, (lo, hi): (u64, u64)) -> Duration {
        Duration::from_micros(self.rng.range(lo, hi))
    }

    /// Queues a completion of `agent`'s: polled after the ones queued before it.
    fn queue_completion(&mut self, agent: usize, ev: Ev) {
        let d = self.us(POLL);
        let at = (self.now + d).max(self.cq_at[agent] + Duration::from_nanos(1));
        self.cq_at[agent] = at;
        self.out.push((at, ev));
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(t) = &mut self.trace {
            t.push(line());
        }
    }

    pub(crate) fn violation(&mut self, what: String) {
        self.violations.push(format!("at {:?}: {what}", self.now));
    }

    /// Starts the head request of `qp` if it is idle.
    pub(crate) fn kick(&mut self, qp: usize) {
        let q = &mut self.qps[qp];
        if q.busy.is_some() || q.sq.is_empty() || q.state != QpState::Ready {
            return;
        }
        let token = self.next_token;
        self.next_token += 1;
        q.busy = Some(token);
        let d = self.us((1, 20));
        self.at(d, Ev::Exec { qp, token });
    }

    /// A DMA by request `xfer` of `len` bytes at `at` of `agent`'s memory: the transfer must
    /// not have reached its outcome.
    fn touch(&mut self, xfer: Option<usize>, agent: usize, at: usize, len: usize, what: &str) {
        self.dmas += 1;
        if let Some(x) = xfer {
            if self.xfers.is_terminal(x) {
                self.violation(format!(
                    "transfer {x} reported its outcome, then a request of it {what} {len} bytes at {at} of agent {agent}'s memory"
                ));
            }
        }
    }

    /// Whether `rkey` allows `len` bytes at `addr` of `agent`'s memory on `rail`.
    fn key_allows(&self, agent: usize, rail: usize, rkey: u32, addr: u64, len: usize) -> bool {
        let seg = (addr as usize) / SEG;
        let end = (addr as usize).checked_add(len);
        seg < SEGS
            && end.is_some_and(|e| e <= (seg + 1) * SEG)
            && rkey == self::rkey(agent, seg, rail, self.key_epoch[agent][seg])
    }

    /// The head request of `qp` starts: its packet goes on the wire (or will never arrive).
    pub(crate) fn exec(&mut self, qp: usize, token: u64) {
        let q = &self.qps[qp];
        if q.busy != Some(token) || q.state != QpState::Ready {
            return;
        }
        if self.now < q.slow_until {
            let at = q.slow_until;
            self.out.push((at, Ev::Exec { qp, token }));
            return;
        }
        let Some(wr) = q.sq.front().cloned() else {
            self.qps[qp].busy = None;
            return;
        };
        let doomed = q.doomed;
        let path = self.path_ok(qp);
        if doomed {
            self.qps[qp].doomed = false;
        }
        if doomed && self.rng.percent(50) {
            self.note(|| format!("qp {qp}: wr {} is doomed", wr.wr_id));
            self.at(
                RETRY,
                Ev::Fail {
                    qp,
                    token,
                    status: Status::LaneError,
                },
            );
            return;
        }
        if !path {
            self.note(|| format!("qp {qp}: wr {} cannot reach its responder", wr.wr_id));
            self.retransmit(qp, token);
            return;
        }
        let agent = self.qps[qp].agent;
        let payload = match wr.kind {
            WrKind::Write {
                local,
                remote,
                len,
                rkey,
            } => {
                self.touch(wr.xfer, agent, local, len, "read");
                Payload::Write {
                    addr: remote,
                    data: self.mem[agent][local..local + len].to_vec(),
                    rkey,
                }
            }
            WrKind::Read {
                remote, len, rkey, ..
            } => Payload::ReadReq {
                addr: remote,
                len,
                rkey,
            },
            WrKind::Send { ref bytes } => Payload::Send {
                bytes: bytes.clone(),
            },
        };
        let d = self.us(WIRE);
        self.at(
            d,
            Ev::Arrive {
                qp,
                token,
                payload,
                lose_ack: doomed,
                xfer: wr.xfer,
            },
        );
    }

    /// The head request of `qp` got no answer: it is sent again a little later, or fails once
    /// it was sent [`TRIES`] times.
    fn retransmit(&mut self, qp: usize, token: u64) {
        let q = &mut self.qps[qp];
        if q.busy != Some(token) || q.state != QpState::Ready {
            return;
        }
        q.tries += 1;
        if q.tries >= TRIES {
            self.at(
                Duration::ZERO,
                Ev::Fail {
                    qp,
                    token,
                    status: Status::LaneError,
                },
            );
        } else {
            self.at(RETRY / TRIES, Ev::Exec { qp, token });
        }
    }

    /// Whether `qp`'s packets reach a responder that takes them.
    fn path_ok(&self, qp: usize) -> bool {
        let q = &self.qps[qp];
        let Some(r) = q.remote.and_then(|r| self.qps.get(r)) else {
            return false;
        };
        self.link_up[q.rail]
            && self.alive[q.peer]
            && self.alive[q.agent]
            && r.state == QpState::Ready
            && r.remote == Some(qp)
    }

    /// A packet of `qp`'s head request reaches the responder.
    pub(crate) fn arrive(
        &mut self,
        qp: usize,
        token: u64,
        payload: Payload,
        lose_ack: bool,
        xfer: Option<usize>,
    ) {
        if !self.path_ok(qp) {
            let r = self.qps[qp]
                .remote
                .map(|r| (r, self.qps[r].state, self.qps[r].remote));
            self.note(|| format!("qp {qp}: a packet was lost (responder {r:?})"));
            self.retransmit(qp, token);
            return;
        }
        let r = self.qps[qp].remote.expect("path_ok");
        let (ragent, rrail) = (self.qps[r].agent, self.qps[r].rail);
        let wire = self.us(WIRE);
        let ack = match payload {
            Payload::Write { addr, data, rkey } => {
                if !self.key_allows(ragent, rrail, rkey, addr, data.len()) {
                    self.at(
                        wire,
                        Ev::Fail {
                            qp,
                            token,
                            status: Status::RequestError,
                        },
                    );
                    return;
                }
                self.touch(xfer, ragent, addr as usize, data.len(), "wrote");
                let a = addr as usize;
                self.mem[ragent][a..a + data.len()].copy_from_slice(&data);
                None
            }
            Payload::ReadReq { addr, len, rkey } => {
                if !self.key_allows(ragent, rrail, rkey, addr, len) {
                    self.at(
                        wire,
                        Ev::Fail {
                            qp,
                            token,
                            status: Status::RequestError,
                        },
                    );
                    return;
                }
                let a = addr as usize;
                Some(self.mem[ragent][a..a + len].to_vec())
            }
            Payload::Send { bytes } => {
                let Some(slot) = self.qps[r].recv.pop_front() else {
                    // No receive posted: the sender tries again (RNR, retried for ever).
                    self.at(
                        RNR,
                        Ev::Arrive {
                            qp,
                            token,
                            payload: Payload::Send { bytes },
                            lose_ack,
                            xfer,
                        },
                    );
                    return;
                };
                if let Some(x) = xfer {
                    let sender = self.qps[qp].agent;
                    let problem = self.xfers.notification_arrived(x, sender, &self.mem);
                    if let Some(p) = problem {
                        self.violation(p);
                    }
                }
                let (peer, lane) = (self.qps[r].peer, self.qps[r].lane);
                self.queue_completion(
                    ragent,
                    Ev::Recv {
                        agent: ragent,
                        peer,
                        qp: r,
                        lane,
                        slot,
                        msg: Some(bytes),
                    },
                );
                None
            }
        };
        if lose_ack {
            self.at(
                RETRY,
                Ev::Fail {
                    qp,
                    token,
                    status: Status::LaneError,
                },
            );
            return;
        }
        self.at(
            wire,
            Ev::Ack {
                qp,
                token,
                data: ack,
            },
        );
    }

    /// The requester of `qp` learns its head request completed (`data`: a READ's bytes).
    pub(crate) fn ack(&mut self, qp: usize, token: u64, data: Option<Vec<u8>>) {
        let q = &self.qps[qp];
        if q.busy != Some(token) || q.state != QpState::Ready {
            return;
        }
        let agent = q.agent;
        let Some(wr) = self.qps[qp].sq.pop_front() else {
            return;
        };
        if let (WrKind::Read { local, len, .. }, Some(bytes)) = (&wr.kind, data) {
            self.touch(wr.xfer, agent, *local, *len, "wrote");
            self.mem[agent][*local..*local + *len].copy_from_slice(&bytes);
        }
        if wr.signaled {
            self.complete(qp, wr.wr_id, Status::Success);
        }
        self.qps[qp].busy = None;
        self.qps[qp].tries = 0;
        self.kick(qp);
    }

    /// The head request of `qp` failed with `status`: the queue pair is in error, every
    /// request on it completes (the rest flushed), and so does every receive.
    pub(crate) fn fail(&mut self, qp: usize, token: u64, status: Status) {
        let q = &self.qps[qp];
        if q.busy != Some(token) || q.state != QpState::Ready {
            return;
        }
        self.error(qp, status);
    }

    /// Puts `qp` in the error state: every request completes with an error (the first with
    /// `status`), every receive is flushed.
    pub(crate) fn error(&mut self, qp: usize, status: Status) {
        self.note(|| format!("qp {qp}: error {status:?}"));
        let q = &mut self.qps[qp];
        q.state = QpState::Error;
        q.busy = None;
        q.tries = 0;
        let wrs: Vec<Wr> = q.sq.drain(..).collect();
        let slots: Vec<u16> = q.recv.drain(..).collect();
        let (agent, peer, lane) = (q.agent, q.peer, q.lane);
        for (i, wr) in wrs.iter().enumerate() {
            let s = if i == 0 { status } else { Status::LaneError };
            self.complete(qp, wr.wr_id, s);
        }
        for slot in slots {
            self.queue_completion(
                agent,
                Ev::Recv {
                    agent,
                    peer,
                    qp,
                    lane,
                    slot,
                    msg: None,
                },
            );
        }
    }

    /// A completion of `qp` for the driver to poll.
    fn complete(&mut self, qp: usize, wr_id: u64, status: Status) {
        let q = &self.qps[qp];
        let c = SendCompletion {
            lane: q.lane,
            wr_id,
            status,
            raw_status: match status {
                Status::Success => 0,
                Status::RequestError => 10,
                Status::LaneError => 12,
            },
            vendor_err: 0,
            qp_num: qp as u32,
        };
        let (agent, peer) = (q.agent, q.peer);
        self.queue_completion(agent, Ev::Cqe { agent, peer, c });
    }
}
