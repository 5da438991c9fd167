//! Hardware tier: GPU segments through the engine, on a host with both a CUDA GPU and an RDMA
//! NIC. Neither the Soft-RoCE VM (no GPU) nor the GPU test machine (no NIC) can run it, so
//! `cargo xtask test` skips `hw_*` targets. Run it on real hardware:
//!
//! ```sh
//! GDR_TEST_DEVICE=mlx5_0 GDR_TEST_GPU=0 cargo test -p gdr-xfer --test hw_xfer_gpu -- --ignored --test-threads=1
//! ```
//!
//! Two agents of one process: a GPU segment registered directly (GPUDirect, or staged where gdr
//! finds no direct path), and one always staged through host bounce buffers (real
//! `cuMemcpyAsync` copies); WRITE and READ between them and a host segment, checked byte for
//! byte by copying the GPU memory back with CUDA. The same for GPU memory the application owns
//! (`register_gpu_memory` with `ForeignDeviceMemory`, as gdr-py registers a CUDA tensor), with
//! its release closure run only after the segment and its transfers are gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gdr_test_support::pattern;

use gdr::cuda::{DeviceBuffer, ForeignDeviceMemory};
use gdr_xfer::{Agent, AgentConfig, Desc, GpuStaging, SegmentPath, TransferOptions};

const WAIT: Duration = Duration::from_secs(60);

fn config(name: &str, staging: GpuStaging) -> AgentConfig {
    AgentConfig::new(name)
        .device(gdr_test_support::device())
        .gpu_staging(staging)
}

fn ordinal() -> i32 {
    std::env::var("GDR_TEST_GPU")
        .map(|s| s.parse().expect("GDR_TEST_GPU is a CUDA ordinal"))
        .unwrap_or(0)
}

/// A GPU segment of agent `a` written to host memory of `b` and read back into a second GPU
/// buffer, both checked.
fn round_trip(staging: GpuStaging, expect_staged: bool) {
    let a = Agent::new(config(&format!("hw-a-{staging:?}"), staging)).unwrap();
    let b = Agent::new(config(&format!("hw-b-{staging:?}"), GpuStaging::Never)).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let peer = a.connect(&addr.to_string()).unwrap();
    let len = 64 << 20;
    let data = pattern(len, 77);
    let src = Arc::new(DeviceBuffer::alloc(ordinal(), len).unwrap());
    src.copy_from_host(0, &data).unwrap();
    let back = Arc::new(DeviceBuffer::alloc(ordinal(), len).unwrap());
    let seg = a.register_gpu(&src, .., "src").unwrap();
    let back_seg = a.register_gpu(&back, .., "back").unwrap();
    println!("{staging:?}: path {:?}", seg.path());
    assert_eq!(
        matches!(seg.path(), SegmentPath::Staged(_)),
        expect_staged,
        "{:?}",
        seg.path()
    );
    let dst = b.alloc_host(len, "dst").unwrap();
    let remote = peer.wait_segment_named("dst", WAIT).unwrap();
    let w = peer
        .write(
            &[Desc::new(&seg, 0, remote.id, 0, len as u64)],
            &TransferOptions::new().notify("w"),
        )
        .unwrap()
        .wait(WAIT)
        .unwrap();
    assert_eq!(dst.to_vec(0, len).unwrap(), data, "{staging:?} WRITE");
    let r = peer
        .read(
            &[Desc::new(&back_seg, 0, remote.id, 0, len as u64)],
            &TransferOptions::new(),
        )
        .unwrap()
        .wait(WAIT)
        .unwrap();
    assert_eq!(back_seg.to_vec(0, len).unwrap(), data, "{staging:?} READ");
    let gbs = |s: &gdr_xfer::TransferStats| len as f64 / s.time_to_complete.as_secs_f64() / 1e9;
    println!(
        "{staging:?}: 64 MiB WRITE {:.2} GB/s, READ {:.2} GB/s",
        gbs(&w),
        gbs(&r)
    );
}

