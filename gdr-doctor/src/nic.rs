//! Per RDMA device and port: software device, port state, rate, RoCE v2 GID index, MTU,
//! relaxed ordering, NCCL_IB_GID_INDEX.

use super::host::HostFacts;
use super::{Finding, NicSummary, Severity};
use crate::topology::pcie::{self, RelaxedOrdering};
use crate::topology::{class, PciDevice, RdmaDevice, RdmaPort, Snapshot};

/// An RDMA device as the pair checks see it.
#[derive(Debug, Clone)]
pub(crate) struct NicFacts {
    pub name: String,
    pub bdf: Option<String>,
    pub numa: Option<i32>,
    pub port: Option<u32>,
    pub ethernet: bool,
    pub roce_gid: Option<u32>,
    pub rate_gbps: Option<f64>,
    /// Reasons a pair through this NIC cannot work.
    pub blocking: Vec<String>,
    /// Reasons a pair through this NIC is slow.
    pub slow: Vec<String>,
}

/// Highest port rate of an NVIDIA/Mellanox adapter in Gb/s, by PCI device id (physical
/// functions only).
pub(crate) fn expected_rate_gbps(device_id: u16) -> Option<(f64, &'static str)> {
    Some(match device_id {
        0x1013 => (100.0, "ConnectX-4"),
        0x1015 => (50.0, "ConnectX-4 Lx"),
        0x1017 => (100.0, "ConnectX-5"),
        0x1019 => (100.0, "ConnectX-5 Ex"),
        0x101b => (200.0, "ConnectX-6"),
        0x101d => (100.0, "ConnectX-6 Dx"),
        0x101f => (50.0, "ConnectX-6 Lx"),
        0x1021 => (400.0, "ConnectX-7"),
        0x1023 => (800.0, "ConnectX-8"),
        0xa2d6 => (100.0, "BlueField-2"),
        0xa2dc => (400.0, "BlueField-3"),
        _ => return None,
    })
}

/// Leading number of a sysfs rate, e.g. `200 Gb/sec (4X HDR)` -> 200.
pub(crate) fn rate_gbps(rate: &str) -> Option<f64> {
    rate.split_whitespace().next()?.parse().ok()
}

/// The RoCE active MTU the kernel derives from a netdev MTU (largest IB MTU that fits after the
/// RoCE v2 headers).
pub(crate) fn roce_active_mtu(netdev_mtu: u32) -> u32 {
    // GRH/IPv6 40 + UDP 8 + BTH 12 + largest extended header 28 + ICRC 4 + slack 4.
    let room = netdev_mtu.saturating_sub(96);
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|m| *m <= room)
        .unwrap_or(0)
}

fn is_active(p: &RdmaPort) -> bool {
    p.state.as_deref().is_some_and(|s| s.contains("ACTIVE"))
}

fn chosen_port(d: &RdmaDevice) -> Option<&RdmaPort> {
    d.ports.iter().find(|p| is_active(p)).or(d.ports.first())
}

/// The index of the RoCE v2 GID with an IPv4-mapped address, lowest first.
pub(crate) fn roce_v2_ipv4_gid(p: &RdmaPort) -> Option<u32> {
    p.gids
        .iter()
        .find(|g| g.is_roce_v2() && g.is_ipv4_mapped())
        .map(|g| g.index)
}

