//! Notifications: small messages bound to a transfer, delivered to the target only after every
//! byte of the transfer landed there.
//!
//! The initiator sends a transfer's notification as an RDMA SEND once the completions of all of
//! the transfer's writes (or reads) are in, on every queue pair that carried them: an RC
//! completion at the initiator means the peer's NIC acknowledged the data, so when the SEND
//! arrives the data is in the target's memory (for GPU memory, call
//! [`Segment::read`](crate::Segment::read), which flushes first). Each peer connection has a
//! pool of receive slots on each rail's first queue pair. A slot's message is copied out when
//! it arrives; the slot is posted again once the application took the notification
//! ([`Agent::take_notifications`](crate::Agent::take_notifications),
//! [`Agent::wait_notification`](crate::Agent::wait_notification)). So what a peer can make us
//! hold is bounded by the slots (`notify_slots` per rail and peer); a sender faster than the
//! application waits in the NIC's receiver-not-ready retries, without limit of time (its
//! transfers' deadlines still apply), and nothing is lost.
//!
//! Every message starts with a header, `flags u8 | id u64` ([`gdr_xfer_proto::Header`]): the
//! id numbers the sender's notifications on the connection, so a notification sent again after
//! its rail failed (the first copy may have arrived before the failure) is delivered once; the
//! probe flag marks the message that re-admits a rail, never delivered.

use std::sync::{Arc, Weak};

use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::wr::RecvRequest;
use gdr_xfer_proto::{Header, Receipt};

use crate::connection::Connection;
use crate::error::{Error, Result};

/// A notification a peer sent with a transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sending agent's name.
    pub peer: String,
    /// The bytes it attached.
    pub data: Vec<u8>,
}

/// A delivered notification and the slot it holds until the application takes it.
pub(crate) struct Delivered {
    pub(crate) notification: Notification,
    pub(crate) conn: Weak<Connection>,
    pub(crate) receipt: Receipt,
}

impl Delivered {
    /// The application took it: its slot is posted again.
    pub(crate) fn take(self) -> Notification {
        if let Some(c) = self.conn.upgrade() {
            c.consumed(self.receipt);
        }
        self.notification
    }
}

/// One rail's notification buffers for a peer connection: `slots` receive slots and `slots`
/// send slots of `max` bytes (plus the header) each.
pub(crate) struct NotifyPool {
    pub(crate) recv: Arc<MemoryRegion>,
    pub(crate) send: Arc<MemoryRegion>,
    pub(crate) slots: u16,
    pub(crate) max: u32,
}

/// The receive wr_id of `slot` on the queue pair of generation `gen`: a completion of a queue
/// pair that was replaced since is recognised as stale and ignored.
pub(crate) fn recv_wr_id(gen: u64, slot: u16) -> u64 {
    (gen << 16) | u64::from(slot)
}

/// The (generation, slot) of a receive wr_id.
pub(crate) fn split_recv_wr_id(wr_id: u64) -> (u64, u16) {
    (wr_id >> 16, wr_id as u16)
}

impl NotifyPool {
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, slots: u16, max: u32) -> Result<NotifyPool> {
        let bytes = usize::from(slots.max(1)) * (max as usize + Header::LEN);
        Ok(NotifyPool {
            recv: MemoryRegion::new(pd, bytes, AccessFlags::LOCAL_WRITE)?,
            send: MemoryRegion::new(pd, bytes, AccessFlags::LOCAL_WRITE)?,
            slots,
            max,
        })
    }

    fn slot_range(&self, slot: u16) -> std::ops::Range<usize> {
        let size = self.max as usize + Header::LEN;
        let start = usize::from(slot) * size;
        start..start + size
    }

    /// Posts the receive of `slot` on `qp`, the queue pair of generation `gen`.
    pub(crate) fn post_recv(&self, qp: &QueuePair, gen: u64, slot: u16) -> Result<()> {
        if slot >= self.slots {
            return Err(Error::invalid(
                format!("notification slot {slot} of {}", self.slots),
                "a slot number comes from the engine",
            ));
        }
        let s = [self.recv.slice(self.slot_range(slot))?];
        qp.post_recv(&RecvRequest::new(&s).id(recv_wr_id(gen, slot)))?;
        Ok(())
    }

    /// Posts every receive slot on `qp`, the queue pair of generation `gen`.
    pub(crate) fn post_all(&self, qp: &QueuePair, gen: u64) -> Result<()> {
        (0..self.slots).try_for_each(|slot| self.post_recv(qp, gen, slot))
    }

    /// The message (header and payload) a completed receive of `slot` holds, `len` bytes as
    /// the completion reported, bounded by the slot.
    pub(crate) fn read(&self, slot: u16, len: u32) -> Result<Vec<u8>> {
        if slot >= self.slots {
            return Err(Error::invalid(
                format!("notification slot {slot} of {}", self.slots),
                "a receive completion names a slot the engine posted",
            ));
        }
        let len = (len as usize).min(self.max as usize + Header::LEN);
        let mut v = vec![0u8; len];
        self.recv.read(self.slot_range(slot).start, &mut v)?;
        Ok(v)
    }

    /// Fills send `slot` with the header and `data` and returns the slice to send.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `data` is longer than a slot holds.
    pub(crate) fn stage(
        &self,
        slot: u16,
        header: Header,
        data: &[u8],
    ) -> Result<gdr::mr::LocalSlice> {
        if slot >= self.slots || data.len() > self.max as usize {
            return Err(Error::invalid(
                format!(
                    "a message of {} bytes in send slot {slot} ({} slots of {} bytes)",
                    data.len(),
                    self.slots,
                    self.max
                ),
                "notifications are at most the smaller of both agents' notify_max",
            ));
        }
        let start = self.slot_range(slot).start;
        let mut msg = Vec::with_capacity(Header::LEN + data.len());
        msg.extend_from_slice(&header.encode());
        msg.extend_from_slice(data);
        self.send.write(start, &msg)?;
        Ok(self.send.slice(start..start + msg.len())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receive_ids_carry_the_generation() {
        for (gen, slot) in [(0, 0), (1, 63), (0xffff_ffff, u16::MAX)] {
            assert_eq!(split_recv_wr_id(recv_wr_id(gen, slot)), (gen, slot));
        }
    }
}
