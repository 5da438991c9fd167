//! The agents' segment tables, as the driver keeps them: each agent announces its segments to
//! its peers through the real wire format, each peer keeps them in the core's [`PeerTable`]
//! (with its rules), and the applications address a peer's memory with the ids and keys of
//! their own agent's table, which lags the owner: a segment deregistered (and registered again
//! under a new id and new keys) reaches a peer's table only when its messages arrive, in order
//! with the rest of the control traffic. A transfer planned meanwhile uses the old keys and
//! fails with a request error: it is not innocent.

use super::*;
use crate::peer_table::PeerTable;
use crate::segment_id::SegmentId;
use crate::wire::SegmentInfo;
use crate::Location;

/// What an application's planner found in its agent's table for some of a peer's segments.
pub(super) struct Seen {
    /// Per segment, the epoch of the registration the table names.
    pub(super) epochs: Vec<u32>,
    /// Whether any of them is not the owner's current registration (its deregistration has not
    /// reached this table yet).
    pub(super) stale: bool,
}

/// The id of registration `epoch` of segment `seg` (ids are never reused by their owner).
pub(super) fn seg_id(seg: usize, epoch: u32) -> SegmentId {
    SegmentId::new((epoch as usize * SEGS + seg + 1) as u32)
}

/// Segment and epoch of an id.
pub(super) fn of_id(id: SegmentId) -> (usize, u32) {
    let i = id.get() as usize - 1;
    (i % SEGS, (i / SEGS) as u32)
}

impl World {
    /// The announcement of registration `epoch` of `owner`'s segment `seg`.
    fn seg_info(&self, owner: usize, seg: usize, epoch: u32) -> SegmentInfo {
        SegmentInfo {
            id: seg_id(seg, epoch),
            name: format!("a{owner}s{seg}"),
            addr: (seg * SEG) as u64,
            len: SEG as u64,
            rkeys: (0..self.p.cfg.rails)
                .map(|r| rkey(owner, seg, r, epoch))
                .collect(),
            location: Location::Cpu { numa: None },
        }
    }

    /// The handshake's table exchange between `a` and `b` (sent and applied before either side
    /// is ready, as the driver does), through the wire's encoder and decoder.
    pub(super) fn exchange_tables(&mut self, a: usize, b: usize, rails: usize) {
        for (owner, to) in [(a, b), (b, a)] {
            // A new connection starts with an empty table (an earlier one's went with it).
            self.tables[to][owner] = PeerTable::new();
            let list: Vec<SegmentInfo> = (0..SEGS)
                .map(|s| self.seg_info(owner, s, self.net.borrow().key_epoch[owner][s]))
                .collect();
            for msg in crate::wire::segment_messages::<SimCodec>(&list) {
                let bytes = msg.encode().expect("a table message encodes");
                let msg = Message::<SimCodec>::decode(&format!("agent {owner}"), &bytes)
                    .expect("a table message decodes");
                if let Err(e) = self.tables[to][owner].apply(msg, rails) {
                    panic!("agent {to} refused agent {owner}'s table: {e}");
                }
            }
        }
    }

    /// `owner` deregistered segment `seg` and registered it again (new id, new keys): each peer
    /// is told on its control link, the new registration first, then the old one's removal.
    pub(super) fn announce_reregistration(&mut self, owner: usize, seg: usize, old: u32, new: u32) {
        let added = Message::<SimCodec>::Segments(vec![self.seg_info(owner, seg, new)]);
        let removed = Message::<SimCodec>::Removed(vec![seg_id(seg, old)]);
        for peer in 0..self.p.agents {
            let Some(inc) = self.conns[owner][peer].as_ref().map(|c| c.inc) else {
                continue;
            };
            if peer == owner || !self.net.borrow().alive[peer] {
                continue;
            }
            for msg in [added.clone(), removed.clone()] {
                let bytes = msg.encode().expect("a table message encodes");
                self.send_control(owner, peer, inc, bytes);
            }
        }
    }

    /// A table message from `from` arrives at `to`: applied to `to`'s table of `from`, with
    /// the core's rules (an honest peer breaks none).
    pub(super) fn apply_table(&mut self, from: usize, to: usize, msg: Message<SimCodec>) {
        let rails = match self.conns[to][from].as_ref() {
            Some(c) => c.core.config().rails,
            None => return,
        };
        self.report.table_messages += 1;
        if let Err(e) = self.tables[to][from].apply(msg, rails) {
            self.net.borrow_mut().violation(format!(
                "agent {to} refused an honest table message from agent {from}: {e}"
            ));
        }
    }

    /// What `agent`'s table says of `peer`'s segments `segs` (the newest registration of each
    /// it knows); `None` when one is missing.
    pub(super) fn seen(&self, agent: usize, peer: usize, segs: &[usize]) -> Option<Seen> {
        let table: &PeerTable = &self.tables[agent][peer];
        let net = self.net.borrow();
        let mut seen = Seen {
            epochs: Vec::with_capacity(segs.len()),
            stale: false,
        };
        for &s in segs {
            let epoch = table
                .iter()
                .map(|i| of_id(i.id))
                .filter(|&(seg, _)| seg == s)
                .map(|(_, e)| e)
                .max()?;
            seen.stale |= epoch != net.key_epoch[peer][s];
            seen.epochs.push(epoch);
        }
        Some(seen)
    }

    /// The remote keys of `peer`'s segments `segs` on every rail, from `agent`'s table.
    pub(super) fn table_keys(
        &self,
        agent: usize,
        peer: usize,
        segs: &[usize],
    ) -> Option<(Vec<u32>, bool)> {
        let seen = self.seen(agent, peer, segs)?;
        let table = &self.tables[agent][peer];
        let mut keys = Vec::with_capacity(segs.len() * self.p.cfg.rails);
        for (&s, &e) in segs.iter().zip(&seen.epochs) {
            keys.extend_from_slice(&table.get(seg_id(s, e))?.rkeys);
        }
        Some((keys, seen.stale))
    }

    /// Once nothing is left to happen, every live agent's table of every live peer it is
    /// connected to holds exactly the peer's current registrations.
    pub(super) fn tables_converged(&self) -> Result<(), String> {
        let net = self.net.borrow();
        for agent in 0..self.p.agents {
            for peer in 0..self.p.agents {
                let connected = self.conns[agent][peer]
                    .as_ref()
                    .is_some_and(|c| c.core.gone().is_none());
                if !connected || !net.alive[agent] || !net.alive[peer] {
                    continue;
                }
                let mut have: Vec<SegmentId> =
                    self.tables[agent][peer].iter().map(|i| i.id).collect();
                have.sort();
                let mut want: Vec<SegmentId> = (0..SEGS)
                    .map(|s| seg_id(s, net.key_epoch[peer][s]))
                    .collect();
                want.sort();
                if have != want {
                    return Err(format!(
                        "agent {agent}'s table of agent {peer} holds {have:?} at the end, not its registrations {want:?}"
                    ));
                }
            }
        }
        Ok(())
    }
}
