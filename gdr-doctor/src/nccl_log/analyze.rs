//! What a log says per process ([`ProcessReport`]), cross-checked with a host's report.

use super::*;

/// `(major, minor)` of a version token.
fn version_num(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// NCCL's `topoPathTypeStr` of a version (by `src/graph/topo.cc` in each release).
fn path_names(v: (u32, u32)) -> Option<&'static [&'static str]> {
    const V26: &[&str] = &["LOC", "NVL", "PIX", "PXB", "PHB", "SYS", "NET"];
    const V28: &[&str] = &["LOC", "NVL", "NVB", "PIX", "PXB", "PHB", "SYS"];
    const V212: &[&str] = &[
        "LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS", "NET", "DIS",
    ];
    const V226: &[&str] = &[
        "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "PHB", "SYS", "NET", "DIS",
    ];
    const V227: &[&str] = &[
        "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "P2C", "PHB", "SYS", "NET", "DIS",
    ];
    const V228: &[&str] = &[
        "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS",
    ];
    if v.0 != 2 {
        return None;
    }
    Some(match v.1 {
        6..=7 => V26,
        8..=11 => V28,
        12..=25 => V212,
        26 => V226,
        27 => V227,
        28.. => V228,
        _ => return None,
    })
}

pub(super) fn path_name(version: Option<&str>, n: u32) -> Option<&'static str> {
    let names = path_names(version_num(version?)?)?;
    names.get(n as usize).copied()
}

/// The verdict, reasons and fixes for one process.
fn process_report(
    p: &LogProcess,
    log_version: Option<&String>,
    host: Option<&Report>,
) -> ProcessReport {
    let version = p.version.clone().or_else(|| log_version.cloned());
    let net = p.channels.len();
    let gdr = p.channels.iter().filter(|c| c.gdrdma).count();
    let count = |d: Direction| {
        let all: Vec<&NetChannel> = p.channels.iter().filter(|c| c.direction == d).collect();
        (all.len(), all.iter().filter(|c| c.gdrdma).count())
    };
    let send = count(Direction::Send);
    let receive = count(Direction::Receive);
    let channel_net = p.channels.first().map(|c| c.net.clone());
    let network_name = p.network.clone().or(channel_net);
    let socket = network_name
        .as_deref()
        .is_some_and(|n| n.eq_ignore_ascii_case("Socket"));
    let verdict = verdict(p, socket, net, gdr);
    let mut why = Why::default();
    what_nccl_printed(p, version.as_deref(), socket, &mut why);
    likely_causes(p, verdict, send, receive, &mut why);
    let host_lines = match host {
        Some(r) if !matches!(verdict, LogVerdict::Gdrdma) => host_checks(p, r),
        _ => Vec::new(),
    };
    ProcessReport {
        process: process_name(p),
        ranks: p.ranks.iter().copied().collect(),
        nranks: p.nranks,
        version,
        network: network_name.map(|n| network_text(p, &n)),
        devices: devices(p),
        relaxed_ordering: p.relaxed_ordering,
        oob: p.oob.clone(),
        net_connections: net,
        gdrdma_connections: gdr,
        send,
        receive,
        intra_node_channels: p.intra_node_channels,
        verdict,
        reasons: why.reasons,
        likely: why.likely,
        host: host_lines,
        fixes: why.fixes,
        notes: why.notes,
        warnings: p.warnings.clone(),
    }
}

/// What a process's connections say: sockets, GDRDMA on all, some or none of its `net`
/// network connections (`gdr` of them with GDRDMA), or none at all.
fn verdict(p: &LogProcess, socket: bool, net: usize, gdr: usize) -> LogVerdict {
    if socket {
        LogVerdict::Socket
    } else if net == 0 {
        // No connection lines, but NCCL said it disabled GPUDirect for every GPU/HCA it
        // printed and enabled it for none.
        let disabled =
            p.distance.iter().any(|d| !d.enabled) || p.hca_gdr.iter().any(|h| !h.enabled);
        let enabled = p.distance.iter().any(|d| d.enabled) || p.hca_gdr.iter().any(|h| h.enabled);
        if disabled && !enabled {
            LogVerdict::NoGdrdma
        } else {
            LogVerdict::NoNetConnections
        }
    } else if gdr == net {
        LogVerdict::Gdrdma
    } else if gdr == 0 {
        LogVerdict::NoGdrdma
    } else {
        LogVerdict::Partial
    }
}