/// Every RDMA device of the snapshot: its summary, what the pair checks need, and its findings
/// (software device, port state and rate, RoCE GID and MTU, relaxed ordering).
pub(crate) fn check(
    snap: &Snapshot,
    _host: &HostFacts,
) -> (Vec<NicSummary>, Vec<NicFacts>, Vec<Finding>) {
    let mut summaries = Vec::new();
    let mut facts = Vec::new();
    let mut out = Vec::new();
    let env_gid = snap.env.get("NCCL_IB_GID_INDEX").cloned();
    for d in &snap.rdma {
        let pci = d.pci_bdf.as_deref().and_then(|b| snap.pci_device(b));
        let mut nf = NicFacts {
            name: d.name.clone(),
            bdf: d.pci_bdf.clone(),
            numa: pci.and_then(|p| p.numa_node).filter(|n| *n >= 0),
            port: None,
            ethernet: false,
            roce_gid: None,
            rate_gbps: None,
            blocking: Vec::new(),
            slow: Vec::new(),
        };
        if d.pci_bdf.is_none() {
            out.push(software_device(d, &mut nf));
        }
        let adapter = Adapter::of(d, pci);
        if d.ports.is_empty() {
            out.push(
                Finding::new(
                    "port.state",
                    Severity::Fail,
                    &d.name,
                    "device has no ports in sysfs",
                )
                .fix("check the driver (`dmesg | grep -i mlx5`) and `ibv_devinfo`"),
            );
            nf.blocking.push(format!("{} has no ports", d.name));
        }
        let chosen = chosen_port(d).map(|p| p.port);
        for p in &d.ports {
            let port = PortCtx::new(d, p, Some(p.port) == chosen);
            check_port(&port, &adapter, env_gid.as_deref(), &mut nf, &mut out);
        }
        if let Some(pci) = pci {
            out.push(relaxed_ordering(d, pci, &mut nf));
        }
        summaries.push(NicSummary {
            name: d.name.clone(),
            bdf: d.pci_bdf.clone(),
            numa_node: nf.numa,
            fw_ver: d.fw_ver.clone(),
            port: nf.port,
            link_layer: chosen_port(d).and_then(|p| p.link_layer.clone()),
            rate: chosen_port(d).and_then(|p| p.rate.clone()),
            roce_v2_gid_index: nf.roce_gid,
        });
        facts.push(nf);
    }
    (summaries, facts, out)
}

/// A device with no PCI function (rxe, siw): it cannot reach GPU memory.
fn software_device(d: &RdmaDevice, nf: &mut NicFacts) -> Finding {
    let on = d
        .parent
        .as_deref()
        .map(|p| format!(" (on {p})"))
        .unwrap_or_default();
    nf.blocking
        .push(format!("{} is a software device (no PCI function)", d.name));
    Finding::new(
        "nic.software",
        Severity::Warn,
        &d.name,
        format!("{}{on} is a software RDMA device with no PCI function: it pins host pages and cannot reach GPU memory", d.name),
    )
    .evidence(format!("/sys/class/infiniband/{}/device is not a PCI device", d.name))
    .fix("for GPUDirect RDMA use a hardware RDMA NIC (ConnectX, BlueField, ...); rxe/siw are for testing the host path")
}

/// The adapter model behind a device, for its expected port rate.
struct Adapter {
    /// The PCI device id (from PCI, or `hca_type`: MT4123 = 0x101b).
    id: Option<u16>,
    /// The highest port rate of the model and its name ([`expected_rate_gbps`]).
    expected: Option<(f64, &'static str)>,
}

impl Adapter {
    fn of(d: &RdmaDevice, pci: Option<&PciDevice>) -> Self {
        let id = pci
            .filter(|p| p.vendor == Some(class::VENDOR_MELLANOX))
            .and_then(|p| p.device)
            .or_else(|| {
                d.hca_type
                    .as_deref()
                    .and_then(|h| h.strip_prefix("MT"))
                    .and_then(|n| n.parse::<u16>().ok())
            });
        Adapter {
            id,
            expected: id.and_then(expected_rate_gbps),
        }
    }
}

/// One port of a device, as its findings name it.
struct PortCtx<'a> {
    d: &'a RdmaDevice,
    p: &'a RdmaPort,
    /// `mlx5_0 port 1`.
    subject: String,
    /// Whether the link layer is Ethernet (RoCE).
    eth: bool,
    /// Its network device, or `<netdev>` in commands.
    ndev: String,
    /// Whether pairs use this port (the first active one, else the first).
    chosen: bool,
}

