//! `cargo xtask compare-perftest`: `gdr bw`/`gdr lat` against perftest's `ib_write_bw`/
//! `ib_write_lat`, alternately, several rounds, in one VM boot (or on this host's own RDMA
//! device with `--local`), then per size the medians and the ratio gdr/perftest.
//!
//! The guest side is `compare-perftest.sh` (plain sh, takes the device as a parameter), so the
//! same comparison runs on real hardware. Ratios are reported, never asserted.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::vm::{self, shell_quote, VmOpts};
use crate::{cargo, say, setup, Result};

/// Options of `cargo xtask compare-perftest`.
#[derive(clap::Args, Debug, Clone)]
pub struct CompareOpts {
    #[command(flatten)]
    pub vm: VmOpts,
    /// Rounds (each runs every measurement of both tools once, alternating).
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// Write-bandwidth message sizes, comma-separated.
    #[arg(long, default_value = "4096,65536,1048576")]
    pub sizes: String,
    /// Round trips of the 2-byte latency runs.
    #[arg(long, default_value_t = 5000)]
    pub lat_iters: u32,
    /// Messages of the 2-byte message-rate runs.
    #[arg(long, default_value_t = 20000)]
    pub rate_iters: u32,
    /// Requests per doorbell for both tools' bandwidth and rate runs (`-l N` to each), for a
    /// like-for-like posting comparison; default: each tool's own default (gdr automatic, perftest 1).
    #[arg(long, value_name = "N")]
    pub post_list: Option<u32>,
    #[command(flatten)]
    pub host: LocalDevice,
}

/// Where a comparison runs instead of the VM: this host's own RDMA device (real hardware).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LocalDevice {
    /// Run on this host's RDMA device instead of booting the Soft-RoCE VM (real hardware).
    #[arg(long, requires_all = ["device", "addr"])]
    pub local: bool,
    /// RDMA device for --local (e.g. mlx5_0).
    #[arg(long)]
    pub device: Option<String>,
    /// GID index for --local.
    #[arg(long, default_value_t = 3)]
    pub gid_index: u32,
    /// This host's address on the device, for --local.
    #[arg(long)]
    pub addr: Option<String>,
}

/// Where the guest-side script lives, relative to the workspace root.
const SCRIPT: &str = "xtask/src/compare-perftest.sh";

pub fn compare(opts: &CompareOpts) -> Result<i32> {
    for s in opts.sizes.split(',') {
        s.trim()
            .parse::<u64>()
            .map_err(|_| format!("--sizes: {s:?} is not a number of bytes"))?;
    }
    let meta = cargo::metadata()?;
    say!("building: cargo build --release --bin gdr");
    setup::run(cargo::cargo().args(["build", "--release", "--bin", "gdr"]))?;
    std::env::set_current_dir(&meta.root).map_err(|e| e.to_string())?;
    let gdr = meta.target_dir.join("release/gdr");
    let post_list = opts.post_list.map_or("-".into(), |n| n.to_string());
    let tail = format!(
        "{} {} {} {} {} {post_list}",
        shell_quote(&gdr.to_string_lossy()),
        opts.rounds,
        shell_quote(&opts.sizes),
        opts.lat_iters,
        opts.rate_iters
    );
    let output = if opts.host.local {
        let dev = opts.host.device.as_deref().unwrap_or_default();
        let addr = opts.host.addr.as_deref().unwrap_or_default();
        let out = Command::new("sh")
            .arg(Path::new(SCRIPT))
            .args([dev, &opts.host.gid_index.to_string(), addr])
            .args([
                gdr.to_string_lossy().as_ref(),
                &opts.rounds.to_string(),
                &opts.sizes,
                &opts.lat_iters.to_string(),
                &opts.rate_iters.to_string(),
                &post_list,
            ])
            .output()
            .map_err(|e| format!("running {SCRIPT}: {e}"))?;
        String::from_utf8_lossy(&out.stdout).into_owned()
    } else {
        setup::ensure_packages()?;
        let script = format!("sh {SCRIPT} \"$GDR_TEST_DEVICE\" \"$GDR_TEST_GID_INDEX\" - {tail}\n");
        let outcome = vm::boot(&opts.vm, &script)?;
        if outcome.code != 0 {
            return Err(format!(
                "the comparison script exited with {} in the VM",
                outcome.code
            ));
        }
        outcome.output
    };
    let runs = parse(&output);
    let (table, failures) = summarize(&runs);
    println!("{table}");
    if failures.is_empty() {
        Ok(0)
    } else {
        for f in &failures {
            eprintln!("xtask: compare-perftest: {f}");
        }
        Ok(1)
    }
}

