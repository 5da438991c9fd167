//! Results of a run and their forms: a perftest-like table, CSV, JSON and an SVG plot.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::params::{Op, Test};
use super::stats::{Bandwidth, Latency};

const MIB: f64 = 1024.0 * 1024.0;

/// One size of a bandwidth run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BwRow {
    /// Message size.
    pub bytes: usize,
    /// Messages completed (all queue pairs).
    pub iterations: u64,
    /// Peak bandwidth, MiB/s (2^20 bytes per second).
    pub bw_peak_mib_s: f64,
    /// Average bandwidth, MiB/s.
    pub bw_avg_mib_s: f64,
    /// Peak bandwidth, Gb/s (10^9 bits per second).
    pub bw_peak_gbps: f64,
    /// Average bandwidth, Gb/s.
    pub bw_avg_gbps: f64,
    /// Message rate, millions of messages per second.
    pub msg_rate_mpps: f64,
}

impl BwRow {
    /// The row of `iterations` messages of `bytes` with figures `bw`.
    pub fn new(bytes: usize, iterations: u64, bw: Bandwidth) -> Self {
        BwRow {
            bytes,
            iterations,
            bw_peak_mib_s: bw.peak_bps / MIB,
            bw_avg_mib_s: bw.avg_bps / MIB,
            bw_peak_gbps: bw.peak_bps * 8.0 / 1e9,
            bw_avg_gbps: bw.avg_bps * 8.0 / 1e9,
            msg_rate_mpps: bw.msg_rate / 1e6,
        }
    }
}

/// One size of a latency run (one-way: half the round trip, as `ib_write_lat`), microseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatRow {
    /// Message size.
    pub bytes: usize,
    /// Round trips measured.
    pub iterations: u64,
    /// Smallest.
    pub t_min_us: f64,
    /// Largest.
    pub t_max_us: f64,
    /// Median.
    pub t_typical_us: f64,
    /// Mean.
    pub t_avg_us: f64,
    /// Standard deviation.
    pub t_stdev_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
}

impl LatRow {
    /// The row of `iterations` round trips of `bytes` with statistics `l`.
    pub fn new(bytes: usize, iterations: u64, l: Latency) -> Self {
        LatRow {
            bytes,
            iterations,
            t_min_us: l.min,
            t_max_us: l.max,
            t_typical_us: l.typical,
            t_avg_us: l.avg,
            t_stdev_us: l.stdev,
            p99_us: l.p99,
            p999_us: l.p999,
        }
    }
}

/// The rows of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Rows {
    /// Bandwidth rows.
    Bw(Vec<BwRow>),
    /// Latency rows.
    Lat(Vec<LatRow>),
}

/// A whole run as one side saw it; `--json` prints exactly this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// `bw` or `lat`.
    pub test: Test,
    /// `client` or `server`.
    pub role: String,
    /// Operation.
    pub op: Op,
    /// Local RDMA device and port.
    pub device: String,
    /// Local GID index.
    pub gid_index: u32,
    /// `host` or `cuda:N (path)`.
    pub memory: String,
    /// Queue pairs.
    pub qps: u32,
    /// Requests in flight per queue pair.
    pub tx_depth: u32,
    /// Signalling interval used.
    pub cq_mod: u32,
    /// Most requests per doorbell (`ibv_post_send` call); 0 = automatic per size (up to 16
    /// requests and 64 KiB of payload).
    #[serde(default = "one")]
    pub post_list: u32,
    /// Latency with write-with-immediate (GPU memory on either side).
    pub write_with_imm: bool,
    /// Whether the server checked every size and found the data and completions it expected.
    pub verified: bool,
    /// What was wrong when not verified.
    pub failures: Vec<String>,
    /// One row per size.
    pub results: Rows,
}

fn one() -> u32 {
    1
}

fn title(r: &Report) -> String {
    let op = match (r.op, r.write_with_imm) {
        (Op::Write, true) => "RDMA_Write (with immediate)",
        (Op::Write, false) => "RDMA_Write",
        (Op::Read, _) => "RDMA_Read",
        (Op::Send, _) => "Send",
    };
    let kind = match r.test {
        Test::Bw => "BW",
        Test::Lat => "Latency",
    };
    format!("{op} {kind} Test (gdr)")
}

