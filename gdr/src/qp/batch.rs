//! Posting many RDMA WRITEs or READs of pieces of one local slice: the slice is checked once
//! (protection domain, access), each piece only against the slice's bounds, and the slice's
//! region is held by the last request of each doorbell rather than by every request.
//!
//! Holding the region on the last request is enough: requests of a queue pair complete and are
//! retired in order, so the last one is retired after all others (a failed one flushes the rest,
//! each with its completion), and a reset or destroy, after which the NIC touches none of them,
//! releases all. This is the per-request cost transfer engines need for block tables of 10^5
//! entries.

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
        // The list's requests and SGEs: the ring's, reused by every batch.
        let mut list = ring.list.take().unwrap_or_else(ListScratch::new);
        let wrs = list.wrs.as_mut_ptr();
        let sges = list.sges.as_mut_ptr();
        let mut done = 0usize;
        while done < pieces.len() {
            let chunk = &pieces[done..(done + LIST_CHUNK).min(pieces.len())];
            let n = chunk.len();
            let signals =
                Signals::new(ring.since_signal, signal_every, n, done + n == pieces.len());
            let head = ring.head;
            ring.stage_ids(chunk, |p| p.wr_id);
            // The region rides on the chunk's last request only (see the module docs).
            ring.mark_last(head + n as u64 - 1, signals.user_last, &local.region);
            for (i, p) in chunk.iter().enumerate() {
                // SAFETY: `i < n <= LIST_CHUNK`: inside both arrays, which nothing else refers
                // to while the ring is locked. Only the fields an RDMA request uses are written
                // (the rest stay zero from `ListScratch::new`); `next` of the last one is one
                // past the array here and set to null below.
                unsafe {
                    let sge = sges.add(i);
                    *sge = ibv::ibv_sge {
                        addr: local.addr + p.offset as u64,
                        length: p.remote.len() as u32,
                        lkey: local.lkey,
                    };
                    let wr = &mut *wrs.add(i);
                    wr.wr_id = id_base | ((head + i as u64) & crate::inflight::SEQ_MASK);
                    wr.next = wrs.add(i + 1);
                    wr.sg_list = sge;
                    wr.num_sge = 1;
                    wr.opcode = opcode;
                    wr.send_flags = 0;
                    wr.wr.rdma.remote_addr = p.remote.addr();
                    wr.wr.rdma.rkey = p.remote.rkey();
                }
            }
            // SAFETY: `n - 1` and the indexes `signals` yields are below `n` (as above).
            unsafe {
                (*wrs.add(n - 1)).next = std::ptr::null_mut();
                for i in signals.iter() {
                    (*wrs.add(i)).send_flags = ibv::ibv_send_flags::IBV_SEND_SIGNALED.0;
                }
            }
            let mut bad: *mut ibv::ibv_send_wr = std::ptr::null_mut();
            // SAFETY: the QP is valid; the n linked requests and their SGEs live across the
            // call; every SGE lies inside `local` (checked above), a region of our PD that the
            // chunk's last request keeps alive until it is retired, after every request before
            // it (in-order retirement), or until the ring is cleared when the NIC is done.
            let rc = unsafe { ibv::ibv_post_send(self.qp.as_ptr(), wrs, &mut bad) };
            if rc == 0 {
                ring.commit_many(n, signals.since_after());
                done += n;
                continue;
            }
            // The requests before `bad` were posted (a `bad` outside the chunk counts as all of
            // them: holding memory longer is always sound).
            let failed = (0..n)
                .find(|&i| std::ptr::eq(wrs.wrapping_add(i), bad))
                .unwrap_or(n);
            ring.list = Some(list);
            let signaled: Vec<bool> = (0..n).map(|i| signals.signals(i)).collect();
            ring.settle(&signaled, failed, Some(&local.region));
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
        ring.list = Some(list);
        Ok(())
    }
}

