//! `gdr doctor nccl-log`: what an `NCCL_DEBUG=INFO` log says about GPUDirect RDMA, per process.
//!
//! [`parse`] reads the lines NCCL prints (`host:pid:tid [dev] NCCL INFO ...`, any prefix a
//! launcher adds before them is skipped) of one or more processes into an [`NcclLog`]; lines it
//! does not know are counted and ignored, input that holds no NCCL line at all is
//! [`Error::NotAnNcclLog`]. [`analyze`] turns the log into a
//! [`LogReport`]: per process (NCCL prints the CUDA device in brackets, not the rank; ranks come
//! from the `comm ... rank R nranks N` and channel lines) the NCCL version, the network and
//! plugin, the devices and ports, whether each network connection of a channel uses GPUDirect
//! RDMA (`via NET/IB/0/GDRDMA`) or not (`via NET/IB/0`), and where not, the reason NCCL printed
//! or the likely cause, cross-checked with a doctor [`Report`] of the host when one is given.
//!
//! The messages are NCCL's own (`src/init.cc`, `src/transport/net.cc`, `src/graph/paths.cc`,
//! `src/graph/topo.cc`, `src/transport/net_ib*`), from 2.4 to 2.30.
//!
//! ```
//! let log = gdr_doctor::nccl_log::parse(
//!     "n1:10:20 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA\n",
//!     "example",
//! )
//! .unwrap();
//! let report = gdr_doctor::nccl_log::analyze(&log, None);
//! assert!(report.gdrdma_verified);
//! assert!(gdr_doctor::nccl_log::parse("no nccl here\n", "x").is_err());
//! ```

use super::{Report, Severity};
use crate::error::{Error, Hint};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// The version of the log report's JSON shape.
pub const LOG_REPORT_FORMAT: u32 = 1;

/// At most this many processes are kept (later ones are counted, not kept).
const MAX_PROCESSES: usize = 4096;
/// At most this many entries per small list of one process (devices, interfaces, GPUDirect
/// lines, variables, ranks); NCCL supports at most 32 HCAs.
const MAX_ITEMS: usize = 256;
/// At most this many network connections per process (deduplicated through a set, so a log of
/// repeated lines costs a lookup per line).
const MAX_CHANNELS: usize = 4096;
/// Lines longer than this are not parsed (NCCL's own lines are below 4 KiB).
const MAX_LINE: usize = 16 * 1024;

/// Direction of a network connection, from the printing process's view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// `[send]`: this process sends (the NIC reads GPU memory when GDRDMA).
    Send,
    /// `[receive]`: this process receives (the NIC writes GPU memory when GDRDMA).
    Receive,
}

/// One `NET/<name>/<dev>` connection of a channel.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NetChannel {
    /// Channel number.
    pub channel: u32,
    /// Connection index (`00/1`), when printed.
    pub conn: Option<u32>,
    /// Sending rank.
    pub from: u32,
    /// Receiving rank.
    pub to: u32,
    /// Send or receive side.
    pub direction: Direction,
    /// Network name (`IB`, `Socket`, a plugin's name such as `IBext_v8`).
    pub net: String,
    /// NCCL's network device index.
    pub dev: u32,
    /// Proxy rank (`NET/IB/0(3)`: PXN through rank 3).
    pub proxy: Option<u32>,
    /// `/GDRDMA`: GPUDirect RDMA is used.
    pub gdrdma: bool,
}

/// One device of a `NET/IB : Using` line, e.g. `[0]mlx5_0:1/RoCE`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetDevice {
    /// NCCL's index.
    pub index: u32,
    /// Device name.
    pub name: String,
    /// Port.
    pub port: Option<u32>,
    /// `IB` or `RoCE` (and any suffix such as `IB/SHARP`).
    pub link: String,
}

/// A `GPU Direct RDMA Disabled/Enabled for GPU g / HCA h (distance d > l)` line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GdrDistance {
    /// GPU as printed (bus id or rank).
    pub gpu: String,
    /// HCA as printed (index or id).
    pub hca: String,
    /// NCCL's path type number of the GPU-NIC path.
    pub distance: u32,
    /// NCCL's limit (NCCL_NET_GDR_LEVEL, default PXB).
    pub limit: u32,
    /// Enabled (`<=`) or disabled (`>`).
    pub enabled: bool,
}

