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
//! byte by copying the GPU memory back with CUDA.

use std::sync::Arc;
use std::time::Duration;

use gdr_test_support::pattern;

use gdr::cuda::DeviceBuffer;
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
