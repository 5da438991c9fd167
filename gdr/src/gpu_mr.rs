//! GPU memory registered for RDMA: [`GpuMemoryRegion`].
//!
//! Registration follows a fixed procedure (shared/DESIGN.md, "GPU memory registration"):
//!
//! 1. **Capabilities**, probed once per process and per NIC and cached: the CUDA driver version
//!    and the GPU's GPUDirect attributes ([`crate::cuda::DeviceInfo`]), whether a peer-memory
//!    module is loaded ([`peer_memory`]), and whether the NIC imports dma-bufs
//!    ([`probe_nic_dma_buf`]: `ibv_reg_dmabuf_mr` with fd -1; `EBADF` means yes).
//! 2. **Pointer check** ([`check_gpu_range`]): `cuPointerGetAttributes` must say device memory.
//!    Managed memory is refused (it would pin CPU pages and silently test the wrong path), host
//!    memory is sent to [`crate::mr::MemoryRegion`], addresses CUDA does not know are refused.
//! 3. **Context**: the memory's own context is made current (the device's primary context for
//!    pool allocations, which have none) and restored afterwards; `SYNC_MEMOPS` is set.
//! 4. **Range**: the requested bytes must lie inside the allocation (`cuMemGetAddressRange`).
//! 5. **Path** ([`choose_path`], a pure function of the recorded inputs [`PathInputs`]): dma-buf
//!    when GPU, driver and NIC all support it, else peer memory when a module is loaded; or the
//!    path the caller forces with [`RegistrationPath`].
//! 6. **dma-buf**: `cuMemGetHandleForAddressRange(DMA_BUF_FD)` on the host-page-aligned range,
//!    then `ibv_reg_dmabuf_mr(pd, offset, len, iova = GPU address, fd, access)`. rdma-core stores
//!    the offset, not the address, in `ibv_mr::addr` for such regions, so the IOVA is recorded
//!    here. **Peer memory**: `ibv_reg_mr_iova2` with relaxed ordering, retried without it on
//!    `EINVAL`, `ibv_reg_mr` where `iova2` is unsupported.
//! 7. The path used is in [`GpuMemoryRegion::path`] and in the `info` log.
//!
//! ```no_run
//! use std::sync::Arc;
//! use gdr::cuda::DeviceBuffer;
//! use gdr::gpu_mr::{GpuMemoryRegion, RegistrationPath};
//! use gdr::mr::{AccessFlags, Registered};
//! # fn main() -> gdr::Result<()> {
//! let ctx = gdr::device::Context::open("mlx5_0")?;
//! let pd = gdr::pd::ProtectionDomain::new(&ctx)?;
//! let buf = Arc::new(DeviceBuffer::alloc(0, 1 << 20)?);
//! let mr = GpuMemoryRegion::register(&pd, buf, .., AccessFlags::remote_rw(), RegistrationPath::Auto)?;
//! println!("GPU region rkey={:#x} via {}", mr.rkey(), mr.path());
//! # Ok(()) }
//! ```

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::ops::RangeBounds;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use gdr_sys::cuda as cu;
use gdr_sys::ibv;

use crate::cuda::{self, DeviceBuffer, DeviceInfo, MemoryKind as CudaMemoryKind, PointerInfo};
use crate::error::{Error, Hint, Result};
use crate::mr::{AccessFlags, MemoryKind, Registered};
use crate::pd::ProtectionDomain;

/// Hint when device memory cannot be pinned by the NIC (`EFAULT`) or no path exists.
pub const HINT_PEER_MEMORY: &str =
    "load nvidia_peermem (`modprobe nvidia_peermem`) or use dma-buf \
     (open kernel module >= 515, CUDA >= 11.7, kernel >= 5.12)";
/// Hint when the NIC's user-space stack cannot import dma-bufs (`EOPNOTSUPP`).
pub const HINT_NIC_NO_DMA_BUF: &str = "rdma-core/OFED lacks dma-buf: upgrade rdma-core (>= 34) or \
     MLNX_OFED, use a NIC whose provider imports dma-bufs, or load nvidia_peermem";
/// Hint when the kernel's RDMA stack cannot import dma-bufs (`EPROTONOSUPPORT`).
pub const HINT_KERNEL_NO_DMA_BUF: &str =
    "kernel < 5.12: its RDMA stack cannot import dma-bufs; upgrade the kernel or load nvidia_peermem";
/// Hint when the GPU reports `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0`.
pub const HINT_GPU_NO_DMA_BUF: &str = "proprietary kernel module or old driver: install the open \
     NVIDIA kernel module (>= 515) or load nvidia_peermem";
/// Hint when the CUDA driver is too old to export dma-bufs.
pub const HINT_DRIVER_NO_DMA_BUF: &str =
    "CUDA driver < 11.7 has no cuMemGetHandleForAddressRange: \
     upgrade the NVIDIA driver or load nvidia_peermem";
