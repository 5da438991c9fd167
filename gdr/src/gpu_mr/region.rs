//! Steps 3 to 7 of registration: the region itself ([`GpuMemoryRegion`]), registered through the
//! path [`super::choose_path`] picks.

use std::fmt;
use std::ops::RangeBounds;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;

use gdr_sys::ibv;

use super::dma_buf::{export_in_context, DmaBufExport};
use super::flush::FlushOutcome;
use super::path::{choose_path, registration_error, PathInputs, RegistrationPath};
use super::probe::{probe_nic_dma_buf, system_facts};
use super::range::check_gpu_range;
use crate::cuda::{self, DeviceBuffer, DeviceMemory, GpuInfo};
use crate::error::{Error, Hint, Result};
use crate::mr::{AccessFlags, MemoryKind, Registered};
use crate::pd::ProtectionDomain;
use crate::return_code::teardown;

/// GPU device memory registered with a protection domain.
///
/// Holds what it registered ([`DeviceBuffer`] via `Arc`, for [`register`](Self::register)), the
/// dma-buf fd (dma-buf path) and the protection domain; `Drop` deregisters before any of them is
/// released. The CPU never gets a view of the bytes: [`Registered::kind`] reports
/// [`MemoryKind::Gpu`], so work requests refuse inline sends and CPU reads from it.
pub struct GpuMemoryRegion {
    mr: NonNull<ibv::ibv_mr>,
    iova: u64,
    len: usize,
    ordinal: i32,
    access: AccessFlags,
    path: RegistrationPath,
    relaxed_ordering: bool,
    gpu: GpuInfo,
    dma_buf: Option<DmaBufExport>,
    owner: Option<Owner>,
    pd: Arc<ProtectionDomain>,
}

/// What keeps a region's memory allocated until the region is gone: gdr's own buffer, or any
/// owner of device memory ([`GpuMemoryRegion::register_owned`]).
enum Owner {
    Buffer(Arc<DeviceBuffer>),
    // Held, never read: it keeps the memory allocated.
    Memory(#[allow(dead_code)] Arc<dyn DeviceMemory + Send + Sync>),
}

// SAFETY: ibv_mr handles may be used from any thread; the region never touches the GPU bytes
// itself, and the owned DeviceBuffer / fd are Send + Sync.
unsafe impl Send for GpuMemoryRegion {}
// SAFETY: as above; there is no interior mutability.
unsafe impl Sync for GpuMemoryRegion {}

impl fmt::Debug for GpuMemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuMemoryRegion")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .field("ordinal", &self.ordinal)
            .field("path", &self.path)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.access)
            .field("device", &self.pd.context().name())
            .finish()
    }
}

crate::mr::inherent_region_methods!(GpuMemoryRegion);

impl GpuMemoryRegion {
    /// Registers `range` of `buffer` (`..` for all of it). The region keeps the buffer alive.
    ///
    /// `access` gets relaxed ordering added where the NIC accepts it.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for a range outside the buffer; everything [`check_gpu_range`] and
    /// [`choose_path`] return; [`Error::Cuda`] from the dma-buf export; [`Error::Verbs`] from the
    /// registration, with hints (e.g. `EFAULT` -> load nvidia_peermem or use dma-buf).
    pub fn register(
        pd: &Arc<ProtectionDomain>,
        buffer: Arc<DeviceBuffer>,
        range: impl RangeBounds<usize>,
        access: AccessFlags,
        path: RegistrationPath,
    ) -> Result<Arc<GpuMemoryRegion>> {
        let (offset, len) =
            crate::mr::resolve_range("GPU region within its DeviceBuffer", range, buffer.len())?;
        let address = buffer
            .device_ptr()
            .checked_add(offset as u64)
            .ok_or_else(|| Error::invalid("device address overflows", Hint::NONE))?;
        // SAFETY: the range lies inside `buffer`, which the region keeps alive (an Arc moved into
        // it) until after deregistration.
        unsafe { register_inner(pd, address, len, access, path, Some(Owner::Buffer(buffer))) }
    }

