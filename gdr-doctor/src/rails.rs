//! Rails: the RDMA ports ranked for one memory location, the one ranking both `gdr doctor` and
//! the transfer engine use ([`rank_rails`]; the key is documented there).
//!
//! ```
//! use gdr_doctor::{diagnose, rank_rails, MemoryLocation};
//! use gdr_doctor::topology::Snapshot;
//! let report = diagnose(&Snapshot::new("empty"));
//! assert!(rank_rails(&report, &MemoryLocation::Any, None).is_empty());
//! ```

use super::host::normalize_bdf;
use super::{
    diagnose, nccl_env_from_process, Finding, GpuSummary, NicSummary, PairReport, PathClass,
    Report, Severity, VerdictKind,
};
use crate::topology::{collect_with, CollectOptions};
use gdr::device::Selection;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::Path;

/// Where the memory of a transfer lives: what the rails are ranked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryLocation {
    /// GPU memory of the GPU with this CUDA ordinal ([`GpuSummary::cuda_ordinal`]). An ordinal
    /// the report does not know (CUDA not read, or no such GPU) is ranked as [`Self::Any`],
    /// and every rail's `why` says so.
    Gpu {
        /// CUDA device ordinal.
        ordinal: u32,
    },
    /// GPU memory of the GPU at this PCI address (`0000:07:00.0`; CUDA's `00000000:07:00.0`
    /// spelling and upper case are accepted). An unknown address is ranked as [`Self::Any`].
    GpuPci(String),
    /// Host memory on this NUMA node (a negative node, sysfs's "unknown", is [`Self::Any`]).
    Numa(i32),
    /// Host memory with no known NUMA node: no NUMA preference.
    Any,
}

impl fmt::Display for MemoryLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryLocation::Gpu { ordinal } => write!(f, "GPU {ordinal}"),
            MemoryLocation::GpuPci(bdf) => write!(f, "GPU {bdf}"),
            MemoryLocation::Numa(n) => write!(f, "host memory on NUMA node {n}"),
            MemoryLocation::Any => f.write_str("host memory"),
        }
    }
}

/// One rail (an RDMA device and port) as ranked for one memory location.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rail {
    /// RDMA device name, e.g. `mlx5_0`.
    pub nic: String,
    /// Port number (the device's first active port, else its first; 0: the device has no
    /// ports).
    pub port: u32,
    /// PCIe path class between the GPU and the NIC (GPU memory only; `None`: host memory, or
    /// unknown, e.g. a software device).
    pub path: Option<PathClass>,
    /// The pair's verdict (GPU memory only).
    pub verdict: Option<VerdictKind>,
    /// NUMA node of the NIC.
    pub nic_numa: Option<i32>,
    /// Whether the NIC is on the memory's NUMA node (`None`: either is unknown).
    pub same_numa: Option<bool>,
    /// Port rate as the kernel reports it, e.g. `200 Gb/sec (4X HDR)`.
    pub rate: Option<String>,
    /// Port rate in Gb/s, parsed from `rate` ([`parse_rate_gbps`]).
    pub rate_gbps: Option<f64>,
    /// Whether the port is ACTIVE.
    pub active: bool,
    /// Whether the engine may use the rail at all: an active port and, for GPU memory, a
    /// verdict other than not usable.
    pub usable: bool,
    /// 0: the rails the engine stripes over by default; each later distinct ranking key is the
    /// next tier. Never 0 for an unusable rail.
    pub tier: u32,
    /// Why the rail sits where it does, for people.
    pub why: String,
}

/// The ranked rails of one memory location, as the report lists them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocationRails {
    /// The memory location.
    pub location: MemoryLocation,
    /// For people: `GPU 0 (0000:07:00.0)`, `host memory on NUMA node 1`.
    pub label: String,
    /// [`rank_rails`] for `location`, with no selection.
    pub rails: Vec<Rail>,
}

/// The port rate in Gb/s of a sysfs rate string (`100 Gb/sec (4X EDR)`, `2.5 Gb/sec (1X SDR)`):
/// the leading decimal number, when what follows is `Gb` or nothing. Anything else (no number,
/// another unit, a number too large to be finite) is `None`.
pub fn parse_rate_gbps(rate: &str) -> Option<f64> {
    let t = rate.trim_start();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, rest) = t.split_at(end);
    let rest = rest.trim_start();
    if !(rest.is_empty() || rest.starts_with("Gb") || rest.starts_with("gb")) {
        return None;
    }
    num.parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r >= 0.0)
}

/// What kind of memory a ranking is for; decides the third key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gpu,
    Host,
}

/// A rail with what it is ranked by.
#[derive(Debug, Clone)]
struct Candidate {
    rail: Rail,
    /// 0 best; PCIe path class for GPU memory, NUMA match for host memory.
    place: u8,
    /// Index of the pair (GPU memory) or NIC (host memory) it was made from.
    origin: usize,
}

fn verdict_rank(v: Option<VerdictKind>) -> u8 {
    match v {
        None | Some(VerdictKind::Usable) => 0,
        Some(VerdictKind::UsableButSlow) => 1,
        Some(VerdictKind::NotUsable) => 2,
    }
}

