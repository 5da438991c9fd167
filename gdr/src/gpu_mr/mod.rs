//! GPU memory registered for RDMA: [`GpuMemoryRegion`].
//!
//! Registration follows a fixed procedure, one file per step:
//!
//! 1. **Capabilities** (`probe.rs`), probed once per process and per NIC and cached: the CUDA
//!    driver version and the GPU's GPUDirect attributes ([`crate::cuda::GpuInfo`]), the host's
//!    kernel modules, memory peers, NVIDIA module and kernel release ([`system_facts`], read by
//!    [`facts::FactReader`]), and whether the NIC imports dma-bufs ([`probe_nic_dma_buf`]:
//!    `ibv_reg_dmabuf_mr` with fd -1; `EBADF` means yes).
//! 2. **Pointer check** (`range.rs`, [`check_gpu_range`]): `cuPointerGetAttributes` must say
//!    device memory. Managed memory is refused (it would pin CPU pages and silently test the
//!    wrong path), host memory is sent to [`crate::mr::MemoryRegion`], addresses CUDA does not
//!    know are refused.
//! 3. **Context**: the memory's own context is made current (the device's primary context for
//!    pool allocations, which have none) and restored afterwards; `SYNC_MEMOPS` is set.
//! 4. **Range**: the requested bytes must lie inside the allocation.
//! 5. **Path** (`path.rs`, [`choose_path`], a pure function of the recorded inputs
//!    [`PathInputs`]): dma-buf when every prerequisite of [`rules`] holds, else peer memory when a
//!    module is loaded; or the path the caller forces with [`RegistrationPath`]. The doctor (the
//!    `gdr-doctor` crate) reads its snapshots with the same [`rules`].
//! 6. **dma-buf** (`dma_buf.rs`): `cuMemGetHandleForAddressRange(DMA_BUF_FD)` on the
//!    host-page-aligned range, then `ibv_reg_dmabuf_mr(pd, offset, len, iova = GPU address, fd,
//!    access)`. rdma-core stores the offset, not the address, in `ibv_mr::addr` for such regions,
//!    so the IOVA is recorded here. **Peer memory**: `ibv_reg_mr_iova2` with relaxed ordering,
//!    retried without it on `EINVAL`, `ibv_reg_mr` where `iova2` is unsupported.
//! 7. The path used is in [`GpuMemoryRegion::path`] and in the `info` log (`region.rs`).
//! 8. **Flush** (`flush.rs`): [`GpuMemoryRegion::flush_rdma_writes`] before a kernel reads what
//!    RDMA wrote, where the GPU needs it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use gdr::cuda::DeviceBuffer;
//! use gdr::gpu_mr::{GpuMemoryRegion, RegistrationPath};
//! use gdr::mr::{AccessFlags, Registered};
//! # fn main() -> gdr::Result<()> {
//! let ctx = gdr::device::Context::open("mlx5_0")?;
//! let pd = gdr::pd::ProtectionDomain::new(&ctx)?;
//! let buf = Arc::new(DeviceBuffer::alloc(0, 1 << 20)?);
//! let mr = GpuMemoryRegion::register(&pd, buf, .., AccessFlags::remote_rw(), RegistrationPath::Auto)?;
//! println!("GPU region rkey={:#x} via {}", mr.rkey(), mr.path());
//! # Ok(()) }
//! ```

mod dma_buf;
pub mod facts;
mod flush;
mod path;
mod probe;
mod range;
mod region;
pub mod rules;

pub use dma_buf::{export_dma_buf, export_dma_buf_at, page_aligned, DmaBufExport};
pub use flush::{flush_method, FlushMethod, FlushOutcome};
pub use path::{choose_path, registration_error, PathInputs, RegistrationPath};
pub use probe::{
    peer_memory, probe_nic_dma_buf, probe_nic_dma_buf_by_name, probe_peer_memory, system_facts,
};
pub use range::{check_gpu_range, GpuRange};
pub use region::GpuMemoryRegion;
pub use rules::{
    NicDmaBuf, PeerMemory, SystemFacts, HINT_DRIVER_NO_DMA_BUF, HINT_GPU_NO_DMA_BUF,
    HINT_KERNEL_NO_DMA_BUF, HINT_NIC_NO_DMA_BUF, HINT_NO_GPUDIRECT, HINT_PEER_MEMORY,
};

/// Hint for managed memory.
pub const HINT_MANAGED: &str = "allocate with cuMemAlloc or cuMemAllocAsync \
     (gdr::cuda::DeviceBuffer): registering managed memory would pin CPU pages and silently \
     measure the host path";
/// Hint for device memory whose allocation is not GPUDirect RDMA capable.
pub const HINT_NOT_GPUDIRECT_CAPABLE: &str =
    "allocate with cuMemAlloc (gdr::cuda::DeviceBuffer::alloc), \
     or with cuMemCreate and allocFlags.gpuDirectRDMACapable = 1; memory from the default \
     stream-ordered pool (cuMemAllocAsync) is not GPUDirect RDMA capable";
/// Hint for host memory passed as GPU memory.
pub const HINT_HOST_MEMORY: &str =
    "this is host memory: register it with gdr::mr::MemoryRegion instead";
