//! The Soft-RoCE VM (README, "How the test VM works"): Debian's 6.1 kernel under QEMU (TCG), an
//! initramfs of busybox-static + the RDMA/9p modules, the host's root over 9p read-only, `rxe0` on
//! a veth pair.
//!
//! Layout under `<target>/softroce/`:
//! * `kernel-<version>-<hash>/`: `vmlinuz`, `modules/*.ko`, `modules.list` (load order), taken from
//!   the distribution package with `apt-get download` + `dpkg -x` (nothing is installed).
//! * `initramfs-<version>-<hash>.cpio`: keyed on the kernel and a hash of the guest scripts.
//! * `runs/<pid>/`: one per `vm` run, shared writable with the guest (command script, env, exit
//!   code); removed afterwards.
//!
//! Everything cached is built under a temporary name and renamed into place, so concurrent runs
//! are safe.

use std::fs;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::setup::{self, run_quiet};
use crate::{cargo, say, Result};

/// Stage 1: PID 1 of the initramfs.
const INIT_SH: &str = include_str!("guest/init.sh");
/// Stage 2: runs chrooted in the host root; brings up rxe0 and runs the command.
const STAGE2_SH: &str = include_str!("guest/stage2.sh");
/// Stage 2 of a cluster host (`gdr.stage2=cluster` on the kernel command line; see cluster.rs).
const CLUSTER_SH: &str = include_str!("guest/cluster.sh");

/// Kernel modules in load order (insmod, no modprobe). crc32_generic first: without it
/// `rdma link add` fails with "rdma_rxe: failed to add". The last five give rdma_cm.
const MODULES: &[&str] = &[
    "crc32_generic",
    "virtio_ring",
    "virtio",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    // The cluster's NICs (virtio-net-pci); harmless in the single VM, which has none.
    "failover",
    "net_failover",
    "virtio_net",
    "netfs",
    "fscache",
    "9pnet",
    "9pnet_virtio",
    "9p",
    "ib_core",
    "ib_uverbs",
    "udp_tunnel",
    "ip6_udp_tunnel",
    "rdma_rxe",
    "veth",
    "configfs",
    "ib_cm",
    "iw_cm",
    "rdma_cm",
    "rdma_ucm",
    // netem: loss/delay/reordering on a cluster rail (`gdr-fault netem`).
    "sch_netem",
];

/// The address of veth0 (and so of rxe0's RoCE v2 GID) inside the VM. It exists only there.
pub const GUEST_ADDR: &str = "10.77.0.1";
const GUEST_PREFIX: u8 = 24;

/// Exit code when the guest hangs past the timeout (as timeout(1)).
const TIMEOUT_EXIT: i32 = 124;

/// Options shared by every command that boots the VM.
#[derive(clap::Args, Clone, Debug)]
pub struct VmOpts {
    /// Kill the VM after this many seconds (boot included).
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    pub timeout: u64,
    /// Locked-memory limit for the command inside the VM: KiB or `unlimited`.
    #[arg(long, value_name = "KIB|unlimited", default_value = "unlimited", value_parser = parse_memlock)]
    pub memlock: String,
    /// Deterministic guest clock: one vCPU, and guest time counted in executed instructions
    /// (`-icount shift=0,sleep=off`, 1 ns each) instead of read off the host. A CPU-bound
    /// benchmark then measures instructions per byte, whatever else this host is doing
    /// (timeouts inside the guest run on the same clock). One vCPU because QEMU 7.2's icount
    /// hangs bringing up a second one.
    #[arg(long)]
    pub icount: bool,
}

fn parse_memlock(s: &str) -> std::result::Result<String, String> {
    if s == "unlimited" || (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())) {
        Ok(s.to_string())
    } else {
        Err("expected a number of KiB or `unlimited`".into())
    }
}

/// What a VM run left behind.
pub struct Outcome {
    /// The command's exit code (124 when the VM was killed by the timeout).
    pub code: i32,
    /// The command's console output (also streamed to stdout while it ran), `\r` removed.
    pub output: String,
}

