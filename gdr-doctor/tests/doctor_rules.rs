//! The doctor and registration cannot disagree: both read a host's facts through gdr's
//! `gpu_mr::facts::FactReader` and decide with gdr's `gpu_mr::rules`.
//!
//! * On a recorded tree, the doctor's snapshot holds the facts registration reads there.
//! * On every combination of kernel module, kernel, driver, GPU attribute, peer memory and NIC
//!   probe, the doctor's findings and pair verdict say what registration's `choose_path` does.
//! * One device test (ignored here, run in the VM with `GDR_TEST_DEVICE=rxe0`): the live
//!   collection records the dma-buf probe registration makes on the NIC.

use std::path::{Path, PathBuf};

use gdr::gpu_mr::{self, choose_path, NicDmaBuf, PathInputs, RegistrationPath, SystemFacts};
use gdr_doctor::topology::{
    collect, collect_with, CollectOptions, CudaDevice, CudaInfo, Kernel, MemoryPeer, NvidiaDriver,
    RdmaDevice, Snapshot,
};
use gdr_doctor::{diagnose, Severity};

use gdr_test_support::h200::h200;

/// The recorded non-root RoCE host (`tests/fixtures/doctor/trees/nonroot-roce`).
fn fixture_tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/doctor/trees/nonroot-roce")
}

/// Registration's facts and the doctor's snapshot of the tree below `root` are the same, and so
/// is what the rules make of them.
fn assert_same_facts(root: &Path) -> SystemFacts {
    let probed = SystemFacts::probe(root);
    let snap = collect(root).unwrap();
    assert_eq!(
        snap.system_facts(),
        probed,
        "registration and the doctor read the same facts below {}",
        root.display()
    );
    assert_eq!(
        gpu_mr::probe_peer_memory(root),
        snap.system_facts().peer_memory()
    );
    probed
}

