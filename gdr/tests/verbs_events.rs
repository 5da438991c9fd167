//! The device's asynchronous events, read through the blocking API, on a real RDMA device.
//!
//! Run in the Soft-RoCE VM by `cargo xtask test` (as root: the test takes the port's netdev
//! down and up again); on real hardware it needs root and a port it may flap:
//! `GDR_TEST_DEVICE=rxe0 cargo test -p gdr --test verbs_events -- --ignored --test-threads=1`.

use std::time::{Duration, Instant};

use gdr::device::{AsyncEventKind, Context, EventSubject};
use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::wr::SendRequest;
use gdr::Error;
use gdr::{CompletionQueue, ProtectionDomain, QueuePair};

use gdr_test_support::device;
use gdr_test_support::verbs::{netdev_of, set_link, wait_port_restored};

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE whose netdev it may take down (run in the VM: cargo xtask test)"]
fn a_port_taken_down_is_a_typed_event_and_pending_requests_fail() {
    let ctx = Context::open(&device()).unwrap();
    let events = ctx.events().unwrap();
    assert!(
        matches!(ctx.events(), Err(Error::InvalidArgument { .. })),
        "one reader per context"
    );
    assert!(
        events.next(Duration::from_millis(100)).unwrap().is_none(),
        "quiet before"
    );
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 64).unwrap();
    // A bounded failure: rxe treats retry_count 7 as infinite; 2 retries of ~4 ms each.
    let a = QueuePair::builder(&pd, &cq, &cq)
        .retry_count(2)
        .timeout(10)
        .build()
        .unwrap();
    let peer_cq = CompletionQueue::new(&ctx, 64).unwrap();
    let b = QueuePair::builder(&pd, &peer_cq, &peer_cq).build().unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    let src = MemoryRegion::with_data(&pd, &[9; 4096], AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&pd, 4096, AccessFlags::remote_rw()).unwrap();

    let netdev = netdev_of(&device(), ctx.port());
    let down = Instant::now();
    set_link(&netdev, false);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut seen = Vec::new();
        let port_err = loop {
            let e = events
                .next(Duration::from_secs(15))
                .unwrap()
                .unwrap_or_else(|| panic!("no port error within 15 s; saw {seen:?}"));
            if e.kind == AsyncEventKind::PortError {
                break e;
            }
            seen.push(e);
        };
        let after = down.elapsed();
        assert_eq!(port_err.subject, EventSubject::Port(ctx.port()));
        assert!(port_err.kind.is_error() && port_err.hint().is_some());
        println!("{port_err} ({after:?} after the link went down; also saw {seen:?})");
        // A request posted while the link is down fails within the retry bound, no hang.
        a.post_send(
            &SendRequest::write(&[src.slice(..).unwrap()], dst.remote().slice(..).unwrap()).id(1),
        )
        .unwrap();
        let posted = Instant::now();
        let c = cq.wait_for(1, Duration::from_secs(30)).unwrap()[0];
        assert_ne!(c.status, gdr::WcStatus::Success, "{c:?}");
        println!(
            "write on a downed port: {} after {:?}",
            c.status,
            posted.elapsed()
        );
    }));
    set_link(&netdev, true);
    let up = loop {
        match events.next(Duration::from_secs(20)).unwrap() {
            Some(e) if e.kind == AsyncEventKind::PortActive => break e,
            Some(_) => continue,
            None => panic!("no port-active event within 20 s of the link coming back"),
        }
    };
    assert_eq!(up.subject, EventSubject::Port(ctx.port()));
    wait_port_restored(&ctx, ctx.port());
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}
