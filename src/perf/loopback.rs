//! Two connected queue pairs of one process on one device (each with its own completion queue)
//! and their buffers: what `cargo bench` and the allocation test measure in-process.

use std::sync::Arc;

use gdr::cq::CompletionQueue;
use gdr::device::Context;
use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;

use super::engine::{Arrival, Flow, PingPong};
use super::params::Op;

/// The device named by `GDR_TEST_DEVICE` and the GID index in `GDR_TEST_GID_INDEX` (optional);
/// a clear message when the variable is missing.
pub fn device_from_env() -> Result<(String, Option<u32>), String> {
    let dev = std::env::var("GDR_TEST_DEVICE").map_err(|_| {
        "GDR_TEST_DEVICE is not set: this needs an RDMA device (run it through `cargo xtask \
         bench` / `cargo xtask test`, which boot the Soft-RoCE VM, or set GDR_TEST_DEVICE=mlx5_0 \
         and GDR_TEST_GID_INDEX on a host with one)"
            .to_string()
    })?;
    let gid = match std::env::var("GDR_TEST_GID_INDEX") {
        Ok(v) => Some(
            v.parse()
                .map_err(|_| format!("GDR_TEST_GID_INDEX={v:?} is not a number"))?,
        ),
        Err(_) => None,
    };
    Ok((dev, gid))
}

/// Queue pairs `a` and `b` connected to each other, with a source and a target buffer per side.
pub struct Loopback {
    /// Completion queue of `a`.
    pub cq_a: Arc<CompletionQueue>,
    /// Completion queue of `b`.
    pub cq_b: Arc<CompletionQueue>,
    /// The active side.
    pub a: QueuePair,
    /// The passive (or answering) side.
    pub b: QueuePair,
    /// `a`'s source.
    pub src_a: Arc<MemoryRegion>,
    /// `a`'s target (`b` writes here).
    pub dst_a: Arc<MemoryRegion>,
    /// `b`'s source.
    pub src_b: Arc<MemoryRegion>,
    /// `b`'s target (`a` writes here).
    pub dst_b: Arc<MemoryRegion>,
}

impl Loopback {
    /// Opens `device`, creates both queue pairs (`tx_depth` requests in flight each) with
    /// buffers of `len` bytes, and connects them.
    pub fn open(
        device: &str,
        gid_index: Option<u32>,
        tx_depth: u32,
        len: usize,
    ) -> gdr::Result<Self> {
        let ctx = Context::open(device)?;
        let pd = ProtectionDomain::new(&ctx)?;
        let cq_a = CompletionQueue::new(&ctx, tx_depth * 2 + 64)?;
        let cq_b = CompletionQueue::new(&ctx, tx_depth * 2 + 64)?;
        let qp = |cq: &Arc<CompletionQueue>| {
            let mut b = QueuePair::builder(&pd, cq, cq)
                .max_send_wr(tx_depth * 2)
                .max_send_sge(1)
                .max_recv_sge(1)
                .max_inline_data(0);
            if let Some(g) = gid_index {
                b = b.gid_index(g);
            }
            b.build()
        };
        let (a, b) = (qp(&cq_a)?, qp(&cq_b)?);
        a.connect(&b.endpoint())?;
        b.connect(&a.endpoint())?;
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let len = len.max(64).next_multiple_of(8);
        let data: Vec<u8> = (0..len).map(super::engine::pattern).collect();
        Ok(Loopback {
            src_a: MemoryRegion::with_data(&pd, &data, access)?,
            dst_a: MemoryRegion::new(&pd, len, access)?,
            src_b: MemoryRegion::with_data(&pd, &data, access)?,
            dst_b: MemoryRegion::new(&pd, len, access)?,
            cq_a,
            cq_b,
            a,
            b,
        })
    }

    /// `a` writing (or reading, per `op`) `size` bytes into `b`'s target.
    pub fn flow_a(&self, size: usize) -> gdr::Result<Flow<'_>> {
        Ok(Flow {
            qp: &self.a,
            local: [self.src_a.slice(0..size)?],
            remote: self.dst_b.remote().slice(0..size as u64)?,
            inline: None,
        })
    }

    /// The two sides of a write ping-pong of `size` bytes polling the last byte
    /// (`.0` initiates on `a`, `.1` answers on `b`).
    pub fn ping_pong(
        &self,
        size: usize,
        cq_mod: u32,
        tx_depth: u32,
    ) -> gdr::Result<(PingPong<'_>, PingPong<'_>)> {
        let side = |qp: &'static str| -> gdr::Result<PingPong<'_>> {
            let (q, cq, src, dst, peer) = if qp == "a" {
                (&self.a, &self.cq_a, &self.src_a, &self.dst_a, &self.dst_b)
            } else {
                (&self.b, &self.cq_b, &self.src_b, &self.dst_b, &self.dst_a)
            };
            Ok(PingPong {
                qp: q,
                cq,
                flow: Flow {
                    qp: q,
                    local: [src.slice(0..size)?],
                    remote: peer.remote().slice(0..size as u64)?,
                    inline: None,
                },
                op: Op::Write,
                arrival: Arrival::LastByte(dst),
                size,
                cq_mod,
                tx_depth,
                marker_src: Some(src),
                warmup: super::engine::lat_warmup(cq_mod),
            })
        };
        self.dst_a.fill(0, size, 0)?;
        self.dst_b.fill(0, size, 0)?;
        Ok((side("a")?, side("b")?))
    }
}
