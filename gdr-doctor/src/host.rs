//! Host-wide checks: inventory, virtualisation, IOMMU, peer memory, dma-buf, CUDA attributes,
//! memlock, unreadable files.

use super::{Finding, Severity};
use crate::topology::{CudaDevice, Limit, Snapshot};
use gdr::gpu_mr::rules::{
    self, DmaBufBlocker, DmaBufFacts, GpuDmaBuf, NicDmaBuf, Readiness, SystemFacts,
    DMA_BUF_MIN_DRIVER_VERSION, DMA_BUF_MIN_KERNEL, OPEN_MODULE_MIN_DRIVER, RDMA_CORE_MIN_DMA_BUF,
};

/// A GPU as the checks see it.
#[derive(Debug, Clone)]
pub(crate) struct GpuFacts {
    pub bdf: String,
    pub name: String,
    pub numa: Option<i32>,
    pub cuda: Option<CudaDevice>,
    pub subject: String,
    /// Whether dma-buf registration can work for this GPU ([`rules::dma_buf_readiness`]).
    pub dmabuf: Tri,
}

/// Whether the GPU side can register memory for the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tri {
    Yes,
    No,
    Unknown,
}

/// Facts derived once per snapshot and used by the pair checks.
#[derive(Debug, Clone)]
pub(crate) struct HostFacts {
    pub gpus: Vec<GpuFacts>,
    pub vm: bool,
    /// The host facts the GPUDirect rules read.
    pub system: SystemFacts,
    /// Whether a peer-memory module is loaded ([`SystemFacts::peer_memory`]).
    pub peermem: bool,
    /// IOMMU groups in translated (DMA) mode.
    pub translated_groups: Vec<u32>,
}

/// `0000:00:06.0` from CUDA's or nvidia-smi's spelling (`00000000:00:06.0`), lowercase.
pub(crate) fn normalize_bdf(s: &str) -> String {
    let s = s.trim().trim_end_matches('\0').trim().to_ascii_lowercase();
    match s.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 => match u32::from_str_radix(dom, 16) {
            Ok(d) => format!("{d:04x}:{rest}"),
            Err(_) => s,
        },
        _ => s,
    }
}

impl HostFacts {
    pub(crate) fn new(snap: &Snapshot) -> Self {
        let mut gpus: Vec<GpuFacts> = snap
            .gpus()
            .map(|d| GpuFacts {
                bdf: d.bdf.to_ascii_lowercase(),
                name: format!(
                    "NVIDIA GPU [{:04x}:{:04x}]",
                    d.vendor.unwrap_or(0),
                    d.device.unwrap_or(0)
                ),
                numa: d.numa_node.filter(|n| *n >= 0),
                cuda: None,
                subject: format!("GPU {}", d.bdf),
                dmabuf: Tri::Unknown,
            })
            .collect();
        if let Some(cuda) = &snap.cuda {
            for dev in &cuda.devices {
                let bdf = normalize_bdf(&dev.pci_bus_id);
                match gpus.iter_mut().find(|g| g.bdf == bdf) {
                    Some(g) => {
                        g.name = dev.name.clone();
                        g.cuda = Some(dev.clone());
                    }
                    None => gpus.push(GpuFacts {
                        subject: format!("GPU {bdf}"),
                        numa: snap
                            .pci_device(&bdf)
                            .and_then(|d| d.numa_node)
                            .filter(|n| *n >= 0),
                        bdf,
                        name: dev.name.clone(),
                        cuda: Some(dev.clone()),
                        dmabuf: Tri::Unknown,
                    }),
                }
            }
        }
        gpus.sort_by(|a, b| a.bdf.cmp(&b.bdf));

        let vm = snap.hypervisor.cpu_flag == Some(true);
        let system = snap.system_facts();
        let peermem = system.peer_memory().present();
        for g in &mut gpus {
            g.dmabuf = dmabuf_readiness(snap, &system, &[&*g], None).0;
        }
        let translated_groups = snap
            .iommu
            .group_types
            .iter()
            .filter(|(_, t)| t.starts_with("DMA"))
            .map(|(g, _)| *g)
            .collect();
        HostFacts {
            gpus,
            vm,
            system,
            peermem,
            translated_groups,
        }
    }
}

