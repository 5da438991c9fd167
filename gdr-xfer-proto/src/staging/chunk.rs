//! What a [`super::Pipeline`] hands its caller: tickets, chunks and events.

/// One started range ([`super::Pipeline::start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

impl Ticket {
    /// The ticket's number (unique within its stager).
    pub fn id(&self) -> u64 {
        self.0
    }
}

/// Which way a ticket moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// GPU memory to the bounce buffers (then the caller sends them: an RDMA WRITE's source).
    DeviceToHost,
    /// The bounce buffers (filled by the caller: an RDMA READ's target) to GPU memory.
    HostToDevice,
}

/// One bounce buffer lent to the caller, for one piece of a ticket's range.
///
/// For [`Direction::DeviceToHost`] its bytes hold `device_offset..device_offset + len` of the
/// device memory: send them, then give the chunk back with [`super::Pipeline::release`]. For
/// [`Direction::HostToDevice`] fill it with the bytes that belong at `device_offset`, then give it
/// back with [`super::Pipeline::commit`] (which copies it to the device), or with
/// [`super::Pipeline::release`] to abandon the ticket.
///
/// A chunk cannot be cloned or made outside its stager, so it is given back exactly once; the
/// bounce buffer is not reused until then.
#[derive(Debug, PartialEq, Eq)]
pub struct Chunk {
    pub(crate) stager: u64,
    pub(crate) slot: usize,
    pub(crate) seq: u64,
    pub(crate) ticket: Ticket,
    pub(crate) direction: Direction,
    pub(crate) device_offset: usize,
    pub(crate) bounce_offset: usize,
    pub(crate) len: usize,
}

impl Chunk {
    /// The ticket it belongs to.
    pub fn ticket(&self) -> Ticket {
        self.ticket
    }
    /// Which way its bytes go.
    pub fn direction(&self) -> Direction {
        self.direction
    }
    /// Where its bytes are (or go) in the device memory, in bytes from the memory's start.
    pub fn device_offset(&self) -> usize {
        self.device_offset
    }
    /// Where its bytes are (or go) relative to the start of the ticket's range.
    pub fn offset_in_ticket(&self, ticket_start: usize) -> usize {
        self.device_offset.saturating_sub(ticket_start)
    }
    /// Its offset in the bounce allocation (in the registered bounce region, when there is one).
    pub fn bounce_offset(&self) -> usize {
        self.bounce_offset
    }
    /// Its length in bytes (the chunk size, or less for a range's last chunk).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Never `true`: empty ranges have no chunks.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The bounce buffer's index.
    pub fn slot(&self) -> usize {
        self.slot
    }
}

/// How a ticket ended; `E` is the copy engine's error ([`super::CopyEngine::Error`]).
#[derive(Debug)]
pub enum Outcome<E> {
    /// Every byte went through.
    Completed {
        /// Bytes moved.
        bytes: u64,
        /// Chunks (copies) it took.
        chunks: u64,
    },
    /// [`super::Pipeline::cancel`] stopped it, or an H2D chunk was released without commit; the
    /// bytes before `bytes_done` may be complete, the rest are not.
    Cancelled {
        /// Bytes that went through before it stopped.
        bytes_done: u64,
    },
    /// A copy failed; nothing after the failure was issued.
    Failed(E),
}

impl<E> Outcome<E> {
    /// `true` for [`Outcome::Completed`].
    pub fn is_completed(&self) -> bool {
        matches!(self, Outcome::Completed { .. })
    }
}

/// What [`super::Pipeline::poll`] reports.
#[derive(Debug)]
pub enum StagingEvent<E> {
    /// A device-to-host chunk is in its bounce buffer: send it, then [`super::Pipeline::release`] it.
    Ready(Chunk),
    /// A host-to-device chunk is free for filling: fill it, then [`super::Pipeline::commit`] it.
    Fill(Chunk),
    /// A ticket is over: every copy of it is complete and every chunk was given back, so the
    /// stager holds nothing of its device memory any more.
    Finished {
        /// Which ticket.
        ticket: Ticket,
        /// How it ended.
        outcome: Outcome<E>,
    },
}
