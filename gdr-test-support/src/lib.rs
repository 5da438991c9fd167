//! What the workspace's test binaries share, so that each helper is written once: the device under
//! test, resource cycles with leak checks ([`cycles`]), gdr's verbs on it ([`verbs`]), gdr-xfer's agents on it ([`xfer`], feature `xfer`), the cluster tier's hosts and rails
//! ([`cluster`]), a
//! throwaway etcd server ([`etcd`]), the GPU tier's helpers ([`gpu`]) and the GPU of the recorded
//! GPU inputs ([`h200`]).
//!
//! A dev-dependency only (`publish = false`). gdr's own integration tests use it although it
//! depends on gdr: cargo builds one gdr for both, so the types the tests and these helpers name
//! are the same.
//!
//! # Conventions of the device tests
//!
//! A test that needs hardware is `#[ignore = "needs ..."]`, the message naming what it needs and
//! where it runs, e.g. `#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM:
//! cargo xtask test)"]`; `cargo xtask test` runs the ignored tests in the Soft-RoCE VM. The
//! harness describes the device under test in the environment:
//!
//! * `GDR_TEST_DEVICE`: the RDMA device ([`device`]; gdr-xfer's agents accept a comma-separated
//!   list, one rail per device);
//! * `GDR_TEST_ADDR`: its IP address ([`addr`]);
//! * `GDR_TEST_GID_INDEX`: the index of its RoCE v2 GID.
//!
//! A missing variable is a failure, not a skip: an ignored test that was asked to run must run.

use std::path::{Path, PathBuf};

pub mod cluster;
pub mod cycles;
pub mod etcd;
pub mod gpu;
pub mod h200;
pub mod verbs;
#[cfg(feature = "xfer")]
pub mod xfer;

/// The RDMA device the tests run on (`GDR_TEST_DEVICE`); a missing device is a failure.
pub fn device() -> String {
    std::env::var("GDR_TEST_DEVICE").expect("GDR_TEST_DEVICE is not set: this test needs an RDMA device (cargo xtask test runs it in the Soft-RoCE VM)")
}

/// The IP address of the device under test (`GDR_TEST_ADDR`).
pub fn addr() -> String {
    std::env::var("GDR_TEST_ADDR").expect("GDR_TEST_ADDR is not set: this test needs the IP address of an RDMA device (cargo xtask test sets it in the VM)")
}

/// The example `name` of the package under test, which `cargo test` builds next to the test
/// binaries (`target/<profile>/examples/<name>`); a missing one is a failure.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in target/<profile>/deps");
    let p = dir.join("examples").join(name);
    assert!(
        p.exists(),
        "{} is missing: build the examples (`cargo test` builds them, or `cargo build --example {name}`)",
        p.display()
    );
    p
}

/// A pattern that differs for every byte position and every seed.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(40503))
                .rotate_left(7) as u8
        })
        .collect()
}
