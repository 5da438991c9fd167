//! Posting many RDMA WRITEs or READs of pieces of one local slice: the slice is checked once
//! (protection domain, access), each piece only against the slice's bounds, and the slice's
//! region is held by the last request of each doorbell rather than by every request.
//!
//! Holding the region on the last request is enough: requests of a queue pair complete and are
//! retired in order, so the last one is retired after all others (a failed one flushes the rest,
//! each with its completion), and a reset or destroy, after which the NIC touches none of them,
//! releases all. This is the per-request cost transfer engines need for block tables of 10^5
//! entries.

use std::mem::MaybeUninit;

use gdr_sys::ibv;

use super::{QueuePair, WorkQueue, LIST_CHUNK};
use crate::error::{Error, Result};
use crate::inflight::{lock, queue_full};
use crate::mr::{AccessFlags, LocalSlice, RemoteSlice};

/// The operation of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOp {
    /// RDMA WRITE: local bytes into the peer's memory.
    Write,
    /// RDMA READ: the peer's bytes into local memory (the local slice needs LOCAL_WRITE).
    Read,
}

/// One request of a batch: `remote.len()` bytes at `offset` of the batch's local slice, to or
/// from `remote`, reported as `wr_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaPiece {
    /// Offset in the batch's local slice.
    pub offset: usize,
    /// The peer's side; its length is the piece's length (at most 4 GiB - 1).
    pub remote: RemoteSlice,
    /// The id its completion carries.
    pub wr_id: u64,
}

