//! NCCL: every environment variable that bears on GPUDirect RDMA and the network path, checked
//! against this host, and the settings that fit this host.
//!
//! Meanings and defaults are NCCL's own (docs/userguide/source/env.rst and the source:
//! `src/graph/paths.cc` `ncclGetLevel` / `ncclTopoCheckGdr`, `src/transport/net_ib/*.cc`,
//! `src/init.cc`), with the NCCL version where a default changed. NCCL reads the variables
//! exactly: level names are compared case-sensitively (`pxb` is ignored, not read as `PXB`),
//! integers are parsed as C's `strtoll(.., 0)` does and an unparsable value falls back to the
//! default.

use super::host::{HostFacts, Tri};
use super::path::PathClass;
use super::{Finding, NcclSetting, NicSummary, PairReport, Severity, VerdictKind};
use crate::topology::pcie::{self, RelaxedOrdering};
use crate::topology::{GidEntry, RdmaDevice, RdmaPort, Snapshot};
use std::collections::BTreeMap;

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

/// A parsed `NCCL_IB_HCA`: `[^][=]name[:port],name[:port]...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HcaList {
    pub exclude: bool,
    pub exact: bool,
    pub entries: Vec<(String, Option<u32>)>,
}

pub(crate) fn parse_hca(s: &str) -> HcaList {
    let mut rest = s.trim();
    let exclude = rest.starts_with('^');
    if exclude {
        rest = &rest[1..];
    }
    let exact = rest.starts_with('=');
    if exact {
        rest = &rest[1..];
    }
    let entries = rest
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once(':') {
            // `<hca>[:<port>[:<rail>[:<plane>]]]`: an empty port field means every port.
            Some((n, p)) => (
                n.to_string(),
                p.split(':').next().and_then(|p| p.parse().ok()),
            ),
            None => (e.to_string(), None),
        })
        .collect();
    HcaList {
        exclude,
        exact,
        entries,
    }
}

impl HcaList {
    fn matches(&self, entry: &str, dev: &str) -> bool {
        if self.exact {
            dev == entry
        } else {
            dev.starts_with(entry)
        }
    }

    /// Whether NCCL would use `dev`.
    fn selects(&self, dev: &str) -> bool {
        let hit = self.entries.iter().any(|(e, _)| self.matches(e, dev));
        hit != self.exclude
    }

    /// The port this list names for `dev` (include lists only).
    fn port_for(&self, dev: &str) -> Option<u32> {
        if self.exclude {
            return None;
        }
        self.entries
            .iter()
            .find(|(e, _)| self.matches(e, dev))
            .and_then(|(_, p)| *p)
    }
}

/// An integer as NCCL's `NCCL_PARAM` reads it (`strtoll(str, &end, 0)`, the whole string):
/// decimal, `0x` hex or leading-zero octal, leading blanks allowed. `None`: NCCL ignores the
/// value and keeps its default.
pub(crate) fn nccl_int(s: &str) -> Option<i64> {
    let t = s.trim_start();
    let (neg, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()?
    } else if t.len() > 1 && t.starts_with('0') {
        i64::from_str_radix(&t[1..], 8).ok()?
    } else {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()?
    };
    Some(if neg { -v } else { v })
}

/// What a level variable (`NCCL_NET_GDR_LEVEL`, `NCCL_P2P_LEVEL`) allows, as NCCL reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// `LOC` (or legacy `0`): never.
    Never,
    /// `NVL`, `NVB` or `C2C`: only over NVLink or a C2C link, never over PCIe.
    NvlinkOnly(&'static str),
    /// Up to this PCIe class (`PXN` and `P2C`, which lie between PXB and PHB, count as PXB).
    UpTo(PathClass, &'static str),
}

impl Level {
    /// Whether a GPU-NIC (or GPU-GPU) path of `class` is allowed.
    pub(crate) fn allows(self, class: PathClass) -> bool {
        match self {
            Level::UpTo(c, _) => class <= c,
            _ => false,
        }
    }

    /// NCCL's name for the level.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Level::Never => "LOC",
            Level::NvlinkOnly(n) | Level::UpTo(_, n) => n,
        }
    }
}

/// How NCCL read a level variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LevelRead {
    /// An exact path-type name.
    Name(Level),
    /// A legacy integer (0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and above SYS).
    Legacy(i64, Level),
    /// Not a name NCCL knows (the comparison is case-sensitive) nor a number: NCCL ignores it.
    Ignored,
}

/// `ncclGetLevel` of NCCL's `src/graph/paths.cc`: an exact name of `topoPathTypeStr` up to SYS,
/// else, when the first character is a digit, the legacy integer (`strtol`, values above 4
/// read as SYS), else nothing.
pub(crate) fn read_level(s: &str) -> LevelRead {
    let named = match s {
        "LOC" => Some(Level::Never),
        "NVL" => Some(Level::NvlinkOnly("NVL")),
        "NVB" => Some(Level::NvlinkOnly("NVB")),
        "C2C" => Some(Level::NvlinkOnly("C2C")),
        "PIX" => Some(Level::UpTo(PathClass::Pix, "PIX")),
        "PXB" => Some(Level::UpTo(PathClass::Pxb, "PXB")),
        "P2C" => Some(Level::UpTo(PathClass::Pxb, "P2C")),
        "PXN" => Some(Level::UpTo(PathClass::Pxb, "PXN")),
        "PHB" => Some(Level::UpTo(PathClass::Phb, "PHB")),
        "SYS" => Some(Level::UpTo(PathClass::Sys, "SYS")),
        _ => None,
    };
    if let Some(l) = named {
        return LevelRead::Name(l);
    }
    if s.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        let n: i64 = digits.parse().unwrap_or(i64::MAX);
        let level = match n {
            0 => Level::Never,
            1 => Level::UpTo(PathClass::Pix, "PIX"),
            2 => Level::UpTo(PathClass::Pxb, "PXB"),
            3 => Level::UpTo(PathClass::Phb, "PHB"),
            _ => Level::UpTo(PathClass::Sys, "SYS"),
        };
        return LevelRead::Legacy(n, level);
    }
    LevelRead::Ignored
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

