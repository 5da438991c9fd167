//! Hardware tier: GPUDirect RDMA end to end, on a host with both a CUDA GPU and an RDMA NIC.
//! Neither the Soft-RoCE VM (no GPU; rxe cannot register GPU memory) nor the GPU test machine
//! (no NIC) can run it, so `cargo xtask test` skips `hw_*` targets. Run it on real hardware:
//!
//! ```sh
//! GDR_TEST_DEVICE=mlx5_0 GDR_TEST_GPU=0 cargo test -p gdr --test hw_gpudirect -- --ignored --test-threads=1
//! ```
//!
//! Every operation of the verbs layer with GPU memory as the local and as the remote region,
//! between two queue pairs of one process; the data is checked by copying it back with CUDA.

use std::sync::Arc;
use std::time::Duration;

use gdr::cq::{CompletionQueue, WcOpcode};
use gdr::cuda::DeviceBuffer;
use gdr::device::Context;
use gdr::gpu_mr::{GpuMemoryRegion, RegistrationPath};
use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::wr::{RecvRequest, SendRequest};

const T: Duration = Duration::from_secs(10);
const NEEDS: &str = "needs a CUDA GPU and an RDMA NIC in one host (GDR_TEST_DEVICE, GDR_TEST_GPU)";

struct Rig {
    pd: Arc<ProtectionDomain>,
    a: QueuePair,
    b: QueuePair,
    cq: Arc<CompletionQueue>,
    ordinal: i32,
}

fn rig() -> Rig {
    let dev = std::env::var("GDR_TEST_DEVICE")
        .unwrap_or_else(|_| panic!("GDR_TEST_DEVICE is not set: this test {NEEDS}"));
    let ordinal = std::env::var("GDR_TEST_GPU")
        .map(|s| s.parse().expect("GDR_TEST_GPU is a CUDA ordinal"))
        .unwrap_or(0);
    let ctx = Context::open(&dev).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 256).unwrap();
    let a = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
    let b = QueuePair::builder(&pd, &cq, &cq).build().unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    Rig {
        pd,
        a,
        b,
        cq,
        ordinal,
    }
}

fn gpu(r: &Rig, data: &[u8], access: AccessFlags) -> Arc<GpuMemoryRegion> {
    let buf = Arc::new(DeviceBuffer::alloc(r.ordinal, data.len()).unwrap());
    buf.copy_from_host(0, data).unwrap();
    let mr = GpuMemoryRegion::register(&r.pd, buf, .., access, RegistrationPath::Auto).unwrap();
    eprintln!("GPU region registered through {:?}", mr.path());
    mr
}

fn contents(mr: &GpuMemoryRegion) -> Vec<u8> {
    mr.flush_rdma_writes().unwrap();
    mr.buffer().unwrap().to_vec().unwrap()
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

fn done(cq: &CompletionQueue, n: usize) -> Vec<gdr::cq::Completion> {
    let got = cq.wait_for(n, T).unwrap();
    for c in &got {
        c.result().unwrap();
    }
    got
}

#[test]
#[ignore = "needs a CUDA GPU and an RDMA NIC in one host (GDR_TEST_DEVICE, GDR_TEST_GPU)"]
fn hw_write_and_read_between_gpu_and_host() {
    let r = rig();
    let n = 1 << 20;
    let src = gpu(
        &r,
        &bytes(n, 1),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
    );
    let dst = gpu(&r, &vec![0; n], AccessFlags::REMOTE_WRITE);
    // GPU -> GPU write.
    r.a.post_send(&SendRequest::write(
        &[src.slice(..).unwrap()],
        dst.remote().slice(..).unwrap(),
    ))
    .unwrap();
    done(&r.cq, 1);
    assert_eq!(contents(&dst), bytes(n, 1));
    // Host <- GPU read.
    let host = MemoryRegion::new(&r.pd, n, AccessFlags::LOCAL_WRITE).unwrap();
    r.b.post_send(&SendRequest::read(
        &[host.slice(..).unwrap()],
        src.remote().slice(..).unwrap(),
    ))
    .unwrap();
    assert_eq!(done(&r.cq, 1)[0].opcode, WcOpcode::RdmaRead);
    assert_eq!(host.to_vec(), bytes(n, 1));
}

#[test]
#[ignore = "needs a CUDA GPU and an RDMA NIC in one host (GDR_TEST_DEVICE, GDR_TEST_GPU)"]
fn hw_send_into_gpu_memory_with_immediate() {
    let r = rig();
    let rx = gpu(&r, &vec![0; 8192], AccessFlags::LOCAL_WRITE);
    r.b.post_recv(&RecvRequest::new(&[rx.slice(..).unwrap()]).id(7))
        .unwrap();
    let tx = MemoryRegion::with_data(&r.pd, &bytes(5000, 3), AccessFlags::LOCAL_WRITE).unwrap();
    r.a.post_send(&SendRequest::send(&[tx.slice(..).unwrap()]).with_imm(99))
        .unwrap();
    let got = done(&r.cq, 2);
    let recv = got.iter().find(|c| c.is_recv).unwrap();
    assert_eq!((recv.wr_id, recv.byte_len, recv.imm), (7, 5000, Some(99)));
    assert_eq!(contents(&rx)[..5000], bytes(5000, 3)[..]);
}

#[test]
#[ignore = "needs a CUDA GPU and an RDMA NIC in one host (GDR_TEST_DEVICE, GDR_TEST_GPU)"]
fn hw_atomics_on_gpu_memory_and_inline_refused() {
    let r = rig();
    let word = gpu(&r, &40u64.to_ne_bytes(), AccessFlags::REMOTE_ATOMIC);
    let old = MemoryRegion::new(&r.pd, 8, AccessFlags::LOCAL_WRITE).unwrap();
    r.a.post_send(&SendRequest::fetch_add(
        &old.slice(..).unwrap(),
        word.remote().slice(..).unwrap(),
        2,
    ))
    .unwrap();
    done(&r.cq, 1);
    assert_eq!(u64::from_ne_bytes(old.to_vec().try_into().unwrap()), 40);
    assert_eq!(u64::from_ne_bytes(contents(&word).try_into().unwrap()), 42);
    let e =
        r.a.post_send(&SendRequest::send(&[word.slice(..).unwrap()]).inline())
            .unwrap_err();
    assert!(e.to_string().contains("from GPU memory"), "{e}");
}
