//! The simulated applications' transfers: the memory each reserved, the bytes it must move,
//! and the checks of its outcome.

use std::time::Duration;

use super::net::{MEM, SEG};
use crate::io::Op;
use crate::transfer::{Failure, TransferKey};

/// Reservation granule of the simulated memory.
pub(crate) const GRAIN: usize = 64;

/// How a transfer misuses the API (it must fail, alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Misuse {
    /// A local segment of another agent (another protection domain).
    ForeignLocal,
    /// A notification longer than the peer takes.
    LongNotify,
}

/// One run: `len` bytes at `local` of the initiator's memory (or the foreign agent's) and at
/// `remote` of the peer's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct XRun {
    pub(crate) local_agent: usize,
    pub(crate) local: usize,
    pub(crate) remote: usize,
    pub(crate) len: usize,
}

/// Where a simulated transfer stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum XState {
    Live,
    Refused,
    Done,
    Failed(Failure),
}

/// An application's transfer, or a staged transfer's child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    App,
    Child { parent: usize },
}

#[derive(Debug)]
pub(crate) struct Xfer {
    pub(crate) kind: Kind,
    /// Whether its local memory is GPU memory staged through bounce buffers.
    pub(crate) staged: bool,
    pub(crate) agent: usize,
    pub(crate) peer: usize,
    pub(crate) op: Op,
    pub(crate) runs: Vec<XRun>,
    pub(crate) notify: bool,
    pub(crate) misuse: Option<Misuse>,
    pub(crate) deadline: Option<Duration>,
    /// Nothing about it may make it fail in a run without link faults: a generous deadline,
    /// no misuse, never cancelled, its remote keys never invalidated.
    pub(crate) innocent: bool,
    pub(crate) state: XState,
    pub(crate) key: Option<TransferKey>,
    pub(crate) arrivals: u32,
    pub(crate) deliveries: u32,
}

/// Every transfer of a run, and who reserved which memory.
#[derive(Default)]
pub(crate) struct Xfers {
    pub(crate) list: Vec<Xfer>,
    /// Per agent, per granule: the transfer that reserved it, plus one (0: free).
    owner: Vec<Vec<u32>>,
}

/// The byte transfer `x` puts at position `i` of its run `run`.
pub(crate) fn pattern(x: usize, run: usize, i: usize) -> u8 {
    let v = (x as u64)
        .wrapping_mul(0x9E37_79B9)
        .wrapping_add((run as u64) << 20)
        .wrapping_add(i as u64 * 131);
    (v ^ (v >> 11) ^ (v >> 23)) as u8
}

impl Xfers {
    pub(crate) fn new(agents: usize) -> Xfers {
        Xfers {
            list: Vec::new(),
            owner: vec![vec![0; MEM / GRAIN]; agents],
        }
    }

    pub(crate) fn is_terminal(&self, x: usize) -> bool {
        self.list
            .get(x)
            .is_some_and(|t| matches!(t.state, XState::Done | XState::Failed(_)))
    }

    /// The transfer that reserved byte `at` of `agent`'s memory.
    pub(crate) fn owner(&self, agent: usize, at: usize) -> Option<usize> {
        match self.owner.get(agent)?.get(at / GRAIN)? {
            0 => None,
            o => Some(*o as usize - 1),
        }
    }

    /// Whether `len` bytes at `at` of `agent`'s memory are free (and inside one segment).
    pub(crate) fn is_free(&self, agent: usize, at: usize, len: usize) -> bool {
        at / SEG == (at + len - 1) / SEG
            && at + len <= MEM
            && (at / GRAIN..(at + len).div_ceil(GRAIN)).all(|g| self.owner[agent][g] == 0)
    }

    pub(crate) fn reserve(&mut self, agent: usize, at: usize, len: usize, x: usize) {
        for g in at / GRAIN..(at + len).div_ceil(GRAIN) {
            self.owner[agent][g] = x as u32 + 1;
        }
    }

    /// Frees every granule `x` reserved.
    fn release(&mut self, x: usize) {
        for agent in &mut self.owner {
            for g in agent.iter_mut() {
                if *g == x as u32 + 1 {
                    *g = 0;
                }
            }
        }
    }

    /// Writes the bytes `x` moves into its source memory.
    pub(crate) fn fill_source(&self, x: usize, mem: &mut [Vec<u8>]) {
        let t = &self.list[x];
        for (r, run) in t.runs.iter().enumerate() {
            let (agent, at) = match t.op {
                Op::Write => (run.local_agent, run.local),
                Op::Read => (t.peer, run.remote),
            };
            for i in 0..run.len {
                mem[agent][at + i] = pattern(x, r, i);
            }
        }
    }

