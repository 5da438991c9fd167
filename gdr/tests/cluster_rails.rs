//! Cluster tier: two hosts, several rails, faults. Every test runs on both hosts at once (the same
//! binary, the same order, `--test-threads=1`); host 1 is the passive side, host 2 the active
//! one. Out-of-band exchanges go over TCP on a rail's addresses (10.78.<rail>.<host>, inside the
//! guests only; `gdr_test_support::cluster` reads them). Run by `cargo xtask test` (or only this
//! tier: `cargo xtask test --cluster-only`), or by hand:
//! `cargo xtask cluster -- target/debug/deps/cluster_rails-* --ignored --test-threads=1`.
//!
//! Tests are named `tN_...` so that libtest's alphabetical order is the order here: `t9` kills
//! host 2 and must come last.
//!
//! Bounds: queue pairs that must fail use `retry_count` 3 and a local ACK timeout exponent of 14
//! (4.096 us * 2^14 = 67 ms): on a real NIC that is (3 + 1) * 67 ms = 268 ms before "retry
//! exceeded". rxe treats a retry count of 7 (gdr's default) as infinite, so the default would
//! hang here; on real NICs 7 means 7 retries (about half a second with timeout 14).

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr::connect::{self, cm, TcpLink};
use gdr::cq::{Completion, CompletionQueue, WcOpcode, WcStatus};
use gdr::device::Context;
use gdr::mr::{AccessFlags, MemoryRegion, RemoteRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::{QpState, QueuePair, QueuePairBuilder};
use gdr::wr::{RecvRequest, SendRequest};

use gdr_test_support::cluster::{addr, device, env, fault, sent_pkts};

const T: Duration = Duration::from_secs(30);
/// How long a host waits for its peer to reach the same test (boot skew, a slower test before).
const MEET: Duration = Duration::from_secs(120);
/// The bound stated for error completions after a rail is cut or a host dies.
const FAIL_BOUND: Duration = Duration::from_secs(20);
/// Local ACK timeout exponent and retry count of the queue pairs that must fail in bounded time.
const ACK_TIMEOUT: u8 = 14;
const RETRIES: u8 = 3;

fn me() -> u32 {
    let h: u32 = env("GDR_HOST_INDEX").parse().unwrap();
    assert_eq!(
        env("GDR_HOSTS"),
        "2",
        "the cluster tests need exactly 2 hosts"
    );
    assert!(h == 1 || h == 2);
    h
}

fn rails() -> u32 {
    env("GDR_RAILS").parse().unwrap()
}

fn gid_index(rail: u32) -> u32 {
    env(&format!("GDR_RAIL{rail}_GID_INDEX")).parse().unwrap()
}

/// The TCP port of test `test` on rail `rail`.
fn port(test: u16, rail: u32) -> u16 {
    18000 + test * 16 + rail as u16
}

/// The out-of-band link of test `test` over rail `rail`'s addresses: host 1 accepts, host 2
/// connects (retrying until host 1 listens).
fn link(test: u16, rail: u32) -> TcpLink {
    let a = addr(1, rail);
    let p = port(test, rail);
    if me() == 1 {
        let l = TcpListener::bind((a.as_str(), p)).unwrap();
        l.set_nonblocking(true).unwrap();
        let end = Instant::now() + MEET;
        loop {
            match l.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    let link = TcpLink::from_stream(s).unwrap();
                    link.set_timeout(Some(MEET)).unwrap();
                    return link;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < end, "host 2 did not connect to {a}:{p}");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("accept on {a}:{p}: {e}"),
            }
        }
    } else {
        let link = TcpLink::connect((a.as_str(), p), MEET).unwrap();
        link.set_timeout(Some(MEET)).unwrap();
        link
    }
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A queue pair on rail `rail`'s device with its RoCE v2 GID.
struct Side {
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
    qp: QueuePair,
}

fn side(rail: u32, f: impl FnOnce(QueuePairBuilder) -> QueuePairBuilder) -> Side {
    let ctx = Context::open(&device(rail)).unwrap();
    assert_eq!(ctx.name(), device(rail));
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 512).unwrap();
    let qp = f(QueuePair::builder(&pd, &cq, &cq).gid_index(gid_index(rail)))
        .build()
        .unwrap();
    Side { pd, cq, qp }
}

