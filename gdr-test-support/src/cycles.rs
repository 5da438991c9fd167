//! Resource cycles: a test makes and drops the same objects many times over, and checks that
//! every kernel object, file descriptor and thread is given back and the process does not grow
//! (gdr's `verbs_cycles` and gdr-xfer's `xfer_cycles`).
//!
//! After each chunk of cycles (1,000 in a full run, a quarter of a shorter one) [`run_cycles`]
//! compares `rdma res show`'s counts (pd, mr, cq, qp, cm_id) of the device under test, the open
//! file descriptors and the threads (`Threads:` of /proc/self/status) with the baseline taken
//! after one warm-up cycle, and the resident memory with the first checkpoint's, and prints one
//! table row. Threads a cycle leaves behind (an agent's control readers) end on their own, so a
//! checkpoint waits up to [`SETTLE`] for the counts to come back (the row prints how long that
//! took) before it fails.
//!
//! The number of cycles per test is `GDR_CYCLES` ([`cycles`]; the full run: `GDR_CYCLES=10000`).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::device;
/// How long a checkpoint waits for detached threads to finish and give their objects back.
pub const SETTLE: Duration = Duration::from_secs(5);

/// The counts `rdma res show` reports that the cycles must give back.
pub const KINDS: [&str; 5] = ["pd", "mr", "cq", "qp", "cm_id"];

/// Resident memory may grow this much over a run (allocator caches, lazily built tables).
pub const RSS_SLACK_KIB: u64 = 4096;

/// What is measured at a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// `rdma res show` counts of the device under test, by kind.
    pub res: BTreeMap<String, u64>,
    pub rss_kib: u64,
    pub fds: usize,
    pub threads: u64,
}

impl Sample {
    /// The part that must be back at the baseline exactly.
    pub fn counts(&self) -> (&BTreeMap<String, u64>, usize, u64) {
        (&self.res, self.fds, self.threads)
    }

    pub fn text(&self) -> String {
        format!(
            "{}; {} fds; {} threads; RSS {} KiB",
            res_text(&self.res),
            self.fds,
            self.threads,
            self.rss_kib
        )
    }
}

/// `rdma res show`'s counts for the device under test (`0: rxe0: pd 1 cq 2 qp 1 cm_id 0 mr 0`).
pub fn rdma_res() -> BTreeMap<String, u64> {
    let out = Command::new("rdma")
        .args(["res", "show"])
        .output()
        .expect("run `rdma res show` (iproute2's rdma tool)");
    assert!(
        out.status.success(),
        "rdma res show failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let dev = device();
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&format!("{dev}:")))
        .unwrap_or_else(|| panic!("no line for {dev} in `rdma res show`:\n{text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut res = BTreeMap::new();
    for kind in KINDS {
        let n = words
            .iter()
            .position(|w| *w == kind)
            .and_then(|i| words.get(i + 1))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {kind} count in `rdma res show`: {line}"));
        res.insert(kind.to_string(), n);
    }
    res
}

/// A number field of /proc/self/status (`VmRSS:`, `Threads:`).
pub fn status_field(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/self/status"))
}

pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

pub fn sample() -> Sample {
    Sample {
        res: rdma_res(),
        rss_kib: status_field("VmRSS:"),
        fds: open_fds(),
        threads: status_field("Threads:"),
    }
}

pub fn res_text(res: &BTreeMap<String, u64>) -> String {
    KINDS
        .iter()
        .map(|k| format!("{k} {}", res[*k]))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Cycles per test: `GDR_CYCLES`, else `default`.
pub fn cycles(default: usize) -> usize {
    match std::env::var("GDR_CYCLES") {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("GDR_CYCLES={v:?} is not a positive number")),
        Err(_) => default,
    }
}

/// Samples until the counts equal the baseline's or [`SETTLE`] passes; returns the last sample
/// and how long it waited after the first sample (zero when that one matched).
pub fn settle(base: &Sample) -> (Sample, Duration) {
    let s = sample();
    if s.counts() == base.counts() {
        return (s, Duration::ZERO);
    }
    let t = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(10));
        let s = sample();
        if s.counts() == base.counts() || t.elapsed() >= SETTLE {
            return (s, t.elapsed());
        }
    }
}

