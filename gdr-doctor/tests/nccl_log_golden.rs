//! Golden-output tests of `gdr_doctor::nccl_log` on real NCCL logs.
//!
//! Fixtures live in `tests/fixtures/nccl-logs/` (in this crate, `gdr-doctor/`): `<name>.log` is an
//! `NCCL_DEBUG=INFO` log pasted in a public issue thread (the header names the thread), trimmed
//! to the lines about the network path; `golden/<name>.table.txt` and
//! `golden/<name>.report.json` are the expected reports. Each test also checks the verdict
//! lines by hand, so a re-bless cannot silently change what a fixture proves.
//!
//! `GDR_BLESS=1 cargo test -p gdr-doctor --test nccl_log_golden` rewrites the goldens.

use gdr_doctor::nccl_log::{analyze, parse, LogReport, LogVerdict};
use gdr_doctor::topology::Snapshot;
use gdr_doctor::{diagnose, Severity};
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nccl-logs")
}

fn bless() -> bool {
    std::env::var_os("GDR_BLESS").is_some_and(|v| v == "1")
}

fn golden(rel: &str, actual: &str) {
    let path = dir().join(rel);
    if bless() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with GDR_BLESS=1 to create it", path.display()));
    assert!(
        expected == actual,
        "{} differs from the output; rerun with GDR_BLESS=1 if intended\n--- actual\n{actual}",
        path.display()
    );
}

/// The report of a fixture, checked against its goldens.
fn report(name: &str) -> LogReport {
    let text = std::fs::read_to_string(dir().join(format!("{name}.log"))).unwrap();
    let header = text.lines().next().unwrap_or("");
    assert!(
        header.starts_with("# Source: https://github.com/"),
        "{name}.log must name its public source in the first line: {header}"
    );
    let log = parse(&text, &format!("fixture {name}.log")).unwrap();
    let r = analyze(&log, None);
    golden(&format!("golden/{name}.table.txt"), &r.to_table());
    golden(&format!("golden/{name}.report.json"), &(r.to_json() + "\n"));
    r
}

fn lines_of(r: &LogReport) -> String {
    r.to_table()
}

#[test]
fn gdrdma_on_every_channel_of_four_ranks() {
    let r = report("gdrdma-on");
    assert!(r.gdrdma_verified);
    assert_eq!(r.exit_code(), 0);
    assert_eq!((r.net_connections, r.gdrdma_connections), (12, 12));
    let ranks: Vec<u32> = r.processes.iter().flat_map(|p| p.ranks.clone()).collect();
    assert_eq!(ranks, [0, 1, 2, 3]);
    for p in &r.processes {
        assert_eq!(p.verdict, LogVerdict::Gdrdma, "{p:?}");
        assert_eq!(p.version.as_deref(), Some("2.7.6+cuda11.1"));
    }
    let rank0 = &r.processes[0];
    assert_eq!(rank0.devices.len(), 9);
    assert_eq!(rank0.devices[0], "[0]mlx5_8:1/IB");
    assert_eq!(rank0.devices[7], "[7]mlx5_16:1/RoCE");
    assert!(rank0.notes[0].contains("NCCL_P2P_LEVEL set by environment to LOC"));
    let t = lines_of(&r);
    assert!(
        t.contains("GPUDirect RDMA: used on all 12 network connection(s)"),
        "{t}"
    );
    assert!(
        t.contains("  verdict       GPUDirect RDMA on every network connection"),
        "{t}"
    );
}

#[test]
fn gdr_off_by_distance_names_the_path_types_of_that_version() {
    let r = report("gdr-off-distance");
    assert!(!r.gdrdma_verified);
    assert_eq!(r.exit_code(), 1);
    let p = &r.processes[0];
    assert_eq!(p.verdict, LogVerdict::NoGdrdma);
    // PyTorch's own line is the only version in the log.
    assert_eq!(p.version.as_deref(), Some("2.21.5"));
    assert!(
        p.reasons[0].contains(
            "(distance 6 > 4)`: with NCCL 2.21.5 that is the path type PHB against the limit PXB"
        ),
        "{:?}",
        p.reasons
    );
    assert!(
        p.fixes[0].contains("NCCL_NET_GDR_LEVEL=PHB"),
        "{:?}",
        p.fixes
    );
    let t = lines_of(&r);
    assert!(
        t.contains("GPUDirect RDMA: not used: NCCL disabled it"),
        "{t}"
    );
    assert!(
        t.contains("  verdict       no GPUDirect RDMA: network data is staged through host memory"),
        "{t}"
    );
}

#[test]
fn gdr_off_without_peer_memory_says_no_module() {
    let r = report("gdr-off-no-peermem");
    assert!(!r.gdrdma_verified);
    assert_eq!((r.net_connections, r.gdrdma_connections), (7, 0));
    assert_eq!(r.processes.len(), 2);
    for p in &r.processes {
        assert_eq!(p.verdict, LogVerdict::NoGdrdma, "{p:?}");
    }
    // Rank 1 printed the reason, rank 0's part of the log did not.
    let rank1 = r.processes.iter().find(|p| p.ranks == [1]).unwrap();
    assert_eq!(rank1.reasons.len(), 3);
    assert!(rank1.reasons[0].contains("'mlx5_1' (no module)`: no peer-memory module"));
    assert!(rank1.fixes[0].contains("modprobe nvidia-peermem"));
    let rank0 = r.processes.iter().find(|p| p.ranks == [0]).unwrap();
    assert!(rank0.reasons.is_empty());
    assert!(rank0.likely[0].contains("NCCL_DEBUG_SUBSYS=INIT,ENV,NET"));
    assert!(lines_of(&r).contains("GPUDirect RDMA: not used on any of 7 network connection(s)"));
}

