//! [`StagingConfig`]: how many bounce buffers a [`super::Stager`] owns, and how large.

use gdr_xfer_proto::staging::PipelineConfig;

use crate::error::{Error, Hint, Result};

/// The bounce buffers of a [`super::Stager`]: `chunks` pinned buffers of `chunk_size` bytes each
/// (one allocation of `chunks * chunk_size` bytes, registered once for RDMA).
///
/// More chunks keep more copies queued on the copy engine while the caller works on ready ones;
/// larger chunks cost fewer copies and fewer work requests. 4 x 8 MiB (the default) keeps three
/// copies queued while the caller sends the fourth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingConfig {
    /// Bytes per bounce buffer (one copy, and one RDMA request or more, per chunk).
    pub chunk_size: usize,
    /// The number of bounce buffers (copies in flight plus chunks handed to the caller).
    pub chunks: usize,
    /// The most tickets (started, unfinished ranges) at once; more are refused.
    pub max_tickets: usize,
    /// The smallest piece a range is cut into. A range is cut into [`Self::PIECES`] pieces of
    /// at least this size (rounded up to 64 KiB) and at most `chunk_size`, so that even a short
    /// range keeps copies and RDMA requests overlapping; see [`piece_size`](Self::piece_size).
    /// Set it to `chunk_size` to always cut at `chunk_size`.
    pub min_piece: usize,
    /// The size of a range's first piece, which doubles piece by piece up to the range's piece
    /// size; the last pieces shrink the same way. The first RDMA request starts after a copy of
    /// this size, not of a whole piece, and the last copy (after the last RDMA READ) is as short:
    /// the pipeline's fill and drain. Set it to `chunk_size` for no ramp.
    pub first_piece: usize,
    /// The rate chunks leave (device to host) or arrive (host to device) at, in bytes per second:
    /// the NIC's, or the rails' together. Zero (the default for a [`super::Stager`]): not
    /// known, and ranges are cut as `min_piece` and `first_piece` say. Otherwise each range is
    /// cut for least time given that rate and the copy engine's cost per copy (pieces of at
    /// least [`CUT_FLOOR`](Self::CUT_FLOOR) bytes and at most `chunk_size`; `min_piece` and
    /// `first_piece` then do not apply): against a NIC about as fast as the copies the pieces
    /// stay near 1 MiB, against a slower one they grow from a short first piece, device to
    /// host; host to device the same, from the end. An agent fills it from its rails' link
    /// rates when left at zero.
    pub nic_rate: u64,
}

impl Default for StagingConfig {
    fn default() -> Self {
        StagingConfig {
            chunk_size: Self::DEFAULT_CHUNK_SIZE,
            chunks: Self::DEFAULT_CHUNKS,
            max_tickets: Self::DEFAULT_MAX_TICKETS,
            min_piece: Self::DEFAULT_MIN_PIECE,
            first_piece: Self::DEFAULT_FIRST_PIECE,
            nic_rate: 0,
        }
    }
}

impl StagingConfig {
    /// 8 MiB per chunk.
    pub const DEFAULT_CHUNK_SIZE: usize = 8 << 20;
    /// Four chunks.
    pub const DEFAULT_CHUNKS: usize = 4;
    /// 4096 tickets at once.
    pub const DEFAULT_MAX_TICKETS: usize = 4096;
    /// 1 MiB: copies of that size still run at close to full copy-engine speed.
    pub const DEFAULT_MIN_PIECE: usize = 1 << 20;
    /// 256 KiB: a copy that short takes about 5 us on a PCIe Gen5 GPU, so the first RDMA request
    /// of a range starts that soon.
    pub const DEFAULT_FIRST_PIECE: usize = 256 << 10;
    /// A range is cut into this many pieces where `min_piece` and `chunk_size` allow: with
    /// copies and RDMA overlapped, the fill and drain cost about one piece's time of the sixteen.
    pub const PIECES: usize = gdr_xfer_proto::staging::PIECES;
    /// The shortest piece of a cut for a known [`nic_rate`](Self::nic_rate): 256 KiB (or
    /// `chunk_size` when that is shorter).
    pub const CUT_FLOOR: usize = gdr_xfer_proto::staging::CUT_FLOOR;
    /// The largest bounce allocation accepted: 16 GiB of pinned memory.
    pub const MAX_TOTAL: usize = 16 << 30;
    /// The most chunks accepted.
    pub const MAX_CHUNKS: usize = 1024;

    /// `chunks` buffers of `chunk_size` bytes, other settings default.
    pub fn new(chunk_size: usize, chunks: usize) -> Self {
        StagingConfig {
            chunk_size,
            chunks,
            ..Self::default()
        }
    }

    /// The size of the pieces a range of `len` bytes is cut into (apart from the ramp at both
    /// ends, see [`first_piece`](Self::first_piece)): `len / PIECES` rounded up to 64 KiB, but
    /// never less than `min_piece` nor more than `chunk_size`.
    pub fn piece_size(&self, len: usize) -> usize {
        self.pipeline().piece_size(len)
    }

    /// The settings the core's bounce-slot machine runs with.
    pub(crate) fn pipeline(&self) -> PipelineConfig {
        PipelineConfig {
            chunk_size: self.chunk_size,
            chunks: self.chunks,
            max_tickets: self.max_tickets,
            min_piece: self.min_piece,
            first_piece: self.first_piece,
            nic_rate: self.nic_rate,
        }
    }

