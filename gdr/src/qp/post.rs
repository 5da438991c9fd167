//! Posting: every check first, then the provider, and a conservative reading of its failures.
//!
//! A request counts as posted unless the provider says exactly this request was not taken
//! (`bad_wr` points at it). rxe, for one, queues requests in user space and then rings a doorbell
//! that can fail with `bad_wr == NULL`: the requests are queued and may run once the queue pair
//! can send. Such requests keep their regions alive until their completion is reaped or the queue
//! pair is reset or destroyed, and their completions are reported under their own ids.

use std::mem::MaybeUninit;
use std::sync::Arc;

use gdr_sys::ibv;

use super::{QpState, QueuePair, WorkQueue, LIST_CHUNK, LIST_SGES, MAX_SGE};
use crate::error::{Error, Hint, Result};
use crate::inflight::{lock, queue_full, Ring};
use crate::mr::{AccessFlags, LocalSlice, MemoryKind};
use crate::wr::{Data, Operation, RecvRequest, SendRequest};

impl QueuePair {
    fn check_slices(
        &self,
        what: &'static str,
        slices: &[LocalSlice],
        max: u32,
        need_write: bool,
    ) -> Result<()> {
        if slices.len() > max as usize {
            return Err(Error::invalid(
                format!(
                    "{what}: {} scatter/gather entries, the queue pair allows {max}",
                    slices.len()
                ),
                "raise max_send_sge/max_recv_sge in the builder",
            ));
        }
        for s in slices {
            if s.pd != Arc::as_ptr(&self.pd) as usize {
                return Err(Error::ForeignRegion {
                    call: what,
                    hint: "register the memory with the queue pair's protection domain".into(),
                });
            }
            if s.len > u32::MAX as usize {
                return Err(Error::invalid(
                    format!("{what}: slice of {} bytes exceeds 4 GiB per SGE", s.len),
                    Hint::NONE,
                ));
            }
            if need_write && !s.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(Error::MissingAccess {
                    call: what,
                    needed: AccessFlags::LOCAL_WRITE,
                    have: s.access,
                    hint: "register it with AccessFlags::LOCAL_WRITE".into(),
                });
            }
        }
        Ok(())
    }

    pub(super) fn check_send(&self, req: &SendRequest<'_>) -> Result<()> {
        let op = req.op;
        let total = req.data_len() as u64;
        match req.data {
            Data::Slices(s) => {
                self.check_slices("post_send", s, self.cfg.max_send_sge, op.writes_local())?;
                if req.inline {
                    if let Some(g) = s
                        .iter()
                        .find(|s| matches!(s.kind(), MemoryKind::Gpu { .. }))
                    {
                        return Err(Error::invalid(
                            format!("inline {op:?} from GPU memory ({:?}): the CPU would have to read device memory", g.kind()),
                            "post it without .inline(); the NIC reads GPU memory directly",
                        ));
                    }
                }
            }
            Data::Inline(_) if op.writes_local() => {
                return Err(Error::invalid(
                    format!("{op:?} cannot be inline: the NIC writes its local buffer"),
                    Hint::NONE,
                ));
            }
            Data::Inline(_) => {}
        }
        if req.inline {
            if op.writes_local() {
                return Err(Error::invalid(
                    format!("{op:?} cannot be inline"),
                    Hint::NONE,
                ));
            }
            if total > u64::from(self.cfg.max_inline_data) {
                return Err(Error::invalid(
                    format!(
                        "inline data of {total} bytes exceeds the queue pair's max_inline_data={}",
                        self.cfg.max_inline_data
                    ),
                    "raise max_inline_data in the builder or post from a registered region",
                ));
            }
        }
        match (op.has_remote(), req.remote) {
            (true, None) => {
                return Err(Error::invalid(
                    format!("{op:?} needs a remote slice"),
                    Hint::NONE,
                ))
            }
            (true, Some(r)) => {
                if op.is_atomic() {
                    if total != 8 || r.len() != 8 {
                        return Err(Error::invalid(
                            format!("atomic {op:?}: local {total} bytes, remote {} bytes; both must be exactly 8", r.len()),
                            Hint::NONE,
                        ));
                    }
                    if !r.addr().is_multiple_of(8) {
                        return Err(Error::invalid(
                            format!(
                                "atomic {op:?}: remote address {:#x} is not 8-byte aligned",
                                r.addr()
                            ),
                            Hint::NONE,
                        ));
                    }
                } else if r.len() != total {
                    return Err(Error::invalid(
                        format!(
                            "{op:?}: local data is {total} bytes but the remote slice is {} bytes",
                            r.len()
                        ),
                        "slice both sides to the same length",
                    ));
                }
            }
            (false, _) => {}
        }
        Ok(())
    }

    /// The error for a post the tracked state does not allow; `None` when it does.
    pub(super) fn not_ready(&self, ring: &Ring, queue: WorkQueue) -> Result<()> {
        let ok = match queue {
            WorkQueue::Send => ring.state.can_send(),
            WorkQueue::Recv => ring.state.can_receive(),
        };
        if ok {
            return Ok(());
        }
        Err(Error::QpNotReady {
            qp_num: self.qp_num(),
            queue,
            state: ring.state,
            hint: Hint::new(match (queue, ring.state) {
                (_, QpState::Error) => "the queue pair was disconnected: reset() it and connect() again",
                (WorkQueue::Send, _) => "send-queue requests need the queue pair connected (connect() or a handshake first)",
                (WorkQueue::Recv, _) => "receives need the queue pair in INIT, RTR or RTS",
            }),
        })
    }

    /// Posts one send-queue request after checking it (bounds were checked when the slices were
    /// made; here: the queue pair's state, protection domain, SGE count, access flags, lengths,
    /// alignment, inline limits, GPU memory never inline). The regions stay alive until the
    /// completion is reaped.
    ///
    /// # Errors
    /// A check failure ([`Error::ForeignRegion`], [`Error::MissingAccess`],
    /// [`Error::InvalidArgument`]), [`Error::QpNotReady`] before `connect`, [`Error::QueueFull`]:
    /// nothing was posted. [`Error::Verbs`] from `ibv_post_send`: the request was not posted if the provider
    /// said so; otherwise (a failed doorbell) it counts as posted and its completion, if the
    /// device runs it, is reported as usual.
    pub fn post_send(&self, req: &SendRequest<'_>) -> Result<()> {
        self.post_send_one::<false>(req).1
    }

    /// [`QueuePair::post_send`] for the async layer: the request is marked as its own (its
    /// completion is routed by that mark, not by its id). Returns whether the request counts as
    /// posted (it may, with an error: a failed doorbell) and the outcome.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn post_send_owned(&self, req: &SendRequest<'_>) -> (bool, Result<()>) {
        self.post_send_one::<true>(req)
    }

    #[inline]
    fn post_send_one<const OWNED: bool>(&self, req: &SendRequest<'_>) -> (bool, Result<()>) {
        // One request: the same steps as a list, without the list's bookkeeping (this is the
        // latency path).
        if let Err(e) = self.check_send(req) {
            return (false, Err(e));
        }
        let mut ring = lock(&self.inflight.send);
        if let Err(e) = self.not_ready(&ring, WorkQueue::Send) {
            return (false, Err(e));
        }
        if ring.free() == 0 {
            return (false, Err(queue_full(&ring, self.qp_num(), 1)));
        }
        let mut sges = [const { MaybeUninit::<ibv::ibv_sge>::uninit() }; MAX_SGE];
        let sig = req.signaled || ring.signal_due(ring.since_signal);
        let (seq, num_sge) = stage_one(&mut ring, 0, req, &mut sges);
        if OWNED {
            ring.mark_owned(seq);
        }
        let mut wr = send_wr(
            req,
            ring.provider_id(seq),
            sig,
            sges[0].as_mut_ptr(),
            num_sge,
        );
        // SAFETY: `wr` (with a null `next`) and its SGEs live across the call; every SGE lies
        // inside a registered region of our PD that the ring now keeps alive, or is inline data
        // the provider copies during the call.
        unsafe { self.post_staged(ring, &mut wr, seq, sig, req.op, req.data_len()) }
    }

    /// Rings the doorbell for the one request `wr` just staged in `ring` as sequence number
    /// `seq`: commits it unless the provider reports exactly this request as not posted (then
    /// it is unstaged). Returns whether it was committed (it may be, with an error: a failed
    /// doorbell) and the outcome. `op` and `bytes` only feed the error message.
    ///
    /// # Safety
    /// `wr.next` is null, and every scatter/gather entry of `wr` lies inside a registered region
    /// of this queue pair's protection domain that stays alive until the request's completion is
    /// reaped (or the queue pair is reset), or is inline data valid during the call.
    pub(super) unsafe fn post_staged(
        &self,
        mut ring: std::sync::MutexGuard<'_, Ring>,
        wr: &mut ibv::ibv_send_wr,
        seq: u64,
        signaled: bool,
        op: Operation,
        bytes: usize,
    ) -> (bool, Result<()>) {
        let mut bad: *mut ibv::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is valid for `self`'s lifetime; the request's memory is the caller's
        // contract.
        let rc = unsafe { ibv::ibv_post_send(self.qp.as_ptr(), wr, &mut bad) };
        if rc == 0 {
            ring.commit(signaled);
            return (true, Ok(()));
        }
        let refused = std::ptr::eq(bad, wr);
        if refused {
            ring.unstage(seq);
        } else {
            // The provider may have queued it (a failed doorbell): it stays in flight.
            ring.commit(signaled);
        }
        drop(ring);
        (
            !refused,
            Err(self.post_error(op, bytes, rc, if refused { 0 } else { 1 }, 1)),
        )
    }

    /// Posts several send-queue requests with one doorbell per [`LIST_CHUNK`] requests (one
    /// `ibv_post_send` call with a linked list), in order. Every request is checked as in
    /// [`QueuePair::post_send`], and the send queue must have room for all of them, before any
    /// is posted: a check failure posts nothing.
    ///
    /// Posting a list costs the CPU and the NIC less than posting its requests one by one (one
    /// doorbell write instead of one per request; on Soft-RoCE one system call instead of one per
    /// request). If the provider itself refuses a request, the ones before it were posted and
    /// complete as usual; the error says how many.
    pub fn post_send_list(&self, reqs: &[SendRequest<'_>]) -> Result<()> {
        if let [one] = reqs {
            return self.post_send(one);
        }
        for req in reqs {
            self.check_send(req)?;
        }
        let mut ring = lock(&self.inflight.send);
        if reqs.is_empty() {
            return Ok(());
        }
        self.not_ready(&ring, WorkQueue::Send)?;
        if reqs.len() as u64 > ring.free() {
            return Err(queue_full(&ring, self.qp_num(), reqs.len()));
        }
        let mut done = 0;
        while done < reqs.len() {
            done += self.post_chunk(&mut ring, &reqs[done..], done, reqs.len())?;
        }
        Ok(())
    }

    /// Posts the longest prefix of `reqs` that fits one call (at most [`LIST_CHUNK`] requests
    /// and [`LIST_SGES`] scatter/gather entries; at least one request); returns its length.
    /// `before` and `total` only feed the error message.
    fn post_chunk(
        &self,
        ring: &mut Ring,
        reqs: &[SendRequest<'_>],
        before: usize,
        total: usize,
    ) -> Result<usize> {
        let mut wrs = [const { MaybeUninit::<ibv::ibv_send_wr>::uninit() }; LIST_CHUNK];
        let mut sges = [const { MaybeUninit::<ibv::ibv_sge>::uninit() }; LIST_SGES];
        let mut signaled = [false; LIST_CHUNK];
        let (mut n, mut used) = (0usize, 0usize);
        let mut since = ring.since_signal;
        for req in reqs {
            // Entries `write_sges` fills: one per slice, one for inline data.
            let k = match req.data {
                Data::Slices(s) => s.len(),
                Data::Inline(_) => 1,
            };
            if n == LIST_CHUNK || used + k > LIST_SGES {
                break;
            }
            let sig = req.signaled || ring.signal_due(since);
            since = if sig { 0 } else { since + 1 };
            let (seq, num_sge) = stage_one(ring, n as u64, req, &mut sges[used..used + k]);
            // A request without data (a zero-byte write with immediate) may come after the last
            // entry is used: it gets no entry pointer at all.
            let at = if num_sge == 0 {
                std::ptr::null_mut()
            } else {
                sges[used].as_mut_ptr()
            };
            wrs[n].write(send_wr(req, ring.provider_id(seq), sig, at, num_sge));
            signaled[n] = sig;
            n += 1;
            used += k;
        }
        let base = wrs[0].as_mut_ptr();
        for i in 1..n {
            // SAFETY: entries 0..n were initialised above; `wrs` outlives the post below.
            unsafe { (*wrs[i - 1].as_mut_ptr()).next = wrs[i].as_mut_ptr() };
        }
        let mut bad: *mut ibv::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is valid; the n linked requests (entries 0..n, the last one's `next` is
        // null) and their SGEs live across the call; every SGE lies inside a registered region
        // of our PD that the ring now keeps alive; inline data is copied during the call.
        let rc = unsafe { ibv::ibv_post_send(self.qp.as_ptr(), base, &mut bad) };
        if rc == 0 {
            for &sig in &signaled[..n] {
                ring.commit(sig);
            }
            return Ok(n);
        }
        // The requests before `bad` were posted. A `bad` outside the list (a provider that does
        // not set it, or a failed doorbell) counts as "all posted": keeping regions alive longer
        // is always sound.
        let failed = (0..n)
            .find(|&i| std::ptr::eq(wrs[i].as_ptr(), bad))
            .unwrap_or(n);
        for &sig in &signaled[..failed] {
            ring.commit(sig);
        }
        for i in failed..n {
            ring.unstage(ring.head + (i - failed) as u64);
        }
        let req = &reqs[failed.min(n - 1)];
        Err(self.post_error(req.op, req.data_len(), rc, before + failed, total))
    }

    /// The error of a refused `ibv_post_send` of `op` with `bytes` of data: `posted` of `total`
    /// requests went out before it.
    pub(super) fn post_error(
        &self,
        op: Operation,
        bytes: usize,
        rc: i32,
        posted: usize,
        total: usize,
    ) -> Error {
        let state = self
            .state()
            .map(|s| format!("{s:?}"))
            .unwrap_or_else(|_| "unknown".into());
        let which = if total == 1 {
            if posted == 1 {
                ", the provider may have queued it: it counts as posted".to_string()
            } else {
                String::new()
            }
        } else {
            format!(
                ", request {} of {total} refused, {posted} posted",
                posted + 1
            )
        };
        let errno = crate::return_code::errno_of(rc);
        Error::verbs(
            "ibv_post_send",
            format!("qpn={:#x}, op={op:?}, bytes={bytes}, state={state}{which}", self.qp_num()),
            errno,
            match errno {
                libc::EINVAL => "sends need the QP in RTS (connect() first; reset() after an error), and values within the QP's caps",
                libc::ENOMEM => "the device's send queue is full: poll completions before posting more",
                _ => "see ibv_post_send(3)",
            },
        )
    }

    /// Posts one receive request; its slices need LOCAL_WRITE.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`]: nothing is posted on a check failure, [`Error::QpNotReady`]
    /// (RESET, or after `disconnect`) or [`Error::QueueFull`].
    pub fn post_recv(&self, req: &RecvRequest<'_>) -> Result<()> {
        self.post_recv_one::<false>(req).1
    }

    /// [`QueuePair::post_recv`] for the async layer (see [`QueuePair::post_send_owned`]).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn post_recv_owned(&self, req: &RecvRequest<'_>) -> (bool, Result<()>) {
        self.post_recv_one::<true>(req)
    }

    #[inline]
    fn post_recv_one<const OWNED: bool>(&self, req: &RecvRequest<'_>) -> (bool, Result<()>) {
        if let Err(e) = self.check_slices("post_recv", req.local, self.cfg.max_recv_sge, true) {
            return (false, Err(e));
        }
        let mut ring = lock(&self.inflight.recv);
        if let Err(e) = self.not_ready(&ring, WorkQueue::Recv) {
            return (false, Err(e));
        }
        if ring.free() == 0 {
            return (false, Err(queue_full(&ring, self.qp_num(), 1)));
        }
        let mut sges = [const { MaybeUninit::<ibv::ibv_sge>::uninit() }; MAX_SGE];
        for (g, s) in sges.iter_mut().zip(req.local) {
            g.write(sge(s));
        }
        let seq = ring.stage(0, req.wr_id, true, req.local.iter().map(|s| &s.region));
        if OWNED {
            ring.mark_owned(seq);
        }
        // SAFETY: plain old data.
        let mut wr: ibv::ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = ring.provider_id(seq);
        wr.sg_list = if req.local.is_empty() {
            std::ptr::null_mut()
        } else {
            sges[0].as_mut_ptr()
        };
        wr.num_sge = req.local.len() as i32;
        let mut bad: *mut ibv::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: valid QP; `wr` and the initialised `sges` live across the call; the regions are
        // kept alive by the ring.
        let rc = unsafe { ibv::ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc == 0 {
            ring.commit(true);
            return (true, Ok(()));
        }
        let refused = std::ptr::eq(bad, &wr);
        if refused {
            ring.unstage(seq);
        } else {
            ring.commit(true);
        }
        drop(ring);
        let errno = crate::return_code::errno_of(rc);
        let e = Error::verbs(
            "ibv_post_recv",
            format!(
                "qpn={:#x}, sges={}{}",
                self.qp_num(),
                req.local.len(),
                if refused {
                    ""
                } else {
                    ", the provider may have queued it: it counts as posted"
                }
            ),
            errno,
            "receives can be posted from INIT on, within max_recv_wr and max_recv_sge",
        );
        (!refused, Err(e))
    }
}

/// The provider's scatter/gather entry for `s`.
pub(super) fn sge(s: &LocalSlice) -> ibv::ibv_sge {
    ibv::ibv_sge {
        addr: s.addr(),
        length: s.len as u32,
        lkey: s.lkey(),
    }
}

/// Writes `req`'s scatter/gather entries into `sges` (which has room for them); returns the
/// slices whose regions the request uses and the entry count the provider gets (0 for a request
/// without data, e.g. a zero-byte write with immediate).
pub(super) fn write_sges<'r>(
    req: &SendRequest<'r>,
    sges: &mut [MaybeUninit<ibv::ibv_sge>],
) -> (&'r [LocalSlice], usize) {
    let (slices, k): (&'r [LocalSlice], usize) = match req.data {
        Data::Slices(s) => {
            for (g, s) in sges.iter_mut().zip(s) {
                g.write(sge(s));
            }
            (s, s.len())
        }
        Data::Inline(b) => {
            sges[0].write(ibv::ibv_sge {
                addr: b.as_ptr() as u64,
                length: b.len() as u32,
                lkey: 0,
            });
            (&[], 1)
        }
    };
    (slices, if req.data_len() == 0 { 0 } else { k })
}

/// Writes `req`'s scatter/gather entries into `sges` (which has room for them) and stages it in
/// the ring as the `ahead`-th request of the post; returns its sequence number and SGE count.
pub(super) fn stage_one(
    ring: &mut Ring,
    ahead: u64,
    req: &SendRequest<'_>,
    sges: &mut [MaybeUninit<ibv::ibv_sge>],
) -> (u64, usize) {
    let (slices, num_sge) = write_sges(req, sges);
    let seq = ring.stage(
        ahead,
        req.wr_id,
        req.signaled,
        slices.iter().map(|s| &s.region),
    );
    (seq, num_sge)
}

/// The provider's form of `req`, with provider id `id` and `num_sge` entries at `sges` (null
/// when there are none).
pub(super) fn send_wr(
    req: &SendRequest<'_>,
    id: u64,
    signaled: bool,
    sges: *mut ibv::ibv_sge,
    num_sge: usize,
) -> ibv::ibv_send_wr {
    // SAFETY: plain old data (null `next`, zero flags).
    let mut wr: ibv::ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = id;
    wr.sg_list = if num_sge == 0 {
        std::ptr::null_mut()
    } else {
        sges
    };
    wr.num_sge = num_sge as i32;
    let mut flags = 0u32;
    if signaled {
        flags |= ibv::ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if req.fence {
        flags |= ibv::ibv_send_flags::IBV_SEND_FENCE.0;
    }
    if req.solicited {
        flags |= ibv::ibv_send_flags::IBV_SEND_SOLICITED.0;
    }
    if req.inline {
        flags |= ibv::ibv_send_flags::IBV_SEND_INLINE.0;
    }
    wr.send_flags = flags;
    use ibv::ibv_wr_opcode::*;
    let (opcode, imm) = match req.op {
        Operation::Write => (IBV_WR_RDMA_WRITE, None),
        Operation::WriteWithImm(i) => (IBV_WR_RDMA_WRITE_WITH_IMM, Some(i)),
        Operation::Read => (IBV_WR_RDMA_READ, None),
        Operation::Send => (IBV_WR_SEND, None),
        Operation::SendWithImm(i) => (IBV_WR_SEND_WITH_IMM, Some(i)),
        Operation::CompareSwap { .. } => (IBV_WR_ATOMIC_CMP_AND_SWP, None),
        Operation::FetchAdd { .. } => (IBV_WR_ATOMIC_FETCH_AND_ADD, None),
    };
    wr.opcode = opcode;
    if let Some(i) = imm {
        wr.imm_data_invalidated_rkey_union.imm_data = i.to_be();
    }
    if let Some(r) = req.remote {
        match req.op {
            Operation::CompareSwap { compare, swap } => {
                wr.wr.atomic = ibv::atomic_t {
                    remote_addr: r.addr(),
                    compare_add: compare,
                    swap,
                    rkey: r.rkey(),
                };
            }
            Operation::FetchAdd { add } => {
                wr.wr.atomic = ibv::atomic_t {
                    remote_addr: r.addr(),
                    compare_add: add,
                    swap: 0,
                    rkey: r.rkey(),
                };
            }
            _ => {
                wr.wr.rdma = ibv::rdma_t {
                    remote_addr: r.addr(),
                    rkey: r.rkey(),
                }
            }
        }
    }
    wr
}
