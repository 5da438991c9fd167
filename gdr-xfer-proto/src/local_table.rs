//! An agent's own segment table: the ids it gives (each once), the segments it holds, and the
//! admission of a segment handed to one of its calls. A segment another agent made is refused
//! before anything changes ([`LocalError::Foreign`]): one agent's segment carries that agent's
//! registrations, and announcing it, carving it or deregistering it through another agent
//! would hand peers keys of the wrong protection domain, or remove what the other agent still
//! serves. The local counterpart of [`crate::PeerTable`].

use std::collections::BTreeMap;
use std::fmt;

use crate::segment_id::SegmentId;

/// Why the table refused a segment handed to a call; nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalError {
    /// The segment was made by another agent (`owner`).
    Foreign {
        /// The agent that made it.
        owner: u64,
        /// Its id (in its owner's table).
        segment: SegmentId,
    },
    /// It is not (or no longer) in the table: deregistered.
    Unknown {
        /// Its id.
        segment: SegmentId,
    },
    /// Every id was given (`u32::MAX - 2` registrations): ids are never given twice.
    Exhausted,
}

impl fmt::Display for LocalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocalError::Foreign { owner, segment } => {
                write!(f, "segment {segment} belongs to agent {owner}")
            }
            LocalError::Unknown { segment } => write!(f, "segment {segment} is not registered"),
            LocalError::Exhausted => f.write_str("segment ids are exhausted"),
        }
    }
}

impl std::error::Error for LocalError {}

/// An agent's own segments (`S`: the driver's segment handle), by id.
#[derive(Debug, Clone)]
pub struct LocalTable<S> {
    agent: u64,
    last: u32,
    segments: BTreeMap<SegmentId, S>,
}

impl<S> LocalTable<S> {
    /// The empty table of agent `agent` (a number no other agent of the process has).
    pub fn new(agent: u64) -> Self {
        LocalTable {
            agent,
            last: 0,
            segments: BTreeMap::new(),
        }
    }

    /// Refuses a segment of another agent: `owner` made segment `segment`.
    ///
    /// # Errors
    /// [`LocalError::Foreign`] when `owner` is not this table's agent.
    pub fn check_own(&self, owner: u64, segment: SegmentId) -> Result<(), LocalError> {
        if owner == self.agent {
            Ok(())
        } else {
            Err(LocalError::Foreign { owner, segment })
        }
    }

    /// The table's entry for a handle of this agent (`owner`, `segment`), when `is_it` says the
    /// entry is that handle's (a handle of a deregistered segment is not its successor's).
    ///
    /// # Errors
    /// [`LocalError::Foreign`] first, then [`LocalError::Unknown`].
    pub fn admit(
        &self,
        owner: u64,
        segment: SegmentId,
        is_it: impl FnOnce(&S) -> bool,
    ) -> Result<&S, LocalError> {
        self.check_own(owner, segment)?;
        match self.segments.get(&segment) {
            Some(s) if is_it(s) => Ok(s),
            _ => Err(LocalError::Unknown { segment }),
        }
    }

    /// Takes the next id: 1, 2, ... up to `u32::MAX - 2`; never 0 or `u32::MAX`, never twice.
    ///
    /// # Errors
    /// [`LocalError::Exhausted`] once every id was given (nothing changes then).
    pub fn next_id(&mut self) -> Result<SegmentId, LocalError> {
        if self.last >= u32::MAX - 2 {
            return Err(LocalError::Exhausted);
        }
        self.last += 1;
        Ok(SegmentId::new(self.last))
    }

    /// Adds segment `id` (from [`LocalTable::next_id`]).
    pub fn insert(&mut self, id: SegmentId, segment: S) {
        self.segments.insert(id, segment);
    }

    /// Adds segment `id`, carved out of `parent` (made by `owner`), in one step with the
    /// parent's admission: a parent deregistered meanwhile refuses it.
    ///
    /// # Errors
    /// As [`LocalTable::admit`] for the parent; nothing is added then.
    pub fn insert_within(
        &mut self,
        owner: u64,
        parent: SegmentId,
        is_parent: impl FnOnce(&S) -> bool,
        id: SegmentId,
        segment: S,
    ) -> Result<(), LocalError> {
        self.admit(owner, parent, is_parent)?;
        self.insert(id, segment);
        Ok(())
    }

