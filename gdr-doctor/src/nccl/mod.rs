//! NCCL: every environment variable that bears on GPUDirect RDMA and the network path, checked
//! against this host, and the settings that fit this host.
//!
//! Meanings and defaults are NCCL's own (docs/userguide/source/env.rst and the source:
//! `src/graph/paths.cc` `ncclGetLevel` / `ncclTopoCheckGdr`, `src/transport/net_ib/*.cc`,
//! `src/init.cc`), with the NCCL version where a default changed. NCCL reads the variables
//! exactly: level names are compared case-sensitively (`pxb` is ignored, not read as `PXB`),
//! integers are parsed as C's `strtoll(.., 0)` does and an unparsable value falls back to the
//! default.
//!
//! How NCCL reads a value is `read.rs`; the checks are grouped by what the variable chooses: the
//! network and its devices (`network.rs`), the GID (`gid.rs`), GPUDirect RDMA and GPU peer
//! access (`gpudirect.rs`); `NCCL_DEBUG` and the recommended settings are here.

mod gid;
mod gpudirect;
mod network;
mod read;
#[cfg(test)]
mod tests;

use super::host::{HostFacts, Tri};
use super::path::PathClass;
use super::{Finding, NcclSetting, NicSummary, PairReport, Severity, VerdictKind};
use crate::topology::pcie::{self, RelaxedOrdering};
use crate::topology::{GidEntry, RdmaDevice, RdmaPort, Snapshot};
use std::collections::BTreeMap;

use gid::{addr_family, gid_index, roce_version};
use gpudirect::{dmabuf_enable, net_gdr_level, net_gdr_read, p2p, relaxed_ordering};
use network::{ib_disable, ib_hca, net, net_plugin, socket_ifname};
pub(crate) use read::{nccl_int, parse_hca, read_level, HcaList, Level, LevelRead};

/// Every NCCL variable the doctor reads (and `gdr doctor` records from its environment).
pub const NCCL_VARS: &[&str] = &[
    "NCCL_IB_DISABLE",
    "NCCL_NET",
    "NCCL_NET_PLUGIN",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ADDR_RANGE",
    "NCCL_SOCKET_IFNAME",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ",
    "NCCL_IB_PCI_RELAXED_ORDERING",
    "NCCL_DMABUF_ENABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_P2P_DISABLE",
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
];

/// The [`NCCL_VARS`] that are set in this process's environment (non-UTF-8 values are left
/// out: NCCL would read their bytes, the doctor cannot show them).
pub fn nccl_env_from_process() -> BTreeMap<String, String> {
    NCCL_VARS
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect()
}

/// What NCCL would use of this host's RDMA devices: the devices `NCCL_IB_HCA` selects (all when
/// unset) with the port NCCL uses (the named one, else the first active, else the first).
fn selected_ports(snap: &Snapshot) -> Vec<(&RdmaDevice, &RdmaPort)> {
    let list = snap.env.get("NCCL_IB_HCA").map(|v| parse_hca(v));
    let mut out = Vec::new();
    for d in &snap.rdma {
        if list.as_ref().is_some_and(|l| !l.selects(&d.name)) {
            continue;
        }
        let named = list.as_ref().and_then(|l| l.port_for(&d.name));
        let port = match named {
            Some(n) => d.ports.iter().find(|p| p.port == n),
            None => d
                .ports
                .iter()
                .find(|p| p.state.as_deref().is_some_and(|s| s.contains("ACTIVE")))
                .or(d.ports.first()),
        };
        if let Some(p) = port {
            out.push((d, p));
        }
    }
    out
}

fn is_ethernet(p: &RdmaPort) -> bool {
    p.link_layer.as_deref() == Some("Ethernet")
}

fn is_link_local(g: &GidEntry) -> bool {
    g.gid.to_ascii_lowercase().starts_with("fe80")
}

/// `RoCE v2 IPv4 10.0.0.1`, `IB/RoCE v1 IPv6 link-local`.
fn gid_text(g: &GidEntry) -> String {
    let t = g.gid_type.as_deref().unwrap_or("type unknown");
    match g.ipv4() {
        Some(ip) => format!("{t} IPv4 {ip}"),
        None if is_link_local(g) => format!("{t} IPv6 link-local"),
        None => format!("{t} IPv6"),
    }
}

fn worst(fs: &[Severity]) -> Severity {
    fs.iter().copied().max().unwrap_or(Severity::Ok)
}

