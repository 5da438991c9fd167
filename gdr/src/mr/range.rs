//! Bounds checks shared by local and remote slices: every range a caller or a peer supplies is
//! resolved with checked arithmetic, so no value can panic, wrap or slip past the limit.

use std::ops::{Bound, RangeBounds};

use crate::error::{Error, Hint, Result};

/// Resolves a range against a length; an out-of-range request is an [`Error::OutOfBounds`].
pub(crate) fn resolve_range(
    what: &'static str,
    range: impl RangeBounds<usize>,
    limit: usize,
) -> Result<(usize, usize)> {
    // usize -> u64 is lossless on every supported target (usize is at most 64 bits).
    let (start, end) = (
        range.start_bound().map(|&x| x as u64),
        range.end_bound().map(|&x| x as u64),
    );
    span(start, end, limit as u64)
        // Both values are at most `limit`, which came from a usize: the casts are lossless.
        .map(|(o, l)| (o as usize, l as usize))
        .map_err(|(offset, len)| Error::OutOfBounds {
            what: what.into(),
            offset,
            len,
            limit: limit as u64,
            hint: Hint::NONE,
        })
}

/// Offset and length of a range within `[0, limit)`, or `Err((offset, len))` when it does not fit
/// (including ranges whose bounds overflow: `..=u64::MAX`, `(Excluded(u64::MAX), ..)`; the
/// error then reports the saturated values).
pub(super) fn span(
    start: Bound<u64>,
    end: Bound<u64>,
    limit: u64,
) -> std::result::Result<(u64, u64), (u64, u64)> {
    let s = match start {
        Bound::Included(s) => Some(s),
        Bound::Excluded(s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let e = match end {
        Bound::Included(e) => e.checked_add(1),
        Bound::Excluded(e) => Some(e),
        Bound::Unbounded => Some(limit),
    };
    match (s, e) {
        (Some(s), Some(e)) if s <= e && e <= limit => Ok((s, e - s)),
        _ => {
            let s = s.unwrap_or(u64::MAX);
            Err((s, e.unwrap_or(u64::MAX).saturating_sub(s)))
        }
    }
}

/// `Ok(())` when `len` bytes at `offset` lie inside `[0, limit)`, computed without overflow;
/// otherwise an [`Error::OutOfBounds`] with the values as given.
pub(super) fn check_span(
    what: &'static str,
    offset: usize,
    len: usize,
    limit: usize,
) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= limit => Ok(()),
        _ => Err(Error::OutOfBounds {
            what: what.into(),
            offset: offset as u64,
            len: len as u64,
            limit: limit as u64,
            hint: Hint::NONE,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(matches!(r, Err(Error::OutOfBounds { offset: 5, .. })));
    }

    #[test]
    fn overflowing_bounds_are_refused_not_saturated() {
        // `..=u64::MAX` is 2^64 bytes: it does not fit a limit of u64::MAX (saturating the end
        // to u64::MAX used to accept it).
        assert_eq!(
            span(Bound::Unbounded, Bound::Included(u64::MAX), u64::MAX),
            Err((0, u64::MAX))
        );
        // A start just past u64::MAX is past every limit, even an empty range at the top.
        assert!(span(Bound::Excluded(u64::MAX), Bound::Unbounded, u64::MAX).is_err());
        assert!(span(
            Bound::Excluded(u64::MAX),
            Bound::Included(u64::MAX),
            u64::MAX
        )
        .is_err());
        // The largest valid ranges still resolve.
        assert_eq!(
            span(Bound::Unbounded, Bound::Unbounded, u64::MAX),
            Ok((0, u64::MAX))
        );
        assert_eq!(
            span(
                Bound::Included(u64::MAX),
                Bound::Excluded(u64::MAX),
                u64::MAX
            ),
            Ok((u64::MAX, 0))
        );
        assert_eq!(span(Bound::Excluded(3), Bound::Included(5), 10), Ok((4, 2)));
        assert!(resolve_range("t", ..=usize::MAX, usize::MAX).is_err());
        assert!(resolve_range("t", usize::MAX.., 10).is_err());
    }

    #[test]
    fn spans_never_overflow() {
        assert!(check_span("t", 0, 10, 10).is_ok());
        assert!(check_span("t", 10, 0, 10).is_ok());
        assert!(check_span("t", 1, 10, 10).is_err());
        let e = check_span("MemoryRegion::read", usize::MAX - 2, 10, 16).unwrap_err();
        assert!(
            matches!(e, Error::OutOfBounds { offset, len: 10, limit: 16, .. } if offset == (usize::MAX - 2) as u64),
            "{e}"
        );
        assert!(check_span("t", usize::MAX, usize::MAX, usize::MAX).is_err());
        assert!(check_span("t", usize::MAX, 1, usize::MAX).is_err());
        assert!(check_span("t", usize::MAX, 0, usize::MAX).is_ok());
    }
}
