//! The variables that choose the GID: `NCCL_IB_GID_INDEX`, `NCCL_IB_ROCE_VERSION_NUM`,
//! `NCCL_IB_ADDR_FAMILY`.

use super::*;

pub(super) fn gid_index(snap: &Snapshot, v: &str) -> Finding {
    let since = "NCCL >= 2.21 selects the GID itself when NCCL_IB_GID_INDEX is unset (default -1: RoCE v2 by NCCL_IB_ROCE_VERSION_NUM=2, IPv4 by NCCL_IB_ADDR_FAMILY=AF_INET); before 2.21 the default index was 0";
    let ev = format!("NCCL_IB_GID_INDEX={v}");
    let Some(n) = nccl_int(v) else {
        return Finding::new(
            "nccl.ib_gid_index",
            Severity::Fail,
            "host",
            format!("NCCL_IB_GID_INDEX={v:?} is not a number: NCCL ignores it and uses its default"),
        )
        .evidence(ev)
        .evidence(since)
        .fix("set the index of the RoCE v2 IPv4 GID (see roce.gid_index), or unset it with NCCL >= 2.21");
    };
    if n < 0 {
        return Finding::new(
            "nccl.ib_gid_index",
            Severity::Ok,
            "host",
            format!("NCCL_IB_GID_INDEX={n}: NCCL >= 2.21 selects the GID itself (older NCCL reads it as an index and fails)"),
        )
        .evidence(ev)
        .evidence(since);
    }
    let ports = selected_ports(snap);
    let roce: Vec<_> = ports.iter().filter(|(_, p)| is_ethernet(p)).collect();
    if roce.is_empty() {
        let mut f = Finding::new(
            "nccl.ib_gid_index",
            Severity::Ok,
            "host",
            format!("NCCL_IB_GID_INDEX={n} has no effect here: no RoCE port is used (the GID index matters for RoCE, not InfiniBand)"),
        )
        .evidence(ev);
        for (d, p) in &ports {
            f = f.evidence(format!(
                "{} port {}: {}",
                d.name,
                p.port,
                p.link_layer.as_deref().unwrap_or("link layer unknown")
            ));
        }
        return f;
    }
    let mut sevs = Vec::new();
    let mut msgs = Vec::new();
    let mut f = Finding::new("nccl.ib_gid_index", Severity::Ok, "host", "").evidence(ev);
    let mut better = Vec::new();
    for (d, p) in roce {
        let at = format!("{} port {}", d.name, p.port);
        let good = p
            .gids
            .iter()
            .find(|g| g.is_roce_v2() && g.is_ipv4_mapped())
            .map(|g| g.index);
        if let Some(g) = good {
            better.push(g);
        }
        let (sev, msg) = entry_at(p, &at, n);
        sevs.push(sev);
        msgs.push(msg);
        for g in &p.gids {
            f = f.evidence(format!("{at} gid[{}] {}", g.index, gid_text(g)));
        }
    }
    f.severity = worst(&sevs);
    f.message = format!("NCCL_IB_GID_INDEX={n}: {}", msgs.join("; "));
    f = f.evidence(since);
    better.sort_unstable();
    better.dedup();
    if f.severity != Severity::Ok {
        f = f.fix(match better.as_slice() {
            [g] => format!("export NCCL_IB_GID_INDEX={g} (the RoCE v2 IPv4 GID), or with NCCL >= 2.21 unset it"),
            _ => "with NCCL >= 2.21 unset NCCL_IB_GID_INDEX (the RoCE v2 IPv4 GID differs between ports, NCCL picks it per port); `show_gids` lists them".to_string(),
        });
    }
    f
}

/// What GID index `n` of port `p` (`at`: `mlx5_0 port 1`) is to NCCL: none, RoCE v1,
/// link-local, IPv6, or the RoCE v2 IPv4 GID it should be.
fn entry_at(p: &RdmaPort, at: &str, n: i64) -> (Severity, String) {
    match p.gids.iter().find(|g| i64::from(g.index) == n) {
        None => (
            Severity::Fail,
            format!("{at} has no GID at index {n}: queue pairs fail to connect"),
        ),
        Some(g) if !g.is_roce_v2() => (
            Severity::Fail,
            format!("{at}: index {n} is {}: RoCE v1 is not routable and peers on RoCE v2 cannot talk to it", gid_text(g)),
        ),
        Some(g) if is_link_local(g) => (
            Severity::Fail,
            format!("{at}: index {n} is {}: link-local addresses do not route across subnets and NCCL's peers default to IPv4", gid_text(g)),
        ),
        Some(g) if !g.is_ipv4_mapped() => (
            Severity::Warn,
            format!(
                "{at}: index {n} is {}: every peer must then use IPv6 GIDs too",
                gid_text(g)
            ),
        ),
        Some(g) => (
            Severity::Ok,
            format!("{at}: index {n} is {}", gid_text(g)),
        ),
    }
}

