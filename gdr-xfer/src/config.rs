//! How an agent is set up: its rails, queue pairs per peer, slice size, striping, queue
//! depths, retries, notification pool, deadlines and polling.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::staging::StagingConfig;
use crate::wire::{MAX_NAME, MAX_NOTIFY, MAX_QPS, MAX_RAILS};

/// An agent's settings. Start from [`AgentConfig::new`] and change what you need.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AgentConfig {
    /// The agent's name, unique among the agents that talk to each other.
    pub name: String,
    /// The rails: an NCCL-style device list (`gdr::device::Selection`: `mlx5_0:1,mlx5_1:1`,
    /// `^mlx5_2`, `=rxe0`). Every port it allows becomes a rail, in the order of the list
    /// (device order for exclusions), at most `max_rails`; ports that are not active are left
    /// out when an active one is allowed. Empty: every device's active ports (or the first
    /// device when none is active).
    pub device: String,
    /// Most rails (1..=8; default 8).
    pub max_rails: u8,
    /// GID index (default: gdr's choice, the RoCE v2 IPv4 entry).
    pub gid_index: Option<u32>,
    /// Queue pairs per peer and rail (1..=16; default 2, as Mooncake). The peer that accepts
    /// a connection uses the connecting peer's count.
    pub qps_per_peer: u8,
    /// Largest work request: longer runs are cut into slices of this size (default 256 KiB,
    /// the stripe minimum, so that every striped transfer has a slice for two rails at least).
    /// Larger requests cost the NIC and the host less per byte: on Soft-RoCE with two CPUs a
    /// WRITE of 1 MiB blocks moved 1.9 times the bytes in 256 KiB requests that it moved in
    /// 64 KiB ones. Smaller ones spread one block over more queue pairs and retry less after a
    /// rail fails.
    pub slice_size: u64,
    /// Transfers of at most this many bytes stay on one rail; larger ones are striped over
    /// every active rail (default 256 KiB).
    pub stripe_min: u64,
    /// Local ACK timeout exponent of the queue pairs (4.096 us x 2^n; default 14 = 67 ms).
    pub ack_timeout: u8,
    /// Transport retries before a request fails and its rail is failed over (0..=6; default
    /// 6: about half a second with the default timeout. 7, infinite on some providers such
    /// as rxe, is refused: failover needs failures).
    pub retry_count: u8,
    /// Send-queue depth of each queue pair (default 256).
    pub send_queue_depth: u32,
    /// Most peers at once (sizes the completion queue; default 16).
    pub max_peers: u32,
    /// Notification receive slots per peer (default 64).
    pub notify_slots: u16,
    /// Largest notification (or message, [`crate::Peer::send_notification`]) this agent
    /// receives, in bytes (default 1024, at most 64 KiB): each receive slot holds one, so a
    /// peer takes `notify_slots` of them per rail in memory.
    pub notify_max: u32,
    /// Notifications the agent keeps for the application without their receive slot, counted
    /// across all its peers and connections (default 1024; those put back with
    /// [`crate::Agent::requeue_notification`] count too). Past it, each further notification
    /// holds its slot until the application takes it (the slot is not posted again), and that
    /// peer's next notifications wait in its NIC (receiver not ready, retried without limit;
    /// their transfers' deadlines still apply): nothing is dropped.
    ///
    /// So the untaken notifications number at most `notify_queue` (plus what the application
    /// put back) plus the receive slots the agent's connections hold (`notify_slots` per rail
    /// and connection, at most [`AgentConfig::max_peers`] connected). Reconnecting does not
    /// add to that: when a connection closes, the notifications holding its slots stay queued
    /// (they were delivered), and until the application took them no connection posts a
    /// receive slot beyond those given back one for one; the peers wait meanwhile.
    pub notify_queue: u32,
    /// Deadline of a transfer when its options give none (default 30 s).
    pub default_timeout: Duration,
    /// How long a transfer that stopped early (deadline, cancel, failure) waits for its
    /// requests in flight before the queue pairs carrying them are destroyed and renewed (a
    /// *fence*), and how long a fenced WRITE then waits at most for the peer to confirm its side
    /// of them is gone (default 500 ms). A transfer's outcome comes at most twice this (plus
    /// 5 ms) after its deadline; whatever it says, its memory is quiet by then.
    pub quiesce: Duration,
    /// Timeout of connection handshakes (default 10 s).
    pub connect_timeout: Duration,
    /// How long the progress thread keeps polling after the last completion before it sleeps on
    /// the completion channel (default 200 us; zero sleeps at once). It polls only while
    /// completions come that often (their average spacing, recent ones weighing most, is
    /// shorter): a stream of
    /// completions further apart gains nothing from polling, and on a host with few cores the
    /// polling takes time from other work (a software NIC's protocol, for one). The staging
    /// driver (GPU memory staged through host bounce buffers) paces itself the same way: it
    /// yields instead of sleeping while its copies and chunks finish that often.
    pub busy_poll: Duration,
    /// Whether the ranking of rails for a segment's memory takes this process's NCCL variables
    /// into account as `gdr doctor` does (`NCCL_IB_HCA` leaving a NIC out, a wrong
    /// `NCCL_IB_GID_INDEX`, a strict `NCCL_NET_GDR_LEVEL`). Default `false`: the rails are
    /// ranked from the topology alone, so NCCL settings exported for another program do not
    /// change which NICs this agent prefers. Which rails exist is [`AgentConfig::device`]'s
    /// business either way.
    pub rails_follow_nccl_env: bool,
    /// What to do with GPU memory the NIC cannot reach directly (default
    /// [`GpuStaging::Fallback`]).
    pub gpu_staging: GpuStaging,
    /// The bounce buffers of staged GPU memory, per GPU (default 4 x 8 MiB).
    pub staging: StagingConfig,
}

