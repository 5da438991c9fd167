//! What kind of memory an address is, according to the CUDA driver (`cuPointerGetAttributes`).

use gdr_sys::cuda as sys;

use super::context::{ContextGuard, PrimaryContext};
use super::memory::DeviceMemory;
use super::{check, init, no_hint};
use crate::error::Result;

/// The kind of memory behind an address, as CUDA classifies it (`CU_POINTER_ATTRIBUTE_MEMORY_TYPE`
/// and `IS_MANAGED`). Not to be confused with [`crate::mr::MemoryKind`], which says what a
/// registered region holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum PointerType {
    /// GPU memory (`cuMemAlloc`, `cuMemAllocAsync`, `cuMemCreate`+map): the only kind GPUDirect
    /// RDMA registers.
    Device,
    /// Host memory pinned by CUDA (`cuMemAllocHost`, `cuMemHostAlloc`, `cuMemHostRegister`).
    HostPinned,
    /// Unified memory (`cuMemAllocManaged`), which migrates between CPU and GPU.
    Managed,
    /// Ordinary host memory CUDA does not know (heap, stack, mmap), mapped in this process.
    PageableHost,
    /// An address neither CUDA nor this process's memory map knows.
    Unknown,
}

impl PointerType {
    /// Short lowercase name, e.g. `device`, `host-pinned`.
    pub fn as_str(self) -> &'static str {
        match self {
            PointerType::Device => "device",
            PointerType::HostPinned => "host-pinned",
            PointerType::Managed => "managed",
            PointerType::PageableHost => "pageable-host",
            PointerType::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for PointerType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`classify`] found about one address.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PointerInfo {
    /// The address asked about.
    pub address: u64,
    /// Its kind.
    pub kind: PointerType,
    /// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`: the GPU the memory belongs to (for pinned host
    /// memory, the device of the allocating context). `None` for memory CUDA does not know.
    pub ordinal: Option<i32>,
    /// `CU_POINTER_ATTRIBUTE_CONTEXT` as an integer handle; 0 when the allocation has no context
    /// (stream-ordered pool allocations) or CUDA does not know the address.
    pub context: usize,
    /// Start of the allocation holding the address (`CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`, or
    /// `cuMemGetAddressRange`), if CUDA knows it.
    pub allocation_base: Option<u64>,
    /// Length of that allocation in bytes.
    pub allocation_len: Option<u64>,
    /// `CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE`, when the driver reports it.
    pub gpu_direct_rdma_capable: Option<bool>,
    /// `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`: synchronous memory operations on this allocation are
    /// ordered with RDMA (set by [`set_sync_memops`] and by GPU registration).
    pub sync_memops: Option<bool>,
}

impl PointerInfo {
    /// Bytes from [`address`](Self::address) to the end of its allocation; `None` when the
    /// allocation is not known or its recorded range does not hold the address (including a
    /// base + length beyond `u64::MAX`).
    pub fn bytes_to_end(&self) -> Option<u64> {
        let base = self.allocation_base?;
        let end = base.checked_add(self.allocation_len?)?;
        if self.address < base {
            return None;
        }
        end.checked_sub(self.address)
    }

    /// Offset of [`address`](Self::address) inside its allocation, if known.
    pub fn offset_in_allocation(&self) -> Option<u64> {
        self.address.checked_sub(self.allocation_base?)
    }

