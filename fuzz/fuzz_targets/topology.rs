//! The topology collector's sysfs/procfs parsers (gdr_doctor::topology::collect_with), fed as
//! file contents through the configurable root, then the doctor on what they read.
//!
//! A copy of the fixture tree `gdr-doctor/tests/fixtures/doctor/trees/nonroot-roce` (plus a few
//! files it lacks) is made once per process in the temp directory. An input is records separated by
//! [`SEPARATOR`]; a record is a path relative to the root, a newline, and the bytes that file
//! holds for this run (a path that names no file of the tree picks one by hash). After each run
//! the touched files get their fixture contents back, so every run sees the same tree. The PCIe
//! config-space parsers also get each record's bytes directly.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gdr_doctor::topology::{collect_with, pcie, CollectOptions, Snapshot};
use libfuzzer_sys::fuzz_target;

/// Between two records of an input.
const SEPARATOR: &[u8] = b"\n@@@\n";

/// Files the fixture lacks that the collector reads: (path, contents).
const EXTRA: &[(&str, &str)] = &[
    ("sys/kernel/mm/memory_peers/nv_mem/version", "1.3\n"),
    ("sys/kernel/iommu_groups/0/type", "DMA\n"),
    ("sys/class/iommu/dmar0/.keep", ""),
];

struct Tree {
    root: PathBuf,
    /// Regular files below the root: relative path and fixture contents, sorted by path.
    files: Vec<(String, Vec<u8>)>,
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the tree's directory");
    let mut entries: Vec<_> = std::fs::read_dir(from)
        .expect("read the fixture tree")
        .map(|e| e.expect("fixture entry"))
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let kind = e.file_type().expect("fixture entry type");
        if kind.is_symlink() {
            let target = std::fs::read_link(&src).expect("fixture link");
            std::os::unix::fs::symlink(target, &dst).expect("copy a link");
        } else if kind.is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).expect("copy a file");
        }
    }
}

fn regular_files(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for e in std::fs::read_dir(dir).expect("read the tree") {
        let e = e.expect("tree entry");
        let kind = e.file_type().expect("entry type");
        if kind.is_dir() {
            regular_files(root, &e.path(), out);
        } else if kind.is_file() {
            let rel = e.path().strip_prefix(root).expect("below root").to_owned();
            let text = rel.to_str().expect("fixture paths are UTF-8").to_string();
            out.push((text, std::fs::read(e.path()).expect("read a file")));
        }
    }
}

fn tree() -> &'static Tree {
    static TREE: OnceLock<Tree> = OnceLock::new();
    TREE.get_or_init(|| {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../gdr-doctor/tests/fixtures/doctor/trees/nonroot-roce");
        let root = std::env::temp_dir().join(format!("gdr-fuzz-topology-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        copy_tree(&fixture, &root);
        for (path, text) in EXTRA {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("extra directory");
            std::fs::write(p, text).expect("extra file");
        }
        let mut files = Vec::new();
        regular_files(&root, &root, &mut files);
        files.sort();
        Tree { root, files }
    })
}

fn records(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(data);
    std::iter::from_fn(move || {
        let r = rest?;
        match r.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
            Some(i) => {
                rest = Some(&r[i + SEPARATOR.len()..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

/// The index of the file a record's path names (an unknown path picks one by hash).
fn pick(files: &[(String, Vec<u8>)], path: &[u8]) -> usize {
    files
        .binary_search_by(|(p, _)| p.as_bytes().cmp(path))
        .unwrap_or_else(|_| {
            let h = path.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            });
            (h % files.len() as u64) as usize
        })
}

fuzz_target!(|data: &[u8]| {
    let t = tree();
    let mut touched = Vec::new();
    for rec in records(data).take(16) {
        let (path, contents) = match rec.iter().position(|&b| b == b'\n') {
            Some(i) => (&rec[..i], &rec[i + 1..]),
            None => (&b""[..], rec),
        };
        // The PCIe config-space and sysfs value parsers, on the bytes themselves.
        let _ = pcie::acs(contents);
        let _ = pcie::relaxed_ordering(contents);
        for id in [0x01, 0x05, 0x10, 0x11] {
            let _ = pcie::find_capability(contents, id);
        }
        let text = String::from_utf8_lossy(contents);
        if let Some(gts) = pcie::link_speed_gts(&text) {
            let _ = pcie::generation(gts);
            let _ = pcie::link_gbps(gts, 16);
        }
        let _ = pcie::hex_to_bytes(&text);
        let i = pick(&t.files, path);
        std::fs::write(t.root.join(&t.files[i].0), contents).expect("write a tree file");
        touched.push(i);
    }
    let snap = collect_with(&t.root, CollectOptions::default()).expect("the root is a directory");
    let report = gdr_doctor::diagnose(&snap);
    let _ = report.to_json();
    let _ = report.to_table(false);
    // Whatever was collected dumps and reads back as itself.
    let again = Snapshot::from_json(&snap.to_json(), "own dump").expect("own dump reads back");
    assert_eq!(again, snap, "collected snapshot JSON round trip");
    for i in touched {
        let (path, original) = &t.files[i];
        std::fs::write(t.root.join(path), original).expect("restore a tree file");
    }
});
