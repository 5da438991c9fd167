//! The engine of `gdr xfer-bench`: gdr-xfer's transfer bandwidth and latencies between two
//! agents, with Mooncake's parameters (threads x batch x block size, operation, duration) and
//! nixlbench's columns (block size, batch size, GB/s, average and p99 of prepare, post and
//! transfer time).
//!
//! The target registers one buffer and waits; the initiator connects, and each of its threads
//! submits a batch of `batch` blocks (a block table: no descriptor per block), waits for it, and
//! starts the next, until the duration is over, for each block size in turn; with `depth` D, each
//! thread keeps D batches (of D disjoint block ranges) in flight and submits the next as the
//! oldest completes. Blocks land at
//! scattered positions by default (a permutation), as KV-cache blocks do, so nothing merges.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use gdr_xfer::{Agent, AgentConfig, BlockTable, Op, Segment, TransferOptions};
use serde::{Deserialize, Serialize};

/// Where blocks land.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Block `i` of a batch goes to a scattered position (nothing merges).
    Scattered,
    /// Block `i` goes to the same position on the target (whole batches merge into runs).
    Contiguous,
    /// Every block of a batch is the thread's block 0, on both sides: the working set of
    /// `ib_write_bw`, which writes one message-sized buffer again and again (it stays in the
    /// CPU caches, which matters where the "NIC" is software, as with Soft-RoCE).
    Repeat,
}

fn one() -> usize {
    1
}

/// What the initiator runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchParams {
    /// Threads, each with `depth` batches in flight.
    pub threads: usize,
    /// Batches each thread keeps in flight (1: submit, wait, repeat, as Mooncake's and
    /// nixlbench's loops; 2 or more keep the queue pairs busy while a finished batch is
    /// reported and the next submitted, as perftest keeps its send queue full).
    #[serde(default = "one")]
    pub depth: usize,
    /// Blocks per batch.
    pub batch: usize,
    /// Block sizes, one row each.
    pub block_sizes: Vec<u64>,
    /// Direction.
    pub op: String,
    /// Seconds per block size.
    pub duration_s: f64,
    /// Queue pairs per peer.
    pub qps: u8,
    /// Largest work request.
    pub slice_size: u64,
    /// Where blocks land.
    pub layout: Layout,
    /// Fill both sides with patterns first, and compare a digest of the last block size's
    /// blocks on both sides at the end (see [`Verify`]).
    #[serde(default)]
    pub verify: bool,
}

/// The data check of `--verify`: both sides fill their buffers with a pattern of their own
/// before the run (every 8-byte word differs), and after it each side hashes the blocks of the
/// last block size's batches in the initiator's order: the initiator its local blocks, the
/// target the remote blocks they map to. After WRITEs the target's blocks must hold the
/// initiator's bytes, after READs the other way round; either way the two digests are equal
/// only if every block landed where it belongs, whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verify {
    /// Threads of the run.
    pub threads: usize,
    /// Batches in flight per thread.
    pub depth: usize,
    /// Blocks per batch.
    pub batch: usize,
    /// The block size hashed (the run's last).
    pub block_size: u64,
    /// Where blocks landed.
    pub layout: Layout,
}

impl Verify {
    /// The message the initiator ends the run with (`done verify threads=1 depth=2 ...`).
    pub fn message(&self) -> String {
        format!(
            "done verify threads={} depth={} batch={} block_size={} layout={}",
            self.threads,
            self.depth,
            self.batch,
            self.block_size,
            format!("{:?}", self.layout).to_lowercase()
        )
    }

