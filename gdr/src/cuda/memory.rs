//! RAII CUDA allocations: device memory (plain and stream-ordered pool), pinned host memory and
//! managed memory, with checked copies between host and device.

use std::borrow::Cow;

use gdr_sys::cuda as sys;

use super::context::{ContextGuard, PrimaryContext};
use super::{check, has_symbol, no_hint};
use crate::error::{Error, Hint, Result};

pub(super) fn check_len(what: &str, len: usize) -> Result<()> {
    if len == 0 {
        return Err(Error::invalid(
            format!("{what}: length 0"),
            "allocate at least one byte",
        ));
    }
    Ok(())
}

fn oom_hint(rc: sys::CUresult) -> Hint {
    if rc == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        Hint::new("free GPU memory (nvidia-smi shows who holds it) or allocate less")
    } else {
        Hint::NONE
    }
}

/// `cuMemcpyHtoD` of `src` to `base + offset`.
///
/// # Safety
/// A context is current, and `base + offset..+src.len()` lies in a live device allocation.
unsafe fn htod(base: u64, offset: usize, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    let dst = base + offset as u64;
    // SAFETY: the caller's contract for the device range; `src` is a valid host slice.
    let rc = unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) };
    check(
        rc,
        "cuMemcpyHtoD",
        || format!("dst={dst:#x}, bytes={}", src.len()),
        no_hint,
    )
}

/// `cuMemcpyDtoH` of `base + offset..+dst.len()` into `dst`.
///
/// # Safety
/// As [`htod`].
unsafe fn dtoh(base: u64, offset: usize, dst: &mut [u8]) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    let src = base + offset as u64;
    // SAFETY: the caller's contract for the device range; `dst` is a valid mutable slice.
    let rc = unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) };
    check(
        rc,
        "cuMemcpyDtoH",
        || format!("src={src:#x}, bytes={}", dst.len()),
        no_hint,
    )
}

/// Copies `src` into any device memory at byte `offset` (`cuMemcpyHtoD`, synchronous), with GPU
/// `ordinal`'s primary context current: for memory gdr did not allocate
/// ([`super::ForeignDeviceMemory`], a cudarc slice), as [`DeviceBuffer::copy_from_host`] does for
/// its own.
///
/// # Errors
/// [`Error::OutOfBounds`] when `offset + src.len()` exceeds the memory's length;
/// [`Error::InvalidArgument`] for a GPU that does not exist; [`Error::Cuda`] from the driver.
pub fn copy_from_host_into(
    memory: &(impl DeviceMemory + ?Sized),
    ordinal: i32,
    offset: usize,
    src: &[u8],
) -> Result<()> {
    check_range("copy_from_host_into", offset, src.len(), memory.len())?;
    let _g = ContextGuard::primary(ordinal)?;
    // SAFETY: in bounds of `memory` (checked), which DeviceMemory's contract keeps allocated
    // while it is borrowed; a context is current (the guard).
    unsafe { htod(memory.device_ptr(), offset, src) }
}

/// Copies any device memory's bytes at `offset` into `dst` (`cuMemcpyDtoH`, synchronous), as
/// [`copy_from_host_into`] the other way.
///
/// # Errors
/// As [`copy_from_host_into`].
pub fn copy_to_host_from(
    memory: &(impl DeviceMemory + ?Sized),
    ordinal: i32,
    offset: usize,
    dst: &mut [u8],
) -> Result<()> {
    check_range("copy_to_host_from", offset, dst.len(), memory.len())?;
    let _g = ContextGuard::primary(ordinal)?;
    // SAFETY: as in copy_from_host_into.
    unsafe { dtoh(memory.device_ptr(), offset, dst) }
}

/// Checks `offset..offset+len` against a buffer of `limit` bytes.
pub(super) fn check_range(
    what: &'static str,
    offset: usize,
    len: usize,
    limit: usize,
) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= limit => Ok(()),
        _ => Err(Error::OutOfBounds {
            what: Cow::Borrowed(what),
            offset: offset as u64,
            len: len as u64,
            limit: limit as u64,
            hint: Hint::new("keep offset + length within the buffer's len()"),
        }),
    }
}

