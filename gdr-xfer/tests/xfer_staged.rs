//! Staged GPU memory through the engine, on the test device, with an emulated GPU (feature
//! `emulated-gpu`): every transfer from or to it goes through bounce buffers, chunk by chunk,
//! as GPU memory without GPUDirect does. What is checked: every byte of WRITEs and READs, paged
//! and listed, mixed with host memory; the notification after all the data; deadlines and dead
//! peers; bounce buffers reused only once the NIC let go of them; memory held until the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr_test_support::pattern;
use gdr_test_support::xfer::{agent, agent_with, connected};
use gdr_xfer::staging::EmulatedGpu;
use gdr_xfer::staging::StagingConfig;
use gdr_xfer::{
    Agent, AgentConfig, BlockTable, Desc, Error, Op, SegmentPath, Status, TransferOptions,
};

const WAIT: Duration = Duration::from_secs(60);
const BLOCK: usize = 16 * 1024;

/// An agent whose staged memory uses `chunks` bounce buffers of `chunk` bytes (small, so that
/// a transfer cycles through every buffer many times).
fn staged_agent(name: &str, chunk: usize, chunks: usize) -> Agent {
    let mut staging = StagingConfig::new(chunk, chunks);
    staging.min_piece = 4096;
    agent_with(AgentConfig::new(name).staging(staging))
}

