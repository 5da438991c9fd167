//! Bandwidth and latency measurement shared by `gdr bw`, `gdr lat` and `cargo bench`:
//! parameters, the measurement loops, statistics, output forms and the TCP session.
//!
//! The loops in [`engine`] take prepared slices and reused buffers so that a posted request
//! allocates nothing; `tests/cli_perf.rs` and `benches/perf.rs` include this module by path.

pub mod cli;
pub mod clock;
pub mod engine;
pub mod params;
pub mod report;
pub mod session;
pub mod stats;
// Used by benches/perf.rs and tests/cli_perf.rs (which include this module by path), not by the binary.
#[allow(dead_code)]
pub mod loopback;