/// CUDA memory that a value keeps allocated for as long as it is borrowed.
///
/// Safe functions that hand an address to the driver and need the allocation to exist during the
/// call ([`super::set_sync_memops`], [`crate::gpu_mr::export_dma_buf`]) take a borrowed owner
/// through this trait instead of a bare address, so no other thread can free the memory (and
/// destroy its context) in the middle of the call.
///
/// # Safety
/// An implementation must guarantee that `device_ptr()..device_ptr() + len()` lies inside one
/// live CUDA allocation made by the CUDA driver (`cuMemAlloc`, `cuMemAllocAsync`,
/// `cuMemAllocManaged`, `cuMemCreate` + map) for as long as `&self` is borrowed: not freed, not
/// returned to a caching allocator, and its context not destroyed. The range and the allocation
/// must not change while the value lives (asynchronous copies, [`super::Stream`], keep an `Arc`
/// of the value rather than a borrow, and rely on the memory staying allocated until the value
/// is dropped). gdr's own implementations free their memory only in `Drop`.
pub unsafe trait DeviceMemory {
    /// The device virtual address of byte 0.
    fn device_ptr(&self) -> u64;
    /// The length in bytes.
    fn len(&self) -> usize;
    /// Whether the memory has no bytes (never, for gdr's own buffers).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a DeviceBuffer frees its allocation only in Drop, which cannot run while it is
// borrowed; its PrimaryContext keeps the context retained.
unsafe impl DeviceMemory for DeviceBuffer {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

// SAFETY: as for DeviceBuffer: freed only in Drop, context retained by the buffer.
unsafe impl DeviceMemory for ManagedBuffer {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

// SAFETY: borrowing the Arc borrows a strong reference, so the inner value (and its allocation)
// lives at least as long as the borrow.
unsafe impl<T: DeviceMemory + ?Sized> DeviceMemory for std::sync::Arc<T> {
    fn device_ptr(&self) -> u64 {
        (**self).device_ptr()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

// SAFETY: a shared borrow of an owner keeps the owner borrowed.
unsafe impl<T: DeviceMemory + ?Sized> DeviceMemory for &T {
    fn device_ptr(&self) -> u64 {
        (**self).device_ptr()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

// SAFETY: a CudaSlice owns its allocation (cuMemAlloc or cuMemAllocAsync) and frees it only
// in Drop, which cannot run while the value is borrowed or held in an Arc; `num_bytes` bytes
// from its pointer lie in that one allocation, and neither changes while the slice lives.
// Reading the pointer through cudarc's `DevicePtr` on the slice's own stream records a read
// event there, which only orders later writes of cudarc's after it.
#[cfg(feature = "cudarc")]
unsafe impl<T> DeviceMemory for cudarc::driver::CudaSlice<T> {
    fn device_ptr(&self) -> u64 {
        let stream = self.stream().clone();
        let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(self, &stream);
        ptr
    }
    fn len(&self) -> usize {
        self.num_bytes()
    }
}

#[derive(Debug)]
enum Origin {
    /// `cuMemAlloc`.
    Plain,
    /// `cuMemAllocAsync` from the device's default memory pool, on a stream we own.
    Pool { stream: sys::CUstream },
}

/// Device memory on one GPU, freed on drop.
///
/// The CPU never reads or writes it directly: use [`copy_from_host`](Self::copy_from_host) and
/// [`copy_to_host`](Self::copy_to_host). Register it for RDMA with
/// [`crate::gpu_mr::GpuMemoryRegion::register`], which keeps an `Arc` of it so the memory cannot be
/// freed while the NIC may still use it.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    origin: Origin,
    ctx: PrimaryContext,
}

// SAFETY: the buffer is an address range plus driver handles; the driver API is thread-safe, the
// CPU never dereferences the address, and every method that touches the memory goes through a
// driver call that makes the owning context current on the calling thread.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as above; shared access only issues driver calls.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Allocates `len` bytes on GPU `ordinal` with `cuMemAlloc` in its primary context.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] without a driver, [`Error::InvalidArgument`] for `len == 0` or a
    /// missing ordinal, [`Error::Cuda`] (`CUDA_ERROR_OUT_OF_MEMORY`, ...) from the driver.
    pub fn alloc(ordinal: i32, len: usize) -> Result<Self> {
        check_len("DeviceBuffer::alloc", len)?;
        let ctx = PrimaryContext::retain(ordinal)?;
        let mut ptr: sys::CUdeviceptr = 0;
        {
            // SAFETY: the guard is dropped at the end of this block, before `ctx`.
            let _g = unsafe { ctx.make_current() }?;
            // SAFETY: a context is current; `ptr` is a valid out-pointer.
            let rc = unsafe { sys::cuMemAlloc_v2(&mut ptr, len) };
            check(
                rc,
                "cuMemAlloc",
                || format!("bytesize={len}, ordinal={ordinal}"),
                oom_hint,
            )?;
        }
        Ok(DeviceBuffer {
            ptr,
            len,
            origin: Origin::Plain,
            ctx,
        })
    }

    /// Allocates `len` bytes from GPU `ordinal`'s default memory pool with `cuMemAllocAsync` on a
    /// stream the buffer owns, then waits for the allocation. This is how caching allocators get
    /// memory; `cuPointerGetAttributes` reports no context for it.
    ///
    /// Memory from the default pool is not GPUDirect RDMA capable (on the H200 with CUDA 13.0,
    /// `CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE` is 0), so
    /// [`crate::gpu_mr::GpuMemoryRegion`] refuses it; use [`alloc`](Self::alloc) for RDMA buffers.
    ///
    /// # Errors
    /// As [`alloc`](Self::alloc), plus [`Error::Unsupported`] when the driver lacks
    /// `cuMemAllocAsync` or the device has no memory pools.
    pub fn alloc_from_pool(ordinal: i32, len: usize) -> Result<Self> {
        check_len("DeviceBuffer::alloc_from_pool", len)?;
        let ctx = PrimaryContext::retain(ordinal)?;
        for sym in [
            "cuMemAllocAsync",
            "cuMemFreeAsync",
            "cuStreamCreate",
            "cuStreamSynchronize",
            "cuStreamDestroy_v2",
        ] {
            if !has_symbol(sym) {
                return Err(Error::unsupported(
                    format!("stream-ordered allocation: libcuda lacks {sym}"),
                    "upgrade the NVIDIA driver to CUDA 11.2 or newer",
                ));
            }
        }
        if !super::device_info(ordinal)?.memory_pools_supported {
            return Err(Error::unsupported(
                format!("GPU {ordinal} reports CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 0"),
                "use DeviceBuffer::alloc (cuMemAlloc) on this GPU",
            ));
        }
        // SAFETY: the guard is dropped below, before `ctx` is moved into the result.
        let guard = unsafe { ctx.make_current() }?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: a context is current; valid out-pointer; 1 = CU_STREAM_NON_BLOCKING.
        let rc = unsafe { sys::cuStreamCreate(&mut stream, 1) };
        check(
            rc,
            "cuStreamCreate",
            || "flags=NON_BLOCKING".into(),
            no_hint,
        )?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `stream` was just created in the current context; valid out-pointer.
        let mut rc = unsafe { sys::cuMemAllocAsync(&mut ptr, len, stream) };
        if rc == sys::CUresult::CUDA_SUCCESS {
            // SAFETY: valid stream; waits until the allocation is usable from other streams.
            rc = unsafe { sys::cuStreamSynchronize(stream) };
        }
        if let Err(e) = check(
            rc,
            "cuMemAllocAsync",
            || format!("bytesize={len}, ordinal={ordinal}"),
            oom_hint,
        ) {
            // SAFETY: the stream is ours; `ptr` is freed only if it was allocated.
            unsafe {
                if ptr != 0 {
                    sys::cuMemFreeAsync(ptr, stream);
                    sys::cuStreamSynchronize(stream);
                }
                sys::cuStreamDestroy_v2(stream);
            }
            return Err(e);
        }
        drop(guard);
        Ok(DeviceBuffer {
            ptr,
            len,
            origin: Origin::Pool { stream },
            ctx,
        })
    }

    /// The device virtual address of byte 0 (a `CUdeviceptr`).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: zero-length buffers are refused at allocation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GPU the memory lives on.
    pub fn ordinal(&self) -> i32 {
        self.ctx.ordinal()
    }

    /// `true` for memory from [`alloc_from_pool`](Self::alloc_from_pool).
    pub fn is_pool_allocation(&self) -> bool {
        matches!(self.origin, Origin::Pool { .. })
    }

    /// Copies `src` to the device at byte `offset` (`cuMemcpyHtoD`, synchronous).
    ///
    /// Takes `&self`: device memory is never borrowed by Rust code, only addressed by driver calls,
    /// so concurrent copies race only on the GPU data, as with any DMA engine.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when `offset + src.len()` exceeds [`len`](Self::len);
    /// [`Error::Cuda`] from the driver.
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range("DeviceBuffer::copy_from_host", offset, src.len(), self.len)?;
        // SAFETY: the guard is dropped at the end of this function, before `self.ctx`.
        let _g = unsafe { self.ctx.make_current() }?;
        // SAFETY: offset..offset+len lies in our allocation (checked), which lives while `self`
        // is borrowed.
        unsafe { htod(self.ptr, offset, src) }
    }

    /// Copies from the device at byte `offset` into `dst` (`cuMemcpyDtoH`, synchronous).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when `offset + dst.len()` exceeds [`len`](Self::len);
    /// [`Error::Cuda`] from the driver.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range("DeviceBuffer::copy_to_host", offset, dst.len(), self.len)?;
        // SAFETY: the guard is dropped at the end of this function, before `self.ctx`.
        let _g = unsafe { self.ctx.make_current() }?;
        // SAFETY: as in copy_from_host.
        unsafe { dtoh(self.ptr, offset, dst) }
    }

