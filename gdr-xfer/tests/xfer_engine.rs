//! The engine between two agents of one process on the test device: transfers of every form,
//! merging and slicing, notifications after the data, memory kept alive by requests in flight,
//! and every bad input refused before anything is posted.

use std::future::Future;
use std::time::Duration;

use gdr_test_support::pattern;
use gdr_test_support::xfer::{agent, agent_with, connected};
use gdr_xfer::{
    AgentConfig, BlockTable, Desc, Error, LocalList, Op, SegmentId, Side, Status, TransferOptions,
};

const NEEDS: &str =
    "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)";
const WAIT: Duration = Duration::from_secs(30);

/// Waits (up to [`WAIT`]) until nothing holds a registration any more.
fn wait_released(weak: &gdr_xfer::RegistrationWeak) {
    let start = std::time::Instant::now();
    while weak.is_alive() && start.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Agents `a` (slices of 4 KiB) and `b` connected, `b` with a 32 MiB segment `dst`, and a
/// 32 MiB segment `src` of `a` with its registration's weak reference.
fn big_pair(
    a: &str,
    b: &str,
) -> (
    gdr_xfer::Agent,
    gdr_xfer::Agent,
    gdr_xfer::Peer,
    gdr_xfer::Segment,
    gdr_xfer::Segment,
    SegmentId,
    gdr_xfer::RegistrationWeak,
) {
    let (a, b, pb, _pa) = connected(agent_with(AgentConfig::new(a).slice_size(4096)), agent(b));
    let len = 32 << 20;
    let dst = b.alloc_host(len, "dst").unwrap();
    let r = pb.wait_segment_named("dst", WAIT).unwrap();
    let src = a.alloc_host(len, "src").unwrap();
    let weak = src.registration_weak();
    (a, b, pb, src, dst, r.id, weak)
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn descriptor_lists_are_merged_sliced_and_land_byte_for_byte() {
    let _ = NEEDS;
    let (a, b, pb, _pa) = connected(
        agent_with(AgentConfig::new("a").slice_size(16 * 1024).qps_per_peer(2)),
        agent("b"),
    );
    let len = 1 << 20;
    let src = a.alloc_host(len, "src").unwrap();
    let dst = b.alloc_host(len, "dst").unwrap();
    let data = pattern(len, 1);
    src.write(0, &data).unwrap();
    let remote = pb.wait_segment_named("dst", WAIT).unwrap();
    assert_eq!(remote.len, len as u64);
    // 64 descriptors of 8 KiB contiguous on both sides (merge into one run), then 64 scattered
    // ones (swapped halves: nothing merges).
    let mut descs: Vec<Desc<'_>> = (0..64)
        .map(|i| Desc::new(&src, i * 8192, remote.id, i * 8192, 8192))
        .collect();
    let half = (len / 2) as u64;
    for i in 0..64u64 {
        let off = half + i * 8192;
        let to = half + (63 - i) * 8192;
        descs.push(Desc::new(&src, off, remote.id, to, 8192));
    }
    let t = pb.write(&descs, &TransferOptions::new()).unwrap();
    let stats = t.wait(WAIT).unwrap();
    println!("write stats: {stats:?}");
    assert_eq!(t.status(), Status::Done);
    assert_eq!(stats.bytes, len as u64);
    assert_eq!(stats.descriptors, 128);
    assert_eq!(
        stats.runs,
        1 + 64,
        "the first 64 merged, the last 64 did not"
    );
    assert_eq!(
        stats.slices,
        (half / 16384) + 64,
        "runs cut at the 16 KiB slice size"
    );
    // Both queue pairs of a rail, on every rail (the test runs on one rail and on two).
    let rails = a.rails().len() as u32;
    assert_eq!(stats.rails_used, rails, "striped over every rail");
    if rails == 1 {
        assert_eq!(stats.qps_used, 2, "both queue pairs");
    } else {
        assert!(
            (rails..=2 * rails).contains(&stats.qps_used),
            "{} queue pairs of {} carried slices",
            stats.qps_used,
            2 * rails
        );
    }
    let got = dst.to_vec(0, len).unwrap();
    assert_eq!(&got[..half as usize], &data[..half as usize]);
    for i in 0..64usize {
        let from = half as usize + i * 8192;
        let to = half as usize + (63 - i) * 8192;
        assert_eq!(&got[to..to + 8192], &data[from..from + 8192], "block {i}");
    }
    // Read it back into a fresh local segment.
    let back = a.alloc_host(len, "back").unwrap();
    let t = pb
        .read(
            &[Desc::new(&back, 0, remote.id, 0, len as u64)],
            &TransferOptions::new(),
        )
        .unwrap();
    t.wait(WAIT).unwrap();
    assert_eq!(back.to_vec(0, len).unwrap(), got);
    println!("1 MiB written as 128 descriptors (65 runs, {} slices on 2 QPs) and read back, every byte verified", stats.slices);
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn paged_and_indexed_transfers_move_the_named_blocks_only() {
    let (a, b, pb, _pa) = connected(agent("pa"), agent("pb"));
    let block = 4096u64;
    let blocks = 256usize;
    let src = a.alloc_host(blocks * block as usize, "pool-a").unwrap();
    let dst = b.alloc_host(blocks * block as usize, "pool-b").unwrap();
    let data = pattern(blocks * block as usize, 7);
    src.write(0, &data).unwrap();
    let remote = pb.wait_segment_named("pool-b", WAIT).unwrap();
    // Every third block, to reversed positions.
    let local_blocks: Vec<u32> = (0..blocks as u32).step_by(3).collect();
    let remote_blocks: Vec<u32> = local_blocks
        .iter()
        .map(|&i| blocks as u32 - 1 - i)
        .collect();
    let table = BlockTable {
        local: &src,
        local_base: 0,
        remote: remote.id,
        remote_base: 0,
        block_len: block,
        local_blocks: &local_blocks,
        remote_blocks: &remote_blocks,
    };
    let stats = pb
        .transfer_blocks(Op::Write, &table, &TransferOptions::new())
        .unwrap()
        .wait(WAIT)
        .unwrap();
    assert_eq!(stats.descriptors, local_blocks.len() as u64);
    let got = dst.to_vec(0, data.len()).unwrap();
    for i in 0..blocks {
        let want_from = blocks - 1 - i;
        let b = block as usize;
        let moved = want_from.is_multiple_of(3);
        let chunk = &got[i * b..(i + 1) * b];
        if moved {
            assert_eq!(
                chunk,
                &data[want_from * b..(want_from + 1) * b],
                "block {i}"
            );
        } else {
            assert!(
                chunk.iter().all(|&x| x == 0),
                "block {i} was not to be written"
            );
        }
    }
    // Prepared lists, addressed by index.
    let ranges: Vec<_> = (0..8u64).map(|i| (&src, i * block, block)).collect();
    let local = LocalList::new(&ranges).unwrap();
    let remote_list = pb
        .prepare_remote(
            &(0..8u64)
                .map(|i| (remote.id, (100 + i) * block, block))
                .collect::<Vec<_>>(),
        )
        .unwrap();
    pb.transfer_indexed(
        Op::Write,
        &local,
        &[0, 7],
        &remote_list,
        &[3, 4],
        &TransferOptions::new(),
    )
    .unwrap()
    .wait(WAIT)
    .unwrap();
    let b = block as usize;
    assert_eq!(dst.to_vec(103 * block, b).unwrap(), &data[..b]);
    assert_eq!(dst.to_vec(104 * block, b).unwrap(), &data[7 * b..8 * b]);
    println!(
        "{} paged blocks and 2 indexed entries landed where named, the other blocks untouched",
        local_blocks.len()
    );
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_notification_arrives_only_after_every_byte_of_its_transfer() {
    let (a, b, pb, _pa) = connected(
        agent_with(AgentConfig::new("na").slice_size(8192).qps_per_peer(4)),
        agent("nb"),
    );
    let len = 4 << 20;
    let src = a.alloc_host(len, "src").unwrap();
    let dst = b.alloc_host(len, "dst").unwrap();
    let remote = pb.wait_segment_named("dst", WAIT).unwrap();
    for round in 0..8u32 {
        let data = pattern(len, 100 + round);
        src.write(0, &data).unwrap();
        let key = format!("round-{round}");
        // Spread over 4 QPs in 512 slices: the notification must wait for all of them.
        let _t = pb
            .write(
                &[Desc::new(&src, 0, remote.id, 0, len as u64)],
                &TransferOptions::new().notify(key.clone()),
            )
            .unwrap();
        let n = b.wait_notification(WAIT).unwrap().expect("a notification");
        // Read the data the moment the notification is there, not after waiting for anything.
        let got = dst.to_vec(0, len).unwrap();
        assert_eq!(n.peer, "na");
        assert_eq!(n.data, key.as_bytes());
        let bad = got.iter().zip(&data).position(|(x, y)| x != y);
        assert_eq!(
            bad, None,
            "round {round}: data not complete when the notification came"
        );
    }
    // An empty notification is delivered too.
    pb.write(
        &[Desc::new(&src, 0, remote.id, 0, 1)],
        &TransferOptions::new().notify(Vec::new()),
    )
    .unwrap()
    .wait(WAIT)
    .unwrap();
    let n = b.wait_notification(WAIT).unwrap().unwrap();
    assert!(n.data.is_empty());
    println!("8 rounds of 4 MiB over 4 QPs: each notification found all its data already there");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn dropped_handles_keep_memory_alive_until_completion_then_release_it() {
    let (a, b, pb, _pa) = connected(agent("da"), agent("db"));
    let len = 8 << 20;
    let dst = b.alloc_host(len, "dst").unwrap();
    let remote = pb.wait_segment_named("dst", WAIT).unwrap();
    let src = a.alloc_host(len, "src").unwrap();
    src.write(0, &pattern(len, 9)).unwrap();
    let weak = src.registration_weak();
    // Submit, drop the handle at once, deregister and drop the segment: only the requests in
    // flight hold the memory now.
    let t = pb
        .write(
            &[Desc::new(&src, 0, remote.id, 0, len as u64)],
            &TransferOptions::new().notify("x"),
        )
        .unwrap();
    drop(t);
    a.deregister(&src).unwrap();
    drop(src);
    let alive_while_in_flight = weak.is_alive();
    // The notification comes after the data; then wait for the engine to retire the requests.
    b.wait_notification(WAIT)
        .unwrap()
        .expect("the dropped transfer still completes");
    let start = std::time::Instant::now();
    wait_released(&weak);
    println!(
        "registration alive right after drop: {alive_while_in_flight}; released {:?} after the notification",
        start.elapsed()
    );
    assert!(!weak.is_alive(), "the registration leaked");
    assert_eq!(dst.to_vec(0, len).unwrap(), pattern(len, 9));
    // A future polled once and dropped behaves the same (32 MiB in 4 KiB slices: still
    // pending after the first poll, unless the device is very fast).
    let big = 32 << 20;
    let dst = b.alloc_host(big, "dst-big").unwrap();
    let remote = pb.wait_segment_named("dst-big", WAIT).unwrap();
    let src = a.alloc_host(big, "src2").unwrap();
    let weak = src.registration_weak();
    let descs: Vec<_> = (0..(big as u64 / 4096))
        .map(|i| {
            Desc::new(
                &src,
                i * 4096,
                remote.id,
                ((i * 7919) % (big as u64 / 4096)) * 4096,
                4096,
            )
        })
        .collect();
    let mut fut = Box::pin(pb.write(&descs, &TransferOptions::new()).unwrap());
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let polled_once = fut.as_mut().poll(&mut cx).is_pending();
    drop(fut);
    let _ = dst;
    a.deregister(&src).unwrap();
    drop(src);
    wait_released(&weak);
    assert!(
        !weak.is_alive(),
        "the registration of a dropped future leaked"
    );
    println!(
        "future dropped while pending: {polled_once}; its registration released after completion"
    );
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn transfers_are_futures() {
    let (a, b, pb, _pa) = connected(agent("fa"), agent("fb"));
    let src = a.alloc_host(1 << 16, "src").unwrap();
    let _dst = b.alloc_host(1 << 16, "dst").unwrap();
    let remote = pb.wait_segment_named("dst", WAIT).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stats = rt.block_on(async {
        let ts: Vec<_> = (0..16u64)
            .map(|i| {
                pb.write(
                    &[Desc::new(&src, i * 4096, remote.id, i * 4096, 4096)],
                    &TransferOptions::new(),
                )
                .unwrap()
            })
            .collect();
        let mut total = 0;
        for t in ts {
            total += t.await.unwrap().bytes;
        }
        total
    });
    assert_eq!(stats, 1 << 16);
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn bad_input_is_refused_before_anything_is_posted() {
    let (a, b, pb, _pa) = connected(agent("ba"), agent("bb"));
    let src = a.alloc_host(8192, "src").unwrap();
    let dst = b.alloc_host(4096, "dst").unwrap();
    let r = pb.wait_segment_named("dst", WAIT).unwrap();
    let o = TransferOptions::new();
    let err = |res: gdr_xfer::Result<gdr_xfer::Transfer>| res.unwrap_err();
    // Local range outside the segment; remote range outside; unknown remote segment.
    let e = err(pb.write(&[Desc::new(&src, 8000, r.id, 0, 1000)], &o));
    assert!(
        matches!(
            e,
            Error::OutOfSegment {
                side: Side::Local,
                index: Some(0),
                ..
            }
        ),
        "{e}"
    );
    let e = err(pb.write(
        &[
            Desc::new(&src, 0, r.id, 0, 1),
            Desc::new(&src, 0, r.id, 4000, 200),
        ],
        &o,
    ));
    assert!(
        matches!(
            e,
            Error::OutOfSegment {
                side: Side::Remote,
                index: Some(1),
                segment_len: 4096,
                ..
            }
        ),
        "{e}"
    );
    let e = err(pb.write(&[Desc::new(&src, 0, SegmentId::new(999), 0, 1)], &o));
    assert!(
        matches!(e, Error::UnknownSegment { segment, .. } if segment == SegmentId::new(999)),
        "{e}"
    );
    // Overflowing offsets.
    let e = err(pb.write(&[Desc::new(&src, u64::MAX, r.id, 0, 2)], &o));
    assert!(matches!(e, Error::OutOfSegment { .. }), "{e}");
    let e = err(pb.write(&[Desc::new(&src, 0, r.id, u64::MAX - 1, 2)], &o));
    assert!(matches!(e, Error::OutOfSegment { .. }), "{e}");
    // Empty list, empty descriptor, notification too long.
    assert!(matches!(
        err(pb.write(&[], &o)),
        Error::InvalidArgument { .. }
    ));
    assert!(matches!(
        err(pb.write(&[Desc::new(&src, 0, r.id, 0, 0)], &o)),
        Error::InvalidArgument { .. }
    ));
    let e = err(pb.write(
        &[Desc::new(&src, 0, r.id, 0, 1)],
        &TransferOptions::new().notify(vec![0; 5000]),
    ));
    assert!(matches!(e, Error::TooLarge { len: 5000, .. }), "{e}");
    // Block tables: an index past the segment, a count mismatch, a zero block length.
    let lb = [0u32, 1];
    let rb = [0u32, 1];
    for (lbs, rbs, blen, want) in [
        (&lb[..], &rb[..], 4096u64, "remote blocks"),
        (&[0u32, 2][..], &[0u32, 0][..], 4096, "local blocks"),
    ] {
        let t = BlockTable {
            local: &src,
            local_base: 0,
            remote: r.id,
            remote_base: 0,
            block_len: blen,
            local_blocks: lbs,
            remote_blocks: rbs,
        };
        let e = err(pb.transfer_blocks(Op::Write, &t, &o));
        assert!(
            matches!(e, Error::IndexOutOfRange { list, .. } if list == want),
            "{e}"
        );
    }
    let t = BlockTable {
        local: &src,
        local_base: 0,
        remote: r.id,
        remote_base: 0,
        block_len: 0,
        local_blocks: &lb,
        remote_blocks: &rb,
    };
    assert!(matches!(
        err(pb.transfer_blocks(Op::Write, &t, &o)),
        Error::InvalidArgument { .. }
    ));
    let t = BlockTable {
        local: &src,
        local_base: 0,
        remote: r.id,
        remote_base: 0,
        block_len: 1024,
        local_blocks: &lb,
        remote_blocks: &rb[..1],
    };
    assert!(matches!(
        err(pb.transfer_blocks(Op::Write, &t, &o)),
        Error::InvalidArgument { .. }
    ));
    // Prepared lists: an index out of range, lengths that differ, a list of another peer.
    let local = LocalList::new(&[(&src, 0, 100), (&src, 100, 200)]).unwrap();
    let remote = pb
        .prepare_remote(&[(r.id, 0, 100), (r.id, 100, 100)])
        .unwrap();
    let e = err(pb.transfer_indexed(Op::Write, &local, &[2], &remote, &[0], &o));
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                list: "local list",
                index: 2,
                len: 2
            }
        ),
        "{e}"
    );
    let e = err(pb.transfer_indexed(Op::Write, &local, &[1], &remote, &[1], &o));
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                local_len: 200,
                remote_len: 100,
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        LocalList::new(&[(&src, 8190, 100)]),
        Err(Error::OutOfSegment { .. })
    ));
    assert!(matches!(
        pb.prepare_remote(&[(r.id, 4000, 100)]),
        Err(Error::OutOfSegment { .. })
    ));
    // A deregistered remote segment: the peer's table forgets it, a prepared list that names it
    // is refused.
    b.deregister(&dst).unwrap();
    let start = std::time::Instant::now();
    while pb.segment(r.id).is_some() && start.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(1));
    }
    let e = err(pb.write(&[Desc::new(&src, 0, r.id, 0, 1)], &o));
    assert!(matches!(e, Error::UnknownSegment { .. }), "{e}");
    let e = err(pb.transfer_indexed(Op::Write, &local, &[0], &remote, &[0], &o));
    assert!(matches!(e, Error::UnknownSegment { .. }), "{e}");
    assert!(matches!(
        b.deregister(&dst),
        Err(Error::UnknownSegment { .. })
    ));
    // Nothing of the above broke the connection.
    let dst2 = b.alloc_host(4096, "dst2").unwrap();
    let r2 = pb.wait_segment_named("dst2", WAIT).unwrap();
    src.write(0, b"still fine").unwrap();
    pb.write(&[Desc::new(&src, 0, r2.id, 0, 10)], &o)
        .unwrap()
        .wait(WAIT)
        .unwrap();
    assert_eq!(dst2.to_vec(0, 10).unwrap(), b"still fine");
    assert!(pb.is_connected());
    println!("every bad input refused with its typed error; the connection still works");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_closed_peer_fails_pending_transfers_and_new_ones() {
    let (a, b, pb, _pa) = connected(agent("ca"), agent("cb"));
    let len = 32 << 20;
    let src = a.alloc_host(len, "src").unwrap();
    let _dst = b.alloc_host(len, "dst").unwrap();
    let r = pb.wait_segment_named("dst", WAIT).unwrap();
    let chunk = len as u64 / 64;
    let descs: Vec<_> = (0..64u64)
        .map(|i| Desc::new(&src, i * chunk, r.id, i * chunk, chunk))
        .collect();
    let t = pb.write(&descs, &TransferOptions::new()).unwrap();
    drop(b);
    let res = t.wait(WAIT);
    println!("pending transfer when the peer agent was dropped: {res:?}");
    // It either finished before the peer went away or failed with the peer's loss; it never hangs.
    if let Err(e) = &res {
        assert!(
            matches!(e, Error::PeerLost { .. } | Error::SliceFailed { .. }),
            "{e}"
        );
    }
    let start = std::time::Instant::now();
    while pb.is_connected() && start.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!pb.is_connected());
    let e = pb
        .write(&[Desc::new(&src, 0, r.id, 0, 1)], &TransferOptions::new())
        .unwrap_err();
    assert!(matches!(e, Error::PeerLost { .. }), "{e}");
    assert!(a.peer("cb").is_none());
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn segments_within_one_registration_cost_no_registration() {
    let a = agent("ra");
    // 1,265 tensors living in one allocation (the NIXL#1498 shape), here 512 MiB of host memory.
    let total = 512usize << 20;
    let n = 1265u64;
    let size = (total as u64 / n) & !4095;
    let t = std::time::Instant::now();
    let pool = a.alloc_host(total, "pool").unwrap();
    let whole = t.elapsed();
    let t = std::time::Instant::now();
    let parts: Vec<_> = (0..n)
        .map(|i| a.register_within(&pool, i * size, size, "tensor").unwrap())
        .collect();
    let within = t.elapsed();
    assert!(parts.iter().all(|p| p.shares_registration_with(&pool)));
    assert!(matches!(
        a.register_within(&pool, total as u64 - 1, 2, "x"),
        Err(Error::OutOfSegment { index: None, .. })
    ));
    let e = a
        .register_within(&pool, total as u64 - 1, 2, "x")
        .unwrap_err();
    assert!(
        !e.to_string().contains("descriptor"),
        "no descriptor here: {e}"
    );
    assert_eq!(a.segments().len(), n as usize + 1);
    for p in &parts {
        a.deregister(p).unwrap();
    }
    // Without sharing: one registration (one ibv_reg_mr) per tensor.
    let t = std::time::Instant::now();
    let separate: Vec<_> = (0..n)
        .map(|_| a.alloc_host(size as usize, "tensor").unwrap())
        .collect();
    let apart = t.elapsed();
    assert!(!separate[0].shares_registration_with(&separate[1]));
    println!(
        "1,265 tensors of {size} bytes: one registration of 512 MiB ({whole:?}) + 1,265 segments within it ({within:?}, no verbs call) vs 1,265 registrations ({apart:?})"
    );
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn concurrent_submitters_each_get_their_own_completion_and_notification() {
    let (a, b, pb, _pa) = connected(
        agent_with(AgentConfig::new("ta").qps_per_peer(3).slice_size(8192)),
        agent("tb"),
    );
    let threads = 8usize;
    let per = 30usize;
    let region = 64 * 1024usize;
    let src = a.alloc_host(threads * region, "src").unwrap();
    let dst = b.alloc_host(threads * region, "dst").unwrap();
    let r = pb.wait_segment_named("dst", WAIT).unwrap();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (pb, src) = (&pb, &src);
            s.spawn(move || {
                let base = (t * region) as u64;
                for k in 0..per {
                    // Each round a different length and pattern, in this thread's own region.
                    let len = 4096 + (k * 997) % (region - 4096);
                    src.write(base, &pattern(len, (t * 1000 + k) as u32))
                        .unwrap();
                    let x = pb
                        .write(
                            &[Desc::new(src, base, r.id, base, len as u64)],
                            &TransferOptions::new().notify(format!("{t}:{k}")),
                        )
                        .unwrap();
                    let stats = x.wait(WAIT).unwrap();
                    assert_eq!(stats.bytes, len as u64);
                }
            });
        }
    });
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < threads * per {
        let n = b
            .wait_notification(WAIT)
            .unwrap()
            .expect("every notification arrives");
        let key = String::from_utf8(n.data).unwrap();
        assert!(seen.insert(key.clone()), "notification {key} twice");
    }
    assert!(b.take_notifications().is_empty(), "no extra notification");
    // The last round of each thread is what its region holds.
    for t in 0..threads {
        let k = per - 1;
        let len = 4096 + (k * 997) % (region - 4096);
        let got = dst.to_vec((t * region) as u64, len).unwrap();
        assert_eq!(got, pattern(len, (t * 1000 + k) as u32), "thread {t}");
    }
    println!("{threads} threads x {per} transfers on 3 QPs: every completion and notification once, to its owner");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_transfer_past_its_deadline_fails_and_its_memory_goes_once_the_nic_is_done() {
    let (a, _b, pb, src, _dst, rid, weak) = big_pair("dla", "dlb");
    let t = pb
        .write(
            &[Desc::new(&src, 0, rid, 0, src.len())],
            &TransferOptions::new().timeout(Duration::from_millis(1)),
        )
        .unwrap();
    a.deregister(&src).unwrap();
    drop(src);
    let e = t.wait(WAIT).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    drop(t);
    let alive_at_timeout = weak.is_alive();
    let start = std::time::Instant::now();
    wait_released(&weak);
    println!(
        "timed out: {e}; registration alive then: {alive_at_timeout}, released {:?} later",
        start.elapsed()
    );
    assert!(
        !weak.is_alive(),
        "released once the NIC finished the posted slices"
    );
    // The connection is fine: the next transfer works.
    let s2 = a.alloc_host(4096, "s2").unwrap();
    pb.write(&[Desc::new(&s2, 0, rid, 0, 4096)], &TransferOptions::new())
        .unwrap()
        .wait(WAIT)
        .unwrap();
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn dropping_the_agent_fails_its_transfers_and_releases_their_memory_afterwards() {
    let (a, _b, pb, src, _dst, rid, weak) = big_pair("xa", "xb");
    let t = pb
        .write(
            &[Desc::new(&src, 0, rid, 0, src.len())],
            &TransferOptions::new(),
        )
        .unwrap();
    drop(src);
    drop(pb);
    drop(a);
    let res = t.wait(WAIT);
    println!("transfer pending when its agent was dropped: {res:?}");
    if let Err(e) = &res {
        assert!(
            matches!(e, Error::AgentClosed | Error::PeerLost { .. }),
            "{e}"
        );
    }
    drop(t);
    // The agent is gone; its queue pairs are destroyed with it (the last holder, a control
    // thread, lets go when its socket closes): then nothing holds the registration.
    let start = std::time::Instant::now();
    wait_released(&weak);
    assert!(!weak.is_alive(), "the registration leaked past the agent");
    println!("released {:?} after the agent was dropped", start.elapsed());
}

/// A peer handle kept after its agent was dropped holds only the agent's intake (no pointer back
/// to the agent): every call refuses with `AgentClosed`, and it keeps no registration alive.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_peer_handle_that_outlives_its_agent_refuses_work_and_holds_no_memory() {
    let (a, _b, pb, src, _dst, rid, weak) = big_pair("oa", "ob");
    let small = a.alloc_host(4096, "small").unwrap();
    let small_weak = small.registration_weak();
    // A transfer while the agent lives lands: the handle is a working one.
    pb.write(
        &[Desc::new(&small, 0, rid, 0, 4096)],
        &TransferOptions::new(),
    )
    .unwrap()
    .wait(WAIT)
    .unwrap();
    drop(src);
    drop(a);
    let closed = |what: &str, e: Error| {
        assert!(matches!(e, Error::AgentClosed), "{what}: {e}");
    };
    let e = pb
        .write(
            &[Desc::new(&small, 0, rid, 0, 4096)],
            &TransferOptions::new(),
        )
        .unwrap_err();
    closed("write", e);
    let e = pb
        .read(
            &[Desc::new(&small, 0, rid, 0, 4096)],
            &TransferOptions::new(),
        )
        .unwrap_err();
    closed("read", e);
    let e = pb
        .send_notification(b"late".to_vec(), &TransferOptions::new())
        .unwrap_err();
    closed("send_notification", e);
    closed(
        "prepare_remote",
        pb.prepare_remote(&[(rid, 0, 1)]).unwrap_err(),
    );
    closed(
        "wait_segment_named",
        pb.wait_segment_named("dst", Duration::from_secs(1))
            .unwrap_err(),
    );
    assert!(
        !pb.is_connected(),
        "the dropped agent's connection is closed"
    );
    // The handle (still held) keeps neither the dropped segment's memory nor, once the segment
    // handle goes, the one the refused calls named.
    wait_released(&weak);
    assert!(
        !weak.is_alive(),
        "a peer handle kept a dropped agent's memory"
    );
    drop(small);
    wait_released(&small_weak);
    assert!(
        !small_weak.is_alive(),
        "a refused call kept its segment's memory"
    );
    drop(pb);
}

