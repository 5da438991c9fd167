//! Regression tests for the core's soundness findings (issue 11): each test is the attack that
//! broke an earlier version, run with safe code only against a real RDMA device.
//!
//! Run in the Soft-RoCE VM by `cargo xtask test`; on real hardware:
//! `GDR_TEST_DEVICE=mlx5_0 cargo test -p gdr --test verbs_soundness -- --ignored --test-threads=1`.
//! A missing device is a failure, not a skip.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use gdr::cq::{Completion, CompletionQueue, WcStatus};
use gdr::device::Context;
use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::{QpState, QueuePair, WorkQueue};
use gdr::wr::{RecvRequest, SendRequest};
use gdr::Error;

use gdr_test_support::device;
use gdr_test_support::verbs::{drain_for, pair_of as pair};

const T: Duration = Duration::from_secs(20);

fn not_ready(r: gdr::Result<()>, state: QpState) {
    match r {
        Err(Error::QpNotReady {
            queue: WorkQueue::Send,
            state: s,
            ..
        }) if s == state => {}
        other => panic!("expected QpNotReady in {state:?}, got {other:?}"),
    }
}

/// Finding 1: rxe queues a request posted in INIT and fails only its doorbell; after connect the
/// "failed" request ran. Now nothing reaches the provider before RTS, and a refused request keeps
/// nothing alive and consumes nothing.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_request_refused_before_connect_never_runs() {
    let p = pair(false, |b| b);
    let src = MemoryRegion::with_data(&p.pd, &[0xab; 256], AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&p.pd, 256, AccessFlags::remote_rw()).unwrap();
    let src_slices = [src.slice(..).unwrap()];
    let write = SendRequest::write(&src_slices, dst.remote().slice(..).unwrap());
    not_ready(p.a.post_send(&write.clone().id(1)), QpState::Init);
    not_ready(
        p.a.post_send_list(&[write.clone(), write.clone()]),
        QpState::Init,
    );

    // A read into a region that is dropped right after the refusal: nothing keeps it alive.
    let sink = MemoryRegion::new(&p.pd, 256, AccessFlags::LOCAL_WRITE).unwrap();
    let sink_weak: Weak<MemoryRegion> = Arc::downgrade(&sink);
    let sink_slices = [sink.slice(..).unwrap()];
    let read = SendRequest::read(&sink_slices, dst.remote().slice(..).unwrap());
    not_ready(p.a.post_send(&read.id(2)), QpState::Init);
    drop(sink_slices);
    drop(sink);
    assert!(
        sink_weak.upgrade().is_none(),
        "a refused read keeps no region alive"
    );

    // A prepared send that would consume the peer's receive.
    let mut ping = p.a.prepare(&SendRequest::send_inline(b"ping")).unwrap();
    not_ready(ping.post(3, true), QpState::Init);
    drop(ping);
    assert_eq!(p.a.send_outstanding(), 0);

    // The peer may post receives in INIT.
    let rx = MemoryRegion::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    p.b.post_recv(&RecvRequest::new(&[rx.slice(..).unwrap()]).id(9))
        .unwrap();
    p.a.connect(&p.b.endpoint()).unwrap();
    p.b.connect(&p.a.endpoint()).unwrap();

    // Nothing refused earlier runs now.
    assert!(drain_for(&p.cq_a, Duration::from_millis(300)).is_empty());
    assert!(drain_for(&p.cq_b, Duration::from_millis(100)).is_empty());
    assert_eq!(dst.to_vec(), vec![0; 256], "no refused write landed");
    assert_eq!(
        p.b.recv_outstanding(),
        1,
        "no refused send consumed the receive"
    );

    // And the queue pair works.
    p.a.post_send(&SendRequest::send_inline(b"real").id(4))
        .unwrap();
    assert_eq!(p.cq_a.wait_for(1, T).unwrap()[0].wr_id, 4);
    let c = p.cq_b.wait_for(1, T).unwrap()[0];
    assert_eq!((c.wr_id, c.byte_len, c.status), (9, 4, WcStatus::Success));
    println!("refused before connect: write, list, read, prepared send; none ran after connect");

    // After disconnect() posting is refused again, until reset + connect.
    p.a.disconnect().unwrap();
    not_ready(p.a.post_send(&write.id(5)), QpState::Error);
}

