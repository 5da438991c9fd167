//! `gdr bw` and `gdr lat`: argument handling (host), the two-process runs with `--json` and the
//! server's verification (Soft-RoCE VM), the clear error for GPU memory on a host without a GPU,
//! and zero heap allocations per posted request in the measurement loops (in-process, counted by
//! a global allocator).
//!
//! Device tests are `#[ignore]`d on the host; `cargo xtask test` runs them in the VM, where
//! `GDR_TEST_DEVICE`, `GDR_TEST_GID_INDEX` and `GDR_TEST_ADDR` are set. They fail loudly when
//! the device is missing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gdr::cq::Completion;
use gdr_tools::perf::engine::{self, BwState};
use gdr_tools::perf::loopback::{device_from_env, Loopback};
use gdr_tools::perf::params::{Limit, Op};

// ---------------------------------------------------------------------------------------------
// Counting allocator: counts allocations made by threads that switched counting on.

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note_alloc() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to the system allocator with the caller's arguments unchanged;
// the only addition is a relaxed counter increment, which neither allocates nor touches memory
// the allocator hands out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: forwarded contract of GlobalAlloc::alloc.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: forwarded contract of GlobalAlloc::alloc_zeroed.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc();
        // SAFETY: forwarded contract of GlobalAlloc::realloc.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract of GlobalAlloc::dealloc.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` with allocation counting on for this thread; returns its result and the count.
fn counted<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, ALLOCATIONS.load(Ordering::Relaxed) - before)
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn gdr() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gdr"))
}

fn run(args: &[&str]) -> Output {
    gdr().args(args).output().expect("running gdr")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct Vm {
    device: String,
    gid: String,
    addr: String,
}

fn vm() -> Vm {
    let var = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| {
            panic!("{k} is not set: this test needs the Soft-RoCE VM (run `cargo xtask test`)")
        })
    };
    Vm {
        device: var("GDR_TEST_DEVICE"),
        gid: var("GDR_TEST_GID_INDEX"),
        addr: var("GDR_TEST_ADDR"),
    }
}

