//! Steps 2 and 4 of registration: the pointer must be device memory, the range must lie inside
//! its allocation ([`check_gpu_range`]).

use std::borrow::Cow;

use super::{HINT_HOST_MEMORY, HINT_MANAGED, HINT_NOT_GPUDIRECT_CAPABLE};
use crate::cuda::{self, GpuInfo, PointerInfo, PointerType};
use crate::error::{Error, Hint, Result};

/// A device range that passed the pre-registration checks of [`check_gpu_range`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GpuRange {
    /// What CUDA says about the start address (kind, ordinal, context, allocation).
    pub pointer: PointerInfo,
    /// Start of the range (a device virtual address).
    pub address: u64,
    /// Length in bytes.
    pub len: usize,
    /// The owning GPU with its GPUDirect attributes.
    pub gpu: GpuInfo,
}

/// The checks before any registration: the driver works, `address` is device memory (not host,
/// managed or unknown memory), `address..address+len` lies inside its allocation, and CUDA does
/// not report the allocation as unfit for GPUDirect RDMA
/// (`CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 0`, as the default stream-ordered pool's
/// memory does on the H200 with CUDA 13.0).
///
/// Safe for any address: it only asks the driver ([`cuda::classify`]). The answer holds at the
/// time of the call.
///
/// # Errors
/// [`Error::CudaUnavailable`] without a driver; [`Error::NotGpuMemory`] for host memory;
/// [`Error::InvalidArgument`] for `len == 0` or an address CUDA does not know;
/// [`Error::Unsupported`] for managed memory;
/// [`Error::OutOfBounds`] when the range leaves the allocation.
pub fn check_gpu_range(address: u64, len: usize) -> Result<GpuRange> {
    if len == 0 {
        return Err(Error::invalid(
            format!("GPU range at {address:#x} has length 0"),
            "register at least one byte",
        ));
    }
    let pointer = cuda::classify(address)?;
    match pointer.kind {
        PointerType::Device => {}
        PointerType::Managed => {
            return Err(Error::unsupported(
                format!(
                    "GPUDirect registration of managed (cuMemAllocManaged) memory at {address:#x}"
                ),
                HINT_MANAGED,
            ))
        }
        PointerType::HostPinned | PointerType::PageableHost => {
            return Err(Error::NotGpuMemory {
                address,
                kind: pointer.kind,
                hint: HINT_HOST_MEMORY.into(),
            })
        }
        PointerType::Unknown => {
            return Err(Error::invalid(
                format!(
                    "{address:#x} is neither CUDA memory nor mapped in this process (cuPointerGetAttributes)"
                ),
                "pass a pointer from cuMemAlloc/cuMemAllocAsync that is still allocated",
            ))
        }
    }
    let (Some(base), Some(size)) = (pointer.allocation_base, pointer.allocation_len) else {
        return Err(Error::invalid(
            format!("the driver reports no allocation range for device pointer {address:#x}"),
            Hint::NONE,
        ));
    };
    range_in_allocation(address, len, base, size)?;
    if pointer.gpu_direct_rdma_capable == Some(false) {
        return Err(Error::unsupported(
            format!(
                "GPUDirect RDMA on the allocation at {base:#x} ({size} bytes): CUDA reports \
                 CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 0"
            ),
            HINT_NOT_GPUDIRECT_CAPABLE,
        ));
    }
    let gpu = cuda::device_info(pointer.ordinal.unwrap_or(0))?;
    Ok(GpuRange {
        pointer,
        address,
        len,
        gpu,
    })
}

/// `Ok` when `address..address + len` lies inside the allocation `base..base + size`, with
/// checked arithmetic throughout (an address below the base, or a range past `u64::MAX`, is out
/// of bounds, never an overflow).
pub(crate) fn range_in_allocation(address: u64, len: usize, base: u64, size: u64) -> Result<()> {
    let offset = address.checked_sub(base);
    let fits = offset
        .and_then(|o| o.checked_add(len as u64))
        .is_some_and(|end| end <= size);
    if fits {
        return Ok(());
    }
    Err(Error::OutOfBounds {
        what: Cow::Owned(format!(
            "GPU range {address:#x}+{len} in its allocation (base {base:#x}, {size} bytes, from \
             the driver)"
        )),
        offset: offset.unwrap_or(0),
        len: len as u64,
        limit: size,
        hint: Hint::new("register a range that lies inside one cuMemAlloc allocation"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert!(range_in_allocation(0x1000, 0x100, 0x1000, 0x100).is_ok());
        assert!(range_in_allocation(0x1080, 0x80, 0x1000, 0x100).is_ok());
        for (address, len, base, size) in [
            (0x1080, 0x81, 0x1000, 0x100),
            (0x0fff, 1, 0x1000, 0x100),
            (u64::MAX - 10, usize::MAX, u64::MAX - 20, 100),
            (u64::MAX, 1, 0, u64::MAX),
        ] {
            match range_in_allocation(address, len, base, size) {
                Err(Error::OutOfBounds { limit, .. }) => assert_eq!(limit, size),
                other => panic!("{address:#x}+{len} in {base:#x}+{size}: {other:?}"),
            }
        }
    }
}
