//! The two sides of a measurement over TCP: the client sends the parameters, the server follows;
//! both set up their device, exchange endpoints and regions, then measure size after size. The
//! client sends each size's figures to the server, the server answers with its verification
//! verdict, and both print the same rows.

use std::io::IsTerminal;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gdr::connect::{PeerInfo, TcpLink};
use gdr::cq::{Completion, CompletionQueue};
use gdr::device::{Context, Selection};
use gdr::mr::{AccessFlags, LocalSlice, RemoteRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::{Error, Hint};
use serde::{Deserialize, Serialize};

use super::engine::{self, Arrival, BwState, Flow, Memory, PingPong, RecvSink};
use super::params::{CudaPath, Limit, Op, Params, ServerHello, Test, Verdict};
use super::report::{self, BwRow, LatRow, Report, Rows};
use super::stats;

/// What each side chooses for itself.
#[derive(Debug, Clone, Default)]
pub struct LocalOpts {
    /// NCCL-style device selection (`""` = first device).
    pub device: String,
    /// GID index (`None` = automatic RoCE v2 choice).
    pub gid_index: Option<u32>,
    /// TCP port of the exchange.
    pub port: u16,
    /// GPU memory on this CUDA device, registered this way.
    pub cuda: Option<(i32, CudaPath)>,
}

/// How results are printed.
#[derive(Debug, Clone, Default)]
pub struct OutputOpts {
    /// One JSON document on stdout instead of the table.
    pub json: bool,
    /// CSV on stdout instead of the table.
    pub csv: bool,
    /// Write an SVG plot here.
    pub plot: Option<PathBuf>,
    /// Gb/s instead of MiB/s.
    pub gbits: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct ClientHello {
    params: Params,
    gpu: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct ClientRow {
    bw: Option<BwRow>,
    lat: Option<LatRow>,
    /// What the client found wrong (read data, latency data).
    problem: Option<String>,
}

fn to_json<T: Serialize>(v: &T) -> gdr::Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| Error::protocol(format!("encoding a message: {e}")))
}

fn from_json<T: for<'de> Deserialize<'de>>(b: &[u8], what: &str) -> gdr::Result<T> {
    serde_json::from_slice(b).map_err(|e| {
        Error::protocol(format!(
            "the peer sent a malformed {what} ({e}); are both sides the same gdr version?"
        ))
    })
}

/// A side's RDMA resources.
struct Side {
    device: String,
    cq: Arc<CompletionQueue>,
    qps: Vec<QueuePair>,
    /// Bandwidth: one buffer per queue pair. Latency: the send source.
    mem: Vec<Memory>,
    /// Latency: the buffer the peer writes (advertised).
    recv_mem: Option<Memory>,
    gid_index: u32,
    inline_size: u32,
}

impl Side {
    fn open(local: &LocalOpts, p: &Params) -> gdr::Result<Side> {
        let (ctx, port) = Context::open_selected(&Selection::parse(&local.device)?)?;
        let pd = ProtectionDomain::new(&ctx)?;
        let qps_n = if p.test == Test::Lat { 1 } else { p.qps };
        let rx = if p.op == Op::Send && p.test == Test::Bw {
            512
        } else {
            engine::LAT_RX_DEPTH.max(16)
        };
        let send_wr = p.tx_depth * 2;
        let cq = CompletionQueue::new(&ctx, qps_n * (send_wr + rx) + 16)?;
        let cuda = local.cuda.map(|(o, path)| (o, path.registration()));
        let inline = if cuda.is_some() { 0 } else { p.inline_size };
        let build = |inline: u32| -> gdr::Result<QueuePair> {
            let mut b = QueuePair::builder(&pd, &cq, &cq)
                .port(port)
                .max_send_wr(send_wr)
                .max_recv_wr(rx)
                .max_send_sge(1)
                .max_recv_sge(1)
                .max_inline_data(inline);
            if let Some(g) = local.gid_index {
                b = b.gid_index(g);
            }
            b.build()
        };
        let mut inline_size = inline;
        let mut qps = Vec::new();
        for _ in 0..qps_n {
            let qp = match build(inline_size) {
                Err(e) if inline_size > 0 => {
                    log::warn!(
                        "queue pair with {inline_size} inline bytes refused ({e}); without inline"
                    );
                    inline_size = 0;
                    build(0)?
                }
                r => r?,
            };
            qps.push(qp);
        }
        let len = p.max_size().max(64).next_multiple_of(8);
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mem = (0..qps_n)
            .map(|_| Memory::alloc(&pd, len, access, cuda))
            .collect::<gdr::Result<Vec<_>>>()?;
        let recv_mem = if p.test == Test::Lat {
            Some(Memory::alloc(&pd, len, access, cuda)?)
        } else {
            None
        };
        let gid_index = qps[0].endpoint().gid_index;
        Ok(Side {
            device: format!("{}:{port}", ctx.name()),
            cq,
            qps,
            mem,
            recv_mem,
            gid_index,
            inline_size,
        })
    }

    /// The region the peer targets on queue pair `q`.
    fn advertised(&self, q: usize) -> RemoteRegion {
        match &self.recv_mem {
            Some(m) => m.remote(),
            None => self.mem[q].remote(),
        }
    }

    /// Exchanges endpoints and regions for every queue pair, connects them, then waits at a barrier.
    fn connect(&self, link: &mut TcpLink) -> gdr::Result<Vec<RemoteRegion>> {
        let mut peers = Vec::new();
        for (q, qp) in self.qps.iter().enumerate() {
            let peer = link.exchange(&PeerInfo::new(qp.endpoint()).region(self.advertised(q)))?;
            qp.connect(&peer.endpoint)?;
            peers.push(*peer.regions.first().ok_or_else(|| {
                Error::protocol("the peer advertised no region for a queue pair")
            })?);
        }
        link.barrier()?;
        Ok(peers)
    }

    fn memory_text(&self) -> String {
        self.mem[0].describe()
    }

    fn is_gpu(&self) -> bool {
        self.mem[0].is_gpu()
    }
}

/// The role of a side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Client,
    Server,
}

