//! Outcomes a caller can trust, on the test device: the regressions of the engine review
//! (issue "gdr-xfer core redesign"). Each test is one finding, tried as the review tried it,
//! with the engine's promise asserted: an outcome means the memory is quiet; one caller's
//! mistake fails only its own transfer; hostile and extreme inputs get typed answers.

use std::time::{Duration, Instant};

use gdr_test_support::pattern;
use gdr_test_support::xfer::{agent, agent_with, connected};
use gdr_xfer::{
    AgentConfig, BlockTable, Desc, Error, Foreign, LocalList, Op, Status, TransferOptions,
};

const WAIT: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;

/// How long after its deadline an outcome may come: twice the quiesce time (the engine's
/// bound) plus the timer period, plus room for a loaded emulated VM to schedule the threads.
fn bound(cfg: &AgentConfig) -> Duration {
    cfg.quiesce * 2 + Duration::from_millis(5) + Duration::from_millis(500)
}

/// Finding 1 (READ): T1 times out with its requests in flight; T2 then reads other bytes into
/// the same local memory. T1's bytes must never land over T2's: T1's outcome comes only once
/// its requests are retired. T1 (1,024 requests of 16 KiB, four times what the send queues of
/// 64 hold on two rails) cannot complete: its outcome is a timeout, after the requests it had
/// posted are retired.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_read_that_timed_out_never_lands_over_a_later_read_into_the_same_memory() {
    read_after_a_timed_out_read("f1r");
}

fn read_after_a_timed_out_read(name: &str) {
    let cfg = AgentConfig::new(format!("{name}a"))
        .qps_per_peer(2)
        .slice_size(16 * 1024)
        .send_queue_depth(64);
    let bound = bound(&cfg);
    let (a, b, pb, _pa) = connected(agent_with(cfg), agent(&format!("{name}b")));
    let len = 16 * MIB;
    let local = a.alloc_host(len as usize, "local").unwrap();
    let src1 = b.alloc_host(len as usize, "src1").unwrap();
    let src2 = b.alloc_host(len as usize, "src2").unwrap();
    src1.write(0, &pattern(len as usize, 1)).unwrap();
    src2.write(0, &pattern(len as usize, 2)).unwrap();
    let r1 = pb.wait_segment_named("src1", WAIT).unwrap();
    let r2 = pb.wait_segment_named("src2", WAIT).unwrap();
    let deadline = Duration::from_millis(1);
    let t0 = Instant::now();
    let t1 = pb
        .read(
            &[Desc::new(&local, 0, r1.id, 0, len)],
            &TransferOptions::new().timeout(deadline),
        )
        .unwrap();
    let out1 = t1.wait(WAIT);
    let after = t0.elapsed();
    assert!(matches!(out1, Err(Error::Timeout { .. })), "T1: {out1:?}");
    assert!(
        after <= deadline + bound,
        "T1's outcome came {after:?} after submission"
    );
    // T1 is over: its memory is quiet. T2 reads other bytes into it.
    pb.read(
        &[Desc::new(&local, 0, r2.id, 0, len)],
        &TransferOptions::new(),
    )
    .unwrap()
    .wait(WAIT)
    .unwrap();
    let want = pattern(len as usize, 2);
    assert!(
        local.to_vec(0, len as usize).unwrap() == want,
        "T2's bytes right after T2"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        local.to_vec(0, len as usize).unwrap() == want,
        "T1's bytes landed after its outcome"
    );
    let fences: u64 = pb.rail_stats().iter().map(|r| r.fences).sum();
    println!(
        "T1 (16 MiB READ in 1,024 requests, 1 ms deadline): {} after {after:?} ({fences} fences); T2's bytes stayed 300 ms later",
        out1.unwrap_err()
    );
}

/// Finding 1 (WRITE): T1 times out with its requests in flight; T2 then writes other bytes to
/// the same remote range, with a notification. After T2's notification the target holds T2's
/// bytes, and still does later.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_write_that_timed_out_never_lands_after_a_later_write_to_the_same_place() {
    write_after_a_timed_out_write("f1w");
}

