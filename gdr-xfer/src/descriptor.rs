//! What a transfer moves: descriptor lists, block tables (the paged form) and prepared lists
//! addressed by index.

use std::sync::Arc;

use crate::error::{descriptor_prefix, Error, Result};
use crate::segment::{Segment, SegmentInner};
use crate::side::Side;
use gdr_xfer_proto::SegmentId;

/// The direction of a one-sided transfer, seen from the initiator (the core's: one enum for
/// the concept).
pub use gdr_xfer_proto::Op;

/// One contiguous piece of a transfer: `len` bytes at `local_offset` of a local segment, and at
/// `remote_offset` of the peer's segment `remote`.
#[derive(Debug, Clone)]
pub struct Desc<'a> {
    /// The local segment.
    pub local: &'a Segment,
    /// Offset in the local segment.
    pub local_offset: u64,
    /// The peer's segment id.
    pub remote: SegmentId,
    /// Offset in the peer's segment.
    pub remote_offset: u64,
    /// Bytes to move (non-zero).
    pub len: u64,
}

impl<'a> Desc<'a> {
    /// A descriptor.
    pub fn new(
        local: &'a Segment,
        local_offset: u64,
        remote: SegmentId,
        remote_offset: u64,
        len: u64,
    ) -> Self {
        Desc {
            local,
            local_offset,
            remote,
            remote_offset,
            len,
        }
    }
}

/// The paged form, for block tables such as a KV cache: block `local_blocks[i]` of the local
/// segment moves to or from block `remote_blocks[i]` of the peer's segment. Block `b` of a side
/// starts at `base + b * block_len`. No descriptor struct per block is needed.
#[derive(Debug, Clone)]
pub struct BlockTable<'a> {
    /// The local segment.
    pub local: &'a Segment,
    /// Offset of local block 0.
    pub local_base: u64,
    /// The peer's segment id.
    pub remote: SegmentId,
    /// Offset of remote block 0.
    pub remote_base: u64,
    /// Bytes per block (non-zero).
    pub block_len: u64,
    /// Local block indices.
    pub local_blocks: &'a [u32],
    /// Remote block indices, one per local block.
    pub remote_blocks: &'a [u32],
}

impl<'a> BlockTable<'a> {
    /// A table moving `local_blocks[i]` of `local` to or from `remote_blocks[i]` of the peer's
    /// segment `remote`, blocks of `block_len` bytes from offset 0 of each segment (move the
    /// bases with [`BlockTable::local_base`] and [`BlockTable::remote_base`]). Checked when a
    /// transfer uses it ([`Peer::transfer_blocks`](crate::Peer::transfer_blocks)).
    pub fn new(
        local: &'a Segment,
        local_blocks: &'a [u32],
        remote: SegmentId,
        remote_blocks: &'a [u32],
        block_len: u64,
    ) -> Self {
        BlockTable {
            local,
            local_base: 0,
            remote,
            remote_base: 0,
            block_len,
            local_blocks,
            remote_blocks,
        }
    }

    /// The table with local block 0 at `offset` of the local segment.
    pub fn local_base(mut self, offset: u64) -> Self {
        self.local_base = offset;
        self
    }

    /// The table with remote block 0 at `offset` of the peer's segment.
    pub fn remote_base(mut self, offset: u64) -> Self {
        self.remote_base = offset;
        self
    }

    /// The same blocks with another local segment (reading back into a second buffer, say).
    pub fn with_local(mut self, local: &'a Segment) -> Self {
        self.local = local;
        self
    }
}

/// A list of local ranges checked once, then named by index in
/// [`Peer::transfer_indexed`](crate::Peer::transfer_indexed) (NIXL's prepared descriptor lists).
#[derive(Clone)]
pub struct LocalList {
    pub(crate) entries: Vec<(Arc<SegmentInner>, u64, u64)>,
}

impl std::fmt::Debug for LocalList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalList")
            .field("len", &self.entries.len())
            .finish()
    }
}

impl LocalList {
    /// Checks each `(segment, offset, len)` against its segment.
    ///
    /// # Errors
    /// [`Error::OutOfSegment`] for a range outside its segment, [`Error::InvalidArgument`] for an
    /// empty range.
    pub fn new(ranges: &[(&Segment, u64, u64)]) -> Result<LocalList> {
        let mut entries = Vec::with_capacity(ranges.len());
        for (i, &(seg, offset, len)) in ranges.iter().enumerate() {
            check_local(Some(i), seg, offset, len)?;
            entries.push((seg.inner.clone(), offset, len));
        }
        Ok(LocalList { entries })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A list of ranges of one peer's segments, checked once against its segment table, then named
/// by index (see [`Peer::prepare_remote`](crate::Peer::prepare_remote)).
#[derive(Debug, Clone)]
pub struct RemoteList {
    /// The peer it was prepared for.
    pub(crate) peer: String,
    /// The serial number of the connection it was prepared on: another one (another agent's,
    /// or a later connection to a peer of the same name, whose ids may name other memory)
    /// refuses it. A number, not a pointer: a list kept after its connection went holds no
    /// part of it.
    pub(crate) conn: u64,
    /// (segment id, offset, len) per entry.
    pub(crate) entries: Vec<(SegmentId, u64, u64)>,
}

impl RemoteList {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Checks one local range against its segment.
/// Checks a local range (descriptor `index`, or no descriptor's: `None`) against its segment.
pub(crate) fn check_local(
    index: Option<usize>,
    seg: &Segment,
    offset: u64,
    len: u64,
) -> Result<()> {
    if len == 0 {
        return Err(Error::invalid(
            format!(
                "{}an empty range of segment {}",
                descriptor_prefix(index),
                seg.id()
            ),
            "every range has at least one byte",
        ));
    }
    if offset.checked_add(len).is_none_or(|end| end > seg.len()) {
        return Err(Error::OutOfSegment {
            index,
            side: Side::Local,
            segment: seg.id(),
            offset,
            len,
            segment_len: seg.len(),
            hint: "check the offset and length against the segment".into(),
        });
    }
    Ok(())
}