    /// Reads [`Verify::message`] back; `None` for anything else.
    pub fn parse(data: &[u8]) -> Option<Verify> {
        let text = std::str::from_utf8(data).ok()?;
        let rest = text.strip_prefix("done verify ")?;
        let field = |k: &str| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))
        };
        let layout = match field("layout")? {
            "scattered" => Layout::Scattered,
            "contiguous" => Layout::Contiguous,
            "repeat" => Layout::Repeat,
            _ => return None,
        };
        Some(Verify {
            threads: field("threads")?.parse().ok()?,
            depth: field("depth")?.parse().ok()?,
            batch: field("batch")?.parse().ok()?,
            block_size: field("block_size")?.parse().ok()?,
            layout,
        })
    }

    /// The blocks hashed, in order: the local ones (`remote` false) or the target's.
    pub fn blocks(&self, remote: bool) -> Vec<u32> {
        (0..self.threads * self.depth)
            .flat_map(|range| {
                let (lb, rb) = block_range(range * self.batch, self.batch, self.layout);
                if remote {
                    rb
                } else {
                    lb
                }
            })
            .collect()
    }

    /// The digest of `blocks` of `seg` (FNV-1a, 64 bits, over the bytes in order).
    ///
    /// # Errors
    /// [`gdr_xfer::Error::OutOfSegment`] for a block outside the segment.
    pub fn digest(&self, seg: &Segment, remote: bool) -> gdr_xfer::Result<u64> {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let mut block = vec![0u8; self.block_size as usize];
        for b in self.blocks(remote) {
            seg.read(u64::from(b) * self.block_size, &mut block)?;
            for &byte in &block {
                h = (h ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        Ok(h)
    }
}

/// Fills `seg` with a pattern of 8-byte words that differ from one another and from another
/// seed's (splitmix64 of the word's index and `seed`).
///
/// # Errors
/// The segment's copy errors.
pub fn fill_pattern(seg: &Segment, seed: u64) -> gdr_xfer::Result<()> {
    const CHUNK: usize = 1 << 20;
    let len = seg.len() as usize;
    let mut buf = Vec::with_capacity(CHUNK.min(len));
    let mut at = 0usize;
    while at < len {
        let n = CHUNK.min(len - at);
        buf.clear();
        buf.extend((0..n.div_ceil(8)).flat_map(|w| {
            let mut z = ((at / 8 + w) as u64)
                .wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)).to_le_bytes()
        }));
        buf.truncate(n);
        seg.write(at as u64, &buf)?;
        at += n;
    }
    Ok(())
}

/// One block size's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    /// Bytes per block.
    pub block_size: u64,
    /// Blocks per batch.
    pub batch_size: usize,
    /// Batches completed (all threads).
    pub batches: u64,
    /// Bandwidth, 10^9 bytes per second.
    pub gb_s: f64,
    /// Bandwidth, 10^9 bits per second.
    pub gbit_s: f64,
    /// Average time of a batch from submission to completion, microseconds.
    pub avg_lat_us: f64,
    /// Checking and merging (prepare), average and p99, microseconds.
    pub avg_prep_us: f64,
    /// p99 of prepare.
    pub p99_prep_us: f64,
    /// Submission until the last request was posted, average, microseconds.
    pub avg_post_us: f64,
    /// p99 of post.
    pub p99_post_us: f64,
    /// Submission until completion, average, microseconds.
    pub avg_tx_us: f64,
    /// p99 of transfer.
    pub p99_tx_us: f64,
    /// Work requests per batch (after merging and slicing).
    pub slices_per_batch: f64,
    /// What each rail carried during this row.
    pub rails: Vec<RailRow>,
}

/// One rail's share of a row (from the engine's per-rail telemetry).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RailRow {
    /// The rail's position.
    pub rail: usize,
    /// `device:port`.
    pub device: String,
    /// Bytes it completed during the row.
    pub bytes: u64,
    /// Its share of the row's bytes.
    pub share: f64,
    /// Its bandwidth during the row, 10^9 bytes per second.
    pub gb_s: f64,
    /// Error completions that paused it during the row.
    pub errors: u64,
    /// Slices it carried when it failed, posted again elsewhere, during the row.
    pub retries: u64,
    /// Its state at the end of the row.
    pub state: String,
}

/// A whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    /// The parameters.
    pub params: BenchParams,
    /// The rails used, `device:port`, comma-separated.
    pub device: String,
    /// One row per block size.
    pub rows: Vec<BenchRow>,
    /// With `verify`: what was hashed, and the initiator's digest (the target prints its own).
    #[serde(default)]
    pub verify: Option<(Verify, u64)>,
}

/// Name of the target's buffer segment.
pub const TARGET_SEGMENT: &str = "xfer-bench";

