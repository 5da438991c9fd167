//! Step 6 of registration, dma-buf side: exporting a host-page-aligned device range as a dma-buf
//! (`cuMemGetHandleForAddressRange`).

use std::borrow::Cow;
use std::ops::RangeBounds;
use std::os::fd::{FromRawFd, OwnedFd};

use gdr_sys::cuda as cu;

use super::range::{check_gpu_range, GpuRange};
use super::rules::{HINT_DRIVER_NO_DMA_BUF, HINT_GPU_NO_DMA_BUF};
use crate::cuda::{self, DeviceMemory};
use crate::error::{Error, Hint, Result};

/// A dma-buf file descriptor exported for a host-page-aligned device range.
#[derive(Debug)]
pub struct DmaBufExport {
    /// The dma-buf (closed on drop).
    pub fd: OwnedFd,
    /// The page-aligned start that was exported (the address aligned down).
    pub aligned_start: u64,
    /// The page-aligned length that was exported (the end aligned up).
    pub aligned_len: u64,
    /// Offset of the requested address inside the dma-buf.
    pub offset: u64,
}

/// `(start aligned down, length aligned up to whole pages, offset of address)` for `page`, a
/// power of two.
///
/// # Errors
/// [`Error::InvalidArgument`] when `page` is not a power of two; [`Error::OutOfBounds`] when the
/// range's end, aligned up, lies beyond `u64::MAX` (e.g. `page_aligned(u64::MAX - 10, 100, 4096)`).
pub fn page_aligned(address: u64, len: u64, page: u64) -> Result<(u64, u64, u64)> {
    if !page.is_power_of_two() {
        return Err(Error::invalid(
            format!("page size {page} is not a power of two"),
            "pass the host page size (gdr::mr::page_size())",
        ));
    }
    let mask = page - 1;
    let start = address & !mask;
    let end = address
        .checked_add(len)
        .and_then(|e| e.checked_add(mask))
        .map(|e| e & !mask)
        .ok_or_else(|| Error::OutOfBounds {
            what: Cow::Owned(format!(
                "page-aligned range of {address:#x}+{len} (pages of {page} bytes)"
            )),
            offset: address,
            len,
            limit: u64::MAX,
            hint: Hint::new("the range's end, rounded up to a page, must not pass u64::MAX"),
        })?;
    Ok((start, end - start, address - start))
}

/// Exports `range` of `memory` (`..` for all of it) as a dma-buf
/// (`cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)`), aligning it to host
/// pages and reporting the offset, with the memory's own context current. The borrow keeps the
/// allocation alive during the call.
///
/// # Errors
/// [`Error::OutOfBounds`] for a range outside `memory`; those of [`check_gpu_range`];
/// [`Error::Unsupported`] when the driver or GPU cannot export; [`Error::Cuda`] when the export
/// fails.
pub fn export_dma_buf(
    memory: &(impl DeviceMemory + ?Sized),
    range: impl RangeBounds<usize>,
) -> Result<DmaBufExport> {
    let (offset, len) = crate::mr::resolve_range("dma-buf export range", range, memory.len())?;
    let address = memory
        .device_ptr()
        .checked_add(offset as u64)
        .ok_or_else(|| Error::invalid("device address overflows", Hint::NONE))?;
    // SAFETY: `DeviceMemory` keeps the allocation alive while `memory` is borrowed, which covers
    // this call; the range lies inside it (resolved against its length).
    unsafe { export_dma_buf_at(address, len) }
}

/// [`export_dma_buf`] for device memory that something else owns (another framework's
/// allocator).
///
/// # Safety
/// The allocation holding `address..address + len` must stay allocated (and its context alive)
/// until this call returns: its context is made current for the export.
///
/// # Errors
/// As [`export_dma_buf`].
pub unsafe fn export_dma_buf_at(address: u64, len: usize) -> Result<DmaBufExport> {
    let range = check_gpu_range(address, len)?;
    // SAFETY: the caller keeps the allocation, and so its context, alive during this call.
    let _ctx = unsafe { range.pointer.make_context_current() }?;
    export_in_context(&range)
}

