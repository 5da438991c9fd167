//! Statistics, as perftest computes them, on plain numbers (seconds, microseconds) so they can
//! be checked on synthetic timestamps.

use serde::{Deserialize, Serialize};

/// Bandwidth figures of one size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bandwidth {
    /// Best bandwidth over any window from a post to a later completion, bytes per second.
    pub peak_bps: f64,
    /// bytes x messages / (last completion - first post), bytes per second.
    pub avg_bps: f64,
    /// Messages per second over the same interval.
    pub msg_rate: f64,
}

/// Average bandwidth and message rate of `messages` messages of `size` bytes that took `secs`.
pub fn average(size: usize, messages: u64, secs: f64) -> (f64, f64) {
    if secs <= 0.0 || messages == 0 {
        return (0.0, 0.0);
    }
    let rate = messages as f64 / secs;
    (rate * size as f64, rate)
}

/// perftest's figures from per-message timestamps in seconds: `posted[i]` when message `i` was
/// posted, `completed[j]` when message `j` was known complete (messages are completed in order;
/// unsignalled ones share the timestamp of the signalled one that retired them).
///
/// Peak: the shortest time per message over every window from post `i` to a signalled completion
/// `j >= i` (completions at `cq_mod - 1`, `2 cq_mod - 1`, ... and the last one), as perftest's
/// report does.
pub fn bandwidth(size: usize, posted: &[f64], completed: &[f64], cq_mod: usize) -> Bandwidth {
    let n = posted.len().min(completed.len());
    if n == 0 {
        return Bandwidth {
            peak_bps: 0.0,
            avg_bps: 0.0,
            msg_rate: 0.0,
        };
    }
    let (avg_bps, msg_rate) = average(size, n as u64, completed[n - 1] - posted[0]);
    let step = cq_mod.max(1);
    let mut best = f64::INFINITY;
    let mut check = |i: usize, j: usize| {
        let t = (completed[j] - posted[i]) / (j - i + 1) as f64;
        if t > 0.0 && t < best {
            best = t;
        }
    };
    // perftest scans every post; bound the work for very long runs by scanning every k-th post.
    let stride = ((n as f64 * (n / step + 1) as f64) / 5e7).ceil().max(1.0) as usize;
    for i in (0..n).step_by(stride) {
        let mut j = (i + 1).div_ceil(step) * step - 1;
        while j < n {
            check(i, j);
            j += step;
        }
        check(i, n - 1);
    }
    let peak_bps = if best.is_finite() {
        size as f64 / best
    } else {
        avg_bps
    };
    Bandwidth {
        peak_bps: peak_bps.max(avg_bps),
        avg_bps,
        msg_rate,
    }
}

/// Peak bandwidth from checkpoints `(messages completed so far, seconds)` when per-message
/// timestamps were not kept (duration mode): the best rate over any run of checkpoints that spans
/// at least `min_messages` messages.
pub fn peak_from_checkpoints(size: usize, points: &[(u64, f64)], min_messages: u64) -> f64 {
    let mut best: f64 = 0.0;
    let mut start = 0;
    for end in 1..points.len() {
        while start + 1 < end && points[end].0 - points[start + 1].0 >= min_messages {
            start += 1;
        }
        let (m, t) = (
            points[end].0 - points[start].0,
            points[end].1 - points[start].1,
        );
        if m >= min_messages && t > 0.0 {
            best = best.max(m as f64 * size as f64 / t);
        }
    }
    best
}

/// Latency figures of one size, microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Median (perftest's "typical").
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Population standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// The sample at quantile `q` of sorted samples (index `floor(q * n)`, clamped, as perftest).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((q * sorted.len() as f64) as usize).min(sorted.len() - 1);
    sorted[i]
}

