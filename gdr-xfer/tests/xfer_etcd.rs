//! Finding peers through a real etcd (Debian's etcd-server, started by the test): an agent in
//! another process publishes itself, this one finds it by name, transfers work; when the
//! published agent's lease ends (the process is stopped, so no socket or packet tells), every
//! transfer pending to it fails at once with `PeerLost`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr_test_support::etcd::EtcdServer;
use gdr_test_support::xfer::agent;
use gdr_test_support::{device, example};
use gdr_xfer::directory::{EtcdDirectory, DEFAULT_PREFIX};
use gdr_xfer::{Desc, Error, Status, TransferOptions};

struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        unsafe_free_signal(self.0.id(), "-CONT");
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends a signal with kill(1) (no unsafe libc call in tests).
fn unsafe_free_signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

fn target(etcd: &str, ttl_ms: u64) -> Stopped {
    let mut child = Command::new(example("kv_transfer"))
        .args(["--serve", "--listen", "127.0.0.1:0", "--device", &device()])
        .args(["--blocks", "10000", "--block-len", "4096"])
        .args(["--etcd", etcd, "--ttl-ms", &ttl_ms.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(
        line.contains("published as kv-target"),
        "target said {line:?}"
    );
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            println!("  | {l}");
        }
    });
    Stopped(child)
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn peers_are_found_by_name_and_a_lease_that_ends_fails_their_transfers() {
    let etcd = EtcdServer::start();
    // Long enough that a busy emulated host (Soft-RoCE under TCG) renews it in time.
    let ttl = Duration::from_secs(6);
    let t = target(&etcd.endpoint(), ttl.as_millis() as u64);
    let dir = Arc::new(
        EtcdDirectory::connect(
            &[etcd.endpoint()],
            DEFAULT_PREFIX,
            ttl,
            Duration::from_secs(5),
        )
        .unwrap(),
    );
    let a = agent("finder");
    // A name nobody published: a typed error within the timeout.
    let start = Instant::now();
    let e = a
        .connect_named(&dir, "nobody", Duration::from_millis(300))
        .unwrap_err();
    assert!(matches!(e, Error::UnknownPeer { .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(3));
    // Found by name; its segments arrive with the connection (and are in etcd too).
    let peer = a
        .connect_named(&dir, "kv-target", Duration::from_secs(10))
        .unwrap();
    assert_eq!(peer.name(), "kv-target");
    let pool = peer
        .wait_segment_named("kv-pool", Duration::from_secs(10))
        .unwrap();
    let listing = dir.list("kv-target/segments/").unwrap();
    println!(
        "kv-target's keys in etcd: endpoint and {:?}",
        listing.entries.iter().map(|e| &e.0).collect::<Vec<_>>()
    );
    assert_eq!(
        listing.entries.len(),
        2,
        "kv-pool and kv-status are published: {listing:?}"
    );
    let src = a.alloc_host(1 << 20, "src").unwrap();
    let one = |i: u64| Desc::new(&src, i * 4096, pool.id, i * 4096, 4096);
    let opts = TransferOptions::new().timeout(Duration::from_secs(120));
    let t0 = Instant::now();
    peer.write(&[one(0)], &opts)
        .unwrap()
        .wait(Duration::from_secs(60))
        .unwrap();
    println!("a write to the peer found by name took {:?}", t0.elapsed());
    // Stop the target: its NIC (the kernel's Soft-RoCE) still answers and its socket stays
    // open, but its lease is no longer renewed and it no longer reposts notification receives.
    // Of 100 transfers with a notification, those past its receive slots wait (RNR retries,
    // forever) until the lease ends.
    unsafe_free_signal(t.0.id(), "-STOP");
    let stopped = Instant::now();
    let pending: Vec<_> = (0..100u64)
        .map(|i| {
            peer.write(&[one(i % 256)], &opts.clone().notify(format!("n{i}")))
                .unwrap()
        })
        .collect();
    let results: Vec<_> = pending
        .iter()
        .map(|x| x.wait(Duration::from_secs(60)))
        .collect();
    let took = stopped.elapsed();
    let done = results.iter().filter(|r| r.is_ok()).count();
    let lost: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    println!(
        "target stopped: {done} of 100 transfers finished before its lease ended, {} failed, all settled {took:?} after the stop (ttl {ttl:?}); first error: {:?}",
        lost.len(),
        lost.first()
    );
    assert!(
        !lost.is_empty(),
        "transfers past the receive slots cannot finish"
    );
    for e in &lost {
        assert!(
            matches!(
                e,
                Error::PeerLost {
                    why: gdr_xfer::Lost::Unlisted,
                    ..
                }
            ),
            "{e}"
        );
    }
    assert!(
        took < ttl + Duration::from_secs(4),
        "failed {took:?} after the stop"
    );
    assert!(pending.iter().all(|x| x.status() != Status::Pending));
    assert!(!peer.is_connected());
    let start = Instant::now();
    while a.peer("kv-target").is_some() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(a.peer("kv-target").is_none(), "the lost peer is forgotten");
}

/// A directory record that names the wrong agent (a stale record whose address another agent
/// now listens on, or a hostile one): the connection is refused with a typed error naming both
/// names, and nothing of it stays connected.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_record_pointing_at_another_agent_is_refused() {
    let etcd = EtcdServer::start();
    let dir = Arc::new(
        EtcdDirectory::connect(
            &[etcd.endpoint()],
            DEFAULT_PREFIX,
            Duration::from_secs(6),
            Duration::from_secs(5),
        )
        .unwrap(),
    );
    let real = agent("real");
    let addr = real.listen("127.0.0.1:0").unwrap();
    // "ghost"'s endpoint record, pointing at "real".
    let record = gdr_xfer::wire::AgentRecord {
        addr: addr.to_string(),
    }
    .encode()
    .unwrap();
    dir.put("ghost/endpoint", &record).unwrap();
    let finder = agent("finder");
    let e = finder
        .connect_named(&dir, "ghost", Duration::from_secs(10))
        .unwrap_err();
    match &e {
        Error::Protocol { peer, detail, .. } => {
            assert_eq!(peer, "ghost");
            assert!(
                detail.contains("says it is \"real\"") && detail.contains("\"ghost\""),
                "{detail}"
            );
        }
        other => panic!("expected a protocol error, got {other}"),
    }
    // Nothing stays connected on either side.
    assert!(finder.peers().is_empty(), "{:?}", finder.peers());
    let end = Instant::now() + Duration::from_secs(10);
    while !real.peers().is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(real.peers().is_empty(), "{:?}", real.peers());
    // The real name still works.
    let r = gdr_xfer::wire::AgentRecord {
        addr: addr.to_string(),
    }
    .encode()
    .unwrap();
    dir.put("real/endpoint", &r).unwrap();
    let peer = finder
        .connect_named(&dir, "real", Duration::from_secs(10))
        .unwrap();
    assert_eq!(peer.name(), "real");
}

fn directory(etcd: &EtcdServer) -> Arc<EtcdDirectory> {
    Arc::new(
        EtcdDirectory::connect(
            &[etcd.endpoint()],
            DEFAULT_PREFIX,
            // A long lease: records that go, go because the agent withdrew them.
            Duration::from_secs(60),
            Duration::from_secs(5),
        )
        .unwrap(),
    )
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn records_go_when_the_agent_shuts_down_or_is_dropped_and_unreachable_addresses_are_refused() {
    let etcd = EtcdServer::start();
    let dir = directory(&etcd);
    let a = agent("leaver");
    let addr = a.listen("127.0.0.1:0").unwrap();
    // What listen("0.0.0.0:0") binds is not where peers reach the agent.
    for bad in ["0.0.0.0:7100", "[::]:7100", "127.0.0.1:0"] {
        let e = a.publish(dir.clone(), bad.parse().unwrap()).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { what, .. } if what.contains("peers cannot connect")),
            "{bad}: {e}"
        );
    }
    a.publish(dir.clone(), addr).unwrap();
    let seg = a.alloc_host(4096, "kv").unwrap();
    let seg_key = format!("leaver/segments/{}", seg.id());
    assert!(dir.get("leaver/endpoint").unwrap().is_some());
    assert!(dir.get(&seg_key).unwrap().is_some());
    let report = a.shutdown(Duration::from_secs(5));
    assert_eq!(report.failed, 0);
    // Gone at once, 60 s before the lease would have ended.
    assert_eq!(dir.get("leaver/endpoint").unwrap(), None);
    assert_eq!(dir.get(&seg_key).unwrap(), None);
    assert!(matches!(
        a.publish(dir.clone(), addr),
        Err(Error::AgentClosed)
    ));
    let finder = agent("finder");
    let e = finder
        .connect_named(&dir, "leaver", Duration::from_millis(500))
        .unwrap_err();
    assert!(matches!(e, Error::UnknownPeer { .. }), "{e}");
    // A dropped agent withdraws too.
    let b = agent("dropped");
    let addr = b.listen("127.0.0.1:0").unwrap();
    b.publish(dir.clone(), addr).unwrap();
    assert!(dir.get("dropped/endpoint").unwrap().is_some());
    drop(b);
    assert_eq!(dir.get("dropped/endpoint").unwrap(), None);
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_stale_record_fails_connect_named_within_its_timeout_and_names_the_address() {
    let etcd = EtcdServer::start();
    let dir = directory(&etcd);
    // The record of an agent that died: nothing listens at its address any more.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = gone.local_addr().unwrap();
    drop(gone);
    let record = gdr_xfer::wire::AgentRecord {
        addr: addr.to_string(),
    }
    .encode()
    .unwrap();
    dir.put("ghost/endpoint", &record).unwrap();
    // An agent whose own connect timeout is longer than the call's: the call's wins.
    let finder = gdr_test_support::xfer::agent_with(
        gdr_xfer::AgentConfig::new("finder").connect_timeout(Duration::from_secs(30)),
    );
    let timeout = Duration::from_secs(2);
    let start = Instant::now();
    let e = finder.connect_named(&dir, "ghost", timeout).unwrap_err();
    let took = start.elapsed();
    println!("connect_named to a stale record: {e} after {took:?}");
    match &e {
        Error::UnknownPeer { name, hint } => {
            assert_eq!(name, "ghost");
            let hint = hint.text().unwrap_or_default();
            assert!(hint.contains(&addr.to_string()), "{hint}");
        }
        other => panic!("expected UnknownPeer, got {other}"),
    }
    // The call's timeout bounds the whole call (with room for a loaded emulated host), not the
    // agent's 30 s connect timeout.
    assert!(took < timeout + Duration::from_secs(3), "{took:?}");
}

/// A second agent publishing a live agent's name (through its own directory or the holder's)
/// is refused with `NameTaken` and touches nothing of the holder: when it leaves, the holder's
/// records are still there and a client connected by name keeps the holder. Once the holder
/// withdrew, the name is free and a new agent takes it.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_published_name_is_not_taken_over_and_is_free_again_once_withdrawn() {
    let etcd = EtcdServer::start();
    let dir_a = directory(&etcd);
    let holder = agent("svc");
    let addr = holder.listen("127.0.0.1:0").unwrap();
    holder.publish(dir_a.clone(), addr).unwrap();
    let seg = holder.alloc_host(1 << 16, "kv").unwrap();
    let records = dir_a.list("svc/").unwrap().entries;
    assert_eq!(records.len(), 2, "endpoint and segment: {records:?}");
    // A client of the holder, found by name: it watches the holder's records.
    let dir_c = directory(&etcd);
    let client = agent("client");
    let peer = client
        .connect_named(&dir_c, "svc", Duration::from_secs(10))
        .unwrap();
    let remote = peer
        .wait_segment_named("kv", Duration::from_secs(10))
        .unwrap();

    let dir_b = directory(&etcd);
    let intruder = agent("svc");
    let iaddr = intruder.listen("127.0.0.1:0").unwrap();
    for dir in [&dir_b, &dir_a] {
        let e = intruder.publish(dir.clone(), iaddr).unwrap_err();
        match &e {
            Error::NameTaken {
                call,
                name,
                holder_lease,
                ..
            } => {
                assert_eq!(*call, "Agent::publish");
                assert_eq!(name, "svc");
                assert_eq!(*holder_lease, dir_a.lease_id());
            }
            other => panic!("expected NameTaken, got {other}"),
        }
        assert!(
            e.to_string()
                .starts_with("Agent::publish: the name \"svc\" is taken"),
            "{e}"
        );
        println!("{e}");
    }
    // Its segments are not published under the name either.
    let _theirs = intruder.alloc_host(4096, "intruder").unwrap();
    assert_eq!(dir_a.list("svc/").unwrap().entries, records);
    // It leaves, its directory too (its lease is revoked): the holder's records stay and its
    // client keeps it.
    intruder.shutdown(Duration::from_secs(1));
    drop(intruder);
    drop(dir_b);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(dir_a.list("svc/").unwrap().entries, records);
    assert!(peer.is_connected());
    assert!(client.peer("svc").is_some());
    let src = client.alloc_host(4096, "src").unwrap();
    peer.write(
        &[Desc::new(&src, 0, remote.id, 0, 4096)],
        &TransferOptions::new().timeout(Duration::from_secs(60)),
    )
    .unwrap()
    .wait(Duration::from_secs(60))
    .unwrap();
    // The holder's own deregistration deletes its segment record only.
    holder.deregister(&seg).unwrap();
    let left = dir_a.list("svc/").unwrap().entries;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0, "svc/endpoint");
    // The holder shuts down: its records go and the name is free for a new agent.
    holder.shutdown(Duration::from_secs(1));
    assert!(dir_a.list("svc/").unwrap().entries.is_empty());
    let end = Instant::now() + Duration::from_secs(10);
    while client.peer("svc").is_some() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let dir_n = directory(&etcd);
    let next = agent("svc");
    let naddr = next.listen("127.0.0.1:0").unwrap();
    next.publish(dir_n.clone(), naddr).unwrap();
    let again = client
        .connect_named(&dir_c, "svc", Duration::from_secs(10))
        .unwrap();
    assert_eq!(again.name(), "svc");
}
