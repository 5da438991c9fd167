//! `gdr xfer-bench`: gdr-xfer's batched transfer bandwidth and latencies between two hosts.

use clap::Args;

use gdr_tools::xfer_bench::{self, BenchParams, Layout};
use gdr_xfer::AgentConfig;

const AFTER_HELP: &str = "\
Start the target, then the initiator with the target's address. Each initiator thread keeps
--depth batches in flight (default one): block tables of --batch blocks of --block-size bytes
(scattered on the target unless --layout contiguous), submitted, waited for, repeated for
--duration seconds per block size. Columns as nixlbench: prepare = checking and merging, post = submission until the last
request was posted, tx = submission until completion (microseconds).

Exit status: 0 measured; 1 an error; 2 usage.

Examples:
  gdr xfer-bench --target -d mlx5_0
  gdr xfer-bench 10.0.0.1:18700 -d mlx5_0 --threads 4 --batch 128 --block-size 65536
  gdr xfer-bench 10.0.0.1:18700 --block-size 16384,65536,262144 --op read --json";

/// Arguments of `gdr xfer-bench`.
#[derive(Debug, Args)]
// A later option overrides an earlier one (`-q 2 ... -q 4` means 4): a script can
// append its variations to a common command line.
#[command(after_help = AFTER_HELP, args_override_self = true)]
pub struct XferBenchArgs {
    /// Run as the target (the side whose memory is written or read).
    #[arg(long, conflicts_with = "target_addr")]
    pub target: bool,
    /// The target's address (`host:port`), for the initiator.
    #[arg(value_name = "HOST:PORT")]
    pub target_addr: Option<String>,
    /// Target: address to listen on.
    #[arg(long, default_value = "0.0.0.0:18700")]
    pub listen: String,
    /// Target: bytes of its buffer (at least threads x depth x batch x the largest block size).
    #[arg(long, default_value_t = 256 << 20)]
    pub buffer_size: usize,
    /// Target: keep serving after an initiator finished.
    #[arg(long)]
    pub forever: bool,
    /// RDMA device: `name[:port]` or an NCCL-style list.
    #[arg(short = 'd', long, default_value = "")]
    pub device: String,
    /// GID index (default: the RoCE v2 IPv4 entry).
    #[arg(short = 'x', long)]
    pub gid_index: Option<u32>,
    /// Threads, each with --depth batches in flight.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Batches each thread keeps in flight (1: submit, wait, repeat, as Mooncake's and
    /// nixlbench's loops; 2 keeps the queue pairs busy between batches, as perftest does).
    #[arg(long, default_value_t = 1)]
    pub depth: usize,
    /// Blocks per batch.
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    /// Block sizes in bytes, comma-separated (one row each).
    #[arg(long, value_delimiter = ',', default_value = "65536")]
    pub block_size: Vec<u64>,
    /// Operation.
    #[arg(long, default_value = "write", value_parser = ["write", "read"])]
    pub op: String,
    /// Seconds per block size.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Queue pairs per peer.
    #[arg(short = 'q', long, default_value_t = 2)]
    pub qps: u8,
    /// Largest work request in bytes (longer runs are cut; the engine's default).
    #[arg(long, default_value_t = 256 * 1024)]
    pub slice_size: u64,
    /// Where blocks land on the target.
    #[arg(long, value_enum, default_value_t = Layout::Scattered)]
    pub layout: Layout,
    /// Microseconds the progress thread keeps polling after a completion before it sleeps on
    /// the completion channel.
    #[arg(long, default_value_t = 200)]
    pub busy_poll_us: u64,
    /// Local ACK timeout exponent of the queue pairs (4.096 us x 2^n; the engine's default).
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    pub ack_timeout: u8,
    /// Send-queue depth of each queue pair: the most requests in flight on one (the engine's
    /// default).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub send_queue_depth: u32,
    /// Check the data: both sides fill their buffers with patterns, and after the run both
    /// print a digest of the last block size's blocks (`... digest 0x...`; give it to the
    /// target too); equal digests mean every block landed where it belongs.
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON document instead of the table.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV instead of the table.
    #[arg(long)]
    pub csv: bool,
}

/// Runs `gdr xfer-bench`; returns the exit code.
pub fn run(args: XferBenchArgs) -> u8 {
    let mut cfg = AgentConfig::new(if args.target {
        "xfer-bench-target"
    } else {
        "xfer-bench-initiator"
    })
    .device(args.device.clone());
    cfg.gid_index = args.gid_index;
    cfg.busy_poll = std::time::Duration::from_micros(args.busy_poll_us);
    cfg.ack_timeout = args.ack_timeout;
    cfg.send_queue_depth = args.send_queue_depth;
    let result = if args.target {
        xfer_bench::run_target(
            cfg,
            &args.listen,
            args.buffer_size,
            args.forever,
            args.verify,
        )
        .map(|()| None)
    } else {
        let Some(addr) = &args.target_addr else {
            eprintln!("gdr xfer-bench: give --target or the target's HOST:PORT");
            return 2;
        };
        if args.threads == 0 || args.depth == 0 || args.batch == 0 || args.block_size.contains(&0) {
            eprintln!(
                "gdr xfer-bench: --threads, --depth, --batch and --block-size must be positive"
            );
            return 2;
        }
        let params = BenchParams {
            threads: args.threads,
            depth: args.depth,
            batch: args.batch,
            block_sizes: args.block_size.clone(),
            op: args.op.clone(),
            duration_s: args.duration,
            qps: args.qps,
            slice_size: args.slice_size,
            layout: args.layout,
            verify: args.verify,
        };
        xfer_bench::run_initiator(cfg, addr, &params).map(Some)
    };
    match result {
        Ok(None) => 0,
        Ok(Some(report)) => {
            if args.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("gdr xfer-bench: {e}");
                        return 1;
                    }
                }
            } else if args.csv {
                print!("{}", xfer_bench::csv(&report));
            } else {
                print!("{}", xfer_bench::table(&report));
            }
            0
        }
        Err(e) => {
            eprintln!("gdr xfer-bench: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: XferBenchArgs,
    }

    #[test]
    fn a_later_option_overrides_an_earlier_one() {
        let c = Cli::try_parse_from(["x", "h:1", "-q", "2", "--slice-size", "65536", "-q", "4"])
            .expect("a repeated option parses");
        assert_eq!(c.args.qps, 4);
        assert_eq!(c.args.slice_size, 65536);
        let c = Cli::try_parse_from(["x", "h:1"]).unwrap();
        assert_eq!(c.args.slice_size, 256 * 1024, "the engine's default");
        let d = AgentConfig::new("x");
        assert_eq!(c.args.ack_timeout, d.ack_timeout, "the engine's default");
        assert_eq!(
            c.args.send_queue_depth, d.send_queue_depth,
            "the engine's default"
        );
        assert!(Cli::try_parse_from(["x", "h:1", "--ack-timeout", "32"]).is_err());
        assert!(Cli::try_parse_from(["x", "h:1", "--send-queue-depth", "0"]).is_err());
    }
}
