//! Prepared send requests: checked once, posted many times.
//!
//! A loop that posts the same request again and again (a latency ping-pong, a proxy forwarding
//! fixed-size blocks) pays [`QueuePair::post_send`]'s checks and the translation into the
//! provider's `ibv_send_wr` on every post. [`QueuePair::prepare`] does both once; each
//! [`PreparedSend::post`] then only takes a send-queue slot and rings the doorbell. What may
//! change between posts is what such loops change: the id, whether the request is signalled, the
//! immediate value and the bytes of an inline request.

use std::mem::MaybeUninit;
use std::sync::Arc;

use gdr_sys::ibv;

use super::post::{send_wr, write_sges};
use super::{QueuePair, WorkQueue, MAX_SGE};
use crate::error::{Error, Hint, Result};
use crate::inflight::{lock, queue_full};
use crate::mr::Registered;
use crate::wr::{Data, Operation, SendRequest};

/// A send request checked once by [`QueuePair::prepare`] and posted any number of times with
/// [`PreparedSend::post`]. It borrows its queue pair (a request cannot be posted on another) and
/// owns a reference to every region it reads or writes; when it is dropped while posts are in
/// flight, the queue pair keeps those regions alive until the last post's completion is reaped,
/// as for [`QueuePair::post_send`].
///
/// ```no_run
/// # use gdr::{mr::{RegionExt, RemoteRegion}, qp::QueuePair, wr::SendRequest};
/// # fn f(qp: &QueuePair, peer: RemoteRegion) -> gdr::Result<()> {
/// let mut ping = qp.prepare(&SendRequest::write_inline(&[0u8; 8], peer.slice(0..8)?))?;
/// for i in 0..1000u64 {
///     ping.inline_data_mut().expect("an inline request")[7] = i as u8;
///     ping.post(i, i % 100 == 99)?;   // signal one in a hundred
///     // ... wait for the peer's answer ...
/// }
/// # Ok(()) }
/// ```
pub struct PreparedSend<'q> {
    qp: &'q QueuePair,
    /// The provider's request; `wr_id`, the signalled flag and `sg_list` are set per post.
    wr: ibv::ibv_send_wr,
    /// `wr.send_flags` without `IBV_SEND_SIGNALED`.
    flags: u32,
    /// Entries `0..wr.num_sge` are initialised by `prepare`.
    sges: [MaybeUninit<ibv::ibv_sge>; MAX_SGE],
    /// The bytes of an inline request (copied into the request by the provider at each post).
    inline: Option<Box<[u8]>>,
    regions: Vec<Arc<dyn Registered>>,
    op: Operation,
    bytes: usize,
    /// Sequence number of the last successful post.
    last: Option<u64>,
}

// SAFETY: the raw pointers inside `wr` (`sg_list`, `next`) point into this value or are null and
// are only used during `post`, which takes `&mut self`; the queue pair is `Sync` and the regions
// are `Send + Sync`.
unsafe impl Send for PreparedSend<'_> {}

impl std::fmt::Debug for PreparedSend<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedSend")
            .field("qp_num", &self.qp.qp_num())
            .field("op", &self.op)
            .field("bytes", &self.bytes)
            .field("inline", &self.inline.is_some())
            .field("last_seq", &self.last)
            .finish()
    }
}

