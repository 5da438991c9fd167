//! `cargo xtask compare-xfer`: gdr-xfer's batched block writes or reads (`gdr xfer-bench`)
//! against perftest's `ib_write_bw` or `ib_read_bw` with the same message size and QP count, alternately, several
//! rounds, in one VM boot (or on this host's RDMA device with `--local`), then the medians and
//! the paired ratio xfer/perftest. The guest side is `compare-xfer.sh`. Ratios are reported,
//! never asserted.

use std::path::Path;
use std::process::Command;

use crate::perftest::{median, LocalDevice};
use crate::vm::{self, shell_quote, VmOpts};
use crate::{cargo, say, setup, Result};

/// Options of `cargo xtask compare-xfer`.
#[derive(clap::Args, Debug, Clone)]
pub struct CompareXferOpts {
    #[command(flatten)]
    pub vm: VmOpts,
    /// Rounds (each runs both tools once, alternating who goes first).
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// Block size (gdr-xfer) and message size (perftest), bytes.
    #[arg(long, default_value_t = 65536)]
    pub size: u64,
    /// Blocks per gdr-xfer batch.
    #[arg(long, default_value_t = 128)]
    pub batch: u32,
    /// Queue pairs, both tools.
    #[arg(long, default_value_t = 2)]
    pub qps: u32,
    /// Seconds per run.
    #[arg(long, default_value_t = 5)]
    pub seconds: u32,
    /// gdr-xfer initiator threads (each keeps one batch in flight).
    #[arg(long, default_value_t = 1)]
    pub threads: u32,
    /// The operation: `write` (against ib_write_bw) or `read` (against ib_read_bw).
    #[arg(long, default_value = "write", value_parser = ["write", "read"])]
    pub op: String,
    #[command(flatten)]
    pub host: LocalDevice,
}

const SCRIPT: &str = "xtask/src/compare-xfer.sh";

