//! Host memory that code outside Rust allocated and owns, handed over by address for as long as
//! a region needs it.

use std::fmt;
use std::ptr::NonNull;

use super::host::HostMemory;
use crate::error::{Error, Hint, Result};

/// Host memory a [`MemoryRegion`](super::MemoryRegion) can register without owning it: an
/// address and a length from another allocator (a Python buffer, a C library's arena), and a
/// `release` closure gdr calls exactly once, when the region has dropped the value after
/// deregistration (after the last request using it). In `release` the owner may free or reuse
/// the memory.
///
/// This is the form for FFI boundaries; Rust code should hand over an owning value
/// ([`Vec<u8>`], [`AlignedBuffer`](super::AlignedBuffer), or its own [`HostMemory`] type).
pub struct ForeignHostMemory {
    ptr: NonNull<u8>,
    len: usize,
    release: Option<Box<dyn FnOnce() + Send>>,
}

// SAFETY: the value only carries the address to registration; `new`'s contract gives gdr
// exclusive access to the bytes from any thread until `release`.
unsafe impl Send for ForeignHostMemory {}
// SAFETY: `&ForeignHostMemory` reaches neither the bytes nor the closure.
unsafe impl Sync for ForeignHostMemory {}

impl ForeignHostMemory {
    /// Memory at `ptr`, `len` bytes, released with `release` when the value is dropped.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a null pointer or `len == 0` (nothing is taken:
    /// `release` is dropped without being called).
    ///
    /// # Safety
    /// Until `release` has been called, `ptr..ptr + len` must be valid for reads and writes,
    /// initialised, not moved or freed, and reached by nothing else: no other code reads or
    /// writes it or holds a reference to it, because the NIC and the region's copies write it
    /// (the [`HostMemory`] contract). gdr calls `release` once, from whichever thread drops the
    /// region last (possibly a progress thread); a panic in it is caught and logged. A
    /// registration that fails drops the value, so `release` has run when the call returns the
    /// error. Should a deregistration fail (the NIC may keep its mapping), gdr leaks the value
    /// and `release` never runs: the memory must then stay as it is for the rest of the process.
    pub unsafe fn new(
        ptr: *mut u8,
        len: usize,
        release: impl FnOnce() + Send + 'static,
    ) -> Result<Self> {
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(Error::invalid(
                "foreign host memory at address 0",
                Hint::new("pass the buffer's start address"),
            ));
        };
        if len == 0 {
            return Err(Error::invalid(
                format!("foreign host memory at {ptr:p} of length 0"),
                Hint::new("register at least one byte"),
            ));
        }
        Ok(ForeignHostMemory {
            ptr,
            len,
            release: Some(Box::new(release)),
        })
    }
}

impl fmt::Debug for ForeignHostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForeignHostMemory")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

// SAFETY: `new`'s contract: the pointer is valid for `len` initialised bytes, exclusively ours,
// until `release`, which runs in `Drop`; the value never touches the bytes itself.
unsafe impl HostMemory for ForeignHostMemory {
    fn as_mut_ptr(&mut self) -> NonNull<u8> {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for ForeignHostMemory {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            crate::cuda::run_release("host", self.ptr.as_ptr() as u64, self.len, release);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;

    #[test]
    fn bad_input_is_refused_without_calling_release_and_drop_releases_once() {
        let called = Arc::new(AtomicBool::new(false));
        let c = called.clone();
        // SAFETY: refused before anything uses the pointer.
        let e = unsafe {
            ForeignHostMemory::new(std::ptr::null_mut(), 8, move || {
                c.store(true, Ordering::SeqCst)
            })
        }
        .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        let mut bytes = vec![1u8; 16];
        // SAFETY: refused (length 0) before anything uses the pointer.
        assert!(unsafe { ForeignHostMemory::new(bytes.as_mut_ptr(), 0, || {}) }.is_err());
        assert!(
            !called.load(Ordering::SeqCst),
            "a refused value releases nothing"
        );
        let c = called.clone();
        // SAFETY: `bytes` outlives the value and nothing else touches it meanwhile.
        let mut m = unsafe {
            ForeignHostMemory::new(bytes.as_mut_ptr(), bytes.len(), move || {
                c.store(true, Ordering::SeqCst)
            })
        }
        .unwrap();
        assert_eq!((m.as_mut_ptr().as_ptr(), m.len()), (bytes.as_mut_ptr(), 16));
        drop(m);
        assert!(called.load(Ordering::SeqCst));
    }
}
