//! Lanes: the queue pairs of a connection, one incarnation at a time, and the records of what
//! is posted on each.
//!
//! A successful completion with number `s` on a lane means every request up to `s` on that
//! lane completed (RC completes in order), so the records up to `s` are credited. Only the last
//! request of each record is signalled.

use std::collections::VecDeque;

use crate::io::LaneRef;
use crate::run::Cursor;
use crate::transfer::TransferKey;

/// What a run of request numbers on one lane belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Posted {
    Slices {
        first: u64,
        last: u64,
        transfer: TransferKey,
        /// The range of the transfer's runs these requests cover (to post again elsewhere).
        from: Cursor,
        to: Cursor,
        bytes: u64,
    },
    Notify {
        seq: u64,
        transfer: TransferKey,
        slot: u16,
    },
    Probe {
        seq: u64,
        slot: u16,
    },
}

impl Posted {
    /// The last request number it covers.
    pub(crate) fn last(&self) -> u64 {
        match *self {
            Posted::Slices { last, .. } => last,
            Posted::Notify { seq, .. } | Posted::Probe { seq, .. } => seq,
        }
    }

    /// Requests it covers.
    pub(crate) fn count(&self) -> u64 {
        match *self {
            Posted::Slices { first, last, .. } => last - first + 1,
            Posted::Notify { .. } | Posted::Probe { .. } => 1,
        }
    }

    /// The transfer it belongs to.
    pub(crate) fn transfer(&self) -> Option<TransferKey> {
        match *self {
            Posted::Slices { transfer, .. } | Posted::Notify { transfer, .. } => Some(transfer),
            Posted::Probe { .. } => None,
        }
    }
}

/// One queue pair slot of a connection.
#[derive(Debug)]
pub(crate) struct Lane {
    /// The current queue pair's generation; `None` while there is none (its rail failed, or
    /// before a renewal installed one).
    pub(crate) gen: Option<u64>,
    pub(crate) posted: VecDeque<Posted>,
    /// Requests posted and not yet credited (bounded by the send queue's depth).
    pub(crate) outstanding: u64,
    /// Set when the driver found the send queue full although the count had room (requests
    /// the driver still holds): nothing more is posted until a completion arrives.
    pub(crate) full: bool,
}

impl Lane {
    pub(crate) fn new(gen: u64) -> Lane {
        Lane {
            gen: Some(gen),
            posted: VecDeque::new(),
            outstanding: 0,
            full: false,
        }
    }

    pub(crate) fn current(&self, lane: usize) -> Option<LaneRef> {
        self.gen.map(|gen| LaneRef { lane, gen })
    }
}

#[cfg(test)]
mod tests {
    /// The engine's memory per transfer is what gdr-xfer's docs say ("Memory the engine keeps
    /// per transfer"): a 32-byte record per run and a 72-byte one per batch of requests.
    #[test]
    fn the_records_per_run_and_per_batch_are_the_documented_sizes() {
        assert_eq!(std::mem::size_of::<crate::run::Run>(), 32);
        assert_eq!(std::mem::size_of::<super::Posted>(), 72);
        assert_eq!(crate::config::CHUNK, 64);
    }
}
