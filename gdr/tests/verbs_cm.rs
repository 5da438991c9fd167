//! rdma_cm connections (resolve, connect, listen, accept) on a real RDMA device.
//! Run in the Soft-RoCE VM by `cargo xtask test` (needs GDR_TEST_ADDR, the device's IP address).

use std::net::SocketAddr;
use std::time::Duration;

use gdr::connect::cm;
use gdr::cq::{CompletionQueue, WcOpcode};
use gdr::mr::{AccessFlags, MemoryRegion, RegionExt};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::wr::{RecvRequest, SendRequest};

const T: Duration = Duration::from_secs(10);

fn addr() -> String {
    std::env::var("GDR_TEST_ADDR").expect("GDR_TEST_ADDR is not set: this test needs the IP address of an RDMA device (cargo xtask test sets it in the VM)")
}

#[test]
#[ignore = "needs an RDMA device and its IP in GDR_TEST_ADDR (run in the VM: cargo xtask test)"]
fn connect_accept_write_and_send() {
    let listener = cm::Listener::bind(format!("{}:0", addr()).parse().unwrap()).unwrap();
    let port = listener.port();
    assert_ne!(port, 0);
    let server = std::thread::spawn(move || {
        let req = listener.next_request(T).unwrap();
        let client_region = req.remote_region().expect("the client advertised a region");
        assert_eq!(client_region.len, 4096);
        let ctx = req.context().clone();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::new(&ctx, 64).unwrap();
        let qp = QueuePair::builder(&pd, &cq, &cq)
            .port(req.port())
            .build()
            .unwrap();
        let mr = MemoryRegion::new(
            &pd,
            8192,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
        qp.post_recv(&RecvRequest::new(&[mr.slice(4096..).unwrap()]).id(1))
            .unwrap();
        let conn = req.accept(qp, Some(mr.remote())).unwrap();
        let got = cq.wait_for(1, T).unwrap()[0];
        got.result().unwrap();
        assert_eq!(
            (got.wr_id, got.opcode, got.byte_len),
            (1, WcOpcode::Recv, 5)
        );
        let data = mr.to_vec();
        assert!(
            data[..4096]
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i % 251) as u8),
            "RDMA write landed"
        );
        assert_eq!(&data[4096..4101], b"hello");
        drop(conn);
    });
    let dst: SocketAddr = format!("{}:{port}", addr()).parse().unwrap();
    let pending = cm::Connector::resolve(dst, T).unwrap();
    let ctx = pending.context().clone();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 64).unwrap();
    let qp = QueuePair::builder(&pd, &cq, &cq)
        .port(pending.port())
        .build()
        .unwrap();
    let data: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
    let mr = MemoryRegion::with_data(
        &pd,
        &data,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
    )
    .unwrap();
    let conn = pending.connect(qp, Some(mr.remote())).unwrap();
    let remote = conn
        .remote_region()
        .expect("the server advertised a region");
    assert_eq!(remote.len, 8192);
    conn.qp()
        .post_send(
            &SendRequest::write(&[mr.slice(..).unwrap()], remote.slice(..4096).unwrap()).id(1),
        )
        .unwrap();
    conn.qp()
        .post_send(&SendRequest::send_inline(b"hello").id(2))
        .unwrap();
    let done = cq.wait_for(2, T).unwrap();
    assert!(done.iter().all(|c| c.is_ok()), "{done:?}");
    server.join().unwrap();
}

#[test]
#[ignore = "needs an RDMA device and its IP in GDR_TEST_ADDR (run in the VM: cargo xtask test)"]
fn connecting_to_a_port_nobody_listens_on_is_rejected_with_a_hint() {
    let dst: SocketAddr = format!("{}:1", addr()).parse().unwrap();
    let pending = cm::Connector::resolve(dst, T).unwrap();
    let ctx = pending.context().clone();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 8).unwrap();
    let qp = QueuePair::builder(&pd, &cq, &cq)
        .port(pending.port())
        .build()
        .unwrap();
    let e = match pending.connect(qp, None) {
        Ok(_) => panic!("connected to a port nobody listens on"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("REJECTED") || e.contains("UNREACHABLE") || e.contains("timed out"),
        "{e}"
    );
    assert!(e.contains("hint:"), "{e}");
}

#[test]
#[ignore = "needs an RDMA device and its IP in GDR_TEST_ADDR (run in the VM: cargo xtask test)"]
fn resolving_an_address_no_device_reaches_fails_clearly() {
    // 192.0.2.0/24 is TEST-NET-1: never assigned; the VM has no route to it.
    let e = match cm::Connector::resolve("192.0.2.1:7471".parse().unwrap(), Duration::from_secs(2))
    {
        Ok(_) => panic!("resolved an unreachable address"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("rdma_resolve_addr") || e.contains("ADDR_ERROR") || e.contains("timed out"),
        "{e}"
    );
}
