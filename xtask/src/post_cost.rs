//! `cargo xtask post-cost`: the engine's own instructions per posted block, counted with
//! callgrind in the Soft-RoCE VM (`benches/xfer_post_cost.rs`: a paged WRITE of N scattered
//! 16 KiB blocks, nothing merges). The provider's `ibv_post_send` is subtracted: the inclusive
//! cost of `librxe-rdmav34.so`'s entry (its own instructions and the `memcpy` it calls), and,
//! for comparison with earlier runs, only librxe's own instructions. Counts are reported, never
//! asserted (the target is 240 per block). `--annotate N` also prints callgrind's N most
//! expensive functions, own and inclusive, to show where the instructions go.

use crate::vm::{self, shell_quote, VmOpts};
use crate::{cargo, say, Result};

/// Options of `cargo xtask post-cost`.
#[derive(clap::Args, Debug, Clone)]
pub struct PostCostOpts {
    #[command(flatten)]
    pub vm: VmOpts,
    /// Block counts to measure, comma-separated (100,000: the target's shape; 18,880:
    /// Llama-70B at TP8 through vLLM's NIXL connector).
    #[arg(long, default_value = "100000,18880")]
    pub blocks: String,
    /// Measure the layer-aware form instead (`Peer::transfer_pools`): each count's blocks
    /// spread over this many pools (64: 32 layers x K and V; `--blocks 128000 --pools 64` is
    /// 2,000 blocks per pool).
    #[arg(long, default_value_t = 1)]
    pub pools: u64,
    /// Also print where the instructions go: callgrind's N most expensive functions, by their
    /// own (exclusive) and by their inclusive cost, for each count (0: none).
    #[arg(long, default_value_t = 0)]
    pub annotate: usize,
}

/// Callgrind's toggles: the submission and wait, the progress thread's completion handling
/// and its periodic tick (which posts as room frees).
const TOGGLES: &str = "--toggle-collect='*measured*' --toggle-collect='*on_send_completion*' \
                       --toggle-collect='*Connection::tick*'";

pub fn post_cost(opts: &PostCostOpts) -> Result<i32> {
    let meta = cargo::metadata()?;
    say!("building: cargo bench --bench xfer_post_cost --no-run");
    let built = cargo::build(&["bench", "--bench", "xfer_post_cost", "--no-run"])?;
    let exe = built
        .iter()
        .find(|a| a.kind == "bench" && a.name == "xfer_post_cost")
        .ok_or("cargo built no `xfer_post_cost` bench executable")?;
    std::env::set_current_dir(&meta.root).map_err(|e| e.to_string())?;
    let counts: Vec<u64> = opts
        .blocks
        .split(',')
        .map(|b| {
            b.trim()
                .parse::<u64>()
                .map_err(|e| format!("--blocks {b:?}: {e}"))
        })
        .collect::<Result<_>>()?;
    let bin = shell_quote(&exe.executable.to_string_lossy());
    let pools = opts.pools.max(1);
    let mut script = String::from("cd /tmp\n");
    for n in &counts {
        script.push_str(&format!(
            "XFER_POOLS={pools} XFER_BLOCKS={n} valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.{n} {TOGGLES} {bin} > /tmp/run.{n} 2>&1 || {{ cat /tmp/run.{n}; exit 1; }}\n\
             grep '^blocks=' /tmp/run.{n}\n\
             total=$(callgrind_annotate --inclusive=no /tmp/cg.{n} | awk '/PROGRAM TOTALS/ {{gsub(\",\",\"\",$1); print $1}}')\n\
             own=$(callgrind_annotate --inclusive=no /tmp/cg.{n} | awk '/librxe-rdmav34/ {{gsub(\",\",\"\",$1); s+=$1}} END {{print s+0}}')\n\
             incl=$(callgrind_annotate --inclusive=yes /tmp/cg.{n} | awk '/librxe-rdmav34/ {{gsub(\",\",\"\",$1); if ($1+0 > m) m=$1+0}} END {{print m+0}}')\n\
             echo \"post-cost blocks={n} total=$total provider_inclusive=$incl provider_own=$own\"\n"
        ));
        if opts.annotate > 0 {
            let lines = opts.annotate + 20;
            script.push_str(&format!(
                "echo '== {n} blocks: own cost by function =='\n\
                 callgrind_annotate --inclusive=no /tmp/cg.{n} | head -n {lines}\n\
                 echo '== {n} blocks: inclusive cost by function =='\n\
                 callgrind_annotate --inclusive=yes /tmp/cg.{n} | head -n {lines}\n"
            ));
        }
    }
    let outcome = vm::boot_ok(&opts.vm, &script, "the measurement")?;
    println!(
        "blocks    total Ir   ibv_post_send (incl.)   per block   librxe own only   per block"
    );
    for line in outcome.output.lines() {
        let Some(rest) = line.trim().strip_prefix("post-cost ") else {
            continue;
        };
        let field = |k: &str| -> u64 {
            rest.split_whitespace()
                .find_map(|f| f.strip_prefix(k).and_then(|v| v.parse().ok()))
                .unwrap_or(0)
        };
        let (n, total, incl, own) = (
            field("blocks="),
            field("total="),
            field("provider_inclusive="),
            field("provider_own="),
        );
        let per = |sub: u64| total.saturating_sub(sub) as f64 / n.max(1) as f64;
        println!(
            "{n:>7} {total:>11} {incl:>23} {:>11.1} {own:>17} {:>11.1}",
            per(incl),
            per(own)
        );
    }
    Ok(0)
}
