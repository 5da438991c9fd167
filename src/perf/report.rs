//! Results of a run and their forms. JSON is the serde form of [`Report`] (`--json` prints it);
//! the perftest-like table ([`table`]), CSV ([`csv`]) and the SVG plot ([`svg`]) each have their
//! own module.

pub mod csv;
pub mod svg;
pub mod table;

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

/// The run's title as perftest words it (`RDMA_Write BW Test (gdr)`); the table and the plot
/// share it.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A bandwidth report of two sizes, shared by the tests of every output form.
    pub(super) fn bw_report() -> Report {
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

    /// A latency report of one size.
    pub(super) fn lat_report() -> Report {
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
        r
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
}
