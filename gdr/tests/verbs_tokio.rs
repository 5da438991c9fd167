//! Awaited operations on tokio (`gdr::aio`, feature `tokio`) against a real RDMA device.
//!
//! Run in the Soft-RoCE VM by `cargo xtask test` (which builds tests with `--all-features`); on
//! real hardware: `GDR_TEST_DEVICE=mlx5_0 cargo test -p gdr --features tokio --test verbs_tokio
//! -- --ignored --test-threads=1`. A missing device is a failure, not a skip.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr::aio::AsyncCompletionQueue;
use gdr::cq::CompletionQueue;
use gdr::device::Context;
use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::{QueuePair, WorkQueue};
use gdr::wr::{RecvRequest, SendRequest};
use gdr::Error;

use gdr_test_support::{device, verbs};

struct Pair {
    pd: Arc<ProtectionDomain>,
    a: QueuePair,
    b: QueuePair,
    cq_a: Arc<CompletionQueue>,
    cq_b: Arc<CompletionQueue>,
}

/// Two connected queue pairs whose completion queues have channels (for awaiting).
fn pair(send_depth: u32) -> Pair {
    let ctx = Context::open(&device()).expect("open the test device");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq_a = CompletionQueue::with_channel(&ctx, 4096).unwrap();
    let cq_b = CompletionQueue::with_channel(&ctx, 4096).unwrap();
    let a = QueuePair::builder(&pd, &cq_a, &cq_a)
        .max_send_wr(send_depth)
        .build()
        .unwrap();
    let b = QueuePair::builder(&pd, &cq_b, &cq_b)
        .max_recv_wr(256)
        .build()
        .unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    Pair {
        pd,
        a,
        b,
        cq_a,
        cq_b,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Posts `req`, retrying while the send queue is full.
async fn post_when_room(
    acq: &AsyncCompletionQueue,
    qp: &QueuePair,
    req: &SendRequest<'_>,
) -> gdr::aio::Completed {
    loop {
        match acq.post_send(qp, req) {
            Ok(done) => return done,
            Err(Error::QueueFull { .. }) => tokio::time::sleep(Duration::from_millis(1)).await,
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_thousand_concurrent_awaited_writes_from_many_tasks() {
    const N: usize = 1000;
    const LEN: usize = 64;
    let p = Arc::new(pair(128));
    let dst = MemoryRegion::new(&p.pd, N * LEN, AccessFlags::remote_rw()).unwrap();
    let remote = dst.remote();
    let rt = runtime();
    let start = Instant::now();
    let ids = rt.block_on(async {
        let acq = AsyncCompletionQueue::new(&p.cq_a).unwrap();
        let tasks: Vec<_> = (0..N)
            .map(|i| {
                let (p, acq) = (p.clone(), acq.clone());
                tokio::spawn(async move {
                    let src =
                        MemoryRegion::with_data(&p.pd, &[i as u8; LEN], AccessFlags::LOCAL_WRITE)
                            .unwrap();
                    let off = (i * LEN) as u64;
                    let local = [src.slice(..).unwrap()];
                    let req =
                        SendRequest::write(&local, remote.slice(off..off + LEN as u64).unwrap());
                    let done = post_when_room(&acq, &p.a, &req).await;
                    let id = done.wr_id();
                    let c = done.await.unwrap();
                    assert_eq!(c.wr_id, id, "each future gets its own completion");
                    id
                })
            })
            .collect();
        let mut ids = Vec::new();
        for t in tasks {
            ids.push(t.await.unwrap());
        }
        ids
    });
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), N);
    let data = dst.to_vec();
    for i in 0..N {
        assert!(
            data[i * LEN..(i + 1) * LEN].iter().all(|&b| b == i as u8),
            "write {i} verified"
        );
    }
    assert_eq!(p.a.send_outstanding(), 0);
    println!(
        "{N} awaited writes from {N} tasks in {:?}, data verified",
        start.elapsed()
    );
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_dropped_future_keeps_the_memory_until_the_completion_is_reaped() {
    // A 32 MiB read takes about half a second on Soft-RoCE under emulation: long enough to drop
    // its future while the NIC is still writing the local region.
    const LEN: usize = 32 << 20;
    let p = pair(16);
    let rt = runtime();
    let remote_bytes: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    let far = MemoryRegion::with_data(&p.pd, &remote_bytes, AccessFlags::remote_rw()).unwrap();
    rt.block_on(async {
        let acq = AsyncCompletionQueue::new(&p.cq_a).unwrap();
        let sink = MemoryRegion::new(&p.pd, LEN, AccessFlags::LOCAL_WRITE).unwrap();
        let read = acq
            .post_send(
                &p.a,
                &SendRequest::read(&[sink.slice(..).unwrap()], far.remote().slice(..).unwrap()),
            )
            .unwrap();
        // Polled once, then dropped mid-flight.
        let early = tokio::time::timeout(Duration::from_millis(20), read).await;
        assert!(early.is_err(), "the read finished within 20 ms: {early:?}");
        let in_flight = p.a.send_outstanding() == 1 && Arc::strong_count(&sink) > 1;
        // Another request on the same queue, its future dropped at once.
        let dst = MemoryRegion::new(&p.pd, 8, AccessFlags::remote_rw()).unwrap();
        let w = acq
            .post_send(&p.a, &SendRequest::write_inline(b"12345678", dst.remote().slice(..).unwrap()))
            .unwrap();
        let w_id = w.wr_id();
        drop(w);
        let end = Instant::now() + Duration::from_secs(30);
        while Arc::strong_count(&sink) > 1 || p.a.send_outstanding() > 0 {
            assert!(Instant::now() < end, "the abandoned completions were never reaped");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(in_flight, "the queue pair held the read's region while it was in flight");
        assert_eq!(sink.to_vec(), remote_bytes, "the abandoned read landed whole");
        assert_eq!(dst.to_vec(), b"12345678");
        // Both futures were dropped; nothing is left over for anyone else.
        let leftover = tokio::time::timeout(Duration::from_millis(200), acq.next_unclaimed()).await;
        assert!(
            leftover.is_err(),
            "an abandoned completion reached someone: {leftover:?} (write {w_id:#x})"
        );
        println!("dropped future: the 32 MiB read's region was held until its completion was reaped, then released");
    });
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn futures_dropped_at_random_points_under_load() {
    const N: usize = 600;
    let p = Arc::new(pair(64));
    let dst = MemoryRegion::new(&p.pd, N * 8, AccessFlags::remote_rw()).unwrap();
    let remote = dst.remote();
    let rt = runtime();
    let (awaited, dropped) = rt.block_on(async {
        let acq = AsyncCompletionQueue::new(&p.cq_a).unwrap();
        let tasks: Vec<_> = (0..N)
            .map(|i| {
                let (p, acq) = (p.clone(), acq.clone());
                tokio::spawn(async move {
                    let off = (i * 8) as u64;
                    let bytes = (i as u64).to_le_bytes();
                    let req =
                        SendRequest::write_inline(&bytes, remote.slice(off..off + 8).unwrap());
                    let done = post_when_room(&acq, &p.a, &req).await;
                    // A cheap hash picks where this future is dropped.
                    match (i * 2654435761) % 3 {
                        0 => {
                            drop(done);
                            false
                        }
                        1 => {
                            // Polled once or twice, then dropped (or resolved in time).
                            let _ = tokio::time::timeout(Duration::from_micros(50), done).await;
                            false
                        }
                        _ => {
                            done.await.unwrap();
                            true
                        }
                    }
                })
            })
            .collect();
        let (mut awaited, mut dropped) = (0, 0);
        for t in tasks {
            if t.await.unwrap() {
                awaited += 1;
            } else {
                dropped += 1;
            }
        }
        // Everything drains, abandoned completions included, and none is handed to anyone.
        let end = Instant::now() + Duration::from_secs(20);
        while p.a.send_outstanding() > 0 {
            assert!(
                Instant::now() < end,
                "{} requests never completed",
                p.a.send_outstanding()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let leftover = tokio::time::timeout(Duration::from_millis(200), acq.next_unclaimed()).await;
        assert!(leftover.is_err(), "{leftover:?}");
        (awaited, dropped)
    });
    let data = dst.to_vec();
    for i in 0..N {
        let v = u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(
            v, i as u64,
            "write {i} landed whether or not its future was awaited"
        );
    }
    println!("{N} writes: {awaited} awaited, {dropped} futures dropped at random points; all data verified, nothing left over");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn awaiting_a_receive_and_a_request_posted_by_hand() {
    let p = pair(16);
    let rt = runtime();
    rt.block_on(async {
        let acq_a = AsyncCompletionQueue::new(&p.cq_a).unwrap();
        let acq_b = AsyncCompletionQueue::new(&p.cq_b).unwrap();
        let rx = MemoryRegion::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
        let recv = acq_b
            .post_recv(&p.b, &RecvRequest::new(&[rx.slice(..).unwrap()]))
            .unwrap();
        // Posted through the blocking API, awaited by id.
        p.a.post_send(&SendRequest::send_inline(b"by hand").id(42))
            .unwrap();
        let sent = acq_a.completion(&p.a, WorkQueue::Send, 42).unwrap();
        assert!(
            matches!(
                acq_a.completion(&p.a, WorkQueue::Send, 42),
                Err(Error::InvalidArgument { .. })
            ),
            "one future per request"
        );
        let (r, s) = tokio::join!(recv, sent);
        assert_eq!(r.unwrap().byte_len, 7);
        assert_eq!(s.unwrap().wr_id, 42);
        assert_eq!(&rx.to_vec()[..7], b"by hand");
        // Wrong queue, reserved ids, and a queue without a channel are errors.
        assert!(matches!(
            acq_b.post_send(&p.a, &SendRequest::send_inline(b"x")),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            acq_b.completion(&p.a, WorkQueue::Send, 43),
            Err(Error::InvalidArgument { .. })
        ));
        let plain = CompletionQueue::new(p.pd.context(), 8).unwrap();
        assert!(AsyncCompletionQueue::new(&plain).is_err());
    });
    // Outside a runtime: a typed error, not a panic.
    assert!(matches!(
        AsyncCompletionQueue::new(&p.cq_a),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE whose netdev it may take down (run in the VM: cargo xtask test)"]
fn a_port_taken_down_fails_pending_futures_and_is_an_awaited_event() {
    use gdr::aio::AsyncDeviceEvents;
    use gdr::device::{AsyncEventKind, EventSubject};

    let ctx = Context::open(&device()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq_a = CompletionQueue::with_channel(&ctx, 64).unwrap();
    let cq_b = CompletionQueue::with_channel(&ctx, 64).unwrap();
    let a = QueuePair::builder(&pd, &cq_a, &cq_a)
        .retry_count(2)
        .timeout(10)
        .build()
        .unwrap();
    let b = QueuePair::builder(&pd, &cq_b, &cq_b).build().unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    let netdev = verbs::netdev_of(&device(), ctx.port());
    let rt = runtime();
    let outcome = rt.block_on(async {
        let events = AsyncDeviceEvents::new(ctx.events().unwrap()).unwrap();
        let acq = AsyncCompletionQueue::new(&cq_a).unwrap();
        // Pending: the peer has no receive posted, so the send waits (RNR) when the link goes.
        let msg = MemoryRegion::with_data(&pd, b"stuck", AccessFlags::LOCAL_WRITE).unwrap();
        let send = acq
            .post_send(&a, &SendRequest::send(&[msg.slice(..).unwrap()]))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let down = Instant::now();
        verbs::set_link(&netdev, false);
        let ev = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                let e = events.next().await.unwrap();
                if e.kind == AsyncEventKind::PortError {
                    return e;
                }
            }
        })
        .await;
        let failed = tokio::time::timeout(Duration::from_secs(30), send).await;
        let failed_after = down.elapsed();
        // Another awaited request after the link went down fails too, promptly.
        let late = acq.post_send(&a, &SendRequest::send_inline(b"late"));
        let late = match late {
            Ok(f) => tokio::time::timeout(Duration::from_secs(30), f)
                .await
                .map(|r| r.is_err()),
            Err(_) => Ok(true),
        };
        (ev, failed, failed_after, late, events)
    });
    verbs::set_link(&netdev, true);
    verbs::wait_port_restored(&ctx, ctx.port());
    let (ev, failed, failed_after, late, _events) = outcome;
    let ev = ev.expect("a port error event within 15 s");
    assert_eq!(ev.subject, EventSubject::Port(ctx.port()));
    match failed {
        Ok(Err(e)) => println!("{ev}; the pending send failed after {failed_after:?}: {e}"),
        Ok(Ok(c)) => panic!("the pending send succeeded on a downed link: {c:?}"),
        Err(_) => panic!("the pending send hung past 30 s"),
    }
    assert_eq!(
        late,
        Ok(true),
        "a request after the link went down fails, not hangs"
    );
}

/// The driver task of a new queue started before the queue was fully built and stopped at once
/// (seen as a hang under load); every new queue must deliver.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn every_new_async_queue_delivers() {
    let p = pair(16);
    let dst = MemoryRegion::new(&p.pd, 8, AccessFlags::remote_rw()).unwrap();
    let rt = runtime();
    rt.block_on(async {
        for i in 0..200u64 {
            let acq = AsyncCompletionQueue::new(&p.cq_a).unwrap();
            if i == 0 {
                assert!(
                    matches!(
                        AsyncCompletionQueue::new(&p.cq_a),
                        Err(Error::InvalidArgument { .. })
                    ),
                    "one async queue per completion queue at a time"
                );
            }
            let bytes = i.to_le_bytes();
            let done = acq
                .post_send(
                    &p.a,
                    &SendRequest::write_inline(&bytes, dst.remote().slice(..).unwrap()),
                )
                .unwrap();
            match tokio::time::timeout(Duration::from_secs(10), done).await {
                Ok(Ok(_)) => {}
                other => panic!("queue {i}: {other:?}"),
            }
        }
    });
    assert_eq!(u64::from_le_bytes(dst.to_vec().try_into().unwrap()), 199);
}

#[test]
#[ignore = "needs an RDMA device and its IP in GDR_TEST_ADDR (run in the VM: cargo xtask test)"]
fn async_rdma_cm_connect_and_accept() {
    use gdr::connect::cm::{Connector, Listener};
    const T: Duration = Duration::from_secs(20);
    let rt = runtime();
    rt.block_on(async {
        let listener = Listener::bind(format!("{}:0", gdr_test_support::addr()).parse().unwrap()).unwrap();
        let port = listener.port();
        let server = tokio::spawn(async move {
            let req = listener.next_request_async(T).await.unwrap();
            let ctx = req.context().clone();
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let cq = CompletionQueue::with_channel(&ctx, 16).unwrap();
            let qp = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
            let mr = MemoryRegion::new(&pd, 64, AccessFlags::remote_rw()).unwrap();
            let conn = req.accept_async(qp, Some(mr.remote())).await.unwrap();
            (conn, mr, listener)
        });
        let dst = format!("{}:{port}", gdr_test_support::addr()).parse().unwrap();
        let pending = Connector::resolve_async(dst, T).await.unwrap();
        let ctx = pending.context().clone();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::with_channel(&ctx, 16).unwrap();
        let qp = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
        let conn = pending.connect_async(qp, None).await.unwrap();
        let remote = conn.remote_region().expect("the server advertised its region");
        let acq = AsyncCompletionQueue::new(&cq).unwrap();
        let src = MemoryRegion::with_data(&pd, b"over rdma_cm", AccessFlags::LOCAL_WRITE).unwrap();
        let local = [src.slice(..).unwrap()];
        acq.post_send(conn.qp(), &SendRequest::write(&local, remote.slice(0..12).unwrap()))
            .unwrap()
            .await
            .unwrap();
        let (server_conn, mr, _listener) = server.await.unwrap();
        assert_eq!(&mr.to_vec()[..12], b"over rdma_cm");
        drop((conn, server_conn));
        println!("async rdma_cm: resolve, connect, next request, accept awaited; a write through the connection verified");
    });
}