/// Rates fastest first, unknown last.
fn rate_order(a: Option<f64>, b: Option<f64>) -> Ordering {
    match (a, b) {
        (Some(x), Some(y)) => y.total_cmp(&x),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// The ranking key (1-4 of [`rank_rails`]'s list): equal means one tier.
fn key_order(a: &Candidate, b: &Candidate) -> Ordering {
    (!a.rail.active)
        .cmp(&!b.rail.active)
        .then(verdict_rank(a.rail.verdict).cmp(&verdict_rank(b.rail.verdict)))
        .then(a.place.cmp(&b.place))
        .then(rate_order(a.rail.rate_gbps, b.rail.rate_gbps))
}

/// The full order: the key, then name, port and origin (a total order on any input).
fn full_order(a: &Candidate, b: &Candidate) -> Ordering {
    key_order(a, b)
        .then_with(|| a.rail.nic.cmp(&b.rail.nic))
        .then(a.rail.port.cmp(&b.rail.port))
        .then(a.origin.cmp(&b.origin))
}

/// Which part of the key puts `c` behind `best` (they differ in at least one).
fn behind(kind: Kind, best: &Candidate, c: &Candidate) -> &'static str {
    if best.rail.active != c.rail.active {
        "its port is not active"
    } else if verdict_rank(best.rail.verdict) != verdict_rank(c.rail.verdict) {
        "a worse verdict"
    } else if best.place != c.place {
        match kind {
            Kind::Gpu => "a longer PCIe path",
            Kind::Host => "a farther NUMA node",
        }
    } else if c.rail.rate_gbps.is_none() {
        "an unknown port rate"
    } else {
        "a slower port"
    }
}

/// What the rails of a report are made from, looked up in constant time (a report is input:
/// a hostile snapshot can hold many devices).
struct Facts<'a> {
    /// The first NIC summary of each name.
    nics: HashMap<&'a str, &'a NicSummary>,
    /// The `port.state` finding of each port by subject (`mlx5_0 port 1`); nic.rs writes one
    /// for every port: OK when ACTIVE, FAIL otherwise.
    states: HashMap<&'a str, &'a Finding>,
}

impl<'a> Facts<'a> {
    fn new(nics: &'a [NicSummary], findings: &'a [Finding]) -> Self {
        let mut by_name = HashMap::new();
        for n in nics {
            by_name.entry(n.name.as_str()).or_insert(n);
        }
        let mut states = HashMap::new();
        for f in findings.iter().filter(|f| f.id == "port.state") {
            // An OK finding wins: a device-level `port.state` (no ports, always FAIL) whose
            // device is named like another's port (`x port 1`) must not shadow that port.
            let e = states.entry(f.subject.as_str()).or_insert(f);
            if f.severity == Severity::Ok {
                *e = f;
            }
        }
        Facts {
            nics: by_name,
            states,
        }
    }

    /// Port, whether active, the state for people, rate text and rate of a NIC's port.
    fn port(
        &self,
        name: &str,
        port: Option<u32>,
    ) -> (u32, bool, String, Option<String>, Option<f64>) {
        let rate = self.nics.get(name).and_then(|n| n.rate.clone());
        let rate_gbps = rate.as_deref().and_then(parse_rate_gbps);
        let Some(port) = port else {
            return (0, false, "the device has no ports".into(), rate, rate_gbps);
        };
        let (active, state) = match self.states.get(format!("{name} port {port}").as_str()) {
            Some(f) if f.severity == Severity::Ok => (true, format!("port {port} active")),
            Some(f) => (false, format!("port {port}: {}", f.message)),
            None => (false, format!("port {port}: state not known")),
        };
        (port, active, state, rate, rate_gbps)
    }
}

fn rate_text(r: &Rail) -> String {
    match r.rate_gbps {
        Some(g) => format!("{g} Gb/s"),
        None => match &r.rate {
            Some(t) => format!("rate {t:?} not understood"),
            None => "rate unknown".into(),
        },
    }
}

/// The rails of one GPU (by PCI address), unranked, from the pairs.
fn gpu_candidates(pairs: &[PairReport], facts: &Facts<'_>, gpu: &str) -> Vec<Candidate> {
    pairs
        .iter()
        .enumerate()
        .filter(|(_, p)| p.gpu == gpu)
        .map(|(i, p)| {
            let (port, active, state, rate, rate_gbps) = facts.port(&p.nic, p.port);
            let kind = p.verdict.kind;
            let usable = active && kind != VerdictKind::NotUsable;
            let path_txt = match p.path {
                Some(c) => format!("{c} path to GPU {gpu}"),
                None => format!("PCIe path to GPU {gpu} unknown"),
            };
            let verdict_txt = match p.verdict.reasons.first() {
                Some(r) if p.verdict.reasons.len() > 1 => {
                    format!("{kind}: {r} (+{} more)", p.verdict.reasons.len() - 1)
                }
                Some(r) => format!("{kind}: {r}"),
                None => kind.to_string(),
            };
            let mut rail = Rail {
                nic: p.nic.clone(),
                port,
                path: p.path,
                verdict: Some(kind),
                nic_numa: p.nic_numa,
                same_numa: p.gpu_numa.zip(p.nic_numa).map(|(g, n)| g == n),
                rate,
                rate_gbps,
                active,
                usable,
                tier: 0,
                why: String::new(),
            };
            rail.why = format!("{path_txt}; {verdict_txt}; {state}; {}", rate_text(&rail));
            Candidate {
                place: p.path.map_or(4, |c| c as u8),
                rail,
                origin: i,
            }
        })
        .collect()
}