pub(super) fn roce_version(snap: &Snapshot, v: &str) -> Finding {
    let ev = format!("NCCL_IB_ROCE_VERSION_NUM={v}");
    if snap.env.contains_key("NCCL_IB_GID_INDEX") {
        return Finding::new(
            "nccl.ib_roce_version",
            Severity::Warn,
            "host",
            format!("NCCL_IB_ROCE_VERSION_NUM={v} is ignored: it only steers NCCL's GID auto-selection (NCCL >= 2.21), which NCCL_IB_GID_INDEX turns off"),
        )
        .evidence(ev)
        .fix("unset one of the two: NCCL_IB_GID_INDEX to let NCCL choose, or NCCL_IB_ROCE_VERSION_NUM");
    }
    let want = match nccl_int(v) {
        Some(1) => "IB/RoCE v1",
        Some(2) => "RoCE v2",
        _ => {
            return Finding::new(
                "nccl.ib_roce_version",
                Severity::Warn,
                "host",
                format!(
                    "NCCL_IB_ROCE_VERSION_NUM={v:?} is neither 1 nor 2 (default 2, NCCL >= 2.21)"
                ),
            )
            .evidence(ev)
            .fix("unset it (RoCE v2 is the default and the routable one)");
        }
    };
    let ports = selected_ports(snap);
    let missing: Vec<String> = ports
        .iter()
        .filter(|(_, p)| is_ethernet(p))
        .filter(|(_, p)| {
            !p.gids.iter().any(|g| {
                g.gid_type
                    .as_deref()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case(want))
            })
        })
        .map(|(d, p)| format!("{} port {}", d.name, p.port))
        .collect();
    let mut f = if !missing.is_empty() {
        Finding::new(
            "nccl.ib_roce_version",
            Severity::Fail,
            "host",
            format!("NCCL_IB_ROCE_VERSION_NUM={v}: no {want} GID on {}", missing.join(", ")),
        )
        .fix("unset it (default 2), or give the port's netdev an IP address so the kernel adds the GIDs")
    } else if want == "IB/RoCE v1" {
        Finding::new(
            "nccl.ib_roce_version",
            Severity::Warn,
            "host",
            "NCCL_IB_ROCE_VERSION_NUM=1 makes NCCL pick RoCE v1 GIDs: not routable beyond one L2 domain",
        )
        .fix("unset it (default 2, RoCE v2)")
    } else {
        Finding::new(
            "nccl.ib_roce_version",
            Severity::Ok,
            "host",
            "NCCL_IB_ROCE_VERSION_NUM=2 (NCCL's default since 2.21): NCCL picks RoCE v2 GIDs",
        )
    };
    f.evidence.insert(0, ev);
    f
}

pub(super) fn addr_family(snap: &Snapshot, v: &str) -> Finding {
    let ev = format!("NCCL_IB_ADDR_FAMILY={v}");
    if snap.env.contains_key("NCCL_IB_GID_INDEX") {
        return Finding::new(
            "nccl.ib_addr_family",
            Severity::Warn,
            "host",
            format!("NCCL_IB_ADDR_FAMILY={v} is ignored: it only steers NCCL's GID auto-selection (NCCL >= 2.21), which NCCL_IB_GID_INDEX turns off"),
        )
        .evidence(ev)
        .fix("unset one of the two: NCCL_IB_GID_INDEX to let NCCL choose, or NCCL_IB_ADDR_FAMILY");
    }
    let v6 = match v {
        "AF_INET" => false,
        "AF_INET6" => true,
        _ => {
            return Finding::new(
                "nccl.ib_addr_family",
                Severity::Warn,
                "host",
                format!("NCCL_IB_ADDR_FAMILY={v:?} is neither AF_INET nor AF_INET6 (case-sensitive): NCCL keeps the default AF_INET"),
            )
            .evidence(ev)
            .fix("unset it, or set AF_INET / AF_INET6");
        }
    };
    let ports = selected_ports(snap);
    let missing: Vec<String> = ports
        .iter()
        .filter(|(_, p)| is_ethernet(p))
        .filter(|(_, p)| {
            !p.gids.iter().any(|g| {
                g.is_roce_v2()
                    && if v6 {
                        !g.is_ipv4_mapped() && !is_link_local(g)
                    } else {
                        g.is_ipv4_mapped()
                    }
            })
        })
        .map(|(d, p)| format!("{} port {}", d.name, p.port))
        .collect();
    let fam = if v6 { "routable IPv6" } else { "IPv4" };
    let mut f = if missing.is_empty() {
        Finding::new(
            "nccl.ib_addr_family",
            Severity::Ok,
            "host",
            format!("NCCL_IB_ADDR_FAMILY={v}: every RoCE port used has a RoCE v2 {fam} GID"),
        )
    } else {
        Finding::new(
            "nccl.ib_addr_family",
            Severity::Fail,
            "host",
            format!(
                "NCCL_IB_ADDR_FAMILY={v}: no RoCE v2 {fam} GID on {}",
                missing.join(", ")
            ),
        )
        .fix(if v6 {
            "give the netdev a global IPv6 address (link-local fe80:: GIDs are not routed), or unset it (AF_INET)"
        } else {
            "give the netdev an IPv4 address (`ip addr add`), or unset it"
        })
    };
    f.evidence.insert(0, ev);
    f
}
