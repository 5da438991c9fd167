//! The report as a table for people.

use super::{Finding, LocationRails, MemoryLocation, Rail, Report, Severity, VerdictKind};
use std::fmt::Write;

fn paint(s: &str, code: &str, color: bool) -> String {
    if color {
        format!("\x1b[{code}m{s}\x1b[0m")
    } else {
        s.to_string()
    }
}

fn severity_tag(s: Severity, color: bool) -> String {
    let text = format!("{:<7}", s.to_string());
    let code = match s {
        Severity::Ok => "32",
        Severity::Warn => "33",
        Severity::Fail => "1;31",
        Severity::Unknown => "35",
    };
    paint(&text, code, color)
}

fn verdict_text(k: VerdictKind, color: bool) -> String {
    let code = match k {
        VerdictKind::Usable => "32",
        VerdictKind::UsableButSlow => "33",
        VerdictKind::NotUsable => "1;31",
    };
    paint(&k.to_string(), code, color)
}

fn numa(n: Option<i32>) -> String {
    n.map_or("?".into(), |n| n.to_string())
}

fn finding(out: &mut String, f: &Finding, color: bool) {
    let _ = writeln!(
        out,
        "  {} {:<22} {}",
        severity_tag(f.severity, color),
        f.id,
        f.subject
    );
    let _ = writeln!(out, "          {}", f.message);
    if f.severity != Severity::Ok {
        for e in &f.evidence {
            let _ = writeln!(out, "          - {e}");
        }
    }
    if let Some(fix) = &f.fix {
        let _ = writeln!(out, "          fix: {fix}");
    }
}

fn rate(r: &Rail) -> String {
    r.rate_gbps.map_or("?".into(), |g| format!("{g} Gb/s"))
}

fn state(r: &Rail) -> &'static str {
    if r.active {
        "active"
    } else {
        "inactive"
    }
}

fn rails(out: &mut String, locations: &[LocationRails], color: bool) {
    let _ = writeln!(
        out,
        "\nRails (* = tier 0, the rails the engine stripes over; gdr_doctor::rank_rails)"
    );
    for l in locations {
        let gpu = matches!(
            l.location,
            MemoryLocation::Gpu { .. } | MemoryLocation::GpuPci(_)
        );
        if !gpu {
            let list: Vec<String> = l
                .rails
                .iter()
                .map(|x| {
                    let numa = match x.same_numa {
                        Some(true) => "same NUMA".to_string(),
                        _ => format!("NUMA {}", numa(x.nic_numa)),
                    };
                    format!(
                        "{}{}:{} (tier {}, {numa}, {}, {})",
                        if x.tier == 0 { "*" } else { "" },
                        x.nic,
                        x.port,
                        x.tier,
                        rate(x),
                        state(x)
                    )
                })
                .collect();
            let list = if list.is_empty() {
                "none".to_string()
            } else {
                list.join(", ")
            };
            let _ = writeln!(out, "  {}: {list}", l.label);
            continue;
        }
        let _ = writeln!(out, "  {}", l.label);
        let _ = writeln!(
            out,
            "    {:<4} {:<10} {:<5} {:<5} {:<4} {:<11} {:<8} verdict",
            "tier", "NIC", "port", "path", "NUMA", "rate", "state"
        );
        for x in &l.rails {
            let _ = writeln!(
                out,
                "  {} {:<4} {:<10} {:<5} {:<5} {:<4} {:<11} {:<8} {}",
                if x.tier == 0 { "*" } else { " " },
                x.tier,
                x.nic,
                x.port,
                x.path.map_or("-", |c| c.name()),
                numa(x.nic_numa),
                rate(x),
                state(x),
                x.verdict
                    .map_or("-".to_string(), |v| verdict_text(v, color))
            );
        }
    }
}

pub(crate) fn table(r: &Report, color: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "gdr doctor: {}", r.source);
    let usable = r
        .pairs
        .iter()
        .filter(|p| p.verdict.kind != VerdictKind::NotUsable)
        .count();
    let headline = if r.pairs.is_empty() {
        paint(
            &format!(
                "GPUDirect RDMA: not possible here ({} GPU(s), {} RDMA device(s), no pair)",
                r.gpus.len(),
                r.nics.len()
            ),
            "1;31",
            color,
        )
    } else if r.gpudirect_usable {
        paint(
            &format!(
                "GPUDirect RDMA: usable on {usable} of {} GPU-NIC pair(s)",
                r.pairs.len()
            ),
            "32",
            color,
        )
    } else {
        paint(
            &format!(
                "GPUDirect RDMA: not usable on any of {} GPU-NIC pair(s)",
                r.pairs.len()
            ),
            "1;31",
            color,
        )
    };
    let _ = writeln!(out, "{headline}");

    if !r.pairs.is_empty() {
        let _ = writeln!(out, "\nPairs (* = best NIC for the GPU)");
        let _ = writeln!(
            out,
            "  {:<14} {:<10} {:<5} {:<5} {:<9} verdict",
            "GPU", "NIC", "port", "path", "NUMA g/n"
        );
        for p in &r.pairs {
            let _ = writeln!(
                out,
                "{} {:<14} {:<10} {:<5} {:<5} {:<9} {}",
                if p.best { "*" } else { " " },
                p.gpu,
                p.nic,
                p.port.map_or("-".into(), |x| x.to_string()),
                p.path.map_or("-", |c| c.name()),
                format!("{}/{}", numa(p.gpu_numa), numa(p.nic_numa)),
                verdict_text(p.verdict.kind, color)
            );
            for why in &p.verdict.reasons {
                let _ = writeln!(out, "      because: {why}");
            }
            for u in &p.verdict.unverified {
                let _ = writeln!(out, "      unverified: {u}");
            }
        }
    }

    if !r.nics.is_empty() && !r.rails.is_empty() {
        rails(&mut out, &r.rails, color);
    }

    let mut all: Vec<&Finding> = r.all_findings().collect();
    all.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let _ = writeln!(out, "\nFindings (worst first)");
    for f in all {
        finding(&mut out, f, color);
    }

    if !r.nccl.is_empty() {
        let _ = writeln!(out, "\nRecommended NCCL settings for this host");
        for s in &r.nccl {
            let _ = writeln!(out, "  export {}={}", s.name, s.value);
            let _ = writeln!(out, "      # {}", s.why);
        }
    }
    out
}
