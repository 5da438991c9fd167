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
    /// Most requests per doorbell (`ibv_post_send` call).
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
        r.device, r.gid_index, r.memory, r.qps, r.tx_depth, r.cq_mod, r.post_list, r.role
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
            svg(
                &format!("{} on {}", title(r), r.device),
                &sizes,
                &typical,
                Some(&p99),
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

/// An SVG line chart against size (log2 x axis) with one series on the left axis and an optional
/// second one on its own right axis.
pub fn svg(title: &str, sizes: &[usize], left: &Series, right: Option<&Series>) -> String {
    let (w, h) = (800.0, 460.0);
    let (x0, x1, y0, y1) = (80.0, 720.0, 400.0, 60.0);
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
    let px = |v: f64| x0 + (v - xmin) / (xmax - xmin) * (x1 - x0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="30" text-anchor="middle" font-size="16">{}</text>"#,
        w / 2.0,
        escape(title)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{x0}" y="{y1}" width="{}" height="{}" fill="none" stroke="#444"/>"##,
        x1 - x0,
        y0 - y1
    );
    for (&b, &v) in sizes.iter().zip(&lx) {
        let x = px(v);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{y1}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            y0 + 16.0,
            size_label(b)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">message size [bytes]</text>"#,
        (x0 + x1) / 2.0,
        y0 + 40.0
    );
    let axis = |series: &Series, right_side: bool, s: &mut String| {
        let max = series.values.iter().copied().fold(0.0, f64::max);
        let (top, step) = nice_axis(max);
        let py = |v: f64| y0 - v / top * (y0 - y1);
        let (ax, anchor, dx) = if right_side {
            (x1, "start", 6.0)
        } else {
            (x0, "end", -6.0)
        };
        let mut t = 0.0;
        while t <= top + step / 2.0 {
            let y = py(t);
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="{anchor}" fill="{}">{}</text>"#,
                ax + dx,
                y + 4.0,
                series.color,
                fmt_tick(t)
            );
            t += step;
        }
        let lx_label = if right_side { x1 + 60.0 } else { x0 - 60.0 };
        let _ = writeln!(
            s,
            r#"<text x="{lx_label}" y="{}" text-anchor="middle" fill="{}" transform="rotate(-90 {lx_label} {})">{}</text>"#,
            (y0 + y1) / 2.0,
            series.color,
            (y0 + y1) / 2.0,
            escape(&series.label)
        );
        let pts: Vec<String> = lx
            .iter()
            .zip(&series.values)
            .map(|(&x, &v)| format!("{:.1},{:.1}", px(x), py(v)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            series.color,
            pts.join(" ")
        );
        for p in &pts {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                s,
                r#"<circle cx="{x}" cy="{y}" r="3" fill="{}"/>"#,
                series.color
            );
        }
    };
    axis(left, false, &mut s);
    if let Some(r) = right {
        axis(r, true, &mut s);
    }
    let mut ly = y1 + 16.0;
    for series in std::iter::once(left).chain(right) {
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            x0 + 10.0,
            ly - 4.0,
            x0 + 30.0,
            ly - 4.0,
            series.color,
            x0 + 36.0,
            ly,
            escape(&series.label)
        );
        ly += 16.0;
    }
    s.push_str("</svg>\n");
    s
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
    fn axis_and_labels() {
        assert_eq!(nice_axis(9.0), (10.0, 2.0));
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
        assert_eq!(size_label(8 << 20), "8M");
        assert_eq!(size_label(2), "2");
        assert_eq!(escape("a<b&c"), "a&lt;b&amp;c");
    }
}
