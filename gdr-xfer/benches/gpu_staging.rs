//! What host staging (`gdr_xfer::staging`) costs and reaches on a GPU, built optimized
//! (`cargo bench -p gdr-xfer --bench gpu_staging`; `cargo xtask gpu-bundle` bundles it for the GPU
//! machine, whose `run.sh` runs it). Needs a CUDA GPU, no RDMA device. Every line goes to stdout
//! and to `$OUT/gpu-staging.txt` when `$OUT` is set. Arguments pick sections by name (all by
//! default): `copy_costs`, `throughput`, `kv_sizes`, `timeline`, `cut_sweep`.
//!
//! - `copy_costs`: one copy's CPU cost to issue, its latency alone, and the rate of copies back to
//!   back per piece size: the copy engine's fixed cost per copy (about 1.5 us D2H and 2 us H2D on
//!   an H200) is what bounds the overlap below.
//! - `throughput`: the staged pipeline against pinned `cuMemcpy` at 16 MiB, 256 MiB and 1 GiB
//!   (every byte checked), and with a simulated 25 and 50 GB/s NIC.
//! - `kv_sizes`: one layer's KV blocks (16 MiB) overlapped with a simulated 25 and 50 GB/s NIC,
//!   for the default cut and the cuts it replaced, against min(staged, NIC), min(pinned, NIC)
//!   and the least time any cut can take with the copy costs just measured.
//! - `timeline`: where a 16 MiB overlapped run's time goes (fill, NIC busy, NIC idle, drain).
//! - `cut_sweep`: the same timeline for other cuts, and the default's chunk by chunk.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr::cuda::{self, DeviceBuffer, DmaHostBuffer, PinnedHostBuffer, Stream};
use gdr_test_support::gpu;
use gdr_xfer::staging::cut::{self, CopyModel};
use gdr_xfer::staging::{Direction, Outcome, Stager, StagingConfig, StagingEvent};

const MIB: usize = 1 << 20;

fn main() {
    let picked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants = |name: &str| picked.is_empty() || picked.iter().any(|p| name.contains(p.as_str()));
    gpu();
    let costs = copy_costs(wants("copy_costs"));
    if wants("throughput") {
        throughput();
    }
    if wants("kv_sizes") {
        kv_sizes(&costs);
    }
    if wants("timeline") {
        timeline();
    }
    if wants("cut_sweep") {
        cut_sweep();
    }
}

fn gpu() {
    gpu::require_gpu("this benchmark");
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    gpu::block_pattern(len, seed)
}

