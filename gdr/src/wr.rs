//! Work requests: what [`crate::qp::QueuePair::post_send`] and
//! [`crate::qp::QueuePair::post_recv`] take, and the in-flight table that keeps every posted
//! request's regions alive until its completion is reaped (soundness rule 1).
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use gdr::{mr::{RegionExt, RemoteRegion}, qp::QueuePair, wr::SendRequest};
//! # fn f(qp: &QueuePair, mr: &Arc<gdr::mr::MemoryRegion>, peer: RemoteRegion) -> gdr::Result<()> {
//! let local = mr.slice(0..4096)?;           // bounds-checked against the local region
//! let remote = peer.slice(0..4096)?;         // bounds-checked against what the peer advertised
//! qp.post_send(&SendRequest::write(&[local], remote).id(1))?;
//! qp.post_send(&SendRequest::write_inline(b"done", peer.slice(4096..4100)?).id(2).with_imm(7))?;
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex};

use crate::mr::{LocalSlice, Registered, RemoteSlice};

/// The operation of a send-queue request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// RDMA write: local data into the remote slice, the peer's CPU is not involved.
    Write,
    /// RDMA write plus a 32-bit immediate that consumes a receive request at the peer.
    WriteWithImm(u32),
    /// RDMA read: the remote slice into local memory.
    Read,
    /// Send: consumes a receive request at the peer.
    Send,
    /// Send with a 32-bit immediate.
    SendWithImm(u32),
    /// Atomic compare-and-swap of the remote 8-byte word; the old value lands in the local slice.
    CompareSwap {
        /// Expected value.
        compare: u64,
        /// New value written when the remote word equals `compare`.
        swap: u64,
    },
    /// Atomic fetch-and-add on the remote 8-byte word; the old value lands in the local slice.
    FetchAdd {
        /// Value added.
        add: u64,
    },
}

impl Operation {
    /// Whether the operation targets a remote slice.
    pub fn has_remote(self) -> bool {
        !matches!(self, Operation::Send | Operation::SendWithImm(_))
    }

    /// Whether the NIC writes the local memory (reads and atomics).
    pub fn writes_local(self) -> bool {
        matches!(
            self,
            Operation::Read | Operation::CompareSwap { .. } | Operation::FetchAdd { .. }
        )
    }

    /// Whether it is an atomic.
    pub fn is_atomic(self) -> bool {
        matches!(
            self,
            Operation::CompareSwap { .. } | Operation::FetchAdd { .. }
        )
    }
}

/// Local data of a send-queue request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Data<'a> {
    /// Scatter/gather list of registered slices.
    Slices(&'a [LocalSlice]),
    /// Bytes copied into the request at post time (inline); need no registration.
    Inline(&'a [u8]),
}

/// A send-queue work request. Build it with a constructor, refine it with the builder methods,
/// post it with [`crate::qp::QueuePair::post_send`]. All checks (bounds, protection domain,
/// access flags, alignment, GPU memory never inline) happen before anything is posted.
#[derive(Debug, Clone)]
pub struct SendRequest<'a> {
    pub(crate) wr_id: u64,
    pub(crate) op: Operation,
    pub(crate) data: Data<'a>,
    pub(crate) remote: Option<RemoteSlice>,
    pub(crate) signaled: bool,
    pub(crate) fence: bool,
    pub(crate) solicited: bool,
    pub(crate) inline: bool,
}

impl<'a> SendRequest<'a> {
    fn new(op: Operation, data: Data<'a>, remote: Option<RemoteSlice>) -> Self {
        SendRequest {
            wr_id: 0,
            op,
            data,
            remote,
            signaled: true,
            fence: false,
            solicited: false,
            inline: false,
        }
    }

    /// RDMA write of `local` (a scatter/gather list) into `remote`; lengths must match.
    pub fn write(local: &'a [LocalSlice], remote: RemoteSlice) -> Self {
        Self::new(Operation::Write, Data::Slices(local), Some(remote))
    }

    /// RDMA write of bytes copied into the request (inline): no registration needed, at most
    /// the queue pair's `max_inline_data` bytes.
    pub fn write_inline(data: &'a [u8], remote: RemoteSlice) -> Self {
        let mut r = Self::new(Operation::Write, Data::Inline(data), Some(remote));
        r.inline = true;
        r
    }

