//! Buffers and the measurement loops. The loops allocate nothing per request: the caller builds
//! the slices once ([`Flow`]), passes a reused completion buffer, and timestamp vectors with
//! their capacity reserved before the run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr::cq::{Completion, CompletionQueue};
use gdr::cuda::DeviceBuffer;
use gdr::gpu_mr::{GpuMemoryRegion, RegistrationPath};
use gdr::mr::{AccessFlags, LocalSlice, MemoryRegion, RemoteRegion, RemoteSlice};
use gdr::pd::ProtectionDomain;
use gdr::qp::{PreparedSend, QueuePair};
use gdr::wr::{RecvRequest, SendRequest};
use gdr::{Error, Hint};

use super::clock::{ticks, Calibration};
use super::params::{Limit, Op};

/// How long a loop waits for the peer without any progress before it gives up.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The byte at offset `i` of every source buffer; receivers check it.
pub fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 8) ^ (i >> 16)) as u8
}

/// A registered buffer in host or GPU memory.
#[derive(Debug, Clone)]
pub enum Memory {
    /// Host memory (page-aligned).
    Host(Arc<MemoryRegion>),
    /// GPU memory (`cuMemAlloc`), dma-buf or peer-memory registration.
    Gpu(Arc<GpuMemoryRegion>),
}

impl Memory {
    /// Allocates and registers `len` bytes: host memory, or GPU memory on CUDA device `ordinal`.
    pub fn alloc(
        pd: &Arc<ProtectionDomain>,
        len: usize,
        access: AccessFlags,
        cuda: Option<(i32, RegistrationPath)>,
    ) -> gdr::Result<Memory> {
        match cuda {
            None => Ok(Memory::Host(MemoryRegion::new(pd, len, access)?)),
            Some((ordinal, path)) => {
                let buf = Arc::new(DeviceBuffer::alloc(ordinal, len)?);
                Ok(Memory::Gpu(GpuMemoryRegion::register(
                    pd,
                    buf,
                    ..,
                    access,
                    path,
                )?))
            }
        }
    }

    /// A local slice for work requests.
    pub fn slice(&self, range: std::ops::Range<usize>) -> gdr::Result<LocalSlice> {
        match self {
            Memory::Host(m) => m.slice(range),
            Memory::Gpu(m) => m.slice(range),
        }
    }

    /// What the peer needs to access the whole buffer.
    pub fn remote(&self) -> RemoteRegion {
        match self {
            Memory::Host(m) => m.remote(),
            Memory::Gpu(m) => m.remote(),
        }
    }

    /// The host region, when this is host memory.
    pub fn host(&self) -> Option<&Arc<MemoryRegion>> {
        match self {
            Memory::Host(m) => Some(m),
            Memory::Gpu(_) => None,
        }
    }

    /// Whether this is GPU memory.
    pub fn is_gpu(&self) -> bool {
        matches!(self, Memory::Gpu(_))
    }

    /// `host` or `cuda:N (dma-buf|peer memory)`.
    pub fn describe(&self) -> String {
        match self {
            Memory::Host(_) => "host".into(),
            Memory::Gpu(m) => format!("cuda:{} ({})", m.ordinal(), m.path()),
        }
    }

    fn device_buffer(m: &GpuMemoryRegion) -> gdr::Result<&Arc<DeviceBuffer>> {
        m.buffer()
            .ok_or_else(|| Error::invalid("GPU region without its DeviceBuffer", Hint::NONE))
    }

    /// Copies `data` into the buffer at `offset` (a CUDA copy for GPU memory).
    pub fn write(&self, offset: usize, data: &[u8]) -> gdr::Result<()> {
        match self {
            Memory::Host(m) => m.write(offset, data),
            Memory::Gpu(m) => Self::device_buffer(m)?.copy_from_host(offset, data),
        }
    }