pub fn compare(opts: &CompareXferOpts) -> Result<i32> {
    let meta = cargo::metadata()?;
    say!("building: cargo build --release --bin gdr");
    setup::run(cargo::cargo().args(["build", "--release", "--bin", "gdr"]))?;
    std::env::set_current_dir(&meta.root).map_err(|e| e.to_string())?;
    let gdr = meta.target_dir.join("release/gdr");
    let args = [
        opts.rounds.to_string(),
        opts.size.to_string(),
        opts.batch.to_string(),
        opts.qps.to_string(),
        opts.seconds.to_string(),
        opts.threads.to_string(),
        opts.op.clone(),
    ];
    let output = if opts.host.local {
        let out = Command::new("sh")
            .arg(Path::new(SCRIPT))
            .args([
                opts.host.device.as_deref().unwrap_or_default(),
                &opts.host.gid_index.to_string(),
                opts.host.addr.as_deref().unwrap_or_default(),
                gdr.to_string_lossy().as_ref(),
            ])
            .args(&args)
            .output()
            .map_err(|e| format!("running {SCRIPT}: {e}"))?;
        String::from_utf8_lossy(&out.stdout).into_owned()
    } else {
        setup::ensure_packages()?;
        let script = format!(
            "sh {SCRIPT} \"$GDR_TEST_DEVICE\" \"$GDR_TEST_GID_INDEX\" - {} {}\n",
            shell_quote(&gdr.to_string_lossy()),
            args.join(" ")
        );
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
    let (table, failures) = summarize(&runs, opts);
    println!("{table}");
    for f in &failures {
        eprintln!("xtask: compare-xfer: {f}");
    }
    Ok(i32::from(!failures.is_empty()))
}

/// One run: tool, round, Gb/s (None: no result line), exit codes.
#[derive(Debug, Clone, PartialEq)]
pub struct XRun {
    pub tool: String,
    pub round: u32,
    pub gbps: Option<f64>,
    pub rc: (i32, i32),
}

/// Reads the script's output: `### TOOL size=S round=R`, the client's output, `### end rc=A server_rc=B`.
pub fn parse(text: &str) -> Vec<XRun> {
    let mut runs = Vec::new();
    let mut cur: Option<XRun> = None;
    let mut size = String::new();
    // perftest's unit, from its header: MiB/s ("MB/sec", or "MiB/sec" in newer versions)
    // unless `--report_gbits` made it Gb/s.
    let mut perftest_gbits = false;
    for line in text.lines() {
        let l = line.trim();
        if let Some(head) = l.strip_prefix("### ") {
            if let Some(rest) = head.strip_prefix("end ") {
                if let Some(mut r) = cur.take() {
                    let num = |k: &str| {
                        rest.split_whitespace()
                            .find_map(|w| w.strip_prefix(k))
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(-1)
                    };
                    r.rc = (num("rc="), num("server_rc="));
                    runs.push(r);
                }
                continue;
            }
            let mut w = head.split_whitespace();
            let tool = w.next().unwrap_or_default().to_string();
            let mut round = 0;
            for kv in w {
                if let Some(v) = kv.strip_prefix("round=") {
                    round = v.parse().unwrap_or(0);
                }
                if let Some(v) = kv.strip_prefix("size=") {
                    size = v.to_string();
                }
            }
            if tool != "done" {
                cur = Some(XRun {
                    tool,
                    round,
                    gbps: None,
                    rc: (-1, -1),
                });
            }
            continue;
        }
        let Some(r) = cur.as_mut() else { continue };
        if l.contains("BW average[") {
            perftest_gbits = l.contains("Gb/sec");
        }
        let cols: Vec<&str> = if r.tool.starts_with("xfer") {
            l.split(',').collect()
        } else {
            l.split_whitespace().collect()
        };
        if cols.first() != Some(&size.as_str()) {
            continue;
        }
        r.gbps = if r.tool.starts_with("xfer") {
            // block_size,batch_size,batches,gb_s,gbit_s,...
            cols.get(4).and_then(|v| v.parse().ok())
        } else {
            // #bytes #iterations BW peak BW average MsgRate
            let avg = cols.get(3).and_then(|v| v.parse::<f64>().ok());
            if perftest_gbits {
                avg
            } else {
                avg.map(|mib| mib * 1_048_576.0 * 8.0 / 1e9)
            }
        };
    }
    runs
}

/// The table and the failed runs.
pub fn summarize(runs: &[XRun], opts: &CompareXferOpts) -> (String, Vec<String>) {
    let mut failures = Vec::new();
    let mut rounds: std::collections::BTreeMap<u32, (Option<f64>, Option<f64>)> =
        Default::default();
    for r in runs {
        match r.gbps.filter(|_| r.rc == (0, 0)) {
            Some(v) => {
                let e = rounds.entry(r.round).or_default();
                if r.tool == "xfer" {
                    e.0 = Some(v);
                } else {
                    e.1 = Some(v);
                }
            }
            None => failures.push(format!(
                "{} round {}: client rc {}, server rc {}{}",
                r.tool,
                r.round,
                r.rc.0,
                r.rc.1,
                if r.gbps.is_none() {
                    ", no result line"
                } else {
                    ""
                }
            )),
        }
    }
    let xs: Vec<f64> = rounds.values().filter_map(|p| p.0).collect();
    let ps: Vec<f64> = rounds.values().filter_map(|p| p.1).collect();
    let paired: Vec<f64> = rounds
        .values()
        .filter_map(|&(x, p)| Some(x? / p?))
        .collect();
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    let mut s = format!(
        "gdr-xfer {} batches of {} x {} B ({} threads) vs ib_{}_bw -s {} -q {}, {} s each, {} rounds, {}\n",
        opts.op.to_uppercase(),
        opts.batch,
        opts.size,
        opts.threads,
        opts.op,
        opts.size,
        opts.qps,
        opts.seconds,
        opts.rounds,
        if opts.vm.icount {
            "guest clock: executed instructions (--icount, one vCPU)"
        } else if opts.host.local {
            "wall clock"
        } else {
            "wall clock (two vCPUs under TCG: noisy, compare medians)"
        }
    );
    s.push_str("round   xfer Gb/s   perftest Gb/s   ratio\n");
    for (r, (x, p)) in &rounds {
        let ratio = x.zip(*p).map(|(x, p)| x / p);
        s.push_str(&format!(
            "{r:>5}   {:>9}   {:>13}   {:>5}\n",
            f(*x),
            f(*p),
            f(ratio)
        ));
    }
    s.push_str(&format!(
        "median  {:>9}   {:>13}   paired {}\n",
        f(median(&xs)),
        f(median(&ps)),
        f(median(&paired))
    ));
    (s, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_tools() {
        let out = "### xfer size=65536 round=1\nblock_size,batch_size,batches,gb_s,gbit_s\n65536,128,17,0.046,0.369,1\n### end rc=0 server_rc=0\n\
                   ### perftest size=65536 round=1\n #bytes  #iterations  BW peak[Gb/sec]  BW average[Gb/sec]  MsgRate[Mpps]\n 65536  2608  0.00  0.46  0.000869\n### end rc=0 server_rc=0\n### done\n";
        let runs = parse(out);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].gbps, Some(0.369));
        assert_eq!(runs[1].gbps, Some(0.46));
        let opts = CompareXferOpts {
            vm: VmOpts {
                timeout: 1,
                memlock: "unlimited".into(),
                icount: false,
            },
            rounds: 1,
            size: 65536,
            batch: 128,
            qps: 2,
            seconds: 5,
            threads: 1,
            op: "write".into(),
            host: LocalDevice::default(),
        };
        let (t, f) = summarize(&runs, &opts);
        assert!(f.is_empty());
        assert!(t.contains("paired 0.8022"), "{t}");
        assert!(t.contains("wall clock (two vCPUs"), "{t}");
        assert!(
            t.contains("gdr-xfer WRITE batches") && t.contains("vs ib_write_bw"),
            "{t}"
        );
    }

    #[test]
    fn reads_perftest_mib_per_second_as_gbits() {
        // ib_write_bw without --report_gbits (as compare-xfer.sh runs it): MiB/s, 4 digits.
        let out = "### perftest size=65536 round=3\n #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      4287             0.00               66.98                0.001072\n### end rc=0 server_rc=0\n";
        let runs = parse(out);
        assert_eq!(runs.len(), 1);
        let g = runs[0].gbps.unwrap();
        assert!((g - 66.98 * 1_048_576.0 * 8.0 / 1e9).abs() < 1e-12, "{g}");
        assert_eq!(runs[0].round, 3);
    }
}
