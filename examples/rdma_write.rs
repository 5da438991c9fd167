//! RDMA write between two processes.
//!
//! The server registers a region that peers may write, advertises it over TCP, and waits for a
//! write-with-immediate that says "done". The client writes a known pattern into the server's
//! region (`--iters` times, the last one with immediate data), and the server checks every byte.
//!
//! ```text
//! rdma_write --server [--port 18515] [--device rxe0] [--size 1048576]
//! rdma_write --connect 10.0.0.1 [--port 18515] [--device rxe0] [--size 1048576] [--iters 100]
//! ```
//!
//! `--gpu [ORDINAL]` puts the buffer on either side in GPU memory (`cuMemAlloc`), registered with
//! `GpuMemoryRegion` (dma-buf or peer memory, whichever the host supports; `--gpu-path` forces
//! one): the NIC then reads from and writes into GPU memory directly. On a host without an RDMA
//! device or without a usable GPU the program stops with the library's error and its hint.
//!
//! On a machine without an RDMA device, `cargo xtask demo` runs both sides in the Soft-RoCE VM.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use gdr::connect::{self, TcpLink};
use gdr::cq::{CompletionQueue, WcOpcode};
use gdr::cuda::DeviceBuffer;
use gdr::device::{Context, Selection};
use gdr::gpu_mr::{GpuMemoryRegion, RegistrationPath};
use gdr::mr::{AccessFlags, LocalSlice, MemoryRegion, RemoteRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::wr::{RecvRequest, SendRequest};

#[derive(Parser, Debug)]
#[command(about = "RDMA write from a client into a server's memory, verified by the server")]
struct Args {
    /// Run as the server (the side whose memory is written).
    #[arg(long, conflicts_with = "connect")]
    server: bool,
    /// Run as the client and connect to this server address.
    #[arg(long)]
    connect: Option<String>,
    /// TCP port of the out-of-band exchange.
    #[arg(long, default_value_t = 18515)]
    port: u16,
    /// RDMA device, `name[:port]` or an NCCL-style list (default: the first device).
    #[arg(long, short = 'd', default_value = "")]
    device: String,
    /// GID index (default: the RoCE v2 IPv4 entry).
    #[arg(long, short = 'x')]
    gid_index: Option<u32>,
    /// Bytes per write.
    #[arg(long, short = 's', default_value_t = 1 << 20)]
    size: usize,
    /// Number of writes.
    #[arg(long, short = 'n', default_value_t = 100)]
    iters: u32,
    /// Use GPU memory on this CUDA device (default ordinal 0) instead of host memory.
    #[arg(long, num_args = 0..=1, default_missing_value = "0")]
    gpu: Option<i32>,
    /// GPU registration path: auto, dmabuf or peermem.
    #[arg(long, default_value = "auto", value_parser = ["auto", "dmabuf", "peermem"])]
    gpu_path: String,
}

/// The buffer of either side: host memory, or GPU memory the NIC reaches directly.
enum Buffer {
    Host(Arc<MemoryRegion>),
    Gpu(Arc<GpuMemoryRegion>),
}

impl Buffer {
    fn new(pd: &Arc<ProtectionDomain>, args: &Args, access: AccessFlags) -> gdr::Result<Buffer> {
        let Some(ordinal) = args.gpu else {
            return Ok(Buffer::Host(MemoryRegion::new(pd, args.size, access)?));
        };
        let path = match args.gpu_path.as_str() {
            "dmabuf" => RegistrationPath::DmaBuf,
            "peermem" => RegistrationPath::PeerMemory,
            _ => RegistrationPath::Auto,
        };
        let buf = Arc::new(DeviceBuffer::alloc(ordinal, args.size)?);
        let mr = GpuMemoryRegion::register(pd, buf, .., access, path)?;
        println!(
            "GPU {ordinal}: {} bytes registered through {:?}",
            args.size,
            mr.path()
        );
        Ok(Buffer::Gpu(mr))
    }

    fn slice(&self) -> gdr::Result<LocalSlice> {
        match self {
            Buffer::Host(m) => m.slice(..),
            Buffer::Gpu(m) => m.slice(..),
        }
    }

    fn remote(&self) -> RemoteRegion {
        match self {
            Buffer::Host(m) => m.remote(),
            Buffer::Gpu(m) => m.remote(),
        }
    }

    fn fill(&self, data: &[u8]) -> gdr::Result<()> {
        match self {
            Buffer::Host(m) => m.write(0, data),
            Buffer::Gpu(m) => m
                .buffer()
                .expect("registered from a DeviceBuffer")
                .copy_from_host(0, data),
        }
    }

    /// The bytes, after the RDMA writes into it completed.
    fn contents(&self) -> gdr::Result<Vec<u8>> {
        match self {
            Buffer::Host(m) => Ok(m.to_vec()),
            Buffer::Gpu(m) => {
                m.flush_rdma_writes()?;
                m.buffer().expect("registered from a DeviceBuffer").to_vec()
            }
        }
    }
}

/// The byte the client writes at `i` in iteration `iter`: every byte position and every
/// iteration differ, so a stale or misplaced write shows.
fn pattern(i: usize, iter: u32) -> u8 {
    (i as u32)
        .wrapping_mul(31)
        .wrapping_add(iter.wrapping_mul(7))
        .wrapping_add((i >> 8) as u32) as u8
}

struct Rdma {
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
    qp: QueuePair,
}

fn open(args: &Args) -> gdr::Result<Rdma> {
    let (ctx, port) = Context::open_selected(&Selection::parse(&args.device)?)?;
    let pd = ProtectionDomain::new(&ctx)?;
    let cq = CompletionQueue::with_channel(&ctx, 256)?;
    let mut b = QueuePair::builder(&pd, &cq, &cq).port(port).max_send_wr(64);
    if let Some(i) = args.gid_index {
        b = b.gid_index(i);
    }
    let qp = b.build()?;
    let e = qp.endpoint();
    println!(
        "device {} port {port}: QPN {:#x}, GID[{}] {}, MTU {}",
        ctx.name(),
        e.qpn,
        e.gid_index,
        e.gid,
        e.mtu
    );
    Ok(Rdma { pd, cq, qp })
}

fn server(args: &Args) -> gdr::Result<()> {
    let r = open(args)?;
    let mr = Buffer::new(
        &r.pd,
        args,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    // The client's final write carries immediate data and consumes this receive.
    r.qp.post_recv(&RecvRequest::new(&[]).id(1))?;
    let listener = TcpListener::bind(("0.0.0.0", args.port))
        .map_err(|e| gdr::Error::io(format!("listening on port {}", args.port), e))?;
    println!("server: waiting on TCP port {}", args.port);
    let mut link = TcpLink::accept(&listener)?;
    let peer = connect::handshake(&mut link, &r.qp, &[mr.remote()])?;
    println!(
        "server: connected to {} (QPN {:#x})",
        link.peer_addr(),
        peer.endpoint.qpn
    );
    let c = r.cq.wait_for(1, Duration::from_secs(60))?;
    let c = c[0].result()?;
    if c.opcode != WcOpcode::RecvRdmaWithImm {
        return Err(gdr::Error::protocol(format!(
            "expected a write with immediate, got {:?}",
            c.opcode
        )));
    }
    let iters = c.imm.unwrap_or(0);
    let data = mr.contents()?;
    let last = iters.saturating_sub(1);
    if let Some(bad) = (0..data.len()).find(|&i| data[i] != pattern(i, last)) {
        link.send_bytes(b"FAIL")?;
        return Err(gdr::Error::protocol(format!(
            "byte {bad} is {:#04x}, expected {:#04x} (iteration {last})",
            data[bad],
            pattern(bad, last)
        )));
    }
    link.send_bytes(b"OK")?;
    println!(
        "server: verified {} bytes written by {iters} RDMA writes: OK",
        data.len()
    );
    Ok(())
}

fn client(args: &Args, host: &str) -> gdr::Result<()> {
    let r = open(args)?;
    let mr = Buffer::new(&r.pd, args, AccessFlags::LOCAL_WRITE)?;
    let mut link = TcpLink::connect((host, args.port), Duration::from_secs(30))?;
    let peer = connect::handshake(&mut link, &r.qp, &[])?;
    let remote = *peer
        .regions
        .first()
        .ok_or_else(|| gdr::Error::protocol("server advertised no region"))?;
    let remote = remote.slice(0..args.size as u64)?;
    let local = [mr.slice()?];
    let iters = args.iters.max(1);
    let mut buf = vec![0u8; args.size];
    let mut busy = Duration::ZERO;
    for iter in 0..iters {
        buf.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = pattern(i, iter));
        mr.fill(&buf)?;
        let t = Instant::now();
        let req = SendRequest::write(&local, remote).id(u64::from(iter));
        let req = if iter + 1 == iters {
            req.with_imm(iters)
        } else {
            req
        };
        r.qp.post_send(&req)?;
        r.cq.wait_for(1, Duration::from_secs(30))?[0].result()?;
        busy += t.elapsed();
    }
    let verdict = link.recv_bytes()?;
    let bytes = args.size as u64 * u64::from(iters);
    println!(
        "client: wrote {bytes} bytes in {iters} RDMA writes of {} bytes: {:.3} s on the wire, {:.3} Gb/s; server says {}",
        args.size,
        busy.as_secs_f64(),
        bytes as f64 * 8.0 / busy.as_secs_f64() / 1e9,
        String::from_utf8_lossy(&verdict)
    );
    if verdict != b"OK" {
        return Err(gdr::Error::protocol("the server found wrong data"));
    }
    Ok(())
}

fn main() {
    env_logger::init();
    let args = Args::parse();
    let result = match (&args.connect, args.server) {
        (Some(host), _) => client(&args, host),
        (None, true) => server(&args),
        (None, false) => {
            eprintln!("give --server or --connect HOST");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("rdma_write: {e}");
        std::process::exit(1);
    }
}