#[test]
fn gdr_off_for_the_hca_in_the_newer_form() {
    let r = report("gdr-off-hca");
    let p = &r.processes[0];
    assert_eq!(p.verdict, LogVerdict::NoGdrdma);
    assert_eq!((p.ranks.as_slice(), p.nranks), (&[0][..], Some(16)));
    assert_eq!(p.devices, ["[0]mlx5_0:1/RoCE", "[1]mlx5_1:1/RoCE"]);
    assert!(p.relaxed_ordering);
    assert_eq!(p.oob.as_deref(), Some("primaryip:10.10.10.10<0>"));
    assert!(p.network.as_deref().unwrap().contains("RoCE"));
    assert_eq!(p.reasons.len(), 2);
    assert!(
        p.reasons[0].contains("neither a peer-memory module"),
        "{:?}",
        p.reasons
    );
    assert!(p.reasons[0].contains("/sys/module/nvidia_peermem/version"));
}

#[test]
fn socket_fallback_says_why() {
    let r = report("socket-fallback");
    assert!(!r.gdrdma_verified);
    let p = &r.processes[0];
    assert_eq!(p.verdict, LogVerdict::Socket);
    assert_eq!(p.version.as_deref(), Some("2.19.3+cuda12.3"));
    assert_eq!(p.devices, ["[0]ens7:10.128.0.32<0>"]);
    assert!(
        p.reasons[0].contains("`NET/IB : No device found.`"),
        "{:?}",
        p.reasons
    );
    let t = lines_of(&r);
    assert!(
        t.contains("GPUDirect RDMA: not used: NCCL uses TCP sockets"),
        "{t}"
    );
    assert!(
        t.contains("  verdict       no RDMA at all: NCCL uses TCP sockets"),
        "{t}"
    );
}

#[test]
fn multi_rank_log_keeps_processes_and_hosts_apart() {
    let r = report("multi-rank");
    assert!(r.gdrdma_verified);
    assert_eq!(r.processes.len(), 3);
    let by_rank: Vec<(Vec<u32>, LogVerdict, usize)> = r
        .processes
        .iter()
        .map(|p| (p.ranks.clone(), p.verdict, p.intra_node_channels))
        .collect();
    assert_eq!(
        by_rank,
        [
            (vec![2], LogVerdict::Gdrdma, 0),
            (vec![3], LogVerdict::Gdrdma, 1),
            (vec![], LogVerdict::NoNetConnections, 4),
        ]
    );
    assert_eq!(r.processes[1].send, (4, 4));
    assert_eq!(r.processes[1].receive, (4, 4));
    let t = lines_of(&r);
    assert!(t.contains("3 process(es) on 2 host(s)"), "{t}");
    assert!(
        t.contains("  verdict       no network connection in the log: cannot tell whether GPUDirect RDMA is used"),
        "{t}"
    );
}

/// The doctor's view of the failing DGX fixture, cross-checked with a log that lacks GDRDMA.
#[test]
fn host_view_explains_a_log_without_gdrdma() {
    let snap_path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/doctor/snapshots/dgx-a100-failing.json");
    let snap = Snapshot::from_json(&std::fs::read_to_string(&snap_path).unwrap(), "dgx").unwrap();
    let host = diagnose(&snap);
    assert!(host
        .findings_with_id("peermem.module")
        .any(|f| f.severity == Severity::Fail));
    let text = std::fs::read_to_string(dir().join("gdr-off-no-peermem.log")).unwrap();
    let r = analyze(&parse(&text, "log").unwrap(), Some(&host));
    assert_eq!(r.host_source.as_deref(), Some(snap.source.as_str()));
    for p in &r.processes {
        assert!(
            p.host.iter().any(|h| h.starts_with("FAIL peermem.module")),
            "{:?}",
            p.host
        );
        assert!(
            p.host.iter().any(|h| h.contains("path SYS")),
            "{:?}",
            p.host
        );
    }
    // A log whose devices the host lacks says the host view may not apply.
    let text = "a:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_9:1/IB ; OOB ib0:1.2.3.4<0>\n\
                a:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n";
    let r = analyze(&parse(text, "log").unwrap(), Some(&host));
    assert!(
        r.processes[0].host[0].contains("none of the log's devices (mlx5_9) is on the host"),
        "{:?}",
        r.processes[0].host
    );
    // A log that shows GDRDMA everywhere needs no host explanation.
    let text = std::fs::read_to_string(dir().join("gdrdma-on.log")).unwrap();
    let r = analyze(&parse(&text, "log").unwrap(), Some(&host));
    assert!(r.processes.iter().all(|p| p.host.is_empty()));
}
