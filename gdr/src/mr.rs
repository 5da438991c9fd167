//! Registered memory: access flags, the [`Registered`] trait every region implements, host
//! [`MemoryRegion`]s that own their buffer, and the slice descriptors work requests take.
//!
//! Memory that the NIC may write (a receive buffer, the target of an RDMA read, anything a peer
//! may write with [`AccessFlags::REMOTE_WRITE`]) is never handed out as `&[u8]`/`&mut [u8]` by
//! safe code: use the copying [`MemoryRegion::read`] / [`MemoryRegion::write`], or the `unsafe`
//! views whose contract says when they are sound.

use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::ptr::NonNull;
use std::sync::Arc;

use gdr_sys::ibv;

use crate::error::{Error, Hint, Result};
use crate::pd::ProtectionDomain;

bitflags::bitflags! {
    /// What the local NIC and remote peers may do with a region (`ibv_access_flags`).
    /// The default is [`AccessFlags::LOCAL_WRITE`] only: least privilege.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// The local NIC may write (receives, RDMA read results, atomic results).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA-write into the region (implies LOCAL_WRITE).
        const REMOTE_WRITE = 1 << 1;
        /// Peers may RDMA-read from the region.
        const REMOTE_READ = 1 << 2;
        /// Peers may run atomics on the region (implies LOCAL_WRITE).
        const REMOTE_ATOMIC = 1 << 3;
        /// The NIC may reorder PCIe writes (faster on many platforms; ignored where unsupported).
        const RELAXED_ORDERING = 1 << 20;
    }
}

impl Default for AccessFlags {
    fn default() -> Self {
        AccessFlags::LOCAL_WRITE
    }
}

impl AccessFlags {
    /// Local write plus remote read and write: a typical RDMA target.
    pub fn remote_rw() -> Self {
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
    }

    /// Adds LOCAL_WRITE where the verbs specification requires it (remote write or atomic).
    pub fn normalized(self) -> Self {
        if self.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC) {
            self | AccessFlags::LOCAL_WRITE
        } else {
            self
        }
    }

    /// The `ibv_access_flags` value.
    pub fn raw(self) -> u32 {
        self.normalized().bits()
    }
}

/// Where a region's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Host memory: the CPU may read and write it.
    Host,
    /// GPU device memory: the CPU must never touch it (no inline sends, no CPU views).
    Gpu {
        /// CUDA device ordinal.
        ordinal: i32,
    },
}

/// Memory registered with a protection domain.
///
/// # Safety
///
/// Implementors guarantee that for as long as the value lives, `[iova(), iova() + len())` is
/// registered with `pd()` under `lkey()`/`rkey()` and backed by memory that stays allocated, and
/// that `kind()` is truthful (host memory is CPU-accessible at `iova()`; GPU memory is reported as
/// such). Work requests rely on this: they keep an `Arc` of the region until their completion is
/// reaped, so the NIC never touches freed or deregistered memory.
pub unsafe trait Registered: Send + Sync + 'static {
    /// Local key, for scatter/gather entries.
    fn lkey(&self) -> u32;
    /// Remote key, for peers.
    fn rkey(&self) -> u32;
    /// The address the NIC uses for byte 0 of the region.
    fn iova(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty (never true for regions gdr creates).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The protection domain it is registered with.
    fn pd(&self) -> &Arc<ProtectionDomain>;
    /// Host or GPU memory.
    fn kind(&self) -> MemoryKind;
    /// The access flags it was registered with.
    fn access(&self) -> AccessFlags;
}

/// Resolves a range against a length; an out-of-range request is an [`Error::OutOfBounds`].
pub(crate) fn resolve_range(
    what: &'static str,
    range: impl RangeBounds<usize>,
    limit: usize,
) -> Result<(usize, usize)> {
    let (start, end) = (
        range.start_bound().map(|&x| x as u64),
        range.end_bound().map(|&x| x as u64),
    );
    span(start, end, limit as u64)
        .map(|(o, l)| (o as usize, l as usize))
        .map_err(|(offset, len)| Error::OutOfBounds {
            what: what.into(),
            offset,
            len,
            limit: limit as u64,
            hint: Hint::NONE,
        })
}