/// A `NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'` line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HcaGdr {
    /// `0 'mlx5_0'`.
    pub hca: String,
    /// Enabled or disabled.
    pub enabled: bool,
    /// `(no module)`: NCCL found no peer-memory module (NCCL before 2.13 says so).
    pub no_module: bool,
}

/// What one process (one `host:pid` and CUDA device) printed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LogProcess {
    /// Host name as printed (empty when the prefix has none).
    pub host: String,
    /// Process id as printed.
    pub pid: String,
    /// The CUDA device in brackets.
    pub cuda_dev: Option<u32>,
    /// Ranks this process printed lines as (from `comm` and channel lines).
    pub ranks: BTreeSet<u32>,
    /// Communicator size.
    pub nranks: Option<u32>,
    /// `NCCL version` this process printed.
    pub version: Option<String>,
    /// `Using network X`.
    pub network: Option<String>,
    /// External net plugin (`NET/Plugin: Loaded net plugin X`, `P2P plugin X`).
    pub plugin: Option<String>,
    /// `NET/Plugin : No plugin found` / `Using internal network plugin`.
    pub internal_plugin: bool,
    /// Devices of the `NET/IB : Using` line.
    pub ib_devices: Vec<NetDevice>,
    /// `[RO]` on that line.
    pub relaxed_ordering: bool,
    /// The `OOB` interface of that line.
    pub oob: Option<String>,
    /// `NET/IB : No device found.`
    pub ib_no_device: bool,
    /// Interfaces of `NET/Socket : Using`.
    pub socket_interfaces: Vec<String>,
    /// `NCCL_X set by environment to Y`.
    pub env: BTreeMap<String, String>,
    /// Per-HCA GPUDirect lines.
    pub hca_gdr: Vec<HcaGdr>,
    /// Distance lines.
    pub distance: Vec<GdrDistance>,
    /// `DMA-BUF is available on GPU device N`.
    pub dmabuf_available: bool,
    /// Network connections of channels (deduplicated).
    pub channels: Vec<NetChannel>,
    /// Channel lines through P2P, SHM and other intra-node transports.
    pub intra_node_channels: usize,
    /// `NCCL WARN` messages (the first few).
    pub warnings: Vec<String>,
}

/// A parsed NCCL log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NcclLog {
    /// Where it came from.
    pub source: String,
    /// Lines read.
    pub lines: usize,
    /// Lines NCCL printed.
    pub nccl_lines: usize,
    /// Processes, in order of first appearance.
    pub processes: Vec<LogProcess>,
    /// Processes beyond the limit, counted only.
    pub processes_left_out: usize,
    /// `NCCL version` lines without a process prefix (NCCL's rank 0 prints it to stdout).
    pub unattributed_versions: Vec<String>,
}

fn push_capped<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if v.len() < MAX_ITEMS && !v.contains(&x) {
        v.push(x);
    }
}

