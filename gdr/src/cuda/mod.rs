//! The CUDA driver, safely: initialisation, device inventory, context guards, allocations,
//! copies and pointer classification.
//!
//! Everything here goes through the CUDA driver API (`libcuda.so.1`), loaded at run time by
//! `cudarc` inside [`gdr_sys::cuda`]. That loader panics when the library or one of its symbols is
//! missing, so this module checks first and returns [`Error::CudaUnavailable`] instead:
//!
//! 1. the library must be found by the dynamic loader ([`gdr_sys::cuda::is_culib_present`]);
//! 2. every symbol this module calls unconditionally must be exported by it (checked by name);
//! 3. `cuDriverGetVersion` must report at least [`MIN_DRIVER_VERSION`];
//! 4. `cuInit(0)` must succeed (it fails with `CUDA_ERROR_NO_DEVICE` on a machine without a GPU).
//!
//! Symbols that only newer drivers export (`cuMemGetHandleForAddressRange`, CUDA >= 11.7;
//! `cuFlushGPUDirectRDMAWrites`, >= 11.3; `cuMemAllocAsync`, >= 11.2) are checked by name before
//! each use and give [`Error::Unsupported`] when absent; so are the stream, event and
//! asynchronous-copy symbols [`Stream`] needs (checked when a stream is created).
//!
//! Asynchronous copies ([`Stream::copy_to_host`], [`Stream::copy_to_device`]) return an
//! [`AsyncCopy`] that holds an `Arc` of both buffers until the copy is known complete; host memory
//! they may write while it is shared implements [`HostDmaMemory`] ([`DmaHostBuffer`], a pinned
//! bounce buffer, and [`crate::mr::MemoryRegion`]).
//!
//! [`driver_version`] needs steps 1-3 only, so it answers on a machine whose driver is installed
//! but which has no GPU; every other entry point needs all four.
//!
//! ```no_run
//! # fn main() -> gdr::Result<()> {
//! let version = gdr::cuda::driver_version()?; // e.g. 13000 for CUDA 13.0
//! for gpu in gdr::cuda::devices()? {
//!     println!("{} {} dma-buf={}", gpu.ordinal, gpu.pci_bus_id, gpu.dma_buf_supported);
//! }
//! let buf = gdr::cuda::DeviceBuffer::alloc(0, 1 << 20)?;
//! buf.copy_from_host(0, &[1, 2, 3])?;
//! let info = gdr::cuda::classify(buf.device_ptr())?;
//! assert_eq!(info.kind, gdr::cuda::PointerType::Device);
//! gdr::cuda::set_sync_memops(&buf)?; // takes the owner: the memory cannot be freed meanwhile
//! # let _ = version; Ok(()) }
//! ```

mod context;
mod dma;
mod foreign;
mod memory;
mod pointer;
mod stream;

pub use context::ContextGuard;
pub use dma::{DmaHostBuffer, HostDmaMemory};
pub(crate) use foreign::run_release;
pub use foreign::ForeignDeviceMemory;
pub use memory::{
    copy_from_host_into, copy_to_host_from, DeviceBuffer, DeviceMemory, ManagedBuffer,
    PinnedHostBuffer,
};
pub use pointer::{classify, set_sync_memops, set_sync_memops_at, PointerInfo, PointerType};
pub use stream::{AsyncCopy, Stream};

use std::ffi::CStr;
use std::sync::OnceLock;

use gdr_sys::cuda as sys;

use crate::error::{Error, Hint, Result};

/// The oldest CUDA driver `gdr` accepts, in `cuDriverGetVersion` form (1000 x major + 10 x minor):
/// 11.2, the first with stream-ordered pool allocations and `cuDevicePrimaryCtxRelease_v2`.
pub const MIN_DRIVER_VERSION: i32 = 11020;

/// Symbols called without a further check once the driver is initialised. Names are the exact
/// ones `cudarc` 0.19 (feature `cuda-12020`) resolves, including `_v2` suffixes.
pub const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceGetPCIBusId",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocHost_v2",
    "cuMemFreeHost",
    "cuMemAllocManaged",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuPointerGetAttribute",
    "cuPointerGetAttributes",
    "cuPointerSetAttribute",
    "cuMemGetAddressRange_v2",
];

/// Hint for a machine without a loadable `libcuda`.
pub const HINT_NO_LIBCUDA: &str = "install the NVIDIA driver (it ships libcuda.so.1) and make \
     sure the dynamic loader finds it (ldconfig -p | grep libcuda; or add its folder to \
     LD_LIBRARY_PATH)";

