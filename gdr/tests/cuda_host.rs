//! Host tier for `gdr::cuda` and `gdr::gpu_mr`: runs on any machine.
//!
//! * Without libcuda (this project's build machine and the Soft-RoCE VM) every CUDA entry point
//!   must return `Error::CudaUnavailable`, never panic.
//! * A fake libcuda built here (a few exported stubs) shows the "symbol missing" and "driver too
//!   old" errors in a child process.
//! * The registration-path decision and the error hints are pure functions, tested on recorded
//!   inputs (the GPU test machine's H200 as gdr-test-support/fixtures/h200-vm-probe.txt recorded it,
//!   and variations of it).
//! * One device test (ignored here, run in the VM with `GDR_TEST_DEVICE=rxe0`) probes the NIC's
//!   dma-buf support and tries a GPU registration without libcuda.

use std::path::{Path, PathBuf};
use std::process::Command;

use gdr::cuda::{self, DeviceBuffer, ManagedBuffer, PinnedHostBuffer};
use gdr::gpu_mr::{
    self, choose_path, flush_method, registration_error, FlushMethod, NicDmaBuf, PathInputs,
    PeerMemory, RegistrationPath, SystemFacts,
};
use gdr::Error;

use gdr_test_support::h200::h200;

/// The host facts of the H200 machine (gdr-test-support/fixtures/h200-vm-probe.txt), with
/// `peer_module` loaded as well when given.
fn h200_system(peer_module: Option<&str>) -> SystemFacts {
    let mut modules = vec!["nvidia".to_string(), "nvidia_uvm".to_string()];
    modules.extend(peer_module.map(str::to_string));
    SystemFacts {
        modules,
        memory_peers: vec![],
        nvidia_version: Some(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  \
             (nixbld@)"
                .into(),
        ),
        kernel_release: Some("6.18.44-fc-v657-gpu".into()),
    }
}

/// The H200 machine with a NIC whose dma-buf probe gave `nic`, and the peer-memory module given.
fn inputs(nic: NicDmaBuf, peer_module: Option<&str>) -> PathInputs {
    PathInputs {
        driver_version: 13000,
        driver_exports_dma_buf: true,
        gpu: h200(),
        system: h200_system(peer_module),
        nic: "mlx5_0".into(),
        nic_dma_buf: nic,
    }
}

fn unsupported(e: Error) -> (String, String) {
    let text = e.to_string();
    match e {
        Error::Unsupported { what, hint } => (what, hint.text().unwrap_or_default().to_string()),
        other => panic!("expected Error::Unsupported, got {other:?} ({text})"),
    }
}

fn assert_unavailable<T: std::fmt::Debug>(what: &str, r: gdr::Result<T>, reason: &str) {
    match r {
        Err(Error::CudaUnavailable { reason: r, hint }) => {
            assert!(
                r.contains(reason),
                "{what}: reason {r:?} does not contain {reason:?}"
            );
            assert!(hint.text().is_some(), "{what}: no hint");
        }
        other => panic!("{what}: expected CudaUnavailable ({reason}), got {other:?}"),
    }
}

/// Every entry point that needs the driver, with the reason it must report when it is missing.
fn check_every_entry_point_unavailable(reason: &str) {
    let heap = vec![0u8; 4096];
    let addr = heap.as_ptr() as u64;
    assert_unavailable("driver_version", cuda::driver_version(), reason);
    assert_unavailable("device_count", cuda::device_count(), reason);
    assert_unavailable("devices", cuda::devices(), reason);
    assert_unavailable("device_info", cuda::device_info(0), reason);
    assert_unavailable(
        "ContextGuard::primary",
        cuda::ContextGuard::primary(0),
        reason,
    );
    assert_unavailable(
        "ContextGuard::current",
        cuda::ContextGuard::current(),
        reason,
    );
    assert_unavailable("DeviceBuffer::alloc", DeviceBuffer::alloc(0, 4096), reason);
    assert_unavailable(
        "DeviceBuffer::alloc_from_pool",
        DeviceBuffer::alloc_from_pool(0, 4096),
        reason,
    );
    assert_unavailable(
        "PinnedHostBuffer::alloc",
        PinnedHostBuffer::alloc(0, 4096),
        reason,
    );
    assert_unavailable(
        "ManagedBuffer::alloc",
        ManagedBuffer::alloc(0, 4096),
        reason,
    );
    assert_unavailable("classify", cuda::classify(addr), reason);
    assert_unavailable(
        "check_gpu_range",
        gpu_mr::check_gpu_range(addr, 4096),
        reason,
    );
    // SAFETY: `heap` outlives both calls (and without a driver nothing is looked up).
    unsafe {
        assert_unavailable(
            "export_dma_buf_at",
            gpu_mr::export_dma_buf_at(addr, 4096),
            reason,
        );
        assert_unavailable("set_sync_memops_at", cuda::set_sync_memops_at(addr), reason);
    }
}