/// Finding 2: completions still queued for an earlier incarnation of a QP number (destroyed and
/// the number reused, or reset) were attributed to the new incarnation's requests, whose
/// sequence numbers restart. A reset restarts them too, so this is the same attack without
/// waiting for the provider to recycle a number.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn completions_of_an_earlier_incarnation_never_retire_a_live_request() {
    // rnr_retry 7: a send without a receive at the peer stays in flight until one is posted.
    let p = pair(true, |b| b.rnr_retry(7));
    let src = MemoryRegion::with_data(&p.pd, &[7; 64], AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&p.pd, 64, AccessFlags::remote_rw()).unwrap();
    for id in 1..=3 {
        p.a.post_send(
            &SendRequest::write(&[src.slice(..).unwrap()], dst.remote().slice(..).unwrap()).id(id),
        )
        .unwrap();
    }
    // Let the three completions land in cq_a; do not poll them.
    let end = Instant::now() + T;
    while dst.to_vec() != vec![7; 64] {
        assert!(Instant::now() < end, "the writes never landed");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));

    p.a.reset().unwrap();
    p.b.reset().unwrap();
    p.a.connect(&p.b.endpoint()).unwrap();
    p.b.connect(&p.a.endpoint()).unwrap();

    // The new incarnation's first request has sequence number 0, as the stale write 1 had.
    let msg = MemoryRegion::with_data(&p.pd, b"live", AccessFlags::LOCAL_WRITE).unwrap();
    let weak: Weak<MemoryRegion> = Arc::downgrade(&msg);
    p.a.post_send(&SendRequest::send(&[msg.slice(..).unwrap()]).id(60))
        .unwrap();
    drop(msg);

    let seen = drain_for(&p.cq_a, Duration::from_millis(500));
    assert!(
        seen.is_empty(),
        "stale completions were reported as the live request: {seen:?}"
    );
    assert!(
        weak.upgrade().is_some(),
        "a stale completion released the live request's region"
    );
    assert_eq!(p.a.send_outstanding(), 1);

    // Its own completion comes once the peer posts a receive.
    let rx = MemoryRegion::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    p.b.post_recv(&RecvRequest::new(&[rx.slice(..).unwrap()]).id(61))
        .unwrap();
    let c = p.cq_a.wait_for(1, T).unwrap()[0];
    assert_eq!((c.wr_id, c.status), (60, WcStatus::Success));
    assert!(weak.upgrade().is_none(), "released once reaped");
    assert_eq!(p.cq_b.wait_for(1, T).unwrap()[0].wr_id, 61);
    assert!(drain_for(&p.cq_a, Duration::from_millis(100)).is_empty());
    println!(
        "3 stale completions dropped; live request 60 kept its region until its own completion"
    );
}

