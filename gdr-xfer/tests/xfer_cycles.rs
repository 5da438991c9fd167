//! Resource cycles of the transfer engine: segments registered and deregistered, segments cut
//! from one pool, whole agent stacks (two agents, a connection, a write with a notification) made
//! and dropped, and peers connected and disconnected between two long-lived agents, many times
//! over; every kernel object, file descriptor and thread must be given back and the process must
//! not grow (modelled on gdr/tests/verbs_cycles.rs).
//!
//! After each chunk of cycles (1,000 in a full run, a quarter of a shorter one) a test compares
//! `rdma res show`'s counts (pd, mr, cq, qp, cm_id), the open file descriptors and the threads
//! (`Threads:` of /proc/self/status) with the baseline taken after one warm-up cycle, and the
//! resident memory with the first checkpoint's, and prints one table row
//! (`gdr_test_support::cycles`). An agent's control reader threads end on their own once their
//! socket is shut down, so a checkpoint waits up to `cycles::SETTLE` for the counts to come back
//! (the row prints how long that took) before it fails.
//!
//! The number of cycles per test is `GDR_CYCLES` (the full run: `GDR_CYCLES=10000`); without it
//! each test runs a count that keeps `cargo xtask test` fast. Run in the Soft-RoCE VM by
//! `cargo xtask test`.

use std::time::{Duration, Instant};

use gdr_test_support::cycles::{
    assert_no_slowdown, cycles, run_cycles, sample, settle, status_field,
};
use gdr_test_support::pattern;
use gdr_test_support::xfer::agent_with;
use gdr_xfer::{Agent, AgentConfig, Desc, Error, Peer, TransferOptions};

const WAIT: Duration = Duration::from_secs(30);

/// An agent for the cycles: small queues (a cycle moves one small buffer), a short busy poll.
fn cycle_agent(name: &str) -> Agent {
    agent_with(
        AgentConfig::new(name)
            .send_queue_depth(16)
            .default_timeout(WAIT),
    )
}

