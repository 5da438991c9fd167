//! Unit tests of the NCCL variables.

use super::*;

#[test]
fn hca_syntax() {
    let l = parse_hca("^=mlx5_0:1,mlx5_1");
    assert!(l.exclude && l.exact);
    assert_eq!(
        l.entries,
        [
            ("mlx5_0".to_string(), Some(1)),
            ("mlx5_1".to_string(), None)
        ]
    );
    let l = parse_hca("mlx5");
    assert!(l.matches("mlx5", "mlx5_3"));
    // Rail and plane fields (NCCL 2.27+), and an empty port meaning every port.
    let l = parse_hca("=mlx5_0:1:0:0,mlx5_1::0:1");
    assert_eq!(
        l.entries,
        [
            ("mlx5_0".to_string(), Some(1)),
            ("mlx5_1".to_string(), None)
        ]
    );
}

#[test]
fn levels_are_read_as_nccl_reads_them() {
    assert_eq!(
        read_level("PXB"),
        LevelRead::Name(Level::UpTo(PathClass::Pxb, "PXB"))
    );
    // Case-sensitive strcmp in ncclGetLevel: lower case is ignored, not upper-cased.
    assert_eq!(read_level("pxb"), LevelRead::Ignored);
    assert_eq!(read_level("NODE"), LevelRead::Ignored);
    assert_eq!(read_level(""), LevelRead::Ignored);
    assert_eq!(
        read_level("5"),
        LevelRead::Legacy(5, Level::UpTo(PathClass::Sys, "SYS"))
    );
    assert_eq!(read_level("0"), LevelRead::Legacy(0, Level::Never));
    assert_eq!(
        read_level("3"),
        LevelRead::Legacy(3, Level::UpTo(PathClass::Phb, "PHB"))
    );
    // strtol stops at the first non-digit; a huge number is still "above 4".
    assert_eq!(
        read_level("2x"),
        LevelRead::Legacy(2, Level::UpTo(PathClass::Pxb, "PXB"))
    );
    assert!(matches!(
        read_level("99999999999999999999999"),
        LevelRead::Legacy(_, Level::UpTo(PathClass::Sys, _))
    ));
    assert!(Level::UpTo(PathClass::Pxb, "PXN").allows(PathClass::Pix));
    assert!(!Level::UpTo(PathClass::Pxb, "PXN").allows(PathClass::Phb));
    assert!(!Level::NvlinkOnly("NVL").allows(PathClass::Pix));
    assert!(!Level::Never.allows(PathClass::Pix));
}

/// The failing DGX fixture (one RoCE NIC mlx5_0 port 1 whose GIDs are v1/v2 link-local at
/// 0/1 and v1/v2 IPv4 at 2/3; no peer memory, no dma-buf; a PIX and a SYS pair) with `env`.
fn dgx(env: &[(&str, &str)]) -> super::super::Report {
    let mut snap = Snapshot::from_json(
        include_str!("../../tests/fixtures/doctor/snapshots/dgx-a100-failing.json"),
        "dgx",
    )
    .unwrap();
    snap.env.clear();
    for (k, v) in env {
        snap.env.insert(k.to_string(), v.to_string());
    }
    super::super::diagnose(&snap)
}

fn one(r: &super::super::Report, id: &str) -> Finding {
    let v: Vec<&Finding> = r.findings_with_id(id).collect();
    assert_eq!(v.len(), 1, "{id}: {v:?}");
    v[0].clone()
}