fn one(cq: &CompletionQueue) -> Completion {
    let c = cq.wait_for(1, T).unwrap()[0];
    c.result().unwrap();
    c
}

fn rw() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// Write, write with immediate, read, send with immediate, fetch-and-add and compare-and-swap
/// from host 2 to host 1 on `rail`; host 1 checks what landed, host 2 what it read back.
fn ops_on_rail(rail: u32) {
    let h = me();
    let s = side(rail, |b| b);
    let seed = 10 + rail as u8;
    let target = if h == 1 {
        let t = MemoryRegion::new(&s.pd, 64 * 1024, rw()).unwrap();
        t.write(32 * 1024, &bytes(4096, seed + 100)).unwrap();
        t
    } else {
        MemoryRegion::new(&s.pd, 64 * 1024, rw()).unwrap()
    };
    let word = MemoryRegion::with_data(&s.pd, &5u64.to_ne_bytes(), rw()).unwrap();
    let rx = MemoryRegion::new(&s.pd, 2048, AccessFlags::LOCAL_WRITE).unwrap();
    if h == 1 {
        s.qp.post_recv(&RecvRequest::new(&[rx.slice(..1024).unwrap()]).id(1))
            .unwrap();
        s.qp.post_recv(&RecvRequest::new(&[rx.slice(1024..).unwrap()]).id(2))
            .unwrap();
    }
    let before = sent_pkts(rail);
    let mut l = link(1, rail);
    let peer = connect::handshake(&mut l, &s.qp, &[target.remote(), word.remote()]).unwrap();
    assert_eq!(peer.regions.len(), 2);
    if h == 1 {
        let got = s.cq.wait_for(2, T).unwrap();
        let summary: Vec<_> = got
            .iter()
            .map(|c| (c.status, c.wr_id, c.opcode, c.imm))
            .collect();
        assert_eq!(
            summary,
            [
                (
                    WcStatus::Success,
                    1,
                    WcOpcode::RecvRdmaWithImm,
                    Some(0x1000 + rail)
                ),
                (WcStatus::Success, 2, WcOpcode::Recv, Some(42)),
            ]
        );
        assert_eq!(got[1].byte_len, 1000);
        l.barrier().unwrap(); // host 2's atomics are done
        let data = target.to_vec();
        assert_eq!(
            data[..8192],
            bytes(8192, seed)[..],
            "writes landed on host 1"
        );
        assert_eq!(
            rx.to_vec()[1024..2024],
            bytes(1000, seed + 1)[..],
            "send landed"
        );
        assert_eq!(
            word.load_u64(0).unwrap(),
            5 + 7 + 100 - 12,
            "atomics applied"
        );
    } else {
        let remote = peer.regions[0];
        let rword = peer.regions[1].slice(..8).unwrap();
        let src = MemoryRegion::with_data(&s.pd, &bytes(8192, seed), rw()).unwrap();
        s.qp.post_send(
            &SendRequest::write(&[src.slice(..4096).unwrap()], remote.slice(..4096).unwrap()).id(1),
        )
        .unwrap();
        one(&s.cq);
        s.qp.post_send(
            &SendRequest::write(
                &[src.slice(4096..).unwrap()],
                remote.slice(4096..8192).unwrap(),
            )
            .with_imm(0x1000 + rail)
            .id(2),
        )
        .unwrap();
        one(&s.cq);
        s.qp.post_send(
            &SendRequest::read(
                &[target.slice(..4096).unwrap()],
                remote.slice(32 * 1024..36 * 1024).unwrap(),
            )
            .id(3),
        )
        .unwrap();
        assert_eq!(one(&s.cq).opcode, WcOpcode::RdmaRead);
        assert_eq!(
            target.to_vec()[..4096],
            bytes(4096, seed + 100)[..],
            "read host 1's bytes"
        );
        let tx = MemoryRegion::with_data(&s.pd, &bytes(1000, seed + 1), rw()).unwrap();
        s.qp.post_send(
            &SendRequest::send(&[tx.slice(..).unwrap()])
                .with_imm(42)
                .id(4),
        )
        .unwrap();
        one(&s.cq);
        let old = MemoryRegion::new(&s.pd, 8, rw()).unwrap();
        s.qp.post_send(&SendRequest::fetch_add(&old.slice(..).unwrap(), rword, 7).id(5))
            .unwrap();
        assert_eq!(one(&s.cq).opcode, WcOpcode::FetchAdd);
        assert_eq!(old.load_u64(0).unwrap(), 5);
        s.qp.post_send(&SendRequest::compare_swap(&old.slice(..).unwrap(), rword, 12, 100).id(6))
            .unwrap();
        assert_eq!(one(&s.cq).opcode, WcOpcode::CompareSwap);
        assert_eq!(old.load_u64(0).unwrap(), 12, "swap saw the added value");
        l.barrier().unwrap();
    }
    let sent = sent_pkts(rail) - before;
    assert!(
        sent > 0,
        "{} sent no packets: traffic took another NIC",
        device(rail)
    );
    eprintln!(
        "host{h} rail {rail} ({}): all operations verified, {sent} packets sent on it",
        device(rail)
    );
}

