//! `cargo xtask compare-peers`: gdr-xfer (`gdr xfer-bench`) against the transfer engines users
//! would pick instead, with the same workload, in one VM boot: Mooncake Transfer Engine's
//! Python batch API and its C++ `transfer_engine_bench`, and NVIDIA NIXL's Python API over
//! UCX. The peers come from PyPI, pinned in `peers/requirements.txt`, installed into
//! `target/peers/venv` on first use. Each case runs every tool `--rounds` times, the order
//! rotating by round; the summary gives per-tool medians and the paired ratio of gdr-xfer to
//! the best peer of each round. Every tool's bytes are checked once per run (a digest on both
//! sides; Mooncake's C++ bench has no such check) and the rxe packets a run sent are counted,
//! per MiB moved, to show the traffic crossed the device. The guest side is
//! `compare-peers.sh`, the peers' drivers `peers/*.py`. Ratios are reported, never asserted.
//! The tools `nixl-on-gdr` and `mooncake-on-gdr` run the NIXL and Mooncake drivers unchanged
//! on gdr's drop-ins (`gdr.nixl`, `gdr.mooncake`; `peers/as_gdr/` answers their imports):
//! they count as gdr's, not as peers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::perftest::median;
use crate::vm::{self, shell_quote, VmOpts};
use crate::{cargo, say, setup, Result};

/// The tools, in the order of the tables.
pub const TOOLS: [&str; 6] = [
    "gdr",
    "mooncake",
    "mooncake-cpp",
    "nixl",
    "nixl-on-gdr",
    "mooncake-on-gdr",
];

/// Options of `cargo xtask compare-peers`.
#[derive(clap::Args, Debug, Clone)]
pub struct ComparePeersOpts {
    #[command(flatten)]
    pub vm: VmOpts,
    /// The wall clock with two vCPUs instead of the instruction-counting clock (`--icount`,
    /// one vCPU), which is the default.
    #[arg(long, conflicts_with = "icount")]
    pub wall: bool,
    /// Rounds (each runs every tool once, the order rotating).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Seconds per run (whole seconds: Mooncake's C++ bench takes no fraction).
    #[arg(long, default_value_t = 4)]
    pub seconds: u32,
    /// Operations, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "write,read", value_parser = ["write", "read"])]
    pub op: Vec<String>,
    /// Block sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1024,65536,1048576")]
    pub size: Vec<u64>,
    /// Blocks per batch, comma-separated: 256 (message rate) and 1 (one block per transfer:
    /// the per-request cost); capped so that a batch moves at most 32 MiB.
    #[arg(long, value_delimiter = ',', default_value = "256,1")]
    pub batch: Vec<u32>,
    /// Queue pairs, comma-separated (gdr-xfer's `-q`, Mooncake's MC_NUM_QP_PER_EP; NIXL's UCX
    /// keeps its own).
    #[arg(long, value_delimiter = ',', default_value = "2")]
    pub qps: Vec<u32>,
    /// Submitting threads, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub threads: Vec<u32>,
    /// Batches each thread keeps in flight (Mooncake's C++ bench always keeps one).
    #[arg(long, default_value_t = 2)]
    pub depth: u32,
    /// Tools, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "gdr,mooncake,mooncake-cpp,nixl", value_parser = TOOLS)]
    pub tools: Vec<String>,
    /// A variant of gdr-xfer run beside the others in every round, as `NAME=ARGS`: the tool
    /// `gdr-NAME` is `gdr xfer-bench` with ARGS (whitespace-separated, given to the target and
    /// the initiator), e.g. `poll0=--busy-poll-us 0` or `q4=-q 4`. Repeat for more. Each
    /// variant gets its own paired ratio to the best peer; gdr's own column stays the default.
    #[arg(long = "gdr-variant", value_parser = parse_variant)]
    pub gdr_variants: Vec<GdrVariant>,
}

/// A variant of gdr-xfer: `gdr xfer-bench` with extra arguments (see `--gdr-variant`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdrVariant {
    /// Its name: the tool is `gdr-NAME`.
    pub name: String,
    /// Its extra arguments, whitespace-separated.
    pub args: String,
}

impl GdrVariant {
    /// The tool's name in the tables and in compare-peers.sh.
    pub fn tool(&self) -> String {
        format!("gdr-{}", self.name)
    }
}

fn parse_variant(s: &str) -> std::result::Result<GdrVariant, String> {
    let (name, args) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: give NAME=ARGS, e.g. poll0=--busy-poll-us 0"))?;
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(format!(
            "`{name}`: a variant's name is lowercase letters, digits and `_` (it names a shell \
             variable)"
        ));
    }
    if args.contains(['\'', '"', '\\', '$', '`']) {
        return Err(format!(
            "`{args}`: a variant's arguments are split on whitespace, without quotes or `$`"
        ));
    }
    Ok(GdrVariant {
        name: name.to_string(),
        args: args.to_string(),
    })
}

/// Whether a tool is gdr-xfer, one of its variants, or a peer's driver on gdr's drop-in
/// (`nixl-on-gdr`): not a peer.
fn is_gdr(tool: &str) -> bool {
    is_xfer_bench(tool) || tool.ends_with("-on-gdr")
}

/// Whether a tool is `gdr xfer-bench` (gdr-xfer or one of its variants): its CSV output.
fn is_xfer_bench(tool: &str) -> bool {
    tool == "gdr" || tool.starts_with("gdr-")
}

