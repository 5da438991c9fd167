//! Staged transfers in the simulation: each agent's GPU memory (a segment of its memory the
//! NIC is never given), a stager lending bounce buffers (another segment) with copies that take
//! time, and the core's [`StagedJob`] driven as gdr-xfer's staging driver drives it. The
//! stager is the core's bounce-slot machine ([`Pipeline`]), the code gdr-xfer's stagers run,
//! over a copy engine whose copies complete at times drawn from the seed. Every copy
//! is checked as it happens: it must not touch a transfer's GPU memory after its outcome, nor a
//! bounce buffer a live child transfer may still use.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::io::{SimIo, SimLocal};
use super::net::{rkey, Net, QpState, WrKind, SEG, SEGS};
use super::world::Ev;
use crate::connection::Connection;
use crate::fault::{DriverError, TextError};
use crate::io::Op;
use crate::run::Run;
use crate::staged::{StageIo, StagedJob, Start};
use crate::staging::{
    Chunk, CopyEngine, Direction, Outcome, Pipeline, PipelineConfig, PipelineError, StagingEvent,
    Ticket,
};
use crate::transfer::{Failure, Spec, TransferKey};

/// The segment of an agent's memory that is its GPU memory.
pub(crate) const GPU_SEG: usize = SEGS;
/// The segment of an agent's memory that holds its bounce buffers.
pub(crate) const BOUNCE_SEG: usize = SEGS + 1;
/// Handles of child transfers carry this bit (the rest is the child's transfer number).
pub(crate) const CHILD: usize = 1 << 40;
/// A copy's time: (min, max) microseconds.
pub(crate) const COPY: (u64, u64) = (5, 300);

/// A staged run's GPU memory, as the stager's copy engine sees it: where it lies in the
/// agent's memory, and the staged transfer it belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SimDev {
    parent: usize,
    start: usize,
    len: usize,
}

/// One copy in flight (its number; copies complete in issue order).
#[derive(Debug)]
pub(crate) struct SimCopy(u64);

/// A copy the engine issued: which way, where, and for which staged transfer.
#[derive(Debug, Clone, Copy)]
struct Issued {
    id: u64,
    to_device: bool,
    dev: SimDev,
    dev_offset: usize,
    bounce_offset: usize,
    len: usize,
}

/// The simulation's copy engine: it only records the copies the core's pipeline issues. The
/// stager gives each a time (in issue order, as one CUDA stream would complete them) and moves
/// the bytes when that time comes.
#[derive(Debug, Default)]
pub(crate) struct SimCopies {
    /// This stager's incarnation, in the top bits of every copy's number (an agent that
    /// restarts gets a new stager; copies of the old one are ignored when their time comes).
    base: u64,
    next: u64,
    /// Copies issued and not yet complete, oldest first; the first `timed` have a time.
    issued: VecDeque<Issued>,
    timed: usize,
    /// Every copy numbered below this is complete.
    complete_below: u64,
    /// The copy that fails, if one does (injected).
    fail: Option<u64>,
}

impl SimCopies {
    fn issue(
        &mut self,
        to_device: bool,
        dev: &SimDev,
        dev_offset: usize,
        bounce_offset: usize,
        len: usize,
    ) -> SimCopy {
        let id = self.base | self.next;
        self.next += 1;
        self.issued.push_back(Issued {
            id,
            to_device,
            dev: *dev,
            dev_offset,
            bounce_offset,
            len,
        });
        SimCopy(id)
    }
}

impl CopyEngine for SimCopies {
    type Device = SimDev;
    type Copy = SimCopy;
    type Error = TextError;

    fn device_len(dev: &SimDev) -> usize {
        dev.len
    }
    fn to_bounce(
        &mut self,
        dev: &SimDev,
        dev_offset: usize,
        bounce_offset: usize,
        len: usize,
    ) -> Result<SimCopy, TextError> {
        Ok(self.issue(false, dev, dev_offset, bounce_offset, len))
    }
    fn to_device(
        &mut self,
        bounce_offset: usize,
        dev: &SimDev,
        dev_offset: usize,
        len: usize,
    ) -> Result<SimCopy, TextError> {
        Ok(self.issue(true, dev, dev_offset, bounce_offset, len))
    }
    fn is_complete(&mut self, copy: &mut SimCopy) -> Result<bool, TextError> {
        let complete = copy.0 < self.complete_below;
        if complete && self.fail == Some(copy.0) {
            return Err(TextError(format!("copy {} failed (injected)", copy.0)));
        }
        Ok(complete)
    }
    fn wait(&mut self, _copy: &mut SimCopy) -> Result<(), TextError> {
        Err(TextError(
            "the simulation's stager never waits for a copy".into(),
        ))
    }
}

