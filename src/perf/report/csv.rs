//! CSV: a header line, then one line per size.

use std::fmt::Write as _;

use super::Rows;

/// CSV with a header line.
pub fn render(rows: &Rows) -> String {
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

#[cfg(test)]
mod tests {
    use super::super::tests::{bw_report, lat_report};
    use super::*;

    #[test]
    fn latency_csv() {
        let c = render(&lat_report().results);
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
        let c = render(&bw_report().results);
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("bytes,iterations,bw_peak_mib_s"));
        assert!(lines[1].starts_with("4096,1000,2.0000,1.0000,"));
    }
}
