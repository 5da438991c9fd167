//! What becomes of every awaited request (`gdr::aio`, feature `tokio`) when something else
//! happens meanwhile: another queue pair's completion with the same id, a reset, a destroyed
//! queue pair, two tasks waiting for the same kind of thing, a future dropped at each point, a
//! completion queue that overran. Each test is an attack that once broke the async layer, or
//! one of its class, kept as a regression test.
//!
//! Run in the Soft-RoCE VM by `cargo xtask test`; by hand: build with `cargo test -p gdr
//! --features tokio --test verbs_tokio_fates --no-run`, then `cargo xtask vm --
//! target/debug/deps/verbs_tokio_fates-HASH --ignored --test-threads=1`. A missing device is a
//! failure, not a skip.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr::aio::{AsyncCompletionQueue, AsyncDeviceEvents};
use gdr::cq::{CompletionQueue, WcOpcode};
use gdr::device::{AsyncEventKind, Context};
use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::{DropCause, QueuePair, WorkQueue};
use gdr::wr::{RecvRequest, SendRequest};
use gdr::{Error, WcStatus};

use gdr_test_support::{device, verbs};

/// How long a future may take to learn its request's fate before the test calls it a hang.
const FATE: Duration = Duration::from_secs(5);

struct Setup {
    pd: Arc<ProtectionDomain>,
    cq_a: Arc<CompletionQueue>,
    cq_b: Arc<CompletionQueue>,
}

/// A protection domain and two completion queues with channels, `cq_a` (awaited) and `cq_b`.
fn setup() -> Setup {
    let ctx = Context::open(&device()).expect("open the test device");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq_a = CompletionQueue::with_channel(&ctx, 1024).unwrap();
    let cq_b = CompletionQueue::with_channel(&ctx, 1024).unwrap();
    Setup { pd, cq_a, cq_b }
}

impl Setup {
    /// A queue pair on `cq_a` connected to a peer on `cq_b`; returns (ours, peer).
    fn connected(&self) -> (QueuePair, QueuePair) {
        let a = QueuePair::builder(&self.pd, &self.cq_a, &self.cq_a)
            .max_send_wr(64)
            .max_recv_wr(64)
            .build()
            .unwrap();
        let b = QueuePair::builder(&self.pd, &self.cq_b, &self.cq_b)
            .max_recv_wr(64)
            .build()
            .unwrap();
        a.connect(&b.endpoint()).unwrap();
        b.connect(&a.endpoint()).unwrap();
        (a, b)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Awaits `f` for at most [`FATE`]; a hang is a test failure naming `what`.
async fn fate<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(FATE, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: still pending after {FATE:?}"),
    }
}

/// Finding 1 of issue 25: a request posted by hand on another queue pair of the same completion
/// queue, with the id the async layer gave a 16 MiB READ, resolved the READ's future before its
/// last bytes had landed.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_hand_posted_id_on_another_queue_pair_never_resolves_an_awaited_request() {
    const LEN: usize = 16 << 20;
    let s = setup();
    let (a, _a_peer) = s.connected();
    let (c, _c_peer) = s.connected();
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 253) as u8).collect();
    let far = MemoryRegion::with_data(&s.pd, &pattern, AccessFlags::remote_rw()).unwrap();
    let sink = MemoryRegion::new(&s.pd, LEN, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&s.pd, 8, AccessFlags::remote_rw()).unwrap();
    runtime().block_on(async {
        let acq = AsyncCompletionQueue::new(&s.cq_a).unwrap();
        let read = acq
            .post_send(
                &a,
                &SendRequest::read(&[sink.slice(..).unwrap()], far.remote().slice(..).unwrap()),
            )
            .unwrap();
        let id = read.wr_id();
        // The same id, by hand, on the other queue pair: it completes long before the READ.
        c.post_send(
            &SendRequest::write_inline(b"12345678", dst.remote().slice(..).unwrap()).id(id),
        )
        .unwrap();
        let got = fate("the READ", read).await.unwrap();
        let landed = sink.to_vec() == pattern;
        assert_eq!(
            (got.qp_num, got.opcode, got.byte_len as usize),
            (a.qp_num(), WcOpcode::RdmaRead, LEN),
            "the READ's future got another request's completion: {got:?}"
        );
        assert!(landed, "the READ's future resolved before its bytes landed");
        let other = fate("the hand-posted write", acq.next_unclaimed())
            .await
            .unwrap();
        assert_eq!((other.qp_num, other.wr_id), (c.qp_num(), id));
        println!(
            "READ {id:#x} on QP {:#x} resolved with its own completion ({LEN} bytes landed); the \
             hand-posted write with the same id on QP {:#x} was unclaimed",
            a.qp_num(),
            c.qp_num()
        );
    });
}

