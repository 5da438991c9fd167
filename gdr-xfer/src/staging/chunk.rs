//! What a [`super::Stager`] hands its caller: the core's tickets, chunks and events, with
//! gdr-xfer's [`Error`] as a failed copy's error.

use crate::error::Error;

pub use gdr_xfer_proto::staging::{Chunk, Direction, Ticket};

/// How a ticket ended: every byte went through, it was cancelled, or a copy failed.
pub type Outcome = gdr_xfer_proto::staging::Outcome<Error>;

/// What [`super::Stager::poll`] reports: a chunk ready to send, a chunk to fill, or a finished
/// ticket.
pub type StagingEvent = gdr_xfer_proto::staging::StagingEvent<Error>;