/// The tools of a run, in the order of the tables: the chosen ones of [`TOOLS`], gdr's
/// variants right after gdr.
pub fn columns(opts: &ComparePeersOpts) -> Vec<String> {
    let mut out = Vec::new();
    for t in TOOLS.iter().filter(|t| opts.tools.iter().any(|x| x == *t)) {
        out.push(t.to_string());
        if *t == "gdr" {
            out.extend(opts.gdr_variants.iter().map(GdrVariant::tool));
        }
    }
    if !opts.tools.iter().any(|t| t == "gdr") {
        let variants = opts.gdr_variants.iter().map(GdrVariant::tool);
        out.splice(0..0, variants);
    }
    out
}

/// One case: operation, block size, blocks per batch, queue pairs, threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    pub op: String,
    pub size: u64,
    pub batch: u32,
    pub qps: u32,
    pub threads: u32,
}

impl Case {
    /// The line that opens a run's section, as compare-peers.sh and the drivers print it.
    #[cfg(test)]
    fn marker(&self) -> String {
        format!(
            "### case op={} size={} batch={} qps={} threads={}",
            self.op, self.size, self.batch, self.qps, self.threads
        )
    }

    /// The case as compare-peers.sh and the drivers take it: `OP:SIZE:BATCH:QPS:THREADS`.
    fn spec(&self) -> String {
        format!(
            "{}:{}:{}:{}:{}",
            self.op, self.size, self.batch, self.qps, self.threads
        )
    }

    fn parse_marker(line: &str) -> Option<Case> {
        let rest = line.trim().strip_prefix("### case ")?;
        let field = |k: &str| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))
        };
        Some(Case {
            op: field("op")?.to_string(),
            size: field("size")?.parse().ok()?,
            batch: field("batch")?.parse().ok()?,
            qps: field("qps")?.parse().ok()?,
            threads: field("threads")?.parse().ok()?,
        })
    }
}

/// The cases, in the order they run: operation, size, batch, QPs, threads. Equal cases after
/// the 32 MiB cap appear once.
pub fn cases(opts: &ComparePeersOpts) -> Vec<Case> {
    let mut out: Vec<Case> = Vec::new();
    for op in &opts.op {
        for &size in &opts.size {
            for &batch in &opts.batch {
                let cap = ((32u64 << 20) / size.max(1)).max(1);
                let batch = u64::from(batch.max(1)).min(cap) as u32;
                for &qps in &opts.qps {
                    for &threads in &opts.threads {
                        let c = Case {
                            op: op.clone(),
                            size,
                            batch,
                            qps,
                            threads,
                        };
                        if !out.contains(&c) {
                            out.push(c);
                        }
                    }
                }
            }
        }
    }
    out
}

const SCRIPT: &str = "xtask/src/compare-peers.sh";
const DRIVERS: &str = "xtask/src/peers";

/// The peers' virtual environment, made and filled from `peers/requirements.txt` on first use
/// (again whenever that file changes).
pub fn ensure_peers(target_dir: &Path) -> Result<PathBuf> {
    let venv = target_dir.join("peers/venv");
    let req = Path::new(DRIVERS).join("requirements.txt");
    let wanted = std::fs::read_to_string(&req).map_err(|e| format!("{}: {e}", req.display()))?;
    let stamp = venv.join("compare-peers-requirements.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(venv);
    }
    say!(
        "installing the peers into {} (pip install --no-deps -r {}; about 500 MB)",
        venv.display(),
        req.display()
    );
    setup::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    setup::run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--no-deps", "-r"])
            .arg(&req),
    )?;
    std::fs::write(&stamp, wanted).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(venv)
}

pub fn compare(opts: &ComparePeersOpts) -> Result<i32> {
    let meta = cargo::metadata()?;
    std::env::set_current_dir(&meta.root).map_err(|e| e.to_string())?;
    say!("building: cargo build --release --bin gdr");
    setup::run(cargo::cargo().args(["build", "--release", "--bin", "gdr"]))?;
    let gdr = meta.target_dir.join("release/gdr");
    let venv = ensure_peers(&meta.target_dir)?;
    let drivers = meta.root.join(DRIVERS);
    // The peers' drivers on gdr's drop-ins run in the wheel's virtual environment.
    let gdr_py = if opts.tools.iter().any(|t| t.ends_with("-on-gdr")) {
        crate::py_test::build_wheel("python3")?.python
    } else {
        PathBuf::from("/nonexistent")
    };
    let cases = cases(opts);
    let mut vm_opts = opts.vm.clone();
    vm_opts.icount = !opts.wall;
    let q = |p: &Path| shell_quote(&p.to_string_lossy());
    let mut script = format!(
        "export GDR={} PEERS_VENV={} PEERS_DIR={} GDR_PY={}\n",
        q(&gdr),
        q(&venv),
        q(&drivers),
        q(&gdr_py)
    );
    for v in &opts.gdr_variants {
        script.push_str(&format!(
            "export GDR_ARGS_{}={}\n",
            v.name,
            shell_quote(&v.args)
        ));
    }
    // One invocation runs every case: the Python drivers then start once per round, not once
    // per case and round.
    script.push_str(&format!(
        "bash {SCRIPT} \"$GDR_TEST_DEVICE\" \"$GDR_TEST_GID_INDEX\" {} {} {} {}",
        opts.rounds,
        opts.seconds,
        opts.depth,
        columns(opts).join(","),
    ));
    for c in &cases {
        script.push_str(&format!(" {}", c.spec()));
    }
    script.push('\n');
    let outcome = vm::boot(&vm_opts, &script)?;
    // The tables of what ran, even when the script failed or the VM timed out: a long run's
    // finished cases are worth reading.
    let mut failures = Vec::new();
    if outcome.code != 0 {
        failures.push(format!(
            "the comparison script exited with {} in the VM",
            outcome.code
        ));
    }
    let mut rows = Vec::new();
    for (case, text) in split_cases(&outcome.output) {
        let runs = parse(&text, &case);
        let (table, row, failed) = summarize(&runs, &case, opts);
        println!("{table}");
        failures.extend(failed);
        rows.push((case, row));
    }
    println!("{}", summary_table(&rows, opts));
    for f in &failures {
        eprintln!("xtask: compare-peers: {f}");
    }
    Ok(i32::from(!failures.is_empty() || rows.len() != cases.len()))
}