/// `host:pid:tid [dev]` before the marker, if there.
fn prefix(before: &str) -> (String, String, Option<u32>) {
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
fn version_after(text: &str) -> Option<String> {
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

/// `(major, minor)` of a version token.
fn version_num(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// NCCL's `topoPathTypeStr` of a version (by `src/graph/topo.cc` in each release).
fn path_names(v: (u32, u32)) -> Option<&'static [&'static str]> {
    const V26: &[&str] = &["LOC", "NVL", "PIX", "PXB", "PHB", "SYS", "NET"];
    const V28: &[&str] = &["LOC", "NVL", "NVB", "PIX", "PXB", "PHB", "SYS"];
    const V212: &[&str] = &[
        "LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS", "NET", "DIS",
    ];
    const V226: &[&str] = &[
        "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "PHB", "SYS", "NET", "DIS",
    ];
    const V227: &[&str] = &[
        "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "P2C", "PHB", "SYS", "NET", "DIS",
    ];
    const V228: &[&str] = &[
        "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS",
    ];
    if v.0 != 2 {
        return None;
    }
    Some(match v.1 {
        6..=7 => V26,
        8..=11 => V28,
        12..=25 => V212,
        26 => V226,
        27 => V227,
        28.. => V228,
        _ => return None,
    })
}

fn num(s: &str) -> Option<u32> {
    s.trim().parse().ok()
}

/// `Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA` (and `Ring 00 : ...`, `Channel 01 :
/// ...` of older NCCL). `Ok(None)`: a channel line through an intra-node transport; `Err`: not a
/// connection line.
fn channel(msg: &str) -> Result<Option<NetChannel>, ()> {
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
fn distance(msg: &str) -> Option<GdrDistance> {
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
            Ok(Some(c)) => {
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
            Ok(None) => p.intra_node_channels = p.intra_node_channels.saturating_add(1),
            Err(()) => {}
        }
    } else if let Some(d) = distance(msg) {
        push_capped(&mut p.distance, d);
    } else if msg.starts_with("NET/") && msg.contains("GPU Direct RDMA ") {
        // `NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)`.
        let enabled = msg.contains("GPU Direct RDMA Enabled");
        if let Some((_, hca)) = msg.split_once(" for HCA ") {
            let no_module = hca.contains("(no module)");
            let hca: String = hca
                .trim_end_matches("(no module)")
                .trim()
                .chars()
                .take(64)
                .collect();
            push_capped(
                &mut p.hca_gdr,
                HcaGdr {
                    hca,
                    enabled,
                    no_module,
                },
            );
        }
    } else if msg.starts_with("NET/IB") && msg.contains("No device found") {
        p.ib_no_device = true;
    } else if msg.starts_with("NET/IB") && msg.contains("Using") {
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
        let (name, rest) = msg.split_once(' ').unwrap_or((msg, ""));
        if let Some((_, val)) = rest.split_once("to ") {
            if p.env.len() < MAX_ITEMS {
                p.env.insert(
                    name.chars().take(64).collect(),
                    val.trim().trim_end_matches('.').chars().take(128).collect(),
                );
            }
        }
    } else if msg.contains(" rank ") && msg.contains(" nranks ") {
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
}

/// Whether GPUDirect RDMA is used by one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogVerdict {
    /// Every network connection says GDRDMA.
    Gdrdma,
    /// Some do, some do not.
    Partial,
    /// None does: data is staged through host memory.
    NoGdrdma,
    /// NCCL uses TCP sockets: no RDMA at all.
    Socket,
    /// No network connection in the log (one node, or the log ends before connection setup).
    NoNetConnections,
}

impl LogVerdict {
    /// The verdict in words.
    pub fn text(self) -> &'static str {
        match self {
            LogVerdict::Gdrdma => "GPUDirect RDMA on every network connection",
            LogVerdict::Partial => "GPUDirect RDMA on some network connections only",
            LogVerdict::NoGdrdma => "no GPUDirect RDMA: network data is staged through host memory",
            LogVerdict::Socket => "no RDMA at all: NCCL uses TCP sockets",
            LogVerdict::NoNetConnections => {
                "no network connection in the log: cannot tell whether GPUDirect RDMA is used"
            }
        }
    }
}

/// The verdict for one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessReport {
    /// `host:pid GPU n` as printed.
    pub process: String,
    /// Ranks of this process.
    pub ranks: Vec<u32>,
    /// Communicator size.
    pub nranks: Option<u32>,
    /// NCCL version (its own line, else the log's only unattributed one).
    pub version: Option<String>,
    /// The network NCCL chose and how (`IB (internal)`, `IBext_v8 (plugin)`, `Socket`).
    pub network: Option<String>,
    /// Devices and ports (`[0]mlx5_0:1/RoCE`).
    pub devices: Vec<String>,
    /// Whether NCCL printed `[RO]` (relaxed ordering).
    pub relaxed_ordering: bool,
    /// Out-of-band interface.
    pub oob: Option<String>,
    /// Network connections.
    pub net_connections: usize,
    /// Of which GDRDMA.
    pub gdrdma_connections: usize,
    /// Send connections and how many of them GDRDMA.
    pub send: (usize, usize),
    /// Receive connections and how many of them GDRDMA.
    pub receive: (usize, usize),
    /// Intra-node channel lines (P2P, SHM).
    pub intra_node_channels: usize,
    /// The verdict.
    pub verdict: LogVerdict,
    /// What NCCL printed that explains it.
    pub reasons: Vec<String>,
    /// The likely causes when NCCL printed none.
    pub likely: Vec<String>,
    /// What the doctor's view of the host says about them.
    pub host: Vec<String>,
    /// What to do.
    pub fixes: Vec<String>,
    /// Settings NCCL printed that are often misread (they do not change the verdict).
    pub notes: Vec<String>,
    /// NCCL warnings.
    pub warnings: Vec<String>,
}

