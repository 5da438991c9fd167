//! Registered memory: access flags, the [`Registered`] trait every region implements, host
//! [`MemoryRegion`]s that own their buffer, and the slice descriptors work requests take.
//!
//! One concept per file: `access` (flags, kinds), `registered` (the trait, local slices),
//! `remote` (peer regions), `range` (bounds checks), `host` (memory a region can own),
//! `atomic_bytes` (how the CPU touches memory the NIC shares), `region` ([`MemoryRegion`]).
//!
//! # Concurrent access by the CPU and the NIC
//!
//! Memory that the NIC may write (a receive buffer, the target of an RDMA read, anything a peer
//! may write with [`AccessFlags::REMOTE_WRITE`]) is never handed out as `&[u8]`/`&mut [u8]` by
//! safe code. The CPU reaches it only through the copying [`MemoryRegion::read`],
//! [`MemoryRegion::write`], [`MemoryRegion::fill`], [`MemoryRegion::to_vec`] and the polling
//! [`WatchedWord::load`], or through `unsafe` views whose contract says when they are sound.
//!
//! Those copies are made of atomic accesses, so a race between threads, or between a thread and
//! the NIC, is defined behaviour in Rust's memory model (the NIC's DMA is treated like another
//! thread's atomic writes). The unit of access depends only on the address: each aligned 8-byte
//! word inside the buffer is always loaded and stored whole (`AtomicU64`; a copy covering part
//! of a word merges its bytes with a compare-and-swap), and only bytes of a word that straddles
//! the buffer's ends (when the buffer is not 8-aligned) are accessed one by one (`AtomicU8`).
//! Copies use relaxed ordering; [`WatchedWord::load`] uses `Acquire`.
//!
//! What a reader may observe while another thread or a peer writes concurrently:
//!
//! - an aligned 8-byte word that one writer writes whole (a [`MemoryRegion::write`] covering
//!   it, an 8-byte RDMA atomic, a flag word a peer writes) is seen either entirely before or
//!   entirely after that write: never torn. For words the NIC writes as part of a larger
//!   transfer, the granularity is the NIC's (in practice at least 8 aligned bytes);
//! - nothing stronger: a copy of several words may see any mix of old and new words, and the
//!   order in which a transfer's words become visible is not defined. Wait for the completion
//!   (or for a flag the peer writes after the data) before relying on the data.

mod access;
mod atomic_bytes;
mod foreign;
mod host;
mod range;
mod region;
mod registered;
mod remote;

pub use access::{AccessFlags, MemoryKind};
pub use foreign::ForeignHostMemory;
pub use host::{page_size, AlignedBuffer, HostMemory};
pub(crate) use range::resolve_range;
pub use region::{memlock_limit_text, MemoryRegion, WatchedWord};
pub(crate) use registered::inherent_region_methods;
pub use registered::{LocalSlice, RegionExt, Registered};
pub use remote::{RemoteRegion, RemoteSlice};
