//! Rails: the RDMA ports an agent moves data on, and what each connection knows of each rail
//! (its state, its cool-down, its measured throughput, its counters).
//!
//! An agent opens every port its device selection allows (in the order of the selection) as
//! rails `0..n`; rail `r` of one agent talks to rail `r` of its peer, so two agents share
//! `min(n, m)` rails. Each rail has its own context, protection domain, completion queue and
//! progress thread; every segment is registered on every rail.
//!
//! Per connection, a rail is [`RailState::Active`] (carries slices), [`RailState::Paused`]
//! (it failed: its queue pairs were destroyed and what they carried was posted again on the
//! other rails; it waits for its cool-down), [`RailState::Renewing`] (new queue pairs offered
//! to the peer) or [`RailState::Probing`] (new queue pairs connected, a probe message in
//! flight). A successful probe re-admits it; a failed one pauses it again with twice the
//! cool-down (from [`FIRST_COOLDOWN`] up to [`MAX_COOLDOWN`]; back to the first after
//! [`HEALTHY`] of service).
//!
//! # Which rails a transfer uses
//!
//! The rails nearest the memory: for the location of a transfer's (first) local segment, the
//! agent's rails are ranked by [`gdr_doctor::rank_rails`], the function `gdr doctor` ranks and
//! prints them with (PCIe path class to the GPU, or NUMA node of host memory, then port rate),
//! so the engine and the doctor never disagree on the same report. The agent's report leaves
//! this process's NCCL variables out unless [`crate::AgentConfig::rails_follow_nccl_env`] says
//! otherwise (`gdr doctor` keeps them: it answers for NCCL). A transfer stripes over the agent's best-ranked
//! rails for its memory ([`preferred_rails`]). When none of those is active, it uses any active
//! rail (a further rail is slower, not wrong).

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use gdr_xfer_proto::RailCounters;
pub use gdr_xfer_proto::RailState;

use gdr::device::Context;
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::CompletionQueue;
use gdr_doctor::topology::{collect_with, CollectOptions, Snapshot};
use gdr_doctor::{MemoryLocation, Report};

