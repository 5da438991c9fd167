//! `cargo xtask compare-xfer`: gdr-xfer's batched block writes or reads (`gdr xfer-bench`)
//! against perftest's `ib_write_bw` or `ib_read_bw` with the same message size and QP count,
//! alternately, several rounds, in one VM boot (or on this host's RDMA device with `--local`),
//! then the medians and the paired ratio xfer/perftest. `--size`, `--qps` and `--op` take lists
//! (`--sweep`: every operation, 1 KiB to 1 MiB, 1, 2 and 4 QPs), all measured in the same boot
//! and summed up in one table. The guest side is `compare-xfer.sh`. Ratios are reported, never
//! asserted.

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
    /// Block sizes (gdr-xfer) and message sizes (perftest), bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "65536")]
    pub size: Vec<u64>,
    /// Blocks per gdr-xfer batch (fewer where a batch would pass 32 MiB: 32 of 1 MiB).
    #[arg(long, default_value_t = 128)]
    pub batch: u32,
    /// Queue pairs, both tools, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    pub qps: Vec<u32>,
    /// Seconds per run.
    #[arg(long, default_value_t = 5)]
    pub seconds: u32,
    /// gdr-xfer initiator threads.
    #[arg(long, default_value_t = 1)]
    pub threads: u32,
    /// Batches each gdr-xfer thread keeps in flight (`gdr xfer-bench --depth`; perftest keeps
    /// its send queue full, and so do two batches).
    #[arg(long, default_value_t = 2)]
    pub depth: u32,
    /// The operations, comma-separated: `write` (against ib_write_bw), `read` (ib_read_bw).
    #[arg(long, value_delimiter = ',', default_value = "write", value_parser = ["write", "read"])]
    pub op: Vec<String>,
    /// The whole table: --op write,read --size 1024,4096,65536,1048576 --qps 1,2,4.
    #[arg(long)]
    pub sweep: bool,
    /// More options for the gdr-xfer initiator, space-separated (`--xfer-args
    /// '--busy-poll-us 0'`), to compare the engine's settings against the same perftest runs.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub xfer_args: String,
    #[command(flatten)]
    pub host: LocalDevice,
}

/// One comparison of the sweep: operation, size, queue pairs, blocks per batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    pub op: String,
    pub size: u64,
    pub qps: u32,
    pub batch: u32,
}

impl Case {
    /// Its marker line in the output (`### case op=write size=65536 qps=2 batch=128`).
    fn marker(&self) -> String {
        format!(
            "### case op={} size={} qps={} batch={}",
            self.op, self.size, self.qps, self.batch
        )
    }

    fn parse_marker(line: &str) -> Option<Case> {
        let rest = line.trim().strip_prefix("### case ")?;
        let field = |k: &str| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .map(str::to_string)
        };
        Some(Case {
            op: field("op=")?,
            size: field("size=")?.parse().ok()?,
            qps: field("qps=")?.parse().ok()?,
            batch: field("batch=")?.parse().ok()?,
        })
    }
}

/// The cases the options ask for, in the order they run: by operation, size, then QPs.
pub fn cases(opts: &CompareXferOpts) -> Vec<Case> {
    let (ops, sizes, qps): (Vec<String>, Vec<u64>, Vec<u32>) = if opts.sweep {
        (
            vec!["write".into(), "read".into()],
            vec![1024, 4096, 65536, 1 << 20],
            vec![1, 2, 4],
        )
    } else {
        (opts.op.clone(), opts.size.clone(), opts.qps.clone())
    };
    let mut out = Vec::new();
    for op in &ops {
        for &size in &sizes {
            for &q in &qps {
                let cap = ((32u64 << 20) / size.max(1)).max(1);
                out.push(Case {
                    op: op.clone(),
                    size,
                    qps: q,
                    batch: u64::from(opts.batch).min(cap) as u32,
                });
            }
        }
    }
    out
}

const SCRIPT: &str = "xtask/src/compare-xfer.sh";

