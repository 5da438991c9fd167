//! `cargo xtask gpu-bundle`: the GPU tier's binaries, for the GPU machine (README, "The GPU
//! machine": one H200, no RDMA device, no Rust toolchain).
//!
//! Test targets named `gpu_*` (any package) hold the GPU tests, and bench targets named `gpu_*`
//! the GPU measurements (built optimized: numbers come from benchmarks, not timed tests). They are
//! built here, copied into `gpu-bundle/` with the `gdr` binary and the examples, and run there by
//! `gpu-bundle/run.sh`.
//! So is the Python binding: its wheel (built as `cargo xtask py-test` builds it) unpacked into
//! `gpu-bundle/python/`, and `gdr-py/tests/test_gpu.py` run with the machine's Python (which has
//! torch with CUDA), under pytest where installed.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::{cargo, say, Result};

pub fn gpu_bundle() -> Result<()> {
    crate::setup::ensure_packages()?;
    let root = cargo::workspace_root();
    let bundle = root.join("gpu-bundle");

    say!("building the test binaries (gpu_* targets are bundled)");
    // Every feature: GPU tests behind one (gpu_cudarc needs `cudarc`) are bundled too.
    let tests: Vec<_> = cargo::build(&["test", "--workspace", "--all-features", "--no-run"])?
        .into_iter()
        .filter(|a| a.test && a.name.starts_with("gpu_"))
        .collect();
    say!("building the benchmarks (gpu_* bench targets, optimized)");
    let benches: Vec<_> = cargo::build(&[
        "bench",
        "--workspace",
        "--all-features",
        "--no-run",
        "--bench",
        "gpu_*",
    ])?
    .into_iter()
    .filter(|a| a.kind == "bench" && a.name.starts_with("gpu_"))
    .collect();
    say!("building the gdr binary and the examples");
    let tools: Vec<_> = cargo::build(&[
        "build",
        "--workspace",
        "--exclude",
        "xtask",
        "--bins",
        "--examples",
    ])?
    .into_iter()
    .filter(|a| !a.test && (a.kind == "bin" || a.kind == "example"))
    .collect();

    say!("building the Python wheel (gdr-py)");
    let wheel = crate::py_test::build_wheel("python3")?;

    let _ = fs::remove_dir_all(&bundle);
    for d in ["tests", "benches", "bin", "examples", "python"] {
        fs::create_dir_all(bundle.join(d))
            .map_err(|e| format!("cannot create gpu-bundle/{d}: {e}"))?;
    }
    let mut lines = String::new();
    for t in &tests {
        let name = format!("{}--{}", t.package, t.name);
        copy(&t.executable, &bundle.join("tests").join(&name))?;
        lines.push_str(&format!("run_one {name} {}\n", shell_dir(&root, t)));
    }
    for b in &benches {
        let name = format!("{}--{}", b.package, b.name);
        copy(&b.executable, &bundle.join("benches").join(&name))?;
        lines.push_str(&format!("run_bench {name} {}\n", shell_dir(&root, b)));
    }
    for t in &tools {
        let sub = if t.kind == "bin" { "bin" } else { "examples" };
        let file = t
            .executable
            .file_name()
            .ok_or("executable without a name")?;
        copy(&t.executable, &bundle.join(sub).join(file))?;
    }
    // The wheel is a zip of the package: unpacked, it is importable with PYTHONPATH (the abi3
    // module loads in any CPython >= 3.11), no pip needed there.
    let unzip = Command::new(&wheel.python)
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel.path)
        .arg(bundle.join("python"))
        .status()
        .map_err(|e| format!("cannot unpack the wheel: {e}"))?;
    if !unzip.success() {
        return Err(format!(
            "unpacking {} failed ({unzip})",
            wheel.path.display()
        ));
    }
    lines.push_str("run_python gdr-py/tests/test_gpu.py\n");
    let script = RUN_SH.replace("@RUN_LINES@\n", &lines);
    let run_sh = bundle.join("run.sh");
    fs::write(&run_sh, script).map_err(|e| format!("cannot write {}: {e}", run_sh.display()))?;
    set_executable(&run_sh)?;

    let size = dir_size(&bundle);
    say!(
        "gpu-bundle/: {} gpu_* test binaries, {} gpu_* benchmarks, {} binaries and examples, the Python package, {:.1} MiB (debug info stripped)",
        tests.len(),
        benches.len(),
        tools.len(),
        size as f64 / (1024.0 * 1024.0)
    );
    if size > CARRY_LIMIT {
        say!("WARNING: that is over the 64 MiB the `run` tool carries");
    }
    for t in tests.iter().chain(&benches) {
        say!("  {}", t.label());
    }
    say!("run it on the GPU machine with the `run` tool:");
    say!("  command: bash gpu-bundle/run.sh    carry: [\"gpu-bundle\"]");
    say!("  (logs come back under $OUT/gpu-tests/)");
    Ok(())
}

