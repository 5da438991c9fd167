//! `cargo xtask dropins`: the differential test of gdr's drop-ins for NIXL's and Mooncake's
//! Python APIs (`gdr.nixl`, `gdr.mooncake`) against the packages themselves, in one VM boot.
//!
//! Each API has one check program (`xtask/src/peers/{nixl,mooncake}_api_check.py`), written
//! against the original's API, that prints one line per call it makes (`step NAME: ok TYPE
//! [VALUE]` or `step NAME: raises CLASS`, or `crashes SIGNAL` for a call run in a forked
//! child). It runs as two processes (a target and an initiator), once on the original (the
//! peers' virtual environment of `compare-peers`) and once on the drop-in (the wheel's virtual
//! environment), changing only the import. This module compares the two runs line by line:
//! every difference must be one of [`DIFFERENCES`], each with its reason, and every listed
//! difference must still occur; every data check (`... bytes`, `notification after the
//! bytes`) must pass on the drop-in, and every process must exit 0.

use std::collections::BTreeMap;

use crate::vm::{self, shell_quote, VmOpts};
use crate::{cargo, compare_peers, py_test, say, Result};

/// `cargo xtask dropins`.
#[derive(clap::Args)]
pub struct DropinsOpts {
    #[command(flatten)]
    pub vm: VmOpts,
}

/// A known difference between the original and gdr's drop-in: the step, what each printed
/// (`-` where the step did not run), and why.
pub struct Difference {
    pub api: &'static str,
    pub side: &'static str,
    pub step: &'static str,
    pub original: &'static str,
    pub dropin: &'static str,
    pub why: &'static str,
}

/// Every expected difference, with its reason.
pub const DIFFERENCES: &[Difference] = &[
    Difference {
        api: "mooncake",
        side: "initiator",
        step: "initialize(no such device)",
        original: "ok int 0",
        dropin: "ok int -1",
        why: "Mooncake goes on without the device (its transfers then fail or use TCP); gdr \
              refuses a device it cannot open: no silent fallback",
    },
    Difference {
        api: "mooncake",
        side: "initiator",
        step: "get_batch_transfer_status(same id again)",
        original: "crashes SIGSEGV",
        dropin: "ok int -1",
        why: "Mooncake frees a batch once its status is read and reads the freed batch when \
              asked again; gdr forgets the id and answers -1",
    },
    Difference {
        api: "mooncake",
        side: "initiator",
        step: "get_batch_transfer_status(unknown)",
        original: "crashes SIGSEGV",
        dropin: "ok int -1",
        why: "Mooncake takes any integer as a pointer to a batch; gdr answers -1 for an id it \
              never gave",
    },
    Difference {
        api: "mooncake",
        side: "initiator",
        step: "allocate_managed_buffer > 0",
        original: "ok bool False",
        dropin: "ok bool True",
        why: "the non-CUDA wheel's rdma protocol allocates nothing (0); gdr's buffer is \
              registered host memory its segment holds",
    },
    Difference {
        api: "mooncake",
        side: "initiator",
        step: "write_bytes_to_buffer",
        original: "-",
        dropin: "ok int 0",
        why: "runs only on a managed buffer (none from Mooncake, above)",
    },
    Difference {
        api: "mooncake",
        side: "initiator",
        step: "read_bytes_from_buffer",
        original: "-",
        dropin: "ok bytes",
        why: "runs only on a managed buffer",
    },
    Difference {
        api: "mooncake",
        side: "initiator",
        step: "transfer_sync_write(managed)",
        original: "-",
        dropin: "ok int 0",
        why: "runs only on a managed buffer",
    },
    Difference {
        api: "mooncake",
        side: "initiator",
        step: "free_managed_buffer",
        original: "-",
        dropin: "ok int 0",
        why: "runs only on a managed buffer",
    },
    Difference {
        api: "mooncake",
        side: "initiator",
        step: "get_engine_ptr",
        original: "ok int",
        dropin: "raises NotImplementedError",
        why: "a pointer to Mooncake's C++ engine, for C++ extensions that call it; gdr has none \
              to give (its agent is gdr_agent)",
    },
    Difference {
        api: "nixl",
        side: "initiator",
        step: "estimate_xfer_cost",
        original: "ok tuple",
        dropin: "raises nixlNotSupportedError",
        why: "UCX answers an analytical estimate; gdr makes none rather than invent one",
    },
];

/// One side's run: its step lines by name, in order, and its exit code.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Run {
    pub steps: Vec<(String, String)>,
    pub rc: Option<i32>,
}

