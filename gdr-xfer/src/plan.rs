//! Turning what the caller asked for into runs: every descriptor checked against both segment
//! tables, descriptors contiguous on both sides merged, before anything is posted.

use std::collections::HashMap;
use std::sync::Arc;

use crate::descriptor::{check_local, BlockTable, Desc, LocalList, RemoteList};
use crate::error::{Error, Result};
use crate::pools::PoolTable;
use crate::side::Side;
use gdr_xfer_proto::Run;
use gdr_xfer_proto::{PeerTable, SegmentId};

use crate::segment::SegmentInner;

/// The checked, merged form of a transfer.
pub(crate) struct Plan {
    pub(crate) locals: Vec<Arc<SegmentInner>>,
    /// Remote keys of the remote segments the runs name, `rails` per segment.
    pub(crate) rkeys: Vec<u32>,
    pub(crate) runs: Vec<Run>,
    pub(crate) descriptors: u64,
}

/// Where a list of blocks lies on each side: the plan's local and remote segment indexes,
/// the offset (local) and address (remote) of block 0, the strides, the bytes per block.
struct Sides {
    local: u32,
    remote: u32,
    local_base: u64,
    remote_base: u64,
    local_stride: u64,
    remote_stride: u64,
    len: u64,
    /// How many blocks fit on each side: an index at or past it is out of range.
    local_fit: u64,
    remote_fit: u64,
}

const LOCAL_BLOCKS: &str = "local blocks";
const REMOTE_BLOCKS: &str = "remote blocks";

/// Builds a plan: distinct local segments by identity, runs merged as they are pushed.
pub(crate) struct Planner<'t> {
    peer: &'t str,
    /// The submitting agent: local segments must be its own.
    agent: u64,
    table: &'t PeerTable,
    /// Rails shared with the peer (remote keys kept per remote segment).
    rails: usize,
    locals: Vec<Arc<SegmentInner>>,
    last_local: usize,
    /// Remote segment id -> its index in the plan.
    remote_ids: HashMap<SegmentId, u32>,
    rkeys: Vec<u32>,
    last_remote: Option<(SegmentId, u64, u64, u32)>,
    runs: Vec<Run>,
    descriptors: u64,
}

/// The most runs a plan allocates room for before its descriptors were checked.
const MAX_PREALLOCATED_RUNS: usize = 1 << 16;

impl<'t> Planner<'t> {
    pub(crate) fn new(
        peer: &'t str,
        table: &'t PeerTable,
        rails: usize,
        capacity: usize,
        agent: u64,
    ) -> Self {
        Planner {
            peer,
            agent,
            table,
            rails: rails.max(1),
            locals: Vec::new(),
            last_local: usize::MAX,
            remote_ids: HashMap::new(),
            rkeys: Vec::new(),
            last_remote: None,
            // A hint from the caller's sizes (pools x blocks may claim far more than the
            // checks will let through): preallocated up to a bound, grown past it only by runs
            // that exist.
            runs: Vec::with_capacity(capacity.min(MAX_PREALLOCATED_RUNS)),
            descriptors: 0,
        }
    }

    /// The index of a local segment in the plan (added on first use, once checked: it must be
    /// this agent's and still registered). `index`: the descriptor's position, for the error.
    fn local(&mut self, index: usize, seg: &Arc<SegmentInner>) -> Result<u32> {
        if self.last_local < self.locals.len() && Arc::ptr_eq(&self.locals[self.last_local], seg) {
            return Ok(self.last_local as u32);
        }
        let i = match self.locals.iter().position(|p| Arc::ptr_eq(p, seg)) {
            Some(i) => i,
            None => {
                if seg.agent != self.agent {
                    return Err(Error::ForeignSegment {
                        index,
                        segment: seg.info.id,
                        hint: "a transfer's local side must be a segment of the agent that submits it: register the memory with this agent (register_host, register_gpu, register_within)".into(),
                    });
                }
                if !seg.is_registered() {
                    return Err(Error::UnknownSegment {
                        owner: "local".into(),
                        segment: seg.info.id,
                        hint: "it was deregistered: register the memory again".into(),
                    });
                }
                self.locals.push(seg.clone());
                self.locals.len() - 1
            }
        };
        self.last_local = i;
        Ok(i as u32)
    }