/// The rails of host memory on `numa` (`None`: no preference), unranked.
fn host_candidates(nics: &[NicSummary], facts: &Facts<'_>, numa: Option<i32>) -> Vec<Candidate> {
    nics.iter()
        .enumerate()
        .map(|(i, n)| {
            let (port, active, state, rate, rate_gbps) = facts.port(&n.name, n.port);
            let same_numa = numa.zip(n.numa_node).map(|(m, x)| m == x);
            let numa_txt = match (numa, n.numa_node, same_numa) {
                (Some(m), _, Some(true)) => format!("NIC on the memory's NUMA node {m}"),
                (Some(m), Some(x), _) => format!("NIC on NUMA node {x}, memory on {m}"),
                (Some(_), None, _) => "NIC's NUMA node unknown".to_string(),
                (None, _, _) => "no NUMA preference".to_string(),
            };
            let mut rail = Rail {
                nic: n.name.clone(),
                port,
                path: None,
                verdict: None,
                nic_numa: n.numa_node,
                same_numa,
                rate,
                rate_gbps,
                active,
                usable: active,
                tier: 0,
                why: String::new(),
            };
            rail.why = format!("{numa_txt}; {state}; {}", rate_text(&rail));
            Candidate {
                place: match same_numa {
                    Some(true) => 0,
                    None => 1,
                    Some(false) => 2,
                },
                rail,
                origin: i,
            }
        })
        .collect()
}

/// The index of the best pair of GPU `gpu` (the first rail of its ranking): what
/// [`GpuSummary::best_nic`] names.
pub(crate) fn best_pair(
    pairs: &[PairReport],
    nics: &[NicSummary],
    findings: &[Finding],
    gpu: &str,
) -> Option<usize> {
    gpu_candidates(pairs, &Facts::new(nics, findings), gpu)
        .into_iter()
        .min_by(full_order)
        .map(|c| c.origin)
}

/// Number the tiers of candidates sorted by [`full_order`]; no rail is dropped.
fn rank_sorted(mut c: Vec<Candidate>, kind: Kind) -> Vec<Candidate> {
    let Some(best) = c.first().cloned() else {
        return c;
    };
    let mut tier = 0u32;
    let mut prev: Option<Candidate> = None;
    for x in &mut c {
        if let Some(p) = &prev {
            if key_order(p, x) != Ordering::Equal {
                tier = tier.saturating_add(1);
            }
        }
        if !x.rail.usable && tier == 0 {
            // Unusable rails sort after usable ones, so all of them are behind this point.
            tier = 1;
        }
        x.rail.tier = tier;
        let tail = if tier == 0 {
            "tier 0: the engine stripes over it".to_string()
        } else if !x.rail.usable {
            format!("tier {tier}: not usable")
        } else {
            format!("tier {tier}: behind tier 0 on {}", behind(kind, &best, x))
        };
        x.rail.why = format!("{}; {tail}", x.rail.why);
        prev = Some(x.clone());
    }
    c
}

fn resolve_gpu<'a>(report: &'a Report, memory: &MemoryLocation) -> Result<&'a GpuSummary, String> {
    match memory {
        MemoryLocation::Gpu { ordinal } => {
            let want = i32::try_from(*ordinal).ok();
            report
                .gpus
                .iter()
                .find(|g| want.is_some() && g.cuda_ordinal == want)
                .ok_or_else(|| {
                    // Every rail repeats this: name a few ordinals, not all of a hostile report's.
                    let known: Vec<i32> =
                        report.gpus.iter().filter_map(|g| g.cuda_ordinal).collect();
                    let mut list: Vec<String> =
                        known.iter().take(16).map(|o| o.to_string()).collect();
                    if known.len() > 16 {
                        list.push(format!("and {} more", known.len() - 16));
                    }
                    format!(
                        "GPU ordinal {ordinal} is not in the report (CUDA ordinals known: {})",
                        if list.is_empty() {
                            "none, CUDA was not read".to_string()
                        } else {
                            list.join(", ")
                        }
                    )
                })
        }
        MemoryLocation::GpuPci(bdf) => {
            let want = normalize_bdf(bdf);
            report
                .gpus
                .iter()
                .find(|g| normalize_bdf(&g.bdf) == want)
                .ok_or_else(|| format!("no GPU at PCI address {bdf:?} in the report"))
        }
        _ => Err(String::new()),
    }
}