    /// Registers `range` of device memory another allocator made (PyTorch's, cudarc's, a
    /// pool's), held by `owner` for as long as the region lives: the region keeps the `Arc`, so
    /// the memory is freed only once the region and every work request using it are gone.
    ///
    /// The same checks run as for [`register`](Self::register): the pointer must be device
    /// memory and the range must lie in one allocation. `owner`'s [`DeviceMemory`] contract (an
    /// `unsafe impl`) is what makes this safe: its range stays allocated, unchanged, for as long
    /// as the value lives.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub fn register_owned<M: DeviceMemory + Send + Sync + 'static>(
        pd: &Arc<ProtectionDomain>,
        owner: Arc<M>,
        range: impl RangeBounds<usize>,
        access: AccessFlags,
        path: RegistrationPath,
    ) -> Result<Arc<GpuMemoryRegion>> {
        let (offset, len) =
            crate::mr::resolve_range("GPU region within its owner's memory", range, owner.len())?;
        let address = owner
            .device_ptr()
            .checked_add(offset as u64)
            .ok_or_else(|| Error::invalid("device address overflows", Hint::NONE))?;
        // SAFETY: the range lies inside `owner`'s memory, which its DeviceMemory contract keeps
        // allocated while the value lives; the region keeps the Arc until after deregistration.
        unsafe { register_inner(pd, address, len, access, path, Some(Owner::Memory(owner))) }
    }

    /// Registers device memory that something else owns (another framework's allocator).
    ///
    /// The same checks run as for [`register`](Self::register): the pointer must be device memory
    /// and the range must lie in its allocation.
    ///
    /// # Safety
    /// `address..address + len` must stay allocated (not freed, not returned to a caching
    /// allocator for reuse) until the returned region and every clone of its `Arc` are dropped,
    /// including those held by in-flight work requests. (Should `ibv_dereg_mr` fail on drop, the
    /// region is leaked and the NIC may keep its mapping: the memory should then stay allocated
    /// for the rest of the process; an error is logged.)
    pub unsafe fn register_raw(
        pd: &Arc<ProtectionDomain>,
        address: u64,
        len: usize,
        access: AccessFlags,
        path: RegistrationPath,
    ) -> Result<Arc<GpuMemoryRegion>> {
        // SAFETY: forwarded to the caller's contract.
        unsafe { register_inner(pd, address, len, access, path, None) }
    }

    /// The path used: [`RegistrationPath::DmaBuf`] or [`RegistrationPath::PeerMemory`].
    pub fn path(&self) -> RegistrationPath {
        self.path
    }

    /// Whether the registration has `IBV_ACCESS_RELAXED_ORDERING`.
    pub fn relaxed_ordering(&self) -> bool {
        self.relaxed_ordering
    }

    /// The GPU the memory lives on.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The device address of byte 0 (equal to [`Registered::iova`]).
    pub fn device_ptr(&self) -> u64 {
        self.iova
    }

    /// The buffer this region keeps alive, when registered with [`register`](Self::register);
    /// use it to fill and check the memory ([`DeviceBuffer::copy_from_host`], ...).
    pub fn buffer(&self) -> Option<&Arc<DeviceBuffer>> {
        match &self.owner {
            Some(Owner::Buffer(b)) => Some(b),
            _ => None,
        }
    }

    /// The dma-buf export behind a [`RegistrationPath::DmaBuf`] region (fd, aligned range,
    /// offset); `None` for peer-memory regions.
    pub fn dma_buf(&self) -> Option<&DmaBufExport> {
        self.dma_buf.as_ref()
    }

    /// The raw `ibv_mr`. Note: for dma-buf regions its `addr` field holds the dma-buf offset, not
    /// the address; use [`Registered::iova`].
    pub fn as_raw(&self) -> *mut ibv::ibv_mr {
        self.mr.as_ptr()
    }

    /// Makes data that RDMA wrote into this GPU's memory visible to kernels launched afterwards.
    ///
    /// Call it after the completion of the RDMA write (or of the receive that announced it) and
    /// before launching the consuming kernel. GPUs whose `writes_ordering` is at least 100 (the H200
    /// reports 100) need nothing; otherwise `cuFlushGPUDirectRDMAWrites` runs in the memory's
    /// context.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the GPU needs a flush but neither `cuFlushGPUDirectRDMAWrites`
    /// nor its HOST option is available: then post a 1-byte RDMA READ from this region on the same
    /// queue pair and wait for its completion before launching the kernel (as NCCL does).
    pub fn flush_rdma_writes(&self) -> Result<FlushOutcome> {
        super::flush::flush(&self.gpu)
    }
}

