//! NCCL: the device list in NCCL_IB_HCA, and the settings that fit this host.

use super::path::PathClass;
use super::{Finding, NcclSetting, NicSummary, PairReport, Severity, VerdictKind};
use crate::topology::Snapshot;

/// A parsed `NCCL_IB_HCA`: `[^][=]name[:port],name[:port]...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HcaList {
    pub exclude: bool,
    pub exact: bool,
    pub entries: Vec<(String, Option<u32>)>,
}

pub(crate) fn parse_hca(s: &str) -> HcaList {
    let mut rest = s.trim();
    let exclude = rest.starts_with('^');
    if exclude {
        rest = &rest[1..];
    }
    let exact = rest.starts_with('=');
    if exact {
        rest = &rest[1..];
    }
    let entries = rest
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once(':') {
            Some((n, p)) => (n.to_string(), p.parse().ok()),
            None => (e.to_string(), None),
        })
        .collect();
    HcaList {
        exclude,
        exact,
        entries,
    }
}

impl HcaList {
    fn matches(&self, entry: &str, dev: &str) -> bool {
        if self.exact {
            dev == entry
        } else {
            dev.starts_with(entry)
        }
    }
}

/// Findings about NCCL_IB_HCA.
pub(crate) fn check_env(snap: &Snapshot) -> Vec<Finding> {
    let Some(v) = snap.env.get("NCCL_IB_HCA") else {
        return Vec::new();
    };
    let list = parse_hca(v);
    let names: Vec<&str> = snap.rdma.iter().map(|d| d.name.as_str()).collect();
    let available = if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    };
    let selected: Vec<&str> = names
        .iter()
        .copied()
        .filter(|d| {
            let hit = list.entries.iter().any(|(e, _)| list.matches(e, d));
            hit != list.exclude
        })
        .collect();
    let missing: Vec<&str> = list
        .entries
        .iter()
        .filter(|(e, _)| !names.iter().any(|d| list.matches(e, d)))
        .map(|(e, _)| e.as_str())
        .collect();
    let ev = vec![
        format!("NCCL_IB_HCA={v}"),
        format!("RDMA devices: {available}"),
    ];
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
    } else {
        Finding::new(
            "nccl.ib_hca",
            Severity::Ok,
            "host",
            format!("NCCL_IB_HCA selects {}", selected.join(", ")),
        )
    };
    f.evidence = ev;
    vec![f]
}

/// The NCCL settings that fit the best pairs.
pub(crate) fn recommend(pairs: &[PairReport], nics: &[NicSummary]) -> Vec<NcclSetting> {
    let best: Vec<&PairReport> = pairs
        .iter()
        .filter(|p| p.best && p.verdict.kind != VerdictKind::NotUsable)
        .collect();
    if best.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut hcas: Vec<String> = best
        .iter()
        .map(|p| match p.port {
            Some(port) => format!("{}:{port}", p.nic),
            None => p.nic.clone(),
        })
        .collect();
    hcas.sort();
    hcas.dedup();
    out.push(NcclSetting {
        name: "NCCL_IB_HCA".into(),
        value: format!("={}", hcas.join(",")),
        why: "the NIC nearest each GPU; `=` makes NCCL match names exactly (mlx5_1 would otherwise also match mlx5_10)".into(),
    });
    let mut gids: Vec<u32> = best
        .iter()
        .filter_map(|p| nics.iter().find(|n| n.name == p.nic))
        .filter(|n| n.link_layer.as_deref() == Some("Ethernet"))
        .filter_map(|n| n.roce_v2_gid_index)
        .collect();
    gids.sort_unstable();
    gids.dedup();
    if gids.len() == 1 {
        out.push(NcclSetting {
            name: "NCCL_IB_GID_INDEX".into(),
            value: gids[0].to_string(),
            why: "the RoCE v2 GID with an IPv4 address on the chosen ports".into(),
        });
    }
    let worst = best.iter().filter_map(|p| p.path).max();
    match worst {
        Some(c) if c <= PathClass::Pxb => out.push(NcclSetting {
            name: "NCCL_NET_GDR_LEVEL".into(),
            value: "PXB".into(),
            why: format!("every GPU has a NIC at {c} or nearer: NCCL's default already uses GPUDirect"),
        }),
        Some(PathClass::Phb) => out.push(NcclSetting {
            name: "NCCL_NET_GDR_LEVEL".into(),
            value: "PHB".into(),
            why: "the best NIC of some GPU is behind the CPU's host bridge; allow GPUDirect there, then compare against staging with a bandwidth test".into(),
        }),
        Some(_) => out.push(NcclSetting {
            name: "NCCL_NET_GDR_LEVEL".into(),
            value: "PXB".into(),
            why: "some GPU has no NIC on its NUMA node: keep NCCL staging through host memory there (the default) and fix the placement".into(),
        }),
        None => {}
    }
    out
}

#[cfg(test)]
mod tests {
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
    }
}
