//! A snapshot of everything on a host that decides whether GPUDirect RDMA works, and how fast.
//!
//! [`collect`] reads sysfs and procfs below a configurable root (normally `/`) into a
//! [`Snapshot`]; [`crate::diagnose`] turns a snapshot into findings without any I/O. A
//! snapshot is plain data (serde), so one machine can be captured (`gdr doctor dump`) and replayed
//! anywhere (`gdr doctor --snapshot FILE`).
//!
//! Reading a file that does not exist is not an error: the field is `None`. A file that exists
//! but cannot be read (permissions, I/O error) is recorded in [`Snapshot::read_errors`] with the
//! reason, so a verdict that depended on it can say "unknown" instead of guessing.

mod collect;
mod cuda;
pub mod pcie;

pub use collect::{collect, collect_with, CollectOptions};
pub use cuda::query_cuda;

use crate::error::{Error, Hint, Result};
use gdr::gpu_mr::rules::SystemFacts;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The version of the snapshot format written by this crate. [`Snapshot::from_json`] refuses
/// other versions with a typed error.
pub const SNAPSHOT_FORMAT: u32 = 1;

/// Environment variables that change how NCCL uses the NIC (every variable the doctor checks,
/// [`crate::NCCL_VARS`]), captured at collect time.
pub const NCCL_ENV_VARS: &[&str] = crate::NCCL_VARS;

/// Everything the doctor looks at, read from one machine at one time.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Format version, [`SNAPSHOT_FORMAT`] when written by this crate.
    pub format: u32,
    /// Free-form description: where and how it was collected (e.g. `collected from /`).
    #[serde(default)]
    pub source: String,
    /// Kernel release and command line.
    #[serde(default)]
    pub kernel: Kernel,
    /// Every PCI device of `/sys/bus/pci/devices`, sorted by address.
    #[serde(default)]
    pub pci: Vec<PciDevice>,
    /// IOMMU state.
    #[serde(default)]
    pub iommu: Iommu,
    /// Names of loaded kernel modules (sorted).
    #[serde(default)]
    pub modules: Vec<String>,
    /// Peer-memory clients registered with the kernel (`/sys/kernel/mm/memory_peers/*/version`).
    #[serde(default)]
    pub memory_peers: Vec<MemoryPeer>,
    /// The NVIDIA kernel driver, when `/proc/driver/nvidia` exists.
    #[serde(default)]
    pub nvidia: Option<NvidiaDriver>,
    /// RDMA devices of `/sys/class/infiniband`, sorted by name.
    #[serde(default)]
    pub rdma: Vec<RdmaDevice>,
    /// The locked-memory limit of the collecting process (`/proc/self/limits`).
    #[serde(default)]
    pub memlock: Option<MemlockLimit>,
    /// Signs that this is a virtual machine.
    #[serde(default)]
    pub hypervisor: Hypervisor,
    /// NCCL environment variables of the collecting process ([`NCCL_ENV_VARS`]) that were set.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// CUDA driver facts, when they were read through the CUDA driver API (`None`: unknown).
    #[serde(default)]
    pub cuda: Option<CudaInfo>,
    /// Files that exist but could not be read, with the reason.
    #[serde(default)]
    pub read_errors: Vec<ReadError>,
}

/// Kernel facts.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Kernel {
    /// `/proc/sys/kernel/osrelease`, e.g. `6.1.0-27-amd64`.
    pub release: Option<String>,
    /// `/proc/cmdline`.
    pub cmdline: Option<String>,
}

/// The configuration space of a PCI device as far as it could be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigSpace {
    /// How many bytes the read returned: 64 without root, 256 or 4096 with root.
    pub len: usize,
    /// The bytes in lowercase hex, trailing zero bytes left out (they are implied up to `len`).
    pub hex: String,
}

