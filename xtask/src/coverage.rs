//! `cargo xtask coverage`: line coverage of gdr-xfer's core (`gdr-xfer-proto`, without the
//! simulator itself: `src/sim/` and `src/bin/`) under the deterministic simulation alone, then
//! under the simulation and the crate's unit tests together, with cargo-llvm-cov.
//!
//! Like `mutants`, it is not part of `cargo xtask test` (CI) and needs tools installed by hand:
//! `cargo install cargo-llvm-cov` and `rustup component add llvm-tools`. The instrumented build
//! lives in `target/llvm-cov-target`, so the normal build is not rebuilt afterwards.

use crate::setup::have;
use crate::sim::CORE_WITH_SIM;
use crate::{cargo, say, Result};

/// The simulator's own files and the test files: what the coverage is *of* is the core the
/// driver ships. (Test modules inside a file of the core, `#[cfg(test)] mod tests { .. }`, are
/// counted in the second report: they run, so they raise its figure a little.)
const IGNORE: &str = "gdr-xfer-proto/src/((sim|bin)/|.*(tests|scripted)\\.rs$)";

#[derive(clap::Args)]
pub struct CoverageOpts {
    /// Seeds the simulation runs.
    #[arg(long, default_value_t = 10_000)]
    seeds: u64,
    /// Per-file table as well as the totals.
    #[arg(long)]
    files: bool,
}

pub fn coverage(opts: &CoverageOpts) -> Result<i32> {
    if !have("cargo-llvm-cov") {
        return Err(
            "cargo-llvm-cov is not installed: cargo install cargo-llvm-cov; \
             rustup component add llvm-tools"
                .into(),
        );
    }
    let llvm_cov = |args: &[&str]| -> Result<i32> {
        let mut cmd = cargo::cargo();
        cmd.arg("llvm-cov").args(args);
        let status = cmd
            .status()
            .map_err(|e| format!("cannot run cargo llvm-cov: {e}"))?;
        Ok(status.code().unwrap_or(1))
    };
    let report = |what: &str| -> Result<i32> {
        say!("coverage of gdr-xfer-proto (without src/sim, src/bin and test files) under {what}:");
        let mut args = vec![
            "report",
            "--release",
            "-p",
            "gdr-xfer-proto",
            "--ignore-filename-regex",
            IGNORE,
        ];
        if !opts.files {
            args.push("--summary-only");
        }
        llvm_cov(&args)
    };
    let seeds = opts.seeds.to_string();
    let core = |cmd: &str, tail: &[&str]| {
        let mut args = vec![cmd, "--no-report", "--release"];
        args.extend(CORE_WITH_SIM);
        args.extend(tail);
        llvm_cov(&args)
    };
    let steps: [&dyn Fn() -> Result<i32>; 5] = [
        &|| llvm_cov(&["clean", "--workspace"]),
        &|| core("run", &["--bin", "xfer-sim", "--", "--seeds", &seeds]),
        &|| report(&format!("the simulation, {seeds} seeds")),
        &|| core("test", &["--lib"]),
        &|| {
            report(&format!(
                "the simulation ({seeds} seeds) and the unit tests together"
            ))
        },
    ];
    for step in steps {
        let code = step()?;
        if code != 0 {
            return Ok(code);
        }
    }
    Ok(0)
}