impl QueuePair {
    /// Posts one RDMA WRITE (or READ) per piece, in order, with one doorbell per
    /// [`LIST_CHUNK`] pieces; only the last piece is signalled (gdr adds the periodic signals
    /// the send queue needs). Every piece is checked before anything is posted, and the send
    /// queue must have room for all of them: a check failure posts nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a piece outside `local`, an empty piece or one of 4 GiB or
    /// more; [`Error::ForeignRegion`] for a slice of another protection domain,
    /// [`Error::MissingAccess`] for a READ into a slice without LOCAL_WRITE; or
    /// [`Error::QpNotReady`], [`Error::QueueFull`]; [`Error::Verbs`] when
    /// the provider refuses a request (those before it were posted and complete as usual; the
    /// error says how many).
    pub fn post_rdma_batch(
        &self,
        op: BatchOp,
        local: &LocalSlice,
        pieces: &[RdmaPiece],
    ) -> Result<()> {
        if local.pd != std::sync::Arc::as_ptr(self.pd()) as usize {
            return Err(Error::ForeignRegion {
                call: "post_rdma_batch",
                hint: "register the memory with the queue pair's protection domain".into(),
            });
        }
        if op == BatchOp::Read && !local.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(Error::MissingAccess {
                call: "post_rdma_batch",
                needed: AccessFlags::LOCAL_WRITE,
                have: local.access,
                hint: "register it with AccessFlags::LOCAL_WRITE".into(),
            });
        }
        for (i, p) in pieces.iter().enumerate() {
            let len = p.remote.len();
            let inside = (p.offset as u64)
                .checked_add(len)
                .is_some_and(|end| end <= local.len as u64);
            if len == 0 || len > u64::from(u32::MAX) || !inside {
                return Err(Error::invalid(
                    format!(
                        "post_rdma_batch: piece {i}: {len} bytes at offset {} of a {}-byte local slice",
                        p.offset, local.len
                    ),
                    "pieces must be non-empty, under 4 GiB, and inside the local slice",
                ));
            }
        }
        let mut ring = lock(&self.inflight.send);
        self.not_ready(&ring, WorkQueue::Send)?;
        if pieces.is_empty() {
            return Ok(());
        }
        if pieces.len() as u64 > ring.free() {
            return Err(queue_full(&ring, self.qp_num(), pieces.len()));
        }
        let opcode = match op {
            BatchOp::Write => ibv::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            BatchOp::Read => ibv::ibv_wr_opcode::IBV_WR_RDMA_READ,
        };
        // Per batch, not per request: the signalling period and the incarnation's id bits.
        let signal_every = ring.signal_every();
        let id_base = ring.id_base();
        let mut done = 0usize;
        while done < pieces.len() {
            let chunk = &pieces[done..(done + LIST_CHUNK).min(pieces.len())];
            let last_of_batch = done + chunk.len() == pieces.len();
            let mut wrs = [const { MaybeUninit::<ibv::ibv_send_wr>::uninit() }; LIST_CHUNK];
            let mut sges = [const { MaybeUninit::<ibv::ibv_sge>::uninit() }; LIST_CHUNK];
            let mut signaled = [false; LIST_CHUNK];
            let mut since = ring.since_signal;
            let n = chunk.len();
            for (i, p) in chunk.iter().enumerate() {
                let user_signaled = last_of_batch && i + 1 == n;
                let sig = user_signaled || u64::from(since) + 1 >= signal_every;
                since = if sig { 0 } else { since + 1 };
                // The region rides on the chunk's last request only (see the module docs).
                let holds = i + 1 == n;
                let seq = ring.stage(
                    i as u64,
                    p.wr_id,
                    user_signaled,
                    holds.then_some(&local.region).into_iter(),
                );
                sges[i].write(ibv::ibv_sge {
                    addr: local.addr + p.offset as u64,
                    length: p.remote.len() as u32,
                    lkey: local.lkey,
                });
                // Built in place (no 128-byte copy per request).
                // SAFETY: plain old data (null `next`, zero flags).
                let wr = wrs[i].write(unsafe { std::mem::zeroed::<ibv::ibv_send_wr>() });
                wr.wr_id = id_base | (seq & crate::inflight::SEQ_MASK);
                wr.sg_list = sges[i].as_mut_ptr();
                wr.num_sge = 1;
                wr.opcode = opcode;
                wr.send_flags = if sig {
                    ibv::ibv_send_flags::IBV_SEND_SIGNALED.0
                } else {
                    0
                };
                wr.wr.rdma.remote_addr = p.remote.addr();
                wr.wr.rdma.rkey = p.remote.rkey();
                signaled[i] = sig;
            }
            for i in 1..n {
                // SAFETY: entries 0..n were initialised above; `wrs` outlives the post below.
                unsafe { (*wrs[i - 1].as_mut_ptr()).next = wrs[i].as_mut_ptr() };
            }
            let mut bad: *mut ibv::ibv_send_wr = std::ptr::null_mut();
            // SAFETY: the QP is valid; the n linked requests and their SGEs live across the
            // call; every SGE lies inside `local` (checked above), a region of our PD that the
            // chunk's last request keeps alive until it is retired, after every request before
            // it (in-order retirement), or until the ring is cleared when the NIC is done.
            let rc = unsafe { ibv::ibv_post_send(self.qp.as_ptr(), wrs[0].as_mut_ptr(), &mut bad) };
            if rc == 0 {
                ring.commit_many(n, since);
                done += n;
                continue;
            }
            // The requests before `bad` were posted (a `bad` outside the chunk counts as all of
            // them: holding memory longer is always sound).
            let failed = (0..n)
                .find(|&i| std::ptr::eq(wrs[i].as_ptr(), bad))
                .unwrap_or(n);
            ring.settle(&signaled[..n], failed, Some(&local.region));
            drop(ring);
            let err = self.post_error(
                match op {
                    BatchOp::Write => crate::wr::Operation::Write,
                    BatchOp::Read => crate::wr::Operation::Read,
                },
                chunk
                    .get(failed.min(n - 1))
                    .map_or(0, |p| p.remote.len() as usize),
                rc,
                done + failed,
                pieces.len(),
            );
            return Err(err);
        }
        Ok(())
    }
}
