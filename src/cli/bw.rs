//! `gdr bw`: RDMA bandwidth and message rate between two hosts, like perftest's `ib_*_bw`.

use clap::Args;

use gdr_tools::perf::cli::CommonArgs;
use gdr_tools::perf::params::{Op, Test};

const AFTER_HELP: &str = "\
Like perftest: start the server, then the client with the server's address. The client's
parameters (operation, sizes, iterations, QPs, depth, moderation) are sent to the server, which
follows them and verifies the data it received; both print the same rows.

Average bandwidth = bytes x iterations / (last completion - first post); peak = the best window
from a post to a later signalled completion; message rate = iterations / the same interval.

Exit status: 0 measured and verified; 1 an error, or the server found wrong data; 2 usage.

Examples:
  gdr bw --server -d mlx5_0                 server
  gdr bw 10.0.0.1 -d mlx5_0 -s 65536 -q 4   client, 64 KiB writes on 4 QPs
  gdr bw 10.0.0.1 -a --report-gbits --plot bw.svg
  gdr bw 10.0.0.1 --op read -D 5 --use-cuda=0 --cuda-path dmabuf";

/// Arguments of `gdr bw`.
#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct BwArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Operation to measure.
    #[arg(long, value_enum, default_value_t = Op::Write)]
    pub op: Op,
    /// Queue pairs.
    #[arg(short = 'q', long, default_value_t = 1, value_name = "N")]
    pub qps: u32,
    /// Most requests posted with one doorbell (one `ibv_post_send` call), 1..=32; 1 posts each
    /// request on its own, as perftest does unless given `-l` [default: automatic: up to 16
    /// requests and 64 KiB of payload per doorbell, so 16 up to 4 KiB and 1 from 64 KiB]
    #[arg(short = 'l', long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub post_list: Option<u32>,
}

/// Default iterations per size (perftest's ib_write_bw).
pub const DEFAULT_ITERS: u64 = 5000;

/// Runs `gdr bw`; returns the exit code.
pub fn run(args: BwArgs) -> u8 {
    let mut params = args
        .common
        .params(Test::Bw, args.op, args.qps, DEFAULT_ITERS, 0);
    params.post_list = args.post_list.unwrap_or(0);
    args.common.run("bw", Test::Bw, params)
}