/// Latency statistics of `samples` (sorted in place).
pub fn latency(samples: &mut [f64]) -> Latency {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    if n == 0 {
        return Latency {
            min: 0.0,
            max: 0.0,
            typical: 0.0,
            avg: 0.0,
            stdev: 0.0,
            p99: 0.0,
            p999: 0.0,
        };
    }
    let avg = samples.iter().sum::<f64>() / n as f64;
    let var = samples.iter().map(|s| (s - avg) * (s - avg)).sum::<f64>() / n as f64;
    Latency {
        min: samples[0],
        max: samples[n - 1],
        typical: samples[n / 2],
        avg,
        stdev: var.sqrt(),
        p99: percentile(samples, 0.99),
        p999: percentile(samples, 0.999),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn steady_stream_has_equal_peak_and_average() {
        // One message posted every 1 us, each completed 10 us after its post, signalled every 4th.
        let n = 100;
        let posted: Vec<f64> = (0..n).map(|i| i as f64 * 1e-6).collect();
        let completed: Vec<f64> = (0..n)
            .map(|i| {
                let signalled = ((i / 4) * 4 + 3).min(n - 1);
                posted[signalled] + 10e-6
            })
            .collect();
        let bw = bandwidth(1000, &posted, &completed, 4);
        // average: 100 messages over (99 + 10) us.
        assert!(close(bw.avg_bps, 100.0 * 1000.0 / 109e-6));
        assert!(close(bw.msg_rate, 100.0 / 109e-6));
        // peak: the whole run is the best window per message in a steady stream... except that
        // a longer window amortises the 10 us tail better: the best is the full run.
        assert!(close(bw.peak_bps, bw.avg_bps));
    }

    #[test]
    fn peak_finds_the_fast_burst() {
        // 8 messages: the first four take 1 s each, the last four complete 1 ms apart.
        let posted = [0.0, 1.0, 2.0, 3.0, 4.0, 4.001, 4.002, 4.003];
        let completed = [1.0, 2.0, 3.0, 4.0, 4.001, 4.002, 4.003, 4.004];
        let bw = bandwidth(1, &posted, &completed, 1);
        assert!(close(bw.avg_bps, 8.0 / 4.004));
        // best window: post 4 (4.0) .. completion 7 (4.004): 4 messages in 4 ms.
        assert!(close(bw.peak_bps, 1000.0), "peak {}", bw.peak_bps);
        // with completions only at 3 and 7 (cq_mod 4) the same window is found.
        let sparse = [4.0, 4.0, 4.0, 4.0, 4.004, 4.004, 4.004, 4.004];
        let bw = bandwidth(1, &posted, &sparse, 4);
        assert!(close(bw.peak_bps, 1000.0), "peak {}", bw.peak_bps);
    }

    #[test]
    fn empty_input_gives_zeros() {
        let bw = bandwidth(64, &[], &[], 100);
        assert_eq!((bw.peak_bps, bw.avg_bps, bw.msg_rate), (0.0, 0.0, 0.0));
        assert_eq!(latency(&mut []).typical, 0.0);
    }

    #[test]
    fn checkpoints_peak() {
        // 100 messages per 1 ms, then one slow 10 ms stretch of 100 messages.
        let points = [(0, 0.0), (100, 0.001), (200, 0.002), (300, 0.012)];
        assert!(close(peak_from_checkpoints(1, &points, 100), 100_000.0));
        assert!(close(peak_from_checkpoints(1, &points, 300), 25_000.0));
        assert_eq!(peak_from_checkpoints(1, &points, 400), 0.0);
    }

    #[test]
    fn latency_percentiles() {
        // 1..=1000 us shuffled.
        let mut s: Vec<f64> = (1..=1000).map(|i| ((i * 7919) % 1000 + 1) as f64).collect();
        let l = latency(&mut s);
        assert_eq!((l.min, l.max), (1.0, 1000.0));
        assert_eq!(l.typical, 501.0);
        assert!(close(l.avg, 500.5));
        assert_eq!(l.p99, 991.0);
        assert_eq!(l.p999, 1000.0);
        assert!(close(l.stdev, ((1000.0f64 * 1000.0 - 1.0) / 12.0).sqrt()));
    }

    #[test]
    fn average_handles_zero_time() {
        assert_eq!(average(8, 10, 0.0), (0.0, 0.0));
        assert_eq!(average(8, 10, 2.0), (40.0, 5.0));
    }
}
