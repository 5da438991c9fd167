//! Command-line options shared by `gdr bw` and `gdr lat`, and running either side.

use std::path::PathBuf;

use clap::Args;

use super::params::{sweep_sizes, CudaPath, Limit, Op, Params, Test};
use super::session::{self, LocalOpts, OutputOpts};

/// Options of both `gdr bw` and `gdr lat`.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Server address (client side); omit with --server.
    #[arg(value_name = "SERVER", required_unless_present = "server")]
    pub host: Option<String>,
    /// Run as the server: wait for a client and follow its parameters.
    #[arg(long, conflicts_with = "host")]
    pub server: bool,
    /// Message size in bytes.
    #[arg(short = 's', long, value_name = "BYTES")]
    pub size: Option<usize>,
    /// Sweep sizes 2 B .. 8 MiB by powers of two.
    #[arg(short = 'a', long = "all", conflicts_with = "size")]
    pub all: bool,
    /// Messages per size (per queue pair).
    #[arg(short = 'n', long, value_name = "N")]
    pub iters: Option<u64>,
    /// Measure each size for this many seconds instead of a fixed count.
    #[arg(short = 'D', long, value_name = "SECS", conflicts_with = "iters")]
    pub duration: Option<f64>,
    /// Requests in flight per queue pair.
    #[arg(short = 't', long, default_value_t = 128, value_name = "N")]
    pub tx_depth: u32,
    /// Signal one request in every N (capped at the tx depth).
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub cq_mod: u32,
    /// Largest message posted inline (host memory); 0 disables inline.
    #[arg(short = 'I', long, value_name = "BYTES")]
    pub inline_size: Option<u32>,
    /// RDMA device: `name[:port]` or an NCCL-style list (`mlx5_0:1,mlx5_1`, `^mlx5_2`, `=mlx5_1`).
    #[arg(short = 'd', long, default_value = "", value_name = "DEVICE")]
    pub device: String,
    /// GID index (default: the RoCE v2 IPv4 entry).
    #[arg(short = 'x', long, value_name = "INDEX")]
    pub gid_index: Option<u32>,
    /// TCP port of the parameter and endpoint exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Use GPU memory on this CUDA device (default 0).
    #[arg(long, value_name = "ORDINAL", num_args = 0..=1, default_missing_value = "0", require_equals = true)]
    pub use_cuda: Option<i32>,
    /// How GPU memory is registered.
    #[arg(long, value_enum, default_value_t = CudaPath::Auto, requires = "use_cuda")]
    pub cuda_path: CudaPath,
    /// Report bandwidth in Gb/s (10^9 bits) instead of MiB/s.
    #[arg(long)]
    pub report_gbits: bool,
    /// Print one JSON document instead of the table.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV instead of the table.
    #[arg(long)]
    pub csv: bool,
    /// Write an SVG plot (against message size) to this file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

impl CommonArgs {
    /// The parameters a client sends. `default_iters` and `default_inline` are the test's defaults.
    pub fn params(
        &self,
        test: Test,
        op: Op,
        qps: u32,
        default_iters: u64,
        default_inline: u32,
    ) -> Params {
        Params {
            test,
            op,
            sizes: if self.all {
                sweep_sizes()
            } else {
                vec![self.size.unwrap_or(match test {
                    Test::Bw => 65536,
                    Test::Lat => 2,
                })]
            },
            limit: match self.duration {
                Some(d) => Limit::Duration(d),
                None => Limit::Iters(self.iters.unwrap_or(default_iters)),
            },
            qps,
            tx_depth: self.tx_depth,
            cq_mod: self.cq_mod,
            inline_size: if self.use_cuda.is_some() {
                0
            } else {
                self.inline_size.unwrap_or(default_inline)
            },
            post_list: 1,
        }
    }

    /// This side's own choices.
    pub fn local(&self) -> LocalOpts {
        LocalOpts {
            device: self.device.clone(),
            gid_index: self.gid_index,
            port: self.port,
            cuda: self.use_cuda.map(|o| (o, self.cuda_path)),
        }
    }

    /// Output forms.
    pub fn output(&self) -> OutputOpts {
        OutputOpts {
            json: self.json,
            csv: self.csv,
            plot: self.plot.clone(),
            gbits: self.report_gbits,
        }
    }

    /// Runs this side; returns the exit code (0 ok, 1 failure or data not verified).
    pub fn run(&self, name: &str, test: Test, params: Params) -> u8 {
        let result = if self.server {
            session::run_server(test, &self.local(), &self.output())
        } else {
            let host = self.host.as_deref().unwrap_or_default();
            session::run_client(host, &params, &self.local(), &self.output())
        };
        match result {
            Ok(r) if r.verified => 0,
            Ok(r) => {
                eprintln!("gdr {name}: data NOT verified: {}", r.failures.join("; "));
                1
            }
            Err(e) => {
                eprintln!("gdr {name}: {e}");
                1
            }
        }
    }
}
