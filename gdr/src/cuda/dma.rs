//! Host memory that CUDA copies read and write while Rust code shares it: the [`HostDmaMemory`]
//! contract, and [`DmaHostBuffer`], pinned memory made for it (a staging bounce buffer).

use std::ptr::NonNull;

use gdr_sys::cuda as sys;

use super::check;
use super::context::PrimaryContext;
use super::memory::{check_len, check_range};
use crate::error::{Hint, Result};
use crate::mr::{HostMemory, MemoryRegion, Registered};

/// Host memory that an asynchronous CUDA copy ([`super::Stream::copy_to_host`],
/// [`super::Stream::copy_to_device`]) may read or write while the value is shared (in an `Arc`
/// that the copy keeps until it is known complete).
///
/// The copy engine's DMA is treated like the NIC's: another agent that reads and writes the bytes
/// at any time while a copy may run. So Rust code must never hold a plain reference to bytes the
/// engine may be writing.
///
/// # Safety
///
/// An implementation promises that:
///
/// - `host_ptr()` returns the same address every time, valid for reads and writes of `len()`
///   bytes (initialised), carrying write permission (derived from the owner's own raw pointer,
///   never from a shared reference), for as long as the value lives: the memory is not moved,
///   freed or shrunk before the value is dropped;
/// - while the value is shared, every CPU access to those bytes is atomic (so a concurrent DMA
///   write is not a data race in Rust's memory model) or goes through an `unsafe` function whose
///   contract makes its caller exclude concurrent copies on the bytes it touches;
/// - `len()` returns the same non-zero value every time.
pub unsafe trait HostDmaMemory: Send + Sync + 'static {
    /// The host address of byte 0, for the copy engine.
    fn host_ptr(&self) -> NonNull<u8>;
    /// The length in bytes.
    fn len(&self) -> usize;
    /// Whether it has no bytes (never, for gdr's own types).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a MemoryRegion owns its buffer at a fixed address until it drops (deregistered, then
// freed or leaked); every safe CPU access to it is atomic (crate::mr's concurrent-access rules,
// under which DMA writers are already expected: the NIC's), and its unsafe views require their
// callers to exclude every concurrent writer. Regions gdr makes are never empty. The address is
// the buffer's own pointer (`iova()` is its address for host regions); it goes only to the driver.
unsafe impl HostDmaMemory for MemoryRegion {
    fn host_ptr(&self) -> NonNull<u8> {
        // A host region's iova is the non-null address of its buffer.
        NonNull::new(self.iova() as usize as *mut u8).unwrap_or(NonNull::dangling())
    }
    fn len(&self) -> usize {
        Registered::len(self)
    }
}

/// Page-locked host memory (`cuMemHostAlloc`, portable to every context) meant to be shared with
/// the copy engine: a bounce buffer for host-staged GPU transfers.
///
/// Unlike [`super::PinnedHostBuffer`] it hands out no safe view of its bytes: asynchronous copies
/// may write them while it is shared, so CPU access is through [`slice`](Self::slice) and
/// [`slice_mut`](Self::slice_mut), whose callers prove no copy touches those bytes. It can also be
/// registered for RDMA ([`HostMemory`]); the region then owns it and every CPU access is the
/// region's (atomic) copies.
#[derive(Debug)]
pub struct DmaHostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    ctx: PrimaryContext,
}

// SAFETY: the buffer owns its allocation through a raw pointer; the driver API is thread-safe and
// the free in Drop may run on any thread; CPU access is unsafe and its contract excludes races.
unsafe impl Send for DmaHostBuffer {}
// SAFETY: as above: `&DmaHostBuffer` gives no safe access to the bytes.
unsafe impl Sync for DmaHostBuffer {}

/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every CUDA context, not only the allocating one.
const MEMHOSTALLOC_PORTABLE: u32 = 0x01;