pub fn compare(opts: &CompareXferOpts) -> Result<i32> {
    let meta = cargo::metadata()?;
    say!("building: cargo build --release --bin gdr");
    setup::run(cargo::cargo().args(["build", "--release", "--bin", "gdr"]))?;
    std::env::set_current_dir(&meta.root).map_err(|e| e.to_string())?;
    let gdr = meta.target_dir.join("release/gdr");
    let cases = cases(opts);
    let args = |c: &Case| {
        [
            opts.rounds.to_string(),
            c.size.to_string(),
            c.batch.to_string(),
            c.qps.to_string(),
            opts.seconds.to_string(),
            opts.threads.to_string(),
            c.op.clone(),
            opts.depth.to_string(),
        ]
    };
    let output = if opts.host.local {
        let mut text = String::new();
        for (i, c) in cases.iter().enumerate() {
            let out = Command::new("sh")
                .env("PORT_BASE", (18720 + 100 * i).to_string())
                .env("XFER_ARGS", &opts.xfer_args)
                .arg(Path::new(SCRIPT))
                .args([
                    opts.host.device.as_deref().unwrap_or_default(),
                    &opts.host.gid_index.to_string(),
                    opts.host.addr.as_deref().unwrap_or_default(),
                    gdr.to_string_lossy().as_ref(),
                ])
                .args(args(c))
                .output()
                .map_err(|e| format!("running {SCRIPT}: {e}"))?;
            text.push_str(&c.marker());
            text.push('\n');
            text.push_str(&String::from_utf8_lossy(&out.stdout));
        }
        text
    } else {
        setup::ensure_packages()?;
        let mut script = String::new();
        for (i, c) in cases.iter().enumerate() {
            // Ports of their own per case (no server waits for a port the last case left in
            // TIME_WAIT).
            script.push_str(&format!(
                "echo '{}'\nPORT_BASE={} XFER_ARGS={} sh {SCRIPT} \"$GDR_TEST_DEVICE\" \"$GDR_TEST_GID_INDEX\" - {} {}\n",
                c.marker(),
                18720 + 100 * i,
                shell_quote(&opts.xfer_args),
                shell_quote(&gdr.to_string_lossy()),
                args(c).join(" ")
            ));
        }
        let outcome = vm::boot(&opts.vm, &script)?;
        if outcome.code != 0 {
            return Err(format!(
                "the comparison script exited with {} in the VM",
                outcome.code
            ));
        }
        outcome.output
    };
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for (case, text) in split_cases(&output) {
        let runs = parse(&text);
        let (table, medians, failed) = summarize(&runs, &case, opts);
        println!("{table}");
        failures.extend(failed);
        summary.push((case, medians));
    }
    if summary.len() > 1 {
        println!("{}", summary_table(&summary, opts));
    }
    for f in &failures {
        eprintln!("xtask: compare-xfer: {f}");
    }
    Ok(i32::from(
        !failures.is_empty() || summary.len() != cases.len(),
    ))
}

/// The output of each case: the lines after its marker.
pub fn split_cases(text: &str) -> Vec<(Case, String)> {
    split_sections(text, Case::parse_marker)
}

/// A comparison's output split at its case markers: each case (`marker` reads it off its line)
/// with the lines after it, up to the next marker; lines before the first are dropped.
pub fn split_sections<C>(text: &str, marker: impl Fn(&str) -> Option<C>) -> Vec<(C, String)> {
    let mut out: Vec<(C, String)> = Vec::new();
    for line in text.lines() {
        if let Some(c) = marker(line) {
            out.push((c, String::new()));
        } else if let Some((_, t)) = out.last_mut() {
            t.push_str(line);
            t.push('\n');
        }
    }
    out
}

/// One case's medians: gdr-xfer, perftest, and the paired ratio.
pub type Medians = (Option<f64>, Option<f64>, Option<f64>);

/// The table of every case's medians.
pub fn summary_table(rows: &[(Case, Medians)], opts: &CompareXferOpts) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    let mut s = format!(
        "summary: {} rounds of {} s, {} thread(s) x {} batch(es) in flight, {}\n\
         op      size     QPs  batch   xfer Gb/s   perftest Gb/s   paired\n",
        opts.rounds,
        opts.seconds,
        opts.threads,
        opts.depth,
        clock(opts)
    );
    for (c, (x, p, r)) in rows {
        s.push_str(&format!(
            "{:<6} {:>8} {:>4} {:>6} {:>11} {:>15} {:>8}\n",
            c.op.to_uppercase(),
            c.size,
            c.qps,
            c.batch,
            f(*x),
            f(*p),
            f(*r)
        ));
    }
    let ratios: Vec<f64> = rows.iter().filter_map(|(_, m)| m.2).collect();
    if let (Some(lo), Some(med)) = (
        ratios.iter().copied().min_by(f64::total_cmp),
        median(&ratios),
    ) {
        s.push_str(&format!(
            "paired ratios: lowest {lo:.4}, median {med:.4} over {} cases\n",
            ratios.len()
        ));
    }
    s
}