struct Printer<'a> {
    out: &'a OutputOpts,
    report: Report,
    progress: bool,
}

impl Printer<'_> {
    fn table(&self) -> bool {
        !self.out.json && !self.out.csv
    }

    fn start(&self) {
        if self.table() {
            print!("{}", report::table::head(&self.report, self.out.gbits));
        }
    }

    fn progress(&self, k: usize, n: usize, size: usize) {
        if self.progress {
            eprint!("\r\x1b[K[{}/{n}] measuring {size} bytes ...", k + 1);
        }
    }

    fn row(&mut self, bw: Option<BwRow>, lat: Option<LatRow>) {
        if self.progress {
            eprint!("\r\x1b[K");
        }
        let table = self.table();
        match (&mut self.report.results, bw, lat) {
            (Rows::Bw(rows), Some(r), _) => {
                if table {
                    print!("{}", report::table::bw_line(&r, self.out.gbits));
                }
                rows.push(r);
            }
            (Rows::Lat(rows), _, Some(r)) => {
                if table {
                    print!("{}", report::table::lat_line(&r));
                }
                rows.push(r);
            }
            _ => {}
        }
    }

    fn finish(&self) -> gdr::Result<()> {
        if self.table() {
            print!("{}", report::table::tail(&self.report));
        } else if self.out.json {
            let text = serde_json::to_string_pretty(&self.report)
                .map_err(|e| Error::protocol(format!("encoding the report: {e}")))?;
            println!("{text}");
        } else {
            print!("{}", report::csv::render(&self.report.results));
        }
        if let Some(path) = &self.out.plot {
            std::fs::write(path, report::svg::plot(&self.report, self.out.gbits))
                .map_err(|e| Error::io(format!("writing the plot {}", path.display()), e))?;
            eprintln!("plot written to {}", path.display());
        }
        Ok(())
    }
}

/// Runs the server: waits for one client, follows its parameters, prints the results.
pub fn run_server(test: Test, local: &LocalOpts, out: &OutputOpts) -> gdr::Result<Report> {
    let listener = TcpListener::bind(("0.0.0.0", local.port))
        .map_err(|e| Error::io(format!("listening on TCP port {}", local.port), e))?;
    eprintln!("waiting for a client on TCP port {} ...", local.port);
    let mut link = TcpLink::accept(&listener)?;
    link.set_timeout(None)?;
    let hello: ClientHello = from_json(&link.recv_bytes()?, "parameter message")?;
    let p = hello.params;
    let setup = (|| {
        if p.test != test {
            return Err(Error::invalid(
                format!(
                    "the client runs a {:?} test but this server was started for {:?}",
                    p.test, test
                ),
                "start the server with the same subcommand (gdr bw / gdr lat) as the client",
            ));
        }
        p.validate()
            .map_err(|e| Error::invalid(format!("client parameters: {e}"), Hint::NONE))?;
        Side::open(local, &p)
    })();
    let side = match setup {
        Ok(s) => s,
        Err(e) => {
            let _ = link.send_bytes(&to_json(&ServerHello {
                error: Some(e.to_string()),
                gpu: false,
            })?);
            return Err(e);
        }
    };
    link.send_bytes(&to_json(&ServerHello {
        error: None,
        gpu: side.is_gpu(),
    })?)?;
    run_side(Role::Server, &mut link, &side, &p, hello.gpu, out)
}

