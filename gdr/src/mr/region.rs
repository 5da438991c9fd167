//! [`MemoryRegion`]: host memory registered with a protection domain, which owns its buffer.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gdr_sys::ibv;

use super::atomic_bytes::AtomicBytes;
use super::{AccessFlags, AlignedBuffer, HostMemory, MemoryKind, Registered};
use crate::error::{Error, Hint, Result};
use crate::pd::ProtectionDomain;
use crate::return_code::{non_null, teardown};

/// An aligned 8-byte word inside a [`MemoryRegion`], checked once, loaded many times
/// (see [`MemoryRegion::watch_u64`]).
///
/// Each [`load`](Self::load) is one atomic load of the whole word: a value that a peer, the NIC
/// or another thread writes whole shows up in a later load, never torn.
#[derive(Debug, Clone, Copy)]
pub struct WatchedWord<'a> {
    word: &'a AtomicU64,
}

impl WatchedWord<'_> {
    /// The word's current value: one atomic load with `Acquire` ordering, so that reads of the
    /// region made after it (e.g. of the payload a flag announces) are not performed before it.
    #[inline]
    #[must_use]
    pub fn load(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }
}

/// Host memory registered with a protection domain (`ibv_reg_mr`). Owns its buffer and
/// deregisters before freeing it.
///
/// # Concurrent access
///
/// The region is `Sync`: any number of threads may [`read`](Self::read),
/// [`write`](Self::write), [`fill`](Self::fill) and [poll](Self::watch_u64) it through `&self`
/// while the NIC reads and writes it too. Every CPU access is atomic (see the
/// [module docs](crate::mr#concurrent-access-by-the-cpu-and-the-nic)), so this is never undefined
/// behaviour; what a copy observes while something else writes is:
///
/// - each aligned 8-byte word is read (and written) as one unit: if every writer writes that
///   word whole, a reader sees one writer's whole value, never a mix ("never torn");
/// - nothing more: a copy spanning several words may see some words before and some after a
///   concurrent write, and words in any mix of the writes racing with it.
///
/// Use completions (or a flag word the peer writes last, polled with [`WatchedWord::load`]) to
/// know when a NIC write is complete before reading its data.
pub struct MemoryRegion {
    mr: NonNull<ibv::ibv_mr>,
    /// The buffer's bytes, through the pointer taken from `mem` at registration.
    bytes: AtomicBytes,
    /// The owner of the buffer: dropped after deregistration, leaked when that fails.
    mem: ManuallyDrop<Box<dyn HostMemory>>,
    access: AccessFlags,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: ibv_mr handles may be used from any thread; the buffer is reached only through
// `bytes` (atomic accesses, Send and Sync) and `mem` is `Send + Sync` and only touched in Drop.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above: `&self` access to the buffer is atomic, never a data race.
unsafe impl Sync for MemoryRegion {}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.iova()))
            .field("len", &self.bytes.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.access)
            .finish()
    }
}

crate::mr::inherent_region_methods!(MemoryRegion);

impl MemoryRegion {
    /// Allocates `len` zeroed, page-aligned bytes and registers them.
    ///
    /// # Errors
    /// As [`AlignedBuffer::zeroed`] and [`MemoryRegion::register`].
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        len: usize,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>> {
        Self::register(pd, Box::new(AlignedBuffer::zeroed(len)?), access)
    }