/// dma-buf readiness of `gpus` by [`rules::dma_buf_readiness`] (the rule registration applies):
/// open kernel module, kernel, CUDA driver, DMA_BUF_SUPPORTED. The NIC side is probed at
/// registration unless `nic` gives its probe. Returns the answer, the evidence and what is
/// missing.
pub(crate) fn dmabuf_readiness(
    snap: &Snapshot,
    system: &SystemFacts,
    gpus: &[&GpuFacts],
    nic: Option<(&str, NicDmaBuf)>,
) -> (Tri, Vec<String>, Vec<String>) {
    let facts = DmaBufFacts {
        system,
        driver_version: snap.cuda.as_ref().and_then(|c| c.driver_version),
        driver_exports_dma_buf: None,
        gpus: gpus
            .iter()
            .map(|g| GpuDmaBuf {
                ordinal: g.cuda.as_ref().map(|c| c.ordinal),
                bdf: g.bdf.clone(),
                dma_buf_supported: g.cuda.as_ref().and_then(|c| c.dma_buf_supported),
            })
            .collect(),
        nic,
    };
    let readiness = rules::dma_buf_readiness(&facts);
    let mut evidence = Vec::new();
    evidence.push(match system.open_kernel_module() {
        Some(true) => "NVIDIA open kernel module".to_string(),
        Some(false) => "NVIDIA proprietary kernel module".to_string(),
        None => "NVIDIA kernel module: not found (/proc/driver/nvidia/version)".to_string(),
    });
    if let Some(r) = &system.kernel_release {
        evidence.push(format!("kernel {r}"));
    }
    evidence.push(match facts.driver_version {
        Some(v) => format!("CUDA driver {}", gdr::cuda::version_text(v)),
        None => match snap.cuda.as_ref().and_then(|c| c.error.as_deref()) {
            Some(e) => format!("CUDA driver version: unknown ({e})"),
            None => "CUDA driver version: unknown (not collected)".into(),
        },
    });
    for g in &facts.gpus {
        if let Some(v) = g.dma_buf_supported {
            evidence.push(format!("{}: DMA_BUF_SUPPORTED={}", g.bdf, v as i32));
        }
    }
    let missing = readiness
        .blockers
        .iter()
        .map(DmaBufBlocker::requirement)
        .collect();
    let tri = match readiness.state() {
        Readiness::Ready => Tri::Yes,
        Readiness::Blocked => Tri::No,
        Readiness::Unknown => Tri::Unknown,
    };
    (tri, evidence, missing)
}

/// Host-wide findings: inventory, virtualisation, IOMMU, peer memory and dma-buf, CUDA
/// attributes, locked-memory limit, unreadable files.
pub(crate) fn check(snap: &Snapshot, host: &HostFacts) -> Vec<Finding> {
    let mut out = inventory(snap, host);
    out.extend(virtualisation(snap, host));
    out.push(iommu(snap, host));
    out.extend(peer_memory(snap, host));
    out.extend(cuda_attributes(snap, host));
    out.push(memlock(snap));
    if !snap.read_errors.is_empty() {
        let mut f = Finding::new(
            "collect.read_errors",
            Severity::Unknown,
            "host",
            format!(
                "{} file(s) could not be read; checks that need them say unknown",
                snap.read_errors.len()
            ),
        );
        for e in snap.read_errors.iter().take(8) {
            f = f.evidence(format!("{}: {}", e.path, e.error));
        }
        if snap.read_errors.len() > 8 {
            f = f.evidence(format!("... {} more", snap.read_errors.len() - 8));
        }
        out.push(
            f.fix("run `gdr doctor` as root to read PCI extended configuration space and the rest"),
        );
    }
    out
}