/// The answer for one log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogReport {
    /// [`LOG_REPORT_FORMAT`].
    pub format: u32,
    /// Where the log came from.
    pub source: String,
    /// The host view it was checked against (`None`: not checked).
    pub host_source: Option<String>,
    /// Lines read.
    pub lines: usize,
    /// Lines from NCCL.
    pub nccl_lines: usize,
    /// Network connections in the log.
    pub net_connections: usize,
    /// Of which GDRDMA.
    pub gdrdma_connections: usize,
    /// Whether the log shows GPUDirect RDMA on every network connection (and has some).
    pub gdrdma_verified: bool,
    /// Processes beyond the reader's limit.
    pub processes_left_out: usize,
    /// Per process.
    pub processes: Vec<ProcessReport>,
}

impl LogReport {
    /// 0 when the log shows GPUDirect RDMA on every network connection, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        if self.gdrdma_verified {
            0
        } else {
            1
        }
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report for people.
    pub fn to_table(&self) -> String {
        table(self)
    }
}

fn path_name(version: Option<&str>, n: u32) -> Option<&'static str> {
    let names = path_names(version_num(version?)?)?;
    names.get(n as usize).copied()
}

/// The verdict, reasons and fixes for one process.
fn process_report(
    p: &LogProcess,
    log_version: Option<&String>,
    host: Option<&Report>,
) -> ProcessReport {
    let version = p.version.clone().or_else(|| log_version.cloned());
    let ver = version.as_deref();
    let net = p.channels.len();
    let gdr = p.channels.iter().filter(|c| c.gdrdma).count();
    let count = |d: Direction| {
        let all: Vec<&NetChannel> = p.channels.iter().filter(|c| c.direction == d).collect();
        (all.len(), all.iter().filter(|c| c.gdrdma).count())
    };
    let send = count(Direction::Send);
    let receive = count(Direction::Receive);
    let channel_net = p.channels.first().map(|c| c.net.clone());
    let network_name = p.network.clone().or(channel_net);
    let socket = network_name
        .as_deref()
        .is_some_and(|n| n.eq_ignore_ascii_case("Socket"));
    let verdict = if socket {
        LogVerdict::Socket
    } else if net == 0 {
        // No connection lines, but NCCL said it disabled GPUDirect for every GPU/HCA it
        // printed and enabled it for none.
        let disabled =
            p.distance.iter().any(|d| !d.enabled) || p.hca_gdr.iter().any(|h| !h.enabled);
        let enabled = p.distance.iter().any(|d| d.enabled) || p.hca_gdr.iter().any(|h| h.enabled);
        if disabled && !enabled {
            LogVerdict::NoGdrdma
        } else {
            LogVerdict::NoNetConnections
        }
    } else if gdr == net {
        LogVerdict::Gdrdma
    } else if gdr == 0 {
        LogVerdict::NoGdrdma
    } else {
        LogVerdict::Partial
    };
    let network = network_name.map(|n| {
        if n.eq_ignore_ascii_case("IB") {
            let kinds: BTreeSet<&str> = p
                .ib_devices
                .iter()
                .map(|d| {
                    if d.link.starts_with("RoCE") {
                        "RoCE"
                    } else {
                        "InfiniBand"
                    }
                })
                .collect();
            let kinds: Vec<&str> = kinds.into_iter().collect();
            if kinds.is_empty() {
                "IB (NCCL's internal IB verbs transport)".to_string()
            } else {
                format!(
                    "IB (NCCL's internal IB verbs transport, {})",
                    kinds.join(" and ")
                )
            }
        } else if n.eq_ignore_ascii_case("Socket") {
            "Socket (NCCL's internal TCP transport)".to_string()
        } else {
            match &p.plugin {
                Some(pl) => format!("{n} (external net plugin {pl})"),
                None => format!("{n} (external net plugin)"),
            }
        }
    });
    let mut reasons = Vec::new();
    let mut likely = Vec::new();
    let mut fixes = Vec::new();
    let mut host_lines = Vec::new();

    // What NCCL printed.
    for d in p.distance.iter().filter(|d| !d.enabled) {
        let named = match (path_name(ver, d.distance), path_name(ver, d.limit)) {
            (Some(a), Some(b)) => format!(
                ": with NCCL {} that is the path type {a} against the limit {b}",
                ver.unwrap_or("?")
            ),
            _ => " (path type numbers depend on the NCCL version, which the log does not give)"
                .to_string(),
        };
        reasons.push(format!(
            "NCCL printed `GPU Direct RDMA Disabled for GPU {} / HCA {} (distance {} > {})`{named}: GPU and NIC are farther apart than NCCL_NET_GDR_LEVEL allows (default PXB)",
            d.gpu, d.hca, d.distance, d.limit
        ));
        let class = path_name(ver, d.distance).unwrap_or("the path's class");
        push_capped(&mut fixes, format!("put the GPU and the NIC under one PCIe switch (PIX/PXB), or export NCCL_NET_GDR_LEVEL={class} if GPUDirect over this path measures faster than staging (`gdr bw --use-cuda`)"));
    }
    for h in p.hca_gdr.iter().filter(|h| !h.enabled) {
        if h.no_module {
            reasons.push(format!("NCCL printed `GPU Direct RDMA Disabled for HCA {} (no module)`: no peer-memory module (nvidia-peermem or nv_peer_mem) was loaded", h.hca));
            push_capped(&mut fixes, "`modprobe nvidia-peermem` on every node (and make it persistent), or use dma-buf (NCCL >= 2.13, open kernel module, Linux >= 5.12, CUDA >= 11.7)".to_string());
        } else {
            reasons.push(format!("NCCL printed `GPU Direct RDMA Disabled for HCA {}`: NCCL found neither a peer-memory module (it checks /sys/kernel/mm/memory_peers/nv_mem*/version and /sys/module/nvidia_peermem/version) nor dma-buf support for this GPU and NIC", h.hca));
            push_capped(&mut fixes, "`modprobe nvidia-peermem` (check `ls /sys/module/nvidia_peermem`), or make dma-buf possible: NVIDIA open kernel module, Linux >= 5.12, CUDA driver >= 11.7, NCCL_DMABUF_ENABLE unset or 1".to_string());
        }
    }
    if let Some(v) = p.env.get("NCCL_NET_GDR_LEVEL") {
        if matches!(v.as_str(), "LOC" | "0") {
            reasons.push(format!("NCCL printed `NCCL_NET_GDR_LEVEL set by environment to {v}`: GPUDirect RDMA is switched off"));
            push_capped(
                &mut fixes,
                "unset NCCL_NET_GDR_LEVEL (default PXB)".to_string(),
            );
        }
    }
    if p.env.get("NCCL_NET_GDR_READ").map(String::as_str) == Some("0") {
        reasons.push("NCCL printed `NCCL_NET_GDR_READ set by environment to 0`: sends stage through host memory".to_string());
    }
    if p.env.get("NCCL_DMABUF_ENABLE").map(String::as_str) == Some("0") {
        reasons.push("NCCL printed `NCCL_DMABUF_ENABLE set by environment to 0`: dma-buf registration is off, only a peer-memory module can enable GPUDirect RDMA".to_string());
    }
    if socket {
        if p.env.get("NCCL_IB_DISABLE").is_some_and(|v| v != "0") {
            reasons.push("NCCL printed `NCCL_IB_DISABLE set by environment to 1`: the IB/RoCE transport is switched off".to_string());
            push_capped(&mut fixes, "unset NCCL_IB_DISABLE".to_string());
        }
        if p.env
            .get("NCCL_NET")
            .is_some_and(|v| v.eq_ignore_ascii_case("Socket"))
        {
            reasons.push(
                "NCCL printed `NCCL_NET set by environment to Socket`: sockets are forced"
                    .to_string(),
            );
            push_capped(&mut fixes, "unset NCCL_NET".to_string());
        }
        if p.ib_no_device {
            reasons.push("NCCL printed `NET/IB : No device found.`: libibverbs listed no usable RDMA device (none present, driver or rdma-core missing, no active port, or NCCL_IB_HCA matching nothing)".to_string());
            push_capped(&mut fixes, "check `ibv_devinfo` (device present, port ACTIVE), then NCCL_IB_HCA; run `gdr doctor` on the node".to_string());
        }
        if reasons.is_empty() {
            likely.push("NCCL chose sockets without saying why in this log: NCCL_IB_DISABLE, NCCL_NET=Socket, or no usable RDMA device (look for `NET/IB : No device found.`)".to_string());
        }
    }
    let mut notes = Vec::new();
    if let Some(v) = p.env.get("NCCL_P2P_LEVEL") {
        notes.push(format!("NCCL printed `NCCL_P2P_LEVEL set by environment to {v}`: that governs GPU-to-GPU peer access inside a node, not GPUDirect RDMA (NCCL_NET_GDR_LEVEL does)"));
    }
    // Send without GDRDMA while receive has it: GDR reads are off.
    if send.0 > 0 && send.1 == 0 && receive.1 > 0 && !p.env.contains_key("NCCL_NET_GDR_READ") {
        likely.push("receives use GPUDirect RDMA but sends do not: NCCL_NET_GDR_READ is off by default for GPUs older than Ampere (compute capability < 8.0) without NVLink".to_string());
        push_capped(&mut fixes, "NCCL_NET_GDR_READ=1 lets the NIC read GPU memory when sending (measure: on PCIe-only pre-Ampere systems it can be slower)".to_string());
    }
    if matches!(verdict, LogVerdict::NoGdrdma | LogVerdict::Partial)
        && p.distance.iter().all(|d| d.enabled)
        && p.hca_gdr.iter().all(|h| h.enabled)
        && !p.env.contains_key("NCCL_NET_GDR_LEVEL")
    {
        likely.push("NCCL printed no reason (those lines are in the NET subsystem: rerun with NCCL_DEBUG_SUBSYS=INIT,ENV,NET); the usual ones: GPU and NIC farther apart than NCCL_NET_GDR_LEVEL (default PXB), no peer-memory module and no dma-buf, or a GPU without GPUDirect RDMA".to_string());
    }
    if p.dmabuf_available && matches!(verdict, LogVerdict::NoGdrdma | LogVerdict::Partial) {
        likely.push("NCCL printed `DMA-BUF is available on GPU device N`: the GPU side of dma-buf is fine, so look at the NIC, the distance and NCCL_NET_GDR_LEVEL".to_string());
    }

    // The host view.
    if let Some(r) = host {
        if !matches!(verdict, LogVerdict::Gdrdma) {
            host_lines.extend(host_checks(p, r));
        }
    }

    let mut devices: Vec<String> = p
        .ib_devices
        .iter()
        .map(|d| match d.port {
            Some(port) => format!("[{}]{}:{port}/{}", d.index, d.name, d.link),
            None => format!("[{}]{}/{}", d.index, d.name, d.link),
        })
        .collect();
    devices.extend(p.socket_interfaces.iter().cloned());
    let process = {
        let who = match (p.host.is_empty(), p.pid.is_empty()) {
            (false, false) => format!("{}:{}", p.host, p.pid),
            (false, true) => p.host.clone(),
            (true, false) => format!("pid {}", p.pid),
            (true, true) => "unnamed process".to_string(),
        };
        match p.cuda_dev {
            Some(d) => format!("{who} GPU {d}"),
            None => who,
        }
    };
    ProcessReport {
        process,
        ranks: p.ranks.iter().copied().collect(),
        nranks: p.nranks,
        version,
        network,
        devices,
        relaxed_ordering: p.relaxed_ordering,
        oob: p.oob.clone(),
        net_connections: net,
        gdrdma_connections: gdr,
        send,
        receive,
        intra_node_channels: p.intra_node_channels,
        verdict,
        reasons,
        likely,
        host: host_lines,
        fixes,
        notes,
        warnings: p.warnings.clone(),
    }
}

