//! A peer's segment table, as its announcements built it: what a transfer to the peer may
//! address. The rules a peer's messages must keep are checked here, and a message that breaks
//! one changes nothing: a segment announced twice, one without a remote key for each shared
//! rail, more than [`MAX_REMOTE_SEGMENTS`] (a hostile peer cannot grow the table without
//! bound). Removals of unknown ids are ignored (a removal may cross an announcement).

use std::collections::{HashMap, HashSet};

use crate::segment_id::SegmentId;
use crate::wire::{Codec, Message, SegmentInfo};

/// Most segments a peer may announce.
pub const MAX_REMOTE_SEGMENTS: usize = 1 << 20;

/// Why a peer's control message ends its connection (nothing of it was applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableError {
    /// The table would hold more than [`MAX_REMOTE_SEGMENTS`].
    TooMany {
        /// The bound.
        max: usize,
    },
    /// A segment id announced while the table has it, or twice in one message.
    AnnouncedTwice {
        /// The id.
        segment: SegmentId,
    },
    /// A segment announced with fewer remote keys than the connection has rails.
    TooFewKeys {
        /// The id.
        segment: SegmentId,
        /// Keys announced.
        keys: usize,
        /// Rails shared.
        rails: usize,
    },
    /// The peer said goodbye.
    Goodbye {
        /// Its reason.
        reason: String,
    },
    /// A handshake message after the handshake.
    HandshakeAgain,
    /// A rail renewal before the handshake ended.
    RenewalDuringHandshake,
}

impl std::fmt::Display for TableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableError::TooMany { max } => write!(f, "announced more than {max} segments"),
            TableError::AnnouncedTwice { segment } => {
                write!(f, "announced segment {segment} twice")
            }
            TableError::TooFewKeys {
                segment,
                keys,
                rails,
            } => write!(
                f,
                "announced segment {segment} with {keys} remote keys for {rails} shared rails"
            ),
            TableError::Goodbye { reason } => write!(f, "the peer said goodbye: {reason}"),
            TableError::HandshakeAgain => {
                f.write_str("unexpected handshake message after the handshake")
            }
            TableError::RenewalDuringHandshake => {
                f.write_str("a rail renewal during the handshake")
            }
        }
    }
}

/// A peer's segments by id (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerTable {
    segments: HashMap<SegmentId, SegmentInfo>,
}

impl PeerTable {
    /// An empty table.
    pub fn new() -> PeerTable {
        PeerTable::default()
    }

    /// Applies a control message of a connection sharing `rails` rails that is not the core's
    /// own (see [`Message::into_control`]): announcements add, removals remove.
    ///
    /// # Errors
    /// The rule the message breaks, or [`TableError::Goodbye`] and the handshake's messages,
    /// which end the connection too; nothing of it was applied.
    pub fn apply<C: Codec>(&mut self, msg: Message<C>, rails: usize) -> Result<(), TableError> {
        match msg {
            Message::Segments(list) => self.announce(list, rails),
            Message::Removed(ids) => {
                for id in ids {
                    self.segments.remove(&id);
                }
                Ok(())
            }
            Message::Bye(reason) => Err(TableError::Goodbye { reason }),
            Message::Hello(_) | Message::Ready => Err(TableError::HandshakeAgain),
            Message::RailRenew(_) | Message::RailRenewed(_) | Message::RailRefused { .. } => {
                Err(TableError::RenewalDuringHandshake)
            }
        }
    }

    /// Adds announced segments, all or none.
    ///
    /// # Errors
    /// As [`PeerTable::apply`].
    pub fn announce(&mut self, list: Vec<SegmentInfo>, rails: usize) -> Result<(), TableError> {
        if self.segments.len().saturating_add(list.len()) > MAX_REMOTE_SEGMENTS {
            return Err(TableError::TooMany {
                max: MAX_REMOTE_SEGMENTS,
            });
        }
        let mut seen = HashSet::with_capacity(list.len());
        for s in &list {
            if self.segments.contains_key(&s.id) || !seen.insert(s.id) {
                return Err(TableError::AnnouncedTwice { segment: s.id });
            }
            if s.rkeys.len() < rails {
                return Err(TableError::TooFewKeys {
                    segment: s.id,
                    keys: s.rkeys.len(),
                    rails,
                });
            }
        }
        for s in list {
            self.segments.insert(s.id, s);
        }
        Ok(())
    }

