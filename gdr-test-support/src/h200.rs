//! The H200 of the GPU test machine, as its CUDA driver reported it: the GPU of the recorded
//! inputs of gdr's `cuda_host` tests and gdr-doctor's `doctor_rules` tests, which both take it
//! from here, so registration and the doctor are tested on the same GPU.

use gdr::cuda::GpuInfo;

/// The H200 (CUDA 13.0 driver, every GPUDirect attribute on).
pub fn h200() -> GpuInfo {
    GpuInfo {
        ordinal: 0,
        name: "NVIDIA H200".into(),
        pci_bus_id: "0000:00:06.0".into(),
        total_memory: 143_771 * 1024 * 1024,
        compute_capability_major: 9,
        compute_capability_minor: 0,
        gpu_direct_rdma_supported: true,
        dma_buf_supported: true,
        gpu_direct_rdma_with_vmm_supported: true,
        flush_writes_options: 1,
        writes_ordering: 100,
        unified_addressing: true,
        memory_pools_supported: true,
    }
}
