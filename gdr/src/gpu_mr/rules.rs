//! The GPUDirect RDMA rules, in one place: which driver, kernel, kernel module and NIC support
//! each registration path needs, and how a host's facts are read against them.
//!
//! Both [`super::choose_path`] (at registration) and the `gdr-doctor` crate (on a recorded
//! host) decide with the functions here, from the same facts read by the same reader
//! ([`super::facts::FactReader`]), so the doctor cannot promise a path that registration
//! refuses, nor refuse one that registration takes:
//!
//! * **peer memory** ([`SystemFacts::peer_memory`]): a module of [`PEER_MEMORY_MODULES`] is
//!   loaded, or a client of [`PEER_MEMORY_CLIENTS`] is registered under
//!   `/sys/kernel/mm/memory_peers` (what NCCL checks);
//! * **dma-buf** ([`dma_buf_readiness`]): the NVIDIA open kernel module, Linux >=
//!   [`DMA_BUF_MIN_KERNEL`], a CUDA driver >= [`DMA_BUF_MIN_DRIVER_VERSION`] that exports
//!   `cuMemGetHandleForAddressRange`, `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 1` on the GPU, and
//!   a NIC whose rdma-core provider and kernel import dma-bufs ([`NicDmaBuf`]).
//!
//! A fact that could not be read is *unknown*: it never blocks registration (the driver and the
//! NIC have the last word there), and it makes the doctor say "unknown", never "ok".
//!
//! ```
//! use gdr::gpu_mr::rules::{dma_buf_readiness, DmaBufFacts, GpuDmaBuf, Readiness, SystemFacts};
//! let system = SystemFacts {
//!     modules: vec!["nvidia".into()],
//!     memory_peers: vec![],
//!     nvidia_version: Some("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04".into()),
//!     kernel_release: Some("5.10.0-28-amd64".into()),
//! };
//! assert!(!system.peer_memory().present());
//! let facts = DmaBufFacts {
//!     system: &system,
//!     driver_version: Some(13000),
//!     driver_exports_dma_buf: Some(true),
//!     gpus: vec![GpuDmaBuf { ordinal: Some(0), bdf: "0000:00:06.0".into(), dma_buf_supported: Some(true) }],
//!     nic: None,
//! };
//! let r = dma_buf_readiness(&facts);
//! assert_eq!(r.state(), Readiness::Blocked);
//! assert_eq!(r.blockers[0].requirement(), "Linux >= 5.12");
//! ```

use std::fmt;

use crate::error::errno_text;

/// The first CUDA driver with `cuMemGetHandleForAddressRange` (dma-buf export), in
/// `cuDriverGetVersion` form: 11.7.
pub const DMA_BUF_MIN_DRIVER_VERSION: i32 = 11070;

/// The first Linux release whose RDMA stack imports dma-bufs (`ib_umem_dmabuf`): 5.12.
pub const DMA_BUF_MIN_KERNEL: (u32, u32) = (5, 12);

/// The first NVIDIA driver branch with the open kernel module, which alone exports dma-bufs: 515.
pub const OPEN_MODULE_MIN_DRIVER: u32 = 515;

/// The first rdma-core release with `ibv_reg_dmabuf_mr`: 34.
pub const RDMA_CORE_MIN_DMA_BUF: u32 = 34;

/// Kernel modules that give `ibv_reg_mr` access to GPU memory (peer memory), as listed in
/// `/proc/modules`.
pub const PEER_MEMORY_MODULES: &[&str] = &["nvidia_peermem", "nv_peer_mem"];

/// Peer-memory clients registered with MLNX_OFED's peer-memory core, as entries of
/// `/sys/kernel/mm/memory_peers`.
pub const PEER_MEMORY_CLIENTS: &[&str] = &["nv_mem", "nv_mem_nc"];

/// Hint when device memory cannot be pinned by the NIC (`EFAULT`) or no path exists.
pub const HINT_PEER_MEMORY: &str =
    "load nvidia_peermem (`modprobe nvidia_peermem`) or use dma-buf \
     (open kernel module >= 515, CUDA >= 11.7, kernel >= 5.12)";
/// Hint when the NIC's user-space stack cannot import dma-bufs (`EOPNOTSUPP`).
pub const HINT_NIC_NO_DMA_BUF: &str = "rdma-core/OFED lacks dma-buf: upgrade rdma-core (>= 34) or \
     MLNX_OFED, use a NIC whose provider imports dma-bufs, or load nvidia_peermem";
