//! `cargo xtask cluster`: several Soft-RoCE hosts with several rails each (README, "The
//! cluster tier: several hosts, several rails, faults"), and faults on demand.
//!
//! Every host is its own QEMU/TCG guest booted from the same kernel and initramfs as the VM
//! (vm.rs), with `gdr.stage2=cluster gdr.host=<h>` on its command line so that its init runs
//! guest/cluster.sh instead of the VM's stage 2. Each rail is one L2 segment shared by all hosts:
//! this process runs a small learning switch per rail on a free 127.0.0.1 port (hub.rs), and
//! every host's NIC of that rail joins it with `-netdev socket,connect=127.0.0.1:PORT`. Inside,
//! the NIC of rail `r` is `eth<r>` with `10.78.<r>.<h>/24` and `rxe<r>` on it. Those addresses
//! exist only inside the guests.
//!
//! All hosts share one writable results directory (`target/softroce/runs/cluster-<pid>/`,
//! `/run/gdr-vm/results` inside): the scenario, the per-host exit codes, the start barrier and the
//! fault requests go through it. `gdr-fault` (guest/gdr-fault.sh, on the guests' PATH) drops a
//! request file: link and power faults into `req/`, which this process polls and carries out
//! through each QEMU's monitor (`set_link`) or by killing the QEMU; netem requests into the
//! target host's `inbox.host<h>/`, which that host's fault watcher (cluster.sh) runs with `tc`.

use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::vm::{self, shell_quote, shell_words, Console};
use crate::{cargo, say, setup, Result};

/// The fault helper the scenario calls (copied to `bin/gdr-fault` in the results share).
const GDR_FAULT_SH: &str = include_str!("guest/gdr-fault.sh");

/// Exit code when the run is killed by the timeout (as timeout(1)).
const TIMEOUT_EXIT: i32 = 124;

/// The most hosts: each guest takes `--mem` MiB and a share of the machine's cores.
const MAX_HOSTS: u32 = 8;

mod hub;

/// Options of `cargo xtask cluster`.
#[derive(clap::Args, Clone, Debug)]
pub struct ClusterOpts {
    /// Number of hosts (guests).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=MAX_HOSTS as i64))]
    pub hosts: u32,
    /// Rails (NICs with an rxe device each) per host.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub rails: u32,
    /// Kill every host after this many seconds (boot included).
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    pub timeout: u64,
    /// Once a host's command has failed, kill the others after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub grace: u64,
    /// Memory of each guest, MiB.
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    pub mem: u32,
    /// Locked-memory limit for the command on each host: KiB or `unlimited`.
    #[arg(long, value_name = "KIB|unlimited", default_value = "unlimited")]
    pub memlock: String,
}

/// How one host's run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum HostEnd {
    /// The command exited with this code.
    Exited(i32),
    /// Powered off by `gdr-fault kill` (not a failure by itself).
    KilledByFault,
    /// Still running at the timeout, or when another host failed and the grace period ended.
    Killed(&'static str),
    /// The guest stopped without reporting an exit code.
    Lost,
}

impl HostEnd {
    fn ok(&self) -> bool {
        matches!(self, HostEnd::Exited(0) | HostEnd::KilledByFault)
    }
}

/// What a cluster run left behind.
pub struct ClusterOutcome {
    /// Per host (index 0 is host 1).
    pub ends: Vec<HostEnd>,
    /// Per host: the command's output, `\r` removed, without the `[hostN]` prefix.
    pub outputs: Vec<String>,
    /// The exit code of the whole run: 0 if every host succeeded, 124 on timeout, else 1.
    pub code: i32,
}

/// `cargo xtask cluster -- <command...>`: the same command on every host.
pub fn run_command(opts: &ClusterOpts, argv: &[String]) -> Result<i32> {
    let script = format!("exec {}\n", shell_words(argv));
    Ok(boot(opts, &script)?.code)
}

