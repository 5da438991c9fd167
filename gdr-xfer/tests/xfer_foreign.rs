//! Memory that code outside Rust owns (a C or Python caller), registered by address: the
//! `release` closure runs only once the segment is deregistered, its handles are gone and no
//! request uses it any more, and the bytes transferred meanwhile are the ones expected.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gdr_test_support::xfer::{agent, connected};
use gdr_xfer::gdr::mr::ForeignHostMemory;
use gdr_xfer::{Desc, Location, TransferOptions};

const WAIT: Duration = Duration::from_secs(10);

#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn foreign_host_memory_is_released_only_after_the_nic_is_done() {
    let (a, b, pb, _pa) = connected(agent("foreign-a"), agent("foreign-b"));
    // The "foreign" allocation: leaked from Rust so that only the release closure frees it,
    // as a C caller's free() would.
    let len = 1 << 20;
    let raw: &'static mut [u8] = Box::leak(vec![0u8; len].into_boxed_slice());
    let (ptr, released) = (raw.as_mut_ptr(), Arc::new(AtomicBool::new(false)));
    let addr = ptr as usize;
    let r = released.clone();
    let release = move || {
        // SAFETY: rebuilt from the leaked box's pointer and length, once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(addr as *mut u8, len)) });
        r.store(true, Ordering::SeqCst);
    };
    // SAFETY: the leaked buffer stays allocated and untouched by anything else until the
    // closure frees it.
    let memory = unsafe { ForeignHostMemory::new(ptr, len, release) }.unwrap();
    let dst = b
        .register_host(memory, "foreign-dst", Location::Cpu { numa: None })
        .unwrap();
    let remote = pb.wait_segment_named("foreign-dst", WAIT).unwrap();
    let src = a.alloc_host(len, "src").unwrap();
    let pattern: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    src.write(0, &pattern).unwrap();
    pb.write(
        &[Desc::new(&src, 0, remote.id, 0, len as u64)],
        &TransferOptions::new(),
    )
    .unwrap()
    .wait(WAIT)
    .unwrap();
    assert_eq!(
        dst.to_vec(0, len).unwrap(),
        pattern,
        "the bytes landed in the foreign memory"
    );
    assert!(
        !released.load(Ordering::SeqCst),
        "released while registered"
    );
    b.deregister(&dst).unwrap();
    assert!(
        !released.load(Ordering::SeqCst),
        "released while a handle still holds it"
    );
    drop(dst);
    // The engine may hold the registration a little longer (its last requests' retirement).
    let end = std::time::Instant::now() + WAIT;
    while !released.load(Ordering::SeqCst) && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        released.load(Ordering::SeqCst),
        "release ran after deregistration"
    );
    println!("foreign host memory: 1 MiB written into it, released after deregister and drop");
}

/// A registration refused before the NIC saw the memory (a name over the bound) drops it at
/// once: release has run when the error comes back, and nothing else was registered.
#[test]
#[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
fn a_refused_registration_releases_foreign_memory_at_once() {
    let a = agent("foreign-refused");
    let mut bytes = vec![0u8; 4096];
    let released = Arc::new(AtomicBool::new(false));
    let r = released.clone();
    // SAFETY: `bytes` outlives the value and nothing else touches it meanwhile.
    let memory = unsafe {
        ForeignHostMemory::new(bytes.as_mut_ptr(), bytes.len(), move || {
            r.store(true, Ordering::SeqCst)
        })
    }
    .unwrap();
    let e = a
        .register_host(memory, &"n".repeat(65), Location::Cpu { numa: None })
        .unwrap_err();
    assert!(
        matches!(e, gdr_xfer::Error::TooLarge { len: 65, .. }),
        "{e}"
    );
    assert!(released.load(Ordering::SeqCst), "released with the error");
    assert!(a.segments().is_empty());
    drop(bytes);
}