#[test]
#[ignore = "needs a CUDA GPU and an RDMA NIC in one host (GDR_TEST_DEVICE, GDR_TEST_GPU)"]
fn hw_gpu_segments_direct_or_fallback() {
    // Staged only if this host has no GPUDirect path; either way the bytes must land.
    let a = Agent::new(config("hw-probe", GpuStaging::Never)).unwrap();
    let buf = Arc::new(DeviceBuffer::alloc(ordinal(), 1 << 20).unwrap());
    let direct = a.register_gpu(&buf, .., "probe").is_ok();
    drop(a);
    round_trip(GpuStaging::Fallback, !direct);
}

#[test]
#[ignore = "needs a CUDA GPU and an RDMA NIC in one host (GDR_TEST_DEVICE, GDR_TEST_GPU)"]
fn hw_gpu_segments_always_staged() {
    round_trip(GpuStaging::Always, true);
}

/// GPU memory the application owns (as a Python tensor's through DLPack), registered with
/// `register_gpu_memory` through [`ForeignDeviceMemory`]: directly or staged (`staging`), a
/// WRITE to host memory and a READ back into it, checked byte for byte; its release closure
/// runs only once the segment is deregistered and its transfers are done.
fn foreign_round_trip(staging: GpuStaging) {
    let a = Agent::new(config(&format!("hw-fa-{staging:?}"), staging)).unwrap();
    let b = Agent::new(config(&format!("hw-fb-{staging:?}"), GpuStaging::Never)).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let peer = a.connect(&addr.to_string()).unwrap();
    let len = 16 << 20;
    let data = pattern(len, 78);
    let owner = Arc::new(DeviceBuffer::alloc(ordinal(), len).unwrap());
    owner.copy_from_host(0, &data).unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let (keep, flag) = (owner.clone(), released.clone());
    // SAFETY: `keep` holds the allocation until the release closure drops it.
    let memory = unsafe {
        ForeignDeviceMemory::new(owner.device_ptr(), len, move || {
            drop(keep);
            flag.store(true, Ordering::SeqCst);
        })
    };
    let seg = a
        .register_gpu_memory(Arc::new(memory), .., "foreign")
        .unwrap();
    println!("foreign {staging:?}: path {:?}", seg.path());
    if staging == GpuStaging::Always {
        assert!(
            matches!(seg.path(), SegmentPath::Staged(_)),
            "{:?}",
            seg.path()
        );
    }
    let dst = b.alloc_host(len, "dst").unwrap();
    let remote = peer.wait_segment_named("dst", WAIT).unwrap();
    let desc = [Desc::new(&seg, 0, remote.id, 0, len as u64)];
    peer.write(&desc, &TransferOptions::new())
        .unwrap()
        .wait(WAIT)
        .unwrap();
    assert_eq!(
        dst.to_vec(0, len).unwrap(),
        data,
        "foreign {staging:?} WRITE"
    );
    owner.copy_from_host(0, &vec![0u8; len]).unwrap();
    peer.read(&desc, &TransferOptions::new())
        .unwrap()
        .wait(WAIT)
        .unwrap();
    let mut back = vec![0u8; len];
    owner.copy_to_host(0, &mut back).unwrap();
    assert_eq!(back, data, "foreign {staging:?} READ");
    assert!(
        !released.load(Ordering::SeqCst),
        "released while registered"
    );
    a.deregister(&seg).unwrap();
    drop(seg);
    let end = std::time::Instant::now() + WAIT;
    while !released.load(Ordering::SeqCst) && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(released.load(Ordering::SeqCst), "never released");
}

#[test]
#[ignore = "needs a CUDA GPU and an RDMA NIC in one host (GDR_TEST_DEVICE, GDR_TEST_GPU)"]
fn hw_foreign_gpu_memory_direct_or_fallback() {
    foreign_round_trip(GpuStaging::Fallback);
}

#[test]
#[ignore = "needs a CUDA GPU and an RDMA NIC in one host (GDR_TEST_DEVICE, GDR_TEST_GPU)"]
fn hw_foreign_gpu_memory_always_staged() {
    foreign_round_trip(GpuStaging::Always);
}
