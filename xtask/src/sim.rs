//! `cargo xtask sim`: the deterministic simulation of gdr-xfer's core (`gdr-xfer-proto`, its
//! `xfer-sim` binary, built with optimizations) over many seeds, one seed replayed with its
//! trace, or a mutation run: the core built with a known bug put back (`--mutant NAME`, the
//! `gdr_mutant` cfg), to show the simulation catches it.

use crate::{cargo, say, Result};

/// The mutants the core knows (`cfg(gdr_mutant = "...")` in gdr-xfer-proto).
pub const MUTANTS: &[(&str, &str)] = &[
    (
        "outcome_before_quiet",
        "a stopped transfer reports at once, with its requests still in flight (the review's finding 1)",
    ),
    (
        "notify_before_data",
        "a notification is sent once the data is posted, not completed",
    ),
    (
        "mask_over_pin",
        "a small transfer pinned to a rail is held to its preferred rails (found by the simulation)",
    ),
    (
        "no_peer_wait",
        "a WRITE whose queue pairs were destroyed reports without waiting for the peer",
    ),
    (
        "staged_outcome_before_quiet",
        "a failed staged transfer reports at once, its copies and children still running",
    ),
    (
        "queued_waits_for_completions",
        "a transfer queued without posting (an event loop's) waits for a completion instead of the next timer",
    ),
];

/// The core's package with its simulation, as cargo's arguments.
pub const CORE_WITH_SIM: [&str; 4] = ["-p", "gdr-xfer-proto", "--features", "sim"];

#[derive(clap::Args)]
pub struct SimOpts {
    /// How many seeds.
    #[arg(long, default_value_t = 10_000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Replay one seed, printing its events when it violates a promise.
    #[arg(long, conflicts_with_all = ["seeds", "start"])]
    seed: Option<u64>,
    /// Build the core with this known bug put back (see --list-mutants) and count the seeds
    /// that catch it.
    #[arg(long)]
    mutant: Option<String>,
    /// List the mutants.
    #[arg(long)]
    list_mutants: bool,
}

pub fn sim(opts: &SimOpts) -> Result<i32> {
    if opts.list_mutants {
        for (name, what) in MUTANTS {
            println!("{name:24} {what}");
        }
        return Ok(0);
    }
    let mut cmd = cargo::cargo();
    cmd.args(["run", "--release", "-q"])
        .args(CORE_WITH_SIM)
        .args(["--bin", "xfer-sim"]);
    if let Some(m) = &opts.mutant {
        if !MUTANTS.iter().any(|(n, _)| n == m) {
            return Err(format!("no mutant {m:?}: cargo xtask sim --list-mutants"));
        }
        // A build of its own, so the normal one is not rebuilt afterwards.
        let dir = cargo::metadata()?.target_dir.join("mutants").join(m);
        cmd.env("CARGO_TARGET_DIR", dir);
        cmd.env("RUSTFLAGS", format!("--cfg gdr_mutant=\"{m}\""));
        say!("mutation run: {m}: the simulation must catch it");
    }
    cmd.arg("--");
    match opts.seed {
        Some(s) => {
            cmd.args(["--seed", &s.to_string()]);
        }
        None => {
            cmd.args([
                "--seeds",
                &opts.seeds.to_string(),
                "--start",
                &opts.start.to_string(),
            ]);
            if opts.mutant.is_some() {
                cmd.arg("--all");
            }
        }
    }
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    let code = status.code().unwrap_or(1);
    if opts.mutant.is_some() {
        // A mutant the simulation does not catch is the failure.
        return Ok(if code == 0 {
            say!("the mutant survived: no seed caught it");
            1
        } else {
            say!("the mutant was caught");
            0
        });
    }
    Ok(code)
}