/// One PCI function.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PciDevice {
    /// Domain:bus:device.function, e.g. `0000:07:00.0`.
    pub bdf: String,
    /// The real sysfs path, e.g. `/sys/devices/pci0000:00/0000:00:01.0/0000:07:00.0`. Its
    /// components are the PCIe tree from the root complex down to this function.
    pub path: String,
    /// Class code (24 bits), e.g. `0x060400` for a PCI bridge.
    pub class: Option<u32>,
    /// Vendor id, e.g. `0x10de` (NVIDIA), `0x15b3` (Mellanox).
    pub vendor: Option<u16>,
    /// Device id.
    pub device: Option<u16>,
    /// NUMA node, `-1` when the platform does not say.
    pub numa_node: Option<i32>,
    /// `current_link_speed`, e.g. `16.0 GT/s PCIe`.
    pub current_link_speed: Option<String>,
    /// `max_link_speed`.
    pub max_link_speed: Option<String>,
    /// `current_link_width` (lanes).
    pub current_link_width: Option<u32>,
    /// `max_link_width` (lanes).
    pub max_link_width: Option<u32>,
    /// The bound driver, e.g. `nvidia`, `mlx5_core`, `pcieport`.
    pub driver: Option<String>,
    /// IOMMU group number.
    pub iommu_group: Option<u32>,
    /// Configuration space as read.
    pub config: Option<ConfigSpace>,
}

/// Class codes and vendor ids the doctor needs.
pub mod class {
    /// PCI-to-PCI bridge (root ports, switch ports).
    pub const BRIDGE_PCI: u32 = 0x0604;
    /// Host bridge.
    pub const BRIDGE_HOST: u32 = 0x0600;
    /// VGA display controller.
    pub const DISPLAY_VGA: u32 = 0x0300;
    /// 3D controller (data-centre GPUs).
    pub const DISPLAY_3D: u32 = 0x0302;
    /// NVIDIA's PCI vendor id.
    pub const VENDOR_NVIDIA: u16 = 0x10de;
    /// Mellanox / NVIDIA networking vendor id.
    pub const VENDOR_MELLANOX: u16 = 0x15b3;
}

impl PciDevice {
    /// Base class and subclass (the class code without the programming interface).
    pub fn class_code(&self) -> Option<u32> {
        self.class.map(|c| c >> 8)
    }

    /// Whether this is a PCI-to-PCI bridge (root port or switch port).
    pub fn is_bridge(&self) -> bool {
        self.class_code() == Some(class::BRIDGE_PCI)
    }

    /// Whether this is an NVIDIA display or 3D controller.
    pub fn is_nvidia_gpu(&self) -> bool {
        self.vendor == Some(class::VENDOR_NVIDIA)
            && matches!(
                self.class_code(),
                Some(class::DISPLAY_VGA) | Some(class::DISPLAY_3D)
            )
    }

    /// The configuration-space bytes (zero-padded to the length read), if any were read, the
    /// hex is well formed and the length is at most [`pcie::CONFIG_SPACE_MAX`] (a snapshot is
    /// input: a forged length must not make the doctor allocate without bound).
    pub fn config_bytes(&self) -> Option<Vec<u8>> {
        let c = self.config.as_ref()?;
        if c.len > pcie::CONFIG_SPACE_MAX {
            return None;
        }
        let mut bytes = pcie::hex_to_bytes(&c.hex)?;
        if bytes.len() > c.len {
            return None;
        }
        bytes.resize(c.len, 0);
        Some(bytes)
    }
}

/// IOMMU state.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Iommu {
    /// Entries of `/sys/class/iommu` (e.g. `dmar0`, `ivhd0`); empty: no IOMMU active.
    pub units: Vec<String>,
    /// `/sys/kernel/iommu_groups/<n>/type` per group that has one (`identity`, `DMA`, `DMA-FQ`,
    /// `blocked`, `unmanaged`).
    pub group_types: BTreeMap<u32, String>,
}

/// A peer-memory client (the old GPUDirect path: nvidia_peermem / nv_peer_mem).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPeer {
    /// Directory name, e.g. `nv_mem`.
    pub name: String,
    /// Contents of its `version` file.
    pub version: Option<String>,
}

/// The NVIDIA kernel driver.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NvidiaDriver {
    /// First line of `/proc/driver/nvidia/version`, e.g.
    /// `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04 ...`.
    pub version: Option<String>,
    /// `/proc/driver/nvidia/params` as `name -> value`.
    pub params: BTreeMap<String, String>,
}

impl NvidiaDriver {
    /// Whether the version line names the open kernel module (needed for dma-buf).
    pub fn is_open_kernel_module(&self) -> Option<bool> {
        self.version
            .as_deref()
            .map(gdr::gpu_mr::rules::is_open_kernel_module)
    }

    /// The driver version number, e.g. `580.159.04`.
    pub fn version_number(&self) -> Option<String> {
        let v = self.version.as_deref()?;
        v.split_whitespace()
            .find(|w| {
                w.chars().next().is_some_and(|c| c.is_ascii_digit())
                    && w.contains('.')
                    && w.chars().all(|c| c.is_ascii_digit() || c == '.')
            })
            .map(str::to_string)
    }
}