/// Hint when the kernel's RDMA stack cannot import dma-bufs (`EPROTONOSUPPORT`, or a release
/// older than [`DMA_BUF_MIN_KERNEL`]).
pub const HINT_KERNEL_NO_DMA_BUF: &str =
    "kernel < 5.12: its RDMA stack cannot import dma-bufs; upgrade the kernel or load nvidia_peermem";
/// Hint when the GPU reports `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0` or the proprietary
/// kernel module is loaded.
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

/// `"11.7"` for 11070.
fn version_text(v: i32) -> String {
    crate::cuda::version_text(v)
}

/// `(major, minor)` of a kernel release like `5.15.0-91-generic`; `None` if it does not start
/// with two numbers.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether the first line of `/proc/driver/nvidia/version` names the open kernel module (the
/// proprietary one says `NVIDIA UNIX x86_64 Kernel Module`).
pub fn is_open_kernel_module(version_line: &str) -> bool {
    version_line.contains("Open Kernel Module")
}

/// Host-wide facts that the paths depend on, as read from `/proc` and `/sys` (live:
/// [`SystemFacts::probe`]) or taken from a recorded host (a doctor snapshot).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SystemFacts {
    /// Loaded kernel modules (`/proc/modules`, else the entries of `/sys/module`).
    pub modules: Vec<String>,
    /// Entries of `/sys/kernel/mm/memory_peers` (MLNX_OFED's peer-memory clients).
    pub memory_peers: Vec<String>,
    /// The first line of `/proc/driver/nvidia/version`; `None`: not readable (unknown).
    pub nvidia_version: Option<String>,
    /// `/proc/sys/kernel/osrelease`; `None`: not readable (unknown).
    pub kernel_release: Option<String>,
}

impl SystemFacts {
    /// The facts of the machine whose `/proc` and `/sys` lie below `root` (`/` for this one),
    /// read by [`super::facts::FactReader`], the reader `gdr-doctor`'s snapshots are read with.
    pub fn probe(root: &std::path::Path) -> Self {
        super::facts::FactReader::new(root).system_facts()
    }

    /// Whether a peer-memory module or client is there, and which.
    pub fn peer_memory(&self) -> PeerMemory {
        let module = PEER_MEMORY_MODULES
            .iter()
            .find(|m| self.modules.iter().any(|l| l == *m))
            .map(|m| format!("kernel module {m}"));
        let client = || {
            PEER_MEMORY_CLIENTS
                .iter()
                .find(|c| self.memory_peers.iter().any(|p| p == *c))
                .map(|c| format!("memory peer {c}"))
        };
        PeerMemory {
            found: module.or_else(client),
        }
    }

    /// Whether the NVIDIA open kernel module is loaded (`None`: no version line to tell).
    pub fn open_kernel_module(&self) -> Option<bool> {
        self.nvidia_version.as_deref().map(is_open_kernel_module)
    }
}

/// Whether a peer-memory module is loaded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PeerMemory {
    /// What was found (`kernel module nvidia_peermem`, `memory peer nv_mem`), if anything.
    pub found: Option<String>,
}

impl PeerMemory {
    /// `true` if a peer-memory module is loaded.
    pub fn present(&self) -> bool {
        self.found.is_some()
    }
}

/// The sentence for "no peer memory", naming everything that was looked for.
pub fn no_peer_memory_text() -> String {
    format!(
        "no peer-memory module is loaded (no {} in /proc/modules, no {} in /sys/kernel/mm/memory_peers)",
        PEER_MEMORY_MODULES.join(" or "),
        PEER_MEMORY_CLIENTS.join(" or ")
    )
}

/// What the per-NIC dma-buf probe found (`ibv_reg_dmabuf_mr` with fd -1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum NicDmaBuf {
    /// The NIC imports dma-bufs (the probe with fd -1 failed with `EBADF`).
    Supported,
    /// The user-space provider or rdma-core lacks dma-buf (`EOPNOTSUPP`; also where libibverbs
    /// is older than rdma-core 34 and has no `ibv_reg_dmabuf_mr`).
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