/// A peer that lies about rails: renewals of a rail it does not share, with the wrong number of
/// queue pairs, answers and refusals nobody asked for. Each is dropped without an answer and
/// changes nothing; an honest renewal afterwards is answered; a renewal inside the handshake
/// ends the connection.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_peer_that_lies_about_rails_changes_nothing() {
    use gdr::connect::TcpLink;
    use gdr::device::{Gid, Mtu};
    use gdr::qp::Endpoint;
    use gdr_xfer::wire::{Hello, Message, RailRenew};

    let a = agent("honest");
    let addr = a.listen("127.0.0.1:0").unwrap().to_string();
    let endpoint = |qpn| {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 77, 0, 1]);
        Endpoint {
            qpn,
            psn: 0x12_3456,
            lid: 0,
            gid: Gid(gid),
            gid_index: 1,
            mtu: Mtu::B1024,
            port: 1,
        }
    };
    let handshake = |name: &str| {
        let mut link = TcpLink::from_stream(std::net::TcpStream::connect(&addr).unwrap()).unwrap();
        link.set_timeout(Some(WAIT)).unwrap();
        let hello = Message::Hello(Hello {
            name: name.into(),
            rails: vec![vec![endpoint(0xff_ff00), endpoint(0xff_ff01)]],
            notify_slots: 4,
            notify_max: 64,
        });
        link.send_bytes(&hello.encode().unwrap()).unwrap();
        // The agent's hello, its table, its ready.
        loop {
            match Message::decode("agent", &link.recv_bytes().unwrap()).unwrap() {
                Message::Ready => break,
                Message::Hello(_) | Message::Segments(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        link
    };
    let send = |link: &mut TcpLink, m: Message| link.send_bytes(&m.encode().unwrap()).unwrap();
    let renew = |rail, epoch, n: u32| RailRenew {
        rail,
        epoch,
        endpoints: (0..n).map(|i| endpoint(0xff_fe00 + i)).collect(),
    };

    // A renewal before the handshake is over: the connection ends, no peer appears.
    let mut early = handshake("early");
    send(&mut early, Message::RailRenew(renew(0, 1, 2)));
    assert!(
        early.recv_bytes().is_err() || a.peer("early").is_none(),
        "a renewal inside the handshake is refused"
    );
    drop(early);

    let mut liar = handshake("liar");
    send(&mut liar, Message::Ready);
    let peer = a.wait_peer("liar", WAIT).unwrap();
    let before = peer.qp_nums();
    for m in [
        Message::RailRenew(renew(5, 1, 2)),    // a rail it does not share
        Message::RailRenew(renew(0, 2, 3)),    // three queue pairs where the rail has two
        Message::RailRenewed(renew(0, 77, 2)), // an answer to no offer
        Message::RailRefused { rail: 0, epoch: 9 }, // a refusal of no offer
    ] {
        send(&mut liar, m);
    }
    // An honest renewal is answered (so the lies before it were read and dropped, in order).
    send(&mut liar, Message::RailRenew(renew(0, 3, 2)));
    liar.set_timeout(Some(WAIT)).unwrap();
    let answer = Message::decode("agent", &liar.recv_bytes().unwrap()).unwrap();
    match answer {
        Message::RailRenewed(r) => assert_eq!((r.rail, r.epoch, r.endpoints.len()), (0, 3, 2)),
        other => panic!("the honest renewal got {other:?}"),
    }
    assert!(peer.is_connected(), "{:?}", peer.lost_reason());
    let stats = &peer.rail_stats()[0];
    assert_eq!((stats.renewals, stats.errors), (1, 0), "{stats:?}");
    let after = peer.qp_nums();
    assert_eq!(after.len(), before.len());
    assert!(
        after.iter().all(|q| !before.contains(q)),
        "new queue pairs: {before:?} -> {after:?}"
    );
    send(&mut liar, Message::Bye("done".into()));
}