/// A send to a peer that posted no receive waits for ever (RNR retries are unbounded by
/// default): the request stays in flight until the queue pair is reset or destroyed.
fn stalled_send(acq: &AsyncCompletionQueue, qp: &QueuePair) -> gdr::aio::Completed {
    acq.post_send(qp, &SendRequest::send_inline(b"nobody listens"))
        .unwrap()
}

/// Whether `r` is the typed outcome of a request of QP `qp_num` that `cause` dropped.
fn dropped_by(r: &gdr::Result<gdr::Completion>, qp_num: u32, cause: DropCause) -> bool {
    matches!(r, Err(Error::RequestDropped { qp_num: q, cause: c, .. }) if *q == qp_num && *c == cause)
}

/// Finding 2 of issue 25: `reset()` dropped the in-flight requests without telling the async
/// layer; their futures stayed pending for ever.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn reset_wakes_the_future_of_every_request_it_dropped() {
    let s = setup();
    let (a, _peer) = s.connected();
    let rx = MemoryRegion::new(&s.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    runtime().block_on(async {
        let acq = AsyncCompletionQueue::new(&s.cq_a).unwrap();
        let send = stalled_send(&acq, &a);
        let recv = acq
            .post_recv(&a, &RecvRequest::new(&[rx.slice(..).unwrap()]))
            .unwrap();
        // One posted by hand behind the stalled send, awaited by its id.
        a.post_send(&SendRequest::send_inline(b"by hand").id(42))
            .unwrap();
        let by_hand = acq.completion(&a, WorkQueue::Send, 42).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(a.send_outstanding() + a.recv_outstanding(), 3);
        let reset = Instant::now();
        a.reset().unwrap();
        let (send, recv, by_hand) = fate("the futures after reset()", async {
            tokio::join!(send, recv, by_hand)
        })
        .await;
        let took = reset.elapsed();
        for (what, r) in [
            ("send", &send),
            ("receive", &recv),
            ("hand-posted send", &by_hand),
        ] {
            assert!(
                dropped_by(r, a.qp_num(), DropCause::Reset),
                "the {what}: {r:?}"
            );
        }
        assert!(matches!(
            by_hand,
            Err(Error::RequestDropped {
                wr_id: 42,
                queue: WorkQueue::Send,
                ..
            })
        ));
        assert!(matches!(
            recv,
            Err(Error::RequestDropped {
                queue: WorkQueue::Recv,
                ..
            })
        ));
        assert_eq!(
            Arc::strong_count(&rx),
            1,
            "the receive's region is released"
        );
        println!("reset(): 3 pending futures resolved {took:?} later:");
        for r in [send, recv, by_hand] {
            println!("  {}", r.unwrap_err());
        }
    });
}

/// Of finding 2's class: `disconnect()` and `reset()` back to back, before the driver could reap
/// the flush completions (a current-thread runtime that does not yield between them): the
/// flushes are discarded with the old incarnation, and the futures learn so from the reset.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn disconnect_then_reset_before_the_flushes_are_reaped() {
    let s = setup();
    let (a, _peer) = s.connected();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let acq = AsyncCompletionQueue::new(&s.cq_a).unwrap();
        let mut send = stalled_send(&acq, &a);
        // Polled once, so it sleeps with its waker registered.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), &mut send)
                .await
                .is_err(),
            "the send cannot complete: nobody posted a receive"
        );
        a.disconnect().unwrap();
        a.reset().unwrap();
        let r = fate("the send after disconnect() + reset()", send).await;
        let flushed = matches!(
            r,
            Err(Error::Completion {
                status: WcStatus::WrFlush,
                ..
            })
        );
        assert!(
            dropped_by(&r, a.qp_num(), DropCause::Reset) || flushed,
            "{r:?}"
        );
        assert_eq!(a.send_outstanding(), 0);
        println!("disconnect() + reset(): {}", r.unwrap_err());
    });
}

