//! Step 5 of registration: which path to take ([`choose_path`]), a pure function of the recorded
//! inputs ([`PathInputs`]) read against [`super::rules`], and the hints for failed registration
//! calls ([`registration_error`]).

use std::fmt;

use super::rules::{
    self, DmaBufBlocker, DmaBufFacts, GpuDmaBuf, NicDmaBuf, PeerMemory, SystemFacts,
    HINT_KERNEL_NO_DMA_BUF, HINT_NIC_NO_DMA_BUF, HINT_PEER_MEMORY,
};
use crate::cuda::GpuInfo;
use crate::error::{Error, Hint, Result};

/// How GPU memory is (or should be) registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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

/// The recorded inputs of the path decision: everything [`choose_path`] looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PathInputs {
    /// `cuDriverGetVersion`.
    pub driver_version: i32,
    /// Whether libcuda exports `cuMemGetHandleForAddressRange`.
    pub driver_exports_dma_buf: bool,
    /// The GPU that owns the memory.
    pub gpu: GpuInfo,
    /// The host's kernel modules, memory peers, NVIDIA module and kernel release.
    pub system: SystemFacts,
    /// The RDMA device's name.
    pub nic: String,
    /// The NIC's dma-buf probe.
    pub nic_dma_buf: NicDmaBuf,
}

impl PathInputs {
    /// The facts the dma-buf rule reads, for this GPU and NIC.
    pub fn dma_buf_facts(&self) -> DmaBufFacts<'_> {
        DmaBufFacts {
            system: &self.system,
            driver_version: Some(self.driver_version),
            driver_exports_dma_buf: Some(self.driver_exports_dma_buf),
            gpus: vec![GpuDmaBuf {
                ordinal: Some(self.gpu.ordinal),
                bdf: self.gpu.pci_bus_id.clone(),
                dma_buf_supported: Some(self.gpu.dma_buf_supported),
            }],
            nic: Some((&self.nic, self.nic_dma_buf)),
        }
    }

    /// Why the dma-buf path cannot be used (empty if it can), by [`rules::dma_buf_readiness`].
    /// Facts that could not be read (an unreadable `/proc/driver/nvidia/version`) block nothing:
    /// the driver and the NIC have the last word.
    pub fn dma_buf_blockers(&self) -> Vec<DmaBufBlocker> {
        rules::dma_buf_readiness(&self.dma_buf_facts()).blockers
    }

    /// Why the dma-buf path cannot be used, with its hint; `None` if it can. Several reasons are
    /// joined with `; `, the hint is the first one's.
    pub fn dma_buf_blocker(&self) -> Option<(String, &'static str)> {
        let blockers = self.dma_buf_blockers();
        let first = blockers.first()?;
        let what = blockers
            .iter()
            .map(DmaBufBlocker::what)
            .collect::<Vec<_>>()
            .join("; ");
        Some((what, first.hint()))
    }

    /// The peer-memory rule applied to [`system`](Self::system).
    pub fn peer_memory(&self) -> PeerMemory {
        self.system.peer_memory()
    }
}

/// Decides how to register GPU memory, from recorded inputs only (no I/O): the requested path if
/// it can work, or for [`RegistrationPath::Auto`] dma-buf first, then peer memory. Never returns
/// `Auto`. The rules are those of [`super::rules`], which the doctor (`gdr-doctor`) applies too.
///
/// # Errors
/// [`Error::Unsupported`] naming what is missing, with the fix as hint: no GPUDirect on the GPU,
/// the dma-buf blockers (kernel module, kernel, driver, GPU, rdma-core/NIC), or no peer-memory
/// module.
pub fn choose_path(inputs: &PathInputs, requested: RegistrationPath) -> Result<RegistrationPath> {
    let gpu = &inputs.gpu;
    if let Some(hint) = rules::gpudirect_blocked(Some(gpu.gpu_direct_rdma_supported)) {
        return Err(Error::unsupported(
            format!(
                "GPUDirect RDMA on GPU {} ({}, {})",
                gpu.ordinal, gpu.name, gpu.pci_bus_id
            ),
            hint,
        ));
    }
    let blocker = inputs.dma_buf_blocker();
    let peer = inputs.peer_memory().present();
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
                        rules::no_peer_memory_text()
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
                    rules::no_peer_memory_text()
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