/// `inventory.gpu` and `inventory.rdma`: the NVIDIA GPUs and RDMA devices found.
fn inventory(snap: &Snapshot, host: &HostFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    if host.gpus.is_empty() {
        out.push(
            Finding::new("inventory.gpu", Severity::Fail, "host", "no NVIDIA GPU found")
                .evidence(format!(
                    "{} PCI devices, none with vendor 0x10de and class 0x0300/0x0302",
                    snap.pci.len()
                ))
                .fix("GPUDirect RDMA needs an NVIDIA GPU; check `lspci -d 10de:` and that the driver is loaded (`nvidia-smi`)"),
        );
    } else {
        let mut f = Finding::new(
            "inventory.gpu",
            Severity::Ok,
            "host",
            format!("{} NVIDIA GPU(s)", host.gpus.len()),
        );
        for g in &host.gpus {
            f = f.evidence(format!(
                "{} {} NUMA {}",
                g.bdf,
                g.name,
                g.numa.map_or("unknown".into(), |n| n.to_string())
            ));
        }
        out.push(f);
    }
    if snap.rdma.is_empty() {
        out.push(
            Finding::new("inventory.rdma", Severity::Fail, "host", "no RDMA device found")
                .evidence("/sys/class/infiniband is empty or absent")
                .fix("install the NIC driver (mlx5_core and mlx5_ib for ConnectX) and rdma-core; `ibv_devinfo` must list the device"),
        );
    } else {
        let mut f = Finding::new(
            "inventory.rdma",
            Severity::Ok,
            "host",
            format!("{} RDMA device(s)", snap.rdma.len()),
        );
        for d in &snap.rdma {
            f = f.evidence(format!(
                "{} pci={} fw={} hca={}",
                d.name,
                d.pci_bdf.as_deref().unwrap_or("none"),
                d.fw_ver.as_deref().unwrap_or("?"),
                d.hca_type.as_deref().unwrap_or("?")
            ));
        }
        out.push(f);
    }
    out
}

/// `vm.synthetic_topology`: whether this is a virtual machine, whose PCIe tree says nothing
/// about the hardware.
fn virtualisation(snap: &Snapshot, host: &HostFacts) -> Option<Finding> {
    let virtio = snap.pci.iter().filter(|d| d.vendor == Some(0x1af4)).count();
    if host.vm {
        let mut f = Finding::new(
            "vm.synthetic_topology",
            Severity::Warn,
            "host",
            "this is a virtual machine: the PCIe tree is the hypervisor's invention, so path classes (PIX/PXB/PHB/SYS) and NUMA nodes may say nothing about the real hardware",
        )
        .evidence("/proc/cpuinfo has the `hypervisor` flag");
        if let Some(v) = &snap.hypervisor.sys_vendor {
            f = f.evidence(format!("DMI sys_vendor: {v}"));
        }
        if virtio > 0 {
            f = f.evidence(format!("{virtio} virtio PCI device(s)"));
        }
        Some(f.fix("judge the path on the physical host (`nvidia-smi topo -m` there), or ask for GPU and NIC passed through below one PCIe switch with ACS disabled on it"))
    } else if snap.hypervisor.cpu_flag.is_none() {
        Some(
            Finding::new(
                "vm.synthetic_topology",
                Severity::Unknown,
                "host",
                "could not tell whether this is a virtual machine",
            )
            .evidence("/proc/cpuinfo not readable"),
        )
    } else {
        None
    }
}