fn write_after_a_timed_out_write(name: &str) {
    let cfg = AgentConfig::new(format!("{name}a"))
        .qps_per_peer(2)
        .slice_size(16 * 1024)
        .send_queue_depth(64);
    let bound = bound(&cfg);
    let (a, b, pb, _pa) = connected(agent_with(cfg), agent(&format!("{name}b")));
    let len = 16 * MIB;
    let m1 = a.alloc_host(len as usize, "m1").unwrap();
    let m2 = a.alloc_host(len as usize, "m2").unwrap();
    m1.write(0, &pattern(len as usize, 11)).unwrap();
    m2.write(0, &pattern(len as usize, 12)).unwrap();
    let dst = b.alloc_host(len as usize, "dst").unwrap();
    let r = pb.wait_segment_named("dst", WAIT).unwrap();
    let t0 = Instant::now();
    let t1 = pb
        .write(
            &[Desc::new(&m1, 0, r.id, 0, len)],
            &TransferOptions::new().timeout(Duration::from_millis(1)),
        )
        .unwrap();
    let out1 = t1.wait(WAIT);
    let after = t0.elapsed();
    assert!(matches!(out1, Err(Error::Timeout { .. })), "T1: {out1:?}");
    assert!(after <= Duration::from_millis(1) + bound, "{after:?}");
    pb.write(
        &[Desc::new(&m2, 0, r.id, 0, len)],
        &TransferOptions::new().notify("t2"),
    )
    .unwrap()
    .wait(WAIT)
    .unwrap();
    let n = b
        .wait_notification(WAIT)
        .unwrap()
        .expect("T2's notification");
    assert_eq!(n.data, b"t2");
    let want = pattern(len as usize, 12);
    assert!(
        dst.to_vec(0, len as usize).unwrap() == want,
        "T2's bytes after its notification"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        dst.to_vec(0, len as usize).unwrap() == want,
        "T1's bytes landed at the target after T2's notification"
    );
    let fences: u64 = pb.rail_stats().iter().map(|r| r.fences).sum();
    println!("T1 (16 MiB WRITE in 1,024 requests, 1 ms deadline): timed out, outcome after {after:?} ({fences} fences); T2's bytes stayed");
}

/// Finding 1, with a request that really stays in flight: a notification stuck in the NIC's
/// receiver-not-ready retries at a peer whose application takes none. The transfer's deadline
/// passes; the stuck request outlives the quiesce time, so its queue pairs are fenced
/// (destroyed and renewed at once); the outcome (a timeout: the notification was not
/// delivered) comes after the peer confirmed its side is gone, within the bound; the stuck
/// notification is never delivered; the rail carries the next transfer.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_request_stuck_in_flight_past_the_deadline_is_fenced_and_never_lands_after() {
    let quiesce = Duration::from_millis(50);
    let cfg = AgentConfig::new("fna").quiesce(quiesce);
    let bound = bound(&cfg);
    let (a, b, pb, _pa) = connected(
        agent_with(cfg),
        agent_with(AgentConfig::new("fnb").notify_slots(1).notify_queue(0)),
    );
    let src = a.alloc_host(4096, "src").unwrap();
    let _dst = b.alloc_host(4096, "dst").unwrap();
    let r = pb.wait_segment_named("dst", WAIT).unwrap();
    let desc = [Desc::new(&src, 0, r.id, 0, 4096)];
    // The first notification takes the peer's only slot (nobody takes it).
    pb.write(&desc, &TransferOptions::new().notify("first"))
        .unwrap()
        .wait(WAIT)
        .unwrap();
    // The second one's SEND waits for a slot that never comes.
    let deadline = Duration::from_millis(100);
    let t0 = Instant::now();
    let stuck = pb
        .write(
            &desc,
            &TransferOptions::new().notify("stuck").timeout(deadline),
        )
        .unwrap();
    let out = stuck.wait(WAIT);
    let after = t0.elapsed();
    assert!(matches!(out, Err(Error::Timeout { .. })), "{out:?}");
    assert!(
        after >= deadline + quiesce,
        "reported before its request was fenced: {after:?}"
    );
    assert!(after <= deadline + bound, "{after:?} after submission");
    let fences: u64 = pb.rail_stats().iter().map(|s| s.fences).sum();
    assert!(fences >= 1, "{:#?}", pb.rail_stats());
    // Only the first notification ever arrives; the fenced one is gone with its queue pair.
    assert_eq!(b.wait_notification(WAIT).unwrap().unwrap().data, b"first");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        b.take_notifications().is_empty(),
        "the fenced notification arrived after its outcome"
    );
    pb.write(&desc, &TransferOptions::new().notify("next"))
        .unwrap()
        .wait(WAIT)
        .unwrap();
    assert_eq!(b.wait_notification(WAIT).unwrap().unwrap().data, b"next");
    println!(
        "a notification stuck at a peer taking none: timed out, fenced ({fences} fence(s)), outcome {after:?} after submission (deadline {deadline:?}, quiesce {quiesce:?}); never delivered; the rail carried the next one"
    );
}