/// Runs the client against `host`.
pub fn run_client(
    host: &str,
    p: &Params,
    local: &LocalOpts,
    out: &OutputOpts,
) -> gdr::Result<Report> {
    p.validate()
        .map_err(|e| Error::invalid(e.to_string(), Hint::NONE))?;
    let side = Side::open(local, p)?;
    let mut link = TcpLink::connect((host, local.port), Duration::from_secs(30))?;
    link.set_timeout(None)?;
    link.send_bytes(&to_json(&ClientHello {
        params: p.clone(),
        gpu: side.is_gpu(),
    })?)?;
    let hello: ServerHello = from_json(&link.recv_bytes()?, "server answer")?;
    if let Some(e) = hello.error {
        return Err(Error::protocol(format!("the server refused: {e}")));
    }
    run_side(Role::Client, &mut link, &side, p, hello.gpu, out)
}

fn run_side(
    role: Role,
    link: &mut TcpLink,
    side: &Side,
    p: &Params,
    peer_gpu: bool,
    out: &OutputOpts,
) -> gdr::Result<Report> {
    let peers = side.connect(link)?;
    let write_with_imm = p.test == Test::Lat && p.op == Op::Write && (peer_gpu || side.is_gpu());
    let mut pr = Printer {
        out,
        report: Report {
            test: p.test,
            role: match role {
                Role::Client => "client".into(),
                Role::Server => "server".into(),
            },
            op: p.op,
            device: side.device.clone(),
            gid_index: side.gid_index,
            memory: side.memory_text(),
            qps: side.qps.len() as u32,
            tx_depth: p.tx_depth,
            cq_mod: p.effective_cq_mod(),
            post_list: if p.test == Test::Bw { p.post_list } else { 1 },
            write_with_imm,
            verified: true,
            failures: Vec::new(),
            results: match p.test {
                Test::Bw => Rows::Bw(Vec::new()),
                Test::Lat => Rows::Lat(Vec::new()),
            },
        },
        progress: std::io::stderr().is_terminal() && p.sizes.len() > 1,
    };
    pr.start();
    // Sources hold the pattern for the whole run.
    for m in &side.mem {
        m.fill_pattern(p.max_size())?;
    }
    let mut wc = [Completion::default(); 32];
    let mut bw_state = BwState::default();
    let mut sink = RecvSink::default();
    let mut samples = Vec::new();
    let inline_buf: Vec<u8> = (0..p.max_size().min(side.inline_size as usize))
        .map(engine::pattern)
        .collect();
    for (k, &size) in p.sizes.iter().enumerate() {
        pr.progress(k, p.sizes.len(), size);
        let flows = side
            .qps
            .iter()
            .enumerate()
            .map(|(q, qp)| {
                Ok(Flow {
                    qp,
                    local: [side.mem[q].slice(0..size)?],
                    remote: peers[q].slice(0..size as u64)?,
                    inline: (size <= inline_buf.len()).then(|| &inline_buf[..size]),
                })
            })
            .collect::<gdr::Result<Vec<_>>>()?;
        let (row_bw, row_lat, failure) = match p.test {
            Test::Bw => {
                let r = bw_size(
                    role,
                    link,
                    side,
                    p,
                    size,
                    &flows,
                    &mut bw_state,
                    &mut sink,
                    &mut wc,
                )?;
                (Some(r.0), None, r.1)
            }
            Test::Lat => {
                drop(flows);
                let r = lat_size(
                    role,
                    link,
                    side,
                    p,
                    size,
                    peers[0],
                    write_with_imm,
                    &inline_buf,
                    &mut samples,
                    &mut wc,
                )?;
                (None, Some(r.0), r.1)
            }
        };
        if let Some(f) = failure {
            pr.report.verified = false;
            pr.report.failures.push(format!("{size} bytes: {f}"));
        }
        pr.row(row_bw, row_lat);
    }
    pr.finish()?;
    Ok(pr.report)
}

type SizeResult<R> = gdr::Result<(R, Option<String>)>;

