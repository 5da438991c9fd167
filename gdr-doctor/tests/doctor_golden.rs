//! Golden-output tests of `gdr_doctor` on recorded and synthetic machines.
//!
//! Fixtures live in `tests/fixtures/doctor/` (in this crate, `gdr-doctor/`):
//! - `snapshots/<name>.json`: snapshots built by the functions below (each one a machine
//!   described in a few lines); the test checks the committed file still equals what the builder
//!   makes, so the JSON that `gdr doctor --snapshot` replays is the reviewed description.
//! - `trees/<name>/`: sysfs/procfs trees read through `collect()`.
//! - `golden/<name>.report.json` and `golden/<name>.table.txt`: the expected report.
//!
//! `GDR_BLESS=1 cargo test -p gdr-doctor --test doctor_golden` rewrites snapshots and goldens.

use gdr::device::Selection;
use gdr_doctor::topology::pcie::bytes_to_hex;
use gdr_doctor::topology::{
    collect_with, CollectOptions, ConfigSpace, CudaDevice, CudaInfo, GidEntry, Hypervisor, Iommu,
    Kernel, Limit, MemlockLimit, Netdev, NvidiaDriver, PciDevice, RdmaDevice, RdmaPort, Snapshot,
};
use gdr_doctor::{
    diagnose, rails_for_host, rank_rails, MemoryLocation, PathClass, Report, Severity, VerdictKind,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/doctor")
}

fn bless() -> bool {
    std::env::var_os("GDR_BLESS").is_some_and(|v| v == "1")
}

/// Compare `actual` with a committed file (or write it when blessing).
fn golden(rel: &str, actual: &str) {
    let path = fixtures().join(rel);
    if bless() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with GDR_BLESS=1 to create it", path.display()));
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the output (first difference at line {}):\n--- expected\n{}\n--- actual\n{}\nrerun with GDR_BLESS=1 if the change is intended",
            path.display(),
            line + 1,
            expected.lines().nth(line).unwrap_or("<end>"),
            actual.lines().nth(line).unwrap_or("<end>")
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Builders: a machine in a few lines.

const MIB: u64 = 1 << 20;

/// A configuration space of `len` bytes (4096 = read as root) with, optionally, an ACS
/// extended capability whose Control register is `acs`, and a PCIe capability whose relaxed
/// ordering bit is `ro`.
fn config(len: usize, class: u32, acs: Option<u16>, ro: Option<bool>) -> ConfigSpace {
    let mut c = vec![0u8; len];
    c[0x06] = 0x10;
    c[0x09] = class as u8;
    c[0x0a] = (class >> 8) as u8;
    c[0x0b] = (class >> 16) as u8;
    c[0x34] = 0x40;
    if len > 0x48 {
        c[0x40] = 0x10; // PCI Express capability, last in the list
        if ro == Some(true) {
            c[0x48] = 0x10;
        }
    }
    if let (Some(ctl), true) = (acs, len > 0x100) {
        // AER at 0x100 -> ACS at 0x148.
        c[0x100..0x104].copy_from_slice(&(0x0001u32 | (1 << 16) | (0x148 << 20)).to_le_bytes());
        c[0x148..0x14c].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
        c[0x14c..0x14e].copy_from_slice(&0x005fu16.to_le_bytes());
        c[0x14e..0x150].copy_from_slice(&ctl.to_le_bytes());
    }
    let used = c.iter().rposition(|x| *x != 0).map_or(0, |i| i + 1);
    ConfigSpace {
        len,
        hex: bytes_to_hex(&c[..used]),
    }
}

struct Pci<'a> {
    snap: &'a mut Snapshot,
    cfg_len: usize,
    /// Link of every bridge: (current GT/s, current width, max GT/s, max width).
    bridge_link: (f64, u32, f64, u32),
}

impl Pci<'_> {
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        parent: &str,
        bdf: &str,
        class: u32,
        vendor: u16,
        device: u16,
        numa: i32,
        link: (f64, u32, f64, u32),
        acs: Option<u16>,
    ) -> String {
        let path = format!("{parent}/{bdf}");
        let speed = |g: f64| format!("{g:.1} GT/s PCIe");
        self.snap.pci.push(PciDevice {
            bdf: bdf.to_string(),
            path: path.clone(),
            class: Some(class),
            vendor: Some(vendor),
            device: Some(device),
            numa_node: Some(numa),
            current_link_speed: Some(speed(link.0)),
            current_link_width: Some(link.1),
            max_link_speed: Some(speed(link.2)),
            max_link_width: Some(link.3),
            driver: Some(
                match class >> 8 {
                    0x0604 => "pcieport",
                    0x0302 | 0x0300 => "nvidia",
                    _ => "mlx5_core",
                }
                .to_string(),
            ),
            iommu_group: None,
            config: Some(config(
                self.cfg_len,
                class,
                if class >> 8 == 0x0604 { acs } else { None },
                if vendor == 0x15b3 { Some(true) } else { None },
            )),
        });
        path
    }
    fn bridge(&mut self, parent: &str, bdf: &str, numa: i32, acs: u16) -> String {
        let link = self.bridge_link;
        self.add(parent, bdf, 0x060400, 0x1000, 0xc010, numa, link, Some(acs))
    }
}

const GEN4X16: (f64, u32, f64, u32) = (16.0, 16, 16.0, 16);
const GEN5X16: (f64, u32, f64, u32) = (32.0, 16, 32.0, 16);

