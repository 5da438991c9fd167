//! Resource cycles: create/destroy each verbs object, and whole stacks, many times over, and
//! check that every kernel object is given back and the process does not grow.
//!
//! After each chunk of cycles (1,000 in a full run) a test compares `rdma res show`'s counts
//! (pd, mr, cq, qp, cm_id) with the baseline taken after one warm-up cycle, and the process's
//! resident memory, open file descriptors and threads with theirs, and prints one table row
//! (`gdr_test_support::cycles`, shared with gdr-xfer's `xfer_cycles`). Repeated registration of
//! the same memory must not slow down: the last chunk may take at most three times the first.
//!
//! The number of cycles per test is `GDR_CYCLES` (the full run: `GDR_CYCLES=10000 cargo xtask
//! test --vm-only --timeout 2700 cycles`, every test here has `cycles` in its name; about 19
//! minutes under emulation); without it each test runs a count chosen to keep `cargo xtask test`
//! fast (about 35 s in the VM). Run in the Soft-RoCE VM by `cargo xtask test`.

use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use gdr::connect::cm;
use gdr::cq::CompletionQueue;
use gdr::device::Context;
use gdr::mr::{AccessFlags, HostMemory, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;

use gdr_test_support::cycles::{cycles, run_cycles};
use gdr_test_support::{addr, device};

const T: Duration = Duration::from_secs(30);

fn ctx() -> Arc<Context> {
    Context::open(&device()).expect("open the test device")
}

/// Two queue pairs on `pd`, connected to each other: both through INIT and RTR to RTS.
fn connected_pair(pd: &Arc<ProtectionDomain>, cq: &Arc<CompletionQueue>) -> (QueuePair, QueuePair) {
    let a = QueuePair::builder(pd, cq, cq).build().unwrap();
    let b = QueuePair::builder(pd, cq, cq).build().unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    (a, b)
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn context_cycles() {
    let dev = device();
    run_cycles("context", cycles(1000), &["pd"], &[], |_, probe| {
        let c = Context::open(&dev).unwrap();
        // A context alone is no `rdma res` object: its first PD shows it is open.
        let pd = ProtectionDomain::new(&c).unwrap();
        probe();
        drop(pd);
        assert_eq!(c.name(), dev);
    });
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn protection_domain_cycles() {
    let ctx = ctx();
    run_cycles("pd", cycles(1000), &["pd"], &[], |_, probe| {
        let pd = ProtectionDomain::new(&ctx).unwrap();
        probe();
        drop(pd);
    });
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn host_region_cycles() {
    let pd = ProtectionDomain::new(&ctx()).unwrap();
    run_cycles("host region", cycles(1000), &["mr"], &[], |i, probe| {
        let mr = MemoryRegion::new(&pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        probe();
        mr.write(0, &(i as u64).to_le_bytes()).unwrap();
        assert_eq!(mr.load_u64(0).unwrap(), i as u64);
    });
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn completion_queue_with_channel_cycles() {
    let ctx = ctx();
    run_cycles("cq with channel", cycles(1000), &["cq"], &[], |_, probe| {
        let cq = CompletionQueue::with_channel(&ctx, 64).unwrap();
        probe();
        cq.arm().unwrap();
        assert!(
            !cq.wait(Duration::ZERO).unwrap(),
            "no completion was posted"
        );
    });
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn queue_pair_to_rts_cycles() {
    let pd = ProtectionDomain::new(&ctx()).unwrap();
    // One CQ for every cycle, never polled: each destroyed QP leaves a tombstone in the CQ's
    // dispatch table until a poll finds the CQ empty, so RSS creeps by about 8 bytes per QP
    // here (+184 KiB over 10,000 cycles in the full run), well inside the slack.
    let cq = CompletionQueue::new(pd.context(), 256).unwrap();
    run_cycles("qp pair to RTS", cycles(500), &["qp"], &[], |_, probe| {
        let (a, b) = connected_pair(&pd, &cq);
        probe();
        assert_eq!(a.state().unwrap(), gdr::QpState::Rts);
        assert_eq!(b.state().unwrap(), gdr::QpState::Rts);
    });
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn whole_stack_cycles() {
    let dev = device();
    run_cycles(
        "whole stack",
        cycles(250),
        &["pd", "mr", "cq", "qp"],
        &[],
        |i, probe| {
            let ctx = Context::open(&dev).unwrap();
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let mr = MemoryRegion::new(&pd, 8192, AccessFlags::LOCAL_WRITE).unwrap();
            mr.fill(0, 8192, i as u8).unwrap();
            let cq = CompletionQueue::with_channel(&ctx, 64).unwrap();
            let (a, b) = connected_pair(&pd, &cq);
            assert_eq!(a.state().unwrap(), gdr::QpState::Rts);
            probe();
            // Dropped in an order unlike creation's: the Arcs keep what each object needs alive.
            drop(ctx);
            drop(pd);
            drop(cq);
            drop(mr);
            drop((b, a));
        },
    );
}

#[test]
#[ignore = "needs an RDMA device and its IP in GDR_TEST_ADDR (run in the VM: cargo xtask test)"]
fn rdma_cm_connect_accept_cycles() {
    let listener = cm::Listener::bind(format!("{}:0", addr()).parse().unwrap()).unwrap();
    let dst: SocketAddr = format!("{}:{}", addr(), listener.port()).parse().unwrap();
    let (to_server, requests) = std::sync::mpsc::channel::<()>();
    let (to_client, accepted) = std::sync::mpsc::channel::<()>();
    // The server accepts one connection per request and drops it once the client is done.
    let server = std::thread::spawn(move || {
        while requests.recv().is_ok() {
            let req = listener.next_request(T).unwrap();
            let ctx = req.context().clone();
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let cq = CompletionQueue::new(&ctx, 16).unwrap();
            let qp = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
            let conn = req.accept(qp, None).unwrap();
            to_client.send(()).unwrap();
            // Wait for the client's "done" (the next request, or the end).
            let _ = requests.recv();
            drop(conn);
            to_client.send(()).unwrap();
        }
    });
    run_cycles(
        "rdma_cm connect/accept",
        cycles(250),
        &["cm_id", "qp"],
        &[],
        |_, probe| {
            to_server.send(()).unwrap();
            let pending = cm::Connector::resolve(dst, T).unwrap();
            let ctx = pending.context().clone();
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let cq = CompletionQueue::new(&ctx, 16).unwrap();
            let qp = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
            let conn = pending.connect(qp, None).unwrap();
            accepted.recv_timeout(T).expect("the server accepted");
            assert_eq!(conn.qp().state().unwrap(), gdr::QpState::Rts);
            probe();
            drop(conn);
            to_server.send(()).unwrap();
            accepted
                .recv_timeout(T)
                .expect("the server dropped its side");
        },
    );
    drop(to_server);
    server.join().unwrap();
}

/// One leaked buffer, registered again and again: the same pages every time.
struct SameMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain bytes, reached only through the raw pointer by the one region that owns this
// value at a time.
unsafe impl Send for SameMemory {}
// SAFETY: `&SameMemory` gives no access to the bytes.
unsafe impl Sync for SameMemory {}

// SAFETY: `ptr` comes from a leaked `&'static mut [u8]` (exclusive, write-capable, initialised,
// never freed or moved), `len` is its length; the test registers it from one `SameMemory` at a
// time (each region is dropped before the next is made), and nothing else touches the bytes.
unsafe impl HostMemory for SameMemory {
    fn as_mut_ptr(&mut self) -> NonNull<u8> {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn registration_cycles_of_the_same_memory_do_not_slow_down() {
    const LEN: usize = 1 << 20;
    let pd = ProtectionDomain::new(&ctx()).unwrap();
    let buf: &'static mut [u8] = Box::leak(vec![0u8; LEN].into_boxed_slice());
    let ptr = NonNull::new(buf.as_mut_ptr()).expect("a boxed slice is not null");
    let rows = run_cycles(
        "same 1 MiB registered",
        cycles(1000),
        &["mr"],
        &[],
        |i, probe| {
            let mr = MemoryRegion::register(
                &pd,
                Box::new(SameMemory { ptr, len: LEN }),
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
            assert_eq!(
                mr.remote().addr,
                ptr.as_ptr() as u64,
                "the same pages each time"
            );
            // The bytes survive from one registration to the next.
            assert_eq!(mr.load_u64(0).unwrap(), i.saturating_sub(1) as u64);
            mr.write(0, &(i as u64).to_le_bytes()).unwrap();
            probe();
        },
    );
    let (first, last) = (rows[0].chunk, rows[rows.len() - 1].chunk);
    println!(
        "cycles same 1 MiB registered: first chunk {:.0} ms, last chunk {:.0} ms",
        first.as_secs_f64() * 1000.0,
        last.as_secs_f64() * 1000.0
    );
    assert!(
        last <= first * 3 + Duration::from_millis(50),
        "registering the same memory slowed down: first chunk {first:?}, last {last:?}"
    );
}
