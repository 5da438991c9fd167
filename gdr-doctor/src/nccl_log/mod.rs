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

mod analyze;
mod parse;
mod table;
#[cfg(test)]
mod tests;

use super::{Report, Severity};
use crate::error::{Error, Hint};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

pub use analyze::analyze;
pub use parse::parse;

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
        table::table(self)
    }
}
