//! Work requests: what [`crate::qp::QueuePair::post_send`] and
//! [`crate::qp::QueuePair::post_recv`] take. (What keeps a posted request's regions alive until
//! its completion is reaped is the queue pair's in-flight table, `inflight.rs`.)
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

use crate::mr::{LocalSlice, RemoteSlice};

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
#[must_use = "a request does nothing until it is posted"]
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
#[must_use = "a request does nothing until it is posted"]
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

#[cfg(test)]
mod tests {
    use super::*;

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
