//! `cargo xtask compare-rails`: gdr-xfer on one rail against gdr-xfer on two rails against
//! perftest's `ib_write_bw` on both rails at once (one client per rail, the sum), in one boot of
//! a 2-host x 2-rail cluster, several rounds in a rotating order, then the medians and the
//! paired ratios two rails / one rail and two rails / the perftest sum. The hosts' side is
//! `compare-rails.sh`. Ratios are reported, never asserted.

use std::collections::BTreeMap;

use crate::cluster::{self, ClusterOpts};
use crate::compare_xfer::{parse, XRun};
use crate::perftest::median;
use crate::vm::shell_quote;
use crate::{cargo, say, setup, Result};

/// Options of `cargo xtask compare-rails`.
#[derive(clap::Args, Debug, Clone)]
pub struct CompareRailsOpts {
    /// Rounds (each runs the three measurements once).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Block size (gdr-xfer) and message size (perftest), bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub size: u64,
    /// Blocks per gdr-xfer batch.
    #[arg(long, default_value_t = 16)]
    pub batch: u32,
    /// Queue pairs per rail, both tools.
    #[arg(long, default_value_t = 2)]
    pub qps: u32,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    pub seconds: u32,
    /// Kill the cluster after this many seconds.
    #[arg(long, default_value_t = 1500)]
    pub timeout: u64,
}

const SCRIPT: &str = "xtask/src/compare-rails.sh";

pub fn compare(opts: &CompareRailsOpts) -> Result<i32> {
    let meta = cargo::metadata()?;
    say!("building: cargo build --release --bin gdr");
    setup::run(cargo::cargo().args(["build", "--release", "--bin", "gdr"]))?;
    setup::ensure_packages()?;
    std::env::set_current_dir(&meta.root).map_err(|e| e.to_string())?;
    let gdr = meta.target_dir.join("release/gdr");
    let script = format!(
        "sh {} {} {} {} {} {} {}\n",
        shell_quote(&meta.root.join(SCRIPT).to_string_lossy()),
        shell_quote(&gdr.to_string_lossy()),
        opts.rounds,
        opts.size,
        opts.batch,
        opts.qps,
        opts.seconds
    );
    let copts = ClusterOpts {
        hosts: 2,
        rails: 2,
        timeout: opts.timeout,
        grace: 60,
        mem: 1024,
        memlock: "unlimited".into(),
    };
    let outcome = cluster::boot(&copts, &script)?;
    let client = outcome.outputs.get(1).cloned().unwrap_or_default();
    let runs = parse(&client);
    let (table, failures) = summarize(&runs, opts);
    // The doctor's rail table of host 2, as the script printed it.
    let rails: Vec<&str> = client
        .lines()
        .skip_while(|l| !l.starts_with("Rails"))
        .take_while(|l| !l.trim().is_empty())
        .collect();
    if !rails.is_empty() {
        println!("gdr doctor on host 2:\n{}\n", rails.join("\n"));
    }
    println!("{table}");
    for f in &failures {
        eprintln!("xtask: compare-rails: {f}");
    }
    if outcome.code != 0 {
        eprintln!(
            "xtask: compare-rails: the cluster run exited with {}",
            outcome.code
        );
    }
    Ok(i32::from(!failures.is_empty() || outcome.code != 0))
}

/// Per round: gdr-xfer on one rail, on two, and the sum of the two ib_write_bw clients (Gb/s).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Round {
    one: Option<f64>,
    two: Option<f64>,
    perf: [Option<f64>; 2],
    /// ib_write_bw on rail 0 alone (how far the bed itself scales).
    perf_one: Option<f64>,
}