/// The output of each case, in the order the cases first appear: the lines after each of its
/// markers (every run of every round and tool opens a section with its case's marker).
pub fn split_cases(text: &str) -> Vec<(Case, String)> {
    let mut out: Vec<(Case, String)> = Vec::new();
    for (case, section) in crate::compare_xfer::split_sections(text, Case::parse_marker) {
        match out.iter_mut().find(|(c, _)| *c == case) {
            Some((_, t)) => t.push_str(&section),
            None => out.push((case, section)),
        }
    }
    out
}

/// The data check of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Both sides printed the same digest.
    Equal,
    /// The tool checks nothing (Mooncake's C++ bench).
    None,
    /// A digest is missing, or the two differ.
    Failed(String),
}

/// One run of one tool.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub tool: String,
    pub round: u32,
    pub gbps: Option<f64>,
    /// Bytes the initiator reports it moved in the timed part.
    pub bytes: Option<f64>,
    /// rxe packets sent during the run (warm-up and data check included).
    pub pkts: Option<u64>,
    /// rxe's other counters that moved during the run (`hw_counters`: retries, sequence
    /// errors, duplicate requests, ...), by name.
    pub counters: BTreeMap<String, u64>,
    /// Each vCPU's busy and softirq shares of the timed part, in percent, in CPU order (the
    /// `### cpu` line; empty when the run printed none).
    pub cpu: Vec<(u32, u32)>,
    pub check: Check,
    pub rc: (i32, i32),
}

impl Run {
    /// Packets per MiB moved.
    pub fn pkts_per_mib(&self) -> Option<f64> {
        let b = self.bytes.filter(|b| *b > 0.0)?;
        Some(self.pkts? as f64 / (b / 1_048_576.0))
    }
}

fn kv<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// Reads one case's output.
pub fn parse(text: &str, case: &Case) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut cur: Option<Run> = None;
    let (mut mine, mut theirs): (Option<String>, Option<String>) = (None, None);
    let size = case.size.to_string();
    let block_bytes = (u64::from(case.batch) * case.size) as f64;
    for line in text.lines() {
        let l = line.trim();
        if let Some(head) = l.strip_prefix("### ") {
            if let Some(rest) = head.strip_prefix("end ") {
                if let Some(mut r) = cur.take() {
                    let num = |k| kv(rest, k).and_then(|v| v.parse().ok()).unwrap_or(-1);
                    r.rc = (num("rc"), num("server_rc"));
                    if r.tool != "mooncake-cpp" {
                        r.check = match (mine.take(), theirs.take()) {
                            (Some(a), Some(b)) if a == b => Check::Equal,
                            (Some(a), Some(b)) => {
                                Check::Failed(format!("initiator {a}, target {b}"))
                            }
                            (a, _) => Check::Failed(format!(
                                "no digest from the {}",
                                if a.is_none() { "initiator" } else { "target" }
                            )),
                        };
                    }
                    runs.push(r);
                }
                continue;
            }
            if let Some(rest) = head.strip_prefix("pkts ") {
                if let Some(r) = cur.as_mut() {
                    r.pkts = kv(rest, "sent").and_then(|v| v.parse().ok());
                    r.counters = rest
                        .split_whitespace()
                        .filter_map(|w| w.split_once('='))
                        .filter(|(k, _)| *k != "sent")
                        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
                        .filter(|(_, v)| *v != 0)
                        .collect();
                }
                continue;
            }
            if let Some(rest) = head.strip_prefix("cpu ") {
                if let Some(r) = cur.as_mut() {
                    // All or nothing: a value that does not parse drops the line, so that no
                    // vCPU's busy share is paired with another's softirq share.
                    let list = |k| -> Option<Vec<u32>> {
                        kv(rest, k)?.split(',').map(|x| x.parse().ok()).collect()
                    };
                    r.cpu = match (list("busy"), list("softirq")) {
                        (Some(b), Some(q)) if b.len() == q.len() => b.into_iter().zip(q).collect(),
                        _ => Vec::new(),
                    };
                }
                continue;
            }
            let mut w = head.split_whitespace();
            let tool = w.next().unwrap_or_default();
            if TOOLS.contains(&tool) || is_gdr(tool) {
                (mine, theirs) = (None, None);
                cur = Some(Run {
                    tool: tool.to_string(),
                    round: w
                        .find_map(|x| x.strip_prefix("round="))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0),
                    gbps: None,
                    bytes: None,
                    pkts: None,
                    counters: BTreeMap::new(),
                    cpu: Vec::new(),
                    check: Check::None,
                    rc: (-1, -1),
                });
            }
            continue;
        }
        let Some(r) = cur.as_mut() else { continue };
        let (target, l) = match l.strip_prefix("target: ") {
            Some(rest) => (true, rest.trim()),
            None => (false, l),
        };
        // The digests: gdr's `xfer-bench[ target]: digest 0x...`, the drivers' `digest side=..`.
        let digest = if let Some(v) = kv(l, "value").filter(|_| l.starts_with("digest ")) {
            Some(v.to_string())
        } else {
            l.split_once(": digest ")
                .filter(|(who, _)| who.starts_with("xfer-bench"))
                .and_then(|(_, d)| d.split_whitespace().next())
                .map(str::to_string)
        };
        if let Some(d) = digest {
            if target {
                theirs = Some(d);
            } else {
                mine = Some(d);
            }
            continue;
        }
        if target {
            continue;
        }
        match r.tool.as_str() {
            t if is_xfer_bench(t) => {
                // block_size,batch_size,batches,gb_s,gbit_s,...
                let cols: Vec<&str> = l.split(',').collect();
                if cols.first() == Some(&size.as_str()) && cols.len() > 4 {
                    r.gbps = cols[4].parse().ok();
                    r.bytes = cols[2].parse::<f64>().ok().map(|n| n * block_bytes);
                }
            }
            "mooncake-cpp" => {
                // Test completed: duration 4.00, batch count 1234, throughput 0.05 GB/s
                if let Some(rest) = l.split("Test completed:").nth(1) {
                    let after = |k: &str| {
                        rest.split(k)
                            .nth(1)
                            .and_then(|s| s.split([',', ' ']).find(|w| !w.is_empty()))
                            .and_then(|v| v.parse::<f64>().ok())
                    };
                    // Its throughput has two decimals (0.00 GB/s per request on Soft-RoCE):
                    // the rate comes from the batch count and the duration instead.
                    r.bytes = after("batch count").map(|n| n * block_bytes);
                    r.gbps = r
                        .bytes
                        .zip(after("duration").filter(|d| *d > 0.0))
                        .map(|(b, d)| b * 8.0 / d / 1e9);
                }
            }
            _ => {
                if l.starts_with("result ") {
                    r.gbps = kv(l, "gbit_s").and_then(|v| v.parse().ok());
                    r.bytes = kv(l, "bytes").and_then(|v| v.parse().ok());
                }
            }
        }
    }
    runs
}