/// The export, with the memory's context already current (the caller's guard).
pub(super) fn export_in_context(range: &GpuRange) -> Result<DmaBufExport> {
    let version = cuda::driver_version()?;
    if version < super::rules::DMA_BUF_MIN_DRIVER_VERSION
        || !cuda::has_symbol("cuMemGetHandleForAddressRange")
    {
        return Err(Error::unsupported(
            format!(
                "dma-buf export: CUDA driver {} lacks cuMemGetHandleForAddressRange",
                cuda::version_text(version)
            ),
            HINT_DRIVER_NO_DMA_BUF,
        ));
    }
    if !range.gpu.dma_buf_supported {
        return Err(Error::unsupported(
            format!(
                "dma-buf export: GPU {} reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0",
                range.gpu.ordinal
            ),
            HINT_GPU_NO_DMA_BUF,
        ));
    }
    let page = crate::mr::page_size() as u64;
    let (start, aligned_len, offset) = page_aligned(range.address, range.len as u64, page)?;
    let size = usize::try_from(aligned_len)
        .map_err(|_| Error::invalid(format!("{aligned_len} bytes do not fit usize"), Hint::NONE))?;
    let mut fd: libc::c_int = -1;
    // SAFETY: initialised driver, the memory's context is current (caller), the out-pointer is a
    // valid int as the DMA_BUF_FD handle type requires; the range is not dereferenced.
    let rc = unsafe {
        cu::cuMemGetHandleForAddressRange(
            (&mut fd as *mut libc::c_int).cast(),
            start,
            size,
            cu::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    cuda::check(
        rc,
        "cuMemGetHandleForAddressRange",
        || {
            format!(
                "dptr={start:#x}, size={aligned_len}, handleType=DMA_BUF_FD (requested {:#x}+{})",
                range.address, range.len
            )
        },
        |rc| match rc {
            cu::CUresult::CUDA_ERROR_NOT_SUPPORTED => HINT_GPU_NO_DMA_BUF.into(),
            cu::CUresult::CUDA_ERROR_INVALID_VALUE => {
                Hint::new("the page-aligned range must lie in one allocation: allocate whole pages")
            }
            _ => Hint::NONE,
        },
    )?;
    if fd < 0 {
        return Err(Error::unsupported(
            format!("cuMemGetHandleForAddressRange returned fd {fd}"),
            HINT_GPU_NO_DMA_BUF,
        ));
    }
    // SAFETY: the driver handed us a new file descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(DmaBufExport {
        fd,
        aligned_start: start,
        aligned_len,
        offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_keeps_the_offset() {
        assert_eq!(
            page_aligned(0x10000, 4096, 4096).unwrap(),
            (0x10000, 4096, 0)
        );
        assert_eq!(
            page_aligned(0x10010, 100, 4096).unwrap(),
            (0x10000, 4096, 0x10)
        );
        assert_eq!(
            page_aligned(0x10ff0, 0x20, 4096).unwrap(),
            (0x10000, 0x2000, 0xff0)
        );
        // The last page whose end is representable still aligns; the very last one's end
        // (2^64) is not.
        assert_eq!(
            page_aligned(u64::MAX - 8191, 4096, 4096).unwrap(),
            (u64::MAX - 8191, 4096, 0)
        );
        assert!(page_aligned(u64::MAX - 4095, 4096, 4096).is_err());
    }

    #[test]
    fn alignment_past_the_address_space_is_an_error() {
        // Finding 5: this overflowed.
        for (address, len) in [(u64::MAX - 10, 100), (u64::MAX - 10, 5), (1, u64::MAX)] {
            match page_aligned(address, len, 4096) {
                Err(Error::OutOfBounds { offset, len: l, .. }) => {
                    assert_eq!((offset, l), (address, len))
                }
                other => panic!("{address:#x}+{len}: {other:?}"),
            }
        }
        for page in [0, 3, 4097] {
            assert!(matches!(
                page_aligned(0x1000, 1, page),
                Err(Error::InvalidArgument { .. })
            ));
        }
    }
}