#[test]
fn every_variable_is_cross_checked_with_the_host() {
    // Unset variables give no finding.
    let r = dgx(&[]);
    assert!(r.all_findings().all(|f| !f.id.starts_with("nccl.")));
    let r = dgx(&[("NCCL_IB_DISABLE", "1")]);
    let f = one(&r, "nccl.ib_disable");
    assert_eq!(f.severity, Severity::Fail);
    assert!(
        f.message.contains("although 1 RDMA device(s) are present"),
        "{}",
        f.message
    );
    let f = one(&dgx(&[("NCCL_IB_HCA", "mlx5_0:2")]), "nccl.ib_hca");
    assert_eq!(f.severity, Severity::Fail);
    assert!(
        f.message.contains("mlx5_0 has no port 2 (ports: 1)"),
        "{}",
        f.message
    );
    let f = one(&dgx(&[("NCCL_IB_HCA", "mlx5_3")]), "nccl.ib_hca");
    assert_eq!(f.severity, Severity::Fail);
    // GID index on a RoCE v1 entry, on an IPv6 link-local v2 entry, past the table.
    for (idx, want) in [
        ("2", "RoCE v1 is not routable"),
        ("1", "link-local addresses do not route"),
        ("9", "has no GID at index 9"),
    ] {
        let f = one(&dgx(&[("NCCL_IB_GID_INDEX", idx)]), "nccl.ib_gid_index");
        assert_eq!(f.severity, Severity::Fail, "{idx}");
        assert!(f.message.contains(want), "{idx}: {}", f.message);
        assert!(f.fix.as_deref().unwrap().contains("NCCL_IB_GID_INDEX=3"));
    }
    let f = one(&dgx(&[("NCCL_IB_GID_INDEX", "-1")]), "nccl.ib_gid_index");
    assert_eq!(f.severity, Severity::Ok);
    // Auto-selection knobs are ignored once the index is set.
    let r = dgx(&[
        ("NCCL_IB_GID_INDEX", "3"),
        ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
    ]);
    assert_eq!(one(&r, "nccl.ib_addr_family").severity, Severity::Warn);
    let f = one(
        &dgx(&[("NCCL_IB_ADDR_FAMILY", "AF_INET6")]),
        "nccl.ib_addr_family",
    );
    assert_eq!(
        f.severity,
        Severity::Fail,
        "only link-local IPv6 GIDs: {}",
        f.message
    );
    let f = one(
        &dgx(&[("NCCL_IB_ROCE_VERSION_NUM", "2")]),
        "nccl.ib_roce_version",
    );
    assert_eq!(f.severity, Severity::Ok);
    // dma-buf off with no peer memory: nothing can register GPU memory.
    let f = one(&dgx(&[("NCCL_DMABUF_ENABLE", "0")]), "nccl.dmabuf_enable");
    assert_eq!(f.severity, Severity::Fail);
    let f = one(&dgx(&[("NCCL_DMABUF_ENABLE", "1")]), "nccl.dmabuf_enable");
    assert_eq!(f.severity, Severity::Fail, "{}", f.message);
    assert_eq!(
        one(&dgx(&[("NCCL_NET", "Socket")]), "nccl.net").severity,
        Severity::Fail
    );
    assert_eq!(
        one(&dgx(&[("NCCL_NET", "ib")]), "nccl.net").severity,
        Severity::Ok
    );
    assert_eq!(
        one(&dgx(&[("NCCL_NET_PLUGIN", "none")]), "nccl.net_plugin").severity,
        Severity::Ok
    );
    assert_eq!(
        one(&dgx(&[("NCCL_NET_GDR_READ", "0")]), "nccl.net_gdr_read").severity,
        Severity::Warn
    );
    assert_eq!(
        one(
            &dgx(&[("NCCL_IB_PCI_RELAXED_ORDERING", "0")]),
            "nccl.ib_relaxed_ordering"
        )
        .severity,
        Severity::Warn
    );
    assert_eq!(
        one(
            &dgx(&[("NCCL_SOCKET_IFNAME", "enp8")]),
            "nccl.socket_ifname"
        )
        .evidence[2],
        "matches RDMA netdev(s): enp8s0f0"
    );
    // NCCL_NET_GDR_LEVEL: the legacy integer 3 is PHB, stricter than the SYS pair; a
    // lower-case name is ignored by NCCL.
    let r = dgx(&[("NCCL_NET_GDR_LEVEL", "3")]);
    let f = one(&r, "nccl.net_gdr_level");
    assert_eq!(f.severity, Severity::Warn);
    assert!(
        f.message
            .contains("legacy integer 3, which NCCL reads as PHB"),
        "{}",
        f.message
    );
    assert!(r.findings_with_id("nccl.gdr_level").any(|f| f
        .message
        .contains("NCCL_NET_GDR_LEVEL=PHB is stricter than this pair's SYS path")));
    let f = one(&dgx(&[("NCCL_NET_GDR_LEVEL", "sys")]), "nccl.net_gdr_level");
    assert!(
        f.message.contains("not a level NCCL knows"),
        "{}",
        f.message
    );
    // P2P: the misreading, and P2P_DISABLE's precedence.
    let r = dgx(&[("NCCL_P2P_LEVEL", "SYS"), ("NCCL_P2P_DISABLE", "1")]);
    assert_eq!(one(&r, "nccl.p2p_disable").severity, Severity::Warn);
    let f = one(&r, "nccl.p2p_level");
    assert!(f.evidence.iter().any(|e| e.contains("takes precedence")));
    assert!(f
        .fix
        .as_deref()
        .unwrap()
        .contains("set NCCL_NET_GDR_LEVEL instead"));
    let f = one(&dgx(&[("NCCL_DEBUG", "WARN")]), "nccl.debug");
    assert!(f.fix.as_deref().unwrap().contains("NCCL_DEBUG=INFO"));
    let f = one(
        &dgx(&[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "COLL")]),
        "nccl.debug",
    );
    assert_eq!(f.severity, Severity::Warn);
}

#[test]
fn integers_are_read_as_strtoll_reads_them() {
    assert_eq!(nccl_int("1"), Some(1));
    assert_eq!(nccl_int(" 3"), Some(3));
    assert_eq!(nccl_int("0x10"), Some(16));
    assert_eq!(nccl_int("010"), Some(8));
    assert_eq!(nccl_int("-1"), Some(-1));
    assert_eq!(nccl_int("0"), Some(0));
    assert_eq!(nccl_int("1 "), None);
    assert_eq!(nccl_int("yes"), None);
    assert_eq!(nccl_int(""), None);
    assert_eq!(nccl_int("-"), None);
    assert_eq!(nccl_int("99999999999999999999"), None);
}