/// The rails for memory at `memory`, best first, with their tiers. Pure: reads nothing but
/// `report`.
///
/// A rail is an RDMA device at the port the doctor pairs it on (the first active port, else the
/// first: [`NicSummary::port`]). The ranking key, in order:
///
/// 1. port state: ACTIVE first;
/// 2. for GPU memory, the pair's verdict ([`VerdictKind`]: usable, usable but slow, not usable);
/// 3. for GPU memory the PCIe path class to the GPU (PIX, PXB, PHB, SYS, unknown last); for
///    host memory the NUMA match (the memory's node, unknown, another node);
/// 4. port rate, fastest first (unknown last; [`parse_rate_gbps`]);
///
/// then device name and port, for a stable order. Rails whose keys are equal form one tier;
/// tier 0, the best key's equals, is what the engine stripes over by default, and each later
/// distinct key is the next tier. A rail that is not usable (a port not ACTIVE, or for GPU
/// memory a verdict of not usable) has `usable: false` and is never tier 0, even when nothing
/// better exists (then there is no tier 0). The doctor's best NIC of a GPU
/// ([`GpuSummary::best_nic`], [`PairReport::best`]) is the first rail of that GPU's ranking:
/// both come from this code.
///
/// `selection` (the `NCCL_IB_HCA` syntax of [`Selection`]: `mlx5_0:1,mlx5_1:1`, `^mlx5_2`,
/// `=mlx5_1`) filters before ranking, so the tiers are numbered over what it leaves; when it
/// leaves nothing the result is empty (the caller decides what that means). A rail whose port
/// number is above 255 (no real RDMA port) never passes a selection.
///
/// A GPU the report does not know (a CUDA ordinal it lacks, CUDA not read, an unknown PCI
/// address) is ranked as host memory with no NUMA preference, and each rail's `why` starts by
/// saying so.
///
/// ```no_run
/// use gdr::device::Selection;
/// use gdr_doctor::{host_report, rank_rails, MemoryLocation};
/// // Collect and diagnose once (at agent start), then rank per memory location.
/// let report = host_report(std::path::Path::new("/"))?;
/// let config = Selection::parse("^mlx5_2")?;
/// let rails = rank_rails(&report, &MemoryLocation::Gpu { ordinal: 0 }, Some(&config));
/// let stripe: Vec<_> = rails.iter().filter(|r| r.tier == 0).collect();
/// for r in &rails {
///     println!("{}:{} tier {} ({})", r.nic, r.port, r.tier, r.why);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn rank_rails(
    report: &Report,
    memory: &MemoryLocation,
    selection: Option<&Selection>,
) -> Vec<Rail> {
    let facts = Facts::new(&report.nics, &report.findings);
    let (kind, mut cands, prefix) = match memory {
        MemoryLocation::Gpu { .. } | MemoryLocation::GpuPci(_) => match resolve_gpu(report, memory)
        {
            Ok(g) => (
                Kind::Gpu,
                gpu_candidates(&report.pairs, &facts, &g.bdf),
                None,
            ),
            Err(why) => (
                Kind::Host,
                host_candidates(&report.nics, &facts, None),
                Some(format!(
                    "{why}: ranked as host memory with no NUMA preference"
                )),
            ),
        },
        MemoryLocation::Numa(n) => (
            Kind::Host,
            host_candidates(&report.nics, &facts, Some(*n).filter(|n| *n >= 0)),
            None,
        ),
        MemoryLocation::Any => (
            Kind::Host,
            host_candidates(&report.nics, &facts, None),
            None,
        ),
    };
    if let Some(sel) = selection {
        cands.retain(|c| u8::try_from(c.rail.port).is_ok_and(|p| sel.allows(&c.rail.nic, p)));
    }
    cands.sort_by(full_order);
    rank_sorted(cands, kind)
        .into_iter()
        .map(|c| {
            let mut r = c.rail;
            if let Some(p) = &prefix {
                r.why = format!("{p}; {}", r.why);
            }
            r
        })
        .collect()
}

/// At most this many NUMA nodes get a host-memory entry in a report (the lowest ones): real
/// machines have a few, and a hostile snapshot must not make the report quadratic in its devices.
pub(crate) const MAX_HOST_LOCATIONS: usize = 64;

/// The locations the report lists rails for: every GPU (by CUDA ordinal when known, else by
/// PCI address), then host memory on every NUMA node of a GPU or NIC (or with no preference
/// when none is known).
pub(crate) fn for_report(report: &Report) -> Vec<LocationRails> {
    let mut out = Vec::new();
    for g in &report.gpus {
        let (location, label) = match g.cuda_ordinal.and_then(|o| u32::try_from(o).ok()) {
            Some(ordinal) => (
                MemoryLocation::Gpu { ordinal },
                format!("GPU {ordinal} ({})", g.bdf),
            ),
            None => (
                MemoryLocation::GpuPci(g.bdf.clone()),
                format!("GPU {}", g.bdf),
            ),
        };
        out.push(LocationRails {
            rails: rank_rails(report, &location, None),
            location,
            label,
        });
    }
    let nodes: BTreeSet<i32> = report
        .gpus
        .iter()
        .filter_map(|g| g.numa_node)
        .chain(report.nics.iter().filter_map(|n| n.numa_node))
        .collect();
    let hosts: Vec<MemoryLocation> = if nodes.is_empty() {
        vec![MemoryLocation::Any]
    } else {
        nodes
            .into_iter()
            .take(MAX_HOST_LOCATIONS)
            .map(MemoryLocation::Numa)
            .collect()
    };
    for location in hosts {
        out.push(LocationRails {
            rails: rank_rails(report, &location, None),
            label: location.to_string(),
            location,
        });
    }
    out
}

/// The doctor's report of the machine whose `/sys` and `/proc` lie below `root`, collected the
/// way `gdr doctor` collects it: for `/`, with the CUDA driver's facts and each RDMA device's
/// dma-buf probe ([`CollectOptions::live`]); below another root without them (so GPUs have no
/// CUDA ordinal there); with the process's NCCL variables either way.
///
/// The pair verdicts, and so the rails, take the process's NCCL variables into account as the
/// doctor does (a wrong `NCCL_IB_GID_INDEX` makes a RoCE pair not usable, a strict
/// `NCCL_NET_GDR_LEVEL` makes it slow). A caller that wants them left out collects with its
/// own options: `diagnose(&collect_with(root, opts)?)`, then [`rank_rails`].
///
/// Fails only when `root` is not a readable directory.
pub fn host_report(root: &Path) -> crate::Result<Report> {
    let mut opts = if root == Path::new("/") {
        CollectOptions::live()
    } else {
        CollectOptions::from_process_env()
    };
    opts.env.extend(nccl_env_from_process());
    Ok(diagnose(&collect_with(root, opts)?))
}