    /// Whether `x`'s bytes are all at its destination.
    pub(crate) fn landed(&self, x: usize, mem: &[Vec<u8>]) -> Result<(), String> {
        let t = &self.list[x];
        for (r, run) in t.runs.iter().enumerate() {
            let (agent, at) = match t.op {
                Op::Write => (t.peer, run.remote),
                Op::Read => (run.local_agent, run.local),
            };
            if let Some(i) = (0..run.len).find(|&i| mem[agent][at + i] != pattern(x, r, i)) {
                return Err(format!(
                    "run {r}: byte {i} of {} at {} of agent {agent}'s memory is {:#04x}, not {:#04x}",
                    run.len,
                    at + i,
                    mem[agent][at + i],
                    pattern(x, r, i)
                ));
            }
        }
        Ok(())
    }

    /// `x`'s notification reached its target's NIC: the first time, every byte of `x` must be
    /// there already, and `x` must not have reported its outcome. Returns the violation.
    pub(crate) fn notification_arrived(
        &mut self,
        x: usize,
        _sender: usize,
        mem: &[Vec<u8>],
    ) -> Option<String> {
        let t = self.list.get_mut(x)?;
        t.arrivals += 1;
        if t.arrivals > 1 {
            return None;
        }
        // A staged READ's bytes reach its GPU memory after its last child (the copies):
        // only its outcome says they are there.
        let staged_read = t.staged && t.op == Op::Read;
        if matches!(t.state, XState::Done | XState::Failed(_)) {
            return Some(format!(
                "transfer {x}'s notification reached the peer after its outcome {:?}",
                t.state
            ));
        }
        if staged_read {
            return None;
        }
        self.landed(x, mem)
            .err()
            .map(|e| format!("transfer {x}'s notification reached the peer before its data: {e}"))
    }

    /// Checks an outcome and records it; frees the transfer's memory. Returns the violations.
    pub(crate) fn outcome(
        &mut self,
        x: usize,
        result: &Result<(), Failure>,
        mem: &[Vec<u8>],
        peer_alive: bool,
        deadline_bound: Duration,
        now: Duration,
    ) -> Vec<String> {
        let mut v = Vec::new();
        let Some(t) = self.list.get(x) else {
            return vec![format!("an outcome for unknown transfer {x}")];
        };
        if t.state != XState::Live {
            v.push(format!(
                "transfer {x} reported an outcome twice ({:?}, then {result:?})",
                t.state
            ));
            return v;
        }
        if let Some(d) = t.deadline {
            if now > d + deadline_bound {
                v.push(format!(
                    "transfer {x}'s outcome came {:?} after its deadline (bound {deadline_bound:?})",
                    now - d
                ));
            }
        }
        if result.is_ok() {
            if let Some(m) = t.misuse {
                v.push(format!("transfer {x} ({m:?}) reported success"));
            }
            if let Err(e) = self.landed(x, mem) {
                v.push(format!("transfer {x} reported success but {e}"));
            }
            if t.notify && peer_alive && t.arrivals == 0 {
                v.push(format!(
                    "transfer {x} reported success, its notification never reached the peer"
                ));
            }
        }
        let state = match result {
            Ok(()) => XState::Done,
            Err(f) => XState::Failed(f.clone()),
        };
        self.list[x].state = state;
        self.release(x);
        v
    }

    /// A new child transfer of staged transfer `parent` (it reserves its bounce buffer).
    pub(crate) fn add_child(&mut self, parent: usize, agent: usize, peer: usize) -> usize {
        let op = self.list[parent].op;
        self.list.push(Xfer {
            kind: Kind::Child { parent },
            staged: false,
            agent,
            peer,
            op,
            runs: Vec::new(),
            notify: false,
            misuse: None,
            deadline: None,
            innocent: false,
            state: XState::Live,
            key: None,
            arrivals: 0,
            deliveries: 0,
        });
        self.list.len() - 1
    }

    /// A child transfer refused at submission: it never moved anything.
    pub(crate) fn child_refused(&mut self, x: usize) {
        self.refused(x);
    }

    /// A child transfer's outcome: its bounce buffer is free for the stager again.
    pub(crate) fn child_outcome(
        &mut self,
        x: usize,
        result: &Result<(), Failure>,
    ) -> Option<String> {
        let t = self.list.get(x)?;
        if t.state != XState::Live {
            return Some(format!("child transfer {x} reported an outcome twice"));
        }
        self.list[x].state = match result {
            Ok(()) => XState::Done,
            Err(f) => XState::Failed(f.clone()),
        };
        self.release(x);
        None
    }

    /// A refused submission: its memory is free again.
    pub(crate) fn refused(&mut self, x: usize) {
        self.list[x].state = XState::Refused;
        self.release(x);
    }
}
