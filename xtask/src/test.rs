//! `cargo xtask test`: all host tests and the README's downstream crates (`cargo xtask
//! downstream`, counted as one test; the whole programs among them also run in the VM, one test
//! each), the fuzz smoke run (`crate::fuzz::smoke`, one test per
//! target, skipped without nightly or cargo-fuzz), then every device test inside one VM boot, then
//! the cluster tier (`cluster_*` test targets on a 2-host x 2-rail cluster, `cluster3_*` on 3 hosts; cluster.rs).
//!
//! Device tests are `#[ignore]`d on the host and run in the VM with `--ignored --test-threads=1`.
//! Test targets named `gpu_*` are the GPU tier: they run on the GPU machine (`cargo xtask
//! gpu-bundle`), not here.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::Instant;

use crate::vm::{self, shell_quote, shell_words, VmOpts};
use crate::{cargo, say, Result};

#[derive(clap::Args)]
pub struct TestOpts {
    #[command(flatten)]
    vm: VmOpts,
    /// Only the device tests in the VM (skip the host tests).
    #[arg(long, conflicts_with = "host_only")]
    vm_only: bool,
    /// Only the host tests (no VM).
    #[arg(long)]
    host_only: bool,
    /// Skip the cluster tier (`cluster_*` test targets on a 2-host x 2-rail cluster), which runs
    /// after the VM tier by default.
    #[arg(long)]
    no_cluster: bool,
    /// Only the cluster tier.
    #[arg(long, conflicts_with_all = ["host_only", "vm_only", "no_cluster"])]
    cluster_only: bool,
    /// Skip the Python tier (`cargo xtask py-test`: the gdr-py wheel built and installed in a
    /// virtual environment, pytest on the host and in the VM), which runs after the VM tier.
    #[arg(long)]
    no_python: bool,
    /// Arguments for every test binary, e.g. a test name filter.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    test_args: Vec<String>,
}

/// Pass/fail counts summed over libtest's `test result:` lines.
#[derive(Default, Clone, Copy, Debug, PartialEq)]
struct Counts {
    passed: u64,
    failed: u64,
}

impl Counts {
    fn add(&mut self, o: Counts) {
        self.passed += o.passed;
        self.failed += o.failed;
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} passed, {} failed", self.passed, self.failed)
    }
}

/// Parses `test result: ok. 3 passed; 0 failed; 1 ignored; ...` (colour codes tolerated).
fn parse_result_line(line: &str) -> Option<Counts> {
    let rest = &line[line.find("test result: ")? + "test result: ".len()..];
    let num_before = |word: &str| -> Option<u64> {
        let end = rest.find(word)?;
        rest[..end]
            .split([' ', ';', '.'])
            .rfind(|s| !s.is_empty())?
            .parse()
            .ok()
    };
    Some(Counts {
        passed: num_before(" passed")?,
        failed: num_before(" failed")?,
    })
}

pub fn test(opts: &TestOpts) -> Result<i32> {
    let start = Instant::now();
    let mut ok = true;
    let mut total = Counts::default();
    let mut skipped: Vec<String> = Vec::new();
    if !opts.vm_only && !opts.cluster_only {
        let (host_ok, counts) = host_tests(&opts.test_args)?;
        say!("host: {counts}");
        ok &= host_ok;
        total.add(counts);
        // The guide's programs built, every code block and link of the guide accounted for,
        // the API documentation without warnings, the book built, and the library crates
        // packaged and built from their packages: one test each.
        for passed in [
            crate::downstream::check()?,
            crate::docs::check_blocks()?,
            crate::docs::check_api_docs()?,
            crate::docs::build_book()?,
            crate::package::check()?,
        ] {
            ok &= passed;
            total.add(Counts {
                passed: u64::from(passed),
                failed: u64::from(!passed),
            });
        }
        // Each fuzz target's few seconds count as one test; skipped without nightly or
        // cargo-fuzz, and said so again at the end.
        match crate::fuzz::smoke()? {
            Ok((passed, failed)) => {
                ok &= failed == 0;
                total.add(Counts { passed, failed });
            }
            Err(why) => skipped.push(format!("the fuzz smoke: {why}")),
        }
    }
    if !opts.host_only && !opts.cluster_only {
        let (vm_ok, counts) = vm_tests(opts)?;
        say!("VM: {counts}");
        ok &= vm_ok;
        total.add(counts);
    }
    if !(opts.no_python || opts.host_only || opts.cluster_only) {
        let py = crate::py_test::PyTestOpts {
            vm: opts.vm.clone(),
            host_only: false,
            python: "python3".into(),
            pytest_args: Vec::new(),
        };
        let (py_ok, passed, failed) = crate::py_test::tier(&py)?;
        let counts = Counts { passed, failed };
        say!("python: {counts}");
        ok &= py_ok;
        total.add(counts);
        // The drop-ins against NIXL and Mooncake from PyPI, call by call: one test.
        let same = crate::dropins::check(&opts.vm)?;
        say!("dropins: {}", if same { "passed" } else { "FAILED" });
        ok &= same;
        total.add(Counts {
            passed: u64::from(same),
            failed: u64::from(!same),
        });
    }
    if opts.cluster_only || !(opts.no_cluster || opts.host_only || opts.vm_only) {
        let (cluster_ok, counts) = cluster_tests(opts)?;
        say!("cluster: {counts}");
        ok &= cluster_ok;
        total.add(counts);
    }
    say!(
        "{} in {:.0} s",
        if ok { "all tests passed" } else { "FAILED" },
        start.elapsed().as_secs_f64()
    );
    say!("{total}");
    for s in &skipped {
        say!("SKIPPED {s}");
    }
    Ok(if ok { 0 } else { 1 })
}