/// What the doctor's report of the host says about a process that does not use GDRDMA.
fn host_checks(p: &LogProcess, r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    let host_nics: Vec<&str> = r.nics.iter().map(|n| n.name.as_str()).collect();
    let absent: Vec<&str> = p
        .ib_devices
        .iter()
        .map(|d| d.name.as_str())
        .filter(|n| !host_nics.contains(n))
        .collect();
    if !p.ib_devices.is_empty() && absent.len() == p.ib_devices.len() {
        out.push(format!(
            "none of the log's devices ({}) is on the host checked ({}): the log is from another machine, so the host findings may not apply",
            absent.join(", "),
            if host_nics.is_empty() { "no RDMA device".to_string() } else { host_nics.join(", ") }
        ));
    }
    for id in [
        "peermem.module",
        "dmabuf.readiness",
        "inventory.rdma",
        "cuda.attributes",
    ] {
        for f in r.findings_with_id(id) {
            if f.severity >= Severity::Warn {
                out.push(format!(
                    "{} {} ({}): {}",
                    f.severity, f.id, f.subject, f.message
                ));
            }
        }
    }
    for pr in r.pairs.iter().filter(|p| p.best) {
        if let Some(c) = pr.path {
            if c > super::PathClass::Pxb {
                out.push(format!(
                    "GPU {} <-> {}: path {c}, beyond NCCL's default NCCL_NET_GDR_LEVEL=PXB",
                    pr.gpu, pr.nic
                ));
            }
        }
    }
    for f in r.all_findings() {
        if f.id.starts_with("nccl.") && f.severity >= Severity::Warn && out.len() < 32 {
            out.push(format!(
                "{} {} ({}): {}",
                f.severity, f.id, f.subject, f.message
            ));
        }
    }
    if out.is_empty() {
        out.push("the host checked shows no peer-memory, dma-buf, path or NCCL setting problem: compare the NCCL environment of the job with this shell's".to_string());
    }
    out
}

