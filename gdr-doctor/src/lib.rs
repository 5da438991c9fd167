//! # gdr-doctor: GPUDirect RDMA and NCCL diagnostics
//!
//! "Will GPUDirect RDMA work here, and fast?": one verdict per GPU-NIC pair (usable, usable but
//! slow, not usable), each with its reasons, and a fix for every finding. This crate is the
//! library of the `gdr doctor` command, on top of the `gdr` crate:
//!
//! * [`topology`]: everything on a host that decides the answer (the PCIe tree and configuration
//!   space, IOMMU, kernel modules and memory peers, the NVIDIA driver, RDMA devices with their
//!   ports and GIDs, the locked-memory limit, signs of a virtual machine, CUDA attributes, NCCL
//!   variables), read from sysfs and procfs below a configurable root ([`topology::collect`])
//!   into a [`Snapshot`]: plain data, saved as JSON and replayed anywhere.
//! * [`diagnose`]: a pure function from a snapshot to a [`Report`]: PCIe path class and NUMA
//!   nodes, ACS redirect bits and link training on every hop, IOMMU mode, peer memory and
//!   dma-buf, CUDA GPUDirect attributes, port state, rate, MTU and RoCE v2 GID, locked memory,
//!   every NCCL variable that bears on the path (read the way NCCL reads it), and the NCCL
//!   settings that fit the host. Whether GPU memory can be registered is decided by gdr's own
//!   rules (`gdr::gpu_mr::rules`) on facts read by gdr's own reader
//!   (`gdr::gpu_mr::facts::FactReader`), the ones registration uses, so the doctor cannot
//!   promise a path that `gdr::gpu_mr::GpuMemoryRegion::register` refuses.
//! * [`rank_rails`]: the RDMA ports ranked for a memory location (a GPU, or host memory on a
//!   NUMA node), the ranking `gdr doctor` prints and gdr-xfer stripes its transfers over.
//! * [`nccl_log`]: what an `NCCL_DEBUG=INFO` log says about GPUDirect RDMA, per process, and
//!   why not where not, cross-checked with a [`Report`] of the host.
//! * Rendering: [`Report::to_table`] (colours optional) and [`Report::to_json`].
//!
//! `gdr doctor` collects this machine with [`topology::collect_with`] and
//! [`topology::CollectOptions::live`] (with the CUDA driver's facts and each NIC's dma-buf
//! probe), or reads `--snapshot FILE` with [`topology::Snapshot::from_json`], diagnoses it, and
//! prints the table or the JSON; `gdr doctor dump` prints the snapshot; `gdr doctor nccl-log` is
//! [`nccl_log::parse`] then [`nccl_log::analyze`]. What fails is input the caller names (a root,
//! a snapshot, a log): an [`Error`] with the values and a hint.
//!
//! Each [`Finding`] has a stable id (e.g. `pcie.acs`), a [`Severity`], the device or pair it is
//! about, the values it was decided on, and a concrete fix. A check that lacks its input says
//! [`Severity::Unknown`], never [`Severity::Ok`]: for example ACS bits live in the extended
//! configuration space, which only root can read.
//!
//! ```no_run
//! use std::path::Path;
//! use gdr_doctor::topology::{collect_with, CollectOptions, Snapshot};
//!
//! // This machine as `gdr doctor` reads it: sysfs and procfs, the CUDA driver, each NIC's probe.
//! let snapshot = collect_with(Path::new("/"), CollectOptions::live())?;
//! let report = gdr_doctor::diagnose(&snapshot);
//! print!("{}", report.to_table(false));
//! for pair in report.pairs.iter().filter(|p| p.best) {
//!     println!("GPU {} -> {}: {}", pair.gpu, pair.nic, pair.verdict.kind);
//! }
//! // A snapshot travels as JSON (`gdr doctor dump`, then `gdr doctor --snapshot FILE`).
//! let replayed = Snapshot::from_json(&snapshot.to_json(), "this machine")?;
//! assert_eq!(replayed, snapshot);
//! # Ok::<(), gdr_doctor::Error>(())
//! ```
//!
//! The diagnosis reads nothing but its snapshot:
//!
//! ```
//! use gdr_doctor::topology::Snapshot;
//! let report = gdr_doctor::diagnose(&Snapshot::new("empty"));
//! assert!(!report.gpudirect_usable);
//! assert_eq!(report.exit_code(), 1);
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod error;
mod host;
mod nccl;
pub mod nccl_log;
mod nic;
mod pair;
pub mod path;
mod rails;
mod render;
pub mod topology;