/// Offset and length of a range within `[0, limit)`, or `Err((offset, len))` when it does not fit.
fn span(
    start: Bound<u64>,
    end: Bound<u64>,
    limit: u64,
) -> std::result::Result<(u64, u64), (u64, u64)> {
    let s = match start {
        Bound::Included(s) => s,
        Bound::Excluded(s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let e = match end {
        Bound::Included(e) => e.saturating_add(1),
        Bound::Excluded(e) => e,
        Bound::Unbounded => limit,
    };
    if s > e || e > limit {
        Err((s, e.saturating_sub(s)))
    } else {
        Ok((s, e - s))
    }
}

/// Slices of registered regions, for work requests. Implemented for every `Arc<R: Registered>`.
pub trait RegionExt {
    /// A local slice for scatter/gather lists. Bounds are checked here, not by the NIC later.
    fn slice(&self, range: impl RangeBounds<usize>) -> Result<LocalSlice>;
    /// The descriptor a peer needs to access this region remotely.
    fn remote(&self) -> RemoteRegion;
}

impl<R: Registered> RegionExt for Arc<R> {
    fn slice(&self, range: impl RangeBounds<usize>) -> Result<LocalSlice> {
        let (offset, len) = resolve_range("local slice", range, self.len())?;
        let region: Arc<dyn Registered> = self.clone();
        Ok(LocalSlice::new(region, offset, len))
    }

    fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.iova(),
            len: self.len() as u64,
            rkey: self.rkey(),
        }
    }
}

/// A bounds-checked piece of a local registered region. Holds the region alive.
///
/// What posting needs from the region (address, lkey, access, protection domain) is read once
/// here: a registration never changes them, and the posting path then makes no virtual calls.
#[derive(Clone)]
pub struct LocalSlice {
    pub(crate) region: Arc<dyn Registered>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) addr: u64,
    pub(crate) lkey: u32,
    pub(crate) access: AccessFlags,
    /// Identity of the region's protection domain (`Arc::as_ptr`), compared, never dereferenced.
    pub(crate) pd: usize,
}

impl LocalSlice {
    /// `len` bytes at `offset` of `region` (the caller checked the range).
    pub(crate) fn new(region: Arc<dyn Registered>, offset: usize, len: usize) -> LocalSlice {
        LocalSlice {
            addr: region.iova() + offset as u64,
            lkey: region.lkey(),
            access: region.access(),
            pd: Arc::as_ptr(region.pd()) as usize,
            region,
            offset,
            len,
        }
    }

    /// Start address as the NIC sees it.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Offset inside the region.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// The region's local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// The region.
    pub fn region(&self) -> &Arc<dyn Registered> {
        &self.region
    }
    /// Host or GPU memory.
    pub fn kind(&self) -> MemoryKind {
        self.region.kind()
    }
    /// A sub-slice, relative to this slice.
    pub fn sub(&self, range: impl RangeBounds<usize>) -> Result<LocalSlice> {
        let (o, len) = resolve_range("local sub-slice", range, self.len)?;
        Ok(LocalSlice::new(self.region.clone(), self.offset + o, len))
    }
}

impl fmt::Debug for LocalSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalSlice")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("kind", &self.kind())
            .finish()
    }
}

/// A region a peer advertised: address, length and remote key. Sent over the wire by
/// [`crate::connect`]; the values come from the peer and are only trusted as far as bounds go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// The peer's address (IOVA) of byte 0.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteRegion {
    /// A descriptor from its parts.
    pub fn new(addr: u64, len: u64, rkey: u32) -> Self {
        RemoteRegion { addr, len, rkey }
    }

    /// A bounds-checked slice of the remote region.
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Result<RemoteSlice> {
        let (start, len) = span(
            range.start_bound().cloned(),
            range.end_bound().cloned(),
            self.len,
        )
        .map_err(|(offset, len)| Error::OutOfBounds {
            what: "remote slice".into(),
            offset,
            len,
            limit: self.len,
            hint: Hint::new("the peer advertised a smaller region"),
        })?;
        Ok(RemoteSlice {
            addr: self.addr + start,
            len,
            rkey: self.rkey,
        })
    }
}

