//! Two processes on one RDMA device: the `rdma_write` example as server and client, and a peer
//! process killed in the middle of a stream. Run in the Soft-RoCE VM by `cargo xtask test`.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gdr::connect::{self, TcpLink};
use gdr::cq::{CompletionQueue, WcStatus};
use gdr::device::Context;
use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::wr::SendRequest;

use gdr_test_support::{addr, device, example};

fn server(port: u16, extra: &[&str]) -> Child {
    Command::new(example("rdma_write"))
        .args([
            "--server",
            "--port",
            &port.to_string(),
            "--device",
            &device(),
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE and its IP in GDR_TEST_ADDR (cargo xtask test)"]
fn rdma_write_example_between_two_processes() {
    let port = 18601;
    let srv = server(port, &["--size", "65536"]);
    let client = Command::new(example("rdma_write"))
        .args([
            "--connect",
            &addr(),
            "--port",
            &port.to_string(),
            "--device",
            &device(),
        ])
        .args(["--size", "65536", "--iters", "10"])
        .output()
        .unwrap();
    let srv = srv.wait_with_output().unwrap();
    let (c, s) = (text(&client), text(&srv));
    assert!(client.status.success(), "client failed:\n{c}\nserver:\n{s}");
    assert!(srv.status.success(), "server failed:\n{s}");
    assert!(
        s.contains("server: verified 65536 bytes written by 10 RDMA writes: OK"),
        "{s}"
    );
    assert!(
        c.contains("client: wrote 655360 bytes in 10 RDMA writes of 65536 bytes"),
        "{c}"
    );
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (cargo xtask test); the VM has no GPU"]
fn rdma_write_gpu_without_cuda_stops_with_a_clear_error() {
    let out = Command::new(example("rdma_write"))
        .args([
            "--server",
            "--port",
            "18602",
            "--device",
            &device(),
            "--gpu",
        ])
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("rdma_write: CUDA driver unavailable"), "{t}");
    assert!(t.contains("hint:"), "{t}");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE and its IP in GDR_TEST_ADDR (cargo xtask test)"]
fn peer_process_killed_mid_stream_gives_an_error_completion_not_a_hang() {
    let port = 18603;
    let size = 4096usize;
    let mut srv = server(port, &["--size", &size.to_string()]);
    let ctx = Context::open(&device()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 64).unwrap();
    // ACK timeout 4.096 us * 2^12 = 17 ms, 3 retries: the failure must surface in well under a second
    // on hardware; Soft-RoCE's timers are coarser, so the bound below is generous.
    let qp = QueuePair::builder(&pd, &cq, &cq)
        .timeout(12)
        .retry_count(3)
        .build()
        .unwrap();
    let mr = MemoryRegion::new(&pd, size, AccessFlags::LOCAL_WRITE).unwrap();
    let mut link = TcpLink::connect((addr().as_str(), port), Duration::from_secs(20)).unwrap();
    let peer = connect::handshake(&mut link, &qp, &[]).unwrap();
    let remote = peer.regions[0].slice(..size as u64).unwrap();
    let local = [mr.slice(..).unwrap()];
    for i in 0..5 {
        qp.post_send(&SendRequest::write(&local, remote).id(i))
            .unwrap();
        assert!(
            cq.wait_for(1, Duration::from_secs(10)).unwrap()[0].is_ok(),
            "write {i} before the kill"
        );
    }
    srv.kill().unwrap();
    srv.wait().unwrap();
    let t = Instant::now();
    let mut failure = None;
    for i in 5..10_000u64 {
        qp.post_send(&SendRequest::write(&local, remote).id(i))
            .unwrap();
        let c = cq
            .wait_for(1, Duration::from_secs(30))
            .expect("an error completion within 30 s, not a hang")[0];
        if !c.is_ok() {
            failure = Some(c);
            break;
        }
    }
    let c = failure.expect("writes to a killed peer kept succeeding");
    assert_eq!(c.status, WcStatus::RetryExceeded, "{c:?}");
    assert!(c
        .result()
        .unwrap_err()
        .to_string()
        .contains("is the peer process alive"));
    eprintln!(
        "error completion {:?} {:.2} s after the kill",
        c.status,
        t.elapsed().as_secs_f64()
    );
    assert!(t.elapsed() < Duration::from_secs(30));
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE, run as root to drop privileges (cargo xtask test)"]
fn locked_memory_limit_too_small_gives_the_memlock_hint() {
    // Root may pin without limit (CAP_IPC_LOCK), so run the example as `nobody` with a typical
    // distribution default of 8 MiB and ask for a 64 MiB region.
    let out = Command::new("prlimit")
        .args([
            "--memlock=8388608",
            "--",
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(example("rdma_write"))
        .args([
            "--server",
            "--port",
            "18604",
            "--device",
            &device(),
            "--size",
            "67108864",
        ])
        .output()
        .expect("prlimit and setpriv (util-linux) run the example");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("ibv_reg_mr(device="), "{t}");
    assert!(t.contains("len=67108864"), "{t}");
    assert!(t.contains("the locked-memory limit is 8192 KiB"), "{t}");
    assert!(t.contains("ulimit -l unlimited"), "{t}");
    eprintln!("{t}");
}