/// Waits until `agent` has no peer any more (the other side's disconnect reached it).
fn wait_no_peers(agent: &Agent) {
    let end = Instant::now() + WAIT;
    while !agent.peers().is_empty() {
        assert!(
            Instant::now() < end,
            "{}: still connected to {:?} {WAIT:?} after the peer disconnected",
            agent.name(),
            agent.peers()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One write of `len` bytes from `a` into `b`'s segment `dst_name` with a notification, checked
/// byte for byte and notification for notification.
fn write_and_notify(a: &Agent, b: &Agent, pb: &Peer, i: usize, len: usize, dst_name: &str) {
    let src = a.alloc_host(len, "cycle-src").unwrap();
    let data = pattern(len, i as u32);
    src.write(0, &data).unwrap();
    let remote = pb.wait_segment_named(dst_name, WAIT).unwrap();
    let note = format!("cycle {i}");
    let t = pb
        .write(
            &[Desc::new(&src, 0, remote.id, 0, len as u64)],
            &TransferOptions::new().notify(note.as_bytes()),
        )
        .unwrap();
    t.wait(WAIT).unwrap();
    let n = b
        .wait_notification(WAIT)
        .unwrap()
        .unwrap_or_else(|| panic!("cycle {i}: no notification within {WAIT:?}"));
    assert_eq!(n.peer, a.name());
    assert_eq!(n.data, note.as_bytes());
    let dst = b
        .segments()
        .into_iter()
        .find(|s| s.name() == dst_name)
        .expect("the destination segment");
    assert_eq!(
        dst.to_vec(0, len).unwrap(),
        data,
        "cycle {i}: the bytes landed"
    );
    a.deregister(&src).unwrap();
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn segment_register_deregister_cycles() {
    // A connected peer, so every registration and deregistration is announced over the control
    // link and the peer's table of our segments must come back too.
    let a = cycle_agent("seg-a");
    let b = cycle_agent("seg-b");
    let addr = b.listen("127.0.0.1:0").unwrap();
    let _pb = a.connect(&addr.to_string()).unwrap();
    let pa = b.wait_peer(a.name(), WAIT).unwrap();
    let rows = run_cycles(
        "segment register/deregister",
        cycles(200),
        &["mr"],
        &["qp"],
        |i, probe| {
            let seg = a.alloc_host(8192, "cycle").unwrap();
            seg.write(0, &(i as u64).to_le_bytes()).unwrap();
            probe();
            let mut back = [0u8; 8];
            seg.read(0, &mut back).unwrap();
            assert_eq!(u64::from_le_bytes(back), i as u64);
            let weak = seg.registration_weak();
            a.deregister(&seg).unwrap();
            // Deregistered once is gone: a second time is refused.
            assert!(matches!(
                a.deregister(&seg),
                Err(Error::UnknownSegment { .. })
            ));
            assert!(
                weak.is_alive(),
                "the segment handle still holds its registration"
            );
            drop(seg);
            assert!(
                !weak.is_alive(),
                "the registration outlived its last segment"
            );
        },
    );
    assert!(a.segments().is_empty(), "{:?}", a.segments());
    let end = Instant::now() + WAIT;
    while !pa.segments().is_empty() {
        assert!(
            Instant::now() < end,
            "the peer still lists {:?}",
            pa.segments()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(pa.is_connected());
    assert_no_slowdown("segment register/deregister", &rows);
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn register_within_one_pool_cycles() {
    const POOL: usize = 1 << 20;
    const BLOCK: u64 = 4096;
    let a = cycle_agent("within-a");
    let pool = a.alloc_host(POOL, "pool").unwrap();
    let blocks = POOL as u64 / BLOCK;
    let rows = run_cycles(
        "register_within one pool",
        cycles(200),
        &[],
        &["mr"],
        |i, probe| {
            let off = (i as u64 % blocks) * BLOCK;
            let seg = a
                .register_within(&pool, off, BLOCK, &format!("block-{i}"))
                .unwrap();
            probe();
            assert!(seg.shares_registration_with(&pool));
            assert_eq!(seg.info().addr, pool.info().addr + off);
            // Writing through the sub-segment lands in the pool.
            seg.write(0, &(i as u64).to_le_bytes()).unwrap();
            let mut back = [0u8; 8];
            pool.read(off, &mut back).unwrap();
            assert_eq!(u64::from_le_bytes(back), i as u64);
            // Out of range is refused.
            assert!(matches!(
                a.register_within(&pool, POOL as u64 - BLOCK + 1, BLOCK, "over"),
                Err(Error::OutOfSegment { .. })
            ));
            a.deregister(&seg).unwrap();
            drop(seg);
        },
    );
    assert_eq!(a.segments().len(), 1, "only the pool is left");
    assert!(pool.registration_weak().is_alive());
    assert_no_slowdown("register_within one pool", &rows);
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn whole_agent_stack_cycles() {
    // Cycles after which a thread of the stack was still running when the last handle had been
    // dropped (the control readers are detached: they end once their socket is shut down), and
    // the most such threads.
    let (mut lingering, mut most) = (0usize, 0u64);
    let n = cycles(100);
    run_cycles(
        "whole agent stack",
        n,
        &["pd", "mr", "cq", "qp"],
        &["cm_id"],
        |i, probe| {
            let before = status_field("Threads:");
            let a = cycle_agent("stack-a");
            let b = cycle_agent("stack-b");
            let addr = b.listen("127.0.0.1:0").unwrap();
            let pb = a.connect(&addr.to_string()).unwrap();
            let pa = b.wait_peer(a.name(), WAIT).unwrap();
            let _dst = b.alloc_host(4096, "dst").unwrap();
            write_and_notify(&a, &b, &pb, i, 4096, "dst");
            probe();
            // Dropped in an order unlike creation's, peer handles last: every thread and kernel
            // object must be gone once the handles are.
            drop(a);
            assert!(
                !pb.is_connected(),
                "a dropped agent's peers are lost at once"
            );
            drop(b);
            assert!(
                !pa.is_connected(),
                "a dropped agent's peers are lost at once"
            );
            drop((pb, pa));
            let left = status_field("Threads:").saturating_sub(before);
            if left > 0 {
                lingering += 1;
                most = most.max(left);
            }
        },
    );
    println!(
        "cycles whole agent stack: {lingering} of {} cycles left a thread running right after the last drop (at most {most})",
        n + 1
    );
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn peer_connect_disconnect_cycles() {
    let a = cycle_agent("conn-a");
    let b = cycle_agent("conn-b");
    let addr = b.listen("127.0.0.1:0").unwrap().to_string();
    let _dst = b.alloc_host(4096, "dst").unwrap();
    let rows = run_cycles(
        "peer connect/disconnect",
        cycles(200),
        &["mr", "qp"],
        &["pd", "cq"],
        |i, probe| {
            let pb = a.connect(&addr).unwrap();
            let pa = b.wait_peer(a.name(), WAIT).unwrap();
            write_and_notify(&a, &b, &pb, i, 4096, "dst");
            probe();
            // Either side hangs up, in turn.
            let (closer, handle, other, other_agent) = if i % 2 == 0 {
                (&a, &pb, &pa, &b)
            } else {
                (&b, &pa, &pb, &a)
            };
            closer.disconnect(handle).unwrap();
            assert!(!handle.is_connected());
            assert!(closer.peers().is_empty(), "{:?}", closer.peers());
            wait_no_peers(other_agent);
            let end = Instant::now() + WAIT;
            while other.is_connected() {
                assert!(
                    Instant::now() < end,
                    "{} never saw the goodbye",
                    other.name()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            let e = pb
                .write(
                    &[Desc::new(
                        &a.alloc_host(64, "late").unwrap(),
                        0,
                        gdr_xfer::SegmentId::new(1),
                        0,
                        64,
                    )],
                    &TransferOptions::new(),
                )
                .unwrap_err();
            assert!(matches!(e, Error::PeerLost { .. }), "{e}");
            for s in a.segments() {
                a.deregister(&s).unwrap();
            }
        },
    );
    assert_no_slowdown("peer connect/disconnect", &rows);
}

/// A raw client of an agent's listener that is not a well-behaved agent, in four ways (cycle
/// `i`, in turn): a hello the agent answers (it has created queue pairs for it) and then a
/// hang-up; a hello carrying the agent's own name (refused with a bye); bytes that are not a
/// frame; and a connect with a hang-up before any byte. Each leaves an accept thread behind that
/// must end and give back what the handshake made.
fn hostile_client(addr: &str, agent_name: &str, i: usize, probe: &mut dyn FnMut()) {
    use gdr::connect::TcpLink;
    use gdr::device::{Gid, Mtu};
    use gdr::qp::Endpoint;
    use gdr_xfer::wire::{Hello, Message};
    use std::io::Write;

    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let hello = |name: &str| {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 77, 0, 1]);
        let endpoint = |qpn| Endpoint {
            qpn,
            psn: 0x12_3456,
            lid: 0,
            gid: Gid(gid),
            gid_index: 1,
            mtu: Mtu::B1024,
            port: 1,
        };
        Message::Hello(Hello {
            name: name.into(),
            rails: vec![vec![endpoint(0xff_ff00), endpoint(0xff_ff01)]],
            notify_slots: 4,
            notify_max: 64,
        })
        .encode()
        .unwrap()
    };
    match i % 4 {
        0 => {
            let mut link = TcpLink::from_stream(stream).unwrap();
            link.set_timeout(Some(WAIT)).unwrap();
            link.send_bytes(&hello("hostile")).unwrap();
            let answer = Message::decode("agent", &link.recv_bytes().unwrap()).unwrap();
            let Message::Hello(h) = answer else {
                panic!("the agent answered a hello with {answer:?}");
            };
            assert_eq!(h.name, agent_name);
            assert_eq!(h.rails[0].len(), 2, "one queue pair per offered endpoint");
            // The agent's queue pairs for us exist now.
            probe();
        }
        1 => {
            let mut link = TcpLink::from_stream(stream).unwrap();
            link.set_timeout(Some(WAIT)).unwrap();
            link.send_bytes(&hello(agent_name)).unwrap();
            // Refused before the agent made queue pairs for it: a goodbye, no hello.
            let bye = Message::decode("agent", &link.recv_bytes().unwrap()).unwrap();
            assert!(
                matches!(&bye, Message::Bye(r) if r.contains("as this agent")),
                "{bye:?}"
            );
        }
        2 => {
            // A frame header announcing 64 MiB, and a little of it.
            let _ = stream.write_all(&[0xffu8; 64]);
        }
        _ => {}
    }
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn hostile_handshake_cycles() {
    let a = cycle_agent("listener");
    let addr = a.listen("127.0.0.1:0").unwrap().to_string();
    let _seg = a.alloc_host(4096, "table").unwrap();
    run_cycles(
        "hostile handshakes",
        cycles(200),
        &["qp"],
        &["pd", "cq"],
        |i, probe| hostile_client(&addr, a.name(), i, probe),
    );
    // Nobody of them became a peer.
    assert!(a.peers().is_empty(), "{:?}", a.peers());
    // Many idle connections at once: each holds a handshake thread until it hangs up or the
    // connect timeout passes (measured and printed: the listener has no cap on handshakes in
    // flight); once they hang up, every thread and fd is given back.
    const IDLE: usize = 64;
    let (base, _) = settle(&sample());
    let idle: Vec<std::net::TcpStream> = (0..IDLE)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    let end = Instant::now() + WAIT;
    let mut open = sample();
    while open.threads < base.threads + IDLE as u64 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        open = sample();
    }
    println!(
        "cycles hostile handshakes: {IDLE} idle connections open: {} threads, {} fds (baseline {} threads, {} fds)",
        open.threads, open.fds, base.threads, base.fds
    );
    drop(idle);
    let (after, waited) = settle(&base);
    assert_eq!(
        after.counts(),
        base.counts(),
        "{IDLE} idle connections closed {waited:?} ago: {} (baseline {})",
        after.text(),
        base.text()
    );
    // And the listener still serves a real agent.
    let b = cycle_agent("real");
    let pa = b.connect(&addr).unwrap();
    let table = pa.wait_segment_named("table", WAIT).unwrap();
    assert_eq!(table.len, 4096);
}

/// Connections the listening agent refuses after the hello exchange (it is full, or already
/// has a peer of that name): each cycle's queue pairs, buffers, sockets and threads on both
/// sides are given back, and the initiator learns why it was refused (not only that the
/// connection closed).
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn refused_connection_cycles() {
    let mut cfg = AgentConfig::new("full")
        .send_queue_depth(16)
        .default_timeout(WAIT);
    cfg.max_peers = 1;
    let b = agent_with(cfg);
    let addr = b.listen("127.0.0.1:0").unwrap().to_string();
    let first = cycle_agent("first");
    let _pb = first.connect(&addr).unwrap();
    b.wait_peer("first", WAIT).unwrap();
    let other = cycle_agent("second");
    let same_name = cycle_agent("first");
    run_cycles(
        "refused connections",
        cycles(100),
        &[],
        &["pd", "cq"],
        |i, probe| {
            let (who, why) = if i % 2 == 0 {
                (&other, "max_peers")
            } else {
                (&same_name, "already connected")
            };
            let e = who.connect(&addr).unwrap_err();
            probe();
            assert!(
                matches!(e, Error::Protocol { .. }) && e.to_string().contains(why),
                "{} refused by a full agent: the error does not say {why:?}: {e}",
                who.name()
            );
            assert!(who.peers().is_empty(), "{:?}", who.peers());
        },
    );
    let names: Vec<String> = b.peers().iter().map(|p| p.name().to_string()).collect();
    assert_eq!(names, ["first"]);
}