/// Prints `line` and appends it to `$OUT/gpu-staging.txt` (see [`gpu::report`]).
fn report(line: &str) {
    gpu::report("gpu-staging.txt", line);
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

/// The median of `reps` timings of `f`.
fn median(reps: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let mut v: Vec<Duration> = (0..reps).map(|_| f()).collect();
    v.sort();
    v[v.len() / 2]
}

fn size_text(n: usize) -> String {
    if n >= 1 << 30 {
        format!("{}GiB", n >> 30)
    } else {
        format!("{}MiB", n >> 20)
    }
}

/// Copies `src` into `dst` with `threads` threads (the host-side step after staging).
fn par_copy(dst: &mut [u8], src: &[u8], threads: usize) {
    let per = src.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(per).zip(src.chunks(per)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

/// The engine's loop against a simulated NIC of `nic_gbps` with a send queue, as a real one has:
/// a chunk is posted as soon as it is ready (D2H: an RDMA WRITE from the chunk; H2D: an RDMA
/// READ into it), and the NIC works through posted chunks back to back, each for `len / rate`,
/// so chunk k ends at max(its post, the end of chunk k-1) + len / rate. The loop reaps a chunk
/// whose time is over (D2H: `release`; H2D: `commit`), as the engine reaps a completion. With
/// the copies overlapped the time is about `size / min(copy, nic)`; run one after the other it
/// would be `size / copy + size / nic`. (An earlier model started the next chunk only when the
/// loop came round to it, so the loop's own time between two chunks counted as NIC time.)
fn simulated_nic(
    st: &mut Stager,
    dev: &Arc<DeviceBuffer>,
    size: usize,
    direction: Direction,
    nic_gbps: f64,
) -> Duration {
    simulated_nic_traced(st, dev, size, direction, nic_gbps, &mut Vec::new())
}

/// One chunk's time on the simulated NIC: when the loop saw it ready, when the NIC started and
/// ended it, and its length.
#[derive(Debug, Clone, Copy)]
struct NicSpan {
    ready: Instant,
    start: Instant,
    end: Instant,
}

/// [`simulated_nic`], recording each chunk's [`NicSpan`] into `trace`.
fn simulated_nic_traced(
    st: &mut Stager,
    dev: &Arc<DeviceBuffer>,
    size: usize,
    direction: Direction,
    nic_gbps: f64,
    trace: &mut Vec<NicSpan>,
) -> Duration {
    let t = Instant::now();
    let ticket = match direction {
        Direction::DeviceToHost => st.start_d2h(dev, 0..size).unwrap(),
        Direction::HostToDevice => st.start_h2d(dev, 0..size).unwrap(),
    };
    let mut events = Vec::new();
    // Posted chunks, in order, with the time the NIC is done with each.
    let mut on_nic: std::collections::VecDeque<(Instant, gdr_xfer::staging::Chunk)> =
        Default::default();
    let mut nic_free = t;
    loop {
        st.poll(&mut events);
        let now = Instant::now();
        for ev in events.drain(..) {
            match ev {
                StagingEvent::Ready(c) | StagingEvent::Fill(c) => {
                    let busy = Duration::from_secs_f64(c.len() as f64 / (nic_gbps * 1e9));
                    let start = nic_free.max(now);
                    nic_free = start + busy;
                    trace.push(NicSpan {
                        ready: now,
                        start,
                        end: nic_free,
                    });
                    on_nic.push_back((nic_free, c));
                }
                StagingEvent::Finished {
                    ticket: done,
                    outcome,
                } => {
                    assert_eq!(done, ticket);
                    assert!(outcome.is_completed(), "{outcome:?}");
                    return t.elapsed();
                }
            }
        }
        while on_nic.front().is_some_and(|(end, _)| *end <= now) {
            let (_, c) = on_nic.pop_front().unwrap();
            match c.direction() {
                Direction::DeviceToHost => st.release(c).unwrap(),
                Direction::HostToDevice => st.commit(c).unwrap(),
            }
        }
    }
}

fn throughput() {
    let info = cuda::device_info(0).unwrap();
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get().min(8));
    report(&format!(
        "GPU 0: {} ({}), host copy threads: {threads}",
        info.name, info.pci_bus_id
    ));
    let configs = [
        StagingConfig::new(8 * MIB, 4),
        StagingConfig::new(4 * MIB, 4),
        StagingConfig::new(16 * MIB, 4),
        StagingConfig::new(2 * MIB, 8),
    ];
    let mut stagers: Vec<Stager> = configs
        .iter()
        .map(|c| Stager::new(0, *c).unwrap())
        .collect();
    let mut worst_pure = f64::MAX;
    for size in [16 * MIB, 256 * MIB, 1 << 30] {
        let reps = if size >= 1 << 30 { 3 } else { 5 };
        let data = pattern(size, size as u64);
        let dev = Arc::new(DeviceBuffer::alloc(0, size).unwrap());
        dev.copy_from_host(0, &data).unwrap();
        let mut pinned = PinnedHostBuffer::alloc(0, size).unwrap();

        // The baseline: one synchronous cuMemcpy into / out of pinned memory of the full size.
        let base_d2h = median(reps, || {
            let t = Instant::now();
            dev.copy_to_host(0, pinned.as_mut_slice()).unwrap();
            t.elapsed()
        });
        assert!(pinned.as_slice() == &data[..], "baseline D2H bytes differ");
        let base_h2d = median(reps, || {
            let t = Instant::now();
            dev.copy_from_host(0, pinned.as_slice()).unwrap();
            t.elapsed()
        });
        let (bd, bh) = (gbps(size, base_d2h), gbps(size, base_h2d));
        report(&format!(
            "baseline size={} pinned cuMemcpy: D2H {bd:.1} GB/s, H2D {bh:.1} GB/s",
            size_text(size)
        ));

        let mut out = vec![0u8; size];
        out.fill(1); // fault the pages in before timing
        let dev_b = Arc::new(DeviceBuffer::alloc(0, size).unwrap());
        for st in &mut stagers {
            let c = st.config();
            let label = format!("{}x{}MiB", c.chunks, c.chunk_size / MIB);
            // Pure staging: device -> bounce, the caller's step (the RDMA) takes no time.
            let pure_d2h = median(reps, || {
                let t = Instant::now();
                let o = st.copy_d2h_pipelined(&dev, 0..size, |_, _| Ok(())).unwrap();
                let e = t.elapsed();
                assert!(matches!(o, Outcome::Completed { bytes, .. } if bytes == size as u64));
                e
            });
            let pure_h2d = median(reps, || {
                let t = Instant::now();
                st.copy_h2d_pipelined(&dev_b, 0..size, |_, _| Ok(()))
                    .unwrap();
                t.elapsed()
            });
            // End to end: bounce -> pageable host memory (memcpy on `threads` threads), and back.
            let e2e_d2h = median(reps, || {
                out.fill(0);
                let t = Instant::now();
                st.copy_d2h_pipelined(&dev, 0..size, |off, bytes| {
                    par_copy(&mut out[off..off + bytes.len()], bytes, threads);
                    Ok(())
                })
                .unwrap();
                t.elapsed()
            });
            assert!(out == data, "staged D2H bytes differ ({label})");
            let e2e_h2d = median(reps, || {
                let t = Instant::now();
                st.copy_h2d_pipelined(&dev_b, 0..size, |off, buf| {
                    let n = buf.len();
                    par_copy(buf, &data[off..off + n], threads);
                    Ok(())
                })
                .unwrap();
                t.elapsed()
            });
            let back = dev_b.to_vec().unwrap();
            assert!(back == data, "staged H2D bytes differ ({label})");
            let (pd, ph) = (gbps(size, pure_d2h), gbps(size, pure_h2d));
            let (ed, eh) = (gbps(size, e2e_d2h), gbps(size, e2e_h2d));
            report(&format!(
                "staging size={} chunks={label}: D2H staged {pd:.1} GB/s ratio {:.3} | H2D staged {ph:.1} GB/s ratio {:.3} | with memcpy to/from pageable ({threads} threads): D2H {ed:.1} GB/s ({:.3}), H2D {eh:.1} GB/s ({:.3})",
                size_text(size),
                pd / bd,
                ph / bh,
                ed / bd,
                eh / bh
            ));
            if c == StagingConfig::default() {
                if size >= 1 << 30 {
                    worst_pure = worst_pure.min(pd / bd).min(ph / bh);
                }
                for nic in [25.0, 50.0] {
                    let d = gbps(
                        size,
                        median(reps, || {
                            simulated_nic(st, &dev, size, Direction::DeviceToHost, nic)
                        }),
                    );
                    let h = gbps(
                        size,
                        median(reps, || {
                            simulated_nic(st, &dev_b, size, Direction::HostToDevice, nic)
                        }),
                    );
                    let ideal_d = pd.min(nic);
                    let ideal_h = ph.min(nic);
                    let serial_d = 1.0 / (1.0 / pd + 1.0 / nic);
                    report(&format!(
                        "overlap size={} chunks={label} simulated NIC {nic:.0} GB/s: D2H {d:.1} GB/s = {:.3} of min(staged, NIC) (serial would be {serial_d:.1}) | H2D {h:.1} GB/s = {:.3} of min(staged, NIC)",
                        size_text(size),
                        d / ideal_d,
                        h / ideal_h
                    ));
                }
            }
        }
    }
    against_target(
        "default config (4 x 8 MiB), 1 GiB copies alone: worst of D2H and H2D, staged/pinned",
        worst_pure,
        0.95,
    );
}

/// Reports `value` against its `target`.
fn against_target(what: &str, value: f64, target: f64) {
    report(&format!(
        "{what} {value:.3} (target >= {target}: {})",
        if value >= target { "met" } else { "NOT met" }
    ));
}

/// Copies overlapped with a simulated NIC at the size of one layer's KV blocks (16 MiB), where
/// the pipeline's fill (the first copy before the first RDMA request) and drain (the last RDMA
/// WRITE after the last copy; the last copy after the last RDMA READ) weigh most. Each cut of the
/// range is measured alone (pure staging, the caller's step free) and against a 25 and a 50 GB/s
/// NIC, medians of nine; the ratio is to min(that cut's pure staging, NIC) and, stricter, to
/// min(pinned cuMemcpy, NIC).
fn kv_sizes(costs: &CopyCosts) {
    let size = 16 * MIB;
    let reps = 9;
    let data = pattern(size, 16);
    let dev = Arc::new(DeviceBuffer::alloc(0, size).unwrap());
    dev.copy_from_host(0, &data).unwrap();
    let dev_b = Arc::new(DeviceBuffer::alloc(0, size).unwrap());
    let mut pinned = PinnedHostBuffer::alloc(0, size).unwrap();
    let base_d2h = gbps(
        size,
        median(reps, || {
            let t = Instant::now();
            dev.copy_to_host(0, pinned.as_mut_slice()).unwrap();
            t.elapsed()
        }),
    );
    let base_h2d = gbps(
        size,
        median(reps, || {
            let t = Instant::now();
            dev.copy_from_host(0, pinned.as_slice()).unwrap();
            t.elapsed()
        }),
    );
    report(&format!(
        "kv-size overlap: 16MiB pinned cuMemcpy D2H {base_d2h:.1} GB/s, H2D {base_h2d:.1} GB/s"
    ));
    let d = StagingConfig::default();
    let paced = |gbps: u64| StagingConfig {
        nic_rate: gbps * 1_000_000_000,
        ..d
    };
    let cuts = [
        (
            "least-time cut for a 50 GB/s NIC (an agent's, its rails at 400 Gb/s)",
            paced(50),
        ),
        ("least-time cut for a 25 GB/s NIC", paced(25)),
        ("default without a NIC rate: 16 pieces, ramp from 256KiB", d),
        (
            "8 pieces, ramp from 256KiB",
            StagingConfig {
                min_piece: 2 * MIB,
                ..d
            },
        ),
        (
            "16 pieces, no ramp",
            StagingConfig {
                first_piece: d.chunk_size,
                ..d
            },
        ),
        (
            "before: 4 pieces of 4MiB, no ramp",
            StagingConfig {
                min_piece: 4 * MIB,
                first_piece: d.chunk_size,
                ..d
            },
        ),
    ];
    // The least time any cut can take, from the copy costs measured before (GB/s).
    let best = |direction: Direction, nic: f64| {
        let c = costs.of(direction);
        size as f64 / c.least_time(direction, size, nic * 1e3) / 1e3
    };
    for nic in [25.0, 50.0] {
        let line = |direction: Direction| {
            let (extra, pieces) = costs.of(direction).least_extra(direction, size, nic * 1e3);
            let b = best(direction, nic);
            format!(
                "{b:.1} GB/s = {:.3} of the NIC ({extra:.1} us over size / NIC and {:.1} us of latency, best cut {pieces} pieces)",
                b / nic,
                costs.of(direction).latency
            )
        };
        report(&format!(
            "kv-size bound, NIC {nic:.0} GB/s: with these copy costs no cut of 16 MiB beats D2H {} | H2D {}",
            line(Direction::DeviceToHost),
            line(Direction::HostToDevice)
        ));
    }
    let mut default_worst = f64::MAX;
    let mut default_of_bound = f64::MAX;
    for (label, config) in cuts {
        let mut st = Stager::new(0, config).unwrap();
        let pure_d2h = gbps(
            size,
            median(reps, || {
                let t = Instant::now();
                st.copy_d2h_pipelined(&dev, 0..size, |_, _| Ok(())).unwrap();
                t.elapsed()
            }),
        );
        let pure_h2d = gbps(
            size,
            median(reps, || {
                let t = Instant::now();
                st.copy_h2d_pipelined(&dev_b, 0..size, |_, _| Ok(()))
                    .unwrap();
                t.elapsed()
            }),
        );
        report(&format!(
            "kv-size cut [{label}]: pure staging D2H {pure_d2h:.1} GB/s ({:.3} of pinned), H2D {pure_h2d:.1} GB/s ({:.3})",
            pure_d2h / base_d2h,
            pure_h2d / base_h2d
        ));
        for nic in [25.0, 50.0] {
            let od = gbps(
                size,
                median(reps, || {
                    simulated_nic(&mut st, &dev, size, Direction::DeviceToHost, nic)
                }),
            );
            let oh = gbps(
                size,
                median(reps, || {
                    simulated_nic(&mut st, &dev_b, size, Direction::HostToDevice, nic)
                }),
            );
            let (rd, rh) = (od / pure_d2h.min(nic), oh / pure_h2d.min(nic));
            let (bd, bh) = (
                od / best(Direction::DeviceToHost, nic),
                oh / best(Direction::HostToDevice, nic),
            );
            report(&format!(
                "kv-size cut [{label}] NIC {nic:.0} GB/s: D2H {od:.1} GB/s = {rd:.3} of min(staged, NIC), {:.3} of min(pinned, NIC), {bd:.3} of the bound | H2D {oh:.1} GB/s = {rh:.3} of min(staged, NIC), {:.3} of min(pinned, NIC), {bh:.3} of the bound",
                od / base_d2h.min(nic),
                oh / base_h2d.min(nic)
            ));
            if config == paced(50) && nic == 50.0 {
                default_worst = rd.min(rh);
                default_of_bound = bd.min(bh);
            }
        }
    }
    against_target(
        "kv-size overlap, least-time cut, 50 GB/s NIC: worst of D2H and H2D, of min(staged, NIC):",
        default_worst,
        0.95,
    );
    report(&format!(
        "kv-size overlap, least-time cut, 50 GB/s NIC: worst of D2H and H2D, of the least time any cut can take: {default_of_bound:.3}"
    ));
}

/// Where a 16 MiB overlapped run's time goes, with the default cut and a 50 GB/s simulated NIC
/// (the median run of nine, by total time): the NIC's idle time before its first chunk (the
/// fill), between chunks (waiting for copies), and after its last one (D2H: nothing; H2D: the
/// last copies, the drain), against its busy time.
fn timeline() {
    let size = 16 * MIB;
    let dev = Arc::new(DeviceBuffer::alloc(0, size).unwrap());
    let d = StagingConfig::default();
    for (label, config) in [
        (
            "least-time cut",
            StagingConfig {
                nic_rate: 50_000_000_000,
                ..d
            },
        ),
        ("default without a NIC rate", d),
    ] {
        let mut st = Stager::new(0, config).unwrap();
        for direction in [Direction::DeviceToHost, Direction::HostToDevice] {
            let t = Timeline::median_of(9, &mut st, &dev, size, direction, 50.0);
            report(&format!(
                "timeline [{label}] {direction:?} 16MiB, 50 GB/s NIC, {t}"
            ));
        }
    }
}

/// One overlapped run's time, split as the NIC saw it.
struct Timeline {
    chunks: usize,
    total: Duration,
    fill: Duration,
    busy: Duration,
    gaps: Duration,
    tail: Duration,
    queued: Duration,
    first: usize,
    largest: usize,
    /// Per chunk: KiB, and ready, NIC start, NIC end in us from the start.
    spans: Vec<(usize, f64, f64, f64)>,
}

impl Timeline {
    /// The median (by total time) of `reps` runs of [`simulated_nic_traced`].
    fn median_of(
        reps: usize,
        st: &mut Stager,
        dev: &Arc<DeviceBuffer>,
        size: usize,
        direction: Direction,
        nic_gbps: f64,
    ) -> Timeline {
        let mut runs: Vec<(Duration, Instant, Vec<NicSpan>)> = (0..reps)
            .map(|_| {
                let mut trace = Vec::new();
                let t0 = Instant::now();
                let total = simulated_nic_traced(st, dev, size, direction, nic_gbps, &mut trace);
                (total, t0, trace)
            })
            .collect();
        runs.sort_by_key(|r| r.0);
        let (total, t0, trace) = &runs[runs.len() / 2];
        assert!(!trace.is_empty(), "no chunk went through the NIC");
        let len = |s: &NicSpan| ((s.end - s.start).as_secs_f64() * nic_gbps * 1e9).round() as usize;
        let last_end = trace.last().map_or(*t0, |s| s.end);
        Timeline {
            chunks: trace.len(),
            total: *total,
            fill: trace[0].start - *t0,
            busy: trace.iter().map(|s| s.end - s.start).sum(),
            gaps: trace
                .windows(2)
                .map(|w| w[1].start.saturating_duration_since(w[0].end))
                .sum(),
            tail: (*t0 + *total).saturating_duration_since(last_end),
            queued: trace.iter().map(|s| s.start - s.ready).sum(),
            first: len(&trace[0]),
            largest: trace.iter().map(len).max().unwrap_or(0),
            spans: trace
                .iter()
                .map(|sp| {
                    let at = |i: Instant| (i - *t0).as_secs_f64() * 1e6;
                    (
                        len(sp).div_ceil(1024),
                        at(sp.ready),
                        at(sp.start),
                        at(sp.end),
                    )
                })
                .collect(),
        }
    }
}

impl std::fmt::Display for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        write!(
            f,
            "{} chunks: total {:.1} us = fill {:.1} + NIC busy {:.1} + NIC idle between chunks {:.1} + after the NIC {:.1}; chunks waited {:.1} us in all for the NIC; first chunk {} KiB, largest {} KiB",
            self.chunks,
            us(self.total),
            us(self.fill),
            us(self.busy),
            us(self.gaps),
            us(self.tail),
            us(self.queued),
            self.first.div_ceil(1024),
            self.largest.div_ceil(1024),
        )
    }
}

