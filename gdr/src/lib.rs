//! # gdr: safe GPUDirect RDMA for Rust
//!
//! An RDMA NIC (InfiniBand HCA or RoCE NIC) reads and writes GPU memory directly: no copy through
//! host memory, no CPU on the data path. `gdr` wraps ibverbs, rdma_cm and the CUDA driver API in
//! RAII types that safe code cannot misuse, checks device pointers with `cuPointerGetAttributes`
//! before any registration, and explains why GPUDirect does not work where it does not
//! ([`doctor`]).
//!
//! Data flows one way, one module per stage:
//! find a device ([`device`]) -> open it -> allocate a protection domain ([`pd`]) -> register
//! memory ([`mr`] for host, [`gpu_mr`] for GPU) -> create completion queues ([`cq`]) and a queue
//! pair ([`qp`]) -> exchange endpoints with the peer ([`connect`]) -> post work requests ([`wr`]) ->
//! reap completions.
//!
//! Parents are kept alive by `Arc`: a queue pair holds its protection domain and completion
//! queues, a region its protection domain, a protection domain its device context.

#![deny(missing_docs)]
#![warn(unsafe_op_in_unsafe_fn)]

pub mod connect;
pub mod cq;
pub mod cuda;
pub mod device;
pub mod doctor;
pub mod error;
pub mod gpu_mr;
pub mod mr;
pub mod pd;
pub mod qp;
pub mod topology;
pub mod wr;

pub use error::{Error, Hint, Result};