    /// RDMA read of `remote` into `local`; lengths must match; `local` needs LOCAL_WRITE.
    pub fn read(local: &'a [LocalSlice], remote: RemoteSlice) -> Self {
        Self::new(Operation::Read, Data::Slices(local), Some(remote))
    }

    /// Send of `local` to the peer's next posted receive.
    pub fn send(local: &'a [LocalSlice]) -> Self {
        Self::new(Operation::Send, Data::Slices(local), None)
    }

    /// Send of bytes copied into the request (inline).
    pub fn send_inline(data: &'a [u8]) -> Self {
        let mut r = Self::new(Operation::Send, Data::Inline(data), None);
        r.inline = true;
        r
    }

    /// Compare-and-swap on the remote 8-byte word; the previous value is written to `local` (8 bytes).
    pub fn compare_swap(
        local: &'a LocalSlice,
        remote: RemoteSlice,
        compare: u64,
        swap: u64,
    ) -> Self {
        Self::new(
            Operation::CompareSwap { compare, swap },
            Data::Slices(std::slice::from_ref(local)),
            Some(remote),
        )
    }

    /// Fetch-and-add on the remote 8-byte word; the previous value is written to `local` (8 bytes).
    pub fn fetch_add(local: &'a LocalSlice, remote: RemoteSlice, add: u64) -> Self {
        Self::new(
            Operation::FetchAdd { add },
            Data::Slices(std::slice::from_ref(local)),
            Some(remote),
        )
    }

    /// Sets the id reported in the completion.
    pub fn id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }

    /// Attaches immediate data: a write becomes write-with-immediate, a send send-with-immediate.
    /// Ignored for reads and atomics (a check at post time refuses them).
    pub fn with_imm(mut self, imm: u32) -> Self {
        self.op = match self.op {
            Operation::Write | Operation::WriteWithImm(_) => Operation::WriteWithImm(imm),
            Operation::Send | Operation::SendWithImm(_) => Operation::SendWithImm(imm),
            other => other,
        };
        self
    }

    /// No completion for this request unless it fails. gdr still signals one request in every
    /// half send queue on its own so the queue cannot fill; those completions are consumed by
    /// [`crate::cq::CompletionQueue::poll`] and never reach the application.
    pub fn unsignaled(mut self) -> Self {
        self.signaled = false;
        self
    }

    /// Waits for earlier reads and atomics on this queue pair before it starts (`IBV_SEND_FENCE`).
    pub fn fenced(mut self) -> Self {
        self.fence = true;
        self
    }

    /// Sets the solicited-event flag for the receiver's completion channel.
    pub fn solicited(mut self) -> Self {
        self.solicited = true;
        self
    }

    /// Sends the slices' bytes inline (copied by the CPU at post time). Refused for GPU memory.
    pub fn inline(mut self) -> Self {
        self.inline = true;
        self
    }

    /// The operation.
    pub fn operation(&self) -> Operation {
        self.op
    }

    /// Total bytes of local data.
    pub fn data_len(&self) -> usize {
        match self.data {
            Data::Slices(s) => s.iter().map(|s| s.len()).sum(),
            Data::Inline(b) => b.len(),
        }
    }
}

/// A receive request: where the next incoming send (or write-with-immediate's notification)
/// lands. The slices need LOCAL_WRITE.
#[derive(Debug, Clone)]
pub struct RecvRequest<'a> {
    pub(crate) wr_id: u64,
    pub(crate) local: &'a [LocalSlice],
}

impl<'a> RecvRequest<'a> {
    /// A receive into `local` (may be empty for write-with-immediate notifications).
    pub fn new(local: &'a [LocalSlice]) -> Self {
        RecvRequest { wr_id: 0, local }
    }

    /// Sets the id reported in the completion.
    pub fn id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }
}

/// The top bit of a posted `wr_id` marks receive-queue requests.
pub(crate) const RECV_BIT: u64 = 1 << 63;

/// One posted request's bookkeeping.
struct Slot {
    user_wr_id: u64,
    user_signaled: bool,
    regions: Vec<Arc<dyn Registered>>,
}

/// Requests posted to one work queue, in posting order. The NIC completes a queue's requests in
/// order (RC), so a completion for sequence number `s` retires every request up to `s`.
pub(crate) struct Ring {
    /// A power of two at least the depth, so a sequence number's slot is `seq & mask`.
    slots: Box<[Slot]>,
    mask: u64,
    depth: u64,
    /// Sequence number of the next request to post.
    pub(crate) head: u64,
    /// Sequence number of the oldest request still in flight.
    pub(crate) tail: u64,
    /// Unsignalled requests posted since the last signalled one.
    pub(crate) since_signal: u32,
}