/// What [`load`] found, cached for the life of the process.
#[derive(Debug, Clone)]
enum LoadState {
    Loaded { version: i32 },
    Failed { reason: String, hint: &'static str },
}

/// What [`init`] found, cached for the life of the process.
#[derive(Debug, Clone)]
enum InitState {
    Ready { version: i32 },
    Failed { reason: String, hint: String },
}

fn load_state() -> &'static LoadState {
    static STATE: OnceLock<LoadState> = OnceLock::new();
    STATE.get_or_init(|| {
        // SAFETY: is_culib_present only tries to dlopen the candidate names and closes them again.
        if !unsafe { sys::is_culib_present() } {
            return LoadState::Failed {
                reason: "libcuda.so (the CUDA driver library) was not found by the dynamic loader"
                    .into(),
                hint: HINT_NO_LIBCUDA,
            };
        }
        if let Some(missing) = REQUIRED_SYMBOLS.iter().find(|s| !has_symbol_unchecked(s)) {
            return LoadState::Failed {
                reason: format!(
                    "libcuda does not export {missing} (driver too old, or not a real libcuda)"
                ),
                hint: "install an NVIDIA driver for CUDA 11.2 or newer",
            };
        }
        let mut version = 0;
        // SAFETY: the library and the symbol are present (checked above); valid out-pointer.
        let rc = unsafe { sys::cuDriverGetVersion(&mut version) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return LoadState::Failed {
                reason: format!("cuDriverGetVersion failed: {}", result_name(rc)),
                hint: "reinstall the NVIDIA driver: its libcuda does not answer",
            };
        }
        if version < MIN_DRIVER_VERSION {
            return LoadState::Failed {
                reason: format!(
                    "CUDA driver {} is older than the {} gdr needs",
                    version_text(version),
                    version_text(MIN_DRIVER_VERSION)
                ),
                hint: "upgrade the NVIDIA driver (CUDA 11.7 or newer also enables dma-buf, see \
                       gdr::gpu_mr::rules)",
            };
        }
        LoadState::Loaded { version }
    })
}

/// `true` if the loaded libcuda exports `name`. Only call after `is_culib_present()` was `true`.
fn has_symbol_unchecked(name: &str) -> bool {
    // SAFETY: callers checked is_culib_present(), so culib() finds the library instead of
    // panicking; looking up a symbol as an untyped function pointer does not call it.
    unsafe {
        sys::culib()
            .get::<unsafe extern "C" fn()>(name.as_bytes())
            .is_ok()
    }
}

/// `true` if the driver is loaded and exports `name` (for symbols only newer drivers have).
pub(crate) fn has_symbol(name: &str) -> bool {
    matches!(load_state(), LoadState::Loaded { .. }) && has_symbol_unchecked(name)
}

/// Loads libcuda and checks its version without initialising it.
fn load() -> Result<i32> {
    match load_state() {
        LoadState::Loaded { version } => Ok(*version),
        LoadState::Failed { reason, hint } => Err(Error::CudaUnavailable {
            reason: reason.clone(),
            hint: Hint::new(*hint),
        }),
    }
}

/// Loads and initialises the driver once per process (`cuInit(0)`), or says why it cannot be
/// used. Every entry point of this module but [`driver_version`] calls it first.
pub(crate) fn init() -> Result<i32> {
    static STATE: OnceLock<InitState> = OnceLock::new();
    let state = STATE.get_or_init(|| {
        let version = match load() {
            Ok(v) => v,
            Err(e) => {
                let hint = e.hint().unwrap_or_default().to_string();
                let reason = match e {
                    Error::CudaUnavailable { reason, .. } => reason,
                    other => other.to_string(),
                };
                return InitState::Failed { reason, hint };
            }
        };
        // SAFETY: libcuda is loaded and exports cuInit (checked by load()).
        let rc = unsafe { sys::cuInit(0) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            let hint = match rc {
                sys::CUresult::CUDA_ERROR_NO_DEVICE => {
                    "no CUDA GPU is visible: check nvidia-smi, CUDA_VISIBLE_DEVICES and that the \
                     nvidia kernel module is loaded"
                }
                sys::CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => {
                    "the user-space libcuda is newer than the kernel module: reboot or reload \
                     the nvidia module after a driver upgrade"
                }
                _ => "check dmesg and nvidia-smi: the driver could not start",
            };
            return InitState::Failed {
                reason: format!("cuInit(0) failed: {} ({})", result_name(rc), rc as i32),
                hint: hint.to_string(),
            };
        }
        InitState::Ready { version }
    });
    match state {
        InitState::Ready { version } => Ok(*version),
        InitState::Failed { reason, hint } => Err(Error::CudaUnavailable {
            reason: reason.clone(),
            hint: if hint.is_empty() {
                Hint::NONE
            } else {
                Hint::new(hint.clone())
            },
        }),
    }
}