/// One RDMA device of `/sys/class/infiniband`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RdmaDevice {
    /// Device name, e.g. `mlx5_0`, `rxe0`.
    pub name: String,
    /// PCI address of the function behind it, when `device` resolves to a PCI device
    /// (software devices such as rxe and siw have none).
    pub pci_bdf: Option<String>,
    /// `parent` (software devices: the network device they run on).
    pub parent: Option<String>,
    /// `fw_ver`.
    pub fw_ver: Option<String>,
    /// `node_type`, e.g. `1: CA`.
    pub node_type: Option<String>,
    /// `hca_type`, e.g. `MT4123`.
    pub hca_type: Option<String>,
    /// `board_id`.
    pub board_id: Option<String>,
    /// Ports, sorted by number.
    pub ports: Vec<RdmaPort>,
    /// Whether the device imports dma-bufs, by the probe registration runs
    /// ([`gdr::gpu_mr::probe_nic_dma_buf`]); recorded by live collection only
    /// ([`CollectOptions::probe_nics`]), `None`: not probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dma_buf: Option<gdr::gpu_mr::rules::NicDmaBuf>,
}

/// One port of an RDMA device.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RdmaPort {
    /// Port number (from 1).
    pub port: u32,
    /// `state`, e.g. `4: ACTIVE`.
    pub state: Option<String>,
    /// `phys_state`, e.g. `5: LinkUp`.
    pub phys_state: Option<String>,
    /// `rate`, e.g. `200 Gb/sec (4X HDR)`.
    pub rate: Option<String>,
    /// `link_layer`: `InfiniBand` or `Ethernet`.
    pub link_layer: Option<String>,
    /// Non-empty GID table entries, sorted by index.
    pub gids: Vec<GidEntry>,
    /// Network devices named by the GID table, with their MTU.
    pub netdevs: Vec<Netdev>,
}

/// One non-empty GID table entry.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GidEntry {
    /// Table index.
    pub index: u32,
    /// The GID as sysfs prints it, e.g. `0000:0000:0000:0000:0000:ffff:0a00:0001`.
    pub gid: String,
    /// `gid_attrs/types/<index>`, e.g. `RoCE v2`, `IB/RoCE v1`.
    pub gid_type: Option<String>,
    /// `gid_attrs/ndevs/<index>`, e.g. `eth0`.
    pub ndev: Option<String>,
}

impl GidEntry {
    /// Whether the GID is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
    pub fn is_ipv4_mapped(&self) -> bool {
        let hex: String = self.gid.chars().filter(|c| *c != ':').collect();
        // ASCII first: sysfs text from a hostile snapshot may hold multi-byte characters, and
        // slicing at byte 20 of those would panic (found by the topology fuzz target).
        hex.len() == 32
            && hex.is_ascii()
            && hex[..20].chars().all(|c| c == '0')
            && hex[20..24].eq_ignore_ascii_case("ffff")
    }

    /// Whether the entry is a RoCE v2 GID.
    pub fn is_roce_v2(&self) -> bool {
        self.gid_type
            .as_deref()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("RoCE v2"))
    }

    /// The IPv4 address of an IPv4-mapped GID, e.g. `10.0.0.1`.
    pub fn ipv4(&self) -> Option<String> {
        if !self.is_ipv4_mapped() {
            return None;
        }
        let hex: String = self.gid.chars().filter(|c| *c != ':').collect();
        let b = pcie::hex_to_bytes(&hex[24..])?;
        Some(format!("{}.{}.{}.{}", b[0], b[1], b[2], b[3]))
    }
}

/// A network device and its MTU.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Netdev {
    /// Interface name.
    pub name: String,
    /// `/sys/class/net/<name>/mtu`.
    pub mtu: Option<u32>,
}

/// A resource limit value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// No limit.
    Unlimited,
    /// A limit in bytes.
    Bytes(u64),
}

/// "Max locked memory" of `/proc/self/limits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemlockLimit {
    /// The soft limit (what `ulimit -l` shows, in bytes here).
    pub soft: Limit,
    /// The hard limit.
    pub hard: Limit,
}

/// Signs of virtualisation.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Hypervisor {
    /// Whether `/proc/cpuinfo` lists the `hypervisor` CPU flag (`None`: not readable).
    pub cpu_flag: Option<bool>,
    /// `/sys/class/dmi/id/sys_vendor`, e.g. `QEMU`.
    pub sys_vendor: Option<String>,
    /// `/sys/class/dmi/id/product_name`.
    pub product_name: Option<String>,
}

