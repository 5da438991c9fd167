//! Host memory regions on a real RDMA device: concurrent CPU access through `&MemoryRegion`,
//! `Vec`-backed registration, and hostile slice arithmetic.
//!
//! Run in the Soft-RoCE VM by `cargo xtask test --vm-only memory_`; on real hardware:
//! `GDR_TEST_DEVICE=mlx5_0 cargo test -p gdr --test verbs_memory -- --ignored --test-threads=1`.
//! A missing device is a failure, not a skip.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gdr::cq::CompletionQueue;
use gdr::device::Context;
use gdr::mr::{AccessFlags, MemoryKind, MemoryRegion, RegionExt, Registered};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::wr::SendRequest;
use gdr::Error;

use gdr_test_support::device;
use gdr_test_support::verbs::pd;

const T: Duration = Duration::from_secs(10);

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn memory_concurrent_cpu_words_are_never_torn() {
    const LEN: usize = 16 << 10;
    const ROUNDS: usize = 2_000;
    let pd = pd();
    let mr = MemoryRegion::new(&pd, LEN, AccessFlags::remote_rw()).unwrap();
    let done = AtomicBool::new(false);
    let (reads, torn, distinct) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..2u8)
            .map(|t| {
                let mr = &mr;
                s.spawn(move || {
                    let mut buf = vec![0u8; LEN];
                    for i in 0..ROUNDS {
                        // Word k holds one byte value repeated, different per word, round and
                        // writer, so a torn word has two values.
                        for (k, w) in buf.chunks_exact_mut(8).enumerate() {
                            w.fill((i * 2 + usize::from(t) + k) as u8);
                        }
                        // The last word is the flag; the data are the words before it.
                        if i % 2 == 0 {
                            mr.write(0, &buf[..LEN - 8]).unwrap();
                        } else {
                            // Starting and ending mid-word: bytes 3..8 of the first word and
                            // the first 5 bytes of the last data word are merged into their
                            // words (compare-and-swap), the words between stored whole.
                            mr.write(3, &buf[3..LEN - 11]).unwrap();
                        }
                        mr.fill(LEN - 8, 8, (i * 2 + usize::from(t)) as u8).unwrap();
                    }
                })
            })
            .collect();
        for _ in 0..2 {
            let (mr, done, reads, torn, distinct) = (&mr, &done, &reads, &torn, &distinct);
            s.spawn(move || {
                let mut buf = vec![0u8; LEN];
                let flag = mr.watch_u64(LEN - 8).unwrap();
                let mut last = None;
                while !done.load(Ordering::Relaxed) {
                    mr.read(0, &mut buf).unwrap();
                    reads.fetch_add(1, Ordering::Relaxed);
                    // Every data word is written whole by every round, except that odd
                    // rounds write only bytes 3..8 of the first and 0..5 of the last: each of
                    // those pieces is always written together, so it is uniform too.
                    let data = &buf[..LEN - 8];
                    let pieces = data[8..LEN - 16]
                        .chunks_exact(8)
                        .chain([&data[3..8], &data[LEN - 16..LEN - 11]]);
                    for w in pieces {
                        if w.iter().any(|&b| b != w[0]) {
                            torn.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    let f = flag.load().to_ne_bytes();
                    if f.iter().any(|&b| b != f[0]) {
                        torn.fetch_add(1, Ordering::Relaxed);
                    }
                    if last != Some(buf[64]) {
                        distinct.fetch_add(1, Ordering::Relaxed);
                        last = Some(buf[64]);
                    }
                }
            });
        }
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    let (reads, torn, distinct) = (reads.into_inner(), torn.into_inner(), distinct.into_inner());
    println!("{reads} reads of {LEN} bytes, {distinct} changes seen, {torn} torn words");
    assert!(reads > 0, "the readers ran");
    assert!(distinct > 2, "the readers saw the writers' progress");
    assert_eq!(torn, 0, "torn words in {reads} reads");
}

/// Finding 4 (aliasing part): a `Vec<u8>` region registers the Vec's own buffer, through the
/// pointer taken once from `&mut`, and the NIC reads and writes exactly those bytes.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn memory_vec_regions_are_the_vecs_bytes_for_the_nic() {
    let ctx = Context::open(&device()).expect("open the test device");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    let src_vec = data.clone();
    let src_addr = src_vec.as_ptr() as u64;
    let src = MemoryRegion::register(&pd, Box::new(src_vec), AccessFlags::LOCAL_WRITE).unwrap();
    let dst_vec = vec![0u8; 5000];
    let dst_addr = dst_vec.as_ptr() as u64;
    let dst = MemoryRegion::register(&pd, Box::new(dst_vec), AccessFlags::REMOTE_WRITE).unwrap();
    assert_eq!((src.iova(), dst.iova()), (src_addr, dst_addr));
    assert_eq!((src.len(), src.kind()), (5000, MemoryKind::Host));
    assert_eq!(src.to_vec(), data);

    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    let a = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
    let b = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    src.write(1, b"written by the CPU").unwrap();
    let mut want = data.clone();
    want[1..19].copy_from_slice(b"written by the CPU");
    a.post_send(
        &SendRequest::write(&[src.slice(..).unwrap()], dst.remote().slice(..).unwrap()).id(1),
    )
    .unwrap();
    let c = cq.wait_for(1, T).unwrap()[0];
    c.result().unwrap();
    assert_eq!(dst.to_vec(), want, "the NIC wrote the Vec's bytes");
    assert_eq!(dst.try_to_vec().unwrap(), want);
    assert_eq!(
        dst.load_u64(0).unwrap(),
        u64::from_ne_bytes(want[..8].try_into().unwrap())
    );
}

