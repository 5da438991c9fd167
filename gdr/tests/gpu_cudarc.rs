//! GPU tier (feature `cudarc`): memory cudarc allocated, seen through gdr's `DeviceMemory`:
//! gdr checks it as it would check its own before a registration, and exports it as a dma-buf
//! when CUDA says GPUDirect RDMA may use it. (The GPU machine has no RDMA device, so the
//! registration itself runs where there is one: `GpuMemoryRegion::register_owned` takes the same
//! owner.)
//!
//! Every test needs a CUDA GPU and is ignored elsewhere; without one each fails loudly.

use std::sync::Arc;

use cudarc::driver::CudaContext;
use gdr::cuda::DeviceMemory;
use gdr::gpu_mr;
use gdr::Error;

const LEN: usize = 4 << 20;

#[test]
#[ignore = "needs a CUDA GPU"]
fn cudarc_memory_is_checked_and_exported_as_gdr_checks_its_own() {
    let ctx = CudaContext::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"));
    let stream = ctx.default_stream();
    println!(
        "cudarc: stream-ordered allocation {}",
        ctx.has_async_alloc()
    );
    let slice = Arc::new(stream.alloc_zeros::<u8>(LEN).unwrap());
    // The owner's view agrees with cudarc's.
    assert_eq!(DeviceMemory::len(&*slice), LEN);
    let ptr = DeviceMemory::device_ptr(&*slice);
    assert_ne!(ptr, 0);
    match gpu_mr::check_gpu_range(ptr, LEN) {
        Ok(range) => {
            println!(
                "cudarc memory {ptr:#x}+{LEN}: device memory of GPU {:?}, GPUDirect capable {:?}",
                range.pointer.ordinal, range.pointer.gpu_direct_rdma_capable
            );
            assert_eq!(range.pointer.ordinal, Some(0));
            // What the dma-buf path of a registration does first.
            let export = gpu_mr::export_dma_buf(&*slice, ..).expect("a dma-buf of cudarc memory");
            println!(
                "dma-buf exported: {} bytes from {:#x}, offset {}",
                export.aligned_len, export.aligned_start, export.offset
            );
            assert!(export.aligned_len >= LEN as u64);
        }
        // cudarc allocates from the stream-ordered pool where the GPU has one; CUDA may report
        // that pool's memory unfit for GPUDirect RDMA (it does on the H200 with CUDA 13.0):
        // refused before any registration, typed, with the hint.
        Err(e @ Error::Unsupported { .. }) => {
            println!("cudarc pool memory refused as gdr's own would be: {e}");
            assert!(ctx.has_async_alloc(), "{e}");
            assert!(e.to_string().contains("IS_GPU_DIRECT_RDMA_CAPABLE"), "{e}");
        }
        Err(e) => panic!("cudarc memory: {e}"),
    }
    // cuMemAlloc memory (not from the pool) held by a CudaSlice: GPUDirect may use it.
    // SAFETY: a fresh cuMemAlloc allocation of LEN bytes, given to one CudaSlice; it is taken
    // back with `leak` and freed with cuMemFree below, never freed by the slice.
    let plain = unsafe {
        let ptr = cudarc::driver::result::malloc_sync(LEN).unwrap();
        stream.upgrade_device_ptr::<u8>(ptr, LEN)
    };
    let plain = Arc::new(plain);
    let range = gpu_mr::check_gpu_range(DeviceMemory::device_ptr(&*plain), LEN)
        .expect("cuMemAlloc memory in a CudaSlice is checked like a DeviceBuffer");
    assert_eq!(range.pointer.ordinal, Some(0));
    let export = gpu_mr::export_dma_buf(&*plain, ..).expect("a dma-buf of cudarc memory");
    println!(
        "cuMemAlloc memory in a CudaSlice: accepted (GPU {:?}, GPUDirect capable {:?}); dma-buf of {} bytes, offset {}",
        range.pointer.ordinal, range.pointer.gpu_direct_rdma_capable, export.aligned_len, export.offset
    );
    drop(export);
    let plain = Arc::into_inner(plain).unwrap();
    stream.synchronize().unwrap();
    let ptr = plain.leak();
    // SAFETY: the pointer came from cuMemAlloc above and nothing uses it any more.
    unsafe { cudarc::driver::result::free_sync(ptr) }.unwrap();
    // A slice of another size: the owner's length follows the element type.
    let words = stream.alloc_zeros::<u32>(1000).unwrap();
    assert_eq!(DeviceMemory::len(&words), 4000);
}

/// Memory a C or Python caller allocated (here: cuMemAlloc through cudarc's raw calls), handed
/// over by address as `ForeignDeviceMemory`: checked and exported as gdr's own, and its release
/// closure (which frees it, as the caller's would) runs once the last reference is gone.
#[test]
#[ignore = "needs a CUDA GPU"]
fn foreign_memory_by_address_is_checked_and_released_after_its_last_user() {
    use std::sync::atomic::{AtomicBool, Ordering};

    use gdr::cuda::ForeignDeviceMemory;

    let ctx = CudaContext::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"));
    ctx.bind_to_thread().unwrap();
    // SAFETY: a plain cuMemAlloc of LEN bytes with the context bound; freed in `release`.
    let ptr = unsafe { cudarc::driver::result::malloc_sync(LEN) }.unwrap();
    let freed = Arc::new(AtomicBool::new(false));
    let f = freed.clone();
    let owner = ctx.clone();
    let release = move || {
        owner.bind_to_thread().unwrap();
        // SAFETY: the pointer came from cuMemAlloc above; gdr is done with it.
        unsafe { cudarc::driver::result::free_sync(ptr) }.unwrap();
        f.store(true, Ordering::SeqCst);
    };
    // SAFETY: ptr..ptr+LEN stays allocated until `release` frees it.
    let memory = Arc::new(unsafe { ForeignDeviceMemory::new(ptr, LEN, release) });
    let range = gpu_mr::check_gpu_range(memory.device_ptr(), LEN)
        .expect("foreign cuMemAlloc memory is checked like a DeviceBuffer");
    assert_eq!(range.pointer.ordinal, Some(0));
    let export = gpu_mr::export_dma_buf(&*memory, ..).expect("a dma-buf of foreign memory");
    let user = memory.clone();
    drop(memory);
    assert!(
        !freed.load(Ordering::SeqCst),
        "freed while still referenced"
    );
    drop(export);
    drop(user);
    assert!(
        freed.load(Ordering::SeqCst),
        "released after the last reference"
    );
    println!(
        "foreign memory {ptr:#x}+{LEN}: checked (GPU {:?}, GPUDirect capable {:?}), exported, released after its last user",
        range.pointer.ordinal, range.pointer.gpu_direct_rdma_capable
    );
}