/// Hint when the GPU cannot do GPUDirect RDMA at all.
pub const HINT_NO_GPUDIRECT: &str =
    "this GPU reports CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED \
     = 0 (consumer GPUs, some vGPU profiles): move data through pinned host memory instead";
/// Hint for managed memory.
pub const HINT_MANAGED: &str = "allocate with cuMemAlloc or cuMemAllocAsync \
     (gdr::cuda::DeviceBuffer): registering managed memory would pin CPU pages and silently \
     measure the host path";
/// Hint for device memory whose allocation is not GPUDirect RDMA capable.
pub const HINT_NOT_GPUDIRECT_CAPABLE: &str =
    "allocate with cuMemAlloc (gdr::cuda::DeviceBuffer::alloc), \
     or with cuMemCreate and allocFlags.gpuDirectRDMACapable = 1; memory from the default \
     stream-ordered pool (cuMemAllocAsync) is not GPUDirect RDMA capable";
/// Hint for host memory passed as GPU memory.
pub const HINT_HOST_MEMORY: &str =
    "this is host memory: register it with gdr::mr::MemoryRegion instead";

/// Files whose presence means a peer-memory module is loaded (as NCCL checks), relative to `/`.
pub const PEER_MEMORY_FILES: &[&str] = &[
    "sys/kernel/mm/memory_peers/nv_mem/version",
    "sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "sys/module/nvidia_peermem/version",
    "sys/module/nv_peer_mem/version",
];

/// How GPU memory is (or should be) registered.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum RegistrationPath {
    /// Choose: dma-buf when GPU, driver and NIC support it, else peer memory.
    #[default]
    Auto,
    /// `cuMemGetHandleForAddressRange` + `ibv_reg_dmabuf_mr`. Needs the open kernel module,
    /// CUDA >= 11.7, Linux >= 5.12 and a NIC provider that imports dma-bufs.
    DmaBuf,
    /// `ibv_reg_mr_iova2` / `ibv_reg_mr` on the device address, resolved by a peer-memory kernel
    /// module (`nvidia_peermem`, or `nv_peer_mem` with MLNX_OFED).
    PeerMemory,
}

impl fmt::Display for RegistrationPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RegistrationPath::Auto => "auto",
            RegistrationPath::DmaBuf => "dma-buf",
            RegistrationPath::PeerMemory => "peer-memory",
        })
    }
}

/// What the per-NIC dma-buf probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NicDmaBuf {
    /// The NIC imports dma-bufs (the probe with fd -1 failed with `EBADF`).
    Supported,
    /// The user-space provider or rdma-core lacks dma-buf (`EOPNOTSUPP`).
    NoProviderSupport,
    /// The kernel lacks dma-buf import for RDMA (`EPROTONOSUPPORT`, Linux < 5.12).
    NoKernelSupport,
    /// The probe failed in an unexpected way; the errno is kept.
    Unknown {
        /// The positive errno.
        errno: i32,
    },
}

impl NicDmaBuf {
    /// Interprets the errno of `ibv_reg_dmabuf_mr(pd, 0, len, 0, fd = -1, ...)`.
    pub fn from_probe_errno(errno: i32) -> Self {
        match errno {
            libc::EBADF => NicDmaBuf::Supported,
            libc::EOPNOTSUPP => NicDmaBuf::NoProviderSupport,
            libc::EPROTONOSUPPORT => NicDmaBuf::NoKernelSupport,
            e => NicDmaBuf::Unknown { errno: e },
        }
    }
}

/// Whether a peer-memory module is loaded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeerMemory {
    /// The first of [`PEER_MEMORY_FILES`] that exists (as an absolute path), if any.
    pub found: Option<String>,
}

impl PeerMemory {
    /// `true` if a peer-memory module is loaded.
    pub fn present(&self) -> bool {
        self.found.is_some()
    }
}

/// Looks for the peer-memory files under `root` (`/` on a live system, a snapshot folder in
/// tests).
pub fn probe_peer_memory(root: &Path) -> PeerMemory {
    PeerMemory {
        found: PEER_MEMORY_FILES
            .iter()
            .find(|rel| root.join(rel).exists())
            .map(|rel| format!("/{rel}")),
    }
}

/// [`probe_peer_memory`] of `/`, once per process.
pub fn peer_memory() -> &'static PeerMemory {
    static PEER: OnceLock<PeerMemory> = OnceLock::new();
    PEER.get_or_init(|| probe_peer_memory(Path::new("/")))
}