/// What a cycle test measured: a row per chunk.
pub struct Row {
    /// Cycles done at this checkpoint.
    pub done: usize,
    /// Cycles in this chunk.
    pub cycles: usize,
    pub sample: Sample,
    /// How long the chunk's cycles took.
    pub chunk: Duration,
    /// How long the checkpoint waited for the counts to settle.
    pub settled: Duration,
}

/// Runs `cycle` `n` times after one warm-up cycle (which opens the device files and fills the
/// allocator caches once per process), checking after each chunk (1,000 cycles, or a quarter of
/// a shorter run) that the kernel objects, fds and threads are back at the baseline and RSS is
/// flat. Prints the table; returns the rows.
///
/// `cycle(i, probe)` calls `probe()` while its objects live: in the warm-up cycle that takes
/// `rdma res show`'s counts, which must exceed the baseline's for each kind of `held` and equal
/// them for each kind of `not_held` (so the checkpoints see the objects a cycle makes, and a
/// cycle that must make none does not).
pub fn run_cycles(
    name: &str,
    n: usize,
    held: &[&str],
    not_held: &[&str],
    mut cycle: impl FnMut(usize, &mut dyn FnMut()),
) -> Vec<Row> {
    let mut during = None;
    cycle(0, &mut || during = Some(rdma_res()));
    let during = during.unwrap_or_else(|| panic!("{name}: the cycle never called probe()"));
    let (base, _) = settle(&sample());
    for kind in held {
        assert!(
            during[*kind] > base.res[*kind],
            "{name}: `rdma res show` counted {kind} {} while a cycle's objects lived, {} without",
            during[*kind],
            base.res[*kind]
        );
    }
    for kind in not_held {
        assert_eq!(
            during[*kind], base.res[*kind],
            "{name}: a cycle must make no {kind}, `rdma res show` counted {} during it, {} without",
            during[*kind], base.res[*kind]
        );
    }
    let chunk = 1000.min(n.div_ceil(4)).max(1);
    let mut rows = Vec::new();
    let mut done = 0;
    let start = Instant::now();
    while done < n {
        let this = chunk.min(n - done);
        let t = Instant::now();
        for i in 0..this {
            cycle(done + i + 1, &mut || {});
        }
        let elapsed = t.elapsed();
        done += this;
        let (s, settled) = settle(&base);
        assert_eq!(
            s.counts(),
            base.counts(),
            "{name}: after {done} cycles (and {settled:?} of waiting): {} (baseline {})",
            s.text(),
            base.text()
        );
        rows.push(Row {
            done,
            cycles: this,
            sample: s,
            chunk: elapsed,
            settled,
        });
    }
    println!(
        "cycles {name}: {n} cycles in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    println!("cycles {name}:   during a cycle: {}", res_text(&during));
    println!("cycles {name}:   baseline:     {}", base.text());
    for r in &rows {
        println!(
            "cycles {name}:   after {:>6}: {}; {} cycles in {:.0} ms ({:.2} ms/cycle, {:.1} s per 1000); waited {} ms to settle",
            r.done,
            r.sample.text(),
            r.cycles,
            r.chunk.as_secs_f64() * 1000.0,
            r.chunk.as_secs_f64() * 1000.0 / r.cycles as f64,
            r.chunk.as_secs_f64() * 1000.0 / r.cycles as f64,
            r.settled.as_millis()
        );
    }
    // RSS is flat: the end is within the slack of the first checkpoint (the first chunk may
    // still fill allocator caches) and of the baseline.
    let last = &rows.last().expect("at least one chunk").sample;
    let first = rows[0].sample.rss_kib;
    assert!(
        last.rss_kib <= first + RSS_SLACK_KIB && last.rss_kib <= base.rss_kib + 2 * RSS_SLACK_KIB,
        "{name}: RSS grew from {} KiB (baseline) / {first} KiB (first chunk) to {} KiB",
        base.rss_kib,
        last.rss_kib
    );
    rows
}

/// Cycles must not slow down as they repeat (a table that only grows would show here): the last
/// chunk's time per cycle is at most four times the first's, plus noise.
pub fn assert_no_slowdown(name: &str, rows: &[Row]) {
    let per = |r: &Row| r.chunk / r.cycles as u32;
    let (first, last) = (per(&rows[0]), per(&rows[rows.len() - 1]));
    assert!(
        last <= first * 4 + Duration::from_millis(2),
        "{name}: cycles slowed down from {first:?} to {last:?} each"
    );
}