/// The network NCCL used (`name`, from `Using network` or the channel lines), for people.
fn network_text(p: &LogProcess, name: &str) -> String {
    if name.eq_ignore_ascii_case("IB") {
        let kinds: BTreeSet<&str> = p
            .ib_devices
            .iter()
            .map(|d| {
                if d.link.starts_with("RoCE") {
                    "RoCE"
                } else {
                    "InfiniBand"
                }
            })
            .collect();
        let kinds: Vec<&str> = kinds.into_iter().collect();
        if kinds.is_empty() {
            "IB (NCCL's internal IB verbs transport)".to_string()
        } else {
            format!(
                "IB (NCCL's internal IB verbs transport, {})",
                kinds.join(" and ")
            )
        }
    } else if name.eq_ignore_ascii_case("Socket") {
        "Socket (NCCL's internal TCP transport)".to_string()
    } else {
        match &p.plugin {
            Some(pl) => format!("{name} (external net plugin {pl})"),
            None => format!("{name} (external net plugin)"),
        }
    }
}

/// Why a process's connections do or do not use GDRDMA, in the order the report lists them.
#[derive(Default)]
struct Why {
    /// What NCCL printed.
    reasons: Vec<String>,
    /// The likely causes where it printed nothing.
    likely: Vec<String>,
    /// What to do.
    fixes: Vec<String>,
    /// Side remarks.
    notes: Vec<String>,
}

/// The reasons NCCL printed (`GPU Direct RDMA Disabled ...`, the variables it read), with their
/// fixes; for sockets, why NCCL chose them.
fn what_nccl_printed(p: &LogProcess, ver: Option<&str>, socket: bool, why: &mut Why) {
    let Why {
        reasons,
        likely,
        fixes,
        notes,
    } = why;
    for d in p.distance.iter().filter(|d| !d.enabled) {
        let named = match (path_name(ver, d.distance), path_name(ver, d.limit)) {
            (Some(a), Some(b)) => format!(
                ": with NCCL {} that is the path type {a} against the limit {b}",
                ver.unwrap_or("?")
            ),
            _ => " (path type numbers depend on the NCCL version, which the log does not give)"
                .to_string(),
        };
        reasons.push(format!(
            "NCCL printed `GPU Direct RDMA Disabled for GPU {} / HCA {} (distance {} > {})`{named}: GPU and NIC are farther apart than NCCL_NET_GDR_LEVEL allows (default PXB)",
            d.gpu, d.hca, d.distance, d.limit
        ));
        let class = path_name(ver, d.distance).unwrap_or("the path's class");
        push_capped(fixes, format!("put the GPU and the NIC under one PCIe switch (PIX/PXB), or export NCCL_NET_GDR_LEVEL={class} if GPUDirect over this path measures faster than staging (`gdr bw --use-cuda`)"));
    }
    for h in p.hca_gdr.iter().filter(|h| !h.enabled) {
        if h.no_module {
            reasons.push(format!("NCCL printed `GPU Direct RDMA Disabled for HCA {} (no module)`: no peer-memory module (nvidia-peermem or nv_peer_mem) was loaded", h.hca));
            push_capped(fixes, "`modprobe nvidia-peermem` on every node (and make it persistent), or use dma-buf (NCCL >= 2.13, open kernel module, Linux >= 5.12, CUDA >= 11.7)".to_string());
        } else {
            reasons.push(format!("NCCL printed `GPU Direct RDMA Disabled for HCA {}`: NCCL found neither a peer-memory module (it checks /sys/kernel/mm/memory_peers/nv_mem*/version and /sys/module/nvidia_peermem/version) nor dma-buf support for this GPU and NIC", h.hca));
            push_capped(fixes, "`modprobe nvidia-peermem` (check `ls /sys/module/nvidia_peermem`), or make dma-buf possible: NVIDIA open kernel module, Linux >= 5.12, CUDA driver >= 11.7, NCCL_DMABUF_ENABLE unset or 1".to_string());
        }
    }
    if let Some(v) = p.env.get("NCCL_NET_GDR_LEVEL") {
        if matches!(v.as_str(), "LOC" | "0") {
            reasons.push(format!("NCCL printed `NCCL_NET_GDR_LEVEL set by environment to {v}`: GPUDirect RDMA is switched off"));
            push_capped(fixes, "unset NCCL_NET_GDR_LEVEL (default PXB)".to_string());
        }
    }
    if p.env.get("NCCL_NET_GDR_READ").map(String::as_str) == Some("0") {
        reasons.push("NCCL printed `NCCL_NET_GDR_READ set by environment to 0`: sends stage through host memory".to_string());
    }
    if p.env.get("NCCL_DMABUF_ENABLE").map(String::as_str) == Some("0") {
        reasons.push("NCCL printed `NCCL_DMABUF_ENABLE set by environment to 0`: dma-buf registration is off, only a peer-memory module can enable GPUDirect RDMA".to_string());
    }
    if socket {
        if p.env.get("NCCL_IB_DISABLE").is_some_and(|v| v != "0") {
            reasons.push("NCCL printed `NCCL_IB_DISABLE set by environment to 1`: the IB/RoCE transport is switched off".to_string());
            push_capped(fixes, "unset NCCL_IB_DISABLE".to_string());
        }
        if p.env
            .get("NCCL_NET")
            .is_some_and(|v| v.eq_ignore_ascii_case("Socket"))
        {
            reasons.push(
                "NCCL printed `NCCL_NET set by environment to Socket`: sockets are forced"
                    .to_string(),
            );
            push_capped(fixes, "unset NCCL_NET".to_string());
        }
        if p.ib_no_device {
            reasons.push("NCCL printed `NET/IB : No device found.`: libibverbs listed no usable RDMA device (none present, driver or rdma-core missing, no active port, or NCCL_IB_HCA matching nothing)".to_string());
            push_capped(fixes, "check `ibv_devinfo` (device present, port ACTIVE), then NCCL_IB_HCA; run `gdr doctor` on the node".to_string());
        }
        if reasons.is_empty() {
            likely.push("NCCL chose sockets without saying why in this log: NCCL_IB_DISABLE, NCCL_NET=Socket, or no usable RDMA device (look for `NET/IB : No device found.`)".to_string());
        }
    }
    if let Some(v) = p.env.get("NCCL_P2P_LEVEL") {
        notes.push(format!("NCCL printed `NCCL_P2P_LEVEL set by environment to {v}`: that governs GPU-to-GPU peer access inside a node, not GPUDirect RDMA (NCCL_NET_GDR_LEVEL does)"));
    }
}

