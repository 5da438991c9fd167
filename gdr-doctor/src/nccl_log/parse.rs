//! Reading the lines NCCL prints into an [`NcclLog`].

use super::*;

/// `host:pid:tid [dev]` before the marker, if there.
pub(super) fn prefix(before: &str) -> (String, String, Option<u32>) {
    let toks: Vec<&str> = before.split_whitespace().collect();
    for i in (0..toks.len()).rev() {
        let t = toks[i];
        let Some(inner) = t.strip_prefix('[').and_then(|t| t.strip_suffix(']')) else {
            continue;
        };
        let Ok(dev) = inner.parse::<u32>() else {
            continue;
        };
        if i == 0 {
            return (String::new(), String::new(), Some(dev));
        }
        let id = toks[i - 1];
        let mut parts = id.rsplitn(3, ':');
        let _tid = parts.next();
        let pid = parts.next();
        let rest = parts.next();
        return match (pid, rest) {
            (Some(pid), Some(rest)) => {
                let host = rest.rsplit(':').next().unwrap_or("").to_string();
                (host, pid.to_string(), Some(dev))
            }
            _ => (String::new(), String::new(), Some(dev)),
        };
    }
    (String::new(), String::new(), None)
}

/// The version token after `NCCL version` (`2.7.6+cuda11.1`), if it starts with a digit.
pub(super) fn version_after(text: &str) -> Option<String> {
    let at = text.find("NCCL version")?;
    let rest = text[at + "NCCL version".len()..].trim_start_matches([':', ' ']);
    let tok: String = rest
        .split_whitespace()
        .next()?
        .trim_end_matches([',', '.', ';'])
        .chars()
        .take(64)
        .collect();
    tok.chars()
        .next()
        .filter(char::is_ascii_digit)
        .map(|_| tok.clone())
}

fn num(s: &str) -> Option<u32> {
    s.trim().parse().ok()
}

/// `Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA` (and `Ring 00 : ...`, `Channel 01 :
/// ...` of older NCCL). `Ok(None)`: a channel line through an intra-node transport; `Err`: not a
/// connection line.
pub(super) fn channel(msg: &str) -> Result<Option<NetChannel>, ()> {
    let rest = msg
        .strip_prefix("Channel ")
        .or_else(|| msg.strip_prefix("Ring "))
        .ok_or(())?;
    let (head, via) = rest.split_once(" via ").ok_or(())?;
    let (chan, peers) = head.split_once(" : ").ok_or(())?;
    let (c, conn) = match chan.trim().split_once('/') {
        Some((c, k)) => (num(c).ok_or(())?, Some(num(k).ok_or(())?)),
        None => (num(chan).ok_or(())?, None),
    };
    let toks: Vec<&str> = peers.split_whitespace().collect();
    let rank = |t: &str| t.split('[').next().and_then(num);
    let (from, to, dir) = match toks.as_slice() {
        [a, "->", b, d] => (
            rank(a).ok_or(())?,
            rank(b).ok_or(())?,
            match *d {
                "[send]" => Some(Direction::Send),
                "[receive]" => Some(Direction::Receive),
                _ => return Err(()),
            },
        ),
        [a, "->", b] => (rank(a).ok_or(())?, rank(b).ok_or(())?, None),
        _ => return Err(()),
    };
    let path = via.split_whitespace().next().ok_or(())?;
    let Some(net) = path.strip_prefix("NET/") else {
        return Ok(None);
    };
    let mut parts = net.split('/');
    let name = parts.next().filter(|n| !n.is_empty()).ok_or(())?;
    let devtok = parts.next().ok_or(())?;
    let (dev, proxy) = match devtok.split_once('(') {
        Some((d, p)) => (
            num(d).ok_or(())?,
            Some(num(p.trim_end_matches(')')).ok_or(())?),
        ),
        None => (num(devtok).ok_or(())?, None),
    };
    let gdrdma = parts.any(|p| p == "GDRDMA");
    Ok(Some(NetChannel {
        channel: c,
        conn,
        from,
        to,
        direction: dir.ok_or(())?,
        net: name.chars().take(64).collect(),
        dev,
        proxy,
        gdrdma,
    }))
}

/// `[0]mlx5_0:1/RoCE`.
fn net_device(t: &str) -> Option<NetDevice> {
    let rest = t.strip_prefix('[')?;
    let (idx, rest) = rest.split_once(']')?;
    let (name_port, link) = rest.split_once('/')?;
    let (name, port) = match name_port.split_once(':') {
        Some((n, p)) => (n, num(p)),
        None => (name_port, None),
    };
    Some(NetDevice {
        index: num(idx)?,
        name: name.chars().take(64).collect(),
        port,
        link: link.chars().take(32).collect(),
    })
}

