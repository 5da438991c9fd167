//! Connection setup on a real RDMA device: rdma_cm (resolve, connect, listen, accept) and the
//! TCP handshake of `gdr::connect`.
//! Run in the Soft-RoCE VM by `cargo xtask test` (needs GDR_TEST_ADDR, the device's IP address,
//! and GDR_TEST_DEVICE, its name).

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use gdr::connect::{self, cm, PeerInfo, TcpLink};
use gdr::cq::{CompletionQueue, WcOpcode, WcStatus};
use gdr::device::Context;
use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::{QpState, QueuePair};
use gdr::wr::{RecvRequest, SendRequest};
use gdr::Error;

use gdr_test_support::{addr, device};

const T: Duration = Duration::from_secs(10);

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
        let (pd, cq, qp) = qp_on(&ctx, req.port(), 64);
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
    assert_eq!(
        ctx.port(),
        pending.port(),
        "the context remembers rdma_cm's port"
    );
    let (pd, cq, qp) = qp_on(&ctx, pending.port(), 64);
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
    let (_pd, _cq, qp) = qp_on(&ctx, pending.port(), 8);
    let e = match pending.connect(qp, None) {
        Ok(_) => panic!("connected to a port nobody listens on"),
        Err(e) => e,
    };
    assert!(
        matches!(&e, Error::CmEvent { got, .. }
            if got == "RDMA_CM_EVENT_REJECTED" || got == "RDMA_CM_EVENT_UNREACHABLE")
            || matches!(e, Error::Timeout { .. }),
        "{e:?}"
    );
    assert!(e.hint().is_some(), "{e}");
}

#[test]
#[ignore = "needs an RDMA device and its IP in GDR_TEST_ADDR (run in the VM: cargo xtask test)"]
fn resolving_an_address_no_device_reaches_fails_clearly() {
    // 192.0.2.0/24 is TEST-NET-1: never assigned; the VM has no route to it.
    let e = match cm::Connector::resolve("192.0.2.1:7471".parse().unwrap(), Duration::from_secs(2))
    {
        Ok(_) => panic!("resolved an unreachable address"),
        Err(e) => e,
    };
    assert!(
        matches!(&e, Error::CmEvent { got, .. } if got == "RDMA_CM_EVENT_ADDR_ERROR")
            || matches!(
                e,
                Error::Verbs {
                    call: "rdma_resolve_addr",
                    ..
                } | Error::Timeout { .. }
            ),
        "{e:?}"
    );
}

#[test]
#[ignore = "needs an RDMA device and its IP in GDR_TEST_ADDR (run in the VM: cargo xtask test)"]
fn duration_max_timeouts_resolve_connect_and_accept() {
    // Instant + Duration::MAX used to panic in accept; every wait here has no deadline.
    let listener = cm::Listener::bind(format!("{}:0", addr()).parse().unwrap()).unwrap();
    let port = listener.port();
    let server = std::thread::spawn(move || {
        let req = listener.next_request(Duration::MAX).unwrap();
        assert_eq!(req.context().port(), req.port());
        let ctx = req.context().clone();
        let (_pd, _cq, qp) = qp_on(&ctx, req.port(), 8);
        let conn = req.accept(qp, None).unwrap();
        assert_eq!(conn.qp().state().unwrap(), QpState::Rts);
        conn
    });
    let dst: SocketAddr = format!("{}:{port}", addr()).parse().unwrap();
    let pending = cm::Connector::resolve(dst, Duration::MAX).unwrap();
    let ctx = pending.context().clone();
    let (_pd, _cq, qp) = qp_on(&ctx, pending.port(), 8);
    let conn = pending.connect(qp, None).unwrap();
    assert_eq!(conn.qp().state().unwrap(), QpState::Rts);
    let server_conn = server.join().unwrap();
    drop(conn);
    drop(server_conn);
}

struct Side {
    cq: std::sync::Arc<CompletionQueue>,
    pd: std::sync::Arc<ProtectionDomain>,
    qp: QueuePair,
}