/// One GPU as the dma-buf rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDmaBuf {
    /// The CUDA ordinal, when known.
    pub ordinal: Option<i32>,
    /// The PCI address, e.g. `0000:00:06.0`.
    pub bdf: String,
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (`None`: not read).
    pub dma_buf_supported: Option<bool>,
}

/// The inputs of [`dma_buf_readiness`].
#[derive(Debug, Clone)]
pub struct DmaBufFacts<'a> {
    /// Host facts (kernel module, kernel release).
    pub system: &'a SystemFacts,
    /// `cuDriverGetVersion` (`None`: unknown).
    pub driver_version: Option<i32>,
    /// Whether libcuda exports `cuMemGetHandleForAddressRange` (`None`: not checked; a driver of
    /// at least [`DMA_BUF_MIN_DRIVER_VERSION`] does).
    pub driver_exports_dma_buf: Option<bool>,
    /// The GPUs the memory may live on (one at registration, every GPU for the doctor's host
    /// finding).
    pub gpus: Vec<GpuDmaBuf>,
    /// The RDMA device and its probe, when one was probed.
    pub nic: Option<(&'a str, NicDmaBuf)>,
}

/// One reason why dma-buf registration cannot work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DmaBufBlocker {
    /// The proprietary NVIDIA kernel module is loaded: it exports no dma-bufs.
    ProprietaryModule,
    /// Linux older than [`DMA_BUF_MIN_KERNEL`].
    OldKernel {
        /// The kernel release.
        release: String,
    },
    /// A CUDA driver older than [`DMA_BUF_MIN_DRIVER_VERSION`].
    OldDriver {
        /// `cuDriverGetVersion`.
        version: i32,
    },
    /// The driver is new enough by number but does not export `cuMemGetHandleForAddressRange`.
    DriverLacksExport {
        /// `cuDriverGetVersion`.
        version: i32,
    },
    /// The GPU reports `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0`.
    GpuLacksDmaBuf {
        /// CUDA ordinal, when known.
        ordinal: Option<i32>,
        /// PCI address.
        bdf: String,
    },
    /// The NIC's probe says it cannot import dma-bufs.
    NicCannotImport {
        /// RDMA device name.
        nic: String,
        /// What the probe found (never [`NicDmaBuf::Supported`]).
        probe: NicDmaBuf,
    },
}

impl DmaBufBlocker {
    /// The sentence registration errors carry, e.g. `CUDA driver 11.4 cannot export dma-bufs
    /// (needs 11.7)`.
    pub fn what(&self) -> String {
        match self {
            DmaBufBlocker::ProprietaryModule => {
                "the proprietary NVIDIA kernel module is loaded (/proc/driver/nvidia/version): only \
                 the open kernel module exports dma-bufs"
                    .to_string()
            }
            DmaBufBlocker::OldKernel { release } => format!(
                "kernel {release} is older than {}.{}: its RDMA stack cannot import dma-bufs",
                DMA_BUF_MIN_KERNEL.0, DMA_BUF_MIN_KERNEL.1
            ),
            DmaBufBlocker::OldDriver { version } | DmaBufBlocker::DriverLacksExport { version } => {
                format!(
                    "CUDA driver {} cannot export dma-bufs (needs {})",
                    version_text(*version),
                    version_text(DMA_BUF_MIN_DRIVER_VERSION)
                )
            }
            DmaBufBlocker::GpuLacksDmaBuf { ordinal, bdf } => match ordinal {
                Some(o) => format!("GPU {o} ({bdf}) reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0"),
                None => format!("GPU {bdf} reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0"),
            },
            DmaBufBlocker::NicCannotImport { nic, probe } => match probe {
                NicDmaBuf::NoKernelSupport => format!(
                    "the kernel cannot import dma-bufs into RDMA device {nic} (ibv_reg_dmabuf_mr: {}, EPROTONOSUPPORT)",
                    errno_text(libc::EPROTONOSUPPORT)
                ),
                NicDmaBuf::Unknown { errno } => format!(
                    "dma-buf probe on RDMA device {nic} failed: {} (errno {errno})",
                    errno_text(*errno)
                ),
                NicDmaBuf::NoProviderSupport | NicDmaBuf::Supported => format!(
                    "RDMA device {nic} cannot import dma-bufs (ibv_reg_dmabuf_mr: {}, EOPNOTSUPP)",
                    errno_text(libc::EOPNOTSUPP)
                ),
            },
        }
    }

