//! `gdr doctor`: collect a topology snapshot (or load one) and print the diagnosis.

use clap::{Args, Subcommand};
use gdr_doctor::nccl_log;
use gdr_doctor::topology::{collect_with, CollectOptions, Snapshot};
use gdr_doctor::{diagnose, nccl_env_from_process, Error, NCCL_VARS};
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

const AFTER_HELP: &str = "\
Exit status:
  0  GPUDirect RDMA can work for at least one GPU-NIC pair (warnings allowed)
  1  it cannot, or there is no GPU-NIC pair at all
  2  usage error, or the snapshot could not be collected or read
  (`gdr doctor nccl-log`: 0 when the log shows GDRDMA on every network connection, 1 when
  not or when it cannot tell, 2 when the log cannot be read or holds no NCCL line)

The NCCL variables that bear on GPUDirect RDMA and the network path are read from the
environment (NCCL_IB_DISABLE, NCCL_NET, NCCL_NET_PLUGIN, NCCL_IB_HCA, NCCL_IB_GID_INDEX,
NCCL_IB_ROCE_VERSION_NUM, NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE, NCCL_SOCKET_IFNAME,
NCCL_NET_GDR_LEVEL, NCCL_NET_GDR_READ, NCCL_IB_PCI_RELAXED_ORDERING, NCCL_DMABUF_ENABLE,
NCCL_P2P_LEVEL, NCCL_P2P_DISABLE, NCCL_DEBUG, NCCL_DEBUG_SUBSYS), or from the snapshot;
--env NAME=VALUE sets one for the diagnosis.

Run as root to read PCIe extended configuration space: without it ACS state is reported as
unknown, never as ok. Colour is used when stdout is a terminal and NO_COLOR is unset.

Examples:
  gdr doctor                          diagnose this machine
  gdr doctor --json                   the same as JSON
  gdr doctor dump > host.json         capture this machine
  gdr doctor --snapshot host.json     diagnose a captured machine
  gdr doctor --root /mnt/copy         read sys/ and proc/ below a directory
  gdr doctor --snapshot host.json --env NCCL_P2P_LEVEL=5
                                      diagnose a captured machine with an NCCL setting
  gdr doctor nccl-log job.log         does NCCL's INFO log show GPUDirect RDMA?
  gdr doctor nccl-log --host job.log  the same, cross-checked with this machine";

/// Arguments of `gdr doctor`.
#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct DoctorArgs {
    #[command(subcommand)]
    action: Option<DoctorAction>,
    /// Print the report as JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Read sysfs and procfs below DIR instead of / (CUDA facts are then not read).
    #[arg(long, value_name = "DIR", global = true, conflicts_with = "snapshot")]
    root: Option<PathBuf>,
    /// Diagnose a snapshot written by `gdr doctor dump` instead of this machine.
    #[arg(long, value_name = "FILE", global = true)]
    snapshot: Option<PathBuf>,
    /// Diagnose as if the NCCL variable NAME were set to VALUE (repeatable; overrides the
    /// environment and the snapshot's record). Only NCCL variables the doctor reads.
    #[arg(long, value_name = "NAME=VALUE", global = true, value_parser = parse_env)]
    env: Vec<(String, String)>,
}

#[derive(Debug, Subcommand)]
enum DoctorAction {
    /// Print the collected snapshot as JSON (replay it later with --snapshot).
    Dump,
    /// Read an NCCL_DEBUG=INFO log (FILE, or - for stdin) of one or more ranks and say, per
    /// process, whether its network connections use GPUDirect RDMA (GDRDMA) and why not.
    NcclLog {
        /// The log file, or `-` for standard input.
        #[arg(value_name = "FILE|-")]
        file: PathBuf,
        /// Cross-check with this machine's diagnosis (also done with --snapshot or --root).
        #[arg(long)]
        host: bool,
    },
}

/// `NAME=VALUE` for one of the NCCL variables the doctor reads.
fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))?;
    if !NCCL_VARS.contains(&k) {
        return Err(format!(
            "{k} is not an NCCL variable the doctor reads ({})",
            NCCL_VARS.join(", ")
        ));
    }
    Ok((k.to_string(), v.to_string()))
}

fn load(args: &DoctorArgs) -> gdr_doctor::Result<Snapshot> {
    let mut snap = if let Some(file) = &args.snapshot {
        let text = std::fs::read_to_string(file).map_err(|source| Error::Io {
            what: format!("reading snapshot {}", file.display()),
            source,
        })?;
        Snapshot::from_json(&text, &file.display().to_string())?
    } else {
        // Every NCCL variable the doctor checks, not only the ones the collector records.
        let mut opts = match &args.root {
            Some(root) if root != Path::new("/") => CollectOptions::from_process_env(),
            _ => CollectOptions::live(),
        };
        opts.env.extend(nccl_env_from_process());
        let root = args.root.as_deref().unwrap_or(Path::new("/"));
        collect_with(root, opts)?
    };
    for (k, v) in &args.env {
        snap.env.insert(k.clone(), v.clone());
    }
    Ok(snap)
}

fn read_log(file: &Path) -> gdr_doctor::Result<(String, String)> {
    if file == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut bytes)
            .map_err(|source| Error::Io {
                what: "reading the NCCL log from stdin".into(),
                source,
            })?;
        return Ok((String::from_utf8_lossy(&bytes).into_owned(), "stdin".into()));
    }
    let bytes = std::fs::read(file).map_err(|source| Error::Io {
        what: format!("reading NCCL log {}", file.display()),
        source,
    })?;
    // Logs may hold bytes that are not UTF-8 (a launcher's prefix, a cut line): keep the rest.
    Ok((
        String::from_utf8_lossy(&bytes).into_owned(),
        file.display().to_string(),
    ))
}

fn fail(e: &Error) -> u8 {
    eprintln!("gdr doctor: {e}");
    if let Some(h) = e.hint() {
        eprintln!("hint: {h}");
    }
    2
}

/// `gdr doctor nccl-log`.
fn run_nccl_log(args: &DoctorArgs, file: &Path, host: bool) -> u8 {
    let (text, source) = match read_log(file) {
        Ok(x) => x,
        Err(e) => return fail(&e),
    };
    let log = match nccl_log::parse(&text, &source) {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    let report = if host || args.snapshot.is_some() || args.root.is_some() {
        match load(args) {
            Ok(snap) => Some(diagnose(&snap)),
            Err(e) => return fail(&e),
        }
    } else {
        None
    };
    let out = nccl_log::analyze(&log, report.as_ref());
    if args.json {
        print(&out.to_json());
    } else {
        print(&out.to_table());
    }
    out.exit_code() as u8
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
    if let Some(DoctorAction::NcclLog { file, host }) = &args.action {
        return run_nccl_log(&args, file, *host);
    }
    let snap = match load(&args) {
        Ok(s) => s,
        Err(e) => return fail(&e),
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
