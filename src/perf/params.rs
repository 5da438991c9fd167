//! What both sides of a measurement agree on (sent by the client, followed by the server) and
//! what each side chooses for itself (device, GID, memory).

use serde::{Deserialize, Serialize};

/// The largest message of a sweep (`-a`): 8 MiB, as perftest.
pub const SWEEP_MAX: usize = 8 << 20;

/// Which measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Test {
    /// Bandwidth and message rate (`ib_*_bw`).
    Bw,
    /// Ping-pong latency (`ib_*_lat`).
    Lat,
}

/// The RDMA operation measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// RDMA write.
    Write,
    /// RDMA read (bandwidth only).
    Read,
    /// Send/receive.
    Send,
}

/// How GPU memory is registered (`--cuda-path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CudaPath {
    /// dma-buf when GPU and NIC support it, peer memory otherwise.
    #[default]
    Auto,
    /// Only dma-buf (`ibv_reg_dmabuf_mr`).
    Dmabuf,
    /// Only peer memory (`nvidia_peermem`, `ibv_reg_mr` on the device pointer).
    Peermem,
}

impl CudaPath {
    /// The library's registration path.
    pub fn registration(self) -> gdr::gpu_mr::RegistrationPath {
        use gdr::gpu_mr::RegistrationPath as R;
        match self {
            CudaPath::Auto => R::Auto,
            CudaPath::Dmabuf => R::DmaBuf,
            CudaPath::Peermem => R::PeerMemory,
        }
    }
}

/// When a measurement of one size stops.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    /// After this many messages per queue pair.
    Iters(u64),
    /// After this many seconds.
    Duration(f64),
}

/// Parameters both sides use; the client sends them, the server follows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Bandwidth or latency.
    pub test: Test,
    /// Operation.
    pub op: Op,
    /// Message sizes in bytes, measured in this order.
    pub sizes: Vec<usize>,
    /// Iterations or duration per size.
    pub limit: Limit,
    /// Queue pairs (bandwidth).
    pub qps: u32,
    /// Requests in flight per queue pair.
    pub tx_depth: u32,
    /// Signal one request in every `cq_mod`.
    pub cq_mod: u32,
    /// Largest message sent inline (host memory only); 0 disables inline.
    pub inline_size: u32,
    /// Most requests posted with one doorbell (bandwidth; 1 = one `ibv_post_send` per request,
    /// as perftest does by default; 0 = automatic per size, see [`Params::post_list_for`]).
    pub post_list: u32,
}

/// Automatic post lists put at most this many payload bytes behind one doorbell.
pub const AUTO_LIST_BYTES: usize = 65536;

/// Automatic post lists are at most this long.
pub const AUTO_LIST_MAX: u32 = 16;

/// The automatic post list for messages of `size` bytes (before the tx-depth cap).
pub fn auto_post_list(size: usize) -> u32 {
    (AUTO_LIST_BYTES / size.max(1)).clamp(1, AUTO_LIST_MAX as usize) as u32
}

/// Sizes of a sweep: 2 B to 8 MiB by powers of two.
pub fn sweep_sizes() -> Vec<usize> {
    (1..)
        .map(|p| 1usize << p)
        .take_while(|&s| s <= SWEEP_MAX)
        .collect()
}

/// Why parameters are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParamError(pub String);

impl Params {
    /// Checks the combination; the server runs this too on what it received.
    pub fn validate(&self) -> Result<(), ParamError> {
        let bad = |s: String| Err(ParamError(s));
        if self.sizes.is_empty() {
            return bad("no message size given".into());
        }
        if let Some(&s) = self.sizes.iter().find(|&&s| s == 0 || s > 1 << 30) {
            return bad(format!("message size {s} is outside 1 B .. 1 GiB"));
        }
        if self.qps == 0 || self.qps > 1024 {
            return bad(format!("--qps {} is outside 1..1024", self.qps));
        }
        if self.tx_depth == 0 || self.tx_depth > 8192 {
            return bad(format!("--tx-depth {} is outside 1..8192", self.tx_depth));
        }
        let most = (gdr::qp::LIST_CHUNK as u32).min(self.tx_depth);
        if self.post_list > most {
            return bad(format!(
                "--post-list {} is outside 1..={most} (at most {} and the tx depth)",
                self.post_list,
                gdr::qp::LIST_CHUNK
            ));
        }
        if self.cq_mod == 0 {
            return bad("--cq-mod must be at least 1".into());
        }
        match self.limit {
            Limit::Iters(0) => return bad("--iters must be at least 1".into()),
            Limit::Iters(n) if n > u32::MAX as u64 => {
                return bad(format!("--iters {n} exceeds {}", u32::MAX))
            }
            Limit::Duration(d) if !(d > 0.0 && d <= 3600.0) => {
                return bad(format!("--duration {d} is outside (0, 3600] seconds"))
            }
            _ => {}
        }
        Ok(())
    }