/// A bounds-checked piece of a [`RemoteRegion`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteSlice {
    addr: u64,
    len: u64,
    rkey: u32,
}

impl RemoteSlice {
    /// The peer's address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
}

/// Host memory that a [`MemoryRegion`] can own: a pointer and length that stay valid and fixed
/// while the value lives.
///
/// # Safety
///
/// `as_ptr()` must return the same non-null pointer to `len()` bytes of host memory, readable and
/// writable by the CPU, for the whole life of the value, and the memory must not be accessed
/// through any other path while the region owns it.
pub unsafe trait HostMemory: Send + Sync + 'static {
    /// Start of the memory.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A page-aligned, zero-initialised host buffer.
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is plain bytes owned uniquely by this value.
unsafe impl Send for AlignedBuffer {}
// SAFETY: no interior mutability is exposed through `&AlignedBuffer` except via raw pointers.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// Allocates `len` zeroed bytes aligned to the host page size.
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
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: the allocation is fixed and owned until Drop.
unsafe impl HostMemory for AlignedBuffer {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

// SAFETY: a Vec's heap buffer does not move while the Vec is not resized, and the region owns it
// without ever resizing it. An empty Vec is refused before registration.
unsafe impl HostMemory for Vec<u8> {
    fn as_ptr(&self) -> *mut u8 {
        self.as_slice().as_ptr() as *mut u8
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

/// An aligned 8-byte word inside a [`MemoryRegion`], checked once, loaded many times
/// (see [`MemoryRegion::watch_u64`]).
#[derive(Debug, Clone, Copy)]
pub struct WatchedWord<'a> {
    ptr: *const u64,
    _region: std::marker::PhantomData<&'a MemoryRegion>,
}

impl WatchedWord<'_> {
    /// The word's current value (one volatile load: a write by the NIC shows up in a later
    /// load, never as a torn read of an aligned word the peer writes whole).
    #[inline]
    pub fn load(&self) -> u64 {
        // SAFETY: `ptr` is 8-byte aligned and inside the region's buffer (checked by
        // `watch_u64`), and the borrow keeps the region (and its buffer) alive. A volatile load
        // of plain bytes has no validity requirement, so concurrent NIC writes cannot make it UB
        // (NIC-written memory is only ever reached through copies and such loads).
        unsafe { std::ptr::read_volatile(self.ptr) }
    }
}

// SAFETY: the word is only ever read (volatile loads), and the region it points into is Sync.
unsafe impl Send for WatchedWord<'_> {}
// SAFETY: as above.
unsafe impl Sync for WatchedWord<'_> {}

/// Host memory registered with a protection domain (`ibv_reg_mr`). Owns its buffer and
/// deregisters before freeing it.
pub struct MemoryRegion {
    mr: NonNull<ibv::ibv_mr>,
    mem: Box<dyn HostMemory>,
    access: AccessFlags,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: ibv_mr handles may be used from any thread; buffer access goes through raw-pointer
// copies whose races with the NIC are the documented contract of this type.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.iova()))
            .field("len", &self.mem.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.access)
            .finish()
    }
}