    /// Registers a copy of `data` in a new page-aligned buffer.
    ///
    /// # Errors
    /// As [`MemoryRegion::new`].
    pub fn with_data(
        pd: &Arc<ProtectionDomain>,
        data: &[u8],
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>> {
        let mut buf = AlignedBuffer::zeroed(data.len())?;
        buf.as_mut_slice().copy_from_slice(data);
        Self::register(pd, Box::new(buf), access)
    }

    /// Registers host memory the region will own (a `Vec<u8>`, an [`AlignedBuffer`], ...).
    /// The write-capable pointer is taken once, here, with [`HostMemory::as_mut_ptr`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for empty memory; [`Error::Verbs`] naming `ibv_reg_mr`, with a
    /// hint chosen from the errno (the locked-memory limit for ENOMEM, ...).
    pub fn register(
        pd: &Arc<ProtectionDomain>,
        mut mem: Box<dyn HostMemory>,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>> {
        let len = mem.len();
        if len == 0 {
            return Err(Error::invalid(
                "cannot register an empty buffer",
                Hint::new("register at least one byte"),
            ));
        }
        let ptr = mem.as_mut_ptr();
        let access = access.normalized();
        // SAFETY: `ptr` points to `len` valid bytes that the region owns (through `mem`) until
        // after deregistration (or forever, when that fails).
        let mr =
            unsafe { ibv::ibv_reg_mr(pd.as_raw(), ptr.as_ptr().cast(), len, access.bits() as i32) };
        let mr = non_null(
            "ibv_reg_mr",
            mr,
            || {
                format!(
                    "device={}, len={len}, access={access:?}",
                    pd.context().name()
                )
            },
            reg_mr_hint,
        )?;
        Ok(Arc::new(MemoryRegion {
            mr,
            // SAFETY: `HostMemory`'s contract: `ptr` is valid for reads and writes of `len`
            // initialised bytes until `mem` drops (after `bytes`, never before deregistration),
            // and nothing else accesses them: `mem` is only dropped or leaked.
            bytes: unsafe { AtomicBytes::new(ptr, len) },
            mem: ManuallyDrop::new(mem),
            access,
            pd: pd.clone(),
        }))
    }

    /// Registers this region's memory once more, with another protection domain (typically of
    /// another device: one registration per rail). The new region shares the bytes and keeps
    /// this one (and so the memory) alive; it is deregistered first when it drops. CPU access
    /// through either region is atomic, as for every region, so using both at once is never
    /// a data race.
    ///
    /// # Errors
    /// As [`MemoryRegion::register`] (`ibv_reg_mr` on `pd`'s device).
    pub fn register_again(
        self: &Arc<Self>,
        pd: &Arc<ProtectionDomain>,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>> {
        Self::register(pd, Box::new(Alias { of: self.clone() }), access)
    }

    /// Copies `out.len()` bytes starting at `offset` out of the region (word-wise atomic loads;
    /// see [Concurrent access](Self#concurrent-access)).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when the range does not lie inside the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.bytes.read("MemoryRegion::read", offset, out)
    }

    /// Copies `data` into the region at `offset` (word-wise atomic stores; see
    /// [Concurrent access](Self#concurrent-access)).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when the range does not lie inside the region.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.bytes.write("MemoryRegion::write", offset, data)
    }

    /// Sets `len` bytes at `offset` to `byte` (word-wise atomic stores).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when the range does not lie inside the region.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.bytes.fill("MemoryRegion::fill", offset, len, byte)
    }

    /// A copy of the whole region. Like any `Vec`, aborts if the allocation fails; see
    /// [`try_to_vec`](Self::try_to_vec) to get an error instead.
    #[must_use]
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.bytes.len()];
        self.copy_all(&mut v);
        v
    }

    /// A copy of the whole region, or an error when `len()` bytes cannot be allocated.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the size when the allocation fails.
    pub fn try_to_vec(&self) -> Result<Vec<u8>> {
        let mut v = zeroed_vec(self.bytes.len())?;
        self.copy_all(&mut v);
        Ok(v)
    }

    fn copy_all(&self, v: &mut [u8]) {
        if let Err(e) = self.bytes.read("MemoryRegion::to_vec", 0, v) {
            // Unreachable: `v` has exactly the region's length.
            log::error!("{e}");
        }
    }

    /// Loads the aligned 8-byte word at `offset` (one atomic `Acquire` load, as
    /// [`WatchedWord::load`]).
    ///
    /// # Errors
    /// As [`MemoryRegion::watch_u64`].
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        Ok(self.watch_u64(offset)?.load())
    }

    /// A handle for polling the 8-byte word at `offset` (a flag or counter the peer writes):
    /// bounds and alignment are checked once here, every [`WatchedWord::load`] is one atomic
    /// load. The handle borrows the region, so the region outlives it.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when `offset + 8` exceeds the region, [`Error::InvalidArgument`]
    /// when the word's address is not 8-byte aligned.
    pub fn watch_u64(&self, offset: usize) -> Result<WatchedWord<'_>> {
        Ok(WatchedWord {
            word: self.bytes.word_at("MemoryRegion::watch_u64", offset)?,
        })
    }

    /// The region's bytes as a slice.
    ///
    /// # Safety
    ///
    /// While the returned reference lives, nothing may write the region: no thread may call
    /// [`write`](Self::write) or [`fill`](Self::fill) or hold a mutable view, no posted receive,
    /// RDMA read or atomic may target it, and no peer may write it (it must not have been
    /// advertised with REMOTE_WRITE/REMOTE_ATOMIC to a connected peer that might use it).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the caller guarantees no concurrent writer; the memory is valid for len
        // initialised bytes while `self` lives.
        unsafe { std::slice::from_raw_parts(self.bytes.as_ptr(), self.bytes.len()) }
    }

    /// The region's bytes as a mutable slice.
    ///
    /// # Safety
    ///
    /// While the returned reference lives, nobody else may access the region: no other view, no
    /// call of any other method that touches the bytes (from any thread), no posted work request
    /// that reads or writes it, no peer access.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: the caller guarantees exclusive access; the memory is valid for len bytes and
        // the pointer carries write permission (taken with `HostMemory::as_mut_ptr`).
        unsafe { std::slice::from_raw_parts_mut(self.bytes.as_ptr(), self.bytes.len()) }
    }

    /// The raw `ibv_mr`.
    pub fn as_raw(&self) -> *mut ibv::ibv_mr {
        self.mr.as_ptr()
    }
}

