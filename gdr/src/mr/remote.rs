//! Regions a peer advertised, and bounds-checked slices of them.
//!
//! Every value here may come from the network: nothing in this file panics or wraps on any
//! `addr`/`len`/range, however hostile.

use std::ops::RangeBounds;

use super::range::span;
use crate::error::{Error, Hint, Result};

/// A region a peer advertised: address, length and remote key. Sent over the wire by
/// [`crate::connect`]; the values come from the peer and are only trusted as far as bounds go.
///
/// The fields are public so that any out-of-band exchange can build one; a descriptor whose
/// `addr + len` does not fit in 64 bits is refused by [`RemoteRegion::slice`] (and
/// [`RemoteRegion::validate`]) rather than wrapping.
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
    /// A descriptor from its parts (not checked here: see [`RemoteRegion::validate`]).
    #[must_use]
    pub fn new(addr: u64, len: u64, rkey: u32) -> Self {
        RemoteRegion { addr, len, rkey }
    }

    /// Checks that the region is addressable: `addr + len` fits in 64 bits (a region may end
    /// exactly at `u64::MAX`, never past it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `addr` and `len`.
    pub fn validate(&self) -> Result<()> {
        self.end().map(|_| ())
    }

    /// One past the last byte, checked.
    fn end(&self) -> Result<u64> {
        self.addr.checked_add(self.len).ok_or_else(|| {
            Error::invalid(
                format!(
                    "remote region addr={:#x} len={} runs past the end of the 64-bit address space",
                    self.addr, self.len
                ),
                Hint::new("the peer advertised an impossible region: check what it sent"),
            )
        })
    }

    /// A bounds-checked slice of the remote region.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for a range outside `[0, len)`, [`Error::InvalidArgument`] for a
    /// region that fails [`RemoteRegion::validate`].
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Result<RemoteSlice> {
        self.end()?;
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
        // `start <= self.len` and `addr + len` fits (checked above): this cannot fail, and is
        // checked so that it can never wrap either.
        let addr = self.addr.checked_add(start).ok_or(Error::OutOfBounds {
            what: "remote slice".into(),
            offset: start,
            len,
            limit: self.len,
            hint: Hint::NONE,
        })?;
        Ok(RemoteSlice {
            addr,
            len,
            rkey: self.rkey,
        })
    }
}

/// A bounds-checked piece of a [`RemoteRegion`]: `addr() + len()` never overflows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteSlice {
    addr: u64,
    len: u64,
    rkey: u32,
}

impl RemoteSlice {
    /// `len` bytes at the peer's address `addr` under `rkey`; `None` when `addr + len`
    /// overflows. For engines that keep a peer's region table themselves; bounds against the
    /// peer's region are theirs to check (the NIC refuses what the key does not cover).
    pub fn new(addr: u64, len: u64, rkey: u32) -> Option<RemoteSlice> {
        addr.checked_add(len)?;
        Some(RemoteSlice { addr, len, rkey })
    }

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

#[cfg(test)]
mod tests {
    use std::ops::Bound;

    use super::*;

    #[test]
    fn remote_slices_made_directly_never_wrap() {
        let r = RemoteSlice::new(0x1000, 64, 7).unwrap();
        assert_eq!((r.addr(), r.len(), r.rkey()), (0x1000, 64, 7));
        assert!(RemoteSlice::new(u64::MAX, 1, 7).is_none());
        assert!(RemoteSlice::new(1, u64::MAX, 7).is_none());
        assert!(RemoteSlice::new(u64::MAX, 0, 7).is_some_and(|r| r.is_empty()));
    }

    #[test]
    fn remote_slices_are_checked() {
        let r = RemoteRegion::new(0x1000, 4096, 7);
        let s = r.slice(4000..4096).unwrap();
        assert_eq!((s.addr(), s.len(), s.rkey()), (0x1000 + 4000, 96, 7));
        let e = r.slice(4000..4097).unwrap_err();
        assert!(matches!(e, Error::OutOfBounds { limit: 4096, .. }), "{e}");
        assert!(r.slice(u64::MAX..).is_err());
        assert!(r.slice(..=u64::MAX).is_err());
        assert!(r
            .slice((Bound::Excluded(u64::MAX), Bound::Unbounded))
            .is_err());
    }

    /// Finding 5: `RemoteRegion::new(u64::MAX - 1, 16, k).slice(8..16)` panicked (debug) or
    /// wrapped (release) computing `addr + 8`.
    #[test]
    fn hostile_remote_region_is_an_error_not_a_wrap() {
        let r = RemoteRegion::new(u64::MAX - 1, 16, 9);
        let e = r.slice(8..16).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("addr=0xfffffffffffffffe len=16 runs past the end"),
            "{e}"
        );
        assert!(r.validate().is_err());
        assert!(r.slice(..).is_err(), "even the offset-0 slice is refused");
        assert!(RemoteRegion::new(u64::MAX, u64::MAX, 0).slice(..0).is_err());
        assert!(RemoteRegion::new(1, u64::MAX, 0).validate().is_err());
    }

    #[test]
    fn regions_reaching_the_top_of_the_address_space_still_work() {
        let r = RemoteRegion::new(u64::MAX - 16, 16, 3);
        r.validate().unwrap();
        let s = r.slice(8..16).unwrap();
        assert_eq!((s.addr(), s.len()), (u64::MAX - 8, 8));
        let s = r.slice(16..).unwrap();
        assert_eq!((s.addr(), s.len()), (u64::MAX, 0));
        let whole = RemoteRegion::new(0, u64::MAX, 1);
        let s = whole.slice(..).unwrap();
        assert_eq!((s.addr(), s.len()), (0, u64::MAX));
        assert!(whole.slice(..=u64::MAX).is_err(), "2^64 bytes do not fit");
        let s = whole.slice(u64::MAX - 1..=u64::MAX - 1).unwrap();
        assert_eq!((s.addr(), s.len()), (u64::MAX - 1, 1));
    }
}