impl Ring {
    fn new(depth: u32, max_sge: u32) -> Self {
        let depth = depth.max(1);
        let slots: Box<[Slot]> = (0..depth.next_power_of_two())
            .map(|_| Slot {
                user_wr_id: 0,
                user_signaled: true,
                regions: Vec::with_capacity(max_sge.max(1) as usize),
            })
            .collect();
        Ring {
            mask: slots.len() as u64 - 1,
            slots,
            depth: u64::from(depth),
            head: 0,
            tail: 0,
            since_signal: 0,
        }
    }

    /// Capacity in requests.
    pub(crate) fn capacity(&self) -> u64 {
        self.depth
    }

    /// Requests in flight.
    pub(crate) fn outstanding(&self) -> u64 {
        self.head - self.tail
    }

    /// Whether a request must be signalled when `since_signal` unsignalled ones precede it, to
    /// keep the queue from filling with requests nobody can retire.
    pub(crate) fn signal_due(&self, since_signal: u32) -> bool {
        u64::from(since_signal) + 1 >= (self.capacity() / 2).max(1)
    }

    /// Fills the slot of sequence number `head + ahead` (the `ahead`-th request of a list being
    /// posted); returns that number. The caller has checked capacity and that `regions` fits the
    /// slot's reserved capacity (no allocation).
    pub(crate) fn stage<'r>(
        &mut self,
        ahead: u64,
        user_wr_id: u64,
        user_signaled: bool,
        regions: impl Iterator<Item = &'r Arc<dyn Registered>>,
    ) -> u64 {
        let seq = self.head + ahead;
        let slot = &mut self.slots[(seq & self.mask) as usize];
        slot.user_wr_id = user_wr_id;
        slot.user_signaled = user_signaled;
        slot.regions.clear();
        slot.regions.extend(regions.cloned());
        seq
    }

    /// Makes the in-flight request `seq` keep `regions` alive too (until it is retired or the
    /// ring cleared); drops them at once when `seq` is no longer in flight.
    pub(crate) fn adopt(&mut self, seq: u64, regions: impl Iterator<Item = Arc<dyn Registered>>) {
        if seq >= self.tail && seq < self.head {
            self.slots[(seq & self.mask) as usize]
                .regions
                .extend(regions);
        }
    }

    /// Undoes [`Ring::stage`] after a failed post.
    pub(crate) fn unstage(&mut self, seq: u64) {
        self.slots[(seq & self.mask) as usize].regions.clear();
    }

    /// Marks the oldest staged request as posted.
    pub(crate) fn commit(&mut self, signaled: bool) {
        self.head += 1;
        self.since_signal = if signaled { 0 } else { self.since_signal + 1 };
    }

    /// Retires every request up to and including `seq`; returns the bookkeeping of `seq`, or
    /// `None` for a sequence number that is not in flight (a stale completion after a reset).
    fn retire(&mut self, seq: u64) -> Option<(u64, bool)> {
        if seq < self.tail || seq >= self.head {
            return None;
        }
        for s in self.tail..=seq {
            self.slots[(s & self.mask) as usize].regions.clear();
        }
        self.tail = seq + 1;
        let slot = &self.slots[(seq & self.mask) as usize];
        Some((slot.user_wr_id, slot.user_signaled))
    }

    /// Forgets everything in flight (after the queue pair was reset or destroyed: the NIC no
    /// longer touches the requests' memory).
    pub(crate) fn clear(&mut self) {
        for s in self.tail..self.head {
            self.slots[(s & self.mask) as usize].regions.clear();
        }
        self.tail = self.head;
        self.since_signal = 0;
    }
}

/// What a reaped completion retired.
pub(crate) struct Done {
    pub(crate) user_wr_id: u64,
    pub(crate) user_signaled: bool,
    pub(crate) is_recv: bool,
}

/// The in-flight table of one queue pair: its send and receive rings.
pub(crate) struct InFlight {
    pub(crate) send: Mutex<Ring>,
    pub(crate) recv: Mutex<Ring>,
}