/// Of finding 2's class: a queue pair dropped while its requests are in flight produces no
/// completions for them; every future of it, and a future for a hand-posted id that was never
/// posted (nothing of a destroyed queue pair can complete, and its number may be reused),
/// resolves with `RequestDropped { cause: Destroyed }`.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn destroying_a_queue_pair_wakes_every_future_of_it() {
    let s = setup();
    let (a, _peer) = s.connected();
    let (other, _other_peer) = s.connected();
    let rx = MemoryRegion::new(&s.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let rx_other = MemoryRegion::new(&s.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    runtime().block_on(async {
        let acq = AsyncCompletionQueue::new(&s.cq_a).unwrap();
        let qpn = a.qp_num();
        let send = stalled_send(&acq, &a);
        let recv = acq
            .post_recv(&a, &RecvRequest::new(&[rx.slice(..).unwrap()]))
            .unwrap();
        let never_posted = acq.completion(&a, WorkQueue::Send, 7).unwrap();
        // Another queue pair's future on the same completion queue waits on.
        let other_recv = acq
            .post_recv(&other, &RecvRequest::new(&[rx_other.slice(..).unwrap()]))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(a);
        let (send, recv, never_posted) = fate("the futures after the drop", async {
            tokio::join!(send, recv, never_posted)
        })
        .await;
        for r in [&send, &recv, &never_posted] {
            assert!(dropped_by(r, qpn, DropCause::Destroyed), "{r:?}");
        }
        assert_eq!(
            Arc::strong_count(&rx),
            1,
            "the receive's region is released"
        );
        // The other queue pair's receive is untouched, and still served.
        _other_peer
            .post_send(&SendRequest::send_inline(b"still served"))
            .unwrap();
        let got = fate("the other queue pair's receive", other_recv)
            .await
            .unwrap();
        assert_eq!((got.qp_num, got.byte_len), (other.qp_num(), 12));
        println!("dropped QP {qpn:#x}: {}", send.unwrap_err());
    });
}
/// Finding 3 of issue 25: one waker slot for `next_unclaimed`; with two tasks waiting and two
/// unclaimed completions arriving, one task stayed pending for ever.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn two_tasks_awaiting_unclaimed_completions_each_get_one() {
    let s = setup();
    let (a, _peer) = s.connected();
    let dst = MemoryRegion::new(&s.pd, 8, AccessFlags::remote_rw()).unwrap();
    runtime().block_on(async {
        let acq = AsyncCompletionQueue::new(&s.cq_a).unwrap();
        for round in 0..10u64 {
            let waiters: Vec<_> = (0..2)
                .map(|_| {
                    let acq = acq.clone();
                    tokio::spawn(async move { acq.next_unclaimed().await })
                })
                .collect();
            // Both are asleep before anything arrives.
            tokio::time::sleep(Duration::from_millis(50)).await;
            for k in 0..2 {
                a.post_send(
                    &SendRequest::write_inline(b"unclaim!", dst.remote().slice(..).unwrap())
                        .id(round * 2 + k),
                )
                .unwrap();
            }
            let mut ids = Vec::new();
            for w in waiters {
                let c = fate("a task awaiting next_unclaimed", w).await.unwrap();
                ids.push(c.unwrap().wr_id);
            }
            ids.sort_unstable();
            assert_eq!(ids, [round * 2, round * 2 + 1]);
        }
        println!(
            "10 rounds: two tasks awaiting next_unclaimed, two completions, each task got one"
        );
    });
}