/// What the loader sees decides what every entry point says. Run directly, it checks the real
/// machine; run by the fake-libcuda tests below (with `GDR_EXPECT_CUDA_REASON` set), it checks
/// the fake library's error.
#[test]
fn driver_state_matches_what_the_loader_finds() {
    if let Ok(reason) = std::env::var("GDR_EXPECT_CUDA_REASON") {
        let e = cuda::driver_version().expect_err("the fake libcuda must be refused");
        println!("fake libcuda: {e}");
        check_every_entry_point_unavailable(&reason);
        return;
    }
    // SAFETY: is_culib_present only dlopens and closes candidate names.
    if unsafe { gdr_sys::cuda::is_culib_present() } {
        let v = cuda::driver_version().expect("libcuda is present, so its version must be read");
        assert!(v >= cuda::MIN_DRIVER_VERSION, "driver {v}");
    } else {
        let e = cuda::devices().expect_err("no libcuda here");
        println!("no libcuda: {e}");
        assert_eq!(
            e.to_string(),
            format!(
                "CUDA driver unavailable: libcuda.so (the CUDA driver library) was not found by \
                 the dynamic loader; hint: {}",
                cuda::HINT_NO_LIBCUDA
            )
        );
        check_every_entry_point_unavailable("was not found by the dynamic loader");
    }
}

