//! Host staging for GPU memory without GPUDirect: when no direct path lets the NIC reach a GPU
//! segment, its bytes go through pinned host bounce buffers, chunk by chunk, with
//! `cuMemcpyAsync` copies of later chunks overlapping the RDMA of earlier ones.
//!
//! The bookkeeping is the core's (`gdr_xfer_proto::staging`, run by the simulation too):
//! [`ChunkPlan`] (cutting a range into chunks), [`cut`] (the least-time cut for a NIC of known
//! rate, [`StagingConfig::nic_rate`]), what the caller is handed ([`Ticket`], [`Chunk`],
//! [`StagingEvent`], [`Outcome`]) and the bounce-slot machine. Here, one concept per file:
//! `config` ([`StagingConfig`]), `chunk` (the core's events with gdr-xfer's error),
//! `pipeline` (the core's machine with the bounce bytes and blocking copies, tested on the host
//! with a fake copy engine), `stager` ([`Stager`]: the CUDA stream and the bounce buffers).
//!
//! Lifetimes: a ticket keeps an `Arc` of its device memory until its
//! [`StagingEvent::Finished`]; every copy in flight keeps an `Arc` of the device memory and of the
//! bounce allocation until it is known complete (`gdr::cuda::AsyncCopy`), and dropping the
//! stager waits for those copies. A bounce buffer is reused only after its chunk came back
//! ([`Stager::release`], [`Stager::commit`]), which the engine does when the RDMA request using
//! it completed.
//!
//! Staging is never silent: [`Stager::describe`] is the line for the segment's info, and creating
//! a stager logs it at `info`.
//!
//! # Staged segments
//!
//! Transfers from and to GPU memory the NIC cannot reach (no GPUDirect path: no peer-memory
//! module, no dma-buf support): the engine moves their bytes through pinned host bounce
//! buffers, and says so.
//!
//! A *staged* segment ([`crate::Segment::path`] is [`crate::SegmentPath::Staged`]) is the local side of
//! transfers like any other. Each of its runs becomes a [`crate::staging`] ticket; every chunk
//! of it becomes one engine transfer ("child") between a bounce buffer and the peer:
//! - WRITE: a `cuMemcpyAsync` copies a chunk to a bounce buffer, the child writes it to the
//!   peer, and the buffer is copied into again only once the child completed;
//! - READ: the child reads the peer's bytes into a bounce buffer, then a copy moves them to the
//!   GPU, and the transfer is done once every copy is complete.
//!
//! Copies of later chunks overlap the RDMA of earlier ones (as many as there are bounce
//! buffers). A notification goes with the last child, posted only after every other child
//! completed, so the target still sees it only after all the data.
//!
//! Peers cannot address a staged segment (one-sided access needs the NIC to reach the memory):
//! it is not announced to them.
//!
//! # Memory
//!
//! A bounce buffer is one registration per rail, and gdr's requests hold the registration they
//! use until gdr retired them. A buffer is given back to the stager only once nothing but the
//! engine's own long-lived references holds it (`staging::slots`): after a child
//! completed, or failed, timed out, or lost its queue pairs, whichever way the NIC let go. The
//! device memory is held by its ticket until every copy of it is complete.
//!
//! The driver is one thread per agent (`xfer-staging-<agent>`), started with the first staged
//! segment. It polls on (yielding) while its copies and chunks finish closer together than the
//! agent's `busy_poll`, and sleeps, longer and longer, while they do not (`staged::pace`). The
//! agent fills [`StagingConfig::nic_rate`] from its rails' link rates when it is left at zero, so
//! its staged runs are cut for least time against the NIC they use.

mod chunk;
mod config;
#[cfg(feature = "emulated-gpu")]
pub(crate) mod emulated;
pub(crate) mod pipeline;
pub(crate) mod slots;
mod stager;
#[cfg(test)]
mod tests;

pub use chunk::{Chunk, Direction, Outcome, StagingEvent, Ticket};
pub use config::StagingConfig;
pub use gdr_xfer_proto::staging::{cut, ChunkPlan};
#[cfg(feature = "emulated-gpu")]
pub(crate) use stager::bytes_text;
pub use stager::Stager;

#[cfg(feature = "emulated-gpu")]
pub use emulated::EmulatedGpu;
