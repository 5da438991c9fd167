//! Staged transfers in the simulation: each agent's GPU memory (a segment of its memory the
//! NIC is never given), a stager lending bounce buffers (another segment) with copies that take
//! time, and the core's [`StagedJob`] driven as gdr-xfer's staging driver drives it. Every copy
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
use crate::fault::TextError;
use crate::io::Op;
use crate::run::Run;
use crate::staged::{StageIo, StagedJob, Start};
use crate::transfer::{Failure, Spec, TransferKey};

/// The segment of an agent's memory that is its GPU memory.
pub(crate) const GPU_SEG: usize = SEGS;
/// The segment of an agent's memory that holds its bounce buffers.
pub(crate) const BOUNCE_SEG: usize = SEGS + 1;
/// Handles of child transfers carry this bit (the rest is the child's transfer number).
pub(crate) const CHILD: usize = 1 << 40;
/// A copy's time: (min, max) microseconds.
pub(crate) const COPY: (u64, u64) = (5, 300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    /// A GPU -> bounce copy of (ticket, offset in its run, len) is in flight.
    Copying(u64, usize, usize),
    Lent(u64),
    /// A bounce -> GPU copy is in flight.
    Committing(u64, usize, usize),
}

#[derive(Debug)]
struct Ticket {
    id: u64,
    parent: usize,
    op: Op,
    dev_start: usize,
    len: usize,
    next: usize,
    out: usize,
    cancelled: bool,
}

/// A bounce buffer lent to a job.
#[derive(Debug)]
pub(crate) struct SimChunk {
    slot: usize,
    ticket: u64,
    offset: usize,
    len: usize,
}

impl SimChunk {
    /// Its ticket.
    pub(crate) fn ticket_id(&self) -> u64 {
        self.ticket
    }
}

/// What the stager has for its jobs at their next step.
pub(crate) enum StageEvent {
    Chunk(SimChunk),
    Finished(u64),
}

/// One agent's stager: its bounce buffers and the tickets moving through them.
pub(crate) struct SimStager {
    pub(crate) chunk: usize,
    slots: Vec<Slot>,
    tickets: Vec<Ticket>,
    max_tickets: usize,
    next_id: u64,
    pub(crate) events: VecDeque<StageEvent>,
}

impl SimStager {
    pub(crate) fn new(chunk: usize, slots: usize, max_tickets: usize) -> SimStager {
        SimStager {
            chunk,
            slots: vec![Slot::Free; slots],
            tickets: Vec::new(),
            max_tickets,
            next_id: 1,
            events: VecDeque::new(),
        }
    }

    fn slot_at(&self, agent_base: usize, slot: usize) -> usize {
        agent_base + slot * self.chunk
    }

    /// Where bounce slot `slot` is in the agent's memory.
    pub(crate) fn slot_addr(&self, slot: usize) -> usize {
        self.slot_at(BOUNCE_SEG * SEG, slot)
    }

