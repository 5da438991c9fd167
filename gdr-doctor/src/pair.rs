//! Per GPU-NIC pair: PCIe path class and NUMA, ACS on every bridge, link training on every hop,
//! NCCL_NET_GDR_LEVEL, and the verdict.

use super::host::{dmabuf_readiness, GpuFacts, HostFacts, Tri};
use super::nccl::{read_level, Level, LevelRead};
use super::nic::NicFacts;
use super::path::{PathClass, PciPath};
use super::{Finding, NicSummary, PairReport, Severity, Verdict, VerdictKind};
use crate::topology::pcie::{self, Acs};
use crate::topology::Snapshot;
use gdr::gpu_mr::rules::{self, DmaBufBlocker, NicDmaBuf};

/// One GPU-NIC pair: its findings and verdict.
pub(crate) fn check(
    snap: &Snapshot,
    host: &HostFacts,
    gpu: &GpuFacts,
    nic: &NicFacts,
) -> PairReport {
    let pair = Pair {
        snap,
        host,
        gpu,
        nic,
        subject: format!("GPU {} <-> {}", gpu.bdf, nic.name),
    };
    let mut findings = Vec::new();
    let mut c = Concerns {
        blocking: nic.blocking.clone(),
        ..Concerns::default()
    };
    findings.extend(registration(&pair, &mut c));
    let path = nic
        .bdf
        .as_deref()
        .and_then(|nb| PciPath::between(snap, &gpu.bdf, nb));
    if let (Some(p), Some(nb)) = (&path, nic.bdf.as_deref()) {
        findings.extend(path_findings(&pair, nb, p, &mut c));
    } else if nic.bdf.is_some() {
        findings.push(
            Finding::new(
                "pcie.path",
                Severity::Unknown,
                &pair.subject,
                "PCIe path unknown: a device is missing from /sys/bus/pci/devices",
            )
            .evidence(format!(
                "GPU {} in sysfs: {}",
                gpu.bdf,
                snap.pci_device(&gpu.bdf).is_some()
            )),
        );
        c.unverified.push("PCIe path".into());
    }
    c.slow.extend(nic.slow.iter().cloned());
    PairReport {
        gpu: gpu.bdf.clone(),
        nic: nic.name.clone(),
        port: nic.port,
        path: path.as_ref().map(|p| p.class),
        common_ancestor: path.as_ref().and_then(|p| p.common_ancestor.clone()),
        bridges: path.as_ref().map(|p| p.bridges.clone()).unwrap_or_default(),
        gpu_numa: gpu.numa,
        nic_numa: nic.numa,
        best: false,
        verdict: c.verdict(),
        findings,
    }
}

/// The pair the checks are about.
struct Pair<'a> {
    snap: &'a Snapshot,
    host: &'a HostFacts,
    gpu: &'a GpuFacts,
    nic: &'a NicFacts,
    /// `GPU 0000:07:00.0 <-> mlx5_0`.
    subject: String,
}

/// What stands between a pair and full-speed GPUDirect RDMA, as the checks find it.
#[derive(Default)]
struct Concerns {
    /// Why it cannot work.
    blocking: Vec<String>,
    /// Why it is slow.
    slow: Vec<String>,
    /// What could not be checked.
    unverified: Vec<String>,
}

impl Concerns {
    /// Not usable when anything blocks (the reasons: what blocks, then what is slow), else
    /// usable but slow when anything is slow, else usable.
    fn verdict(self) -> Verdict {
        let kind = if !self.blocking.is_empty() {
            VerdictKind::NotUsable
        } else if !self.slow.is_empty() {
            VerdictKind::UsableButSlow
        } else {
            VerdictKind::Usable
        };
        let reasons = match kind {
            VerdictKind::NotUsable => {
                let mut r = self.blocking;
                r.extend(self.slow);
                r
            }
            _ => self.slow,
        };
        Verdict {
            kind,
            reasons,
            unverified: self.unverified,
        }
    }
}

