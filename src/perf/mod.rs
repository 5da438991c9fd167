//! Bandwidth and latency measurement shared by `gdr bw`, `gdr lat` and `cargo bench`:
//! parameters, the measurement loops, statistics, output forms and the TCP session.
//!
//! The loops in [`engine`] take prepared slices and reused buffers so that a posted request
//! allocates nothing; `tests/cli_perf.rs` counts it and `benches/perf.rs` times it, both through
//! [`loopback`] (two queue pairs of one process).

pub mod cli;
pub mod clock;
pub mod engine;
pub mod loopback;
pub mod params;
pub mod report;
pub mod session;
pub mod stats;