    /// Makes the memory's own context current: the allocation's context, or the primary context
    /// of its device when it has none (pool allocations). The previous context is restored when
    /// the returned guard drops.
    ///
    /// # Safety
    /// The allocation must still be alive (so a non-zero [`context`](Self::context) is valid)
    /// while the guard lives.
    pub unsafe fn make_context_current(&self) -> Result<ContextGuard> {
        if self.context != 0 {
            // SAFETY: the context of a live allocation is alive (caller's contract).
            unsafe { ContextGuard::from_raw(self.context as sys::CUcontext) }
        } else {
            ContextGuard::primary(self.ordinal.unwrap_or(0))
        }
    }
}

/// Classifies `address` with `cuPointerGetAttributes` (memory type, device ordinal, managed flag,
/// context) and, for memory CUDA knows, finds its allocation
/// (`CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` / `RANGE_SIZE`).
///
/// Any address may be passed, also one another thread frees meanwhile: the driver only looks the
/// address up, nothing is dereferenced, and no context handle reported for it is ever made
/// current (which would be undefined behaviour once the allocation and its context are gone).
/// Where the driver lacks the range attributes, `cuMemGetAddressRange` runs under the device's
/// primary context, retained for the call. The answer describes the address at the time of the
/// call; use it for an allocation you own (e.g. a [`super::DeviceBuffer`]) to rely on it later.
///
/// # Errors
/// [`crate::Error::CudaUnavailable`] without a driver; [`crate::Error::Cuda`] if the driver
/// rejects the query.
pub fn classify(address: u64) -> Result<PointerInfo> {
    use sys::CUpointer_attribute as P;
    init()?;
    let mut attrs = [
        P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        P::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        P::CU_POINTER_ATTRIBUTE_CONTEXT,
    ];
    // Every slot is 8 zeroed bytes: large enough for each attribute's type (unsigned int, int,
    // bool, CUcontext); the low bytes hold the value on little- and big-endian alike for the
    // zero/non-zero tests, and we read 32-bit values from the first 4 bytes.
    let mut slots = [[0u8; 8]; 4];
    let mut data: [*mut libc::c_void; 4] = [
        slots[0].as_mut_ptr().cast(),
        slots[1].as_mut_ptr().cast(),
        slots[2].as_mut_ptr().cast(),
        slots[3].as_mut_ptr().cast(),
    ];
    // SAFETY: initialised driver; `attrs` and `data` have 4 entries each, every data pointer points
    // to 8 writable bytes, enough for the attribute's type; `address` is not dereferenced (the
    // driver answers with null values for addresses it does not know).
    let rc = unsafe {
        sys::cuPointerGetAttributes(
            attrs.len() as u32,
            attrs.as_mut_ptr(),
            data.as_mut_ptr(),
            address,
        )
    };
    check(
        rc,
        "cuPointerGetAttributes",
        || format!("ptr={address:#x}, attributes=MEMORY_TYPE,DEVICE_ORDINAL,IS_MANAGED,CONTEXT"),
        no_hint,
    )?;
    let u32_at = |i: usize| u32::from_ne_bytes(slots[i][..4].try_into().unwrap_or([0; 4]));
    let memory_type = u32_at(0);
    let ordinal = u32_at(1) as i32;
    let managed = slots[2].iter().any(|b| *b != 0);
    let context = u64::from_ne_bytes(slots[3]) as usize;

    // CU_MEMORYTYPE_HOST = 1, DEVICE = 2, ARRAY = 3, UNIFIED = 4; 0: CUDA does not know it.
    let kind = if managed {
        PointerType::Managed
    } else {
        match memory_type {
            2 | 3 => PointerType::Device,
            1 => PointerType::HostPinned,
            4 => PointerType::Managed,
            _ => {
                if host_mapping_contains(address) {
                    PointerType::PageableHost
                } else {
                    PointerType::Unknown
                }
            }
        }
    };
    let mut info = PointerInfo {
        address,
        kind,
        ordinal: None,
        context: 0,
        allocation_base: None,
        allocation_len: None,
        gpu_direct_rdma_capable: None,
        sync_memops: None,
    };
    if matches!(kind, PointerType::PageableHost | PointerType::Unknown) {
        return Ok(info);
    }
    info.ordinal = (ordinal >= 0).then_some(ordinal);
    info.context = context;

    let start = u64_attribute(P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, address);
    let size = u64_attribute(P::CU_POINTER_ATTRIBUTE_RANGE_SIZE, address);
    match (start, size) {
        (Some(base), Some(size)) if size > 0 => {
            info.allocation_base = Some(base);
            info.allocation_len = Some(size);
        }
        _ => {
            // An older driver without the range attributes: ask cuMemGetAddressRange under a
            // context we own (the device's primary context, retained here), never under the
            // reported context, which another thread may destroy meanwhile.
            let primary = PrimaryContext::retain(info.ordinal.unwrap_or(0))?;
            // SAFETY: `primary` is declared before `_guard`, so the guard drops first.
            let _guard = unsafe { primary.make_current() }?;
            let mut base: sys::CUdeviceptr = 0;
            let mut size: usize = 0;
            // SAFETY: initialised driver, a context is current, valid out-pointers; the address
            // is only looked up.
            let rc = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, address) };
            if rc == sys::CUresult::CUDA_SUCCESS {
                info.allocation_base = Some(base);
                info.allocation_len = Some(size as u64);
            } else if kind != PointerType::HostPinned {
                // Pinned host memory may legitimately have no device range; device memory must.
                check(
                    rc,
                    "cuMemGetAddressRange",
                    || format!("dptr={address:#x}, kind={kind}"),
                    no_hint,
                )?;
            }
        }
    }
    info.gpu_direct_rdma_capable =
        u64_attribute(P::CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, address).map(|v| v != 0);
    info.sync_memops = u64_attribute(P::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, address).map(|v| v != 0);
    Ok(info)
}

/// One pointer attribute of at most 8 bytes, zero-extended; `None` if the driver does not report
/// it (older drivers, unknown addresses).
fn u64_attribute(attr: sys::CUpointer_attribute, address: u64) -> Option<u64> {
    let mut v: u64 = 0;
    // SAFETY: initialised driver (callers ran init()); 8 writable bytes hold the attribute's
    // unsigned int / bool / CUdeviceptr / size_t; the address is only looked up, never
    // dereferenced.
    let rc = unsafe { sys::cuPointerGetAttribute((&mut v as *mut u64).cast(), attr, address) };
    (rc == sys::CUresult::CUDA_SUCCESS).then_some(v)
}

