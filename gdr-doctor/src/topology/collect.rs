//! Reading a [`Snapshot`] from sysfs and procfs below a root directory.
//!
//! Every path is resolved inside the root, symbolic links included (an absolute link target is
//! taken relative to the root), so a copied or synthetic `sys/` + `proc/` tree reads exactly like
//! the live machine. Every file is read through [`FactReader`], the reader registration takes
//! its host facts from, so the doctor and registration see the same machine.

use super::pcie::bytes_to_hex;
use super::*;
use gdr::gpu_mr::facts::FactReader;
use std::path::{Component, Path};

/// What [`collect_with`] takes from outside the root.
#[derive(Debug, Clone, Default)]
pub struct CollectOptions {
    /// The environment variables to record (normally the process's NCCL variables).
    pub env: BTreeMap<String, String>,
    /// CUDA facts to record; `None` leaves [`Snapshot::cuda`] unknown.
    pub cuda: Option<CudaInfo>,
    /// Open each RDMA device and probe whether it imports dma-bufs
    /// ([`RdmaDevice::dma_buf`]); only meaningful for this machine (root `/`).
    pub probe_nics: bool,
}

impl CollectOptions {
    /// The NCCL variables ([`NCCL_ENV_VARS`]) of this process, no CUDA facts.
    pub fn from_process_env() -> Self {
        let env = NCCL_ENV_VARS
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect();
        CollectOptions {
            env,
            cuda: None,
            probe_nics: false,
        }
    }

    /// For this machine: the process's NCCL variables, the CUDA driver's facts
    /// ([`super::query_cuda`]; its `error` says why when libcuda is absent) and each RDMA
    /// device's dma-buf probe.
    pub fn live() -> Self {
        CollectOptions {
            cuda: Some(super::query_cuda()),
            probe_nics: true,
            ..CollectOptions::from_process_env()
        }
    }
}

/// Collect a snapshot of the machine whose `/sys` and `/proc` lie below `root` (`/` for this
/// machine), with this process's NCCL environment variables and no CUDA facts.
///
/// Fails only when `root` itself is not a readable directory; anything missing below it is
/// `None` in the snapshot, anything unreadable is listed in [`Snapshot::read_errors`].
pub fn collect(root: &Path) -> Result<Snapshot> {
    collect_with(root, CollectOptions::from_process_env())
}

/// [`collect`] with explicit environment and CUDA facts.
///
/// # Errors
/// [`Error::Io`] when `root` cannot be read, [`Error::NotADirectory`] when it is not a
/// directory.
pub fn collect_with(root: &Path, opts: CollectOptions) -> Result<Snapshot> {
    let meta = std::fs::metadata(root).map_err(|source| Error::Io {
        what: format!("collect: root directory {}", root.display()),
        source,
    })?;
    if !meta.is_dir() {
        return Err(Error::NotADirectory {
            root: root.to_path_buf(),
            hint: Hint::new(
                "give a directory that contains sys/ and proc/ (or / for this machine)",
            ),
        });
    }
    let mut c = Collector {
        files: FactReader::new(root),
    };
    let mut snap = Snapshot::new(format!("collected from {}", root.display()));
    snap.kernel = Kernel {
        release: c.files.kernel_release(),
        cmdline: c.files.read_str("/proc/cmdline"),
    };
    snap.pci = c.pci_devices();
    snap.iommu = c.iommu();
    snap.modules = c.files.modules();
    snap.memory_peers = c
        .files
        .memory_peers()
        .into_iter()
        .map(|name| MemoryPeer {
            version: c
                .files
                .read_str(&format!("/sys/kernel/mm/memory_peers/{name}/version")),
            name,
        })
        .collect();
    snap.nvidia = c.nvidia();
    snap.rdma = c.rdma_devices();
    if opts.probe_nics {
        for dev in &mut snap.rdma {
            dev.dma_buf = gdr::gpu_mr::probe_nic_dma_buf_by_name(&dev.name);
        }
    }
    snap.memlock = c.memlock();
    snap.hypervisor = Hypervisor {
        cpu_flag: c.files.read_str("/proc/cpuinfo").map(|text| {
            text.lines()
                .find(|l| l.starts_with("flags"))
                .is_some_and(|l| l.split_whitespace().any(|w| w == "hypervisor"))
        }),
        sys_vendor: c.files.read_str("/sys/class/dmi/id/sys_vendor"),
        product_name: c.files.read_str("/sys/class/dmi/id/product_name"),
    };
    snap.env = opts.env;
    snap.cuda = opts.cuda;
    snap.read_errors = c
        .files
        .take_unreadable()
        .into_iter()
        .map(|u| ReadError {
            path: u.path,
            error: u.error,
        })
        .collect();
    Ok(snap)
}

