//! Unit tests of the rail ranking.

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
        why.contains("known: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, and 984 more)"),
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