impl<'a> PortCtx<'a> {
    fn new(d: &'a RdmaDevice, p: &'a RdmaPort, chosen: bool) -> Self {
        PortCtx {
            d,
            p,
            subject: format!("{} port {}", d.name, p.port),
            eth: p.link_layer.as_deref() == Some("Ethernet"),
            ndev: p
                .netdevs
                .first()
                .map_or_else(|| "<netdev>".into(), |n| n.name.clone()),
            chosen,
        }
    }
}

/// One port's findings: state, rate, and for RoCE the GID and MTU; the chosen port's facts go
/// into `nf`.
fn check_port(
    port: &PortCtx<'_>,
    adapter: &Adapter,
    env_gid: Option<&str>,
    nf: &mut NicFacts,
    out: &mut Vec<Finding>,
) {
    let p = port.p;
    out.push(port_state(port));
    let rate = p.rate.as_deref().and_then(rate_gbps);
    if let Some(r) = rate {
        out.push(rate_finding(port, r, adapter, nf));
    }
    if port.eth {
        out.push(gid_finding(
            p,
            &port.subject,
            &port.ndev,
            env_gid,
            port.chosen,
            nf,
        ));
        out.extend(mtu_finding(p, &port.subject, port.chosen, nf));
    }
    if port.chosen {
        nf.port = Some(p.port);
        nf.ethernet = port.eth;
        nf.roce_gid = if port.eth { roce_v2_ipv4_gid(p) } else { None };
        nf.rate_gbps = rate;
        if !is_active(p) {
            let state = p.state.as_deref().unwrap_or("unknown");
            nf.blocking
                .push(format!("{} is not active ({state})", port.subject));
        }
    }
}

/// Whether the port is ACTIVE, and if not, how to get it there.
fn port_state(port: &PortCtx<'_>) -> Finding {
    let (d, p, subject, ndev_txt) = (port.d, port.p, &port.subject, &port.ndev);
    let state = p.state.as_deref().unwrap_or("unknown");
    let phys = p.phys_state.as_deref().unwrap_or("unknown");
    let ev_state = format!("state {state}, phys_state {phys}");
    if is_active(p) {
        return Finding::new("port.state", Severity::Ok, subject, "port active").evidence(ev_state);
    }
    let fix = if !phys.contains("LinkUp") {
        if port.eth {
            format!("no physical link: check cable/transceiver and the switch port (`ethtool {ndev_txt}`, `ibstat {} {}`), then `ip link set {ndev_txt} up`", d.name, p.port)
        } else {
            format!("no physical link: check cable/transceiver and the switch port (`ibstat {} {}`, `mlxlink -d {}`)", d.name, p.port, d.bdf_or_name())
        }
    } else if port.eth {
        format!("link is up but the port is not active: `ip link set {ndev_txt} up` and give it an IP address")
    } else {
        "physical link up but logical state not ACTIVE: no subnet manager has configured the port; run opensm on one node or enable the switch's SM".to_string()
    };
    Finding::new(
        "port.state",
        Severity::Fail,
        subject,
        format!("port not active ({state})"),
    )
    .evidence(ev_state)
    .fix(fix)
}

/// The port's rate `r` (Gb/s) against the adapter's maximum; a slower chosen port makes its
/// pairs slow.
fn rate_finding(port: &PortCtx<'_>, r: f64, adapter: &Adapter, nf: &mut NicFacts) -> Finding {
    let (d, p, subject, ndev_txt) = (port.d, port.p, &port.subject, &port.ndev);
    let ev = format!("rate {}", p.rate.as_deref().unwrap_or(""));
    match adapter.expected {
        Some((max, model)) if r < max && is_active(p) => {
            if port.chosen {
                nf.slow.push(format!("{subject} at {r} Gb/s of {max}"));
            }
            Finding::new(
                "port.rate",
                Severity::Warn,
                subject,
                format!("port runs at {r} Gb/s; a {model} port does up to {max} Gb/s"),
            )
            .evidence(ev)
            .evidence(format!("{model} (PCI device id {:#06x})", adapter.id.unwrap_or(0)))
            .fix(if port.eth {
                format!("check what the link negotiated and why: `ethtool {ndev_txt}` (speed, autoneg), the cable/transceiver rating and the switch port speed; `mlxlink -d {}` shows the negotiation", d.bdf_or_name())
            } else {
                format!("check the cable rating and the switch port (`ibstat {} {}`, `mlxlink -d {}`); an HDR port at QDR/EDR speed has a slower cable or switch", d.name, p.port, d.bdf_or_name())
            })
        }
        Some((max, model)) => Finding::new(
            "port.rate",
            Severity::Ok,
            subject,
            format!("port rate {r} Gb/s ({model}, max {max})"),
        )
        .evidence(ev),
        None => Finding::new(
            "port.rate",
            Severity::Ok,
            subject,
            format!("port rate {r} Gb/s (maximum for this adapter not known)"),
        )
        .evidence(ev),
    }
}

