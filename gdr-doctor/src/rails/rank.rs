//! The ranking key and its tiers ([`rank_rails`]): the candidate rails of a GPU or of host
//! memory, ordered.

use super::*;

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
