//! Metrics (feature `metrics`) scraped from a real Prometheus exporter over HTTP, after real
//! transfers: counters by outcome, bytes, durations, and the rails.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use gdr_test_support::xfer::{agent, connected};
use gdr_xfer::{Desc, TransferOptions};

const WAIT: Duration = Duration::from_secs(60);

/// `GET /metrics` from the exporter at `addr`.
fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("the exporter listens");
    s.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// The value of the first sample of `name` whose labels contain every one of `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn transfers_and_rails_are_scraped_by_prometheus() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(([127, 0, 0, 1], port))
        .install()
        .expect("the exporter starts");
    let (a, b, pb, _pa) = connected(agent("metrics-a"), agent("metrics-b"));
    let len = 1 << 20;
    let src = a.alloc_host(len, "src").unwrap();
    let _dst = b.alloc_host(len, "dst").unwrap();
    let r = pb.wait_segment_named("dst", WAIT).unwrap();
    // Ten writes of 64 KiB that succeed, one that is cancelled before it can finish.
    for i in 0..10u64 {
        pb.write(
            &[Desc::new(&src, i * 65536, r.id, i * 65536, 65536)],
            &TransferOptions::new(),
        )
        .unwrap()
        .wait(WAIT)
        .unwrap();
    }
    let t = pb
        .write(
            &[Desc::new(&src, 0, r.id, 0, len as u64)],
            &TransferOptions::new(),
        )
        .unwrap();
    t.cancel();
    let cancelled = t.wait(WAIT).is_err();
    // The rails are exported once a second by the progress thread's timers: wait for an
    // export after the writes.
    let end = Instant::now() + WAIT;
    let text = loop {
        let text = scrape(&addr);
        let rail = sample(&text, "gdr_xfer_rail_bytes_total", &["peer=\"metrics-b\""]);
        if rail.is_some_and(|v| v >= 10.0 * 65536.0) || Instant::now() > end {
            break text;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!(
        "{}",
        text.lines()
            .filter(|l| l.contains("gdr_xfer_") && !l.starts_with('#'))
            .take(24)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let peer = "peer=\"metrics-b\"";
    let ok = sample(
        &text,
        "gdr_xfer_transfers_total",
        &[peer, "op=\"write\"", "outcome=\"ok\""],
    );
    assert!(ok.is_some_and(|v| v >= 10.0), "ok transfers: {ok:?}");
    if cancelled {
        let c = sample(
            &text,
            "gdr_xfer_transfers_total",
            &[peer, "outcome=\"cancelled\""],
        );
        assert_eq!(c, Some(1.0));
    }
    let bytes = sample(&text, "gdr_xfer_bytes_total", &[peer, "op=\"write\""]);
    assert!(
        bytes.is_some_and(|v| v >= 10.0 * 65536.0),
        "bytes: {bytes:?}"
    );
    let count = sample(
        &text,
        "gdr_xfer_transfer_duration_seconds_count",
        &["op=\"write\""],
    );
    assert!(count.is_some_and(|v| v >= 10.0), "durations: {count:?}");
    assert!(sample(
        &text,
        "gdr_xfer_plan_duration_seconds_count",
        &["op=\"write\""]
    )
    .is_some());
    let rail = sample(&text, "gdr_xfer_rail_bytes_total", &[peer, "rail=\"0\""]);
    assert!(
        rail.is_some_and(|v| v >= 10.0 * 65536.0),
        "rail bytes: {rail:?}"
    );
    assert_eq!(
        sample(&text, "gdr_xfer_rail_active", &[peer, "rail=\"0\""]),
        Some(1.0)
    );
}