/// Probes (once per device name, then cached) whether the NIC behind `pd` imports dma-bufs:
/// `ibv_reg_dmabuf_mr` with fd -1 fails with `EBADF` on a NIC that does, `EOPNOTSUPP` or
/// `EPROTONOSUPPORT` on one that does not.
pub fn probe_nic_dma_buf(pd: &ProtectionDomain) -> NicDmaBuf {
    static CACHE: OnceLock<Mutex<HashMap<String, NicDmaBuf>>> = OnceLock::new();
    let name = pd.context().name().to_string();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache.lock().ok().and_then(|m| m.get(&name).copied()) {
        return v;
    }
    let len = crate::mr::page_size();
    // SAFETY: `pd` is a live protection domain; fd -1 refers to no file, so nothing is imported;
    // if a provider registers something anyway we deregister it below.
    let mr = unsafe {
        ibv::ibv_reg_dmabuf_mr(
            pd.as_raw(),
            0,
            len,
            0,
            -1,
            AccessFlags::LOCAL_WRITE.bits() as i32,
        )
    };
    let result = if mr.is_null() {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        NicDmaBuf::from_probe_errno(errno)
    } else {
        // SAFETY: `mr` was just returned by ibv_reg_dmabuf_mr and is deregistered once.
        unsafe { ibv::ibv_dereg_mr(mr) };
        NicDmaBuf::Supported
    };
    log::debug!("dma-buf probe on {name}: {result:?}");
    if let Ok(mut m) = cache.lock() {
        m.insert(name, result);
    }
    result
}

/// The recorded inputs of the path decision: everything [`choose_path`] looks at.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PathInputs {
    /// `cuDriverGetVersion`.
    pub driver_version: i32,
    /// Whether libcuda exports `cuMemGetHandleForAddressRange`.
    pub driver_exports_dma_buf: bool,
    /// The GPU that owns the memory.
    pub gpu: DeviceInfo,
    /// The peer-memory module probe.
    pub peer_memory: PeerMemory,
    /// The RDMA device's name.
    pub nic: String,
    /// The NIC's dma-buf probe.
    pub nic_dma_buf: NicDmaBuf,
}

impl PathInputs {
    /// Why the dma-buf path cannot be used, with its hint; `None` if it can.
    pub fn dma_buf_blocker(&self) -> Option<(String, &'static str)> {
        if self.driver_version < cuda::DMA_BUF_MIN_DRIVER_VERSION || !self.driver_exports_dma_buf {
            return Some((
                format!(
                    "CUDA driver {} cannot export dma-bufs (needs {})",
                    cuda::version_text(self.driver_version),
                    cuda::version_text(cuda::DMA_BUF_MIN_DRIVER_VERSION)
                ),
                HINT_DRIVER_NO_DMA_BUF,
            ));
        }
        if !self.gpu.dma_buf_supported {
            return Some((
                format!(
                    "GPU {} ({}) reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0",
                    self.gpu.ordinal, self.gpu.pci_bus_id
                ),
                HINT_GPU_NO_DMA_BUF,
            ));
        }
        match self.nic_dma_buf {
            NicDmaBuf::Supported => None,
            NicDmaBuf::NoProviderSupport => Some((
                format!(
                    "RDMA device {} cannot import dma-bufs (ibv_reg_dmabuf_mr: {}, EOPNOTSUPP)",
                    self.nic,
                    crate::error::errno_text(libc::EOPNOTSUPP)
                ),
                HINT_NIC_NO_DMA_BUF,
            )),
            NicDmaBuf::NoKernelSupport => Some((
                format!(
                    "the kernel cannot import dma-bufs into RDMA device {} (ibv_reg_dmabuf_mr: {}, EPROTONOSUPPORT)",
                    self.nic,
                    crate::error::errno_text(libc::EPROTONOSUPPORT)
                ),
                HINT_KERNEL_NO_DMA_BUF,
            )),
            NicDmaBuf::Unknown { errno } => Some((
                format!(
                    "dma-buf probe on RDMA device {} failed: {} (errno {errno})",
                    self.nic,
                    crate::error::errno_text(errno)
                ),
                HINT_NIC_NO_DMA_BUF,
            )),
        }
    }