/// The likely causes where NCCL printed no reason: sends without GDRDMA, missing NET lines,
/// dma-buf available on the GPU side.
fn likely_causes(
    p: &LogProcess,
    verdict: LogVerdict,
    send: (usize, usize),
    receive: (usize, usize),
    why: &mut Why,
) {
    // Send without GDRDMA while receive has it: GDR reads are off.
    if send.0 > 0 && send.1 == 0 && receive.1 > 0 && !p.env.contains_key("NCCL_NET_GDR_READ") {
        why.likely.push("receives use GPUDirect RDMA but sends do not: NCCL_NET_GDR_READ is off by default for GPUs older than Ampere (compute capability < 8.0) without NVLink".to_string());
        push_capped(&mut why.fixes, "NCCL_NET_GDR_READ=1 lets the NIC read GPU memory when sending (measure: on PCIe-only pre-Ampere systems it can be slower)".to_string());
    }
    if matches!(verdict, LogVerdict::NoGdrdma | LogVerdict::Partial)
        && p.distance.iter().all(|d| d.enabled)
        && p.hca_gdr.iter().all(|h| h.enabled)
        && !p.env.contains_key("NCCL_NET_GDR_LEVEL")
    {
        why.likely.push("NCCL printed no reason (those lines are in the NET subsystem: rerun with NCCL_DEBUG_SUBSYS=INIT,ENV,NET); the usual ones: GPU and NIC farther apart than NCCL_NET_GDR_LEVEL (default PXB), no peer-memory module and no dma-buf, or a GPU without GPUDirect RDMA".to_string());
    }
    if p.dmabuf_available && matches!(verdict, LogVerdict::NoGdrdma | LogVerdict::Partial) {
        why.likely.push("NCCL printed `DMA-BUF is available on GPU device N`: the GPU side of dma-buf is fine, so look at the NIC, the distance and NCCL_NET_GDR_LEVEL".to_string());
    }
}