/// Relaxed ordering on the NIC's PCIe function.
fn relaxed_ordering(d: &RdmaDevice, pci: &PciDevice, nf: &mut NicFacts) -> Finding {
    let ro = pci
        .config_bytes()
        .map_or(RelaxedOrdering::Unknown, |c| pcie::relaxed_ordering(&c));
    let subject = format!("{} ({})", d.name, pci.bdf);
    match ro {
        RelaxedOrdering::Enabled => Finding::new("pcie.relaxed_ordering", Severity::Ok, subject, "relaxed ordering enabled on the NIC")
            .evidence("PCIe Device Control: RlxdOrd+"),
        RelaxedOrdering::Disabled => {
            nf.slow.push(format!("relaxed ordering off on {}", pci.bdf));
            Finding::new("pcie.relaxed_ordering", Severity::Warn, subject, "relaxed ordering disabled on the NIC: writes into GPU memory can run at less than half speed")
                .evidence("PCIe Device Control: RlxdOrd-")
                .fix(format!("`setpci -s {} CAP_EXP+8.w=0010:0010` sets the enable bit (not persistent); check whether the kernel or BIOS disabled it for this root port, and register with IBV_ACCESS_RELAXED_ORDERING", pci.bdf))
        }
        RelaxedOrdering::Unknown => Finding::new("pcie.relaxed_ordering", Severity::Unknown, subject, "relaxed ordering unknown: the PCIe capability lies beyond the configuration bytes read")
            .evidence(format!("config bytes read: {}", pci.config.as_ref().map_or(0, |c| c.len)))
            .fix("run as root to read the full configuration space"),
    }
}

trait BdfOrName {
    fn bdf_or_name(&self) -> String;
}

impl BdfOrName for RdmaDevice {
    fn bdf_or_name(&self) -> String {
        self.pci_bdf.clone().unwrap_or_else(|| self.name.clone())
    }
}