/// Boots the cluster and runs `script` (POSIX sh) on every host; see the module docs.
pub fn boot(opts: &ClusterOpts, script: &str) -> Result<ClusterOutcome> {
    if opts.memlock != "unlimited" && !opts.memlock.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "--memlock {}: expected KiB or `unlimited`",
            opts.memlock
        ));
    }
    setup::ensure_packages()?;
    let cwd = std::env::current_dir().map_err(|e| format!("no current directory: {e}"))?;
    let meta = cargo::metadata()?;
    for p in [&cwd, &meta.target_dir] {
        if ["/tmp", "/run", "/proc", "/sys", "/dev"]
            .iter()
            .any(|d| p.starts_with(d))
        {
            return Err(format!(
                "{} is under a directory that the guests replace with a fresh one; work from elsewhere",
                p.display()
            ));
        }
    }
    let cache = meta.target_dir.join("softroce");
    fs::create_dir_all(&cache).map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    let kernel = vm::ensure_kernel(&cache)?;
    let initramfs = vm::ensure_initramfs(&cache, &kernel)?;
    let runs = cache.join("runs");
    vm::remove_stale_runs(&runs);
    remove_stale_cluster_runs(&runs);
    let run_dir = runs.join(format!("cluster-{}", std::process::id()));
    let _ = fs::remove_dir_all(&run_dir);
    for d in ["bin", "req"] {
        fs::create_dir_all(run_dir.join(d))
            .map_err(|e| format!("cannot create {}: {e}", run_dir.display()))?;
    }
    let result = run(opts, script, &cwd, &kernel, &initramfs, &run_dir);
    let _ = fs::remove_dir_all(&run_dir);
    result
}

fn remove_stale_cluster_runs(runs: &Path) {
    let Ok(entries) = fs::read_dir(runs) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|s| s.strip_prefix("cluster-"))
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// The QEMU processes; killed (and reaped) when dropped, whatever way the run ends.
struct Guests(Vec<Option<Child>>);

impl Drop for Guests {
    fn drop(&mut self) {
        for c in self.0.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn mac(rail: u32, host: u32) -> String {
    format!("52:54:00:78:{rail:02x}:{host:02x}")
}

fn utc_now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let s = d.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        d.subsec_millis()
    )
}

