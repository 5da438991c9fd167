//! The variables that choose the network and its devices: `NCCL_IB_DISABLE`, `NCCL_NET`,
//! `NCCL_NET_PLUGIN`, `NCCL_IB_HCA`, `NCCL_SOCKET_IFNAME`.

use super::*;

pub(super) fn ib_disable(snap: &Snapshot, v: &str) -> Finding {
    let ev = format!("NCCL_IB_DISABLE={v}");
    let devs = snap.rdma.len();
    let ev_devs = format!(
        "RDMA devices: {}",
        if devs == 0 {
            "none".to_string()
        } else {
            snap.rdma
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    match nccl_int(v) {
        Some(0) if devs == 0 => Finding::new(
            "nccl.ib_disable",
            Severity::Warn,
            "host",
            "NCCL_IB_DISABLE=0 allows the IB/RoCE transport, but this host has no RDMA device: NCCL falls back to sockets",
        )
        .evidence(ev)
        .evidence(ev_devs)
        .fix("install the NIC driver and rdma-core so that `ibv_devices` lists the NIC (see inventory.rdma)"),
        Some(0) => Finding::new(
            "nccl.ib_disable",
            Severity::Ok,
            "host",
            "NCCL_IB_DISABLE=0 allows the IB/RoCE transport (0 is NCCL's default: setting it changes nothing)",
        )
        .evidence(ev)
        .evidence(ev_devs),
        Some(_) => Finding::new(
            "nccl.ib_disable",
            Severity::Fail,
            "host",
            format!("NCCL_IB_DISABLE={v} turns the IB/RoCE transport off: NCCL uses TCP sockets, so neither RDMA nor GPUDirect RDMA is used{}", if devs > 0 { format!(" although {devs} RDMA device(s) are present") } else { String::new() }),
        )
        .evidence(ev)
        .evidence(ev_devs)
        .fix("unset NCCL_IB_DISABLE (or set it to 0)"),
        None => Finding::new(
            "nccl.ib_disable",
            Severity::Warn,
            "host",
            format!("NCCL_IB_DISABLE={v:?} is not a number: NCCL ignores it and keeps the default 0 (IB/RoCE allowed)"),
        )
        .evidence(ev)
        .fix("set NCCL_IB_DISABLE to 0 or 1, or unset it"),
    }
}

pub(super) fn net(snap: &Snapshot, v: &str) -> Finding {
    let ev = format!("NCCL_NET={v}");
    if v.eq_ignore_ascii_case("Socket") {
        Finding::new(
            "nccl.net",
            Severity::Fail,
            "host",
            "NCCL_NET=Socket forces NCCL's TCP socket transport: no RDMA, no GPUDirect RDMA",
        )
        .evidence(ev)
        .fix("unset NCCL_NET (NCCL picks IB when a usable RDMA device exists), or NCCL_NET=IB")
    } else if v.eq_ignore_ascii_case("IB") {
        if snap.rdma.is_empty() {
            Finding::new(
                "nccl.net",
                Severity::Fail,
                "host",
                "NCCL_NET=IB forces the IB verbs transport, but this host has no RDMA device: NCCL initialisation fails instead of falling back to sockets",
            )
            .evidence(ev)
            .evidence("RDMA devices: none")
            .fix("install the NIC driver and rdma-core, or unset NCCL_NET")
        } else {
            Finding::new(
                "nccl.net",
                Severity::Ok,
                "host",
                "NCCL_NET=IB forces NCCL's internal IB verbs transport (no silent fall-back to sockets)",
            )
            .evidence(ev)
        }
    } else {
        Finding::new(
            "nccl.net",
            Severity::Unknown,
            "host",
            format!("NCCL_NET={v} names an external network plugin (NCCL >= 2.10 matches the name case-insensitively and does not fall back): whether it uses GPUDirect RDMA is up to that plugin"),
        )
        .evidence(ev)
        .fix("check the plugin's own log lines (`NET/Plugin: Loaded net plugin ...`, then `via NET/<name>/<dev>/GDRDMA` on the channel lines: `gdr doctor nccl-log`)")
    }
}

pub(super) fn net_plugin(v: &str) -> Finding {
    let ev = format!("NCCL_NET_PLUGIN={v}");
    if v.eq_ignore_ascii_case("none") {
        Finding::new(
            "nccl.net_plugin",
            Severity::Ok,
            "host",
            "NCCL_NET_PLUGIN=none: NCCL loads no external net plugin and uses its internal IB or Socket transport",
        )
        .evidence(ev)
    } else {
        Finding::new(
            "nccl.net_plugin",
            Severity::Unknown,
            "host",
            format!("NCCL_NET_PLUGIN={v}: NCCL (>= 2.11) loads `{v}`, else `libnccl-net-{v}.so`, else its internal transport; the plugin (e.g. HPC-X's IBext) then decides about GPUDirect RDMA"),
        )
        .evidence(ev)
        .fix("confirm which plugin loaded with NCCL_DEBUG=INFO (`NET/Plugin` lines) and whether the channels say GDRDMA (`gdr doctor nccl-log`)")
    }
}

pub(super) fn ib_hca(snap: &Snapshot, v: &str) -> Finding {
    let list = parse_hca(v);
    let names: Vec<&str> = snap.rdma.iter().map(|d| d.name.as_str()).collect();
    let available = if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    };
    let selected: Vec<&str> = names.iter().copied().filter(|d| list.selects(d)).collect();
    let missing: Vec<&str> = list
        .entries
        .iter()
        .filter(|(e, _)| !names.iter().any(|d| list.matches(e, d)))
        .map(|(e, _)| e.as_str())
        .collect();
    let mut ev = vec![
        format!("NCCL_IB_HCA={v}"),
        format!("RDMA devices: {available}"),
    ];
    let bad_ports = named_ports(snap, &list, &mut ev);
    let widened = widened_prefixes(&list, &names);
    let mut f = if selected.is_empty() {
        Finding::new(
            "nccl.ib_hca",
            Severity::Fail,
            "host",
            format!("NCCL_IB_HCA={v} selects no RDMA device: NCCL falls back to sockets"),
        )
        .fix("set NCCL_IB_HCA to existing devices (see the recommendation below) or unset it")
    } else if !missing.is_empty() && !list.exclude {
        Finding::new(
            "nccl.ib_hca",
            Severity::Fail,
            "host",
            format!("NCCL_IB_HCA names {} which does not exist", missing.join(", ")),
        )
        .fix("remove the names that do not exist (`ibv_devices` lists the real ones), or unset NCCL_IB_HCA")
    } else if !bad_ports.is_empty() {
        Finding::new(
            "nccl.ib_hca",
            Severity::Fail,
            "host",
            format!("NCCL_IB_HCA names a port NCCL cannot use: {}", bad_ports.join("; ")),
        )
        .fix("name an active port (`ibv_devinfo` lists them), or leave the port out so NCCL uses every port")
    } else if !widened.is_empty() {
        Finding::new(
            "nccl.ib_hca",
            Severity::Warn,
            "host",
            format!(
                "NCCL_IB_HCA={v} selects {} (NCCL matches prefixes: {})",
                selected.join(", "),
                widened.join(", ")
            ),
        )
        .fix(format!(
            "prefix the list with `=` for exact names: NCCL_IB_HCA=={}",
            v.trim_start_matches('=')
        ))
    } else {
        let what: Vec<String> = selected
            .iter()
            .map(|d| match list.port_for(d) {
                Some(p) => format!("{d} port {p}"),
                None => d.to_string(),
            })
            .collect();
        Finding::new(
            "nccl.ib_hca",
            Severity::Ok,
            "host",
            format!("NCCL_IB_HCA selects {}", what.join(", ")),
        )
    };
    f.evidence.append(&mut ev);
    f.evidence.extend(bad_ports.iter().cloned());
    f
}

/// The ports an include list names that the device lacks or that are not active; the active
/// ones go into `ev`.
fn named_ports(snap: &Snapshot, list: &HcaList, ev: &mut Vec<String>) -> Vec<String> {
    let mut bad_ports = Vec::new();
    if list.exclude {
        return bad_ports;
    }
    for (entry, port) in &list.entries {
        let Some(port) = port else { continue };
        for d in snap.rdma.iter().filter(|d| list.matches(entry, &d.name)) {
            match d.ports.iter().find(|p| p.port == *port) {
                None => bad_ports.push(format!(
                    "{} has no port {port} (ports: {})",
                    d.name,
                    d.ports
                        .iter()
                        .map(|p| p.port.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
                Some(p) if !p.state.as_deref().is_some_and(|s| s.contains("ACTIVE")) => bad_ports
                    .push(format!(
                        "{} port {port} is not active ({})",
                        d.name,
                        p.state.as_deref().unwrap_or("state unknown")
                    )),
                Some(_) => ev.push(format!("{} port {port}: active", d.name)),
            }
        }
    }
    bad_ports
}

/// The prefix entries that also match longer device names (`mlx5_1` -> `mlx5_10`).
fn widened_prefixes(list: &HcaList, names: &[&str]) -> Vec<String> {
    if list.exact || list.exclude {
        return Vec::new();
    }
    list.entries
        .iter()
        .filter(|(e, _)| names.contains(&e.as_str()))
        .flat_map(|(e, _)| {
            names
                .iter()
                .filter(move |d| **d != e && d.starts_with(e.as_str()))
                .map(move |d| format!("{e} also matches {d}"))
        })
        .collect()
}

pub(super) fn socket_ifname(snap: &Snapshot, v: &str) -> Finding {
    let rdma_netdevs: Vec<String> = snap
        .rdma
        .iter()
        .flat_map(|d| {
            d.ports
                .iter()
                .flat_map(|p| p.netdevs.iter().map(|n| n.name.clone()))
        })
        .collect();
    let list = parse_hca(v);
    let hits: Vec<&String> = rdma_netdevs.iter().filter(|n| list.selects(n)).collect();
    let mut f = Finding::new(
        "nccl.socket_ifname",
        Severity::Ok,
        "host",
        format!("NCCL_SOCKET_IFNAME={v} picks the IP interfaces for NCCL's bootstrap, the IB transport's out-of-band connection and the Socket transport; it does not pick the RDMA NIC (NCCL_IB_HCA does)"),
    )
    .evidence(format!("NCCL_SOCKET_IFNAME={v}"))
    .evidence(format!(
        "netdevs of RDMA ports: {}",
        if rdma_netdevs.is_empty() {
            "none".to_string()
        } else {
            rdma_netdevs.join(", ")
        }
    ));
    if !hits.is_empty() {
        f = f.evidence(format!(
            "matches RDMA netdev(s): {}",
            hits.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    f.fix("if NCCL reports `Bootstrap : no socket interface found`, name an interface that exists and has an address on every node (`ip -br addr`); the prefix rules are NCCL_IB_HCA's (`^` excludes, `=` exact)")
}
