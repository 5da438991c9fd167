//! `gdr`: the command-line tool of the gdr GPUDirect RDMA library.
//!
//! A thin dispatcher: each subcommand lives in its own module under `src/cli/`; the measurement
//! engine of `bw` and `lat` is this package's library (`gdr_tools::perf`, `src/perf/`).

mod cli;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// GPUDirect RDMA tools: diagnose a host, query devices, measure bandwidth and latency.
#[derive(Debug, Parser)]
#[command(name = "gdr", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Will GPUDirect RDMA work on this host, and fast? One verdict per GPU-NIC pair, with fixes.
    Doctor(cli::doctor::DoctorArgs),
    /// RDMA devices, ports and GID tables (like ibv_devinfo and show_gids), with the GID gdr picks.
    Devinfo(cli::devinfo::DevinfoArgs),
    /// RDMA bandwidth and message rate, like ib_write_bw (server: --server; client: SERVER).
    Bw(cli::bw::BwArgs),
    /// RDMA ping-pong latency, like ib_write_lat (server: --server; client: SERVER).
    Lat(cli::lat::LatArgs),
    /// Batched block transfers with gdr-xfer, like Mooncake's bench and nixlbench (target:
    /// --target; initiator: HOST:PORT).
    XferBench(cli::xfer_bench::XferBenchArgs),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Doctor(args) => cli::doctor::run(args),
        Command::Devinfo(args) => cli::devinfo::run(args),
        Command::Bw(args) => cli::bw::run(args),
        Command::Lat(args) => cli::lat::run(args),
        Command::XferBench(args) => cli::xfer_bench::run(args),
    };
    ExitCode::from(code)
}
