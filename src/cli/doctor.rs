//! `gdr doctor`: collect a topology snapshot (or load one) and print the diagnosis.

use clap::{Args, Subcommand};
use gdr::doctor::diagnose;
use gdr::topology::{collect_with, CollectOptions, Snapshot};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

const AFTER_HELP: &str = "\
Exit status:
  0  GPUDirect RDMA can work for at least one GPU-NIC pair (warnings allowed)
  1  it cannot, or there is no GPU-NIC pair at all
  2  usage error, or the snapshot could not be collected or read

Run as root to read PCIe extended configuration space: without it ACS state is reported as
unknown, never as ok. Colour is used when stdout is a terminal and NO_COLOR is unset.

Examples:
  gdr doctor                          diagnose this machine
  gdr doctor --json                   the same as JSON
  gdr doctor dump > host.json         capture this machine
  gdr doctor --snapshot host.json     diagnose a captured machine
  gdr doctor --root /mnt/copy         read sys/ and proc/ below a directory";

/// Arguments of `gdr doctor`.
#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct DoctorArgs {
    #[command(subcommand)]
    action: Option<DoctorAction>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Read sysfs and procfs below DIR instead of / (CUDA facts are then not read).
    #[arg(long, value_name = "DIR", global = true, conflicts_with = "snapshot")]
    root: Option<PathBuf>,
    /// Diagnose a snapshot written by `gdr doctor dump` instead of this machine.
    #[arg(long, value_name = "FILE", global = true)]
    snapshot: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum DoctorAction {
    /// Print the collected snapshot as JSON (replay it later with --snapshot).
    Dump,
}

fn load(args: &DoctorArgs) -> gdr::Result<Snapshot> {
    if let Some(file) = &args.snapshot {
        let text = std::fs::read_to_string(file)
            .map_err(|e| gdr::Error::io(format!("reading snapshot {}", file.display()), e))?;
        return Snapshot::from_json(&text, &file.display().to_string());
    }
    match &args.root {
        Some(root) if root != Path::new("/") => {
            collect_with(root, CollectOptions::from_process_env())
        }
        _ => collect_with(Path::new("/"), CollectOptions::live()),
    }
}

fn use_color() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    // A closed pipe (`gdr doctor | head`) is not an error worth reporting.
    let _ = out.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    let _ = out.flush();
}

/// Run `gdr doctor`; returns the exit status.
pub fn run(args: DoctorArgs) -> u8 {
    let snap = match load(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gdr doctor: {e}");
            if let Some(h) = e.hint() {
                eprintln!("hint: {h}");
            }
            return 2;
        }
    };
    if let Some(DoctorAction::Dump) = args.action {
        print(&snap.to_json());
        return 0;
    }
    let report = diagnose(&snap);
    if args.json {
        print(&report.to_json());
    } else {
        print(&report.to_table(use_color()));
    }
    report.exit_code() as u8
}
