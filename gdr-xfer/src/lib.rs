//! # gdr-xfer: a safe transfer engine on gdr
//!
//! Moves many blocks between machines with one-sided RDMA READ and WRITE: KV-cache blocks,
//! weights, checkpoints. One [`Agent`] per process owns its rails (RDMA ports, each with a
//! completion queue and a progress thread), its registered [`Segment`]s and its [`Peer`]s. A transfer is a list of descriptors, a
//! block table (the paged form: block indices, no struct per block) or indices into prepared
//! lists; it is checked against both segment tables before anything is posted, runs contiguous on
//! both sides are merged, long runs are cut into slices spread over the peer's queue pairs, and an
//! optional notification reaches the target only after every byte landed there.
//!
//! ## Finding a peer directly (no server)
//!
//! ```no_run
//! use std::time::Duration;
//! use gdr_xfer::{Agent, AgentConfig, BlockTable, Op, TransferOptions};
//!
//! // The target (the decode side): a pool of KV blocks that prefill writes into.
//! let target = Agent::new(AgentConfig::new("decode-0").device("mlx5_0"))?;
//! let _pool = target.alloc_host(1024 * 65536, "kv-pool")?;
//! target.listen("0.0.0.0:7100")?;
//!
//! // The initiator (the prefill side), in another process: connect, find the pool, write
//! // blocks 0..128 of its KV cache into blocks 512.. of the target's pool, with a notification
//! // after the data.
//! let agent = Agent::new(AgentConfig::new("prefill-0").device("mlx5_0"))?;
//! let local = agent.alloc_host(128 * 65536, "kv-cache")?;
//! let peer = agent.connect("10.0.0.1:7100")?;
//! let pool = peer.wait_segment_named("kv-pool", Duration::from_secs(5))?;
//! let local_blocks: Vec<u32> = (0..128).collect();
//! let remote_blocks: Vec<u32> = (512..640).collect();
//! let table = BlockTable::new(&local, &local_blocks, pool.id, &remote_blocks, 65536);
//! let opts = TransferOptions::new().timeout(Duration::from_secs(5)).notify("req-42");
//! let stats = peer.transfer_blocks(Op::Write, &table, &opts)?.wait(Duration::from_secs(5))?;
//! println!("{} bytes in {} requests, {:?}", stats.bytes, stats.slices, stats.time_to_complete);
//!
//! // Back on the target: the notification comes after the data.
//! if let Some(n) = target.wait_notification(Duration::from_secs(5))? {
//!     println!("{} says {:?}: its blocks are in the pool", n.peer, n.data);
//! }
//! # Ok::<(), gdr_xfer::Error>(())
//! ```
//!
//! A [`Transfer`] is also a [`Future`](std::future::Future): `.await` it on any executor. So
//! are the async forms of the blocking calls (connecting, waiting for a peer, a segment or a
//! notification), and [`Agent::notifications`] is a stream: see [`futures`].
//!
//! ## Memory safety without a caller's promise
//!
//! The engines this field uses leave buffer lifetimes to the caller ("keep this operation and
//! its buffers alive"). Here a segment owns (host) or holds (GPU) its memory, every request in
//! flight holds the registration it uses (gdr's rule), and a [`Transfer`] handle only observes:
//! drop it, drop the future, deregister the segment, even drop the agent, and the memory is
//! released exactly when the NIC can no longer touch it, never before and never leaked. Bad
//! input is a typed [`Error`] before anything is posted; a transfer past its deadline fails with
//! [`Error::Timeout`]; a peer that dies fails every transfer pending to it with
//! [`Error::PeerLost`].
//!
//! ## Outcomes a caller can trust
//!
//! A transfer's outcome, whatever it is (done, [`Error::Timeout`], [`Error::Cancelled`],
//! [`Error::PeerLost`], [`Error::NoRail`], ...), is reported only once none of its requests
//! can touch its local or remote memory again: from then on both may be reused, and a later
//! transfer into the same memory is never overtaken by this one's bytes. A transfer that stops
//! early (its deadline, [`Transfer::cancel`], a failure) posts nothing more and waits for the
//! requests it had posted; those still in flight [`AgentConfig::quiesce`] later (500 ms by
//! default) are *fenced*: their queue pairs are destroyed (after `ibv_destroy_qp` the NIC
//! touches none of their memory) and renewed with the peer at once, the other transfers'
//! requests on them posted again; a WRITE also waits until the peer confirmed its side of
//! those queue pairs is gone (its packets may still have been on the wire), at most one more
//! quiesce time. So an outcome comes at most `2 x quiesce` plus 5 ms after the deadline. It is
//! `Ok` only when every byte landed (and the notification was delivered): a transfer whose
//! deadline passed after all its bytes had landed reports success.
//!
//! One caller's mistake fails only its own transfer: another agent's segment as the local side
//! is refused before anything is posted ([`Error::ForeignSegment`]), and any other object of
//! another agent given to a call (a parent segment, a segment to deregister, a peer to
//! disconnect), or a remote list of another connection, before anything changes
//! ([`Error::ForeignObject`]); a request the NIC refuses
//! for its own reason (a stale remote key) fails its transfer ([`Error::SliceFailed`]) and the
//! queue pairs it broke are renewed at once, the other transfers' requests posted again.
//!
//! A disconnect or a shutdown stops the transfers in flight the same way (each reports once
//! neither side's memory can be touched by it) before the connection closes.
//!
//! The bookkeeping behind these promises is the sans-IO core [`gdr_xfer_proto`] (transfers,
//! lanes, deadlines, fences, failover, renewal, notifications; the peers, completion routing,
//! handshake and segment tables between connections), driven here by gdr's queue
//! pairs and threads, and checked there by a deterministic simulation of agents over simulated
//! RC queue pairs with faults drawn from a seed (`cargo xtask sim`).
//!
//! ## Finding a peer through etcd (feature `etcd`)
//!
//! Agents publish their address and segments under lease-bound keys; peers are found by name;
//! when an agent's lease ends (it died or hung, even with its sockets open) every transfer
//! pending to it fails at once.
//!
#![cfg_attr(feature = "etcd", doc = "```no_run")]
#![cfg_attr(not(feature = "etcd"), doc = "```ignore")]
//! use std::sync::Arc;
//! use std::time::Duration;
//! use gdr_xfer::directory::{EtcdDirectory, DEFAULT_PREFIX, DEFAULT_TTL};
//! use gdr_xfer::{Agent, AgentConfig};
//!
//! let etcd = vec!["10.0.0.100:2379".to_string()];
//! let dir = Arc::new(EtcdDirectory::connect(&etcd, DEFAULT_PREFIX, DEFAULT_TTL, Duration::from_secs(5))?);
//!
//! // The target (decode) publishes itself.
//! let target = Agent::new(AgentConfig::new("decode-0"))?;
//! let addr = target.listen("10.0.0.1:7100")?;
//! target.publish(dir.clone(), addr)?;
//!
//! // Prefill finds it by name (in another process, with its own directory).
//! let agent = Agent::new(AgentConfig::new("prefill-0"))?;
//! let peer = agent.connect_named(&dir, "decode-0", Duration::from_secs(10))?;
//! # Ok::<(), gdr_xfer::Error>(())
//! ```
//!
//! ## Rails: striping and failover
//!
//! Every port [`AgentConfig::device`] allows is a rail; rail `r` of one agent talks to rail `r`
//! of its peer. Transfers larger than [`AgentConfig::stripe_min`] are striped over the rails
//! nearest their memory (ranked by `gdr_doctor::rank_rails`, the ranking `gdr doctor` prints,
//! from the topology alone unless [`AgentConfig::rails_follow_nccl_env`] asks for NCCL's
//! variables too),
//! each chunk to the rail whose queued bytes drain soonest at its measured throughput. A rail
//! whose request fails is paused for that peer: its queue pairs are destroyed and what they
//! carried is posted again on the other rails, within the transfer's deadline; it is renewed
//! and probed after a growing cool-down, then used again. With no rail usable for a quiesce
//! time (the peer may be renewing it meanwhile), pending transfers fail with
//! [`Error::NoRail`]. [`Peer::rail_stats`] reports each rail ([`RailStats`]).
//!
//! ## GPU memory without GPUDirect
//!
//! [`Agent::register_gpu`] registers GPU memory for the NIC to reach directly; where gdr finds
//! no direct path (no peer-memory module, no dma-buf support), the segment is *staged* instead
//! ([`GpuStaging`]): its transfers go through pinned host bounce buffers, chunk by chunk, with
//! copies overlapping the RDMA ([`staging`]). It is never silent: a warning in the log, and
//! [`Segment::path`] is [`SegmentPath::Staged`] with the line that says how and why;
//! [`Agent::staging_stats`] counts what moved. A staged segment is only ever the local side of
//! a transfer (peers cannot address it). With the feature `emulated-gpu`,
//! `Agent::register_emulated_gpu` takes host bytes for such memory, so that the staged path
//! can be tested where there is no GPU:
//!
#![cfg_attr(feature = "emulated-gpu", doc = "```no_run")]
#![cfg_attr(not(feature = "emulated-gpu"), doc = "```ignore")]
//! use gdr_xfer::staging::EmulatedGpu;
//! use gdr_xfer::{Agent, AgentConfig, Desc, SegmentPath, TransferOptions};
//!
//! let agent = Agent::new(AgentConfig::new("prefill-0").device("rxe0"))?;
//! let gpu = EmulatedGpu::new(0, 64 << 20);
//! let kv = agent.register_emulated_gpu(&gpu, .., "kv")?;
//! assert!(matches!(kv.path(), SegmentPath::Staged(_)));
//! let peer = agent.connect("10.0.0.1:7100")?;
//! let pool = peer.wait_segment_named("kv-pool", std::time::Duration::from_secs(5))?;
//! peer.write(&[Desc::new(&kv, 0, pool.id, 0, 64 << 20)], &TransferOptions::new())?
//!     .wait(std::time::Duration::from_secs(30))?;
//! # Ok::<(), gdr_xfer::Error>(())
//! ```
//!
//! ## Progress
//!
//! Submitting posts at once, in the caller's thread, what the send queues have room for (one
//! doorbell per 32 requests, one signalled request per batch of up to 64, or of 32 where a
//! transfer is spread over several rails); each rail's progress thread reaps its completions, posts the rest
//! as room frees and delivers notifications; any of them (or a waiter past its transfer's
//! deadline) runs the timers: deadlines, fences, renewals. It polls while completions come and
//! sleeps on the completion channel otherwise. The caller never waits for another thread to
//! post. A panic in a completion's handling (a bug) closes that connection only; the threads go
//! on.
//!
//! ## Notifications: bounded
//!
//! A notification's receive slot is posted again as soon as its message is copied out, while
//! the agent keeps fewer than [`AgentConfig::notify_queue`] (1,024) untaken notifications
//! without their slot, counted across all peers and connections; past that, each holds its
//! slot until the application takes it ([`Agent::take_notifications`],
//! [`Agent::wait_notification`]), and the peer's further notifications wait in its NIC
//! (receiver not ready). A peer faster than the application is held back, nothing is lost,
//! and the agent holds at most `notify_queue` plus its connections' receive slots
//! (`notify_slots` per rail and connection) untaken notifications, plus what the application
//! put back ([`Agent::requeue_notification`]). Reconnecting does not reset the bound: the
//! notifications a closed connection's slots held stay queued, and no connection posts a new
//! slot until they are taken.
//!
//! ## Memory the engine keeps per transfer
//!
//! Per transfer: one run record of 32 bytes per descriptor or block that did not merge
//! ([`TransferStats::runs`]; runs contiguous on both sides are one), and one 72-byte record per
//! batch of up to 64 posted requests (1.125 bytes a request when batches are full), kept until the
//! batch completes (the core's host tests pin both sizes). Per request in flight: gdr's entry, a slot of the queue pair's ring (40 bytes,
//! plus 16 for each memory region it holds), allocated once with the queue pair, so bounded by
//! the queues' depth, not by the transfer. Nothing is allocated per block: a paged batch of
//! 100,000 blocks that do not merge keeps 3.2 MB of runs, 128 blocks of 64 KiB keep 4 KiB.

