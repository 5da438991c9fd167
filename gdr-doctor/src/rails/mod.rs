//! Rails: the RDMA ports ranked for one memory location, the one ranking both `gdr doctor` and
//! the transfer engine use ([`rank_rails`]; the key is documented there).
//!
//! ```
//! use gdr_doctor::{diagnose, rank_rails, MemoryLocation};
//! use gdr_doctor::topology::Snapshot;
//! let report = diagnose(&Snapshot::new("empty"));
//! assert!(rank_rails(&report, &MemoryLocation::Any, None).is_empty());
//! ```

mod rank;
#[cfg(test)]
mod tests;

use super::host::normalize_bdf;
use super::{
    diagnose, nccl_env_from_process, Finding, GpuSummary, NicSummary, PairReport, PathClass,
    Report, Severity, VerdictKind,
};
use crate::topology::{collect_with, CollectOptions};
use gdr::device::Selection;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::Path;

pub(crate) use rank::best_pair;
pub use rank::rank_rails;

/// Where the memory of a transfer lives: what the rails are ranked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryLocation {
    /// GPU memory of the GPU with this CUDA ordinal ([`GpuSummary::cuda_ordinal`]). An ordinal
    /// the report does not know (CUDA not read, or no such GPU) is ranked as [`Self::Any`],
    /// and every rail's `why` says so.
    Gpu {
        /// CUDA device ordinal.
        ordinal: u32,
    },
    /// GPU memory of the GPU at this PCI address (`0000:07:00.0`; CUDA's `00000000:07:00.0`
    /// spelling and upper case are accepted). An unknown address is ranked as [`Self::Any`].
    GpuPci(String),
    /// Host memory on this NUMA node (a negative node, sysfs's "unknown", is [`Self::Any`]).
    Numa(i32),
    /// Host memory with no known NUMA node: no NUMA preference.
    Any,
}

impl fmt::Display for MemoryLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryLocation::Gpu { ordinal } => write!(f, "GPU {ordinal}"),
            MemoryLocation::GpuPci(bdf) => write!(f, "GPU {bdf}"),
            MemoryLocation::Numa(n) => write!(f, "host memory on NUMA node {n}"),
            MemoryLocation::Any => f.write_str("host memory"),
        }
    }
}

/// One rail (an RDMA device and port) as ranked for one memory location.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rail {
    /// RDMA device name, e.g. `mlx5_0`.
    pub nic: String,
    /// Port number (the device's first active port, else its first; 0: the device has no
    /// ports).
    pub port: u32,
    /// PCIe path class between the GPU and the NIC (GPU memory only; `None`: host memory, or
    /// unknown, e.g. a software device).
    pub path: Option<PathClass>,
    /// The pair's verdict (GPU memory only).
    pub verdict: Option<VerdictKind>,
    /// NUMA node of the NIC.
    pub nic_numa: Option<i32>,
    /// Whether the NIC is on the memory's NUMA node (`None`: either is unknown).
    pub same_numa: Option<bool>,
    /// Port rate as the kernel reports it, e.g. `200 Gb/sec (4X HDR)`.
    pub rate: Option<String>,
    /// Port rate in Gb/s, parsed from `rate` ([`parse_rate_gbps`]).
    pub rate_gbps: Option<f64>,
    /// Whether the port is ACTIVE.
    pub active: bool,
    /// Whether the engine may use the rail at all: an active port and, for GPU memory, a
    /// verdict other than not usable.
    pub usable: bool,
    /// 0: the rails the engine stripes over by default; each later distinct ranking key is the
    /// next tier. Never 0 for an unusable rail.
    pub tier: u32,
    /// Why the rail sits where it does, for people.
    pub why: String,
}

/// The ranked rails of one memory location, as the report lists them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocationRails {
    /// The memory location.
    pub location: MemoryLocation,
    /// For people: `GPU 0 (0000:07:00.0)`, `host memory on NUMA node 1`.
    pub label: String,
    /// [`rank_rails`] for `location`, with no selection.
    pub rails: Vec<Rail>,
}