use crate::topology::Snapshot;
use serde::{Deserialize, Serialize};
use std::fmt;

pub use error::{Error, Hint, Result};
pub use nccl::{nccl_env_from_process, NCCL_VARS};
pub use path::PathClass;
pub use rails::{
    host_report, parse_rate_gbps, rails_for_host, rank_rails, LocationRails, MemoryLocation, Rail,
};

/// The version of the report's JSON shape. Fields are only added within one format (`rails`
/// was added in format 1); a field removed, renamed or changed in meaning bumps it.
pub const REPORT_FORMAT: u32 = 1;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Checked and fine.
    Ok,
    /// The input needed for the check is missing; not known to be fine.
    Unknown,
    /// Works, but slower or more fragile than it should.
    Warn,
    /// Breaks GPUDirect RDMA (or the operation named) until fixed.
    Fail,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Ok => "OK",
            Severity::Unknown => "UNKNOWN",
            Severity::Warn => "WARN",
            Severity::Fail => "FAIL",
        })
    }
}

/// One checked fact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Stable identifier, e.g. `pcie.acs`, `port.rate`, `peermem.module`.
    pub id: String,
    /// How bad it is.
    pub severity: Severity,
    /// What it is about: `host`, a GPU (`GPU 0000:07:00.0`), an RDMA port (`mlx5_0 port 1`) or a
    /// pair (`GPU 0000:07:00.0 <-> mlx5_0`).
    pub subject: String,
    /// One sentence for people.
    pub message: String,
    /// The values read that the verdict rests on.
    pub evidence: Vec<String>,
    /// What to do about it (commands, kernel parameters, NCCL settings); `None` when nothing is
    /// needed.
    pub fix: Option<String>,
}

impl Finding {
    pub(crate) fn new(
        id: &str,
        severity: Severity,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Finding {
            id: id.to_string(),
            severity,
            subject: subject.into(),
            message: message.into(),
            evidence: Vec::new(),
            fix: None,
        }
    }

    pub(crate) fn evidence(mut self, e: impl Into<String>) -> Self {
        self.evidence.push(e.into());
        self
    }

    pub(crate) fn fix(mut self, f: impl Into<String>) -> Self {
        self.fix = Some(f.into());
        self
    }
}

/// Whether GPUDirect RDMA can be used for a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// Usable at full speed as far as the snapshot shows.
    Usable,
    /// Usable, but something on the path costs bandwidth or latency.
    UsableButSlow,
    /// Will not work until the reasons are fixed.
    NotUsable,
}

impl fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VerdictKind::Usable => "usable",
            VerdictKind::UsableButSlow => "usable but slow",
            VerdictKind::NotUsable => "not usable",
        })
    }
}

/// The verdict for one pair, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The verdict.
    pub kind: VerdictKind,
    /// Why it is slow or not usable (empty when usable).
    pub reasons: Vec<String>,
    /// What could not be checked and might still change the verdict.
    pub unverified: Vec<String>,
}

/// One GPU as the report sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSummary {
    /// PCI address, e.g. `0000:07:00.0`.
    pub bdf: String,
    /// Name from CUDA, or the PCI ids when CUDA was not read.
    pub name: String,
    /// CUDA ordinal, when CUDA was read.
    pub cuda_ordinal: Option<i32>,
    /// NUMA node (`None`: not reported by the platform).
    pub numa_node: Option<i32>,
    /// The RDMA device of the best pair for this GPU: the first of its rails ([`rank_rails`]).
    pub best_nic: Option<String>,
}

/// One RDMA device as the report sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicSummary {
    /// Device name, e.g. `mlx5_0`.
    pub name: String,
    /// PCI address (`None`: a software device such as rxe).
    pub bdf: Option<String>,
    /// NUMA node.
    pub numa_node: Option<i32>,
    /// Firmware version.
    pub fw_ver: Option<String>,
    /// The port used for pairs (the first active one, else the first).
    pub port: Option<u32>,
    /// Link layer of that port.
    pub link_layer: Option<String>,
    /// Rate of that port.
    pub rate: Option<String>,
    /// Index of the RoCE v2 IPv4 GID of that port (Ethernet only).
    pub roce_v2_gid_index: Option<u32>,
}

