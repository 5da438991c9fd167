//! Each agent's own segment table, the core's [`LocalTable`](crate::LocalTable) in its
//! [`Endpoint`]: what a deregistration and a new registration change in it, and the calls that
//! hand an agent another agent's segment (or a stale handle of its own). The simulated agents' segment ids are the same numbers on every
//! agent (segment and epoch), so a table that looked at ids alone would take another agent's
//! segment for its own: the owner is what must refuse it, before anything changes.

use super::tables::{of_id, seg_id};
use super::*;
use crate::local_table::LocalError;
use crate::segment_id::SegmentId;

/// Agent `agent`'s endpoint at the start (`rails` rails, `agents` agents in all), its table
/// holding each segment's first registration.
pub(super) fn registered(
    agent: usize,
    rails: usize,
    agents: usize,
) -> Endpoint<(usize, u32), (usize, u32)> {
    let mut e = Endpoint::new(agent as u64, rails, agents);
    for seg in 0..SEGS {
        e.segments_mut().insert(seg_id(seg, 0), (seg, 0));
    }
    e
}

impl World {
    /// `agent` deregisters the `old` registration of segment `seg` and registers it again
    /// (epoch `old + 1`): through its table, as the driver does; an honest call it refuses is a
    /// violation.
    pub(super) fn reregister(&mut self, agent: usize, seg: usize, old: u32) {
        let t = self.endpoints[agent].segments_mut();
        if let Err(e) = t.remove(agent as u64, seg_id(seg, old), |&e| e == (seg, old)) {
            self.net.borrow_mut().violation(format!(
                "agent {agent} refused to deregister its own segment {seg} (epoch {old}): {e}"
            ));
            return;
        }
        t.insert(seg_id(seg, old + 1), (seg, old + 1));
    }

    /// `agent` is handed a segment of another agent (whose id is one of `agent`'s own ids, or
    /// soon will be) to deregister, to carve a new segment out of, and to admit, and a stale
    /// handle of its own: each call must be refused with the error that names why, and the
    /// table must be as it was (no segment gone, none added; so nothing is announced and no
    /// transfer is touched).
    pub(super) fn on_foreign_calls(&mut self, agent: usize) {
        let n = self.p.agents;
        let other = (agent + 1 + self.rng.index(n - 1)) % n;
        let seg = self.rng.index(SEGS);
        let (theirs, ours) = {
            let net = self.net.borrow();
            (net.key_epoch[other][seg], net.key_epoch[agent][seg])
        };
        let id = seg_id(seg, theirs);
        let owner = other as u64;
        let t = self.endpoints[agent].segments_mut();
        let before: Vec<SegmentId> = t.ids().collect();
        let foreign = LocalError::Foreign { owner, segment: id };
        let mut wrong = Vec::new();
        let mut check = |what: &str, got: Option<LocalError>, want: LocalError| {
            if got != Some(want) {
                wrong.push(format!("{what}: {got:?}, not {want:?}"));
            }
        };
        let got = t.remove(owner, id, |&e| e.0 == seg).err();
        check("deregister", got, foreign);
        let new = seg_id(seg, ours + 1_000);
        let got = t.insert_within(owner, id, |_| true, new, (SEGS, 0)).err();
        check("register_within", got, foreign);
        let got = t.admit(owner, id, |_| true).err();
        check("admit", got, foreign);
        if ours > 0 {
            // Our own handle of a registration deregistered since: unknown, not its successor.
            let stale = seg_id(seg, ours - 1);
            let got = t.remove(agent as u64, stale, |&e| e == of_id(stale)).err();
            check(
                "deregister a stale handle",
                got,
                LocalError::Unknown { segment: stale },
            );
        }
        if t.ids().collect::<Vec<_>>() != before {
            wrong.push("the table changed".into());
        }
        self.log(|| format!("agent {agent} handed agent {other}'s segment {seg}: refused"));
        self.report.foreign_refused += 3 + u64::from(ours > 0);
        if !wrong.is_empty() {
            self.net.borrow_mut().violation(format!(
                "agent {agent}, handed agent {other}'s segment {seg} (epoch {theirs}): {}",
                wrong.join("; ")
            ));
        }
    }
}