/// The verdict for every process of `log`; `host` is the doctor's report of the machine the
/// log should be checked against (`None`: the log alone).
pub fn analyze(log: &NcclLog, host: Option<&Report>) -> LogReport {
    let log_version = match log.unattributed_versions.as_slice() {
        [v] => Some(v),
        _ => None,
    };
    let mut processes: Vec<ProcessReport> = log
        .processes
        .iter()
        .map(|p| process_report(p, log_version, host))
        .collect();
    // By rank (processes without one last), stable for the rest.
    processes.sort_by_key(|p| p.ranks.first().copied().unwrap_or(u32::MAX));
    let net: usize = processes.iter().map(|p| p.net_connections).sum();
    let gdr: usize = processes.iter().map(|p| p.gdrdma_connections).sum();
    let bad = processes.iter().any(|p| {
        matches!(
            p.verdict,
            LogVerdict::NoGdrdma | LogVerdict::Partial | LogVerdict::Socket
        )
    });
    LogReport {
        format: LOG_REPORT_FORMAT,
        source: log.source.clone(),
        host_source: host.map(|r| r.source.clone()),
        lines: log.lines,
        nccl_lines: log.nccl_lines,
        net_connections: net,
        gdrdma_connections: gdr,
        gdrdma_verified: net > 0 && gdr == net && !bad,
        processes_left_out: log.processes_left_out,
        processes,
    }
}

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