fn run(
    opts: &ClusterOpts,
    script: &str,
    cwd: &Path,
    kernel: &vm::Kernel,
    initramfs: &Path,
    run_dir: &Path,
) -> Result<ClusterOutcome> {
    let n = opts.hosts;
    let nonce = prepare_run_dir(opts, script, cwd, run_dir)?;
    // One switch per rail; every host's NIC of that rail connects to it. Declared before the
    // guests so that it outlives them (dropped after them).
    let hubs = (0..opts.rails)
        .map(|r| hub::Hub::start().map_err(|e| format!("cannot start rail {r}'s switch: {e}")))
        .collect::<Result<Vec<_>>>()?;
    say!(
        "booting a cluster of {n} host(s) x {} rail(s) (kernel {}, timeout {} s, {} MiB and 1 vCPU each)",
        opts.rails,
        kernel.version,
        opts.timeout,
        opts.mem
    );
    let start = Instant::now();
    let mut guests = Guests(Vec::new());
    let mut hosts = Vec::new();
    for h in 1..=n {
        let (child, io) = boot_host(h, opts, kernel, initramfs, run_dir, &hubs, &nonce)?;
        guests.0.push(Some(child));
        hosts.push(io);
    }
    let mut ends: Vec<Option<HostEnd>> = vec![None; n as usize];
    let timed_out = watch(opts, run_dir, &mut guests, &mut ends, &hosts, start);
    if timed_out {
        let names = running_names(&ends);
        eprintln!(
            "xtask: TIMEOUT: the cluster was still running after {} s; killed {names} \
             (the scenario hung, or needs more time: --timeout SECS)",
            opts.timeout
        );
        for (i, e) in ends.iter_mut().enumerate() {
            if e.is_none() {
                *e = Some(HostEnd::Killed("timeout"));
            }
            if let Some(mut c) = guests.0[i].take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    // Hosts that reported a code may still be powering off: give them a moment, then kill.
    let t = Instant::now();
    for child in guests.0.iter_mut().flatten() {
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
    drop(guests);
    drop(hubs);
    let ends: Vec<HostEnd> = ends
        .into_iter()
        .map(|e| e.unwrap_or(HostEnd::Lost))
        .collect();
    let outputs = collect_outputs(hosts, &ends)?;
    let code = verdict(&ends, timed_out, start);
    Ok(ClusterOutcome {
        ends,
        outputs,
        code,
    })
}

/// Writes the run directory's files every host reads (the environment, the scenario, the
/// `gdr-fault` tool); returns the run's nonce (the console markers carry it).
fn prepare_run_dir(opts: &ClusterOpts, script: &str, cwd: &Path, run_dir: &Path) -> Result<String> {
    let n = opts.hosts;
    let nonce = format!(
        "{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let cwd_str = cwd
        .to_str()
        .ok_or_else(|| format!("the current directory is not UTF-8: {}", cwd.display()))?;
    let env = [
        ("GDR_VM_MEMLOCK", opts.memlock.clone()),
        ("GDR_VM_CWD", cwd_str.to_string()),
        ("GDR_VM_NONCE", nonce.clone()),
        ("GDR_VM_TERM", "dumb".to_string()),
        ("GDR_HOSTS", n.to_string()),
        ("GDR_RAILS", opts.rails.to_string()),
        ("GDR_CLUSTER_BARRIER", opts.timeout.min(300).to_string()),
    ]
    .iter()
    .map(|(k, v)| format!("{k}={}\n", shell_quote(v)))
    .collect::<String>();
    vm::write(&run_dir.join("env"), env.as_bytes())?;
    vm::write(&run_dir.join("cmd.sh"), script.as_bytes())?;
    let fault = run_dir.join("bin/gdr-fault");
    vm::write(&fault, GDR_FAULT_SH.as_bytes())?;
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&fault, fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", fault.display()))?;
    }

    Ok(nonce)
}

/// What is read from one host while it runs: its console (parsed from QEMU's stdout by a
/// reader thread) and QEMU's stderr (read whole by another).
struct HostIo {
    console: Arc<Mutex<Console>>,
    reader: thread::JoinHandle<()>,
    err_reader: thread::JoinHandle<String>,
}

/// Starts host `h` (1-based): QEMU with the kernel and initramfs, the host's root and the run
/// directory shared, one NIC per rail on that rail's switch.
fn boot_host(
    h: u32,
    opts: &ClusterOpts,
    kernel: &vm::Kernel,
    initramfs: &Path,
    run_dir: &Path,
    hubs: &[hub::Hub],
    nonce: &str,
) -> Result<(Child, HostIo)> {
    let run_str = run_dir
        .to_str()
        .ok_or("the target directory is not UTF-8")?;
    let mut qemu = Command::new("setpriv");
    // The guest dies with us even if we are killed outright (SIGKILL).
    qemu.args(["--pdeathsig", "SIGKILL", "--", "qemu-system-x86_64"])
        .args(["-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "1"])
        .arg("-m")
        .arg(opts.mem.to_string())
        .args(["-nographic", "-nic", "none", "-no-reboot"])
        .arg("-name")
        .arg(format!("gdr-host{h}"))
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .arg("-append")
        .arg(format!(
            "{} gdr.stage2=cluster gdr.host={h}",
            vm::kernel_cmdline()
        ))
        .arg("-virtfs")
        .arg("local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=results,security_model=none,multidevs=remap",
            run_str.replace(',', ",,")
        ))
        .arg("-monitor")
        .arg(format!(
            "unix:{run_str}/mon.host{h}.sock,server=on,wait=off"
        ));
    for (r, hub) in hubs.iter().enumerate() {
        qemu.arg("-netdev")
            .arg(format!("socket,id=r{r},connect=127.0.0.1:{}", hub.port()))
            .arg("-device")
            .arg(format!(
                "virtio-net-pci,netdev=r{r},mac={}",
                mac(r as u32, h)
            ));
    }
    qemu.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = qemu
        .spawn()
        .map_err(|e| format!("cannot start qemu-system-x86_64 (through setpriv): {e}"))?;
    let console = Arc::new(Mutex::new(Console::with_prefix(
        &format!("{nonce}-h{h}"),
        &format!("[host{h}] "),
    )));
    let (reader, err_reader) = vm::read_guest_output(&mut child, &console);
    Ok((
        child,
        HostIo {
            console,
            reader,
            err_reader,
        },
    ))
}

/// Watches the hosts until every one has ended, a failed host's grace time ran out (the others
/// are killed), or the cluster's timeout passed (returns true; the caller kills the rest).
/// Faults the scenario asks for (`gdr-fault`) are carried out meanwhile.
fn watch(
    opts: &ClusterOpts,
    run_dir: &Path,
    guests: &mut Guests,
    ends: &mut [Option<HostEnd>],
    hosts: &[HostIo],
    start: Instant,
) -> bool {
    let n = ends.len();
    let fault_log = run_dir.join("faults.log");
    let mut failed_at: Option<Instant> = None;
    let timeout = Duration::from_secs(opts.timeout);
    let grace = Duration::from_secs(opts.grace);
    loop {
        for i in 0..n {
            if ends[i].is_some() {
                continue;
            }
            let exited = matches!(
                guests.0[i].as_mut().map(|c| c.try_wait()),
                Some(Ok(Some(_)) | Err(_))
            );
            // A reported exit code counts as soon as it is there (the guest still powers off).
            let code = fs::read_to_string(run_dir.join(format!("exit.host{}", i + 1)))
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok());
            if exited || code.is_some() {
                if exited {
                    if let Some(mut c) = guests.0[i].take() {
                        let _ = c.wait();
                    }
                }
                let code = code.or_else(|| {
                    if exited {
                        hosts[i].console.lock().expect("console lock").end_code
                    } else {
                        None
                    }
                });
                match code {
                    Some(c) => ends[i] = Some(HostEnd::Exited(c)),
                    None if exited => ends[i] = Some(HostEnd::Lost),
                    None => {}
                }
                if let Some(e) = &ends[i] {
                    if !e.ok() && failed_at.is_none() {
                        failed_at = Some(Instant::now());
                    }
                }
            }
        }
        handle_faults(run_dir, guests, ends, start, &fault_log);
        if ends.iter().all(Option::is_some) {
            break;
        }
        if start.elapsed() >= timeout {
            return true;
        }
        if failed_at.is_some_and(|t| t.elapsed() >= grace) {
            let names = running_names(ends);
            say!(
                "a host failed {} s ago; killing the hosts still running: {names}",
                opts.grace
            );
            for (i, e) in ends.iter_mut().enumerate() {
                if e.is_none() {
                    *e = Some(HostEnd::Killed("another host failed"));
                    if let Some(mut c) = guests.0[i].take() {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                }
            }
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Joins the hosts' reader threads and returns each host's output; a lost host's boot log and
/// QEMU's complaints are printed.
fn collect_outputs(hosts: Vec<HostIo>, ends: &[HostEnd]) -> Result<Vec<String>> {
    let mut outputs = Vec::new();
    for (i, host) in hosts.into_iter().enumerate() {
        let _ = host.reader.join();
        let stderr = host.err_reader.join().unwrap_or_default();
        let c = Arc::try_unwrap(host.console)
            .map_err(|_| "console still shared")?
            .into_inner()
            .expect("console lock");
        if ends[i] == HostEnd::Lost {
            if !c.started {
                eprintln!("xtask: host{}'s console up to here:", i + 1);
                eprint!("{}", c.boot_log);
            }
            if !stderr.trim().is_empty() {
                eprintln!("xtask: host{}'s QEMU said:\n{}", i + 1, stderr.trim_end());
            }
        }
        outputs.push(c.output);
    }
    Ok(outputs)
}

/// Says how each host ended and the cluster's verdict; returns the exit code (0, 1, or
/// [`TIMEOUT_EXIT`]).
fn verdict(ends: &[HostEnd], timed_out: bool, start: Instant) -> i32 {
    let secs = start.elapsed().as_secs_f64();
    let mut failed = Vec::new();
    for (i, e) in ends.iter().enumerate() {
        let what = match e {
            HostEnd::Exited(c) => format!("exited with {c}"),
            HostEnd::KilledByFault => "powered off by gdr-fault kill".to_string(),
            HostEnd::Killed(why) => format!("killed ({why})"),
            HostEnd::Lost => "stopped without reporting an exit code".to_string(),
        };
        say!("host{}: {what}", i + 1);
        if !e.ok() {
            failed.push(format!("host{}", i + 1));
        }
    }
    let code = if timed_out {
        TIMEOUT_EXIT
    } else if failed.is_empty() {
        0
    } else {
        1
    };
    if failed.is_empty() {
        say!("cluster finished in {secs:.1} s; every host succeeded");
    } else {
        say!(
            "cluster finished in {secs:.1} s; FAILED on {}",
            failed.join(", ")
        );
    }
    code
}

fn running_names(ends: &[Option<HostEnd>]) -> String {
    let v: Vec<String> = ends
        .iter()
        .enumerate()
        .filter(|(_, e)| e.is_none())
        .map(|(i, _)| format!("host{}", i + 1))
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// Carries out the link and power requests that `gdr-fault` left in `req/`.
fn handle_faults(
    run_dir: &Path,
    guests: &mut Guests,
    ends: &mut [Option<HostEnd>],
    start: Instant,
    log: &Path,
) {
    let Ok(entries) = fs::read_dir(run_dir.join("req")) else {
        return;
    };
    let mut reqs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "req"))
        .collect();
    reqs.sort();
    for req in reqs {
        let text = fs::read_to_string(&req).unwrap_or_default();
        let _ = fs::remove_file(&req);
        let words: Vec<&str> = text.split_whitespace().collect();
        let result = fault(run_dir, guests, ends, &words);
        let res = match &result {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error: {e}"),
        };
        let line = format!(
            "{} (+{:.3} s) {}: {res}",
            utc_now(),
            start.elapsed().as_secs_f64(),
            words.join(" ")
        );
        say!("fault {line}");
        if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(log) {
            let _ = writeln!(f, "{line}");
        }
        let done = req.with_extension("done");
        let tmp = req.with_extension("donetmp");
        if fs::write(&tmp, format!("{res}\n")).is_ok() {
            let _ = fs::rename(&tmp, &done);
        }
    }
}

fn fault(
    run_dir: &Path,
    guests: &mut Guests,
    ends: &mut [Option<HostEnd>],
    words: &[&str],
) -> Result<()> {
    let host = |s: &str| -> Result<usize> {
        let h: usize = s.parse().map_err(|_| format!("bad host {s:?}"))?;
        if h == 0 || h > ends.len() {
            return Err(format!("no host {h} (hosts are 1..={})", ends.len()));
        }
        Ok(h)
    };
    match words {
        ["kill", h] => {
            let h = host(h)?;
            let Some(mut c) = guests.0[h - 1].take() else {
                return Err(format!("host{h} is not running"));
            };
            let _ = c.kill();
            let _ = c.wait();
            if ends[h - 1].is_none() {
                ends[h - 1] = Some(HostEnd::KilledByFault);
            }
            Ok(())
        }
        [what @ ("link-down" | "link-up"), h, r] => {
            let h = host(h)?;
            let r: u32 = r.parse().map_err(|_| format!("bad rail {r:?}"))?;
            if guests.0[h - 1].is_none() {
                return Err(format!("host{h} is not running"));
            }
            let on = if *what == "link-up" { "on" } else { "off" };
            let reply = monitor(
                &run_dir.join(format!("mon.host{h}.sock")),
                &format!("set_link r{r} {on}"),
            )?;
            if reply.trim().is_empty() {
                Ok(())
            } else {
                Err(format!("QEMU: {}", reply.trim()))
            }
        }
        _ => Err(format!("unknown request {:?}", words.join(" "))),
    }
}

/// Sends one command to a QEMU human monitor and returns its reply (empty on success for most).
fn monitor(sock: &Path, cmd: &str) -> Result<String> {
    let mut s = UnixStream::connect(sock)
        .map_err(|e| format!("cannot reach the monitor {}: {e}", sock.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let read_prompt = |s: &mut UnixStream| -> Result<String> {
        let mut buf = Vec::new();
        let mut b = [0u8; 512];
        while !buf.ends_with(b"(qemu) ") {
            let k = s
                .read(&mut b)
                .map_err(|e| format!("monitor {}: {e}", sock.display()))?;
            if k == 0 {
                return Err(format!("monitor {} closed", sock.display()));
            }
            buf.extend_from_slice(&b[..k]);
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    read_prompt(&mut s)?;
    s.write_all(format!("{cmd}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let reply = read_prompt(&mut s)?;
    // The monitor echoes the command line (with terminal escapes) before the reply.
    let mut out = String::new();
    for l in reply.lines() {
        let l = l.trim_end_matches('\r');
        if l.contains(cmd) || l.starts_with("(qemu)") || l.contains('\x1b') {
            continue;
        }
        let _ = writeln!(out, "{l}");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rail_macs_encode_rail_and_host() {
        // cluster.sh finds each rail's NIC by this MAC.
        assert_eq!(mac(1, 2), "52:54:00:78:01:02");
        assert_eq!(mac(0, 1), "52:54:00:78:00:01");
    }

    #[test]
    fn a_host_powered_off_by_a_fault_is_not_a_failure() {
        assert!(HostEnd::Exited(0).ok());
        assert!(HostEnd::KilledByFault.ok());
        assert!(!HostEnd::Exited(3).ok());
        assert!(!HostEnd::Killed("timeout").ok());
        assert!(!HostEnd::Lost.ok());
    }
}
