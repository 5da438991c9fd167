//! `cargo xtask bench`: builds `benches/perf.rs` (release) and runs it in the Soft-RoCE VM,
//! where `GDR_TEST_DEVICE` and `GDR_TEST_GID_INDEX` name rxe0.

use crate::vm::{self, shell_quote, VmOpts};
use crate::{cargo, say, Result};

/// Options of `cargo xtask bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchOpts {
    #[command(flatten)]
    pub vm: VmOpts,
    /// Bandwidth messages per size (GDR_BENCH_ITERS).
    #[arg(long, default_value_t = 1000)]
    pub iters: u64,
    /// Latency round trips per size (GDR_BENCH_LAT_ITERS).
    #[arg(long, default_value_t = 1000)]
    pub lat_iters: u64,
    /// Message sizes, comma-separated (GDR_BENCH_SIZES).
    #[arg(long, default_value = "2,4096,65536,1048576")]
    pub sizes: String,
}

pub fn bench(opts: &BenchOpts) -> Result<i32> {
    let meta = cargo::metadata()?;
    say!("building: cargo bench --bench perf --no-run");
    let built = cargo::build(&["bench", "--bench", "perf", "--no-run"])?;
    let exe = built
        .iter()
        .find(|a| a.kind == "bench" && a.name == "perf")
        .ok_or("cargo built no `perf` bench executable")?;
    std::env::set_current_dir(&meta.root).map_err(|e| e.to_string())?;
    let script = format!(
        "GDR_BENCH_ITERS={} GDR_BENCH_LAT_ITERS={} GDR_BENCH_SIZES={} {} --bench\n",
        opts.iters,
        opts.lat_iters,
        shell_quote(&opts.sizes),
        shell_quote(&exe.executable.to_string_lossy())
    );
    Ok(vm::boot(&opts.vm, &script)?.code)
}