fn table(r: &LogReport) -> String {
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
    let headline = if r.net_connections == 0 {
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
    };
    let _ = writeln!(out, "{headline}");
    if r.processes_left_out > 0 {
        let _ = writeln!(out, "({} more process(es) not read)", r.processes_left_out);
    }
    for p in &r.processes {
        let _ = writeln!(out);
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
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_of_launchers_and_nccl() {
        assert_eq!(
            prefix("[1,0]<stdout>:gpu6:1407:1595 [0] "),
            ("gpu6".into(), "1407".into(), Some(0))
        );
        assert_eq!(
            prefix("<cluster_name>:924:1152 [5] "),
            ("<cluster_name>".into(), "924".into(), Some(5))
        );
        assert_eq!(
            prefix(":22901:22901 [0] "),
            ("".into(), "22901".into(), Some(0))
        );
        assert_eq!(
            prefix("host:1:2 [3] misc/ibvwrap.cc:284 "),
            ("host".into(), "1".into(), Some(3))
        );
        assert_eq!(prefix("[0] "), ("".into(), "".into(), Some(0)));
        assert_eq!(prefix(""), ("".into(), "".into(), None));
    }

    #[test]
    fn channel_lines_of_every_format() {
        let c = channel("Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA")
            .unwrap()
            .unwrap();
        assert_eq!((c.channel, c.conn, c.from, c.to), (0, Some(0), 0, 1));
        assert!(c.gdrdma && c.direction == Direction::Send && c.net == "IB");
        let c = channel("Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA/Shared")
            .unwrap()
            .unwrap();
        assert_eq!((c.from, c.to, c.dev, c.conn), (2, 0, 5, None));
        assert!(c.gdrdma && c.direction == Direction::Receive);
        let c = channel("Channel 02/0 : 1[1] -> 3[1] [send] via NET/IB/2(5)/GDRDMA")
            .unwrap()
            .unwrap();
        assert_eq!((c.dev, c.proxy), (2, Some(5)));
        let c = channel("Ring 00 : 51[3d000] -> 56[1a000] [receive] via NET/IB/2")
            .unwrap()
            .unwrap();
        assert!(!c.gdrdma);
        let c = channel("Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3")
            .unwrap()
            .unwrap();
        assert_eq!(c.net, "Socket");
        assert_eq!(
            channel("Channel 00/0 : 3[1] -> 2[0] via P2P/CUMEM"),
            Ok(None)
        );
        assert_eq!(channel("Channel 00/02 :    0   1"), Err(()));
        assert_eq!(
            channel("Channel 00/0 : x -> y [send] via NET/IB/0"),
            Err(())
        );
        assert_eq!(
            channel("Channel 00/0 : 0[0] -> 1[0] [send] via NET/"),
            Err(())
        );
    }

    #[test]
    fn distances_and_versions() {
        let d =
            distance("GPU Direct RDMA Disabled for GPU 42000 / HCA 0 (distance 6 > 4)").unwrap();
        assert_eq!((d.distance, d.limit, d.enabled), (6, 4, false));
        let d = distance("GPU Direct RDMA Enabled for GPU 1c000 / HCA 3 (distance 3 <= 4), read 0")
            .unwrap();
        assert!(d.enabled);
        assert_eq!(path_name(Some("2.21.5+cuda12.4"), 6), Some("PHB"));
        assert_eq!(path_name(Some("2.21.5+cuda12.4"), 4), Some("PXB"));
        assert_eq!(path_name(Some("2.7.6+cuda11.1"), 4), Some("PHB"));
        assert_eq!(path_name(Some("2.28.3"), 6), Some("P2C"));
        assert_eq!(path_name(Some("2.4.7"), 4), None);
        assert_eq!(path_name(None, 4), None);
        assert_eq!(path_name(Some("2.21.5"), 99), None);
        assert_eq!(
            version_after("NCCL version 2.4.7+cuda9.2").as_deref(),
            Some("2.4.7+cuda9.2")
        );
        assert_eq!(
            version_after("environments: NCCL version: 2.21.5, TORCH").as_deref(),
            Some("2.21.5")
        );
        assert_eq!(version_after("NCCL version x"), None);
    }

    #[test]
    fn no_nccl_line_is_an_error_naming_the_fix() {
        let e = parse("hello\nworld\n", "t.log").unwrap_err();
        assert!(matches!(e, Error::NotAnNcclLog { lines: 2, .. }), "{e}");
        let s = e.to_string();
        assert!(s.contains("t.log") && s.contains("2 line(s)"), "{s}");
        assert!(e.hint().unwrap().contains("NCCL_DEBUG=INFO"));
        assert!(parse("", "empty").is_err());
    }

    #[test]
    fn hostile_lines_do_not_panic_and_stay_bounded() {
        let mut text = String::new();
        // One process with more distinct connections and devices than kept.
        for i in 0..(MAX_CHANNELS + 10) {
            text.push_str(&format!(
                "one:1:1 [0] NCCL INFO Channel {i}/0 : 0[0] -> 1[0] [send] via NET/IB/0\n"
            ));
        }
        let devs: String = (0..MAX_ITEMS + 10)
            .map(|i| format!(" [{i}]d{i}:1/IB"))
            .collect();
        text.push_str(&format!(
            "one:1:1 [0] NCCL INFO NET/IB : Using{devs} ; OOB x\n"
        ));
        // More processes than kept, each repeating one connection.
        for i in 0..5000 {
            for _ in 0..2 {
                text.push_str(&format!(
                    "h{i}:{i}:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n"
                ));
            }
        }
        text.push_str("é:é:é [é] NCCL INFO NET/IB : Using [é]é:é/é [0]ü:9999999999/RoCE ; OOB é\n");
        text.push_str(
            "x NCCL INFO GPU Direct RDMA Disabled for GPU ü / HCA ü (distance 99999999999 > 4)\n",
        );
        text.push_str("NCCL WARN\nNCCL INFO\nNCCL INFO Channel  via \nNCCL INFO Ring 1 : 1[ -> ] [send] via NET/a/1(/\n");
        text.push_str(&"x".repeat(MAX_LINE + 1));
        let log = parse(&text, "hostile").unwrap();
        assert_eq!(log.processes.len(), MAX_PROCESSES);
        assert!(log.processes_left_out > 0);
        let one = &log.processes[0];
        assert_eq!(one.host, "one");
        assert_eq!(one.channels.len(), MAX_CHANNELS);
        assert_eq!(one.ib_devices.len(), MAX_ITEMS);
        assert!(log.processes[1..].iter().all(|p| p.channels.len() == 1));
        let r = analyze(&log, None);
        assert!(!r.gdrdma_verified);
        let _ = r.to_table();
        serde_json::from_str::<serde_json::Value>(&r.to_json()).unwrap();
    }
}
