//! `cargo xtask`: project automation for gdr.
//!
//! * `setup`: install the system packages the workspace and the VM need (apt, idempotent).
//! * `vm -- <command...>`: boot the Soft-RoCE VM, run the command inside as root with `rxe0` up.
//! * `cluster -- <command...>`: several Soft-RoCE hosts x rails, the command on each, faults.
//! * `test`: host tests, then the device tests inside one VM boot.
//! * `demo`: the README's main job, run inside the VM.
//! * `gpu-bundle`: collect the `gpu_*` test binaries for the GPU machine.
//! * `compare-perftest`: gdr bw/lat against perftest, medians and ratios.
//! * `compare-xfer`: gdr-xfer's batched block writes against ib_write_bw, paired ratios.
//! * `dropins`: gdr.nixl and gdr.mooncake against NIXL and Mooncake, call by call, in the VM.
//! * `compare-rails`: gdr-xfer on one rail, on two, and ib_write_bw on both, on a cluster.
//! * `bench`: `cargo bench` (benches/perf.rs) inside the VM.
//! * `post-cost`: gdr-xfer's instructions per posted block, under callgrind in the VM.
//! * `downstream`: build a new crate from each program of the guide (README.md, docs/, READMEs).
//! * `docs`: account for every code block and link of the guide, check its commands, run
//!   `cargo doc` with warnings as errors, build the book.
//! * `package`: `cargo publish --dry-run` of the five library crates.
//! * `fuzz [--minutes N] [TARGET...]`: the cargo-fuzz targets in fuzz/, executions and crashes.
//! * `mutants`: cargo-mutants over gdr-xfer-proto's decision code (`.cargo/mutants.toml`).
//! * `coverage`: line coverage of gdr-xfer-proto under the simulation and its unit tests.

