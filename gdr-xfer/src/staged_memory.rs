//! What a staged segment is made of, and how a segment reaches its memory.

use std::sync::Arc;

use gdr::cuda::{DeviceBuffer, DeviceMemory};
use gdr::gpu_mr::RegistrationPath;

use crate::error::Result;

/// How the NIC reaches a segment's memory ([`crate::Segment::path`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SegmentPath {
    /// Registered host memory.
    Host,
    /// GPU memory the NIC reads and writes directly (GPUDirect RDMA), registered this way.
    GpuDirect(RegistrationPath),
    /// GPU memory without a direct path: staged through pinned host bounce buffers. The text
    /// says why and how (the stager's configuration).
    Staged(String),
}

/// The device memory under a staged segment.
#[derive(Clone)]
pub(crate) enum StagedDevice {
    Cuda(Arc<DeviceBuffer>),
    /// GPU memory the application allocated ([`gdr::cuda::ForeignDeviceMemory`], a cudarc
    /// slice), on GPU `ordinal`.
    CudaForeign {
        memory: Arc<dyn DeviceMemory + Send + Sync>,
        ordinal: i32,
    },
    #[cfg(feature = "emulated-gpu")]
    Emulated(Arc<crate::staging::EmulatedGpu>),
}

impl StagedDevice {
    /// The CUDA memory, for the stager's copies (`None` for an emulated GPU).
    pub(crate) fn cuda(&self) -> Option<Arc<dyn DeviceMemory + Send + Sync>> {
        match self {
            StagedDevice::Cuda(b) => Some(b.clone()),
            StagedDevice::CudaForeign { memory, .. } => Some(memory.clone()),
            #[cfg(feature = "emulated-gpu")]
            StagedDevice::Emulated(_) => None,
        }
    }

    /// Which GPU: the key of its bounce buffers (emulated GPUs have their own keys).
    pub(crate) fn key(&self) -> (bool, i32) {
        match self {
            StagedDevice::Cuda(b) => (false, b.ordinal()),
            StagedDevice::CudaForeign { ordinal, .. } => (false, *ordinal),
            #[cfg(feature = "emulated-gpu")]
            StagedDevice::Emulated(g) => (true, g.ordinal() as i32),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            StagedDevice::Cuda(b) => DeviceMemory::len(&**b),
            StagedDevice::CudaForeign { memory, .. } => memory.len(),
            #[cfg(feature = "emulated-gpu")]
            StagedDevice::Emulated(g) => g.len(),
        }
    }

    /// A synchronous copy out of the memory (for [`crate::Segment::read`]).
    pub(crate) fn read(&self, at: usize, out: &mut [u8]) -> Result<()> {
        match self {
            StagedDevice::Cuda(b) => Ok(b.copy_to_host(at, out)?),
            StagedDevice::CudaForeign { memory, ordinal } => {
                Ok(gdr::cuda::copy_to_host_from(&**memory, *ordinal, at, out)?)
            }
            #[cfg(feature = "emulated-gpu")]
            StagedDevice::Emulated(g) => g.read(at, out),
        }
    }

    /// A synchronous copy into the memory (for [`crate::Segment::write`]).
    pub(crate) fn write(&self, at: usize, data: &[u8]) -> Result<()> {
        match self {
            StagedDevice::Cuda(b) => Ok(b.copy_from_host(at, data)?),
            StagedDevice::CudaForeign { memory, ordinal } => Ok(gdr::cuda::copy_from_host_into(
                &**memory, *ordinal, at, data,
            )?),
            #[cfg(feature = "emulated-gpu")]
            StagedDevice::Emulated(g) => g.write(at, data),
        }
    }
}

/// A staged segment's backing: the device memory, which bounce buffers serve it, and the line
/// that says so.
pub(crate) struct StagedMemory {
    pub(crate) device: StagedDevice,
    /// Index of its bounce buffers in the agent's staging driver.
    pub(crate) bounce: usize,
    pub(crate) describe: String,
}