#![deny(missing_docs)]
#![warn(unsafe_op_in_unsafe_fn)]
#![warn(unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod agent;
mod cache;
mod config;
mod connection;
mod control;
mod descriptor;
pub mod directory;
#[cfg(feature = "etcd")]
mod discovery;
pub mod error;
pub mod futures;
mod intake;
mod lanes;
#[cfg(feature = "metrics")]
pub mod metrics;
mod notify;
mod peer;
mod plan;
mod pools;
mod progress;
mod rail;
mod segment;
mod shared;
mod shutdown;
mod side;
mod spacing;
mod staged;
mod staged_memory;
pub mod staging;
mod transfer;
mod transfer_stats;
mod wakers;
// Public for the fuzz targets and the tests that play a hostile peer; the format itself is
// documented in `gdr_xfer_proto::wire`.
#[doc(hidden)]
pub mod wire;

pub use agent::Agent;
pub use cache::CacheStats;
pub use config::{AgentConfig, GpuStaging, TransferOptions};
pub use descriptor::{BlockTable, Desc, LocalList, Op, RemoteList};
pub use error::{Error, Foreign, Hint, Result};
#[doc(hidden)]
pub use futures::WakerCounts;
/// The gdr crate gdr-xfer is built on, so one dependency line is enough for what its API takes
/// from it: [`gdr::cuda::DeviceBuffer`] and [`gdr::cuda::DeviceMemory`] for GPU memory,
/// [`gdr::mr::HostMemory`] and [`gdr::mr::AlignedBuffer`] for host memory.
pub use gdr;
pub use gdr_xfer_proto::{
    DriverError, Location, Lost, ParseLocationError, RailFault, RailReport, RailReports, Rejection,
    SegmentId, TableError,
};
pub use notify::Notification;
pub use peer::Peer;
pub use pools::PoolTable;
pub use rail::{RailState, RailStats};
pub use segment::{RegistrationWeak, Segment};
pub use shutdown::ShutdownReport;
pub use side::Side;
pub use staged::StagingStats;
pub use staged_memory::SegmentPath;
pub use transfer::{Status, Transfer};
pub use transfer_stats::TransferStats;
pub use wire::SegmentInfo;