    /// Copies bytes at `offset` out of the buffer.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> gdr::Result<()> {
        match self {
            Memory::Host(m) => m.read(offset, out),
            Memory::Gpu(m) => Self::device_buffer(m)?.copy_to_host(offset, out),
        }
    }

    /// Fills the first `len` bytes with [`pattern`].
    pub fn fill_pattern(&self, len: usize) -> gdr::Result<()> {
        let data: Vec<u8> = (0..len).map(pattern).collect();
        self.write(0, &data)
    }

    /// Zeroes the first `len` bytes.
    pub fn zero(&self, len: usize) -> gdr::Result<()> {
        match self {
            Memory::Host(m) => m.fill(0, len, 0),
            Memory::Gpu(_) => self.write(0, &vec![0; len]),
        }
    }

    /// `None` when bytes `0..len` hold [`pattern`], otherwise where they first differ.
    pub fn check_pattern(&self, len: usize) -> gdr::Result<Option<String>> {
        let mut got = vec![0u8; len];
        self.read(0, &mut got)?;
        Ok(got
            .iter()
            .enumerate()
            .find(|(i, b)| **b != pattern(*i))
            .map(|(i, b)| {
                format!(
                    "byte {i} of {len} is {b:#04x}, expected {:#04x}",
                    pattern(i)
                )
            }))
    }
}

/// One queue pair's traffic of one size: built once, posted many times.
pub struct Flow<'a> {
    /// The queue pair.
    pub qp: &'a QueuePair,
    /// The local data (one scatter/gather entry).
    pub local: [LocalSlice; 1],
    /// The peer's target (ignored for sends).
    pub remote: RemoteSlice,
    /// Bytes sent inline instead of `local` (host memory, small sizes).
    pub inline: Option<&'a [u8]>,
}

impl Flow<'_> {
    fn request(&self, op: Op) -> SendRequest<'_> {
        match (op, self.inline) {
            (Op::Write, Some(b)) => SendRequest::write_inline(b, self.remote),
            (Op::Write, None) => SendRequest::write(&self.local, self.remote),
            (Op::Read, _) => SendRequest::read(&self.local, self.remote),
            (Op::Send, Some(b)) => SendRequest::send_inline(b),
            (Op::Send, None) => SendRequest::send(&self.local),
        }
    }
}

const QP_SHIFT: u32 = 40;
const SEQ_MASK: u64 = (1 << QP_SHIFT) - 1;

fn wr_id(q: usize, n: u64) -> u64 {
    ((q as u64) << QP_SHIFT) | n
}

fn split_id(id: u64) -> (usize, u64) {
    ((id >> QP_SHIFT) as usize, id & SEQ_MASK)
}

fn stalled(what: &str, since: Instant) -> Error {
    Error::Timeout {
        what: what.into(),
        after: since.elapsed(),
        hint: Hint::new(
            "the peer stopped or the connection broke; is the other side still running?",
        ),
    }
}

/// Timestamps and counters of a bandwidth run, reused from run to run (reserve once, then the
/// loop never allocates).
#[derive(Debug, Default)]
pub struct BwState {
    /// Post time (ticks) of every message, in posting order (iteration mode).
    pub posted: Vec<u64>,
    /// Completion time (ticks) of every message, in completion order (iteration mode).
    pub completed: Vec<u64>,
    /// `(messages completed, ticks)` at every poll that reaped something (duration mode).
    pub checkpoints: Vec<(u64, u64)>,
    scnt: Vec<u64>,
    ccnt: Vec<u64>,
    last_signaled: Vec<bool>,
}

impl BwState {
    /// Room for `messages` timestamps and `qps` queue pairs.
    pub fn reserve(&mut self, messages: usize, qps: usize) {
        self.posted
            .reserve(messages.saturating_sub(self.posted.len()));
        self.completed
            .reserve(messages.saturating_sub(self.completed.len()));
        self.checkpoints.reserve(1 << 16);
        self.scnt.resize(qps, 0);
        self.ccnt.resize(qps, 0);
        self.last_signaled.resize(qps, true);
    }
}