/// Whether GPU memory of the pair can be registered with its NIC, by the rules registration
/// applies: GPUDirect on the GPU, then peer memory, else dma-buf for this GPU and, when live
/// collection probed it, this NIC (gpu_mr::choose_path's order). The NIC probe's finding, if
/// it was probed.
fn registration(pair: &Pair<'_>, c: &mut Concerns) -> Option<Finding> {
    let (snap, host, gpu, nic) = (pair.snap, pair.host, pair.gpu, pair.nic);
    let gpudirect = gpu.cuda.as_ref().and_then(|c| c.gpudirect_rdma_supported);
    if rules::gpudirect_blocked(gpudirect).is_some() {
        c.blocking
            .push(format!("CUDA reports no GPUDirect RDMA on {}", gpu.bdf));
    } else if gpudirect.is_none() {
        c.unverified.push("CUDA GPUDirect attributes".to_string());
    }
    let nic_probe = snap
        .rdma
        .iter()
        .find(|d| d.name == nic.name)
        .and_then(|d| d.dma_buf);
    if !host.peermem {
        match gpu.dmabuf {
            Tri::No => c
                .blocking
                .push("no peer-memory module and dma-buf not possible".into()),
            Tri::Unknown => c
                .unverified
                .push("dma-buf readiness (no peer-memory module)".into()),
            Tri::Yes => {}
        }
    }
    nic_probe.map(|probe| {
        nic_dma_buf_finding(
            snap,
            host,
            gpu,
            &nic.name,
            probe,
            &pair.subject,
            &mut c.blocking,
        )
    })
}

/// The findings along the PCIe path `p` between the GPU and the NIC at `nb`: path class and
/// NUMA, ACS, link training, IOMMU translation, NCCL_NET_GDR_LEVEL.
fn path_findings(pair: &Pair<'_>, nb: &str, p: &PciPath, c: &mut Concerns) -> Vec<Finding> {
    let (snap, host, gpu, nic, subject) = (pair.snap, pair.host, pair.gpu, pair.nic, &pair.subject);
    let mut findings = vec![
        path_finding(
            snap,
            host,
            gpu,
            nic,
            nb,
            p,
            subject,
            &mut c.slow,
            &mut c.unverified,
        ),
        acs_finding(snap, p, subject, &mut c.slow, &mut c.unverified),
    ];
    findings.extend(link_findings(snap, gpu, nic, nb, p, subject, &mut c.slow));
    // IOMMU translation for either end.
    for bdf in [gpu.bdf.as_str(), nb] {
        if let Some(g) = snap.pci_device(bdf).and_then(|d| d.iommu_group) {
            if host.translated_groups.contains(&g) {
                c.slow
                    .push(format!("IOMMU translates DMA for {bdf} (group {g})"));
            }
        }
    }
    findings.extend(gdr_level_finding(snap, p.class, subject, &mut c.slow));
    findings
}

#[allow(clippy::too_many_arguments)]
fn path_finding(
    snap: &Snapshot,
    host: &HostFacts,
    gpu: &GpuFacts,
    nic: &NicFacts,
    nic_bdf: &str,
    p: &PciPath,
    subject: &str,
    slow: &mut Vec<String>,
    unverified: &mut Vec<String>,
) -> Finding {
    let numa = |n: Option<i32>| n.map_or("unknown".to_string(), |n| n.to_string());
    let (sev, msg) = match p.class {
        PathClass::Pix => (
            Severity::Ok,
            "PIX: GPU and NIC under one PCIe switch".to_string(),
        ),
        PathClass::Pxb => (
            Severity::Ok,
            "PXB: GPU and NIC behind several PCIe bridges, not through the CPU".to_string(),
        ),
        PathClass::Phb => {
            slow.push("path PHB: peer traffic crosses the CPU's host bridge".into());
            (Severity::Warn, "PHB: traffic between GPU and NIC crosses the CPU's host bridge; NCCL's default (NCCL_NET_GDR_LEVEL=PXB) does not use GPUDirect here".to_string())
        }
        PathClass::Sys => {
            slow.push(format!(
                "path SYS: GPU on NUMA node {}, NIC on NUMA node {}",
                numa(gpu.numa),
                numa(nic.numa)
            ));
            (Severity::Warn, "SYS: GPU and NIC sit on different NUMA nodes / root complexes; every transfer crosses the CPU interconnect (about half the bandwidth)".to_string())
        }
    };
    let path_of = |b: &str| {
        snap.pci_device(b)
            .map(|d| d.path.clone())
            .unwrap_or_default()
    };
    let mut f = Finding::new("pcie.path", sev, subject, msg)
        .evidence(format!(
            "GPU {}: {} (NUMA {})",
            gpu.bdf,
            path_of(&gpu.bdf),
            numa(gpu.numa)
        ))
        .evidence(format!(
            "NIC {} {}: {} (NUMA {})",
            nic.name,
            nic_bdf,
            path_of(nic_bdf),
            numa(nic.numa)
        ))
        .evidence(p.why.clone());
    if host.vm {
        f = f.evidence("virtual machine: this tree is the hypervisor's, not the hardware's");
        unverified.push("real PCIe path (virtual machine)".into());
    }
    if p.class >= PathClass::Phb {
        f = f.fix(format!(
            "use a NIC on the GPU's own PCIe switch / NUMA node (see the best NIC for {}), or move one card; pin the process to the NIC's NUMA node (`numactl --cpunodebind={n} --membind={n}`)",
            gpu.bdf,
            n = nic.numa.unwrap_or(0)
        ));
    }
    f
}

