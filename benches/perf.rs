//! `cargo bench`: write bandwidth and latency, in-process, between two queue pairs of one process
//! on the device named by `GDR_TEST_DEVICE` (GID index `GDR_TEST_GID_INDEX`). `cargo xtask bench`
//! runs it in the Soft-RoCE VM. Prints perftest-like tables; fails with a clear message when
//! there is no device.
//!
//! Environment: `GDR_BENCH_ITERS` (bandwidth messages per size, default 1000),
//! `GDR_BENCH_LAT_ITERS` (round trips, default 1000), `GDR_BENCH_SIZES` (comma-separated).

use gdr::cq::Completion;
use gdr_tools::perf::engine::{self, BwState};
use gdr_tools::perf::loopback::{device_from_env, Loopback};
use gdr_tools::perf::params::{self, Limit, Op, Test};
use gdr_tools::perf::report::{self, BwRow, LatRow};
use gdr_tools::perf::stats;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench` (and maybe a filter); this harness measures everything.
    if let Err(e) = bench() {
        eprintln!("bench perf: {e}");
        std::process::exit(1);
    }
}

fn bench() -> Result<(), String> {
    let (dev, gid) = device_from_env()?;
    let iters = env_num("GDR_BENCH_ITERS", 1000);
    let lat_iters = env_num("GDR_BENCH_LAT_ITERS", 1000);
    let sizes: Vec<usize> = match std::env::var("GDR_BENCH_SIZES") {
        Ok(s) => s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .map_err(|_| format!("GDR_BENCH_SIZES: {x:?} is not a size"))
            })
            .collect::<Result<_, _>>()?,
        Err(_) => vec![2, 4096, 65536, 1 << 20],
    };
    let (tx_depth, cq_mod) = (128u32, 100u32);
    let max = sizes.iter().copied().max().unwrap_or(64);
    let lb = Loopback::open(&dev, gid, tx_depth, max)
        .map_err(|e| format!("opening {dev} for two in-process queue pairs: {e}"))?;

    println!(
        "write bandwidth, {dev}, 1 QP, tx depth {tx_depth}, cq moderation {cq_mod}, automatic post list, in-process"
    );
    print!("{}", report::table::column_header(Test::Bw, true));
    let mut wc = [Completion::default(); 32];
    let mut st = BwState::default();
    for &size in &sizes {
        let flows = [lb.flow_a(size).map_err(|e| e.to_string())?];
        let run = engine::bw_active(
            &lb.cq_a,
            &flows,
            Op::Write,
            Limit::Iters(iters),
            tx_depth,
            cq_mod,
            params::auto_post_list(size),
            &mut st,
            &mut wc,
        )
        .map_err(|e| format!("write bandwidth, {size} B: {e}"))?;
        let (posted, completed) = run.timeline(&st);
        let bw = stats::bandwidth(size, &posted, &completed, cq_mod as usize);
        print!(
            "{}",
            report::table::bw_line(&BwRow::new(size, run.messages, bw), true)
        );
    }

    println!();
    println!("write latency (ping-pong polling the last byte), {dev}, in-process");
    print!("{}", report::table::column_header(Test::Lat, true));
    for &size in sizes.iter().filter(|&&s| s <= 65536) {
        let (a, b) = lb
            .ping_pong(size, cq_mod, tx_depth)
            .map_err(|e| e.to_string())?;
        let mut samples = Vec::with_capacity(lat_iters as usize + 1);
        std::thread::scope(|s| -> Result<(), String> {
            let answer = s.spawn(|| {
                let mut wc = [Completion::default(); 32];
                let mut scratch = Vec::with_capacity(lat_iters as usize + 1);
                let mut req = b.prepare(None)?;
                b.run(&mut req, lat_iters, false, 0, &mut scratch, &mut wc)
            });
            let mut wc = [Completion::default(); 32];
            let mine = a
                .prepare(None)
                .and_then(|mut req| a.run(&mut req, lat_iters, true, 0, &mut samples, &mut wc));
            let theirs = answer
                .join()
                .map_err(|_| "the answering thread panicked".to_string())?;
            mine.and(theirs)
                .map_err(|e| format!("latency, {size} B: {e}"))
        })?;
        let l = stats::latency(&mut samples);
        print!(
            "{}",
            report::table::lat_line(&LatRow::new(size, lat_iters, l))
        );
    }
    Ok(())
}
