//! The variables of GPUDirect RDMA and GPU peer access: `NCCL_NET_GDR_LEVEL`,
//! `NCCL_NET_GDR_READ`, `NCCL_IB_PCI_RELAXED_ORDERING`, `NCCL_DMABUF_ENABLE`, `NCCL_P2P_LEVEL`,
//! `NCCL_P2P_DISABLE`.

use super::*;

pub(super) fn net_gdr_level(v: &str, pairs: &[PairReport]) -> Finding {
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

pub(super) fn net_gdr_read(v: &str) -> Finding {
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

pub(super) fn relaxed_ordering(snap: &Snapshot, v: &str) -> Finding {
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

pub(super) fn dmabuf_enable(host: &HostFacts, v: &str) -> Finding {
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

pub(super) fn p2p(
    level: Option<&str>,
    disable: Option<&str>,
    pairs: &[PairReport],
) -> Vec<Finding> {
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