/// The perftest-like table (header, one line per size, closing rule).
#[cfg(test)]
pub fn table(r: &Report, gbits: bool) -> String {
    let mut s = table_head(r, gbits);
    match &r.results {
        Rows::Bw(rows) => rows.iter().for_each(|row| s.push_str(&bw_line(row, gbits))),
        Rows::Lat(rows) => rows.iter().for_each(|row| s.push_str(&lat_line(row))),
    }
    s.push_str(&table_tail(r));
    s
}

const RULE_LEN: usize = 95;

/// The table's title block and column header (printed before the first size is measured).
pub fn table_head(r: &Report, gbits: bool) -> String {
    let rule = "-".repeat(RULE_LEN);
    let mut s = String::new();
    let _ = writeln!(s, "{rule}");
    let _ = writeln!(s, "{:^95}", title(r));
    let _ = writeln!(
        s,
        " Device: {}  GID index: {}  Memory: {}  QPs: {}  TX depth: {}  CQ moderation: {}  Post list: {}  Role: {}",
        r.device,
        r.gid_index,
        r.memory,
        r.qps,
        r.tx_depth,
        r.cq_mod,
        match r.post_list {
            0 => "auto (<= 64 KiB)".to_string(),
            n => n.to_string(),
        },
        r.role
    );
    let _ = writeln!(s, "{rule}");
    s.push_str(&table_header(r.test, gbits));
    s
}

/// The table's closing rule, and the verification failures if any.
pub fn table_tail(r: &Report) -> String {
    let mut s = "-".repeat(RULE_LEN);
    s.push('\n');
    if !r.verified {
        let _ = writeln!(s, " NOT VERIFIED: {}", r.failures.join("; "));
    }
    s
}

/// The column header line of the table.
pub fn table_header(test: Test, gbits: bool) -> String {
    match test {
        Test::Bw => {
            let unit = if gbits { "Gb/sec" } else { "MiB/sec" };
            format!(
                " {:<10} {:<12} {:<20} {:<22} {:<14}\n",
                "#bytes",
                "#iterations",
                format!("BW peak[{unit}]"),
                format!("BW average[{unit}]"),
                "MsgRate[Mpps]"
            )
        }
        Test::Lat => format!(
            " {:<10} {:<12} {:<12} {:<12} {:<16} {:<12} {:<14} {:<22} {:<22}\n",
            "#bytes",
            "#iterations",
            "t_min[usec]",
            "t_max[usec]",
            "t_typical[usec]",
            "t_avg[usec]",
            "t_stdev[usec]",
            "99% percentile[usec]",
            "99.9% percentile[usec]"
        ),
    }
}

/// One bandwidth line of the table.
pub fn bw_line(row: &BwRow, gbits: bool) -> String {
    let (peak, avg) = if gbits {
        (row.bw_peak_gbps, row.bw_avg_gbps)
    } else {
        (row.bw_peak_mib_s, row.bw_avg_mib_s)
    };
    format!(
        " {:<10} {:<12} {:<20} {:<22} {:<14.6}\n",
        row.bytes,
        row.iterations,
        fmt_bw(peak),
        fmt_bw(avg),
        row.msg_rate_mpps
    )
}

/// Two decimals, or six for small values (as perftest prints tiny Gb/s figures).
fn fmt_bw(v: f64) -> String {
    if v != 0.0 && v.abs() < 0.01 {
        format!("{v:.6}")
    } else {
        format!("{v:.2}")
    }
}

/// One latency line of the table.
pub fn lat_line(row: &LatRow) -> String {
    format!(
        " {:<10} {:<12} {:<12.2} {:<12.2} {:<16.2} {:<12.2} {:<14.2} {:<22.2} {:<22.2}\n",
        row.bytes,
        row.iterations,
        row.t_min_us,
        row.t_max_us,
        row.t_typical_us,
        row.t_avg_us,
        row.t_stdev_us,
        row.p99_us,
        row.p999_us
    )
}