fn gid_finding(
    p: &RdmaPort,
    subject: &str,
    ndev: &str,
    env_gid: Option<&str>,
    is_chosen: bool,
    nf: &mut NicFacts,
) -> Finding {
    let table: Vec<String> = p
        .gids
        .iter()
        .map(|g| {
            format!(
                "gid[{}] {} {} {}",
                g.index,
                g.gid,
                g.gid_type.as_deref().unwrap_or("?"),
                g.ndev.as_deref().unwrap_or("-")
            )
        })
        .collect();
    let Some(idx) = roce_v2_ipv4_gid(p) else {
        let has_v2 = p.gids.iter().any(|g| g.is_roce_v2());
        let msg = if p.gids.is_empty() {
            "GID table is empty: no IP address on the port's network device".to_string()
        } else if has_v2 {
            "no RoCE v2 GID with an IPv4 address (only IPv6 ones): NCCL's default address family is IPv4".to_string()
        } else {
            "no RoCE v2 GID: only RoCE v1 entries; RoCE v1 is not routable and NCCL prefers v2"
                .to_string()
        };
        if is_chosen {
            nf.blocking.push(format!("{subject}: no RoCE v2 IPv4 GID"));
        }
        let mut f = Finding::new("roce.gid_index", Severity::Fail, subject, msg);
        for t in table {
            f = f.evidence(t);
        }
        return f.fix(format!("give {ndev} an IPv4 address (`ip addr add <a.b.c.d>/<len> dev {ndev}`); check `cma_roce_mode -d <dev> -p <port>` is RoCE v2"));
    };
    let ip = p
        .gids
        .iter()
        .find(|g| g.index == idx)
        .and_then(|g| g.ipv4())
        .unwrap_or_default();
    let mut f = match env_gid.map(|s| s.trim().parse::<i64>()) {
        Some(Ok(v)) if v >= 0 && v != i64::from(idx) => {
            let what = p
                .gids
                .iter()
                .find(|g| i64::from(g.index) == v)
                .map(|g| {
                    format!(
                        "{} {}",
                        g.gid_type.as_deref().unwrap_or("?"),
                        if g.is_ipv4_mapped() { "IPv4" } else { "IPv6" }
                    )
                })
                .unwrap_or_else(|| "an empty slot".into());
            if is_chosen {
                nf.blocking.push(format!(
                    "NCCL_IB_GID_INDEX={v} is not the RoCE v2 IPv4 GID {idx}"
                ));
            }
            Finding::new(
                "roce.gid_index",
                Severity::Fail,
                subject,
                format!("NCCL_IB_GID_INDEX={v} selects {what}; the RoCE v2 IPv4 GID is index {idx}"),
            )
            .fix(format!("export NCCL_IB_GID_INDEX={idx} (or unset it: NCCL picks RoCE v2 IPv4 itself); perftest: `-x {idx}`"))
        }
        Some(Err(_)) => Finding::new(
            "roce.gid_index",
            Severity::Fail,
            subject,
            format!(
                "NCCL_IB_GID_INDEX={:?} is not a number; the RoCE v2 IPv4 GID is index {idx}",
                env_gid.unwrap_or("")
            ),
        )
        .fix(format!("export NCCL_IB_GID_INDEX={idx}")),
        _ => Finding::new(
            "roce.gid_index",
            Severity::Ok,
            subject,
            format!("RoCE v2 IPv4 GID at index {idx} ({ip})"),
        ),
    };
    if let Some(v) = env_gid {
        f = f.evidence(format!("NCCL_IB_GID_INDEX={v}"));
    }
    for t in table {
        f = f.evidence(t);
    }
    f
}

fn mtu_finding(p: &RdmaPort, subject: &str, is_chosen: bool, nf: &mut NicFacts) -> Option<Finding> {
    let nd = p.netdevs.iter().find(|n| n.mtu.is_some())?;
    let mtu = nd.mtu?;
    let active = roce_active_mtu(mtu);
    let ev = format!("{} mtu {mtu} -> RoCE active MTU {active}", nd.name);
    Some(if active >= 4096 {
        Finding::new(
            "roce.mtu",
            Severity::Ok,
            subject,
            format!("RoCE MTU 4096 ({} mtu {mtu})", nd.name),
        )
        .evidence(ev)
    } else {
        if is_chosen {
            nf.slow
                .push(format!("RoCE MTU {active} ({} mtu {mtu})", nd.name));
        }
        Finding::new(
            "roce.mtu",
            Severity::Warn,
            subject,
            format!("RoCE active MTU {active}: large transfers need 4096 (netdev MTU >= 4200)"),
        )
        .evidence(ev)
        .fix(format!(
            "`ip link set {} mtu 9000` (and the same or larger on every switch port on the way)",
            nd.name
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_and_rate_math() {
        assert_eq!(roce_active_mtu(1500), 1024);
        assert_eq!(roce_active_mtu(4200), 4096);
        assert_eq!(roce_active_mtu(9000), 4096);
        assert_eq!(roce_active_mtu(4096), 2048);
        assert_eq!(rate_gbps("40 Gb/sec (4X QDR)"), Some(40.0));
        assert_eq!(rate_gbps("2.5 Gb/sec (1X SDR)"), Some(2.5));
        assert_eq!(expected_rate_gbps(0x101b).map(|x| x.0), Some(200.0));
    }
}