/// The CUDA driver's version as `cuDriverGetVersion` reports it: 1000 x major + 10 x minor
/// (13000 is CUDA 13.0). Needs libcuda but no GPU.
///
/// # Errors
/// [`Error::CudaUnavailable`] when libcuda is absent, lacks a symbol gdr needs, or is older than
/// [`MIN_DRIVER_VERSION`].
pub fn driver_version() -> Result<i32> {
    load()
}

/// `13000` -> `"13.0"`, `12020` -> `"12.2"`.
pub fn version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// The `CUresult` name, e.g. `CUDA_ERROR_INVALID_VALUE`. Only valid once libcuda is loaded.
pub(crate) fn result_name(rc: sys::CUresult) -> String {
    let mut p: *const libc::c_char = std::ptr::null();
    // SAFETY: callers have a loaded libcuda (they just got `rc` from it); cuGetErrorName writes a
    // pointer to a static NUL-terminated string or leaves it untouched on failure.
    let ok = unsafe { sys::cuGetErrorName(rc, &mut p) } == sys::CUresult::CUDA_SUCCESS;
    if ok && !p.is_null() {
        // SAFETY: the driver returned a static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    } else {
        format!("{rc:?}")
    }
}

/// Turns a `CUresult` into `Ok(())` or an [`Error::Cuda`] naming the call and its arguments.
pub(crate) fn check(
    rc: sys::CUresult,
    call: &'static str,
    args: impl FnOnce() -> String,
    hint: impl FnOnce(sys::CUresult) -> Hint,
) -> Result<()> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(Error::Cuda {
        call,
        args: args(),
        result: rc,
        name: result_name(rc),
        hint: hint(rc),
    })
}

/// No hint: for `check` calls where the error text says enough.
pub(crate) fn no_hint(_: sys::CUresult) -> Hint {
    Hint::NONE
}

/// One CUDA GPU as the driver reports it, with the attributes that decide GPUDirect RDMA. (The
/// RDMA side's counterpart is [`crate::device::DeviceInfo`].)
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GpuInfo {
    /// The CUDA device ordinal (as `CUDA_VISIBLE_DEVICES` renumbers them).
    pub ordinal: i32,
    /// The marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// The PCI address in lowercase sysfs form, e.g. `0000:00:06.0`.
    pub pci_bus_id: String,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// Compute capability major number (9 for Hopper).
    pub compute_capability_major: i32,
    /// Compute capability minor number.
    pub compute_capability_minor: i32,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`: a NIC may read and write this GPU's memory.
    pub gpu_direct_rdma_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`: `cuMemGetHandleForAddressRange` can export dma-buf
    /// file descriptors (needs the open kernel module).
    pub dma_buf_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`: memory from `cuMemCreate`
    /// can be registered too.
    pub gpu_direct_rdma_with_vmm_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS`: bit mask of
    /// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST` (1) and `..._MEMOPS` (2).
    pub flush_writes_options: i32,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING`: 0 none, 100 owner, 200 all devices.
    /// Below 100 a consumer must flush RDMA-written data before a kernel reads it.
    pub writes_ordering: i32,
    /// `CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING`: device pointers are unique process addresses.
    pub unified_addressing: bool,
    /// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`: `cuMemAllocAsync` works on this device.
    pub memory_pools_supported: bool,
}

impl GpuInfo {
    /// `true` when RDMA writes into this GPU need a flush before a kernel consumes them
    /// (`writes_ordering` below `CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER`, 100).
    pub fn needs_flush(&self) -> bool {
        self.writes_ordering < 100
    }
}

/// The number of CUDA devices.
///
/// # Errors
/// [`Error::CudaUnavailable`] without a usable driver; [`Error::Cuda`] if the count fails.
pub fn device_count() -> Result<i32> {
    init()?;
    let mut n = 0;
    // SAFETY: the driver is initialised and exports cuDeviceGetCount; `n` is a valid out-pointer.
    let rc = unsafe { sys::cuDeviceGetCount(&mut n) };
    check(rc, "cuDeviceGetCount", String::new, no_hint)?;
    Ok(n)
}