/// One direction's copy costs, as [`copy_costs`] measured them.
#[derive(Debug, Clone, Copy)]
struct Costs {
    /// Bytes per microsecond of a long copy (8 MiB copies back to back).
    rate: f64,
    /// The copy engine's fixed time per copy (us): a 1 MiB copy's share of a queue of them,
    /// less 1 MiB at `rate`.
    per_copy: f64,
    /// The rest of a lone copy's latency (us): issuing it and seeing it complete.
    latency: f64,
}

impl Costs {
    /// The least extra time (us) over `size / nic` that any cut of `size` bytes into copies
    /// can take with these costs and a NIC of `nic` bytes per us (the bound of
    /// `gdr_xfer::staging::cut`, its least-time cut without a floor or a cap on the pieces),
    /// and the number of pieces of that cut.
    fn least_extra(&self, direction: Direction, size: usize, nic: f64) -> (f64, usize) {
        let model = CopyModel {
            rate: self.rate,
            per_copy_us: self.per_copy,
        };
        let rate = (nic * 1e6) as u64;
        match cut::least_time(size, direction, rate, model, 1, size) {
            Some(p) => (cut::time_over_nic(&p, direction, rate, model), p.len()),
            None => (f64::NAN, 0),
        }
    }

    /// The least time (us) any cut of `size` bytes takes with a NIC of `nic` bytes per us.
    fn least_time(&self, direction: Direction, size: usize, nic: f64) -> f64 {
        self.latency + size as f64 / nic + self.least_extra(direction, size, nic).0
    }
}

