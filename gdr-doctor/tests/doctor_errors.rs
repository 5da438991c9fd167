//! Bad input to the doctor gives typed errors or recorded read errors, never a panic.

use gdr_doctor::topology::{collect_with, CollectOptions, Snapshot, SNAPSHOT_FORMAT};
use gdr_doctor::Error;
use std::path::PathBuf;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gdr-doctor-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn malformed_snapshots_are_invalid_argument_errors() {
    let cases = [
        ("", "not a JSON object"),
        ("{not json", "not a JSON object"),
        ("[1, 2]", "not a JSON object"),
        ("{}", "no `format` field"),
        ("{\"format\": 99}", "format 99"),
        ("{\"format\": 1, \"pci\": \"nope\"}", "invalid type"),
        ("{\"format\": 1, \"rdma\": [{\"name\": 5}]}", "invalid type"),
    ];
    for (text, want) in cases {
        let e = Snapshot::from_json(text, "bad.json").unwrap_err();
        match &e {
            Error::SnapshotFormat {
                input,
                found,
                supported,
                ..
            } => assert_eq!(
                (input.as_str(), *found, *supported),
                ("bad.json", 99, SNAPSHOT_FORMAT)
            ),
            Error::InvalidSnapshot { input, .. } => assert_eq!(input, "bad.json"),
            other => panic!("{text:?}: {other:?}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains("bad.json") && msg.contains(want),
            "{text:?}: {msg}"
        );
        assert!(e.hint().unwrap().contains("gdr doctor dump"), "{msg}");
    }
    // The smallest valid snapshot is accepted and diagnosed.
    let s = Snapshot::from_json(&format!("{{\"format\": {SNAPSHOT_FORMAT}}}"), "min.json").unwrap();
    let r = gdr_doctor::diagnose(&s);
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn garbage_config_hex_does_not_panic_the_diagnosis() {
    let text = r#"{"format":1,
      "pci":[{"bdf":"0000:01:00.0","path":"/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
              "class":197120,"vendor":4318,"device":1,"numa_node":0,
              "current_link_speed":"fast","max_link_speed":null,"current_link_width":0,"max_link_width":16,
              "driver":null,"iommu_group":null,"config":{"len":4096,"hex":"zz"}},
             {"bdf":"0000:00:01.0","path":"/sys/devices/pci0000:00/0000:00:01.0",
              "class":394240,"vendor":1,"device":1,"numa_node":0,
              "current_link_speed":null,"max_link_speed":null,"current_link_width":null,"max_link_width":null,
              "driver":null,"iommu_group":null,"config":{"len":2,"hex":"ffffffff"}},
             {"bdf":"0000:02:00.0","path":"/sys/devices/pci0000:00/0000:00:01.0/0000:02:00.0",
              "class":131072,"vendor":5555,"device":4123,"numa_node":0,
              "current_link_speed":null,"max_link_speed":null,"current_link_width":null,"max_link_width":null,
              "driver":null,"iommu_group":null,"config":null}],
      "rdma":[{"name":"mlx5_0","pci_bdf":"0000:02:00.0","parent":null,"fw_ver":null,"node_type":null,
               "hca_type":"MTxyz","board_id":null,
               "ports":[{"port":1,"state":"4: ACTIVE","phys_state":null,"rate":"fast","link_layer":"Ethernet",
                         "gids":[{"index":0,"gid":"::","gid_type":null,"ndev":null}],"netdevs":[]}]}],
      "env":{"NCCL_IB_GID_INDEX":"abc","NCCL_NET_GDR_LEVEL":"7","NCCL_IB_HCA":"^"}}"#;
    let s = Snapshot::from_json(text, "garbage.json").unwrap();
    let r = gdr_doctor::diagnose(&s);
    let acs = r.findings_with_id("pcie.acs").next().unwrap();
    assert_eq!(acs.severity, gdr_doctor::Severity::Unknown, "{acs:?}");
    assert!(r.to_table(false).contains("NCCL_NET_GDR_LEVEL=7"));
}

/// A snapshot is input (`gdr doctor --snapshot FILE`): a forged configuration-space length, a
/// GPU and a NIC at the same address, and a GPU whose sysfs path stops at the root complex must
/// give "unknown" findings, not an allocation without bound or an index panic.
#[test]
fn hostile_snapshot_lengths_and_paths_do_not_panic_or_abort() {
    let text = r#"{"format":1,
      "pci":[{"bdf":"0000:01:00.0","path":"/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
              "class":197120,"vendor":4318,"device":1,"numa_node":0,
              "config":{"len":18446744073709551615,"hex":"00"}},
             {"bdf":"0000:00:01.0","path":"/sys/devices/pci0000:00/0000:00:01.0",
              "class":394240,"vendor":1,"device":1,"numa_node":0,
              "config":{"len":1000000000000,"hex":"ffff"}},
             {"bdf":"0000:09:00.0","path":"/sys/devices/pci0000:00",
              "class":197120,"vendor":4318,"device":2,"numa_node":0}],
      "rdma":[{"name":"mlx5_0","pci_bdf":"0000:01:00.0","ports":[]},
              {"name":"mlx5_1","pci_bdf":"0000:00:01.0","ports":[]}]}"#;
    let s = Snapshot::from_json(text, "hostile.json").unwrap();
    assert_eq!(s.pci[0].config_bytes(), None, "forged length refused");
    let r = gdr_doctor::diagnose(&s);
    assert_eq!(r.pairs.len(), 4, "{:#?}", r.pairs);
    for p in &r.pairs {
        assert_eq!(
            p.path, None,
            "{} <-> {}: no path class from a forged tree",
            p.gpu, p.nic
        );
    }
    assert!(!r.to_table(false).is_empty());
}

#[test]
fn collect_records_unreadable_files_and_reads_the_rest() {
    let root = scratch("unreadable");
    std::fs::create_dir_all(root.join("proc/sys/kernel")).unwrap();
    std::fs::write(root.join("proc/sys/kernel/osrelease"), "6.1.0-27-amd64\n").unwrap();
    // A directory where a file should be: reading it fails with EISDIR.
    std::fs::create_dir_all(root.join("proc/cmdline")).unwrap();
    std::fs::create_dir_all(root.join("proc/self")).unwrap();
    std::fs::write(
        root.join("proc/self/limits"),
        "Max locked memory  unlimited  unlimited  bytes\n",
    )
    .unwrap();
    let s = collect_with(&root, CollectOptions::default()).unwrap();
    assert_eq!(s.kernel.release.as_deref(), Some("6.1.0-27-amd64"));
    assert_eq!(s.kernel.cmdline, None);
    assert_eq!(s.read_errors.len(), 1, "{:?}", s.read_errors);
    assert_eq!(s.read_errors[0].path, "/proc/cmdline");
    assert!(
        s.read_errors[0].error.contains("directory"),
        "{:?}",
        s.read_errors
    );
    assert!(s.pci.is_empty() && s.rdma.is_empty() && s.nvidia.is_none());
    let r = gdr_doctor::diagnose(&s);
    assert!(r.findings_with_id("collect.read_errors").next().is_some());
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn collect_from_a_missing_or_non_directory_root_is_an_error() {
    let root = scratch("notdir");
    let file = root.join("file");
    std::fs::write(&file, "x").unwrap();
    let e = collect_with(&file, CollectOptions::default()).unwrap_err();
    assert!(
        matches!(&e, Error::NotADirectory { root, .. } if *root == file),
        "{e:?}"
    );
    let e = collect_with(&root.join("missing"), CollectOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("missing"));
    let _ = std::fs::remove_dir_all(&root);
}