    /// (address, length, index in the plan's remote segments) of a remote segment.
    fn remote(&mut self, id: SegmentId) -> Result<(u64, u64, u32)> {
        if let Some((rid, addr, len, idx)) = self.last_remote {
            if rid == id {
                return Ok((addr, len, idx));
            }
        }
        let s = self.table.get(id).ok_or_else(|| Error::UnknownSegment {
            owner: self.peer.to_string(),
            segment: id,
            hint: "the peer never registered it or deregistered it: list its segments with Peer::segments".into(),
        })?;
        let next = self.remote_ids.len() as u32;
        let idx = *self.remote_ids.entry(id).or_insert(next);
        if idx == next {
            // The table holds only segments with a key for every shared rail (checked when
            // the peer announced them).
            for r in 0..self.rails {
                self.rkeys.push(s.rkeys.get(r).copied().unwrap_or(0));
            }
        }
        self.last_remote = Some((id, s.addr, s.len, idx));
        Ok((s.addr, s.len, idx))
    }

    fn check_remote(
        index: usize,
        segment: SegmentId,
        seg_len: u64,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > seg_len) {
            return Err(Error::OutOfSegment {
                index: Some(index),
                side: Side::Remote,
                segment,
                offset,
                len,
                segment_len: seg_len,
                hint: "check the offset and length against the peer's segment (Peer::segment)"
                    .into(),
            });
        }
        Ok(())
    }

    /// Appends a checked piece, merging it into the previous run when it continues it on both
    /// sides.
    fn push(&mut self, local: u32, local_offset: u64, remote_addr: u64, remote: u32, len: u64) {
        self.descriptors += 1;
        if let Some(last) = self.runs.last_mut() {
            if last.local == local
                && last.remote == remote
                && last.local_offset + last.len == local_offset
                && last.remote_addr + last.len == remote_addr
            {
                last.len += len;
                return;
            }
        }
        self.runs.push(Run {
            local,
            local_offset,
            remote_addr,
            remote,
            len,
        });
    }

    /// Adds a descriptor list.
    pub(crate) fn descs(&mut self, descs: &[Desc<'_>]) -> Result<()> {
        for (i, d) in descs.iter().enumerate() {
            check_local(Some(i), d.local, d.local_offset, d.len)?;
            let (addr, seg_len, remote) = self.remote(d.remote)?;
            Self::check_remote(i, d.remote, seg_len, d.remote_offset, d.len)?;
            let l = self.local(i, &d.local.inner)?;
            self.push(l, d.local_offset, addr + d.remote_offset, remote, d.len);
        }
        Ok(())
    }

    /// Adds a block table.
    pub(crate) fn blocks(&mut self, t: &BlockTable<'_>) -> Result<()> {
        if t.local_blocks.len() != t.remote_blocks.len() {
            return Err(Error::invalid(
                format!(
                    "block table: {} local blocks but {} remote blocks",
                    t.local_blocks.len(),
                    t.remote_blocks.len()
                ),
                "give one remote block per local block",
            ));
        }
        if t.block_len == 0 {
            return Err(Error::invalid(
                "block table: block length 0",
                "use the size of one block",
            ));
        }
        // How many whole blocks fit on each side.
        let local_blocks = t.local.len().saturating_sub(t.local_base) / t.block_len;
        let (addr, seg_len, remote) = self.remote(t.remote)?;
        let remote_blocks = seg_len.saturating_sub(t.remote_base) / t.block_len;
        let l = self.local(0, &t.local.inner)?;
        // A base that leaves no whole block: said so, not as "index 1 of 0".
        let first = t.local_blocks.first().zip(t.remote_blocks.first());
        if let Some((&lb, &rb)) = first.filter(|_| local_blocks == 0 || remote_blocks == 0) {
            let local = local_blocks == 0;
            let (block, base, segment, segment_len) = if local {
                (lb, t.local_base, t.local.id(), t.local.len())
            } else {
                (rb, t.remote_base, t.remote, seg_len)
            };
            return Err(Error::BlockOutOfSegment {
                pool: 0,
                side: if local { Side::Local } else { Side::Remote },
                block: u64::from(block),
                segment,
                offset: u64::from(block)
                    .saturating_mul(t.block_len)
                    .saturating_add(base),
                block_len: t.block_len,
                segment_len,
                hint: "the table's base leaves no whole block in the segment: check local_base, remote_base and block_len".into(),
            });
        }
        // Wrapping: a base past the segment (a caller's u64::MAX) would overflow here, and it
        // is used only for blocks in range, where `addr + base` lies inside the segment (whose
        // end does not overflow: the wire format refuses such tables).
        let sides = Sides {
            local: l,
            remote,
            local_base: t.local_base,
            remote_base: addr.wrapping_add(t.remote_base),
            local_stride: t.block_len,
            remote_stride: t.block_len,
            len: t.block_len,
            local_fit: local_blocks,
            remote_fit: remote_blocks,
        };
        self.push_blocks(&sides, t.local_blocks, t.remote_blocks)
            .map_err(|(list, index, len)| Error::IndexOutOfRange { list, index, len })
    }

    /// Adds a layer-aware table: the same blocks in every pool.
    pub(crate) fn pools(&mut self, t: &PoolTable<'_>) -> Result<()> {
        if t.local_blocks.len() != t.remote_blocks.len() {
            return Err(Error::invalid(
                format!(
                    "pool table: {} local blocks but {} remote blocks",
                    t.local_blocks.len(),
                    t.remote_blocks.len()
                ),
                "give one remote block per local block",
            ));
        }
        if t.block_len == 0 || t.local_stride < t.block_len || t.remote_stride < t.block_len {
            return Err(Error::invalid(
                format!(
                    "pool table: blocks of {} bytes, strides {} (local) and {} (remote)",
                    t.block_len, t.local_stride, t.remote_stride
                ),
                "use a non-zero block length and strides of at least the block length",
            ));
        }
        // How many blocks of a pool at `base` fit in a segment of `seg_len` bytes.
        let fit = |base: u64, stride: u64, seg_len: u64| match seg_len
            .checked_sub(base)
            .and_then(|room| room.checked_sub(t.block_len))
        {
            Some(room) => room / stride + 1,
            None => 0,
        };
        for (p, pool) in t.pools.iter().enumerate() {
            let l = self.local(p, &pool.local.inner)?;
            let (addr, seg_len, remote) = self.remote(pool.remote)?;
            let (local_len, local_id) = (pool.local.len(), pool.local.id());
            let sides = Sides {
                local: l,
                remote,
                local_base: pool.local_base,
                // In range only when some block fits, and then it lies inside the segment.
                remote_base: addr.wrapping_add(pool.remote_base),
                local_stride: t.local_stride,
                remote_stride: t.remote_stride,
                len: t.block_len,
                local_fit: fit(pool.local_base, t.local_stride, local_len),
                remote_fit: fit(pool.remote_base, t.remote_stride, seg_len),
            };
            self.push_blocks(&sides, t.local_blocks, t.remote_blocks)
                .map_err(|(list, block, _)| {
                    let local = list == LOCAL_BLOCKS;
                    let (base, stride, segment, segment_len) = if local {
                        (pool.local_base, t.local_stride, local_id, local_len)
                    } else {
                        (pool.remote_base, t.remote_stride, pool.remote, seg_len)
                    };
                    Error::BlockOutOfSegment {
                        pool: p,
                        side: if local { Side::Local } else { Side::Remote },
                        block,
                        segment,
                        offset: block.saturating_mul(stride).saturating_add(base),
                        block_len: t.block_len,
                        segment_len,
                        hint: "check the pool's base, the strides and the block indices against the segments (Peer::segment for the peer's)".into(),
                    }
                })?;
        }
        Ok(())
    }

    /// Appends blocks, each checked against the blocks that fit on each side, merging those
    /// that continue the run before them on both sides (the rule of [`Planner::push`]). A block
    /// out of range is `Err((list, index, blocks that fit))`.
    fn push_blocks(
        &mut self,
        s: &Sides,
        local_blocks: &[u32],
        remote_blocks: &[u32],
    ) -> std::result::Result<(), (&'static str, u64, u64)> {
        self.runs.reserve(local_blocks.len());
        // The run being extended (start on each side and length), kept in registers, out of the
        // vector, while the blocks continue it. It starts as the last run of earlier
        // descriptors when that one is of the same segment pair.
        let (mut open, mut at_local, mut at_remote, mut len) = match self.runs.last() {
            Some(last) if last.local == s.local && last.remote == s.remote => {
                let last = self.runs.pop().expect("there is a last run");
                (true, last.local_offset, last.remote_addr, last.len)
            }
            _ => (false, 0, 0, 0),
        };
        for (&lb, &rb) in local_blocks.iter().zip(remote_blocks) {
            if u64::from(lb) >= s.local_fit {
                self.close_run(s, open, at_local, at_remote, len);
                return Err((LOCAL_BLOCKS, u64::from(lb), s.local_fit));
            }
            if u64::from(rb) >= s.remote_fit {
                self.close_run(s, open, at_local, at_remote, len);
                return Err((REMOTE_BLOCKS, u64::from(rb), s.remote_fit));
            }
            // In range, so neither sum overflows: both lie below the segments' ends.
            let local_offset = s.local_base + u64::from(lb) * s.local_stride;
            let remote_addr = s.remote_base + u64::from(rb) * s.remote_stride;
            if open && at_local + len == local_offset && at_remote + len == remote_addr {
                len += s.len;
                continue;
            }
            self.close_run(s, open, at_local, at_remote, len);
            (open, at_local, at_remote, len) = (true, local_offset, remote_addr, s.len);
        }
        self.close_run(s, open, at_local, at_remote, len);
        self.descriptors += local_blocks.len() as u64;
        Ok(())
    }

    /// Appends the run [`Planner::push_blocks`] was extending, if any.
    #[inline(always)]
    fn close_run(&mut self, s: &Sides, open: bool, local_offset: u64, remote_addr: u64, len: u64) {
        if open {
            self.runs.push(Run {
                local: s.local,
                local_offset,
                remote_addr,
                remote: s.remote,
                len,
            });
        }
    }

    /// Adds pairs of indices into prepared lists.
    pub(crate) fn indexed(
        &mut self,
        local: &LocalList,
        local_idx: &[u32],
        remote: &RemoteList,
        remote_idx: &[u32],
    ) -> Result<()> {
        if local_idx.len() != remote_idx.len() {
            return Err(Error::invalid(
                format!(
                    "{} local indices but {} remote indices",
                    local_idx.len(),
                    remote_idx.len()
                ),
                "give one remote index per local index",
            ));
        }
        for (i, (&li, &ri)) in local_idx.iter().zip(remote_idx).enumerate() {
            let (seg, loff, llen) =
                local
                    .entries
                    .get(li as usize)
                    .ok_or(Error::IndexOutOfRange {
                        list: "local list",
                        index: u64::from(li),
                        len: local.entries.len() as u64,
                    })?;
            let &(rid, roff, rlen) =
                remote
                    .entries
                    .get(ri as usize)
                    .ok_or(Error::IndexOutOfRange {
                        list: "remote list",
                        index: u64::from(ri),
                        len: remote.entries.len() as u64,
                    })?;
            if *llen != rlen {
                return Err(Error::LengthMismatch {
                    index: i,
                    local_len: *llen,
                    remote_len: rlen,
                });
            }
            // The peer may have deregistered (or replaced) the segment since the list was
            // prepared: look it up again.
            let (addr, seg_len, remote) = self.remote(rid)?;
            Self::check_remote(i, rid, seg_len, roff, rlen)?;
            let l = self.local(i, seg)?;
            self.push(l, *loff, addr + roff, remote, rlen);
        }
        Ok(())
    }

    pub(crate) fn finish(self) -> Result<Plan> {
        if self.runs.is_empty() {
            return Err(Error::invalid(
                "empty transfer",
                "give at least one descriptor or block",
            ));
        }
        Ok(Plan {
            locals: self.locals,
            rkeys: self.rkeys,
            runs: self.runs,
            descriptors: self.descriptors,
        })
    }
}