    /// The signalling interval actually used: at most the tx depth (perftest caps it the same way,
    /// otherwise the queue fills with unsignalled requests and nothing completes).
    pub fn effective_cq_mod(&self) -> u32 {
        self.cq_mod.min(self.tx_depth).max(1)
    }

    /// Requests per doorbell for messages of `size` bytes: the fixed `post_list`, or when it is
    /// 0 (automatic) as many as fit in [`AUTO_LIST_BYTES`] of payload, 1 to [`AUTO_LIST_MAX`],
    /// at most the tx depth. Small messages gain from fewer doorbells (fewer system calls on
    /// Soft-RoCE, fewer MMIO writes on a NIC); large ones are paced by the wire, and on
    /// Soft-RoCE a request per call keeps the kernel's protocol work moving steadily.
    pub fn post_list_for(&self, size: usize) -> u32 {
        let n = if self.post_list > 0 {
            self.post_list
        } else {
            auto_post_list(size)
        };
        n.min(self.tx_depth).max(1)
    }

    /// The largest size measured.
    pub fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(1)
    }
}

/// What the server answers to the parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerHello {
    /// `None` when the server accepted the parameters and set itself up; otherwise why not.
    pub error: Option<String>,
    /// Whether the server's buffers are GPU memory (latency then uses write with immediate).
    pub gpu: bool,
}

/// The server's verdict after one size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// Whether the server found the data and completions it expected.
    pub ok: bool,
    /// What was wrong (empty when ok).
    pub detail: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Params {
        Params {
            test: Test::Bw,
            op: Op::Write,
            sizes: vec![65536],
            limit: Limit::Iters(5000),
            qps: 1,
            tx_depth: 128,
            cq_mod: 100,
            inline_size: 0,
            post_list: 0,
        }
    }

    #[test]
    fn sweep_is_2_bytes_to_8_mib() {
        let s = sweep_sizes();
        assert_eq!((s[0], *s.last().unwrap(), s.len()), (2, SWEEP_MAX, 23));
        assert!(s.windows(2).all(|w| w[1] == 2 * w[0]));
    }

    #[test]
    fn validation_names_the_bad_option() {
        assert_eq!(base().validate(), Ok(()));
        let mut p = base();
        p.qps = 0;
        assert!(p.validate().unwrap_err().0.contains("--qps"));
        let mut p = base();
        p.limit = Limit::Iters(0);
        assert!(p.validate().unwrap_err().0.contains("--iters"));
        let mut p = base();
        p.sizes = vec![0];
        assert!(p.validate().unwrap_err().0.contains("size 0"));
        let mut p = base();
        p.post_list = 129;
        assert!(p.validate().unwrap_err().0.contains("--post-list 129"));
        let mut p = base();
        p.limit = Limit::Duration(0.0);
        assert!(p.validate().unwrap_err().0.contains("--duration 0"));
        let mut p = base();
        p.test = Test::Lat;
        p.op = Op::Read;
        assert_eq!(p.validate(), Ok(()), "read latency is measured");
    }

    #[test]
    fn automatic_post_lists_hold_64_kib_of_payload() {
        let mut p = base();
        let auto: Vec<u32> = [2, 4096, 8192, 32768, 65536, 1 << 20]
            .iter()
            .map(|&s| p.post_list_for(s))
            .collect();
        assert_eq!(auto, [16, 16, 8, 2, 1, 1]);
        p.tx_depth = 4;
        assert_eq!(p.post_list_for(2), 4, "never more than the tx depth");
        p.tx_depth = 128;
        p.post_list = 8;
        assert_eq!(
            (p.post_list_for(2), p.post_list_for(1 << 20)),
            (8, 8),
            "fixed"
        );
    }

    #[test]
    fn cq_mod_is_capped_by_depth() {
        let mut p = base();
        p.tx_depth = 16;
        assert_eq!(p.effective_cq_mod(), 16);
        p.tx_depth = 128;
        assert_eq!(p.effective_cq_mod(), 100);
    }

    #[test]
    fn params_round_trip_as_json() {
        let mut p = base();
        p.limit = Limit::Duration(1.5);
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Params>(&text).unwrap(), p);
    }
}