/// CUDA driver facts, read through the CUDA driver API.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CudaInfo {
    /// `cuDriverGetVersion`, e.g. `13000` for 13.0.
    pub driver_version: Option<i32>,
    /// One entry per CUDA device.
    pub devices: Vec<CudaDevice>,
    /// Why the device list is missing or incomplete, if it is.
    pub error: Option<String>,
}

/// The GPUDirect-relevant attributes of one CUDA device.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CudaDevice {
    /// CUDA ordinal.
    pub ordinal: i32,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// PCI bus id as CUDA reports it, e.g. `0000:00:06.0`.
    pub pci_bus_id: String,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
    pub gpudirect_rdma_supported: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
    pub dma_buf_supported: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`.
    pub gpudirect_rdma_with_vmm_supported: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS` (bit mask).
    pub gpudirect_rdma_flush_writes_options: Option<i32>,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING` (100 = owner, 200 = all devices).
    pub gpudirect_rdma_writes_ordering: Option<i32>,
}

/// A file that exists but could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadError {
    /// The path, as seen on the collected machine (without the root prefix).
    pub path: String,
    /// The reason, e.g. `Permission denied (os error 13)`.
    pub error: String,
}

impl Snapshot {
    /// An empty snapshot of the current format.
    pub fn new(source: impl Into<String>) -> Self {
        Snapshot {
            format: SNAPSHOT_FORMAT,
            source: source.into(),
            ..Snapshot::default()
        }
    }

    /// Parse a snapshot from JSON; `what` names the input in errors (a file name).
    ///
    /// Malformed JSON is [`Error::InvalidSnapshot`], a format version this crate does not know
    /// [`Error::SnapshotFormat`]; never a panic.
    pub fn from_json(text: &str, what: &str) -> Result<Snapshot> {
        #[derive(Deserialize)]
        struct Probe {
            format: Option<u32>,
        }
        let probe: Probe = serde_json::from_str(text).map_err(|e| {
            Error::invalid_snapshot(what, format!("not a JSON object with a format field: {e}"))
        })?;
        match probe.format {
            Some(SNAPSHOT_FORMAT) => {}
            Some(found) => {
                return Err(Error::SnapshotFormat {
                    input: what.to_string(),
                    found,
                    supported: SNAPSHOT_FORMAT,
                    hint: Hint::new("capture it again with this version's `gdr doctor dump`"),
                })
            }
            None => return Err(Error::invalid_snapshot(what, "no `format` field")),
        }
        serde_json::from_str(text).map_err(|e| Error::invalid_snapshot(what, e.to_string()))
    }

    /// The snapshot as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The PCI device with this address.
    pub fn pci_device(&self, bdf: &str) -> Option<&PciDevice> {
        self.pci.iter().find(|d| d.bdf.eq_ignore_ascii_case(bdf))
    }

    /// NVIDIA GPUs found in sysfs.
    pub fn gpus(&self) -> impl Iterator<Item = &PciDevice> {
        self.pci.iter().filter(|d| d.is_nvidia_gpu())
    }

    /// Whether a module of this name is loaded.
    pub fn has_module(&self, name: &str) -> bool {
        self.modules.iter().any(|m| m == name)
    }

    /// The host facts the GPUDirect rules take ([`gdr::gpu_mr::rules`]), as this snapshot
    /// recorded them: what registration would read on the machine
    /// ([`gdr::gpu_mr::rules::SystemFacts::probe`]; both read through the same reader).
    pub fn system_facts(&self) -> SystemFacts {
        SystemFacts {
            modules: self.modules.clone(),
            memory_peers: self.memory_peers.iter().map(|p| p.name.clone()).collect(),
            nvidia_version: self.nvidia.as_ref().and_then(|n| n.version.clone()),
            kernel_release: self.kernel.release.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gid_with_multibyte_characters_is_not_ipv4_mapped_and_does_not_panic() {
        // The topology fuzz target's crash: 32 bytes whose byte 20 is inside a character.
        let e = GidEntry {
            index: 1,
            gid: format!("{}\u{e9}{}", "0".repeat(19), "f".repeat(11)),
            gid_type: None,
            ndev: None,
        };
        assert_eq!(e.gid.len(), 32);
        assert!(!e.is_ipv4_mapped());
    }
}