    /// Copies the whole buffer into a new `Vec`.
    ///
    /// # Errors
    /// [`Error::Cuda`] from the driver.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len];
        self.copy_to_host(0, &mut v)?;
        Ok(v)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: the guard is dropped at the end of this function, before the fields.
        let guard = unsafe { self.ctx.make_current() };
        if let Err(e) = &guard {
            log::warn!("DeviceBuffer drop: cannot make its context current: {e}");
        }
        match self.origin {
            Origin::Plain => {
                // SAFETY: `ptr` came from cuMemAlloc and is freed once; registrations hold an
                // Arc of this buffer, so none outlives it.
                let rc = unsafe { sys::cuMemFree_v2(self.ptr) };
                if rc != sys::CUresult::CUDA_SUCCESS {
                    log::warn!("cuMemFree({:#x}) failed: {rc:?}", self.ptr);
                }
            }
            Origin::Pool { stream } => {
                // SAFETY: `ptr` came from cuMemAllocAsync on `stream`, which we own; we wait
                // for the free and then destroy the idle stream.
                unsafe {
                    let rc = sys::cuMemFreeAsync(self.ptr, stream);
                    if rc != sys::CUresult::CUDA_SUCCESS {
                        log::warn!("cuMemFreeAsync({:#x}) failed: {rc:?}", self.ptr);
                    }
                    sys::cuStreamSynchronize(stream);
                    sys::cuStreamDestroy_v2(stream);
                }
            }
        }
        drop(guard);
    }
}

/// Page-locked host memory from `cuMemAllocHost`: fast to copy to and from the GPU, and what a
/// host-staged GPU transfer bounces through. Zeroed on allocation.
#[derive(Debug)]
pub struct PinnedHostBuffer {
    ptr: *mut u8,
    len: usize,
    ctx: PrimaryContext,
}

// SAFETY: the buffer owns its allocation exclusively; slices follow Rust's borrow rules through
// &self / &mut self, and the free in Drop may run on any thread (driver API is thread-safe).
unsafe impl Send for PinnedHostBuffer {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for PinnedHostBuffer {}

impl PinnedHostBuffer {
    /// Allocates `len` bytes of pinned host memory in GPU `ordinal`'s primary context.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`], [`Error::InvalidArgument`] for `len == 0`, [`Error::Cuda`].
    pub fn alloc(ordinal: i32, len: usize) -> Result<Self> {
        check_len("PinnedHostBuffer::alloc", len)?;
        let ctx = PrimaryContext::retain(ordinal)?;
        let mut p: *mut libc::c_void = std::ptr::null_mut();
        {
            // SAFETY: the guard is dropped at the end of this block, before `ctx`.
            let _g = unsafe { ctx.make_current() }?;
            // SAFETY: a context is current; valid out-pointer.
            let rc = unsafe { sys::cuMemAllocHost_v2(&mut p, len) };
            check(
                rc,
                "cuMemAllocHost",
                || format!("bytesize={len}, ordinal={ordinal}"),
                |_| Hint::new("pinned memory is limited by RAM: allocate less"),
            )?;
        }
        // SAFETY: `p` points to `len` freshly allocated writable bytes.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len) };
        Ok(PinnedHostBuffer {
            ptr: p.cast(),
            len,
            ctx,
        })
    }

