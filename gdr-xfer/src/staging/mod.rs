//! Host staging for GPU memory without GPUDirect: when no direct path lets the NIC reach a GPU
//! segment, its bytes go through pinned host bounce buffers, chunk by chunk, with
//! `cuMemcpyAsync` copies of later chunks overlapping the RDMA of earlier ones.
//!
//! One concept per file: `config` ([`StagingConfig`]), `plan` ([`ChunkPlan`]: cutting a range
//! into chunks), `chunk` (what the caller is handed: [`Ticket`], [`Chunk`], [`StagingEvent`],
//! [`Outcome`]), `pipeline` (the bookkeeping, independent of CUDA, tested on the host with a
//! fake copy engine), `stager` ([`Stager`]: the CUDA stream and the bounce buffers).
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

mod chunk;
mod config;
pub(crate) mod pipeline;
mod plan;
pub(crate) mod slots;
mod stager;
#[cfg(test)]
mod tests;

pub use chunk::{Chunk, Direction, Outcome, StagingEvent, Ticket};
pub use config::StagingConfig;
pub use plan::ChunkPlan;
#[cfg(feature = "emulated-gpu")]
pub(crate) use stager::bytes_text;
pub use stager::Stager;
