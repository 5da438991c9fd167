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

/// The built wheel and the virtual environment it is installed in.
pub struct Wheel {
    /// The venv's Python.
    pub python: PathBuf,
    /// The `.whl` file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// How long `maturin build --release` took.
    pub build_time: std::time::Duration,
}

/// Installs the system packages it needs when missing (`cargo xtask setup`'s list), creates the
/// venv under `target/py` (maturin, numpy, pytest, mypy) when needed, builds the
/// abi3 wheel into `target/py/wheels` and installs it there. Runs from the workspace root.
pub fn build_wheel(base_python: &str) -> Result<Wheel> {
    // python3-venv, and protoc for the wheel's etcd client, on a fresh machine too.
    crate::setup::ensure_packages()?;
    let meta = cargo::metadata()?;
    let root = meta.root.clone();
    std::env::set_current_dir(&root).map_err(|e| e.to_string())?;
    let dir = meta.target_dir.join("py");
    let venv = dir.join("venv");
    let wheels = dir.join("wheels");
    let python = venv.join("bin/python");
    let maturin = venv.join("bin/maturin");

    if !python.exists() {
        say!("creating {} ({base_python} -m venv)", venv.display());
        run(
            "python -m venv",
            Command::new(base_python).args(["-m", "venv"]).arg(&venv),
        )?;
    }
    let ready = works(Command::new(&maturin).arg("--version"))
        && works(Command::new(&python).args(["-c", "import numpy, pytest, mypy"]));
    if !ready {
        say!("installing maturin, numpy, pytest and mypy into the venv (pip)");
        run(
            "pip install",
            Command::new(&python).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "maturin>=1.5,<2",
                "numpy",
                "pytest",
                "mypy",
            ]),
        )?;
    }

    // The wheel: only this build's in the folder, so the one found is the one built.
    std::fs::create_dir_all(&wheels).map_err(|e| format!("{}: {e}", wheels.display()))?;
    for old in wheel_files(&wheels)? {
        let _ = std::fs::remove_file(old);
    }
    say!("building the wheel: maturin build --release -m gdr-py/Cargo.toml");
    let started = Instant::now();
    run(
        "maturin build",
        Command::new(&maturin)
            .args(["build", "--release", "-m", "gdr-py/Cargo.toml", "-o"])
            .arg(&wheels),
    )?;
    let build_time = started.elapsed();
    let wheel = match wheel_files(&wheels)?.as_slice() {
        [one] => one.clone(),
        other => {
            return Err(format!(
                "expected one wheel in {}, found {other:?}",
                wheels.display()
            ))
        }
    };
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

/// The Python tier, as `cargo xtask test` runs it: whether it passed, and the tests passed and
/// failed (host and VM pytest together; a build or setup failure counts as one failed test).
pub fn tier(opts: &PyTestOpts) -> Result<(bool, u64, u64)> {
    let Wheel {
        python,
        path: wheel,
        size,
        build_time,
    } = build_wheel(&opts.python)?;

    say!("host pytest (-m \"not device and not gpu and not hw\")");
    let host = Command::new(&python)
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

    let name = wheel
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    say!(
        "wheel {name}: {size} bytes ({:.2} MiB), built in {:.1} s (maturin build --release)",
        size as f64 / (1024.0 * 1024.0),
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
    let ok = host_ok && vm_ok;
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