fn iommu(snap: &Snapshot, host: &HostFacts) -> Finding {
    let cmdline = snap.kernel.cmdline.clone().unwrap_or_default();
    let words: Vec<&str> = cmdline.split_whitespace().collect();
    let pt = words
        .iter()
        .any(|w| *w == "iommu=pt" || *w == "iommu.passthrough=1");
    let off = words
        .iter()
        .any(|w| *w == "iommu=off" || *w == "intel_iommu=off" || *w == "amd_iommu=off");
    let iommu_words: Vec<&str> = words
        .iter()
        .copied()
        .filter(|w| w.contains("iommu"))
        .collect();
    let cmd_ev = if iommu_words.is_empty() {
        "kernel command line: no iommu parameters".to_string()
    } else {
        format!("kernel command line: {}", iommu_words.join(" "))
    };
    // Groups that hold a GPU or an RDMA NIC.
    let relevant: Vec<(String, u32, String)> = snap
        .pci
        .iter()
        .filter(|d| {
            d.is_nvidia_gpu()
                || snap
                    .rdma
                    .iter()
                    .any(|r| r.pci_bdf.as_deref() == Some(d.bdf.as_str()))
        })
        .filter_map(|d| {
            let g = d.iommu_group?;
            Some((d.bdf.clone(), g, snap.iommu.group_types.get(&g)?.clone()))
        })
        .collect();
    let translated: Vec<&(String, u32, String)> = relevant
        .iter()
        .filter(|(_, g, _)| host.translated_groups.contains(g))
        .collect();
    let fix = "boot with `iommu=pt` (Intel: `intel_iommu=on iommu=pt`, AMD: `amd_iommu=on iommu=pt`) so devices use identity mappings; or, per group with its devices unbound, `echo identity > /sys/kernel/iommu_groups/<N>/type`";
    if !translated.is_empty() {
        let mut f = Finding::new(
            "iommu.mode",
            Severity::Warn,
            "host",
            "the IOMMU translates DMA for GPU/NIC: peer-to-peer goes through the root complex and every access pays for translation (or fails where the IOMMU blocks it)",
        )
        .evidence(cmd_ev);
        for (bdf, g, t) in translated {
            f = f.evidence(format!("{bdf}: IOMMU group {g} type {t}"));
        }
        return f.fix(fix);
    }
    if snap.iommu.units.is_empty() {
        return Finding::new("iommu.mode", Severity::Ok, "host", "no IOMMU active")
            .evidence("/sys/class/iommu is empty")
            .evidence(cmd_ev);
    }
    let units = format!("IOMMU units: {}", snap.iommu.units.join(", "));
    if !relevant.is_empty() || pt || off {
        let mut f = Finding::new(
            "iommu.mode",
            Severity::Ok,
            "host",
            "IOMMU in passthrough (identity) mode for GPU and NIC",
        )
        .evidence(units)
        .evidence(cmd_ev);
        for (bdf, g, t) in &relevant {
            f = f.evidence(format!("{bdf}: IOMMU group {g} type {t}"));
        }
        return f;
    }
    Finding::new(
        "iommu.mode",
        Severity::Unknown,
        "host",
        "an IOMMU is active but the mode of the GPU/NIC groups could not be read",
    )
    .evidence(units)
    .evidence(cmd_ev)
    .fix(fix)
}

fn peer_memory(snap: &Snapshot, host: &HostFacts) -> Vec<Finding> {
    let all: Vec<&GpuFacts> = host.gpus.iter().collect();
    let (tri, ev, missing) = dmabuf_readiness(snap, &host.system, &all, None);
    vec![
        peermem_finding(snap, host, tri),
        dmabuf_finding(snap, host, tri, ev, &missing),
    ]
}

/// `peermem.module`: whether a peer-memory module is loaded, and what that leaves when it is
/// not (`tri`: whether dma-buf can work).
fn peermem_finding(snap: &Snapshot, host: &HostFacts, tri: Tri) -> Finding {
    let mut mods: Vec<String> = [
        "nvidia",
        "nvidia_peermem",
        "nv_peer_mem",
        "ib_core",
        "mlx5_core",
        "mlx5_ib",
        "rdma_rxe",
    ]
    .iter()
    .filter(|m| snap.has_module(m))
    .map(|m| m.to_string())
    .collect();
    if mods.is_empty() {
        mods.push("none of nvidia, nvidia_peermem, nv_peer_mem, ib_core, mlx5_core".into());
    }
    let peers: Vec<String> = snap
        .memory_peers
        .iter()
        .map(|p| format!("{} {}", p.name, p.version.as_deref().unwrap_or("?")))
        .collect();
    let mod_ev = format!("modules: {}", mods.join(", "));
    let peers_ev = if peers.is_empty() {
        "/sys/kernel/mm/memory_peers: none".to_string()
    } else {
        format!("memory peers: {}", peers.join(", "))
    };
    if host.peermem {
        return Finding::new(
            "peermem.module",
            Severity::Ok,
            "host",
            "peer-memory module loaded: ibv_reg_mr accepts GPU pointers",
        )
        .evidence(mod_ev)
        .evidence(peers_ev);
    }
    let sev = if tri == Tri::No {
        Severity::Fail
    } else {
        Severity::Warn
    };
    Finding::new(
        "peermem.module",
        sev,
        "host",
        if tri == Tri::No {
            "no peer-memory module and dma-buf is not possible: GPU memory cannot be registered with the NIC"
        } else {
            "no peer-memory module: ibv_reg_mr on GPU memory fails (EFAULT); only the dma-buf path is left"
        },
    )
    .evidence(mod_ev)
    .evidence(peers_ev)
    .fix(format!("`modprobe nvidia-peermem` (ships with NVIDIA driver >= 470; make it persistent in /etc/modules-load.d/), or use dma-buf: {}", dma_buf_requirements()))
}

