//! `QueuePair::post_rdma_batch` on the test device: many pieces of one region in one call land
//! where named, the region stays alive until the batch's last completion and is released after,
//! and every bad piece is refused before anything is posted.

use std::sync::Arc;
use std::time::Duration;

use gdr::mr::{AccessFlags, MemoryRegion, RemoteSlice};
use gdr::qp::{BatchOp, RdmaPiece};
use gdr::Error;

use gdr_test_support::verbs;

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_batch_lands_piece_by_piece_and_holds_its_region_until_the_last_completion() {
    let p = verbs::pair_of(true, |b| b.max_send_wr(256));
    let n = 200usize;
    let piece = 512usize;
    let src = MemoryRegion::new(&p.pd, n * piece, AccessFlags::LOCAL_WRITE).unwrap();
    let data: Vec<u8> = (0..n * piece).map(|i| (i * 7 + i / 512) as u8).collect();
    src.write(0, &data).unwrap();
    let dst = MemoryRegion::new(&p.pd, n * piece, AccessFlags::remote_rw()).unwrap();
    let r = dst.remote();
    // Piece i goes to position n-1-i.
    let pieces: Vec<RdmaPiece> = (0..n)
        .map(|i| RdmaPiece {
            offset: i * piece,
            remote: RemoteSlice::new(r.addr + ((n - 1 - i) * piece) as u64, piece as u64, r.rkey)
                .unwrap(),
            wr_id: 1000 + i as u64,
        })
        .collect();
    let weak = Arc::downgrade(&src);
    let local = src.slice(..).unwrap();
    drop(src);
    p.a.post_rdma_batch(BatchOp::Write, &local, &pieces)
        .unwrap();
    drop(local);
    let held = weak.upgrade().is_some();
    // Only the last piece is signalled: one completion, carrying its id.
    let done = p.cq_a.wait_for(1, Duration::from_secs(30)).unwrap();
    assert_eq!(done[0].wr_id, 1000 + n as u64 - 1);
    done[0].result().unwrap();
    assert!(held, "the region must be held while the batch is in flight");
    assert!(
        weak.upgrade().is_none(),
        "the region must be released with the last completion"
    );
    let got = dst.to_vec();
    for i in 0..n {
        let at = (n - 1 - i) * piece;
        assert_eq!(
            &got[at..at + piece],
            &data[i * piece..(i + 1) * piece],
            "piece {i}"
        );
    }
    assert_eq!(p.a.send_outstanding(), 0);
    println!("{n} pieces in one call: every byte where named; region held until the last completion, then released");
}

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn bad_pieces_are_refused_before_anything_is_posted() {
    let p = verbs::pair_of(true, |b| b.max_send_wr(16));
    let src = MemoryRegion::new(&p.pd, 4096, AccessFlags::empty()).unwrap();
    let dst = MemoryRegion::new(&p.pd, 4096, AccessFlags::remote_rw()).unwrap();
    let r = dst.remote();
    let remote = |off: u64, len: u64| RemoteSlice::new(r.addr + off, len, r.rkey).unwrap();
    let local = src.slice(..).unwrap();
    let ok = RdmaPiece {
        offset: 0,
        remote: remote(0, 64),
        wr_id: 1,
    };
    let bad = [
        RdmaPiece {
            offset: 4090,
            remote: remote(0, 64),
            wr_id: 2,
        },
        RdmaPiece {
            offset: usize::MAX - 10,
            remote: remote(0, 64),
            wr_id: 3,
        },
        RdmaPiece {
            offset: 0,
            remote: remote(0, 0),
            wr_id: 4,
        },
    ];
    for b in bad {
        let e =
            p.a.post_rdma_batch(BatchOp::Write, &local, &[ok, b])
                .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    }
    // A READ needs LOCAL_WRITE on the local side.
    let e =
        p.a.post_rdma_batch(BatchOp::Read, &local, &[ok])
            .unwrap_err();
    assert!(
        matches!(e, Error::MissingAccess { call: "post_rdma_batch", needed, .. } if needed == AccessFlags::LOCAL_WRITE),
        "{e}"
    );
    // More pieces than the send queue holds.
    let many = vec![ok; 17];
    let e =
        p.a.post_rdma_batch(BatchOp::Write, &local, &many)
            .unwrap_err();
    assert!(matches!(e, Error::QueueFull { .. }), "{e}");
    // Another protection domain's region.
    let other = verbs::pd();
    let foreign = MemoryRegion::new(&other, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let e =
        p.a.post_rdma_batch(BatchOp::Write, &foreign.slice(..).unwrap(), &[ok])
            .unwrap_err();
    assert!(
        matches!(
            e,
            Error::ForeignRegion {
                call: "post_rdma_batch",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(p.a.send_outstanding(), 0, "nothing was posted");
    // Before connect: refused.
    let q = verbs::pair_of(false, |b| b);
    let s = MemoryRegion::new(&q.pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let e =
        q.a.post_rdma_batch(BatchOp::Write, &s.slice(..).unwrap(), &[ok])
            .unwrap_err();
    assert!(matches!(e, Error::QpNotReady { .. }), "{e}");
    // And a good batch still works.
    p.a.post_rdma_batch(BatchOp::Write, &local, &[ok]).unwrap();
    p.cq_a.wait_for(1, Duration::from_secs(10)).unwrap()[0]
        .result()
        .unwrap();
}

/// The request list a queue pair keeps between batches leaks nothing from one batch into the
/// next: a 40-piece WRITE (two lists, the periodic and the caller's signal set), then a 3-piece
/// READ on the same queue pair. A stale link after the READ's last entry would post the WRITE's
/// requests again (overwriting the target after the caller changed it), a stale flag would add
/// a completion, a stale opcode would write instead of read.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_short_batch_after_a_long_one_posts_exactly_its_own_requests() {
    let p = verbs::pair_of(true, |b| b.max_send_wr(64));
    let piece = 256usize;
    let n = 40usize;
    let src = MemoryRegion::new(&p.pd, n * piece, AccessFlags::LOCAL_WRITE).unwrap();
    src.write(0, &vec![0xAA; n * piece]).unwrap();
    let dst = MemoryRegion::new(&p.pd, n * piece, AccessFlags::remote_rw()).unwrap();
    let r = dst.remote();
    let at = |i: usize, len: usize| {
        RemoteSlice::new(r.addr + (i * piece) as u64, len as u64, r.rkey).unwrap()
    };
    let pieces: Vec<RdmaPiece> = (0..n)
        .map(|i| RdmaPiece {
            offset: i * piece,
            remote: at(i, piece),
            wr_id: i as u64,
        })
        .collect();
    let local = src.slice(..).unwrap();
    p.a.post_rdma_batch(BatchOp::Write, &local, &pieces)
        .unwrap();
    let done = p.cq_a.wait_for(1, Duration::from_secs(30)).unwrap();
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].wr_id, n as u64 - 1);
    done[0].result().unwrap();
    assert_eq!(p.a.send_outstanding(), 0);
    // The target changes; then three READs of its first blocks into the source.
    dst.write(0, &vec![0x55; n * piece]).unwrap();
    let back: Vec<RdmaPiece> = (0..3)
        .map(|i| RdmaPiece {
            offset: i * piece,
            remote: at(i, piece),
            wr_id: 100 + i as u64,
        })
        .collect();
    p.a.post_rdma_batch(BatchOp::Read, &local, &back).unwrap();
    let done = p.cq_a.wait_for(1, Duration::from_secs(30)).unwrap();
    assert_eq!(done.len(), 1, "one signalled completion: {done:?}");
    assert_eq!(done[0].wr_id, 102);
    done[0].result().unwrap();
    let more = p.cq_a.wait_for(1, Duration::from_millis(300));
    assert!(
        matches!(more, Err(Error::Timeout { .. })),
        "no completion beyond the READ's own: {more:?}"
    );
    assert_eq!(p.a.send_outstanding(), 0);
    let got = src.to_vec();
    assert!(
        got[..3 * piece].iter().all(|&b| b == 0x55),
        "the READs read"
    );
    assert!(
        got[3 * piece..].iter().all(|&b| b == 0xAA),
        "nothing else moved"
    );
    assert!(
        dst.to_vec().iter().all(|&b| b == 0x55),
        "no WRITE of the first batch was posted again"
    );
    println!("40-piece WRITE then 3-piece READ on one queue pair: exactly the READ's requests ran");
}