/// What the stager has for its jobs at their next step.
pub(crate) enum StageEvent {
    Chunk(Chunk),
    Finished(u64, Result<(), DriverError>),
}

/// One agent's stager: the core's bounce-slot machine ([`Pipeline`], the code gdr-xfer's
/// stagers run) over the simulation's copy engine, and the events it reported.
pub(crate) struct SimStager {
    pipe: Pipeline<SimCopies>,
    /// When the last copy issued completes (copies complete in issue order).
    last_copy: Duration,
    pub(crate) events: VecDeque<StageEvent>,
}

impl SimStager {
    /// A stager of incarnation `incarnation` (see [`SimCopies`]) whose copy number `fail`
    /// (counted from 1) fails, if given.
    pub(crate) fn new(config: PipelineConfig, incarnation: u64, fail: Option<u64>) -> SimStager {
        let base = incarnation << 40;
        let engine = SimCopies {
            base,
            next: 1,
            complete_below: base,
            fail: fail.map(|n| base | n),
            ..SimCopies::default()
        };
        SimStager {
            pipe: Pipeline::new(engine, config).expect("the world draws valid stager settings"),
            last_copy: Duration::ZERO,
            events: VecDeque::new(),
        }
    }

    /// The faults heal: a copy not issued yet does not fail any more (one issued already still
    /// does, for a transfer submitted before the heal).
    pub(crate) fn no_more_failures(&mut self) {
        let engine = self.pipe.engine_mut();
        if engine.fail.is_some_and(|f| f >= engine.base | engine.next) {
            engine.fail = None;
        }
    }

    /// Where bounce bytes at `bounce_offset` are in the agent's memory.
    pub(crate) fn bounce_addr(bounce_offset: usize) -> usize {
        BOUNCE_SEG * SEG + bounce_offset
    }

    fn start(
        &mut self,
        parent: usize,
        dev_start: usize,
        op: Op,
        len: usize,
    ) -> Result<u64, Start<TextError>> {
        let direction = match op {
            Op::Write => Direction::DeviceToHost,
            Op::Read => Direction::HostToDevice,
        };
        let dev = SimDev {
            parent,
            start: dev_start,
            len,
        };
        match self.pipe.start(direction, dev, 0..len) {
            Ok(t) => Ok(t.id()),
            Err(PipelineError::TooManyTickets { .. }) => Err(Start::Busy),
            Err(e) => Err(Start::Failed(TextError(e.to_string()))),
        }
    }

    /// Runs the pipeline: copies that completed are reaped, free buffers get copies or are lent
    /// to fill, finished tickets are reported; then new copies are given their times.
    pub(crate) fn pump(&mut self, net: &mut Net, agent: usize) {
        let mut out = Vec::new();
        self.pipe.poll(&mut out);
        for ev in out {
            match ev {
                StagingEvent::Ready(c) => self.events.push_back(StageEvent::Chunk(c)),
                StagingEvent::Fill(c) => {
                    check_buffer_free(net, agent, Self::bounce_addr(c.bounce_offset()), c.len());
                    self.events.push_back(StageEvent::Chunk(c));
                }
                StagingEvent::Finished { ticket, outcome } => {
                    let r = match outcome {
                        Outcome::Failed(e) => Err(DriverError::new(e)),
                        _ => Ok(()),
                    };
                    self.events.push_back(StageEvent::Finished(ticket.id(), r));
                }
            }
        }
        self.time_copies(net, agent);
    }

    /// Gives each new copy its completion time, after every copy issued before it.
    fn time_copies(&mut self, net: &mut Net, agent: usize) {
        let engine = self.pipe.engine_mut();
        while engine.timed < engine.issued.len() {
            let c = engine.issued[engine.timed];
            engine.timed += 1;
            if !c.to_device {
                check_buffer_free(net, agent, Self::bounce_addr(c.bounce_offset), c.len);
            }
            let d = Duration::from_micros(net.rng.range(COPY.0, COPY.1));
            let at = (net.now + d).max(self.last_copy + Duration::from_nanos(1));
            self.last_copy = at;
            net.at(at - net.now, Ev::CopyDone { agent, copy: c.id });
        }
    }