fn wait_gone(weak: &gdr_xfer::RegistrationWeak) -> bool {
    let start = Instant::now();
    while weak.is_alive() && start.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(1));
    }
    !weak.is_alive()
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn staged_writes_and_reads_move_every_byte() {
    let (a, b, pb, _pa) = connected(staged_agent("sa", 1 << 20, 4), agent("sb"));
    let len = 12 << 20;
    let gpu = EmulatedGpu::new(0, len);
    let data = pattern(len, 41);
    gpu.write(0, &data).unwrap();
    let seg = a.register_emulated_gpu(&gpu, .., "weights").unwrap();
    let SegmentPath::Staged(how) = seg.path() else {
        panic!("not staged: {:?}", seg.path());
    };
    println!("path: {how}");
    assert!(how.contains("4 x 1 MiB"), "{how}");
    assert!(!seg.is_published());
    let dst = b.alloc_host(len, "dst").unwrap();
    let remote = pb.wait_segment_named("dst", WAIT).unwrap();
    // The peer never hears of a staged segment.
    std::thread::sleep(Duration::from_millis(50));
    assert!(b
        .peer("sa")
        .unwrap()
        .segments()
        .iter()
        .all(|s| s.name != "weights"));

    // One large WRITE: 12 chunks through 4 bounce buffers.
    let t = pb
        .write(
            &[Desc::new(&seg, 0, remote.id, 0, len as u64)],
            &TransferOptions::new(),
        )
        .unwrap();
    let stats = t.wait(WAIT).unwrap();
    assert_eq!(stats.bytes, len as u64);
    assert!(stats.qps_used >= 1 && stats.rails_used >= 1, "{stats:?}");
    assert_eq!(dst.to_vec(0, len).unwrap(), data, "large staged WRITE");
    println!("12 MiB staged WRITE: {stats:?}");

    // A paged WRITE of 700 scattered 16 KiB blocks.
    // Fewer blocks than the segment has, so that no remote block is written twice.
    let blocks = 700u32;
    let nblocks = (len / BLOCK) as u32;
    let local: Vec<u32> = (0..blocks).map(|i| (i * 7) % nblocks).collect();
    let remote_blocks: Vec<u32> = (0..blocks).map(|i| (i * 13 + 5) % nblocks).collect();
    let fresh = pattern(len, 42);
    gpu.write(0, &fresh).unwrap();
    let table = BlockTable {
        local: &seg,
        local_base: 0,
        remote: remote.id,
        remote_base: 0,
        block_len: BLOCK as u64,
        local_blocks: &local,
        remote_blocks: &remote_blocks,
    };
    let stats = pb
        .transfer_blocks(Op::Write, &table, &TransferOptions::new())
        .unwrap()
        .wait(WAIT)
        .unwrap();
    assert_eq!(stats.bytes, u64::from(blocks) * BLOCK as u64);
    let got = dst.to_vec(0, len).unwrap();
    for (&l, &r) in local.iter().zip(&remote_blocks) {
        let (l, r) = (l as usize * BLOCK, r as usize * BLOCK);
        assert_eq!(got[r..r + BLOCK], fresh[l..l + BLOCK], "block {l} -> {r}");
    }

    // READ the whole destination back into a second staged segment of the same GPU.
    let back_gpu = EmulatedGpu::new(0, len);
    let back = a.register_emulated_gpu(&back_gpu, .., "back").unwrap();
    let stats = pb
        .read(
            &[Desc::new(&back, 0, remote.id, 0, len as u64)],
            &TransferOptions::new(),
        )
        .unwrap()
        .wait(WAIT)
        .unwrap();
    let mut read = vec![0u8; len];
    back_gpu.read(0, &mut read).unwrap();
    assert_eq!(read, got, "staged READ");
    // The segment reads through the emulated device too.
    assert_eq!(back.to_vec(4096, 64).unwrap(), got[4096..4096 + 64]);
    println!("12 MiB staged READ: {stats:?}; 700 paged blocks verified");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_staged_notification_arrives_only_after_all_the_data() {
    let (a, b, pb, _pa) = connected(staged_agent("na", 256 << 10, 3), agent("nb"));
    let len = 4 << 20;
    let gpu = EmulatedGpu::new(1, len);
    let seg = a.register_emulated_gpu(&gpu, .., "kv").unwrap();
    let host = a.alloc_host(1 << 20, "host").unwrap();
    let dst = b.alloc_host(len + (1 << 20), "dst").unwrap();
    let remote = pb.wait_segment_named("dst", WAIT).unwrap();
    for round in 0..6u32 {
        let data = pattern(len, 200 + round);
        gpu.write(0, &data).unwrap();
        let tail = pattern(1 << 20, 300 + round);
        host.write(0, &tail).unwrap();
        let key = format!("round-{round}");
        // Odd rounds end with a run of host memory: the notification then goes with it.
        let mut descs = vec![Desc::new(&seg, 0, remote.id, 0, len as u64)];
        if round % 2 == 1 {
            descs.push(Desc::new(&host, 0, remote.id, len as u64, 1 << 20));
        }
        let _t = pb
            .write(&descs, &TransferOptions::new().notify(key.clone()))
            .unwrap();
        let n = b.wait_notification(WAIT).unwrap().expect("a notification");
        let got = dst.to_vec(0, len + (1 << 20)).unwrap();
        assert_eq!(n.data, key.as_bytes());
        assert_eq!(
            got[..len].iter().zip(&data).position(|(x, y)| x != y),
            None,
            "round {round}: staged data not complete when the notification came"
        );
        if round % 2 == 1 {
            assert_eq!(got[len..], tail[..], "round {round}: host run");
        }
    }
    println!("6 rounds of 4 MiB staged (3 x 256 KiB bounce buffers), half with a host run last: each notification found all its data");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn dropped_staged_transfers_hold_the_memory_until_the_end_then_release_it() {
    let (a, b, pb, _pa) = connected(staged_agent("da", 512 << 10, 2), agent("db"));
    let len = 16 << 20;
    let gpu = EmulatedGpu::new(0, len);
    gpu.write(0, &pattern(len, 7)).unwrap();
    let dst = b.alloc_host(len, "dst").unwrap();
    let remote = pb.wait_segment_named("dst", WAIT).unwrap();
    let seg = a.register_emulated_gpu(&gpu, .., "src").unwrap();
    let weak = seg.registration_weak();
    let t = pb
        .write(
            &[Desc::new(&seg, 0, remote.id, 0, len as u64)],
            &TransferOptions::new().notify("done"),
        )
        .unwrap();
    drop(t);
    a.deregister(&seg).unwrap();
    drop(seg);
    let held = weak.is_alive();
    b.wait_notification(WAIT)
        .unwrap()
        .expect("the dropped staged transfer still completes");
    assert!(held, "the staged memory was let go while its transfer ran");
    assert!(wait_gone(&weak), "the staged memory leaked");
    assert_eq!(dst.to_vec(0, len).unwrap(), pattern(len, 7));
    // The emulated device itself is only ours again.
    assert_eq!(Arc::strong_count(&gpu), 1);
    println!("dropped handle + deregistered segment: memory held while in flight ({held}), released after the notification");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn staged_transfers_fail_at_their_deadline_or_with_their_peer_and_the_buffers_work_after() {
    let a = staged_agent("fa", 4 << 20, 2);
    let (a, b, pb, _pa) = connected(a, agent("fb"));
    let len = 16 << 20;
    let gpu = EmulatedGpu::new(0, len);
    gpu.write(0, &pattern(len, 3)).unwrap();
    let seg = a.register_emulated_gpu(&gpu, .., "src").unwrap();
    let dst = b.alloc_host(len, "dst").unwrap();
    let remote = pb.wait_segment_named("dst", WAIT).unwrap();

    // A deadline far too short for 16 MiB through 2 x 4 MiB.
    let t = pb
        .write(
            &[Desc::new(&seg, 0, remote.id, 0, len as u64)],
            &TransferOptions::new().timeout(Duration::from_millis(20)),
        )
        .unwrap();
    let e = t.wait(WAIT).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert_eq!(t.status(), Status::Failed);
    let at_failure = a.staging_stats();
    println!("deadline: {e}; then {at_failure:?}");
    // Its bounce buffers come back only once gdr retired the requests still in flight.
    let start = Instant::now();
    while a.staging_stats().chunks_in_use > 0 && start.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(1));
    }
    let after = a.staging_stats();
    println!(
        "all bounce buffers back {:?} after the failure: {after:?}",
        start.elapsed()
    );
    assert_eq!(after.chunks_in_use, 0, "{after:?}");
    // (On one rxe device the provider moves a request's bytes inside ibv_post_send, so no
    // request outlives its child here; cluster3_xfer's t4 cuts the links to make them.)

    // The bounce buffers come back once the NIC let go: the next transfers work.
    for round in 0..3u32 {
        let data = pattern(len, 10 + round);
        gpu.write(0, &data).unwrap();
        pb.write(
            &[Desc::new(&seg, 0, remote.id, 0, len as u64)],
            &TransferOptions::new(),
        )
        .unwrap()
        .wait(WAIT)
        .unwrap();
        assert_eq!(
            dst.to_vec(0, len).unwrap(),
            data,
            "round {round} after the deadline"
        );
    }
    let st = a.staging_stats();
    println!("after the deadline and 3 rounds: {st:?}");
    assert_eq!((st.active_transfers, st.chunks_in_use), (0, 0), "{st:?}");
    assert_eq!((st.buffers, st.transfers), (2, 4), "{st:?}");

    // The peer dies with staged transfers in flight: they fail within their deadline.
    let pending: Vec<_> = (0..4)
        .map(|_| {
            pb.write(
                &[Desc::new(&seg, 0, remote.id, 0, len as u64)],
                &TransferOptions::new().timeout(Duration::from_secs(20)),
            )
            .unwrap()
        })
        .collect();
    let killed = Instant::now();
    drop(dst);
    drop(b);
    let mut errors = Vec::new();
    for t in &pending {
        if let Err(e) = t.wait(WAIT) {
            errors.push(e);
        }
    }
    let took = killed.elapsed();
    println!(
        "peer gone: {} of 4 staged transfers failed within {took:?}: {:?}",
        errors.len(),
        errors.first().map(|e| e.to_string())
    );
    assert!(!errors.is_empty(), "a transfer survived its peer's end");
    assert!(
        errors.iter().all(|e| matches!(
            e,
            Error::PeerLost { .. } | Error::SliceFailed { .. } | Error::NoRail { .. }
        )),
        "{errors:?}"
    );
    assert!(
        took < Duration::from_secs(20),
        "past the deadline: {took:?}"
    );

    // A new peer: the same bounce buffers carry its transfers.
    let c = agent("fc");
    let addr = c.listen("127.0.0.1:0").unwrap();
    let pc = a.connect(&addr.to_string()).unwrap();
    let dst = c.alloc_host(len, "dst").unwrap();
    let remote = pc.wait_segment_named("dst", WAIT).unwrap();
    let data = pattern(len, 99);
    gpu.write(0, &data).unwrap();
    pc.write(
        &[Desc::new(&seg, 0, remote.id, 0, len as u64)],
        &TransferOptions::new(),
    )
    .unwrap()
    .wait(WAIT)
    .unwrap();
    assert_eq!(dst.to_vec(0, len).unwrap(), data, "after the peer died");
    let start = Instant::now();
    while a.staging_stats().active_transfers > 0 && start.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = a.staging_stats();
    println!("at the end: {st:?}");
    assert_eq!((st.active_transfers, st.chunks_in_use), (0, 0), "{st:?}");
    println!("the bounce buffers carried 16 MiB to a new peer after the old one died");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn concurrent_staged_transfers_share_the_bounce_buffers_without_mixing_bytes() {
    let (a, b, pb, _pa) = connected(staged_agent("ca", 128 << 10, 4), agent("cb"));
    let per = 1 << 20;
    let threads = 4;
    let gpu = EmulatedGpu::new(0, per * threads);
    let seg = a.register_emulated_gpu(&gpu, .., "src").unwrap();
    let back_gpu = EmulatedGpu::new(0, per * threads);
    let back = a.register_emulated_gpu(&back_gpu, .., "back").unwrap();
    let _dst = b.alloc_host(per * threads, "dst").unwrap();
    let remote = pb.wait_segment_named("dst", WAIT).unwrap();
    for i in 0..threads {
        gpu.write(i * per, &pattern(per, 500 + i as u32)).unwrap();
    }
    std::thread::scope(|s| {
        for i in 0..threads {
            let (pb, seg, back) = (&pb, &seg, &back);
            s.spawn(move || {
                let at = (i * per) as u64;
                for _ in 0..3 {
                    pb.write(
                        &[Desc::new(seg, at, remote.id, at, per as u64)],
                        &TransferOptions::new(),
                    )
                    .unwrap()
                    .wait(WAIT)
                    .unwrap();
                    pb.read(
                        &[Desc::new(back, at, remote.id, at, per as u64)],
                        &TransferOptions::new(),
                    )
                    .unwrap()
                    .wait(WAIT)
                    .unwrap();
                }
            });
        }
    });
    let mut got = vec![0u8; per * threads];
    back_gpu.read(0, &mut got).unwrap();
    for i in 0..threads {
        assert_eq!(
            got[i * per..(i + 1) * per],
            pattern(per, 500 + i as u32)[..],
            "thread {i}"
        );
    }
    println!(
        "4 threads x 3 rounds of 1 MiB WRITE + READ through 4 shared bounce buffers: no byte mixed"
    );
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn bad_input_on_staged_segments_is_refused_before_anything_moves() {
    let (a, _b, pb, _pa) = connected(staged_agent("ba", 1 << 20, 2), agent("bb"));
    let gpu = EmulatedGpu::new(0, 1 << 20);
    assert!(matches!(
        a.register_emulated_gpu(&gpu, 0..(2 << 20), "too-long"),
        Err(Error::InvalidArgument { .. }) | Err(Error::OutOfSegment { .. })
    ));
    let seg = a.register_emulated_gpu(&gpu, 4096..8192, "window").unwrap();
    let remote = pb.wait_segment_named("dst-none", Duration::from_millis(10));
    assert!(matches!(remote, Err(Error::Timeout { .. })));
    let e = pb
        .write(
            &[Desc::new(&seg, 0, gdr_xfer::SegmentId::new(12345), 0, 4096)],
            &TransferOptions::new(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::UnknownSegment { .. }), "{e}");
    let e = pb
        .write(
            &[Desc::new(&seg, 1, gdr_xfer::SegmentId::new(12345), 0, 4096)],
            &TransferOptions::new(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::OutOfSegment { .. }), "{e}");
    // Staging config errors are typed.
    let e = Agent::new(
        AgentConfig::new("bad")
            .device(gdr_test_support::device())
            .staging(StagingConfig::new(0, 4)),
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn dropping_the_agent_fails_its_staged_transfers_and_releases_their_memory() {
    let (a, b, pb, _pa) = connected(staged_agent("xa", 256 << 10, 2), agent("xb"));
    let len = 16 << 20;
    let gpu = EmulatedGpu::new(0, len);
    let seg = a.register_emulated_gpu(&gpu, .., "src").unwrap();
    let weak = seg.registration_weak();
    let _dst = b.alloc_host(len, "dst").unwrap();
    let remote = pb.wait_segment_named("dst", WAIT).unwrap();
    let pending: Vec<_> = (0..4)
        .map(|_| {
            pb.write(
                &[Desc::new(&seg, 0, remote.id, 0, len as u64)],
                &TransferOptions::new(),
            )
            .unwrap()
        })
        .collect();
    drop(seg);
    let start = Instant::now();
    drop(pb);
    drop(a);
    let dropped_in = start.elapsed();
    let outcomes: Vec<_> = pending.iter().map(|t| t.wait(WAIT)).collect();
    for o in &outcomes {
        match o {
            Ok(_) | Err(Error::AgentClosed) | Err(Error::PeerLost { .. }) => {}
            Err(e) => panic!("unexpected: {e}"),
        }
    }
    assert!(
        outcomes.iter().any(|o| o.is_err()),
        "all 64 MiB were done before the drop"
    );
    assert!(wait_gone(&weak), "the staged memory outlived its agent");
    assert_eq!(Arc::strong_count(&gpu), 1);
    println!(
        "agent dropped in {dropped_in:?} with 4 staged writes pending: {:?}",
        outcomes
            .iter()
            .map(|o| o.as_ref().map(|_| "done").unwrap_or("failed"))
            .collect::<Vec<_>>()
    );
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn more_staged_transfers_than_the_stager_has_tickets_wait_their_turn() {
    // 3 tickets and 2 bounce buffers for 12 paged writes of 16 blocks each, all at once.
    let mut staging = StagingConfig::new(64 << 10, 2);
    staging.min_piece = 4096;
    staging.max_tickets = 3;
    let (a, b, pb, _pa) = connected(
        agent_with(AgentConfig::new("ta").staging(staging)),
        agent("tb"),
    );
    let transfers = 12u32;
    let per = 16u32;
    let gpu = EmulatedGpu::new(0, (transfers * per) as usize * BLOCK);
    let data = pattern(gpu.len(), 77);
    gpu.write(0, &data).unwrap();
    let seg = a.register_emulated_gpu(&gpu, .., "src").unwrap();
    let dst = b.alloc_host(gpu.len(), "dst").unwrap();
    let remote = pb.wait_segment_named("dst", WAIT).unwrap();
    // Block k of transfer t goes from local block t*per+k to remote block (t*per+k) reversed
    // within the transfer, so nothing merges and every block is its own run (and ticket).
    let tables: Vec<(Vec<u32>, Vec<u32>)> = (0..transfers)
        .map(|t| {
            let local: Vec<u32> = (0..per).map(|k| t * per + k).collect();
            let remote: Vec<u32> = (0..per).map(|k| t * per + (per - 1 - k)).collect();
            (local, remote)
        })
        .collect();
    let pending: Vec<_> = tables
        .iter()
        .enumerate()
        .map(|(t, (l, r))| {
            pb.transfer_blocks(
                Op::Write,
                &BlockTable {
                    local: &seg,
                    local_base: 0,
                    remote: remote.id,
                    remote_base: 0,
                    block_len: BLOCK as u64,
                    local_blocks: l,
                    remote_blocks: r,
                },
                &TransferOptions::new().notify(format!("t{t}")),
            )
            .unwrap()
        })
        .collect();
    for (t, p) in pending.iter().enumerate() {
        let s = p.wait(WAIT).unwrap_or_else(|e| panic!("transfer {t}: {e}"));
        assert_eq!(s.runs, u64::from(per));
    }
    let mut notes = 0;
    while notes < transfers {
        b.wait_notification(WAIT)
            .unwrap()
            .expect("a notification per transfer");
        notes += 1;
    }
    let got = dst.to_vec(0, gpu.len()).unwrap();
    for (l, r) in &tables {
        for (&lb, &rb) in l.iter().zip(r) {
            let (l, r) = (lb as usize * BLOCK, rb as usize * BLOCK);
            assert_eq!(got[r..r + BLOCK], data[l..l + BLOCK], "block {lb} -> {rb}");
        }
    }
    let st = a.staging_stats();
    assert_eq!(st.chunks, u64::from(transfers * per), "{st:?}");
    println!("12 paged staged writes of 16 blocks at once through 3 tickets and 2 buffers: all verified; {st:?}");
}

/// Engine review, finding 2 (staged form): another agent's staged segment as the local side
/// used to index that agent's bounce buffers and panic the staging thread (after which no
/// staged deadline fired). It is refused before anything moves; this agent's own staged
/// transfers go on, and a staged deadline still fires.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn another_agents_staged_segment_is_refused_and_staging_goes_on() {
    let (a, b, pb, _pa) = connected(staged_agent("fsa", 1 << 20, 4), agent("fsb"));
    let other = Agent::new(
        AgentConfig::new("fsc")
            .device(gdr_test_support::device())
            .max_rails(1),
    )
    .unwrap();
    let len = 4 << 20;
    let theirs_gpu = EmulatedGpu::new(5, len);
    let theirs = other
        .register_emulated_gpu(&theirs_gpu, .., "theirs")
        .unwrap();
    let ours_gpu = EmulatedGpu::new(0, len);
    ours_gpu.write(0, &pattern(len, 77)).unwrap();
    let ours = a.register_emulated_gpu(&ours_gpu, .., "ours").unwrap();
    let dst = b.alloc_host(len, "dst").unwrap();
    let r = pb.wait_segment_named("dst", WAIT).unwrap();
    let e = pb
        .write(
            &[Desc::new(&theirs, 0, r.id, 0, len as u64)],
            &TransferOptions::new(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::ForeignSegment { .. }), "{e}");
    pb.write(
        &[Desc::new(&ours, 0, r.id, 0, len as u64)],
        &TransferOptions::new(),
    )
    .unwrap()
    .wait(WAIT)
    .unwrap();
    assert!(dst.to_vec(0, len).unwrap() == pattern(len, 77));
    // The staging thread is alive: a staged transfer past its deadline fails at it.
    let t = pb
        .write(
            &[Desc::new(&ours, 0, r.id, 0, len as u64)],
            &TransferOptions::new().timeout(Duration::from_micros(1)),
        )
        .unwrap();
    let out = t.wait(WAIT);
    assert!(matches!(out, Err(Error::Timeout { .. }) | Ok(_)), "{out:?}");
    println!("another agent's staged segment: {e}; our staged write and deadline: fine");
}

/// Engine review, finding 3: two threads registering different GPUs at once could give a
/// segment the other GPU's bounce buffers (the index was read after the lock was let go).
/// Eight threads register eight emulated GPUs at once, each many times; every segment is
/// staged through its own GPU's buffers, and a transfer from each moves its own bytes.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn gpus_registered_at_once_each_get_their_own_bounce_buffers() {
    let (a, b, pb, _pa) = connected(staged_agent("fga", 256 << 10, 2), agent("fgb"));
    let len = 1 << 20;
    let gpus: Vec<Arc<EmulatedGpu>> = (0..8u32)
        .map(|g| {
            let gpu = EmulatedGpu::new(g, len);
            gpu.write(0, &pattern(len, 500 + g)).unwrap();
            gpu
        })
        .collect();
    let segs: Vec<gdr_xfer::Segment> = std::thread::scope(|s| {
        let hs: Vec<_> = gpus
            .iter()
            .map(|gpu| {
                let a = &a;
                s.spawn(move || {
                    let mut last = None;
                    for k in 0..4 {
                        last = Some(
                            a.register_emulated_gpu(gpu, .., &format!("g{}-{k}", gpu.ordinal()))
                                .unwrap(),
                        );
                    }
                    last.unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let dst = b.alloc_host(8 * len, "dst").unwrap();
    let r = pb.wait_segment_named("dst", WAIT).unwrap();
    for (g, seg) in segs.iter().enumerate() {
        let SegmentPath::Staged(how) = seg.path() else {
            panic!("not staged: {:?}", seg.path());
        };
        assert!(
            how.contains(&format!("emulated GPU {g} ")),
            "segment of GPU {g}: {how}"
        );
        pb.write(
            &[Desc::new(seg, 0, r.id, (g * len) as u64, len as u64)],
            &TransferOptions::new(),
        )
        .unwrap()
        .wait(WAIT)
        .unwrap();
        assert!(
            dst.to_vec((g * len) as u64, len).unwrap() == pattern(len, 500 + g as u32),
            "GPU {g}"
        );
    }
    assert_eq!(a.staging_stats().gpus.len(), 8);
    println!("8 GPUs registered at once from 8 threads: each staged through its own buffers");
}