/// CSV with a header line.
pub fn csv(rows: &Rows) -> String {
    let mut s = String::new();
    match rows {
        Rows::Bw(rows) => {
            s.push_str("bytes,iterations,bw_peak_mib_s,bw_avg_mib_s,bw_peak_gbps,bw_avg_gbps,msg_rate_mpps\n");
            for r in rows {
                let _ = writeln!(
                    s,
                    "{},{},{:.4},{:.4},{:.6},{:.6},{:.6}",
                    r.bytes,
                    r.iterations,
                    r.bw_peak_mib_s,
                    r.bw_avg_mib_s,
                    r.bw_peak_gbps,
                    r.bw_avg_gbps,
                    r.msg_rate_mpps
                );
            }
        }
        Rows::Lat(rows) => {
            s.push_str("bytes,iterations,t_min_us,t_max_us,t_typical_us,t_avg_us,t_stdev_us,p99_us,p999_us\n");
            for r in rows {
                let _ = writeln!(
                    s,
                    "{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3}",
                    r.bytes,
                    r.iterations,
                    r.t_min_us,
                    r.t_max_us,
                    r.t_typical_us,
                    r.t_avg_us,
                    r.t_stdev_us,
                    r.p99_us,
                    r.p999_us
                );
            }
        }
    }
    s
}

/// One line of a plot.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend and axis label.
    pub label: String,
    /// One value per x.
    pub values: Vec<f64>,
    /// Stroke colour.
    pub color: &'static str,
}

/// The plot of a run: bandwidth (left axis) and message rate (right axis) against size for
/// bandwidth; typical and 99% latency against size for latency.
pub fn plot(r: &Report, gbits: bool) -> String {
    match &r.results {
        Rows::Bw(rows) => {
            let sizes: Vec<usize> = rows.iter().map(|x| x.bytes).collect();
            let bw = Series {
                label: if gbits {
                    "average bandwidth [Gb/s]".into()
                } else {
                    "average bandwidth [MiB/s]".into()
                },
                values: rows
                    .iter()
                    .map(|x| if gbits { x.bw_avg_gbps } else { x.bw_avg_mib_s })
                    .collect(),
                color: "#1f77b4",
            };
            let rate = Series {
                label: "message rate [Mpps]".into(),
                values: rows.iter().map(|x| x.msg_rate_mpps).collect(),
                color: "#d62728",
            };
            svg(
                &format!("{} on {}", title(r), r.device),
                &sizes,
                &bw,
                Some(&rate),
            )
        }
        Rows::Lat(rows) => {
            let sizes: Vec<usize> = rows.iter().map(|x| x.bytes).collect();
            let typical = Series {
                label: "typical latency [usec]".into(),
                values: rows.iter().map(|x| x.t_typical_us).collect(),
                color: "#1f77b4",
            };
            let p99 = Series {
                label: "99% latency [usec]".into(),
                values: rows.iter().map(|x| x.p99_us).collect(),
                color: "#d62728",
            };
            svg_log(
                &format!("{} on {}", title(r), r.device),
                &sizes,
                "latency [usec], log scale",
                &[&typical, &p99],
            )
        }
    }
}