/// [`rank_rails`] on [`host_report`]`(root)`: the rails of this machine (`root` = `/`) for
/// `memory`. To rank several locations, call [`host_report`] once and [`rank_rails`] per
/// location.
pub fn rails_for_host(
    root: &Path,
    memory: &MemoryLocation,
    selection: Option<&Selection>,
) -> crate::Result<Vec<Rail>> {
    Ok(rank_rails(&host_report(root)?, memory, selection))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Verdict, REPORT_FORMAT};

    /// A NIC for [`report`]: name, NUMA node, port (`None`: no ports), rate, active.
    struct N(
        &'static str,
        Option<i32>,
        Option<u32>,
        Option<&'static str>,
        bool,
    );

    /// A report with one GPU (`0000:07:00.0`, CUDA ordinal 0, NUMA 0) paired with every NIC;
    /// `pair` gives each pair's path class and verdict.
    fn report(nics: &[N], pair: impl Fn(&str) -> (Option<PathClass>, VerdictKind)) -> Report {
        let gpu = "0000:07:00.0";
        let mut findings = Vec::new();
        let mut summaries = Vec::new();
        let mut pairs = Vec::new();
        for N(name, numa, port, rate, active) in nics {
            summaries.push(NicSummary {
                name: name.to_string(),
                bdf: None,
                numa_node: *numa,
                fw_ver: None,
                port: *port,
                link_layer: Some("InfiniBand".into()),
                rate: rate.map(String::from),
                roce_v2_gid_index: None,
            });
            if let Some(p) = port {
                let subject = format!("{name} port {p}");
                findings.push(if *active {
                    Finding::new("port.state", Severity::Ok, subject, "port active")
                } else {
                    Finding::new(
                        "port.state",
                        Severity::Fail,
                        subject,
                        "port not active (1: DOWN)",
                    )
                });
            }
            let (path, kind) = pair(name);
            pairs.push(PairReport {
                gpu: gpu.into(),
                nic: name.to_string(),
                port: *port,
                path,
                common_ancestor: None,
                bridges: Vec::new(),
                gpu_numa: Some(0),
                nic_numa: *numa,
                best: false,
                verdict: Verdict {
                    kind,
                    reasons: if kind == VerdictKind::Usable {
                        vec![]
                    } else {
                        vec![format!("{name} has a problem")]
                    },
                    unverified: vec![],
                },
                findings: vec![],
            });
        }
        Report {
            format: REPORT_FORMAT,
            source: "test".into(),
            gpudirect_usable: true,
            gpus: vec![GpuSummary {
                bdf: gpu.into(),
                name: "GPU".into(),
                cuda_ordinal: Some(0),
                numa_node: Some(0),
                best_nic: None,
            }],
            nics: summaries,
            pairs,
            findings,
            nccl: vec![],
            rails: vec![],
        }
    }

    fn pix(_: &str) -> (Option<PathClass>, VerdictKind) {
        (Some(PathClass::Pix), VerdictKind::Usable)
    }

    const HDR: Option<&str> = Some("200 Gb/sec (4X HDR)");
    const EDR: Option<&str> = Some("100 Gb/sec (4X EDR)");
    const GPU0: MemoryLocation = MemoryLocation::Gpu { ordinal: 0 };

    fn names(rails: &[Rail]) -> Vec<(String, u32)> {
        rails
            .iter()
            .map(|r| (format!("{}:{}", r.nic, r.port), r.tier))
            .collect()
    }

    fn sel(s: &str) -> Selection {
        Selection::parse(s).unwrap()
    }

    #[test]
    fn ties_form_one_tier_and_each_later_key_is_the_next() {
        let r = report(
            &[
                N("mlx5_3", Some(1), Some(1), HDR, true),
                N("mlx5_1", Some(0), Some(1), HDR, true),
                N("mlx5_0", Some(0), Some(1), HDR, true),
                N("mlx5_2", Some(0), Some(1), EDR, true),
            ],
            |n| match n {
                "mlx5_3" => (Some(PathClass::Sys), VerdictKind::Usable),
                _ => (Some(PathClass::Pix), VerdictKind::Usable),
            },
        );
        let rails = rank_rails(&r, &GPU0, None);
        assert_eq!(
            names(&rails),
            [
                ("mlx5_0:1".to_string(), 0),
                ("mlx5_1:1".to_string(), 0),
                ("mlx5_2:1".to_string(), 1),
                ("mlx5_3:1".to_string(), 2),
            ],
            "{rails:#?}"
        );
        assert!(rails.iter().all(|r| r.usable));
        assert!(
            rails[0].why.contains("tier 0: the engine stripes over it"),
            "{}",
            rails[0].why
        );
        assert!(rails[2].why.contains("a slower port"), "{}", rails[2].why);
        assert!(
            rails[3].why.contains("a longer PCIe path"),
            "{}",
            rails[3].why
        );
        assert_eq!(rails[0].rate_gbps, Some(200.0));
        assert_eq!(rails[0].same_numa, Some(true));
        assert_eq!(rails[3].same_numa, Some(false));
    }

    #[test]
    fn the_verdict_comes_before_the_path_and_not_usable_is_never_tier_0() {
        let r = report(
            &[
                N("mlx5_0", Some(0), Some(1), HDR, true),
                N("mlx5_1", Some(1), Some(1), EDR, true),
                N("mlx5_2", Some(0), Some(1), HDR, true),
            ],
            |n| match n {
                "mlx5_0" => (Some(PathClass::Pix), VerdictKind::UsableButSlow),
                "mlx5_1" => (Some(PathClass::Sys), VerdictKind::Usable),
                _ => (Some(PathClass::Pix), VerdictKind::NotUsable),
            },
        );
        let rails = rank_rails(&r, &GPU0, None);
        assert_eq!(
            names(&rails),
            [
                ("mlx5_1:1".to_string(), 0),
                ("mlx5_0:1".to_string(), 1),
                ("mlx5_2:1".to_string(), 2),
            ]
        );
        assert!(!rails[2].usable);
        assert!(
            rails[2].why.contains("not usable: mlx5_2 has a problem"),
            "{}",
            rails[2].why
        );
        // Only unusable rails: none is tier 0, yet they are still listed, best first.
        let r = report(&[N("mlx5_0", Some(0), Some(1), HDR, true)], |_| {
            (Some(PathClass::Pix), VerdictKind::NotUsable)
        });
        let rails = rank_rails(&r, &GPU0, None);
        assert_eq!(names(&rails), [("mlx5_0:1".to_string(), 1)]);
        assert!(!rails[0].usable);
    }

    #[test]
    fn an_inactive_port_is_never_tier_0() {
        // The inactive one is faster and nearer in every other way.
        let r = report(
            &[
                N("mlx5_0", Some(0), Some(1), HDR, false),
                N("mlx5_1", Some(1), Some(1), EDR, true),
            ],
            pix,
        );
        for loc in [GPU0, MemoryLocation::Numa(0), MemoryLocation::Any] {
            let rails = rank_rails(&r, &loc, None);
            assert_eq!(
                names(&rails),
                [("mlx5_1:1".to_string(), 0), ("mlx5_0:1".to_string(), 1)],
                "{loc}"
            );
            assert!(!rails[1].active && !rails[1].usable, "{loc}");
            assert!(
                rails[1].why.contains("port not active (1: DOWN)"),
                "{}",
                rails[1].why
            );
        }
        // Alone, it is still tier 1; a device without ports is port 0, inactive.
        let r = report(
            &[
                N("mlx5_0", Some(0), Some(1), HDR, false),
                N("mlx5_9", Some(0), None, None, true),
            ],
            pix,
        );
        for loc in [GPU0, MemoryLocation::Numa(0)] {
            let rails = rank_rails(&r, &loc, None);
            assert_eq!(rails.len(), 2);
            assert!(
                rails.iter().all(|x| x.tier >= 1 && !x.usable && !x.active),
                "{rails:#?}"
            );
            let none = rails.iter().find(|x| x.nic == "mlx5_9").unwrap();
            assert_eq!(none.port, 0);
            assert!(none.why.contains("the device has no ports"), "{}", none.why);
        }
    }

    #[test]
    fn host_memory_prefers_its_numa_node_and_unknown_numa_ties() {
        let r = report(
            &[
                N("mlx5_0", Some(0), Some(1), HDR, true),
                N("mlx5_1", Some(1), Some(1), HDR, true),
                N("rxe0", None, Some(1), HDR, true),
                N("mlx5_2", Some(1), Some(1), EDR, true),
            ],
            pix,
        );
        let rails = rank_rails(&r, &MemoryLocation::Numa(1), None);
        assert_eq!(
            names(&rails),
            [
                ("mlx5_1:1".to_string(), 0),
                ("mlx5_2:1".to_string(), 1),
                ("rxe0:1".to_string(), 2),
                ("mlx5_0:1".to_string(), 3),
            ]
        );
        assert_eq!(rails[0].same_numa, Some(true));
        assert_eq!(rails[2].same_numa, None);
        assert_eq!(rails[3].same_numa, Some(false));
        assert!(
            rails[3].why.contains("NIC on NUMA node 0, memory on 1"),
            "{}",
            rails[3].why
        );
        assert!(rails[1].why.contains("a slower port"), "{}", rails[1].why);
        assert!(
            rails[3].why.contains("a farther NUMA node"),
            "{}",
            rails[3].why
        );
        assert!(rails
            .iter()
            .all(|x| x.path.is_none() && x.verdict.is_none()));
        // No preference (Any, or sysfs's -1): NUMA ties, the rate decides.
        for loc in [MemoryLocation::Any, MemoryLocation::Numa(-1)] {
            let rails = rank_rails(&r, &loc, None);
            assert_eq!(
                names(&rails),
                [
                    ("mlx5_0:1".to_string(), 0),
                    ("mlx5_1:1".to_string(), 0),
                    ("rxe0:1".to_string(), 0),
                    ("mlx5_2:1".to_string(), 1),
                ],
                "{loc}"
            );
            assert!(rails.iter().all(|x| x.same_numa.is_none()));
        }
    }

    #[test]
    fn a_selection_filters_before_ranking() {
        let r = report(
            &[
                N("mlx5_0", Some(0), Some(1), HDR, true),
                N("mlx5_1", Some(0), Some(1), EDR, true),
                N("mlx5_10", Some(0), Some(1), HDR, true),
                N("mlx5_2", Some(0), Some(2), HDR, true),
            ],
            pix,
        );
        let pick = |s: &str| names(&rank_rails(&r, &GPU0, Some(&sel(s))));
        assert_eq!(
            pick("=mlx5_0:1,mlx5_1:1"),
            [("mlx5_0:1".to_string(), 0), ("mlx5_1:1".to_string(), 1)],
            "an override: the tiers are renumbered over what is left"
        );
        assert_eq!(
            pick("mlx5_0:1,mlx5_1:1"),
            [
                ("mlx5_0:1".to_string(), 0),
                ("mlx5_10:1".to_string(), 0),
                ("mlx5_1:1".to_string(), 1)
            ],
            "names are prefixes, as in NCCL: mlx5_1 matches mlx5_10"
        );
        assert_eq!(
            pick("=mlx5_1:1"),
            [("mlx5_1:1".to_string(), 0)],
            "a slower rail alone is tier 0"
        );
        assert_eq!(
            pick("^mlx5_2"),
            [
                ("mlx5_0:1".to_string(), 0),
                ("mlx5_10:1".to_string(), 0),
                ("mlx5_1:1".to_string(), 1)
            ]
        );
        assert_eq!(
            pick("mlx5_1"),
            [("mlx5_10:1".to_string(), 0), ("mlx5_1:1".to_string(), 1)],
            "a prefix, as NCCL"
        );
        assert_eq!(pick("=mlx5_1"), [("mlx5_1:1".to_string(), 0)], "exact");
        assert_eq!(pick("mlx5_2:1"), [], "mlx5_2 is paired on port 2");
        assert_eq!(pick("mlx5_2:2"), [("mlx5_2:2".to_string(), 0)]);
        assert_eq!(pick("mlx5,^mlx5_0,^mlx5_1"), [("mlx5_2:2".to_string(), 0)]);
        assert_eq!(
            pick(""),
            names(&rank_rails(&r, &GPU0, None)),
            "empty list: all"
        );
        for loc in [GPU0, MemoryLocation::Numa(0), MemoryLocation::Any] {
            assert!(
                rank_rails(&r, &loc, Some(&sel("^mlx5"))).is_empty(),
                "{loc}"
            );
            assert!(rank_rails(&r, &loc, Some(&sel("rxe0"))).is_empty(), "{loc}");
        }
    }

    #[test]
    fn an_unknown_gpu_is_ranked_as_host_memory_and_says_so() {
        let r = report(
            &[
                N("mlx5_0", Some(1), Some(1), HDR, true),
                N("mlx5_1", Some(0), Some(1), EDR, true),
            ],
            |n| match n {
                "mlx5_0" => (Some(PathClass::Sys), VerdictKind::UsableButSlow),
                _ => (Some(PathClass::Pix), VerdictKind::Usable),
            },
        );
        let as_gpu = rank_rails(&r, &GPU0, None);
        assert_eq!(as_gpu[0].nic, "mlx5_1");
        for loc in [
            MemoryLocation::Gpu { ordinal: 7 },
            MemoryLocation::Gpu { ordinal: u32::MAX },
            MemoryLocation::GpuPci("0000:99:00.0".into()),
        ] {
            let rails = rank_rails(&r, &loc, None);
            assert_eq!(
                names(&rails),
                [("mlx5_0:1".to_string(), 0), ("mlx5_1:1".to_string(), 1)],
                "{loc}: host ranking, the faster port first"
            );
            for x in &rails {
                assert!(
                    x.why
                        .contains("ranked as host memory with no NUMA preference"),
                    "{loc}: {}",
                    x.why
                );
                assert!(x.path.is_none() && x.verdict.is_none());
            }
        }
        let why = &rank_rails(&r, &MemoryLocation::Gpu { ordinal: 7 }, None)[0].why;
        assert!(
            why.starts_with("GPU ordinal 7 is not in the report (CUDA ordinals known: 0)"),
            "{why}"
        );
        let mut no_cuda = r.clone();
        no_cuda.gpus[0].cuda_ordinal = None;
        let why = &rank_rails(&no_cuda, &GPU0, None)[0].why;
        assert!(why.contains("none, CUDA was not read"), "{why}");
        // Many GPUs: a few ordinals are named, not all.
        let mut many = r.clone();
        many.gpus = (0..1000)
            .map(|o| GpuSummary {
                bdf: format!("0000:{:02x}:{:02x}.0", o / 32, o % 32),
                cuda_ordinal: Some(o),
                ..r.gpus[0].clone()
            })
            .collect();
        let why = &rank_rails(&many, &MemoryLocation::Gpu { ordinal: 5000 }, None)[0].why;
        assert!(
            why.contains(
                "known: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, and 984 more)"
            ),
            "{why}"
        );
        // CUDA's spelling of the address, in upper case, finds the GPU.
        for bdf in ["00000000:07:00.0", "0000:07:00.0", " 0000:07:00.0 "] {
            let rails = rank_rails(&no_cuda, &MemoryLocation::GpuPci(bdf.into()), None);
            assert_eq!(rails[0].nic, "mlx5_1", "{bdf}");
            assert_eq!(rails[0].path, Some(PathClass::Pix), "{bdf}");
        }
    }

    #[test]
    fn a_report_lists_at_most_64_numa_nodes_of_host_memory() {
        let nics: Vec<N> = (0..200)
            .map(|i| {
                N(
                    Box::leak(format!("mlx5_{i}").into_boxed_str()),
                    Some(i),
                    Some(1),
                    HDR,
                    true,
                )
            })
            .collect();
        let r = report(&nics, pix);
        let l = for_report(&r);
        assert_eq!(l.len(), 1 + MAX_HOST_LOCATIONS);
        assert_eq!(l[0].location, GPU0);
        assert_eq!(l[0].rails.len(), 200);
        assert_eq!(l[1].location, MemoryLocation::Numa(0));
        assert_eq!(l[1].rails[0].nic, "mlx5_0", "its own node's NIC first");
        assert_eq!(l[1].rails[0].tier, 0);
        assert!(l[1].rails[1..].iter().all(|x| x.tier == 1));
        assert_eq!(l[MAX_HOST_LOCATIONS].location, MemoryLocation::Numa(63));
    }

    #[test]
    fn a_device_named_like_a_port_does_not_shadow_that_port() {
        let mut r = report(&[N("x", Some(0), Some(1), HDR, true)], pix);
        // What nic.rs writes for a device `x port 1` without ports, before x's own finding.
        r.findings.insert(
            0,
            Finding::new(
                "port.state",
                Severity::Fail,
                "x port 1",
                "device has no ports",
            ),
        );
        for loc in [GPU0, MemoryLocation::Any] {
            let rails = rank_rails(&r, &loc, None);
            assert!(rails[0].active && rails[0].tier == 0, "{loc}: {rails:#?}");
        }
    }

    #[test]
    fn best_pair_is_the_first_rail() {
        let r = report(
            &[
                N("mlx5_0", Some(0), Some(1), EDR, true),
                N("mlx5_1", Some(0), Some(1), HDR, true),
                N("mlx5_2", Some(0), Some(1), HDR, false),
            ],
            pix,
        );
        let best = best_pair(&r.pairs, &r.nics, &r.findings, "0000:07:00.0").unwrap();
        assert_eq!(r.pairs[best].nic, "mlx5_1");
        assert_eq!(rank_rails(&r, &GPU0, None)[0].nic, "mlx5_1");
        assert_eq!(
            best_pair(&r.pairs, &r.nics, &r.findings, "0000:99:00.0"),
            None
        );
    }

    #[test]
    fn rate_strings_as_the_kernel_writes_them() {
        for (s, want) in [
            ("100 Gb/sec (4X EDR)", Some(100.0)),
            ("10 Gb/sec (1X QDR)", Some(10.0)),
            ("2.5 Gb/sec (1X SDR)", Some(2.5)),
            ("56 Gb/sec (4X FDR)", Some(56.0)),
            ("400 Gb/sec (4X NDR)", Some(400.0)),
            ("  25 Gb/sec", Some(25.0)),
            ("200", Some(200.0)),
            ("200Gb/s", Some(200.0)),
        ] {
            assert_eq!(parse_rate_gbps(s), want, "{s:?}");
        }
    }

    #[test]
    fn hostile_rate_strings_never_panic_and_never_rank_as_numbers() {
        let huge = "9".repeat(400);
        let long = "1".repeat(100_000);
        for s in [
            "",
            " ",
            "NaN Gb/sec",
            "nan",
            "inf Gb/sec",
            "-inf",
            "-100 Gb/sec",
            "+100 Gb/sec",
            "1e3 Gb/sec",
            "1.2.3 Gb/sec",
            ".",
            "..",
            "100 Mb/sec",
            "Unknown",
            "ü Gb/sec",
            "١٠٠ Gb/sec",
            "\0",
            huge.as_str(),
        ] {
            assert_eq!(parse_rate_gbps(s), None, "{s:?}");
        }
        assert_eq!(parse_rate_gbps(&long), None, "10^100000 is not finite");
        assert_eq!(parse_rate_gbps("0 Gb/sec"), Some(0.0));
        // Ranking on such rates and odd ports: a total order, unknown rates last.
        let r = report(
            &[
                N("a", Some(0), Some(1), Some("NaN Gb/sec"), true),
                N("b", Some(0), Some(u32::MAX), Some("inf"), true),
                N("c", Some(0), Some(1), Some("1.5 Gb/sec"), true),
                N("d", None, Some(256), Some(""), true),
                N("", Some(-5), Some(1), None, true),
            ],
            |_| (None, VerdictKind::Usable),
        );
        for loc in [
            GPU0,
            MemoryLocation::Numa(0),
            MemoryLocation::Any,
            MemoryLocation::Numa(i32::MIN),
        ] {
            let rails = rank_rails(&r, &loc, None);
            assert_eq!(rails.len(), 5, "{loc}");
            assert_eq!(rails[0].nic, "c", "{loc}: the only known rate first");
            assert_eq!(rails[0].tier, 0);
            assert!(
                rails[1..]
                    .iter()
                    .all(|x| x.rate_gbps.is_none() && x.tier >= 1),
                "{loc}"
            );
            assert!(
                rails[1].why.contains("an unknown port rate"),
                "{}",
                rails[1].why
            );
            // Ports above 255 are not RDMA ports: no selection lets them through.
            let kept = rank_rails(&r, &loc, Some(&sel("^c")));
            assert!(kept.iter().all(|x| x.port <= 255), "{loc}: {kept:#?}");
            assert_eq!(kept.len(), 2, "{loc}");
        }
    }
}
