//! The layer-aware paged form: one call moves the same block indices in every pool of a
//! layered KV cache (layers x {K, V}), each pool a region of a segment on each side, with
//! per-side block strides. The caller gives one pair of index arrays and one line per pool,
//! not a table per layer nor a struct per block; the planner merges what continues on both
//! sides, as for a [`crate::BlockTable`].

use crate::segment::Segment;
use gdr_xfer_proto::SegmentId;

/// One pool on each side: the local segment and the offset of its block 0, the peer's
/// segment id and the offset of its block 0.
#[derive(Debug, Clone)]
pub(crate) struct PoolPair<'a> {
    pub(crate) local: &'a Segment,
    pub(crate) local_base: u64,
    pub(crate) remote: SegmentId,
    pub(crate) remote_base: u64,
}

/// Block `local_blocks[i]` of every local pool moves to or from block `remote_blocks[i]` of
/// the matching pool of the peer ([`crate::Peer::transfer_pools`]). Block `b` of a pool starts
/// at its base plus `b` times the side's stride and is `block_len` bytes long.
///
/// For 32 layers of K and V in one allocation per side, `layer_bytes` apart:
///
/// ```no_run
/// # fn f(peer: &gdr_xfer::Peer, kv: &gdr_xfer::Segment, pool: gdr_xfer::SegmentId) -> gdr_xfer::Result<()> {
/// use gdr_xfer::{Op, PoolTable, TransferOptions};
/// let (block_len, layer_bytes) = (16 << 10, 4096 * (16 << 10));
/// let local: Vec<u32> = (0..2000).collect();
/// let remote: Vec<u32> = (0..2000).map(|b| b * 2 + 1).collect();
/// let mut table = PoolTable::new(block_len, &local, &remote);
/// for p in 0..64 {
///     table = table.pool(kv, p * layer_bytes, pool, p * layer_bytes);
/// }
/// peer.transfer_pools(Op::Write, &table, &TransferOptions::new())?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PoolTable<'a> {
    pub(crate) pools: Vec<PoolPair<'a>>,
    pub(crate) block_len: u64,
    pub(crate) local_stride: u64,
    pub(crate) remote_stride: u64,
    pub(crate) local_blocks: &'a [u32],
    pub(crate) remote_blocks: &'a [u32],
}

impl<'a> PoolTable<'a> {
    /// A table of no pools yet: blocks of `block_len` bytes, consecutive on both sides (the
    /// strides are `block_len`), `local_blocks[i]` moving to or from `remote_blocks[i]`.
    pub fn new(block_len: u64, local_blocks: &'a [u32], remote_blocks: &'a [u32]) -> Self {
        PoolTable {
            pools: Vec::new(),
            block_len,
            local_stride: block_len,
            remote_stride: block_len,
            local_blocks,
            remote_blocks,
        }
    }

    /// Sets the distance between consecutive blocks of a pool on each side (at least
    /// `block_len`: a layout with padding between blocks).
    pub fn strides(mut self, local: u64, remote: u64) -> Self {
        self.local_stride = local;
        self.remote_stride = remote;
        self
    }

    /// Adds a pool: its block 0 at `local_base` of `local`, and at `remote_base` of the peer's
    /// segment `remote`.
    pub fn pool(
        mut self,
        local: &'a Segment,
        local_base: u64,
        remote: SegmentId,
        remote_base: u64,
    ) -> Self {
        self.pools.push(PoolPair {
            local,
            local_base,
            remote,
            remote_base,
        });
        self
    }

    /// The number of pools.
    pub fn pools(&self) -> usize {
        self.pools.len()
    }

    /// The number of blocks moved: the pools times the blocks of each.
    pub fn blocks(&self) -> u64 {
        self.pools.len() as u64 * self.local_blocks.len() as u64
    }
}