    /// The segment with this id.
    pub fn get(&self, id: SegmentId) -> Option<&SegmentInfo> {
        self.segments.get(&id)
    }

    /// Every segment, in no order.
    pub fn iter(&self) -> impl Iterator<Item = &SegmentInfo> + '_ {
        self.segments.values()
    }

    /// How many segments it has.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Codec, SegmentInfo};
    use crate::Location;

    /// A codec whose endpoints are never used here.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct NoEndpoints;

    impl Codec for NoEndpoints {
        type Endpoint = ();
        fn encode_endpoint(_: &()) -> Result<Vec<u8>, String> {
            Ok(Vec::new())
        }
        fn decode_endpoint(_: &[u8]) -> Result<(), String> {
            Ok(())
        }
    }

    type Msg = Message<NoEndpoints>;

    fn seg(id: u32) -> SegmentInfo {
        SegmentInfo {
            id: SegmentId::new(id),
            name: format!("s{id}"),
            addr: 0x1000 * u64::from(id),
            len: 4096,
            rkeys: vec![id, id + 1],
            location: Location::Cpu { numa: None },
        }
    }

    #[test]
    fn a_peer_that_lies_about_its_segments_is_dropped_and_changes_nothing() {
        let mut t = PeerTable::new();
        assert!(t.is_empty());
        t.apply(Msg::Segments(vec![seg(1), seg(2)]), 2).unwrap();
        assert!(!t.is_empty());
        // The same id again, in a later message or twice in one: refused, nothing added.
        let e = t.apply(Msg::Segments(vec![seg(3), seg(1)]), 2).unwrap_err();
        assert_eq!(
            e,
            TableError::AnnouncedTwice {
                segment: SegmentId::new(1)
            }
        );
        let e = t.apply(Msg::Segments(vec![seg(4), seg(4)]), 2).unwrap_err();
        assert_eq!(
            e,
            TableError::AnnouncedTwice {
                segment: SegmentId::new(4)
            }
        );
        // Fewer keys than shared rails: the second rail could not address it.
        let mut short = seg(5);
        short.rkeys.truncate(1);
        let e = t.apply(Msg::Segments(vec![seg(6), short]), 2).unwrap_err();
        assert_eq!(
            e.to_string(),
            "announced segment 5 with 1 remote keys for 2 shared rails"
        );
        assert_eq!(t.len(), 2);
        assert!([3, 4, 6]
            .into_iter()
            .all(|i| t.get(SegmentId::new(i)).is_none()));
        // Removals of unknown ids are harmless; known ones go.
        t.apply(Msg::Removed(vec![SegmentId::new(2), SegmentId::new(99)]), 2)
            .unwrap();
        assert_eq!(
            t.iter().map(|s| s.id).collect::<Vec<_>>(),
            [SegmentId::new(1)]
        );
        // A removed id announced again is a new segment (ids are never reused by honest peers,
        // and a dishonest one only redirects its own memory).
        t.apply(Msg::Segments(vec![seg(2)]), 2).unwrap();
        // Goodbye and handshake messages end the connection.
        assert_eq!(
            t.apply(Msg::Bye("x".into()), 2),
            Err(TableError::Goodbye { reason: "x".into() })
        );
        assert_eq!(t.apply(Msg::Ready, 2), Err(TableError::HandshakeAgain));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn a_peer_cannot_grow_the_table_without_bound() {
        let mut t = PeerTable::new();
        let first: Vec<SegmentInfo> = (0..MAX_REMOTE_SEGMENTS as u32 - 1).map(seg).collect();
        t.announce(first, 1).unwrap();
        let e = t
            .announce(vec![seg(u32::MAX - 2), seg(u32::MAX - 1)], 1)
            .unwrap_err();
        assert_eq!(
            e,
            TableError::TooMany {
                max: MAX_REMOTE_SEGMENTS
            }
        );
        assert_eq!(t.len(), MAX_REMOTE_SEGMENTS - 1);
        t.announce(vec![seg(u32::MAX - 1)], 1).unwrap();
    }
}