    fn no_peer_memory_text(&self) -> String {
        format!(
            "no peer-memory module is loaded (none of {} exists)",
            PEER_MEMORY_FILES
                .iter()
                .map(|f| format!("/{f}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// Decides how to register GPU memory, from recorded inputs only (no I/O): the requested path if
/// it can work, or for [`RegistrationPath::Auto`] dma-buf first, then peer memory. Never returns
/// `Auto`.
///
/// # Errors
/// [`Error::Unsupported`] naming what is missing, with the fix as hint: no GPUDirect on the GPU,
/// the dma-buf blocker (driver, GPU module, rdma-core, kernel), or no peer-memory module.
pub fn choose_path(inputs: &PathInputs, requested: RegistrationPath) -> Result<RegistrationPath> {
    let gpu = &inputs.gpu;
    if !gpu.gpu_direct_rdma_supported {
        return Err(Error::unsupported(
            format!(
                "GPUDirect RDMA on GPU {} ({}, {})",
                gpu.ordinal, gpu.name, gpu.pci_bus_id
            ),
            HINT_NO_GPUDIRECT,
        ));
    }
    let blocker = inputs.dma_buf_blocker();
    let peer = inputs.peer_memory.present();
    match requested {
        RegistrationPath::DmaBuf => match blocker {
            None => Ok(RegistrationPath::DmaBuf),
            Some((what, hint)) => Err(Error::unsupported(
                format!("dma-buf registration: {what}"),
                hint,
            )),
        },
        RegistrationPath::PeerMemory => {
            if peer {
                Ok(RegistrationPath::PeerMemory)
            } else {
                Err(Error::unsupported(
                    format!(
                        "peer-memory registration of GPU memory on {}: {}",
                        inputs.nic,
                        inputs.no_peer_memory_text()
                    ),
                    HINT_PEER_MEMORY,
                ))
            }
        }
        RegistrationPath::Auto => match (blocker, peer) {
            (None, _) => Ok(RegistrationPath::DmaBuf),
            (Some(_), true) => Ok(RegistrationPath::PeerMemory),
            (Some((what, hint)), false) => Err(Error::unsupported(
                format!(
                    "no GPUDirect RDMA path from GPU {} ({}) to {}: dma-buf: {what}; peer memory: {}",
                    gpu.ordinal,
                    gpu.pci_bus_id,
                    inputs.nic,
                    inputs.no_peer_memory_text()
                ),
                format!("{hint}; or {HINT_PEER_MEMORY}"),
            )),
        },
    }
}

/// Maps a failed GPU registration call to an error with the hint that fits the errno.
pub fn registration_error(
    call: &'static str,
    args: String,
    path: RegistrationPath,
    errno: i32,
) -> Error {
    let hint: Hint = match (path, errno) {
        (RegistrationPath::DmaBuf, libc::EOPNOTSUPP) => HINT_NIC_NO_DMA_BUF.into(),
        (RegistrationPath::DmaBuf, libc::EPROTONOSUPPORT) => HINT_KERNEL_NO_DMA_BUF.into(),
        (_, libc::EFAULT) => HINT_PEER_MEMORY.into(),
        (_, libc::ENOMEM) | (_, libc::EAGAIN) => Hint::new(format!(
            "the NIC could not pin the range (locked-memory limit {}; BAR1 space: nvidia-smi -q -d MEMORY); raise `ulimit -l` or register less",
            crate::mr::memlock_limit_text()
        )),
        (_, libc::EINVAL) => {
            "the NIC rejected the access flags, length or IOVA (see its max_mr_size)".into()
        }
        (_, libc::EPERM) | (_, libc::EACCES) => {
            "no permission: check RLIMIT_MEMLOCK and /dev/infiniband permissions".into()
        }
        _ => Hint::NONE,
    };
    Error::verbs(call, args, errno, hint)
}

/// A device range that passed the pre-registration checks of [`check_gpu_range`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuRange {
    /// What CUDA says about the start address (kind, ordinal, context, allocation).
    pub pointer: PointerInfo,
    /// Start of the range (a device virtual address).
    pub address: u64,
    /// Length in bytes.
    pub len: usize,
    /// The owning GPU with its GPUDirect attributes.
    pub gpu: DeviceInfo,
}

/// The checks before any registration: the driver works, `address` is device memory (not host,
/// managed or unknown memory), `address..address+len` lies inside its allocation, and CUDA does
/// not report the allocation as unfit for GPUDirect RDMA
/// (`CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 0`, as the default stream-ordered pool's
/// memory does on the H200 with CUDA 13.0).
///
/// # Errors
/// [`Error::CudaUnavailable`] without a driver; [`Error::InvalidArgument`] for `len == 0`, host
/// memory or an address CUDA does not know; [`Error::Unsupported`] for managed memory;
/// [`Error::OutOfBounds`] when the range leaves the allocation.
pub fn check_gpu_range(address: u64, len: usize) -> Result<GpuRange> {
    if len == 0 {
        return Err(Error::invalid(
            format!("GPU range at {address:#x} has length 0"),
            "register at least one byte",
        ));
    }
    let pointer = cuda::classify(address)?;
    match pointer.kind {
        CudaMemoryKind::Device => {}
        CudaMemoryKind::Managed => {
            return Err(Error::unsupported(
                format!(
                    "GPUDirect registration of managed (cuMemAllocManaged) memory at {address:#x}"
                ),
                HINT_MANAGED,
            ))
        }
        CudaMemoryKind::HostPinned | CudaMemoryKind::PageableHost => {
            return Err(Error::invalid(
                format!(
                    "{address:#x} is {} memory, not GPU device memory (cuPointerGetAttributes)",
                    pointer.kind
                ),
                HINT_HOST_MEMORY,
            ))
        }
        CudaMemoryKind::Unknown => {
            return Err(Error::invalid(
                format!(
                    "{address:#x} is neither CUDA memory nor mapped in this process (cuPointerGetAttributes)"
                ),
                "pass a pointer from cuMemAlloc/cuMemAllocAsync that is still allocated",
            ))
        }
    }
    let (Some(base), Some(size)) = (pointer.allocation_base, pointer.allocation_len) else {
        return Err(Error::invalid(
            format!("cuMemGetAddressRange found no allocation for device pointer {address:#x}"),
            Hint::NONE,
        ));
    };
    let offset = address - base;
    let fits = offset
        .checked_add(len as u64)
        .is_some_and(|end| end <= size);
    if !fits {
        return Err(Error::OutOfBounds {
            what: Cow::Owned(format!(
                "GPU range in its allocation (base {base:#x}, {size} bytes, from cuMemGetAddressRange)"
            )),
            offset,
            len: len as u64,
            limit: size,
            hint: Hint::new("register a range that lies inside one cuMemAlloc allocation"),
        });
    }
    if pointer.gpu_direct_rdma_capable == Some(false) {
        return Err(Error::unsupported(
            format!(
                "GPUDirect RDMA on the allocation at {base:#x} ({size} bytes): CUDA reports \
                 CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 0"
            ),
            HINT_NOT_GPUDIRECT_CAPABLE,
        ));
    }
    let gpu = cuda::device_info(pointer.ordinal.unwrap_or(0))?;
    Ok(GpuRange {
        pointer,
        address,
        len,
        gpu,
    })
}

/// A dma-buf file descriptor exported for a host-page-aligned device range.
#[derive(Debug)]
pub struct DmaBufExport {
    /// The dma-buf (closed on drop).
    pub fd: OwnedFd,
    /// The page-aligned start that was exported (the address aligned down).
    pub aligned_start: u64,
    /// The page-aligned length that was exported (the end aligned up).
    pub aligned_len: u64,
    /// Offset of the requested address inside the dma-buf.
    pub offset: u64,
}

/// `(start aligned down, length aligned up to whole pages, offset of address)` for `page`, a
/// power of two.
pub fn page_aligned(address: u64, len: u64, page: u64) -> (u64, u64, u64) {
    let start = address & !(page - 1);
    let end = (address + len + page - 1) & !(page - 1);
    (start, end - start, address - start)
}

/// Exports `address..address+len` of device memory as a dma-buf
/// (`cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)`), aligning the range to
/// host pages and reporting the offset, with the memory's own context current.
///
/// # Errors
/// Those of [`check_gpu_range`]; [`Error::Unsupported`] when the driver or GPU cannot export;
/// [`Error::Cuda`] when the export fails.
pub fn export_dma_buf(address: u64, len: usize) -> Result<DmaBufExport> {
    let range = check_gpu_range(address, len)?;
    // SAFETY: the allocation was alive a moment ago and the caller keeps it alive during this
    // call (a stale address fails the driver call; it is never dereferenced).
    let _ctx = unsafe { range.pointer.make_context_current() }?;
    export_in_context(&range)
}

fn export_in_context(range: &GpuRange) -> Result<DmaBufExport> {
    let version = cuda::driver_version()?;
    if version < cuda::DMA_BUF_MIN_DRIVER_VERSION
        || !cuda::has_symbol("cuMemGetHandleForAddressRange")
    {
        return Err(Error::unsupported(
            format!(
                "dma-buf export: CUDA driver {} lacks cuMemGetHandleForAddressRange",
                cuda::version_text(version)
            ),
            HINT_DRIVER_NO_DMA_BUF,
        ));
    }
    if !range.gpu.dma_buf_supported {
        return Err(Error::unsupported(
            format!(
                "dma-buf export: GPU {} reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0",
                range.gpu.ordinal
            ),
            HINT_GPU_NO_DMA_BUF,
        ));
    }
    let page = crate::mr::page_size() as u64;
    let (start, aligned_len, offset) = page_aligned(range.address, range.len as u64, page);
    let mut fd: libc::c_int = -1;
    // SAFETY: initialised driver, the memory's context is current (caller), the out-pointer is a
    // valid int as the DMA_BUF_FD handle type requires; the range is not dereferenced.
    let rc = unsafe {
        cu::cuMemGetHandleForAddressRange(
            (&mut fd as *mut libc::c_int).cast(),
            start,
            aligned_len as usize,
            cu::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    cuda::check(
        rc,
        "cuMemGetHandleForAddressRange",
        || {
            format!(
                "dptr={start:#x}, size={aligned_len}, handleType=DMA_BUF_FD (requested {:#x}+{})",
                range.address, range.len
            )
        },
        |rc| match rc {
            cu::CUresult::CUDA_ERROR_NOT_SUPPORTED => HINT_GPU_NO_DMA_BUF.into(),
            cu::CUresult::CUDA_ERROR_INVALID_VALUE => {
                Hint::new("the page-aligned range must lie in one allocation: allocate whole pages")
            }
            _ => Hint::NONE,
        },
    )?;
    if fd < 0 {
        return Err(Error::unsupported(
            format!("cuMemGetHandleForAddressRange returned fd {fd}"),
            HINT_GPU_NO_DMA_BUF,
        ));
    }
    // SAFETY: the driver handed us a new file descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(DmaBufExport {
        fd,
        aligned_start: start,
        aligned_len,
        offset,
    })
}

/// What [`GpuMemoryRegion::flush_rdma_writes`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushOutcome {
    /// The GPU orders RDMA writes before later kernels (`writes_ordering >= 100`): nothing to do.
    NotNeeded,
    /// `cuFlushGPUDirectRDMAWrites(CURRENT_CTX, TO_OWNER)` ran.
    Flushed,
}

/// How RDMA-written data must be made visible to GPU kernels on `gpu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushMethod {
    /// Nothing: the GPU orders them (`writes_ordering >= 100`).
    NotNeeded,
    /// `cuFlushGPUDirectRDMAWrites` (the driver has it and the GPU offers the HOST option).
    CuFlush,
    /// Neither: the consumer must post a 1-byte RDMA READ from the region on the same queue pair
    /// and wait for its completion before launching the kernel (what NCCL does).
    RdmaRead,
}

/// Chooses the flush from the GPU's attributes and whether the driver has the flush call.
pub fn flush_method(gpu: &DeviceInfo, driver_has_flush: bool) -> FlushMethod {
    if !gpu.needs_flush() {
        FlushMethod::NotNeeded
    } else if driver_has_flush && gpu.flush_writes_options & 1 != 0 {
        FlushMethod::CuFlush
    } else {
        FlushMethod::RdmaRead
    }
}

/// GPU device memory registered with a protection domain.
///
/// Holds what it registered ([`DeviceBuffer`] via `Arc`, for [`register`](Self::register)), the
/// dma-buf fd (dma-buf path) and the protection domain; `Drop` deregisters before any of them is
/// released. The CPU never gets a view of the bytes: [`Registered::kind`] reports
/// [`MemoryKind::Gpu`], so work requests refuse inline sends and CPU reads from it.
pub struct GpuMemoryRegion {
    mr: NonNull<ibv::ibv_mr>,
    iova: u64,
    len: usize,
    ordinal: i32,
    access: AccessFlags,
    path: RegistrationPath,
    relaxed_ordering: bool,
    gpu: DeviceInfo,
    dma_buf: Option<DmaBufExport>,
    buffer: Option<Arc<DeviceBuffer>>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: ibv_mr handles may be used from any thread; the region never touches the GPU bytes
// itself, and the owned DeviceBuffer / fd are Send + Sync.
unsafe impl Send for GpuMemoryRegion {}
// SAFETY: as above; there is no interior mutability.
unsafe impl Sync for GpuMemoryRegion {}

impl fmt::Debug for GpuMemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuMemoryRegion")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .field("ordinal", &self.ordinal)
            .field("path", &self.path)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.access)
            .field("device", &self.pd.context().name())
            .finish()
    }
}