#[cfg(all(test, feature = "emulated-gpu"))]
mod tests {
    //! The planner on the host: an emulated GPU's staged segment needs no device.
    use super::Planner;
    use crate::descriptor::{BlockTable, Desc};
    use crate::error::Error;
    use crate::pools::PoolTable;
    use crate::segment::Segment;
    use crate::wire::SegmentInfo;
    use gdr_xfer_proto::{Location, PeerTable, SegmentId};

    /// The peer segment the tests address.
    const R: SegmentId = SegmentId::new(7);

    fn local(len: usize) -> Segment {
        crate::segment::emulated_segment(1, "l", len)
    }

    fn table() -> PeerTable {
        let r = SegmentInfo {
            id: R,
            name: "r".into(),
            addr: 0x10_0000,
            len: 1 << 20,
            rkeys: vec![0x55, 0x66],
            location: Location::Cpu { numa: None },
        };
        let mut t = PeerTable::new();
        t.announce(vec![r], 2).unwrap();
        t
    }

    fn runs(p: &Planner<'_>) -> Vec<(u64, u64, u64)> {
        p.runs
            .iter()
            .map(|r| (r.local_offset, r.remote_addr, r.len))
            .collect()
    }

    #[test]
    fn blocks_merge_only_where_both_sides_continue_and_across_tables() {
        let seg = local(1 << 20);
        let t = table();
        let mut p = Planner::new("peer", &t, 2, 0, 1);
        // A descriptor, then blocks continuing it on both sides, then a gap, then two more.
        p.descs(&[Desc::new(&seg, 0, R, 0, 4096)]).unwrap();
        let (lb, rb) = ([1u32, 2, 5, 3, 4], [1u32, 2, 9, 3, 4]);
        p.blocks(&BlockTable {
            local: &seg,
            local_base: 0,
            remote: R,
            remote_base: 0,
            block_len: 4096,
            local_blocks: &lb,
            remote_blocks: &rb,
        })
        .unwrap();
        let base = 0x10_0000;
        assert_eq!(
            runs(&p),
            vec![
                (0, base, 3 * 4096),
                (5 * 4096, base + 9 * 4096, 4096),
                (3 * 4096, base + 3 * 4096, 2 * 4096),
            ]
        );
        assert_eq!(p.descriptors, 6);
        // Remote keys once per remote segment, one per rail.
        assert_eq!(p.rkeys, vec![0x55, 0x66]);
        let plan = p.finish().unwrap();
        assert_eq!(plan.runs.len(), 3);
    }