/// This machine's doctor report for ranking rails, read once per process for each choice of
/// `nccl_env` (the topology does not change while it runs; which rails work is the engine's
/// own bookkeeping). `None` when it cannot be read.
fn host_report(nccl_env: bool) -> Option<&'static Report> {
    static REPORTS: [OnceLock<Option<Report>>; 2] = [OnceLock::new(), OnceLock::new()];
    REPORTS[usize::from(nccl_env)]
        .get_or_init(|| {
            let read = if nccl_env {
                gdr_doctor::host_report(Path::new("/"))
            } else {
                collect_with(Path::new("/"), CollectOptions::live())
                    .map(|snapshot| rail_report(snapshot, false))
            };
            match read {
                Ok(r) => Some(r),
                Err(e) => {
                    log::warn!(
                        "reading this host's topology for rail choice: {e}; every rail is equal"
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// The doctor's report on `snapshot` for ranking rails: with the NCCL variables the snapshot
/// recorded when `nccl_env`, without any otherwise.
fn rail_report(mut snapshot: Snapshot, nccl_env: bool) -> Report {
    if !nccl_env {
        snapshot.env.clear();
    }
    gdr_doctor::diagnose(&snapshot)
}

/// The doctor's name for a segment location.
pub(crate) fn memory_location(location: crate::Location) -> MemoryLocation {
    match location {
        crate::Location::Cpu { numa: None } => MemoryLocation::Any,
        crate::Location::Cpu { numa: Some(n) } => {
            MemoryLocation::Numa(i32::try_from(n).unwrap_or(-1))
        }
        crate::Location::Cuda { ordinal } => MemoryLocation::Gpu { ordinal },
    }
}

/// The rails (bit `i` = rail `i` of `rails`) a transfer from memory at `memory` stripes over:
/// those of the best tier [`gdr_doctor::rank_rails`] gives among the agent's rails in
/// `report`. A rail the report does not list counts as best (nothing says it is worse); no
/// report, or no rail found, gives every rail.
pub(crate) fn preferred_rails(
    report: Option<&Report>,
    rails: &[(String, u8)],
    memory: &MemoryLocation,
) -> u32 {
    let all = if rails.len() >= 32 {
        u32::MAX
    } else {
        (1u32 << rails.len()) - 1
    };
    let Some(report) = report else {
        return all;
    };
    let ranked = gdr_doctor::rank_rails(report, memory, None);
    let tiers: Vec<Option<u32>> = rails
        .iter()
        .map(|(name, port)| {
            ranked
                .iter()
                .find(|r| r.nic == *name && r.port == u32::from(*port))
                .map(|r| r.tier)
        })
        .collect();
    let Some(best) = tiers.iter().flatten().min().copied() else {
        return all;
    };
    tiers
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_none_or(|t| t == best))
        .fold(0, |m, (i, _)| m | (1 << i))
}

/// [`preferred_rails`] on this machine's report, with or without this process's NCCL
/// variables ([`crate::AgentConfig::rails_follow_nccl_env`]).
pub(crate) fn preferred_rails_here(
    rails: &[(String, u8)],
    location: crate::Location,
    nccl_env: bool,
) -> u32 {
    preferred_rails(host_report(nccl_env), rails, &memory_location(location))
}

/// One of the agent's rails.
pub(crate) struct AgentRail {
    pub(crate) ctx: Arc<Context>,
    pub(crate) port: u8,
    pub(crate) pd: Arc<ProtectionDomain>,
    pub(crate) cq: Arc<CompletionQueue>,
}

/// How the agent's connections' queue pairs are made ([`crate::AgentConfig`]'s settings).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpShape {
    pub(crate) send_queue_depth: u32,
    pub(crate) recv_slots: u16,
    pub(crate) ack_timeout: u8,
    pub(crate) retry_count: u8,
    pub(crate) gid_index: Option<u32>,
}

/// The agent's rails, and how queue pairs are made on them: what a connection needs to make
/// its queue pairs (at the handshake and at every renewal), shared by the agent and its
/// connections without a way back to the agent.
pub(crate) struct Rails {
    list: Vec<AgentRail>,
    shape: QpShape,
}

impl Rails {
    pub(crate) fn new(list: Vec<AgentRail>, shape: QpShape) -> Rails {
        Rails { list, shape }
    }

    /// Creates `n` queue pairs on rail `rail` for a peer connection.
    pub(crate) fn create_qps(&self, rail: usize, n: usize) -> gdr::Result<Vec<QueuePair>> {
        let s = &self.shape;
        let r = self.list.get(rail).ok_or_else(|| {
            gdr::Error::invalid(
                format!("rail {rail} of {}", self.list.len()),
                "queue pairs are made only on the agent's rails (a bug in gdr-xfer if seen)",
            )
        })?;
        (0..n)
            .map(|_| {
                let mut b = QueuePair::builder(&r.pd, &r.cq, &r.cq)
                    .port(r.port)
                    .max_send_wr(s.send_queue_depth)
                    .max_recv_wr(u32::from(s.recv_slots))
                    .timeout(s.ack_timeout)
                    .retry_count(s.retry_count);
                if let Some(g) = s.gid_index {
                    b = b.gid_index(g);
                }
                b.build()
            })
            .collect()
    }

    /// (device, port) of every rail.
    pub(crate) fn names(&self) -> Vec<(String, u8)> {
        self.list
            .iter()
            .map(|r| (r.ctx.name().to_string(), r.port))
            .collect()
    }
}

impl std::ops::Deref for Rails {
    type Target = [AgentRail];
    fn deref(&self) -> &[AgentRail] {
        &self.list
    }
}

/// Telemetry of one rail to one peer (see [`Peer::rail_stats`](crate::Peer::rail_stats)).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RailStats {
    /// The rail's position in the agent's rail list.
    pub rail: usize,
    /// The RDMA device.
    pub device: String,
    /// Its port.
    pub port: u8,
    /// Where it stands.
    pub state: RailState,
    /// Bytes of slices completed on it.
    pub bytes: u64,
    /// Slices completed on it.
    pub slices: u64,
    /// Error completions (or failed posts) that paused it.
    pub errors: u64,
    /// Slices it carried when it failed or was fenced, posted again on another rail (or on its
    /// new queue pairs).
    pub retries: u64,
    /// Times its queue pairs were replaced.
    pub renewals: u64,
    /// Times it came back into service (its probe succeeded, or the peer renewed it).
    pub readmissions: u64,
    /// Times it was renewed at once to end a stopped transfer's requests in flight (a fence)
    /// or a queue pair a bad request broke; not failures.
    pub fences: u64,
    /// Bytes posted on it and not completed yet.
    pub inflight_bytes: u64,
    /// Moving average of its completed bytes per second (0 until measured).
    pub throughput: f64,
    /// Why it last failed.
    pub last_error: Option<String>,
    /// From its last failure until the slices it carried were posted again (nothing was
    /// posted again: the transfers had none in flight there).
    pub last_failover: Option<Duration>,
}

impl RailStats {
    pub(crate) fn new(
        rail: usize,
        device: String,
        port: u8,
        state: RailState,
        c: RailCounters,
    ) -> RailStats {
        RailStats {
            rail,
            device,
            port,
            state,
            bytes: c.bytes,
            slices: c.slices,
            errors: c.errors,
            retries: c.retries,
            renewals: c.renewals,
            readmissions: c.readmissions,
            fences: c.fences,
            inflight_bytes: c.inflight_bytes,
            throughput: c.throughput,
            last_error: c.last_error.as_ref().map(ToString::to_string),
            last_failover: c.last_failover,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(name: &str) -> Snapshot {
        let path = format!(
            "{}/../gdr-doctor/tests/fixtures/doctor/snapshots/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap();
        Snapshot::from_json(&text, &path).unwrap()
    }

    fn fixture(name: &str) -> Report {
        gdr_doctor::diagnose(&snapshot(name))
    }

    #[test]
    fn nccl_variables_exported_for_another_program_do_not_move_the_rails_unless_asked() {
        // The fixed DGX (RoCE), with mlx5_1's RoCE v2 IPv4 GID at index 1 instead of 3, in a
        // process whose environment says NCCL_IB_GID_INDEX=1 (exported for an NCCL program
        // using mlx5_1): to NCCL, mlx5_0 is not usable.
        let mut snap = snapshot("dgx-a100-fixed.json");
        let mlx5_1 = snap.rdma.iter_mut().find(|d| d.name == "mlx5_1").unwrap();
        for g in &mut mlx5_1.ports[0].gids {
            g.index = match g.index {
                1 => 3,
                3 => 1,
                i => i,
            };
        }
        snap.env
            .insert("NCCL_IB_GID_INDEX".to_string(), "1".to_string());
        let rails = vec![("mlx5_0".to_string(), 1), ("mlx5_1".to_string(), 1)];
        let gpu0 = MemoryLocation::Gpu { ordinal: 0 };
        let topology_only = rail_report(snap.clone(), false);
        assert_eq!(
            preferred_rails(Some(&topology_only), &rails, &gpu0),
            0b01,
            "by default GPU 0's memory keeps to the NIC on its PCIe switch"
        );
        let as_nccl = rail_report(snap, true);
        assert_eq!(
            preferred_rails(Some(&as_nccl), &rails, &gpu0),
            0b10,
            "asked to follow NCCL's variables, the agent avoids mlx5_0 as NCCL would"
        );
    }

    #[test]
    fn a_transfer_stripes_over_the_rails_the_doctor_ranks_best_for_its_memory() {
        // The fixed DGX: GPU 0 shares a PCIe switch with mlx5_0, GPU 1 with mlx5_1.
        let report = fixture("dgx-a100-fixed.json");
        let rails = vec![("mlx5_0".to_string(), 1), ("mlx5_1".to_string(), 1)];
        let gpu =
            |ordinal| preferred_rails(Some(&report), &rails, &MemoryLocation::Gpu { ordinal });
        assert_eq!(gpu(0), 0b01, "GPU 0's memory goes over mlx5_0 only");
        assert_eq!(gpu(1), 0b10, "GPU 1's memory goes over mlx5_1 only");
        // The doctor's table says the same (its best NIC per GPU).
        for g in &report.gpus {
            let want = if g.best_nic.as_deref() == Some("mlx5_0") {
                0b01
            } else {
                0b10
            };
            assert_eq!(gpu(g.cuda_ordinal.unwrap() as u32), want, "{g:?}");
        }
        // Rails in the other order: the mask follows the agent's rail numbers.
        let swapped = vec![rails[1].clone(), rails[0].clone()];
        assert_eq!(
            preferred_rails(Some(&report), &swapped, &MemoryLocation::Gpu { ordinal: 0 }),
            0b10
        );
        // Host memory with no NUMA preference, no report, an unknown rail: every rail.
        assert_eq!(preferred_rails(None, &rails, &MemoryLocation::Any), 0b11);
        let odd = vec![("rxe9".to_string(), 1), ("mlx5_1".to_string(), 1)];
        assert_eq!(
            preferred_rails(Some(&report), &odd, &MemoryLocation::Gpu { ordinal: 1 }),
            0b11,
            "a rail the report does not know is not ranked worse"
        );
        assert_eq!(
            preferred_rails(Some(&report), &odd, &MemoryLocation::Gpu { ordinal: 0 }),
            0b11,
            "the best known rail (mlx5_1, SYS) and the unknown one"
        );
    }
}
