//! Host memory a [`MemoryRegion`](super::MemoryRegion) can own: the [`HostMemory`] contract, the
//! page-aligned [`AlignedBuffer`], and `Vec<u8>`.

use std::ptr::NonNull;

use crate::error::{Error, Hint, Result};

/// Host memory that a [`MemoryRegion`](super::MemoryRegion) can own and register.
///
/// Registration calls [`as_mut_ptr`](HostMemory::as_mut_ptr) exactly once, with exclusive access
/// (`&mut self`), and from then on reaches the bytes only through that pointer: the CPU with the
/// atomic copies described in [`crate::mr`], the NIC by DMA. The value itself is kept (boxed, so
/// it may move) only to be dropped after deregistration, which frees the memory; it is leaked
/// instead when deregistration fails.
///
/// # Safety
///
/// An implementation promises that the pointer returned by `as_mut_ptr`:
///
/// - is valid for reads and writes of `len()` bytes, all of them initialised, and is derived
///   from exclusive access to that memory (so it carries write permission: never derive it from
///   a `&[u8]` or any other shared reference);
/// - stays valid, at the same address, until the value is dropped: the memory is never moved,
///   reallocated, freed or shrunk before that, and moving the value itself does not invalidate
///   it (own the memory through a raw pointer, as `Vec` and [`AlignedBuffer`] do, not through a
///   `Box<[u8]>` or a reference, which a move re-asserts as unique);
/// - is the only way the memory is accessed while the value lives: no other method of the
///   implementation (nor anything else) reads or writes those bytes, or creates a reference to
///   them, until `Drop`.
///
/// `len()` must return the same non-zero value every time and must not touch the bytes.
pub unsafe trait HostMemory: Send + Sync + 'static {
    /// Start of the memory, for reading and writing. Called once, at registration.
    fn as_mut_ptr(&mut self) -> NonNull<u8>;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether it is empty (empty memory cannot be registered).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A page-aligned, zero-initialised host buffer.
///
/// Before registration it is ordinary owned memory ([`as_slice`](Self::as_slice),
/// [`as_mut_slice`](Self::as_mut_slice)); once a [`MemoryRegion`](super::MemoryRegion) owns it,
/// only the region reaches its bytes.
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is plain bytes owned uniquely by this value; nothing ties it to a thread.
unsafe impl Send for AlignedBuffer {}
// SAFETY: `&AlignedBuffer` only gives `&[u8]` (shared reads); writes need `&mut`.
unsafe impl Sync for AlignedBuffer {}

impl std::fmt::Debug for AlignedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.layout.size())
            .field("align", &self.layout.align())
            .finish()
    }
}

impl AlignedBuffer {
    /// Allocates `len` zeroed bytes aligned to the host page size.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `len == 0`, a length the allocator cannot lay out, or
    /// allocation failure.
    pub fn zeroed(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid(
                "buffer length 0",
                "register at least one byte",
            ));
        }
        let page = page_size();
        let layout = std::alloc::Layout::from_size_align(len, page)
            .map_err(|e| Error::invalid(format!("buffer of {len} bytes: {e}"), Hint::NONE))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            Error::invalid(format!("out of memory allocating {len} bytes"), Hint::NONE)
        })?;
        Ok(AlignedBuffer { ptr, layout })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Always `false`: empty buffers are refused at allocation.
    pub fn is_empty(&self) -> bool {
        self.layout.size() == 0
    }

    /// The contents.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised (zeroed) bytes while `self` lives, and
        // `&self` excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    /// The contents, for writing.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: the allocation is owned through a raw pointer (moves do not retag it), fixed and
// initialised (zeroed) until Drop, and the pointer handed out is the allocation's own, derived
// from `alloc_zeroed`. No method touches the bytes except the slice views, which need `&self` /
// `&mut self` and so cannot be called while a region owns the buffer.
unsafe impl HostMemory for AlignedBuffer {
    fn as_mut_ptr(&mut self) -> NonNull<u8> {
        self.ptr
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

// SAFETY: `Vec::as_mut_ptr` derives the pointer from the Vec's own raw buffer pointer without
// creating a reference to the elements (documented by std, for this aliasing purpose), and a
// move of the Vec does not invalidate it. The heap buffer does not move while the Vec is not
// resized, and the region owns the Vec without ever touching it until Drop. `len` bytes are
// initialised. An empty Vec is refused before registration.
unsafe impl HostMemory for Vec<u8> {
    fn as_mut_ptr(&mut self) -> NonNull<u8> {
        // A Vec's buffer pointer is never null (dangling but non-null when empty).
        NonNull::new(Vec::as_mut_ptr(self)).unwrap_or(NonNull::dangling())
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

/// The host page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_is_page_aligned_and_zeroed() {
        let mut b = AlignedBuffer::zeroed(10_000).unwrap();
        assert_eq!(b.as_slice().as_ptr() as usize % page_size(), 0);
        assert_eq!(b.len(), 10_000);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[9_999] = 7;
        assert_eq!(b.as_slice()[9_999], 7);
        let p = HostMemory::as_mut_ptr(&mut b);
        assert_eq!(p.as_ptr().cast_const(), b.as_slice().as_ptr());
        assert!(AlignedBuffer::zeroed(0).is_err());
        assert!(matches!(
            AlignedBuffer::zeroed(usize::MAX),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn vec_hands_out_its_own_buffer() {
        let mut v = vec![1u8, 2, 3];
        let want = v.as_ptr();
        let p = HostMemory::as_mut_ptr(&mut v);
        assert_eq!(p.as_ptr().cast_const(), want);
        assert_eq!(HostMemory::len(&v), 3);
        assert!(HostMemory::is_empty(&Vec::<u8>::new()));
    }
}
