//! PCIe path classes between two PCI functions, from their real sysfs paths (NCCL's names).

use crate::topology::Snapshot;
use serde::{Deserialize, Serialize};
use std::fmt;

/// How far apart two PCI functions are, near to far (NCCL's and `nvidia-smi topo -m`'s names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PathClass {
    /// At most one PCIe switch (or bridge) between them.
    Pix,
    /// Several bridges, but not the CPU's host bridge.
    Pxb,
    /// Through the CPU's host bridge (different root ports of one root complex).
    Phb,
    /// Across root complexes or NUMA nodes (the CPU interconnect).
    Sys,
}

impl PathClass {
    /// The name NCCL uses (`PIX`, `PXB`, `PHB`, `SYS`).
    pub fn name(self) -> &'static str {
        match self {
            PathClass::Pix => "PIX",
            PathClass::Pxb => "PXB",
            PathClass::Phb => "PHB",
            PathClass::Sys => "SYS",
        }
    }

    /// Parse an NCCL level name. `LOC` (same device only) is returned as `Ok(None)`; numbers
    /// and unknown names are an `Err` with the text.
    pub fn parse_nccl_level(s: &str) -> Result<Option<PathClass>, String> {
        match s.trim().to_ascii_uppercase().as_str() {
            "LOC" => Ok(None),
            "PIX" => Ok(Some(PathClass::Pix)),
            "PXB" => Ok(Some(PathClass::Pxb)),
            "PHB" | "NODE" => Ok(Some(PathClass::Phb)),
            "SYS" => Ok(Some(PathClass::Sys)),
            other => Err(other.to_string()),
        }
    }
}

impl fmt::Display for PathClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The PCIe path between two functions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciPath {
    /// The class.
    pub class: PathClass,
    /// The deepest PCI function above both (`None`: they share only the root complex or not even
    /// that).
    pub common_ancestor: Option<String>,
    /// Bridges between them: from the first function up, then down to the second.
    pub bridges: Vec<String>,
    /// Why the class was chosen, for evidence.
    pub why: String,
}

/// The chain `[root complex, bdf, bdf, ...]` of a real sysfs path.
pub fn chain(path: &str) -> Option<Vec<String>> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let rc = comps.iter().rposition(|c| c.starts_with("pci"))?;
    let mut out = vec![comps[rc].to_string()];
    out.extend(
        comps[rc + 1..]
            .iter()
            .take_while(|c| c.len() == 12 && c.as_bytes()[4] == b':' && c.as_bytes()[10] == b'.')
            .map(|c| c.to_string()),
    );
    Some(out)
}

impl PciPath {
    /// Classifies the path between two PCI functions of a snapshot. `None` when either is
    /// missing, its sysfs path has no PCI root complex or no function below it, or both are the
    /// same function.
    pub fn between(snap: &Snapshot, a: &str, b: &str) -> Option<PciPath> {
        between(snap, a, b)
    }
}

