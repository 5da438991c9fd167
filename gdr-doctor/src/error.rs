//! The error type of gdr-doctor: every failure is a matchable variant that names the input, the
//! values that matter and, where one is known, how to fix it.
//!
//! Few things fail: a diagnosis is a pure function, and a collection records what it cannot read
//! in the snapshot instead of failing ([`crate::topology::Snapshot::read_errors`], the CUDA
//! driver's reason in [`crate::topology::CudaInfo::error`]). What remains is input the caller
//! names: a collection root, a snapshot, an NCCL log.

use std::path::PathBuf;

pub use gdr::Hint;

/// The hint of every snapshot error.
const HINT_SNAPSHOT: &str = "give a file written by `gdr doctor dump`";

/// Everything that can go wrong in gdr-doctor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory could not be read (the collection root itself; files below it that
    /// exist but cannot be read are recorded in the snapshot instead).
    #[error("{what}: {source}")]
    Io {
        /// What was being read, e.g. `collect: root directory /mnt/copy`.
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The collection root is not a directory.
    #[error("collect: root {} is not a directory{hint}", .root.display())]
    NotADirectory {
        /// The root given.
        root: PathBuf,
        /// How to fix it.
        hint: Hint,
    },

    /// A snapshot is not one this crate reads: not a JSON object, no `format` field, or fields
    /// of the wrong shape.
    #[error("invalid snapshot {input}: {what}{hint}")]
    InvalidSnapshot {
        /// The input's name (a file name).
        input: String,
        /// What is wrong with it.
        what: String,
        /// How to fix it.
        hint: Hint,
    },

    /// A snapshot of another format version than this crate's
    /// ([`crate::topology::SNAPSHOT_FORMAT`]).
    #[error("invalid snapshot {input}: format {found}, this gdr reads format {supported}{hint}")]
    SnapshotFormat {
        /// The input's name (a file name).
        input: String,
        /// The snapshot's `format`.
        found: u32,
        /// The format this crate reads.
        supported: u32,
        /// How to fix it.
        hint: Hint,
    },

    /// An NCCL log holds no line NCCL printed.
    #[error("NCCL log {input}: {lines} line(s), none printed by NCCL (no `NCCL INFO`, `NCCL WARN` or `NCCL version` line){hint}")]
    NotAnNcclLog {
        /// The input's name (a file name, `stdin`).
        input: String,
        /// How many lines it has.
        lines: usize,
        /// How to fix it.
        hint: Hint,
    },
}

/// `Result` with gdr-doctor's [`enum@Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The fix hint, if the error has one.
    pub fn hint(&self) -> Option<&str> {
        match self {
            Error::NotADirectory { hint, .. }
            | Error::InvalidSnapshot { hint, .. }
            | Error::SnapshotFormat { hint, .. }
            | Error::NotAnNcclLog { hint, .. } => hint.text(),
            Error::Io { .. } => None,
        }
    }

    /// The snapshot `input` is not usable: `what`, with the hint to capture it again.
    pub(crate) fn invalid_snapshot(input: &str, what: impl Into<String>) -> Self {
        Error::InvalidSnapshot {
            input: input.to_string(),
            what: what.into(),
            hint: Hint::new(HINT_SNAPSHOT),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_show_their_values_and_hint() {
        let e = Error::invalid_snapshot("bad.json", "no `format` field");
        assert_eq!(
            e.to_string(),
            "invalid snapshot bad.json: no `format` field; hint: give a file written by `gdr doctor dump`"
        );
        assert_eq!(e.hint(), Some(HINT_SNAPSHOT));
        let e = Error::Io {
            what: "reading x".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "gone"),
        };
        assert_eq!(e.to_string(), "reading x: gone");
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(e.hint(), None);
    }
}