struct Collector {
    files: FactReader,
}

fn is_bdf(s: &str) -> bool {
    // dddd:bb:dd.f
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars()
            .enumerate()
            .all(|(i, ch)| matches!(i, 4 | 7 | 10) || ch.is_ascii_hexdigit())
}

fn basename(p: &str) -> Option<String> {
    p.rsplit('/')
        .next()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

impl Collector {
    /// Resolve symbolic links inside the root; returns the machine path, `None` if it does not
    /// exist.
    fn resolve(&self, p: &str) -> Option<String> {
        let mut pending: Vec<String> = Path::new(p)
            .components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .rev()
            .collect();
        let mut done: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(comp) = pending.pop() {
            if comp == ".." {
                done.pop();
                continue;
            }
            if comp == "." {
                continue;
            }
            done.push(comp);
            let machine = format!("/{}", done.join("/"));
            let meta = std::fs::symlink_metadata(self.files.host_path(&machine)).ok()?;
            if meta.file_type().is_symlink() {
                links += 1;
                if links > 40 {
                    return None;
                }
                let target = std::fs::read_link(self.files.host_path(&machine)).ok()?;
                done.pop();
                if target.is_absolute() {
                    done.clear();
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(s) => pending.push(s.to_string_lossy().into_owned()),
                        Component::ParentDir => pending.push("..".into()),
                        _ => {}
                    }
                }
            }
        }
        Some(format!("/{}", done.join("/")))
    }

    fn read_parsed<T: std::str::FromStr>(
        &mut self,
        p: &str,
        parse: fn(&str) -> Option<T>,
    ) -> Option<T> {
        let s = self.files.read_str(p)?;
        let v = parse(s.trim());
        if v.is_none() {
            self.files.record(p, format!("unexpected value {s:?}"));
        }
        v
    }

    fn pci_devices(&mut self) -> Vec<PciDevice> {
        let mut out = Vec::new();
        for bdf in self.files.list_dir("/sys/bus/pci/devices") {
            let link = format!("/sys/bus/pci/devices/{bdf}");
            let Some(path) = self.resolve(&link) else {
                self.files.record(&link, "dangling link");
                continue;
            };
            let hex = |s: &str| {
                let s = s.trim_start_matches("0x");
                u32::from_str_radix(s, 16).ok()
            };
            let class = self.read_parsed(&format!("{path}/class"), hex);
            let vendor = self
                .read_parsed(&format!("{path}/vendor"), hex)
                .and_then(|v| u16::try_from(v).ok());
            let device = self
                .read_parsed(&format!("{path}/device"), hex)
                .and_then(|v| u16::try_from(v).ok());
            let numa_node = self.read_parsed(&format!("{path}/numa_node"), |s| s.parse().ok());
            let current_link_speed = self.files.read_str(&format!("{path}/current_link_speed"));
            let max_link_speed = self.files.read_str(&format!("{path}/max_link_speed"));
            let current_link_width =
                self.read_parsed(&format!("{path}/current_link_width"), |s| s.parse().ok());
            let max_link_width =
                self.read_parsed(&format!("{path}/max_link_width"), |s| s.parse().ok());
            let driver = self
                .resolve(&format!("{path}/driver"))
                .and_then(|p| basename(&p));
            let iommu_group = self
                .resolve(&format!("{path}/iommu_group"))
                .and_then(|p| basename(&p))
                .and_then(|s| s.parse().ok());
            let config = self.files.read_bytes(&format!("{path}/config")).map(|b| {
                let used = b.iter().rposition(|x| *x != 0).map_or(0, |i| i + 1);
                ConfigSpace {
                    len: b.len(),
                    hex: bytes_to_hex(&b[..used]),
                }
            });
            out.push(PciDevice {
                bdf,
                path,
                class,
                vendor,
                device,
                numa_node,
                current_link_speed,
                max_link_speed,
                current_link_width,
                max_link_width,
                driver,
                iommu_group,
                config,
            });
        }
        out
    }

    fn iommu(&mut self) -> Iommu {
        let units = self.files.list_dir("/sys/class/iommu");
        let mut group_types = BTreeMap::new();
        for g in self.files.list_dir("/sys/kernel/iommu_groups") {
            let Ok(n) = g.parse::<u32>() else { continue };
            if let Some(t) = self
                .files
                .read_str(&format!("/sys/kernel/iommu_groups/{g}/type"))
            {
                group_types.insert(n, t);
            }
        }
        Iommu { units, group_types }
    }

    fn nvidia(&mut self) -> Option<NvidiaDriver> {
        let version = self.files.nvidia_version();
        let params_text = self.files.read_str("/proc/driver/nvidia/params");
        if version.is_none() && params_text.is_none() {
            return None;
        }
        let params = params_text
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                Some((k.trim().to_string(), v.trim().to_string()))
            })
            .collect();
        Some(NvidiaDriver { version, params })
    }

    fn memlock(&mut self) -> Option<MemlockLimit> {
        let text = self.files.read_str("/proc/self/limits")?;
        let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
        let mut fields = line["Max locked memory".len()..].split_whitespace();
        let parse = |s: Option<&str>| -> Option<Limit> {
            match s? {
                "unlimited" => Some(Limit::Unlimited),
                n => n.parse().ok().map(Limit::Bytes),
            }
        };
        let soft = parse(fields.next());
        let hard = parse(fields.next());
        match (soft, hard) {
            (Some(soft), Some(hard)) => Some(MemlockLimit { soft, hard }),
            _ => {
                self.files
                    .record("/proc/self/limits", format!("unexpected line {line:?}"));
                None
            }
        }
    }

    fn rdma_devices(&mut self) -> Vec<RdmaDevice> {
        let mut out = Vec::new();
        for name in self.files.list_dir("/sys/class/infiniband") {
            let Some(dir) = self.resolve(&format!("/sys/class/infiniband/{name}")) else {
                self.files
                    .record(&format!("/sys/class/infiniband/{name}"), "dangling link");
                continue;
            };
            let pci_bdf = self
                .resolve(&format!("{dir}/device"))
                .and_then(|p| basename(&p))
                .filter(|b| is_bdf(b))
                .filter(|b| {
                    std::fs::symlink_metadata(
                        self.files.host_path(&format!("/sys/bus/pci/devices/{b}")),
                    )
                    .is_ok()
                });
            let mut dev = RdmaDevice {
                name: name.clone(),
                pci_bdf,
                parent: self.files.read_str(&format!("{dir}/parent")),
                fw_ver: self.files.read_str(&format!("{dir}/fw_ver")),
                node_type: self.files.read_str(&format!("{dir}/node_type")),
                hca_type: self.files.read_str(&format!("{dir}/hca_type")),
                board_id: self.files.read_str(&format!("{dir}/board_id")),
                ports: Vec::new(),
                dma_buf: None,
            };
            let mut ports: Vec<u32> = self
                .files
                .list_dir(&format!("{dir}/ports"))
                .iter()
                .filter_map(|p| p.parse().ok())
                .collect();
            ports.sort_unstable();
            for port in ports {
                let pdir = format!("{dir}/ports/{port}");
                let mut p = RdmaPort {
                    port,
                    state: self.files.read_str(&format!("{pdir}/state")),
                    phys_state: self.files.read_str(&format!("{pdir}/phys_state")),
                    rate: self.files.read_str(&format!("{pdir}/rate")),
                    link_layer: self.files.read_str(&format!("{pdir}/link_layer")),
                    gids: Vec::new(),
                    netdevs: Vec::new(),
                };
                let mut idx: Vec<u32> = self
                    .files
                    .list_dir(&format!("{pdir}/gids"))
                    .iter()
                    .filter_map(|i| i.parse().ok())
                    .collect();
                idx.sort_unstable();
                for i in idx {
                    let Some(gid) = self.files.read_str(&format!("{pdir}/gids/{i}")) else {
                        continue;
                    };
                    if gid.chars().all(|c| c == '0' || c == ':') {
                        // An empty slot; its attributes read as EINVAL.
                        continue;
                    }
                    p.gids.push(GidEntry {
                        index: i,
                        gid,
                        gid_type: self.files.read_str(&format!("{pdir}/gid_attrs/types/{i}")),
                        ndev: self.files.read_str(&format!("{pdir}/gid_attrs/ndevs/{i}")),
                    });
                }
                let mut names: Vec<String> = p.gids.iter().filter_map(|g| g.ndev.clone()).collect();
                if let Some(parent) = &dev.parent {
                    names.push(parent.clone());
                }
                names.sort();
                names.dedup();
                p.netdevs = names
                    .into_iter()
                    .map(|n| Netdev {
                        mtu: self
                            .read_parsed(&format!("/sys/class/net/{n}/mtu"), |s| s.parse().ok()),
                        name: n,
                    })
                    .collect();
                dev.ports.push(p);
            }
            out.push(dev);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_shape() {
        assert!(is_bdf("0000:00:06.0"));
        assert!(is_bdf("0000:af:1f.7"));
        assert!(!is_bdf("pci0000:00"));
        assert!(!is_bdf("rxe0"));
    }

    #[test]
    fn missing_root_is_a_typed_error() {
        let e = collect_with(
            Path::new("/nonexistent/gdr-root"),
            CollectOptions::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/gdr-root"), "{e}");
    }
}