fn between(snap: &Snapshot, a: &str, b: &str) -> Option<PciPath> {
    let da = snap.pci_device(a)?;
    let db = snap.pci_device(b)?;
    let ca = chain(&da.path)?;
    let cb = chain(&db.path)?;
    // Each chain must name a function below its root complex, and the two must differ (a
    // snapshot is input: a GPU listed at its NIC's address must not index out of bounds).
    if ca.len() < 2 || cb.len() < 2 || ca == cb {
        return None;
    }
    let common = ca.iter().zip(&cb).take_while(|(x, y)| x == y).count();
    if common >= ca.len() || common >= cb.len() {
        // One function lies on the other's path (a bridge and a device below it).
        return None;
    }
    let up: Vec<String> = ca[common.max(1)..ca.len() - 1]
        .iter()
        .rev()
        .cloned()
        .collect();
    let down: Vec<String> = cb[common.max(1)..cb.len() - 1].to_vec();
    let numa = match (da.numa_node, db.numa_node) {
        (Some(x), Some(y)) if x >= 0 && y >= 0 && x != y => Some((x, y)),
        _ => None,
    };
    let (mut class, ancestor, mut why) = if common == 0 {
        (
            PathClass::Sys,
            None,
            format!("different root complexes {} and {}", ca[0], cb[0]),
        )
    } else if common == 1 {
        (
            PathClass::Phb,
            None,
            format!("common parent is the host bridge of {}", ca[0]),
        )
    } else {
        let hops_a = ca.len() - common - 1;
        let hops_b = cb.len() - common - 1;
        let anc = ca[common - 1].clone();
        let class = if hops_a <= 1 && hops_b <= 1 {
            PathClass::Pix
        } else {
            PathClass::Pxb
        };
        let why = format!(
            "common parent {anc}, {} bridge(s) on the path",
            hops_a + hops_b + 1
        );
        (class, Some(anc), why)
    };
    let mut bridges = up;
    if let Some(anc) = &ancestor {
        bridges.push(anc.clone());
    }
    bridges.extend(down);
    if let Some((x, y)) = numa {
        class = PathClass::Sys;
        why = format!("NUMA node {x} vs {y}; {why}");
    }
    Some(PciPath {
        class,
        common_ancestor: ancestor,
        bridges,
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::PciDevice;

    fn snap(devs: &[(&str, &str, i32)]) -> Snapshot {
        let mut s = Snapshot::new("test");
        for (bdf, path, numa) in devs {
            s.pci.push(PciDevice {
                bdf: bdf.to_string(),
                path: path.to_string(),
                numa_node: Some(*numa),
                ..PciDevice::default()
            });
        }
        s
    }

    #[test]
    fn classes() {
        let s = snap(&[
            ("0000:03:00.0", "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", 0),
            ("0000:04:00.0", "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", 0),
            ("0000:07:00.0", "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0", 0),
            ("0000:41:00.0", "/sys/devices/pci0000:00/0000:00:03.0/0000:41:00.0", 0),
            ("0000:81:00.0", "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", 1),
            ("0000:82:00.0", "/sys/devices/pci0000:00/0000:00:05.0/0000:82:00.0", 1),
        ]);
        let p = PciPath::between(&s, "0000:03:00.0", "0000:04:00.0").unwrap();
        assert_eq!(p.class, PathClass::Pix);
        assert_eq!(p.common_ancestor.as_deref(), Some("0000:01:00.0"));
        assert_eq!(p.bridges, ["0000:02:00.0", "0000:01:00.0", "0000:02:01.0"]);
        assert_eq!(
            PciPath::between(&s, "0000:03:00.0", "0000:07:00.0")
                .unwrap()
                .class,
            PathClass::Pxb
        );
        let p = PciPath::between(&s, "0000:03:00.0", "0000:41:00.0").unwrap();
        assert_eq!(p.class, PathClass::Phb);
        assert_eq!(
            p.bridges,
            [
                "0000:02:00.0",
                "0000:01:00.0",
                "0000:00:01.0",
                "0000:00:03.0"
            ]
        );
        assert_eq!(
            PciPath::between(&s, "0000:03:00.0", "0000:81:00.0")
                .unwrap()
                .class,
            PathClass::Sys
        );
        // Same root complex but the platform puts them on different NUMA nodes.
        assert_eq!(
            PciPath::between(&s, "0000:03:00.0", "0000:82:00.0")
                .unwrap()
                .class,
            PathClass::Sys
        );
        assert!(PciPath::between(&s, "0000:03:00.0", "0000:99:00.0").is_none());
    }

    #[test]
    fn hostile_snapshot_paths_give_no_path_instead_of_a_panic() {
        let s = snap(&[
            ("0000:03:00.0", "/sys/devices/pci0000:00", 0),
            (
                "0000:04:00.0",
                "/sys/devices/pci0000:00/0000:00:01.0/0000:04:00.0",
                0,
            ),
            ("0000:00:01.0", "/sys/devices/pci0000:00/0000:00:01.0", 0),
        ]);
        // A function without a PCI component below its root complex.
        assert!(PciPath::between(&s, "0000:03:00.0", "0000:04:00.0").is_none());
        assert!(PciPath::between(&s, "0000:04:00.0", "0000:03:00.0").is_none());
        // The same function on both ends, and a bridge above the other end.
        assert!(PciPath::between(&s, "0000:04:00.0", "0000:04:00.0").is_none());
        assert!(PciPath::between(&s, "0000:00:01.0", "0000:04:00.0").is_none());
        assert!(PciPath::between(&s, "0000:04:00.0", "0000:00:01.0").is_none());
    }

    #[test]
    fn nccl_levels() {
        assert_eq!(PathClass::parse_nccl_level("pxb"), Ok(Some(PathClass::Pxb)));
        assert_eq!(PathClass::parse_nccl_level("LOC"), Ok(None));
        assert!(PathClass::parse_nccl_level("3").is_err());
        assert!(PathClass::Pix < PathClass::Sys);
    }
}
