//! Cutting a byte range into chunks of at most the bounce buffer's size.

use std::ops::Range;

/// The chunks of `range`, in order: each `chunk_size` bytes but the last, which holds the rest.
/// An empty range has no chunks.
///
/// `chunk_size` must be non-zero ([`super::StagingConfig::validate`] guarantees it); a zero size is
/// treated as 1 so the iterator still ends.
#[derive(Debug, Clone)]
pub struct ChunkPlan {
    next: usize,
    end: usize,
    chunk_size: usize,
}

impl ChunkPlan {
    /// The plan for `range` in chunks of `chunk_size` bytes.
    pub fn new(range: Range<usize>, chunk_size: usize) -> Self {
        ChunkPlan {
            next: range.start,
            end: range.end.max(range.start),
            chunk_size: chunk_size.max(1),
        }
    }

    /// The number of chunks not yet taken.
    pub fn remaining_chunks(&self) -> usize {
        (self.end - self.next).div_ceil(self.chunk_size)
    }

    /// The bytes not yet taken.
    pub fn remaining_bytes(&self) -> usize {
        self.end - self.next
    }

    /// `true` when every chunk was taken.
    pub fn is_done(&self) -> bool {
        self.next >= self.end
    }

    /// Stops the plan: no further chunk is produced.
    pub fn stop(&mut self) {
        self.next = self.end;
    }
}

impl Iterator for ChunkPlan {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        if self.next >= self.end {
            return None;
        }
        let len = self.chunk_size.min(self.end - self.next);
        let r = self.next..self.next + len;
        self.next += len;
        Some(r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining_chunks();
        (n, Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_range_once_in_order() {
        for (range, size) in [
            (0..10, 3),
            (5..5, 4),
            (7..8, 4096),
            (0..16, 4),
            (3..(64 << 20) + 5, 8 << 20),
            (usize::MAX - 10..usize::MAX, 4),
        ] {
            let plan = ChunkPlan::new(range.clone(), size);
            let want = range.len().div_ceil(size);
            assert_eq!(plan.remaining_chunks(), want, "{range:?}/{size}");
            let chunks: Vec<_> = plan.collect();
            assert_eq!(chunks.len(), want);
            let mut at = range.start;
            for c in &chunks {
                assert_eq!(c.start, at);
                assert!(!c.is_empty() && c.len() <= size);
                at = c.end;
            }
            assert_eq!(at, range.end.max(range.start));
            assert!(chunks.iter().rev().skip(1).all(|c| c.len() == size));
        }
    }

    #[test]
    fn reversed_and_zero_sizes_end() {
        #[allow(clippy::reversed_empty_ranges)]
        let r = 10..3;
        assert_eq!(ChunkPlan::new(r, 4).count(), 0);
        assert_eq!(ChunkPlan::new(0..5, 0).count(), 5);
        let mut p = ChunkPlan::new(0..100, 10);
        assert_eq!(p.next(), Some(0..10));
        p.stop();
        assert!(p.is_done());
        assert_eq!(p.remaining_bytes(), 0);
        assert_eq!(p.next(), None);
    }
}