fn size_label(b: usize) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A value axis from 0 to a round number above `max`, and its tick step.
fn nice_axis(max: f64) -> (f64, f64) {
    if max.is_nan() || max <= 0.0 || !max.is_finite() {
        return (1.0, 0.2);
    }
    let raw = max * 1.05 / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (step * 5.0, step)
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

const W: f64 = 800.0;
const H: f64 = 460.0;
/// Plot area: left, right, bottom, top.
const X0: f64 = 80.0;
const X1: f64 = 720.0;
const Y0: f64 = 400.0;
const Y1: f64 = 60.0;

/// A value axis: where each value goes, and the labelled ticks.
struct Axis {
    /// Maps a value to its y pixel.
    py: Box<dyn Fn(f64) -> f64>,
    /// Tick values.
    ticks: Vec<f64>,
}

impl Axis {
    /// From 0 to a round number above the largest value.
    fn linear(values: &[f64]) -> Axis {
        let max = values.iter().copied().fold(0.0, f64::max);
        let (top, step) = nice_axis(max);
        Axis {
            py: Box::new(move |v| Y0 - v / top * (Y0 - Y1)),
            ticks: (0..=((top / step).round() as usize))
                .map(|k| k as f64 * step)
                .collect(),
        }
    }

    /// Whole decades around the positive values (log10).
    fn log(values: &[f64]) -> Axis {
        let pos = values.iter().copied().filter(|v| *v > 0.0 && v.is_finite());
        let (lo, hi) = pos.fold((f64::INFINITY, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
        let (lo, hi) = if hi > 0.0 {
            (
                lo.log10().floor(),
                hi.log10().ceil().max(lo.log10().floor() + 1.0),
            )
        } else {
            (0.0, 1.0)
        };
        Axis {
            py: Box::new(move |v| {
                let l = if v > 0.0 { v.log10().clamp(lo, hi) } else { lo };
                Y0 - (l - lo) / (hi - lo) * (Y0 - Y1)
            }),
            ticks: (lo as i32..=hi as i32).map(|e| 10f64.powi(e)).collect(),
        }
    }
}

/// An SVG line chart against size (log2 x axis) with one series on the left axis and an optional
/// second one on its own right axis.
pub fn svg(title: &str, sizes: &[usize], left: &Series, right: Option<&Series>) -> String {
    let mut s = frame(title, sizes);
    draw(&mut s, sizes, &Axis::linear(&left.values), left, false);
    if let Some(r) = right {
        draw(&mut s, sizes, &Axis::linear(&r.values), r, true);
    }
    legend(&mut s, std::iter::once(left).chain(right));
    s.push_str("</svg>\n");
    s
}

/// An SVG line chart against size (log2 x axis) with every series on one log10 axis (latency:
/// 2 B and 8 MiB differ by four decades).
pub fn svg_log(title: &str, sizes: &[usize], axis_label: &str, series: &[&Series]) -> String {
    let mut s = frame(title, sizes);
    let all: Vec<f64> = series
        .iter()
        .flat_map(|x| x.values.iter().copied())
        .collect();
    let axis = Axis::log(&all);
    for (k, x) in series.iter().enumerate() {
        let labelled = Series {
            label: axis_label.into(),
            values: Vec::new(),
            color: "#444",
        };
        if k == 0 {
            draw(&mut s, sizes, &axis, &labelled, false);
        }
        line(&mut s, sizes, &axis, x);
    }
    legend(&mut s, series.iter().copied());
    s.push_str("</svg>\n");
    s
}

/// x pixel of each size (log2 scale over the sizes' range).
fn xs(sizes: &[usize]) -> Vec<f64> {
    let lx: Vec<f64> = sizes.iter().map(|&b| (b.max(1) as f64).log2()).collect();
    let (xmin, xmax) = lx
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    let (xmin, xmax) = if lx.is_empty() {
        (0.0, 1.0)
    } else if xmax > xmin {
        (xmin, xmax)
    } else {
        (xmin - 1.0, xmax + 1.0)
    };
    lx.iter()
        .map(|v| X0 + (v - xmin) / (xmax - xmin) * (X1 - X0))
        .collect()
}

/// Header, title, plot box and the size axis.
fn frame(title: &str, sizes: &[usize]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="30" text-anchor="middle" font-size="16">{}</text>"#,
        W / 2.0,
        escape(title)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{X0}" y="{Y1}" width="{}" height="{}" fill="none" stroke="#444"/>"##,
        X1 - X0,
        Y0 - Y1
    );
    // A full sweep (23 sizes) leaves 28 px per tick: smaller labels keep "256K" and "512K" apart.
    let tick_font = if sizes.len() > 16 { 10 } else { 12 };
    for (&b, x) in sizes.iter().zip(xs(sizes)) {
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{Y0}" x2="{x:.1}" y2="{Y1}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle" font-size="{tick_font}">{}</text>"##,
            Y0 + 16.0,
            size_label(b)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">message size [bytes]</text>"#,
        (X0 + X1) / 2.0,
        Y0 + 40.0
    );
    s
}

/// The tick labels and title of `axis` on the left or right side, in the series' colour, and
/// the series' line (when it has values).
fn draw(s: &mut String, sizes: &[usize], axis: &Axis, series: &Series, right_side: bool) {
    let (ax, anchor, dx) = if right_side {
        (X1, "start", 6.0)
    } else {
        (X0, "end", -6.0)
    };
    for &t in &axis.ticks {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="{anchor}" fill="{}">{}</text>"#,
            ax + dx,
            (axis.py)(t) + 4.0,
            series.color,
            fmt_tick(t)
        );
    }
    let lx_label = if right_side { X1 + 60.0 } else { X0 - 60.0 };
    let mid = (Y0 + Y1) / 2.0;
    let _ = writeln!(
        s,
        r#"<text x="{lx_label}" y="{mid}" text-anchor="middle" fill="{}" transform="rotate(-90 {lx_label} {mid})">{}</text>"#,
        series.color,
        escape(&series.label)
    );
    if !series.values.is_empty() {
        line(s, sizes, axis, series);
    }
}

/// One series as a polyline with a dot per size.
fn line(s: &mut String, sizes: &[usize], axis: &Axis, series: &Series) {
    let pts: Vec<(f64, f64)> = xs(sizes)
        .into_iter()
        .zip(&series.values)
        .map(|(x, &v)| (x, (axis.py)(v)))
        .collect();
    let text: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    let _ = writeln!(
        s,
        r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
        series.color,
        text.join(" ")
    );
    for (x, y) in pts {
        let _ = writeln!(
            s,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{}"/>"#,
            series.color
        );
    }
}

/// The legend: one entry per series, top centre (bandwidth sweeps peak at the right, message
/// rates at the left; latency grows towards the right).
fn legend<'a>(s: &mut String, series: impl Iterator<Item = &'a Series>) {
    let lx = X0 + (X1 - X0) * 0.33;
    let mut ly = Y1 + 16.0;
    for x in series {
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            lx,
            ly - 4.0,
            lx + 20.0,
            ly - 4.0,
            x.color,
            lx + 26.0,
            ly,
            escape(&x.label)
        );
        ly += 16.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bw_report() -> Report {
        let rows = vec![
            BwRow::new(
                4096,
                1000,
                Bandwidth {
                    peak_bps: 2.0 * MIB,
                    avg_bps: MIB,
                    msg_rate: 256.0,
                },
            ),
            BwRow::new(
                65536,
                1000,
                Bandwidth {
                    peak_bps: 125e6,
                    avg_bps: 100e6,
                    msg_rate: 100e6 / 65536.0,
                },
            ),
        ];
        Report {
            test: Test::Bw,
            role: "client".into(),
            op: Op::Write,
            device: "rxe0:1".into(),
            gid_index: 1,
            memory: "host".into(),
            qps: 1,
            tx_depth: 128,
            cq_mod: 100,
            post_list: 16,
            write_with_imm: false,
            verified: true,
            failures: vec![],
            results: Rows::Bw(rows),
        }
    }

    #[test]
    fn rows_convert_units() {
        let r = bw_report();
        let Rows::Bw(rows) = &r.results else {
            unreachable!()
        };
        assert_eq!(rows[0].bw_avg_mib_s, 1.0);
        assert_eq!(rows[0].bw_peak_mib_s, 2.0);
        assert!((rows[1].bw_avg_gbps - 0.8).abs() < 1e-12);
        assert!((rows[1].bw_peak_gbps - 1.0).abs() < 1e-12);
        assert!((rows[0].msg_rate_mpps - 256e-6).abs() < 1e-15);
    }

    #[test]
    fn table_looks_like_perftest() {
        let t = table(&bw_report(), false);
        assert!(t.contains("RDMA_Write BW Test (gdr)"));
        assert!(t.contains("#bytes"));
        assert!(t.contains("BW peak[MiB/sec]") && t.contains("BW average[MiB/sec]"));
        assert!(t.contains("MsgRate[Mpps]"));
        let line = t
            .lines()
            .find(|l| l.trim_start().starts_with("4096"))
            .unwrap();
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols, ["4096", "1000", "2.00", "1.00", "0.000256"]);
        let g = table(&bw_report(), true);
        assert!(g.contains("BW peak[Gb/sec]"));
        let line = g
            .lines()
            .find(|l| l.trim_start().starts_with("65536"))
            .unwrap();
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&cols[..4], ["65536", "1000", "1.00", "0.80"]);
        assert!(!g.contains("NOT VERIFIED"));
        assert_eq!(fmt_bw(0.000655), "0.000655");
        assert_eq!(fmt_bw(12.345), "12.35");
        let mut bad = bw_report();
        bad.verified = false;
        bad.failures = vec!["byte 3 differs".into()];
        assert!(table(&bad, false).contains("NOT VERIFIED: byte 3 differs"));
    }

    #[test]
    fn latency_table_and_csv() {
        let row = LatRow::new(
            2,
            1000,
            Latency {
                min: 1.0,
                max: 9.0,
                typical: 2.0,
                avg: 2.5,
                stdev: 0.5,
                p99: 5.0,
                p999: 8.0,
            },
        );
        let mut r = bw_report();
        r.test = Test::Lat;
        r.results = Rows::Lat(vec![row]);
        let t = table(&r, false);
        assert!(t.contains("t_typical[usec]") && t.contains("99.9% percentile[usec]"));
        assert!(t.contains("Latency Test"));
        let line = t
            .lines()
            .find(|l| l.trim_start().starts_with("2 "))
            .unwrap();
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            cols,
            ["2", "1000", "1.00", "9.00", "2.00", "2.50", "0.50", "5.00", "8.00"]
        );
        let c = csv(&r.results);
        let mut lines = c.lines();
        assert_eq!(
            lines.next().unwrap(),
            "bytes,iterations,t_min_us,t_max_us,t_typical_us,t_avg_us,t_stdev_us,p99_us,p999_us"
        );
        assert_eq!(
            lines.next().unwrap(),
            "2,1000,1.000,9.000,2.000,2.500,0.500,5.000,8.000"
        );
        assert_eq!(lines.next(), None);
    }

    #[test]
    fn bw_csv_has_one_line_per_size() {
        let c = csv(&bw_report().results);
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("bytes,iterations,bw_peak_mib_s"));
        assert!(lines[1].starts_with("4096,1000,2.0000,1.0000,"));
    }

    #[test]
    fn json_round_trips() {
        let r = bw_report();
        let text = serde_json::to_string(&r).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["test"], "bw");
        assert_eq!(v["op"], "write");
        assert_eq!(v["results"][0]["bytes"], 4096);
        assert_eq!(v["results"][1]["iterations"], 1000);
        let back: Report = serde_json::from_str(&text).unwrap();
        let (Rows::Bw(a), Rows::Bw(b)) = (&back.results, &r.results) else {
            panic!("bandwidth rows came back as {:?}", back.results);
        };
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!((x.bytes, x.iterations), (y.bytes, y.iterations));
            assert!((x.bw_avg_gbps - y.bw_avg_gbps).abs() <= 1e-12 * y.bw_avg_gbps);
        }
        assert_eq!(
            (back.device, back.verified, back.qps),
            (r.device, r.verified, r.qps)
        );
    }

    #[test]
    fn svg_has_both_series_and_size_ticks() {
        let s = plot(&bw_report(), false);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 2);
        assert_eq!(s.matches("<circle").count(), 4);
        assert!(s.contains(">4K<") && s.contains(">64K<"));
        assert!(s.contains("average bandwidth [MiB/s]") && s.contains("message rate [Mpps]"));
        // a single size still renders (no division by zero, no NaN).
        let mut one = bw_report();
        if let Rows::Bw(r) = &mut one.results {
            r.truncate(1);
        }
        let s = plot(&one, true);
        assert!(!s.contains("NaN") && s.contains("[Gb/s]"));
    }

    #[test]
    fn latency_plot_shares_one_log_axis() {
        let typical = Series {
            label: "typical latency [usec]".into(),
            values: vec![2.5, 40.0, 9000.0],
            color: "#1f77b4",
        };
        let p99 = Series {
            label: "99% latency [usec]".into(),
            values: vec![3.0, 55.0, 12000.0],
            color: "#d62728",
        };
        let s = svg_log(
            "lat",
            &[2, 4096, 8 << 20],
            "latency [usec], log scale",
            &[&typical, &p99],
        );
        assert_eq!(s.matches("<polyline").count(), 2);
        // decades 1 .. 100000 around 2.5 .. 12000, one label each, and one axis title.
        for t in [">1.0<", ">10.0<", ">100<", ">1000<", ">10000<", ">100000<"] {
            assert!(s.contains(t), "missing tick {t}");
        }
        assert!(!s.contains(">1000000<"));
        assert_eq!(s.matches("latency [usec], log scale").count(), 1);
        assert!(s.contains(">8M<") && !s.contains("NaN"));
        // a zero (no sample) stays on the bottom edge instead of producing -inf.
        let zero = Series {
            values: vec![0.0, 1.0, 1.0],
            ..typical.clone()
        };
        let s = svg_log("lat", &[2, 4, 8], "x", &[&zero]);
        assert!(!s.contains("inf") && !s.contains("NaN"));
    }

    #[test]
    fn axis_and_labels() {
        assert_eq!(nice_axis(9.0), (10.0, 2.0));
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
        assert_eq!(size_label(8 << 20), "8M");
        assert_eq!(size_label(2), "2");
        assert_eq!(escape("a<b&c"), "a&lt;b&amp;c");
    }
}