    /// Copy `copy`'s time came: its bytes move now (checked against the transfer's outcome),
    /// and the pipeline learns it is complete at its next poll.
    pub(crate) fn copy_done(&mut self, net: &mut Net, agent: usize, copy: u64) {
        let engine = self.pipe.engine_mut();
        let Some(c) = engine.issued.front().copied() else {
            return; // a copy of an earlier incarnation
        };
        if c.id != copy {
            if copy & !((1 << 40) - 1) == engine.base {
                net.violation(format!(
                    "copy {copy} of agent {agent} completed before copy {} issued earlier",
                    c.id
                ));
            }
            return;
        }
        engine.issued.pop_front();
        engine.timed -= 1;
        engine.complete_below = c.id + 1;
        if engine.fail == Some(c.id) {
            // Nothing moves, the pipeline learns of the failure at its next poll, and the
            // staged transfer it belonged to may fail: it is no innocent one.
            net.copy_failures += 1;
            if let Some(x) = net.xfers.list.get_mut(c.dev.parent) {
                x.innocent = false;
            }
            self.pump(net, agent);
            return;
        }
        let (dev, bounce) = (
            c.dev.start + c.dev_offset,
            Self::bounce_addr(c.bounce_offset),
        );
        if c.to_device {
            touch_gpu(net, c.dev.parent, agent, dev, c.len, "wrote");
            net.mem[agent].copy_within(bounce..bounce + c.len, dev);
        } else {
            touch_gpu(net, c.dev.parent, agent, dev, c.len, "read");
            net.mem[agent].copy_within(dev..dev + c.len, bounce);
        }
        self.pump(net, agent);
    }

    fn give_back(
        &mut self,
        net: &mut Net,
        agent: usize,
        c: Chunk,
        commit: bool,
    ) -> Result<(), TextError> {
        check_buffer_free(net, agent, Self::bounce_addr(c.bounce_offset()), c.len());
        let r = if commit {
            self.pipe.commit(c)
        } else {
            self.pipe.release(c)
        };
        self.pump(net, agent);
        r.map_err(|e| TextError(e.to_string()))
    }

    /// A chunk no job owns (cannot happen): given back.
    pub(crate) fn release_orphan(
        &mut self,
        net: &mut Net,
        agent: usize,
        c: Chunk,
    ) -> Result<(), TextError> {
        self.give_back(net, agent, c, false)
    }

    fn cancel(&mut self, net: &mut Net, agent: usize, id: u64) {
        // An unknown ticket finished already.
        let _ = self.pipe.cancel(Ticket(id));
        self.pump(net, agent);
    }

    /// The tickets and buffers, for traces.
    pub(crate) fn describe(&self) -> String {
        format!(
            "tickets {} copies {} idle {}",
            self.pipe.active_tickets(),
            self.pipe.copies_in_flight(),
            self.pipe.is_idle()
        )
    }

    /// Whether the agent has any ticket.
    pub(crate) fn busy(&self) -> bool {
        !self.pipe.is_idle() || !self.events.is_empty()
    }
}

/// A copy of `len` bytes at `at` of `agent`'s GPU memory for staged transfer `parent`: it
/// must not have reported its outcome.
fn touch_gpu(net: &mut Net, parent: usize, agent: usize, at: usize, len: usize, what: &str) {
    if net.xfers.is_terminal(parent) {
        net.violation(format!(
            "staged transfer {parent} reported its outcome, then a copy {what} {len} bytes of its GPU memory at {at} of agent {agent}"
        ));
    }
}

/// A bounce buffer is filled or given back: no live child transfer may still own it, and no
/// request of any queue pair may still name it.
fn check_buffer_free(net: &mut Net, agent: usize, at: usize, len: usize) {
    if let Some(x) = net.xfers.owner(agent, at) {
        if !net.xfers.is_terminal(x) {
            net.violation(format!(
                "a bounce buffer at {at} of agent {agent} was reused while child transfer {x} still owns it"
            ));
        }
    }
    if !quiet(net, agent, at, len) {
        net.violation(format!(
            "a bounce buffer at {at} of agent {agent} was reused while a request still names it"
        ));
    }
}

/// Whether no request of `agent`'s queue pairs names `len` bytes at `at`.
fn quiet(net: &Net, agent: usize, at: usize, len: usize) -> bool {
    net.qps
        .iter()
        .filter(|q| q.agent == agent && q.state != QpState::Destroyed)
        .all(|q| {
            q.sq.iter().all(|w| match w.kind {
                WrKind::Write { local, len: l, .. } | WrKind::Read { local, len: l, .. } => {
                    local + l <= at || at + len <= local
                }
                WrKind::Send { .. } => true,
            })
        })
}

/// A staged run of the simulation: its place in the GPU (or host) memory and the peer's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SRun {
    pub(crate) staged: bool,
    /// Where its local bytes are in the agent's memory (GPU or host).
    pub(crate) local: usize,
    pub(crate) remote: usize,
    pub(crate) len: usize,
}

