//! System packages (Debian/Ubuntu, apt) and small process helpers.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{say, Result};

/// Everything the workspace build and the Soft-RoCE VM need from the distribution.
pub const PACKAGES: &[&str] = &[
    // The VM: emulator, the initramfs' shell, module tools, archive tool.
    "qemu-system-x86",
    "busybox-static",
    "kmod",
    "cpio",
    // `ip` and `rdma` inside the VM (they run from the host's root).
    "iproute2",
    // The RDMA user space: providers (rxe), ibv_devinfo, rping, perftest for reference numbers.
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "rdmacm-utils",
    "perftest",
    // callgrind: gdr-xfer's instructions per block (benches/xfer_post_cost.rs, README).
    "valgrind",
    // Building rdma-sys: headers and libraries to link, bindgen's libclang (<= 15), pkg-config.
    "libibverbs-dev",
    "librdmacm-dev",
    "libclang-dev",
    "clang",
    "pkg-config",
    // Building gdr-xfer's `etcd` feature: etcd-client compiles etcd's .proto files with protoc at
    // build time (tonic-prost-build), and they import Google's well-known types
    // (google/protobuf/descriptor.proto, struct.proto), which Debian ships in libprotobuf-dev
    // (only recommended by protobuf-compiler, so not pulled in by --no-install-recommends).
    "protobuf-compiler",
    "libprotobuf-dev",
    // gdr-xfer's etcd directory tests start a real etcd (v3 API, Debian 12: 3.4) on loopback.
    "etcd-server",
    // The Python tier (`cargo xtask py-test`): a virtual environment for maturin, numpy and
    // pytest (pip installs them from PyPI), in which the gdr-py wheel is built and tested.
    "python3",
    "python3-venv",
    // compare-peers' Python drivers import numpy; the xtask's own test of their workload
    // (`the_peer_drivers_pass_their_tests`) runs them under Debian's python3.
    "python3-numpy",
];

static APT_UPDATED: AtomicBool = AtomicBool::new(false);

/// `cargo xtask setup`: installs whatever of [`PACKAGES`] is missing.
pub fn setup() -> Result<()> {
    ensure_packages()?;
    say!("all {} system packages are installed", PACKAGES.len());
    crate::fuzz::ensure_cargo_fuzz();
    Ok(())
}

/// Installs the packages of [`PACKAGES`] that are not installed yet (one `apt-get update`, one
/// `apt-get install`). Does nothing, quickly, when all are there.
pub fn ensure_packages() -> Result<()> {
    if !have("dpkg-query") {
        return check_tools_without_apt();
    }
    let missing = missing_packages()?;
    if missing.is_empty() {
        return Ok(());
    }
    say!("installing missing system packages: {}", missing.join(" "));
    apt_update()?;
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend(missing.iter().map(String::as_str));
    run_privileged("apt-get", &args)?;
    let still = missing_packages()?;
    if !still.is_empty() {
        return Err(format!("apt-get did not install: {}", still.join(" ")));
    }
    Ok(())
}

fn missing_packages() -> Result<Vec<String>> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Package} ${db:Status-Abbrev}\n"])
        .args(PACKAGES)
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run dpkg-query: {e}"))?;
    // dpkg-query exits 1 when some package is unknown; the listed ones are still printed.
    let text = String::from_utf8_lossy(&out.stdout);
    let installed: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            let (name, status) = l.split_once(' ')?;
            status.starts_with("ii").then_some(name)
        })
        .map(|n| n.split(':').next().unwrap_or(n))
        .collect();
    Ok(PACKAGES
        .iter()
        .filter(|p| !installed.contains(p))
        .map(|p| p.to_string())
        .collect())
}

/// `apt-get update`, at most once per xtask run.
pub fn apt_update() -> Result<()> {
    if APT_UPDATED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    say!("apt-get update");
    run_privileged("apt-get", &["update", "-q"])
}

fn check_tools_without_apt() -> Result<()> {
    let tools = [
        "qemu-system-x86_64",
        "busybox",
        "ip",
        "rdma",
        "pkg-config",
        "protoc",
        "etcd",
    ];
    let missing: Vec<_> = tools.iter().filter(|t| !have(t)).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "no dpkg/apt here and these tools are missing: {missing:?}; install the equivalents of: {}",
            PACKAGES.join(" ")
        ))
    }
}

/// Runs a command as root: directly when we are root, through sudo otherwise.
fn run_privileged(program: &str, args: &[&str]) -> Result<()> {
    // sudo resets the environment, so the variable goes through env(1).
    let mut cmd = if is_root() {
        Command::new("env")
    } else if have("sudo") {
        let mut c = Command::new("sudo");
        c.arg("env");
        c
    } else {
        return Err(format!("{program} needs root and there is no sudo"));
    };
    cmd.arg("DEBIAN_FRONTEND=noninteractive").arg(program);
    // Wait for a concurrent apt/dpkg (another xtask run) instead of failing on its lock.
    if program == "apt-get" {
        cmd.args(["-o", "DPkg::Lock::Timeout=300"]);
    }
    cmd.args(args);
    run(&mut cmd)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Whether `tool` is on PATH.
pub fn have(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

/// Runs a command with inherited stdio; a non-zero exit is an error.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} failed ({status})", describe(cmd)))
    }
}

/// Runs a command quietly; its output is shown only when it fails.
pub fn run_quiet(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{} failed ({}):\n{}{}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}
