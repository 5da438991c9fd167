//! Every RC operation between two queue pairs of one process, on a real RDMA device.
//!
//! Run in the Soft-RoCE VM by `cargo xtask test`; on real hardware:
//! `GDR_TEST_DEVICE=mlx5_0 cargo test -p gdr --test verbs_loopback -- --ignored --test-threads=1`.
//! A missing device is a failure, not a skip.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr::cq::{Completion, CompletionQueue, WcOpcode, WcStatus};
use gdr::device::{Context, DeviceList, GidType, PortState};
use gdr::mr::{AccessFlags, MemoryRegion, RemoteRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::{QpState, QueuePair, WorkQueue};
use gdr::wr::{Operation, RecvRequest, SendRequest};
use gdr::Error;

use gdr_test_support::device;
use gdr_test_support::verbs::{pair_of, Pair};

const T: Duration = Duration::from_secs(10);

fn pair_with(f: impl Fn(gdr::qp::QueuePairBuilder) -> gdr::qp::QueuePairBuilder) -> Pair {
    pair_of(true, f)
}

fn pair() -> Pair {
    pair_with(|b| b)
}

fn one(cq: &CompletionQueue) -> Completion {
    let c = cq.wait_for(1, T).unwrap()[0];
    c.result().unwrap();
    c
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn device_port_and_roce_v2_gid() {
    let names = DeviceList::new().unwrap().names();
    assert!(
        names.contains(&device()),
        "{} not among {names:?}",
        device()
    );
    let ctx = Context::open(&format!("{}:1", device())).unwrap();
    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Active);
    let attr = ctx.query_device().unwrap();
    assert!(attr.max_qp > 0 && attr.phys_port_cnt >= 1);
    let gid = ctx.default_gid(1).unwrap();
    assert_eq!(gid.gid_type, GidType::RoceV2);
    assert!(gid.gid.ipv4().is_some(), "{gid:?}");
    if let Ok(i) = std::env::var("GDR_TEST_GID_INDEX") {
        assert_eq!(gid.index, i.parse::<u32>().unwrap());
    }
    let err = Context::open("no_such_dev0").unwrap_err();
    assert!(matches!(err, Error::DeviceNotFound { .. }), "{err}");
    assert!(
        err.to_string().contains(&device()),
        "lists what exists: {err}"
    );
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn rdma_write_and_write_with_imm() {
    let p = pair();
    let src = MemoryRegion::with_data(&p.pd, &bytes(8192, 1), AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&p.pd, 8192, AccessFlags::REMOTE_WRITE).unwrap();
    let remote = dst.remote();
    p.a.post_send(
        &SendRequest::write(&[src.slice(..4096).unwrap()], remote.slice(..4096).unwrap()).id(7),
    )
    .unwrap();
    let c = one(&p.cq_a);
    assert_eq!((c.wr_id, c.opcode), (7, WcOpcode::RdmaWrite));
    assert_eq!(dst.to_vec()[..4096], bytes(8192, 1)[..4096]);

    p.b.post_recv(&RecvRequest::new(&[]).id(99)).unwrap();
    p.a.post_send(
        &SendRequest::write(&[src.slice(4096..).unwrap()], remote.slice(4096..).unwrap())
            .with_imm(0xdead_beef)
            .id(8),
    )
    .unwrap();
    assert_eq!(one(&p.cq_a).wr_id, 8);
    let r = one(&p.cq_b);
    assert_eq!(
        (r.wr_id, r.opcode, r.imm, r.is_recv),
        (99, WcOpcode::RecvRdmaWithImm, Some(0xdead_beef), true)
    );
    assert_eq!(dst.to_vec(), bytes(8192, 1));
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn rdma_read() {
    let p = pair();
    let theirs = MemoryRegion::with_data(&p.pd, &bytes(3000, 5), AccessFlags::REMOTE_READ).unwrap();
    let mine = MemoryRegion::new(&p.pd, 3000, AccessFlags::LOCAL_WRITE).unwrap();
    p.a.post_send(
        &SendRequest::read(
            &[mine.slice(..).unwrap()],
            theirs.remote().slice(..).unwrap(),
        )
        .id(3),
    )
    .unwrap();
    let c = one(&p.cq_a);
    assert_eq!(
        (c.wr_id, c.opcode, c.byte_len),
        (3, WcOpcode::RdmaRead, 3000)
    );
    assert_eq!(mine.to_vec(), bytes(3000, 5));
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn send_receive_with_and_without_imm_and_inline() {
    let p = pair();
    let rx = MemoryRegion::new(&p.pd, 4 * 1024, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..4 {
        p.b.post_recv(
            &RecvRequest::new(&[rx.slice(i * 1024..(i + 1) * 1024).unwrap()]).id(i as u64),
        )
        .unwrap();
    }
    let tx = MemoryRegion::with_data(&p.pd, &bytes(1000, 9), AccessFlags::LOCAL_WRITE).unwrap();
    p.a.post_send(&SendRequest::send(&[tx.slice(..).unwrap()]).id(1))
        .unwrap();
    p.a.post_send(
        &SendRequest::send(&[tx.slice(..500).unwrap()])
            .with_imm(42)
            .id(2),
    )
    .unwrap();
    p.a.post_send(&SendRequest::send_inline(b"inline hello").id(3))
        .unwrap();
    p.a.post_send(&SendRequest::send(&[tx.slice(..10).unwrap()]).inline().id(4))
        .unwrap();
    let sent: Vec<u64> = p
        .cq_a
        .wait_for(4, T)
        .unwrap()
        .iter()
        .map(|c| c.result().unwrap().wr_id)
        .collect();
    assert_eq!(sent, [1, 2, 3, 4]);
    let got = p.cq_b.wait_for(4, T).unwrap();
    let summary: Vec<_> = got
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.byte_len, c.imm))
        .collect();
    assert_eq!(
        summary,
        [
            (0, WcOpcode::Recv, 1000, None),
            (1, WcOpcode::Recv, 500, Some(42)),
            (2, WcOpcode::Recv, 12, None),
            (3, WcOpcode::Recv, 10, None)
        ]
    );
    let data = rx.to_vec();
    assert_eq!(data[..1000], bytes(1000, 9)[..]);
    assert_eq!(data[1024..1524], bytes(500, 9)[..]);
    assert_eq!(&data[2048..2060], b"inline hello");
    assert_eq!(data[3072..3082], bytes(10, 9)[..]);
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn atomics_return_previous_values() {
    let p = pair();
    let target =
        MemoryRegion::with_data(&p.pd, &5u64.to_ne_bytes(), AccessFlags::REMOTE_ATOMIC).unwrap();
    let old = MemoryRegion::new(&p.pd, 8, AccessFlags::LOCAL_WRITE).unwrap();
    let word = target.remote().slice(..).unwrap();
    let read_old = || u64::from_ne_bytes(old.to_vec().try_into().unwrap());
    let read_target = || u64::from_ne_bytes(target.to_vec().try_into().unwrap());

    p.a.post_send(&SendRequest::compare_swap(
        &old.slice(..).unwrap(),
        word,
        5,
        9,
    ))
    .unwrap();
    assert_eq!(one(&p.cq_a).opcode, WcOpcode::CompareSwap);
    assert_eq!((read_old(), read_target()), (5, 9), "swap happened");

    p.a.post_send(&SendRequest::compare_swap(
        &old.slice(..).unwrap(),
        word,
        5,
        1,
    ))
    .unwrap();
    one(&p.cq_a);
    assert_eq!(
        (read_old(), read_target()),
        (9, 9),
        "compare failed, no swap"
    );

    p.a.post_send(&SendRequest::fetch_add(&old.slice(..).unwrap(), word, 100))
        .unwrap();
    assert_eq!(one(&p.cq_a).opcode, WcOpcode::FetchAdd);
    assert_eq!((read_old(), read_target()), (9, 109));

    let e =
        p.a.post_send(&SendRequest::fetch_add(&old.slice(..4).unwrap(), word, 1))
            .unwrap_err();
    assert!(e.to_string().contains("both must be exactly 8"), "{e}");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn scatter_gather_lists() {
    let p = pair();
    let a = MemoryRegion::with_data(&p.pd, &bytes(100, 1), AccessFlags::LOCAL_WRITE).unwrap();
    let b = MemoryRegion::with_data(&p.pd, &bytes(200, 2), AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&p.pd, 300, AccessFlags::REMOTE_WRITE).unwrap();
    let sg = [b.slice(..200).unwrap(), a.slice(..100).unwrap()];
    p.a.post_send(&SendRequest::write(&sg, dst.remote().slice(..).unwrap()))
        .unwrap();
    one(&p.cq_a);
    let mut want = bytes(200, 2);
    want.extend(bytes(100, 1));
    assert_eq!(dst.to_vec(), want);

    // A receive spread over two buffers.
    let r1 = MemoryRegion::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let r2 = MemoryRegion::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    p.b.post_recv(&RecvRequest::new(&[
        r1.slice(..).unwrap(),
        r2.slice(..).unwrap(),
    ]))
    .unwrap();
    p.a.post_send(&SendRequest::send(&[b.slice(..100).unwrap()]))
        .unwrap();
    one(&p.cq_a);
    assert_eq!(one(&p.cq_b).byte_len, 100);
    assert_eq!(r1.to_vec()[..], bytes(200, 2)[..64]);
    assert_eq!(r2.to_vec()[..36], bytes(200, 2)[64..100]);
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn unsignaled_requests_with_periodic_signalling() {
    let p = pair_with(|b| b.max_send_wr(16));
    let src = MemoryRegion::with_data(&p.pd, &bytes(4096, 3), AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&p.pd, 4096, AccessFlags::REMOTE_WRITE).unwrap();
    let local = [src.slice(..64).unwrap()];
    let mut visible = 0;
    let mut buf = [Completion::default(); 16];
    // 1000 unsignalled writes through a 16-deep queue: gdr signals one in every 8 on its own and
    // consumes those completions, so the queue never fills and the application sees none.
    for i in 0..1000u64 {
        let off = (i % 64) * 64;
        loop {
            match p.a.post_send(
                &SendRequest::write(&local, dst.remote().slice(off..off + 64).unwrap())
                    .unsignaled(),
            ) {
                Ok(()) => break,
                Err(Error::QueueFull {
                    queue: WorkQueue::Send,
                    ..
                }) => {
                    visible += p.cq_a.poll(&mut buf).unwrap();
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    p.a.post_send(&SendRequest::write(&local, dst.remote().slice(..64).unwrap()).id(1000))
        .unwrap();
    let deadline = Instant::now() + T;
    let last = loop {
        let n = p.cq_a.poll(&mut buf).unwrap();
        if let Some(c) = buf[..n].iter().find(|c| c.wr_id == 1000) {
            break *c;
        }
        visible += n;
        assert!(
            Instant::now() < deadline,
            "no completion for the signalled write"
        );
    };
    assert!(last.is_ok());
    assert_eq!(
        visible, 0,
        "unsignalled requests produced visible completions"
    );
    assert_eq!(p.a.send_outstanding(), 0);
    assert!(dst.to_vec().chunks(64).all(|c| c == &bytes(4096, 3)[..64]));
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn post_lists_go_out_in_order_across_chunks_and_check_everything_first() {
    let p = pair_with(|b| b.max_send_wr(128));
    let src = MemoryRegion::with_data(&p.pd, &bytes(8192, 9), AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&p.pd, 8192, AccessFlags::REMOTE_WRITE).unwrap();
    // 100 writes of 64 bytes: even ones from one SGE, odd ones from four of 16 bytes, so the list
    // is cut into provider calls both by request count and by SGE count.
    let sgls: Vec<Vec<_>> = (0..100u64)
        .map(|i| {
            let off = (i * 64) as usize;
            if i % 2 == 0 {
                vec![src.slice(off..off + 64).unwrap()]
            } else {
                (0..4)
                    .map(|k| src.slice(off + 16 * k..off + 16 * (k + 1)).unwrap())
                    .collect()
            }
        })
        .collect();
    let reqs: Vec<SendRequest> = sgls
        .iter()
        .enumerate()
        .map(|(i, sgl)| {
            let off = i as u64 * 64;
            let r =
                SendRequest::write(sgl, dst.remote().slice(off..off + 64).unwrap()).id(i as u64);
            if i == 99 {
                r
            } else {
                r.unsignaled()
            }
        })
        .collect();
    p.a.post_send_list(&reqs).unwrap();
    let c = one(&p.cq_a);
    assert_eq!(c.wr_id, 99, "only the signalled request is visible");
    assert_eq!(p.a.send_outstanding(), 0);
    assert_eq!(dst.to_vec()[..6400], bytes(8192, 9)[..6400]);

    // A bad request anywhere in the list: nothing is posted.
    let spare = MemoryRegion::new(&p.pd, 4096, AccessFlags::REMOTE_WRITE).unwrap();
    let good = [src.slice(..64).unwrap()];
    let bad_list = [
        SendRequest::write(&good, spare.remote().slice(..64).unwrap()),
        SendRequest::write(&good, spare.remote().slice(64..96).unwrap()),
    ];
    let err = p.a.post_send_list(&bad_list).unwrap_err();
    assert!(
        err.to_string()
            .contains("64 bytes but the remote slice is 32"),
        "{err}"
    );
    assert_eq!(
        p.a.send_outstanding(),
        0,
        "the good first request was not posted"
    );

    // More requests than the send queue has room for: nothing is posted.
    let too_many: Vec<SendRequest> = (0..129)
        .map(|_| SendRequest::write(&good, spare.remote().slice(..64).unwrap()).unsignaled())
        .collect();
    let err = p.a.post_send_list(&too_many).unwrap_err();
    assert!(
        matches!(
            err,
            Error::QueueFull {
                queue: WorkQueue::Send,
                outstanding: 0,
                capacity: 128,
                requested: 129,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(p.a.send_outstanding(), 0);
    // The queue still works, and the refused lists wrote nothing.
    p.a.post_send(&SendRequest::write(&good, dst.remote().slice(..64).unwrap()).id(7))
        .unwrap();
    assert_eq!(one(&p.cq_a).wr_id, 7);
    assert!(spare.to_vec().iter().all(|&b| b == 0));
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn regions_of_in_flight_requests_stay_alive_until_reaped() {
    let p = pair();
    let src = MemoryRegion::with_data(&p.pd, &bytes(1 << 16, 4), AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&p.pd, 1 << 16, AccessFlags::REMOTE_WRITE).unwrap();
    let weak = Arc::downgrade(&src);
    p.a.post_send(&SendRequest::write(
        &[src.slice(..).unwrap()],
        dst.remote().slice(..).unwrap(),
    ))
    .unwrap();
    drop(src);
    assert!(
        weak.upgrade().is_some(),
        "the queue pair keeps the posted region alive"
    );
    one(&p.cq_a);
    assert!(
        weak.upgrade().is_none(),
        "reaping the completion releases it"
    );
    assert_eq!(dst.to_vec(), bytes(1 << 16, 4));
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn bad_ranges_are_errors_before_posting() {
    let p = pair_with(|b| b.max_send_sge(2).max_inline_data(16));
    let src = MemoryRegion::new(&p.pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&p.pd, 4096, AccessFlags::REMOTE_WRITE).unwrap();
    let e = src.slice(4000..4097).unwrap_err();
    assert_eq!(
        e.to_string(),
        "local slice: range offset=4000 len=97 lies outside [0, 4096)"
    );
    let e = dst.remote().slice(..4097).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { limit: 4096, .. }));
    let e =
        p.a.post_send(&SendRequest::write(
            &[src.slice(..100).unwrap()],
            dst.remote().slice(..50).unwrap(),
        ))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("local data is 100 bytes but the remote slice is 50 bytes"),
        "{e}"
    );
    let three = [
        src.slice(..1).unwrap(),
        src.slice(..1).unwrap(),
        src.slice(..1).unwrap(),
    ];
    let e =
        p.a.post_send(&SendRequest::write(
            &three,
            dst.remote().slice(..3).unwrap(),
        ))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("3 scatter/gather entries, the queue pair allows 2"),
        "{e}"
    );
    let e =
        p.a.post_send(&SendRequest::write_inline(
            &[0; 17],
            dst.remote().slice(..17).unwrap(),
        ))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("exceeds the queue pair's max_inline_data=16"),
        "{e}"
    );
    let ro = MemoryRegion::new(&p.pd, 64, AccessFlags::REMOTE_READ).unwrap();
    let e =
        p.a.post_send(&SendRequest::read(
            &[ro.slice(..).unwrap()],
            dst.remote().slice(..64).unwrap(),
        ))
        .unwrap_err();
    assert!(
        matches!(e, Error::MissingAccess { needed, .. } if needed == AccessFlags::LOCAL_WRITE),
        "{e}"
    );
    assert!(e.to_string().contains("without LOCAL_WRITE"), "{e}");
    let other_pd = ProtectionDomain::new(p.pd.context()).unwrap();
    let foreign = MemoryRegion::new(&other_pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let e =
        p.a.post_send(&SendRequest::write(
            &[foreign.slice(..).unwrap()],
            dst.remote().slice(..64).unwrap(),
        ))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::ForeignRegion {
                call: "post_send",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("another protection domain"), "{e}");
    assert_eq!(p.a.send_outstanding(), 0, "nothing was posted");
    let mut buf = [Completion::default(); 4];
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(p.cq_a.poll(&mut buf).unwrap(), 0, "the NIC saw nothing");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn wrong_rkey_gives_remote_access_error_and_qp_recovers() {
    let p = pair();
    let src = MemoryRegion::with_data(&p.pd, &bytes(256, 6), AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&p.pd, 256, AccessFlags::REMOTE_WRITE).unwrap();
    let good = dst.remote();
    let forged = RemoteRegion::new(good.addr, good.len, good.rkey ^ 0x5a5a_0000);
    p.a.post_send(&SendRequest::write(&[src.slice(..).unwrap()], forged.slice(..).unwrap()).id(1))
        .unwrap();
    let c = p.cq_a.wait_for(1, T).unwrap()[0];
    assert_eq!(c.status, WcStatus::RemoteAccess, "{c:?}");
    let e = c.result().unwrap_err().to_string();
    assert!(e.contains("rkey, address range or access flags"), "{e}");
    assert_eq!(p.a.state().unwrap(), QpState::Error);
    let e =
        p.a.post_send(&SendRequest::write(
            &[src.slice(..).unwrap()],
            good.slice(..).unwrap(),
        ))
        .map(|_| ());
    // Posting in the error state either fails at once or completes with a flush error.
    if e.is_ok() {
        assert_eq!(p.cq_a.wait_for(1, T).unwrap()[0].status, WcStatus::WrFlush);
    }

    // Recovery: both sides reset and reconnect with fresh endpoints.
    p.a.reset().unwrap();
    p.b.reset().unwrap();
    assert_eq!(p.a.state().unwrap(), QpState::Init);
    p.a.connect(&p.b.endpoint()).unwrap();
    p.b.connect(&p.a.endpoint()).unwrap();
    p.a.post_send(&SendRequest::write(&[src.slice(..).unwrap()], good.slice(..).unwrap()).id(2))
        .unwrap();
    let c = one(&p.cq_a);
    assert_eq!(c.wr_id, 2);
    assert_eq!(dst.to_vec(), bytes(256, 6));
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn receive_queue_exhaustion() {
    let p = pair_with(|b| b.max_recv_wr(4).rnr_retry(0).min_rnr_timer(1));
    let rx = MemoryRegion::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    for _ in 0..4 {
        p.b.post_recv(&RecvRequest::new(&[rx.slice(..).unwrap()]))
            .unwrap();
    }
    let e =
        p.b.post_recv(&RecvRequest::new(&[rx.slice(..).unwrap()]))
            .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QueueFull {
                queue: WorkQueue::Recv,
                outstanding: 4,
                capacity: 4,
                requested: 1,
                ..
            }
        ),
        "{e}"
    );
    // Five sends to four receives: the fifth finds no receive and, with rnr_retry 0, fails.
    for i in 0..5 {
        p.a.post_send(&SendRequest::send_inline(b"x").id(i))
            .unwrap();
    }
    let got = p.cq_a.wait_for(5, T).unwrap();
    assert!(got[..4].iter().all(|c| c.is_ok()), "{got:?}");
    assert_eq!(got[4].status, WcStatus::RnrRetryExceeded, "{got:?}");
    assert!(got[4]
        .result()
        .unwrap_err()
        .to_string()
        .contains("post receives before the sender starts"));
    assert_eq!(p.cq_b.wait_for(4, T).unwrap().len(), 4);
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn vanished_peer_gives_error_completion_within_timeout() {
    // timeout 10 = 4.2 ms per try, 2 retries.
    let p = pair_with(|b| b.timeout(10).retry_count(2));
    let src = MemoryRegion::with_data(&p.pd, &bytes(64, 1), AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&p.pd, 64, AccessFlags::REMOTE_WRITE).unwrap();
    let remote = dst.remote();
    drop(p.b); // the peer's queue pair is gone
    let t = Instant::now();
    p.a.post_send(&SendRequest::write(
        &[src.slice(..).unwrap()],
        remote.slice(..).unwrap(),
    ))
    .unwrap();
    let c = p
        .cq_a
        .wait_for(1, Duration::from_secs(30))
        .expect("an error completion, not a hang")[0];
    assert_eq!(c.status, WcStatus::RetryExceeded, "{c:?}");
    assert!(c
        .result()
        .unwrap_err()
        .to_string()
        .contains("is the peer process alive"));
    eprintln!("retry-exceeded after {:?}", t.elapsed());
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn completion_channel_wakes_a_sleeping_waiter() {
    let p = pair();
    let rx = MemoryRegion::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    p.b.post_recv(&RecvRequest::new(&[rx.slice(..).unwrap()]).id(5))
        .unwrap();
    let cq_b = p.cq_b.clone();
    let waiter = std::thread::spawn(move || cq_b.wait_for(1, T));
    std::thread::sleep(Duration::from_millis(100));
    p.a.post_send(&SendRequest::send_inline(b"wake").id(1))
        .unwrap();
    one(&p.cq_a);
    let got = waiter.join().unwrap().unwrap();
    assert_eq!((got[0].wr_id, got[0].byte_len), (5, 4));
    // And a wait with nothing to come times out with a typed error.
    let e = p.cq_b.wait_for(1, Duration::from_millis(200)).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn reset_state_rejects_posting_with_a_clear_error() {
    let ctx = Context::open(&device()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    let qp = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Init);
    let mr = MemoryRegion::new(&pd, 64, AccessFlags::REMOTE_WRITE).unwrap();
    let r = qp.post_send(&SendRequest::write(
        &[mr.slice(..).unwrap()],
        mr.remote().slice(..).unwrap(),
    ));
    // Refused before the provider is touched (rxe would queue it and run it after connect).
    match r {
        Err(Error::QpNotReady {
            queue: WorkQueue::Send,
            state: QpState::Init,
            ..
        }) => {}
        other => panic!("expected QpNotReady, got {other:?}"),
    }
    assert_eq!(qp.send_outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn unroutable_peer_gid_is_a_clear_connect_error() {
    let ctx = Context::open(&device()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    let qp = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
    let other = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
    // TEST-NET-1 (192.0.2.0/24): no interface of the test machine routes there.
    let mut peer = other.endpoint();
    peer.gid = gdr::device::Gid(
        std::net::Ipv4Addr::new(192, 0, 2, 1)
            .to_ipv6_mapped()
            .octets(),
    );
    let e = qp.connect(&peer).unwrap_err();
    let s = e.to_string();
    eprintln!("{s}");
    assert!(
        s.contains("ibv_modify_qp") && s.contains("Init -> Rtr"),
        "{s}"
    );
    assert!(
        s.contains("no route from GID[") && s.contains("::ffff:192.0.2.1"),
        "{s}"
    );
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn prepared_requests_post_many_times_and_keep_their_regions_alive() {
    let p = pair_with(|b| b.max_send_wr(16).max_inline_data(64));
    let src = MemoryRegion::with_data(&p.pd, &bytes(4096, 5), AccessFlags::LOCAL_WRITE).unwrap();
    let dst = MemoryRegion::new(&p.pd, 4096, AccessFlags::REMOTE_WRITE).unwrap();
    let local = [src.slice(..256).unwrap()];
    let mut buf = [Completion::default(); 16];

    // 100 posts of one prepared write through a 16-deep queue, one in ten signalled: those ten
    // are what the application sees, with the ids of their posts.
    let mut w =
        p.a.prepare(&SendRequest::write(
            &local,
            dst.remote().slice(..256).unwrap(),
        ))
        .unwrap();
    assert_eq!((w.operation(), w.data_len()), (Operation::Write, 256));
    assert!(w.inline_data_mut().is_none());
    let mut seen = Vec::new();
    for i in 0..100u64 {
        loop {
            match w.post(i, i % 10 == 9) {
                Ok(()) => break,
                Err(Error::QueueFull {
                    queue: WorkQueue::Send,
                    ..
                }) => {
                    let n = p.cq_a.poll(&mut buf).unwrap();
                    seen.extend(buf[..n].iter().map(|c| c.wr_id));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    let deadline = Instant::now() + T;
    while p.a.send_outstanding() > 0 {
        let n = p.cq_a.poll(&mut buf).unwrap();
        for c in &buf[..n] {
            c.result().unwrap();
            seen.push(c.wr_id);
        }
        assert!(Instant::now() < deadline, "prepared writes never completed");
    }
    assert_eq!(seen, (0..10).map(|k| k * 10 + 9).collect::<Vec<u64>>());
    assert_eq!(dst.to_vec()[..256], bytes(4096, 5)[..256]);
    let e = w.set_imm(1).unwrap_err();
    assert!(e.to_string().contains("carries no immediate"), "{e}");

    // A prepared inline write with immediate: new bytes and a new immediate per post.
    let note = MemoryRegion::new(&p.pd, 64, AccessFlags::REMOTE_WRITE).unwrap();
    let mut ping =
        p.a.prepare(
            &SendRequest::write_inline(&[0u8; 8], note.remote().slice(..8).unwrap()).with_imm(0),
        )
        .unwrap();
    for i in 1..=3u32 {
        p.b.post_recv(&RecvRequest::new(&[]).id(u64::from(i)))
            .unwrap();
        ping.inline_data_mut().unwrap()[7] = i as u8;
        ping.set_imm(100 + i).unwrap();
        ping.post(u64::from(i), true).unwrap();
        assert_eq!(one(&p.cq_a).wr_id, u64::from(i));
        let r = one(&p.cq_b);
        assert_eq!((r.wr_id, r.imm), (u64::from(i), Some(100 + i)));
        assert_eq!(note.to_vec()[7], i as u8);
    }

    // Dropped with a post in flight: the queue pair keeps the region until that post is reaped.
    let big = MemoryRegion::with_data(&p.pd, &bytes(1 << 16, 6), AccessFlags::LOCAL_WRITE).unwrap();
    let target = MemoryRegion::new(&p.pd, 1 << 16, AccessFlags::REMOTE_WRITE).unwrap();
    let weak = Arc::downgrade(&big);
    let mut copy =
        p.a.prepare(&SendRequest::write(
            &[big.slice(..).unwrap()],
            target.remote().slice(..).unwrap(),
        ))
        .unwrap();
    drop(big);
    copy.post(77, true).unwrap();
    drop(copy);
    assert!(
        weak.upgrade().is_some(),
        "the queue pair keeps the region of the dropped prepared request's post"
    );
    assert_eq!(one(&p.cq_a).wr_id, 77);
    assert!(weak.upgrade().is_none(), "reaping the post releases it");
    assert_eq!(target.to_vec(), bytes(1 << 16, 6));
    // Dropped after its posts were reaped: nothing is kept.
    let small = MemoryRegion::with_data(&p.pd, &bytes(64, 7), AccessFlags::LOCAL_WRITE).unwrap();
    let weak = Arc::downgrade(&small);
    let mut again =
        p.a.prepare(&SendRequest::write(
            &[small.slice(..).unwrap()],
            target.remote().slice(..64).unwrap(),
        ))
        .unwrap();
    drop(small);
    again.post(78, true).unwrap();
    assert_eq!(one(&p.cq_a).wr_id, 78);
    assert!(
        weak.upgrade().is_some(),
        "the prepared request holds its region"
    );
    drop(again);
    assert!(
        weak.upgrade().is_none(),
        "nothing in flight: released with the request"
    );

    // Checks happen once, at prepare: a bad request is refused there.
    let e =
        p.a.prepare(&SendRequest::write(
            &local,
            dst.remote().slice(..8).unwrap(),
        ))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("local data is 256 bytes but the remote slice is 8 bytes"),
        "{e}"
    );
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn waiting_for_one_particular_completion_keeps_the_others_in_order() {
    let p = pair();
    let dst = MemoryRegion::new(&p.pd, 64, AccessFlags::REMOTE_WRITE).unwrap();
    for id in 1..=3 {
        p.a.post_send(&SendRequest::write_inline(b"x", dst.remote().slice(0..1).unwrap()).id(id))
            .unwrap();
    }
    let c = p.cq_a.wait_for_id(3, T).unwrap();
    assert_eq!((c.wr_id, c.status), (3, WcStatus::Success));
    let rest: Vec<u64> = p
        .cq_a
        .wait_for(2, T)
        .unwrap()
        .iter()
        .map(|c| c.wr_id)
        .collect();
    assert_eq!(rest, [1, 2], "the completions before it are kept, in order");
    p.a.post_send(&SendRequest::write_inline(b"y", dst.remote().slice(0..1).unwrap()).id(4))
        .unwrap();
    match p.cq_a.wait_for_id(99, Duration::from_millis(300)) {
        Err(Error::Timeout { what, .. }) => assert!(what.contains("1 others arrived"), "{what}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(one(&p.cq_a).wr_id, 4, "kept through the timeout");
}