/// `dmabuf.readiness`: whether dma-buf registration can work (`tri`, with its evidence `ev` and
/// the `missing` requirements), with the NVIDIA driver parameters that bear on it.
fn dmabuf_finding(
    snap: &Snapshot,
    host: &HostFacts,
    tri: Tri,
    ev: Vec<String>,
    missing: &[String],
) -> Finding {
    // NVIDIA driver parameters that change peer mappings and PCIe ordering.
    let params: Vec<String> = snap
        .nvidia
        .iter()
        .flat_map(|n| n.params.iter())
        .filter(|(k, v)| {
            (k.as_str() == "RegistryDwords" && v.contains("PeerMappingOverride"))
                || k.as_str() == "EnablePCIERelaxedOrderingMode"
                || k.as_str() == "GrdmaPciTopoCheckOverride"
        })
        .map(|(k, v)| format!("nvidia param {k}: {v}"))
        .collect();
    let (sev, msg) = match tri {
        Tri::Yes => (
            Severity::Ok,
            "dma-buf registration possible (NIC import support is probed at registration)"
                .to_string(),
        ),
        Tri::No => (
            if host.peermem {
                Severity::Warn
            } else {
                Severity::Fail
            },
            format!(
                "dma-buf registration not possible: needs {}",
                missing.join(", ")
            ),
        ),
        Tri::Unknown => (
            Severity::Unknown,
            "dma-buf readiness unknown (CUDA driver or kernel facts missing)".to_string(),
        ),
    };
    let mut f = Finding::new("dmabuf.readiness", sev, "host", msg);
    for e in ev.into_iter().chain(params) {
        f = f.evidence(e);
    }
    if tri == Tri::No {
        f = f.fix(format!(
            "install the NVIDIA open kernel module (>= {OPEN_MODULE_MIN_DRIVER}, e.g. the `-open` driver packages), a kernel >= {}.{} and a CUDA driver >= {}; rdma-core >= {RDMA_CORE_MIN_DMA_BUF} for ibv_reg_dmabuf_mr",
            DMA_BUF_MIN_KERNEL.0,
            DMA_BUF_MIN_KERNEL.1,
            gdr::cuda::version_text(DMA_BUF_MIN_DRIVER_VERSION)
        ));
    } else if tri == Tri::Unknown {
        f = f.fix(match &snap.cuda {
            None => "CUDA facts were not collected (a --root read or a capture without them): run `gdr doctor` on the machine itself",
            Some(_) => "install the NVIDIA driver so that libcuda.so.1 loads (the evidence says why it did not), then run `gdr doctor` again",
        });
    }
    f
}

/// `open kernel module >= 515, Linux >= 5.12, CUDA >= 11.7`, from the rules' constants.
fn dma_buf_requirements() -> String {
    format!(
        "open kernel module >= {OPEN_MODULE_MIN_DRIVER}, Linux >= {}.{}, CUDA >= {}",
        DMA_BUF_MIN_KERNEL.0,
        DMA_BUF_MIN_KERNEL.1,
        gdr::cuda::version_text(DMA_BUF_MIN_DRIVER_VERSION)
    )
}