impl QueuePair {
    /// Checks `req` as [`QueuePair::post_send`] would and translates it once, for posting many
    /// times with [`PreparedSend::post`] (a fraction of `post_send`'s cost per post). The
    /// request's id and signalled flag are ignored: each post gives its own. Inline data is
    /// copied into the prepared request; change it with [`PreparedSend::inline_data_mut`].
    pub fn prepare(&self, req: &SendRequest<'_>) -> Result<PreparedSend<'_>> {
        self.check_send(req)?;
        // Inline bytes are copied into the prepared request (a heap copy: its address survives
        // moves of the PreparedSend), and the entries point there.
        let inline: Option<Box<[u8]>> = match req.data {
            Data::Inline(b) => Some(b.into()),
            Data::Slices(_) => None,
        };
        let view = SendRequest {
            data: inline.as_deref().map_or(req.data, Data::Inline),
            ..req.clone()
        };
        let mut sges = [const { MaybeUninit::<ibv::ibv_sge>::uninit() }; MAX_SGE];
        let (slices, num_sge) = write_sges(&view, &mut sges);
        let regions = slices.iter().map(|s| Arc::clone(&s.region)).collect();
        let wr = send_wr(req, 0, false, sges[0].as_mut_ptr(), num_sge);
        Ok(PreparedSend {
            qp: self,
            flags: wr.send_flags,
            wr,
            sges,
            inline,
            regions,
            op: req.op,
            bytes: req.data_len(),
            last: None,
        })
    }
}

impl PreparedSend<'_> {
    /// Posts the request with id `wr_id`. An unsignalled post is still signalled when the send
    /// queue needs it (every half queue, as for [`QueuePair::post_send`]); its completion is then
    /// not reported. Fails, posting nothing, when the send queue is full or the provider refuses
    /// (the queue pair is not in RTS).
    #[inline]
    pub fn post(&mut self, wr_id: u64, signaled: bool) -> Result<()> {
        let qp = self.qp;
        let mut ring = lock(&qp.inflight.send);
        qp.not_ready(&ring, WorkQueue::Send)?;
        if ring.free() == 0 {
            return Err(queue_full(&ring, qp.qp_num(), 1));
        }
        let sig = signaled || ring.signal_due(ring.since_signal);
        // The prepared request keeps its regions itself (and hands them to the ring when it is
        // dropped with posts in flight), so the slot holds none.
        let seq = ring.stage(0, wr_id, signaled, std::iter::empty());
        self.wr.wr_id = ring.provider_id(seq);
        self.wr.send_flags = if sig {
            self.flags | ibv::ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            self.flags
        };
        if self.wr.num_sge > 0 {
            self.wr.sg_list = self.sges[0].as_mut_ptr();
        }
        // SAFETY: `wr` (null `next`) and the entries `prepare` initialised live in `self` across
        // the call; every entry lies inside a registered region of the QP's PD (checked by
        // `prepare`) that `self.regions` keeps alive and `Drop` hands to the ring while posts are
        // in flight, or is the inline copy in `self.inline`.
        let (committed, outcome) =
            unsafe { qp.post_staged(ring, &mut self.wr, seq, sig, self.op, self.bytes) };
        // A post the provider may have queued (even one reported as failed) is in flight: the
        // regions must outlive it when this request is dropped.
        if committed {
            self.last = Some(seq);
        }
        outcome
    }

    /// Sets the immediate value of a write or send with immediate for the following posts.
    pub fn set_imm(&mut self, imm: u32) -> Result<()> {
        match self.op {
            Operation::WriteWithImm(_) | Operation::SendWithImm(_) => {
                self.wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                Ok(())
            }
            op => Err(Error::invalid(
                format!("set_imm({imm}) on a prepared {op:?}, which carries no immediate"),
                Hint::new("prepare the request with .with_imm(..)"),
            )),
        }
    }

    /// The bytes of an inline request (copied at each post, so changing them between posts is
    /// how a loop sends new data); `None` for a request that reads registered memory.
    pub fn inline_data_mut(&mut self) -> Option<&mut [u8]> {
        self.inline.as_deref_mut()
    }

    /// The operation, as prepared.
    pub fn operation(&self) -> Operation {
        self.op
    }

    /// Bytes of data each post carries.
    pub fn data_len(&self) -> usize {
        self.bytes
    }
}

impl Drop for PreparedSend<'_> {
    fn drop(&mut self) {
        // Posts still in flight may read or write the regions: the slot of the last post keeps
        // them until its completion (which, on an RC queue, comes after every earlier one) is
        // reaped, or the queue pair is reset or destroyed.
        if let Some(seq) = self.last {
            if !self.regions.is_empty() {
                lock(&self.qp.inflight.send).adopt(seq, self.regions.drain(..));
            }
        }
    }
}
