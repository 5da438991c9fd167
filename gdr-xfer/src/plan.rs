//! Turning what the caller asked for into runs: every descriptor checked against both segment
//! tables, descriptors contiguous on both sides merged, before anything is posted.

use std::collections::HashMap;
use std::sync::Arc;

use crate::descriptor::{check_local, BlockTable, Desc, LocalList, RemoteList};
use crate::error::{Error, Result};
use crate::segment::SegmentInner;
use crate::transfer::Run;
use crate::wire::SegmentInfo;

/// The checked, merged form of a transfer.
pub(crate) struct Plan {
    pub(crate) locals: Vec<Arc<SegmentInner>>,
    /// Remote keys of the remote segments the runs name, `rails` per segment.
    pub(crate) rkeys: Vec<u32>,
    pub(crate) runs: Vec<Run>,
    pub(crate) descriptors: u64,
}

/// Builds a plan: distinct local segments by identity, runs merged as they are pushed.
pub(crate) struct Planner<'t> {
    peer: &'t str,
    table: &'t HashMap<u32, SegmentInfo>,
    /// Rails shared with the peer (remote keys kept per remote segment).
    rails: usize,
    locals: Vec<Arc<SegmentInner>>,
    last_local: usize,
    /// Remote segment id -> its index in the plan.
    remote_ids: HashMap<u32, u32>,
    rkeys: Vec<u32>,
    last_remote: Option<(u32, u64, u64, u32)>,
    runs: Vec<Run>,
    descriptors: u64,
}

impl<'t> Planner<'t> {
    pub(crate) fn new(
        peer: &'t str,
        table: &'t HashMap<u32, SegmentInfo>,
        rails: usize,
        capacity: usize,
    ) -> Self {
        Planner {
            peer,
            table,
            rails: rails.max(1),
            locals: Vec::new(),
            last_local: usize::MAX,
            remote_ids: HashMap::new(),
            rkeys: Vec::new(),
            last_remote: None,
            runs: Vec::with_capacity(capacity),
            descriptors: 0,
        }
    }

    /// The index of a local segment in the plan (added on first use).
    fn local(&mut self, seg: &Arc<SegmentInner>) -> u32 {
        if self.last_local < self.locals.len() && Arc::ptr_eq(&self.locals[self.last_local], seg) {
            return self.last_local as u32;
        }
        let i = match self.locals.iter().position(|p| Arc::ptr_eq(p, seg)) {
            Some(i) => i,
            None => {
                self.locals.push(seg.clone());
                self.locals.len() - 1
            }
        };
        self.last_local = i;
        i as u32
    }

    /// (address, length, index in the plan's remote segments) of a remote segment.
    fn remote(&mut self, id: u32) -> Result<(u64, u64, u32)> {
        if let Some((rid, addr, len, idx)) = self.last_remote {
            if rid == id {
                return Ok((addr, len, idx));
            }
        }
        let s = self.table.get(&id).ok_or_else(|| Error::UnknownSegment {
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

    fn check_remote(index: usize, segment: u32, seg_len: u64, offset: u64, len: u64) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > seg_len) {
            return Err(Error::OutOfSegment {
                index,
                side: "remote",
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
            check_local(i, d.local, d.local_offset, d.len)?;
            let (addr, seg_len, remote) = self.remote(d.remote)?;
            Self::check_remote(i, d.remote, seg_len, d.remote_offset, d.len)?;
            let l = self.local(&d.local.inner);
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
        let l = self.local(&t.local.inner);
        self.runs.reserve(t.local_blocks.len());
        let (len, local_base, remote_base) = (t.block_len, t.local_base, addr + t.remote_base);
        for (&lb, &rb) in t.local_blocks.iter().zip(t.remote_blocks) {
            if u64::from(lb) >= local_blocks {
                return Err(Error::IndexOutOfRange {
                    list: "local blocks",
                    index: u64::from(lb),
                    len: local_blocks,
                });
            }
            if u64::from(rb) >= remote_blocks {
                return Err(Error::IndexOutOfRange {
                    list: "remote blocks",
                    index: u64::from(rb),
                    len: remote_blocks,
                });
            }
            // In range, so neither product overflows: both are below the segment lengths.
            let local_offset = local_base + u64::from(lb) * len;
            let remote_addr = remote_base + u64::from(rb) * len;
            // The same merge rule as `push`, for one segment pair: a block continuing the last
            // run on both sides extends it.
            if let Some(last) = self.runs.last_mut() {
                if last.local == l
                    && last.remote == remote
                    && last.local_offset + last.len == local_offset
                    && last.remote_addr + last.len == remote_addr
                {
                    last.len += len;
                    continue;
                }
            }
            self.runs.push(Run {
                local: l,
                local_offset,
                remote_addr,
                remote,
                len,
            });
        }
        self.descriptors += t.local_blocks.len() as u64;
        Ok(())
    }

    /// Adds pairs of indices into prepared lists.
    pub(crate) fn indexed(
        &mut self,
        local: &LocalList,
        local_idx: &[u32],
        remote: &RemoteList,
        remote_idx: &[u32],
    ) -> Result<()> {
        if remote.peer != self.peer {
            return Err(Error::invalid(
                format!(
                    "remote list prepared for {:?} used with {:?}",
                    remote.peer, self.peer
                ),
                "prepare one remote list per peer",
            ));
        }
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
            let l = self.local(seg);
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