fn gids_for(ipv4: [u8; 4], ndev: &str) -> Vec<GidEntry> {
    let v4 = format!(
        "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
        ipv4[0], ipv4[1], ipv4[2], ipv4[3]
    );
    let ll = "fe80:0000:0000:0000:0ac0:ebff:fe00:0001".to_string();
    [
        (0, ll.clone(), "IB/RoCE v1"),
        (1, ll, "RoCE v2"),
        (2, v4.clone(), "IB/RoCE v1"),
        (3, v4, "RoCE v2"),
    ]
    .into_iter()
    .map(|(index, gid, t)| GidEntry {
        index,
        gid,
        gid_type: Some(t.to_string()),
        ndev: Some(ndev.to_string()),
    })
    .collect()
}

fn roce_port(rate: &str, ipv4: [u8; 4], ndev: &str, mtu: u32) -> RdmaPort {
    RdmaPort {
        port: 1,
        state: Some("4: ACTIVE".into()),
        phys_state: Some("5: LinkUp".into()),
        rate: Some(rate.into()),
        link_layer: Some("Ethernet".into()),
        gids: gids_for(ipv4, ndev),
        netdevs: vec![Netdev {
            name: ndev.into(),
            mtu: Some(mtu),
        }],
    }
}

fn ib_port(state: &str, phys: &str, rate: &str) -> RdmaPort {
    RdmaPort {
        port: 1,
        state: Some(state.into()),
        phys_state: Some(phys.into()),
        rate: Some(rate.into()),
        link_layer: Some("InfiniBand".into()),
        gids: vec![GidEntry {
            index: 0,
            gid: "fe80:0000:0000:0000:b83f:d203:0012:3456".into(),
            gid_type: Some("IB/RoCE v1".into()),
            ndev: None,
        }],
        netdevs: vec![],
    }
}

fn rdma(name: &str, bdf: &str, hca: &str, fw: &str, port: RdmaPort) -> RdmaDevice {
    RdmaDevice {
        name: name.into(),
        pci_bdf: Some(bdf.into()),
        parent: None,
        fw_ver: Some(fw.into()),
        node_type: Some("1: CA".into()),
        hca_type: Some(hca.into()),
        board_id: None,
        ports: vec![port],
        dma_buf: None,
    }
}

fn cuda_dev(ordinal: i32, name: &str, bdf: &str, dmabuf: bool) -> CudaDevice {
    CudaDevice {
        ordinal,
        name: name.into(),
        pci_bus_id: bdf.into(),
        gpudirect_rdma_supported: Some(true),
        dma_buf_supported: Some(dmabuf),
        gpudirect_rdma_with_vmm_supported: Some(true),
        gpudirect_rdma_flush_writes_options: Some(1),
        gpudirect_rdma_writes_ordering: Some(100),
    }
}

