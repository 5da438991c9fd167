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

use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr::aio::AsyncCompletionQueue;
use gdr::cq::{CompletionQueue, WcOpcode};
use gdr::device::Context;
use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::wr::{RecvRequest, SendRequest};
use gdr::Error;

mod common;
use common::device;

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
    let pd = ctx.alloc_pd().unwrap();
    let cq_a = ctx.create_cq_with_channel(1024).unwrap();
    let cq_b = ctx.create_cq_with_channel(1024).unwrap();
    Setup { pd, cq_a, cq_b }
}

impl Setup {
    /// A queue pair on `cq_a` connected to a peer on `cq_b`; returns (ours, peer).
    fn connected(&self) -> (QueuePair, QueuePair) {
        let a = self
            .pd
            .queue_pair(&self.cq_a, &self.cq_a)
            .max_send_wr(64)
            .max_recv_wr(64)
            .build()
            .unwrap();
        let b = self
            .pd
            .queue_pair(&self.cq_b, &self.cq_b)
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
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(a.send_outstanding() + a.recv_outstanding(), 2);
        let reset = Instant::now();
        a.reset().unwrap();
        let (send, recv) = fate("the futures after reset()", async {
            tokio::join!(send, recv)
        })
        .await;
        let took = reset.elapsed();
        for (what, r) in [("send", &send), ("receive", &recv)] {
            assert!(r.is_err(), "the {what} cannot have completed: {r:?}");
        }
        assert_eq!(
            Arc::strong_count(&rx),
            1,
            "the receive's region is released"
        );
        println!(
            "reset(): the stalled send and the pending receive resolved {took:?} later: {}; {}",
            send.unwrap_err(),
            recv.unwrap_err()
        );
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
        println!("10 rounds: two tasks awaiting next_unclaimed, two completions, each task got one");
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
        assert!(leftover.is_err(), "the old READ reached someone: {leftover:?}");
        println!("old queue's READ {old:#x}, new queue's write {new:#x}: each completion to its own");
    });
}