/// Writes entry 0 of `local` to entry 0 of `list` through `peer`.
fn write_entry_0(
    peer: &gdr_xfer::Peer,
    local: &LocalList,
    list: &gdr_xfer::RemoteList,
) -> gdr_xfer::Result<gdr_xfer::Transfer> {
    peer.transfer_indexed(Op::Write, local, &[0], list, &[0], &TransferOptions::new())
}

/// Finding 2, and the class of issue 37: every call given an object of another agent of the
/// same process (a segment as a transfer's local side, as the parent of `register_within`, to
/// `deregister`; a peer handle to `disconnect`; a remote list prepared on another connection) is
/// refused before anything changes, with a typed error; an unrelated 4,096-block WRITE to the
/// same peer, in flight meanwhile, succeeds; no rail fails and no connection is lost. (With
/// the VM's two rails, the other agent has one: the review's two-rail initiator and one-rail
/// owner, where a sub-segment of the other agent's segment used to be announced with one
/// remote key for two rails and the peer dropped the whole connection.)
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn another_agents_objects_are_refused_and_fail_nothing_else() {
    let (a, b, pb, pa) = connected(agent("f2a"), agent("f2b"));
    let other = gdr_xfer::Agent::new(
        AgentConfig::new("f2c")
            .device(gdr_test_support::device())
            .max_rails(1),
    )
    .unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let pc = other.connect(&addr.to_string()).unwrap();
    let foreign = other.alloc_host(1 << 20, "foreign").unwrap();
    let pool = b.alloc_host(4096 * 4096, "pool").unwrap();
    let r = pb.wait_segment_named("pool", WAIT).unwrap();
    pc.wait_segment_named("pool", WAIT).unwrap();
    let src = a.alloc_host(4096 * 4096, "src").unwrap();
    src.write(0, &pattern(4096 * 4096, 21)).unwrap();
    let blocks: Vec<u32> = (0..4096).collect();
    let big = pb
        .transfer_blocks(
            Op::Write,
            &BlockTable {
                local: &src,
                local_base: 0,
                remote: r.id,
                remote_base: 0,
                block_len: 4096,
                local_blocks: &blocks,
                remote_blocks: &blocks,
            },
            &TransferOptions::new(),
        )
        .unwrap();
    let foreign_segment = |e: &Error, call: &str, id| matches!(e, Error::ForeignObject { call: c, object: Foreign::Segment(s), .. } if *c == call && *s == id);
    // Transfers from another agent's segment.
    for op in [Op::Write, Op::Read] {
        let e = pb
            .transfer(
                op,
                &[Desc::new(&foreign, 0, r.id, 0, 4096)],
                &TransferOptions::new(),
            )
            .unwrap_err();
        assert!(matches!(e, Error::ForeignSegment { .. }), "{e}");
        println!("{op:?} from another agent's segment: {e}");
    }
    // A sub-segment of another agent's segment, both ways: nothing registered, nothing
    // announced.
    let (mine, theirs) = (a.segments().len(), other.segments().len());
    let e = a.register_within(&foreign, 0, 4096, "carved").unwrap_err();
    assert!(
        foreign_segment(&e, "Agent::register_within", foreign.id()),
        "{e}"
    );
    println!("register_within another agent's segment: {e}");
    let e = other.register_within(&src, 0, 4096, "carved").unwrap_err();
    assert!(
        foreign_segment(&e, "Agent::register_within", src.id()),
        "{e}"
    );
    assert_eq!((a.segments().len(), other.segments().len()), (mine, theirs));
    // Deregistering another agent's segment: it stays registered with its own agent.
    let e = a.deregister(&foreign).unwrap_err();
    assert!(
        foreign_segment(&e, "Agent::deregister", foreign.id()),
        "{e}"
    );
    assert!(other.segments().iter().any(|s| s.id() == foreign.id()));
    // Disconnecting another agent's peer: its connection stays.
    let e = other.disconnect(&pb).unwrap_err();
    assert!(
        matches!(&e, Error::ForeignObject { call: "Agent::disconnect", object: Foreign::Peer(n), .. } if n == "f2b"),
        "{e}"
    );
    println!("disconnect another agent's peer: {e}");
    // A remote list prepared on another agent's connection to the same peer.
    let list = pb.prepare_remote(&[(r.id, 0, 4096)]).unwrap();
    let local = LocalList::new(&[(&foreign, 0, 4096)]).unwrap();
    let e = write_entry_0(&pc, &local, &list).unwrap_err();
    assert!(
        matches!(&e, Error::ForeignObject { call: "Peer::transfer_indexed", object: Foreign::RemoteList(n), .. } if n == "f2b"),
        "{e}"
    );
    println!("a remote list of another agent's connection: {e}");
    big.wait(WAIT).unwrap();
    assert!(pool.to_vec(0, 4096 * 4096).unwrap() == pattern(4096 * 4096, 21));
    for s in pb.rail_stats().iter().chain(pc.rail_stats().iter()) {
        assert_eq!(s.errors, 0, "rail {} failed: {:?}", s.rail, s.last_error);
    }
    assert!(pb.is_connected() && pc.is_connected() && pa.is_connected());
    // Both connections carry the next transfers; a sub-segment of one's own segment is
    // announced as before.
    let carved = a.register_within(&src, 4096, 4096, "carved").unwrap();
    let seen = pa.wait_segment_named("carved", WAIT).unwrap();
    assert_eq!((seen.id, seen.len), (carved.id(), 4096));
    let local = LocalList::new(&[(&src, 0, 4096)]).unwrap();
    write_entry_0(&pb, &local, &list)
        .unwrap()
        .wait(WAIT)
        .unwrap();
    pc.write(
        &[Desc::new(&foreign, 0, r.id, 4096, 4096)],
        &TransferOptions::new(),
    )
    .unwrap()
    .wait(WAIT)
    .unwrap();
    // A segment deregistered by its own agent is refused the same way, typed.
    a.deregister(&src).unwrap();
    let e = pb
        .write(
            &[Desc::new(&src, 0, r.id, 0, 4096)],
            &TransferOptions::new(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::UnknownSegment { .. }), "{e}");
    let e = a.register_within(&src, 0, 4096, "late").unwrap_err();
    assert!(matches!(e, Error::UnknownSegment { .. }), "{e}");
}