/// How [`Agent::register_gpu`](crate::Agent::register_gpu) treats GPU memory without a
/// GPUDirect path (no peer-memory module, no dma-buf support in the driver or the NIC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GpuStaging {
    /// Register it for GPUDirect; when gdr finds no direct path, stage it through host bounce
    /// buffers instead, and say so (a warning in the log, [`crate::Segment::path`]).
    #[default]
    Fallback,
    /// Never stage: registration fails with gdr's error and its hint.
    Never,
    /// Always stage, even where GPUDirect works (to compare the two, or to keep GPU memory
    /// away from the NIC).
    Always,
}

impl AgentConfig {
    /// The defaults, for an agent called `name`.
    pub fn new(name: impl Into<String>) -> AgentConfig {
        AgentConfig {
            name: name.into(),
            device: String::new(),
            max_rails: MAX_RAILS as u8,
            gid_index: None,
            qps_per_peer: 2,
            slice_size: 256 * 1024,
            stripe_min: 256 * 1024,
            ack_timeout: 14,
            retry_count: 6,
            send_queue_depth: 256,
            max_peers: 16,
            notify_slots: 64,
            notify_max: 1024,
            notify_queue: 1024,
            default_timeout: Duration::from_secs(30),
            quiesce: Duration::from_millis(500),
            connect_timeout: Duration::from_secs(10),
            busy_poll: Duration::from_micros(200),
            rails_follow_nccl_env: false,
            gpu_staging: GpuStaging::Fallback,
            staging: StagingConfig::default(),
        }
    }

    /// Sets the device.
    pub fn device(mut self, device: impl Into<String>) -> Self {
        self.device = device.into();
        self
    }

    /// Sets the most rails.
    pub fn max_rails(mut self, n: u8) -> Self {
        self.max_rails = n;
        self
    }

    /// Sets the size up to which a transfer stays on one rail.
    pub fn stripe_min(mut self, bytes: u64) -> Self {
        self.stripe_min = bytes;
        self
    }

    /// Sets the ACK timeout exponent and the retry count of the queue pairs.
    pub fn retries(mut self, ack_timeout: u8, retry_count: u8) -> Self {
        self.ack_timeout = ack_timeout;
        self.retry_count = retry_count;
        self
    }

    /// Sets the queue pairs per peer.
    pub fn qps_per_peer(mut self, n: u8) -> Self {
        self.qps_per_peer = n;
        self
    }

    /// Sets the slice size.
    pub fn slice_size(mut self, bytes: u64) -> Self {
        self.slice_size = bytes;
        self
    }

    /// Sets the default transfer deadline.
    pub fn default_timeout(mut self, t: Duration) -> Self {
        self.default_timeout = t;
        self
    }

    /// Sets how GPU memory without a direct path is treated.
    pub fn gpu_staging(mut self, mode: GpuStaging) -> Self {
        self.gpu_staging = mode;
        self
    }

    /// Sets the bounce buffers of staged GPU memory.
    pub fn staging(mut self, config: StagingConfig) -> Self {
        self.staging = config;
        self
    }

    /// Sets the send-queue depth per queue pair.
    pub fn send_queue_depth(mut self, n: u32) -> Self {
        self.send_queue_depth = n;
        self
    }

    /// Sets how long a stopped transfer waits for its requests in flight before they are
    /// fenced ([`AgentConfig::quiesce`]).
    pub fn quiesce(mut self, t: Duration) -> Self {
        self.quiesce = t;
        self
    }

    /// Sets the GID index of every rail.
    pub fn gid_index(mut self, index: u32) -> Self {
        self.gid_index = Some(index);
        self
    }

    /// Sets the most peers at once.
    pub fn max_peers(mut self, n: u32) -> Self {
        self.max_peers = n;
        self
    }