/// Of finding 1's class: the ids of a dropped async queue's requests still in flight were
/// handed out again by the next async queue on the same completion queue, whose first future
/// then resolved with the old READ's completion.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_new_async_queue_never_receives_a_completion_of_the_one_before() {
    const LEN: usize = 16 << 20;
    let s = setup();
    let (a, _peer) = s.connected();
    let far = MemoryRegion::new(&s.pd, LEN, AccessFlags::remote_rw()).unwrap();
    let sink = MemoryRegion::new(&s.pd, LEN, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&s.pd, 8, AccessFlags::remote_rw()).unwrap();
    runtime().block_on(async {
        let first = AsyncCompletionQueue::new(&s.cq_a).unwrap();
        let read = first
            .post_send(
                &a,
                &SendRequest::read(&[sink.slice(..).unwrap()], far.remote().slice(..).unwrap()),
            )
            .unwrap();
        let old = read.wr_id();
        drop((read, first));
        let second = AsyncCompletionQueue::new(&s.cq_a).unwrap();
        let write = second
            .post_send(
                &a,
                &SendRequest::write_inline(b"12345678", dst.remote().slice(..).unwrap()),
            )
            .unwrap();
        let new = write.wr_id();
        let got = fate("the write", write).await.unwrap();
        assert_eq!(
            (got.opcode, got.wr_id),
            (WcOpcode::RdmaWrite, new),
            "the new queue's write got the old queue's READ ({old:#x}): {got:?}"
        );
        assert_eq!(dst.to_vec(), b"12345678");
        let leftover =
            tokio::time::timeout(Duration::from_millis(300), second.next_unclaimed()).await;
        assert!(
            leftover.is_err(),
            "the old READ reached someone: {leftover:?}"
        );
        println!(
            "old queue's READ {old:#x}, new queue's write {new:#x}: each completion to its own"
        );
    });
}

/// Polls `f` once (with the task's waker), leaving it pending or ready.
async fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> bool {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::pin::Pin::new(&mut *f).poll(cx).is_ready())
    })
    .await
}