fn acs_finding(
    snap: &Snapshot,
    p: &PciPath,
    subject: &str,
    slow: &mut Vec<String>,
    unverified: &mut Vec<String>,
) -> Finding {
    let mut redirect = Vec::new();
    let mut unknown = Vec::new();
    let mut evidence = Vec::new();
    for b in &p.bridges {
        let Some(d) = snap.pci_device(b) else {
            unknown.push(b.clone());
            evidence.push(format!("{b}: not in sysfs"));
            continue;
        };
        let Some(bytes) = d.config_bytes() else {
            unknown.push(b.clone());
            evidence.push(format!("{b}: config space not read"));
            continue;
        };
        match pcie::acs(&bytes) {
            Acs::NotReadable { len } => {
                unknown.push(b.clone());
                evidence.push(format!(
                    "{b}: only {len} config bytes readable (extended capabilities need root)"
                ));
            }
            Acs::Absent => evidence.push(format!("{b}: no ACS capability")),
            Acs::Present { offset, control } => {
                let bits = control.set_bits();
                let bits_txt = if bits.is_empty() {
                    "none".to_string()
                } else {
                    bits.join(" ")
                };
                evidence.push(format!(
                    "{b}: ACS at {offset:#x}, control {:#06x}: {bits_txt}",
                    control.raw
                ));
                if control.redirects_p2p() {
                    redirect.push(b.clone());
                }
            }
        }
    }
    if p.bridges.is_empty() {
        return Finding::new(
            "pcie.acs",
            Severity::Ok,
            subject,
            "no PCI bridge between GPU and NIC: nothing to redirect",
        );
    }
    let mut f = if !redirect.is_empty() {
        slow.push(format!(
            "ACS redirects peer-to-peer on {}",
            redirect.join(", ")
        ));
        let setpci: Vec<String> = redirect
            .iter()
            .map(|b| format!("setpci -s {b} ECAP_ACS+0x6.w=0000"))
            .collect();
        Finding::new(
            "pcie.acs",
            Severity::Warn,
            subject,
            format!("ACS redirects peer-to-peer traffic up to the root complex on {}", redirect.join(", ")),
        )
        .fix(format!(
            "on bare metal, clear ACS Control on these bridges: now `{}` (as root, lost at reboot); persistently boot with `pci=disable_acs_redir={}` (Linux >= 5.1; `pci=config_acs=` on newer kernels) or disable ACS in the BIOS. Keep ACS in VMs that need device isolation. (`pcie_acs_override` does not clear these bits.)",
            setpci.join("; "),
            redirect.join(";")
        ))
    } else if !unknown.is_empty() {
        unverified.push(format!("ACS on {}", unknown.join(", ")));
        Finding::new(
            "pcie.acs",
            Severity::Unknown,
            subject,
            format!("ACS state unknown on {}", unknown.join(", ")),
        )
        .fix("run `gdr doctor` as root (or `sudo lspci -vvv -s <bridge> | grep ACSCtl`)")
    } else {
        Finding::new(
            "pcie.acs",
            Severity::Ok,
            subject,
            "no ACS redirect on any bridge between GPU and NIC",
        )
    };
    for e in evidence {
        f = f.evidence(e);
    }
    f
}