/// `GPU Direct RDMA Disabled for GPU 42000 / HCA 0 (distance 6 > 4)`.
pub(super) fn distance(msg: &str) -> Option<GdrDistance> {
    let rest = msg.strip_prefix("GPU Direct RDMA ")?;
    let (state, rest) = rest.split_once(" for GPU ")?;
    let enabled = match state {
        "Enabled" => true,
        "Disabled" => false,
        _ => return None,
    };
    let (gpu, rest) = rest.split_once(" / HCA ")?;
    let (hca, rest) = rest.split_once(" (distance ")?;
    let inner = rest.split(')').next()?;
    let mut t = inner.split_whitespace();
    let d = num(t.next()?)?;
    let _op = t.next()?;
    let l = num(t.next()?.trim_end_matches(','))?;
    Some(GdrDistance {
        gpu: gpu.trim().chars().take(32).collect(),
        hca: hca.trim().chars().take(32).collect(),
        distance: d,
        limit: l,
        enabled,
    })
}

/// Read an NCCL log. Unknown lines are ignored; input without a single NCCL line is
/// [`Error::NotAnNcclLog`].
pub fn parse(text: &str, source: &str) -> crate::Result<NcclLog> {
    let mut log = NcclLog {
        source: source.to_string(),
        lines: 0,
        nccl_lines: 0,
        processes: Vec::new(),
        processes_left_out: 0,
        unattributed_versions: Vec::new(),
    };
    let mut index: BTreeMap<(String, String, Option<u32>), usize> = BTreeMap::new();
    // Per process, the connections already kept.
    let mut seen: Vec<BTreeSet<ChannelKey>> = Vec::new();
    let mut left_out: BTreeSet<(String, String, Option<u32>)> = BTreeSet::new();
    for line in text.lines() {
        log.lines += 1;
        if line.len() > MAX_LINE {
            continue;
        }
        let marker = ["NCCL INFO", "NCCL WARN"]
            .iter()
            .filter_map(|m| line.find(m).map(|at| (at, *m)))
            .min();
        let Some((at, m)) = marker else {
            if let Some(v) = version_after(line) {
                log.nccl_lines += 1;
                push_capped(&mut log.unattributed_versions, v);
            }
            continue;
        };
        log.nccl_lines += 1;
        let (host, pid, dev) = prefix(&line[..at]);
        let key: (String, String, Option<u32>) = (
            host.chars().take(256).collect(),
            pid.chars().take(32).collect(),
            dev,
        );
        let msg = line[at + m.len()..].trim();
        let i = match index.get(&key) {
            Some(i) => *i,
            None if log.processes.len() < MAX_PROCESSES => {
                log.processes.push(LogProcess {
                    host: key.0.clone(),
                    pid: key.1.clone(),
                    cuda_dev: key.2,
                    ..LogProcess::default()
                });
                seen.push(BTreeSet::new());
                index.insert(key, log.processes.len() - 1);
                log.processes.len() - 1
            }
            None => {
                if left_out.len() < MAX_PROCESSES {
                    left_out.insert(key);
                }
                continue;
            }
        };
        let p = &mut log.processes[i];
        if m == "NCCL WARN" {
            if p.warnings.len() < 16 {
                push_capped(&mut p.warnings, msg.chars().take(300).collect());
            }
            continue;
        }
        read_info(p, &mut seen[i], msg);
    }
    log.processes_left_out = left_out.len();
    if log.nccl_lines == 0 {
        return Err(Error::NotAnNcclLog {
            input: source.to_string(),
            lines: log.lines,
            hint: Hint::new("run the job with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,ENV,NET for the reasons) and give gdr the output of every rank, e.g. NCCL_DEBUG_FILE=/tmp/nccl.%h.%p"),
        });
    }
    Ok(log)
}

/// What makes two connection lines the same connection.
type ChannelKey = (u32, Option<u32>, u32, u32, Direction);

