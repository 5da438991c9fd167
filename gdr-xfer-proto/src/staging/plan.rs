//! Cutting a byte range into chunks of at most the bounce buffer's size, optionally ramped: short
//! pieces first and last, so the pipeline fills and drains quickly; or along a list of piece
//! lengths (the least-time cut for a NIC of known rate, [`super::cut`]).

use std::ops::Range;
use std::sync::Arc;

/// The chunks of `range`, in order: each `chunk_size` bytes but the last, which holds the rest
/// ([`ChunkPlan::new`]); or ramped ([`ChunkPlan::ramped`]); or along a list of lengths. An empty
/// range has no chunks.
///
/// `chunk_size` must be non-zero ([`super::PipelineConfig::check`] guarantees it); a zero size is
/// treated as 1 so the iterator still ends.
#[derive(Debug, Clone)]
pub struct ChunkPlan {
    next: usize,
    end: usize,
    chunk_size: usize,
    /// The next chunk's size limit on the way up (doubles per chunk up to `chunk_size`).
    ramp: usize,
    /// The smallest chunk of the ramps.
    floor: usize,
    /// Piece lengths to follow before the cut above (a chunk never passes the range's end or
    /// `chunk_size`; what the list leaves uncovered is cut as above), and the next one's index.
    listed: Option<(Arc<[usize]>, usize)>,
}

impl ChunkPlan {
    /// The plan for `range` in chunks of `chunk_size` bytes.
    pub fn new(range: Range<usize>, chunk_size: usize) -> Self {
        Self::ramped(range, chunk_size, chunk_size)
    }

    /// The plan for `range` in chunks of `chunk_size` bytes, ramped: the first is `first`
    /// bytes, each next one twice the one before up to `chunk_size`; towards the end each
    /// takes at most half of what remains (not less than `first`), and a remainder shorter than
    /// `first` joins the chunk before it. `first >= chunk_size` is [`ChunkPlan::new`].
    pub fn ramped(range: Range<usize>, chunk_size: usize, first: usize) -> Self {
        let chunk_size = chunk_size.max(1);
        let floor = first.clamp(1, chunk_size);
        ChunkPlan {
            next: range.start,
            end: range.end.max(range.start),
            chunk_size,
            ramp: floor,
            floor,
            listed: None,
        }
    }

    /// The plan for `range` along `pieces` (lengths in order), each at most `chunk_size`; past
    /// the list (or should it not cover the range), in chunks of `chunk_size`.
    pub(crate) fn listed(range: Range<usize>, chunk_size: usize, pieces: Arc<[usize]>) -> Self {
        let mut plan = Self::new(range, chunk_size);
        plan.listed = Some((pieces, 0));
        plan
    }