/// The `CUdevice` handle of `ordinal`, or an error that lists how many devices exist.
pub(crate) fn device_handle(ordinal: i32) -> Result<sys::CUdevice> {
    let count = device_count()?;
    if ordinal < 0 || ordinal >= count {
        return Err(Error::invalid(
            format!("CUDA device ordinal {ordinal} does not exist ({count} device(s) visible)"),
            "pick an ordinal below the count `nvidia-smi -L` shows; CUDA_VISIBLE_DEVICES renumbers them",
        ));
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: initialised driver; `dev` is a valid out-pointer; ordinal is in range.
    let rc = unsafe { sys::cuDeviceGet(&mut dev, ordinal) };
    check(rc, "cuDeviceGet", || format!("ordinal={ordinal}"), no_hint)?;
    Ok(dev)
}

/// Reads one integer device attribute. Attributes newer than the driver read as `None`.
fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<Option<i32>> {
    let mut v = 0;
    // SAFETY: initialised driver; `v` is a valid out-pointer; `dev` came from cuDeviceGet.
    let rc = unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) };
    if rc == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
        return Ok(None);
    }
    check(
        rc,
        "cuDeviceGetAttribute",
        || format!("attrib={attr:?}, dev={dev}"),
        no_hint,
    )?;
    Ok(Some(v))
}

/// Normalises `cuDeviceGetPCIBusId` output (`0000:00:06.0` or `00000000:00:06.0`) to the
/// lowercase four-digit-domain form sysfs uses.
pub fn normalize_pci_bus_id(raw: &str) -> String {
    let raw = raw.trim().trim_end_matches('\0').to_ascii_lowercase();
    match raw.split_once(':') {
        Some((domain, rest)) => match u32::from_str_radix(domain, 16) {
            Ok(d) => format!("{d:04x}:{rest}"),
            Err(_) => raw,
        },
        None => raw,
    }
}

/// Reads everything [`GpuInfo`] holds for one ordinal.
///
/// # Errors
/// [`Error::CudaUnavailable`] without a usable driver, [`Error::InvalidArgument`] for an ordinal
/// that does not exist, [`Error::Cuda`] when a query fails.
pub fn device_info(ordinal: i32) -> Result<GpuInfo> {
    use sys::CUdevice_attribute as A;
    let dev = device_handle(ordinal)?;

    let mut name = [0 as libc::c_char; 256];
    // SAFETY: the buffer is 256 bytes and we pass its length; the driver NUL-terminates.
    let rc = unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev) };
    check(rc, "cuDeviceGetName", || format!("dev={dev}"), no_hint)?;
    // SAFETY: NUL-terminated by the driver within the zero-initialised buffer.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();

    let mut bus = [0 as libc::c_char; 64];
    // SAFETY: as above; 64 bytes is more than the 13 the id needs.
    let rc = unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) };
    check(rc, "cuDeviceGetPCIBusId", || format!("dev={dev}"), no_hint)?;
    // SAFETY: NUL-terminated by the driver within the zero-initialised buffer.
    let bus = unsafe { CStr::from_ptr(bus.as_ptr()) }.to_string_lossy();

    let mut total: usize = 0;
    // SAFETY: initialised driver; valid out-pointer.
    let rc = unsafe { sys::cuDeviceTotalMem_v2(&mut total, dev) };
    check(rc, "cuDeviceTotalMem", || format!("dev={dev}"), no_hint)?;

    let get = |a| attribute(dev, a).map(|v| v.unwrap_or(0));
    Ok(GpuInfo {
        ordinal,
        name,
        pci_bus_id: normalize_pci_bus_id(&bus),
        total_memory: total as u64,
        compute_capability_major: get(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        compute_capability_minor: get(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        gpu_direct_rdma_supported: get(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)? != 0,
        dma_buf_supported: get(A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)? != 0,
        gpu_direct_rdma_with_vmm_supported: get(
            A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
        )? != 0,
        flush_writes_options: get(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS)?,
        writes_ordering: get(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING)?,
        unified_addressing: get(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? != 0,
        memory_pools_supported: get(A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0,
    })
}

/// Every CUDA device with its GPUDirect attributes, in ordinal order.
///
/// # Errors
/// [`Error::CudaUnavailable`] when libcuda is absent or too old, or `cuInit` fails (for example
/// `CUDA_ERROR_NO_DEVICE`); [`Error::Cuda`] when a query fails.
pub fn devices() -> Result<Vec<GpuInfo>> {
    (0..device_count()?).map(device_info).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_bus_id_is_normalised() {
        assert_eq!(normalize_pci_bus_id("0000:00:06.0"), "0000:00:06.0");
        assert_eq!(normalize_pci_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(normalize_pci_bus_id("0001:AF:00.1\0"), "0001:af:00.1");
    }

    #[test]
    fn version_text_formats_major_minor() {
        assert_eq!(version_text(13000), "13.0");
        assert_eq!(version_text(12020), "12.2");
        assert_eq!(version_text(11070), "11.7");
    }
}