/// The pattern seeds of `verify`: the initiator's local buffer, the target's.
const INITIATOR_SEED: u64 = 1;
const TARGET_SEED: u64 = 2;

/// `WHO: digest 0x... over N blocks of S B`, as both sides print it.
pub fn digest_line(who: &str, v: &Verify, digest: u64) -> String {
    format!(
        "{who}: digest {digest:#018x} over {} blocks of {} B",
        v.threads * v.depth * v.batch,
        v.block_size
    )
}

/// Runs the target: registers `buffer_size` bytes, listens, and serves until an initiator sends
/// the notification `done` or goes away (or forever with `forever`). With `verify`, the buffer
/// is filled with a pattern first, and an initiator's `done verify ...` message is answered by
/// printing the digest of the blocks it names (`xfer-bench target: digest ...`).
///
/// # Errors
/// The engine's errors.
pub fn run_target(
    cfg: AgentConfig,
    listen: &str,
    buffer_size: usize,
    forever: bool,
    verify: bool,
) -> gdr_xfer::Result<()> {
    let agent = Agent::new(cfg)?;
    let buf = agent.alloc_host(buffer_size, TARGET_SEGMENT)?;
    if verify {
        fill_pattern(&buf, TARGET_SEED)?;
    }
    let addr = agent.listen(listen)?;
    println!(
        "xfer-bench target: listening on {addr} ({}), buffer {buffer_size} bytes",
        agent.device()
    );
    let mut served = false;
    loop {
        // Whether the initiator was connected is read before waiting: its last message is
        // queued before it is forgotten, so a wait after seeing it gone still returns that
        // message (read after the wait, the message could come and the initiator go between
        // the two, and the message would never be read).
        let connected = !agent.peers().is_empty();
        if let Some(n) = agent.wait_notification(Duration::from_millis(200))? {
            if let Some(v) = Verify::parse(&n.data) {
                println!(
                    "{}",
                    digest_line("xfer-bench target", &v, v.digest(&buf, true)?)
                );
            }
            if n.data.starts_with(b"done") && !forever {
                return Ok(());
            }
        } else if served && !connected && !forever {
            println!("xfer-bench target: the initiator left without saying done");
            return Ok(());
        }
        served |= connected;
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn avg(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The remote block of local block `i` of a thread's range of `n` blocks.
fn scatter(i: usize, n: usize) -> usize {
    // A stride coprime with n (an odd prime that does not divide it) permutes 0..n.
    let stride = [7919usize, 7907, 7901]
        .into_iter()
        .find(|s| !n.is_multiple_of(*s))
        .unwrap_or(1);
    (i * stride + n / 3) % n
}

/// The local and remote blocks of a batch of `batch` blocks starting at block `first`.
fn block_range(first: usize, batch: usize, layout: Layout) -> (Vec<u32>, Vec<u32>) {
    let first = first as u32;
    let lb = (0..batch as u32)
        .map(|i| first + if layout == Layout::Repeat { 0 } else { i })
        .collect();
    let rb = (0..batch)
        .map(|i| {
            first
                + match layout {
                    Layout::Scattered => scatter(i, batch) as u32,
                    Layout::Contiguous => i as u32,
                    Layout::Repeat => 0,
                }
        })
        .collect();
    (lb, rb)
}

struct Sample {
    /// When the batch completed.
    done: Instant,
    prep: f64,
    post: f64,
    tx: f64,
    slices: u64,
}

/// Runs the initiator against the target at `addr`.
///
/// # Errors
/// The engine's errors; [`gdr_xfer::Error::InvalidArgument`] when the target's buffer is too
/// small for threads x batch x the largest block.
pub fn run_initiator(
    mut cfg: AgentConfig,
    addr: &str,
    params: &BenchParams,
) -> gdr_xfer::Result<BenchReport> {
    cfg.qps_per_peer = params.qps;
    cfg.slice_size = params.slice_size;
    let op = if params.op == "read" {
        Op::Read
    } else {
        Op::Write
    };
    let agent = Agent::new(cfg)?;
    let largest = params.block_sizes.iter().copied().max().unwrap_or(0);
    let need = largest as usize * params.batch * params.threads * params.depth.max(1);
    let local = agent.alloc_host(need.max(1), "xfer-bench-local")?;
    if params.verify {
        fill_pattern(&local, INITIATOR_SEED)?;
    }
    let peer = agent.connect(addr)?;
    let remote = peer.wait_segment_named(TARGET_SEGMENT, Duration::from_secs(10))?;
    if (remote.len as usize) < need {
        return Err(gdr_xfer::Error::invalid(
            format!(
                "the target's buffer has {} bytes; {} threads x {} batches in flight x {} blocks x {largest} bytes need {need}",
                remote.len, params.threads, params.depth.max(1), params.batch
            ),
            "start the target with a larger --buffer-size",
        ));
    }
    let mut rows = Vec::new();
    for &bs in &params.block_sizes {
        rows.push(run_size(&peer, &local, remote.id, op, bs, params)?);
    }
    // Tell the target we are done (it exits unless it serves forever); with `verify`, in a
    // message (a write would change a verified byte) that names the blocks to hash.
    let verify = match (params.verify, params.block_sizes.last()) {
        (true, Some(&block_size)) => {
            let v = Verify {
                threads: params.threads.max(1),
                depth: params.depth.max(1),
                batch: params.batch.max(1),
                block_size,
                layout: params.layout,
            };
            let digest = v.digest(&local, false)?;
            peer.send_notification(v.message(), &TransferOptions::new())?
                .wait(Duration::from_secs(10))?;
            Some((v, digest))
        }
        _ => {
            peer.write(
                &[gdr_xfer::Desc::new(&local, 0, remote.id, 0, 1)],
                &TransferOptions::new().notify("done"),
            )?
            .wait(Duration::from_secs(10))?;
            None
        }
    };
    Ok(BenchReport {
        params: params.clone(),
        device: agent
            .rails()
            .iter()
            .map(|(d, p)| format!("{d}:{p}"))
            .collect::<Vec<_>>()
            .join(","),
        rows,
        verify,
    })
}

fn run_size(
    peer: &gdr_xfer::Peer,
    local: &Segment,
    remote: gdr_xfer::SegmentId,
    op: Op,
    bs: u64,
    params: &BenchParams,
) -> gdr_xfer::Result<BenchRow> {
    let threads = params.threads.max(1);
    let batch = params.batch.max(1);
    let depth = params.depth.max(1);
    let rails_before = peer.rail_stats();
    let duration = Duration::from_secs_f64(params.duration_s.max(0.01));
    let stop = Arc::new(AtomicBool::new(false));
    let start_line = Arc::new(Barrier::new(threads + 1));
    let mut handles = Vec::new();
    for t in 0..threads {
        let peer = peer.clone();
        let local = local.clone();
        let stop = stop.clone();
        let start_line = start_line.clone();
        let layout = params.layout;
        handles.push(std::thread::spawn(
            move || -> gdr_xfer::Result<Vec<Sample>> {
                // One block range per batch in flight: thread t's d-th is range t x depth + d.
                let sides: Vec<(Vec<u32>, Vec<u32>)> = (0..depth)
                    .map(|d| block_range((t * depth + d) * batch, batch, layout))
                    .collect();
                let tables: Vec<BlockTable<'_>> = sides
                    .iter()
                    .map(|(lb, rb)| BlockTable::new(&local, lb, remote, rb, bs))
                    .collect();
                let opts = TransferOptions::new().timeout(Duration::from_secs(60));
                // Warm-up, outside the measurement: every block range once, all in flight
                // together, so that the data check of `verify` covers only ranges that moved
                // (a short run may stop before the loop below posts them all). Every thread
                // reaches the start line, a failed one too (the others would wait for it forever).
                let warm = tables
                    .iter()
                    .map(|table| peer.transfer_blocks(op, table, &opts))
                    .collect::<gdr_xfer::Result<Vec<_>>>()
                    .and_then(|posted| {
                        posted
                            .into_iter()
                            .try_for_each(|t| t.wait(Duration::from_secs(60)).map(drop))
                    });
                start_line.wait();
                warm?;
                let mut samples = Vec::new();
                let mut in_flight = std::collections::VecDeque::with_capacity(depth);
                let mut next = 0usize;
                loop {
                    while in_flight.len() < depth && !stop.load(Ordering::Relaxed) {
                        in_flight.push_back(peer.transfer_blocks(
                            op,
                            &tables[next % depth],
                            &opts,
                        )?);
                        next += 1;
                    }
                    // Batches still in flight at the stop are waited for and counted.
                    let Some(oldest) = in_flight.pop_front() else {
                        break;
                    };
                    let s = oldest.wait(Duration::from_secs(60))?;
                    samples.push(Sample {
                        done: Instant::now(),
                        prep: s.plan_time.as_secs_f64() * 1e6,
                        post: s.time_to_post.as_secs_f64() * 1e6,
                        tx: s.time_to_complete.as_secs_f64() * 1e6,
                        slices: s.slices,
                    });
                }
                Ok(samples)
            },
        ));
    }
    start_line.wait();
    let began = Instant::now();
    // On stderr, for scripts that sample the host during the measurement (compare-peers).
    eprintln!(
        "xfer-bench: measuring {bs} B blocks for {} s",
        duration.as_secs_f64()
    );
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(s)) => all.extend(s),
            Ok(Err(e)) => first_err = first_err.or(Some(e)),
            Err(_) => {
                first_err = first_err.or(Some(gdr_xfer::Error::invalid(
                    "a benchmark thread panicked",
                    "report this as a bug",
                )))
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    // Bytes of every batch submitted after the start line, over the time until the last one
    // finished (batches in flight at the stop count, and so does the time they took).
    let elapsed = all
        .iter()
        .map(|s| s.done.duration_since(began))
        .max()
        .unwrap_or_default()
        .as_secs_f64()
        .max(1e-9);
    let bytes = all.len() as f64 * batch as f64 * bs as f64;
    let mut prep: Vec<f64> = all.iter().map(|s| s.prep).collect();
    let mut post: Vec<f64> = all.iter().map(|s| s.post).collect();
    let mut tx: Vec<f64> = all.iter().map(|s| s.tx).collect();
    for v in [&mut prep, &mut post, &mut tx] {
        v.sort_by(f64::total_cmp);
    }
    let gb_s = bytes / elapsed / 1e9;
    let rails_after = peer.rail_stats();
    let total: u64 = rails_after
        .iter()
        .zip(&rails_before)
        .map(|(a, b)| a.bytes - b.bytes)
        .sum();
    let rails = rails_after
        .iter()
        .zip(&rails_before)
        .map(|(a, b)| RailRow {
            rail: a.rail,
            device: format!("{}:{}", a.device, a.port),
            bytes: a.bytes - b.bytes,
            share: (a.bytes - b.bytes) as f64 / total.max(1) as f64,
            gb_s: (a.bytes - b.bytes) as f64 / elapsed / 1e9,
            errors: a.errors - b.errors,
            retries: a.retries - b.retries,
            state: format!("{:?}", a.state).to_lowercase(),
        })
        .collect();
    Ok(BenchRow {
        block_size: bs,
        batch_size: batch,
        batches: all.len() as u64,
        gb_s,
        gbit_s: gb_s * 8.0,
        avg_lat_us: avg(&tx),
        avg_prep_us: avg(&prep),
        p99_prep_us: percentile(&prep, 0.99),
        avg_post_us: avg(&post),
        p99_post_us: percentile(&post, 0.99),
        avg_tx_us: avg(&tx),
        p99_tx_us: percentile(&tx, 0.99),
        slices_per_batch: if all.is_empty() {
            0.0
        } else {
            all.iter().map(|s| s.slices as f64).sum::<f64>() / all.len() as f64
        },
        rails,
    })
}

/// The table, nixlbench's columns.
pub fn table(r: &BenchReport) -> String {
    let mut s = format!(
        "gdr xfer-bench: {} threads, {:?} {} layout, {} QPs per rail, slice {} B, rails {}\n",
        r.params.threads,
        r.params.op,
        format!("{:?}", r.params.layout).to_lowercase(),
        r.params.qps,
        r.params.slice_size,
        r.device
    );
    s.push_str(&format!(
        "{:>14} {:>10} {:>10} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n",
        "Block Size (B)",
        "Batch Size",
        "B/W (GB/s)",
        "Avg Lat (us)",
        "Avg Prep",
        "P99 Prep",
        "Avg Post",
        "P99 Post",
        "Avg Tx",
        "P99 Tx"
    ));
    for row in &r.rows {
        s.push_str(&format!(
            "{:>14} {:>10} {:>10.4} {:>12.1} {:>12.1} {:>12.1} {:>12.1} {:>12.1} {:>12.1} {:>12.1}\n",
            row.block_size,
            row.batch_size,
            row.gb_s,
            row.avg_lat_us,
            row.avg_prep_us,
            row.p99_prep_us,
            row.avg_post_us,
            row.p99_post_us,
            row.avg_tx_us,
            row.p99_tx_us
        ));
        if row.rails.len() > 1 {
            for r in &row.rails {
                s.push_str(&format!(
                    "{:>14} rail {} {}: {:.1} % of the bytes, {:.4} GB/s, {} errors, {} retried slices, {}\n",
                    "",
                    r.rail,
                    r.device,
                    r.share * 100.0,
                    r.gb_s,
                    r.errors,
                    r.retries,
                    r.state
                ));
            }
        }
    }
    if let Some((v, d)) = &r.verify {
        s.push_str(&digest_line("xfer-bench", v, *d));
        s.push('\n');
    }
    s
}

/// CSV with a header line (and, with `verify`, the digest line after the rows).
pub fn csv(r: &BenchReport) -> String {
    let mut s = String::from("block_size,batch_size,batches,gb_s,gbit_s,avg_lat_us,avg_prep_us,p99_prep_us,avg_post_us,p99_post_us,avg_tx_us,p99_tx_us,slices_per_batch,rail_bytes\n");
    for x in &r.rows {
        let rails = x
            .rails
            .iter()
            .map(|r| r.bytes.to_string())
            .collect::<Vec<_>>()
            .join(";");
        s.push_str(&format!(
            "{},{},{},{:.6},{:.6},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.1},{rails}\n",
            x.block_size,
            x.batch_size,
            x.batches,
            x.gb_s,
            x.gbit_s,
            x.avg_lat_us,
            x.avg_prep_us,
            x.p99_prep_us,
            x.avg_post_us,
            x.p99_post_us,
            x.avg_tx_us,
            x.p99_tx_us,
            x.slices_per_batch
        ));
    }
    if let Some((v, d)) = &r.verify {
        s.push_str(&digest_line("xfer-bench", v, *d));
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_is_a_permutation() {
        for n in [1usize, 2, 3, 128, 7919, 7919 * 7907, 10_000] {
            if n > 100_000 {
                continue;
            }
            let mut seen = vec![false; n];
            for i in 0..n {
                let j = scatter(i, n);
                assert!(!seen[j], "n={n}: {j} twice");
                seen[j] = true;
            }
        }
    }

    #[test]
    fn the_verify_message_round_trips_and_names_matching_blocks() {
        let v = Verify {
            threads: 2,
            depth: 2,
            batch: 5,
            block_size: 1024,
            layout: Layout::Scattered,
        };
        assert_eq!(Verify::parse(v.message().as_bytes()), Some(v));
        assert_eq!(Verify::parse(b"done"), None);
        assert_eq!(Verify::parse(b"done verify threads=1"), None);
        assert_eq!(
            Verify::parse(b"done verify threads=x depth=1 batch=1 block_size=1 layout=repeat"),
            None
        );
        let (l, r) = (v.blocks(false), v.blocks(true));
        assert_eq!(l.len(), 20);
        // Each range's remote blocks are a permutation of its local ones.
        for (lc, rc) in l.chunks(5).zip(r.chunks(5)) {
            let (mut a, mut b) = (lc.to_vec(), rc.to_vec());
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b);
        }
        assert_ne!(l, r);
    }

    #[test]
    fn percentiles_of_sorted_samples() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.99), 0.0);
        assert_eq!(avg(&[1.0, 3.0]), 2.0);
    }
}
