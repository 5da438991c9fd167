//! `cargo xtask mutants`: mutation testing of gdr-xfer's core (`gdr-xfer-proto`) with
//! cargo-mutants. Each mutant of the core's decision code (the scope, seed count and timeouts are
//! in `.cargo/mutants.toml`) is built and must fail the crate's unit tests or the deterministic
//! simulation; the ones that survive are listed in `mutants.out/missed.txt`.
//!
//! cargo-mutants is not installed by `cargo xtask setup`, and nothing in `cargo xtask test` (CI)
//! runs this: it runs only when asked (`cargo install cargo-mutants` first). One job by default:
//! a whole run is about an hour on two cores.

use std::path::Path;

use serde_json::Value;

use crate::setup::have;
use crate::{cargo, say, Result};

#[derive(clap::Args)]
pub struct MutantsOpts {
    /// Build and test this many mutants at once (each in its own copy of the tree).
    #[arg(long, short = 'j', default_value_t = 1)]
    jobs: u32,
    /// Only mutants whose name (as `--list` shows it: `file:line:column: mutation`) matches
    /// this regex, e.g. `src/rail\.rs` for one file. (cargo-mutants' own `--file` adds to the
    /// scope of `.cargo/mutants.toml`; it does not narrow it.)
    #[arg(long, short = 'F')]
    re: Option<String>,
    /// List the mutants, run nothing.
    #[arg(long)]
    list: bool,
    /// More arguments for cargo-mutants (after `--`), e.g. `--iterate`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    extra: Vec<String>,
}

pub fn mutants(opts: &MutantsOpts) -> Result<i32> {
    if !have("cargo-mutants") {
        return Err("cargo-mutants is not installed: cargo install cargo-mutants".into());
    }
    let mut cmd = cargo::cargo();
    cmd.args(["mutants", "-p", "gdr-xfer-proto", "--jobs"])
        .arg(opts.jobs.to_string());
    if let Some(re) = &opts.re {
        cmd.args(["--re", re]);
    }
    if opts.list {
        cmd.arg("--list");
    }
    cmd.args(&opts.extra);
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run cargo mutants: {e}"))?;
    if !opts.list {
        let out = cargo::workspace_root().join("mutants.out");
        if let Some(line) = score(&out.join("outcomes.json")) {
            say!("{line}");
        }
    }
    // cargo-mutants exits 2 when a mutant survived, 3 on a timeout, 4 when the baseline failed.
    Ok(status.code().unwrap_or(1))
}

/// The run's counts and its score, (caught + timeout) / (caught + timeout + missed), from
/// cargo-mutants' `outcomes.json`.
fn score(path: &Path) -> Option<String> {
    let v: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let (caught, missed, timeout, unviable) =
        (n("caught"), n("missed"), n("timeout"), n("unviable"));
    let viable = caught + missed + timeout;
    let pct = if viable == 0 {
        100.0
    } else {
        100.0 * (caught + timeout) as f64 / viable as f64
    };
    Some(format!(
        "{} mutants: {caught} caught, {timeout} timeouts, {missed} missed, {unviable} unviable; \
         score {pct:.1}% of {viable} viable (survivors: mutants.out/missed.txt)",
        n("total_mutants")
    ))
}