/// One case's summary: per tool, the median Gb/s, the median packets per MiB and its checks;
/// the median over rounds of gdr-xfer / the best peer of that round (and of each variant of
/// gdr-xfer), and that best peer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub gbps: BTreeMap<String, f64>,
    pub pkts_per_mib: BTreeMap<String, f64>,
    pub checks: BTreeMap<String, String>,
    pub vs_best: Option<f64>,
    /// Per variant of gdr-xfer (`gdr-NAME`): its paired ratio to the best peer.
    pub variants_vs_best: BTreeMap<String, f64>,
    pub best: Option<String>,
}

fn clock(opts: &ComparePeersOpts) -> &'static str {
    if opts.wall {
        "wall clock (two vCPUs under TCG: noisy, compare medians)"
    } else {
        "guest clock: executed instructions (--icount, one vCPU)"
    }
}

fn f4(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.4}"))
}

/// One case's table, its summary row and its failures (a run without a result, a nonzero
/// exit, a failed data check, a run that sent no rxe packets, a tool without one run a round).
pub fn summarize(runs: &[Run], case: &Case, opts: &ComparePeersOpts) -> (String, Row, Vec<String>) {
    let mut failures = Vec::new();
    let mut by_round: BTreeMap<u32, BTreeMap<String, f64>> = BTreeMap::new();
    let mut row = Row::default();
    let name = |c: &Case| {
        format!(
            "{} {} B x {} qps={} threads={}",
            c.op.to_uppercase(),
            c.size,
            c.batch,
            c.qps,
            c.threads
        )
    };
    let mut checked: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    let mut pkts: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in runs {
        let what = format!("{}: {} round {}", name(case), r.tool, r.round);
        let ok = r.rc == (0, 0) && r.gbps.is_some();
        if !ok {
            failures.push(format!(
                "{what}: client rc {}, server rc {}{}",
                r.rc.0,
                r.rc.1,
                if r.gbps.is_none() {
                    ", no result line"
                } else {
                    ""
                }
            ));
        }
        let e = checked.entry(r.tool.clone()).or_default();
        match &r.check {
            Check::Equal => e.0 += 1,
            Check::None => {}
            Check::Failed(why) => {
                e.1 += 1;
                failures.push(format!("{what}: data check failed: {why}"));
            }
        }
        if r.pkts == Some(0) {
            failures.push(format!(
                "{what}: no rxe packets were sent (not RDMA over the device?)"
            ));
        } else if ok && r.pkts.is_none() {
            failures.push(format!(
                "{what}: no packet count (`### pkts` line): whether it crossed the device is unknown"
            ));
        }
        if let Some(p) = r.pkts_per_mib() {
            pkts.entry(r.tool.clone()).or_default().push(p);
        }
        if let (true, Some(g)) = (ok, r.gbps) {
            by_round
                .entry(r.round)
                .or_default()
                .insert(r.tool.clone(), g);
        }
    }
    let tools = columns(opts);
    for t in &tools {
        let n = runs.iter().filter(|r| r.tool == *t).count();
        if n != opts.rounds as usize {
            failures.push(format!(
                "{}: {t} has {n} runs, not one a round ({})",
                name(case),
                opts.rounds
            ));
        }
    }
    let mut s = format!(
        "{}: {} s per run, {} rounds, {} batch(es) in flight per thread, {}\n",
        name(case),
        opts.seconds,
        opts.rounds,
        opts.depth,
        clock(opts)
    );
    s.push_str("round");
    for t in &tools {
        s.push_str(&format!(" {t:>13}"));
    }
    s.push_str("   gdr/best peer\n");
    // Per gdr tool (gdr and its variants), its ratio to the best peer of each round.
    let mut ratios: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (round, m) in &by_round {
        s.push_str(&format!("{round:>5}"));
        for t in &tools {
            s.push_str(&format!(" {:>13}", f4(m.get(t).copied())));
        }
        let best = m
            .iter()
            .filter(|(t, _)| !is_gdr(t))
            .map(|(_, v)| *v)
            .max_by(f64::total_cmp);
        for t in tools.iter().filter(|t| is_gdr(t)) {
            if let Some(r) = m.get(t).zip(best).map(|(g, b)| g / b) {
                ratios.entry(t).or_default().push(r);
            }
        }
        let ratio = m.get("gdr").zip(best).map(|(g, b)| g / b);
        s.push_str(&format!("   {}\n", f4(ratio)));
    }
    for t in &tools {
        let v: Vec<f64> = by_round
            .values()
            .filter_map(|m| m.get(t).copied())
            .collect();
        if let Some(m) = median(&v) {
            row.gbps.insert(t.to_string(), m);
        }
        if let Some(p) = pkts.get(t).and_then(|v| median(v)) {
            row.pkts_per_mib.insert(t.to_string(), p);
        }
        let (eq, bad) = checked.get(t).copied().unwrap_or_default();
        row.checks.insert(
            t.to_string(),
            if t == "mooncake-cpp" {
                "none".to_string()
            } else if bad > 0 {
                format!("FAILED {bad}")
            } else {
                format!("{eq}/{}", runs.iter().filter(|r| r.tool == *t).count())
            },
        );
    }
    row.vs_best = ratios.get("gdr").and_then(|v| median(v));
    row.variants_vs_best = ratios
        .iter()
        .filter(|(t, _)| **t != "gdr")
        .filter_map(|(t, v)| Some((t.to_string(), median(v)?)))
        .collect();
    row.best = row
        .gbps
        .iter()
        .filter(|(t, _)| !is_gdr(t))
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(t, _)| t.clone());
    s.push_str("median");
    for t in &tools {
        s.push_str(&format!(" {:>12}", f4(row.gbps.get(t).copied())));
        s.push(' ');
    }
    s.push_str(&format!("  paired {}\n", f4(row.vs_best)));
    for (t, r) in &row.variants_vs_best {
        s.push_str(&format!("{t}/best peer, paired: {r:.4}\n"));
    }
    // A peer's driver on gdr's drop-in against the same driver on the peer itself.
    for t in tools.iter().filter(|t| t.ends_with("-on-gdr")) {
        let original = t.trim_end_matches("-on-gdr");
        let paired: Vec<f64> = by_round
            .values()
            .filter_map(|m| Some(m.get(t.as_str())? / m.get(original)?))
            .collect();
        if let Some(r) = median(&paired) {
            s.push_str(&format!("{t}/{original}, paired: {r:.4}\n"));
        }
    }
    s.push_str("data check (equal digests / runs) and rxe packets per MiB:");
    for t in &tools {
        s.push_str(&format!(
            " {t} {} {}",
            row.checks.get(t).map_or("-", String::as_str),
            row.pkts_per_mib
                .get(t)
                .map_or("-".to_string(), |p| format!("{p:.0}"))
        ));
        s.push(';');
    }
    s.pop();
    s.push('\n');
    // What rxe counted besides packets (retransmissions, sequence errors, ...): a tool whose
    // requests the device had to repeat pays for it in bandwidth.
    let mut line = String::new();
    for t in &tools {
        let mut sum: BTreeMap<&str, u64> = BTreeMap::new();
        for r in runs.iter().filter(|r| r.tool == *t) {
            for (k, v) in &r.counters {
                *sum.entry(k).or_default() += v;
            }
        }
        if !sum.is_empty() {
            let kv: Vec<String> = sum.iter().map(|(k, v)| format!("{k}={v}")).collect();
            line.push_str(&format!(" {t} {};", kv.join(" ")));
        }
    }
    if !line.is_empty() {
        line.pop();
        s.push_str(&format!(
            "rxe's other counters, summed over the runs:{line}\n"
        ));
    }
    s.push_str(&cpu_line(runs, &tools));
    (s, row, failures)
}