    /// What is needed instead, as the doctor lists it, e.g. `Linux >= 5.12`.
    pub fn requirement(&self) -> String {
        match self {
            DmaBufBlocker::ProprietaryModule => {
                format!("the NVIDIA open kernel module (>= {OPEN_MODULE_MIN_DRIVER})")
            }
            DmaBufBlocker::OldKernel { .. } => {
                format!("Linux >= {}.{}", DMA_BUF_MIN_KERNEL.0, DMA_BUF_MIN_KERNEL.1)
            }
            DmaBufBlocker::OldDriver { .. } | DmaBufBlocker::DriverLacksExport { .. } => format!(
                "CUDA driver >= {}",
                version_text(DMA_BUF_MIN_DRIVER_VERSION)
            ),
            DmaBufBlocker::GpuLacksDmaBuf { bdf, .. } => format!("DMA_BUF_SUPPORTED on {bdf}"),
            DmaBufBlocker::NicCannotImport { nic, probe } => match probe {
                NicDmaBuf::NoKernelSupport => format!(
                    "a kernel that imports dma-bufs into {nic} (Linux >= {}.{})",
                    DMA_BUF_MIN_KERNEL.0, DMA_BUF_MIN_KERNEL.1
                ),
                _ => format!("dma-buf import on {nic} (rdma-core >= {RDMA_CORE_MIN_DMA_BUF})"),
            },
        }
    }

    /// The fix.
    pub fn hint(&self) -> &'static str {
        match self {
            DmaBufBlocker::ProprietaryModule | DmaBufBlocker::GpuLacksDmaBuf { .. } => {
                HINT_GPU_NO_DMA_BUF
            }
            DmaBufBlocker::OldKernel { .. } => HINT_KERNEL_NO_DMA_BUF,
            DmaBufBlocker::OldDriver { .. } | DmaBufBlocker::DriverLacksExport { .. } => {
                HINT_DRIVER_NO_DMA_BUF
            }
            DmaBufBlocker::NicCannotImport { probe, .. } => match probe {
                NicDmaBuf::NoKernelSupport => HINT_KERNEL_NO_DMA_BUF,
                _ => HINT_NIC_NO_DMA_BUF,
            },
        }
    }
}

impl fmt::Display for DmaBufBlocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what())
    }
}

/// A fact the dma-buf rule needed but did not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownFact {
    /// `/proc/driver/nvidia/version` was not read.
    NvidiaModule,
    /// The kernel release was not read or not understood.
    KernelRelease,
    /// The CUDA driver version was not read.
    DriverVersion,
    /// A GPU's `DMA_BUF_SUPPORTED` attribute was not read.
    GpuAttribute,
}

/// [`dma_buf_readiness`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmaBufReadiness {
    /// Why dma-buf cannot work, in the order: kernel module, kernel, driver, GPUs, NIC.
    pub blockers: Vec<DmaBufBlocker>,
    /// What could not be checked.
    pub unknown: Vec<UnknownFact>,
}

/// The overall answer of [`DmaBufReadiness::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Every prerequisite is met.
    Ready,
    /// At least one prerequisite is missing.
    Blocked,
    /// Nothing is known to be missing, but something could not be checked.
    Unknown,
}

impl DmaBufReadiness {
    /// Blocked when anything blocks, else Unknown when anything is unknown, else Ready.
    pub fn state(&self) -> Readiness {
        if !self.blockers.is_empty() {
            Readiness::Blocked
        } else if !self.unknown.is_empty() {
            Readiness::Unknown
        } else {
            Readiness::Ready
        }
    }
}