/// The worst path class among the best pairs that can work, and whether any best pair exists.
fn best_classes(pairs: &[PairReport]) -> Vec<PathClass> {
    let mut v: Vec<PathClass> = pairs
        .iter()
        .filter(|p| p.best)
        .filter_map(|p| p.path)
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Findings about every NCCL variable that is set ([`NCCL_VARS`]), cross-checked with the
/// host's devices, peer memory, dma-buf readiness and the GPU-NIC paths of `pairs`.
pub(crate) fn check_env(snap: &Snapshot, host: &HostFacts, pairs: &[PairReport]) -> Vec<Finding> {
    let mut out = Vec::new();
    let env = &snap.env;
    let get = |k: &str| env.get(k).map(String::as_str);
    if let Some(v) = get("NCCL_IB_DISABLE") {
        out.push(ib_disable(snap, v));
    }
    if let Some(v) = get("NCCL_NET") {
        out.push(net(snap, v));
    }
    if let Some(v) = get("NCCL_NET_PLUGIN") {
        out.push(net_plugin(v));
    }
    if let Some(v) = get("NCCL_IB_HCA") {
        out.push(ib_hca(snap, v));
    }
    if let Some(v) = get("NCCL_IB_GID_INDEX") {
        out.push(gid_index(snap, v));
    }
    if let Some(v) = get("NCCL_IB_ROCE_VERSION_NUM") {
        out.push(roce_version(snap, v));
    }
    if let Some(v) = get("NCCL_IB_ADDR_FAMILY") {
        out.push(addr_family(snap, v));
    }
    if let Some(v) = get("NCCL_IB_ADDR_RANGE") {
        let mut f = Finding::new(
            "nccl.ib_addr_range",
            Severity::Ok,
            "host",
            format!("NCCL_IB_ADDR_RANGE={v}: NCCL (>= 2.21) only auto-selects GIDs inside this CIDR range"),
        )
        .evidence(format!("NCCL_IB_ADDR_RANGE={v}"));
        if get("NCCL_IB_GID_INDEX").is_some() {
            f.severity = Severity::Warn;
            f.message = format!("NCCL_IB_ADDR_RANGE={v} is ignored: NCCL_IB_GID_INDEX is set, so NCCL does not auto-select the GID");
            f = f.fix("unset NCCL_IB_GID_INDEX to let NCCL (>= 2.21) pick the GID in this range, or unset NCCL_IB_ADDR_RANGE");
        }
        out.push(f);
    }
    if let Some(v) = get("NCCL_SOCKET_IFNAME") {
        out.push(socket_ifname(snap, v));
    }
    if let Some(v) = get("NCCL_NET_GDR_LEVEL") {
        out.push(net_gdr_level(v, pairs));
    }
    if let Some(v) = get("NCCL_NET_GDR_READ") {
        out.push(net_gdr_read(v));
    }
    if let Some(v) = get("NCCL_IB_PCI_RELAXED_ORDERING") {
        out.push(relaxed_ordering(snap, v));
    }
    if let Some(v) = get("NCCL_DMABUF_ENABLE") {
        out.push(dmabuf_enable(host, v));
    }
    if get("NCCL_P2P_LEVEL").is_some() || get("NCCL_P2P_DISABLE").is_some() {
        out.extend(p2p(get("NCCL_P2P_LEVEL"), get("NCCL_P2P_DISABLE"), pairs));
    }
    if let Some(v) = get("NCCL_DEBUG") {
        out.push(debug(v, get("NCCL_DEBUG_SUBSYS")));
    }
    out
}

fn debug(v: &str, subsys: Option<&str>) -> Finding {
    let ev = format!("NCCL_DEBUG={v}");
    // debug.cc compares with strcasecmp, untrimmed.
    let level = v.to_ascii_uppercase();
    let mut f = match level.as_str() {
        "INFO" | "TRACE" => Finding::new(
            "nccl.debug",
            Severity::Ok,
            "host",
            format!("NCCL_DEBUG={v}: NCCL logs its network choice, devices and each channel's transport (`via NET/IB/<n>/GDRDMA` when GPUDirect RDMA is used, `via NET/IB/<n>` when not); read the log with `gdr doctor nccl-log FILE`"),
        ),
        "WARN" | "VERSION" | "ABORT" => Finding::new(
            "nccl.debug",
            Severity::Ok,
            "host",
            format!("NCCL_DEBUG={v}: NCCL does not log the channel transports, so the log cannot show whether GPUDirect RDMA is used"),
        )
        .fix("NCCL_DEBUG=INFO to see `via NET/IB/<n>/GDRDMA` lines (then `gdr doctor nccl-log`)"),
        _ => Finding::new(
            "nccl.debug",
            Severity::Warn,
            "host",
            format!("NCCL_DEBUG={v:?} is not a level NCCL knows (VERSION, WARN, INFO, ABORT, TRACE; any case): NCCL logs nothing"),
        )
        .fix("NCCL_DEBUG=INFO"),
    };
    f = f.evidence(ev);
    if matches!(level.as_str(), "INFO" | "TRACE") {
        match subsys {
            None => {
                f = f
                    .evidence("NCCL_DEBUG_SUBSYS unset: INIT, BOOTSTRAP and ENV (the channel lines are INIT; the lines saying why GPUDirect RDMA is off are NET)")
                    .fix("add NCCL_DEBUG_SUBSYS=INIT,ENV,NET to also get the reasons (`GPU Direct RDMA Disabled for ...`)");
            }
            Some(s) => {
                let up = s.to_ascii_uppercase();
                let parts: Vec<&str> = up.split(',').map(str::trim).collect();
                let inverted = up.starts_with('^');
                let has = |name: &str| {
                    let listed = parts
                        .iter()
                        .any(|p| p.trim_start_matches('^') == name || *p == "ALL");
                    listed != inverted
                };
                f = f.evidence(format!("NCCL_DEBUG_SUBSYS={s}"));
                if !has("INIT") && !has("NET") {
                    f.severity = Severity::Warn;
                    f.message.push_str("; but NCCL_DEBUG_SUBSYS leaves out INIT and NET, so the channel lines are not printed");
                    f = f.fix("NCCL_DEBUG_SUBSYS=INIT,ENV,NET");
                }
            }
        }
    }
    f
}

/// The NCCL settings that fit the best pairs.
pub(crate) fn recommend(pairs: &[PairReport], nics: &[NicSummary]) -> Vec<NcclSetting> {
    let best: Vec<&PairReport> = pairs
        .iter()
        .filter(|p| p.best && p.verdict.kind != VerdictKind::NotUsable)
        .collect();
    if best.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut hcas: Vec<String> = best
        .iter()
        .map(|p| match p.port {
            Some(port) => format!("{}:{port}", p.nic),
            None => p.nic.clone(),
        })
        .collect();
    hcas.sort();
    hcas.dedup();
    out.push(NcclSetting {
        name: "NCCL_IB_HCA".into(),
        value: format!("={}", hcas.join(",")),
        why: "the NIC nearest each GPU; `=` makes NCCL match names exactly (mlx5_1 would otherwise also match mlx5_10)".into(),
    });
    let mut gids: Vec<u32> = best
        .iter()
        .filter_map(|p| nics.iter().find(|n| n.name == p.nic))
        .filter(|n| n.link_layer.as_deref() == Some("Ethernet"))
        .filter_map(|n| n.roce_v2_gid_index)
        .collect();
    gids.sort_unstable();
    gids.dedup();
    if gids.len() == 1 {
        out.push(NcclSetting {
            name: "NCCL_IB_GID_INDEX".into(),
            value: gids[0].to_string(),
            why: "the RoCE v2 GID with an IPv4 address on the chosen ports".into(),
        });
    }
    let worst = best.iter().filter_map(|p| p.path).max();
    match worst {
        Some(c) if c <= PathClass::Pxb => out.push(NcclSetting {
            name: "NCCL_NET_GDR_LEVEL".into(),
            value: "PXB".into(),
            why: format!("every GPU has a NIC at {c} or nearer: NCCL's default already uses GPUDirect"),
        }),
        Some(PathClass::Phb) => out.push(NcclSetting {
            name: "NCCL_NET_GDR_LEVEL".into(),
            value: "PHB".into(),
            why: "the best NIC of some GPU is behind the CPU's host bridge; allow GPUDirect there, then compare against staging with a bandwidth test".into(),
        }),
        Some(_) => out.push(NcclSetting {
            name: "NCCL_NET_GDR_LEVEL".into(),
            value: "PXB".into(),
            why: "some GPU has no NIC on its NUMA node: keep NCCL staging through host memory there (the default) and fix the placement".into(),
        }),
        None => {}
    }
    out
}
