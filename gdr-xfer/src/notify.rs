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
//!
//! With several rails, each rail has its own pool (registered with that rail's protection
//! domain) on its first queue pair, and a notification goes on any working rail. Every message
//! starts with a header, `flags u8 | id u64`: the id numbers the sender's notifications on the
//! connection, so a notification sent again after its rail failed (the first copy may have
//! arrived before the failure) is delivered once; the probe flag marks the message that
//! re-admits a rail, never delivered.

use std::collections::BTreeSet;
use std::sync::Arc;

use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::wr::RecvRequest;

use crate::error::{Error, Result};

/// Bytes of the header in front of every notification: flags u8, id u64.
pub(crate) const HEADER: usize = 9;
/// The header flag of a rail probe.
pub(crate) const FLAG_PROBE: u8 = 1;
/// How many notification ids a receiver remembers to drop repeats.
const SEEN_WINDOW: usize = 4096;

/// A notification a peer sent with a transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sending agent's name.
    pub peer: String,
    /// The bytes it attached.
    pub data: Vec<u8>,
}

/// One rail's notification buffers for a peer connection: `slots` receive slots and `slots`
/// send slots of `max` bytes (plus the header) each.
pub(crate) struct NotifyPool {
    pub(crate) recv: Arc<MemoryRegion>,
    pub(crate) send: Arc<MemoryRegion>,
    pub(crate) slots: u16,
    pub(crate) max: u32,
}

/// A received message: its header and payload.
pub(crate) struct Received {
    pub(crate) flags: u8,
    pub(crate) id: u64,
    pub(crate) data: Vec<u8>,
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

/// The ids of notifications already delivered from one peer (the latest [`SEEN_WINDOW`]).
#[derive(Default)]
pub(crate) struct Seen {
    ids: BTreeSet<u64>,
}

impl Seen {
    /// Whether `id` is new (and remembers it). Ids older than the window count as seen: a
    /// repeat comes within a transfer's deadline, long before 4096 newer ones.
    pub(crate) fn first_time(&mut self, id: u64) -> bool {
        if self.ids.len() >= SEEN_WINDOW && self.ids.first().is_some_and(|&f| id < f) {
            return false;
        }
        if !self.ids.insert(id) {
            return false;
        }
        while self.ids.len() > SEEN_WINDOW {
            self.ids.pop_first();
        }
        true
    }
}

impl NotifyPool {
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, slots: u16, max: u32) -> Result<NotifyPool> {
        let bytes = usize::from(slots.max(1)) * (max as usize + HEADER);
        Ok(NotifyPool {
            recv: MemoryRegion::new(pd, bytes, AccessFlags::LOCAL_WRITE)?,
            send: MemoryRegion::new(pd, bytes, AccessFlags::LOCAL_WRITE)?,
            slots,
            max,
        })
    }

    fn slot_range(&self, slot: u16) -> std::ops::Range<usize> {
        let size = self.max as usize + HEADER;
        let start = usize::from(slot) * size;
        start..start + size
    }

    /// Posts the receive of `slot` on `qp`, the queue pair of generation `gen`.
    pub(crate) fn post_recv(&self, qp: &QueuePair, gen: u64, slot: u16) -> Result<()> {
        let s = [self.recv.slice(self.slot_range(slot))?];
        qp.post_recv(&RecvRequest::new(&s).id(recv_wr_id(gen, slot)))?;
        Ok(())
    }

    /// Posts every receive slot on `qp`, the queue pair of generation `gen`.
    pub(crate) fn post_all(&self, qp: &QueuePair, gen: u64) -> Result<()> {
        (0..self.slots).try_for_each(|slot| self.post_recv(qp, gen, slot))
    }

    /// The message a completed receive of `slot` holds (`len` as the completion reported it,
    /// bounded by the slot).
    pub(crate) fn take(&self, slot: u16, len: u32) -> Result<Received> {
        let len = (len as usize).min(self.max as usize + HEADER);
        if len < HEADER {
            return Err(Error::protocol(
                "peer",
                format!("a notification of {len} bytes, shorter than its {HEADER}-byte header"),
            ));
        }
        let mut v = vec![0u8; len];
        self.recv.read(self.slot_range(slot).start, &mut v)?;
        let mut id = [0u8; 8];
        id.copy_from_slice(&v[1..HEADER]);
        Ok(Received {
            flags: v[0],
            id: u64::from_be_bytes(id),
            data: v.split_off(HEADER),
        })
    }

    /// Fills send `slot` with the header and `data` and returns the slice to send.
    pub(crate) fn stage(
        &self,
        slot: u16,
        flags: u8,
        id: u64,
        data: &[u8],
    ) -> Result<gdr::mr::LocalSlice> {
        let start = self.slot_range(slot).start;
        let mut msg = Vec::with_capacity(HEADER + data.len());
        msg.push(flags);
        msg.extend_from_slice(&id.to_be_bytes());
        msg.extend_from_slice(data);
        self.send.write(start, &msg)?;
        Ok(self.send.slice(start..start + msg.len())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_dropped_and_the_window_is_bounded() {
        let mut s = Seen::default();
        assert!(s.first_time(5));
        assert!(!s.first_time(5), "a repeat");
        // Out of order is fine (rails deliver in any order).
        assert!(s.first_time(3));
        for id in 10..10 + SEEN_WINDOW as u64 {
            assert!(s.first_time(id));
        }
        assert_eq!(s.ids.len(), SEEN_WINDOW);
        // Older than everything remembered: counted as seen, never delivered twice.
        assert!(!s.first_time(4));
        assert!(!s.first_time(10 + SEEN_WINDOW as u64 - 1));
        assert!(s.first_time(u64::MAX));
    }

    #[test]
    fn receive_ids_carry_the_generation() {
        for (gen, slot) in [(0, 0), (1, 63), (0xffff_ffff, u16::MAX)] {
            assert_eq!(split_recv_wr_id(recv_wr_id(gen, slot)), (gen, slot));
        }
    }
}