fn clock(opts: &CompareXferOpts) -> &'static str {
    if opts.vm.icount {
        "guest clock: executed instructions (--icount, one vCPU)"
    } else if opts.host.local {
        "wall clock"
    } else {
        "wall clock (two vCPUs under TCG: noisy, compare medians)"
    }
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

/// One case's table, its medians and its failed runs.
pub fn summarize(
    runs: &[XRun],
    case: &Case,
    opts: &CompareXferOpts,
) -> (String, Medians, Vec<String>) {
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
        "gdr-xfer {} batches of {} x {} B ({} threads x {} in flight) vs ib_{}_bw -s {} -q {}, {} s each, {} rounds, {}\n",
        case.op.to_uppercase(),
        case.batch,
        case.size,
        opts.threads,
        opts.depth,
        case.op,
        case.size,
        case.qps,
        opts.seconds,
        opts.rounds,
        clock(opts)
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
    let medians = (median(&xs), median(&ps), median(&paired));
    s.push_str(&format!(
        "median  {:>9}   {:>13}   paired {}\n",
        f(medians.0),
        f(medians.1),
        f(medians.2)
    ));
    (s, medians, failures)
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
            size: vec![65536],
            batch: 128,
            qps: vec![2],
            seconds: 5,
            threads: 1,
            depth: 2,
            op: vec!["write".into()],
            sweep: false,
            xfer_args: String::new(),
            host: LocalDevice::default(),
        };
        let case = &cases(&opts)[0];
        let (t, m, f) = summarize(&runs, case, &opts);
        assert!(f.is_empty());
        assert_eq!(m.0, Some(0.369));
        assert!(t.contains("paired 0.8022"), "{t}");
        assert!(t.contains("wall clock (two vCPUs"), "{t}");
        assert!(
            t.contains("gdr-xfer WRITE batches") && t.contains("vs ib_write_bw"),
            "{t}"
        );
    }

    fn opts(sweep: bool) -> CompareXferOpts {
        CompareXferOpts {
            vm: VmOpts {
                timeout: 1,
                memlock: "unlimited".into(),
                icount: true,
            },
            rounds: 1,
            size: vec![4096, 1 << 20],
            batch: 128,
            qps: vec![1, 4],
            seconds: 2,
            threads: 1,
            depth: 2,
            op: vec!["read".into()],
            sweep,
            xfer_args: String::new(),
            host: LocalDevice::default(),
        }
    }

    #[test]
    fn the_sweep_covers_every_operation_size_and_qp_count_with_batches_capped_at_32_mib() {
        let all = cases(&opts(true));
        assert_eq!(all.len(), 2 * 4 * 3);
        assert_eq!(
            all[0],
            Case {
                op: "write".into(),
                size: 1024,
                qps: 1,
                batch: 128
            }
        );
        let last = all.last().unwrap();
        assert_eq!(
            (last.op.as_str(), last.size, last.qps, last.batch),
            ("read", 1 << 20, 4, 32)
        );
        let some = cases(&opts(false));
        assert_eq!(
            some.iter().map(|c| (c.size, c.qps)).collect::<Vec<_>>(),
            [(4096, 1), (4096, 4), (1 << 20, 1), (1 << 20, 4)]
        );
    }

    #[test]
    fn each_case_is_parsed_from_its_own_section_and_summed_up() {
        let o = opts(false);
        let cs = cases(&o);
        let mut out = String::new();
        for (i, c) in cs.iter().take(2).enumerate() {
            out.push_str(&c.marker());
            out.push_str(&format!(
                "\n### xfer size={s} round=1\n{s},128,17,0.05,{x},1\n### end rc=0 server_rc=0\n\
                 ### perftest size={s} round=1\n BW average[Gb/sec]\n {s}  2608  0.00  0.50  0.1\n### end rc=0 server_rc=0\n### done\n",
                s = c.size,
                x = 0.5 + 0.1 * i as f64
            ));
        }
        let split = split_cases(&out);
        assert_eq!(split.len(), 2);
        let rows: Vec<(Case, Medians)> = split
            .iter()
            .map(|(c, t)| {
                let (_, m, f) = summarize(&parse(t), c, &o);
                assert!(f.is_empty(), "{f:?}");
                (c.clone(), m)
            })
            .collect();
        assert_eq!(rows[0].1 .2, Some(1.0));
        assert!((rows[1].1 .2.unwrap() - 1.2).abs() < 1e-9);
        let table = summary_table(&rows, &o);
        assert!(
            table.contains("READ       4096    1    128      0.5000          0.5000   1.0000"),
            "{table}"
        );
        assert!(table.contains("lowest 1.0000"), "{table}");
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
