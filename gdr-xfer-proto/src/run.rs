//! Runs (bytes contiguous on both sides), positions in them, and cutting them into requests.

use crate::fault::Rejection;
use crate::io::Pieces;

/// A run: bytes contiguous on both sides, after merging adjacent descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Index into the transfer's local segments.
    pub local: u32,
    /// Offset in that segment.
    pub local_offset: u64,
    /// Remote address.
    pub remote_addr: u64,
    /// Index of the remote segment in the transfer's key table.
    pub remote: u32,
    /// Bytes.
    pub len: u64,
}

/// A position in a transfer's runs: run index and byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Cursor {
    /// The run.
    pub run: usize,
    /// The byte offset in it.
    pub offset: u64,
}

impl Cursor {
    /// Run `run`, offset `offset`.
    pub fn new(run: usize, offset: u64) -> Cursor {
        Cursor { run, offset }
    }
}

/// Requests a run list needs when cut into slices of `slice_size` bytes.
pub fn slices_of(runs: &[Run], slice_size: u64) -> u64 {
    runs.iter()
        .map(|r| {
            // Most runs are one block no longer than a slice: no division for them.
            if r.len <= slice_size {
                1
            } else {
                r.len.div_ceil(slice_size)
            }
        })
        .sum()
}

/// Cuts up to `max` slices of at most `slice_size` bytes from `from` towards `to` (`from <
/// to`), all of the local segment of `from`'s run, into `pieces` (wr_ids `first..`). Returns
/// where it stopped and the bytes cut. `rkey(remote segment)` gives the remote key of a segment
/// on the rail being posted to. (The hot loop of posting: one bound per run, the remote key
/// looked up only when the remote segment changes.)
#[allow(clippy::too_many_arguments)]
pub(crate) fn cut<P: Pieces>(
    runs: &[Run],
    rkey: impl Fn(u32) -> u32,
    slice_size: u64,
    from: Cursor,
    to: Cursor,
    max: usize,
    first: u64,
    pieces: &mut P,
) -> Result<(Cursor, u64), Rejection> {
    // The runs `from` to `to`: the last one partly when `to` is inside it.
    let end_run = if to.offset == 0 { to.run } else { to.run + 1 };
    let Some(runs) = runs.get(from.run..end_run) else {
        return Err(Rejection::PastRuns {
            end_run,
            runs: runs.len(),
        });
    };
    let last = runs.len().saturating_sub(1);
    let Some(head) = runs.first() else {
        return Ok((from, 0));
    };
    let local = head.local;
    let mut remote_seg = head.remote;
    let mut key = rkey(head.remote);
    let mut bytes = 0;
    let mut off = from.offset;
    // Pieces cut so far, kept out of the sink.
    let mut n = 0usize;
    for (i, run) in runs.iter().enumerate() {
        if run.local != local {
            return Ok((Cursor::new(from.run + i, 0), bytes));
        }
        if run.remote != remote_seg {
            remote_seg = run.remote;
            key = rkey(run.remote);
        }
        let end = if i == last && to.offset != 0 {
            to.offset
        } else {
            run.len
        };
        while off < end {
            if n >= max {
                return Ok((Cursor::new(from.run + i, off), bytes));
            }
            // Up to the range's end (a retry range may end inside a run).
            let len = (end - off).min(slice_size);
            // The local offset is bounded by the driver (every piece against its local
            // registration); the remote range must not wrap.
            let local_offset = run.local_offset.wrapping_add(off);
            let Some(remote_addr) = run.remote_addr.checked_add(off) else {
                return Err(Rejection::RemoteOverflow {
                    addr: run.remote_addr,
                    len: off,
                });
            };
            if !pieces.push(local_offset, remote_addr, len, key, first + n as u64) {
                return Err(Rejection::RemoteOverflow {
                    addr: remote_addr,
                    len,
                });
            }
            n += 1;
            bytes += len;
            off += len;
        }
        off = 0;
    }
    Ok((to, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (local offset, remote address, len, rkey, wr_id) per piece.
    #[derive(Default)]
    struct Sink(Vec<(u64, u64, u64, u32, u64)>);
    impl Pieces for Sink {
        fn clear(&mut self) {
            self.0.clear();
        }
        fn push(&mut self, lo: u64, ra: u64, len: u64, rkey: u32, wr_id: u64) -> bool {
            self.0.push((lo, ra, len, rkey, wr_id));
            ra.checked_add(len).is_some()
        }
        fn len(&self) -> usize {
            self.0.len()
        }
    }

    fn run(local: u32, remote: u32, remote_addr: u64, len: u64) -> Run {
        Run {
            local,
            local_offset: 0x1000,
            remote_addr,
            remote,
            len,
        }
    }

    /// Runs A (100 KiB), B (16 KiB, another remote segment), C (another local segment);
    /// slices of 64 KiB; keys per (remote segment, rail).
    fn runs() -> Vec<Run> {
        vec![
            run(0, 0, 0x10_0000, 100 << 10),
            run(0, 1, 0x20_0000, 16 << 10),
            run(1, 0, 0x30_0000, 16 << 10),
        ]
    }

    fn cut_all(from: Cursor, to: Cursor, max: usize, rail: u32) -> (Cursor, u64, Sink) {
        let mut s = Sink::default();
        let keys = [0xa0, 0xa1, 0xb0, 0xb1];
        let (c, b) = cut(
            &runs(),
            |seg| keys[(seg * 2 + rail) as usize],
            64 << 10,
            from,
            to,
            max,
            100,
            &mut s,
        )
        .unwrap();
        (c, b, s)
    }

    fn at(run: usize, offset: u64) -> Cursor {
        Cursor::new(run, offset)
    }

    #[test]
    fn cutting_stops_at_a_local_segment_change_and_numbers_the_pieces() {
        let end = at(3, 0);
        let (c, bytes, p) = cut_all(at(0, 0), end, 32, 0);
        assert_eq!(c, at(2, 0), "C belongs to another local segment");
        assert_eq!(bytes, 116 << 10);
        assert_eq!(
            p.0,
            [
                (0x1000, 0x10_0000, 64 << 10, 0xa0, 100),
                (
                    0x1000 + (64 << 10),
                    0x10_0000 + (64 << 10),
                    36 << 10,
                    0xa0,
                    101
                ),
                // B's remote segment has its own key.
                (0x1000, 0x20_0000, 16 << 10, 0xb0, 102),
            ]
        );
        let (_, _, p) = cut_all(at(0, 0), end, 32, 1);
        assert_eq!(
            p.0.iter().map(|x| x.3).collect::<Vec<_>>(),
            [0xa1, 0xa1, 0xb1]
        );
        let (c, bytes, p) = cut_all(at(2, 0), end, 32, 0);
        assert_eq!((c, bytes, p.0.len()), (end, 16 << 10, 1));
    }

    #[test]
    fn cutting_stops_at_the_room_and_at_a_retry_range_end() {
        let end = at(3, 0);
        let (c, bytes, p) = cut_all(at(0, 0), end, 1, 0);
        assert_eq!((c, bytes, p.0.len()), (at(0, 64 << 10), 64 << 10, 1));
        let (c, _, p) = cut_all(c, end, 32, 0);
        assert_eq!((c, p.0.len()), (at(2, 0), 2));
        assert_eq!(p.0[0].2, 36 << 10);
        // A retry range ending inside a run: exactly that range, the same slices as first cut.
        let (c, bytes, p) = cut_all(at(0, 0), at(0, 64 << 10), 32, 0);
        assert_eq!((c, bytes, p.0.len()), (at(0, 64 << 10), 64 << 10, 1));
        let (c, bytes, p) = cut_all(at(0, 64 << 10), at(1, 0), 32, 0);
        assert_eq!((c, bytes, p.0.len()), (at(1, 0), 36 << 10, 1));
        let (c, _, p) = cut_all(at(0, 0), end, 2, 0);
        assert_eq!((c, p.0.len()), (at(1, 0), 2));
    }

    #[test]
    fn overflowing_and_out_of_range_cuts_are_errors_not_panics() {
        let mut s = Sink::default();
        let r = [Run {
            local: 0,
            local_offset: 0,
            remote_addr: u64::MAX - 10,
            remote: 0,
            len: 100,
        }];
        assert!(cut(&r, |_| 1, 64, at(0, 0), at(1, 0), 8, 0, &mut s).is_err());
        assert!(cut(&r, |_| 1, 64, at(5, 0), at(7, 0), 8, 0, &mut s).is_err());
        assert_eq!(slices_of(&runs(), 64 << 10), 4);
    }
}