fn wait_with_timeout(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("waiting for gdr").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collecting gdr");
            panic!(
                "gdr did not finish within {limit:?}; stdout:\n{}\nstderr:\n{}",
                text(&out.stdout),
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("collecting gdr")
}

/// Runs `gdr <sub> --server` and `gdr <sub> ADDR` with `client_args` and `--json` on both;
/// returns both parsed documents.
fn server_and_client(
    sub: &str,
    port: &str,
    client_args: &[&str],
) -> (serde_json::Value, serde_json::Value) {
    let v = vm();
    let common = [
        "-d",
        v.device.as_str(),
        "-x",
        v.gid.as_str(),
        "-p",
        port,
        "--json",
    ];
    let server = gdr()
        .arg(sub)
        .arg("--server")
        .args(common)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the server");
    let client = gdr()
        .arg(sub)
        .arg(&v.addr)
        .args(common)
        .args(client_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the client");
    let c = wait_with_timeout(client, Duration::from_secs(120));
    let s = wait_with_timeout(server, Duration::from_secs(30));
    assert!(
        c.status.success() && s.status.success(),
        "client {:?}: {}\nserver {:?}: {}",
        c.status,
        text(&c.stderr),
        s.status,
        text(&s.stderr)
    );
    let parse = |o: &Output, who: &str| -> serde_json::Value {
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{who} printed no JSON ({e}): {}", text(&o.stdout)))
    };
    (parse(&s, "server"), parse(&c, "client"))
}

// ---------------------------------------------------------------------------------------------
// Host tests: argument handling (no device needed: they stop before opening one).

#[test]
fn help_lists_the_perftest_options() {
    for sub in ["bw", "lat"] {
        let out = run(&[sub, "--help"]);
        assert!(out.status.success());
        let help = text(&out.stdout);
        for opt in [
            "--server",
            "--size",
            "--all",
            "--iters",
            "--duration",
            "--tx-depth",
            "--cq-mod",
            "--device",
            "--gid-index",
            "--port",
            "--use-cuda",
            "--cuda-path",
            "--report-gbits",
            "--json",
            "--csv",
            "--plot",
        ] {
            assert!(help.contains(opt), "gdr {sub} --help lacks {opt}");
        }
    }
    let bw_help = text(&run(&["bw", "--help"]).stdout);
    assert!(bw_help.contains("--qps") && bw_help.contains("--post-list"));
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["bw"][..],                               // neither server nor address
        &["bw", "host", "-a", "-s", "4096"],       // sweep and one size
        &["bw", "host", "-n", "10", "-D", "2"],    // iterations and duration
        &["bw", "host", "--op", "atomic"],         // unknown operation
        &["lat", "host", "--cuda-path", "dmabuf"], // path without --use-cuda
        &["bw", "host", "--json", "--csv"],        // two output forms
        &["bw", "--server", "host"],               // server with an address
    ] {
        let out = run(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "gdr {args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn invalid_combinations_are_refused_before_any_device_is_opened() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["bw", "host", "-l", "33"],
            "--post-list 33 is outside 1..=32",
        ),
        (
            &["bw", "host", "-l", "16", "-t", "8"],
            "--post-list 16 is outside 1..=8",
        ),
        (&["bw", "host", "-D", "0"], "--duration 0 is outside"),
        (&["bw", "host", "-n", "0"], "--iters must be at least 1"),
        (&["bw", "host", "-q", "0"], "--qps 0"),
        (&["bw", "host", "--cq-mod", "0"], "--cq-mod"),
    ];
    for (args, want) in cases {
        let out = run(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "gdr {args:?}: {err}");
        assert!(
            err.contains(want),
            "gdr {args:?}: expected {want:?} in {err:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Device tests (Soft-RoCE VM).

#[test]
#[ignore = "needs an RDMA device (GDR_TEST_DEVICE); run by `cargo xtask test` in the Soft-RoCE VM"]
fn bw_server_and_client_agree_and_verify() {
    // write with the automatic post list (reported as 0) and with one request per doorbell.
    for (op, port, list) in [
        ("write", "18601", "0"),
        ("write", "18605", "1"),
        ("read", "18602", "0"),
        ("send", "18603", "0"),
    ] {
        let mut args = vec!["--op", op, "-s", "4096", "-n", "300"];
        if list != "0" {
            args.extend(["-l", list]);
        }
        let (server, client) = server_and_client("bw", port, &args);
        for (who, doc) in [("server", &server), ("client", &client)] {
            assert_eq!(doc["test"], "bw", "{who}");
            assert_eq!(doc["op"], op, "{who}");
            assert_eq!(doc["post_list"].to_string(), list, "{who}");
            assert_eq!(doc["role"], who);
            assert_eq!(doc["verified"], true, "{who} {op}: {}", doc["failures"]);
            let row = &doc["results"][0];
            assert_eq!(row["bytes"], 4096, "{who}");
            assert_eq!(row["iterations"], 300, "{who}");
            assert!(
                row["bw_avg_mib_s"].as_f64().unwrap() > 0.0,
                "{who} {op}: {row}"
            );
            assert!(
                row["bw_peak_mib_s"].as_f64().unwrap() >= row["bw_avg_mib_s"].as_f64().unwrap()
            );
            assert!(row["msg_rate_mpps"].as_f64().unwrap() > 0.0);
        }
        assert_eq!(
            server["results"], client["results"],
            "both sides print the same rows"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device (GDR_TEST_DEVICE); run by `cargo xtask test` in the Soft-RoCE VM"]
fn bw_sweep_with_two_qps_writes_a_plot() {
    let plot = std::env::temp_dir().join(format!("gdr-bw-{}.svg", std::process::id()));
    let plot_arg = plot.to_string_lossy().into_owned();
    let (_, client) = server_and_client(
        "bw",
        "18604",
        &["-q", "2", "-s", "65536", "-n", "200", "--plot", &plot_arg],
    );
    assert_eq!(client["qps"], 2);
    assert_eq!(client["results"][0]["iterations"], 200, "per queue pair");
    let svg = std::fs::read_to_string(&plot).expect("the plot was written");
    assert!(svg.starts_with("<svg") && svg.contains("message rate [Mpps]"));
    let _ = std::fs::remove_file(plot);
}

#[test]
#[ignore = "needs an RDMA device (GDR_TEST_DEVICE); run by `cargo xtask test` in the Soft-RoCE VM"]
fn lat_server_and_client_agree_and_verify() {
    for (op, port) in [("write", "18611"), ("send", "18612"), ("read", "18613")] {
        for size in ["2", "4096"] {
            let (server, client) =
                server_and_client("lat", port, &["--op", op, "-s", size, "-n", "200"]);
            for (who, doc) in [("server", &server), ("client", &client)] {
                assert_eq!(doc["test"], "lat", "{who}");
                assert_eq!(
                    doc["verified"], true,
                    "{who} {op} {size}: {}",
                    doc["failures"]
                );
                assert_eq!(doc["write_with_imm"], false);
                let row = &doc["results"][0];
                assert_eq!(row["bytes"].to_string(), size);
                assert_eq!(row["iterations"], 200);
                let (min, typ, max) = (
                    row["t_min_us"].as_f64().unwrap(),
                    row["t_typical_us"].as_f64().unwrap(),
                    row["t_max_us"].as_f64().unwrap(),
                );
                assert!(0.0 < min && min <= typ && typ <= max, "{who}: {row}");
                assert!(row["p99_us"].as_f64().unwrap() <= row["p999_us"].as_f64().unwrap());
            }
        }
    }
}

#[test]
#[ignore = "needs an RDMA device (GDR_TEST_DEVICE); run by `cargo xtask test` in the Soft-RoCE VM"]
fn lat_duration_mode_calibrates_a_count_both_sides_run() {
    for (op, port) in [("write", "18614"), ("send", "18615"), ("read", "18616")] {
        let (server, client) =
            server_and_client("lat", port, &["--op", op, "-s", "64", "-D", "0.2"]);
        for (who, doc) in [("server", &server), ("client", &client)] {
            assert_eq!(doc["verified"], true, "{who} {op}: {}", doc["failures"]);
        }
        let row = &client["results"][0];
        let n = row["iterations"].as_u64().unwrap();
        assert!(n >= 1, "{op}: {row}");
        assert_eq!(
            server["results"], client["results"],
            "{op}: same row on both sides"
        );
        assert!(row["t_typical_us"].as_f64().unwrap() > 0.0, "{op}: {row}");
    }
}

#[test]
#[ignore = "needs an RDMA device (GDR_TEST_DEVICE); run by `cargo xtask test` in the Soft-RoCE VM"]
fn gpu_memory_without_a_gpu_stops_with_the_library_error() {
    let v = vm();
    // The client sets up its memory before it connects: no server needed to see the error.
    let out = run(&[
        "bw",
        &v.addr,
        "-d",
        &v.device,
        "-x",
        &v.gid,
        "-p",
        "18621",
        "--use-cuda",
        "-n",
        "10",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("CUDA"),
        "expected the library's CUDA error, got {err:?}"
    );
}

#[test]
#[ignore = "needs an RDMA device (GDR_TEST_DEVICE); run by `cargo xtask test` in the Soft-RoCE VM"]
fn measurement_loops_allocate_nothing_per_request() {
    let (dev, gid) = device_from_env().unwrap_or_else(|e| panic!("{e}"));
    let lb = Loopback::open(&dev, gid, 128, 65536).expect("opening the device");
    let mut wc = [Completion::default(); 32];
    let mut st = BwState::default();
    for (op, size) in [(Op::Write, 4096), (Op::Read, 4096), (Op::Write, 2)] {
        let flows = [lb.flow_a(size).unwrap()];
        // warm-up: reserves the timestamp vectors.
        engine::bw_active(
            &lb.cq_a,
            &flows,
            op,
            Limit::Iters(1000),
            128,
            100,
            16,
            &mut st,
            &mut wc,
        )
        .unwrap();
        let (run, allocs) = counted(|| {
            engine::bw_active(
                &lb.cq_a,
                &flows,
                op,
                Limit::Iters(1000),
                128,
                100,
                16,
                &mut st,
                &mut wc,
            )
        });
        let run = run.unwrap();
        assert_eq!(run.messages, 1000);
        assert_eq!(
            allocs, 0,
            "{op:?} {size} B: {allocs} allocations in 1000 posts"
        );
    }

    // ping-pong: both sides in threads, each counting its own allocations.
    let (a, b) = lb.ping_pong(64, 100, 128).unwrap();
    let iters = 500;
    std::thread::scope(|s| {
        let answer = s.spawn(|| {
            let mut wc = [Completion::default(); 32];
            let mut samples = Vec::with_capacity(iters as usize + 1);
            let mut req = b.prepare(None).unwrap();
            counted(|| b.run(&mut req, iters, false, 0, &mut samples, &mut wc))
        });
        let mut wc = [Completion::default(); 32];
        let mut samples = Vec::with_capacity(iters as usize + 1);
        let mut req = a.prepare(None).unwrap();
        let (r, allocs) = counted(|| a.run(&mut req, iters, true, 0, &mut samples, &mut wc));
        r.unwrap();
        assert_eq!(samples.len(), iters as usize);
        assert!(samples.iter().all(|&s| s > 0.0));
        assert_eq!(
            allocs, 0,
            "initiator: {allocs} allocations in {iters} round trips"
        );
        let (r, allocs) = answer.join().unwrap();
        r.unwrap();
        assert_eq!(
            allocs, 0,
            "responder: {allocs} allocations in {iters} round trips"
        );
    });
}

#[test]
#[ignore = "needs an RDMA device (GDR_TEST_DEVICE); run by `cargo xtask test` in the Soft-RoCE VM"]
fn bw_duration_mode_drains_and_verifies() {
    // send: a calibration run sets the count the receiver expects.
    for (op, port) in [("write", "18631"), ("read", "18632"), ("send", "18633")] {
        let (server, client) =
            server_and_client("bw", port, &["--op", op, "-D", "0.3", "-s", "65536"]);
        for doc in [&server, &client] {
            assert_eq!(doc["verified"], true, "{op}: {}", doc["failures"]);
            let row = &doc["results"][0];
            assert!(row["iterations"].as_u64().unwrap() > 0, "{op}: {row}");
            assert!(row["bw_avg_mib_s"].as_f64().unwrap() > 0.0, "{op}: {row}");
        }
    }
}