/// Both directions' copy costs.
#[derive(Debug, Clone, Copy)]
struct CopyCosts {
    d2h: Costs,
    h2d: Costs,
}

impl CopyCosts {
    fn of(&self, direction: Direction) -> &Costs {
        match direction {
            Direction::DeviceToHost => &self.d2h,
            Direction::HostToDevice => &self.h2d,
        }
    }
}

/// What one copy costs at the sizes the pipeline cuts: the CPU time to issue it
/// (`cuMemcpy*Async` and the event), the latency until `is_complete` sees it done when issued
/// alone, and the rate of a queue of such copies back to back (16 MiB in all), reported when
/// `print`; returns the model [`Costs`] derived from them (the pipeline's fill is about latency +
/// first piece / rate, and each copy adds the engine's fixed cost).
fn copy_costs(print: bool) -> CopyCosts {
    let total = 16 * MIB;
    let stream = Arc::new(Stream::new(0).unwrap());
    let dev = Arc::new(DeviceBuffer::alloc(0, total).unwrap());
    let host = Arc::new(DmaHostBuffer::alloc(0, total).unwrap());
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    // Per direction: (piece, lone latency us, queue time per copy us).
    let mut seen: Vec<(bool, usize, f64, f64)> = Vec::new();
    for piece in [
        64 << 10,
        128 << 10,
        256 << 10,
        512 << 10,
        MIB,
        2 * MIB,
        8 * MIB,
    ] {
        for d2h in [true, false] {
            let issue = |at: usize| {
                if d2h {
                    stream.copy_to_host(&dev, at, &host, at, piece).unwrap()
                } else {
                    stream.copy_to_device(&host, at, &dev, at, piece).unwrap()
                }
            };
            let mut issue_cost = Vec::new();
            let mut latency = Vec::new();
            for _ in 0..31 {
                let t = Instant::now();
                let mut c = issue(0);
                issue_cost.push(t.elapsed());
                while !c.is_complete().unwrap() {}
                latency.push(t.elapsed());
            }
            issue_cost.sort();
            latency.sort();
            let n = total / piece;
            // All issued first, then waited for: the engine's time per copy, unless issuing
            // them takes longer (small pieces: the issue column says).
            let queue = median(9, || {
                let t = Instant::now();
                let mut copies: Vec<_> = (0..n).map(|k| issue(k * piece)).collect();
                for c in &mut copies {
                    while !c.is_complete().unwrap() {}
                }
                t.elapsed()
            });
            seen.push((d2h, piece, us(latency[15]), us(queue) / n as f64));
            if print {
                report(&format!(
                    "copy {} {} KiB: issue {:.2} us, alone until seen complete {:.2} us (median of 31); {n} back to back: {:.1} GB/s",
                    if d2h { "D2H" } else { "H2D" },
                    piece >> 10,
                    us(issue_cost[15]),
                    us(latency[15]),
                    gbps(total, queue)
                ));
            }
        }
    }
    let model = |d2h: bool| {
        let at = |piece: usize| {
            seen.iter()
                .find(|s| s.0 == d2h && s.1 == piece)
                .map_or((0.0, 0.0), |s| (s.2, s.3))
        };
        let rate = (8 * MIB) as f64 / at(8 * MIB).1;
        let per_copy = (at(MIB).1 - MIB as f64 / rate).max(0.0);
        let small = 256 << 10;
        let latency = (at(small).0 - per_copy - small as f64 / rate).max(0.0);
        let c = Costs {
            rate,
            per_copy,
            latency,
        };
        if print {
            report(&format!(
                "copy model {}: {:.1} GB/s, {:.2} us per copy on the engine, {:.2} us to issue and see a lone copy complete",
                if d2h { "D2H" } else { "H2D" },
                rate / 1e3,
                per_copy,
                latency
            ));
        }
        c
    };
    CopyCosts {
        d2h: model(true),
        h2d: model(false),
    }
}

