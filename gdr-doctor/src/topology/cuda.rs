//! Filling [`CudaInfo`] from the CUDA driver (through [`gdr::cuda`]).

use super::{CudaDevice, CudaInfo};

/// Read the CUDA driver version and every device's GPUDirect attributes from this machine's
/// CUDA driver. Never fails: when libcuda is absent or a query fails, the reason is in
/// [`CudaInfo::error`] and the rest stays empty.
pub fn query_cuda() -> CudaInfo {
    let mut info = CudaInfo::default();
    match gdr::cuda::driver_version() {
        Ok(v) => info.driver_version = Some(v),
        Err(e) => {
            info.error = Some(e.to_string());
            return info;
        }
    }
    match gdr::cuda::devices() {
        Ok(devs) => {
            info.devices = devs
                .into_iter()
                .map(|d| CudaDevice {
                    ordinal: d.ordinal,
                    name: d.name,
                    pci_bus_id: d.pci_bus_id,
                    gpudirect_rdma_supported: Some(d.gpu_direct_rdma_supported),
                    dma_buf_supported: Some(d.dma_buf_supported),
                    gpudirect_rdma_with_vmm_supported: Some(d.gpu_direct_rdma_with_vmm_supported),
                    gpudirect_rdma_flush_writes_options: Some(d.flush_writes_options),
                    gpudirect_rdma_writes_ordering: Some(d.writes_ordering),
                })
                .collect()
        }
        Err(e) => info.error = Some(e.to_string()),
    }
    info
}
