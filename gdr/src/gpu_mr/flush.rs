//! Step 8 of the design: making RDMA-written data visible to GPU kernels
//! ([`super::GpuMemoryRegion::flush_rdma_writes`]).

use gdr_sys::cuda as cu;

use crate::cuda::{self, GpuInfo};
use crate::error::{Error, Result};

/// What [`super::GpuMemoryRegion::flush_rdma_writes`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushOutcome {
    /// The GPU orders RDMA writes before later kernels (`writes_ordering >= 100`): nothing to do.
    NotNeeded,
    /// `cuFlushGPUDirectRDMAWrites(CURRENT_CTX, TO_OWNER)` ran.
    Flushed,
}

/// How RDMA-written data must be made visible to GPU kernels on `gpu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushMethod {
    /// Nothing: the GPU orders them (`writes_ordering >= 100`).
    NotNeeded,
    /// `cuFlushGPUDirectRDMAWrites` (the driver has it and the GPU offers the HOST option).
    CuFlush,
    /// Neither: the consumer must post a 1-byte RDMA READ from the region on the same queue pair
    /// and wait for its completion before launching the kernel (what NCCL does).
    RdmaRead,
}

/// Chooses the flush from the GPU's attributes and whether the driver has the flush call.
pub fn flush_method(gpu: &GpuInfo, driver_has_flush: bool) -> FlushMethod {
    if !gpu.needs_flush() {
        FlushMethod::NotNeeded
    } else if driver_has_flush && gpu.flush_writes_options & 1 != 0 {
        FlushMethod::CuFlush
    } else {
        FlushMethod::RdmaRead
    }
}

/// Runs the flush [`flush_method`] chooses for `gpu`, in its primary context.
pub(super) fn flush(gpu: &GpuInfo) -> Result<FlushOutcome> {
    match flush_method(gpu, cuda::has_symbol("cuFlushGPUDirectRDMAWrites")) {
        FlushMethod::NotNeeded => Ok(FlushOutcome::NotNeeded),
        FlushMethod::RdmaRead => Err(Error::unsupported(
            format!(
                "cuFlushGPUDirectRDMAWrites on GPU {} (writes_ordering {}, flush options {:#x})",
                gpu.ordinal, gpu.writes_ordering, gpu.flush_writes_options
            ),
            "post a 1-byte RDMA READ from this region on the same queue pair and wait for its \
             completion before the kernel reads the data",
        )),
        FlushMethod::CuFlush => {
            let _ctx = cuda::ContextGuard::primary(gpu.ordinal)?;
            // SAFETY: initialised driver with the symbol present (checked); a context of the
            // owning device is current and retained by the guard.
            let rc = unsafe {
                cu::cuFlushGPUDirectRDMAWrites(
                    cu::CUflushGPUDirectRDMAWritesTarget::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                    cu::CUflushGPUDirectRDMAWritesScope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER,
                )
            };
            cuda::check(
                rc,
                "cuFlushGPUDirectRDMAWrites",
                || {
                    format!(
                        "target=CURRENT_CTX, scope=TO_OWNER, ordinal={}",
                        gpu.ordinal
                    )
                },
                cuda::no_hint,
            )?;
            Ok(FlushOutcome::Flushed)
        }
    }
}