    /// The number of chunks not yet taken.
    pub fn remaining_chunks(&self) -> usize {
        if self.floor == self.chunk_size && self.listed.is_none() {
            (self.end - self.next).div_ceil(self.chunk_size)
        } else {
            self.clone().count()
        }
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
        let rem = self.end - self.next;
        if let Some((pieces, at)) = &mut self.listed {
            if let Some(&want) = pieces.get(*at) {
                *at += 1;
                let len = want.clamp(1, self.chunk_size).min(rem);
                let r = self.next..self.next + len;
                self.next += len;
                return Some(r);
            }
        }
        // Up the ramp, then at most half of what remains (the ramp down), never below the floor.
        let half = (rem / 2).max(self.floor);
        let mut len = self.chunk_size.min(self.ramp).min(half).min(rem);
        if rem - len < self.floor {
            // No remainder shorter than the floor: it joins this chunk when that fits.
            len = rem.min(self.chunk_size);
        }
        self.ramp = self.ramp.saturating_mul(2);
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
    fn a_remainder_as_long_as_the_floor_is_a_chunk_of_its_own() {
        let got: Vec<_> = ChunkPlan::ramped(0..4, 8, 2).collect();
        assert_eq!(got, vec![0..2, 2..4]);
    }

    #[test]
    fn the_plan_says_what_is_left() {
        let mut p = ChunkPlan::ramped(0..100, 32, 8);
        let n = p.clone().count();
        assert_eq!(p.size_hint(), (n, Some(n)));
        assert_eq!(p.remaining_bytes(), 100);
        let first = p.next().unwrap();
        assert_eq!(p.remaining_bytes(), 100 - first.len());
        assert_eq!(p.size_hint(), (n - 1, Some(n - 1)));
        p.stop();
        assert_eq!((p.remaining_bytes(), p.size_hint()), (0, (0, Some(0))));
    }

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
    fn ramped_chunks_grow_from_the_first_and_shrink_towards_the_end() {
        const K: usize = 1 << 10;
        const M: usize = 1 << 20;
        let sizes = |r: Range<usize>, size: usize, first: usize| -> Vec<usize> {
            ChunkPlan::ramped(r, size, first).map(|c| c.len()).collect()
        };
        let s = sizes(0..16 * M, M, 256 * K);
        assert_eq!(&s[..3], [256 * K, 512 * K, M], "up: {s:?}");
        let top = s.iter().rposition(|&l| l == M).unwrap();
        assert!(
            s[top..].windows(2).all(|w| w[1] <= w[0]) && s.len() - top >= 3,
            "down: {s:?}"
        );
        assert!(
            *s.last().unwrap() < 2 * 256 * K,
            "a short last chunk: {s:?}"
        );
        assert!(s.iter().all(|&l| (256 * K..=M).contains(&l)), "{s:?}");
        // No ramp when first >= chunk_size: the fixed plan.
        assert_eq!(sizes(0..10, 3, 3), [3, 3, 3, 1]);
        assert_eq!(sizes(0..10, 3, 9), [3, 3, 3, 1]);
        // Short ranges: one chunk, or the floor and the rest.
        assert_eq!(sizes(0..100, 1000, 64), [100]);
        assert_eq!(sizes(0..130, 1000, 64), [64, 66]);
        // Every plan covers its range once, in order, within the bounds, for odd sizes too.
        for (range, size, first) in [
            (0..16 * M, M, 256 * K),
            (3..(64 * M) + 5, 8 * M, 256 * K),
            (0..12345, 4096, 1000),
            (0..(8 * M) + 1, M, 1),
            (usize::MAX - 100..usize::MAX, 16, 4),
        ] {
            let plan = ChunkPlan::ramped(range.clone(), size, first);
            let n = plan.remaining_chunks();
            let chunks: Vec<_> = plan.collect();
            assert_eq!(chunks.len(), n);
            let mut at = range.start;
            for c in &chunks {
                assert_eq!(c.start, at);
                assert!(!c.is_empty() && c.len() <= size, "{range:?}: {c:?}");
                at = c.end;
            }
            assert_eq!(at, range.end);
        }
    }

    #[test]
    fn listed_chunks_follow_the_list_within_the_bounds() {
        let list = |v: &[usize]| -> Arc<[usize]> { v.into() };
        let lens = |p: ChunkPlan| -> Vec<usize> { p.map(|c| c.len()).collect() };
        assert_eq!(
            lens(ChunkPlan::listed(0..10, 4, list(&[1, 2, 3, 4]))),
            [1, 2, 3, 4]
        );
        // Longer than the range: cut at its end; a zero or oversized length: 1 and chunk_size.
        assert_eq!(lens(ChunkPlan::listed(0..5, 4, list(&[0, 9, 9]))), [1, 4]);
        // Shorter than the range: the rest in chunks of chunk_size.
        assert_eq!(lens(ChunkPlan::listed(0..11, 4, list(&[2]))), [2, 4, 4, 1]);
        let p = ChunkPlan::listed(100..111, 4, list(&[2, 3]));
        assert_eq!(p.remaining_chunks(), 4);
        let chunks: Vec<_> = p.collect();
        assert_eq!(chunks, [100..102, 102..105, 105..109, 109..111]);
        let mut p = ChunkPlan::listed(0..100, 10, list(&[5; 20]));
        p.next();
        p.stop();
        assert_eq!(p.next(), None);
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
