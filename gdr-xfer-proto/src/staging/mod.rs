//! Staging through host bounce buffers: the bookkeeping of the bounce-slot machine, independent
//! of any copy engine, so that gdr-xfer's stagers (CUDA, or `memcpy` for the emulated GPU) and
//! the simulation run the same code.
//!
//! One concept per file: `plan` ([`ChunkPlan`]: cutting a range into chunks), [`cut`] (the
//! least-time cut for a NIC of known rate), `chunk` (what the caller is handed: [`Ticket`],
//! [`Chunk`], [`StagingEvent`], [`Outcome`]), `pipeline` ([`Pipeline`]: which bounce buffer
//! is free, copying, lent or broken, and which ticket it serves; [`CopyEngine`]: the copies
//! it issues). Here: its configuration ([`PipelineConfig`]) and its errors
//! ([`PipelineError`]).
//!
//! A bounce buffer is reused only after its chunk came back ([`Pipeline::release`],
//! [`Pipeline::commit`]); a copy that failed without being known complete leaves its buffer
//! broken for good; a ticket is reported finished only once every copy of it is complete and
//! every chunk of it came back, so its device memory is no longer used.

mod chunk;
pub mod cut;
mod pipeline;
mod plan;

use std::fmt;

pub use chunk::{Chunk, Direction, Outcome, StagingEvent, Ticket};
pub use pipeline::{check_within, CopyEngine, Pipeline, CUTS_KEPT};
pub use plan::ChunkPlan;

/// A range is cut into this many pieces where `min_piece` and `chunk_size` allow: with copies
/// and RDMA overlapped, the fill and drain cost about one piece's time of the sixteen.
pub const PIECES: usize = 16;
/// The shortest piece of a cut for a known NIC rate: 256 KiB (or `chunk_size` when that is
/// shorter).
pub const CUT_FLOOR: usize = 256 << 10;

/// The bounce buffers of a [`Pipeline`] and how it cuts ranges (gdr-xfer's `StagingConfig`
/// says what each setting is for, and checks the limits on pinned memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Bytes per bounce buffer.
    pub chunk_size: usize,
    /// The number of bounce buffers.
    pub chunks: usize,
    /// The most tickets at once; more are refused.
    pub max_tickets: usize,
    /// The smallest piece a range is cut into (without a known NIC rate).
    pub min_piece: usize,
    /// The size of a range's first piece (without a known NIC rate).
    pub first_piece: usize,
    /// The rate chunks leave or arrive at, in bytes per second (0: not known).
    pub nic_rate: u64,
}

impl PipelineConfig {
    /// The size of the pieces a range of `len` bytes is cut into (apart from the ramp at both
    /// ends): `len / PIECES` rounded up to 64 KiB, but never less than `min_piece` nor more than
    /// `chunk_size`.
    pub fn piece_size(&self, len: usize) -> usize {
        let size = self.chunk_size.max(1);
        let per = len.div_ceil(PIECES);
        let per = per.div_ceil(64 << 10).saturating_mul(64 << 10);
        per.max(self.min_piece).min(size)
    }

    /// Checks what the pipeline itself needs: non-zero sizes and at least one ticket, and
    /// `chunks * chunk_size` representable.
    ///
    /// # Errors
    /// [`PipelineError::Config`] naming the setting.
    pub fn check(&self) -> Result<(), PipelineError> {
        let bad = |setting| Err(PipelineError::Config { setting });
        if self.chunk_size == 0 || self.chunks == 0 {
            return bad("chunk_size and chunks must be at least 1");
        }
        if self.chunk_size.checked_mul(self.chunks).is_none() {
            return bad("chunk_size * chunks overflows");
        }
        if self.min_piece == 0 {
            return bad("min_piece must be at least 1");
        }
        if self.first_piece == 0 {
            return bad("first_piece must be at least 1");
        }
        if self.max_tickets == 0 {
            return bad("max_tickets must be at least 1");
        }
        Ok(())
    }
}