/// `cargo test --workspace --all-features --no-fail-fast`, output streamed and its results counted.
fn host_tests(test_args: &[String]) -> Result<(bool, Counts)> {
    crate::setup::ensure_packages()?;
    say!("host tests: cargo test --workspace --all-features");
    let mut cmd = cargo::cargo();
    cmd.args(["test", "--workspace", "--all-features", "--no-fail-fast"]);
    if !test_args.is_empty() {
        cmd.arg("--").args(test_args);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run cargo test: {e}"))?;
    let mut counts = Counts::default();
    let stdout = std::io::stdout();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.map_err(|e| e.to_string())?;
        let mut out = stdout.lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
        if let Some(c) = parse_result_line(&line) {
            counts.add(c);
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    Ok((status.success(), counts))
}

/// Builds every test binary, then runs all but the `gpu_*` and `hw_*` ones inside one VM boot.
fn vm_tests(opts: &TestOpts) -> Result<(bool, Counts)> {
    crate::setup::ensure_packages()?;
    say!("device tests: building the test binaries");
    let artifacts = cargo::build(&["test", "--workspace", "--all-features", "--no-run"])?;
    let tests: Vec<_> = artifacts
        .iter()
        // gpu_*: the GPU machine's tier; hw_*: needs a GPU and an RDMA NIC in one host (users run
        // it); cluster_*, cluster3_*: the cluster tier (cluster_tests).
        .filter(|a| {
            a.test
                && !a.name.starts_with("gpu_")
                && !a.name.starts_with("hw_")
                && !a.name.starts_with("cluster")
        })
        .collect();
    if tests.is_empty() {
        say!("no test binaries");
        return Ok((true, Counts::default()));
    }
    let mut script = tier_script(&tests, &shell_words(&opts.test_args), "");
    let runnable = if opts.test_args.is_empty() {
        crate::downstream::runnable()?
    } else {
        Vec::new()
    };
    // The guide's whole programs (built from the guide alone, `cargo xtask downstream`), each
    // counted as one test: it passes when it exits with 0.
    if opts.test_args.is_empty() {
        let end = script
            .rfind("[ \"$failed\" -eq 0 ]")
            .unwrap_or(script.len());
        let mut programs = String::from("export GDR_DEVICE=\"$GDR_TEST_DEVICE\"\n");
        for (p, exe) in &runnable {
            let name = &p.name;
            programs.push_str(&format!(
                "run_one {} {} {}\n[ \"$rc\" -eq 0 ] && echo 'test result: ok. 1 passed; 0 failed; (the guide program {name})'\n",
                shell_quote(&format!("guide program {name} ({}, {})", p.rust.place(), exe.display())),
                shell_quote(&cargo::workspace_root().to_string_lossy()),
                shell_quote(&exe.to_string_lossy()),
            ));
        }
        script.insert_str(end, &programs);
    }
    // The engine's tests (direct and staged, and the outcome regression about rails) once more
    // on two rails: a second rxe on the veth
    // pair's other end (its own subnet), so that both agents of a test stripe over rxe0 and rxe1.
    let two_rails: Vec<_> = tests
        .iter()
        .filter(|a| a.name == "xfer_engine" || a.name == "xfer_staged" || a.name == "xfer_outcomes")
        .collect();
    if !two_rails.is_empty() {
        let end = script
            .rfind("[ \"$failed\" -eq 0 ]")
            .unwrap_or(script.len());
        let mut more = String::from(
            "ip addr add 10.77.1.1/24 dev veth1 && rdma link add rxe1 type rxe netdev veth1 || \
             { echo 'cannot add rxe1 on veth1'; failed=$((failed + 1)); }\n\
             export GDR_TEST_DEVICE=rxe0,rxe1\n",
        );
        for t in two_rails {
            // Of the outcome regressions, the one about rails: a two-rail agent handed a
            // one-rail agent's segment (the rest do not depend on the rail count).
            // Of the staged tests, the ones that move bytes over both rails (the striping and
            // failover of staged jobs is the simulation's, on every seed with two rails).
            let args = match (t.name.as_str(), opts.test_args.is_empty()) {
                ("xfer_outcomes", true) => "another_agents_objects".to_string(),
                ("xfer_staged", true) => {
                    "staged_writes_and_reads_move_every_byte a_staged_notification_arrives_only_after_all_the_data"
                        .to_string()
                }
                _ => shell_words(&opts.test_args),
            };
            more.push_str(&run_one_line(t, " on two rails", &args));
        }
        script.insert_str(end, &more);
    }
    say!(
        "device tests: {} test binaries in one VM boot (--ignored --test-threads=1; xfer_engine, two of xfer_staged and one of xfer_outcomes also on two rails), and the guide's programs {:?}",
        tests.len(),
        runnable.iter().map(|(p, _)| p.name.as_str()).collect::<Vec<_>>()
    );
    let outcome = vm::boot(&opts.vm, &script)?;
    let (counts, failed_bins) = summarize(&outcome.output);
    for b in &failed_bins {
        say!("FAILED in the VM: {b}");
    }
    let ok = outcome.code == 0 && counts.failed == 0 && failed_bins.is_empty();
    Ok((ok, counts))
}

/// The cluster tier: every `cluster_*` test binary on each host of a 2-host x 2-rail cluster,
/// then every `cluster3_*` binary on a 3-host x 2-rail one (`cargo xtask cluster`), one boot
/// each, with `--ignored --test-threads=1 --nocapture`. The tests pair up across hosts by running
/// in the same order on every host.
fn cluster_tests(opts: &TestOpts) -> Result<(bool, Counts)> {
    crate::setup::ensure_packages()?;
    say!("cluster tests: building the test binaries");
    let artifacts = cargo::build(&["test", "--workspace", "--all-features", "--no-run"])?;
    let mut total = Counts::default();
    let mut ok = true;
    for (prefix, hosts) in [("cluster_", 2), ("cluster3_", 3)] {
        let tests: Vec<_> = artifacts
            .iter()
            .filter(|a| a.test && a.name.starts_with(prefix))
            .collect();
        if tests.is_empty() {
            say!("no {prefix}* test binaries");
            continue;
        }
        let script = tier_script(&tests, &shell_words(&opts.test_args), "--nocapture");
        let copts = crate::cluster::ClusterOpts {
            hosts,
            rails: 2,
            timeout: opts.vm.timeout,
            grace: 60,
            mem: 1024,
            memlock: opts.vm.memlock.clone(),
        };
        say!(
            "cluster tests: {} test binaries ({prefix}*) on {} hosts x {} rails",
            tests.len(),
            copts.hosts,
            copts.rails
        );
        let outcome = crate::cluster::boot(&copts, &script)?;
        ok &= outcome.code == 0;
        for (i, out) in outcome.outputs.iter().enumerate() {
            let (counts, failed_bins) = summarize(out);
            say!("cluster host{}: {counts} ({:?})", i + 1, outcome.ends[i]);
            for b in &failed_bins {
                say!("FAILED on cluster host{}: {b}", i + 1);
            }
            ok &= counts.failed == 0 && failed_bins.is_empty();
            total.add(counts);
        }
    }
    Ok((ok, total))
}

/// A script that runs each test binary with `--ignored --test-threads=1 <more> <extra>` in its
/// package directory, between `==== label ====` / `==== exit N: label ====` lines (`summarize`).
fn tier_script(tests: &[&cargo::Artifact], extra: &str, more: &str) -> String {
    let mut script = String::from(
        "# Generated by cargo xtask test: each test binary with --ignored, in its package directory.\n\
         echo \"device: $GDR_TEST_DEVICE port 1 $(cat /sys/class/infiniband/$GDR_TEST_DEVICE/ports/1/state), \
         GID index $GDR_TEST_GID_INDEX, address $GDR_TEST_ADDR, ulimit -l $(ulimit -l)\"\n\
         failed=0\n\
         run_one() {\n\
         \x20   label=$1; dir=$2; shift 2\n\
         \x20   echo\n\
         \x20   echo \"==== $label ====\"\n\
         \x20   (cd \"$dir\" && CARGO_MANIFEST_DIR=\"$dir\" \"$@\")\n\
         \x20   rc=$?\n\
         \x20   echo \"==== exit $rc: $label ====\"\n\
         \x20   [ \"$rc\" -eq 0 ] || failed=$((failed + 1))\n\
         }\n",
    );
    // The resource-cycle tests' count (gdr/tests/verbs_cycles.rs): GDR_CYCLES=10000 for the full run.
    if let Ok(n) = std::env::var("GDR_CYCLES") {
        script.push_str(&format!("export GDR_CYCLES={}\n", shell_quote(&n)));
    }
    for t in tests {
        script.push_str(&run_one_line(t, "", &format!("{more} {extra}")));
    }
    script.push_str("[ \"$failed\" -eq 0 ]\n");
    script
}

/// The script line that runs test binary `t` with `--ignored --test-threads=1 ARGS`, labelled
/// with its name, `note` and its path.
fn run_one_line(t: &cargo::Artifact, note: &str, args: &str) -> String {
    let root = cargo::workspace_root();
    let exe = t.executable.strip_prefix(&root).unwrap_or(&t.executable);
    format!(
        "run_one {} {} {} --ignored --test-threads=1 {args}\n",
        shell_quote(&format!("{}{note} ({})", t.label(), exe.display())),
        shell_quote(&t.package_dir.to_string_lossy()),
        shell_quote(&t.executable.to_string_lossy()),
    )
}

/// Sums the `test result:` lines of the VM's output; a binary that exits non-zero without a
/// failed test (a crash, a panic outside a test) counts as one failure.
fn summarize(output: &str) -> (Counts, Vec<String>) {
    let mut total = Counts::default();
    let mut block = Counts::default();
    let mut failed_bins = Vec::new();
    for line in output.lines() {
        if line.starts_with("==== ") && !line.starts_with("==== exit ") {
            block = Counts::default();
        } else if let Some(rest) = line.strip_prefix("==== exit ") {
            let (code, label) = rest.split_once(": ").unwrap_or((rest, ""));
            if code.trim() != "0" {
                failed_bins.push(label.trim_end_matches(" ====").to_string());
                if block.failed == 0 {
                    total.failed += 1;
                }
            }
        } else if let Some(c) = parse_result_line(line) {
            block.add(c);
            total.add(c);
        }
    }
    (total, failed_bins)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_libtest_summary() {
        let c = parse_result_line(
            "test result: ok. 3 passed; 1 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.01s",
        );
        assert_eq!(
            c,
            Some(Counts {
                passed: 3,
                failed: 1
            })
        );
        let c = parse_result_line("test result: \x1b[32mok\x1b[0m. 12 passed; 0 failed; 0 ignored");
        assert_eq!(
            c,
            Some(Counts {
                passed: 12,
                failed: 0
            })
        );
        assert_eq!(parse_result_line("running 3 tests"), None);
    }

    #[test]
    fn summarizes_vm_output() {
        let out = "\n==== a test x (t/x) ====\nrunning 1 test\ntest result: ok. 1 passed; 0 failed; 0 ignored\n\
                   ==== exit 0: a test x (t/x) ====\n\n==== a test y (t/y) ====\nSegmentation fault\n\
                   ==== exit 139: a test y (t/y) ====\n";
        let (c, failed) = summarize(out);
        assert_eq!(
            c,
            Counts {
                passed: 1,
                failed: 1
            }
        );
        assert_eq!(failed, vec!["a test y (t/y)".to_string()]);
    }

    #[test]
    fn quoting_survives_spaces_and_quotes() {
        assert_eq!(shell_words(&["a b", "it's"]), r"'a b' 'it'\''s'");
    }
}