/// Waits until `cond` holds (the driver reaps in the background), at most [`FATE`].
async fn until(what: &str, cond: impl Fn() -> bool) {
    let end = Instant::now() + FATE;
    while !cond() {
        assert!(Instant::now() < end, "{what}: not within {FATE:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every future of `aio` cancelled at each of its points: a `Completed` never polled, polled
/// once while pending, dropped after its completion arrived and woke it, and after a reset
/// ended it; a `next_unclaimed` wait dropped while registered. Afterwards every request's
/// memory is released, nothing reaches anyone it was not meant for, and the queue still
/// serves.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn futures_dropped_at_each_point_leave_nothing_behind() {
    let s = setup();
    let (a, peer) = s.connected();
    let (c, _c_peer) = s.connected();
    let dst = MemoryRegion::new(&s.pd, 8, AccessFlags::remote_rw()).unwrap();
    let rx = MemoryRegion::new(&s.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let peer_rx = MemoryRegion::new(&s.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let msg = MemoryRegion::with_data(&s.pd, b"a message", AccessFlags::LOCAL_WRITE).unwrap();
    let write = || SendRequest::write_inline(b"12345678", dst.remote().slice(..).unwrap());
    runtime().block_on(async {
        let acq = AsyncCompletionQueue::new(&s.cq_a).unwrap();
        // 1. Never polled.
        drop(acq.post_send(&a, &write()).unwrap());
        // 2. Polled once while pending (a send the peer has no receive for yet), then dropped.
        let mut pending = acq
            .post_send(&a, &SendRequest::send(&[msg.slice(..).unwrap()]))
            .unwrap();
        assert!(!poll_once(&mut pending).await, "no receive at the peer yet");
        drop(pending);
        // 3. Woken by its completion, dropped before it is polled again.
        let mut woken = acq
            .post_send(&a, &SendRequest::send(&[msg.slice(..).unwrap()]))
            .unwrap();
        assert!(!poll_once(&mut woken).await);
        peer.post_recv(&RecvRequest::new(&[peer_rx.slice(..).unwrap()]).id(1))
            .unwrap();
        peer.post_recv(&RecvRequest::new(&[peer_rx.slice(..).unwrap()]).id(2))
            .unwrap();
        until("both sends completed", || a.send_outstanding() == 0).await;
        drop(woken);
        assert_eq!(Arc::strong_count(&msg), 1, "the sends' region is released");
        // 4. Ended by a reset, dropped before it is polled.
        let ended = acq
            .post_recv(&c, &RecvRequest::new(&[rx.slice(..).unwrap()]))
            .unwrap();
        c.reset().unwrap();
        drop(ended);
        // 5. A next_unclaimed wait registered, then cancelled: the completion that comes next
        //    stays for the next caller.
        let mut wait = Box::pin(acq.next_unclaimed());
        assert!(!poll_once(&mut wait).await);
        drop(wait);
        a.post_send(&write().id(77)).unwrap();
        let got = fate("the next unclaimed completion", acq.next_unclaimed())
            .await
            .unwrap();
        assert_eq!(got.wr_id, 77, "only the hand-posted write is unclaimed");
        let leftover =
            tokio::time::timeout(Duration::from_millis(300), acq.next_unclaimed()).await;
        assert!(leftover.is_err(), "an abandoned completion reached someone: {leftover:?}");
        assert_eq!(Arc::strong_count(&rx), 1, "the reset receive's region is released");
        assert_eq!(a.send_outstanding() + c.recv_outstanding(), 0);
        // The queue still serves.
        let done = fate("a write after all that", acq.post_send(&a, &write()).unwrap())
            .await
            .unwrap();
        assert_eq!(done.opcode, WcOpcode::RdmaWrite);
        println!("futures dropped unpolled, pending, woken, ended; a cancelled unclaimed wait: nothing leaked or misdelivered");
    });
}

/// Of finding 2's class, as a race: tasks post receives through the async queue while another
/// thread resets the queue pair over and over; every receive ends with the last reset, and every
/// future, whichever incarnation its request landed in, resolves with `RequestDropped`.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn resets_racing_posts_strand_no_future() {
    const TASKS: usize = 8;
    const RESETS: usize = 30;
    let s = setup();
    let (a, _peer) = s.connected();
    let a = Arc::new(a);
    let rx = MemoryRegion::new(&s.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    runtime().block_on(async {
        let acq = AsyncCompletionQueue::new(&s.cq_a).unwrap();
        let resets = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let resetter = {
            let (a, resets) = (a.clone(), resets.clone());
            std::thread::spawn(move || {
                while resets.load(Ordering::Relaxed) < RESETS {
                    std::thread::sleep(Duration::from_micros(500));
                    a.reset().unwrap();
                    resets.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // Every task posts until the last reset: its receives land in every incarnation.
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (a, acq, rx, resets) = (a.clone(), acq.clone(), rx.clone(), resets.clone());
                tokio::spawn(async move {
                    let mut futures = Vec::new();
                    let mut refused = 0;
                    while resets.load(Ordering::Relaxed) < RESETS {
                        match acq.post_recv(&a, &RecvRequest::new(&[rx.slice(..).unwrap()])) {
                            Ok(f) => futures.push(f),
                            Err(Error::QueueFull { .. }) => refused += 1,
                            Err(e) => panic!("{e}"),
                        }
                        tokio::task::yield_now().await;
                    }
                    (futures, refused)
                })
            })
            .collect();
        let mut futures = Vec::new();
        let mut refused = 0;
        for t in tasks {
            let (f, r) = t.await.unwrap();
            futures.extend(f);
            refused += r;
        }
        resetter.join().unwrap();
        a.reset().unwrap();
        let n = futures.len();
        let outcomes = fate("every receive future", async {
            let mut v = Vec::new();
            for f in futures {
                v.push(f.await);
            }
            v
        })
        .await;
        for r in &outcomes {
            assert!(dropped_by(r, a.qp_num(), DropCause::Reset), "{r:?}");
        }
        assert_eq!(a.recv_outstanding(), 0);
        assert_eq!(Arc::strong_count(&rx), 1);
        println!("{n} receives posted by {TASKS} tasks ({refused} refused: queue full) across {RESETS} resets from another thread: every future resolved with RequestDropped(reset)");
    });
}

/// The device's event during a wait: a completion queue that overruns loses completions (rxe
/// drops them and raises `IBV_EVENT_CQ_ERR`), so a future whose completion was lost would wait
/// for ever. Passed to `handle_event`, the event fails it, and every later wait and post on the
/// queue, with a typed `DeviceEvent`.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_queue_that_overran_fails_the_futures_waiting_on_it() {
    let ctx = Context::open(&device()).expect("open the test device");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::with_channel(&ctx, 4).unwrap();
    let peer_cq = CompletionQueue::new(&ctx, 64).unwrap();
    let a = QueuePair::builder(&pd, &cq, &cq)
        .max_send_wr(128)
        .build()
        .unwrap();
    let b = QueuePair::builder(&pd, &peer_cq, &peer_cq).build().unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    let dst = MemoryRegion::new(&pd, 8, AccessFlags::remote_rw()).unwrap();
    let write = || SendRequest::write_inline(b"overflow", dst.remote().slice(..).unwrap());
    // One thread: nothing reaps the queue while this test posts.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let events = AsyncDeviceEvents::new(ctx.events().unwrap()).unwrap();
        let acq = AsyncCompletionQueue::new(&cq).unwrap();
        let overflow = cq.depth() as u64 + 8;
        for i in 0..overflow {
            a.post_send(&write().id(i)).unwrap();
        }
        let mut lost = acq.post_send(&a, &write()).unwrap();
        let event = fate("the CQ error event", async {
            loop {
                let e = events.next().await.unwrap();
                if e.kind == AsyncEventKind::CqError {
                    return e;
                }
            }
        })
        .await;
        assert!(event.concerns_cq(&cq), "{event}");
        // The precondition: the write's completion is really lost.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), &mut lost)
                .await
                .is_err(),
            "the write completed: the queue did not overrun"
        );
        assert_eq!(acq.handle_event(&event), 1, "one future was waiting");
        let r = fate("the write whose completion was lost", lost).await;
        let is_event = |r: &gdr::Result<_>| {
            matches!(r, Err(Error::DeviceEvent { event: e, .. }) if e.kind == AsyncEventKind::CqError)
        };
        assert!(is_event(&r), "{r:?}");
        let later = acq.post_send(&a, &write());
        assert!(
            matches!(&later, Err(Error::DeviceEvent { event: e, .. }) if e.kind == AsyncEventKind::CqError),
            "posting on a stopped queue: {later:?}"
        );
        // The completions that did fit are still handed out, then the waits fail too.
        let mut unclaimed = 0;
        loop {
            match fate("next_unclaimed on a stopped queue", acq.next_unclaimed()).await {
                Ok(_) => unclaimed += 1,
                Err(e) => {
                    assert!(matches!(e, Error::DeviceEvent { .. }), "{e}");
                    break;
                }
            }
        }
        println!(
            "{overflow} hand-posted writes on a CQ of depth {}: {event}; the awaited write whose \
             completion was lost: {}; {unclaimed} completions that fitted were handed out",
            cq.depth(),
            r.unwrap_err()
        );
    });
}

/// Two waiters of the device's events: two tasks await `AsyncDeviceEvents::next` on one reader
/// while the port goes down and up; each gets an event of its own.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE whose netdev it may take down (run in the VM: cargo xtask test)"]
fn two_tasks_awaiting_device_events_each_get_one() {
    let ctx = Context::open(&device()).unwrap();
    let netdev = verbs::netdev_of(&device(), ctx.port());
    let rt = runtime();
    let got = rt.block_on(async {
        let events = Arc::new(AsyncDeviceEvents::new(ctx.events().unwrap()).unwrap());
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let events = events.clone();
                tokio::spawn(async move { events.next().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        verbs::set_link(&netdev, false);
        tokio::time::sleep(Duration::from_millis(500)).await;
        verbs::set_link(&netdev, true);
        let mut got = Vec::new();
        for w in waiters {
            got.push(
                tokio::time::timeout(Duration::from_secs(15), w)
                    .await
                    .ok()
                    .map(|e| e.unwrap().unwrap()),
            );
        }
        got
    });
    verbs::wait_port_restored(&ctx, ctx.port());
    assert!(
        got.iter().all(Option::is_some),
        "a task awaiting the device's events got none within 15 s: {got:?}"
    );
    println!(
        "two tasks awaiting device events, port down and up: {}; {}",
        got[0].unwrap(),
        got[1].unwrap()
    );
}

/// Of finding 2's class: a queue pair whose send and receive queues report to two completion
/// queues, each with its own async queue; a reset tells each the requests of its own queue.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn reset_tells_each_completion_queue_of_its_own_requests() {
    let s = setup();
    let cq_r = CompletionQueue::with_channel(s.pd.context(), 64).unwrap();
    let a = QueuePair::builder(&s.pd, &s.cq_a, &cq_r).build().unwrap();
    let b = QueuePair::builder(&s.pd, &s.cq_b, &s.cq_b).build().unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    runtime().block_on(async {
        let sends = AsyncCompletionQueue::new(&s.cq_a).unwrap();
        let recvs = AsyncCompletionQueue::new(&cq_r).unwrap();
        assert!(
            matches!(
                recvs.post_send(&a, &SendRequest::send_inline(b"x")),
                Err(Error::InvalidArgument { .. })
            ),
            "the send queue reports elsewhere"
        );
        let send = stalled_send(&sends, &a);
        let recv = recvs.post_recv(&a, &RecvRequest::new(&[])).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        a.reset().unwrap();
        let (send, recv) = fate("both futures", async { tokio::join!(send, recv) }).await;
        assert!(
            matches!(
                send,
                Err(Error::RequestDropped {
                    queue: WorkQueue::Send,
                    cause: DropCause::Reset,
                    ..
                })
            ),
            "{send:?}"
        );
        assert!(
            matches!(
                recv,
                Err(Error::RequestDropped {
                    queue: WorkQueue::Recv,
                    cause: DropCause::Reset,
                    ..
                })
            ),
            "{recv:?}"
        );
        println!("send and receive queues on two async queues: both futures ended by the reset");
    });
}

/// Of finding 1's class, across incarnations: a hand-posted request's completion that went
/// unclaimed before `reset()` is not the completion of a request posted with the same id after
/// it; a future asked for by that id waits for the new one, and the old one stays unclaimed.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_completion_from_before_a_reset_is_not_claimed_by_id() {
    let s = setup();
    let (a, b) = s.connected();
    let dst = MemoryRegion::new(&s.pd, 8, AccessFlags::remote_rw()).unwrap();
    let sink = MemoryRegion::new(&s.pd, 8, AccessFlags::LOCAL_WRITE).unwrap();
    runtime().block_on(async {
        let acq = AsyncCompletionQueue::new(&s.cq_a).unwrap();
        a.post_send(&SendRequest::write_inline(b"old one!", dst.remote().slice(..).unwrap()).id(5))
            .unwrap();
        // An awaited write behind it: reaping its completion leaves the hand-posted one unclaimed.
        let w = acq
            .post_send(&a, &SendRequest::write_inline(b"12345678", dst.remote().slice(..).unwrap()))
            .unwrap();
        fate("the awaited write", w).await.unwrap();
        for qp in [&a, &b] {
            qp.reset().unwrap();
        }
        a.connect(&b.endpoint()).unwrap();
        b.connect(&a.endpoint()).unwrap();
        let mut by_id = acq.completion(&a, WorkQueue::Send, 5).unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut by_id)
                .await
                .is_err(),
            "the future took the completion from before the reset"
        );
        a.post_send(&SendRequest::read(&[sink.slice(..).unwrap()], dst.remote().slice(..).unwrap()).id(5))
            .unwrap();
        let new = fate("the READ after the reset", by_id).await.unwrap();
        assert_eq!((new.wr_id, new.opcode), (5, WcOpcode::RdmaRead));
        let old = fate("the old write, unclaimed", acq.next_unclaimed())
            .await
            .unwrap();
        assert_eq!((old.wr_id, old.opcode), (5, WcOpcode::RdmaWrite));
        println!("wr_id 5 before and after reset(): the future got the READ after it; the write before it stayed unclaimed");
    });
}
