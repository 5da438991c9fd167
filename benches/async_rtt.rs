//! Awaited completions against busy polling: 2-byte RDMA writes, one at a time, each waited for
//! until its completion, between two queue pairs of one process on `GDR_TEST_DEVICE`.
//!
//! Blocking: `post_send` then `CompletionQueue::wait_for` spinning on a queue without a channel
//! (what `gdr lat` and perftest do). Async: `AsyncCompletionQueue::post_send(..).await` on a
//! current-thread tokio runtime, which sleeps on the completion channel. Both report wall time
//! and CPU time (user + system, the whole process) per write: the point of awaiting is to give
//! the core back while the NIC works.
//!
//! ```text
//! cargo bench --features tokio --bench async_rtt                 # needs GDR_TEST_DEVICE
//! cargo xtask vm -- target/release/deps/async_rtt-<hash>        # in the Soft-RoCE VM
//! ```
//! `GDR_BENCH_ITERS` (default 5000) writes per mode, three rounds alternating the modes.

use std::time::{Duration, Instant};

use gdr::aio::AsyncCompletionQueue;
use gdr::{
    AccessFlags, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair, SendRequest,
};

/// User plus system CPU time of the process so far.
fn cpu_time() -> Duration {
    // SAFETY: an all-zero rusage is valid and getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to an rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

struct Sample {
    wall: Duration,
    cpu: Duration,
}

fn per_op(s: &Sample, n: u64) -> (f64, f64) {
    (
        s.wall.as_secs_f64() * 1e6 / n as f64,
        s.cpu.as_secs_f64() * 1e6 / n as f64,
    )
}

fn main() {
    if let Err(e) = bench() {
        eprintln!("bench async_rtt: {e}");
        std::process::exit(1);
    }
}

fn bench() -> gdr::Result<()> {
    let device = std::env::var("GDR_TEST_DEVICE").map_err(|_| {
        gdr::Error::invalid(
            "GDR_TEST_DEVICE is not set",
            "name an RDMA device (cargo xtask vm runs this inside the Soft-RoCE VM with rxe0)",
        )
    })?;
    let iters: u64 = std::env::var("GDR_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let ctx = Context::open(&device)?;
    let pd = ProtectionDomain::new(&ctx)?;
    let peer_cq = CompletionQueue::new(&ctx, 64)?;
    let peer = QueuePair::builder(&pd, &peer_cq, &peer_cq).build()?;
    let dst = MemoryRegion::new(&pd, 64, AccessFlags::remote_rw())?;
    let remote = dst.remote().slice(0..2)?;

    // Blocking: a queue without a channel, spun on.
    let spin_cq = CompletionQueue::new(&ctx, 64)?;
    let spin_qp = QueuePair::builder(&pd, &spin_cq, &spin_cq).build()?;
    // Async: a queue with a channel.
    let chan_cq = CompletionQueue::with_channel(&ctx, 64)?;
    let async_qp = QueuePair::builder(&pd, &chan_cq, &chan_cq).build()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| gdr::Error::io("building the tokio runtime", e))?;
    let acq = {
        let _g = rt.enter();
        AsyncCompletionQueue::new(&chan_cq)?
    };

    let connect = |qp: &gdr::QueuePair| -> gdr::Result<()> {
        qp.reset()?;
        peer.reset()?;
        qp.connect(&peer.endpoint())?;
        peer.connect(&qp.endpoint())
    };

    let blocking = |n: u64| -> gdr::Result<Sample> {
        connect(&spin_qp)?;
        let req = SendRequest::write_inline(b"hi", remote);
        let (t0, c0) = (Instant::now(), cpu_time());
        for _ in 0..n {
            spin_qp.post_send(&req)?;
            spin_cq.wait_for(1, Duration::from_secs(10))?[0].result()?;
        }
        Ok(Sample {
            wall: t0.elapsed(),
            cpu: cpu_time() - c0,
        })
    };
    let awaited = |n: u64| -> gdr::Result<Sample> {
        connect(&async_qp)?;
        let req = SendRequest::write_inline(b"hi", remote);
        rt.block_on(async {
            let (t0, c0) = (Instant::now(), cpu_time());
            for _ in 0..n {
                acq.post_send(&async_qp, &req)?.await?;
            }
            Ok(Sample {
                wall: t0.elapsed(),
                cpu: cpu_time() - c0,
            })
        })
    };

    // Warm-up, then three rounds alternating which mode goes first.
    blocking(200)?;
    awaited(200)?;
    println!("2-byte writes, each awaited until its completion, {iters} per round, on {device}");
    println!(
        "{:<10} {:>6} {:>12} {:>12} {:>10}",
        "mode", "round", "wall us/op", "cpu us/op", "cpu/wall"
    );
    let (mut bw, mut bc, mut aw, mut ac) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        let (b, a) = if round % 2 == 0 {
            let b = blocking(iters)?;
            (b, awaited(iters)?)
        } else {
            let a = awaited(iters)?;
            (blocking(iters)?, a)
        };
        for (name, s, w, c) in [
            ("blocking", &b, &mut bw, &mut bc),
            ("awaited", &a, &mut aw, &mut ac),
        ] {
            let (wall, cpu) = per_op(s, iters);
            println!(
                "{name:<10} {round:>6} {wall:>12.2} {cpu:>12.2} {:>10.2}",
                cpu / wall
            );
            w.push(wall);
            c.push(cpu);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (bw, bc, aw, ac) = (
        median(&mut bw),
        median(&mut bc),
        median(&mut aw),
        median(&mut ac),
    );
    println!(
        "median: blocking {bw:.2} us wall / {bc:.2} us cpu per write; awaited {aw:.2} us wall / {ac:.2} us cpu; awaited/blocking wall {:.3}, cpu {:.3}",
        aw / bw,
        ac / bc
    );
    Ok(())
}
