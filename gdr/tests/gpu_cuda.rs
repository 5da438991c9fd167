//! GPU tier for `gdr::cuda` and the pre-registration checks of `gdr::gpu_mr`.
//!
//! Every test needs a CUDA GPU and is ignored elsewhere; run with
//! `--ignored --test-threads=1 --nocapture` on the GPU machine (`cargo xtask gpu-bundle`; README,
//! "The GPU machine"). Without a GPU each test fails loudly at `gpu()`.

use std::sync::Arc;

use gdr::cuda::{
    self, ContextGuard, DeviceBuffer, GpuInfo, ManagedBuffer, PinnedHostBuffer, PointerType,
};
use gdr::gpu_mr::{self, NicDmaBuf, PathInputs, RegistrationPath};
use gdr::Error;

const MIB: usize = 1 << 20;

/// GPU 0, or a panic that says why there is none.
fn gpu() -> GpuInfo {
    let devices = cuda::devices().unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"));
    assert!(
        !devices.is_empty(),
        "this test needs a CUDA GPU: none visible"
    );
    devices[0].clone()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_inventory_reports_gpudirect_attributes() {
    let g = gpu();
    let v = cuda::driver_version().unwrap();
    println!("driver {} ({v})", cuda::version_text(v));
    println!("{g:#?}");
    assert!(v >= cuda::MIN_DRIVER_VERSION);
    assert!(!g.name.is_empty());
    let parts: Vec<&str> = g.pci_bus_id.split(':').collect();
    assert_eq!(parts.len(), 3, "{}", g.pci_bus_id);
    assert_eq!(parts[0].len(), 4, "{}", g.pci_bus_id);
    assert_eq!(g.pci_bus_id, g.pci_bus_id.to_lowercase());
    assert!(g.total_memory > 0);
    assert!(g.compute_capability_major >= 3);
    assert!(g.unified_addressing);
    assert_eq!(
        cuda::device_count().unwrap() as usize,
        cuda::devices().unwrap().len()
    );
    let e = cuda::device_info(999).unwrap_err();
    println!("missing ordinal: {e}");
    assert!(matches!(e, Error::InvalidArgument { .. }));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_context_guard_restores_the_previous_context() {
    gpu();
    std::thread::spawn(|| {
        assert!(
            ContextGuard::current().unwrap().is_null(),
            "a new thread has no context"
        );
        {
            let g = ContextGuard::primary(0).unwrap();
            assert_eq!(ContextGuard::current().unwrap(), g.as_raw());
            assert!(g.previous().is_null());
            assert_eq!(g.ordinal(), Some(0));
            {
                let inner = ContextGuard::primary(0).unwrap();
                assert_eq!(inner.previous(), g.as_raw());
            }
            assert_eq!(ContextGuard::current().unwrap(), g.as_raw());
        }
        assert!(
            ContextGuard::current().unwrap().is_null(),
            "restored to none"
        );
    })
    .join()
    .unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_classify_cumemalloc_and_subranges() {
    gpu();
    let buf = DeviceBuffer::alloc(0, 2 * MIB).unwrap();
    let p = buf.device_ptr();
    let info = cuda::classify(p).unwrap();
    println!("cuMemAlloc: {info:?}");
    assert_eq!(info.kind, PointerType::Device);
    assert_eq!(info.ordinal, Some(0));
    assert_ne!(info.context, 0, "cuMemAlloc memory belongs to a context");
    assert_eq!(info.allocation_base, Some(p));
    assert!(info.allocation_len.unwrap() >= 2 * MIB as u64);
    assert_eq!(
        info.gpu_direct_rdma_capable,
        Some(true),
        "cuMemAlloc memory is GPUDirect capable"
    );
    cuda::set_sync_memops(&buf).unwrap();
    assert_eq!(
        cuda::classify(p).unwrap().sync_memops,
        Some(true),
        "SYNC_MEMOPS set"
    );
    // SAFETY: `buf` (and so its context) lives until the end of this test.
    let own = unsafe { cuda::ContextGuard::from_raw(info.context as _) }.unwrap();
    assert_eq!(cuda::ContextGuard::current().unwrap(), own.as_raw());
    drop(own);
    // A heap allocation on purpose (not an array on the stack): CUDA must call it pageable host memory.
    #[allow(clippy::useless_vec)]
    let heap = vec![0u8; 64];
    // SAFETY: `heap` lives until the end of this test.
    let r = unsafe { cuda::set_sync_memops_at(heap.as_ptr() as u64) };
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");

    let inner = cuda::classify(p + 4096 + 17).unwrap();
    assert_eq!(inner.kind, PointerType::Device);
    assert_eq!(inner.allocation_base, Some(p));
    assert_eq!(inner.offset_in_allocation(), Some(4096 + 17));

    // Pre-registration range checks: whole, sub-range, and out of range.
    let alloc_len = info.allocation_len.unwrap() as usize;
    let whole = gpu_mr::check_gpu_range(p, alloc_len).unwrap();
    assert_eq!(whole.gpu.ordinal, 0);
    gpu_mr::check_gpu_range(p + 4096, 4096).unwrap();
    let e = gpu_mr::check_gpu_range(p + alloc_len as u64 - 10, 20).unwrap_err();
    println!("out of range: {e}");
    match e {
        Error::OutOfBounds {
            offset, len, limit, ..
        } => {
            assert_eq!(offset, alloc_len as u64 - 10);
            assert_eq!(len, 20);
            assert_eq!(limit, alloc_len as u64);
        }
        other => panic!("expected OutOfBounds, got {other:?}"),
    }
    assert!(matches!(
        gpu_mr::check_gpu_range(p, alloc_len + 1),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        gpu_mr::check_gpu_range(p, 0),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_classify_pinned_host_memory() {
    gpu();
    let mut host = PinnedHostBuffer::alloc(0, 64 * 1024).unwrap();
    host.as_mut_slice()[..4].copy_from_slice(b"gdr!");
    assert_eq!(&host.as_slice()[..4], b"gdr!");
    let info = cuda::classify(host.as_ptr() as u64).unwrap();
    println!("cuMemAllocHost: {info:?}");
    assert_eq!(info.kind, PointerType::HostPinned);
    assert_eq!(info.ordinal, Some(0));
    let e = gpu_mr::check_gpu_range(host.as_ptr() as u64, 4096).unwrap_err();
    println!("pinned host memory as GPU memory: {e}");
    assert!(matches!(
        e,
        Error::NotGpuMemory {
            kind: PointerType::HostPinned,
            ..
        }
    ));
    assert_eq!(e.hint(), Some(gpu_mr::HINT_HOST_MEMORY));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_classify_managed_memory_and_refuse_it() {
    gpu();
    let m = ManagedBuffer::alloc(0, 2 * MIB).unwrap();
    let info = cuda::classify(m.device_ptr()).unwrap();
    println!("cuMemAllocManaged: {info:?}");
    assert_eq!(info.kind, PointerType::Managed);
    let e = gpu_mr::check_gpu_range(m.device_ptr(), 4096).unwrap_err();
    println!("managed memory: {e}");
    assert!(matches!(e, Error::Unsupported { .. }));
    assert_eq!(e.hint(), Some(gpu_mr::HINT_MANAGED));
    assert!(gpu_mr::export_dma_buf(&m, ..4096).is_err());
    // Managed memory takes SYNC_MEMOPS through its owner too.
    cuda::set_sync_memops(&m).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_classify_pool_allocation_uses_the_primary_context() {
    let g = gpu();
    assert!(g.memory_pools_supported, "the GPU machine supports pools");
    std::thread::spawn(|| {
        let buf = DeviceBuffer::alloc_from_pool(0, 4 * MIB).unwrap();
        assert!(buf.is_pool_allocation());
        assert!(ContextGuard::current().unwrap().is_null());
        let info = cuda::classify(buf.device_ptr()).unwrap();
        println!("cuMemAllocAsync: {info:?}");
        assert_eq!(info.kind, PointerType::Device);
        assert_eq!(info.ordinal, Some(0));
        assert!(info.allocation_base.is_some());
        assert!(
            ContextGuard::current().unwrap().is_null(),
            "context restored"
        );
        // The default pool's memory is not GPUDirect RDMA capable on the test machine: the
        // pre-registration check must refuse it before any verbs call; if a driver reports it
        // capable, the check must pass.
        match info.gpu_direct_rdma_capable {
            Some(false) => {
                let e = gpu_mr::check_gpu_range(buf.device_ptr(), 4 * MIB).unwrap_err();
                println!("pool memory: {e}");
                assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
                assert_eq!(e.hint(), Some(gpu_mr::HINT_NOT_GPUDIRECT_CAPABLE));
            }
            _ => {
                let range = gpu_mr::check_gpu_range(buf.device_ptr(), 4 * MIB).unwrap();
                assert_eq!(range.len, 4 * MIB);
            }
        }
        assert!(
            ContextGuard::current().unwrap().is_null(),
            "context restored"
        );
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        buf.copy_from_host(8192, &pattern).unwrap();
        let mut back = vec![0u8; 4096];
        buf.copy_to_host(8192, &mut back).unwrap();
        assert_eq!(back, pattern);
    })
    .join()
    .unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_classify_heap_and_made_up_addresses() {
    gpu();
    let heap = vec![7u8; 1 << 16];
    let info = cuda::classify(heap.as_ptr() as u64).unwrap();
    println!("heap Vec: {info:?}");
    assert_eq!(info.kind, PointerType::PageableHost);
    assert_eq!(info.ordinal, None);
    let e = gpu_mr::check_gpu_range(heap.as_ptr() as u64, heap.len()).unwrap_err();
    println!("host pointer as GPU memory: {e}");
    assert!(matches!(
        e,
        Error::NotGpuMemory {
            kind: PointerType::PageableHost,
            ..
        }
    ));
    assert_eq!(e.hint(), Some(gpu_mr::HINT_HOST_MEMORY));

    for addr in [0x10u64, 0x0000_7eee_dead_0000] {
        let info = cuda::classify(addr).unwrap();
        println!("made-up {addr:#x}: {info:?}");
        assert_eq!(info.kind, PointerType::Unknown);
        let e = gpu_mr::check_gpu_range(addr, 64).unwrap_err();
        println!("made-up address as GPU memory: {e}");
        assert!(matches!(e, Error::InvalidArgument { .. }));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_own_context_is_used_with_none_current() {
    gpu();
    let buf = Arc::new(DeviceBuffer::alloc(0, 2 * MIB).unwrap());
    let b = buf.clone();
    std::thread::spawn(move || {
        assert!(ContextGuard::current().unwrap().is_null());
        // Range query and dma-buf export need a context; the pointer's own one is used.
        let info = cuda::classify(b.device_ptr() + 100).unwrap();
        assert_eq!(info.allocation_base, Some(b.device_ptr()));
        let export = gpu_mr::export_dma_buf(&b, ..64 * 1024).unwrap();
        assert!(std::os::fd::AsRawFd::as_raw_fd(&export.fd) >= 0);
        assert!(
            ContextGuard::current().unwrap().is_null(),
            "no context left current"
        );
    })
    .join()
    .unwrap();
}

fn fd_target(fd: &std::os::fd::OwnedFd) -> String {
    let n = std::os::fd::AsRawFd::as_raw_fd(fd);
    std::fs::read_link(format!("/proc/self/fd/{n}"))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|e| format!("<{e}>"))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_dma_buf_export_aligned_and_unaligned() {
    let g = gpu();
    assert!(g.dma_buf_supported, "the GPU machine supports dma-buf");
    let buf = DeviceBuffer::alloc(0, 2 * MIB).unwrap();
    let p = buf.device_ptr();
    let page = 4096u64;
    assert_eq!(p % page, 0, "cuMemAlloc returns page-aligned memory");

    let a = gpu_mr::export_dma_buf(&buf, ..64 * 1024).unwrap();
    println!("aligned export: {a:?} -> {}", fd_target(&a.fd));
    assert_eq!(a.aligned_start, p);
    assert_eq!(a.aligned_len, 64 * 1024);
    assert_eq!(a.offset, 0);
    assert!(fd_target(&a.fd).contains("dmabuf"), "{}", fd_target(&a.fd));

    let u = gpu_mr::export_dma_buf(&buf, 100..1100).unwrap();
    println!("unaligned export: {u:?} -> {}", fd_target(&u.fd));
    assert_eq!(u.aligned_start, p);
    assert_eq!(u.aligned_len, page);
    assert_eq!(u.offset, 100);
    assert!(fd_target(&u.fd).contains("dmabuf"));

    // A range crossing a page boundary spans two pages.
    let c = gpu_mr::export_dma_buf(&buf, (page - 8) as usize..(page + 8) as usize).unwrap();
    assert_eq!(
        (c.aligned_start, c.aligned_len, c.offset),
        (p, 2 * page, page - 8)
    );
    assert_ne!(
        std::os::fd::AsRawFd::as_raw_fd(&a.fd),
        std::os::fd::AsRawFd::as_raw_fd(&u.fd)
    );
    // The whole buffer, and ranges outside it (checked against the owner, before the driver).
    let whole = gpu_mr::export_dma_buf(&buf, ..).unwrap();
    assert_eq!((whole.aligned_len, whole.offset), (2 * MIB as u64, 0));
    for bad in [
        gpu_mr::export_dma_buf(&buf, 2 * MIB - 1..2 * MIB + 1),
        gpu_mr::export_dma_buf(&buf, usize::MAX - 1..usize::MAX),
    ] {
        assert!(matches!(bad, Err(Error::OutOfBounds { .. })), "{bad:?}");
    }
    // The raw form with a caller-kept allocation works the same.
    // SAFETY: `buf` lives until the end of this test.
    let raw = unsafe { gpu_mr::export_dma_buf_at(p + 100, 1000) }.unwrap();
    assert_eq!((raw.aligned_start, raw.offset), (p, 100));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_copies_round_trip_and_are_bounds_checked() {
    gpu();
    let buf = DeviceBuffer::alloc(0, MIB).unwrap();
    let data: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    buf.copy_from_host(0, &data).unwrap();
    assert_eq!(buf.to_vec().unwrap(), data);
    let e = buf.copy_from_host(MIB - 1, &[1, 2]).unwrap_err();
    println!("copy out of bounds: {e}");
    assert!(matches!(e, Error::OutOfBounds { .. }));
    let mut small = [0u8; 2];
    assert!(matches!(
        buf.copy_to_host(MIB - 1, &mut small),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        DeviceBuffer::alloc(0, 0),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        DeviceBuffer::alloc(99, 4096),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_registration_without_rdma_device() {
    let g = gpu();
    let buf = Arc::new(DeviceBuffer::alloc(0, 2 * MIB).unwrap());
    // The checks before any verbs call pass for real device memory.
    let range = gpu_mr::check_gpu_range(buf.device_ptr(), 2 * MIB).unwrap();
    assert_eq!(range.gpu, g);
    let system = gpu_mr::system_facts();
    println!("host facts of this machine: {system:?}");
    let peer = gpu_mr::peer_memory();
    println!("peer memory on this machine: {peer:?}");
    assert_eq!(*peer, system.peer_memory());
    println!(
        "flush for RDMA writes: {:?}",
        gpu_mr::flush_method(&g, true)
    );

    let names = gdr::device::DeviceList::new()
        .expect("libibverbs must load on the GPU machine")
        .names();
    println!("RDMA devices: {names:?}");
    if names.is_empty() {
        // What a user sees when registering GPU memory on a host without an RDMA NIC: opening
        // the device fails before anything is registered.
        let e = gdr::device::Context::open("mlx5_0").unwrap_err();
        println!("no RDMA device: {e}");
        assert!(matches!(e, Error::DeviceNotFound { .. }), "{e:?}");
        assert!(e.hint().is_some());
        // The decision this machine would take with a NIC lacking dma-buf import.
        let inputs = PathInputs {
            driver_version: cuda::driver_version().unwrap(),
            driver_exports_dma_buf: true,
            gpu: g.clone(),
            system: system.clone(),
            nic: "mlx5_0".into(),
            nic_dma_buf: NicDmaBuf::NoProviderSupport,
        };
        match gpu_mr::choose_path(&inputs, RegistrationPath::Auto) {
            Ok(p) => {
                assert!(peer.present());
                assert_eq!(p, RegistrationPath::PeerMemory);
            }
            Err(e) => {
                println!("this GPU with a NIC without dma-buf: {e}");
                assert!(!peer.present());
                assert!(matches!(e, Error::Unsupported { .. }));
            }
        }
        let with_nic = PathInputs {
            nic_dma_buf: NicDmaBuf::Supported,
            ..inputs
        };
        assert_eq!(
            gpu_mr::choose_path(&with_nic, RegistrationPath::Auto).unwrap(),
            RegistrationPath::DmaBuf,
            "this GPU exports dma-bufs, so a dma-buf NIC would get that path"
        );
    } else {
        // A real NIC: register for real and check what the region reports.
        let ctx = gdr::device::Context::open(&names[0]).unwrap();
        let pd = gdr::pd::ProtectionDomain::new(&ctx).unwrap();
        match gpu_mr::GpuMemoryRegion::register(
            &pd,
            buf.clone(),
            4096..8192,
            gdr::mr::AccessFlags::remote_rw(),
            RegistrationPath::Auto,
        ) {
            Ok(mr) => {
                use gdr::mr::Registered;
                println!("registered: {mr:?}");
                assert_eq!(mr.iova(), buf.device_ptr() + 4096);
                assert_eq!(mr.len(), 4096);
                assert_ne!(mr.path(), RegistrationPath::Auto);
            }
            Err(e) => {
                println!("registration on {} failed with: {e}", names[0]);
                assert!(
                    e.hint().is_some(),
                    "a failed GPU registration carries a hint: {e:?}"
                );
            }
        }
    }
}

/// Finding 6: guards for two contexts dropped in either order leave a correct context current
/// (the newer guard's while it lives, then the one from before the first), never one that an
/// older guard already released.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_context_guards_dropped_out_of_order() {
    use gdr_sys::cuda as sys;
    gpu();
    std::thread::spawn(|| {
        // A second context on the same GPU stands in for a second GPU's.
        let mut dev: sys::CUdevice = 0;
        let mut other: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the driver is initialised (gpu() listed the devices); valid out-pointers.
        // cuCtxCreate makes the new context current; it is unset right away.
        unsafe {
            assert_eq!(sys::cuDeviceGet(&mut dev, 0), sys::CUresult::CUDA_SUCCESS);
            assert_eq!(
                sys::cuCtxCreate_v2(&mut other, 0, dev),
                sys::CUresult::CUDA_SUCCESS
            );
            assert_eq!(
                sys::cuCtxSetCurrent(std::ptr::null_mut()),
                sys::CUresult::CUDA_SUCCESS
            );
        }
        let now = || ContextGuard::current().unwrap();
        assert!(now().is_null());

        // A (primary) then B; A dropped first.
        let a = ContextGuard::primary(0).unwrap();
        let a_ctx = a.as_raw();
        // SAFETY: `other` is destroyed only at the end of this closure, after every guard.
        let b = unsafe { ContextGuard::from_raw(other) }.unwrap();
        assert_eq!(now(), other);
        drop(a);
        assert_eq!(now(), other, "B's guard lives: B stays current");
        drop(b);
        assert!(
            now().is_null(),
            "back to none, not to A's released primary context {a_ctx:p}"
        );

        // B then A; B dropped first.
        // SAFETY: as above.
        let b = unsafe { ContextGuard::from_raw(other) }.unwrap();
        let a = ContextGuard::primary(0).unwrap();
        drop(b);
        assert_eq!(now(), a.as_raw(), "A's guard lives: A stays current");
        drop(a);
        assert!(now().is_null(), "back to none, not to B");

        // Three guards, the middle one first, then in order.
        let outer = ContextGuard::primary(0).unwrap();
        // SAFETY: as above.
        let middle = unsafe { ContextGuard::from_raw(other) }.unwrap();
        let inner = ContextGuard::primary(0).unwrap();
        drop(middle);
        assert_eq!(now(), inner.as_raw());
        drop(inner);
        assert_eq!(now(), outer.as_raw(), "the older live guard's context");
        drop(outer);
        assert!(now().is_null());

        // Nested in order still restores each previous context.
        {
            // SAFETY: as above.
            let b = unsafe { ContextGuard::from_raw(other) }.unwrap();
            {
                let a = ContextGuard::primary(0).unwrap();
                assert_eq!(a.previous(), other);
            }
            assert_eq!(now(), b.as_raw());
        }
        assert!(now().is_null());
        // SAFETY: no guard refers to `other` any more.
        assert_eq!(
            unsafe { sys::cuCtxDestroy_v2(other) },
            sys::CUresult::CUDA_SUCCESS
        );
    })
    .join()
    .unwrap();
}

/// Finding 6: `classify` and `check_gpu_range` are safe on an address another thread frees and
/// reallocates meanwhile (no context reported for it is ever made current), and range checks
/// cannot overflow.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_classify_races_with_free_and_never_overflows() {
    gpu();
    // Keeps the primary context retained, so the churn below does not recreate it each time.
    let buf = DeviceBuffer::alloc(0, 2 * MIB).unwrap();
    let first = DeviceBuffer::alloc(0, MIB).unwrap();
    let address = first.device_ptr();
    drop(first);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 2000 {
                // Often lands on the same address again.
                let b = DeviceBuffer::alloc(0, MIB).unwrap();
                drop(b);
                n += 1;
            }
            n
        })
    };
    let (mut device, mut unknown, mut raced) = (0u32, 0u32, 0u32);
    for _ in 0..2000 {
        // Freed between two driver queries, the answer is a typed driver error; never a crash.
        match cuda::classify(address) {
            Ok(info) => match info.kind {
                PointerType::Device => device += 1,
                // A freed device address may lie in CUDA's reserved virtual range, which
                // /proc/self/maps lists: then it reads as pageable host memory.
                PointerType::Unknown | PointerType::PageableHost => unknown += 1,
                other => panic!("a device address classified as {other}"),
            },
            Err(Error::Cuda { .. }) => raced += 1,
            Err(e) => panic!("unexpected: {e:?}"),
        }
        match gpu_mr::check_gpu_range(address, 4096) {
            Ok(r) => assert_eq!(r.address, address),
            // Freed: unknown, or (in CUDA's reserved range, as above) pageable host memory.
            Err(
                Error::InvalidArgument { .. }
                | Error::NotGpuMemory {
                    kind: PointerType::PageableHost,
                    ..
                }
                | Error::Cuda { .. },
            ) => {}
            Err(e) => panic!("unexpected: {e:?}"),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let allocations = churn.join().unwrap();
    println!(
        "classify during {allocations} alloc/free cycles: {device} device, {unknown} not device, \
         {raced} freed between two queries"
    );
    assert_eq!(device + unknown + raced, 2000);

    let p = buf.device_ptr();
    for (addr, len) in [
        (p, usize::MAX),
        (p + 4096, usize::MAX - 4095),
        (p + 10, 2 * MIB),
    ] {
        let e = gpu_mr::check_gpu_range(addr, len).unwrap_err();
        assert!(
            matches!(e, Error::OutOfBounds { .. }),
            "{addr:#x}+{len}: {e:?}"
        );
    }
    let info = cuda::classify(p + 100).unwrap();
    assert_eq!(info.bytes_to_end(), info.allocation_len.map(|l| l - 100));
}