/// The port rate in Gb/s of a sysfs rate string (`100 Gb/sec (4X EDR)`, `2.5 Gb/sec (1X SDR)`):
/// the leading decimal number, when what follows is `Gb` or nothing. Anything else (no number,
/// another unit, a number too large to be finite) is `None`.
pub fn parse_rate_gbps(rate: &str) -> Option<f64> {
    let t = rate.trim_start();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, rest) = t.split_at(end);
    let rest = rest.trim_start();
    if !(rest.is_empty() || rest.starts_with("Gb") || rest.starts_with("gb")) {
        return None;
    }
    num.parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r >= 0.0)
}

/// At most this many NUMA nodes get a host-memory entry in a report (the lowest ones): real
/// machines have a few, and a hostile snapshot must not make the report quadratic in its devices.
pub(crate) const MAX_HOST_LOCATIONS: usize = 64;

/// The locations the report lists rails for: every GPU (by CUDA ordinal when known, else by
/// PCI address), then host memory on every NUMA node of a GPU or NIC (or with no preference
/// when none is known).
pub(crate) fn for_report(report: &Report) -> Vec<LocationRails> {
    let mut out = Vec::new();
    for g in &report.gpus {
        let (location, label) = match g.cuda_ordinal.and_then(|o| u32::try_from(o).ok()) {
            Some(ordinal) => (
                MemoryLocation::Gpu { ordinal },
                format!("GPU {ordinal} ({})", g.bdf),
            ),
            None => (
                MemoryLocation::GpuPci(g.bdf.clone()),
                format!("GPU {}", g.bdf),
            ),
        };
        out.push(LocationRails {
            rails: rank_rails(report, &location, None),
            location,
            label,
        });
    }
    let nodes: BTreeSet<i32> = report
        .gpus
        .iter()
        .filter_map(|g| g.numa_node)
        .chain(report.nics.iter().filter_map(|n| n.numa_node))
        .collect();
    let hosts: Vec<MemoryLocation> = if nodes.is_empty() {
        vec![MemoryLocation::Any]
    } else {
        nodes
            .into_iter()
            .take(MAX_HOST_LOCATIONS)
            .map(MemoryLocation::Numa)
            .collect()
    };
    for location in hosts {
        out.push(LocationRails {
            rails: rank_rails(report, &location, None),
            label: location.to_string(),
            location,
        });
    }
    out
}

/// The doctor's report of the machine whose `/sys` and `/proc` lie below `root`, collected the
/// way `gdr doctor` collects it: for `/`, with the CUDA driver's facts and each RDMA device's
/// dma-buf probe ([`CollectOptions::live`]); below another root without them (so GPUs have no
/// CUDA ordinal there); with the process's NCCL variables either way.
///
/// The pair verdicts, and so the rails, take the process's NCCL variables into account as the
/// doctor does (a wrong `NCCL_IB_GID_INDEX` makes a RoCE pair not usable, a strict
/// `NCCL_NET_GDR_LEVEL` makes it slow). A caller that wants them left out collects with its
/// own options: `diagnose(&collect_with(root, opts)?)`, then [`rank_rails`].
///
/// Fails only when `root` is not a readable directory.
pub fn host_report(root: &Path) -> crate::Result<Report> {
    let mut opts = if root == Path::new("/") {
        CollectOptions::live()
    } else {
        CollectOptions::from_process_env()
    };
    opts.env.extend(nccl_env_from_process());
    Ok(diagnose(&collect_with(root, opts)?))
}

/// [`rank_rails`] on [`host_report`]`(root)`: the rails of this machine (`root` = `/`) for
/// `memory`. To rank several locations, call [`host_report`] once and [`rank_rails`] per
/// location.
pub fn rails_for_host(
    root: &Path,
    memory: &MemoryLocation,
    selection: Option<&Selection>,
) -> crate::Result<Vec<Rail>> {
    Ok(rank_rails(&host_report(root)?, memory, selection))
}