/// One GPU-NIC pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairReport {
    /// GPU PCI address.
    pub gpu: String,
    /// RDMA device name.
    pub nic: String,
    /// Port of the RDMA device.
    pub port: Option<u32>,
    /// PCIe path class (`None`: the NIC has no PCI function or a device is missing from sysfs).
    pub path: Option<PathClass>,
    /// The deepest PCI device both sit below (`None`: only the root complex or nothing).
    pub common_ancestor: Option<String>,
    /// Bridges between the two, GPU side first.
    pub bridges: Vec<String>,
    /// GPU NUMA node.
    pub gpu_numa: Option<i32>,
    /// NIC NUMA node.
    pub nic_numa: Option<i32>,
    /// Whether this is the best NIC for this GPU (the first of its rails, [`rank_rails`]).
    pub best: bool,
    /// The verdict.
    pub verdict: Verdict,
    /// Findings about this pair.
    pub findings: Vec<Finding>,
}

/// An NCCL environment variable recommended for this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NcclSetting {
    /// Variable name, e.g. `NCCL_IB_HCA`.
    pub name: String,
    /// Value to set.
    pub value: String,
    /// Why.
    pub why: String,
}

/// The doctor's answer for one snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`REPORT_FORMAT`].
    pub format: u32,
    /// Where the snapshot came from.
    pub source: String,
    /// Whether at least one pair is usable (possibly slow): the exit code's answer.
    pub gpudirect_usable: bool,
    /// GPUs.
    pub gpus: Vec<GpuSummary>,
    /// RDMA devices.
    pub nics: Vec<NicSummary>,
    /// Every GPU-NIC pair.
    pub pairs: Vec<PairReport>,
    /// Findings about the host, single GPUs and single RDMA ports.
    pub findings: Vec<Finding>,
    /// NCCL settings that fit this host.
    pub nccl: Vec<NcclSetting>,
    /// The rails the transfer engine ranks for every GPU, then for host memory on every NUMA
    /// node of a GPU or NIC (the lowest 64; with no NUMA preference when none is known):
    /// [`rank_rails`] with no selection.
    pub rails: Vec<LocationRails>,
}

impl Report {
    /// 0 when GPUDirect RDMA can work for at least one pair (warnings allowed), 1 when it
    /// cannot or no GPU-NIC pair exists.
    pub fn exit_code(&self) -> i32 {
        if self.gpudirect_usable {
            0
        } else {
            1
        }
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report as a table for people; `color` adds ANSI colours to severities and verdicts.
    pub fn to_table(&self, color: bool) -> String {
        render::table(self, color)
    }

    /// Every finding: host-level first, then per pair.
    pub fn all_findings(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .chain(self.pairs.iter().flat_map(|p| p.findings.iter()))
    }

    /// The findings with this id.
    pub fn findings_with_id<'a>(&'a self, id: &str) -> impl Iterator<Item = &'a Finding> + 'a {
        let id = id.to_string();
        self.all_findings().filter(move |f| f.id == id)
    }
}

/// Diagnose a snapshot. Pure: reads nothing but `snap`.
pub fn diagnose(snap: &Snapshot) -> Report {
    let host = host::HostFacts::new(snap);
    let mut findings = host::check(snap, &host);
    let (nics, nic_facts, nic_findings) = nic::check(snap, &host);
    findings.extend(nic_findings);
    let mut pairs = Vec::new();
    for gpu in &host.gpus {
        for nic in &nic_facts {
            pairs.push(pair::check(snap, &host, gpu, nic));
        }
    }
    pair::mark_best(&mut pairs, &nics, &findings);
    findings.extend(nccl::check_env(snap, &host, &pairs));
    let gpus = host
        .gpus
        .iter()
        .map(|g| GpuSummary {
            bdf: g.bdf.clone(),
            name: g.name.clone(),
            cuda_ordinal: g.cuda.as_ref().map(|c| c.ordinal),
            numa_node: g.numa,
            best_nic: pairs
                .iter()
                .find(|p| p.best && p.gpu == g.bdf)
                .map(|p| p.nic.clone()),
        })
        .collect();
    let nccl = nccl::recommend(&pairs, &nics);
    let gpudirect_usable = pairs
        .iter()
        .any(|p| p.verdict.kind != VerdictKind::NotUsable);
    let mut report = Report {
        format: REPORT_FORMAT,
        source: snap.source.clone(),
        gpudirect_usable,
        gpus,
        nics,
        pairs,
        findings,
        nccl,
        rails: Vec::new(),
    };
    report.rails = rails::for_report(&report);
    report
}