#[test]
#[ignore = "needs the cluster tier (cargo xtask test --cluster)"]
fn t1_write_read_send_imm_atomics_on_every_rail() {
    for r in 0..rails() {
        ops_on_rail(r);
    }
}

#[test]
#[ignore = "needs the cluster tier (cargo xtask test --cluster)"]
fn t2_rdma_cm_connect_accept_on_every_rail() {
    let h = me();
    for rail in 0..rails() {
        let cm_port = port(2, rail) + 8;
        let dst = format!("{}:{cm_port}", addr(1, rail)).parse().unwrap();
        if h == 1 {
            let listener = cm::Listener::bind(dst).unwrap();
            let mut l = link(2, rail); // host 2 connects only once we listen
            let req = listener.next_request(MEET).unwrap();
            let ctx = req.context().clone();
            assert_eq!(ctx.name(), device(rail), "rdma_cm picked the rail's device");
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let cq = CompletionQueue::new(&ctx, 16).unwrap();
            let qp = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
            let mr = MemoryRegion::new(&pd, 8192, rw()).unwrap();
            qp.post_recv(&RecvRequest::new(&[mr.slice(4096..).unwrap()]).id(1))
                .unwrap();
            let conn = req.accept(qp, Some(mr.remote())).unwrap();
            let got = one(&cq);
            assert_eq!((got.opcode, got.byte_len), (WcOpcode::Recv, 5));
            assert_eq!(mr.to_vec()[..4096], bytes(4096, 50 + rail as u8)[..]);
            assert_eq!(&mr.to_vec()[4096..4101], b"hello");
            l.barrier().unwrap();
            drop(conn);
        } else {
            let mut l = link(2, rail);
            let pending = cm::Connector::resolve(dst, T).unwrap();
            let ctx = pending.context().clone();
            assert_eq!(ctx.name(), device(rail), "rdma_cm picked the rail's device");
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let cq = CompletionQueue::new(&ctx, 16).unwrap();
            let qp = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
            let mr = MemoryRegion::with_data(&pd, &bytes(4096, 50 + rail as u8), rw()).unwrap();
            let conn = pending.connect(qp, None).unwrap();
            let remote = conn.remote_region().expect("host 1 advertised a region");
            conn.qp()
                .post_send(
                    &SendRequest::write(&[mr.slice(..).unwrap()], remote.slice(..4096).unwrap())
                        .id(1),
                )
                .unwrap();
            conn.qp()
                .post_send(&SendRequest::send_inline(b"hello").id(2))
                .unwrap();
            let done = cq.wait_for(2, T).unwrap();
            assert!(done.iter().all(|c| c.is_ok()), "{done:?}");
            l.barrier().unwrap();
            drop(conn);
        }
        eprintln!(
            "host{h} rail {rail}: rdma_cm connection on {} verified",
            device(rail)
        );
    }
}

/// What a stream of writes to the peer saw.
struct Stream {
    ok: u64,
    /// Time from the last success (or from `since`) to the first error completion.
    first_error_after: Option<Duration>,
    first_error: Option<WcStatus>,
    errors: u64,
}