/// `cargo xtask vm -- <command...>`: returns the command's exit code.
pub fn run_command(opts: &VmOpts, argv: &[String]) -> Result<i32> {
    let script = format!("exec {}\n", shell_words(argv));
    Ok(boot(opts, &script)?.code)
}

/// Quotes each word for a POSIX shell and joins them with spaces.
pub fn shell_words<S: AsRef<str>>(words: &[S]) -> String {
    words
        .iter()
        .map(|w| shell_quote(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Quotes one word for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// [`boot`], and an error unless the script exited 0 (`what` names the script in it).
pub fn boot_ok(opts: &VmOpts, script: &str, what: &str) -> Result<Outcome> {
    let outcome = boot(opts, script)?;
    if outcome.code != 0 {
        return Err(format!("{what} exited with {} in the VM", outcome.code));
    }
    Ok(outcome)
}

/// Boots the VM and runs `script` (POSIX sh) inside it as root, in the host's current directory,
/// with rxe0 up and `GDR_TEST_*` exported. Streams the script's output to stdout.
pub fn boot(opts: &VmOpts, script: &str) -> Result<Outcome> {
    setup::ensure_packages()?;
    let cwd = std::env::current_dir().map_err(|e| format!("no current directory: {e}"))?;
    let meta = cargo::metadata()?;
    for (what, p) in [
        ("the current directory", &cwd),
        ("the target directory", &meta.target_dir),
    ] {
        if ["/tmp", "/run", "/proc", "/sys", "/dev"]
            .iter()
            .any(|d| p.starts_with(d))
        {
            return Err(format!(
                "{what} ({}) is under a directory that the VM replaces with a fresh one; \
                 work from elsewhere",
                p.display()
            ));
        }
    }
    let cache = meta.target_dir.join("softroce");
    fs::create_dir_all(&cache).map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    let kernel = ensure_kernel(&cache)?;
    let initramfs = ensure_initramfs(&cache, &kernel)?;

    let runs = cache.join("runs");
    remove_stale_runs(&runs);
    let run_dir = runs.join(std::process::id().to_string());
    let _ = fs::remove_dir_all(&run_dir);
    fs::create_dir_all(&run_dir)
        .map_err(|e| format!("cannot create {}: {e}", run_dir.display()))?;
    let result = boot_in(opts, script, &cwd, &kernel, &initramfs, &run_dir);
    let _ = fs::remove_dir_all(&run_dir);
    result
}

fn boot_in(
    opts: &VmOpts,
    script: &str,
    cwd: &Path,
    kernel: &Kernel,
    initramfs: &Path,
    run_dir: &Path,
) -> Result<Outcome> {
    let nonce = format!(
        "{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let term = if io::stdout().is_terminal() {
        std::env::var("TERM").unwrap_or_else(|_| "dumb".into())
    } else {
        "dumb".into()
    };
    let cwd_str = cwd
        .to_str()
        .ok_or_else(|| format!("the current directory is not UTF-8: {}", cwd.display()))?;
    let env = [
        ("GDR_VM_ADDR", GUEST_ADDR.to_string()),
        ("GDR_VM_PREFIX", GUEST_PREFIX.to_string()),
        ("GDR_VM_MEMLOCK", opts.memlock.clone()),
        ("GDR_VM_CWD", cwd_str.to_string()),
        ("GDR_VM_NONCE", nonce.clone()),
        ("GDR_VM_TERM", term),
    ]
    .iter()
    .map(|(k, v)| format!("{k}={}\n", shell_quote(v)))
    .collect::<String>();
    write(&run_dir.join("env"), env.as_bytes())?;
    write(&run_dir.join("cmd.sh"), script.as_bytes())?;

    let mut qemu = Command::new("qemu-system-x86_64");
    let accel = if opts.icount {
        "tcg,thread=single"
    } else {
        "tcg,thread=multi"
    };
    qemu.args(["-accel", accel]);
    if opts.icount {
        qemu.args(["-icount", "shift=0,sleep=off"]);
    }
    qemu.args([
        "-cpu",
        "max",
        "-m",
        "2048",
        "-smp",
        if opts.icount { "1" } else { "2" },
    ])
    .args(["-nographic", "-nic", "none", "-no-reboot"])
    .arg("-kernel")
    .arg(&kernel.vmlinuz)
    .arg("-initrd")
    .arg(initramfs)
    // panic=-1: a kernel panic reboots at once, and -no-reboot turns that into QEMU exiting.
    .arg("-append")
    .arg(kernel_cmdline())
    .arg("-virtfs")
    .arg("local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
    .arg("-virtfs")
    .arg(format!(
        "local,path={},mount_tag=results,security_model=none,multidevs=remap",
        run_dir
            .to_str()
            .ok_or("the target directory is not UTF-8")?
            .replace(',', ",,")
    ))
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());

    say!(
        "booting the Soft-RoCE VM (kernel {}, timeout {} s, ulimit -l {})",
        kernel.version,
        opts.timeout,
        opts.memlock
    );
    let start = Instant::now();
    let mut child = qemu
        .spawn()
        .map_err(|e| format!("cannot start qemu-system-x86_64: {e}"))?;
    let console = Arc::new(Mutex::new(Console::new(&nonce)));
    let (reader, err_reader) = read_guest_output(&mut child, &console);

    let timeout = Duration::from_secs(opts.timeout);
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(e) => return Err(format!("waiting for QEMU: {e}")),
        }
        if start.elapsed() >= timeout {
            timed_out = true;
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let _ = reader.join();
    let qemu_stderr = err_reader.join().unwrap_or_default();
    let console = Arc::try_unwrap(console)
        .map_err(|_| "console still shared")?
        .into_inner()
        .expect("console lock");
    let secs = start.elapsed().as_secs_f64();

    if timed_out {
        eprintln!(
            "xtask: TIMEOUT: the VM was still running after {} s and has been killed \
             (the command hung, or needs more time: --timeout SECS)",
            opts.timeout
        );
        if !console.started {
            eprintln!("xtask: the command never started; the VM's console up to here:");
            eprint!("{}", console.boot_log);
        }
        return Ok(Outcome {
            code: TIMEOUT_EXIT,
            output: console.output,
        });
    }
    let file_code = fs::read_to_string(run_dir.join("exit_code"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    match file_code.or(console.end_code) {
        Some(code) => {
            say!("VM finished in {secs:.1} s; the command exited with {code}");
            Ok(Outcome {
                code,
                output: console.output,
            })
        }
        None => {
            if !console.started {
                eprintln!("xtask: the VM's console up to here:");
                eprint!("{}", console.boot_log);
            }
            if !qemu_stderr.trim().is_empty() {
                eprintln!("xtask: QEMU said:\n{}", qemu_stderr.trim_end());
            }
            Err(format!(
                "the VM stopped after {secs:.1} s without reporting an exit code ({}; QEMU: {})",
                if console.started {
                    "the command started but did not finish"
                } else {
                    "it failed before the command started"
                },
                status.map(|s| s.to_string()).unwrap_or_default()
            ))
        }
    }
}

/// Splits the serial console into boot noise (kept for diagnostics), the command's output
/// (streamed), and the end marker with the exit code.
pub(crate) struct Console {
    start_marker: String,
    end_prefix: String,
    /// Put before every streamed line (`[host1] ` in a cluster, empty for the VM).
    prefix: String,
    pub(crate) started: bool,
    pub(crate) ended: bool,
    pub(crate) end_code: Option<i32>,
    pub(crate) boot_log: String,
    pub(crate) output: String,
}

impl Console {
    fn new(nonce: &str) -> Self {
        Self::with_prefix(nonce, "")
    }

    /// A console whose streamed lines start with `prefix`.
    pub(crate) fn with_prefix(nonce: &str, prefix: &str) -> Self {
        Console {
            prefix: prefix.to_string(),
            start_marker: format!("@@gdr-vm:{nonce}:start@@"),
            end_prefix: format!("@@gdr-vm:{nonce}:end:"),
            started: false,
            ended: false,
            end_code: None,
            boot_log: String::new(),
            output: String::new(),
        }
    }

    pub(crate) fn line(&mut self, raw: &[u8]) {
        let text = String::from_utf8_lossy(raw);
        let text = text.trim_end_matches(['\n', '\r']);
        if self.ended {
            return;
        }
        if !self.started {
            if text.ends_with(&self.start_marker) {
                self.started = true;
            } else {
                if let Some(pos) = text.find("gdr-vm: ") {
                    eprintln!("xtask: {}guest: {}", self.prefix, &text[pos + 8..]);
                }
                self.boot_log.push_str(text);
                self.boot_log.push('\n');
            }
            return;
        }
        if let Some(pos) = text.find(&self.end_prefix) {
            let rest = &text[pos + self.end_prefix.len()..];
            self.end_code = rest.trim_end_matches('@').parse().ok();
            self.ended = true;
            // Output printed without a final newline shares the marker's line.
            let before = &text[..pos];
            if !before.is_empty() {
                self.emit(before);
            }
            return;
        }
        self.emit(text);
    }

    fn emit(&mut self, text: &str) {
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "{}{text}", self.prefix);
        let _ = out.flush();
        self.output.push_str(text);
        self.output.push('\n');
    }
}

pub(crate) fn write(path: &Path, data: &[u8]) -> Result<()> {
    fs::write(path, data).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Removes `runs/<pid>` directories whose process is gone.
pub(crate) fn remove_stale_runs(runs: &Path) {
    let Ok(entries) = fs::read_dir(runs) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// An unpacked distribution kernel: the image and the modules the VM loads.
pub struct Kernel {
    pub version: String,
    pub vmlinuz: PathBuf,
    pub dir: PathBuf,
}

/// FNV-1a, 64 bit: a stable hash for cache keys (std's hasher is not stable across releases).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.iter().chain(&[0xff]) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The concrete kernel package that `linux-image-amd64` depends on, e.g.
/// `linux-image-6.1.0-57-amd64`.
fn kernel_package() -> Result<String> {
    let query = || -> Option<String> {
        let out = Command::new("apt-cache")
            .args(["depends", "linux-image-amd64"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
            let dep = l.trim().strip_prefix("Depends:")?.trim();
            (dep.starts_with("linux-image-") && !dep.starts_with('<')).then(|| dep.to_string())
        })
    };
    if let Some(p) = query() {
        return Ok(p);
    }
    setup::apt_update()?;
    query().ok_or_else(|| {
        "apt knows no linux-image-amd64 (Debian's kernel meta-package); the Soft-RoCE VM boots \
         Debian's 6.1 kernel, so it needs Debian 12's apt sources"
            .to_string()
    })
}

pub(crate) fn ensure_kernel(cache: &Path) -> Result<Kernel> {
    let package = kernel_package()?;
    let version = package
        .strip_prefix("linux-image-")
        .unwrap_or(&package)
        .to_string();
    let key = fnv1a(&[MODULES.join(",").as_bytes()]);
    let dir = cache.join(format!("kernel-{version}-{:08x}", key as u32));
    let kernel = Kernel {
        vmlinuz: dir.join("vmlinuz"),
        dir: dir.clone(),
        version: version.clone(),
    };
    if dir.join("modules.list").is_file() {
        return Ok(kernel);
    }

    let tmp = cache.join(format!("tmp-kernel-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let result = unpack_kernel(&package, &version, &tmp).and_then(|out| {
        match fs::rename(&out, &dir) {
            Ok(()) => Ok(()),
            // Another run got there first: use theirs.
            Err(_) if dir.join("modules.list").is_file() => Ok(()),
            Err(e) => Err(format!(
                "cannot move the kernel into {}: {e}",
                dir.display()
            )),
        }
    });
    let _ = fs::remove_dir_all(&tmp);
    result.map(|()| kernel)
}

/// Downloads and unpacks the kernel package under `tmp`; returns the finished cache directory
/// (still under `tmp`) holding `vmlinuz`, `modules/` and `modules.list`.
fn unpack_kernel(package: &str, version: &str, tmp: &Path) -> Result<PathBuf> {
    say!("downloading {package} (apt-get download; it is unpacked, not installed)");
    let download = || {
        run_quiet(
            Command::new("apt-get")
                .args(["download", "-q", package])
                .current_dir(tmp),
        )
    };
    if let Err(first) = download() {
        // A stale package list names a version the mirror no longer has.
        setup::apt_update()?;
        download().map_err(|e| format!("{first}\nafter apt-get update: {e}"))?;
    }
    let deb = fs::read_dir(tmp)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or("apt-get download left no .deb")?;
    say!(
        "unpacking {} (dpkg -x)",
        deb.file_name().unwrap_or_default().to_string_lossy()
    );
    let x = tmp.join("x");
    run_quiet(Command::new("dpkg").arg("-x").arg(&deb).arg(&x))?;

    let out = tmp.join("out");
    let mods_out = out.join("modules");
    fs::create_dir_all(&mods_out).map_err(|e| e.to_string())?;
    let vmlinuz = x.join("boot").join(format!("vmlinuz-{version}"));
    fs::copy(&vmlinuz, out.join("vmlinuz"))
        .map_err(|e| format!("{} missing from {package}: {e}", vmlinuz.display()))?;

    let moddir = x.join("lib/modules").join(version);
    let mut found = std::collections::HashMap::new();
    collect_modules(&moddir.join("kernel"), &mut found)?;
    let builtin = fs::read_to_string(moddir.join("modules.builtin")).unwrap_or_default();
    let mut list = String::new();
    for m in MODULES {
        let file = found
            .get(*m)
            .or_else(|| found.get(m.replace('_', "-").as_str()));
        match file {
            Some(path) => {
                fs::copy(path, mods_out.join(format!("{m}.ko"))).map_err(|e| e.to_string())?;
                list.push_str(m);
                list.push('\n');
            }
            None if builtin
                .lines()
                .any(|l| l.ends_with(&format!("/{m}.ko")) || l.ends_with(&format!("/{}.ko", m.replace('_', "-")))) => {}
            None => {
                return Err(format!(
                    "module {m}.ko is neither in {package} nor built in (compressed modules are not supported)"
                ))
            }
        }
    }
    write(&out.join("modules.list"), list.as_bytes())?;
    Ok(out)
}

fn collect_modules(
    dir: &Path,
    found: &mut std::collections::HashMap<String, PathBuf>,
) -> Result<()> {
    for e in fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let e = e.map_err(|e| e.to_string())?;
        let p = e.path();
        if e.file_type().map_err(|e| e.to_string())?.is_dir() {
            collect_modules(&p, found)?;
        } else if let Some(stem) = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".ko"))
        {
            found.insert(stem.to_string(), p.clone());
        }
    }
    Ok(())
}

/// The initramfs: `/init`, `/stage2.sh`, `/bin/busybox`, `/modules/*.ko`, `/modules.list`, and a
/// `/dev/console` node (so PID 1 starts with a console), written as a newc cpio archive.
pub(crate) fn ensure_initramfs(cache: &Path, kernel: &Kernel) -> Result<PathBuf> {
    let busybox_path = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .ok_or("no /bin/busybox: install busybox-static")?;
    let busybox = fs::read(busybox_path).map_err(|e| format!("{}: {e}", busybox_path.display()))?;
    if !elf_is_static(&busybox) {
        return Err(format!(
            "{} is dynamically linked: install busybox-static",
            busybox_path.display()
        ));
    }
    let list = fs::read_to_string(kernel.dir.join("modules.list")).map_err(|e| e.to_string())?;
    let key = fnv1a(&[
        INIT_SH.as_bytes(),
        STAGE2_SH.as_bytes(),
        CLUSTER_SH.as_bytes(),
        list.as_bytes(),
        &busybox.len().to_le_bytes(),
    ]);
    let path = cache.join(format!("initramfs-{}-{key:016x}.cpio", kernel.version));
    if path.is_file() {
        return Ok(path);
    }
    say!(
        "building the initramfs ({})",
        path.file_name().unwrap_or_default().to_string_lossy()
    );
    let mut cpio = Cpio::default();
    for d in ["bin", "dev", "modules", "proc", "sys", "host"] {
        cpio.dir(d);
    }
    cpio.char_dev("dev/console", 5, 1);
    cpio.file("init", 0o755, INIT_SH.as_bytes());
    cpio.file("stage2.sh", 0o644, STAGE2_SH.as_bytes());
    cpio.file("cluster.sh", 0o644, CLUSTER_SH.as_bytes());
    cpio.file("modules.list", 0o644, list.as_bytes());
    cpio.file("bin/busybox", 0o755, &busybox);
    for m in list.lines() {
        let data = fs::read(kernel.dir.join("modules").join(format!("{m}.ko")))
            .map_err(|e| e.to_string())?;
        cpio.file(&format!("modules/{m}.ko"), 0o644, &data);
    }
    let tmp = cache.join(format!("tmp-initramfs-{}", std::process::id()));
    write(&tmp, &cpio.finish())?;
    fs::rename(&tmp, &path).map_err(|e| format!("cannot move the initramfs into place: {e}"))?;
    Ok(path)
}

/// Whether an ELF64 file has no program interpreter (PT_INTERP), i.e. is statically linked.
fn elf_is_static(elf: &[u8]) -> bool {
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    if elf.get(..5) != Some(b"\x7fELF\x02") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    (0..usize::from(phnum)).all(|i| {
        let off = phoff as usize + i * usize::from(phentsize);
        u32_at(off).is_some_and(|t| t != 3)
    })
}

/// A minimal writer for the "newc" cpio format the kernel unpacks as initramfs.
#[derive(Default)]
struct Cpio {
    data: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), body: &[u8]) {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            if mode & 0o170000 == 0o040000 { 2 } else { 1 },
            0, // mtime
            body.len() as u32,
            0, // dev major
            0, // dev minor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0, // check
        ];
        self.data.extend_from_slice(b"070701");
        for f in fields {
            self.data.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.data.extend_from_slice(name.as_bytes());
        self.data.push(0);
        self.pad();
        self.data.extend_from_slice(body);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.data.len().is_multiple_of(4) {
            self.data.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, perm: u32, body: &[u8]) {
        self.entry(name, 0o100000 | perm, (0, 0), body);
    }

    fn char_dev(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020600, (major, minor), &[]);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.data
    }
}

/// The guest kernel's command line; `GDR_VM_APPEND` adds to it (for measurement experiments,
/// e.g. `idle=poll`).
///
/// `tsc=reliable`: under TCG the kernel's TSC synchronisation check fails ("TSCs
/// unsynchronized", the emulated vCPUs are too slow for it) and it falls back to the HPET, whose
/// every read is an emulated MMIO access under QEMU's global lock: ~7 % of a latency run's CPU
/// went to `read_hpet`. QEMU derives every vCPU's TSC from one host clock, so it is in fact
/// synchronised; with it the guest clock costs a few instructions.
///
/// `init_on_alloc=0`: Debian's kernel zeroes every slab allocation by default; Soft-RoCE
/// allocates a socket buffer per packet, and that memset was ~7.5 % of a 64 KiB write-bandwidth
/// run (perf in the VM: `rxe_init_packet` -> `__alloc_skb` -> `memset_erms`). The test VM does
/// not need the hardening; every tool measured in it gains the same.
pub(crate) fn kernel_cmdline() -> String {
    let base = "console=ttyS0 quiet loglevel=0 panic=-1 tsc=reliable init_on_alloc=0";
    match std::env::var("GDR_VM_APPEND") {
        Ok(extra) if !extra.trim().is_empty() => format!("{base} {}", extra.trim()),
        _ => base.to_string(),
    }
}

/// Starts the two threads that read a guest's QEMU: one feeds its stdout to `console` line by
/// line, the other reads its stderr whole (returned when joined).
pub fn read_guest_output(
    child: &mut std::process::Child,
    console: &Arc<Mutex<Console>>,
) -> (thread::JoinHandle<()>, thread::JoinHandle<String>) {
    let stdout = child.stdout.take().expect("piped stdout");
    let c = Arc::clone(console);
    let reader = thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => c.lock().expect("console lock").line(&line),
            }
        }
    });
    let mut stderr = child.stderr.take().expect("piped stderr");
    let err_reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    (reader, err_reader)
}