    #[test]
    fn hostile_lengths_and_offsets_are_refused_without_overflow() {
        let seg = local(1 << 20);
        let t = table();
        let huge = u64::MAX;
        for (off, len, roff) in [
            (0, huge, 0),
            (huge, 1, 0),
            (huge - 10, 20, 0),
            (0, 4096, huge),
            (0, 4096, huge - 100),
            (4096, (1 << 20) - 4095, 0),
        ] {
            let mut p = Planner::new("peer", &t, 1, 0, 1);
            match p.descs(&[Desc::new(&seg, off, R, roff, len)]) {
                Err(Error::OutOfSegment { .. }) => {}
                other => panic!("({off}, {len}, {roff}): {other:?}"),
            }
            assert!(p.runs.is_empty(), "nothing half-applied");
        }
        // Block tables: a block length of u64::MAX leaves no whole block on either side, and
        // huge bases leave none either.
        let (lb, rb) = ([0u32], [0u32]);
        for (len, lbase, rbase) in [(huge, 0, 0), (4096, huge, 0), (4096, 0, huge)] {
            let mut p = Planner::new("peer", &t, 1, 0, 1);
            let r = p.blocks(&BlockTable {
                local: &seg,
                local_base: lbase,
                remote: R,
                remote_base: rbase,
                block_len: len,
                local_blocks: &lb,
                remote_blocks: &rb,
            });
            // Said as a block outside the segment, not as "index 0 of 0".
            assert!(
                matches!(
                    r,
                    Err(Error::BlockOutOfSegment {
                        pool: 0,
                        block: 0,
                        ..
                    })
                ),
                "({len}, {lbase}, {rbase}): {r:?}"
            );
            assert!(p.runs.is_empty());
        }
    }