/// A remote list prepared on a connection that was closed names the segment ids of that
/// connection's peer; a new connection to a peer of the same name (a restarted agent reuses
/// ids for other memory) refuses it, typed, before anything is posted.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_remote_list_of_an_earlier_connection_is_refused() {
    let a = agent("f2ra");
    let b = agent("f2rb");
    let addr = b.listen("127.0.0.1:0").unwrap().to_string();
    let pb = a.connect(&addr).unwrap();
    let dst = b.alloc_host(4096, "dst").unwrap();
    let r = pb.wait_segment_named("dst", WAIT).unwrap();
    let list = pb.prepare_remote(&[(r.id, 0, 4096)]).unwrap();
    let src = a.alloc_host(4096, "src").unwrap();
    let local = LocalList::new(&[(&src, 0, 4096)]).unwrap();
    a.disconnect(&pb).unwrap();
    let end = Instant::now() + WAIT;
    while b.peer("f2ra").is_some() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    let again = a.connect(&addr).unwrap();
    again.wait_segment_named("dst", WAIT).unwrap();
    let e = write_entry_0(&again, &local, &list).unwrap_err();
    assert!(
        matches!(&e, Error::ForeignObject { object: Foreign::RemoteList(n), .. } if n == "f2rb"),
        "{e}"
    );
    println!("a remote list of an earlier connection: {e}");
    src.write(0, &[7u8; 4096]).unwrap();
    let fresh = again.prepare_remote(&[(r.id, 0, 4096)]).unwrap();
    write_entry_0(&again, &local, &fresh)
        .unwrap()
        .wait(WAIT)
        .unwrap();
    assert_eq!(dst.to_vec(0, 4096).unwrap(), vec![7u8; 4096]);
}