/// The table and the failed runs.
fn summarize(runs: &[XRun], opts: &CompareRailsOpts) -> (String, Vec<String>) {
    let mut failures = Vec::new();
    let mut rounds: BTreeMap<u32, Round> = BTreeMap::new();
    for r in runs {
        let Some(v) = r.gbps.filter(|_| r.rc == (0, 0)) else {
            failures.push(format!(
                "{} round {}: rc {}{}",
                r.tool,
                r.round,
                r.rc.0,
                if r.gbps.is_none() {
                    ", no result line"
                } else {
                    ""
                }
            ));
            continue;
        };
        let e = rounds.entry(r.round).or_default();
        match r.tool.as_str() {
            "xfer1" => e.one = Some(v),
            "xfer2" => e.two = Some(v),
            "perf0" => e.perf[0] = Some(v),
            "perf1" => e.perf[1] = Some(v),
            "perfone" => e.perf_one = Some(v),
            other => failures.push(format!("unknown measurement {other}")),
        }
    }
    let sum = |r: &Round| Some(r.perf[0]? + r.perf[1]?);
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    let mut s = format!(
        "gdr-xfer batches of {} x {} B, {} QPs per rail, vs ib_write_bw -s {} -q {} on each rail at once, {} s each, {} rounds\n",
        opts.batch, opts.size, opts.qps, opts.size, opts.qps, opts.seconds, opts.rounds
    );
    s.push_str("round   1 rail Gb/s   2 rails Gb/s   perftest r0+r1 Gb/s   perftest r0   2/1     2/perftest   perftest 2/1\n");
    let (mut scale, mut vs, mut bed) = (Vec::new(), Vec::new(), Vec::new());
    for (n, r) in &rounds {
        let a = r.two.zip(r.one).map(|(t, o)| t / o);
        let b = r.two.zip(sum(r)).map(|(t, p)| t / p);
        let c = sum(r).zip(r.perf_one).map(|(t, o)| t / o);
        scale.extend(a);
        vs.extend(b);
        bed.extend(c);
        s.push_str(&format!(
            "{n:>5}   {:>11}   {:>12}   {:>8} + {:<8}    {:>11}   {:>5}   {:>10}   {:>12}\n",
            f(r.one),
            f(r.two),
            f(r.perf[0]),
            f(r.perf[1]),
            f(r.perf_one),
            f(a),
            f(b),
            f(c)
        ));
    }
    let col = |g: &dyn Fn(&Round) -> Option<f64>| {
        median(&rounds.values().filter_map(g).collect::<Vec<_>>())
    };
    s.push_str(&format!(
        "median  {:>11}   {:>12}   {:>19}    {:>11}   paired {}   paired {}   paired {}\n",
        f(col(&|r| r.one)),
        f(col(&|r| r.two)),
        f(col(&sum)),
        f(col(&|r| r.perf_one)),
        f(median(&scale)),
        f(median(&vs)),
        f(median(&bed))
    ));
    (s, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_each_round_and_sums_the_two_perftest_clients() {
        let out = "### xfer1 size=1048576 round=1\nblock_size,batch_size,batches,gb_s,gbit_s\n1048576,16,3,0.05,0.4,x\n### end rc=0 server_rc=0\n\
                   ### xfer2 size=1048576 round=1\n1048576,16,5,0.09,0.72,x\n### end rc=0 server_rc=0\n\
                   ### perf0 size=1048576 round=1\n #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n 1048576  100  0.00  47.68  0.0001\n### end rc=0 server_rc=0\n\
                   ### perf1 size=1048576 round=1\n #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n 1048576  100  0.00  47.68  0.0001\n### end rc=0 server_rc=0\n\
                   ### perfone size=1048576 round=1\n #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n 1048576  100  0.00  59.60  0.0001\n### end rc=0 server_rc=0\n### done\n";
        let runs = parse(out);
        assert_eq!(runs.len(), 5);
        let opts = CompareRailsOpts {
            rounds: 1,
            size: 1 << 20,
            batch: 16,
            qps: 2,
            seconds: 5,
            timeout: 1,
        };
        let (t, f) = summarize(&runs, &opts);
        assert!(f.is_empty(), "{f:?}");
        assert!(
            t.contains("paired 1.800   paired 0.900   paired 1.600"),
            "{t}"
        );
    }
}