impl GpuMemoryRegion {
    /// Registers `range` of `buffer` (`..` for all of it). The region keeps the buffer alive.
    ///
    /// `access` gets relaxed ordering added where the NIC accepts it.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for a range outside the buffer; everything [`check_gpu_range`] and
    /// [`choose_path`] return; [`Error::Cuda`] from the dma-buf export; [`Error::Verbs`] from the
    /// registration, with hints (e.g. `EFAULT` -> load nvidia_peermem or use dma-buf).
    pub fn register(
        pd: &Arc<ProtectionDomain>,
        buffer: Arc<DeviceBuffer>,
        range: impl RangeBounds<usize>,
        access: AccessFlags,
        path: RegistrationPath,
    ) -> Result<Arc<GpuMemoryRegion>> {
        let (offset, len) =
            crate::mr::resolve_range("GPU region within its DeviceBuffer", range, buffer.len())?;
        let address = buffer.device_ptr() + offset as u64;
        register_inner(pd, address, len, access, path, Some(buffer))
    }

    /// Registers device memory that something else owns (another framework's allocator).
    ///
    /// The same checks run as for [`register`](Self::register): the pointer must be device memory
    /// and the range must lie in its allocation.
    ///
    /// # Safety
    /// `address..address + len` must stay allocated (not freed, not returned to a caching
    /// allocator for reuse) until the returned region and every clone of its `Arc` are dropped,
    /// including those held by in-flight work requests.
    pub unsafe fn register_raw(
        pd: &Arc<ProtectionDomain>,
        address: u64,
        len: usize,
        access: AccessFlags,
        path: RegistrationPath,
    ) -> Result<Arc<GpuMemoryRegion>> {
        register_inner(pd, address, len, access, path, None)
    }

