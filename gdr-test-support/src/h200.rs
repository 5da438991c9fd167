//! The H200 of the GPU test machine, as its CUDA driver reported it: the GPU of the recorded
//! inputs of gdr's `cuda_host` tests and gdr-doctor's `doctor_rules` tests, which both take it
//! from here, so registration and the doctor are tested on the same GPU. The machine's full probe
//! (kernel config, driver, nvidia-smi, PCI devices, CUDA attributes) is
//! `gdr-test-support/fixtures/h200-vm-probe.txt`.

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

#[cfg(test)]
mod tests {
    use super::h200;

    const PROBE: &str = include_str!("../fixtures/h200-vm-probe.txt");

    /// The value after `key ` on the probe's line that starts with it.
    fn attr(key: &str) -> &'static str {
        PROBE
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {key} in the probe"))
    }

    /// The recorded GpuInfo says what the machine's probe says.
    #[test]
    fn h200_matches_the_recorded_probe() {
        let g = h200();
        assert!(
            PROBE.contains("NVIDIA H200, 00000000:00:06.0, 580.159.04, 143771 MiB"),
            "nvidia-smi's line"
        );
        assert_eq!(g.name, "NVIDIA H200");
        assert_eq!(g.pci_bus_id, "0000:00:06.0");
        assert_eq!(g.total_memory, 143_771 * 1024 * 1024);
        assert_eq!(attr("driver"), "13000", "CUDA 13.0");
        let on = |k: &str| attr(&format!("CU_DEVICE_ATTRIBUTE_{k}")) == "1";
        assert_eq!(g.gpu_direct_rdma_supported, on("GPU_DIRECT_RDMA_SUPPORTED"));
        assert_eq!(g.dma_buf_supported, on("DMA_BUF_SUPPORTED"));
        assert_eq!(
            g.gpu_direct_rdma_with_vmm_supported,
            on("GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED")
        );
        assert_eq!(g.unified_addressing, on("UNIFIED_ADDRESSING"));
        assert_eq!(
            g.flush_writes_options.to_string(),
            attr("CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS")
        );
        assert_eq!(
            g.writes_ordering.to_string(),
            attr("CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING")
        );
    }
}