/// One `NCCL INFO` message of process `p`.
fn read_info(p: &mut LogProcess, seen: &mut BTreeSet<ChannelKey>, msg: &str) {
    if let Some(v) = version_after(msg).filter(|_| msg.starts_with("NCCL version")) {
        p.version = Some(v);
    } else if let Some(rest) = msg.strip_prefix("Using network ") {
        p.network = Some(rest.trim().chars().take(64).collect());
    } else if let Some(ch) = msg
        .strip_prefix("Channel ")
        .or_else(|| msg.strip_prefix("Ring "))
        .map(|_| channel(msg))
    {
        match ch {
            Ok(Some(c)) => record_channel(p, seen, c),
            Ok(None) => p.intra_node_channels = p.intra_node_channels.saturating_add(1),
            Err(()) => {}
        }
    } else if let Some(d) = distance(msg) {
        push_capped(&mut p.distance, d);
    } else if msg.starts_with("NET/") && msg.contains("GPU Direct RDMA ") {
        if let Some(h) = hca_gdr(msg) {
            push_capped(&mut p.hca_gdr, h);
        }
    } else if msg.starts_with("NET/IB") && msg.contains("No device found") {
        p.ib_no_device = true;
    } else if msg.starts_with("NET/IB") && msg.contains("Using") {
        read_ib_devices(p, msg);
    } else if msg.starts_with("NET/Socket") && msg.contains("Using") {
        for t in msg.split_whitespace().filter(|t| t.starts_with('[')) {
            push_capped(&mut p.socket_interfaces, t.chars().take(128).collect());
        }
    } else if let Some(rest) = msg
        .strip_prefix("NET/Plugin: Loaded net plugin ")
        .or_else(|| msg.strip_prefix("NET/Plugin : Loaded net plugin "))
        .or_else(|| msg.strip_prefix("P2P plugin "))
    {
        p.plugin = rest
            .split_whitespace()
            .next()
            .map(|s| s.chars().take(64).collect());
    } else if msg.starts_with("NET/Plugin")
        && (msg.contains("No plugin found") || msg.contains("Using internal"))
    {
        p.internal_plugin = true;
    } else if msg.starts_with("DMA-BUF is available") {
        p.dmabuf_available = true;
    } else if msg.starts_with("NCCL_") && msg.contains(" set ") && msg.contains("to ") {
        read_variable(p, msg);
    } else if msg.contains(" rank ") && msg.contains(" nranks ") {
        read_ranks(p, msg);
    }
}

/// A network connection line: its rank, and the connection once.
fn record_channel(p: &mut LogProcess, seen: &mut BTreeSet<ChannelKey>, c: NetChannel) {
    if p.ranks.len() < MAX_ITEMS {
        p.ranks.insert(match c.direction {
            Direction::Send => c.from,
            Direction::Receive => c.to,
        });
    }
    if p.channels.len() < MAX_CHANNELS
        && seen.insert((c.channel, c.conn, c.from, c.to, c.direction))
    {
        p.channels.push(c);
    }
}

/// `NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)`.
fn hca_gdr(msg: &str) -> Option<HcaGdr> {
    let enabled = msg.contains("GPU Direct RDMA Enabled");
    let (_, hca) = msg.split_once(" for HCA ")?;
    let no_module = hca.contains("(no module)");
    let hca: String = hca
        .trim_end_matches("(no module)")
        .trim()
        .chars()
        .take(64)
        .collect();
    Some(HcaGdr {
        hca,
        enabled,
        no_module,
    })
}

/// `NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.0.0.1<0>`: devices, relaxed ordering, OOB.
fn read_ib_devices(p: &mut LogProcess, msg: &str) {
    let (devs, oob) = match msg.split_once("; OOB ") {
        Some((d, o)) => (d, Some(o.trim().chars().take(128).collect::<String>())),
        None => (msg, None),
    };
    for t in devs.split_whitespace() {
        if t == "[RO]" || t == "[RO];" {
            p.relaxed_ordering = true;
        } else if let Some(d) = net_device(t) {
            push_capped(&mut p.ib_devices, d);
        }
    }
    if oob.is_some() {
        p.oob = oob;
    }
}

/// `NCCL_NET_GDR_LEVEL set by environment to PHB`.
fn read_variable(p: &mut LogProcess, msg: &str) {
    let (name, rest) = msg.split_once(' ').unwrap_or((msg, ""));
    if let Some((_, val)) = rest.split_once("to ") {
        if p.env.len() < MAX_ITEMS {
            p.env.insert(
                name.chars().take(64).collect(),
                val.trim().trim_end_matches('.').chars().take(128).collect(),
            );
        }
    }
}

/// `comm 0x... rank 3 nranks 8 ...`: the rank and the communicator's size.
fn read_ranks(p: &mut LogProcess, msg: &str) {
    let toks: Vec<&str> = msg.split_whitespace().collect();
    for w in toks.windows(2) {
        match w[0] {
            "rank" => {
                if let Some(r) = num(w[1]).filter(|_| p.ranks.len() < MAX_ITEMS) {
                    p.ranks.insert(r);
                }
            }
            "nranks" => p.nranks = num(w[1]).or(p.nranks),
            _ => {}
        }
    }
}