mod bench;
mod bundle;
mod cargo;
mod cluster;
mod compare_peers;
mod compare_rails;
mod compare_xfer;
mod coverage;
mod demo;
mod docs;
mod downstream;
mod dropins;
mod fuzz;
mod mutants;
mod package;
mod perftest;
mod post_cost;
mod py_cost;
mod py_test;
mod setup;
mod sim;
mod test;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "gdr project automation", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install the system packages gdr and its Soft-RoCE VM need (apt-get; idempotent).
    Setup,
    /// Boot the Soft-RoCE VM and run a command inside it as root, with rxe0 up.
    Vm {
        #[command(flatten)]
        opts: vm::VmOpts,
        /// The command and its arguments (after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<String>,
    },
    /// Boot several Soft-RoCE hosts with several rails each and run a command on every host.
    Cluster {
        #[command(flatten)]
        opts: cluster::ClusterOpts,
        /// The command and its arguments (after `--`), run on every host.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<String>,
    },
    /// Run all tests: host tests, then the device tests inside one VM boot.
    Test(test::TestOpts),
    /// Run the main job (currently: query rxe0 through gdr-sys) inside the VM.
    Demo {
        #[command(flatten)]
        opts: vm::VmOpts,
    },
    /// Build the `gpu_*` test binaries, the gdr binary and examples into gpu-bundle/.
    GpuBundle,
    /// gdr bw/lat against perftest's ib_write_bw/ib_write_lat, alternately, in one VM boot.
    ComparePerftest(perftest::CompareOpts),
    /// gdr xfer-bench (gdr-xfer) against ib_write_bw, alternately, in one VM boot.
    CompareXfer(compare_xfer::CompareXferOpts),
    /// gdr xfer-bench against Mooncake TE (Python and C++) and NIXL, same workload, one VM boot.
    ComparePeers(compare_peers::ComparePeersOpts),
    /// gdr's drop-ins (gdr.nixl, gdr.mooncake) against NIXL and Mooncake themselves: the same
    /// API check programs on both, every call's result compared, in one VM boot.
    Dropins(dropins::DropinsOpts),
    /// gdr-xfer on one rail and on two against ib_write_bw on both rails, on a 2-host cluster.
    CompareRails(compare_rails::CompareRailsOpts),
    /// Run `cargo bench` (write bandwidth and latency, benches/perf.rs) inside the VM.
    Bench(bench::BenchOpts),
    /// gdr-xfer's own instructions per posted block (callgrind, benches/xfer_post_cost.rs).
    PostCost(post_cost::PostCostOpts),
    /// Build a new crate from each program of the guide (README.md, the book, the crates'
    /// READMEs) alone: its dependency block and its code; not run.
    Downstream,
    /// `cargo publish --dry-run` of the five library crates (nothing is uploaded).
    Package,
    /// Account for every code block of the guide, check its shell commands, build the book
    /// (mdBook, installed into target/tools on first use) into target/book.
    Docs(docs::DocsOpts),
    /// Fuzz every decoder (fuzz/, cargo-fuzz on nightly), one target after another.
    Fuzz(fuzz::FuzzOpts),
    /// The deterministic simulation of gdr-xfer's core over many seeds (or one, or a mutant).
    Sim(sim::SimOpts),
    /// Mutation testing of gdr-xfer's core with cargo-mutants (installed by hand; not in CI).
    Mutants(mutants::MutantsOpts),
    /// Line coverage of gdr-xfer's core under the simulation and its unit tests
    /// (cargo-llvm-cov, installed by hand; not in CI).
    Coverage(coverage::CoverageOpts),
    /// The Python binding: build the abi3 wheel (maturin), host pytest, VM pytest, then the wheel
    /// installed into a fresh virtual environment in the VM runs the README's Python example.
    PyTest(py_test::PyTestOpts),
    /// The Python wheel users install: abi3 (CPython >= 3.11), manylinux_2_28, linking the
    /// system's libibverbs; written to target/py/wheels.
    Wheel,
    /// The Python binding's own instructions per call of Peer.transfer_blocks against the Rust
    /// API (callgrind in the VM).
    PyCost(py_cost::PyCostOpts),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup => setup::setup().map(|()| 0),
        Command::Vm { opts, command } => vm::run_command(&opts, &command),
        Command::Cluster { opts, command } => cluster::run_command(&opts, &command),
        Command::Test(opts) => test::test(&opts),
        Command::Demo { opts } => demo::demo(&opts),
        Command::GpuBundle => bundle::gpu_bundle().map(|()| 0),
        Command::ComparePerftest(opts) => perftest::compare(&opts),
        Command::CompareXfer(opts) => compare_xfer::compare(&opts),
        Command::ComparePeers(opts) => compare_peers::compare(&opts),
        Command::PostCost(opts) => post_cost::post_cost(&opts),
        Command::Dropins(opts) => dropins::dropins(&opts),
        Command::CompareRails(opts) => compare_rails::compare(&opts),
        Command::Bench(opts) => bench::bench(&opts),
        Command::Downstream => downstream::downstream(),
        Command::Docs(opts) => docs::docs(&opts),
        Command::Package => package::package(),
        Command::Fuzz(opts) => fuzz::fuzz(&opts),
        Command::Sim(opts) => sim::sim(&opts),
        Command::Mutants(opts) => mutants::mutants(&opts),
        Command::Coverage(opts) => coverage::coverage(&opts),
        Command::PyTest(opts) => py_test::py_test(&opts),
        Command::Wheel => py_test::wheel().map(|()| 0),
        Command::PyCost(opts) => py_cost::py_cost(&opts),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::from(1)
        }
    }
}

/// Parses `cargo xtask`'s arguments (those after `xtask`) without running anything: the
/// guide's `cargo xtask` lines are checked with it.
pub(crate) fn parse_args(args: &[String]) -> Result<()> {
    let argv = std::iter::once("cargo xtask".to_string()).chain(args.iter().cloned());
    Cli::try_parse_from(argv)
        .map(|_| ())
        .map_err(|e| e.to_string().lines().next().unwrap_or_default().to_string())
}

/// Errors are plain messages: xtask prints them and exits 1.
pub type Result<T> = std::result::Result<T, String>;

/// Prints one short progress line.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        eprintln!("xtask: {}", format!($($arg)*))
    };
}