/// Reads the facts against the dma-buf prerequisites.
pub fn dma_buf_readiness(f: &DmaBufFacts<'_>) -> DmaBufReadiness {
    let mut blockers = Vec::new();
    let mut unknown = Vec::new();
    match f.system.open_kernel_module() {
        Some(true) => {}
        Some(false) => blockers.push(DmaBufBlocker::ProprietaryModule),
        None => unknown.push(UnknownFact::NvidiaModule),
    }
    match f.system.kernel_release.as_deref() {
        Some(r) => match kernel_version(r) {
            Some(v) if v >= DMA_BUF_MIN_KERNEL => {}
            Some(_) => blockers.push(DmaBufBlocker::OldKernel {
                release: r.to_string(),
            }),
            None => unknown.push(UnknownFact::KernelRelease),
        },
        None => unknown.push(UnknownFact::KernelRelease),
    }
    match f.driver_version {
        Some(v) if v < DMA_BUF_MIN_DRIVER_VERSION => {
            blockers.push(DmaBufBlocker::OldDriver { version: v })
        }
        Some(v) if f.driver_exports_dma_buf == Some(false) => {
            blockers.push(DmaBufBlocker::DriverLacksExport { version: v })
        }
        Some(_) => {}
        None => unknown.push(UnknownFact::DriverVersion),
    }
    for g in &f.gpus {
        match g.dma_buf_supported {
            Some(true) => {}
            Some(false) => blockers.push(DmaBufBlocker::GpuLacksDmaBuf {
                ordinal: g.ordinal,
                bdf: g.bdf.clone(),
            }),
            None => {
                if !unknown.contains(&UnknownFact::GpuAttribute) {
                    unknown.push(UnknownFact::GpuAttribute)
                }
            }
        }
    }
    if let Some((nic, probe)) = f.nic {
        if probe != NicDmaBuf::Supported {
            blockers.push(DmaBufBlocker::NicCannotImport {
                nic: nic.to_string(),
                probe,
            });
        }
    }
    DmaBufReadiness { blockers, unknown }
}