#[test]
fn the_snapshot_holds_the_facts_registration_reads() {
    let facts = assert_same_facts(&fixture_tree());
    assert!(!facts.modules.is_empty(), "{facts:?}");

    // A tree with a peer-memory client and no /proc/modules (the modules of /sys/module count).
    let root: PathBuf =
        std::env::temp_dir().join(format!("gdr-doctor-rules-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("sys/module/nvidia")).unwrap();
    std::fs::create_dir_all(root.join("sys/kernel/mm/memory_peers/nv_mem")).unwrap();
    std::fs::write(
        root.join("sys/kernel/mm/memory_peers/nv_mem/version"),
        "1.0\n",
    )
    .unwrap();
    std::fs::create_dir_all(root.join("proc/sys/kernel")).unwrap();
    std::fs::write(root.join("proc/sys/kernel/osrelease"), "6.1.0-27-amd64\n").unwrap();
    let facts = assert_same_facts(&root);
    assert_eq!(facts.modules, ["nvidia"]);
    assert_eq!(
        facts.peer_memory().found.as_deref(),
        Some("memory peer nv_mem")
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// The doctor and registration decide with the same rules: on every combination of kernel
/// module, kernel, driver, GPU attribute, peer memory and NIC probe (none recorded, imports,
/// does not), the doctor's findings and pair verdict say what `choose_path` does.
#[test]
fn doctor_and_registration_agree_on_every_machine() {
    let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04";
    let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.57.02";
    let nic_probes = [
        None,
        Some(NicDmaBuf::Supported),
        Some(NicDmaBuf::NoProviderSupport),
    ];
    let mut machines = Vec::new();
    for module in [open, proprietary] {
        for kernel in ["5.4.0-42-generic", "6.1.0-27-amd64"] {
            for driver in [11040, 11070, 13000] {
                for dma_buf_attr in [false, true] {
                    for peer in [None, Some("module"), Some("client")] {
                        for nic_probe in nic_probes {
                            machines.push((module, kernel, driver, dma_buf_attr, peer, nic_probe));
                        }
                    }
                }
            }
        }
    }
    assert_eq!(machines.len(), 216);
    for (module, kernel, driver, dma_buf_attr, peer, nic_probe) in machines {
        let label = format!(
            "{module} / {kernel} / driver {driver} / DMA_BUF_SUPPORTED={dma_buf_attr} / \
             peer {peer:?} / NIC {nic_probe:?}"
        );
        let mut snap = Snapshot::new("combination");
        snap.kernel = Kernel {
            release: Some(kernel.into()),
            cmdline: None,
        };
        snap.nvidia = Some(NvidiaDriver {
            version: Some(module.into()),
            ..NvidiaDriver::default()
        });
        snap.modules = vec!["nvidia".into()];
        match peer {
            Some("module") => snap.modules.push("nvidia_peermem".into()),
            Some(_) => snap.memory_peers.push(MemoryPeer {
                name: "nv_mem".into(),
                version: Some("1.0".into()),
            }),
            None => {}
        }
        snap.cuda = Some(CudaInfo {
            driver_version: Some(driver),
            devices: vec![CudaDevice {
                ordinal: 0,
                name: "NVIDIA H200".into(),
                pci_bus_id: "0000:00:06.0".into(),
                gpudirect_rdma_supported: Some(true),
                dma_buf_supported: Some(dma_buf_attr),
                ..CudaDevice::default()
            }],
            error: None,
        });
        snap.rdma = vec![RdmaDevice {
            name: "mlx5_0".into(),
            dma_buf: nic_probe,
            ..RdmaDevice::default()
        }];
        let report = diagnose(&snap);
        let severity = |id: &str| {
            report
                .findings_with_id(id)
                .next()
                .unwrap_or_else(|| panic!("{label}: no {id} finding"))
                .severity
        };
        let nic_findings: Vec<Severity> = report
            .findings_with_id("dmabuf.nic")
            .map(|f| f.severity)
            .collect();
        assert_eq!(nic_findings.len(), nic_probe.is_some() as usize, "{label}");

        let mut gpu = h200();
        gpu.dma_buf_supported = dma_buf_attr;
        let inputs = PathInputs {
            driver_version: driver,
            driver_exports_dma_buf: driver >= 11070,
            gpu,
            system: snap.system_facts(),
            nic: "mlx5_0".into(),
            // Not probed: the doctor leaves the NIC to registration; compare with one that
            // imports.
            nic_dma_buf: nic_probe.unwrap_or(NicDmaBuf::Supported),
        };

        let dma = choose_path(&inputs, RegistrationPath::DmaBuf);
        let nic_ok = nic_findings.iter().all(|s| *s == Severity::Ok);
        assert_eq!(
            dma.is_ok(),
            severity("dmabuf.readiness") == Severity::Ok && nic_ok,
            "dma-buf: {label}: {dma:?}"
        );
        let pm = choose_path(&inputs, RegistrationPath::PeerMemory);
        assert_eq!(
            pm.is_ok(),
            severity("peermem.module") == Severity::Ok,
            "peer memory: {label}: {pm:?}"
        );
        let auto = choose_path(&inputs, RegistrationPath::Auto);
        let nic_fail = nic_findings.contains(&Severity::Fail);
        assert_eq!(
            auto.is_err(),
            severity("peermem.module") == Severity::Fail || nic_fail,
            "no path at all: {label}: {auto:?}"
        );
        // The pair's verdict names a registration blocker exactly when choose_path finds no
        // path.
        let pair = &report.pairs[0];
        let no_path = pair
            .verdict
            .reasons
            .iter()
            .any(|r| r.starts_with("no peer-memory module and"));
        assert_eq!(
            no_path,
            auto.is_err(),
            "pair verdict: {label}: {:?}",
            pair.verdict
        );
        if let Err(e) = &dma {
            // The doctor names the first reason registration gives.
            let first = &inputs.dma_buf_blockers()[0];
            let said = report
                .all_findings()
                .any(|f| f.message.contains(&first.requirement()) || f.message == first.what());
            assert!(said, "{label}: the doctor does not say {e}");
        }
    }
}

/// gdr's `serde` feature, which this crate turns on: registration's recorded inputs (the GPU,
/// the host facts, the NIC's probe) read back from JSON as they were, in the shape a snapshot
/// records the probe in.
#[test]
fn registration_inputs_round_trip_through_json() {
    let inputs = PathInputs {
        driver_version: 13000,
        driver_exports_dma_buf: true,
        gpu: h200(),
        system: SystemFacts::probe(&fixture_tree()),
        nic: "mlx5_0".into(),
        nic_dma_buf: NicDmaBuf::Unknown { errno: 5 },
    };
    let text = serde_json::to_string(&inputs).unwrap();
    assert!(text.contains("\"pci_bus_id\":\"0000:00:06.0\""), "{text}");
    assert!(
        text.contains("\"nic_dma_buf\":{\"Unknown\":{\"errno\":5}}"),
        "{text}"
    );
    assert_eq!(serde_json::from_str::<PathInputs>(&text).unwrap(), inputs);
}

/// Soft-RoCE tier: rxe imports no dma-bufs; the doctor's live collection records the same
/// probe registration makes, and writes it into the snapshot.
#[test]
#[ignore = "needs an RDMA device: run in the VM (cargo xtask test) with GDR_TEST_DEVICE=rxe0"]
fn live_collection_records_the_nic_dma_buf_probe_of_registration() {
    let dev = gdr_test_support::device();
    // Registration's probe on a protection domain of the device (cached per device name).
    let probe = gpu_mr::probe_nic_dma_buf_by_name(&dev).expect("open the RDMA device");
    let snap = collect_with(Path::new("/"), CollectOptions::live()).expect("collect this machine");
    let recorded = snap.rdma.iter().find(|d| d.name == dev);
    assert_eq!(
        recorded.and_then(|d| d.dma_buf),
        Some(probe),
        "snapshot: {:?}",
        snap.rdma
    );
    assert!(snap
        .to_json()
        .contains("\"dma_buf\": \"NoProviderSupport\""));
    // The snapshot reads back with the probe, and the doctor diagnoses it.
    let back = Snapshot::from_json(&snap.to_json(), "live").unwrap();
    assert_eq!(back.rdma, snap.rdma);
    assert!(!diagnose(&back).to_table(false).is_empty());
}