/// The runs by (api, impl, side) from the VM's output (`### dropin ...` sections).
pub fn parse(text: &str) -> Runs {
    let mut out = BTreeMap::new();
    let mut cur: Option<(String, String, String)> = None;
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(rest) = line.strip_prefix("### dropin ") {
            let field = |k: &str| {
                rest.split_whitespace()
                    .find_map(|f| f.strip_prefix(k))
                    .unwrap_or("")
                    .to_string()
            };
            let key = (field("api="), field("impl="), field("side="));
            out.insert(key.clone(), Run::default());
            cur = Some(key);
        } else if let Some(rc) = line.strip_prefix("### end rc=") {
            if let Some(run) = cur.take().and_then(|k| out.get_mut(&k)) {
                run.rc = rc.trim().parse().ok();
            }
        } else if let (Some(rest), Some(key)) = (line.strip_prefix("step "), &cur) {
            if let (Some((name, result)), Some(run)) = (rest.rsplit_once(": "), out.get_mut(key)) {
                run.steps.push((name.to_string(), result.to_string()));
            }
        }
    }
    out
}

/// The original package's name for each API's `--impl`.
fn original_of(api: &str) -> &'static str {
    match api {
        "nixl" => "nixl",
        _ => "mooncake",
    }
}

/// One compared step: the step, what each printed, and the listed reason when they differ.
pub struct Row {
    pub step: String,
    pub original: String,
    pub dropin: String,
    pub why: Option<&'static str>,
}

/// One API's side, compared: the API, the side, its rows.
pub type Table = (String, String, Vec<Row>);

/// The runs by (api, impl, side).
pub type Runs = BTreeMap<(String, String, String), Run>;

/// Compares the runs of each API and side: the rows, and the failures.
pub fn compare(runs: &Runs) -> (Vec<Table>, Vec<String>) {
    let mut tables = Vec::new();
    let mut failures = Vec::new();
    let mut seen = vec![false; DIFFERENCES.len()];
    for api in ["nixl", "mooncake"] {
        for side in ["target", "initiator"] {
            let get = |imp: &str| runs.get(&(api.to_string(), imp.to_string(), side.to_string()));
            let (Some(orig), Some(ours)) = (get(original_of(api)), get("gdr")) else {
                failures.push(format!(
                    "{api} {side}: a run is missing from the VM's output"
                ));
                continue;
            };
            for (imp, run) in [(original_of(api), orig), ("gdr", ours)] {
                if run.rc != Some(0) {
                    failures.push(format!("{api} on {imp}, {side}: exited with {:?}", run.rc));
                }
            }
            for (imp, run) in [(original_of(api), orig), ("gdr", ours)] {
                let mut names: Vec<&str> = run.steps.iter().map(|(n, _)| n.as_str()).collect();
                names.sort_unstable();
                if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
                    failures.push(format!(
                        "{api} on {imp}, {side}: two steps are named {:?}",
                        w[0]
                    ));
                }
            }
            let mut names: Vec<&str> = ours.steps.iter().map(|(n, _)| n.as_str()).collect();
            for (n, _) in &orig.steps {
                if !names.contains(&n.as_str()) {
                    names.push(n);
                }
            }
            let find = |run: &Run, n: &str| {
                run.steps
                    .iter()
                    .find(|(s, _)| s == n)
                    .map_or("-".to_string(), |(_, r)| r.clone())
            };
            let mut rows = Vec::new();
            for n in names {
                let (o, d) = (find(orig, n), find(ours, n));
                let is_check = n.ends_with(" bytes") || n.contains("notification after the bytes");
                if is_check && d != "ok bool True" {
                    failures.push(format!(
                        "{api} {side}: the drop-in's data check {n:?} printed {d:?}"
                    ));
                }
                let why = if o == d {
                    None
                } else if let Some(i) = DIFFERENCES.iter().position(|k| {
                    k.api == api
                        && k.side == side
                        && k.step == n
                        && k.original == o
                        && k.dropin == d
                }) {
                    seen[i] = true;
                    Some(DIFFERENCES[i].why)
                } else {
                    failures.push(format!(
                        "{api} {side}: step {n:?}: the original printed {o:?}, the drop-in {d:?} (not a listed difference)"
                    ));
                    Some("NOT LISTED")
                };
                rows.push(Row {
                    step: n.to_string(),
                    original: o,
                    dropin: d,
                    why,
                });
            }
            tables.push((api.to_string(), side.to_string(), rows));
        }
    }
    for (k, seen) in DIFFERENCES.iter().zip(seen) {
        if !seen {
            failures.push(format!(
                "{} {}: the listed difference at {:?} ({:?} against {:?}) did not occur: update the list",
                k.api, k.side, k.step, k.original, k.dropin
            ));
        }
    }
    (tables, failures)
}

const SCRIPT: &str = "xtask/src/dropins.sh";
const DRIVERS: &str = "xtask/src/peers";

/// `cargo xtask dropins`: the exit code.
pub fn dropins(opts: &DropinsOpts) -> Result<i32> {
    Ok(i32::from(!check(&opts.vm)?))
}