/// Why GPUDirect RDMA is impossible on a GPU whatever the path: `Some(false)` of
/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` blocks, `None` is unknown.
pub fn gpudirect_blocked(gpu_direct_rdma_supported: Option<bool>) -> Option<&'static str> {
    (gpu_direct_rdma_supported == Some(false)).then_some(HINT_NO_GPUDIRECT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200_system() -> SystemFacts {
        SystemFacts {
            modules: vec!["nvidia".into(), "nvidia_uvm".into()],
            memory_peers: vec![],
            nvidia_version: Some(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build"
                    .into(),
            ),
            kernel_release: Some("6.18.44-fc-v657-gpu".into()),
        }
    }

    fn facts(system: &SystemFacts) -> DmaBufFacts<'_> {
        DmaBufFacts {
            system,
            driver_version: Some(13000),
            driver_exports_dma_buf: Some(true),
            gpus: vec![GpuDmaBuf {
                ordinal: Some(0),
                bdf: "0000:00:06.0".into(),
                dma_buf_supported: Some(true),
            }],
            nic: None,
        }
    }

    #[test]
    fn the_h200_machine_is_ready_and_has_no_peer_memory() {
        let s = h200_system();
        assert_eq!(dma_buf_readiness(&facts(&s)).state(), Readiness::Ready);
        assert_eq!(s.peer_memory(), PeerMemory { found: None });
    }

    #[test]
    fn peer_memory_is_a_module_or_a_client_by_exact_name() {
        let mut s = h200_system();
        s.modules.push("nvidia_peermem".into());
        assert_eq!(
            s.peer_memory().found.as_deref(),
            Some("kernel module nvidia_peermem")
        );
        let mut s = h200_system();
        s.memory_peers.push("nv_mem_nc".into());
        assert_eq!(
            s.peer_memory().found.as_deref(),
            Some("memory peer nv_mem_nc")
        );
        let mut s = h200_system();
        s.modules.push("nvidia_peermem_extra".into());
        s.memory_peers.push("nv_mem2".into());
        assert!(!s.peer_memory().present(), "names match exactly");
        let t = no_peer_memory_text();
        assert!(t.contains("nvidia_peermem or nv_peer_mem"), "{t}");
        assert!(t.contains("nv_mem or nv_mem_nc"), "{t}");
    }

    #[test]
    fn every_prerequisite_blocks_in_order() {
        let s = SystemFacts {
            nvidia_version: Some(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.57.02".into(),
            ),
            kernel_release: Some("5.4.0-42-generic".into()),
            ..SystemFacts::default()
        };
        let mut f = facts(&s);
        f.driver_version = Some(11040);
        f.gpus[0].dma_buf_supported = Some(false);
        f.nic = Some(("mlx5_0", NicDmaBuf::NoProviderSupport));
        let r = dma_buf_readiness(&f);
        assert_eq!(r.state(), Readiness::Blocked);
        let needs: Vec<String> = r.blockers.iter().map(|b| b.requirement()).collect();
        assert_eq!(
            needs,
            [
                "the NVIDIA open kernel module (>= 515)",
                "Linux >= 5.12",
                "CUDA driver >= 11.7",
                "DMA_BUF_SUPPORTED on 0000:00:06.0",
                "dma-buf import on mlx5_0 (rdma-core >= 34)"
            ]
        );
        let hints: Vec<&str> = r.blockers.iter().map(|b| b.hint()).collect();
        assert_eq!(
            hints,
            [
                HINT_GPU_NO_DMA_BUF,
                HINT_KERNEL_NO_DMA_BUF,
                HINT_DRIVER_NO_DMA_BUF,
                HINT_GPU_NO_DMA_BUF,
                HINT_NIC_NO_DMA_BUF
            ]
        );
        assert_eq!(
            r.blockers[2].what(),
            "CUDA driver 11.4 cannot export dma-bufs (needs 11.7)"
        );
    }

    #[test]
    fn the_export_symbol_and_the_nic_probe_block_too() {
        let s = h200_system();
        let mut f = facts(&s);
        f.driver_exports_dma_buf = Some(false);
        f.nic = Some(("rxe0", NicDmaBuf::NoKernelSupport));
        let r = dma_buf_readiness(&f);
        assert_eq!(
            r.blockers,
            [
                DmaBufBlocker::DriverLacksExport { version: 13000 },
                DmaBufBlocker::NicCannotImport {
                    nic: "rxe0".into(),
                    probe: NicDmaBuf::NoKernelSupport
                }
            ]
        );
        assert_eq!(r.blockers[1].hint(), HINT_KERNEL_NO_DMA_BUF);
        assert!(r.blockers[1].what().contains("EPROTONOSUPPORT"));
        f.nic = Some(("mlx5_0", NicDmaBuf::Supported));
        f.driver_exports_dma_buf = None;
        assert_eq!(dma_buf_readiness(&f).state(), Readiness::Ready);
    }

    #[test]
    fn missing_facts_are_unknown_never_ready() {
        let s = SystemFacts::default();
        let mut f = facts(&s);
        f.driver_version = None;
        f.gpus[0].dma_buf_supported = None;
        let r = dma_buf_readiness(&f);
        assert_eq!(r.state(), Readiness::Unknown);
        assert_eq!(
            r.unknown,
            [
                UnknownFact::NvidiaModule,
                UnknownFact::KernelRelease,
                UnknownFact::DriverVersion,
                UnknownFact::GpuAttribute
            ]
        );
        let s = SystemFacts {
            kernel_release: Some("garbage".into()),
            ..h200_system()
        };
        assert_eq!(
            dma_buf_readiness(&facts(&s)).unknown,
            [UnknownFact::KernelRelease]
        );
    }

    #[test]
    fn kernel_releases_parse() {
        assert_eq!(kernel_version("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(kernel_version("6.18.44-fc-v657-gpu"), Some((6, 18)));
        assert_eq!(kernel_version("5.12"), Some((5, 12)));
        assert_eq!(kernel_version("linux"), None);
        assert_eq!(kernel_version("99999999999.1"), None, "no overflow");
    }

    #[test]
    fn hints_quote_the_rule_constants() {
        let kernel = format!(
            "kernel >= {}.{}",
            DMA_BUF_MIN_KERNEL.0, DMA_BUF_MIN_KERNEL.1
        );
        let cuda = format!("CUDA >= {}", version_text(DMA_BUF_MIN_DRIVER_VERSION));
        let module = format!("open kernel module >= {OPEN_MODULE_MIN_DRIVER}");
        for part in [&kernel, &cuda, &module] {
            assert!(HINT_PEER_MEMORY.contains(part.as_str()), "{part}");
        }
        assert!(HINT_NIC_NO_DMA_BUF.contains(&format!("rdma-core (>= {RDMA_CORE_MIN_DMA_BUF})")));
        assert!(HINT_KERNEL_NO_DMA_BUF.starts_with(&format!(
            "kernel < {}.{}",
            DMA_BUF_MIN_KERNEL.0, DMA_BUF_MIN_KERNEL.1
        )));
        assert!(HINT_DRIVER_NO_DMA_BUF.starts_with(&format!(
            "CUDA driver < {}",
            version_text(DMA_BUF_MIN_DRIVER_VERSION)
        )));
        assert!(HINT_GPU_NO_DMA_BUF.contains(&format!("(>= {OPEN_MODULE_MIN_DRIVER})")));
    }
}