/// Link training on every hop of the path `p` (GPU, bridges, NIC at `nic_bdf`), and whether the
/// narrowest link carries the NIC's port rate.
fn link_findings(
    snap: &Snapshot,
    gpu: &GpuFacts,
    nic: &NicFacts,
    nic_bdf: &str,
    p: &PciPath,
    subject: &str,
    slow: &mut Vec<String>,
) -> Vec<Finding> {
    let mut hops = vec![gpu.bdf.clone()];
    hops.extend(p.bridges.iter().cloned());
    hops.push(nic_bdf.to_string());
    let links = Links::survey(snap, &hops, &gpu.bdf);
    if links.known == 0 {
        return vec![Finding::new(
            "pcie.link",
            Severity::Unknown,
            subject,
            "link speed/width not reported for any device on the path (common in VMs)",
        )];
    }
    let narrowest = links.narrowest.clone();
    let mut out = vec![links.training_finding(subject, slow)];
    if let (Some((bw, at)), Some(rate)) = (narrowest, nic.rate_gbps) {
        if bw < rate {
            slow.push(format!(
                "PCIe link at {at} carries {bw:.0} Gb/s, less than the {rate} Gb/s port"
            ));
            out.push(
                Finding::new(
                    "pcie.bandwidth",
                    Severity::Warn,
                    subject,
                    format!("the narrowest PCIe link ({at}, {bw:.0} Gb/s) is slower than the {rate} Gb/s port"),
                )
                .evidence(format!("narrowest link: {at}, {bw:.0} Gb/s per direction after encoding"))
                .evidence(format!("port rate: {rate} Gb/s"))
                .fix("put GPU and NIC in slots whose whole path runs at the NIC's generation and width"),
            );
        }
    }
    out
}

/// The links of the devices on a path, by how they trained.
#[derive(Default)]
struct Links {
    /// Below their maximum width, or speed (but for the GPU's).
    down: Vec<String>,
    /// The GPU's link below its maximum speed only (normal when idle).
    idle: Vec<String>,
    /// At their maximum.
    ok: Vec<String>,
    /// How many devices reported their links.
    known: usize,
    /// The slowest link (Gb/s per direction, the GPU's at its maximum speed) and its device.
    narrowest: Option<(f64, String)>,
}

impl Links {
    /// Read the link speed and width of every device of `hops` (`gpu` is the GPU's address).
    fn survey(snap: &Snapshot, hops: &[String], gpu: &str) -> Self {
        let mut links = Links::default();
        for b in hops {
            let Some(d) = snap.pci_device(b) else {
                continue;
            };
            let cs = d
                .current_link_speed
                .as_deref()
                .and_then(pcie::link_speed_gts);
            let ms = d.max_link_speed.as_deref().and_then(pcie::link_speed_gts);
            let (Some(cs), Some(ms), Some(cw), Some(mw)) =
                (cs, ms, d.current_link_width, d.max_link_width)
            else {
                continue;
            };
            if cw == 0 || mw == 0 {
                continue;
            }
            links.known += 1;
            let txt = format!(
                "{b}: {cs} GT/s x{cw} of {ms} GT/s x{mw} (Gen{} x{cw})",
                pcie::generation(cs)
            );
            let bw = pcie::link_gbps(cs, cw);
            // A GPU lowers its link speed when idle; its width should stay.
            let is_gpu = b == gpu;
            if cw < mw || (cs < ms && !is_gpu) {
                links.down.push(txt);
            } else if cs < ms {
                links.idle.push(txt);
            } else {
                links.ok.push(txt);
            }
            let full_bw = if is_gpu { pcie::link_gbps(ms, cw) } else { bw };
            if links.narrowest.as_ref().is_none_or(|(x, _)| full_bw < *x) {
                links.narrowest = Some((full_bw, b.clone()));
            }
        }
        links
    }