/// Exchanges the client's figures and the server's verdict; returns the row and the failure.
fn settle<R: Clone>(
    role: Role,
    link: &mut TcpLink,
    mine: Option<(ClientRow, R)>,
    server_check: impl FnOnce() -> gdr::Result<Option<String>>,
    pick: impl Fn(&ClientRow) -> Option<R>,
) -> SizeResult<R> {
    match (role, mine) {
        (Role::Client, Some((row, r))) => {
            link.send_bytes(&to_json(&row)?)?;
            let v: Verdict = from_json(&link.recv_bytes()?, "verdict")?;
            Ok((r, (!v.ok).then_some(v.detail)))
        }
        _ => {
            let row: ClientRow = from_json(&link.recv_bytes()?, "result row")?;
            let mut problems: Vec<String> = row.problem.iter().cloned().collect();
            if let Some(p) = server_check()? {
                problems.push(p);
            }
            let v = Verdict {
                ok: problems.is_empty(),
                detail: problems.join("; "),
            };
            link.send_bytes(&to_json(&v)?)?;
            let r = pick(&row)
                .ok_or_else(|| Error::protocol("the client's result row is missing its figures"))?;
            Ok((r, (!v.ok).then_some(v.detail)))
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn bw_size(
    role: Role,
    link: &mut TcpLink,
    side: &Side,
    p: &Params,
    size: usize,
    flows: &[Flow<'_>],
    st: &mut BwState,
    sink: &mut RecvSink,
    wc: &mut [Completion],
) -> SizeResult<BwRow> {
    let qps: Vec<&QueuePair> = side.qps.iter().collect();
    let locals: Vec<[LocalSlice; 1]> = flows.iter().map(|f| f.local.clone()).collect();
    // Send for a fixed time: the receiver must know the count, so a short run sets it.
    let limit = match (p.op, p.limit) {
        (Op::Send, Limit::Duration(secs)) => Limit::Iters(send_count_for(
            secs, role, link, side, p, size, flows, &qps, &locals, st, sink, wc,
        )?),
        (_, l) => l,
    };
    let total = match limit {
        Limit::Iters(n) => n,
        Limit::Duration(_) => 0,
    };
    match (role, p.op) {
        (Role::Server, Op::Write) => side.mem.iter().try_for_each(|m| m.zero(size))?,
        (Role::Server, Op::Send) => {
            side.mem.iter().try_for_each(|m| m.zero(size))?;
            sink.prepost(&qps, &locals, total, 512)?;
        }
        (Role::Client, Op::Read) => side.mem.iter().try_for_each(|m| m.zero(size))?,
        _ => {}
    }
    link.barrier()?;
    match role {
        Role::Client => {
            let run = engine::bw_active(
                &side.cq,
                flows,
                p.op,
                limit,
                p.tx_depth,
                p.effective_cq_mod(),
                p.post_list_for(size),
                st,
                wc,
            )?;
            let bw = match limit {
                Limit::Iters(_) => {
                    let (posted, completed) = run.timeline(st);
                    stats::bandwidth(size, &posted, &completed, p.effective_cq_mod() as usize)
                }
                Limit::Duration(_) => {
                    let secs = run.secs(run.end);
                    let (avg_bps, msg_rate) = stats::average(size, run.messages, secs);
                    let points: Vec<(u64, f64)> = st
                        .checkpoints
                        .iter()
                        .map(|&(m, t)| (m, run.secs(t)))
                        .collect();
                    let min = u64::from(p.tx_depth) * side.qps.len() as u64;
                    stats::Bandwidth {
                        peak_bps: stats::peak_from_checkpoints(size, &points, min).max(avg_bps),
                        avg_bps,
                        msg_rate,
                    }
                }
            };
            let row = BwRow::new(size, run.messages / side.qps.len() as u64, bw);
            let problem = if p.op == Op::Read {
                first_problem(side.mem.iter().map(|m| m.check_pattern(size)))?
            } else {
                None
            };
            let msg = ClientRow {
                bw: Some(row.clone()),
                lat: None,
                problem,
            };
            settle(role, link, Some((msg, row)), || Ok(None), |r| r.bw.clone())
        }
        Role::Server => {
            if p.op == Op::Send {
                sink.drain(&side.cq, &qps, &locals, total, size, wc)?;
            }
            let check = || -> gdr::Result<Option<String>> {
                match p.op {
                    Op::Write | Op::Send => {
                        first_problem(side.mem.iter().map(|m| m.check_pattern(size)))
                    }
                    Op::Read => Ok(None),
                }
            };
            settle::<BwRow>(role, link, None, check, |r| r.bw.clone())
        }
    }
}

/// Messages per queue pair of the calibration run of a timed send bandwidth measurement.
const SEND_CALIBRATION: u64 = 1000;

/// The message count (per queue pair) that fills `secs` of send bandwidth: the client sends
/// SEND_CALIBRATION messages per queue pair (the server receives and checks their count), times
/// them, and tells the server the count both then run.
#[allow(clippy::too_many_arguments)]
fn send_count_for(
    secs: f64,
    role: Role,
    link: &mut TcpLink,
    side: &Side,
    p: &Params,
    size: usize,
    flows: &[Flow<'_>],
    qps: &[&QueuePair],
    locals: &[[LocalSlice; 1]],
    st: &mut BwState,
    sink: &mut RecvSink,
    wc: &mut [Completion],
) -> gdr::Result<u64> {
    if role == Role::Server {
        sink.prepost(qps, locals, SEND_CALIBRATION, 512)?;
    }
    link.barrier()?;
    match role {
        Role::Client => {
            let run = engine::bw_active(
                &side.cq,
                flows,
                Op::Send,
                Limit::Iters(SEND_CALIBRATION),
                p.tx_depth,
                p.effective_cq_mod(),
                p.post_list_for(size),
                st,
                wc,
            )?;
            let n = iters_for(secs, run.secs(run.end) / SEND_CALIBRATION as f64);
            share_count(link, Some(n), "message count")
        }
        Role::Server => {
            sink.drain(&side.cq, qps, locals, SEND_CALIBRATION, size, wc)?;
            share_count(link, None, "message count")
        }
    }
}

/// The client's calibrated count reaches the server: the side with `Some(n)` sends it, the
/// other receives it (checked: 8 bytes, clamped to 1..=MAX_DURATION_ITERS). Returns the count.
fn share_count(link: &mut TcpLink, mine: Option<u64>, what: &str) -> gdr::Result<u64> {
    if let Some(n) = mine {
        link.send_bytes(&n.to_le_bytes())?;
        return Ok(n);
    }
    let b = link.recv_bytes()?;
    let b: [u8; 8] = b
        .as_slice()
        .try_into()
        .map_err(|_| Error::protocol(format!("{what} of {} bytes, expected 8", b.len())))?;
    Ok(u64::from_le_bytes(b).clamp(1, MAX_DURATION_ITERS))
}

fn first_problem(
    checks: impl Iterator<Item = gdr::Result<Option<String>>>,
) -> gdr::Result<Option<String>> {
    for c in checks {
        if let Some(p) = c? {
            return Ok(Some(p));
        }
    }
    Ok(None)
}

/// Timed round trips (after the warm-up) that calibrate a latency run of fixed duration.
const CALIBRATION: u64 = 100;

/// Most round trips (or reads) of one size in duration mode.
const MAX_DURATION_ITERS: u64 = 100_000_000;

/// How many operations of `secs_each` seconds fit in `secs` (at least one).
fn iters_for(secs: f64, secs_each: f64) -> u64 {
    if secs_each > 0.0 && secs_each.is_finite() {
        ((secs / secs_each).round() as u64).clamp(1, MAX_DURATION_ITERS)
    } else {
        1
    }
}

/// Read latency of one size: the client reads the server's advertised buffer (which holds the
/// pattern) into its own (zeroed first) and checks it; the server only waits for the result.
#[allow(clippy::too_many_arguments)]
fn read_lat_size(
    role: Role,
    link: &mut TcpLink,
    side: &Side,
    p: &Params,
    size: usize,
    peer: RemoteRegion,
    advertised: &Memory,
    samples: &mut Vec<f64>,
    wc: &mut [Completion],
) -> SizeResult<LatRow> {
    match role {
        Role::Server => {
            advertised.fill_pattern(size)?;
            link.barrier()?;
            settle::<LatRow>(role, link, None, || Ok(None), |r| r.lat.clone())
        }
        Role::Client => {
            let dst = &side.mem[0];
            dst.zero(size)?;
            let flow = Flow {
                qp: &side.qps[0],
                local: [dst.slice(0..size)?],
                remote: peer.slice(0..size as u64)?,
                inline: None,
            };
            let warmup = engine::lat_warmup(p.effective_cq_mod());
            link.barrier()?;
            // Duration mode: the warm-up and CALIBRATION timed reads set the count.
            let (warmup, iters) = match p.limit {
                Limit::Iters(n) => (warmup, n),
                Limit::Duration(secs) => {
                    samples.reserve(CALIBRATION as usize + 1);
                    engine::read_latency(&side.cq, &flow, warmup, CALIBRATION, samples, wc)?;
                    (0, iters_for(secs, 1e-6 * stats::latency(samples).typical))
                }
            };
            samples.reserve(iters as usize + 1);
            engine::read_latency(&side.cq, &flow, warmup, iters, samples, wc)?;
            let row = LatRow::new(size, iters, stats::latency(samples));
            let msg = ClientRow {
                bw: None,
                lat: Some(row.clone()),
                problem: dst.check_pattern(size)?,
            };
            settle(role, link, Some((msg, row)), || Ok(None), |r| r.lat.clone())
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn lat_size(
    role: Role,
    link: &mut TcpLink,
    side: &Side,
    p: &Params,
    size: usize,
    peer: RemoteRegion,
    write_with_imm: bool,
    inline_buf: &[u8],
    samples: &mut Vec<f64>,
    wc: &mut [Completion],
) -> SizeResult<LatRow> {
    let recv_mem = side
        .recv_mem
        .as_ref()
        .ok_or_else(|| Error::invalid("latency side without a receive buffer", Hint::NONE))?;
    if p.op == Op::Read {
        return read_lat_size(role, link, side, p, size, peer, recv_mem, samples, wc);
    }
    recv_mem.zero(size)?;
    let recv_local = [recv_mem.slice(0..size)?];
    let arrival = match (p.op, write_with_imm) {
        (Op::Write, false) => Arrival::LastByte(
            recv_mem
                .host()
                .ok_or_else(|| Error::invalid("polling needs host memory", Hint::NONE))?,
        ),
        (Op::Write, true) => Arrival::Completion { local: &[] },
        _ => Arrival::Completion { local: &recv_local },
    };
    let inline = size <= inline_buf.len();
    let mut pp = PingPong {
        qp: &side.qps[0],
        cq: &side.cq,
        flow: Flow {
            qp: &side.qps[0],
            local: [side.mem[0].slice(0..size)?],
            remote: peer.slice(0..size as u64)?,
            inline: None,
        },
        op: p.op,
        arrival,
        size,
        cq_mod: p.effective_cq_mod(),
        tx_depth: p.tx_depth,
        marker_src: side.mem[0].host().map(|m| m.as_ref()),
        warmup: engine::lat_warmup(p.effective_cq_mod()),
    };
    // the source's last byte carries markers in the previous size; restore the pattern.
    side.mem[0].fill_pattern(size)?;
    let client = role == Role::Client;
    let use_inline = inline && !write_with_imm;
    let mut req = pp.prepare(use_inline.then(|| &inline_buf[..size]))?;
    let iters = match p.limit {
        Limit::Iters(n) => n,
        Limit::Duration(secs) => {
            // Calibration: the warm-up and CALIBRATION timed round trips; their typical round
            // trip sets how many fit in `secs`. Both sides then run that many, from a clean
            // start (no write in flight: each side has seen the other's last message).
            let posted = pp.prepost(CALIBRATION)?;
            samples.reserve(CALIBRATION as usize + 1);
            link.barrier()?;
            pp.run(&mut req, CALIBRATION, client, posted, samples, wc)?;
            // samples are half round trips in microseconds.
            let mine = client.then(|| iters_for(secs, 2e-6 * stats::latency(samples).typical));
            let n = share_count(link, mine, "round-trip count")?;
            recv_mem.zero(size)?;
            pp.warmup = 0;
            n
        }
    };
    let posted = pp.prepost(iters)?;
    samples.reserve(iters as usize + 1);
    link.barrier()?;
    pp.run(&mut req, iters, client, posted, samples, wc)?;
    // Everything but the last byte (the marker) must be the pattern.
    let check = || -> gdr::Result<Option<String>> {
        if size > 1 {
            recv_mem.check_pattern(size - 1)
        } else {
            Ok(None)
        }
    };
    match role {
        Role::Client => {
            let l = stats::latency(samples);
            let row = LatRow::new(size, iters, l);
            let msg = ClientRow {
                bw: None,
                lat: Some(row.clone()),
                problem: check()?,
            };
            settle(role, link, Some((msg, row)), || Ok(None), |r| r.lat.clone())
        }
        Role::Server => settle::<LatRow>(role, link, None, check, |r| r.lat.clone()),
    }
}
