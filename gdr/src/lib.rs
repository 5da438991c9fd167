//! # gdr: safe GPUDirect RDMA for Rust
//!
//! An RDMA NIC (InfiniBand HCA or RoCE NIC) reads and writes GPU memory directly: no copy through
//! host memory, no CPU on the data path. `gdr` wraps ibverbs, rdma_cm and the CUDA driver API in
//! RAII types that safe code cannot misuse, and checks device pointers with
//! `cuPointerGetAttributes` before any registration. Why GPUDirect does not work where it does not
//! is the `gdr-doctor` crate's question (`gdr doctor`); it decides with gdr's own rules
//! ([`gpu_mr::rules`]).
//!
//! Data flows one way, one module per stage:
//! find a device ([`device`]) -> open it -> allocate a protection domain ([`pd`]) -> register
//! memory ([`mr`] for host, [`gpu_mr`] for GPU) -> create completion queues ([`cq`]) and a queue
//! pair ([`qp`]) -> exchange endpoints with the peer ([`connect`]) -> post work requests ([`wr`]) ->
//! reap completions.
//!
//! Parents are kept alive by `Arc`: a queue pair holds its protection domain and completion
//! queues, a region its protection domain, a protection domain its device context.
//!
//! ## Quick start: write into a peer's memory
//!
//! The client side of `examples/rdma_write.rs` (run both sides with `cargo xtask demo`, or on real
//! hardware with `cargo run --example rdma_write -- --server` and `-- --connect HOST`):
//!
//! ```no_run
//! use std::time::Duration;
//! use gdr::{connect, cq::CompletionQueue, device::Context, pd::ProtectionDomain, qp::QueuePair};
//! use gdr::mr::{AccessFlags, MemoryRegion};
//! use gdr::wr::SendRequest;
//!
//! let ctx = Context::open("mlx5_0:1")?;                 // or an NCCL-style list, see device::Selection
//! let pd = ProtectionDomain::new(&ctx)?;
//! let cq = CompletionQueue::new(&ctx, 256)?;
//! let qp = QueuePair::builder(&pd, &cq, &cq).build()?;  // RoCE v2 GID picked automatically
//! let mr = MemoryRegion::with_data(&pd, b"hello, peer", AccessFlags::LOCAL_WRITE)?;
//!
//! // Exchange endpoints and regions over TCP, connect (INIT -> RTR -> RTS), meet at a barrier.
//! let mut link = connect::TcpLink::connect("192.0.2.10:18515", Duration::from_secs(10))?;
//! let peer = connect::handshake(&mut link, &qp, &[])?;
//!
//! // Bounds are checked here, against our region and the region the peer advertised.
//! let remote = peer.regions[0].slice(0..11)?;
//! qp.post_send(&SendRequest::write(&[mr.slice(..)?], remote).id(1))?;
//! let done = cq.wait_for(1, Duration::from_secs(5))?;
//! done[0].result()?;                                   // a failed completion becomes an Error with a hint
//! # Ok::<(), gdr::Error>(())
//! ```
//!
//! Many requests at once: [`qp::QueuePair::post_send_list`] checks a whole slice of requests
//! first, then posts them with one doorbell per 32 (one `ibv_post_send` call each); `gdr bw`
//! refills its send queue that way. The same request again and again (a ping-pong, a proxy
//! forwarding fixed blocks): [`qp::QueuePair::prepare`] checks and translates it once, and each
//! [`qp::PreparedSend::post`] only takes a send-queue slot and rings the doorbell.
//!
//! On tokio (feature `tokio`), `gdr::aio` delivers completions to futures: post a request, await its
//! own completion, drop the future at any point without harm. The device's asynchronous events
//! (port down, a queue pair's fatal error, ...) are read with [`device::DeviceEvents`] (or
//! awaited with `aio::AsyncDeviceEvents`).
//!
//! GPU memory works the same way: allocate a [`cuda::DeviceBuffer`], register it with
//! [`gpu_mr::GpuMemoryRegion::register`] (the pointer is checked with `cuPointerGetAttributes`,
//! then registered through dma-buf or peer memory, whichever the host supports) and slice it like
//! a host region. Nothing the CPU would have to read from GPU memory (inline sends, byte views) is
//! offered for it.
//!
//! With the feature `serde`, the plain-data types that describe GPU memory and its registration
//! ([`cuda::GpuInfo`], [`cuda::PointerInfo`], [`gpu_mr::GpuRange`], [`gpu_mr::PathInputs`],
//! [`gpu_mr::RegistrationPath`], [`gpu_mr::SystemFacts`], [`gpu_mr::PeerMemory`],
//! [`gpu_mr::NicDmaBuf`]) implement serde's `Serialize` and `Deserialize`, to be recorded; it is
//! off by default (gdr itself serializes nothing).
//!
//! ## Soundness
//!
//! Safe code cannot cause undefined behaviour: a posted request keeps every region it references
//! alive until its completion is reaped ([`cq::CompletionQueue::poll`]) or the queue pair is reset
//! or destroyed; ranges and the queue pair's state are checked before anything reaches the
//! provider, and a post the provider may have queued counts as posted even when it reported an
//! error; every completion is attributed by QP number, incarnation tag and sequence number (see
//! `inflight.rs`), so a completion of a destroyed or reset queue pair never retires a live
//! request; a completion queue polled from several threads reports each completion once, in
//! order; memory the NIC may write is only reachable through copies or `unsafe` views with a
//! written contract; nothing panics on missing hardware or libraries or on hostile arguments
//! (every such case is an [`Error`] with a hint, a matchable variant).

#![deny(missing_docs)]
#![warn(unsafe_op_in_unsafe_fn)]
#![warn(unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(feature = "tokio")]
pub mod aio;
pub mod connect;
pub mod cq;
pub mod cuda;
pub mod device;
pub mod error;
pub mod gpu_mr;
mod inflight;
pub mod mr;
pub mod pd;
pub mod qp;
mod raw_enum;
mod return_code;
pub mod wr;

pub use error::{Error, Hint, Result};

pub use cq::{Completion, CompletionQueue, WcStatus};
pub use device::Context;
/// The old name of [`Context`].
#[deprecated(
    since = "0.1.0",
    note = "one name for one type: use gdr::Context (gdr::device::Context)"
)]
pub type DeviceContext = device::Context;
pub use gpu_mr::GpuMemoryRegion;
pub use mr::{
    AccessFlags, LocalSlice, MemoryRegion, RegionExt, Registered, RemoteRegion, RemoteSlice,
};
pub use pd::ProtectionDomain;
pub use qp::{Endpoint, QpState, QueuePair, WorkQueue};
pub use wr::{Operation, RecvRequest, SendRequest};

/// The traits a program using gdr needs in scope (`use gdr::prelude::*;`): slicing and describing
/// registered regions.
pub mod prelude {
    pub use crate::mr::{RegionExt, Registered};
}