/// One measured run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// `gdr` or `perftest`.
    pub tool: String,
    /// `bw`, `rate` or `lat`.
    pub kind: String,
    /// Message size.
    pub size: u64,
    /// Round number.
    pub round: u32,
    /// The figure: average MiB/s (bw; both tools print two decimals, four or more significant
    /// digits, where Gb/s would give two), Mpps (rate), typical usec (lat); `None` if not found.
    pub value: Option<f64>,
    /// Client and server exit codes.
    pub rc: (i32, i32),
}

/// Parses the script's output: blocks `### TOOL KIND size=S round=R` .. `### end rc=A server_rc=B`.
pub fn parse(text: &str) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    let mut cur: Option<Run> = None;
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(rest) = line.strip_prefix("### ") {
            if let Some(rcs) = rest.strip_prefix("end ") {
                if let Some(mut run) = cur.take() {
                    let mut rc = (-1, -1);
                    for kv in rcs.split_whitespace() {
                        match kv.split_once('=') {
                            Some(("rc", v)) => rc.0 = v.parse().unwrap_or(-1),
                            Some(("server_rc", v)) => rc.1 = v.parse().unwrap_or(-1),
                            _ => {}
                        }
                    }
                    run.rc = rc;
                    let dup = runs.iter().any(|r| {
                        (&r.tool, &r.kind, r.size, r.round)
                            == (&run.tool, &run.kind, run.size, run.round)
                    });
                    if !dup {
                        runs.push(run);
                    }
                }
                continue;
            }
            let words: Vec<&str> = rest.split_whitespace().collect();
            if let [tool, kind, size, round] = words[..] {
                let size = size.strip_prefix("size=").and_then(|v| v.parse().ok());
                let round = round.strip_prefix("round=").and_then(|v| v.parse().ok());
                if let (Some(size), Some(round)) = (size, round) {
                    cur = Some(Run {
                        tool: tool.into(),
                        kind: kind.into(),
                        size,
                        round,
                        value: None,
                        rc: (-1, -1),
                    });
                }
            }
            continue;
        }
        if let Some(run) = cur.as_mut() {
            if run.value.is_some() {
                continue;
            }
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.first() != Some(&run.size.to_string().as_str()) {
                continue;
            }
            let nums: Vec<f64> = cols.iter().filter_map(|c| c.parse().ok()).collect();
            if nums.len() != cols.len() {
                continue;
            }
            // bw table: bytes iters peak avg rate; lat table: bytes iters min max typical ...
            let idx = if run.kind == "bw" { 3 } else { 4 };
            run.value = nums.get(idx).copied();
        }
    }
    runs
}

/// The median of the values (mean of the middle two for an even count).
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// (display order, kind, size).
type GroupKey = (u8, String, u64);

/// One round's values of one metric: (gdr, perftest).
type Pair = (Option<f64>, Option<f64>);

/// One metric's values per round.
type Rounds = BTreeMap<u32, Pair>;