fn ib_disable(snap: &Snapshot, v: &str) -> Finding {
    let ev = format!("NCCL_IB_DISABLE={v}");
    let devs = snap.rdma.len();
    let ev_devs = format!(
        "RDMA devices: {}",
        if devs == 0 {
            "none".to_string()
        } else {
            snap.rdma
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    match nccl_int(v) {
        Some(0) if devs == 0 => Finding::new(
            "nccl.ib_disable",
            Severity::Warn,
            "host",
            "NCCL_IB_DISABLE=0 allows the IB/RoCE transport, but this host has no RDMA device: NCCL falls back to sockets",
        )
        .evidence(ev)
        .evidence(ev_devs)
        .fix("install the NIC driver and rdma-core so that `ibv_devices` lists the NIC (see inventory.rdma)"),
        Some(0) => Finding::new(
            "nccl.ib_disable",
            Severity::Ok,
            "host",
            "NCCL_IB_DISABLE=0 allows the IB/RoCE transport (0 is NCCL's default: setting it changes nothing)",
        )
        .evidence(ev)
        .evidence(ev_devs),
        Some(_) => Finding::new(
            "nccl.ib_disable",
            Severity::Fail,
            "host",
            format!("NCCL_IB_DISABLE={v} turns the IB/RoCE transport off: NCCL uses TCP sockets, so neither RDMA nor GPUDirect RDMA is used{}", if devs > 0 { format!(" although {devs} RDMA device(s) are present") } else { String::new() }),
        )
        .evidence(ev)
        .evidence(ev_devs)
        .fix("unset NCCL_IB_DISABLE (or set it to 0)"),
        None => Finding::new(
            "nccl.ib_disable",
            Severity::Warn,
            "host",
            format!("NCCL_IB_DISABLE={v:?} is not a number: NCCL ignores it and keeps the default 0 (IB/RoCE allowed)"),
        )
        .evidence(ev)
        .fix("set NCCL_IB_DISABLE to 0 or 1, or unset it"),
    }
}

fn net(snap: &Snapshot, v: &str) -> Finding {
    let ev = format!("NCCL_NET={v}");
    if v.eq_ignore_ascii_case("Socket") {
        Finding::new(
            "nccl.net",
            Severity::Fail,
            "host",
            "NCCL_NET=Socket forces NCCL's TCP socket transport: no RDMA, no GPUDirect RDMA",
        )
        .evidence(ev)
        .fix("unset NCCL_NET (NCCL picks IB when a usable RDMA device exists), or NCCL_NET=IB")
    } else if v.eq_ignore_ascii_case("IB") {
        if snap.rdma.is_empty() {
            Finding::new(
                "nccl.net",
                Severity::Fail,
                "host",
                "NCCL_NET=IB forces the IB verbs transport, but this host has no RDMA device: NCCL initialisation fails instead of falling back to sockets",
            )
            .evidence(ev)
            .evidence("RDMA devices: none")
            .fix("install the NIC driver and rdma-core, or unset NCCL_NET")
        } else {
            Finding::new(
                "nccl.net",
                Severity::Ok,
                "host",
                "NCCL_NET=IB forces NCCL's internal IB verbs transport (no silent fall-back to sockets)",
            )
            .evidence(ev)
        }
    } else {
        Finding::new(
            "nccl.net",
            Severity::Unknown,
            "host",
            format!("NCCL_NET={v} names an external network plugin (NCCL >= 2.10 matches the name case-insensitively and does not fall back): whether it uses GPUDirect RDMA is up to that plugin"),
        )
        .evidence(ev)
        .fix("check the plugin's own log lines (`NET/Plugin: Loaded net plugin ...`, then `via NET/<name>/<dev>/GDRDMA` on the channel lines: `gdr doctor nccl-log`)")
    }
}

fn net_plugin(v: &str) -> Finding {
    let ev = format!("NCCL_NET_PLUGIN={v}");
    if v.eq_ignore_ascii_case("none") {
        Finding::new(
            "nccl.net_plugin",
            Severity::Ok,
            "host",
            "NCCL_NET_PLUGIN=none: NCCL loads no external net plugin and uses its internal IB or Socket transport",
        )
        .evidence(ev)
    } else {
        Finding::new(
            "nccl.net_plugin",
            Severity::Unknown,
            "host",
            format!("NCCL_NET_PLUGIN={v}: NCCL (>= 2.11) loads `{v}`, else `libnccl-net-{v}.so`, else its internal transport; the plugin (e.g. HPC-X's IBext) then decides about GPUDirect RDMA"),
        )
        .evidence(ev)
        .fix("confirm which plugin loaded with NCCL_DEBUG=INFO (`NET/Plugin` lines) and whether the channels say GDRDMA (`gdr doctor nccl-log`)")
    }
}

fn ib_hca(snap: &Snapshot, v: &str) -> Finding {
    let list = parse_hca(v);
    let names: Vec<&str> = snap.rdma.iter().map(|d| d.name.as_str()).collect();
    let available = if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    };
    let selected: Vec<&str> = names.iter().copied().filter(|d| list.selects(d)).collect();
    let missing: Vec<&str> = list
        .entries
        .iter()
        .filter(|(e, _)| !names.iter().any(|d| list.matches(e, d)))
        .map(|(e, _)| e.as_str())
        .collect();
    let mut ev = vec![
        format!("NCCL_IB_HCA={v}"),
        format!("RDMA devices: {available}"),
    ];
    // Ports named in the list that the device lacks or that are not active.
    let mut bad_ports = Vec::new();
    if !list.exclude {
        for (entry, port) in &list.entries {
            let Some(port) = port else { continue };
            for d in snap.rdma.iter().filter(|d| list.matches(entry, &d.name)) {
                match d.ports.iter().find(|p| p.port == *port) {
                    None => bad_ports.push(format!(
                        "{} has no port {port} (ports: {})",
                        d.name,
                        d.ports
                            .iter()
                            .map(|p| p.port.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                    Some(p) if !p.state.as_deref().is_some_and(|s| s.contains("ACTIVE")) => {
                        bad_ports.push(format!(
                            "{} port {port} is not active ({})",
                            d.name,
                            p.state.as_deref().unwrap_or("state unknown")
                        ))
                    }
                    Some(_) => ev.push(format!("{} port {port}: active", d.name)),
                }
            }
        }
    }
    // A prefix entry that also matches longer names (mlx5_1 -> mlx5_10).
    let widened: Vec<String> = if list.exact || list.exclude {
        Vec::new()
    } else {
        list.entries
            .iter()
            .filter(|(e, _)| names.contains(&e.as_str()))
            .flat_map(|(e, _)| {
                names
                    .iter()
                    .filter(move |d| **d != e && d.starts_with(e.as_str()))
                    .map(move |d| format!("{e} also matches {d}"))
            })
            .collect()
    };
    let mut f = if selected.is_empty() {
        Finding::new(
            "nccl.ib_hca",
            Severity::Fail,
            "host",
            format!("NCCL_IB_HCA={v} selects no RDMA device: NCCL falls back to sockets"),
        )
        .fix("set NCCL_IB_HCA to existing devices (see the recommendation below) or unset it")
    } else if !missing.is_empty() && !list.exclude {
        Finding::new(
            "nccl.ib_hca",
            Severity::Fail,
            "host",
            format!("NCCL_IB_HCA names {} which does not exist", missing.join(", ")),
        )
        .fix("remove the names that do not exist (`ibv_devices` lists the real ones), or unset NCCL_IB_HCA")
    } else if !bad_ports.is_empty() {
        Finding::new(
            "nccl.ib_hca",
            Severity::Fail,
            "host",
            format!("NCCL_IB_HCA names a port NCCL cannot use: {}", bad_ports.join("; ")),
        )
        .fix("name an active port (`ibv_devinfo` lists them), or leave the port out so NCCL uses every port")
    } else if !widened.is_empty() {
        Finding::new(
            "nccl.ib_hca",
            Severity::Warn,
            "host",
            format!(
                "NCCL_IB_HCA={v} selects {} (NCCL matches prefixes: {})",
                selected.join(", "),
                widened.join(", ")
            ),
        )
        .fix(format!(
            "prefix the list with `=` for exact names: NCCL_IB_HCA=={}",
            v.trim_start_matches('=')
        ))
    } else {
        let what: Vec<String> = selected
            .iter()
            .map(|d| match list.port_for(d) {
                Some(p) => format!("{d} port {p}"),
                None => d.to_string(),
            })
            .collect();
        Finding::new(
            "nccl.ib_hca",
            Severity::Ok,
            "host",
            format!("NCCL_IB_HCA selects {}", what.join(", ")),
        )
    };
    f.evidence.append(&mut ev);
    f.evidence.extend(bad_ports.iter().cloned());
    f
}

fn gid_index(snap: &Snapshot, v: &str) -> Finding {
    let since = "NCCL >= 2.21 selects the GID itself when NCCL_IB_GID_INDEX is unset (default -1: RoCE v2 by NCCL_IB_ROCE_VERSION_NUM=2, IPv4 by NCCL_IB_ADDR_FAMILY=AF_INET); before 2.21 the default index was 0";
    let ev = format!("NCCL_IB_GID_INDEX={v}");
    let Some(n) = nccl_int(v) else {
        return Finding::new(
            "nccl.ib_gid_index",
            Severity::Fail,
            "host",
            format!("NCCL_IB_GID_INDEX={v:?} is not a number: NCCL ignores it and uses its default"),
        )
        .evidence(ev)
        .evidence(since)
        .fix("set the index of the RoCE v2 IPv4 GID (see roce.gid_index), or unset it with NCCL >= 2.21");
    };
    if n < 0 {
        return Finding::new(
            "nccl.ib_gid_index",
            Severity::Ok,
            "host",
            format!("NCCL_IB_GID_INDEX={n}: NCCL >= 2.21 selects the GID itself (older NCCL reads it as an index and fails)"),
        )
        .evidence(ev)
        .evidence(since);
    }
    let ports = selected_ports(snap);
    let roce: Vec<_> = ports.iter().filter(|(_, p)| is_ethernet(p)).collect();
    if roce.is_empty() {
        let mut f = Finding::new(
            "nccl.ib_gid_index",
            Severity::Ok,
            "host",
            format!("NCCL_IB_GID_INDEX={n} has no effect here: no RoCE port is used (the GID index matters for RoCE, not InfiniBand)"),
        )
        .evidence(ev);
        for (d, p) in &ports {
            f = f.evidence(format!(
                "{} port {}: {}",
                d.name,
                p.port,
                p.link_layer.as_deref().unwrap_or("link layer unknown")
            ));
        }
        return f;
    }
    let mut sevs = Vec::new();
    let mut msgs = Vec::new();
    let mut f = Finding::new("nccl.ib_gid_index", Severity::Ok, "host", "").evidence(ev);
    let mut better = Vec::new();
    for (d, p) in roce {
        let at = format!("{} port {}", d.name, p.port);
        let good = p
            .gids
            .iter()
            .find(|g| g.is_roce_v2() && g.is_ipv4_mapped())
            .map(|g| g.index);
        if let Some(g) = good {
            better.push(g);
        }
        match p.gids.iter().find(|g| i64::from(g.index) == n) {
            None => {
                sevs.push(Severity::Fail);
                msgs.push(format!(
                    "{at} has no GID at index {n}: queue pairs fail to connect"
                ));
            }
            Some(g) if !g.is_roce_v2() => {
                sevs.push(Severity::Fail);
                msgs.push(format!("{at}: index {n} is {}: RoCE v1 is not routable and peers on RoCE v2 cannot talk to it", gid_text(g)));
            }
            Some(g) if is_link_local(g) => {
                sevs.push(Severity::Fail);
                msgs.push(format!("{at}: index {n} is {}: link-local addresses do not route across subnets and NCCL's peers default to IPv4", gid_text(g)));
            }
            Some(g) if !g.is_ipv4_mapped() => {
                sevs.push(Severity::Warn);
                msgs.push(format!(
                    "{at}: index {n} is {}: every peer must then use IPv6 GIDs too",
                    gid_text(g)
                ));
            }
            Some(g) => {
                sevs.push(Severity::Ok);
                msgs.push(format!("{at}: index {n} is {}", gid_text(g)));
            }
        }
        for g in &p.gids {
            f = f.evidence(format!("{at} gid[{}] {}", g.index, gid_text(g)));
        }
    }
    f.severity = worst(&sevs);
    f.message = format!("NCCL_IB_GID_INDEX={n}: {}", msgs.join("; "));
    f = f.evidence(since);
    better.sort_unstable();
    better.dedup();
    if f.severity != Severity::Ok {
        f = f.fix(match better.as_slice() {
            [g] => format!("export NCCL_IB_GID_INDEX={g} (the RoCE v2 IPv4 GID), or with NCCL >= 2.21 unset it"),
            _ => "with NCCL >= 2.21 unset NCCL_IB_GID_INDEX (the RoCE v2 IPv4 GID differs between ports, NCCL picks it per port); `show_gids` lists them".to_string(),
        });
    }
    f
}

fn roce_version(snap: &Snapshot, v: &str) -> Finding {
    let ev = format!("NCCL_IB_ROCE_VERSION_NUM={v}");
    if snap.env.contains_key("NCCL_IB_GID_INDEX") {
        return Finding::new(
            "nccl.ib_roce_version",
            Severity::Warn,
            "host",
            format!("NCCL_IB_ROCE_VERSION_NUM={v} is ignored: it only steers NCCL's GID auto-selection (NCCL >= 2.21), which NCCL_IB_GID_INDEX turns off"),
        )
        .evidence(ev)
        .fix("unset one of the two: NCCL_IB_GID_INDEX to let NCCL choose, or NCCL_IB_ROCE_VERSION_NUM");
    }
    let want = match nccl_int(v) {
        Some(1) => "IB/RoCE v1",
        Some(2) => "RoCE v2",
        _ => {
            return Finding::new(
                "nccl.ib_roce_version",
                Severity::Warn,
                "host",
                format!(
                    "NCCL_IB_ROCE_VERSION_NUM={v:?} is neither 1 nor 2 (default 2, NCCL >= 2.21)"
                ),
            )
            .evidence(ev)
            .fix("unset it (RoCE v2 is the default and the routable one)");
        }
    };
    let ports = selected_ports(snap);
    let missing: Vec<String> = ports
        .iter()
        .filter(|(_, p)| is_ethernet(p))
        .filter(|(_, p)| {
            !p.gids.iter().any(|g| {
                g.gid_type
                    .as_deref()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case(want))
            })
        })
        .map(|(d, p)| format!("{} port {}", d.name, p.port))
        .collect();
    let mut f = if !missing.is_empty() {
        Finding::new(
            "nccl.ib_roce_version",
            Severity::Fail,
            "host",
            format!("NCCL_IB_ROCE_VERSION_NUM={v}: no {want} GID on {}", missing.join(", ")),
        )
        .fix("unset it (default 2), or give the port's netdev an IP address so the kernel adds the GIDs")
    } else if want == "IB/RoCE v1" {
        Finding::new(
            "nccl.ib_roce_version",
            Severity::Warn,
            "host",
            "NCCL_IB_ROCE_VERSION_NUM=1 makes NCCL pick RoCE v1 GIDs: not routable beyond one L2 domain",
        )
        .fix("unset it (default 2, RoCE v2)")
    } else {
        Finding::new(
            "nccl.ib_roce_version",
            Severity::Ok,
            "host",
            "NCCL_IB_ROCE_VERSION_NUM=2 (NCCL's default since 2.21): NCCL picks RoCE v2 GIDs",
        )
    };
    f.evidence.insert(0, ev);
    f
}

fn addr_family(snap: &Snapshot, v: &str) -> Finding {
    let ev = format!("NCCL_IB_ADDR_FAMILY={v}");
    if snap.env.contains_key("NCCL_IB_GID_INDEX") {
        return Finding::new(
            "nccl.ib_addr_family",
            Severity::Warn,
            "host",
            format!("NCCL_IB_ADDR_FAMILY={v} is ignored: it only steers NCCL's GID auto-selection (NCCL >= 2.21), which NCCL_IB_GID_INDEX turns off"),
        )
        .evidence(ev)
        .fix("unset one of the two: NCCL_IB_GID_INDEX to let NCCL choose, or NCCL_IB_ADDR_FAMILY");
    }
    let v6 = match v {
        "AF_INET" => false,
        "AF_INET6" => true,
        _ => {
            return Finding::new(
                "nccl.ib_addr_family",
                Severity::Warn,
                "host",
                format!("NCCL_IB_ADDR_FAMILY={v:?} is neither AF_INET nor AF_INET6 (case-sensitive): NCCL keeps the default AF_INET"),
            )
            .evidence(ev)
            .fix("unset it, or set AF_INET / AF_INET6");
        }
    };
    let ports = selected_ports(snap);
    let missing: Vec<String> = ports
        .iter()
        .filter(|(_, p)| is_ethernet(p))
        .filter(|(_, p)| {
            !p.gids.iter().any(|g| {
                g.is_roce_v2()
                    && if v6 {
                        !g.is_ipv4_mapped() && !is_link_local(g)
                    } else {
                        g.is_ipv4_mapped()
                    }
            })
        })
        .map(|(d, p)| format!("{} port {}", d.name, p.port))
        .collect();
    let fam = if v6 { "routable IPv6" } else { "IPv4" };
    let mut f = if missing.is_empty() {
        Finding::new(
            "nccl.ib_addr_family",
            Severity::Ok,
            "host",
            format!("NCCL_IB_ADDR_FAMILY={v}: every RoCE port used has a RoCE v2 {fam} GID"),
        )
    } else {
        Finding::new(
            "nccl.ib_addr_family",
            Severity::Fail,
            "host",
            format!(
                "NCCL_IB_ADDR_FAMILY={v}: no RoCE v2 {fam} GID on {}",
                missing.join(", ")
            ),
        )
        .fix(if v6 {
            "give the netdev a global IPv6 address (link-local fe80:: GIDs are not routed), or unset it (AF_INET)"
        } else {
            "give the netdev an IPv4 address (`ip addr add`), or unset it"
        })
    };
    f.evidence.insert(0, ev);
    f
}

fn socket_ifname(snap: &Snapshot, v: &str) -> Finding {
    let rdma_netdevs: Vec<String> = snap
        .rdma
        .iter()
        .flat_map(|d| {
            d.ports
                .iter()
                .flat_map(|p| p.netdevs.iter().map(|n| n.name.clone()))
        })
        .collect();
    let list = parse_hca(v);
    let hits: Vec<&String> = rdma_netdevs.iter().filter(|n| list.selects(n)).collect();
    let mut f = Finding::new(
        "nccl.socket_ifname",
        Severity::Ok,
        "host",
        format!("NCCL_SOCKET_IFNAME={v} picks the IP interfaces for NCCL's bootstrap, the IB transport's out-of-band connection and the Socket transport; it does not pick the RDMA NIC (NCCL_IB_HCA does)"),
    )
    .evidence(format!("NCCL_SOCKET_IFNAME={v}"))
    .evidence(format!(
        "netdevs of RDMA ports: {}",
        if rdma_netdevs.is_empty() {
            "none".to_string()
        } else {
            rdma_netdevs.join(", ")
        }
    ));
    if !hits.is_empty() {
        f = f.evidence(format!(
            "matches RDMA netdev(s): {}",
            hits.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    f.fix("if NCCL reports `Bootstrap : no socket interface found`, name an interface that exists and has an address on every node (`ip -br addr`); the prefix rules are NCCL_IB_HCA's (`^` excludes, `=` exact)")
}

fn net_gdr_level(v: &str, pairs: &[PairReport]) -> Finding {
    let ev = format!("NCCL_NET_GDR_LEVEL={v}");
    let classes = best_classes(pairs);
    let classes_txt = if classes.is_empty() {
        "no GPU-NIC pair".to_string()
    } else {
        classes
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ev_pairs = format!("best GPU-NIC path classes on this host: {classes_txt}");
    let (level, how) = match read_level(v) {
        LevelRead::Ignored => {
            return Finding::new(
                "nccl.net_gdr_level",
                Severity::Warn,
                "host",
                format!("NCCL_NET_GDR_LEVEL={v} is not a level NCCL knows (names are compared case-sensitively): NCCL ignores it and keeps its default PXB"),
            )
            .evidence(ev)
            .evidence(ev_pairs)
            .fix("use an upper-case name: LOC, PIX, PXB, PHB or SYS");
        }
        LevelRead::Legacy(n, l) => (l, format!(" (the legacy integer {n}, which NCCL reads as {}: 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and above SYS)", l.name())),
        LevelRead::Name(l) => (l, String::new()),
    };
    let blocked: Vec<&PathClass> = classes.iter().filter(|c| !level.allows(**c)).collect();
    let legacy = matches!(read_level(v), LevelRead::Legacy(..));
    let mut f = if !blocked.is_empty() {
        Finding::new(
            "nccl.net_gdr_level",
            Severity::Warn,
            "host",
            format!(
                "NCCL_NET_GDR_LEVEL={v}{how} is stricter than this host's {} path(s), where NCCL stages through host memory instead of GPUDirect RDMA",
                blocked.iter().map(|c| c.name()).collect::<Vec<_>>().join("/")
            ),
        )
        .fix("unset it (default PXB), or name the class GPUDirect should cover, e.g. NCCL_NET_GDR_LEVEL=PHB; per-pair detail: nccl.gdr_level")
    } else {
        let mut f = Finding::new(
            "nccl.net_gdr_level",
            Severity::Ok,
            "host",
            format!(
                "NCCL_NET_GDR_LEVEL={v}{how} allows GPUDirect RDMA on every best GPU-NIC path here"
            ),
        );
        if legacy {
            f.severity = Severity::Warn;
            f = f.fix(format!("write the name instead (NCCL_NET_GDR_LEVEL={}): integer meanings changed across NCCL versions", level.name()));
        }
        f
    };
    f.evidence.insert(0, ev);
    f.evidence.push(ev_pairs);
    f.evidence
        .push("NCCL's default is PXB (with NCCL_NET_GDR_C2C=1, the default since 2.27, also C2C-attached NICs)".into());
    f
}

fn net_gdr_read(v: &str) -> Finding {
    let ev = format!("NCCL_NET_GDR_READ={v}");
    let default = "default: enabled on NVLink platforms since NCCL 2.4.2 and, in current NCCL (paths.cc), on every GPU of compute capability >= 8.0; disabled on older GPUs without NVLink";
    match nccl_int(v) {
        Some(0) => Finding::new(
            "nccl.net_gdr_read",
            Severity::Warn,
            "host",
            "NCCL_NET_GDR_READ=0: sends stage through host memory (the NIC does not read GPU memory); only receives use GPUDirect RDMA, and the log shows GDRDMA on [receive] channels only",
        )
        .evidence(ev)
        .evidence(default)
        .fix("unset it to get NCCL's per-platform default, or 1 to read GPU memory directly when sending"),
        Some(1) => Finding::new(
            "nccl.net_gdr_read",
            Severity::Ok,
            "host",
            "NCCL_NET_GDR_READ=1: the NIC reads GPU memory directly when sending (within NCCL_NET_GDR_LEVEL); on pre-Ampere PCIe systems this can be slightly slower than staging",
        )
        .evidence(ev)
        .evidence(default),
        _ => Finding::new(
            "nccl.net_gdr_read",
            Severity::Warn,
            "host",
            format!("NCCL_NET_GDR_READ={v:?} is neither 0 nor 1"),
        )
        .evidence(ev)
        .evidence(default)
        .fix("set 0 or 1, or unset it"),
    }
}

fn relaxed_ordering(snap: &Snapshot, v: &str) -> Finding {
    let ev = format!("NCCL_IB_PCI_RELAXED_ORDERING={v}");
    let mut nic_ro = Vec::new();
    for (d, _) in selected_ports(snap) {
        let Some(pci) = d.pci_bdf.as_deref().and_then(|b| snap.pci_device(b)) else {
            continue;
        };
        let ro = pci
            .config_bytes()
            .map_or(RelaxedOrdering::Unknown, |c| pcie::relaxed_ordering(&c));
        nic_ro.push((d.name.clone(), ro));
    }
    let off: Vec<&str> = nic_ro
        .iter()
        .filter(|(_, r)| *r == RelaxedOrdering::Disabled)
        .map(|(n, _)| n.as_str())
        .collect();
    let mut f = match nccl_int(v) {
        Some(0) => Finding::new(
            "nccl.ib_relaxed_ordering",
            Severity::Warn,
            "host",
            "NCCL_IB_PCI_RELAXED_ORDERING=0: NCCL registers memory without relaxed ordering; NIC writes into GPU memory can be much slower, above all in virtual machines",
        )
        .fix("unset it (default 2: use relaxed ordering when available, NCCL >= 2.12)"),
        Some(1) => Finding::new(
            "nccl.ib_relaxed_ordering",
            Severity::Ok,
            "host",
            "NCCL_IB_PCI_RELAXED_ORDERING=1: NCCL forces relaxed ordering and fails if registration cannot use it (IBV_ACCESS_RELAXED_ORDERING, rdma-core >= 28)",
        ),
        Some(2) => Finding::new(
            "nccl.ib_relaxed_ordering",
            Severity::Ok,
            "host",
            "NCCL_IB_PCI_RELAXED_ORDERING=2 (the default since NCCL 2.12): relaxed ordering when available ([RO] on the `NET/IB : Using` line)",
        ),
        _ => Finding::new(
            "nccl.ib_relaxed_ordering",
            Severity::Warn,
            "host",
            format!("NCCL_IB_PCI_RELAXED_ORDERING={v:?} is not 0, 1 or 2"),
        )
        .fix("unset it (default 2)"),
    };
    f.evidence.insert(0, ev);
    for (n, r) in &nic_ro {
        f.evidence
            .push(format!("{n}: PCIe Device Control relaxed ordering {r:?}"));
    }
    if !off.is_empty() && f.severity == Severity::Ok {
        f.severity = Severity::Warn;
        f.message.push_str(&format!(
            "; but relaxed ordering is off in the PCIe Device Control of {}, so the NIC sends strictly ordered writes anyway",
            off.join(", ")
        ));
        f = f.fix("enable it on the NIC function (see pcie.relaxed_ordering)");
    }
    f
}

fn dmabuf_enable(host: &HostFacts, v: &str) -> Finding {
    let ev = format!("NCCL_DMABUF_ENABLE={v}");
    let ready = if host.gpus.is_empty() {
        Tri::Unknown
    } else if host.gpus.iter().all(|g| g.dmabuf == Tri::Yes) {
        Tri::Yes
    } else if host.gpus.iter().any(|g| g.dmabuf == Tri::No) {
        Tri::No
    } else {
        Tri::Unknown
    };
    let ev_host = format!(
        "this host: peer-memory module {}, dma-buf {}",
        if host.peermem { "loaded" } else { "not loaded" },
        match ready {
            Tri::Yes => "possible",
            Tri::No => "not possible (see dmabuf.readiness)",
            Tri::Unknown => "unknown",
        }
    );
    match nccl_int(v) {
        Some(0) if !host.peermem => Finding::new(
            "nccl.dmabuf_enable",
            Severity::Fail,
            "host",
            "NCCL_DMABUF_ENABLE=0 turns dma-buf registration off and no peer-memory module is loaded: NCCL cannot register GPU memory with the NIC, so it uses no GPUDirect RDMA",
        )
        .evidence(ev)
        .evidence(ev_host)
        .fix("unset NCCL_DMABUF_ENABLE (default 1 since NCCL 2.13), or `modprobe nvidia-peermem`"),
        Some(0) => Finding::new(
            "nccl.dmabuf_enable",
            Severity::Ok,
            "host",
            "NCCL_DMABUF_ENABLE=0: NCCL registers GPU memory through the peer-memory module (loaded) instead of dma-buf",
        )
        .evidence(ev)
        .evidence(ev_host),
        Some(1) if ready == Tri::No && !host.peermem => Finding::new(
            "nccl.dmabuf_enable",
            Severity::Fail,
            "host",
            "NCCL_DMABUF_ENABLE=1, but dma-buf is not possible on this host and no peer-memory module is loaded: NCCL silently disables dma-buf and uses no GPUDirect RDMA",
        )
        .evidence(ev)
        .evidence(ev_host)
        .fix("see dmabuf.readiness for what dma-buf needs, or `modprobe nvidia-peermem`"),
        Some(1) => Finding::new(
            "nccl.dmabuf_enable",
            Severity::Ok,
            "host",
            "NCCL_DMABUF_ENABLE=1 (the default since NCCL 2.13): dma-buf registration when kernel, CUDA driver and NIC support it (`DMA-BUF is available on GPU device N` in the log)",
        )
        .evidence(ev)
        .evidence(ev_host),
        _ => Finding::new(
            "nccl.dmabuf_enable",
            Severity::Warn,
            "host",
            format!("NCCL_DMABUF_ENABLE={v:?} is neither 0 nor 1"),
        )
        .evidence(ev)
        .fix("unset it (default 1)"),
    }
}

/// What to set instead of NCCL_P2P_LEVEL for GPUDirect RDMA on this host.
fn gdr_level_advice(pairs: &[PairReport]) -> String {
    let classes = best_classes(pairs);
    let list = |cs: &[PathClass]| cs.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ");
    let near: Vec<PathClass> = classes
        .iter()
        .copied()
        .filter(|c| *c <= PathClass::Pxb)
        .collect();
    match classes.last() {
        None => "set NCCL_NET_GDR_LEVEL instead (LOC, PIX, PXB, PHB or SYS; default PXB): it chooses how far apart GPU and NIC may be for GPUDirect RDMA".to_string(),
        Some(c) if *c <= PathClass::Pxb => format!(
            "set NCCL_NET_GDR_LEVEL instead: this host's best GPU-NIC paths are {}, which NCCL's default NCCL_NET_GDR_LEVEL=PXB already covers (export NCCL_NET_GDR_LEVEL=PXB to be explicit)",
            list(&classes)
        ),
        Some(PathClass::Phb) => format!(
            "set NCCL_NET_GDR_LEVEL instead: this host's best GPU-NIC paths are {}; export NCCL_NET_GDR_LEVEL=PHB allows GPUDirect RDMA over the host bridge too (measure against staging: `gdr bw --use-cuda`)",
            list(&classes)
        ),
        Some(_) => format!(
            "set NCCL_NET_GDR_LEVEL instead: this host's best GPU-NIC paths are {}; {}for the SYS path(s) staging is usually faster than GPUDirect RDMA, so fix the placement, or export NCCL_NET_GDR_LEVEL=SYS only if `gdr bw --use-cuda` measures it faster",
            list(&classes),
            if near.is_empty() {
                String::new()
            } else {
                format!("NCCL_NET_GDR_LEVEL=PXB (the default) gives GPUDirect RDMA on the {} pair(s); ", list(&near))
            }
        ),
    }
}

fn p2p(level: Option<&str>, disable: Option<&str>, pairs: &[PairReport]) -> Vec<Finding> {
    let mut out = Vec::new();
    let advice = gdr_level_advice(pairs);
    let disabled = disable.and_then(nccl_int) == Some(1);
    if let Some(v) = disable {
        let f = if disabled {
            Finding::new(
                "nccl.p2p_disable",
                Severity::Warn,
                "host",
                "NCCL_P2P_DISABLE=1 turns off the P2P transport between GPUs of one node (NVLink/PCIe peer access; traffic then goes through host shared memory); it has no effect on GPUDirect RDMA between GPU and NIC",
            )
            .fix(format!("unset it unless intra-node peer access is broken here; {advice}"))
        } else {
            Finding::new(
                "nccl.p2p_disable",
                Severity::Ok,
                "host",
                format!("NCCL_P2P_DISABLE={v}: the P2P transport between GPUs of one node stays on (only 1 disables it); it does not concern GPUDirect RDMA"),
            )
        };
        out.push(f.evidence(format!("NCCL_P2P_DISABLE={v}")));
    }
    if let Some(v) = level {
        let ev = format!("NCCL_P2P_LEVEL={v}");
        let misreading = "NCCL_P2P_LEVEL governs GPU-to-GPU peer access inside one node (the P2P transport over NVLink or PCIe), not GPUDirect RDMA between GPU and NIC";
        let (sev, msg) = match read_level(v) {
            LevelRead::Legacy(n, l) => (
                Severity::Warn,
                format!("NCCL_P2P_LEVEL={v} does not enable GPUDirect RDMA: {misreading}. {n} is a legacy integer, which NCCL reads as {} (values above 4 mean SYS)", l.name()),
            ),
            LevelRead::Name(l) => (
                Severity::Warn,
                format!("NCCL_P2P_LEVEL={} does not enable GPUDirect RDMA: {misreading}", l.name()),
            ),
            LevelRead::Ignored => (
                Severity::Warn,
                format!("NCCL_P2P_LEVEL={v} is not a level NCCL knows (names are case-sensitive), so NCCL ignores it; and it would not enable GPUDirect RDMA anyway: {misreading}"),
            ),
        };
        let mut f = Finding::new("nccl.p2p_level", sev, "host", msg)
            .evidence(ev)
            .evidence("NCCL's integer form is legacy: 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 SYS; above 4 is SYS; NVL has no integer");
        if disabled {
            f = f.evidence("NCCL_P2P_DISABLE=1 is set and takes precedence over NCCL_P2P_LEVEL");
        }
        out.push(f.fix(format!(
            "unset NCCL_P2P_LEVEL unless you mean intra-node GPU peer access; {advice}; check the result with `NCCL_DEBUG=INFO` and `gdr doctor nccl-log` (`via NET/IB/<n>/GDRDMA`)"
        )));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hca_syntax() {
        let l = parse_hca("^=mlx5_0:1,mlx5_1");
        assert!(l.exclude && l.exact);
        assert_eq!(
            l.entries,
            [
                ("mlx5_0".to_string(), Some(1)),
                ("mlx5_1".to_string(), None)
            ]
        );
        let l = parse_hca("mlx5");
        assert!(l.matches("mlx5", "mlx5_3"));
        // Rail and plane fields (NCCL 2.27+), and an empty port meaning every port.
        let l = parse_hca("=mlx5_0:1:0:0,mlx5_1::0:1");
        assert_eq!(
            l.entries,
            [
                ("mlx5_0".to_string(), Some(1)),
                ("mlx5_1".to_string(), None)
            ]
        );
    }

    #[test]
    fn levels_are_read_as_nccl_reads_them() {
        assert_eq!(
            read_level("PXB"),
            LevelRead::Name(Level::UpTo(PathClass::Pxb, "PXB"))
        );
        // Case-sensitive strcmp in ncclGetLevel: lower case is ignored, not upper-cased.
        assert_eq!(read_level("pxb"), LevelRead::Ignored);
        assert_eq!(read_level("NODE"), LevelRead::Ignored);
        assert_eq!(read_level(""), LevelRead::Ignored);
        assert_eq!(
            read_level("5"),
            LevelRead::Legacy(5, Level::UpTo(PathClass::Sys, "SYS"))
        );
        assert_eq!(read_level("0"), LevelRead::Legacy(0, Level::Never));
        assert_eq!(
            read_level("3"),
            LevelRead::Legacy(3, Level::UpTo(PathClass::Phb, "PHB"))
        );
        // strtol stops at the first non-digit; a huge number is still "above 4".
        assert_eq!(
            read_level("2x"),
            LevelRead::Legacy(2, Level::UpTo(PathClass::Pxb, "PXB"))
        );
        assert!(matches!(
            read_level("99999999999999999999999"),
            LevelRead::Legacy(_, Level::UpTo(PathClass::Sys, _))
        ));
        assert!(Level::UpTo(PathClass::Pxb, "PXN").allows(PathClass::Pix));
        assert!(!Level::UpTo(PathClass::Pxb, "PXN").allows(PathClass::Phb));
        assert!(!Level::NvlinkOnly("NVL").allows(PathClass::Pix));
        assert!(!Level::Never.allows(PathClass::Pix));
    }

    /// The failing DGX fixture (one RoCE NIC mlx5_0 port 1 whose GIDs are v1/v2 link-local at
    /// 0/1 and v1/v2 IPv4 at 2/3; no peer memory, no dma-buf; a PIX and a SYS pair) with `env`.
    fn dgx(env: &[(&str, &str)]) -> super::super::Report {
        let mut snap = Snapshot::from_json(
            include_str!("../tests/fixtures/doctor/snapshots/dgx-a100-failing.json"),
            "dgx",
        )
        .unwrap();
        snap.env.clear();
        for (k, v) in env {
            snap.env.insert(k.to_string(), v.to_string());
        }
        super::super::diagnose(&snap)
    }

    fn one(r: &super::super::Report, id: &str) -> Finding {
        let v: Vec<&Finding> = r.findings_with_id(id).collect();
        assert_eq!(v.len(), 1, "{id}: {v:?}");
        v[0].clone()
    }

    #[test]
    fn every_variable_is_cross_checked_with_the_host() {
        // Unset variables give no finding.
        let r = dgx(&[]);
        assert!(r.all_findings().all(|f| !f.id.starts_with("nccl.")));
        let r = dgx(&[("NCCL_IB_DISABLE", "1")]);
        let f = one(&r, "nccl.ib_disable");
        assert_eq!(f.severity, Severity::Fail);
        assert!(
            f.message.contains("although 1 RDMA device(s) are present"),
            "{}",
            f.message
        );
        let f = one(&dgx(&[("NCCL_IB_HCA", "mlx5_0:2")]), "nccl.ib_hca");
        assert_eq!(f.severity, Severity::Fail);
        assert!(
            f.message.contains("mlx5_0 has no port 2 (ports: 1)"),
            "{}",
            f.message
        );
        let f = one(&dgx(&[("NCCL_IB_HCA", "mlx5_3")]), "nccl.ib_hca");
        assert_eq!(f.severity, Severity::Fail);
        // GID index on a RoCE v1 entry, on an IPv6 link-local v2 entry, past the table.
        for (idx, want) in [
            ("2", "RoCE v1 is not routable"),
            ("1", "link-local addresses do not route"),
            ("9", "has no GID at index 9"),
        ] {
            let f = one(&dgx(&[("NCCL_IB_GID_INDEX", idx)]), "nccl.ib_gid_index");
            assert_eq!(f.severity, Severity::Fail, "{idx}");
            assert!(f.message.contains(want), "{idx}: {}", f.message);
            assert!(f.fix.as_deref().unwrap().contains("NCCL_IB_GID_INDEX=3"));
        }
        let f = one(&dgx(&[("NCCL_IB_GID_INDEX", "-1")]), "nccl.ib_gid_index");
        assert_eq!(f.severity, Severity::Ok);
        // Auto-selection knobs are ignored once the index is set.
        let r = dgx(&[
            ("NCCL_IB_GID_INDEX", "3"),
            ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
        ]);
        assert_eq!(one(&r, "nccl.ib_addr_family").severity, Severity::Warn);
        let f = one(
            &dgx(&[("NCCL_IB_ADDR_FAMILY", "AF_INET6")]),
            "nccl.ib_addr_family",
        );
        assert_eq!(
            f.severity,
            Severity::Fail,
            "only link-local IPv6 GIDs: {}",
            f.message
        );
        let f = one(
            &dgx(&[("NCCL_IB_ROCE_VERSION_NUM", "2")]),
            "nccl.ib_roce_version",
        );
        assert_eq!(f.severity, Severity::Ok);
        // dma-buf off with no peer memory: nothing can register GPU memory.
        let f = one(&dgx(&[("NCCL_DMABUF_ENABLE", "0")]), "nccl.dmabuf_enable");
        assert_eq!(f.severity, Severity::Fail);
        let f = one(&dgx(&[("NCCL_DMABUF_ENABLE", "1")]), "nccl.dmabuf_enable");
        assert_eq!(f.severity, Severity::Fail, "{}", f.message);
        assert_eq!(
            one(&dgx(&[("NCCL_NET", "Socket")]), "nccl.net").severity,
            Severity::Fail
        );
        assert_eq!(
            one(&dgx(&[("NCCL_NET", "ib")]), "nccl.net").severity,
            Severity::Ok
        );
        assert_eq!(
            one(&dgx(&[("NCCL_NET_PLUGIN", "none")]), "nccl.net_plugin").severity,
            Severity::Ok
        );
        assert_eq!(
            one(&dgx(&[("NCCL_NET_GDR_READ", "0")]), "nccl.net_gdr_read").severity,
            Severity::Warn
        );
        assert_eq!(
            one(
                &dgx(&[("NCCL_IB_PCI_RELAXED_ORDERING", "0")]),
                "nccl.ib_relaxed_ordering"
            )
            .severity,
            Severity::Warn
        );
        assert_eq!(
            one(
                &dgx(&[("NCCL_SOCKET_IFNAME", "enp8")]),
                "nccl.socket_ifname"
            )
            .evidence[2],
            "matches RDMA netdev(s): enp8s0f0"
        );
        // NCCL_NET_GDR_LEVEL: the legacy integer 3 is PHB, stricter than the SYS pair; a
        // lower-case name is ignored by NCCL.
        let r = dgx(&[("NCCL_NET_GDR_LEVEL", "3")]);
        let f = one(&r, "nccl.net_gdr_level");
        assert_eq!(f.severity, Severity::Warn);
        assert!(
            f.message
                .contains("legacy integer 3, which NCCL reads as PHB"),
            "{}",
            f.message
        );
        assert!(r.findings_with_id("nccl.gdr_level").any(|f| f
            .message
            .contains("NCCL_NET_GDR_LEVEL=PHB is stricter than this pair's SYS path")));
        let f = one(&dgx(&[("NCCL_NET_GDR_LEVEL", "sys")]), "nccl.net_gdr_level");
        assert!(
            f.message.contains("not a level NCCL knows"),
            "{}",
            f.message
        );
        // P2P: the misreading, and P2P_DISABLE's precedence.
        let r = dgx(&[("NCCL_P2P_LEVEL", "SYS"), ("NCCL_P2P_DISABLE", "1")]);
        assert_eq!(one(&r, "nccl.p2p_disable").severity, Severity::Warn);
        let f = one(&r, "nccl.p2p_level");
        assert!(f.evidence.iter().any(|e| e.contains("takes precedence")));
        assert!(f
            .fix
            .as_deref()
            .unwrap()
            .contains("set NCCL_NET_GDR_LEVEL instead"));
        let f = one(&dgx(&[("NCCL_DEBUG", "WARN")]), "nccl.debug");
        assert!(f.fix.as_deref().unwrap().contains("NCCL_DEBUG=INFO"));
        let f = one(
            &dgx(&[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "COLL")]),
            "nccl.debug",
        );
        assert_eq!(f.severity, Severity::Warn);
    }

    #[test]
    fn integers_are_read_as_strtoll_reads_them() {
        assert_eq!(nccl_int("1"), Some(1));
        assert_eq!(nccl_int(" 3"), Some(3));
        assert_eq!(nccl_int("0x10"), Some(16));
        assert_eq!(nccl_int("010"), Some(8));
        assert_eq!(nccl_int("-1"), Some(-1));
        assert_eq!(nccl_int("0"), Some(0));
        assert_eq!(nccl_int("1 "), None);
        assert_eq!(nccl_int("yes"), None);
        assert_eq!(nccl_int(""), None);
        assert_eq!(nccl_int("-"), None);
        assert_eq!(nccl_int("99999999999999999999"), None);
    }
}