    /// Removes this agent's segment `segment` (made by `owner`) when `is_it` says the entry is
    /// the caller's handle's.
    ///
    /// # Errors
    /// As [`LocalTable::admit`]; nothing is removed then.
    pub fn remove(
        &mut self,
        owner: u64,
        segment: SegmentId,
        is_it: impl FnOnce(&S) -> bool,
    ) -> Result<S, LocalError> {
        self.admit(owner, segment, is_it)?;
        self.segments
            .remove(&segment)
            .ok_or(LocalError::Unknown { segment })
    }

    /// The segment of id `id`.
    pub fn get(&self, id: SegmentId) -> Option<&S> {
        self.segments.get(&id)
    }

    /// The segments, by id.
    pub fn values(&self) -> impl Iterator<Item = &S> {
        self.segments.values()
    }

    /// The ids, in order.
    pub fn ids(&self) -> impl Iterator<Item = SegmentId> + '_ {
        self.segments.keys().copied()
    }

    /// How many segments it holds.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> SegmentId {
        SegmentId::new(n)
    }

    #[test]
    fn ids_never_wrap_and_never_repeat() {
        let mut t = LocalTable::<()>::new(1);
        assert_eq!(t.next_id(), Ok(id(1)));
        assert_eq!(t.next_id(), Ok(id(2)));
        t.last = u32::MAX - 3;
        assert_eq!(t.next_id(), Ok(id(u32::MAX - 2)));
        assert_eq!(t.next_id(), Err(LocalError::Exhausted), "not wrapped");
        assert_eq!(t.next_id(), Err(LocalError::Exhausted));
        assert_eq!(t.last, u32::MAX - 2);
    }

    #[test]
    fn another_agents_segment_is_refused_before_anything_changes() {
        let mut t = LocalTable::new(1);
        let a = t.next_id().unwrap();
        t.insert(a, "a");
        let before = t.clone();
        // Agent 2's segment with the same number as ours: refused as foreign, not mistaken
        // for ours, by every call.
        let foreign = LocalError::Foreign {
            owner: 2,
            segment: a,
        };
        assert_eq!(t.check_own(2, a), Err(foreign));
        assert_eq!(t.admit(2, a, |_| true).err(), Some(foreign));
        assert_eq!(t.remove(2, a, |_| true), Err(foreign));
        let b = t.next_id().unwrap();
        assert_eq!(t.insert_within(2, a, |_| true, b, "b"), Err(foreign));
        assert_eq!(
            t.ids().collect::<Vec<_>>(),
            before.ids().collect::<Vec<_>>()
        );
        assert_eq!(t.ids().collect::<Vec<_>>(), vec![a]);
        assert_eq!(t.get(a), Some(&"a"));
        assert!(!t.is_empty());
    }

    #[test]
    fn a_stale_handle_names_nothing_and_a_deregistered_parent_carves_nothing() {
        let mut t = LocalTable::new(7);
        let a = t.next_id().unwrap();
        t.insert(a, 10);
        // A handle whose entry is not this one (its segment was deregistered and the id is
        // held by another registration in the caller's eyes): unknown.
        assert_eq!(
            t.remove(7, a, |&v| v == 11),
            Err(LocalError::Unknown { segment: a })
        );
        assert_eq!(t.remove(7, a, |&v| v == 10), Ok(10));
        assert_eq!(
            t.remove(7, a, |_| true),
            Err(LocalError::Unknown { segment: a })
        );
        let b = t.next_id().unwrap();
        assert_eq!(
            t.insert_within(7, a, |_| true, b, 20),
            Err(LocalError::Unknown { segment: a })
        );
        assert!(t.is_empty());
        let c = t.next_id().unwrap();
        t.insert(c, 30);
        let d = t.next_id().unwrap();
        assert_eq!(t.insert_within(7, c, |&v| v == 30, d, 31), Ok(()));
        assert_eq!(t.values().copied().collect::<Vec<_>>(), vec![30, 31]);
        assert_eq!(t.len(), 2);
    }
}