const RELAXED: u32 = ibv::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;

/// # Safety
/// `address..address + len` must stay allocated until the returned region is dropped (the
/// `buffer` moved into it holds it, or the caller of `register_raw` promised so).
unsafe fn register_inner(
    pd: &Arc<ProtectionDomain>,
    address: u64,
    len: usize,
    access: AccessFlags,
    requested: RegistrationPath,
    owner: Option<Owner>,
) -> Result<Arc<GpuMemoryRegion>> {
    let range = check_gpu_range(address, len)?;
    // SAFETY: the allocation stays alive (this function's contract), so its context does.
    let _ctx = unsafe { range.pointer.make_context_current() }?;

    // SAFETY: as above.
    if let Err(e) = unsafe { cuda::set_sync_memops_at(address) } {
        log::warn!("{e}; synchronous copies to this memory may race with RDMA");
    }

    let inputs = PathInputs {
        driver_version: cuda::driver_version()?,
        driver_exports_dma_buf: cuda::has_symbol("cuMemGetHandleForAddressRange"),
        gpu: range.gpu.clone(),
        system: system_facts().clone(),
        nic: pd.context().name().to_string(),
        nic_dma_buf: probe_nic_dma_buf(pd),
    };
    let path = choose_path(&inputs, requested)?;
    let access = access.normalized() - AccessFlags::RELAXED_ORDERING;
    let base_bits = access.bits();
    let dev = pd.context().name();

    let (mr, relaxed, dma_buf) = match path {
        RegistrationPath::DmaBuf => {
            let export = export_in_context(&range)?;
            let fd = export.fd.as_raw_fd();
            let attempt = |bits: u32| {
                // SAFETY: live pd; `fd` is a dma-buf we own covering offset..offset+len; the
                // kernel takes its own reference to the dma-buf for the registration's life.
                let mr = unsafe {
                    ibv::ibv_reg_dmabuf_mr(
                        pd.as_raw(),
                        export.offset,
                        len,
                        address,
                        fd,
                        bits as i32,
                    )
                };
                NonNull::new(mr)
                    .ok_or_else(|| std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
            };
            let (mr, relaxed) = match attempt(base_bits | RELAXED) {
                Ok(mr) => (mr, true),
                Err(libc::EINVAL) => match attempt(base_bits) {
                    Ok(mr) => (mr, false),
                    Err(e) => return Err(dma_err(dev, &export, address, len, access, false, e)),
                },
                Err(e) => return Err(dma_err(dev, &export, address, len, access, true, e)),
            };
            (mr, relaxed, Some(export))
        }
        RegistrationPath::PeerMemory | RegistrationPath::Auto => {
            let ptr = address as *mut libc::c_void;
            let iova2 = |bits: u32| {
                // SAFETY: live pd; the device range was checked to lie in a live allocation that
                // outlives the region; the peer-memory module resolves the device address.
                let mr = unsafe { ibv::ibv_reg_mr_iova2(pd.as_raw(), ptr, len, address, bits) };
                NonNull::new(mr)
                    .ok_or_else(|| std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
            };
            let args = |call_ro: bool| {
                format!(
                    "device={dev}, addr={address:#x}, len={len}, iova={address:#x}, access={access:?}{}",
                    if call_ro { "|RELAXED_ORDERING" } else { "" }
                )
            };
            match iova2(base_bits | RELAXED) {
                Ok(mr) => (mr, true, None),
                Err(libc::EINVAL) => match iova2(base_bits) {
                    Ok(mr) => (mr, false, None),
                    Err(e) => {
                        return Err(registration_error(
                            "ibv_reg_mr_iova2",
                            args(false),
                            RegistrationPath::PeerMemory,
                            e,
                        ))
                    }
                },
                Err(libc::EOPNOTSUPP) | Err(libc::ENOSYS) => {
                    // SAFETY: as for iova2 above; plain ibv_reg_mr uses the address as IOVA.
                    let mr = unsafe { ibv::ibv_reg_mr(pd.as_raw(), ptr, len, base_bits as i32) };
                    match NonNull::new(mr) {
                        Some(mr) => (mr, false, None),
                        None => {
                            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                            return Err(registration_error(
                                "ibv_reg_mr",
                                format!(
                                    "device={dev}, addr={address:#x}, len={len}, access={access:?}"
                                ),
                                RegistrationPath::PeerMemory,
                                e,
                            ));
                        }
                    }
                }
                Err(e) => {
                    return Err(registration_error(
                        "ibv_reg_mr_iova2",
                        args(true),
                        RegistrationPath::PeerMemory,
                        e,
                    ))
                }
            }
        }
    };
    let region = GpuMemoryRegion {
        mr,
        iova: address,
        len,
        ordinal: range.gpu.ordinal,
        access: if relaxed {
            access | AccessFlags::RELAXED_ORDERING
        } else {
            access
        },
        path,
        relaxed_ordering: relaxed,
        gpu: range.gpu,
        dma_buf,
        owner,
        pd: pd.clone(),
    };
    log::info!(
        "registered GPU {} memory {:#x}+{} on {} via {} (relaxed ordering {}, lkey {:#x}, rkey {:#x})",
        region.ordinal,
        address,
        len,
        dev,
        path,
        if relaxed { "on" } else { "off" },
        region.lkey(),
        region.rkey()
    );
    Ok(Arc::new(region))
}

fn dma_err(
    dev: &str,
    export: &DmaBufExport,
    address: u64,
    len: usize,
    access: AccessFlags,
    relaxed: bool,
    errno: i32,
) -> Error {
    registration_error(
        "ibv_reg_dmabuf_mr",
        format!(
            "device={dev}, offset={}, len={len}, iova={address:#x}, fd={}, access={access:?}{}",
            export.offset,
            export.fd.as_raw_fd(),
            if relaxed { "|RELAXED_ORDERING" } else { "" }
        ),
        RegistrationPath::DmaBuf,
        errno,
    )
}

impl Drop for GpuMemoryRegion {
    fn drop(&mut self) {
        // SAFETY: work requests hold an Arc of the region until their completion is reaped, so
        // no posted request uses it; deregistering here happens before the fields drop (dma-buf
        // fd, then the DeviceBuffer, then the protection domain).
        let rc = unsafe { ibv::ibv_dereg_mr(self.mr.as_ptr()) };
        let ok = teardown(
            "ibv_dereg_mr",
            format_args!(
                "GPU region {:#x}+{} on {} via {}",
                self.iova,
                self.len,
                self.pd.context().name(),
                self.path
            ),
            rc,
        );
        // The NIC may still map the memory when deregistration failed: keep the buffer, the
        // dma-buf and the protection domain rather than free what it may still write.
        keep_unless(
            ok,
            (self.owner.take(), self.dma_buf.take(), self.pd.clone()),
        );
    }
}

/// Drops `owned` when `released` (the device let go of it), leaks it otherwise.
fn keep_unless<T>(released: bool, owned: T) {
    if released {
        drop(owned);
    } else {
        std::mem::forget(owned);
    }
}

// SAFETY: `[iova, iova + len)` is registered under lkey/rkey with `pd` for the life of the value
// (deregistered in Drop before the DeviceBuffer or, for register_raw, the caller's allocation is
// released); kind() reports GPU memory, so nothing offers CPU access to it.
unsafe impl Registered for GpuMemoryRegion {
    fn lkey(&self) -> u32 {
        // SAFETY: the mr is valid while self lives.
        unsafe { (*self.mr.as_ptr()).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
    fn iova(&self) -> u64 {
        self.iova
    }
    fn len(&self) -> usize {
        self.len
    }
    fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Gpu {
            ordinal: self.ordinal,
        }
    }
    fn access(&self) -> AccessFlags {
        self.access
    }
}

#[cfg(test)]
mod tests {
    use super::keep_unless;
    use std::sync::Arc;

    #[test]
    fn a_failed_deregistration_keeps_what_the_nic_may_use() {
        let owned = Arc::new(7u8);
        keep_unless(false, (Some(owned.clone()), owned.clone()));
        assert_eq!(Arc::strong_count(&owned), 3, "leaked, never freed");
        let owned = Arc::new(7u8);
        keep_unless(true, (Some(owned.clone()), owned.clone()));
        assert_eq!(Arc::strong_count(&owned), 1, "released");
    }
}