    /// The path used: [`RegistrationPath::DmaBuf`] or [`RegistrationPath::PeerMemory`].
    pub fn path(&self) -> RegistrationPath {
        self.path
    }

    /// Whether the registration has `IBV_ACCESS_RELAXED_ORDERING`.
    pub fn relaxed_ordering(&self) -> bool {
        self.relaxed_ordering
    }

    /// The GPU the memory lives on.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The device address of byte 0 (equal to [`Registered::iova`]).
    pub fn device_ptr(&self) -> u64 {
        self.iova
    }

    /// The buffer this region keeps alive, when registered with [`register`](Self::register);
    /// use it to fill and check the memory ([`DeviceBuffer::copy_from_host`], ...).
    pub fn buffer(&self) -> Option<&Arc<DeviceBuffer>> {
        self.buffer.as_ref()
    }

    /// The dma-buf export behind a [`RegistrationPath::DmaBuf`] region (fd, aligned range,
    /// offset); `None` for peer-memory regions.
    pub fn dma_buf(&self) -> Option<&DmaBufExport> {
        self.dma_buf.as_ref()
    }

    /// The raw `ibv_mr`. Note: for dma-buf regions its `addr` field holds the dma-buf offset, not
    /// the address; use [`Registered::iova`].
    pub fn as_raw(&self) -> *mut ibv::ibv_mr {
        self.mr.as_ptr()
    }