impl MemoryRegion {
    /// Allocates `len` zeroed, page-aligned bytes and registers them.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        len: usize,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>> {
        Self::register(pd, Box::new(AlignedBuffer::zeroed(len)?), access)
    }

    /// Registers a copy of `data` in a new page-aligned buffer.
    pub fn with_data(
        pd: &Arc<ProtectionDomain>,
        data: &[u8],
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>> {
        let buf = AlignedBuffer::zeroed(data.len())?;
        // SAFETY: the new buffer has exactly data.len() bytes and does not overlap `data`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.as_ptr(), data.len()) };
        Self::register(pd, Box::new(buf), access)
    }

    /// Registers host memory the region will own (a `Vec<u8>`, an [`AlignedBuffer`], pinned
    /// CUDA host memory, ...).
    pub fn register(
        pd: &Arc<ProtectionDomain>,
        mem: Box<dyn HostMemory>,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>> {
        let len = mem.len();
        if len == 0 {
            return Err(Error::invalid(
                "cannot register an empty buffer",
                Hint::NONE,
            ));
        }
        let access = access.normalized();
        // SAFETY: `mem` points to `len` valid bytes that the region owns until after dereg.
        let mr =
            unsafe { ibv::ibv_reg_mr(pd.as_raw(), mem.as_ptr().cast(), len, access.bits() as i32) };
        let mr = NonNull::new(mr).ok_or_else(|| {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            reg_mr_error("ibv_reg_mr", pd.context().name(), len, access, errno)
        })?;
        Ok(Arc::new(MemoryRegion {
            mr,
            mem,
            access,
            pd: pd.clone(),
        }))
    }

    fn ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    fn check(&self, what: &'static str, offset: usize, len: usize) -> Result<()> {
        resolve_range(what, offset..offset.saturating_add(len), self.mem.len()).map(|_| ())
    }

    /// Copies `out.len()` bytes starting at `offset` out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check("MemoryRegion::read", offset, out.len())?;
        // SAFETY: bounds checked; raw copy without forming a reference to memory the NIC may write.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr().add(offset), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check("MemoryRegion::write", offset, data.len())?;
        // SAFETY: bounds checked; raw copy without forming a reference to memory the NIC may read.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Fills `len` bytes at `offset` with `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.check("MemoryRegion::fill", offset, len)?;
        // SAFETY: bounds checked.
        unsafe { std::ptr::write_bytes(self.ptr().add(offset), byte, len) };
        Ok(())
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.mem.len()];
        self.read(0, &mut v)
            .expect("whole-region read is in bounds");
        v
    }

    /// Reads the 8-byte word at `offset` with one volatile load (for polling a flag the peer writes).
    pub fn read_u64_volatile(&self, offset: usize) -> Result<u64> {
        Ok(self.watch_u64(offset)?.load())
    }

    /// A handle for polling the 8-byte word at `offset` (a flag or counter the peer writes):
    /// bounds and alignment are checked once here, every [`WatchedWord::load`] is one volatile
    /// load. The handle borrows the region, so the region outlives it.
    pub fn watch_u64(&self, offset: usize) -> Result<WatchedWord<'_>> {
        self.check("MemoryRegion::watch_u64", offset, 8)?;
        if !(self.ptr() as usize + offset).is_multiple_of(8) {
            return Err(Error::invalid(
                format!("offset {offset} is not 8-byte aligned"),
                Hint::NONE,
            ));
        }
        Ok(WatchedWord {
            // SAFETY: in bounds (checked above).
            ptr: unsafe { self.ptr().add(offset) }.cast::<u64>(),
            _region: std::marker::PhantomData,
        })
    }

    /// The region's bytes as a slice.
    ///
    /// # Safety
    ///
    /// While the returned reference lives, nothing may write the region: no posted receive, RDMA
    /// read or atomic may target it, and no peer may write it (it must not have been advertised with
    /// REMOTE_WRITE/REMOTE_ATOMIC to a connected peer that might use it).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the caller guarantees no concurrent writer; the memory is valid for len bytes.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.mem.len()) }
    }

    /// The region's bytes as a mutable slice.
    ///
    /// # Safety
    ///
    /// While the returned reference lives, nobody else may access the region: no other view, no
    /// posted work request that reads or writes it, no peer access.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: the caller guarantees exclusive access; the memory is valid for len bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.mem.len()) }
    }

    /// The raw `ibv_mr`.
    pub fn as_raw(&self) -> *mut ibv::ibv_mr {
        self.mr.as_ptr()
    }
}