/// Finding 2: a notification longer than the sender's own slots but within the peer's limit.
/// Refused before anything is posted (the limit is the smaller of both agents'), alone.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_notification_longer_than_either_side_takes_is_refused_alone() {
    let (a, b, pb, pa) = connected(
        agent_with(AgentConfig::new("f2na").notify_max(64)),
        agent_with(AgentConfig::new("f2nb").notify_max(4096)),
    );
    let sa = a.alloc_host(4096, "sa").unwrap();
    let sb = b.alloc_host(4096, "sb").unwrap();
    let rb = pb.wait_segment_named("sb", WAIT).unwrap();
    let ra = pa.wait_segment_named("sa", WAIT).unwrap();
    let long = vec![7u8; 1000];
    for (peer, local, remote) in [(&pb, &sa, rb.id), (&pa, &sb, ra.id)] {
        let e = peer
            .write(
                &[Desc::new(local, 0, remote, 0, 4096)],
                &TransferOptions::new().notify(long.clone()),
            )
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::TooLarge {
                    len: 1000,
                    max: 64,
                    ..
                }
            ),
            "{e}"
        );
        println!("{e}");
        peer.write(
            &[Desc::new(local, 0, remote, 0, 4096)],
            &TransferOptions::new().notify(vec![1u8; 64]),
        )
        .unwrap()
        .wait(WAIT)
        .unwrap();
    }
    assert_eq!(b.wait_notification(WAIT).unwrap().unwrap().data.len(), 64);
    assert_eq!(a.wait_notification(WAIT).unwrap().unwrap().data.len(), 64);
    assert!(pb.rail_stats().iter().all(|s| s.errors == 0));
}

/// Finding 3: `Duration::MAX` as the connect timeout, a segment wait and a transfer deadline
/// means "no limit", not a panic.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn timeouts_of_duration_max_mean_no_limit() {
    let (a, b, pb, _pa) = connected(
        agent_with(AgentConfig::new("f3ma").connect_timeout(Duration::MAX)),
        agent_with(AgentConfig::new("f3mb").connect_timeout(Duration::MAX)),
    );
    let _seg = b.alloc_host(4096, "there").unwrap();
    let r = pb.wait_segment_named("there", Duration::MAX).unwrap();
    let src = a.alloc_host(4096, "src").unwrap();
    let t = pb
        .write(
            &[Desc::new(&src, 0, r.id, 0, 4096)],
            &TransferOptions::new().timeout(Duration::MAX),
        )
        .unwrap();
    t.wait(Duration::MAX).unwrap();
    assert_eq!(t.status(), Status::Done);
    a.wait_peer("f3mb", Duration::MAX).unwrap();
}

/// Finding 3: a target with 1,000 segments of 64-byte names (about 100 KB of table, more than
/// a frame) can be connected to: the table is sent in frames cut by size.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_peer_with_a_thousand_long_named_segments_can_be_connected_to() {
    let b = agent("f3tb");
    let pool = b.alloc_host(1000 * 4096, "pool").unwrap();
    for i in 0..1000u64 {
        b.register_within(&pool, i * 4096, 4096, &format!("{i:064}"))
            .unwrap();
    }
    let (_a, _b, pb, _pa) = connected(agent("f3ta"), b);
    let last = pb
        .wait_segment_named(&format!("{:064}", 999), WAIT)
        .unwrap();
    assert_eq!(last.len, 4096);
    assert_eq!(pb.segments().len(), 1001);
    println!(
        "connected to a peer with {} segments of 64-byte names",
        pb.segments().len()
    );
}