/// The comparison table, then every round's values, and the list of failed or unparsable runs.
/// Per metric: each tool's median over the rounds and their ratio; the median of the per-round
/// ratios (`paired`: the two runs of a round are back to back, so a slow spell of the host
/// affects both); the ratio of each tool's best round (`best`: the run least disturbed by the
/// host; on an emulated host a whole run can be 1.5-2x slower); and in how many rounds gdr did
/// better than perftest (`ahead`).
pub fn summarize(runs: &[Run]) -> (String, Vec<String>) {
    let mut failures = Vec::new();
    let mut groups: BTreeMap<GroupKey, Rounds> = BTreeMap::new();
    for r in runs {
        let Some(v) = r.value.filter(|_| r.rc == (0, 0)) else {
            failures.push(format!(
                "{} {} size={} round={}: client rc {}, server rc {}{}",
                r.tool,
                r.kind,
                r.size,
                r.round,
                r.rc.0,
                r.rc.1,
                if r.value.is_none() {
                    ", no result line"
                } else {
                    ""
                }
            ));
            continue;
        };
        let order = match r.kind.as_str() {
            "bw" => 0,
            "rate" => 1,
            _ => 2,
        };
        let e = groups
            .entry((order, r.kind.clone(), r.size))
            .or_default()
            .entry(r.round)
            .or_default();
        if r.tool == "gdr" {
            e.0 = Some(v);
        } else {
            e.1 = Some(v);
        }
    }
    let mut s = String::new();
    s.push_str(&format!(
        "{:<26} {:>8} {:>6} {:>12} {:>15} {:>12} {:>7} {:>7} {:>6} {:>7}\n",
        "metric",
        "bytes",
        "rounds",
        "gdr median",
        "perftest median",
        "gdr/perftest",
        "paired",
        "best",
        "ahead",
        "target"
    ));
    let mut detail = String::new();
    for ((_, kind, size), rounds) in &groups {
        let (metric, target, higher_is_better) = match kind.as_str() {
            "bw" => ("write BW average [Gb/s]", ">= 1.0", true),
            "rate" => ("write msg rate [Mpps]", ">= 1.0", true),
            _ => ("write latency typ [usec]", "<= 1.0", false),
        };
        let g: Vec<f64> = rounds.values().filter_map(|r| r.0).collect();
        let p: Vec<f64> = rounds.values().filter_map(|r| r.1).collect();
        let (mut gm, mut pm) = (median(&g), median(&p));
        if kind == "bw" {
            // MiB/s -> Gb/s (10^9 bits).
            let gbps = |v: f64| v * 1048576.0 * 8.0 / 1e9;
            (gm, pm) = (gm.map(gbps), pm.map(gbps));
        }
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        // Rounds where both tools ran: gdr ahead when it did better in that same round.
        let paired: Vec<(f64, f64)> = rounds.values().filter_map(|r| Some((r.0?, r.1?))).collect();
        let ahead = paired
            .iter()
            .filter(|(g, p)| if higher_is_better { g > p } else { g < p })
            .count();
        let ratios: Vec<f64> = paired
            .iter()
            .filter(|(_, p)| *p > 0.0)
            .map(|(g, p)| g / p)
            .collect();
        let best = |v: &[f64]| {
            v.iter()
                .copied()
                .reduce(|a, b| if higher_is_better { a.max(b) } else { a.min(b) })
        };
        let r3 = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}"));
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.6}"));
        s.push_str(&format!(
            "{:<26} {:>8} {:>6} {:>12} {:>15} {:>12} {:>7} {:>7} {:>6} {:>7}\n",
            metric,
            size,
            g.len().min(p.len()),
            f(gm),
            f(pm),
            r3(ratio(gm, pm)),
            r3(median(&ratios)),
            r3(ratio(best(&g), best(&p))),
            format!("{ahead}/{}", paired.len()),
            target
        ));
        let unit = match kind.as_str() {
            "bw" => "MiB/s",
            "rate" => "Mpps",
            _ => "usec",
        };
        let list = |pick: fn(&Pair) -> Option<f64>| {
            rounds
                .values()
                .map(|r| pick(r).map_or("-".into(), |v| format!("{v}")))
                .collect::<Vec<_>>()
                .join(" ")
        };
        detail.push_str(&format!(
            "{kind} {size} B [{unit}] per round\n  gdr      {}\n  perftest {}\n",
            list(|r| r.0),
            list(|r| r.1)
        ));
    }
    s.push('\n');
    s.push_str(&detail);
    (s, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
### gdr bw size=4096 round=1
 #bytes     #iterations  BW peak[MiB/sec]   BW average[MiB/sec]  MsgRate[Mpps]
 4096       1000         31.00                28.27                  0.007236
### end rc=0 server_rc=0
### perftest bw size=4096 round=1
 local address: LID 0000 QPN 0x001f
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 4096       1000             34.57              29.70   \t\t   0.007604
### end rc=0 server_rc=0
### gdr bw size=4096 round=2
 4096       1000         31.00                26.56                  0.006800
### end rc=0 server_rc=0
### perftest bw size=4096 round=2
 4096       1000             34.57              27.34   \t\t   0.007000
### end rc=0 server_rc=0
### gdr lat size=2 round=1
 2          1000         13.71        1956.81      20.89            26.00        71.85          131.67                 1956.81
### end rc=0 server_rc=0
### perftest lat size=2 round=1
 2       1000          12.90          491.69       21.08    \t       22.62       \t19.23  \t\t130.51  \t\t491.69
### end rc=0 server_rc=0
### gdr rate size=2 round=1
gdr bw: something failed
### end rc=1 server_rc=0
### done
";

    #[test]
    fn parses_both_tools_tables() {
        let runs = parse(SAMPLE);
        assert_eq!(runs.len(), 7);
        assert_eq!(runs[0].value, Some(28.27));
        assert_eq!(runs[1].value, Some(29.70));
        assert_eq!(runs[4].value, Some(20.89));
        assert_eq!(runs[5].value, Some(21.08));
        assert_eq!(runs[6].rc, (1, 0));
        assert_eq!(runs[6].value, None);
    }

    #[test]
    fn summary_has_medians_ratios_and_failures() {
        let (table, failures) = summarize(&parse(SAMPLE));
        let bw = table.lines().find(|l| l.starts_with("write BW")).unwrap();
        let cols: Vec<&str> = bw.split_whitespace().collect();
        // medians: gdr 27.415 MiB/s, perftest 28.52 MiB/s; as Gb/s (x 2^20 x 8 / 10^9):
        // 0.229974 and 0.239243; ratio 0.961.
        assert!(
            cols.contains(&"0.229974") && cols.contains(&"0.239243"),
            "{bw}"
        );
        assert!(cols.contains(&"0.961"), "{bw}");
        let lat = table
            .lines()
            .find(|l| l.starts_with("write latency"))
            .unwrap();
        assert!(lat.contains("0.991"), "{lat}");
        // round 1: gdr 28.27 < 29.70 MiB/s, round 2: 26.56 < 27.34: perftest ahead in both;
        // latency 20.89 < 21.08 us: gdr ahead in its only round.
        // paired: bw round ratios 0.952 and 0.971, median 0.962; best rounds 28.27 / 29.70 =
        // 0.952; latency 20.89 / 21.08 = 0.991 for both.
        assert!(bw.contains(" 0.962   0.952    0/2  >= 1.0"), "{bw}");
        assert!(lat.contains(" 0.991   0.991    1/1  <= 1.0"), "{lat}");
        assert!(
            table.contains(
                "bw 4096 B [MiB/s] per round\n  gdr      28.27 26.56\n  perftest 29.7 27.34\n"
            ),
            "{table}"
        );
        assert_eq!(failures.len(), 1);
        assert!(failures[0].contains("gdr rate size=2 round=1"));
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