/// The devices of the `NET/IB : Using` line (`[0]mlx5_0:1/RoCE`), then the socket interfaces.
fn devices(p: &LogProcess) -> Vec<String> {
    let mut devices: Vec<String> = p
        .ib_devices
        .iter()
        .map(|d| match d.port {
            Some(port) => format!("[{}]{}:{port}/{}", d.index, d.name, d.link),
            None => format!("[{}]{}/{}", d.index, d.name, d.link),
        })
        .collect();
    devices.extend(p.socket_interfaces.iter().cloned());
    devices
}

/// `host:pid GPU d`, as far as the log names the process.
fn process_name(p: &LogProcess) -> String {
    let who = match (p.host.is_empty(), p.pid.is_empty()) {
        (false, false) => format!("{}:{}", p.host, p.pid),
        (false, true) => p.host.clone(),
        (true, false) => format!("pid {}", p.pid),
        (true, true) => "unnamed process".to_string(),
    };
    match p.cuda_dev {
        Some(d) => format!("{who} GPU {d}"),
        None => who,
    }
}

/// What the doctor's report of the host says about a process that does not use GDRDMA.
fn host_checks(p: &LogProcess, r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    let host_nics: Vec<&str> = r.nics.iter().map(|n| n.name.as_str()).collect();
    let absent: Vec<&str> = p
        .ib_devices
        .iter()
        .map(|d| d.name.as_str())
        .filter(|n| !host_nics.contains(n))
        .collect();
    if !p.ib_devices.is_empty() && absent.len() == p.ib_devices.len() {
        out.push(format!(
            "none of the log's devices ({}) is on the host checked ({}): the log is from another machine, so the host findings may not apply",
            absent.join(", "),
            if host_nics.is_empty() { "no RDMA device".to_string() } else { host_nics.join(", ") }
        ));
    }
    for id in [
        "peermem.module",
        "dmabuf.readiness",
        "inventory.rdma",
        "cuda.attributes",
    ] {
        for f in r.findings_with_id(id) {
            if f.severity >= Severity::Warn {
                out.push(format!(
                    "{} {} ({}): {}",
                    f.severity, f.id, f.subject, f.message
                ));
            }
        }
    }
    for pr in r.pairs.iter().filter(|p| p.best) {
        if let Some(c) = pr.path {
            if c > crate::PathClass::Pxb {
                out.push(format!(
                    "GPU {} <-> {}: path {c}, beyond NCCL's default NCCL_NET_GDR_LEVEL=PXB",
                    pr.gpu, pr.nic
                ));
            }
        }
    }
    for f in r.all_findings() {
        if f.id.starts_with("nccl.") && f.severity >= Severity::Warn && out.len() < 32 {
            out.push(format!(
                "{} {} ({}): {}",
                f.severity, f.id, f.subject, f.message
            ));
        }
    }
    if out.is_empty() {
        out.push("the host checked shows no peer-memory, dma-buf, path or NCCL setting problem: compare the NCCL environment of the job with this shell's".to_string());
    }
    out
}

/// The verdict for every process of `log`; `host` is the doctor's report of the machine the
/// log should be checked against (`None`: the log alone).
pub fn analyze(log: &NcclLog, host: Option<&Report>) -> LogReport {
    let log_version = match log.unattributed_versions.as_slice() {
        [v] => Some(v),
        _ => None,
    };
    let mut processes: Vec<ProcessReport> = log
        .processes
        .iter()
        .map(|p| process_report(p, log_version, host))
        .collect();
    // By rank (processes without one last), stable for the rest.
    processes.sort_by_key(|p| p.ranks.first().copied().unwrap_or(u32::MAX));
    let net: usize = processes.iter().map(|p| p.net_connections).sum();
    let gdr: usize = processes.iter().map(|p| p.gdrdma_connections).sum();
    let bad = processes.iter().any(|p| {
        matches!(
            p.verdict,
            LogVerdict::NoGdrdma | LogVerdict::Partial | LogVerdict::Socket
        )
    });
    LogReport {
        format: LOG_REPORT_FORMAT,
        source: log.source.clone(),
        host_source: host.map(|r| r.source.clone()),
        lines: log.lines,
        nccl_lines: log.nccl_lines,
        net_connections: net,
        gdrdma_connections: gdr,
        gdrdma_verified: net > 0 && gdr == net && !bad,
        processes_left_out: log.processes_left_out,
        processes,
    }
}