/// What a [`Pipeline`] refuses. Each refusal changed nothing, except where its variant says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PipelineError {
    /// A setting of [`PipelineConfig`] is out of range.
    Config {
        /// Which setting, and what it must be.
        setting: &'static str,
    },
    /// [`Pipeline::start`]: the range is not inside the device memory.
    OutsideDevice {
        /// Which way the ticket would have gone.
        direction: Direction,
        /// The range's start.
        start: usize,
        /// The range's end.
        end: usize,
        /// The device memory's length.
        device_len: usize,
    },
    /// [`Pipeline::start`]: `max_tickets` tickets are active already.
    TooManyTickets {
        /// How many.
        active: usize,
    },
    /// No such ticket is active.
    UnknownTicket {
        /// The ticket.
        ticket: Ticket,
    },
    /// The chunk is not lent by this pipeline now (another pipeline's, or given back already).
    NotLent {
        /// The call it was given to.
        call: &'static str,
        /// Its ticket.
        ticket: Ticket,
        /// Its bounce buffer.
        slot: usize,
    },
    /// [`Pipeline::commit`] of a device-to-host chunk: it was released instead.
    CommitDeviceToHost {
        /// Its ticket.
        ticket: Ticket,
    },
    /// [`Pipeline::commit`]: the copy engine refused the copy; the ticket failed with that
    /// error, which its `Finished` event carries.
    CopyNotIssued {
        /// The failed ticket.
        ticket: Ticket,
    },
    /// Bytes asked for lie outside the chunk.
    OutsideChunk {
        /// The call.
        call: &'static str,
        /// Offset in the chunk.
        at: usize,
        /// Bytes.
        len: usize,
        /// The chunk's length.
        chunk_len: usize,
    },
}

impl PipelineError {
    /// What to do about it.
    pub fn hint(&self) -> &'static str {
        match self {
            PipelineError::Config { .. } => {
                "use StagingConfig::default() (4 x 8 MiB) or other non-zero values"
            }
            PipelineError::OutsideDevice { .. } => "pass start <= end <= the buffer's len()",
            PipelineError::TooManyTickets { .. } => {
                "poll until tickets finish, or raise StagingConfig::max_tickets"
            }
            PipelineError::UnknownTicket { .. } => {
                "the ticket finished already (its Finished event was reported)"
            }
            PipelineError::NotLent { .. } => "give a chunk back to the stager that lent it",
            PipelineError::CommitDeviceToHost { .. } => {
                "give device-to-host chunks back with Stager::release"
            }
            PipelineError::CopyNotIssued { .. } => {
                "the ticket is failed; its Finished event carries the error"
            }
            PipelineError::OutsideChunk { .. } => "keep at + length within Chunk::len()",
        }
    }
}

impl fmt::Display for PipelineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PipelineError::Config { setting } => write!(f, "staging config: {setting}"),
            PipelineError::OutsideDevice {
                direction,
                start,
                end,
                device_len,
            } => write!(
                f,
                "staging {direction:?}: range {start}..{end} is not inside the device memory's \
                 {device_len} bytes"
            ),
            PipelineError::TooManyTickets { active } => write!(
                f,
                "staging: {active} tickets are active, the most this stager accepts (max_tickets)"
            ),
            PipelineError::UnknownTicket { ticket } => {
                write!(f, "staging: no active ticket {}", ticket.0)
            }
            PipelineError::NotLent { call, ticket, slot } => write!(
                f,
                "{call}: chunk (ticket {}, slot {slot}) is not lent by this stager",
                ticket.0
            ),
            PipelineError::CommitDeviceToHost { ticket } => write!(
                f,
                "Stager::commit: chunk of ticket {} is a device-to-host chunk (it was released \
                 instead)",
                ticket.0
            ),
            PipelineError::CopyNotIssued { ticket } => write!(
                f,
                "Stager::commit: the copy of ticket {} could not be issued",
                ticket.0
            ),
            PipelineError::OutsideChunk {
                call,
                at,
                len,
                chunk_len,
            } => write!(
                f,
                "{call}: {len} bytes at {at} do not fit in the chunk's {chunk_len} bytes"
            ),
        }
    }
}

impl std::error::Error for PipelineError {}

#[cfg(test)]
mod tests;