    #[test]
    fn every_pool_moves_the_same_blocks_merged_where_both_sides_continue() {
        // 4 pools (2 layers x K, V) of 16 blocks of 256 bytes, 4 KiB apart locally; remote
        // pools 8 KiB apart, blocks with 512-byte strides (padding between blocks).
        let seg = local(1 << 20);
        let t = table();
        let (lb, rb) = ([0u32, 1, 2, 7], [3u32, 4, 9, 10]);
        let mut table = PoolTable::new(256, &lb, &rb).strides(256, 512);
        for p in 0..4u64 {
            table = table.pool(&seg, p * 4096, R, p * 8192);
        }
        assert_eq!((table.pools(), table.blocks()), (4, 16));
        let mut p = Planner::new("peer", &t, 2, 0, 1);
        p.pools(&table).unwrap();
        let base = 0x10_0000;
        let mut want = Vec::new();
        for pool in 0..4u64 {
            let (l, r) = (pool * 4096, base + pool * 8192);
            // Remote strides are 512: no two blocks continue on the remote side.
            want.push((l, r + 3 * 512, 256));
            want.push((l + 256, r + 4 * 512, 256));
            want.push((l + 512, r + 9 * 512, 256));
            want.push((l + 7 * 256, r + 10 * 512, 256));
        }
        assert_eq!(runs(&p), want);
        assert_eq!(p.descriptors, 16);
        // Consecutive on both sides: one run per pool.
        let (lb, rb) = ([4u32, 5, 6], [0u32, 1, 2]);
        let mut table = PoolTable::new(256, &lb, &rb);
        for p in 0..2u64 {
            table = table.pool(&seg, p * 4096, R, p * 4096);
        }
        let mut p = Planner::new("peer", &t, 2, 0, 1);
        p.pools(&table).unwrap();
        assert_eq!(
            runs(&p),
            vec![(1024, base, 768), (4096 + 1024, base + 4096, 768)]
        );
    }

