//! The log report as a table for people.

use super::*;

fn ranks_text(r: &[u32]) -> String {
    match r {
        [] => "rank ?".to_string(),
        [one] => format!("rank {one}"),
        many => format!(
            "ranks {}",
            many.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

pub(super) fn table(r: &LogReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "gdr doctor nccl-log: {}", r.source);
    let hosts: BTreeSet<&str> = r
        .processes
        .iter()
        .map(|p| p.process.split([':', ' ']).next().unwrap_or(""))
        .collect();
    let _ = writeln!(
        out,
        "{} line(s), {} from NCCL; {} process(es) on {} host(s)",
        r.lines,
        r.nccl_lines,
        r.processes.len(),
        hosts.len()
    );
    if let Some(h) = &r.host_source {
        let _ = writeln!(out, "checked against the host view: {h}");
    }
    let _ = writeln!(out, "{}", headline(r));
    if r.processes_left_out > 0 {
        let _ = writeln!(out, "({} more process(es) not read)", r.processes_left_out);
    }
    for p in &r.processes {
        let _ = writeln!(out);
        process(&mut out, p);
    }
    out
}

/// The answer for the whole log, in one line.
fn headline(r: &LogReport) -> String {
    if r.net_connections == 0 {
        if r.processes.iter().any(|p| p.verdict == LogVerdict::Socket) {
            "GPUDirect RDMA: not used: NCCL uses TCP sockets".to_string()
        } else if r
            .processes
            .iter()
            .any(|p| p.verdict == LogVerdict::NoGdrdma)
        {
            "GPUDirect RDMA: not used: NCCL disabled it (the log has no network connection lines)"
                .to_string()
        } else {
            "GPUDirect RDMA: unknown: the log has no network connection".to_string()
        }
    } else if r.gdrdma_verified {
        format!(
            "GPUDirect RDMA: used on all {} network connection(s)",
            r.net_connections
        )
    } else if r.gdrdma_connections == 0 {
        format!(
            "GPUDirect RDMA: not used on any of {} network connection(s)",
            r.net_connections
        )
    } else {
        format!(
            "GPUDirect RDMA: used on {} of {} network connection(s)",
            r.gdrdma_connections, r.net_connections
        )
    }
}

/// One process's block.
fn process(out: &mut String, p: &ProcessReport) {
    let _ = writeln!(
        out,
        "{} ({}{})",
        ranks_text(&p.ranks),
        p.process,
        p.nranks.map(|n| format!(", {n} ranks")).unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "  NCCL version  {}",
        p.version.as_deref().unwrap_or("not in the log")
    );
    let _ = writeln!(
        out,
        "  network       {}",
        p.network.as_deref().unwrap_or("not in the log")
    );
    if !p.devices.is_empty() {
        let _ = writeln!(
            out,
            "  devices       {}{}{}",
            p.devices.join(" "),
            if p.relaxed_ordering { " [RO]" } else { "" },
            p.oob
                .as_deref()
                .map(|o| format!("; OOB {o}"))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(
        out,
        "  connections   {} network ({} GDRDMA: send {}/{}, receive {}/{}), {} intra-node",
        p.net_connections,
        p.gdrdma_connections,
        p.send.1,
        p.send.0,
        p.receive.1,
        p.receive.0,
        p.intra_node_channels
    );
    let _ = writeln!(out, "  verdict       {}", p.verdict.text());
    for x in &p.reasons {
        let _ = writeln!(out, "  because       {x}");
    }
    for x in &p.likely {
        let _ = writeln!(out, "  likely        {x}");
    }
    for x in &p.host {
        let _ = writeln!(out, "  host          {x}");
    }
    for x in &p.fixes {
        let _ = writeln!(out, "  fix           {x}");
    }
    for x in &p.notes {
        let _ = writeln!(out, "  note          {x}");
    }
    for x in p.warnings.iter().take(4) {
        let _ = writeln!(out, "  NCCL WARN     {x}");
    }
}
