//! Device memory that code outside Rust allocated and owns (a Python framework's tensor, a C
//! library's pool), handed over by address for as long as gdr needs it.

use std::fmt;
use std::sync::Mutex;

use super::memory::DeviceMemory;

/// What runs once gdr no longer needs some foreign memory.
type Release = Box<dyn FnOnce() + Send>;

/// Device memory gdr does not own: an address and a length from another allocator, and a
/// `release` closure that gdr calls exactly once, when the value is dropped, which is after the
/// last registration and request using the memory are gone. Until then the memory must stay
/// allocated; in `release` its owner may free it (drop a tensor reference, return it to a pool).
///
/// This is the form for FFI boundaries. Rust code with an owning type should implement
/// [`DeviceMemory`] for that type instead (as gdr does for cudarc's `CudaSlice` with the
/// feature `cudarc`).
///
/// ```no_run
/// # fn f(ptr: u64, len: usize) -> gdr::Result<()> {
/// use std::sync::Arc;
/// use gdr::cuda::ForeignDeviceMemory;
/// // SAFETY: ptr..ptr+len stays allocated until the closure runs (the caller's contract).
/// let memory = unsafe {
///     ForeignDeviceMemory::new(ptr, len, move || println!("gdr is done with {ptr:#x}"))
/// };
/// let memory = Arc::new(memory);
/// # let _ = memory; Ok(()) }
/// ```
pub struct ForeignDeviceMemory {
    ptr: u64,
    len: usize,
    release: Mutex<Option<Release>>,
}

impl ForeignDeviceMemory {
    /// Memory at `ptr`, `len` bytes, released with `release` when the value is dropped.
    ///
    /// # Safety
    /// `ptr..ptr + len` must lie in one live CUDA allocation made by the CUDA driver
    /// (`cuMemAlloc`, `cuMemAllocAsync`, `cuMemCreate` + map; a framework's caching allocator
    /// hands out sub-ranges of those) and stay allocated, at that address, with its context
    /// alive, until `release` has been called: not freed, not returned to a caching allocator
    /// for reuse. gdr calls `release` once, from whichever thread drops the last reference
    /// (possibly a gdr progress thread); it must not block for long. If `release` panics, the
    /// panic is caught and logged. The registration checks (device memory, one allocation,
    /// GPUDirect capable) still run when the memory is registered; a registration refused by
    /// them drops its reference at once. Should a deregistration fail (the NIC may keep its
    /// mapping), gdr leaks the value instead of dropping it, and `release` never runs: the
    /// memory must then stay allocated for the rest of the process.
    pub unsafe fn new(ptr: u64, len: usize, release: impl FnOnce() + Send + 'static) -> Self {
        ForeignDeviceMemory {
            ptr,
            len,
            release: Mutex::new(Some(Box::new(release))),
        }
    }
}

impl fmt::Debug for ForeignDeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForeignDeviceMemory")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

// SAFETY: `new`'s contract: the range stays allocated, unchanged, until `release` runs, which
// is in `Drop`, after every borrow and every `Arc` clone of the value is gone.
unsafe impl DeviceMemory for ForeignDeviceMemory {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for ForeignDeviceMemory {
    fn drop(&mut self) {
        let release = self
            .release
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(release) = release {
            run_release("device", self.ptr, self.len, release);
        }
    }
}

/// Calls a foreign owner's `release`, catching (and logging) a panic: a drop inside gdr must
/// not unwind through a progress thread.
pub(crate) fn run_release(kind: &str, ptr: u64, len: usize, release: Release) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(release)).is_err() {
        log::error!(
            "the release closure of foreign {kind} memory at {ptr:#x} ({len} bytes) panicked; \
             gdr went on"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    #[test]
    fn release_runs_once_when_the_last_reference_goes_and_a_panic_in_it_is_contained() {
        let released = Arc::new(AtomicUsize::new(0));
        let r = released.clone();
        // SAFETY: the memory is never used (no registration in this test).
        let m = Arc::new(unsafe {
            ForeignDeviceMemory::new(0x7000_0000, 4096, move || {
                r.fetch_add(1, Ordering::SeqCst);
            })
        });
        assert_eq!((m.device_ptr(), m.len()), (0x7000_0000, 4096));
        let clone = m.clone();
        drop(m);
        assert_eq!(released.load(Ordering::SeqCst), 0, "still referenced");
        drop(clone);
        assert_eq!(released.load(Ordering::SeqCst), 1);
        // SAFETY: as above.
        let panicking = unsafe { ForeignDeviceMemory::new(1, 1, || panic!("owner's bug")) };
        drop(panicking);
    }

    /// Clones dropped on many threads at once: release runs exactly once, after the last.
    #[test]
    fn racing_drops_release_exactly_once() {
        for _ in 0..200 {
            let released = Arc::new(AtomicUsize::new(0));
            let r = released.clone();
            // SAFETY: the memory is never used (no registration in this test).
            let m = Arc::new(unsafe {
                ForeignDeviceMemory::new(0x1000, 64, move || {
                    r.fetch_add(1, Ordering::SeqCst);
                })
            });
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let c = m.clone();
                    std::thread::spawn(move || drop(c))
                })
                .collect();
            drop(m);
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(released.load(Ordering::SeqCst), 1);
        }
    }
}