/// Sets `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` on the allocation behind `memory`, so synchronous
/// CUDA memory operations on it (cuMemcpy, cuMemset) complete before returning and do not race
/// with RDMA into the same memory (the GPUDirect RDMA documentation asks for it). Runs in the
/// memory's own context. The borrow keeps the allocation (and so its context) alive for the call.
///
/// # Errors
/// [`crate::Error::CudaUnavailable`] without a driver; [`crate::Error::InvalidArgument`] when the
/// memory is not CUDA device or managed memory; [`crate::Error::Cuda`] from the driver.
pub fn set_sync_memops(memory: &(impl DeviceMemory + ?Sized)) -> Result<()> {
    // SAFETY: `DeviceMemory` guarantees the allocation stays alive while `memory` is borrowed,
    // which covers this call.
    unsafe { set_sync_memops_at(memory.device_ptr()) }
}

/// [`set_sync_memops`] for an address whose owner is not a [`DeviceMemory`] (another framework's
/// allocator).
///
/// # Safety
/// The allocation holding `address` must stay allocated until this call returns: its context is
/// made current, and a destroyed context must not be.
///
/// # Errors
/// As [`set_sync_memops`].
pub unsafe fn set_sync_memops_at(address: u64) -> Result<()> {
    let info = classify(address)?;
    if !matches!(info.kind, PointerType::Device | PointerType::Managed) {
        return Err(crate::Error::invalid(
            format!(
                "SYNC_MEMOPS on {address:#x}: {} memory is not CUDA device memory",
                info.kind
            ),
            "pass a pointer from cuMemAlloc",
        ));
    }
    // SAFETY: the caller keeps the allocation (and so its context) alive during this call.
    let _ctx = unsafe { info.make_context_current() }?;
    let one: u32 = 1;
    // SAFETY: initialised driver, the memory's context is current, SYNC_MEMOPS takes an unsigned
    // int; the address is not dereferenced.
    let rc = unsafe {
        sys::cuPointerSetAttribute(
            (&one as *const u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
            address,
        )
    };
    check(
        rc,
        "cuPointerSetAttribute",
        || format!("attribute=SYNC_MEMOPS, value=1, ptr={address:#x}"),
        no_hint,
    )
}

/// `true` if `address` lies in a mapping listed in `/proc/self/maps`.
fn host_mapping_contains(address: u64) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    maps_contain(&maps, address)
}

/// Parses `/proc/<pid>/maps` text: `start-end perms ...` in hex.
pub(crate) fn maps_contain(maps: &str, address: u64) -> bool {
    maps.lines().any(|line| {
        let range = line.split_whitespace().next().unwrap_or("");
        let Some((s, e)) = range.split_once('-') else {
            return false;
        };
        match (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) {
            (Ok(s), Ok(e)) => s <= address && address < e,
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(base: Option<u64>, len: Option<u64>, address: u64) -> PointerInfo {
        PointerInfo {
            address,
            kind: PointerType::Device,
            ordinal: Some(0),
            context: 0,
            allocation_base: base,
            allocation_len: len,
            gpu_direct_rdma_capable: None,
            sync_memops: None,
        }
    }

    #[test]
    fn bytes_to_end_never_overflows() {
        assert_eq!(
            info(Some(0x1000), Some(0x100), 0x1010).bytes_to_end(),
            Some(0xf0)
        );
        assert_eq!(
            info(Some(0x1000), Some(0x100), 0x1100).bytes_to_end(),
            Some(0)
        );
        // The finding: base + len beyond u64::MAX used to overflow.
        assert_eq!(
            info(Some(u64::MAX - 10), Some(100), u64::MAX - 5).bytes_to_end(),
            None
        );
        assert_eq!(info(Some(0x1000), Some(0x100), 0x10).bytes_to_end(), None);
        assert_eq!(info(Some(0x1000), Some(0x100), 0x2000).bytes_to_end(), None);
        assert_eq!(info(None, Some(0x100), 0x1000).bytes_to_end(), None);
        assert_eq!(info(Some(0x1000), None, 0x1000).bytes_to_end(), None);
        assert_eq!(
            info(Some(0x1000), Some(1), 0x10).offset_in_allocation(),
            None
        );
        assert_eq!(
            info(Some(0x1000), Some(1), u64::MAX).offset_in_allocation(),
            Some(u64::MAX - 0x1000)
        );
    }

    #[test]
    fn maps_parsing_finds_ranges() {
        let maps = "55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0 [heap]\n\
                    7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n";
        assert!(maps_contain(maps, 0x55d0c0000000));
        assert!(maps_contain(maps, 0x55d0c0020fff));
        assert!(!maps_contain(maps, 0x55d0c0021000));
        assert!(!maps_contain(maps, 0x10));
        assert!(!maps_contain("garbage\n", 0x10));
    }

    #[test]
    fn heap_memory_is_in_our_own_map() {
        let v = vec![0u8; 4096];
        assert!(host_mapping_contains(v.as_ptr() as u64));
        assert!(!host_mapping_contains(0x10));
    }
}
