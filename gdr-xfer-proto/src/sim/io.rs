//! The simulated driver: the core's [`Io`] on simulated queue pairs.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use super::net::{Net, QpState, SimQp, Wr, WrKind, SEG};
use crate::fault::TextError;
use crate::io::{Header, Io, LaneRef, Op, Pieces, PostResult, Status};

/// A local segment in the simulation: segment `seg` of agent `agent`'s memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimLocal {
    /// The agent whose memory (and protection domain) it is.
    pub agent: usize,
    /// The segment.
    pub seg: usize,
}

/// The requests of one batch: (local offset, remote address, len, rkey, wr_id).
#[derive(Default)]
pub struct SimPieces(Vec<(u64, u64, u64, u32, u64)>);

impl Pieces for SimPieces {
    fn clear(&mut self) {
        self.0.clear();
    }
    fn push(
        &mut self,
        local_offset: u64,
        remote_addr: u64,
        len: u64,
        rkey: u32,
        wr_id: u64,
    ) -> bool {
        if remote_addr.checked_add(len).is_none() {
            return false;
        }
        self.0.push((local_offset, remote_addr, len, rkey, wr_id));
        true
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// What the core produced during one call, for the world to act on.
#[derive(Default)]
pub(crate) struct Out {
    /// Queue pairs made (rail, number, lane), for the agent's endpoint to route.
    pub(crate) routed: Vec<(usize, u32, LaneRef)>,
    /// Queue pairs destroyed (rail, number, lane), for the endpoint to unroute.
    pub(crate) unrouted: Vec<(usize, u32, LaneRef)>,
}

/// One agent's driver of its connection to one peer.
pub struct SimIo {
    net: Rc<RefCell<Net>>,
    agent: usize,
    peer: usize,
    /// The incarnation of the connection.
    inc: u32,
    qps: Vec<(LaneRef, usize)>,
    pieces: SimPieces,
    /// Largest message a send slot holds (header included).
    send_max: usize,
    depth: usize,
    pub(crate) out: Out,
}

impl SimIo {
    /// Carries out [`crate::Action::DestroyLanes`]: the queue pairs of `lanes` are gone (their
    /// requests will not execute), and unrouted.
    pub(crate) fn destroy_lanes(&mut self, lanes: &[LaneRef]) {
        let mut net = self.net.borrow_mut();
        for l in lanes {
            if let Some(i) = self.qps.iter().position(|(x, _)| x == l) {
                let (_, qp) = self.qps.swap_remove(i);
                let q = &mut net.qps[qp];
                self.out.unrouted.push((q.rail, qp as u32, *l));
                q.state = QpState::Destroyed;
                q.sq.clear();
                q.recv.clear();
                q.busy = None;
            }
        }
    }

    pub(crate) fn new(
        net: Rc<RefCell<Net>>,
        (agent, peer, inc): (usize, usize, u32),
        send_max: usize,
        depth: usize,
    ) -> SimIo {
        SimIo {
            net,
            agent,
            peer,
            inc,
            qps: Vec::new(),
            pieces: SimPieces::default(),
            send_max,
            depth,
            out: Out::default(),
        }
    }

    fn qp(&self, lane: LaneRef) -> Option<usize> {
        self.qps.iter().find(|(l, _)| *l == lane).map(|&(_, q)| q)
    }

    /// Makes a queue pair for `lane` on `rail` (connected later).
    pub(crate) fn add_qp(&mut self, rail: usize, lane: LaneRef) -> usize {
        let mut net = self.net.borrow_mut();
        let id = net.qps.len();
        net.qps.push(SimQp {
            agent: self.agent,
            peer: self.peer,
            rail,
            lane,
            inc: self.inc,
            remote: None,
            state: QpState::Created,
            sq: VecDeque::new(),
            busy: None,
            recv: VecDeque::new(),
            slow_until: Default::default(),
            doomed: false,
            tries: 0,
        });
        self.qps.push((lane, id));
        id
    }

    /// Connects our queue pair `ours` to the peer's `theirs`.
    pub(crate) fn connect(&self, ours: usize, theirs: usize) {
        let mut net = self.net.borrow_mut();
        let q = &mut net.qps[ours];
        if q.state == QpState::Created {
            q.remote = Some(theirs);
            q.state = QpState::Ready;
        }
    }

    /// Queues requests on `qp` (flushed at once when it is in error).
    fn push(&mut self, qp: usize, wrs: Vec<Wr>) -> PostResult<TextError> {
        let mut net = self.net.borrow_mut();
        let q = &mut net.qps[qp];
        if q.state == QpState::Created || q.state == QpState::Destroyed {
            return PostResult::Broken {
                posted: 0,
                error: TextError::from(format!("queue pair {qp} is not ready ({:?})", q.state)),
            };
        }
        if q.sq.len() + wrs.len() > self.depth {
            net.overposts += 1;
            return PostResult::Full;
        }
        let error = q.state == QpState::Error;
        q.sq.extend(wrs);
        if error {
            net.error(qp, Status::LaneError);
        } else {
            net.kick(qp);
        }
        PostResult::Posted
    }
}

impl Io for SimIo {
    type Local = SimLocal;
    type Handle = usize;
    type Endpoints = Vec<usize>;
    type Pieces = SimPieces;
    type Error = TextError;

    fn pieces(&mut self) -> &mut SimPieces {
        &mut self.pieces
    }

    fn post_rdma(&mut self, lane: LaneRef, op: Op, local: &SimLocal) -> PostResult<TextError> {
        let Some(qp) = self.qp(lane) else {
            return PostResult::Broken {
                posted: 0,
                error: TextError::from(format!("no queue pair for {lane:?}")),
            };
        };
        if local.agent != self.agent {
            return PostResult::Rejected(TextError::from(format!(
                "memory of agent {} is registered with another protection domain",
                local.agent
            )));
        }
        let mut wrs = Vec::with_capacity(self.pieces.0.len());
        let n = self.pieces.0.len();
        for (i, &(lo, remote, len, rkey, wr_id)) in self.pieces.0.iter().enumerate() {
            if lo.checked_add(len).is_none_or(|e| e > SEG as u64) || len == 0 {
                return PostResult::Rejected(TextError::from(format!(
                    "{len} bytes at {lo} of a {SEG}-byte segment"
                )));
            }
            let at = local.seg * SEG + lo as usize;
            let xfer = {
                let net = self.net.borrow();
                net.xfers.owner(self.agent, at)
            };
            if xfer.is_none() {
                self.net.borrow_mut().violation(format!(
                    "a request was posted on memory no live transfer reserved ({at} of agent {})",
                    self.agent
                ));
            }
            let len = len as usize;
            let kind = match op {
                Op::Write => WrKind::Write {
                    local: at,
                    remote,
                    len,
                    rkey,
                },
                Op::Read => WrKind::Read {
                    local: at,
                    remote,
                    len,
                    rkey,
                },
            };
            wrs.push(Wr {
                wr_id,
                signaled: i + 1 == n,
                kind,
                xfer,
            });
        }
        self.push(qp, wrs)
    }

    fn post_message(
        &mut self,
        lane: LaneRef,
        wr_id: u64,
        _slot: u16,
        header: Header,
        data: &[u8],
    ) -> PostResult<TextError> {
        let Some(qp) = self.qp(lane) else {
            return PostResult::Broken {
                posted: 0,
                error: TextError::from(format!("no queue pair for {lane:?}")),
            };
        };
        if Header::LEN + data.len() > self.send_max {
            return PostResult::Rejected(TextError::from(format!(
                "a message of {} bytes in a {}-byte send slot",
                data.len(),
                self.send_max
            )));
        }
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(data);
        let xfer = (header.flags & Header::PROBE == 0 && data.len() >= 8)
            .then(|| u64::from_be_bytes(data[..8].try_into().expect("8 bytes")) as usize);
        self.push(
            qp,
            vec![Wr {
                wr_id,
                signaled: true,
                kind: WrKind::Send { bytes },
                xfer,
            }],
        )
    }

    fn arm_recv(&mut self, lane: LaneRef, slot: u16) -> Result<(), TextError> {
        let qp = self
            .qp(lane)
            .ok_or_else(|| TextError(format!("no queue pair for {lane:?}")))?;
        let mut net = self.net.borrow_mut();
        match net.qps[qp].state {
            QpState::Destroyed => Err("destroyed".into()),
            QpState::Error => {
                net.qps[qp].recv.push_back(slot);
                net.error(qp, Status::LaneError);
                Ok(())
            }
            _ => {
                net.qps[qp].recv.push_back(slot);
                Ok(())
            }
        }
    }

    fn create_lanes(&mut self, rail: usize, lanes: &[LaneRef]) -> Result<Vec<usize>, TextError> {
        let fail = {
            let mut net = self.net.borrow_mut();
            let p = net.create_fail;
            net.rng.percent(p)
        };
        if fail {
            return Err("the simulated provider refused to create a queue pair".into());
        }
        let made: Vec<usize> = lanes.iter().map(|&l| self.add_qp(rail, l)).collect();
        for (&l, &qp) in lanes.iter().zip(&made) {
            self.out.routed.push((rail, qp as u32, l));
        }
        Ok(made)
    }

    fn connect_lanes(
        &mut self,
        _rail: usize,
        lanes: &[LaneRef],
        remote: &Vec<usize>,
    ) -> Result<(), TextError> {
        for (l, &theirs) in lanes.iter().zip(remote) {
            let ours = self
                .qp(*l)
                .ok_or_else(|| TextError(format!("no queue pair for {l:?}")))?;
            self.connect(ours, theirs);
        }
        Ok(())
    }

    fn endpoint_count(&self, endpoints: &Vec<usize>) -> usize {
        endpoints.len()
    }
}

/// The simulation's queue pair endpoints on the wire: the simulated queue pair's number. Every
/// control message between simulated agents crosses the real wire format
/// ([`crate::wire::Message`]): encoded by the sender, decoded by the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimCodec;

impl crate::wire::Codec for SimCodec {
    type Endpoint = usize;

    fn encode_endpoint(qp: &usize) -> Result<Vec<u8>, String> {
        Ok((*qp as u64).to_be_bytes().to_vec())
    }

    fn decode_endpoint(bytes: &[u8]) -> Result<usize, String> {
        let b: [u8; 8] = bytes
            .try_into()
            .map_err(|_| format!("{} bytes, not 8", bytes.len()))?;
        usize::try_from(u64::from_be_bytes(b)).map_err(|_| "queue pair number too large".into())
    }
}