/// Maps a failed host or GPU `ibv_reg_mr*` to an error with the hint that fits the errno.
pub(crate) fn reg_mr_error(
    call: &'static str,
    dev: &str,
    len: usize,
    access: AccessFlags,
    errno: i32,
) -> Error {
    let hint = match errno {
        libc::ENOMEM | libc::EAGAIN => Hint::new(format!(
            "the locked-memory limit is {}; raise it (`ulimit -l unlimited`, or memlock in /etc/security/limits.conf / LimitMEMLOCK= for services)",
            memlock_limit_text()
        )),
        libc::EINVAL => Hint::new("the device rejected the access flags or the length (see its max_mr_size)"),
        libc::EFAULT => Hint::new("the address range is not mapped in this process"),
        libc::EPERM | libc::EACCES => Hint::new("no permission to pin memory: check RLIMIT_MEMLOCK and /dev/infiniband permissions"),
        _ => Hint::NONE,
    };
    Error::verbs(
        call,
        format!("device={dev}, len={len}, access={access:?}"),
        errno,
        hint,
    )
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

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: no work request references the region any more (they hold an Arc), so the NIC
        // is done with it; deregister before `mem` is freed (fields drop after this body).
        let rc = unsafe { ibv::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            log::warn!(
                "ibv_dereg_mr failed: {}",
                crate::error::errno_text(rc.abs())
            );
        }
    }
}

// SAFETY: the registration covers exactly the owned buffer at its own address for the life of the
// value (deregistered in Drop before the buffer is freed); it is host memory.
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
        self.ptr() as u64
    }
    fn len(&self) -> usize {
        self.mem.len()
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
    use super::*;

    #[test]
    fn access_defaults_to_least_privilege_and_normalizes() {
        assert_eq!(AccessFlags::default(), AccessFlags::LOCAL_WRITE);
        assert_eq!(
            AccessFlags::REMOTE_WRITE.normalized(),
            AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE
        );
        assert_eq!(
            AccessFlags::REMOTE_READ.normalized(),
            AccessFlags::REMOTE_READ
        );
        assert_eq!(AccessFlags::REMOTE_ATOMIC.raw(), 0b1001);
        assert_eq!(
            AccessFlags::RELAXED_ORDERING.bits(),
            ibv::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0
        );
        assert_eq!(
            AccessFlags::REMOTE_ATOMIC.bits(),
            ibv::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0
        );
    }

    #[test]
    fn ranges_are_checked() {
        assert_eq!(resolve_range("t", .., 10).unwrap(), (0, 10));
        assert_eq!(resolve_range("t", 2..=3, 10).unwrap(), (2, 2));
        assert_eq!(resolve_range("t", 10..10, 10).unwrap(), (10, 0));
        let e = resolve_range("local slice", 4..11, 10).unwrap_err();
        assert_eq!(
            e.to_string(),
            "local slice: range offset=4 len=7 lies outside [0, 10)"
        );
        #[allow(clippy::reversed_empty_ranges)]
        let r = resolve_range("t", 5..4, 10);
        assert!(r.is_err());
    }

    #[test]
    fn remote_slices_are_checked() {
        let r = RemoteRegion::new(0x1000, 4096, 7);
        let s = r.slice(4000..4096).unwrap();
        assert_eq!((s.addr(), s.len(), s.rkey()), (0x1000 + 4000, 96, 7));
        let e = r.slice(4000..4097).unwrap_err();
        assert!(matches!(e, Error::OutOfBounds { limit: 4096, .. }), "{e}");
        assert!(r.slice(u64::MAX..).is_err());
    }

    #[test]
    fn enomem_hint_names_memlock() {
        let e = reg_mr_error(
            "ibv_reg_mr",
            "rxe0",
            1 << 30,
            AccessFlags::LOCAL_WRITE,
            libc::ENOMEM,
        );
        let s = e.to_string();
        assert!(s.starts_with("ibv_reg_mr(device=rxe0, len=1073741824, access=AccessFlags(LOCAL_WRITE)) failed: Cannot allocate memory (errno 12); hint: the locked-memory limit is"), "{s}");
        assert!(s.contains("ulimit -l unlimited"));
    }

    #[test]
    fn aligned_buffer_is_page_aligned_and_zeroed() {
        let b = AlignedBuffer::zeroed(10_000).unwrap();
        assert_eq!(b.as_ptr() as usize % page_size(), 0);
        // SAFETY: test-only read of a buffer we own exclusively.
        let s = unsafe { std::slice::from_raw_parts(b.as_ptr(), b.len()) };
        assert!(s.iter().all(|&x| x == 0));
        assert!(AlignedBuffer::zeroed(0).is_err());
    }
}
