//! The [`Registered`] promise every region makes, and bounds-checked local slices of it.

use std::fmt;
use std::ops::RangeBounds;
use std::sync::Arc;

use super::range::resolve_range;
use super::{AccessFlags, MemoryKind, RemoteRegion};
use crate::error::{Error, Hint, Result};
use crate::pd::ProtectionDomain;

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

/// Slices of registered regions, for work requests. Implemented for every `Arc<R: Registered>`.
pub trait RegionExt {
    /// A local slice for scatter/gather lists. Bounds are checked here, not by the NIC later.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for a range outside the region; [`Error::InvalidArgument`] when the
    /// region's own `iova() + len()` does not fit in 64 bits (a broken [`Registered`] impl).
    fn slice(&self, range: impl RangeBounds<usize>) -> Result<LocalSlice>;
    /// The descriptor a peer needs to access this region remotely.
    #[must_use]
    fn remote(&self) -> RemoteRegion;
}

impl<R: Registered> RegionExt for Arc<R> {
    fn slice(&self, range: impl RangeBounds<usize>) -> Result<LocalSlice> {
        let (offset, len) = resolve_range("local slice", range, self.len())?;
        let region: Arc<dyn Registered> = self.clone();
        LocalSlice::new(region, offset, len)
    }

    fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.iova(),
            len: self.len() as u64,
            rkey: self.rkey(),
        }
    }
}

/// Gives a region type the everyday methods of [`Registered`] and [`RegionExt`] as inherent
/// methods, so `mr.slice(..)`, `mr.remote()`, `mr.lkey()` and `mr.rkey()` work without importing
/// a trait. Used for gdr's own region types.
macro_rules! inherent_region_methods {
    ($region:ty) => {
        impl $region {
            /// A bounds-checked local slice, for scatter/gather lists (as [`RegionExt::slice`]).
            ///
            /// # Errors
            /// [`Error::OutOfBounds`](crate::Error::OutOfBounds) for a range outside the region.
            ///
            /// [`RegionExt::slice`]: crate::mr::RegionExt::slice
            pub fn slice(
                self: &std::sync::Arc<Self>,
                range: impl std::ops::RangeBounds<usize>,
            ) -> crate::Result<crate::mr::LocalSlice> {
                crate::mr::RegionExt::slice(self, range)
            }

            /// The descriptor a peer needs to access this region remotely (as
            /// [`RegionExt::remote`](crate::mr::RegionExt::remote)).
            #[must_use]
            pub fn remote(self: &std::sync::Arc<Self>) -> crate::mr::RemoteRegion {
                crate::mr::RegionExt::remote(self)
            }

            /// The local key, for scatter/gather entries.
            #[must_use]
            pub fn lkey(&self) -> u32 {
                crate::mr::Registered::lkey(self)
            }

            /// The remote key a peer needs.
            #[must_use]
            pub fn rkey(&self) -> u32 {
                crate::mr::Registered::rkey(self)
            }
        }
    };
}
pub(crate) use inherent_region_methods;

/// A bounds-checked piece of a local registered region. Holds the region alive.
///
/// What posting needs from the region (address, lkey, access, protection domain) is read once
/// here: a registration never changes them, and the posting path then makes no virtual calls.
/// `addr() + len()` never overflows: construction checks it.
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
    /// `len` bytes at `offset` of `region` (the caller checked the range against
    /// `region.len()`); the NIC addresses are computed with checked arithmetic.
    pub(crate) fn new(
        region: Arc<dyn Registered>,
        offset: usize,
        len: usize,
    ) -> Result<LocalSlice> {
        let addr = slice_addr(region.iova(), offset, len)?;
        Ok(LocalSlice {
            addr,
            lkey: region.lkey(),
            access: region.access(),
            pd: Arc::as_ptr(region.pd()) as usize,
            region,
            offset,
            len,
        })
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
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for a range outside this slice.
    pub fn sub(&self, range: impl RangeBounds<usize>) -> Result<LocalSlice> {
        let (o, len) = resolve_range("local sub-slice", range, self.len)?;
        // `o <= self.len` and `self.offset + self.len <= region.len()`, so this cannot overflow;
        // checked anyway so that no arithmetic here can ever wrap.
        let offset = self.offset.checked_add(o).ok_or(Error::OutOfBounds {
            what: "local sub-slice".into(),
            offset: o as u64,
            len: len as u64,
            limit: self.len as u64,
            hint: Hint::NONE,
        })?;
        LocalSlice::new(self.region.clone(), offset, len)
    }
}

/// The NIC address of `len` bytes at `offset` of a region at `iova`: an error, not a wrap, when
/// the slice would run past the end of the 64-bit address space.
fn slice_addr(iova: u64, offset: usize, len: usize) -> Result<u64> {
    iova.checked_add(offset as u64)
        .filter(|a| a.checked_add(len as u64).is_some())
        .ok_or_else(|| {
            Error::invalid(
                format!(
                    "local slice offset={offset} len={len} of a region at iova={iova:#x} \
                     runs past the end of the 64-bit address space"
                ),
                Hint::new(
                    "the region reports an impossible iova/len (a broken `Registered` implementation)",
                ),
            )
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_addresses_never_wrap() {
        assert_eq!(slice_addr(0x1000, 16, 32).unwrap(), 0x1010);
        assert_eq!(slice_addr(u64::MAX - 16, 8, 8).unwrap(), u64::MAX - 8);
        let e = slice_addr(u64::MAX - 16, 8, 9).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(e.to_string().contains("offset=8 len=9"), "{e}");
        assert!(e.to_string().contains("iova=0xffffffffffffffef"), "{e}");
        assert!(slice_addr(u64::MAX, 1, 0).is_err());
        #[cfg(target_pointer_width = "64")]
        assert!(slice_addr(2, usize::MAX, 0).is_err());
    }
}
