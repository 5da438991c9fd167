//! Reading the host facts the GPUDirect rules take ([`SystemFacts`]) from `/proc` and `/sys`
//! below a root directory (`/` for this machine, a copied or synthetic tree otherwise).
//!
//! [`FactReader`] is the one reader of those files: registration reads this machine's facts
//! with it ([`SystemFacts::probe`]), and a diagnostic tool that records a whole host (the
//! `gdr-doctor` crate's collector) reads every file through it too, so both see the same machine
//! the same way. A file that does not exist is not an error (the fact is unknown or
//! empty); a file that exists but cannot be read is kept in [`FactReader::unreadable`] with the
//! reason.
//!
//! ```
//! use gdr::gpu_mr::facts::FactReader;
//! let root = std::env::temp_dir().join(format!("gdr-facts-doc-{}", std::process::id()));
//! std::fs::create_dir_all(root.join("proc/sys/kernel")).unwrap();
//! std::fs::write(root.join("proc/modules"), "nvidia_peermem 16384 0 - Live 0x0\n").unwrap();
//! std::fs::write(root.join("proc/sys/kernel/osrelease"), "6.1.0-27-amd64\n").unwrap();
//! let mut reader = FactReader::new(&root);
//! let facts = reader.system_facts();
//! assert_eq!(facts.modules, ["nvidia_peermem"]);
//! assert_eq!(facts.kernel_release.as_deref(), Some("6.1.0-27-amd64"));
//! assert!(facts.peer_memory().present());
//! assert!(reader.unreadable().is_empty());
//! # std::fs::remove_dir_all(&root).unwrap();
//! ```

use std::fmt;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::rules::SystemFacts;

/// A file below the root that exists but could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableFile {
    /// The path as seen on the machine read (without the root prefix), e.g. `/proc/cmdline`.
    pub path: String,
    /// The reason, e.g. `Permission denied (os error 13)`.
    pub error: String,
}

/// Reads files of the machine whose `/proc` and `/sys` lie below a root, by their machine paths
/// (`/proc/modules` is `<root>/proc/modules`). Not-found is `None` (or empty); any other failure
/// is recorded in [`FactReader::unreadable`].
#[derive(Debug, Clone)]
pub struct FactReader {
    root: PathBuf,
    unreadable: Vec<UnreadableFile>,
}

impl FactReader {
    /// A reader of the machine below `root` (`/` for this one).
    pub fn new(root: &Path) -> Self {
        FactReader {
            root: root.to_path_buf(),
            unreadable: Vec::new(),
        }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path on this machine of a machine path (`/sys/x` -> `<root>/sys/x`).
    pub fn host_path(&self, machine_path: &str) -> PathBuf {
        self.root.join(machine_path.trim_start_matches('/'))
    }

    /// Record that `machine_path` exists but could not be read (or held an unexpected value).
    pub fn record(&mut self, machine_path: &str, error: impl fmt::Display) {
        self.unreadable.push(UnreadableFile {
            path: machine_path.to_string(),
            error: error.to_string(),
        });
    }

    /// The files that could not be read so far, in the order they were tried.
    pub fn unreadable(&self) -> &[UnreadableFile] {
        &self.unreadable
    }

    /// The recorded unreadable files, leaving none.
    pub fn take_unreadable(&mut self) -> Vec<UnreadableFile> {
        std::mem::take(&mut self.unreadable)
    }

    /// The bytes of a file; `None` when it does not exist or cannot be read (recorded).
    pub fn read_bytes(&mut self, machine_path: &str) -> Option<Vec<u8>> {
        match std::fs::read(self.host_path(machine_path)) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => {
                self.record(machine_path, e);
                None
            }
        }
    }

    /// A file as text (bytes that are not UTF-8 replaced), trailing white space removed.
    pub fn read_str(&mut self, machine_path: &str) -> Option<String> {
        let bytes = self.read_bytes(machine_path)?;
        Some(String::from_utf8_lossy(&bytes).trim_end().to_string())
    }

    /// The entry names of a directory, sorted; empty when it does not exist or cannot be read
    /// (recorded).
    pub fn list_dir(&mut self, machine_path: &str) -> Vec<String> {
        match std::fs::read_dir(self.host_path(machine_path)) {
            Ok(rd) => {
                let mut v: Vec<String> = rd
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                v.sort();
                v
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                self.record(machine_path, e);
                Vec::new()
            }
        }
    }

    /// Loaded kernel modules: the first word of each line of `/proc/modules`, else the entries
    /// of `/sys/module`; sorted, without repeats.
    pub fn modules(&mut self) -> Vec<String> {
        let mut mods: Vec<String> = match self.read_str("/proc/modules") {
            Some(text) => text
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect(),
            None => self.list_dir("/sys/module"),
        };
        mods.sort();
        mods.dedup();
        mods
    }

    /// The peer-memory clients registered with MLNX_OFED's peer-memory core: the entries of
    /// `/sys/kernel/mm/memory_peers`, sorted.
    pub fn memory_peers(&mut self) -> Vec<String> {
        self.list_dir("/sys/kernel/mm/memory_peers")
    }

    /// The first line of `/proc/driver/nvidia/version`, trimmed.
    pub fn nvidia_version(&mut self) -> Option<String> {
        self.read_str("/proc/driver/nvidia/version")
            .and_then(|t| t.lines().next().map(|l| l.trim().to_string()))
    }

    /// `/proc/sys/kernel/osrelease`, e.g. `6.1.0-27-amd64`.
    pub fn kernel_release(&mut self) -> Option<String> {
        self.read_str("/proc/sys/kernel/osrelease")
    }

    /// Everything the GPUDirect rules read about the host.
    pub fn system_facts(&mut self) -> SystemFacts {
        SystemFacts {
            modules: self.modules(),
            memory_peers: self.memory_peers(),
            nvidia_version: self.nvidia_version(),
            kernel_release: self.kernel_release(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_files_are_unknown_and_unreadable_ones_are_recorded() {
        let root = std::env::temp_dir().join(format!("gdr-facts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // /proc/modules absent: the entries of /sys/module count.
        std::fs::create_dir_all(root.join("sys/module/nvidia")).unwrap();
        std::fs::create_dir_all(root.join("sys/module/ib_core")).unwrap();
        // A directory where a file should be: reading it fails with EISDIR.
        std::fs::create_dir_all(root.join("proc/driver/nvidia/version")).unwrap();
        let mut r = FactReader::new(&root);
        let facts = r.system_facts();
        assert_eq!(facts.modules, ["ib_core", "nvidia"]);
        assert!(facts.memory_peers.is_empty());
        assert_eq!(facts.nvidia_version, None);
        assert_eq!(facts.kernel_release, None);
        assert_eq!(r.unreadable().len(), 1, "{:?}", r.unreadable());
        assert_eq!(r.unreadable()[0].path, "/proc/driver/nvidia/version");
        assert_eq!(r.take_unreadable().len(), 1);
        assert!(r.unreadable().is_empty());
        assert_eq!(r.host_path("/sys/x"), root.join("sys/x"));
        let _ = std::fs::remove_dir_all(&root);
    }
}