/// The overlapped 16 MiB run, 50 GB/s NIC, for other cuts (the bounce buffers' size caps the
/// piece) against the default: how the fill, the idle between chunks and the drain move with
/// the first and the largest piece; and the default's chunks one by one (KiB, then when each was
/// ready, and started and ended on the NIC, in us from the start).
fn cut_sweep() {
    let size = 16 * MIB;
    let dev = Arc::new(DeviceBuffer::alloc(0, size).unwrap());
    let k = 1 << 10;
    let d = StagingConfig::default();
    let mut cuts: Vec<(String, StagingConfig)> = vec![
        (
            "least-time".into(),
            StagingConfig {
                nic_rate: 50_000_000_000,
                ..d
            },
        ),
        ("default".into(), d),
    ];
    for (chunk, chunks, first) in [
        (MIB, 4, MIB),
        (768 * k, 4, 256 * k),
        (768 * k, 4, 512 * k),
        (512 * k, 16, 128 * k),
        (2 * MIB, 4, 256 * k),
    ] {
        cuts.push((
            format!(
                "{} x {} KiB, first {} KiB",
                chunks,
                chunk >> 10,
                first >> 10
            ),
            StagingConfig {
                chunk_size: chunk,
                chunks,
                min_piece: chunk.min(d.min_piece),
                first_piece: first,
                ..d
            },
        ));
    }
    for (label, config) in cuts {
        let mut st = Stager::new(0, config).unwrap();
        for direction in [Direction::DeviceToHost, Direction::HostToDevice] {
            let t = Timeline::median_of(9, &mut st, &dev, size, direction, 50.0);
            let ratio = t.busy.as_secs_f64() / t.total.as_secs_f64();
            report(&format!(
                "sweep [{label}] {direction:?}: {:.1} GB/s = {ratio:.3} of the NIC; {t}",
                gbps(size, t.total)
            ));
            if label != "default" && label != "least-time" {
                continue;
            }
            let spans: Vec<String> = t
                .spans
                .iter()
                .map(|(kib, r, a, b)| format!("{kib}K r{r:.1} s{a:.1} e{b:.1}"))
                .collect();
            report(&format!("  chunks: {}", spans.join(" | ")));
        }
    }
}
