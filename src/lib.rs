//! The library half of `gdr-tools`: the bandwidth and latency engine behind `gdr bw` and
//! `gdr lat` ([`perf`]) and the transfer benchmark behind `gdr xfer-bench` ([`xfer_bench`]),
//! shared by the `gdr` binary (`src/main.rs`, subcommands in `src/cli/`), `benches/` and the
//! integration tests in `tests/`.
//!
//! This crate is not published (`publish = false`); the library users depend on is `gdr`.

#![warn(missing_docs)]

pub mod perf;
pub mod xfer_bench;