/// The requests and SGEs of one doorbell's list, kept by the send queue's ring between batches:
/// allocated zeroed once, so a batch writes only the fields an RDMA request uses (no 128-byte
/// clearing per request), and the fields it never writes stay zero for the provider to read.
pub(crate) struct ListScratch {
    wrs: [ibv::ibv_send_wr; LIST_CHUNK],
    sges: [ibv::ibv_sge; LIST_CHUNK],
}

// SAFETY: the raw pointers in the requests point into the scratch itself; they are written
// before each post and read only by that post, with the ring's lock held. Nothing in the
// scratch is shared or owned elsewhere.
unsafe impl Send for ListScratch {}

impl ListScratch {
    fn new() -> Box<ListScratch> {
        // SAFETY: every field is plain data for which all-zero bytes are valid (null pointers,
        // zero integers, unions of those).
        Box::new(unsafe { std::mem::zeroed::<ListScratch>() })
    }
}

/// Which requests of one doorbell's list are signalled: the batch's last one (the caller's), and
/// every `every`-th since the queue's last signalled request (so that the send queue never holds
/// more unsignalled requests than it can retire).
#[derive(Debug, Clone, Copy)]
struct Signals {
    /// The index of the first periodic signal.
    first: u64,
    every: u64,
    n: usize,
    /// Whether the list's last request is the batch's last (signalled for the caller).
    user_last: bool,
    since: u32,
}

impl Signals {
    /// For a list of `n` requests posted when `since` unsignalled requests follow the last
    /// signalled one (`every >= 1`).
    fn new(since: u32, every: u64, n: usize, user_last: bool) -> Signals {
        let every = every.max(1);
        Signals {
            first: every.saturating_sub(u64::from(since) + 1),
            every,
            n,
            user_last,
            since,
        }
    }

    /// Whether request `i` of the list is signalled (what [`Ring::signal_due`] says for each
    /// request in turn).
    ///
    /// [`Ring::signal_due`]: crate::inflight::Ring::signal_due
    fn signals(&self, i: usize) -> bool {
        let i64 = i as u64;
        (self.user_last && i + 1 == self.n)
            || (i64 >= self.first && (i64 - self.first).is_multiple_of(self.every))
    }

    /// The signalled requests' indexes, in order.
    fn iter(self) -> impl Iterator<Item = usize> {
        let periodic = (self.first..self.n as u64)
            .step_by(self.every.min(usize::MAX as u64) as usize)
            .map(|i| i as usize);
        let last = (self.user_last && self.n > 0).then(|| self.n - 1);
        periodic.chain(last)
    }

    /// The unsignalled requests after the last signalled one once the list is posted.
    fn since_after(&self) -> u32 {
        match (0..self.n).rev().find(|&i| self.signals(i)) {
            Some(last) => (self.n - 1 - last) as u32,
            None => self.since + self.n as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Signals;

    /// The list's signals are exactly those of the rule applied request by request: a request
    /// is signalled when `since + 1 >= every`, or when it is the batch's last.
    #[test]
    fn signals_match_the_per_request_rule() {
        for every in 1..=9u64 {
            for since in 0..every as u32 {
                for n in 1..=20usize {
                    for user_last in [false, true] {
                        let s = Signals::new(since, every, n, user_last);
                        let mut run = since;
                        let mut want = Vec::new();
                        for i in 0..n {
                            let sig = (user_last && i + 1 == n) || u64::from(run) + 1 >= every;
                            run = if sig { 0 } else { run + 1 };
                            want.push(sig);
                            assert_eq!(
                                s.signals(i),
                                sig,
                                "every={every} since={since} n={n} i={i}"
                            );
                        }
                        let got: Vec<usize> = s.iter().collect();
                        let want_idx: Vec<usize> = (0..n).filter(|&i| want[i]).collect();
                        let mut dedup = got.clone();
                        dedup.dedup();
                        assert_eq!(dedup, want_idx, "every={every} since={since} n={n}");
                        assert_eq!(s.since_after(), run, "every={every} since={since} n={n}");
                    }
                }
            }
        }
    }
}