/// Streams 64 KiB writes (8 outstanding) from `src` to `remote` until an error completion
/// arrives and every request has completed, or `until_ok` successes, or `limit` passes.
/// `on_ok(n)` runs after each success.
fn stream(
    s: &Side,
    src: &Arc<MemoryRegion>,
    remote: RemoteRegion,
    until_ok: u64,
    limit: Duration,
    mut on_ok: impl FnMut(u64) -> Option<Instant>,
) -> Stream {
    const CHUNK: usize = 64 * 1024;
    // `src` is at least as long as `remote` in every caller.
    let slots = remote.len / CHUNK as u64;
    let mut out = Stream {
        ok: 0,
        first_error_after: None,
        first_error: None,
        errors: 0,
    };
    let mut posted = 0u64;
    let mut outstanding = 0u64;
    let mut mark = Instant::now();
    let end = Instant::now() + limit;
    let mut buf = [Completion::default(); 16];
    loop {
        while out.errors == 0 && outstanding < 8 && posted < until_ok {
            let i = (posted % slots) as usize * CHUNK;
            s.qp.post_send(
                &SendRequest::write(
                    &[src.slice(i..i + CHUNK).unwrap()],
                    remote.slice(i as u64..(i + CHUNK) as u64).unwrap(),
                )
                .id(posted),
            )
            .unwrap();
            posted += 1;
            outstanding += 1;
        }
        if outstanding == 0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "stream still running after {limit:?}: {outstanding} requests outstanding, {} ok",
            out.ok
        );
        let n = s.cq.poll(&mut buf).unwrap();
        for c in &buf[..n] {
            outstanding -= 1;
            if c.is_ok() && out.errors == 0 {
                out.ok += 1;
                mark = on_ok(out.ok).unwrap_or_else(Instant::now);
            } else if !c.is_ok() {
                if out.errors == 0 {
                    out.first_error_after = Some(mark.elapsed());
                    out.first_error = Some(c.status);
                }
                out.errors += 1;
            }
        }
        if n == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    out
}

#[test]
#[ignore = "needs the cluster tier (cargo xtask test --cluster)"]
fn t3_rail_down_during_writes_errors_on_both_sides_then_reset_and_reconnect() {
    let h = me();
    let rail = rails() - 1;
    let s = side(rail, |b| b.retry_count(RETRIES).timeout(ACK_TIMEOUT));
    let target = MemoryRegion::new(&s.pd, 1 << 20, rw()).unwrap();
    let src = MemoryRegion::with_data(&s.pd, &bytes(1 << 20, h as u8), rw()).unwrap();
    // Coordination over rail 0's TCP (rail `rail` is about to be cut).
    let mut l = link(3, 0);
    let peer = connect::handshake(&mut l, &s.qp, &[target.remote()]).unwrap();
    let remote = peer.regions[0];
    let cut = std::cell::Cell::new(None::<Instant>);
    let st = stream(&s, &src, remote, u64::MAX, Duration::from_secs(120), |n| {
        if h == 2 && n == 40 && cut.get().is_none() {
            fault(&["link-down", "2", &rail.to_string()]);
            cut.set(Some(Instant::now()));
        }
        cut.get()
    });
    let after = st.first_error_after.expect("an error completion");
    eprintln!(
        "host{h} rail {rail}: {} writes ok, then {:?} {:.0} ms after the {}; {} error completions",
        st.ok,
        st.first_error.unwrap(),
        after.as_secs_f64() * 1000.0,
        if h == 2 { "cut" } else { "last success" },
        st.errors
    );
    assert!(
        after <= FAIL_BOUND,
        "error completion after {after:?} > {FAIL_BOUND:?}"
    );
    assert_eq!(st.first_error, Some(WcStatus::RetryExceeded));
    assert_eq!(s.qp.state().unwrap(), QpState::Error);
    l.barrier().unwrap(); // both saw their errors
    if h == 2 {
        fault(&["link-up", "2", &rail.to_string()]);
    }
    l.barrier().unwrap();
    s.qp.reset().unwrap();
    let peer = connect::handshake(&mut l, &s.qp, &[target.remote()]).unwrap();
    let remote = peer.regions[0];
    let fresh = MemoryRegion::with_data(&s.pd, &bytes(1 << 20, 0x40 + h as u8), rw()).unwrap();
    let st = stream(&s, &fresh, remote, 32, T, |_| None);
    assert_eq!((st.ok, st.errors), (32, 0), "after reconnect");
    l.barrier().unwrap();
    assert_eq!(
        target.to_vec(),
        bytes(1 << 20, 0x40 + 3 - h as u8),
        "the peer's writes after the reconnect verify"
    );
    eprintln!("host{h} rail {rail}: reset + reconnect ok, 32 x 64 KiB verified");
}