/// One memory, two registrations (`register_again`, one per rail in gdr-xfer): the NIC writes
/// through the second one's key land in the bytes the first one reads, and the memory lives
/// until both are gone.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn memory_registered_again_in_another_pd_shares_the_bytes() {
    let ctx = Context::open(&device()).expect("open the test device");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let other_pd = ProtectionDomain::new(&ctx).unwrap();
    let first = MemoryRegion::new(&pd, 8192, AccessFlags::remote_rw()).unwrap();
    let again = first
        .register_again(&other_pd, AccessFlags::remote_rw())
        .unwrap();
    assert_eq!((again.iova(), again.len()), (first.iova(), first.len()));
    assert_ne!(again.rkey(), first.rkey());
    let src = MemoryRegion::with_data(
        &other_pd,
        b"through the second key",
        AccessFlags::LOCAL_WRITE,
    )
    .unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    let a = QueuePair::builder(&other_pd, &cq, &cq).build().unwrap();
    let b = QueuePair::builder(&other_pd, &cq, &cq).build().unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    a.post_send(
        &SendRequest::write(
            &[src.slice(..).unwrap()],
            again.remote().slice(100..122).unwrap(),
        )
        .id(7),
    )
    .unwrap();
    cq.wait_for(1, T).unwrap()[0].result().unwrap();
    let mut got = vec![0u8; 22];
    first.read(100, &mut got).unwrap();
    assert_eq!(
        &got, b"through the second key",
        "the first region sees the NIC's write"
    );
    // The second registration keeps the memory: dropping the first leaves it readable.
    let weak = Arc::downgrade(&first);
    drop(first);
    assert!(weak.upgrade().is_some(), "held by the second registration");
    assert_eq!(&again.to_vec()[100..122], b"through the second key");
    drop(again);
    assert!(
        weak.upgrade().is_none(),
        "released with the last registration"
    );
}

/// A `Registered` implementation that reports an impossible address (its `iova + len` runs
/// past 2^64). It is never posted; it exists to show slicing refuses it instead of wrapping.
struct ImpossibleRegion {
    pd: Arc<ProtectionDomain>,
}

// SAFETY: deliberately false about the address range, to test the bounds arithmetic only: the
// test never posts a work request with it, so the NIC is never given the bogus range.
unsafe impl Registered for ImpossibleRegion {
    fn lkey(&self) -> u32 {
        1
    }
    fn rkey(&self) -> u32 {
        1
    }
    fn iova(&self) -> u64 {
        u64::MAX - 100
    }
    fn len(&self) -> usize {
        4096
    }
    fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn access(&self) -> AccessFlags {
        AccessFlags::LOCAL_WRITE
    }
}

/// Finding 5 (mr part): slice arithmetic on values a region or a peer supplies is checked:
/// an error, never a panic (debug) or a wrap (release).
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn memory_slices_of_impossible_regions_are_errors() {
    let r = Arc::new(ImpossibleRegion { pd: pd() });
    let ok = r.slice(..50).unwrap();
    assert_eq!(ok.addr(), u64::MAX - 100);
    let e = r.slice(50..200).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(ok.sub(..10).is_ok());
    assert!(r.slice(101..).is_err());
    let remote = r.remote();
    assert!(remote.slice(8..16).is_err(), "{remote:?}");
    assert!(remote.validate().is_err());

    let mr = MemoryRegion::new(&r.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut buf = [0u8; 16];
    assert!(matches!(
        mr.read(usize::MAX - 7, &mut buf),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(mr.write(usize::MAX, &buf).is_err());
    assert!(mr.fill(8, usize::MAX, 0).is_err());
    assert!(mr.watch_u64(usize::MAX - 3).is_err());
    assert!(matches!(
        mr.watch_u64(4),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(mr.watch_u64(56).is_ok() && mr.watch_u64(57).is_err());
}