/// Builds `libcuda.so` from C source in a fresh folder and returns the folder.
fn build_fake_libcuda(tag: &str, source: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gdr-fake-libcuda-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    let c = dir.join("fake.c");
    std::fs::write(&c, source).expect("write fake.c");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so"))
        .arg(&c)
        .output()
        .expect("this test needs a C compiler (cc) to build a fake libcuda");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

fn run_child_with(libdir: &Path, expect: &str) -> String {
    let exe = std::env::current_exe().expect("current_exe");
    let out = Command::new(exe)
        .args([
            "--exact",
            "driver_state_matches_what_the_loader_finds",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LD_LIBRARY_PATH", libdir)
        .env("GDR_EXPECT_CUDA_REASON", expect)
        .output()
        .expect("spawn the test binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "child did not run the test:\n{text}"
    );
    text
}

#[test]
fn fake_libcuda_missing_symbols_is_a_typed_error() {
    let dir = build_fake_libcuda(
        "nosym",
        "int cuDriverGetVersion(int *v) { *v = 13000; return 0; }\n",
    );
    let text = run_child_with(&dir, "libcuda does not export cuInit");
    assert!(text.contains("fake libcuda: CUDA driver unavailable: libcuda does not export cuInit"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn fake_libcuda_too_old_is_a_typed_error() {
    // Every symbol gdr needs, as stubs that fail; the version says CUDA 10.2.
    let names = gdr::cuda::REQUIRED_SYMBOLS
        .iter()
        .filter(|n| **n != "cuDriverGetVersion");
    let mut src = String::from("int cuDriverGetVersion(int *v) { *v = 10020; return 0; }\n");
    for n in names {
        src.push_str(&format!("int {n}(void) {{ return 999; }}\n"));
    }
    let dir = build_fake_libcuda("old", &src);
    let text = run_child_with(&dir, "CUDA driver 10.2 is older than the 11.2 gdr needs");
    assert!(text.contains("hint: upgrade the NVIDIA driver"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn h200_with_a_dma_buf_nic_takes_dma_buf() {
    let got = choose_path(&inputs(NicDmaBuf::Supported, None), RegistrationPath::Auto).unwrap();
    assert_eq!(got, RegistrationPath::DmaBuf);
    // Forcing either path works when its prerequisites are there.
    let both = inputs(NicDmaBuf::Supported, Some("nvidia_peermem"));
    assert_eq!(
        choose_path(&both, RegistrationPath::PeerMemory).unwrap(),
        RegistrationPath::PeerMemory
    );
    assert_eq!(
        choose_path(&both, RegistrationPath::DmaBuf).unwrap(),
        RegistrationPath::DmaBuf
    );
}

#[test]
fn nic_without_dma_buf_falls_back_to_peer_memory() {
    let i = inputs(NicDmaBuf::NoProviderSupport, Some("nvidia_peermem"));
    assert_eq!(
        choose_path(&i, RegistrationPath::Auto).unwrap(),
        RegistrationPath::PeerMemory
    );
}

#[test]
fn nic_without_dma_buf_and_no_peer_memory_explains_both() {
    // The H200 machine as probed (no nvidia_peermem) with a NIC like rxe0 (EOPNOTSUPP).
    let e = choose_path(
        &inputs(NicDmaBuf::NoProviderSupport, None),
        RegistrationPath::Auto,
    )
    .unwrap_err();
    println!("NIC without dma-buf, no peer memory (Auto): {e}");
    let (what, hint) = unsupported(e);
    assert!(what.contains("no GPUDirect RDMA path from GPU 0 (0000:00:06.0) to mlx5_0"));
    assert!(what.contains("RDMA device mlx5_0 cannot import dma-bufs"));
    assert!(what.contains("EOPNOTSUPP"));
    assert!(what.contains("no peer-memory module is loaded"));
    assert!(
        what.contains("no nvidia_peermem or nv_peer_mem in /proc/modules"),
        "{what}"
    );
    assert!(hint.starts_with(gpu_mr::HINT_NIC_NO_DMA_BUF), "{hint}");
    assert!(hint.contains("rdma-core/OFED lacks dma-buf"));
    assert!(hint.ends_with(gpu_mr::HINT_PEER_MEMORY), "{hint}");
}

#[test]
fn forced_dma_buf_on_a_nic_without_it_names_rdma_core() {
    let e = choose_path(
        &inputs(NicDmaBuf::NoProviderSupport, Some("nvidia_peermem")),
        RegistrationPath::DmaBuf,
    )
    .unwrap_err();
    println!("NIC without dma-buf (forced DmaBuf): {e}");
    let (what, hint) = unsupported(e);
    assert!(what.starts_with("dma-buf registration: RDMA device mlx5_0 cannot import dma-bufs"));
    assert_eq!(hint, gpu_mr::HINT_NIC_NO_DMA_BUF);
}

#[test]
fn forced_peer_memory_without_a_module_names_nvidia_peermem() {
    let e = choose_path(
        &inputs(NicDmaBuf::Supported, None),
        RegistrationPath::PeerMemory,
    )
    .unwrap_err();
    println!("no peer memory module (forced PeerMemory): {e}");
    let (what, hint) = unsupported(e);
    assert!(what.contains("no peer-memory module is loaded"), "{what}");
    assert_eq!(hint, gpu_mr::HINT_PEER_MEMORY);
    assert!(hint.contains("load nvidia_peermem"));
    assert!(hint.contains("open kernel module >= 515, CUDA >= 11.7, kernel >= 5.12"));
}

#[test]
fn old_kernel_maps_to_the_kernel_hint() {
    let e = choose_path(
        &inputs(NicDmaBuf::NoKernelSupport, None),
        RegistrationPath::DmaBuf,
    )
    .unwrap_err();
    let (what, hint) = unsupported(e);
    assert!(what.contains("EPROTONOSUPPORT"), "{what}");
    assert!(hint.starts_with("kernel < 5.12"), "{hint}");
}

#[test]
fn proprietary_module_maps_to_its_hint() {
    let mut i = inputs(NicDmaBuf::Supported, None);
    i.gpu.dma_buf_supported = false;
    let e = choose_path(&i, RegistrationPath::Auto).unwrap_err();
    println!("GPU without dma-buf: {e}");
    let (what, hint) = unsupported(e);
    assert!(
        what.contains("CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0"),
        "{what}"
    );
    assert!(
        hint.starts_with("proprietary kernel module or old driver"),
        "{hint}"
    );
    // With peer memory, Auto still finds a path.
    i.system.memory_peers.push("nv_mem".into());
    assert_eq!(
        choose_path(&i, RegistrationPath::Auto).unwrap(),
        RegistrationPath::PeerMemory
    );
}

#[test]
fn old_driver_cannot_export_dma_bufs() {
    let mut i = inputs(NicDmaBuf::Supported, None);
    i.driver_version = 11040;
    let (what, hint) = unsupported(choose_path(&i, RegistrationPath::DmaBuf).unwrap_err());
    assert!(
        what.contains("CUDA driver 11.4 cannot export dma-bufs (needs 11.7)"),
        "{what}"
    );
    assert_eq!(hint, gpu_mr::HINT_DRIVER_NO_DMA_BUF);
    let mut i = inputs(NicDmaBuf::Supported, None);
    i.driver_exports_dma_buf = false;
    assert!(choose_path(&i, RegistrationPath::DmaBuf).is_err());
}

#[test]
fn gpu_without_gpudirect_is_refused_on_every_path() {
    let mut i = inputs(NicDmaBuf::Supported, Some("nvidia_peermem"));
    i.gpu.gpu_direct_rdma_supported = false;
    for p in [
        RegistrationPath::Auto,
        RegistrationPath::DmaBuf,
        RegistrationPath::PeerMemory,
    ] {
        let (what, hint) = unsupported(choose_path(&i, p).unwrap_err());
        assert!(what.contains("GPUDirect RDMA on GPU 0 (NVIDIA H200, 0000:00:06.0)"));
        assert_eq!(hint, gpu_mr::HINT_NO_GPUDIRECT);
    }
}

#[test]
fn probe_errnos_are_classified() {
    assert_eq!(
        NicDmaBuf::from_probe_errno(libc::EBADF),
        NicDmaBuf::Supported
    );
    assert_eq!(
        NicDmaBuf::from_probe_errno(libc::EOPNOTSUPP),
        NicDmaBuf::NoProviderSupport
    );
    assert_eq!(
        NicDmaBuf::from_probe_errno(libc::EPROTONOSUPPORT),
        NicDmaBuf::NoKernelSupport
    );
    assert_eq!(
        NicDmaBuf::from_probe_errno(libc::EINVAL),
        NicDmaBuf::Unknown {
            errno: libc::EINVAL
        }
    );
    assert!(inputs(
        NicDmaBuf::Unknown {
            errno: libc::EINVAL
        },
        None
    )
    .dma_buf_blocker()
    .is_some());
}

#[test]
fn registration_errnos_map_to_design_hints() {
    let e = registration_error(
        "ibv_reg_mr_iova2",
        "device=mlx5_0, addr=0x7f0000000000, len=4096".into(),
        RegistrationPath::PeerMemory,
        libc::EFAULT,
    );
    println!("EFAULT on a device pointer: {e}");
    assert_eq!(
        e.to_string(),
        format!(
            "ibv_reg_mr_iova2(device=mlx5_0, addr=0x7f0000000000, len=4096) failed: Bad address \
             (errno 14); hint: {}",
            gpu_mr::HINT_PEER_MEMORY
        )
    );
    let e = registration_error(
        "ibv_reg_dmabuf_mr",
        String::new(),
        RegistrationPath::DmaBuf,
        libc::EOPNOTSUPP,
    );
    println!("EOPNOTSUPP on dma-buf: {e}");
    assert_eq!(e.errno(), Some(libc::EOPNOTSUPP));
    assert_eq!(e.hint(), Some(gpu_mr::HINT_NIC_NO_DMA_BUF));
    let e = registration_error(
        "ibv_reg_dmabuf_mr",
        String::new(),
        RegistrationPath::DmaBuf,
        libc::EPROTONOSUPPORT,
    );
    assert_eq!(e.hint(), Some(gpu_mr::HINT_KERNEL_NO_DMA_BUF));
    let e = registration_error(
        "ibv_reg_dmabuf_mr",
        String::new(),
        RegistrationPath::DmaBuf,
        libc::ENOMEM,
    );
    assert!(e.hint().unwrap().contains("locked-memory limit"));
}

#[test]
fn peer_memory_probe_reads_the_given_root() {
    let root = std::env::temp_dir().join(format!("gdr-peermem-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("proc")).unwrap();
    std::fs::create_dir_all(root.join("sys/module/nvidia_peermem")).unwrap();
    let modules = |names: &[&str]| {
        let text: String = names
            .iter()
            .map(|n| format!("{n} 16384 0 - Live 0x0000000000000000\n"))
            .collect();
        std::fs::write(root.join("proc/modules"), text).unwrap();
    };
    // /proc/modules decides, not a stale /sys/module folder.
    modules(&["nvidia", "nvidia_uvm"]);
    assert_eq!(gpu_mr::probe_peer_memory(&root), PeerMemory { found: None });
    modules(&["nvidia", "nvidia_peermem"]);
    assert_eq!(
        gpu_mr::probe_peer_memory(&root).found.as_deref(),
        Some("kernel module nvidia_peermem")
    );
    modules(&["nvidia"]);
    std::fs::create_dir_all(root.join("sys/kernel/mm/memory_peers/nv_mem")).unwrap();
    std::fs::write(
        root.join("sys/kernel/mm/memory_peers/nv_mem/version"),
        "1.0\n",
    )
    .unwrap();
    assert_eq!(
        gpu_mr::probe_peer_memory(&root).found.as_deref(),
        Some("memory peer nv_mem")
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn flush_follows_writes_ordering() {
    let mut g = h200();
    assert_eq!(flush_method(&g, true), FlushMethod::NotNeeded);
    g.writes_ordering = 0;
    assert!(g.needs_flush());
    assert_eq!(flush_method(&g, true), FlushMethod::CuFlush);
    assert_eq!(flush_method(&g, false), FlushMethod::RdmaRead);
    g.flush_writes_options = 2;
    assert_eq!(flush_method(&g, true), FlushMethod::RdmaRead);
}

#[test]
fn page_alignment_for_dma_buf_export() {
    assert_eq!(
        gpu_mr::page_aligned(0x7f00_0000_1000, 8192, 4096).unwrap(),
        (0x7f00_0000_1000, 8192, 0)
    );
    assert_eq!(
        gpu_mr::page_aligned(0x7f00_0000_1234, 100, 4096).unwrap(),
        (0x7f00_0000_1000, 4096, 0x234)
    );
    assert_eq!(
        gpu_mr::page_aligned(0x7f00_0000_1ff0, 0x20, 4096).unwrap(),
        (0x7f00_0000_1000, 8192, 0xff0)
    );
    // Finding 5: the end past u64::MAX is a typed error, not an overflow.
    let e = gpu_mr::page_aligned(u64::MAX - 10, 100, 4096).unwrap_err();
    println!("page_aligned(u64::MAX - 10, 100): {e}");
    assert!(matches!(e, Error::OutOfBounds { offset, len: 100, .. } if offset == u64::MAX - 10));
    assert!(matches!(
        gpu_mr::page_aligned(0x1000, 1, 0),
        Err(Error::InvalidArgument { .. })
    ));
}

/// Soft-RoCE tier: rxe imports no dma-bufs, and without libcuda a GPU registration stops with
/// the typed error before touching the NIC.
#[test]
#[ignore = "needs an RDMA device: run in the VM (cargo xtask test) with GDR_TEST_DEVICE=rxe0"]
fn nic_dma_buf_probe_and_gpu_registration_without_cuda() {
    let dev = gdr_test_support::device();
    let ctx = gdr::device::Context::open(&dev).expect("open the RDMA device");
    let pd = gdr::pd::ProtectionDomain::new(&ctx).expect("allocate a protection domain");
    let probe = gpu_mr::probe_nic_dma_buf(&pd);
    println!("dma-buf probe on {dev}: {probe:?}");
    assert_eq!(
        probe,
        NicDmaBuf::NoProviderSupport,
        "rxe does not import dma-bufs"
    );
    // Cached: a second probe answers the same.
    assert_eq!(gpu_mr::probe_nic_dma_buf(&pd), probe);
    // By name (what the doctor's live collection records, gdr-doctor's doctor_rules test).
    assert_eq!(gpu_mr::probe_nic_dma_buf_by_name(&dev), Some(probe));
    assert_eq!(gpu_mr::probe_nic_dma_buf_by_name("no-such-device"), None);

    let heap = vec![0u8; 4096];
    // SAFETY: the call fails before registering anything (no libcuda in the VM), and `heap`
    // outlives it anyway.
    let r = unsafe {
        gpu_mr::GpuMemoryRegion::register_raw(
            &pd,
            heap.as_ptr() as u64,
            heap.len(),
            gdr::mr::AccessFlags::LOCAL_WRITE,
            RegistrationPath::Auto,
        )
    };
    // SAFETY: is_culib_present only dlopens and closes candidate names.
    if unsafe { gdr_sys::cuda::is_culib_present() } {
        // A CUDA driver in the guest: the heap pointer must be refused as host memory.
        match r {
            Err(Error::NotGpuMemory { kind, .. }) => {
                assert_ne!(kind, gdr::cuda::PointerType::Device)
            }
            Err(Error::CudaUnavailable { .. }) => {}
            other => panic!("heap memory registered as GPU memory: {other:?}"),
        }
    } else {
        let e = r.expect_err("no libcuda in the VM");
        println!("GPU registration without libcuda: {e}");
        assert!(matches!(e, Error::CudaUnavailable { .. }), "{e:?}");
    }
}
