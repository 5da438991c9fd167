//! The async forms of the blocking calls, awaited on tokio: connecting, waiting for a peer and
//! for its segment, notifications as a future and as a stream; each wakes when its condition
//! comes, and each ends with a typed error when the agent or the peer goes.

use std::future::poll_fn;
use std::pin::Pin;
use std::time::Duration;

use futures_core::Stream;
use gdr_test_support::pattern;
use gdr_test_support::xfer::agent;
use gdr_xfer::{Desc, Error, TransferOptions};

const WAIT: Duration = Duration::from_secs(60);

/// The next item of a stream (what `StreamExt::next` does).
async fn next<S: Stream + Unpin>(s: &mut S) -> Option<S::Item> {
    poll_fn(|cx| Pin::new(&mut *s).poll_next(cx)).await
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn connect_wait_and_notifications_are_awaited_without_blocking_a_thread() {
    // One worker thread: a wait that blocked it would stall every other task.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let a = agent("async-a");
        let b = agent("async-b");
        let addr = b.listen("127.0.0.1:0").unwrap();
        // b waits for a (nothing connected yet) while a connects: both on the one worker.
        let (pa, pb) = tokio::join!(
            b.wait_peer_async("async-a"),
            a.connect_async(&addr.to_string())
        );
        let (_pa, pb) = (pa.unwrap(), pb.unwrap());
        // a waits for a segment b registers only later.
        let len = 1 << 20;
        let wait = pb.wait_segment_named_async("late");
        let register = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            b.alloc_host(len, "late").unwrap()
        };
        let (info, dst) = tokio::join!(wait, register);
        let info = info.unwrap();
        assert_eq!(info.id, dst.id());
        // 32 writes, each with a notification; b takes them as a stream while they arrive.
        let src = a.alloc_host(len, "src").unwrap();
        src.write(0, &pattern(len, 5)).unwrap();
        let block = len as u64 / 32;
        let sender = async {
            for i in 0..32u64 {
                let t = pb
                    .write(
                        &[Desc::new(&src, i * block, info.id, i * block, block)],
                        &TransferOptions::new().notify(format!("block {i}")),
                    )
                    .unwrap();
                t.await.unwrap();
            }
        };
        let receiver = async {
            let mut notes = b.notifications();
            let mut got = Vec::new();
            while got.len() < 32 {
                let n = tokio::time::timeout(WAIT, next(&mut notes))
                    .await
                    .expect("a notification within the wait")
                    .expect("the stream goes on while the agent lives");
                assert_eq!(n.peer, "async-a");
                got.push(String::from_utf8(n.data).unwrap());
            }
            got
        };
        let ((), mut got) = tokio::join!(sender, receiver);
        got.sort_by_key(|s| s[6..].parse::<u32>().unwrap());
        let want: Vec<String> = (0..32).map(|i| format!("block {i}")).collect();
        assert_eq!(got, want, "none lost, none twice");
        assert_eq!(dst.to_vec(0, len).unwrap(), pattern(len, 5));
        // A wait given up (its future dropped by the timeout) leaves nothing behind: the next
        // notification still reaches the next wait.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), b.wait_notification_async())
                .await
                .is_err()
        );
        pb.write(
            &[Desc::new(&src, 0, info.id, 0, 8)],
            &TransferOptions::new().notify("after"),
        )
        .unwrap()
        .await
        .unwrap();
        let n = tokio::time::timeout(WAIT, b.wait_notification_async())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n.data, b"after");
    });
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn async_waits_end_with_a_typed_error_when_the_peer_or_the_agent_goes() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let a = agent("gone-a");
        let b = agent("gone-b");
        let addr = b.listen("127.0.0.1:0").unwrap();
        let pb = a.connect_async(&addr.to_string()).await.unwrap();
        // A segment that never comes: the wait ends when the peer goes.
        let wait = pb.wait_segment_named_async("never");
        let (r, ()) = tokio::join!(tokio::time::timeout(WAIT, wait), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(b);
        });
        match r.expect("woken by the peer's loss, not by the timeout") {
            Err(Error::PeerLost { peer, .. }) => assert_eq!(peer, "gone-b"),
            other => panic!("expected PeerLost, got {other:?}"),
        }
        // Waits on an agent that shuts down end with AgentClosed; its stream ends.
        let c = agent("gone-c");
        let (peer, note, end) = tokio::join!(
            tokio::time::timeout(WAIT, c.wait_peer_async("nobody")),
            tokio::time::timeout(WAIT, c.wait_notification_async()),
            async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                c.shutdown(Duration::ZERO)
            }
        );
        assert!(matches!(peer.unwrap(), Err(Error::AgentClosed)));
        assert!(matches!(note.unwrap(), Err(Error::AgentClosed)));
        assert_eq!(end.failed, 0);
        assert!(next(&mut c.notifications()).await.is_none());
        assert!(matches!(
            c.connect_async(&addr.to_string()).await,
            Err(Error::AgentClosed)
        ));
    });
}

/// The futures own what they need: a long-lived poller (the Python binding's) keeps one across
/// polls, on any thread.
#[test]
fn the_wait_futures_are_static_send_and_unpin() {
    fn owned<T: Send + Unpin + 'static>() {}
    owned::<gdr_xfer::futures::WaitNotification>();
    owned::<gdr_xfer::futures::Notifications>();
    owned::<gdr_xfer::futures::WaitPeer>();
    owned::<gdr_xfer::futures::WaitSegment>();
    owned::<gdr_xfer::futures::Connecting>();
}

struct Counting(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Counting {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn dropped_wait_futures_leave_no_waker_behind() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let a = agent("wakers-a");
    let b = agent("wakers-b");
    let addr = b.listen("127.0.0.1:0").unwrap();
    let pb = a.connect(&addr.to_string()).unwrap();
    let counting = std::sync::Arc::new(Counting(0.into()));
    let waker = Waker::from(counting.clone());
    let mut cx = Context::from_waker(&waker);
    const N: usize = 10_000;
    for i in 0..N {
        // Polled twice (the second poll replaces its own registration), then dropped.
        let mut n = a.wait_notification_async();
        assert!(Pin::new(&mut n).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut n).poll(&mut cx).is_pending());
        let mut s = a.notifications();
        assert!(Pin::new(&mut s).poll_next(&mut cx).is_pending());
        assert!(Pin::new(&mut s).poll_next(&mut cx).is_pending());
        let mut p = a.wait_peer_async("nobody");
        assert!(Pin::new(&mut p).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut p).poll(&mut cx).is_pending());
        let mut w = pb.wait_segment_named_async("never");
        assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        let held = a.waker_counts();
        assert_eq!(
            (held.notifications, held.peers, pb.waker_count()),
            (2, 1, 1),
            "one waker per pending future (round {i})"
        );
        drop((n, s, p, w));
        let held = a.waker_counts();
        assert_eq!(
            (held.notifications, held.peers, pb.waker_count()),
            (0, 0, 0),
            "round {i}: {held:?} wakers held after their futures were dropped"
        );
    }
    // A woken future, dropped after: nothing to remove, nothing left.
    let mut n = a.wait_notification_async();
    assert!(Pin::new(&mut n).poll(&mut cx).is_pending());
    a.requeue_notification(gdr_xfer::Notification {
        peer: "x".into(),
        data: b"x".to_vec(),
    });
    assert!(counting.0.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    drop(n);
    assert_eq!(a.waker_counts(), gdr_xfer::WakerCounts::default());
    assert_eq!(a.take_notifications().len(), 1);
}
