//! `cargo xtask fuzz` and the fuzz smoke run of `cargo xtask test`: the cargo-fuzz targets in
//! `fuzz/` (every decoder of untrusted bytes), run one after another with libFuzzer, each line
//! reporting executions and crashes.
//!
//! The targets build with the nightly toolchain, cargo-fuzz (`cargo xtask setup` installs it) and
//! AddressSanitizer, with debug assertions and overflow checks on. Each target's corpus is
//! `fuzz/corpus/<target>/` (kept between runs, not committed), seeded from `fuzz/seeds/<target>/`
//! and from the test fixtures (`gdr-doctor/tests/fixtures/doctor/`,
//! `gdr-doctor/tests/fixtures/nccl-logs/`). A crash leaves its input in `fuzz/artifacts/<target>/`;
//! the libFuzzer log of each run is `fuzz/target/logs/<target>.log` (`<target>.smoke.log` for the
//! smoke run).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::setup::have;
use crate::{cargo, say, Result};

/// Every fuzz target (`fuzz/fuzz_targets/<name>.rs`).
pub const TARGETS: &[&str] = &[
    "wire",
    "cm_private",
    "doctor_snapshot",
    "topology",
    "selection",
    "nccl_log",
    "xfer_wire",
];

/// Seconds each target runs in the smoke run of `cargo xtask test`.
const SMOKE_SECONDS: u32 = 5;

#[derive(clap::Args)]
pub struct FuzzOpts {
    /// Minutes each target runs at most.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Executions each target runs at most (the run stops at whichever limit comes first).
    #[arg(long, default_value_t = 10_000_000)]
    runs: u64,
    /// Targets to run (default: all of them, one after another).
    targets: Vec<String>,
}

/// What one libFuzzer run did.
struct Outcome {
    executions: u64,
    seconds: f64,
    /// The first crash: libFuzzer's summary and the input it saved.
    crash: Option<String>,
}

impl Outcome {
    fn line(&self, target: &str) -> String {
        let rate = self.executions as f64 / self.seconds.max(0.001);
        match &self.crash {
            None => format!(
                "{target}: {} executions in {:.0} s ({rate:.0}/s), 0 crashes",
                self.executions, self.seconds
            ),
            Some(c) => format!(
                "{target}: {} executions in {:.0} s, 1 crash (the run stops at the first): {c}",
                self.executions, self.seconds
            ),
        }
    }
}

fn fuzz_dir() -> PathBuf {
    cargo::workspace_root().join("fuzz")
}

/// Why fuzzing cannot run here, if it cannot: nightly and cargo-fuzz are needed.
fn unavailable() -> Option<String> {
    if !have("rustup") {
        return Some("rustup is not installed (cargo-fuzz needs the nightly toolchain)".into());
    }
    let nightly = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !nightly {
        return Some(
            "no nightly toolchain (rustup toolchain install nightly, then cargo xtask setup)"
                .into(),
        );
    }
    if !have("cargo-fuzz") {
        return Some("cargo-fuzz is not installed (cargo xtask setup installs it)".into());
    }
    None
}

/// `rustup run nightly cargo fuzz ARGS` in `fuzz/`, without the stable toolchain's variables
/// that `cargo xtask` inherited.
fn cargo_fuzz() -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", "nightly", "cargo", "fuzz"])
        .current_dir(fuzz_dir())
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC");
    c
}