#[test]
#[ignore = "needs the cluster tier (cargo xtask test --cluster)"]
fn t5_one_percent_loss_writes_complete_and_verify() {
    let h = me();
    let rail = rails() - 1;
    let s = side(rail, |b| b);
    let target = MemoryRegion::new(&s.pd, 1 << 20, rw()).unwrap();
    let mut l = link(5, 0);
    let peer = connect::handshake(&mut l, &s.qp, &[target.remote()]).unwrap();
    let n = 64;
    let mut secs = Vec::new();
    for (round, loss) in [(0u8, false), (1, true)] {
        if loss && h == 2 {
            fault(&["netem", "2", &rail.to_string(), "loss", "1%"]);
        }
        l.barrier().unwrap();
        if h == 2 {
            let src = MemoryRegion::with_data(&s.pd, &bytes(1 << 20, 0x60 + round), rw()).unwrap();
            let t = Instant::now();
            let st = stream(
                &s,
                &src,
                peer.regions[0],
                n,
                Duration::from_secs(240),
                |_| None,
            );
            secs.push(t.elapsed().as_secs_f64());
            assert_eq!((st.ok, st.errors), (n, 0));
        }
        l.barrier().unwrap();
        if h == 1 {
            assert_eq!(
                target.to_vec(),
                bytes(1 << 20, 0x60 + round),
                "every byte verifies"
            );
        }
        if loss && h == 2 {
            fault(&["netem-clear", "2", &rail.to_string()]);
        }
    }
    if h == 2 {
        eprintln!(
            "rail {rail}: {n} x 64 KiB writes: {:.2} s clean, {:.2} s with 1 % loss on host 2's egress: slowdown x{:.2}",
            secs[0],
            secs[1],
            secs[1] / secs[0]
        );
    }
}

#[test]
#[ignore = "needs the cluster tier (cargo xtask test --cluster)"]
fn t9_host_killed_during_writes_survivor_errors_and_tears_down() {
    let h = me();
    let rail = 0;
    let s = side(rail, |b| b.retry_count(RETRIES).timeout(ACK_TIMEOUT));
    let target = MemoryRegion::new(&s.pd, 1 << 20, rw()).unwrap();
    let src = MemoryRegion::with_data(&s.pd, &bytes(1 << 20, h as u8), rw()).unwrap();
    let mut l = link(9, rail);
    let peer = connect::handshake(&mut l, &s.qp, &[target.remote()]).unwrap();
    let killed = std::cell::Cell::new(None::<Instant>);
    let st = stream(
        &s,
        &src,
        peer.regions[0],
        u64::MAX,
        Duration::from_secs(120),
        |n| {
            if h == 1 && n == 40 && killed.get().is_none() {
                fault(&["kill", "2"]);
                killed.set(Some(Instant::now()));
            }
            killed.get()
        },
    );
    // Host 2 does not get here: it is powered off mid-stream.
    let after = st.first_error_after.expect("an error completion");
    eprintln!(
        "host{h}: {} writes ok, then {:?} {:.0} ms after host 2 was killed; {} error completions",
        st.ok,
        st.first_error.unwrap(),
        after.as_secs_f64() * 1000.0,
        st.errors
    );
    assert!(
        after <= FAIL_BOUND,
        "error completion after {after:?} > {FAIL_BOUND:?}"
    );
    assert_eq!(st.first_error, Some(WcStatus::RetryExceeded));
    assert_eq!(s.qp.state().unwrap(), QpState::Error);
    let t = Instant::now();
    drop(l);
    drop(s.qp);
    drop(target);
    drop(src);
    drop(s.cq);
    drop(s.pd);
    eprintln!(
        "host{h}: teardown in {:.1} ms",
        t.elapsed().as_secs_f64() * 1000.0
    );
}