/// A staged transfer in the simulation.
pub(crate) struct SimJob {
    pub(crate) xfer: usize,
    pub(crate) op: Op,
    pub(crate) runs: Vec<SRun>,
    pub(crate) core: StagedJob<Chunk, TransferKey>,
    /// Its children: key and transfer number.
    pub(crate) children: Vec<(TransferKey, usize)>,
    /// The remote keys' epochs when it was submitted (per remote segment).
    pub(crate) epochs: Vec<u32>,
}

/// A job's I/O during one call.
pub(crate) struct SimStageIo<'a> {
    pub(crate) stager: &'a mut SimStager,
    pub(crate) core: &'a mut Connection<SimIo>,
    pub(crate) io: &'a mut SimIo,
    pub(crate) net: Rc<RefCell<Net>>,
    pub(crate) agent: usize,
    pub(crate) peer: usize,
    pub(crate) rails: usize,
    pub(crate) now: Instant,
    pub(crate) xfer: usize,
    pub(crate) op: Op,
    pub(crate) runs: &'a [SRun],
    pub(crate) children: &'a mut Vec<(TransferKey, usize)>,
    pub(crate) epochs: &'a [u32],
}

impl StageIo for SimStageIo<'_> {
    type Chunk = Chunk;
    type Child = TransferKey;
    type Error = TextError;

    fn ticket_of(&self, c: &Chunk) -> u64 {
        c.ticket().id()
    }
    fn place(&self, c: &Chunk, _run: usize) -> (u64, u64) {
        // The ticket's device memory is the run's: offsets are within the run.
        (c.device_offset() as u64, c.len() as u64)
    }
    fn len_of(&self, c: &Chunk) -> u64 {
        c.len() as u64
    }
    fn start(&mut self, run: usize) -> Result<u64, Start<TextError>> {
        let r = self.runs[run];
        let id = self.stager.start(self.xfer, r.local, self.op, r.len)?;
        let mut net = self.net.borrow_mut();
        self.stager.pump(&mut net, self.agent);
        Ok(id)
    }
    fn cancel_ticket(&mut self, ticket: u64) {
        let mut net = self.net.borrow_mut();
        self.stager.cancel(&mut net, self.agent, ticket);
    }
    fn post(
        &mut self,
        chunk: Option<&Chunk>,
        run: usize,
        offset: u64,
        len: u64,
        timeout: Duration,
        notify: Option<&[u8]>,
    ) -> Result<TransferKey, Failure> {
        let r = self.runs[run];
        let remote = r.remote + offset as usize;
        let seg = remote / SEG;
        let seg_index = seg.min(self.epochs.len().saturating_sub(1));
        let (local, local_offset, cx) = {
            let mut net = self.net.borrow_mut();
            let cx = net.xfers.add_child(self.xfer, self.agent, self.peer);
            match chunk {
                Some(c) => {
                    let at = SimStager::bounce_addr(c.bounce_offset());
                    net.xfers.reserve(self.agent, at, c.len(), cx);
                    (
                        SimLocal {
                            agent: self.agent,
                            seg: BOUNCE_SEG,
                        },
                        (at % SEG) as u64,
                        cx,
                    )
                }
                None => {
                    let at = r.local + offset as usize;
                    (
                        SimLocal {
                            agent: self.agent,
                            seg: at / SEG,
                        },
                        (at % SEG) as u64,
                        cx,
                    )
                }
            }
        };
        let epoch = self.epochs.get(seg_index).copied().unwrap_or(0);
        let spec = Spec {
            op: self.op,
            locals: vec![local],
            runs: vec![Run {
                local: 0,
                local_offset,
                remote_addr: remote as u64,
                remote: 0,
                len,
            }],
            rkeys: (0..self.rails)
                .map(|rail| rkey(self.peer, seg, rail, epoch))
                .collect(),
            timeout: Some(timeout),
            notify: notify.map(<[u8]>::to_vec),
            rail_mask: u32::MAX,
            handle: CHILD | cx,
        };
        match self.core.submit(self.now, self.io, spec) {
            Ok(key) => {
                self.children.push((key, cx));
                Ok(key)
            }
            Err(f) => {
                self.net.borrow_mut().xfers.child_refused(cx);
                Err(f)
            }
        }
    }
    fn cancel_child(&mut self, child: TransferKey) {
        self.core.cancel(self.now, self.io, child);
    }
    fn is_quiet(&self, c: &Chunk) -> bool {
        quiet(
            &self.net.borrow(),
            self.agent,
            SimStager::bounce_addr(c.bounce_offset()),
            c.len(),
        )
    }
    fn give_back(&mut self, c: Chunk, commit: bool) -> Result<(), TextError> {
        let mut net = self.net.borrow_mut();
        self.stager.give_back(&mut net, self.agent, c, commit)
    }
}
