//! The id an agent gives each of its segments.

use std::fmt;

/// An agent's id for one of its segments: given once (1, 2, ...) and never reused by that
/// agent, so an id a peer holds names that segment or none. A type of its own, so that it
/// cannot be passed where an offset, a length or a block index is meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentId(u32);

impl SegmentId {
    /// The id with the number `raw` (as the wire carries it, or as [`SegmentId::get`] gave it).
    pub const fn new(raw: u32) -> Self {
        SegmentId(raw)
    }

    /// Its number.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for SegmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
