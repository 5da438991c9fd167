//! Settings of a queue pair and its builder.

use std::sync::Arc;

use super::QueuePair;
use crate::cq::CompletionQueue;
use crate::device::Mtu;
use crate::error::Result;
use crate::mr::AccessFlags;
use crate::pd::ProtectionDomain;

/// Settings of a queue pair. Defaults follow perftest and NCCL.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct QpConfig {
    /// Send queue depth (default 128).
    pub max_send_wr: u32,
    /// Receive queue depth (default 128).
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send request (default 4, at most [`MAX_SGE`](super::MAX_SGE)).
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive request (default 4, at most [`MAX_SGE`](super::MAX_SGE)).
    pub max_recv_sge: u32,
    /// Inline data bytes (default 64).
    pub max_inline_data: u32,
    /// Port; `None` (the default) uses the port the device context was opened with
    /// ([`crate::device::Context::port`], 1 unless a selection such as `mlx5_0:2` named another).
    pub port: Option<u8>,
    /// GID index; `None` picks RoCE v2 IPv4 on Ethernet ports, 0 on InfiniBand.
    pub gid_index: Option<u32>,
    /// Path MTU cap; `None` uses the port's active MTU (and the peer's, whichever is smaller).
    pub mtu: Option<Mtu>,
    /// Local ACK timeout exponent: 4.096 us * 2^timeout (default 14, about 67 ms).
    pub timeout: u8,
    /// Transport retries (default 7).
    pub retry_count: u8,
    /// RNR retries (default 7 = infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code (default 12).
    pub min_rnr_timer: u8,
    /// Outstanding reads/atomics; `None` takes the device's maximum (capped at 16).
    pub max_rd_atomic: Option<u8>,
    /// What peers may do through this queue pair (default remote write, read and atomics; each
    /// region's own access flags still apply).
    pub access: AccessFlags,
    /// Initial PSN; `None` draws a random one.
    pub psn: Option<u32>,
    /// Traffic class (RoCE DSCP << 2).
    pub traffic_class: u8,
    /// Service level.
    pub service_level: u8,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
            port: None,
            gid_index: None,
            mtu: None,
            timeout: 14,
            retry_count: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: None,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            psn: None,
            traffic_class: 0,
            service_level: 0,
        }
    }
}

/// Builds a [`QueuePair`]; see [`QpConfig`] for the settings and defaults.
#[must_use = "a builder does nothing until build() is called"]
pub struct QueuePairBuilder {
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) send_cq: Arc<CompletionQueue>,
    pub(super) recv_cq: Arc<CompletionQueue>,
    pub(super) cfg: QpConfig,
}

macro_rules! setter {
    ($(#[$m:meta])* $name:ident: $t:ty) => {
        $(#[$m])*
        pub fn $name(mut self, v: $t) -> Self {
            self.cfg.$name = v;
            self
        }
    };
}

impl QueuePairBuilder {
    setter!(/// Send queue depth.
        max_send_wr: u32);
    setter!(/// Receive queue depth.
        max_recv_wr: u32);
    setter!(/// SGEs per send request.
        max_send_sge: u32);
    setter!(/// SGEs per receive request.
        max_recv_sge: u32);
    setter!(/// Inline bytes.
        max_inline_data: u32);
    setter!(/// Local ACK timeout exponent.
        timeout: u8);
    setter!(/// Transport retry count.
        retry_count: u8);
    setter!(/// RNR retry count (7 = infinite).
        rnr_retry: u8);
    setter!(/// Minimum RNR NAK timer code.
        min_rnr_timer: u8);
    setter!(/// Remote access allowed through this QP.
        access: AccessFlags);
    setter!(/// Traffic class.
        traffic_class: u8);
    setter!(/// Service level.
        service_level: u8);

    /// Uses `port` instead of the device context's port.
    pub fn port(mut self, port: u8) -> Self {
        self.cfg.port = Some(port);
        self
    }

    /// Uses GID `index` instead of the automatic RoCE v2 choice.
    pub fn gid_index(mut self, index: u32) -> Self {
        self.cfg.gid_index = Some(index);
        self
    }

    /// Caps the path MTU.
    pub fn mtu(mut self, mtu: Mtu) -> Self {
        self.cfg.mtu = Some(mtu);
        self
    }

    /// Sets the initial PSN (24 bits).
    pub fn psn(mut self, psn: u32) -> Self {
        self.cfg.psn = Some(psn);
        self
    }

    /// Sets outstanding reads/atomics.
    pub fn max_rd_atomic(mut self, n: u8) -> Self {
        self.cfg.max_rd_atomic = Some(n);
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, cfg: QpConfig) -> Self {
        self.cfg = cfg;
        self
    }

    /// Creates the queue pair and moves it to INIT (receives may be posted from now on).
    pub fn build(self) -> Result<QueuePair> {
        QueuePair::create(self.pd, self.send_cq, self.recv_cq, self.cfg)
    }
}