/// The artifact's package directory relative to the workspace root, quoted for the shell.
fn shell_dir(root: &Path, a: &cargo::Artifact) -> String {
    let dir = a.package_dir.strip_prefix(root).unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    crate::vm::shell_quote(&dir.to_string_lossy())
}

/// What the `run` tool carries to the GPU machine at most.
const CARRY_LIMIT: u64 = 64 * 1024 * 1024;

/// Copies an executable without its debug info (debug builds are mostly DWARF; the symbol table
/// stays, so backtraces keep function names). Falls back to a plain copy without `strip`.
fn copy(from: &Path, to: &Path) -> Result<()> {
    let stripped = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(to)
        .arg(from)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if stripped {
        return Ok(());
    }
    fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))
}

fn dir_size(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

fn set_executable(p: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Generated by `cargo xtask gpu-bundle`: runs the GPU tier (test targets named gpu_*, the
# benchmarks named gpu_*, then the Python binding's GPU tests) on the GPU machine, from the
# repository root of a copy of the working tree, with gpu-bundle/ carried along. Each test binary
# runs with --ignored --test-threads=1 in its package's directory, each benchmark with --bench
# there (its numbers also go to $OUT); the Python tests run with the machine's python3
# (pytest -m gpu where pytest is installed, else the file's own runner) and the package from
# gpu-bundle/python. Logs go to $OUT/gpu-tests/ (or gpu-bundle/out/ without $OUT). Exits
# non-zero when anything fails.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
logs="${OUT:-$here/out}/gpu-tests"
mkdir -p "$logs"
export LD_LIBRARY_PATH="/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Tests that need the gdr binary or an example should look here at run time: the paths compiled
# into them (CARGO_BIN_EXE_*) name the build machine's target directory.
export GDR_BUNDLE="$here" GDR_BIN="$here/bin/gdr" GDR_EXAMPLES_DIR="$here/examples"
export PATH="$here/bin:$here/examples:$PATH"
export RUST_BACKTRACE=1

{
    echo "host: $(hostname)  date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
} | tee "$logs/machine.txt"

failed=0
ran=0
run_one() {
    local name=$1 dir=$2 rc
    echo
    echo "==== $name ===="
    (cd "$root/$dir" && CARGO_MANIFEST_DIR="$root/$dir" "$here/tests/$name" --ignored --test-threads=1) 2>&1 |
        tee "$logs/$name.log"
    rc=${PIPESTATUS[0]}
    echo "==== exit $rc: $name ====" | tee -a "$logs/$name.log"
    echo "$name $rc" >>"$logs/summary.txt"
    ran=$((ran + 1))
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

run_bench() {
    local name=$1 dir=$2 rc
    echo
    echo "==== $name (benchmark) ===="
    # A test target may have the same name: the log and the summary line say "bench".
    (cd "$root/$dir" && "$here/benches/$name" --bench) 2>&1 | tee "$logs/$name--bench.log"
    rc=${PIPESTATUS[0]}
    echo "==== exit $rc: $name (benchmark) ====" | tee -a "$logs/$name--bench.log"
    echo "$name--bench $rc" >>"$logs/summary.txt"
    ran=$((ran + 1))
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

run_python() {
    local file=$1 name rc
    name="python--$(basename "$file" .py)"
    echo
    echo "==== $name ===="
    (
        cd "$root" || exit 1
        export PYTHONPATH="$here/python" PYTHONDONTWRITEBYTECODE=1
        if python3 -c "import pytest" 2>/dev/null; then
            python3 -m pytest -p no:cacheprovider -v -s -m gpu "$file"
        else
            python3 "$file"
        fi
    ) 2>&1 | tee "$logs/$name.log"
    rc=${PIPESTATUS[0]}
    echo "==== exit $rc: $name ====" | tee -a "$logs/$name.log"
    echo "$name $rc" >>"$logs/summary.txt"
    ran=$((ran + 1))
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

: >"$logs/summary.txt"
@RUN_LINES@
if [ "$ran" -eq 0 ]; then
    echo "no gpu_* test binaries in this bundle" | tee -a "$logs/summary.txt"
fi
echo "gpu tier: $ran binaries, $failed failed" | tee -a "$logs/summary.txt"
[ "$failed" -eq 0 ]
"#;