/// Finding 3: a peer sending notifications faster than the application takes them is held
/// back, not buffered without bound: at most `notify_queue` plus the slots are kept, the
/// sender's transfers wait (none fails, none is lost), and every notification arrives once
/// when the application takes them.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_peer_faster_than_the_application_is_held_back_and_loses_nothing() {
    let slots = 8u16;
    let queue = 16u32;
    let (a, b, pb, _pa) = connected(
        agent_with(AgentConfig::new("f3na").notify_max(4096)),
        agent_with(
            AgentConfig::new("f3nb")
                .notify_max(4096)
                .notify_slots(slots)
                .notify_queue(queue),
        ),
    );
    let src = a.alloc_host(4096, "src").unwrap();
    let _dst = b.alloc_host(4096, "dst").unwrap();
    let r = pb.wait_segment_named("dst", WAIT).unwrap();
    let n = 200usize;
    let transfers: Vec<_> = (0..n)
        .map(|i| {
            let mut note = vec![0u8; 4096];
            note[..8].copy_from_slice(&(i as u64).to_be_bytes());
            pb.write(
                &[Desc::new(&src, 0, r.id, 0, 64)],
                &TransferOptions::new().notify(note).timeout(WAIT),
            )
            .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let held = b.pending_notifications();
    let rails = b.rails().len();
    let cap = queue as usize + usize::from(slots) * rails;
    let waiting = transfers
        .iter()
        .filter(|t| t.status() == Status::Pending)
        .count();
    println!("after 2 s untaken: {held} notifications kept (cap {cap}), {waiting} of {n} transfers waiting");
    assert!(held <= cap, "{held} kept, more than {cap}");
    assert!(waiting > 0, "the sender was not held back");
    assert!(transfers.iter().all(|t| t.status() != Status::Failed));
    let mut seen = vec![false; n];
    for _ in 0..n {
        let note = b
            .wait_notification(WAIT)
            .unwrap()
            .expect("every notification arrives");
        let i = u64::from_be_bytes(note.data[..8].try_into().unwrap()) as usize;
        assert!(!seen[i], "notification {i} twice");
        seen[i] = true;
    }
    for t in &transfers {
        t.wait(WAIT).unwrap();
    }
    assert_eq!(b.pending_notifications(), 0);
}

/// The audit's reconnect attack: a peer that disconnects and reconnects under the same name
/// made the target hold `notify_queue` plus the slots again per connection (5000 notifications
/// for a bound of 1088). The bound is the agent's: across five connections the target keeps at
/// most `notify_queue` plus one connection's slots, the notifications of closed connections
/// stay queued (none lost), and once the application took them the last connection's slots are
/// posted again and its waiting transfers complete.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn reconnecting_does_not_grow_the_notification_bound() {
    let slots = 4u16;
    let queue = 8u32;
    let b = agent_with(
        AgentConfig::new("f3rb")
            .notify_slots(slots)
            .notify_queue(queue),
    );
    let addr = b.listen("127.0.0.1:0").unwrap().to_string();
    let _dst = b.alloc_host(4096, "dst").unwrap();
    let a = agent("f3ra");
    let src = a.alloc_host(4096, "src").unwrap();
    let rails = b.rails().len();
    let cap = queue as usize + usize::from(slots) * rails;
    let per_round = 3 * cap;
    let rounds = 5;
    let mut last = Vec::new();
    let mut peak = 0;
    for round in 0..rounds {
        // The same name again: b forgets the old connection once a's goodbye arrived.
        let end = Instant::now() + WAIT;
        let pb = loop {
            match a.connect(&addr) {
                Ok(p) => break p,
                Err(e) if Instant::now() < end => {
                    println!("round {round}: connect: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("round {round}: {e}"),
            }
        };
        let r = pb.wait_segment_named("dst", WAIT).unwrap();
        let last_round = round == rounds - 1;
        let timeout = if last_round {
            WAIT
        } else {
            Duration::from_secs(3)
        };
        let transfers: Vec<_> = (0..per_round)
            .map(|i| {
                let id = (round * per_round + i) as u64;
                pb.write(
                    &[Desc::new(&src, 0, r.id, 0, 64)],
                    &TransferOptions::new()
                        .notify(id.to_be_bytes().to_vec())
                        .timeout(timeout),
                )
                .unwrap()
            })
            .collect();
        std::thread::sleep(Duration::from_secs(1));
        let held = b.pending_notifications();
        peak = peak.max(held);
        println!("round {round}: {held} notifications kept (bound {cap})");
        assert!(
            held <= cap,
            "round {round}: {held} kept, over the agent's bound {cap}"
        );
        if last_round {
            last = transfers;
        } else {
            a.disconnect(&pb).unwrap();
            for t in transfers {
                let _ = t.wait(WAIT);
            }
        }
    }
    // Every notification kept arrives once; then the last connection's slots are posted again
    // and its transfers complete, their notifications arriving too.
    let mut seen = std::collections::HashSet::new();
    let mut got = 0;
    let last_ids = ((rounds - 1) * per_round) as u64..(rounds * per_round) as u64;
    // Until every transfer of the last round completed and each of its notifications was
    // taken: a transfer completes when its notification reached b's NIC, a moment before b's
    // progress thread queues it, so an empty queue alone does not say all arrived.
    let end = Instant::now() + WAIT;
    while last.iter().any(|t| t.status() == Status::Pending)
        || !last_ids.clone().all(|i| seen.contains(&i))
    {
        assert!(
            Instant::now() < end,
            "the last round's transfers and notifications did not all arrive: {} pending, {:?} missing",
            last.iter().filter(|t| t.status() == Status::Pending).count(),
            last_ids.clone().filter(|i| !seen.contains(i)).collect::<Vec<_>>()
        );
        for n in b.take_notifications() {
            let id = u64::from_be_bytes(n.data[..8].try_into().unwrap());
            assert!(seen.insert(id), "notification {id} twice");
            got += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for t in &last {
        t.wait(WAIT)
            .expect("the last connection's transfers complete once taken");
    }
    println!("{got} notifications taken, peak {peak} kept (bound {cap})");
}

/// A cancelled transfer reports once its requests are retired; its memory is then quiet and
/// the connection serves the next transfer.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_cancelled_transfer_reports_when_its_memory_is_quiet() {
    let (a, b, pb, _pa) = connected(agent("cxa"), agent("cxb"));
    let len = 32 * MIB;
    let src = a.alloc_host(len as usize, "src").unwrap();
    let _dst = b.alloc_host(len as usize, "dst").unwrap();
    let r = pb.wait_segment_named("dst", WAIT).unwrap();
    let weak = src.registration_weak();
    let t = pb
        .write(
            &[Desc::new(&src, 0, r.id, 0, len)],
            &TransferOptions::new().notify("never"),
        )
        .unwrap();
    t.cancel();
    t.cancel();
    let out = t.wait(WAIT);
    assert!(
        matches!(out, Err(Error::Cancelled { .. }) | Ok(_)),
        "{out:?}"
    );
    drop(t);
    a.deregister(&src).unwrap();
    drop(src);
    // Quiet: nothing of the transfer holds the memory any more.
    let start = Instant::now();
    while weak.is_alive() && start.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        !weak.is_alive(),
        "a cancelled transfer still held its memory"
    );
    if out.is_err() {
        assert!(
            b.take_notifications().is_empty(),
            "a cancelled transfer's notification was sent"
        );
    }
    let s2 = a.alloc_host(4096, "s2").unwrap();
    pb.write(&[Desc::new(&s2, 0, r.id, 0, 4096)], &TransferOptions::new())
        .unwrap()
        .wait(WAIT)
        .unwrap();
    println!("cancelled 32 MiB write: {out:?}");
}

/// `register_within` racing the deregistration of its parent, from threads, as an adversary
/// would: each carve either succeeds (it stays registered, and the peer is told of it) or is
/// refused with `UnknownSegment` (nothing registered, nothing announced), never anything else;
/// the parent's removal reaches the peer; the connection and the transfers after it are
/// untouched. The parent's admission and the child's insertion are one step under the
/// endpoint's lock: a carve cannot land in the table after its parent left it.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn carving_a_parent_while_it_is_deregistered_carves_only_from_a_live_parent() {
    use std::sync::Barrier;
    let (a, b, pb, pa) = connected(agent("race-a"), agent("race-b"));
    let dst = b.alloc_host(4096, "race-dst").unwrap();
    let rd = pb.wait_segment_named("race-dst", WAIT).unwrap();
    let (threads, per_thread) = (4usize, 16u64);
    let (mut carved, mut refused) = (Vec::new(), Vec::new());
    for round in 0..12 {
        let parent = a
            .alloc_host(1 << 16, &format!("race-parent-{round}"))
            .unwrap();
        pa.wait_segment_named(&format!("race-parent-{round}"), WAIT)
            .unwrap();
        let start = Barrier::new(threads + 1);
        let results: Vec<(String, gdr_xfer::Result<gdr_xfer::Segment>)> = std::thread::scope(|s| {
            let carvers: Vec<_> = (0..threads)
                .map(|t| {
                    let (a, parent, start) = (&a, &parent, &start);
                    s.spawn(move || {
                        start.wait();
                        (0..per_thread)
                            .map(|i| {
                                let name = format!("race-{round}-{t}-{i}");
                                let r = a.register_within(parent, i * 4096, 4096, &name);
                                (name, r)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            start.wait();
            // Round by round, the deregistration comes earlier or later among the carves.
            std::thread::sleep(Duration::from_micros(round * 150));
            a.deregister(&parent).unwrap();
            carvers
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        // The parent is gone, once: a second deregistration is refused.
        assert!(matches!(
            a.deregister(&parent),
            Err(Error::UnknownSegment { .. })
        ));
        for (name, r) in results {
            match r {
                Ok(seg) => carved.push((name, seg)),
                Err(Error::UnknownSegment { segment, .. }) => {
                    assert_eq!(segment, parent.id(), "{name}: refused for its parent");
                    refused.push(name);
                }
                Err(e) => panic!("{name}: neither carved nor refused as gone: {e}"),
            }
        }
    }
    // Control messages arrive in order: once a segment registered after the races is seen,
    // every announcement made during them was applied.
    let _marker = a.alloc_host(4096, "race-marker").unwrap();
    pa.wait_segment_named("race-marker", WAIT).unwrap();
    let mine: Vec<gdr_xfer::SegmentId> = a.segments().iter().map(|s| s.id()).collect();
    let seen: Vec<String> = pa.segments().into_iter().map(|s| s.name).collect();
    for (name, seg) in &carved {
        assert!(mine.contains(&seg.id()), "{name} carved but not registered");
        assert!(seen.contains(name), "{name} carved but never announced");
    }
    for name in &refused {
        assert!(!seen.contains(name), "{name} refused but announced");
    }
    assert!(
        !seen.iter().any(|n| n.starts_with("race-parent-")),
        "a deregistered parent is still in the peer's table"
    );
    // The connection is untouched, and a carved segment is a transfer's source as any other.
    assert!(pb.is_connected() && pa.is_connected());
    if let Some((_, seg)) = carved.first() {
        seg.write(0, &pattern(4096, 5)).unwrap();
        pb.write(
            &[Desc::new(seg, 0, rd.id, 0, 4096)],
            &TransferOptions::new(),
        )
        .unwrap()
        .wait(WAIT)
        .unwrap();
        assert_eq!(dst.to_vec(0, 4096).unwrap(), pattern(4096, 5));
    }
    println!(
        "register_within racing deregister: {} carved, {} refused as gone, 0 otherwise",
        carved.len(),
        refused.len()
    );
}
