//! The perftest-like table: a title block, one line per size, a closing rule.

use std::fmt::Write as _;

use super::{title, BwRow, LatRow, Report, Rows};
use crate::perf::params::Test;

/// The whole table (title block, one line per size, closing rule); `gdr bw` and `gdr lat` print
/// it piece by piece instead ([`head`], then a line as each size finishes, then [`tail`]).
pub fn render(r: &Report, gbits: bool) -> String {
    let mut s = head(r, gbits);
    match &r.results {
        Rows::Bw(rows) => rows.iter().for_each(|row| s.push_str(&bw_line(row, gbits))),
        Rows::Lat(rows) => rows.iter().for_each(|row| s.push_str(&lat_line(row))),
    }
    s.push_str(&tail(r));
    s
}

const RULE_LEN: usize = 95;

/// The table's title block and column header (printed before the first size is measured).
pub fn head(r: &Report, gbits: bool) -> String {
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
    s.push_str(&column_header(r.test, gbits));
    s
}

/// The table's closing rule, and the verification failures if any.
pub fn tail(r: &Report) -> String {
    let mut s = "-".repeat(RULE_LEN);
    s.push('\n');
    if !r.verified {
        let _ = writeln!(s, " NOT VERIFIED: {}", r.failures.join("; "));
    }
    s
}

/// The column header line of the table.
pub fn column_header(test: Test, gbits: bool) -> String {
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

#[cfg(test)]
mod tests {
    use super::super::tests::{bw_report, lat_report};
    use super::*;

    #[test]
    fn table_looks_like_perftest() {
        let t = render(&bw_report(), false);
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
        let g = render(&bw_report(), true);
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
        assert!(render(&bad, false).contains("NOT VERIFIED: byte 3 differs"));
    }

    #[test]
    fn latency_table() {
        let r = lat_report();
        let t = render(&r, false);
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
    }
}
