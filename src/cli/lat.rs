//! `gdr lat`: RDMA latency between two hosts, like perftest's `ib_write_lat`, `ib_send_lat` and
//! `ib_read_lat`.

use clap::Args;

use gdr_tools::perf::cli::CommonArgs;
use gdr_tools::perf::params::{Op, Test};

const AFTER_HELP: &str = "\
Ping-pong: the client sends a message, the server answers with one of the same size, and the
one-way latency is half the round trip. With --op write each side polls the last byte of the
buffer the peer writes (as ib_write_lat); with GPU memory on either side the writes carry an
immediate and each side waits for its completion instead (the CPU never polls GPU memory).
With --op send each side waits for its receive completion. With --op read the client reads the
server's buffer, one read at a time, and waits for each completion; a read's latency is the whole
round trip (as ib_read_lat), and the server's CPU takes no part.

t_typical is the median; 99% and 99.9% are percentiles of the sorted samples.

Exit status: 0 measured and verified; 1 an error, or wrong data arrived; 2 usage.

Examples:
  gdr lat --server -d mlx5_0
  gdr lat 10.0.0.1 -d mlx5_0 -s 2 -n 10000
  gdr lat 10.0.0.1 -a --plot lat.svg --use-cuda";

/// Arguments of `gdr lat`.
#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct LatArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Operation to measure.
    #[arg(long, value_enum, default_value_t = Op::Write)]
    pub op: Op,
}

/// Default round trips per size (perftest's ib_write_lat).
pub const DEFAULT_ITERS: u64 = 1000;

/// Default largest inline message (perftest's ib_write_lat).
pub const DEFAULT_INLINE: u32 = 220;

/// Runs `gdr lat`; returns the exit code.
pub fn run(args: LatArgs) -> u8 {
    let params = args
        .common
        .params(Test::Lat, args.op, 1, DEFAULT_ITERS, DEFAULT_INLINE);
    args.common.run("lat", Test::Lat, params)
}