/// The line of the tools' CPU use in the timed part: per tool, its vCPUs busiest first, each
/// as the median over the runs of the busy share with the softirq share (rxe's protocol work)
/// in brackets, in percent. Where one vCPU is saturated and the other is not, the tool's
/// throughput is bound by the work that runs on one CPU. Empty when no run printed a cpu line.
fn cpu_line(runs: &[Run], tools: &[String]) -> String {
    let mut line = String::new();
    for t in tools {
        let mut sorted: Vec<Vec<(u32, u32)>> = runs
            .iter()
            .filter(|r| r.tool == *t && !r.cpu.is_empty())
            .map(|r| r.cpu.clone())
            .collect();
        if sorted.is_empty() {
            continue;
        }
        for c in &mut sorted {
            c.sort_by(|a, b| b.cmp(a));
        }
        let n = sorted.iter().map(Vec::len).min().unwrap_or(0);
        let cpus: Vec<String> = (0..n)
            .map(|i| {
                let at = |f: fn(&(u32, u32)) -> u32| {
                    let v: Vec<f64> = sorted.iter().map(|c| f64::from(f(&c[i]))).collect();
                    median(&v).unwrap_or(0.0)
                };
                format!("{:.0} ({:.0})", at(|c| c.0), at(|c| c.1))
            })
            .collect();
        line.push_str(&format!(" {t} {};", cpus.join(", ")));
    }
    if line.is_empty() {
        return line;
    }
    line.pop();
    format!(
        "vCPU busy % (softirq %) in the timed part, busiest first, medians of the runs:{line}\n"
    )
}