impl DmaHostBuffer {
    /// Allocates `len` zeroed bytes of pinned host memory in GPU `ordinal`'s primary context.
    ///
    /// # Errors
    /// [`crate::Error::CudaUnavailable`] without a driver, [`crate::Error::InvalidArgument`] for
    /// `len == 0` or a missing ordinal, [`crate::Error::Cuda`] when `cuMemHostAlloc` fails.
    pub fn alloc(ordinal: i32, len: usize) -> Result<Self> {
        check_len("DmaHostBuffer::alloc", len)?;
        let ctx = PrimaryContext::retain(ordinal)?;
        let mut p: *mut libc::c_void = std::ptr::null_mut();
        {
            // SAFETY: the guard is dropped at the end of this block, before `ctx`.
            let _g = unsafe { ctx.make_current() }?;
            // SAFETY: a context is current; `p` is a valid out-pointer.
            let rc = unsafe { sys::cuMemHostAlloc(&mut p, len, MEMHOSTALLOC_PORTABLE) };
            check(
                rc,
                "cuMemHostAlloc",
                || format!("bytesize={len}, flags=PORTABLE, ordinal={ordinal}"),
                |_| {
                    Hint::new("pinned memory is limited by RAM (and RLIMIT_MEMLOCK): allocate less")
                },
            )?;
        }
        let Some(ptr) = NonNull::new(p.cast::<u8>()) else {
            return Err(crate::Error::invalid(
                format!("cuMemHostAlloc({len}) returned success with a null pointer"),
                "reinstall the NVIDIA driver",
            ));
        };
        // SAFETY: `ptr` points to `len` freshly allocated writable bytes nothing else uses yet.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Ok(DmaHostBuffer { ptr, len, ctx })
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

    /// The host address of byte 0 (for logs and checks; not for dereferencing).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr().addr()
    }

    /// The bytes `offset..offset + len`, for reading.
    ///
    /// # Safety
    /// While the returned reference lives, nothing may write those bytes: no asynchronous copy
    /// to host may be in flight on them (every copy that wrote them is known complete) or start,
    /// and no [`slice_mut`](Self::slice_mut) view of them may exist.
    ///
    /// # Errors
    /// [`crate::Error::OutOfBounds`] when the range does not lie inside the buffer.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> Result<&[u8]> {
        check_range("DmaHostBuffer::slice", offset, len, self.len)?;
        // SAFETY: in bounds (checked); initialised (zeroed at allocation); the caller excludes
        // concurrent writers for the life of the reference.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) })
    }

    /// The bytes `offset..offset + len`, for writing.
    ///
    /// # Safety
    /// While the returned reference lives, nothing else may access those bytes: no asynchronous
    /// copy (either direction) may be in flight on them or start, and no other view of them may
    /// exist.
    ///
    /// # Errors
    /// [`crate::Error::OutOfBounds`] when the range does not lie inside the buffer.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> Result<&mut [u8]> {
        check_range("DmaHostBuffer::slice_mut", offset, len, self.len)?;
        // SAFETY: in bounds; the pointer carries write permission (from cuMemHostAlloc); the
        // caller guarantees exclusive access for the life of the reference.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) })
    }
}

impl Drop for DmaHostBuffer {
    fn drop(&mut self) {
        // SAFETY: the guard is dropped at the end of this function, before the fields.
        let _g = unsafe { self.ctx.make_current() };
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once; copies that used it held an
        // Arc of it, so none is in flight.
        let rc = unsafe { sys::cuMemFreeHost(self.ptr.as_ptr().cast()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            log::warn!("cuMemFreeHost({:p}) failed: {rc:?}", self.ptr);
        }
    }
}

// SAFETY: fixed allocation owned through a raw pointer until Drop, initialised (zeroed), the
// pointer is cuMemHostAlloc's own; the only CPU views are unsafe and their contracts exclude
// concurrent access; len is fixed and non-zero.
unsafe impl HostDmaMemory for DmaHostBuffer {
    fn host_ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

// SAFETY: the allocation is owned through a raw pointer (a move does not invalidate it), fixed,
// initialised (zeroed) until Drop, and the pointer handed out is cuMemHostAlloc's own. No safe
// method touches the bytes, and the unsafe views need `&self`, which nobody has once a region
// owns the buffer. `len` is fixed and non-zero.
unsafe impl HostMemory for DmaHostBuffer {
    fn as_mut_ptr(&mut self) -> NonNull<u8> {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}