impl InFlight {
    pub(crate) fn new(send_depth: u32, send_sge: u32, recv_depth: u32, recv_sge: u32) -> Self {
        InFlight {
            send: Mutex::new(Ring::new(send_depth, send_sge)),
            recv: Mutex::new(Ring::new(recv_depth, recv_sge)),
        }
    }

    /// Retires the request a completion reports.
    pub(crate) fn complete(&self, wr_id: u64) -> Option<Done> {
        let is_recv = wr_id & RECV_BIT != 0;
        let ring = if is_recv { &self.recv } else { &self.send };
        let (user_wr_id, user_signaled) = lock(ring).retire(wr_id & !RECV_BIT)?;
        Some(Done {
            user_wr_id,
            user_signaled: user_signaled || is_recv,
            is_recv,
        })
    }
}

/// Locks a ring, recovering from poisoning (the ring's state stays consistent on panic).
pub(crate) fn lock(m: &Mutex<Ring>) -> std::sync::MutexGuard<'_, Ring> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_retires_in_order_and_ignores_stale_ids() {
        let mut r = Ring::new(4, 1);
        for id in 10..13 {
            let seq = r.stage(0, id, id == 12, std::iter::empty());
            r.commit(id == 12);
            assert_eq!(seq, id - 10);
        }
        assert_eq!(r.outstanding(), 3);
        assert_eq!(
            r.retire(2),
            Some((12, true)),
            "signalled completion retires the unsignalled before it"
        );
        assert_eq!(r.outstanding(), 0);
        assert_eq!(r.retire(1), None, "already retired");
        assert_eq!(r.retire(7), None, "never posted");
        r.stage(0, 1, true, std::iter::empty());
        r.commit(true);
        r.clear();
        assert_eq!(r.retire(3), None, "cleared by reset");
    }

    #[test]
    fn periodic_signalling_bounds_unsignalled_runs() {
        let mut r = Ring::new(8, 1);
        let mut forced = 0;
        for i in 0..32 {
            let sig = r.signal_due(r.since_signal);
            forced += sig as u32;
            r.stage(0, i, false, std::iter::empty());
            r.commit(sig);
            assert!(
                r.since_signal < 4,
                "never more than half the queue unsignalled"
            );
            if sig {
                r.retire(r.head - 1);
            }
        }
        assert_eq!(forced, 8);
    }

    #[test]
    fn a_depth_that_is_not_a_power_of_two_wraps_correctly() {
        let mut r = Ring::new(3, 1);
        assert_eq!(r.capacity(), 3, "capacity is the depth, not the slot count");
        for round in 0..10u64 {
            for k in 0..3 {
                r.stage(k, round * 10 + k, k == 2, std::iter::empty());
            }
            for k in 0..3 {
                r.commit(k == 2);
            }
            assert_eq!(r.outstanding(), 3);
            assert_eq!(r.retire(r.head - 1), Some((round * 10 + 2, true)));
        }
    }

    #[test]
    fn a_staged_list_gets_consecutive_sequence_numbers() {
        let mut r = Ring::new(8, 1);
        r.stage(0, 100, true, std::iter::empty());
        r.commit(true);
        let seqs: Vec<u64> = (0..3)
            .map(|k| r.stage(k, 200 + k, k == 2, std::iter::empty()))
            .collect();
        assert_eq!(seqs, [1, 2, 3]);
        for k in 0..3 {
            r.commit(k == 2);
        }
        assert_eq!((r.outstanding(), r.since_signal), (4, 0));
        assert_eq!(r.retire(3), Some((202, true)));
        assert_eq!(r.outstanding(), 0);
    }

    #[test]
    fn builders_set_operations() {
        let remote = crate::mr::RemoteRegion::new(0x1000, 64, 5)
            .slice(..)
            .unwrap();
        let w = SendRequest::write_inline(b"abc", remote)
            .id(3)
            .with_imm(9)
            .unsignaled()
            .fenced();
        assert_eq!(w.operation(), Operation::WriteWithImm(9));
        assert_eq!(
            (w.wr_id, w.signaled, w.fence, w.inline, w.data_len()),
            (3, false, true, true, 3)
        );
        assert_eq!(
            SendRequest::send_inline(b"x").with_imm(1).operation(),
            Operation::SendWithImm(1)
        );
        assert!(Operation::FetchAdd { add: 1 }.writes_local() && Operation::Read.writes_local());
        assert!(!Operation::Send.has_remote() && Operation::Read.has_remote());
    }
}