/// What a bandwidth run did.
#[derive(Debug, Clone, Copy)]
pub struct BwRun {
    /// Messages completed.
    pub messages: u64,
    /// First post (ticks).
    pub start: u64,
    /// Last completion (ticks).
    pub end: u64,
    /// Seconds per tick, measured over the run.
    pub secs_per_tick: f64,
}

impl BwRun {
    /// Seconds from the first post to `t` (ticks).
    pub fn secs(&self, t: u64) -> f64 {
        t.saturating_sub(self.start) as f64 * self.secs_per_tick
    }

    /// Per-message post and completion times in seconds from the first post.
    pub fn timeline(&self, st: &BwState) -> (Vec<f64>, Vec<f64>) {
        (
            st.posted.iter().map(|&t| self.secs(t)).collect(),
            st.completed.iter().map(|&t| self.secs(t)).collect(),
        )
    }
}

/// The active side of a bandwidth run: posts `op` on every flow, `tx_depth` in flight per queue
/// pair, one signalled request in every `cq_mod`, up to `post_list` requests per doorbell, until
/// `limit`. All queue pairs report into `cq`.
#[allow(clippy::too_many_arguments)]
pub fn bw_active(
    cq: &CompletionQueue,
    flows: &[Flow<'_>],
    op: Op,
    limit: Limit,
    tx_depth: u32,
    cq_mod: u32,
    post_list: u32,
    st: &mut BwState,
    wc: &mut [Completion],
) -> gdr::Result<BwRun> {
    let nq = flows.len();
    let (iters, deadline) = match limit {
        Limit::Iters(n) => (n, None),
        Limit::Duration(d) => (u64::MAX, Some(Duration::from_secs_f64(d))),
    };
    let record = deadline.is_none();
    st.posted.clear();
    st.completed.clear();
    st.checkpoints.clear();
    st.reserve(if record { (iters as usize) * nq } else { 0 }, nq);
    st.scnt.iter_mut().for_each(|c| *c = 0);
    st.ccnt.iter_mut().for_each(|c| *c = 0);
    st.last_signaled.iter_mut().for_each(|l| *l = true);
    let depth = u64::from(tx_depth);
    let cq_mod = u64::from(cq_mod.max(1));
    let cal = Calibration::start();
    let start_instant = Instant::now();
    let start = ticks();
    let mut end = start;
    let mut last_progress = start_instant;
    let mut done_at_check = 0u64;
    let mut stop = false;
    let mut total_done = 0u64;
    st.checkpoints.push((0, start));
    // Timestamps are TSC ticks (see `clock`): one per burst of posts, one per poll that reaped
    // something. Every post of a burst gets the burst's start time, which can only make the
    // peak more conservative. `Instant` is read once per 1024 empty polls, for the stall and
    // duration checks.
    let mut empty_polls = 0u32;
    let post_list = (post_list as usize).clamp(1, gdr::qp::LIST_CHUNK);
    // Requests of one doorbell, on the stack (no allocation): `list[..listed]`.
    let Some(first) = flows.first() else {
        return Err(Error::invalid("bandwidth run without a flow", Hint::NONE));
    };
    let mut list: [SendRequest<'_>; gdr::qp::LIST_CHUNK] =
        std::array::from_fn(|_| first.request(op));
    let mut listed = 0;
    loop {
        let mut burst: Option<u64> = None;
        for (q, f) in flows.iter().enumerate() {
            loop {
                let n = st.scnt[q];
                // after the deadline: one more request, signalled, unless the last one was.
                if n >= iters || n - st.ccnt[q] >= depth || (stop && st.last_signaled[q]) {
                    break;
                }
                let signaled = (n + 1).is_multiple_of(cq_mod) || n + 1 == iters || stop;
                st.last_signaled[q] = signaled;
                let req = f.request(op).id(wr_id(q, n));
                let req = if signaled { req } else { req.unsignaled() };
                if record {
                    let t = *burst.get_or_insert_with(ticks);
                    st.posted.push(t);
                }
                list[listed] = req;
                listed += 1;
                st.scnt[q] = n + 1;
                if listed == post_list {
                    f.qp.post_send_list(&list[..listed])?;
                    listed = 0;
                }
            }
            if listed > 0 {
                f.qp.post_send_list(&list[..listed])?;
                listed = 0;
            }
        }
        let k = cq.poll(wc)?;
        let now = if k > 0 {
            empty_polls = 0;
            let now = ticks();
            for c in &wc[..k] {
                c.result()?;
                let (q, n) = split_id(c.wr_id);
                let newly = (n + 1).saturating_sub(st.ccnt[q]);
                st.ccnt[q] = st.ccnt[q].max(n + 1);
                total_done += newly;
                if record {
                    for _ in 0..newly {
                        st.completed.push(now);
                    }
                }
            }
            end = now;
            if st.checkpoints.len() < st.checkpoints.capacity() {
                st.checkpoints.push((total_done, now));
            }
            // duration mode: the deadline is checked at every completion batch (one clock read
            // per cq_mod messages); a busy CQ may never see 1024 empty polls in a row.
            deadline.map(|_| Instant::now())
        } else {
            empty_polls = empty_polls.wrapping_add(1);
            if empty_polls.is_multiple_of(1024) {
                let now = Instant::now();
                if total_done != done_at_check {
                    done_at_check = total_done;
                    last_progress = now;
                } else if now - last_progress > STALL_TIMEOUT {
                    return Err(stalled("bandwidth run: no completion", last_progress));
                }
                Some(now)
            } else {
                None
            }
        };
        if let (Some(d), Some(now)) = (deadline, now) {
            if !stop && now - start_instant >= d {
                stop = true;
            }
        }
        let finished = if stop {
            st.scnt.iter().zip(&st.ccnt).all(|(s, c)| s == c) && st.last_signaled.iter().all(|&l| l)
        } else {
            st.ccnt.iter().all(|&c| c >= iters)
        };
        if finished {
            break;
        }
    }
    Ok(BwRun {
        messages: total_done,
        start,
        end,
        secs_per_tick: cal.secs_per_tick(),
    })
}

/// Receives for the passive side of a send bandwidth run (or of send latency).
#[derive(Debug, Default)]
pub struct RecvSink {
    posted: Vec<u64>,
    done: Vec<u64>,
}

impl RecvSink {
    /// Posts up to `depth` receives of `locals[q]` on every queue pair, for `total` messages each.
    pub fn prepost(
        &mut self,
        qps: &[&QueuePair],
        locals: &[[LocalSlice; 1]],
        total: u64,
        depth: u32,
    ) -> gdr::Result<()> {
        self.posted.clear();
        self.posted.resize(qps.len(), 0);
        self.done.clear();
        self.done.resize(qps.len(), 0);
        for (q, qp) in qps.iter().enumerate() {
            while self.posted[q] < total.min(u64::from(depth)) {
                qp.post_recv(&RecvRequest::new(&locals[q]).id(wr_id(q, self.posted[q])))?;
                self.posted[q] += 1;
            }
        }
        Ok(())
    }

    /// Reaps receives (reposting while more are expected) until `total` arrived on every queue
    /// pair; each must carry `size` bytes.
    pub fn drain(
        &mut self,
        cq: &CompletionQueue,
        qps: &[&QueuePair],
        locals: &[[LocalSlice; 1]],
        total: u64,
        size: usize,
        wc: &mut [Completion],
    ) -> gdr::Result<()> {
        let mut last_progress = Instant::now();
        let (mut empty, mut got, mut got_at_check) = (0u32, 0u64, 0u64);
        while self.done.iter().any(|&d| d < total) {
            let k = cq.poll(wc)?;
            if k == 0 {
                empty = empty.wrapping_add(1);
                if empty.is_multiple_of(1024) {
                    if got != got_at_check {
                        got_at_check = got;
                        last_progress = Instant::now();
                    } else if last_progress.elapsed() > STALL_TIMEOUT {
                        return Err(stalled("send bandwidth: no receive", last_progress));
                    }
                }
                continue;
            }
            got += k as u64;
            for c in &wc[..k] {
                c.result()?;
                if !c.is_recv {
                    continue;
                }
                if c.byte_len as usize != size {
                    return Err(Error::protocol(format!(
                        "a receive carried {} bytes, expected {size}",
                        c.byte_len
                    )));
                }
                let (q, _) = split_id(c.wr_id);
                self.done[q] += 1;
                if self.posted[q] < total {
                    qps[q].post_recv(&RecvRequest::new(&locals[q]).id(wr_id(q, self.posted[q])))?;
                    self.posted[q] += 1;
                }
            }
        }
        Ok(())
    }
}

/// How a latency ping-pong learns that the peer's message arrived.
pub enum Arrival<'a> {
    /// Poll the last byte of this host region (RDMA write, like `ib_write_lat`).
    LastByte(&'a MemoryRegion),
    /// Wait for a receive completion (send, or write with immediate for GPU memory).
    Completion {
        /// Receive scatter list (empty for write with immediate).
        local: &'a [LocalSlice],
    },
}

/// One side of a latency ping-pong of one size.
pub struct PingPong<'a> {
    /// The queue pair.
    pub qp: &'a QueuePair,
    /// Its completion queue (send and receive).
    pub cq: &'a CompletionQueue,
    /// What to send.
    pub flow: Flow<'a>,
    /// The operation: write (with `LastByte`: the marker is the last byte; with `Completion`:
    /// write with immediate) or send.
    pub op: Op,
    /// How arrival is detected.
    pub arrival: Arrival<'a>,
    /// Message size.
    pub size: usize,
    /// Signal one send in every `cq_mod`.
    pub cq_mod: u32,
    /// Send requests that may be in flight (the queue pair's ring is twice this).
    pub tx_depth: u32,
    /// The host region the marker byte is written into (write without inline, host memory).
    pub marker_src: Option<&'a MemoryRegion>,
    /// Untimed round trips before the measured ones (both sides run them).
    pub warmup: u64,
}

/// Untimed round trips (or reads) before a latency measurement: one signalling period, so that
/// one-time costs are not measured: the peer waking from the TCP barrier (milliseconds on a
/// loaded host) and the first send completion (hundreds of microseconds on Soft-RoCE).
pub fn lat_warmup(cq_mod: u32) -> u64 {
    u64::from(cq_mod.clamp(1, 1000))
}

/// The marker of round trip `i`: never 0, never equal to the previous one.
pub fn marker(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Receives a ping-pong needs posted before its first round trip.
pub const LAT_RX_DEPTH: u32 = 64;

impl<'a> PingPong<'a> {
    /// Posts the receives the first round trips need (completion arrival only); `iters` are the
    /// measured round trips (the warm-up is added here).
    pub fn prepost(&self, iters: u64) -> gdr::Result<u64> {
        let iters = self.warmup + iters;
        let mut posted = 0;
        if let Arrival::Completion { local } = &self.arrival {
            while posted < iters.min(u64::from(LAT_RX_DEPTH)) {
                self.qp.post_recv(&RecvRequest::new(local).id(posted))?;
                posted += 1;
            }
        }
        Ok(posted)
    }

    /// The request each round trip posts, prepared once ([`QueuePair::prepare`]): `inline_src`
    /// is the inline source (`size` bytes; its last byte is replaced by each message's marker),
    /// `None` posts the flow. Write with immediate when arrival is by completion.
    pub fn prepare(&self, inline_src: Option<&[u8]>) -> gdr::Result<PreparedSend<'a>> {
        let req = match inline_src {
            Some(b) => match self.op {
                Op::Send => SendRequest::send_inline(&b[..self.size]),
                _ => SendRequest::write_inline(&b[..self.size], self.flow.remote),
            },
            None => self.flow.request(self.op),
        };
        self.qp.prepare(&if self.with_imm() {
            req.with_imm(0)
        } else {
            req
        })
    }

    fn with_imm(&self) -> bool {
        matches!(
            (self.op, &self.arrival),
            (Op::Write, Arrival::Completion { .. })
        )
    }

    /// Runs the warm-up and then `measured` round trips of `req` (from [`PingPong::prepare`]);
    /// the client (`initiator`) sends first and records half of each measured round trip in
    /// microseconds into `samples` (reserved by the caller for `measured + 1`). Like perftest,
    /// one clock read per round trip: the time between consecutive posts. Each round trip only
    /// sets the marker and posts.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        req: &mut PreparedSend<'_>,
        measured: u64,
        initiator: bool,
        mut posted_recvs: u64,
        samples: &mut Vec<f64>,
        wc: &mut [Completion],
    ) -> gdr::Result<()> {
        samples.clear();
        let iters = self.warmup + measured;
        let cq_mod = u64::from(self.cq_mod.clamp(1, self.tx_depth.max(1)));
        let mut unreaped = 0u64;
        let mut received = 0u64;
        let with_imm = self.with_imm();
        // The marker goes into the inline copy, or into the source region's last byte.
        let marker_src = match (&self.arrival, self.marker_src) {
            (Arrival::LastByte(_), Some(src)) if req.inline_data_mut().is_none() => Some(src),
            _ => None,
        };
        let cal = Calibration::start();
        let base = cal.start_ticks();
        for i in 0..iters {
            if initiator {
                if i >= self.warmup {
                    samples.push(ticks().saturating_sub(base) as f64);
                }
            } else {
                self.wait(
                    i,
                    &mut received,
                    &mut posted_recvs,
                    iters,
                    &mut unreaped,
                    wc,
                )?;
            }
            // post
            let m = marker(i);
            if let Some(b) = req.inline_data_mut() {
                b[self.size - 1] = m;
            } else if let Some(src) = marker_src {
                src.write(self.size - 1, &[m])?;
            }
            if with_imm {
                req.set_imm(i as u32)?;
            }
            let signaled = (i + 1).is_multiple_of(cq_mod) || i + 1 == iters;
            // With every signalled send reaped, fewer than cq_mod (<= tx_depth) sends are in
            // flight: the queue can only be full while a signalled completion is pending.
            while unreaped > 0 && self.qp.send_outstanding() >= u64::from(self.tx_depth) {
                self.reap(&mut received, &mut posted_recvs, iters, &mut unreaped, wc)?;
            }
            req.post(i, signaled)?;
            // `unreaped` counts signalled sends whose completion is still to be polled: the
            // CQ is polled while waiting only when one is pending.
            unreaped += u64::from(signaled);
            if initiator {
                self.wait(
                    i,
                    &mut received,
                    &mut posted_recvs,
                    iters,
                    &mut unreaped,
                    wc,
                )?;
            }
        }
        if initiator {
            samples.push(ticks().saturating_sub(base) as f64);
            // ticks of consecutive posts -> half round trips in microseconds
            intervals_us(samples, &cal, 2.0);
        }
        let since = Instant::now();
        while self.qp.send_outstanding() > 0 {
            self.reap(&mut received, &mut posted_recvs, iters, &mut unreaped, wc)?;
            if since.elapsed() > STALL_TIMEOUT {
                return Err(stalled("latency: last send never completed", since));
            }
        }
        Ok(())
    }

    /// Polls the completion queue once: retires sends, counts receives (reposting as needed).
    fn reap(
        &self,
        received: &mut u64,
        posted: &mut u64,
        iters: u64,
        unreaped: &mut u64,
        wc: &mut [Completion],
    ) -> gdr::Result<usize> {
        let k = self.cq.poll(wc)?;
        for c in &wc[..k] {
            c.result()?;
            if c.is_recv {
                if let Arrival::Completion { local } = &self.arrival {
                    if let (Op::Write, Some(imm)) = (self.op, c.imm) {
                        if u64::from(imm) != *received {
                            return Err(Error::protocol(format!(
                                "write with immediate {imm} arrived, expected {received}"
                            )));
                        }
                    }
                    *received += 1;
                    if *posted < iters {
                        self.qp.post_recv(&RecvRequest::new(local).id(*posted))?;
                        *posted += 1;
                    }
                }
            } else {
                *unreaped = unreaped.saturating_sub(1);
            }
        }
        Ok(k)
    }

    /// Waits until message `i` of the peer arrived.
    fn wait(
        &self,
        i: u64,
        received: &mut u64,
        posted: &mut u64,
        iters: u64,
        unreaped: &mut u64,
        wc: &mut [Completion],
    ) -> gdr::Result<()> {
        // The clock is read only after 4096 spins without arrival (Instant::now can be a
        // system call: see `clock`), never on the fast path.
        let mut since: Option<Instant> = None;
        let mut spins = 0u32;
        let mut stalled_for = |what: &str| -> gdr::Result<()> {
            let s = *since.get_or_insert_with(Instant::now);
            if s.elapsed() > STALL_TIMEOUT {
                return Err(stalled(what, s));
            }
            Ok(())
        };
        match &self.arrival {
            Arrival::LastByte(mr) => {
                let last = self.size - 1;
                let word = last & !7;
                let shift = last & 7;
                let m = marker(i);
                let flag = mr.watch_u64(word)?;
                loop {
                    if flag.load().to_ne_bytes()[shift] == m {
                        break;
                    }
                    if *unreaped > 0 {
                        self.reap(received, posted, iters, unreaped, wc)?;
                    }
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(4096) {
                        stalled_for("latency: the peer's write never arrived")?;
                    }
                    // No spin-loop hint (PAUSE): it delays noticing the arrival, and perftest's
                    // poll loop has none either.
                }
            }
            Arrival::Completion { .. } => {
                while *received <= i {
                    self.reap(received, posted, iters, unreaped, wc)?;
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(4096) {
                        stalled_for("latency: the peer's message never arrived")?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Turns timestamps (ticks since the calibration's start) into the microseconds between
/// consecutive ones, divided by `per`; drops the last timestamp.
fn intervals_us(samples: &mut Vec<f64>, cal: &Calibration, per: f64) {
    let us_per_tick = cal.secs_per_tick() * 1e6;
    for j in 0..samples.len().saturating_sub(1) {
        samples[j] = (samples[j + 1] - samples[j]) * us_per_tick / per;
    }
    samples.pop();
}

/// The client side of a read-latency run: `warmup` untimed reads, then `measured` RDMA reads of
/// `flow`, one at a time, each signalled and waited for. Records every measured read's latency
/// in microseconds into `samples` (reserved by the caller for `measured + 1`). A read is
/// one-sided, so its latency is the whole round trip (perftest's `ib_read_lat` does not halve it
/// either); one clock read per read.
pub fn read_latency(
    cq: &CompletionQueue,
    flow: &Flow<'_>,
    warmup: u64,
    measured: u64,
    samples: &mut Vec<f64>,
    wc: &mut [Completion],
) -> gdr::Result<()> {
    samples.clear();
    let cal = Calibration::start();
    let base = cal.start_ticks();
    for i in 0..warmup + measured {
        if i >= warmup {
            samples.push(ticks().saturating_sub(base) as f64);
        }
        flow.qp.post_send(&flow.request(Op::Read).id(i))?;
        let mut spins = 0u32;
        let mut since: Option<Instant> = None;
        loop {
            let k = cq.poll(wc)?;
            let mut done = false;
            for c in &wc[..k] {
                c.result()?;
                done |= c.wr_id == i;
            }
            if done {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) {
                let s = *since.get_or_insert_with(Instant::now);
                if s.elapsed() > STALL_TIMEOUT {
                    return Err(stalled("read latency: a read never completed", s));
                }
            }
        }
    }
    samples.push(ticks().saturating_sub(base) as f64);
    intervals_us(samples, &cal, 1.0);
    Ok(())
}