    /// `pcie.link`: every link at its maximum, or which trained below it (then the pair is
    /// slow).
    fn training_finding(self, subject: &str, slow: &mut Vec<String>) -> Finding {
        let mut f = if !self.down.is_empty() {
            slow.push(format!(
                "PCIe link below its maximum on {}",
                self.down
                    .iter()
                    .map(|d| d.split(':').take(3).collect::<Vec<_>>().join(":"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            Finding::new("pcie.link", Severity::Warn, subject, format!("{} PCIe link(s) on the path trained below their maximum", self.down.len()))
                .fix("reseat the card or riser, check the slot's wiring (an x16 card in an x8 slot) and BIOS link-speed settings; `lspci -vv -s <bdf> | grep -E 'LnkCap|LnkSta'` shows both")
        } else {
            Finding::new(
                "pcie.link",
                Severity::Ok,
                subject,
                "every PCIe link on the path at its maximum speed and width",
            )
        };
        for d in self.down {
            f = f.evidence(format!("downtrained: {d}"));
        }
        for d in self.idle {
            f = f.evidence(format!("{d}: speed below max is normal for an idle GPU; recheck under load (`nvidia-smi -q -d PCIE`)"));
        }
        for d in self.ok {
            f = f.evidence(d);
        }
        f
    }
}

fn gdr_level_finding(
    snap: &Snapshot,
    class: PathClass,
    subject: &str,
    slow: &mut Vec<String>,
) -> Option<Finding> {
    let v = snap.env.get("NCCL_NET_GDR_LEVEL")?;
    // As NCCL's ncclGetLevel reads it: exact names, legacy integers, anything else ignored
    // (then NCCL's default PXB applies).
    let (level, ignored) = match read_level(v) {
        LevelRead::Name(l) | LevelRead::Legacy(_, l) => (l, false),
        LevelRead::Ignored => (Level::UpTo(PathClass::Pxb, "PXB"), true),
    };
    let level_txt = level.name();
    let shown = if ignored {
        format!("{v} (ignored by NCCL: default PXB)")
    } else {
        level_txt.to_string()
    };
    Some(if !level.allows(class) {
        slow.push(format!(
            "NCCL_NET_GDR_LEVEL={v} keeps NCCL off GPUDirect on this {class} path"
        ));
        Finding::new(
            "nccl.gdr_level",
            Severity::Warn,
            subject,
            format!("NCCL_NET_GDR_LEVEL={shown} is stricter than this pair's {class} path: NCCL will stage through host memory"),
        )
        .evidence(format!("NCCL_NET_GDR_LEVEL={v}"))
        .fix(format!("export NCCL_NET_GDR_LEVEL={class} if GPUDirect on a {class} path measures faster than staging (`gdr bw --use-cuda`), or unset it"))
    } else if class >= PathClass::Sys {
        Finding::new(
            "nccl.gdr_level",
            Severity::Warn,
            subject,
            format!("NCCL_NET_GDR_LEVEL={shown} lets NCCL use GPUDirect across NUMA nodes, usually slower than staging"),
        )
        .evidence(format!("NCCL_NET_GDR_LEVEL={v}"))
        .fix("unset NCCL_NET_GDR_LEVEL (default PXB) unless a measurement shows SYS-path GPUDirect is faster")
    } else {
        Finding::new(
            "nccl.gdr_level",
            Severity::Ok,
            subject,
            format!("NCCL_NET_GDR_LEVEL={shown} allows GPUDirect on this {class} path"),
        )
        .evidence(format!("NCCL_NET_GDR_LEVEL={v}"))
    })
}

/// Mark the best pair of every GPU: the first of its rails, by the ranking the transfer
/// engine uses ([`super::rank_rails`]: active port, verdict, path class, port rate, name).
/// `findings` must hold the per-port findings (`port.state`).
pub(crate) fn mark_best(pairs: &mut [PairReport], nics: &[NicSummary], findings: &[Finding]) {
    let mut gpus: Vec<String> = pairs.iter().map(|p| p.gpu.clone()).collect();
    gpus.sort();
    gpus.dedup();
    for g in gpus {
        if let Some(i) = super::rails::best_pair(pairs, nics, findings, &g) {
            pairs[i].best = true;
        }
    }
}

/// What the NIC's dma-buf probe means for this pair, by the rule registration applies: a NIC
/// that cannot import dma-bufs leaves only peer memory.
fn nic_dma_buf_finding(
    snap: &Snapshot,
    host: &HostFacts,
    gpu: &GpuFacts,
    nic: &str,
    probe: NicDmaBuf,
    subject: &str,
    blocking: &mut Vec<String>,
) -> Finding {
    let evidence = format!("ibv_reg_dmabuf_mr probe (fd -1) on {nic}: {probe:?}");
    if probe == NicDmaBuf::Supported {
        return Finding::new(
            "dmabuf.nic",
            Severity::Ok,
            subject,
            format!("{nic} imports dma-bufs"),
        )
        .evidence(evidence);
    }
    let blocker = DmaBufBlocker::NicCannotImport {
        nic: nic.to_string(),
        probe,
    };
    // Everything dma-buf needs on this pair, by the rules (the NIC's blocker is among them).
    let (_, _, missing) = dmabuf_readiness(snap, &host.system, &[gpu], Some((nic, probe)));
    let severity = if host.peermem {
        Severity::Warn
    } else {
        if gpu.dmabuf == Tri::Yes {
            blocking.push(format!(
                "no peer-memory module and dma-buf not possible: {}",
                blocker.what()
            ));
        }
        Severity::Fail
    };
    Finding::new("dmabuf.nic", severity, subject, blocker.what())
        .evidence(evidence)
        .evidence(format!(
            "dma-buf on this pair needs: {}",
            missing.join(", ")
        ))
        .fix(blocker.hint())
}