    /// Makes data that RDMA wrote into this GPU's memory visible to kernels launched afterwards.
    ///
    /// Call it after the completion of the RDMA write (or of the receive that announced it) and
    /// before launching the consuming kernel. GPUs whose `writes_ordering` is at least 100 (the H200
    /// reports 100) need nothing; otherwise `cuFlushGPUDirectRDMAWrites` runs in the memory's
    /// context.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the GPU needs a flush but neither `cuFlushGPUDirectRDMAWrites`
    /// nor its HOST option is available: then post a 1-byte RDMA READ from this region on the same
    /// queue pair and wait for its completion before launching the kernel (as NCCL does).
    pub fn flush_rdma_writes(&self) -> Result<FlushOutcome> {
        match flush_method(&self.gpu, cuda::has_symbol("cuFlushGPUDirectRDMAWrites")) {
            FlushMethod::NotNeeded => Ok(FlushOutcome::NotNeeded),
            FlushMethod::RdmaRead => Err(Error::unsupported(
                format!(
                    "cuFlushGPUDirectRDMAWrites on GPU {} (writes_ordering {}, flush options {:#x})",
                    self.ordinal, self.gpu.writes_ordering, self.gpu.flush_writes_options
                ),
                "post a 1-byte RDMA READ from this region on the same queue pair and wait for its \
                 completion before the kernel reads the data",
            )),
            FlushMethod::CuFlush => {
                let _ctx = cuda::ContextGuard::primary(self.ordinal)?;
                // SAFETY: initialised driver with the symbol present (checked); a context of the
                // owning device is current.
                let rc = unsafe {
                    cu::cuFlushGPUDirectRDMAWrites(
                        cu::CUflushGPUDirectRDMAWritesTarget::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                        cu::CUflushGPUDirectRDMAWritesScope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER,
                    )
                };
                cuda::check(
                    rc,
                    "cuFlushGPUDirectRDMAWrites",
                    || format!("target=CURRENT_CTX, scope=TO_OWNER, ordinal={}", self.ordinal),
                    cuda::no_hint,
                )?;
                Ok(FlushOutcome::Flushed)
            }
        }
    }
}

const RELAXED: u32 = ibv::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;