/// `len` zeroed bytes, or an error instead of an abort when they cannot be allocated.
fn zeroed_vec(len: usize) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|e| {
        Error::invalid(
            format!("cannot allocate {len} bytes for a copy of the region: {e}"),
            Hint::new("copy it in pieces with MemoryRegion::read"),
        )
    })?;
    v.resize(len, 0);
    Ok(v)
}

/// The hint for a failed host or GPU `ibv_reg_mr*`, chosen from the errno.
pub(crate) fn reg_mr_hint(errno: i32) -> Hint {
    match errno {
        libc::ENOMEM | libc::EAGAIN => Hint::new(format!(
            "the locked-memory limit is {}; raise it (`ulimit -l unlimited`, or memlock in /etc/security/limits.conf / LimitMEMLOCK= for services)",
            memlock_limit_text()
        )),
        libc::EINVAL => Hint::new("the device rejected the access flags or the length (see its max_mr_size)"),
        libc::EFAULT => Hint::new("the address range is not mapped in this process"),
        libc::EPERM | libc::EACCES => Hint::new("no permission to pin memory: check RLIMIT_MEMLOCK and /dev/infiniband permissions"),
        _ => Hint::NONE,
    }
}

/// `RLIMIT_MEMLOCK` as people read it (`unlimited` or `N KiB`).
pub fn memlock_limit_text() -> String {
    // SAFETY: an all-zero rlimit is valid and getrlimit fills it.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to an rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return "unknown".into();
    }
    if r.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        format!("{} KiB", r.rlim_cur / 1024)
    }
}

/// The memory of a region, registered again ([`MemoryRegion::register_again`]): holds the
/// original region, which owns the bytes, alive.
struct Alias {
    of: Arc<MemoryRegion>,
}

// SAFETY: the pointer is the original region's, taken from exclusive access to the memory when
// it was registered (so it carries write permission); it stays valid while `of` lives, which is
// as long as this value. The memory is reached by the original region and by the alias's region
// only through their `AtomicBytes` (atomic word copies) and by the NICs, never through a
// reference: two atomic views of the same bytes are not a data race, which is what the trait's
// exclusivity rule protects against. `len` is the original's, fixed.
unsafe impl HostMemory for Alias {
    fn as_mut_ptr(&mut self) -> NonNull<u8> {
        // `AtomicBytes` never holds a null pointer (it was built from a `NonNull`).
        NonNull::new(self.of.bytes.as_ptr()).unwrap_or(NonNull::dangling())
    }
    fn len(&self) -> usize {
        self.of.bytes.len()
    }
}

/// Frees `buffer` when deregistration succeeded; leaks it when it failed, because the NIC may
/// still map (and write) the memory.
fn release_buffer<T>(deregistered: bool, buffer: T) {
    if deregistered {
        drop(buffer);
    } else {
        std::mem::forget(buffer);
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: no work request references the region any more (they hold an Arc), so the NIC
        // is done with it; deregister before the buffer is freed.
        let rc = unsafe { ibv::ibv_dereg_mr(self.mr.as_ptr()) };
        let deregistered = teardown(
            "ibv_dereg_mr",
            format_args!("host region {:#x}+{}", self.iova(), self.bytes.len()),
            rc,
        );
        // SAFETY: `mem` is taken once, here, and not used again (`bytes` is never touched after
        // this: the remaining fields' drops do not use it).
        let mem = unsafe { ManuallyDrop::take(&mut self.mem) };
        release_buffer(deregistered, mem);
    }
}