    /// Sets the notification receive slots per peer and rail.
    pub fn notify_slots(mut self, n: u16) -> Self {
        self.notify_slots = n;
        self
    }

    /// Sets how many notifications (from all peers together) are kept for the application
    /// before the peers are held back ([`AgentConfig::notify_queue`]).
    pub fn notify_queue(mut self, n: u32) -> Self {
        self.notify_queue = n;
        self
    }

    /// Sets the largest notification, in bytes (at most 64 KiB).
    pub fn notify_max(mut self, bytes: u32) -> Self {
        self.notify_max = bytes;
        self
    }

    /// Sets the handshake timeout.
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Sets how long the progress threads poll after the last completion before sleeping.
    pub fn busy_poll(mut self, t: Duration) -> Self {
        self.busy_poll = t;
        self
    }

    /// Sets whether the rail ranking follows this process's NCCL variables
    /// ([`AgentConfig::rails_follow_nccl_env`]).
    pub fn rails_follow_nccl_env(mut self, follow: bool) -> Self {
        self.rails_follow_nccl_env = follow;
        self
    }

    /// Checks the values.
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |what: String, hint: &'static str| Err(Error::invalid(what, hint));
        if self.name.is_empty() || self.name.len() > MAX_NAME {
            return bad(
                format!("agent name {:?}", self.name),
                "give every agent a name of 1 to 64 bytes",
            );
        }
        if self.qps_per_peer == 0 || usize::from(self.qps_per_peer) > MAX_QPS {
            return bad(
                format!("{} queue pairs per peer", self.qps_per_peer),
                "use 1..=16",
            );
        }
        if self.max_rails == 0 || usize::from(self.max_rails) > MAX_RAILS {
            return bad(format!("{} rails", self.max_rails), "use 1..=8");
        }
        if self.retry_count > 6 || self.ack_timeout == 0 || self.ack_timeout > 31 {
            return bad(
                format!(
                    "retry count {} with ACK timeout exponent {}",
                    self.retry_count, self.ack_timeout
                ),
                "use a retry count of 0..=6 and a timeout exponent of 1..=31 (14 = 67 ms)",
            );
        }
        if self.slice_size == 0 || self.slice_size > 1 << 30 {
            return bad(
                format!("slice size {}", self.slice_size),
                "use 4 KiB..1 GiB",
            );
        }
        if self.send_queue_depth < 2 {
            return bad(
                format!("send queue depth {}", self.send_queue_depth),
                "use at least 2 (256 is a good start)",
            );
        }
        self.staging.validate()?;
        if self.quiesce.is_zero() || self.quiesce > Duration::from_secs(60) {
            return bad(
                format!("quiesce time {:?}", self.quiesce),
                "use 1 ms..=60 s (500 ms is a good start)",
            );
        }
        if self.max_peers == 0 {
            return bad("max_peers 0".into(), "allow at least one peer");
        }
        if self.notify_slots == 0 || self.notify_max == 0 || self.notify_max > MAX_NOTIFY {
            return bad(
                format!(
                    "{} notification slots of {} bytes",
                    self.notify_slots, self.notify_max
                ),
                "use at least one slot of 1..=65536 bytes",
            );
        }
        Ok(())
    }
}

/// Options of one transfer.
#[derive(Debug, Clone, Default)]
pub struct TransferOptions {
    pub(crate) timeout: Option<Duration>,
    pub(crate) notify: Option<Vec<u8>>,
    pub(crate) post_inline_max: Option<u64>,
}

impl TransferOptions {
    /// No notification, the agent's default deadline.
    pub fn new() -> Self {
        Self::default()
    }

    /// The transfer's deadline, from submission: past it, it fails with
    /// [`Error::Timeout`](crate::Error::Timeout).
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// A notification the target receives after every byte of the transfer landed there.
    pub fn notify(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.notify = Some(data.into());
        self
    }

    /// Posts the transfer's requests on the submitting thread only when it moves at most
    /// `bytes`; a larger one is checked, planned and queued there (errors still come from the
    /// submitting call) and posted by [`Peer::post_queued`](crate::Peer::post_queued), called
    /// from another thread, or by the connection's next completion or timer tick (a progress
    /// thread runs them every 5 ms), whichever comes first.
    /// For a thread that must not spend the provider's time in `ibv_post_send`: an event
    /// loop. A software NIC such as Soft-RoCE does the NIC's work inside that call (measured
    /// in the Soft-RoCE VM: 0.06 ms to plan a 16 MiB write, 400 ms to post it). Staged
    /// transfers are posted by the staging thread anyway. Default: every transfer is posted
    /// at once.
    pub fn post_inline_max(mut self, bytes: u64) -> Self {
        self.post_inline_max = Some(bytes);
        self
    }
}

/// Longest sleep, and the period of the timers: an outcome may come this much after its due
/// time.
pub(crate) const TICK: Duration = Duration::from_millis(5);
