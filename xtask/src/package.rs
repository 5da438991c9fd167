//! `cargo xtask package`: `cargo publish --dry-run` of the five library crates, each packaged
//! and built from its package against the packaged crates below it, as crates.io would build
//! it. Nothing is uploaded.

use std::time::Instant;

use crate::{cargo, say, Result};

/// The crates that would be published, in dependency order.
pub const CRATES: &[&str] = &["gdr-sys", "gdr", "gdr-doctor", "gdr-xfer-proto", "gdr-xfer"];

/// Packages and verifies [`CRATES`]; whether all of them passed.
pub fn check() -> Result<bool> {
    let start = Instant::now();
    let mut cmd = cargo::cargo();
    // --allow-dirty: the check is of what would be packaged, a working tree's edits included.
    cmd.args(["publish", "--dry-run", "--allow-dirty"]);
    for c in CRATES {
        cmd.args(["-p", c]);
    }
    say!(
        "package: cargo publish --dry-run --allow-dirty -p {}",
        CRATES.join(" -p ")
    );
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run cargo publish: {e}"))?;
    say!(
        "package: {} ({:.0} s)",
        if status.success() {
            "every crate packaged and built from its package"
        } else {
            "FAILED: cargo publish --dry-run"
        },
        start.elapsed().as_secs_f64()
    );
    Ok(status.success())
}

/// `cargo xtask package`.
pub fn package() -> Result<i32> {
    Ok(if check()? { 0 } else { 1 })
}