/// The differential test, as one test of `cargo xtask test`: whether it passed.
pub fn check(vm_opts: &VmOpts) -> Result<bool> {
    let meta = cargo::metadata()?;
    std::env::set_current_dir(&meta.root).map_err(|e| e.to_string())?;
    let wheel = py_test::build_wheel("python3")?;
    let venv = compare_peers::ensure_peers(&meta.target_dir)?;
    let q = |p: &std::path::Path| shell_quote(&p.to_string_lossy());
    let script = format!(
        "export PYTHONDONTWRITEBYTECODE=1 PEERS_VENV={} PY={} PEERS_DIR={}\nbash {SCRIPT} \"$GDR_TEST_DEVICE\" \"$GDR_TEST_GID_INDEX\"\n",
        q(&venv),
        q(&wheel.python),
        q(&meta.root.join(DRIVERS)),
    );
    say!("the API check programs on NIXL, Mooncake and gdr's drop-ins, in the VM");
    let outcome = vm::boot(vm_opts, &script)?;
    let runs = parse(&outcome.output);
    let (tables, mut failures) = compare(&runs);
    for (api, side, rows) in &tables {
        let same = rows.iter().filter(|r| r.why.is_none()).count();
        println!(
            "\n{api} ({side}): {} steps, {same} the same on {} and on gdr's drop-in",
            rows.len(),
            original_of(api)
        );
        println!(
            "| step | {} | gdr.{api} | why they differ |",
            original_of(api)
        );
        println!("|---|---|---|---|");
        for r in rows {
            println!(
                "| {} | {} | {} | {} |",
                r.step,
                r.original,
                r.dropin,
                r.why.unwrap_or("")
            );
        }
    }
    if outcome.code != 0 {
        failures.push(format!("the script exited with {} in the VM", outcome.code));
    }
    for f in &failures {
        eprintln!("xtask: dropins: {f}");
    }
    if failures.is_empty() {
        say!(
            "dropins: every difference is listed with its reason ({} listed), every data check passed",
            DIFFERENCES.len()
        );
    }
    Ok(failures.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(api: &str, imp: &str, side: &str, steps: &[&str], rc: i32) -> String {
        let mut s = format!("### dropin api={api} impl={imp} side={side}\n");
        for st in steps {
            s.push_str(&format!("step {st}\n"));
        }
        s.push_str(&format!("### end rc={rc}\n"));
        s
    }

    #[test]
    fn sections_are_parsed_by_api_impl_and_side() {
        let text = section(
            "nixl",
            "gdr",
            "target",
            &["a: ok int 0", "b(x: y): raises E"],
            0,
        );
        let runs = parse(&text);
        let run = &runs[&("nixl".into(), "gdr".into(), "target".into())];
        assert_eq!(run.rc, Some(0));
        assert_eq!(
            run.steps[1],
            ("b(x: y)".to_string(), "raises E".to_string())
        );
    }

    #[test]
    fn an_unlisted_difference_and_a_failed_check_fail_the_comparison() {
        let mut text = String::new();
        for side in ["target", "initiator"] {
            text += &section(
                "nixl",
                "nixl",
                side,
                &["x: ok int 0", "WRITE bytes: ok bool True"],
                0,
            );
            text += &section(
                "nixl",
                "gdr",
                side,
                &["x: ok int 1", "WRITE bytes: ok bool False"],
                0,
            );
        }
        let (_, failures) = compare(&parse(&text));
        assert!(
            failures
                .iter()
                .any(|f| f.contains("not a listed difference")),
            "{failures:?}"
        );
        assert!(
            failures.iter().any(|f| f.contains("data check")),
            "{failures:?}"
        );
        // Mooncake's runs are missing, and so are its listed differences.
        assert!(failures
            .iter()
            .any(|f| f.contains("mooncake target: a run is missing")));
        assert!(failures.iter().any(|f| f.contains("did not occur")));
    }

    #[test]
    fn identical_runs_with_the_listed_differences_pass() {
        // Each API and side: a step both print alike, then every listed difference.
        let mut text = String::new();
        for (api, original) in [("nixl", "nixl"), ("mooncake", "mooncake")] {
            for side in ["target", "initiator"] {
                let mut orig = vec!["x: ok int 0".to_string()];
                let mut ours = orig.clone();
                for d in DIFFERENCES
                    .iter()
                    .filter(|d| d.api == api && d.side == side)
                {
                    if d.original != "-" {
                        orig.push(format!("{}: {}", d.step, d.original));
                    }
                    ours.push(format!("{}: {}", d.step, d.dropin));
                }
                let o: Vec<&str> = orig.iter().map(String::as_str).collect();
                let g: Vec<&str> = ours.iter().map(String::as_str).collect();
                text += &section(api, original, side, &o, 0);
                text += &section(api, "gdr", side, &g, 0);
            }
        }
        let (tables, failures) = compare(&parse(&text));
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!(tables.len(), 4);
    }

    #[test]
    fn a_process_that_did_not_exit_0_fails() {
        let mut text = String::new();
        for side in ["target", "initiator"] {
            text += &section("nixl", "nixl", side, &[], 0);
            text += &section(
                "nixl",
                "gdr",
                side,
                &[],
                if side == "target" { 139 } else { 0 },
            );
        }
        let (_, failures) = compare(&parse(&text));
        assert!(
            failures
                .iter()
                .any(|f| f.contains("nixl on gdr, target: exited with Some(139)")),
            "{failures:?}"
        );
    }
}