/// The table of every case: Gb/s medians, the paired ratio to the best peer, the checks.
pub fn summary_table(rows: &[(Case, Row)], opts: &ComparePeersOpts) -> String {
    let tools = columns(opts);
    let variants: Vec<String> = opts.gdr_variants.iter().map(GdrVariant::tool).collect();
    let mut s = format!(
        "summary (Gb/s, medians of {} rounds of {} s; {} batch(es) in flight per thread; {})\n",
        opts.rounds,
        opts.seconds,
        opts.depth,
        clock(opts)
    );
    s.push_str("op     size     batch qps thr");
    for t in &tools {
        s.push_str(&format!(" {t:>12}"));
    }
    s.push_str("  gdr/best  best peer     checks");
    for v in &variants {
        s.push_str(&format!(" {:>12}", format!("{}/best", &v[4..])));
    }
    s.push('\n');
    for (c, r) in rows {
        s.push_str(&format!(
            "{:<6} {:>8} {:>5} {:>3} {:>3}",
            c.op.to_uppercase(),
            c.size,
            c.batch,
            c.qps,
            c.threads
        ));
        for t in &tools {
            s.push_str(&format!(" {:>12}", f4(r.gbps.get(t).copied())));
        }
        let failed = r.checks.values().any(|c| c.starts_with("FAILED"));
        s.push_str(&format!(
            "  {:>8}  {:<12}  {:<6}",
            f4(r.vs_best),
            r.best.as_deref().unwrap_or("-"),
            if failed { "FAILED" } else { "ok" }
        ));
        for v in &variants {
            s.push_str(&format!(" {:>12}", f4(r.variants_vs_best.get(v).copied())));
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
    }
    let ratios: Vec<f64> = rows.iter().filter_map(|(_, r)| r.vs_best).collect();
    if let (Some(lo), Some(med)) = (
        ratios.iter().copied().min_by(f64::total_cmp),
        median(&ratios),
    ) {
        s.push_str(&format!(
            "gdr/best peer: lowest {lo:.4}, median {med:.4} over {} cases; {} of them below 1\n",
            ratios.len(),
            ratios.iter().filter(|r| **r < 1.0).count()
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        opts: ComparePeersOpts,
    }

    fn opts(args: &[&str]) -> ComparePeersOpts {
        Cli::parse_from(std::iter::once("compare-peers").chain(args.iter().copied())).opts
    }

    #[test]
    fn the_default_cases_are_both_operations_three_sizes_batched_and_per_request() {
        let o = opts(&[]);
        assert!(!o.wall && o.rounds == 3 && o.depth == 2);
        let all = cases(&o);
        assert_eq!(all.len(), 2 * 3 * 2);
        assert_eq!(
            (
                all[0].op.as_str(),
                all[0].size,
                all[0].batch,
                all[0].qps,
                all[0].threads
            ),
            ("write", 1024, 256, 2, 1)
        );
        // 256 blocks of 1 MiB pass 32 MiB: 32 a batch.
        let big: Vec<u32> = all
            .iter()
            .filter(|c| c.size == 1 << 20)
            .map(|c| c.batch)
            .collect();
        assert_eq!(big, [32, 1, 32, 1]);
        assert!(all
            .iter()
            .all(|c| Case::parse_marker(&c.marker()).as_ref() == Some(c)));
        let o = opts(&["--size", "1048576", "--batch", "64,32", "--op", "read"]);
        assert_eq!(
            cases(&o).len(),
            1,
            "64 and 32 blocks of 1 MiB are one case after the cap"
        );
        assert!(Cli::try_parse_from(["x", "--wall", "--icount"]).is_err());
        assert!(Cli::try_parse_from(["x", "--tools", "ucx"]).is_err());
    }

    const OUT: &str = "\
### gdr round=1
block_size,batch_size,batches,gb_s,gbit_s,avg_lat_us
65536,256,10,0.05,0.4000,1
xfer-bench: digest 0x00000000000000aa over 512 blocks of 65536 B
target: xfer-bench target: listening on 127.0.0.1:1 (rxe0:1), buffer 1 bytes
target: xfer-bench target: digest 0x00000000000000aa over 512 blocks of 65536 B
### pkts sent=163840 rcvd_pkts=163000 duplicate_request=3 ack_deferred=0
### cpu busy=48,100 softirq=2,71
### end rc=0 server_rc=0
### mooncake round=1
result gbit_s=0.200000 bytes=83886080 seconds=4.0 batches=5
digest side=initiator value=beef blocks=512 block_size=65536
target: digest side=target value=beef blocks=512 block_size=65536
### pkts sent=81920
### cpu busy=97,99 softirq=40,35
### end rc=0 server_rc=0
### mooncake-cpp round=1
I1207 12:00:00.0 1 bench.cpp:1] Test completed: duration 4.00, batch count 12, throughput 0.05 GB/s
### pkts sent=196608
### cpu busy=1,2,3 softirq=0
### end rc=0 server_rc=0
### nixl round=1
result gbit_s=0.300000 bytes=100 seconds=4.0 batches=5
digest side=initiator value=beef blocks=512 block_size=65536
target: digest side=target value=dead blocks=512 block_size=65536
### pkts sent=0
### end rc=0 server_rc=0
### done
";

    #[test]
    fn every_tool_is_parsed_and_checked_and_a_bad_check_or_silent_device_fails() {
        let o = opts(&[
            "--size", "65536", "--batch", "256", "--op", "write", "--rounds", "1",
        ]);
        let case = &cases(&o)[0];
        let runs = parse(OUT, case);
        assert_eq!(runs.len(), 4);
        assert_eq!(runs[0].gbps, Some(0.4));
        assert_eq!(runs[0].check, Check::Equal);
        assert_eq!(runs[0].bytes, Some(10.0 * 256.0 * 65536.0));
        // 163840 packets over 160 MiB.
        assert_eq!(runs[0].pkts_per_mib(), Some(1024.0));
        assert_eq!(
            runs[0].counters.iter().collect::<Vec<_>>(),
            [
                (&"duplicate_request".to_string(), &3),
                (&"rcvd_pkts".to_string(), &163000)
            ],
            "the counters that moved, besides sent packets"
        );
        assert_eq!(runs[0].cpu, [(48, 2), (100, 71)], "each vCPU, in CPU order");
        assert_eq!(runs[1].check, Check::Equal);
        assert!(
            runs[2].cpu.is_empty(),
            "a cpu line whose lists differ in length is dropped"
        );
        assert!(runs[3].cpu.is_empty(), "no cpu line");
        let bad = OUT.replace("busy=48,100 softirq=2,71", "busy=x,100 softirq=2");
        assert!(
            parse(&bad, case)[0].cpu.is_empty(),
            "a value that does not parse drops the whole line"
        );
        // 12 batches of 16 MiB in 4 s (not the two-decimal throughput it prints).
        assert!((runs[2].gbps.unwrap() - 12.0 * 256.0 * 65536.0 * 8.0 / 4.0 / 1e9).abs() < 1e-12);
        assert_eq!(runs[2].check, Check::None);
        assert_eq!(runs[2].bytes, Some(12.0 * 256.0 * 65536.0));
        assert!(matches!(runs[3].check, Check::Failed(_)));
        let (table, row, failures) = summarize(&runs, case, &o);
        assert_eq!(row.best.as_deref(), Some("mooncake-cpp"));
        assert!((row.vs_best.unwrap() - 0.4 / 0.402653184).abs() < 1e-9);
        assert_eq!(row.checks["gdr"], "1/1");
        assert_eq!(row.checks["nixl"], "FAILED 1");
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert!(failures.iter().any(|f| f.contains("data check failed")));
        assert!(failures.iter().any(|f| f.contains("no rxe packets")));
        assert!(table.contains("paired 0.9934"), "{table}");
        assert!(
            table.contains("summed over the runs: gdr duplicate_request=3 rcvd_pkts=163000\n"),
            "{table}"
        );
        assert!(
            table.contains("busiest first, medians of the runs: gdr 100 (71), 48 (2); mooncake 99 (35), 97 (40)\n"),
            "{table}"
        );
        let sum = summary_table(&[(case.clone(), row)], &o);
        assert!(sum.contains("WRITE     65536   256   2   1       0.4000       0.2000       0.4027       0.3000    0.9934  mooncake-cpp  FAILED"), "{sum}");
        assert!(sum.contains("1 of them below 1"), "{sum}");
    }

    #[test]
    fn a_run_without_a_digest_or_result_is_a_failure() {
        let o = opts(&["--rounds", "1"]);
        let case = &cases(&o)[0];
        let text = "### gdr round=1\n1024,256,1,0.1,0.8,1\n### pkts sent=10\n### end rc=0 server_rc=0\n### nixl round=1\n### end rc=1 server_rc=0\n";
        let runs = parse(text, case);
        assert_eq!(
            runs[0].check,
            Check::Failed("no digest from the initiator".into())
        );
        let (_, _, failures) = summarize(&runs, case, &o);
        assert_eq!(failures.len(), 5, "{failures:?}");
        assert!(failures
            .iter()
            .any(|f| f.contains("mooncake-cpp has 0 runs, not one a round (1)")));
    }

    #[test]
    fn a_case_gathers_its_sections_from_every_round_and_tool() {
        let o = opts(&["--size", "1024", "--batch", "1", "--rounds", "2"]);
        let all = cases(&o);
        let (w, r) = (&all[0], &all[1]);
        assert_eq!(w.spec(), "write:1024:1:2:1");
        let run = |c: &Case, tool: &str, round: u32| {
            format!(
                "{}\n### {tool} round={round}\nresult gbit_s=0.{round}00000 bytes=1 seconds=1 batches=1\n\
                 digest side=initiator value=ab blocks=1 block_size=1024\n\
                 target: digest side=target value=ab blocks=1 block_size=1024\n\
                 ### pkts sent=1\n### end rc=0 server_rc=0\n",
                c.marker()
            )
        };
        // Round-major, as compare-peers.sh prints it: a Python driver runs every case in turn.
        let text = [
            run(w, "nixl", 1),
            run(r, "nixl", 1),
            run(r, "gdr", 1),
            run(w, "gdr", 2),
            run(w, "nixl", 2),
        ]
        .concat()
            + "### done\n";
        let split = split_cases(&text);
        assert_eq!(split.len(), 2);
        assert_eq!(&split[0].0, w);
        let runs = parse(&split[0].1, w);
        let got: Vec<(&str, u32)> = runs.iter().map(|x| (x.tool.as_str(), x.round)).collect();
        assert_eq!(got, [("nixl", 1), ("gdr", 2), ("nixl", 2)]);
        assert!(runs.iter().all(|x| x.check == Check::Equal));
        assert_eq!(parse(&split[1].1, r).len(), 2);
    }

    #[test]
    fn a_peers_driver_on_a_drop_in_is_parsed_as_python_counts_as_gdr_and_pairs_with_the_peer() {
        let o = opts(&[
            "--size",
            "1024",
            "--batch",
            "1",
            "--op",
            "write",
            "--rounds",
            "1",
            "--tools",
            "nixl,nixl-on-gdr",
        ]);
        let case = &cases(&o)[0];
        let run = |tool: &str, gbps: &str| {
            format!(
                "{}\n### {tool} round=1\nresult gbit_s={gbps} bytes=1 seconds=1 batches=1\n\
                 digest side=initiator value=ab blocks=1 block_size=1024\n\
                 target: digest side=target value=ab blocks=1 block_size=1024\n\
                 ### pkts sent=1\n### end rc=0 server_rc=0\n",
                case.marker()
            )
        };
        let text = [run("nixl", "0.1"), run("nixl-on-gdr", "0.45")].concat();
        let runs = parse(&text, case);
        assert_eq!(
            runs.iter().find(|r| r.tool == "nixl-on-gdr").unwrap().gbps,
            Some(0.45)
        );
        let (table, row, failures) = summarize(&runs, case, &o);
        assert!(failures.is_empty(), "{failures:?}");
        // Not a peer: the best peer is NIXL itself, and the drop-in gets its own ratios.
        assert_eq!(row.best.as_deref(), Some("nixl"));
        assert!((row.variants_vs_best["nixl-on-gdr"] - 4.5).abs() < 1e-9);
        assert!(
            table.contains("nixl-on-gdr/nixl, paired: 4.5000"),
            "{table}"
        );
    }

    #[test]
    fn a_gdr_variant_runs_beside_gdr_with_its_own_ratio_and_a_bad_one_is_refused() {
        let o = opts(&[
            "--size",
            "65536",
            "--batch",
            "256",
            "--op",
            "write",
            "--rounds",
            "1",
            "--tools",
            "gdr,mooncake",
            "--gdr-variant",
            "poll0=--busy-poll-us 0",
            "--gdr-variant",
            "q4=-q 4",
        ]);
        assert_eq!(columns(&o), ["gdr", "gdr-poll0", "gdr-q4", "mooncake"]);
        assert_eq!(o.gdr_variants[0].args, "--busy-poll-us 0");
        let case = &cases(&o)[0];
        let gdr = |tool: &str, gbit: &str| {
            format!(
                "### {tool} round=1\n65536,256,10,0.05,{gbit},1\n\
                 xfer-bench: digest 0xaa over 512 blocks of 65536 B\n\
                 target: xfer-bench target: digest 0xaa over 512 blocks of 65536 B\n\
                 ### pkts sent=10\n### end rc=0 server_rc=0\n"
            )
        };
        let text = [
            gdr("gdr", "0.4000"),
            gdr("gdr-poll0", "0.5000"),
            gdr("gdr-q4", "0.1000"),
            "### mooncake round=1\nresult gbit_s=0.250000 bytes=83886080 seconds=4.0 batches=5\n\
             digest side=initiator value=be blocks=512 block_size=65536\n\
             target: digest side=target value=be blocks=512 block_size=65536\n\
             ### pkts sent=10\n### end rc=0 server_rc=0\n"
                .to_string(),
        ]
        .concat();
        let runs = parse(&text, case);
        assert_eq!(runs.len(), 4);
        assert_eq!(runs[1].tool, "gdr-poll0");
        assert_eq!(runs[1].gbps, Some(0.5));
        assert_eq!(runs[2].check, Check::Equal);
        let (table, row, failures) = summarize(&runs, case, &o);
        assert!(failures.is_empty(), "{failures:?}");
        // The best peer is a peer, never a variant of gdr.
        assert_eq!(row.best.as_deref(), Some("mooncake"));
        assert!((row.vs_best.unwrap() - 1.6).abs() < 1e-9);
        assert!((row.variants_vs_best["gdr-poll0"] - 2.0).abs() < 1e-9);
        assert!((row.variants_vs_best["gdr-q4"] - 0.4).abs() < 1e-9);
        assert!(
            table.contains("gdr-q4/best peer, paired: 0.4000"),
            "{table}"
        );
        let sum = summary_table(&[(case.clone(), row)], &o);
        assert!(sum.contains("poll0/best"), "{sum}");
        assert!(
            sum.contains("1.6000  mooncake      ok           2.0000       0.4000"),
            "{sum}"
        );
        // A missing variant run is a failure, as a missing tool's is.
        let (_, _, failures) = summarize(&runs[..2], case, &o);
        assert!(
            failures.iter().any(|f| f.contains("gdr-q4 has 0 runs")),
            "{failures:?}"
        );
        // A run without its packet count is a failure: it may not have crossed the device.
        let uncounted = text.replacen("### pkts sent=10\n", "", 1);
        let (_, _, failures) = summarize(&parse(&uncounted, case), case, &o);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].contains("gdr round 1: no packet count"),
            "{failures:?}"
        );
        for bad in ["noequals", "Poll=-q 4", "=x", "x=--a '1'", "x=$(id)"] {
            assert!(
                Cli::try_parse_from(["x", "--gdr-variant", bad]).is_err(),
                "{bad}"
            );
        }
    }

    /// The drivers' shared workload in Python (`peers/test_bench_common.py`): the warm-up moves
    /// every block range even when one submission outlasts the timed part, a block that never
    /// moved fails the data check by name, and the lines this module parses. Debian's python3
    /// with python3-numpy (`cargo xtask setup`), not whatever `python3` comes first on PATH.
    #[test]
    fn the_peer_drivers_pass_their_tests() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/peers");
        let out = std::process::Command::new("/usr/bin/python3")
            .args(["-B", "test_bench_common.py"])
            .current_dir(&dir)
            .output()
            .expect("/usr/bin/python3 runs (cargo xtask setup installs it)");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        assert!(
            text.contains("Ran 4 tests") && text.contains("\nOK"),
            "{text}"
        );
    }
}