/// Finding 2, the destroy half: a queue pair dropped with completions still queued in a shared
/// completion queue; the queue pair created next on that queue is not disturbed by them.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn completions_of_a_destroyed_queue_pair_are_dropped() {
    let ctx = Context::open(&device()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let shared = CompletionQueue::new(&ctx, 256).unwrap();
    let peer_cq = CompletionQueue::new(&ctx, 256).unwrap();
    let peer = QueuePair::builder(&pd, &peer_cq, &peer_cq).build().unwrap();
    let dst = MemoryRegion::new(&pd, 64, AccessFlags::remote_rw()).unwrap();
    let src = MemoryRegion::with_data(&pd, &[1; 64], AccessFlags::LOCAL_WRITE).unwrap();
    {
        let old = QueuePair::builder(&pd, &shared, &shared).build().unwrap();
        old.connect(&peer.endpoint()).unwrap();
        peer.connect(&old.endpoint()).unwrap();
        for id in 0..4 {
            old.post_send(
                &SendRequest::write(&[src.slice(..).unwrap()], dst.remote().slice(..).unwrap())
                    .id(id),
            )
            .unwrap();
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    peer.reset().unwrap();
    let new = QueuePair::builder(&pd, &shared, &shared).build().unwrap();
    new.connect(&peer.endpoint()).unwrap();
    peer.connect(&new.endpoint()).unwrap();
    let rx = MemoryRegion::new(&pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let weak = Arc::downgrade(&rx);
    new.post_recv(&RecvRequest::new(&[rx.slice(..).unwrap()]).id(100))
        .unwrap();
    drop(rx);
    assert!(drain_for(&shared, Duration::from_millis(300)).is_empty());
    assert!(weak.upgrade().is_some());
    peer.post_send(&SendRequest::send_inline(b"hi").id(1))
        .unwrap();
    let c = shared.wait_for(1, T).unwrap()[0];
    assert_eq!((c.wr_id, c.is_recv, c.byte_len), (100, true, 2));
    assert!(weak.upgrade().is_none());
}

/// Finding 3: two threads polling one completion queue lost completions (a thread holding a
/// later completion retired first, and the earlier one was dropped as stale).
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn two_threads_polling_one_queue_see_every_completion_once_and_in_order() {
    const N: usize = 30_000;
    let p = Arc::new(pair(true, |b| b.max_send_wr(128)));
    let dst = MemoryRegion::new(&p.pd, 64, AccessFlags::remote_rw()).unwrap();
    let remote = dst.remote().slice(0..1).unwrap();
    let reaped = Arc::new(AtomicUsize::new(0));
    let pollers: Vec<_> = (0..2)
        .map(|_| {
            let (p, reaped) = (p.clone(), reaped.clone());
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                let mut buf = [Completion::default(); 8];
                let end = Instant::now() + Duration::from_secs(60);
                while reaped.load(Ordering::Relaxed) < N && Instant::now() < end {
                    let n = p.cq_a.poll(&mut buf).unwrap();
                    for c in &buf[..n] {
                        assert!(c.is_ok(), "{c:?}");
                        mine.push(c.wr_id);
                    }
                    reaped.fetch_add(n, Ordering::Relaxed);
                }
                mine
            })
        })
        .collect();
    for id in 0..N as u64 {
        let byte = [id as u8];
        let req = SendRequest::write_inline(&byte, remote).id(id);
        loop {
            match p.a.post_send(&req) {
                Ok(()) => break,
                Err(Error::QueueFull { .. }) => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
    }
    let per_thread: Vec<Vec<u64>> = pollers.into_iter().map(|h| h.join().unwrap()).collect();
    for ids in &per_thread {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "each poller sees completions in the device's order"
        );
    }
    let mut all: Vec<u64> = per_thread.concat();
    all.sort_unstable();
    let lost = N - all.len();
    all.dedup();
    assert_eq!(all.len(), N - lost, "no completion reported twice");
    assert_eq!(lost, 0, "{lost} of {N} completions lost");
    assert_eq!(all, (0..N as u64).collect::<Vec<_>>());
    println!(
        "{N} completions, two pollers: {} + {}, none lost or repeated",
        per_thread[0].len(),
        per_thread[1].len()
    );
}

/// Finding 5: inputs that panicked or aborted the process.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn hostile_arguments_are_errors_not_panics() {
    let p = pair(true, |b| b.max_send_sge(4));
    let src = MemoryRegion::with_data(&p.pd, &[3; 1024], AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&p.pd, 1024, AccessFlags::remote_rw()).unwrap();
    // 16 four-slice writes fill the list's 64 entries; a zero-byte write with immediate follows.
    let slices: Vec<Vec<_>> = (0..16)
        .map(|i| {
            (0..4)
                .map(|k| {
                    src.slice((i * 64 + k * 16)..(i * 64 + k * 16 + 16))
                        .unwrap()
                })
                .collect()
        })
        .collect();
    let mut reqs: Vec<SendRequest> = slices
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let off = i as u64 * 64;
            SendRequest::write(s, dst.remote().slice(off..off + 64).unwrap()).id(i as u64)
        })
        .collect();
    reqs.push(
        SendRequest::write(&[], dst.remote().slice(0..0).unwrap())
            .with_imm(0x5eed)
            .id(16),
    );
    p.b.post_recv(&RecvRequest::new(&[]).id(99)).unwrap();
    p.a.post_send_list(&reqs).unwrap();
    let ids: Vec<u64> = p
        .cq_a
        .wait_for(17, T)
        .unwrap()
        .iter()
        .map(|c| c.wr_id)
        .collect();
    assert_eq!(ids, (0..17).collect::<Vec<_>>());
    let c = p.cq_b.wait_for(1, T).unwrap()[0];
    assert_eq!((c.wr_id, c.imm), (99, Some(0x5eed)));
    assert_eq!(dst.to_vec(), vec![3; 1024]);

    // Waits for absurd counts time out instead of allocating (or aborting) up front.
    for n in [usize::MAX, 1 << 40] {
        match p.cq_a.wait_for(n, Duration::from_millis(20)) {
            Err(Error::Timeout { .. }) => {}
            other => panic!("wait_for({n}) gave {other:?}"),
        }
    }
    // A timeout that does not fit an Instant means no deadline.
    p.a.post_send(&SendRequest::write_inline(b"x", dst.remote().slice(0..1).unwrap()).id(20))
        .unwrap();
    assert_eq!(p.cq_a.wait_for(1, Duration::MAX).unwrap()[0].wr_id, 20);

    // A wait that times out keeps what arrived for the next poll.
    p.a.post_send(&SendRequest::write_inline(b"y", dst.remote().slice(0..1).unwrap()).id(21))
        .unwrap();
    match p.cq_a.wait_for(2, Duration::from_millis(500)) {
        Err(Error::Timeout { what, .. }) => assert!(what.contains("1 arrived"), "{what}"),
        other => panic!("{other:?}"),
    }
    let mut buf = [Completion::default(); 4];
    assert_eq!(p.cq_a.poll(&mut buf).unwrap(), 1);
    assert_eq!(
        buf[0].wr_id, 21,
        "the completion the timed-out wait saw is not lost"
    );
    assert_eq!(p.cq_a.poll(&mut []).unwrap(), 0);
}