    fn start(
        &mut self,
        parent: usize,
        op: Op,
        dev_start: usize,
        len: usize,
    ) -> Result<u64, Start<TextError>> {
        if self.tickets.len() >= self.max_tickets {
            return Err(Start::Busy);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.tickets.push(Ticket {
            id,
            parent,
            op,
            dev_start,
            len,
            next: 0,
            out: 0,
            cancelled: false,
        });
        Ok(id)
    }

    /// Issues what the tickets can: a copy into a free buffer (WRITE), or a free buffer lent
    /// to fill (READ).
    pub(crate) fn pump(&mut self, net: &mut Net, agent: usize) {
        for ti in 0..self.tickets.len() {
            loop {
                let t = &self.tickets[ti];
                if t.cancelled || t.next >= t.len {
                    break;
                }
                let Some(slot) = self.slots.iter().position(|s| *s == Slot::Free) else {
                    return;
                };
                let (id, offset) = (t.id, t.next);
                let len = (t.len - t.next).min(self.chunk);
                let op = t.op;
                let t = &mut self.tickets[ti];
                t.next += len;
                t.out += 1;
                let at = self.slot_addr(slot);
                check_buffer_free(net, agent, at, len);
                match op {
                    Op::Write => {
                        self.slots[slot] = Slot::Copying(id, offset, len);
                        let d = Duration::from_micros(net.rng.range(COPY.0, COPY.1));
                        net.at(d, Ev::CopyDone { agent, slot });
                    }
                    Op::Read => {
                        self.slots[slot] = Slot::Lent(id);
                        self.events.push_back(StageEvent::Chunk(SimChunk {
                            slot,
                            ticket: id,
                            offset,
                            len,
                        }));
                    }
                }
            }
        }
    }

    /// A GPU -> bounce copy completed: the bytes are copied now, and the buffer lent.
    pub(crate) fn copy_done(&mut self, net: &mut Net, agent: usize, slot: usize) {
        let Some(Slot::Copying(id, offset, len)) = self.slots.get(slot).copied() else {
            return;
        };
        let Some(t) = self.tickets.iter().find(|t| t.id == id) else {
            return;
        };
        let (src, dst) = (t.dev_start + offset, self.slot_addr(slot));
        touch_gpu(net, t.parent, agent, src, len, "read");
        net.mem[agent].copy_within(src..src + len, dst);
        self.slots[slot] = Slot::Lent(id);
        self.events.push_back(StageEvent::Chunk(SimChunk {
            slot,
            ticket: id,
            offset,
            len,
        }));
    }

    /// A bounce -> GPU copy completed.
    pub(crate) fn commit_done(&mut self, net: &mut Net, agent: usize, slot: usize) {
        let Some(Slot::Committing(id, offset, len)) = self.slots.get(slot).copied() else {
            return;
        };
        if let Some(t) = self.tickets.iter_mut().find(|t| t.id == id) {
            let (src, dst) = (self.chunk * slot + BOUNCE_SEG * SEG, t.dev_start + offset);
            touch_gpu(net, t.parent, agent, dst, len, "wrote");
            net.mem[agent].copy_within(src..src + len, dst);
            t.out -= 1;
        }
        self.slots[slot] = Slot::Free;
        self.finish_tickets();
    }

    fn give_back(
        &mut self,
        net: &mut Net,
        agent: usize,
        c: SimChunk,
        commit: bool,
    ) -> Result<(), TextError> {
        if self.slots.get(c.slot) != Some(&Slot::Lent(c.ticket)) {
            return Err(TextError(format!(
                "bounce buffer {} given back twice or by the wrong ticket",
                c.slot
            )));
        }
        check_buffer_free(net, agent, self.slot_addr(c.slot), c.len);
        if commit {
            self.slots[c.slot] = Slot::Committing(c.ticket, c.offset, c.len);
            let d = Duration::from_micros(net.rng.range(COPY.0, COPY.1));
            net.at(
                d,
                Ev::CommitDone {
                    agent,
                    slot: c.slot,
                },
            );
        } else {
            self.slots[c.slot] = Slot::Free;
            if let Some(t) = self.tickets.iter_mut().find(|t| t.id == c.ticket) {
                t.out -= 1;
            }
            self.finish_tickets();
        }
        Ok(())
    }

    /// A chunk no job owns (cannot happen): given back.
    pub(crate) fn release_orphan(
        &mut self,
        net: &mut Net,
        agent: usize,
        c: SimChunk,
    ) -> Result<(), TextError> {
        self.give_back(net, agent, c, false)
    }

    fn cancel(&mut self, id: u64) {
        if let Some(t) = self.tickets.iter_mut().find(|t| t.id == id) {
            t.cancelled = true;
        }
        self.finish_tickets();
    }

    /// Reports the tickets that are over: nothing issued any more, nothing out.
    fn finish_tickets(&mut self) {
        let mut i = 0;
        while i < self.tickets.len() {
            let t = &self.tickets[i];
            if (t.cancelled || t.next >= t.len) && t.out == 0 {
                let id = t.id;
                // Order kept: tickets are served first started, first served.
                self.tickets.remove(i);
                self.events.push_back(StageEvent::Finished(id));
            } else {
                i += 1;
            }
        }
    }

    /// The tickets and slots, for traces.
    pub(crate) fn describe(&self) -> String {
        format!("tickets {:?} slots {:?}", self.tickets, self.slots)
    }

    /// Whether the agent has any ticket.
    pub(crate) fn busy(&self) -> bool {
        !self.tickets.is_empty()
            || self.slots.iter().any(|s| *s != Slot::Free)
            || !self.events.is_empty()
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
    pub(crate) core: StagedJob<SimChunk, TransferKey>,
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
    type Chunk = SimChunk;
    type Child = TransferKey;
    type Error = TextError;

    fn ticket_of(&self, c: &SimChunk) -> u64 {
        c.ticket
    }
    fn place(&self, c: &SimChunk, _run: usize) -> (u64, u64) {
        (c.offset as u64, c.len as u64)
    }
    fn len_of(&self, c: &SimChunk) -> u64 {
        c.len as u64
    }
    fn start(&mut self, run: usize) -> Result<u64, Start<TextError>> {
        let r = self.runs[run];
        let id = self.stager.start(self.xfer, self.op, r.local, r.len)?;
        let mut net = self.net.borrow_mut();
        self.stager.pump(&mut net, self.agent);
        Ok(id)
    }
    fn cancel_ticket(&mut self, ticket: u64) {
        self.stager.cancel(ticket);
    }
    fn post(
        &mut self,
        chunk: Option<&SimChunk>,
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
                    let at = self.stager.slot_addr(c.slot);
                    net.xfers.reserve(self.agent, at, c.len, cx);
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
    fn is_quiet(&self, c: &SimChunk) -> bool {
        quiet(
            &self.net.borrow(),
            self.agent,
            self.stager.slot_addr(c.slot),
            c.len,
        )
    }
    fn give_back(&mut self, c: SimChunk, commit: bool) -> Result<(), TextError> {
        let mut net = self.net.borrow_mut();
        let r = self.stager.give_back(&mut net, self.agent, c, commit);
        self.stager.pump(&mut net, self.agent);
        r
    }
}