    /// The bounce allocation's size: `chunk_size * chunks`.
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    pub fn total(&self) -> Result<usize> {
        self.validate()?;
        Ok(self.chunk_size * self.chunks)
    }

    /// Checks the settings: non-zero sizes, at most [`MAX_CHUNKS`](Self::MAX_CHUNKS) chunks and
    /// [`MAX_TOTAL`](Self::MAX_TOTAL) bytes in all, at least one ticket.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the value and the limit.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String, hint: &'static str| {
            Err(Error::InvalidArgument {
                what,
                hint: Hint::new(hint),
            })
        };
        if self.chunk_size == 0 || self.chunks == 0 {
            return bad(
                format!(
                    "staging config: chunk_size={} chunks={}: both must be at least 1",
                    self.chunk_size, self.chunks
                ),
                "use StagingConfig::default() (4 x 8 MiB) or other non-zero values",
            );
        }
        if self.chunks > Self::MAX_CHUNKS {
            return bad(
                format!(
                    "staging config: {} chunks is more than the {} allowed",
                    self.chunks,
                    Self::MAX_CHUNKS
                ),
                "use fewer, larger chunks",
            );
        }
        match self.chunk_size.checked_mul(self.chunks) {
            Some(t) if t <= Self::MAX_TOTAL => {}
            _ => {
                return bad(
                    format!(
                        "staging config: {} x {} bytes of bounce buffers exceeds the {} allowed",
                        self.chunks,
                        self.chunk_size,
                        Self::MAX_TOTAL
                    ),
                    "pinned memory is locked RAM: a few chunks of a few MiB reach full speed",
                );
            }
        }
        if self.min_piece == 0 {
            return bad(
                "staging config: min_piece=0".into(),
                "use StagingConfig::DEFAULT_MIN_PIECE (1 MiB), or chunk_size to never cut smaller",
            );
        }
        if self.first_piece == 0 {
            return bad(
                "staging config: first_piece=0".into(),
                "use StagingConfig::DEFAULT_FIRST_PIECE (256 KiB), or chunk_size for no ramp",
            );
        }
        if self.max_tickets == 0 {
            return bad(
                "staging config: max_tickets=0 admits no transfer".into(),
                "allow at least one ticket",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_four_by_eight_mib() {
        let c = StagingConfig::default();
        assert_eq!(c.total().unwrap(), 32 << 20);
        assert_eq!(StagingConfig::new(1 << 20, 2).total().unwrap(), 2 << 20);
    }

    #[test]
    fn ranges_are_cut_into_sixteen_pieces_where_the_bounds_allow() {
        let c = StagingConfig::default(); // 4 x 8 MiB, pieces of at least 1 MiB
        const MIB: usize = 1 << 20;
        assert_eq!(
            c.piece_size(1 << 30),
            8 * MIB,
            "long ranges: the chunk size"
        );
        assert_eq!(c.piece_size(128 * MIB), 8 * MIB);
        assert_eq!(c.piece_size(32 * MIB), 2 * MIB);
        assert_eq!(
            c.piece_size(16 * MIB),
            MIB,
            "a layer's KV blocks: sixteen pieces"
        );
        assert_eq!(
            c.piece_size(64 * MIB + 1),
            4 * MIB + (64 << 10),
            "rounded up to 64 KiB"
        );
        assert_eq!(c.piece_size(3 * MIB), MIB, "never below min_piece");
        assert_eq!(c.piece_size(1), MIB);
        assert_eq!(c.piece_size(0), MIB);
        assert_eq!(c.piece_size(usize::MAX), 8 * MIB);
        let fixed = StagingConfig {
            min_piece: 8 * MIB,
            ..c
        };
        assert_eq!(fixed.piece_size(16 * MIB), 8 * MIB);
        let tiny = StagingConfig::new(4096, 2);
        assert_eq!(tiny.piece_size(100_000), 4096, "never above chunk_size");
        for len in [0, 1, 4095, 1 << 20, 123_456_789, usize::MAX] {
            for cfg in [c, fixed, tiny, StagingConfig::new(1, 1)] {
                let p = cfg.piece_size(len);
                assert!(p >= 1 && p <= cfg.chunk_size, "{cfg:?} {len}: {p}");
            }
        }
    }

    #[test]
    fn hostile_sizes_are_typed_errors() {
        for c in [
            StagingConfig::new(0, 4),
            StagingConfig::new(4096, 0),
            StagingConfig::new(usize::MAX, 2),
            StagingConfig::new(usize::MAX / 2 + 1, 2),
            StagingConfig::new(1 << 30, 17),
            StagingConfig::new(4096, StagingConfig::MAX_CHUNKS + 1),
            StagingConfig {
                max_tickets: 0,
                ..StagingConfig::default()
            },
            StagingConfig {
                min_piece: 0,
                ..StagingConfig::default()
            },
            StagingConfig {
                first_piece: 0,
                ..StagingConfig::default()
            },
        ] {
            let e = c.total().unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{c:?}: {e}");
            assert!(e.to_string().contains("staging config"), "{e}");
        }
    }
}