    /// The host address of byte 0.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The host address of byte 0, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: zero-length buffers are refused at allocation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GPU whose context allocated it.
    pub fn ordinal(&self) -> i32 {
        self.ctx.ordinal()
    }

    /// The contents.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes (zeroed at allocation) for as long as
        // `self` lives, and `&self` excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The contents, for writing.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        // SAFETY: the guard is dropped at the end of this function, before the fields.
        let _g = unsafe { self.ctx.make_current() };
        // SAFETY: `ptr` came from cuMemAllocHost and is freed once.
        let rc = unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            log::warn!("cuMemFreeHost({:p}) failed: {rc:?}", self.ptr);
        }
    }
}

/// Unified (managed) memory from `cuMemAllocManaged`, which migrates between CPU and GPU.
///
/// It exists so programs can test and demonstrate that GPUDirect registration refuses it
/// ([`crate::gpu_mr::GpuMemoryRegion`] would otherwise pin CPU pages and silently measure the
/// wrong path). The CPU never touches it through this type.
#[derive(Debug)]
pub struct ManagedBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: PrimaryContext,
}

// SAFETY: as for DeviceBuffer: an address range plus driver handles, touched only by driver calls.
unsafe impl Send for ManagedBuffer {}
// SAFETY: as above.
unsafe impl Sync for ManagedBuffer {}