fn modules(m: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = m.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

fn bare_metal() -> Hypervisor {
    Hypervisor {
        cpu_flag: Some(false),
        sys_vendor: Some("NVIDIA".into()),
        product_name: Some("DGXA100".into()),
    }
}

/// The source document's DGX A100: GPU0 and mlx5_0 (ConnectX-6, RoCE v2) under one PCIe
/// switch whose downstream ports have ACS P2P redirect on, GPU1 on the other socket with no NIC
/// of its own, no peer-memory module (proprietary driver 470 on Linux 5.4, so no dma-buf
/// either), the port at 40 Gb/s instead of 200, and NCCL_IB_GID_INDEX pointing at the RoCE v1
/// link-local GID.
fn dgx_a100(fixed: bool) -> Snapshot {
    let name = if fixed {
        "dgx-a100-fixed"
    } else {
        "dgx-a100-failing"
    };
    let mut s = Snapshot::new(format!(
        "fixture {name} (built by gdr-doctor/tests/doctor_golden.rs)"
    ));
    let acs = if fixed { 0x0000 } else { 0x001d };
    let mut p = Pci {
        snap: &mut s,
        cfg_len: 4096,
        bridge_link: GEN4X16,
    };
    let rc0 = "/sys/devices/pci0000:00";
    let rp0 = p.bridge(rc0, "0000:00:01.1", 0, 0x0000);
    let usp0 = p.bridge(&rp0, "0000:01:00.0", 0, 0x0000);
    let dsp_gpu0 = p.bridge(&usp0, "0000:02:00.0", 0, acs);
    let dsp_nic0 = p.bridge(&usp0, "0000:02:01.0", 0, acs);
    p.add(
        &dsp_gpu0,
        "0000:07:00.0",
        0x030200,
        0x10de,
        0x20b0,
        0,
        GEN4X16,
        None,
    );
    p.add(
        &dsp_nic0,
        "0000:08:00.0",
        0x020000,
        0x15b3,
        0x101b,
        0,
        GEN4X16,
        None,
    );
    let rc1 = "/sys/devices/pci0000:80";
    let rp1 = p.bridge(rc1, "0000:80:01.1", 1, 0x0000);
    let usp1 = p.bridge(&rp1, "0000:81:00.0", 1, 0x0000);
    let dsp_gpu1 = p.bridge(&usp1, "0000:82:00.0", 1, acs);
    p.add(
        &dsp_gpu1,
        "0000:87:00.0",
        0x030200,
        0x10de,
        0x20b0,
        1,
        GEN4X16,
        None,
    );
    if fixed {
        let dsp_nic1 = p.bridge(&usp1, "0000:82:01.0", 1, acs);
        p.add(
            &dsp_nic1,
            "0000:88:00.0",
            0x020000,
            0x15b3,
            0x101b,
            1,
            GEN4X16,
            None,
        );
    }
    s.pci.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    s.kernel = Kernel {
        release: Some("5.4.0-42-generic".into()),
        cmdline: Some("BOOT_IMAGE=/boot/vmlinuz-5.4.0-42-generic root=/dev/md0 ro".into()),
    };
    let mut m = vec![
        "nvidia",
        "nvidia_uvm",
        "ib_core",
        "ib_uverbs",
        "mlx5_core",
        "mlx5_ib",
    ];
    if fixed {
        m.push("nvidia_peermem");
    }
    s.modules = modules(&m);
    s.nvidia = Some(NvidiaDriver {
        version: Some(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.57.02  Tue Jul 13 16:14:05 UTC 2021"
                .into(),
        ),
        params: BTreeMap::from([("RegistryDwords".to_string(), "\"\"".to_string())]),
    });
    let rate = if fixed {
        "200 Gb/sec (4X HDR)"
    } else {
        "40 Gb/sec (4X QDR)"
    };
    s.rdma.push(rdma(
        "mlx5_0",
        "0000:08:00.0",
        "MT4123",
        "20.31.1014",
        roce_port(rate, [192, 168, 10, 1], "enp8s0f0", 9000),
    ));
    if fixed {
        s.rdma.push(rdma(
            "mlx5_1",
            "0000:88:00.0",
            "MT4123",
            "20.31.1014",
            roce_port("200 Gb/sec (4X HDR)", [192, 168, 11, 1], "enp136s0f0", 9000),
        ));
    }
    s.memlock = Some(MemlockLimit {
        soft: Limit::Unlimited,
        hard: Limit::Unlimited,
    });
    s.hypervisor = bare_metal();
    s.env = BTreeMap::from([(
        "NCCL_IB_GID_INDEX".to_string(),
        if fixed { "3" } else { "0" }.to_string(),
    )]);
    s.cuda = Some(CudaInfo {
        driver_version: Some(11040),
        devices: vec![
            cuda_dev(0, "NVIDIA A100-SXM4-40GB", "00000000:07:00.0", false),
            cuda_dev(1, "NVIDIA A100-SXM4-40GB", "00000000:87:00.0", false),
        ],
        error: None,
    });
    s
}

/// One H100 and one ConnectX-7 (InfiniBand NDR) under one switch, peer memory and dma-buf
/// both ready, IOMMU in passthrough.
fn healthy_pix() -> Snapshot {
    let mut s = Snapshot::new("fixture healthy-pix (built by gdr-doctor/tests/doctor_golden.rs)");
    let mut p = Pci {
        snap: &mut s,
        cfg_len: 4096,
        bridge_link: GEN5X16,
    };
    let rp = p.bridge("/sys/devices/pci0000:00", "0000:00:01.0", 0, 0x0000);
    let usp = p.bridge(&rp, "0000:15:00.0", 0, 0x0000);
    let d1 = p.bridge(&usp, "0000:16:00.0", 0, 0x0011);
    let d2 = p.bridge(&usp, "0000:16:01.0", 0, 0x0011);
    p.add(
        &d1,
        "0000:18:00.0",
        0x030200,
        0x10de,
        0x2330,
        0,
        GEN5X16,
        None,
    );
    p.add(
        &d2,
        "0000:19:00.0",
        0x020700,
        0x15b3,
        0x1021,
        0,
        GEN5X16,
        None,
    );
    for d in &mut s.pci {
        d.iommu_group = Some(match d.bdf.as_str() {
            "0000:18:00.0" => 20,
            "0000:19:00.0" => 21,
            _ => 1,
        });
    }
    s.pci.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    s.iommu = Iommu {
        units: vec!["dmar0".into(), "dmar1".into()],
        group_types: BTreeMap::from([
            (1, "identity".to_string()),
            (20, "identity".to_string()),
            (21, "identity".to_string()),
        ]),
    };
    s.kernel = Kernel {
        release: Some("6.5.0-1018-nvidia".into()),
        cmdline: Some("BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 ro intel_iommu=on iommu=pt".into()),
    };
    s.modules = modules(&[
        "nvidia",
        "nvidia_uvm",
        "nvidia_peermem",
        "ib_core",
        "mlx5_core",
        "mlx5_ib",
    ]);
    s.memory_peers = vec![];
    s.nvidia = Some(NvidiaDriver {
        version: Some("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16-I3-D08-1-2)  Tue Mar  5 22:14:05 UTC 2024".into()),
        params: BTreeMap::new(),
    });
    s.rdma.push(rdma(
        "mlx5_0",
        "0000:19:00.0",
        "MT4129",
        "28.39.1002",
        ib_port("4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)"),
    ));
    s.memlock = Some(MemlockLimit {
        soft: Limit::Unlimited,
        hard: Limit::Unlimited,
    });
    s.hypervisor = Hypervisor {
        cpu_flag: Some(false),
        sys_vendor: Some("Supermicro".into()),
        product_name: Some("SYS-821GE-TNHR".into()),
    };
    s.cuda = Some(CudaInfo {
        driver_version: Some(12040),
        devices: vec![cuda_dev(0, "NVIDIA H100 80GB HBM3", "0000:18:00.0", true)],
        error: None,
    });
    s
}

/// GPU and NIC on two root ports of one root complex (PHB), IOMMU translating, netdev MTU
/// 1500, NCCL_NET_GDR_LEVEL=PIX and an NCCL_IB_HCA that names a device that does not exist.
fn phb_host() -> Snapshot {
    let mut s = Snapshot::new("fixture phb-host (built by gdr-doctor/tests/doctor_golden.rs)");
    let mut p = Pci {
        snap: &mut s,
        cfg_len: 4096,
        bridge_link: GEN4X16,
    };
    let rc = "/sys/devices/pci0000:00";
    let rp1 = p.bridge(rc, "0000:00:01.0", 0, 0x0000);
    let rp3 = p.bridge(rc, "0000:00:03.0", 0, 0x0000);
    p.add(
        &rp1,
        "0000:01:00.0",
        0x030200,
        0x10de,
        0x20b5,
        0,
        GEN4X16,
        None,
    );
    p.add(
        &rp3,
        "0000:41:00.0",
        0x020000,
        0x15b3,
        0x101d,
        0,
        GEN4X16,
        None,
    );
    for d in &mut s.pci {
        d.iommu_group = Some(match d.bdf.as_str() {
            "0000:01:00.0" => 12,
            "0000:41:00.0" => 30,
            _ => 2,
        });
    }
    s.pci.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    s.iommu = Iommu {
        units: vec!["ivhd0".into()],
        group_types: BTreeMap::from([
            (2, "DMA-FQ".to_string()),
            (12, "DMA-FQ".to_string()),
            (30, "DMA-FQ".to_string()),
        ]),
    };
    s.kernel = Kernel {
        release: Some("6.1.0-27-amd64".into()),
        cmdline: Some(
            "BOOT_IMAGE=/boot/vmlinuz-6.1.0-27-amd64 root=UUID=1234 ro amd_iommu=on".into(),
        ),
    };
    s.modules = modules(&[
        "nvidia",
        "nvidia_peermem",
        "ib_core",
        "mlx5_core",
        "mlx5_ib",
    ]);
    s.nvidia = Some(NvidiaDriver {
        version: Some("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.183.01  Release Build  (dvs-builder@U16-I2-C04-1-2)  Sun May 12 19:39:15 UTC 2024".into()),
        params: BTreeMap::new(),
    });
    s.rdma.push(rdma(
        "mlx5_0",
        "0000:41:00.0",
        "MT4125",
        "22.36.1010",
        roce_port("100 Gb/sec (4X EDR)", [10, 1, 0, 7], "ens3f0np0", 1500),
    ));
    s.memlock = Some(MemlockLimit {
        soft: Limit::Bytes(512 * MIB),
        hard: Limit::Unlimited,
    });
    s.hypervisor = Hypervisor {
        cpu_flag: Some(false),
        sys_vendor: Some("Dell Inc.".into()),
        product_name: Some("PowerEdge R7525".into()),
    };
    s.env = BTreeMap::from([
        ("NCCL_IB_HCA".to_string(), "mlx5_0,mlx5_4".to_string()),
        ("NCCL_NET_GDR_LEVEL".to_string(), "PIX".to_string()),
    ]);
    s.cuda = Some(CudaInfo {
        driver_version: Some(12020),
        devices: vec![cuda_dev(0, "NVIDIA A100 80GB PCIe", "0000:01:00.0", true)],
        error: None,
    });
    s
}

/// GPU and NIC under one switch, but the InfiniBand port is down (no cable / no link).
fn port_down() -> Snapshot {
    let mut s = healthy_pix();
    s.source = "fixture port-down (built by gdr-doctor/tests/doctor_golden.rs)".into();
    s.rdma[0].ports[0] = ib_port("1: DOWN", "3: Disabled", "10 Gb/sec (4X SDR)");
    s
}

/// The GPU test machine as gdr-test-support/fixtures/h200-vm-probe.txt read it: one H200 at
/// 0000:00:06.0 on the root bus of a VM, virtio devices, no RDMA device, the open kernel
/// module 580.159.04, CUDA 13.0 with every GPUDirect attribute on, no peer-memory module.
/// Device ids, link speeds, cpuinfo and limits were not in the probe: left unknown, except the
/// hypervisor flag (the machine is a VM: README, "The GPU machine").
fn h200_vm() -> Snapshot {
    let mut s = Snapshot::new(
        "fixture h200-vm, from gdr-test-support/fixtures/h200-vm-probe.txt (2026-11-30)",
    );
    for (bdf, class, vendor) in [
        ("0000:00:00.0", 0x060000, 0x8086),
        ("0000:00:01.0", 0x018000, 0x1af4),
        ("0000:00:02.0", 0x018000, 0x1af4),
        ("0000:00:03.0", 0x020000, 0x1af4),
        ("0000:00:04.0", 0xffff00, 0x1af4),
        ("0000:00:05.0", 0xffff00, 0x1af4),
        ("0000:00:06.0", 0x030200, 0x10de),
    ] {
        s.pci.push(PciDevice {
            bdf: bdf.into(),
            path: format!("/sys/devices/pci0000:00/{bdf}"),
            class: Some(class),
            vendor: Some(vendor),
            numa_node: Some(-1),
            ..PciDevice::default()
        });
    }
    s.kernel = Kernel {
        release: Some("6.18.44-fc-v657-gpu".into()),
        cmdline: None,
    };
    s.modules = modules(&["libnvdimm", "nvidia", "nvidia_uvm", "nvproxy"]);
    s.nvidia = Some(NvidiaDriver {
        version: Some("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)".into()),
        params: BTreeMap::new(),
    });
    s.hypervisor = Hypervisor {
        cpu_flag: Some(true),
        sys_vendor: None,
        product_name: None,
    };
    s.cuda = Some(CudaInfo {
        driver_version: Some(13000),
        devices: vec![CudaDevice {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            pci_bus_id: "0000:00:06.0".into(),
            gpudirect_rdma_supported: Some(true),
            dma_buf_supported: Some(true),
            gpudirect_rdma_with_vmm_supported: Some(true),
            gpudirect_rdma_flush_writes_options: Some(1),
            gpudirect_rdma_writes_ordering: Some(100),
        }],
        error: None,
    });
    s
}

fn built() -> Vec<(&'static str, Snapshot)> {
    vec![
        ("dgx-a100-failing", dgx_a100(false)),
        ("dgx-a100-fixed", dgx_a100(true)),
        ("healthy-pix", healthy_pix()),
        ("phb-host", phb_host()),
        ("port-down", port_down()),
        ("h200-vm", h200_vm()),
    ]
}

/// The committed snapshot of a built fixture (checked against the builder).
fn load(name: &str) -> Snapshot {
    let path = fixtures().join(format!("snapshots/{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with GDR_BLESS=1 to create it", path.display()));
    Snapshot::from_json(&text, &path.display().to_string()).unwrap()
}

fn tree(name: &str) -> Snapshot {
    let root = fixtures().join("trees").join(name);
    let mut s = collect_with(&root, CollectOptions::default()).unwrap();
    // The report names the source; keep it independent of where the checkout lives.
    s.source = format!("fixture tree {name} (read through collect())");
    s
}

fn check_golden(name: &str, snap: &Snapshot) -> Report {
    let report = diagnose(snap);
    golden(
        &format!("golden/{name}.report.json"),
        &(report.to_json() + "\n"),
    );
    golden(&format!("golden/{name}.table.txt"), &report.to_table(false));
    report
}

// ---------------------------------------------------------------------------------------------

#[test]
fn committed_snapshots_match_their_builders() {
    for (name, snap) in built() {
        golden(&format!("snapshots/{name}.json"), &(snap.to_json() + "\n"));
        assert_eq!(load(name), snap, "{name}: JSON round trip");
    }
}

#[test]
fn golden_reports_for_every_fixture() {
    for (name, _) in built() {
        check_golden(name, &load(name));
    }
    check_golden("nonroot-roce", &tree("nonroot-roce"));
    for name in CAPTURED {
        check_golden(name, &captured(name));
    }
}

/// Snapshots captured on real machines with `gdr doctor dump` (committed as captured).
const CAPTURED: &[&str] = &["h200-vm-live"];

fn captured(name: &str) -> Snapshot {
    let path = fixtures().join(format!("captured/{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap();
    Snapshot::from_json(&text, &path.display().to_string()).unwrap()
}

#[test]
fn captured_h200_agrees_with_the_probe() {
    let s = captured("h200-vm-live");
    let r = diagnose(&s);
    assert_eq!(r.gpus.len(), 1);
    assert_eq!(r.gpus[0].bdf, "0000:00:06.0");
    assert_eq!(r.gpus[0].name, "NVIDIA H200");
    assert_eq!(r.gpus[0].cuda_ordinal, Some(0));
    assert!(r.nics.is_empty() && r.pairs.is_empty());
    assert_eq!(
        finding(&r, "inventory.rdma", "host").severity,
        Severity::Fail
    );
    assert_eq!(
        finding(&r, "dmabuf.readiness", "host").severity,
        Severity::Ok
    );
    let cuda = finding(&r, "cuda.attributes", "0000:00:06.0");
    assert_eq!(cuda.severity, Severity::Ok);
    for attr in [
        "GPU_DIRECT_RDMA_SUPPORTED=1",
        "DMA_BUF_SUPPORTED=1",
        "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED=1",
        "GPU_DIRECT_RDMA_WRITES_ORDERING=100",
    ] {
        assert!(cuda.evidence.iter().any(|e| e == attr), "{attr}: {cuda:?}");
    }
    assert_eq!(r.exit_code(), 1);
    // The builder's reconstruction of the same machine from the text probe agrees on the verdicts.
    let built = diagnose(&h200_vm());
    let ids = |r: &Report| -> Vec<(String, Severity)> {
        let mut v: Vec<_> = r
            .all_findings()
            .map(|f| (f.id.clone(), f.severity))
            .collect();
        v.sort();
        v
    };
    let (mut a, mut b) = (ids(&r), ids(&built));
    // The probe did not read the memlock limit; the capture did.
    a.retain(|x| x.0 != "memlock.limit");
    b.retain(|x| x.0 != "memlock.limit");
    assert_eq!(a, b);
}

fn finding<'a>(r: &'a Report, id: &str, subject_has: &str) -> &'a gdr_doctor::Finding {
    r.findings_with_id(id)
        .find(|f| f.subject.contains(subject_has))
        .unwrap_or_else(|| panic!("no finding {id} about {subject_has}: {}", r.to_table(false)))
}

#[test]
fn failing_dgx_every_cause_is_found_with_its_fix() {
    let r = diagnose(&load("dgx-a100-failing"));
    assert!(!r.gpudirect_usable);
    assert_eq!(r.exit_code(), 1);

    // ACS redirect on the switch's downstream ports between GPU0 and mlx5_0.
    let acs = finding(&r, "pcie.acs", "0000:07:00.0 <-> mlx5_0");
    assert_eq!(acs.severity, Severity::Warn);
    assert!(
        acs.message.contains("0000:02:00.0") && acs.message.contains("0000:02:01.0"),
        "{acs:?}"
    );
    assert!(acs
        .evidence
        .iter()
        .any(|e| e.contains("ReqRedir") && e.contains("CmpltRedir")));
    let fix = acs.fix.as_deref().unwrap();
    assert!(
        fix.contains("setpci -s 0000:02:00.0 ECAP_ACS+0x6.w=0000"),
        "{fix}"
    );
    assert!(
        fix.contains("pci=disable_acs_redir=0000:02:00.0;0000:02:01.0"),
        "{fix}"
    );

    // GPU0 <-> mlx5_0 is PIX; GPU1 <-> mlx5_0 crosses NUMA: SYS.
    let p0 = r.pairs.iter().find(|p| p.gpu == "0000:07:00.0").unwrap();
    assert_eq!(p0.path, Some(PathClass::Pix));
    let p1 = r.pairs.iter().find(|p| p.gpu == "0000:87:00.0").unwrap();
    assert_eq!(p1.path, Some(PathClass::Sys));
    assert_eq!((p1.gpu_numa, p1.nic_numa), (Some(1), Some(0)));
    let sys = finding(&r, "pcie.path", "0000:87:00.0 <-> mlx5_0");
    assert_eq!(sys.severity, Severity::Warn);
    assert!(sys.fix.as_deref().unwrap().contains("numactl"));

    // No peer memory, and dma-buf impossible with a proprietary 470 driver on Linux 5.4.
    let pm = finding(&r, "peermem.module", "host");
    assert_eq!(pm.severity, Severity::Fail);
    assert!(pm
        .fix
        .as_deref()
        .unwrap()
        .contains("modprobe nvidia-peermem"));
    let db = finding(&r, "dmabuf.readiness", "host");
    assert_eq!(db.severity, Severity::Fail);
    assert!(
        db.message.contains("open kernel module")
            && db.message.contains("5.12")
            && db.message.contains("11.7"),
        "{}",
        db.message
    );

    // 40 Gb/s on a 200 Gb/s ConnectX-6 port.
    let rate = finding(&r, "port.rate", "mlx5_0 port 1");
    assert_eq!(rate.severity, Severity::Warn);
    assert!(
        rate.message.contains("40") && rate.message.contains("200"),
        "{}",
        rate.message
    );
    assert!(rate.fix.as_deref().unwrap().contains("ethtool enp8s0f0"));

    // NCCL_IB_GID_INDEX=0 is the RoCE v1 link-local GID; the right one is 3.
    let gid = finding(&r, "roce.gid_index", "mlx5_0 port 1");
    assert_eq!(gid.severity, Severity::Fail);
    assert!(gid.fix.as_deref().unwrap().contains("NCCL_IB_GID_INDEX=3"));

    // Both pairs: not usable, with the reasons.
    for p in &r.pairs {
        assert_eq!(p.verdict.kind, VerdictKind::NotUsable, "{p:?}");
        assert!(p
            .verdict
            .reasons
            .iter()
            .any(|w| w.contains("no peer-memory module")));
    }
    assert!(p0.verdict.reasons.iter().any(|w| w.contains("ACS")));
    assert!(p1.verdict.reasons.iter().any(|w| w.contains("SYS")));
    assert!(r.nccl.is_empty(), "no usable pair, nothing to recommend");
}

#[test]
fn fixed_dgx_is_usable_with_the_right_nccl_settings() {
    let r = diagnose(&load("dgx-a100-fixed"));
    assert!(r.gpudirect_usable);
    assert_eq!(r.exit_code(), 0);
    for g in &r.gpus {
        let best = r.pairs.iter().find(|p| p.best && p.gpu == g.bdf).unwrap();
        assert_eq!(best.path, Some(PathClass::Pix), "{best:?}");
        assert_eq!(best.verdict.kind, VerdictKind::Usable, "{best:?}");
    }
    assert_eq!(r.gpus[0].best_nic.as_deref(), Some("mlx5_0"));
    assert_eq!(r.gpus[1].best_nic.as_deref(), Some("mlx5_1"));
    assert!(r.all_findings().all(|f| f.severity != Severity::Fail));
    let env: Vec<(String, String)> = r
        .nccl
        .iter()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect();
    assert!(
        env.contains(&("NCCL_IB_HCA".into(), "=mlx5_0:1,mlx5_1:1".into())),
        "{env:?}"
    );
    assert!(
        env.contains(&("NCCL_IB_GID_INDEX".into(), "3".into())),
        "{env:?}"
    );
    assert!(
        env.contains(&("NCCL_NET_GDR_LEVEL".into(), "PXB".into())),
        "{env:?}"
    );
}

#[test]
fn healthy_pix_is_usable_and_phb_is_slow() {
    let r = diagnose(&load("healthy-pix"));
    assert_eq!(r.pairs.len(), 1);
    assert_eq!(
        r.pairs[0].verdict.kind,
        VerdictKind::Usable,
        "{}",
        r.to_table(false)
    );
    assert_eq!(finding(&r, "pcie.acs", "<->").severity, Severity::Ok);

    let r = diagnose(&load("phb-host"));
    let p = &r.pairs[0];
    assert_eq!(p.path, Some(PathClass::Phb));
    assert_eq!(p.verdict.kind, VerdictKind::UsableButSlow);
    assert_eq!(r.exit_code(), 0);
    assert_eq!(finding(&r, "iommu.mode", "host").severity, Severity::Warn);
    assert!(finding(&r, "iommu.mode", "host")
        .fix
        .as_deref()
        .unwrap()
        .contains("iommu=pt"));
    assert_eq!(
        finding(&r, "nccl.gdr_level", "<->").severity,
        Severity::Warn
    );
    let hca = finding(&r, "nccl.ib_hca", "host");
    assert_eq!(hca.severity, Severity::Fail);
    assert!(hca.message.contains("mlx5_4"));
    assert_eq!(finding(&r, "roce.mtu", "mlx5_0").severity, Severity::Warn);
    assert_eq!(
        finding(&r, "memlock.limit", "host").severity,
        Severity::Warn
    );
    assert!(r
        .nccl
        .iter()
        .any(|s| s.name == "NCCL_NET_GDR_LEVEL" && s.value == "PHB"));
}

#[test]
fn port_down_is_not_usable() {
    let r = diagnose(&load("port-down"));
    assert_eq!(r.pairs[0].verdict.kind, VerdictKind::NotUsable);
    let f = finding(&r, "port.state", "mlx5_0 port 1");
    assert_eq!(f.severity, Severity::Fail);
    assert!(f.fix.as_deref().unwrap().contains("ibstat mlx5_0 1"));
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn h200_vm_has_a_gpu_but_no_nic() {
    let r = diagnose(&load("h200-vm"));
    assert_eq!(r.gpus.len(), 1);
    assert_eq!(r.gpus[0].bdf, "0000:00:06.0");
    assert_eq!(r.gpus[0].name, "NVIDIA H200");
    assert!(r.pairs.is_empty());
    assert_eq!(
        finding(&r, "inventory.rdma", "host").severity,
        Severity::Fail
    );
    assert_eq!(
        finding(&r, "vm.synthetic_topology", "host").severity,
        Severity::Warn
    );
    assert_eq!(
        finding(&r, "cuda.attributes", "0000:00:06.0").severity,
        Severity::Ok
    );
    // Open module 580, kernel 6.18, CUDA 13.0, DMA_BUF_SUPPORTED=1: dma-buf is the way.
    assert_eq!(
        finding(&r, "dmabuf.readiness", "host").severity,
        Severity::Ok
    );
    assert_eq!(
        finding(&r, "peermem.module", "host").severity,
        Severity::Warn
    );
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn nonroot_tree_acs_is_unknown_never_ok_and_gid_skips_empty_slots() {
    let s = tree("nonroot-roce");
    assert_eq!(s.pci.len(), 6);
    assert!(s.pci.iter().all(|d| d.config.as_ref().unwrap().len == 64));
    let nic = s.pci_device("0000:04:00.0").unwrap();
    assert_eq!(
        nic.path,
        "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0"
    );
    assert_eq!(nic.driver.as_deref(), Some("mlx5_core"));
    assert_eq!(s.rdma[0].pci_bdf.as_deref(), Some("0000:04:00.0"));
    let port1 = &s.rdma[0].ports[0];
    let idx: Vec<u32> = port1.gids.iter().map(|g| g.index).collect();
    assert_eq!(
        idx,
        [0, 1, 4, 5, 6, 7],
        "empty slots 2, 3, 8.. are left out"
    );
    assert_eq!(port1.netdevs[0].mtu, Some(1500));
    assert_eq!(s.memlock.unwrap().soft, Limit::Bytes(8 * MIB));
    assert!(s.read_errors.is_empty(), "{:?}", s.read_errors);

    let r = diagnose(&s);
    let acs = finding(&r, "pcie.acs", "<->");
    assert_eq!(acs.severity, Severity::Unknown);
    assert!(r.pairs[0]
        .verdict
        .unverified
        .iter()
        .any(|u| u.starts_with("ACS")));
    assert_eq!(r.nics[0].roce_v2_gid_index, Some(5));
    assert_eq!(
        finding(&r, "port.state", "mlx5_0 port 2").severity,
        Severity::Fail
    );
    assert_eq!(finding(&r, "pcie.link", "<->").severity, Severity::Warn);
    assert_eq!(
        finding(&r, "memlock.limit", "host").severity,
        Severity::Fail
    );
}

// ---------------------------------------------------------------------------------------------
// Rails: the ranking the transfer engine uses, on the same fixtures.

/// Every committed snapshot of `snapshots/` (by directory listing, so a new fixture is covered
/// without editing this list), the fixture tree and the captured machines.
fn every_fixture() -> Vec<(String, Snapshot)> {
    let mut out = Vec::new();
    let dir = fixtures().join("snapshots");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        out.push((
            name,
            Snapshot::from_json(&text, &p.display().to_string()).unwrap(),
        ));
    }
    assert!(out.len() >= built().len(), "{}", dir.display());
    out.push(("nonroot-roce".into(), tree("nonroot-roce")));
    for name in CAPTURED {
        out.push((name.to_string(), captured(name)));
    }
    out
}

fn gpu_location(g: &gdr_doctor::GpuSummary) -> MemoryLocation {
    match g.cuda_ordinal {
        Some(o) => MemoryLocation::Gpu {
            ordinal: u32::try_from(o).unwrap(),
        },
        None => MemoryLocation::GpuPci(g.bdf.clone()),
    }
}

#[test]
fn the_best_nic_is_the_first_rail_on_every_fixture() {
    let mut gpus_seen = 0;
    for (name, snap) in every_fixture() {
        let r = diagnose(&snap);
        for g in &r.gpus {
            let rails = rank_rails(&r, &gpu_location(g), None);
            assert_eq!(
                g.best_nic.as_deref(),
                rails.first().map(|x| x.nic.as_str()),
                "{name}: GPU {}: {rails:#?}",
                g.bdf
            );
            // The same by PCI address, and the pair marked best is that rail.
            let by_pci = rank_rails(&r, &MemoryLocation::GpuPci(g.bdf.clone()), None);
            assert_eq!(by_pci, rails, "{name}: GPU {}", g.bdf);
            let best: Vec<&str> = r
                .pairs
                .iter()
                .filter(|p| p.best && p.gpu == g.bdf)
                .map(|p| p.nic.as_str())
                .collect();
            assert_eq!(
                best,
                rails
                    .first()
                    .map(|x| x.nic.as_str())
                    .into_iter()
                    .collect::<Vec<_>>(),
                "{name}: GPU {}",
                g.bdf
            );
            // One rail per pair of this GPU.
            assert_eq!(
                rails.len(),
                r.pairs.iter().filter(|p| p.gpu == g.bdf).count(),
                "{name}"
            );
            gpus_seen += 1;
        }
        // The report's rails are rank_rails's, location by location.
        for l in &r.rails {
            assert_eq!(
                l.rails,
                rank_rails(&r, &l.location, None),
                "{name}: {}",
                l.label
            );
        }
        assert_eq!(
            r.rails
                .iter()
                .filter(|l| matches!(
                    l.location,
                    MemoryLocation::Gpu { .. } | MemoryLocation::GpuPci(_)
                ))
                .count(),
            r.gpus.len(),
            "{name}: one entry per GPU"
        );
    }
    assert!(gpus_seen >= 8, "{gpus_seen}");
}

#[test]
fn fixed_dgx_stripes_each_gpu_over_its_pix_nic() {
    let r = diagnose(&load("dgx-a100-fixed"));
    for (ordinal, pix_nic, other) in [(0, "mlx5_0", "mlx5_1"), (1, "mlx5_1", "mlx5_0")] {
        let rails = rank_rails(&r, &MemoryLocation::Gpu { ordinal }, None);
        let tier0: Vec<&str> = rails
            .iter()
            .filter(|x| x.tier == 0)
            .map(|x| x.nic.as_str())
            .collect();
        assert_eq!(tier0, [pix_nic], "GPU {ordinal}: {rails:#?}");
        assert_eq!(rails[0].path, Some(PathClass::Pix));
        assert_eq!(rails[0].rate_gbps, Some(200.0));
        assert!(rails[0].usable && rails[0].active);
        assert_eq!((rails[1].nic.as_str(), rails[1].tier), (other, 1));
        assert_eq!(rails[1].path, Some(PathClass::Sys));
        assert!(rails[1].usable, "the SYS rail is a usable fallback");
        // An override to the far NIC alone makes it tier 0; excluding both leaves nothing.
        let only = Selection::parse(&format!("={other}")).unwrap();
        let rails = rank_rails(&r, &MemoryLocation::Gpu { ordinal }, Some(&only));
        assert_eq!(
            (rails.len(), rails[0].nic.as_str(), rails[0].tier),
            (1, other, 0)
        );
        let none = Selection::parse("^mlx5").unwrap();
        assert!(rank_rails(&r, &MemoryLocation::Gpu { ordinal }, Some(&none)).is_empty());
    }
    // Host memory: the NIC of the memory's node first, the other one tier 1.
    for (node, near) in [(0, "mlx5_0"), (1, "mlx5_1")] {
        let rails = rank_rails(&r, &MemoryLocation::Numa(node), None);
        assert_eq!(
            (rails[0].nic.as_str(), rails[0].tier),
            (near, 0),
            "node {node}"
        );
        assert_eq!(rails[1].tier, 1, "node {node}");
    }
    let table = r.to_table(false);
    assert!(table.contains("\nRails (* = tier 0"), "{table}");
    assert!(
        table.contains("  * 0    mlx5_0     1     PIX   0    200 Gb/s"),
        "{table}"
    );
}

#[test]
fn failing_dgx_and_port_down_have_no_tier_0_for_gpu_memory() {
    let r = diagnose(&load("dgx-a100-failing"));
    for g in &r.gpus {
        let rails = rank_rails(&r, &gpu_location(g), None);
        assert!(!rails.is_empty());
        assert!(rails.iter().all(|x| !x.usable && x.tier >= 1), "{rails:#?}");
    }
    // The port-down fixture: its only port is DOWN, read from the doctor's port finding.
    let r = diagnose(&load("port-down"));
    for loc in [
        gpu_location(&r.gpus[0]),
        MemoryLocation::Any,
        MemoryLocation::Numa(0),
    ] {
        let rails = rank_rails(&r, &loc, None);
        assert_eq!(rails.len(), 1, "{loc}");
        assert!(
            !rails[0].active && !rails[0].usable && rails[0].tier == 1,
            "{loc}: {rails:#?}"
        );
        assert!(rails[0].why.contains("port not active"), "{}", rails[0].why);
    }
    // And an active port reads as active.
    let r = diagnose(&load("healthy-pix"));
    let rails = rank_rails(&r, &MemoryLocation::Gpu { ordinal: 0 }, None);
    assert!(
        rails[0].active && rails[0].usable && rails[0].tier == 0,
        "{rails:#?}"
    );
}

#[test]
fn rails_for_host_reads_a_tree_through_collect() {
    let root = fixtures().join("trees/nonroot-roce");
    let rails = rails_for_host(&root, &MemoryLocation::Any, None).unwrap();
    assert_eq!(rails.len(), 1, "{rails:#?}");
    assert_eq!(
        (rails[0].nic.as_str(), rails[0].port, rails[0].tier),
        ("mlx5_0", 1, 0)
    );
    assert!(rails[0].active, "port 1 is the active one (port 2 is down)");
    // No CUDA facts below a root other than /: a GPU ordinal falls back, and says so.
    let rails = rails_for_host(&root, &MemoryLocation::Gpu { ordinal: 0 }, None).unwrap();
    assert!(
        rails[0].why.contains("CUDA was not read"),
        "{}",
        rails[0].why
    );
    // By PCI address the GPU is known: its pair ranks it.
    let rails =
        rails_for_host(&root, &MemoryLocation::GpuPci("0000:03:00.0".into()), None).unwrap();
    assert_eq!(rails[0].path, Some(PathClass::Pix), "{rails:#?}");
    let none = Selection::parse("^mlx5_0").unwrap();
    assert!(rails_for_host(&root, &MemoryLocation::Any, Some(&none))
        .unwrap()
        .is_empty());
    let e = rails_for_host(&root.join("no-such-dir"), &MemoryLocation::Any, None).unwrap_err();
    assert!(e.to_string().contains("no-such-dir"), "{e}");
}

/// What the engine calls at agent start, on this machine: one rail per RDMA device, and the time
/// it took (printed with `--nocapture`; not asserted, it depends on the machine).
#[test]
fn rails_for_this_host_list_every_device_and_print_the_time() {
    let t = std::time::Instant::now();
    let report = gdr_doctor::host_report(Path::new("/")).unwrap();
    let collect = t.elapsed();
    let rails = rank_rails(&report, &MemoryLocation::Any, None);
    assert_eq!(rails.len(), report.nics.len());
    let t = std::time::Instant::now();
    let again = rails_for_host(Path::new("/"), &MemoryLocation::Any, None).unwrap();
    let whole = t.elapsed();
    assert_eq!(again.len(), rails.len());
    eprintln!(
        "host_report(/): {collect:?}; rails_for_host(/): {whole:?}; {} rail(s): {:?}",
        rails.len(),
        rails
            .iter()
            .map(|x| (&x.nic, x.port, x.tier))
            .collect::<Vec<_>>()
    );
}