fn cuda_attributes(snap: &Snapshot, host: &HostFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    for g in &host.gpus {
        let Some(c) = &g.cuda else {
            let why = match &snap.cuda {
                None => "CUDA attributes: unknown (not read through the CUDA driver)".to_string(),
                Some(ci) => format!(
                    "CUDA attributes: unknown (CUDA does not list this GPU{})",
                    ci.error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                ),
            };
            out.push(
                Finding::new("cuda.attributes", Severity::Unknown, &g.subject, why)
                    .fix("run `gdr doctor` on the machine itself with the NVIDIA driver's libcuda.so.1 on the loader path"),
            );
            continue;
        };
        let b = |v: Option<bool>| v.map_or("?".to_string(), |x| (x as i32).to_string());
        let i = |v: Option<i32>| v.map_or("?".to_string(), |x| x.to_string());
        let mut f = match c.gpudirect_rdma_supported {
            Some(true) => Finding::new("cuda.attributes", Severity::Ok, &g.subject, format!("{}: GPUDirect RDMA supported", c.name)),
            Some(false) => Finding::new("cuda.attributes", Severity::Fail, &g.subject, format!("{}: CUDA says GPUDirect RDMA is not supported on this GPU", c.name))
                .fix("GeForce and some virtualised GPUs lack GPUDirect RDMA; use a data-centre GPU, or a driver/vGPU profile that enables it"),
            None => Finding::new("cuda.attributes", Severity::Unknown, &g.subject, format!("{}: GPUDirect RDMA attribute not read", c.name)),
        };
        f = f
            .evidence(format!("CUDA ordinal {}", c.ordinal))
            .evidence(format!(
                "GPU_DIRECT_RDMA_SUPPORTED={}",
                b(c.gpudirect_rdma_supported)
            ))
            .evidence(format!("DMA_BUF_SUPPORTED={}", b(c.dma_buf_supported)))
            .evidence(format!(
                "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED={}",
                b(c.gpudirect_rdma_with_vmm_supported)
            ))
            .evidence(format!(
                "GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS={}",
                i(c.gpudirect_rdma_flush_writes_options)
            ))
            .evidence(format!(
                "GPU_DIRECT_RDMA_WRITES_ORDERING={}",
                i(c.gpudirect_rdma_writes_ordering)
            ));
        if c.gpudirect_rdma_writes_ordering.is_some_and(|o| o < 100) {
            f = f.evidence("writes ordering < 100: a consumer must flush (cuFlushGPUDirectRDMAWrites or a 1-byte RDMA READ) before reading RDMA-written data");
        }
        out.push(f);
    }
    out
}

fn memlock(snap: &Snapshot) -> Finding {
    const MIB: u64 = 1 << 20;
    let fix = "`ulimit -l unlimited` in the launching shell, `* - memlock unlimited` in /etc/security/limits.conf, or `LimitMEMLOCK=infinity` for a systemd service / `--ulimit memlock=-1` for a container";
    match snap.memlock {
        None => Finding::new(
            "memlock.limit",
            Severity::Unknown,
            "host",
            "locked-memory limit unknown",
        )
        .evidence("/proc/self/limits not readable"),
        Some(l) => {
            let show = |x: Limit| match x {
                Limit::Unlimited => "unlimited".to_string(),
                Limit::Bytes(b) => format!("{} KiB", b / 1024),
            };
            let ev = format!(
                "Max locked memory: soft {} hard {}",
                show(l.soft),
                show(l.hard)
            );
            match l.soft {
                Limit::Unlimited => Finding::new("memlock.limit", Severity::Ok, "host", "locked-memory limit unlimited").evidence(ev),
                Limit::Bytes(b) if b < 64 * MIB => Finding::new(
                    "memlock.limit",
                    Severity::Fail,
                    "host",
                    format!("locked-memory limit {} KiB: registering host buffers (staging, bounce, large queues) beyond it fails with ENOMEM", b / 1024),
                )
                .evidence(ev)
                .fix(fix),
                Limit::Bytes(b) => Finding::new(
                    "memlock.limit",
                    Severity::Warn,
                    "host",
                    format!("locked-memory limit {} MiB: enough for small jobs, not for large host registrations", b / MIB),
                )
                .evidence(ev)
                .fix(fix),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_and_versions() {
        assert_eq!(normalize_bdf("00000000:00:06.0"), "0000:00:06.0");
        assert_eq!(normalize_bdf("0000:AF:00.0\0"), "0000:af:00.0");
        assert_eq!(
            dma_buf_requirements(),
            "open kernel module >= 515, Linux >= 5.12, CUDA >= 11.7"
        );
    }
}
