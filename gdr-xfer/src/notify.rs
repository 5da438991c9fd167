//! Notifications: small messages bound to a transfer, delivered to the target only after every
//! byte of the transfer landed there.
//!
//! The initiator sends a transfer's notification as an RDMA SEND once the completions of all of
//! the transfer's writes (or reads) are in, on every queue pair that carried them: an RC
//! completion at the initiator means the peer's NIC acknowledged the data, so when the SEND
//! arrives the data is in the target's memory (for GPU memory, call
//! [`Segment::read`](crate::Segment::read), which flushes first). Each peer connection has a
//! pool of receive slots on its first queue pair; a slot is reposted as soon as its message is
//! copied out, and senders retry (RNR) while none is posted, so no notification is lost.

use std::sync::Arc;

use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::wr::RecvRequest;

use crate::error::Result;

/// A notification a peer sent with a transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sending agent's name.
    pub peer: String,
    /// The bytes it attached.
    pub data: Vec<u8>,
}

/// A peer connection's notification buffers: `slots` receive slots and `slots` send slots of
/// `max` bytes each.
pub(crate) struct NotifyPool {
    pub(crate) recv: Arc<MemoryRegion>,
    pub(crate) send: Arc<MemoryRegion>,
    pub(crate) slots: u16,
    pub(crate) max: u32,
}

impl NotifyPool {
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, slots: u16, max: u32) -> Result<NotifyPool> {
        let bytes = usize::from(slots.max(1)) * max.max(1) as usize;
        Ok(NotifyPool {
            recv: MemoryRegion::new(pd, bytes, AccessFlags::LOCAL_WRITE)?,
            send: MemoryRegion::new(pd, bytes, AccessFlags::LOCAL_WRITE)?,
            slots,
            max,
        })
    }

    fn slot_range(&self, slot: u16) -> std::ops::Range<usize> {
        let start = usize::from(slot) * self.max as usize;
        start..start + self.max as usize
    }

    /// Posts the receive of `slot` on `qp` (its wr_id is the slot number).
    pub(crate) fn post_recv(&self, qp: &QueuePair, slot: u16) -> Result<()> {
        let s = [self.recv.slice(self.slot_range(slot))?];
        qp.post_recv(&RecvRequest::new(&s).id(u64::from(slot)))?;
        Ok(())
    }

    /// The bytes a completed receive of `slot` holds (`len` as the completion reported it,
    /// bounded by the slot).
    pub(crate) fn take(&self, slot: u16, len: u32) -> Result<Vec<u8>> {
        let len = (len.min(self.max)) as usize;
        let mut v = vec![0u8; len];
        self.recv.read(self.slot_range(slot).start, &mut v)?;
        Ok(v)
    }

    /// Fills send `slot` with `data` and returns the slice to send (`None` for empty data: a
    /// SEND without a scatter/gather entry).
    pub(crate) fn stage(&self, slot: u16, data: &[u8]) -> Result<Option<gdr::mr::LocalSlice>> {
        if data.is_empty() {
            return Ok(None);
        }
        let start = self.slot_range(slot).start;
        self.send.write(start, data)?;
        Ok(Some(self.send.slice(start..start + data.len())?))
    }
}