/// Builds every target (sanitizer, debug assertions), printing cargo's output only on failure.
fn build() -> Result<()> {
    let start = Instant::now();
    crate::setup::run_quiet(cargo_fuzz().args(["build", "--debug-assertions"]))?;
    say!(
        "fuzz: built {} targets in {:.0} s",
        TARGETS.len(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Writes `name` into `dir` unless a file of that name is there.
fn seed(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let p = dir.join(name);
    if !p.exists() {
        std::fs::write(&p, bytes).map_err(|e| format!("writing seed {}: {e}", p.display()))?;
    }
    Ok(())
}

/// Regular files below `dir` as (path relative to `root`, contents), sorted.
fn tree_files(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries {
        let e = e.map_err(|e| e.to_string())?;
        let kind = e.file_type().map_err(|e| e.to_string())?;
        if kind.is_dir() {
            tree_files(root, &e.path(), out)?;
        } else if kind.is_file() {
            let rel = e
                .path()
                .strip_prefix(root)
                .map_err(|e| e.to_string())?
                .to_owned();
            let bytes = std::fs::read(e.path()).map_err(|e| e.to_string())?;
            out.push((rel.to_string_lossy().into_owned(), bytes));
        }
    }
    Ok(())
}

/// The corpus directory of `target` (seeded) and the read-only seed directories beside it.
fn corpus(target: &str) -> Result<Vec<PathBuf>> {
    let fuzz = fuzz_dir();
    let fixtures = cargo::workspace_root().join("gdr-doctor/tests/fixtures/doctor");
    let main = fuzz.join("corpus").join(target);
    std::fs::create_dir_all(&main).map_err(|e| format!("{}: {e}", main.display()))?;
    let mut dirs = vec![main.clone()];
    let seeds = fuzz.join("seeds").join(target);
    if seeds.is_dir() {
        dirs.push(seeds);
    }
    match target {
        // The captured and hand-written snapshots `gdr doctor --snapshot` reads in the tests.
        "doctor_snapshot" => {
            dirs.push(fixtures.join("snapshots"));
            dirs.push(fixtures.join("captured"));
        }
        // The fixture tree's files in the target's input format ("path\ncontents" records):
        // one seed per file, and one with every file.
        "topology" => {
            let root = fixtures.join("trees/nonroot-roce");
            let mut files = Vec::new();
            tree_files(&root, &root, &mut files)?;
            files.sort();
            let mut all = Vec::new();
            for (i, (path, bytes)) in files.iter().enumerate() {
                let mut rec = format!("{path}\n").into_bytes();
                rec.extend_from_slice(bytes);
                seed(&main, &format!("fixture-{i:03}"), &rec)?;
                if !all.is_empty() {
                    all.extend_from_slice(b"\n@@@\n");
                }
                all.extend_from_slice(&rec);
            }
            seed(&main, "fixture-all", &all)?;
        }
        // The real NCCL logs of the nccl-log golden tests, one seed each.
        "nccl_log" => {
            let logs = cargo::workspace_root().join("gdr-doctor/tests/fixtures/nccl-logs");
            let entries =
                std::fs::read_dir(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(stem) = name.strip_suffix(".log") {
                    let bytes = std::fs::read(e.path()).map_err(|e| e.to_string())?;
                    seed(&main, &format!("fixture-{stem}"), &bytes)?;
                }
            }
        }
        _ => {}
    }
    Ok(dirs)
}

/// The number after `key` in libFuzzer's output (`stat::number_of_executed_units: 123`).
fn stat(log: &str, key: &str) -> Option<u64> {
    log.lines()
        .rev()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
}

/// libFuzzer's description of a crash and the input it saved, from its log.
fn crash_summary(log: &str) -> String {
    let what = log
        .lines()
        .find(|l| {
            l.contains("panicked at") || l.contains("==ERROR:") || l.contains("deadly signal")
        })
        .unwrap_or("the fuzz target exited with an error");
    let artifact = log
        .lines()
        .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
        .unwrap_or("(no input saved)");
    format!("{} -> {artifact}", what.trim())
}

/// Runs `target` with libFuzzer `flags`; the log goes to
/// `fuzz/target/logs/<target><suffix>.log`.
fn run_target(target: &str, suffix: &str, flags: &[String]) -> Result<Outcome> {
    let dirs = corpus(target)?;
    let logs = fuzz_dir().join("target/logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
    let log_path = logs.join(format!("{target}{suffix}.log"));
    let log =
        std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let start = Instant::now();
    let status = cargo_fuzz()
        .args(["run", "--debug-assertions", target])
        .args(&dirs)
        .arg("--")
        .args(["-print_final_stats=1", "-timeout=10"])
        .args(flags)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .status()
        .map_err(|e| format!("cannot run cargo fuzz: {e}"))?;
    let seconds = start.elapsed().as_secs_f64();
    if target == "topology" {
        remove_topology_trees();
    }
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let executions = stat(&text, "stat::number_of_executed_units:").unwrap_or(0);
    let crash = (!status.success()).then(|| crash_summary(&text));
    Ok(Outcome {
        executions,
        seconds,
        crash,
    })
}

/// The topology target copies its fixture tree into the temp directory once per process
/// (`gdr-fuzz-topology-<pid>`): removes those whose process has ended.
fn remove_topology_trees() {
    let tmp = std::env::temp_dir();
    if let Ok(entries) = std::fs::read_dir(&tmp) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix("gdr-fuzz-topology-") else {
                continue;
            };
            if !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// The smoke run of `cargo xtask test`: every target for a few seconds. `Err(why)` when
/// fuzzing cannot run here (printed, with how to get it); else (targets without a crash,
/// targets with one).
pub fn smoke() -> Result<std::result::Result<(u64, u64), String>> {
    if let Some(why) = unavailable() {
        say!("fuzz smoke: SKIPPED: {why}");
        return Ok(Err(why));
    }
    say!(
        "fuzz smoke: {} targets, {SMOKE_SECONDS} s each (cargo fuzz, nightly, AddressSanitizer)",
        TARGETS.len()
    );
    let start = Instant::now();
    if let Err(e) = build() {
        say!("fuzz smoke: the build failed: {e}");
        return Ok(Ok((0, 1)));
    }
    let (mut passed, mut failed) = (0, 0);
    for t in TARGETS {
        let o = run_target(t, ".smoke", &[format!("-max_total_time={SMOKE_SECONDS}")])?;
        say!("fuzz smoke: {}", o.line(t));
        if o.crash.is_some() || o.executions == 0 {
            failed += 1;
        } else {
            passed += 1;
        }
    }
    say!(
        "fuzz smoke: {passed} targets clean, {failed} crashed, {:.0} s with the build",
        start.elapsed().as_secs_f64()
    );
    Ok(Ok((passed, failed)))
}

/// `cargo xtask fuzz [--minutes N] [--runs R] [TARGET...]`: each target until `R` executions or
/// `N` minutes, one after another; exits 1 when any target crashed.
pub fn fuzz(opts: &FuzzOpts) -> Result<i32> {
    if let Some(why) = unavailable() {
        return Err(format!("cannot fuzz: {why}"));
    }
    let targets: Vec<&str> = if opts.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        opts.targets.iter().map(String::as_str).collect()
    };
    if let Some(bad) = targets.iter().find(|t| !TARGETS.contains(t)) {
        return Err(format!(
            "unknown fuzz target {bad:?}; the targets are {}",
            TARGETS.join(", ")
        ));
    }
    if !opts.minutes.is_finite() || opts.minutes <= 0.0 {
        return Err(format!("--minutes {} must be positive", opts.minutes));
    }
    build()?;
    let seconds = (opts.minutes * 60.0).ceil() as u64;
    let flags = [
        format!("-max_total_time={seconds}"),
        format!("-runs={}", opts.runs),
    ];
    let mut lines = Vec::new();
    let mut crashed = 0;
    for t in &targets {
        say!(
            "fuzz: {t}: up to {} executions or {} min (log: fuzz/target/logs/{t}.log)",
            opts.runs,
            opts.minutes
        );
        let o = run_target(t, "", &flags)?;
        let line = o.line(t);
        say!("fuzz: {line}");
        crashed += usize::from(o.crash.is_some());
        lines.push(line);
    }
    say!(
        "fuzz: summary ({} targets, {crashed} crashed)",
        targets.len()
    );
    for l in &lines {
        say!("fuzz:   {l}");
    }
    Ok(if crashed == 0 { 0 } else { 1 })
}

/// Installs cargo-fuzz from crates.io when it is missing (`cargo xtask setup`). A failure is
/// printed, not fatal: without cargo-fuzz the fuzz smoke run says why it skips.
pub fn ensure_cargo_fuzz() {
    if have("cargo-fuzz") {
        return;
    }
    say!("installing cargo-fuzz (cargo install cargo-fuzz --locked)");
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["install", "cargo-fuzz", "--locked"]);
    if let Err(e) = crate::setup::run(&mut cmd) {
        say!("cargo-fuzz was not installed ({e}): the fuzz smoke run will be skipped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_stats_and_crashes() {
        let log = "INFO: Seed: 1\n#2\tINITED\nDone 607688 runs in 6 second(s)\n\
                   stat::number_of_executed_units: 607688\nstat::peak_rss_mb: 40\n";
        assert_eq!(stat(log, "stat::number_of_executed_units:"), Some(607688));
        assert_eq!(stat(log, "stat::missing:"), None);
        let crash = "thread '<unnamed>' panicked at fuzz_targets/wire.rs:3:5:\n\
                     ==1== ERROR: libFuzzer: deadly signal\n\
                     artifact_prefix='a/'; Test unit written to a/crash-00ff\n";
        let s = crash_summary(crash);
        assert!(
            s.starts_with("thread '<unnamed>' panicked at fuzz_targets/wire.rs"),
            "{s}"
        );
        assert!(s.ends_with("-> a/crash-00ff"), "{s}");
    }

    #[test]
    fn every_target_has_a_source_file() {
        for t in TARGETS {
            let p = fuzz_dir().join("fuzz_targets").join(format!("{t}.rs"));
            assert!(p.is_file(), "{} is missing", p.display());
        }
    }
}
