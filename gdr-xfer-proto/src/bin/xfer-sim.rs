//! `xfer-sim`: runs the deterministic simulation of gdr-xfer's core over many seeds (`cargo
//! xtask sim`), or one seed with its trace.
//!
//! ```text
//! xfer-sim [--seeds N] [--start S] [--all]   run seeds S..S+N (default 0..10000); --all: do not
//!                                            stop after 5 violations, count them
//! xfer-sim --seed S                          replay one seed, printing its events on a violation
//! ```

use std::process::ExitCode;
use std::time::Instant;

use gdr_xfer_proto::sim::{run, run_traced, Report};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seeds = 10_000u64;
    let mut start = 0u64;
    let mut one = None;
    let mut all = false;
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--all" {
            all = true;
            i += 1;
            continue;
        }
        let value = args.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match (args[i].as_str(), value) {
            ("--seeds", Some(v)) => seeds = v,
            ("--start", Some(v)) => start = v,
            ("--seed", Some(v)) => one = Some(v),
            _ => {
                eprintln!("usage: xfer-sim [--seeds N] [--start S] [--all] | --seed S");
                return ExitCode::from(2);
            }
        }
        i += 2;
    }
    if let Some(seed) = one {
        return match run_traced(seed) {
            Ok(r) => {
                println!("seed {seed}: ok: {r:?}");
                ExitCode::SUCCESS
            }
            Err(v) => {
                println!("{v}");
                ExitCode::FAILURE
            }
        };
    }
    let t0 = Instant::now();
    let mut total = Report::default();
    let mut failures = 0u64;
    let mut ran = 0u64;
    for seed in start..start + seeds {
        ran += 1;
        match run(seed) {
            Ok(r) => total.add(&r),
            Err(v) => {
                failures += 1;
                if failures <= 5 {
                    println!("{v}");
                }
                if failures >= 5 && !all {
                    println!("stopping after 5 violations");
                    break;
                }
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{ran} seeds ({start}..{}) in {secs:.2} s ({:.0} seeds/s): {failures} violated; trace hash {:016x}",
        start + ran,
        ran as f64 / secs.max(1e-9),
        total.trace_hash
    );
    println!(
        "transfers: {} submitted ({} staged, {} messages), {} refused, {} done, failed {:?}; notifications {}; DMAs checked {}",
        total.submitted, total.staged, total.messages, total.refused, total.done, total.failed, total.notifications, total.dmas
    );
    println!(
        "liveness: {} transfers submitted after the faults healed, {} succeeded",
        total.liveness, total.liveness_done
    );
    println!(
        "endpoints: {} send completions routed, {} routed nowhere (queue pair destroyed or connection gone), {} connections let go once drained, {} reconnections; {} segment-table messages applied, {} transfers planned from a table a deregistration had not reached; {} calls with another agent's segment or a stale handle refused, nothing changed",
        total.routed, total.routed_nowhere, total.conns_gone, total.reconnections, total.table_messages, total.stale_plans, total.foreign_refused
    );
    println!(
        "faults: {} stalls, {} lane faults, {} link cuts, {} kills, {} deregistrations, {} copies failed; fences {}, renewals {}, rail pauses {}; events {}, virtual time {:.1} s",
        total.stalls,
        total.lane_faults,
        total.link_faults,
        total.kills,
        total.deregistrations,
        total.copy_failures,
        total.fences,
        total.renewals,
        total.rail_pauses,
        total.events,
        total.virtual_time.as_secs_f64()
    );
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