/// Resets racing posts and polls from other threads: a post either lands in one incarnation or
/// is refused, and every completion reported is a request that was posted, reported once.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn resets_racing_posts_and_polls_never_misattribute() {
    use std::collections::HashSet;
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;

    let p = Arc::new(pair(true, |b| b.max_send_wr(32)));
    let dst = MemoryRegion::new(&p.pd, 64, AccessFlags::remote_rw()).unwrap();
    let remote = dst.remote().slice(0..8).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let posted = Arc::new(Mutex::new(HashSet::new()));
    let poster = {
        let (p, stop, posted) = (p.clone(), stop.clone(), posted.clone());
        std::thread::spawn(move || {
            let mut refused = 0u64;
            let mut id = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match p
                    .a
                    .post_send(&SendRequest::write_inline(b"racingxx", remote).id(id))
                {
                    Ok(()) => {
                        posted.lock().unwrap().insert(id);
                    }
                    Err(Error::QpNotReady { .. } | Error::QueueFull { .. }) => refused += 1,
                    // A doorbell the provider refused mid-reset: the request may have been
                    // queued, so it counts as posted.
                    Err(Error::Verbs { .. }) => {
                        posted.lock().unwrap().insert(id);
                    }
                    Err(e) => panic!("{e}"),
                }
                id += 1;
            }
            (id, refused)
        })
    };
    let poller = {
        let (p, stop) = (p.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut buf = [Completion::default(); 16];
            while !stop.load(Ordering::Relaxed) {
                let n = p.cq_a.poll(&mut buf).unwrap();
                seen.extend(buf[..n].iter().map(|c| (c.wr_id, c.status)));
            }
            seen
        })
    };
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(30));
        p.a.reset().unwrap();
        p.b.reset().unwrap();
        p.a.connect(&p.b.endpoint()).unwrap();
        p.b.connect(&p.a.endpoint()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(30));
    stop.store(true, Ordering::Relaxed);
    let (tried, refused) = poster.join().unwrap();
    let mut seen = poller.join().unwrap();
    seen.extend(
        drain_for(&p.cq_a, Duration::from_millis(300))
            .iter()
            .map(|c| (c.wr_id, c.status)),
    );
    let posted = posted.lock().unwrap();
    let mut ids = HashSet::new();
    for (id, status) in &seen {
        assert!(
            posted.contains(id),
            "completion {id} ({status:?}) for a request never posted"
        );
        assert!(ids.insert(*id), "completion {id} reported twice");
        assert!(
            matches!(status, WcStatus::Success | WcStatus::WrFlush),
            "{id}: {status:?}"
        );
    }
    assert!(
        !seen.is_empty() && refused > 0,
        "the race happened: {} seen, {refused} refused",
        seen.len()
    );
    println!(
        "10 resets: {tried} posts tried, {} posted, {refused} refused, {} completions, all attributed once",
        posted.len(),
        seen.len()
    );
}

/// Two threads sleeping on one completion channel for one completion: one gets it, the other
/// times out at its deadline (it used to sleep in `ibv_get_cq_event` until some later event).
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn two_waiters_on_one_channel_both_return() {
    let p = Arc::new(pair(true, |b| b));
    let rx = MemoryRegion::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    p.b.post_recv(&RecvRequest::new(&[rx.slice(..).unwrap()]).id(7))
        .unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                let r = p.cq_b.wait_for(1, Duration::from_secs(3));
                (
                    r.map(|v| v.iter().map(|c| c.wr_id).collect::<Vec<_>>()),
                    start.elapsed(),
                )
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    p.a.post_send(&SendRequest::send_inline(b"one").id(1))
        .unwrap();
    let results: Vec<_> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
    let got: Vec<_> = results
        .iter()
        .filter_map(|(r, _)| r.as_ref().ok())
        .collect();
    assert_eq!(
        got,
        [&vec![7u64]],
        "exactly one waiter gets the completion: {results:?}"
    );
    for (r, took) in &results {
        if let Err(e) = r {
            assert!(matches!(e, Error::Timeout { .. }), "{e}");
            assert!(
                *took < Duration::from_secs(10),
                "the other waiter returned at its deadline"
            );
        }
    }
}