    #[test]
    fn a_block_outside_a_pool_names_the_pool_and_bad_tables_are_refused() {
        let seg = local(64 << 10);
        let t = table();
        let (lb, rb) = ([0u32, 15], [0u32, 1]);
        // Pool 2's local base leaves room for 8 blocks only: block 15 is outside.
        let table = PoolTable::new(1024, &lb, &rb)
            .pool(&seg, 0, R, 0)
            .pool(&seg, 16 << 10, R, 0)
            .pool(&seg, 56 << 10, R, 0);
        let mut p = Planner::new("peer", &t, 1, 0, 1);
        match p.pools(&table) {
            Err(Error::BlockOutOfSegment {
                pool: 2,
                side: crate::Side::Local,
                block: 15,
                offset,
                ..
            }) => assert_eq!(offset, (56 << 10) + 15 * 1024),
            other => panic!("{other:?}"),
        }
        // A remote base past the peer's segment, strides shorter than a block, uneven
        // arrays, a zero block length: refused.
        let mut p = Planner::new("peer", &t, 1, 0, 1);
        let far = PoolTable::new(1024, &lb, &rb).pool(&seg, 0, R, u64::MAX);
        assert!(matches!(
            p.pools(&far),
            Err(Error::BlockOutOfSegment {
                side: crate::Side::Remote,
                ..
            })
        ));
        for bad in [
            PoolTable::new(1024, &lb, &rb)
                .strides(512, 1024)
                .pool(&seg, 0, R, 0),
            PoolTable::new(1024, &lb, &rb[..1]).pool(&seg, 0, R, 0),
            PoolTable::new(0, &lb, &rb).pool(&seg, 0, R, 0),
        ] {
            let mut p = Planner::new("peer", &t, 1, 0, 1);
            assert!(
                matches!(p.pools(&bad), Err(Error::InvalidArgument { .. })),
                "{bad:?}"
            );
        }
        // No pool: nothing to move.
        let mut p = Planner::new("peer", &t, 1, 0, 1);
        p.pools(&PoolTable::new(1024, &lb, &rb)).unwrap();
        assert!(matches!(p.finish(), Err(Error::InvalidArgument { .. })));
    }

    #[test]
    fn a_block_outside_either_side_is_refused() {
        let seg = local(8 * 4096);
        let t = table();
        let table = |lb: &'static [u32], rb: &'static [u32]| BlockTable {
            local: &seg,
            local_base: 4096,
            remote: R,
            remote_base: 0,
            block_len: 4096,
            local_blocks: lb,
            remote_blocks: rb,
        };
        let mut p = Planner::new("peer", &t, 1, 0, 1);
        // 7 whole blocks after the local base: index 7 is out.
        match p.blocks(&table(&[0, 7], &[0, 1])) {
            Err(Error::IndexOutOfRange {
                index: 7, len: 7, ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let mut p = Planner::new("peer", &t, 1, 0, 1);
        match p.blocks(&table(&[0], &[256])) {
            Err(Error::IndexOutOfRange {
                index: 256,
                len: 256,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let mut p = Planner::new("peer", &t, 1, 0, 1);
        assert!(matches!(
            p.blocks(&table(&[0, 1], &[0])),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            Planner::new("peer", &t, 1, 0, 1).finish(),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
