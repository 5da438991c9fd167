//! The SVG plot of a run: line charts against message size (log2 x axis), no dependencies.

use std::fmt::Write as _;

use super::{title, Report, Rows};

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
            chart(
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
            log_chart(
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
pub fn chart(title: &str, sizes: &[usize], left: &Series, right: Option<&Series>) -> String {
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
pub fn log_chart(title: &str, sizes: &[usize], axis_label: &str, series: &[&Series]) -> String {
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
    use super::super::tests::bw_report;
    use super::*;

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
        let s = log_chart(
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
        let s = log_chart("lat", &[2, 4, 8], "x", &[&zero]);
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