fn register_inner(
    pd: &Arc<ProtectionDomain>,
    address: u64,
    len: usize,
    access: AccessFlags,
    requested: RegistrationPath,
    buffer: Option<Arc<DeviceBuffer>>,
) -> Result<Arc<GpuMemoryRegion>> {
    let range = check_gpu_range(address, len)?;
    // SAFETY: the allocation stays alive: `buffer` holds it, or the caller of register_raw
    // promised so.
    let _ctx = unsafe { range.pointer.make_context_current() }?;

    if let Err(e) = cuda::set_sync_memops(address) {
        log::warn!("{e}; synchronous copies to this memory may race with RDMA");
    }

    let inputs = PathInputs {
        driver_version: cuda::driver_version()?,
        driver_exports_dma_buf: cuda::has_symbol("cuMemGetHandleForAddressRange"),
        gpu: range.gpu.clone(),
        peer_memory: peer_memory().clone(),
        nic: pd.context().name().to_string(),
        nic_dma_buf: probe_nic_dma_buf(pd),
    };
    let path = choose_path(&inputs, requested)?;
    let access = access.normalized() - AccessFlags::RELAXED_ORDERING;
    let base_bits = access.bits();
    let dev = pd.context().name();

    let (mr, relaxed, dma_buf) = match path {
        RegistrationPath::DmaBuf => {
            let export = export_in_context(&range)?;
            let fd = export.fd.as_raw_fd();
            let attempt = |bits: u32| {
                // SAFETY: live pd; `fd` is a dma-buf we own covering offset..offset+len; the
                // kernel takes its own reference to the dma-buf for the registration's life.
                let mr = unsafe {
                    ibv::ibv_reg_dmabuf_mr(
                        pd.as_raw(),
                        export.offset,
                        len,
                        address,
                        fd,
                        bits as i32,
                    )
                };
                NonNull::new(mr)
                    .ok_or_else(|| std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
            };
            let (mr, relaxed) = match attempt(base_bits | RELAXED) {
                Ok(mr) => (mr, true),
                Err(libc::EINVAL) => match attempt(base_bits) {
                    Ok(mr) => (mr, false),
                    Err(e) => return Err(dma_err(dev, &export, address, len, access, false, e)),
                },
                Err(e) => return Err(dma_err(dev, &export, address, len, access, true, e)),
            };
            (mr, relaxed, Some(export))
        }
        RegistrationPath::PeerMemory | RegistrationPath::Auto => {
            let ptr = address as *mut libc::c_void;
            let iova2 = |bits: u32| {
                // SAFETY: live pd; the device range was checked to lie in a live allocation that
                // outlives the region; the peer-memory module resolves the device address.
                let mr = unsafe { ibv::ibv_reg_mr_iova2(pd.as_raw(), ptr, len, address, bits) };
                NonNull::new(mr)
                    .ok_or_else(|| std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
            };
            let args = |call_ro: bool| {
                format!(
                    "device={dev}, addr={address:#x}, len={len}, iova={address:#x}, access={access:?}{}",
                    if call_ro { "|RELAXED_ORDERING" } else { "" }
                )
            };
            match iova2(base_bits | RELAXED) {
                Ok(mr) => (mr, true, None),
                Err(libc::EINVAL) => match iova2(base_bits) {
                    Ok(mr) => (mr, false, None),
                    Err(e) => {
                        return Err(registration_error(
                            "ibv_reg_mr_iova2",
                            args(false),
                            RegistrationPath::PeerMemory,
                            e,
                        ))
                    }
                },
                Err(libc::EOPNOTSUPP) | Err(libc::ENOSYS) => {
                    // SAFETY: as for iova2 above; plain ibv_reg_mr uses the address as IOVA.
                    let mr = unsafe { ibv::ibv_reg_mr(pd.as_raw(), ptr, len, base_bits as i32) };
                    match NonNull::new(mr) {
                        Some(mr) => (mr, false, None),
                        None => {
                            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                            return Err(registration_error(
                                "ibv_reg_mr",
                                format!(
                                    "device={dev}, addr={address:#x}, len={len}, access={access:?}"
                                ),
                                RegistrationPath::PeerMemory,
                                e,
                            ));
                        }
                    }
                }
                Err(e) => {
                    return Err(registration_error(
                        "ibv_reg_mr_iova2",
                        args(true),
                        RegistrationPath::PeerMemory,
                        e,
                    ))
                }
            }
        }
    };
    let region = GpuMemoryRegion {
        mr,
        iova: address,
        len,
        ordinal: range.gpu.ordinal,
        access: if relaxed {
            access | AccessFlags::RELAXED_ORDERING
        } else {
            access
        },
        path,
        relaxed_ordering: relaxed,
        gpu: range.gpu,
        dma_buf,
        buffer,
        pd: pd.clone(),
    };
    log::info!(
        "registered GPU {} memory {:#x}+{} on {} via {} (relaxed ordering {}, lkey {:#x}, rkey {:#x})",
        region.ordinal,
        address,
        len,
        dev,
        path,
        if relaxed { "on" } else { "off" },
        region.lkey(),
        region.rkey()
    );
    Ok(Arc::new(region))
}

fn dma_err(
    dev: &str,
    export: &DmaBufExport,
    address: u64,
    len: usize,
    access: AccessFlags,
    relaxed: bool,
    errno: i32,
) -> Error {
    registration_error(
        "ibv_reg_dmabuf_mr",
        format!(
            "device={dev}, offset={}, len={len}, iova={address:#x}, fd={}, access={access:?}{}",
            export.offset,
            export.fd.as_raw_fd(),
            if relaxed { "|RELAXED_ORDERING" } else { "" }
        ),
        RegistrationPath::DmaBuf,
        errno,
    )
}

impl Drop for GpuMemoryRegion {
    fn drop(&mut self) {
        // SAFETY: work requests hold an Arc of the region until their completion is reaped, so
        // the NIC is done with it; deregistering here happens before the fields drop (dma-buf fd,
        // then the DeviceBuffer, then the protection domain).
        let rc = unsafe { ibv::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            log::warn!(
                "ibv_dereg_mr (GPU region {:#x}+{}) failed: {}",
                self.iova,
                self.len,
                crate::error::errno_text(rc.abs())
            );
        }
    }
}

// SAFETY: `[iova, iova + len)` is registered under lkey/rkey with `pd` for the life of the value
// (deregistered in Drop before the DeviceBuffer or, for register_raw, the caller's allocation is
// released); kind() reports GPU memory, so nothing offers CPU access to it.
unsafe impl Registered for GpuMemoryRegion {
    fn lkey(&self) -> u32 {
        // SAFETY: the mr is valid while self lives.
        unsafe { (*self.mr.as_ptr()).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
    fn iova(&self) -> u64 {
        self.iova
    }
    fn len(&self) -> usize {
        self.len
    }
    fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Gpu {
            ordinal: self.ordinal,
        }
    }
    fn access(&self) -> AccessFlags {
        self.access
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_keeps_the_offset() {
        assert_eq!(page_aligned(0x10000, 4096, 4096), (0x10000, 4096, 0));
        assert_eq!(page_aligned(0x10010, 100, 4096), (0x10000, 4096, 0x10));
        assert_eq!(page_aligned(0x10ff0, 0x20, 4096), (0x10000, 0x2000, 0xff0));
    }
}