fn side() -> Side {
    let ctx = Context::open(&device()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    let qp = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
    Side { cq, pd, qp }
}

#[test]
#[ignore = "needs an RDMA device and its IP in GDR_TEST_ADDR (run in the VM: cargo xtask test)"]
fn handshake_whose_peer_closes_after_the_hello_leaves_the_qp_in_error() {
    // TCP over the rxe device's own address, not loopback.
    let listener = TcpListener::bind(format!("{}:0", addr())).unwrap();
    let at = listener.local_addr().unwrap();
    let peer = side();
    let peer_endpoint = peer.qp.endpoint();
    let peer_thread = std::thread::spawn(move || {
        let mut link = TcpLink::accept(&listener).unwrap();
        let theirs = link.exchange(&PeerInfo::new(peer_endpoint)).unwrap();
        // Close right after the hello: the barrier never comes.
        drop(link);
        theirs
    });

    let me = side();
    let mr = MemoryRegion::new(&me.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    me.qp
        .post_recv(&RecvRequest::new(&[mr.slice(..).unwrap()]).id(9))
        .unwrap();
    let mut link = TcpLink::connect(at, T).unwrap();
    let e = connect::handshake(&mut link, &me.qp, &[]).unwrap_err();
    assert!(
        matches!(&e, Error::PeerLost { reason, .. } if reason.contains("closed the connection")),
        "the barrier's error names the closed peer: {e}"
    );
    assert_eq!(
        peer_thread.join().unwrap().endpoint,
        me.qp.endpoint(),
        "the hello went through"
    );
    assert_eq!(me.qp.state().unwrap(), QpState::Error);

    // The posted receive flushes, and reset() makes the queue pair usable again.
    let c = me.cq.wait_for(1, T).unwrap()[0];
    assert_eq!((c.wr_id, c.status), (9, WcStatus::WrFlush), "{c:?}");
    me.qp.reset().unwrap();
    assert_eq!(me.qp.state().unwrap(), QpState::Init);
}

#[test]
#[ignore = "needs an RDMA device and its IP in GDR_TEST_ADDR (run in the VM: cargo xtask test)"]
fn handshake_whose_peer_closes_before_the_hello_leaves_the_qp_untouched() {
    let listener = TcpListener::bind(format!("{}:0", addr())).unwrap();
    let at = listener.local_addr().unwrap();
    let peer_thread = std::thread::spawn(move || drop(TcpLink::accept(&listener).unwrap()));
    let me = side();
    let mut link = TcpLink::connect(at, T).unwrap();
    peer_thread.join().unwrap();
    let e = connect::handshake(&mut link, &me.qp, &[]).unwrap_err();
    assert!(
        matches!(&e, Error::PeerLost { reason, .. } if reason.contains("closed the connection")),
        "{e}"
    );
    assert_eq!(me.qp.state().unwrap(), QpState::Init);
}

/// A protection domain, a completion queue of `depth` and a queue pair on `ctx`, the context
/// rdma_cm opened for a connection: the queue pair takes the context's port, which must be the one
/// rdma_cm resolved (`port`).
fn qp_on(
    ctx: &std::sync::Arc<gdr::device::Context>,
    port: u8,
    depth: u32,
) -> (
    std::sync::Arc<ProtectionDomain>,
    std::sync::Arc<CompletionQueue>,
    QueuePair,
) {
    let pd = ProtectionDomain::new(ctx).unwrap();
    let cq = CompletionQueue::new(ctx, depth).unwrap();
    let qp = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
    assert_eq!(
        qp.port(),
        port,
        "the queue pair takes the port rdma_cm resolved"
    );
    (pd, cq, qp)
}

fn cm_client(dst: SocketAddr) -> cm::CmConnection {
    let pending = cm::Connector::resolve(dst, T).unwrap();
    let ctx = pending.context().clone();
    let (_pd, _cq, qp) = qp_on(&ctx, pending.port(), 8);
    pending.connect(qp, None).unwrap()
}

fn cm_accept(req: cm::ConnectRequest) -> cm::CmConnection {
    let ctx = req.context().clone();
    let (_pd, _cq, qp) = qp_on(&ctx, req.port(), 8);
    req.accept(qp, None).unwrap()
}

#[test]
#[ignore = "needs an RDMA device and its IP in GDR_TEST_ADDR (run in the VM: cargo xtask test)"]
fn a_second_request_that_arrives_during_accept_is_kept_for_next_request() {
    let listener = cm::Listener::bind(format!("{}:0", addr()).parse().unwrap()).unwrap();
    let dst: SocketAddr = format!("{}:{}", addr(), listener.port()).parse().unwrap();
    let a = std::thread::spawn(move || cm_client(dst));
    let req_a = listener.next_request(T).unwrap();
    // B's request reaches the listener's channel before A is accepted, so accept(A) reads it
    // while waiting for A's ESTABLISHED (it used to drop it, leaking its id, and B timed out).
    let b = std::thread::spawn(move || cm_client(dst));
    std::thread::sleep(Duration::from_millis(500));
    let conn_a = cm_accept(req_a);
    let req_b = listener.next_request(T).unwrap();
    let conn_b = cm_accept(req_b);
    let (client_a, client_b) = (a.join().unwrap(), b.join().unwrap());
    for c in [&conn_a, &conn_b, &client_a, &client_b] {
        assert_eq!(c.qp().state().unwrap(), QpState::Rts);
    }
}