// SAFETY: the registration covers exactly the owned buffer at its own address for the life of the
// value (deregistered in Drop before the buffer is freed, and the buffer leaked when that fails);
// it is host memory.
unsafe impl Registered for MemoryRegion {
    fn lkey(&self) -> u32 {
        // SAFETY: the mr is valid while self lives.
        unsafe { (*self.mr.as_ptr()).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
    fn iova(&self) -> u64 {
        self.bytes.as_ptr().addr() as u64
    }
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn access(&self) -> AccessFlags {
        self.access
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "getrlimit is a foreign call Miri cannot run")]
    fn enomem_hint_names_memlock() {
        let e = Error::verbs(
            "ibv_reg_mr",
            "device=rxe0, len=1073741824, access=AccessFlags(LOCAL_WRITE)".to_string(),
            libc::ENOMEM,
            reg_mr_hint(libc::ENOMEM),
        );
        let s = e.to_string();
        assert!(s.starts_with("ibv_reg_mr(device=rxe0, len=1073741824, access=AccessFlags(LOCAL_WRITE)) failed: Cannot allocate memory (errno 12); hint: the locked-memory limit is"), "{s}");
        assert!(s.contains("ulimit -l unlimited"));
        assert!(reg_mr_hint(libc::EFAULT).text().is_some());
        assert!(reg_mr_hint(libc::EBUSY).text().is_none());
    }

    struct DropProbe<'a>(&'a Cell<bool>);
    impl Drop for DropProbe<'_> {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }

    /// Finding 6: a failed `ibv_dereg_mr` must leak the buffer (the NIC may still map it), a
    /// successful one free it. `teardown`'s verdict drives the decision, as in `Drop`.
    #[test]
    fn buffer_is_leaked_when_deregistration_fails() {
        let freed = Cell::new(false);
        release_buffer(
            teardown("ibv_dereg_mr", "test region", libc::EBUSY),
            DropProbe(&freed),
        );
        assert!(!freed.get(), "a buffer the NIC may still map was freed");
        release_buffer(
            teardown("ibv_dereg_mr", "test region", 0),
            DropProbe(&freed),
        );
        assert!(freed.get(), "a deregistered buffer was not freed");
    }

    /// Finding 4, aliasing part: the write-capable pointer is taken from `&mut` once, and stays
    /// valid while the owner moves (into the box, into the region) and until it drops: Miri
    /// checks this under Stacked and Tree Borrows (`cargo +nightly miri test -p gdr --lib mr::`).
    #[test]
    fn host_memory_pointer_survives_moves_until_drop() {
        for mut mem in [
            Box::new(vec![0u8; 61]) as Box<dyn HostMemory>,
            Box::new(AlignedBuffer::zeroed(61).unwrap()),
        ] {
            let len = mem.len();
            let ptr = mem.as_mut_ptr();
            // SAFETY: HostMemory's contract, as in `register`.
            let bytes = unsafe { AtomicBytes::new(ptr, len) };
            let owner = ManuallyDrop::new(mem);
            let moved = (bytes, owner);
            let (bytes, owner) = moved;
            bytes.write("t", 3, b"hello, NIC").unwrap();
            bytes.fill("t", 50, 11, 0xEE).unwrap();
            let mut out = [0u8; 61];
            bytes.read("t", 0, &mut out).unwrap();
            assert_eq!(&out[3..13], b"hello, NIC");
            assert!(out[50..].iter().all(|&b| b == 0xEE) && out[..3] == [0; 3]);
            assert_eq!(bytes.word_at("t", 0).is_ok(), ptr.as_ptr().addr() % 8 == 0);
            release_buffer(true, ManuallyDrop::into_inner(owner));
        }
    }

    #[test]
    fn huge_copies_are_errors_not_aborts() {
        let e = zeroed_vec(usize::MAX).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(e.to_string().contains(&usize::MAX.to_string()), "{e}");
        assert_eq!(zeroed_vec(3).unwrap(), vec![0; 3]);
    }
}