impl ManagedBuffer {
    /// Allocates `len` bytes of managed memory (`CU_MEM_ATTACH_GLOBAL`) in GPU `ordinal`'s
    /// primary context.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`], [`Error::InvalidArgument`] for `len == 0`, [`Error::Cuda`].
    pub fn alloc(ordinal: i32, len: usize) -> Result<Self> {
        check_len("ManagedBuffer::alloc", len)?;
        let ctx = PrimaryContext::retain(ordinal)?;
        let mut ptr: sys::CUdeviceptr = 0;
        {
            // SAFETY: the guard is dropped at the end of this block, before `ctx`.
            let _g = unsafe { ctx.make_current() }?;
            // SAFETY: a context is current; valid out-pointer; 1 = CU_MEM_ATTACH_GLOBAL.
            let rc = unsafe { sys::cuMemAllocManaged(&mut ptr, len, 1) };
            check(
                rc,
                "cuMemAllocManaged",
                || format!("bytesize={len}, flags=ATTACH_GLOBAL, ordinal={ordinal}"),
                oom_hint,
            )?;
        }
        Ok(ManagedBuffer { ptr, len, ctx })
    }

    /// The unified virtual address of byte 0.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: zero-length buffers are refused at allocation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for ManagedBuffer {
    fn drop(&mut self) {
        // SAFETY: the guard is dropped at the end of this function, before the fields.
        let _g = unsafe { self.ctx.make_current() };
        // SAFETY: `ptr` came from cuMemAllocManaged and is freed once.
        let rc = unsafe { sys::cuMemFree_v2(self.ptr) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            log::warn!("cuMemFree({:#x}) (managed) failed: {rc:?}", self.ptr);
        }
    }
}
