//! The shell commands of the guide (```` ```sh ```` blocks), checked without running them:
//! a `cargo xtask` line must parse with xtask's own command line, and a `cargo run`, `cargo
//! test` or `cargo bench` line must name packages, examples, tests and benches that exist.
//! Other programs (`gdr`, `pip`, `etcd`, the peers' tools) are counted as not checked here.

use super::blocks::Block;
use crate::Result;

/// What became of one command line.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Checked, and fine.
    Checked,
    /// A program this check does not know (named).
    NotChecked(String),
}

/// The command lines of a `sh` block: backslash continuations joined, comments and blank
/// lines dropped.
pub fn lines(block: &Block) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for raw in block.text.lines() {
        let line = strip_comment(raw).trim_end();
        if let Some(head) = line.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
            continue;
        }
        cur.push_str(line);
        let whole = cur.trim().to_string();
        cur.clear();
        if !whole.is_empty() {
            out.push(whole);
        }
    }
    out
}

/// A line without its `# comment` (a `#` at the start or after a space, outside quotes).
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') if prev.is_whitespace() => return &line[..i],
            _ => {}
        }
        prev = c;
    }
    line
}

/// Shell words up to the first pipe, redirection or `&`, quotes removed; leading variable
/// assignments and `sudo` skipped.
pub fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    let mut any = false;
    for c in line.chars() {
        match (quote, c) {
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), _) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any {
                    words.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            _ => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(cur);
    }
    let end = words
        .iter()
        .position(|w| {
            matches!(w.as_str(), "|" | "&" | "&&" | ";" | "<")
                || w.starts_with('>')
                || w.starts_with("2>")
        })
        .unwrap_or(words.len());
    words.truncate(end);
    let skip = words
        .iter()
        .take_while(|w| w.as_str() == "sudo" || is_assignment(w))
        .count();
    words.drain(..skip);
    words
}

fn is_assignment(w: &str) -> bool {
    w.split_once('=').is_some_and(|(k, _)| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// How the arguments of the workspace's own programs are parsed: `cargo xtask`'s (after
/// `xtask`) and the `gdr` tool's (after `gdr`, or after `--` of `cargo run --bin gdr`).
pub struct Parsers<'a> {
    /// `cargo xtask` (this tool's own parser).
    pub xtask: &'a dyn Fn(&[String]) -> Result<()>,
    /// `gdr` (the built tool, asked for its help after the arguments).
    pub gdr: &'a dyn Fn(&[String]) -> Result<()>,
}

/// Checks one command line with `parsers`; `targets` are the workspace's (package, kind,
/// name) triples.
pub fn check(
    line: &str,
    parsers: &Parsers<'_>,
    targets: &[(String, String, String)],
) -> Result<Verdict> {
    let w = words(line);
    let Some(program) = w.first() else {
        return Ok(Verdict::NotChecked(String::new()));
    };
    if program == "gdr" {
        (parsers.gdr)(&w[1..]).map_err(|e| format!("`{line}`: {e}"))?;
        return Ok(Verdict::Checked);
    }
    if program == "apt-get" && w.get(1).is_some_and(|s| s == "install") {
        // The packages a guide asks a user to install are the ones `cargo xtask setup`
        // installs and the tests run with.
        let unknown: Vec<&String> = w[2..]
            .iter()
            .filter(|p| !p.starts_with('-') && !crate::setup::PACKAGES.contains(&p.as_str()))
            .collect();
        if !unknown.is_empty() {
            return Err(format!(
                "`{line}`: cargo xtask setup does not install {unknown:?}"
            ));
        }
        return Ok(Verdict::Checked);
    }
    if program != "cargo" {
        return Ok(Verdict::NotChecked(program.clone()));
    }
    let mut args = w[1..].iter().skip_while(|a| a.starts_with('+'));
    match args.next().map(String::as_str) {
        Some("xtask") => {
            let rest: Vec<String> = args.cloned().collect();
            (parsers.xtask)(&rest).map_err(|e| format!("`{line}`: {e}"))?;
            Ok(Verdict::Checked)
        }
        Some(sub @ ("run" | "test" | "bench" | "build")) => {
            let args: Vec<String> = args.cloned().collect();
            check_cargo_targets(line, sub, &args, targets)?;
            // `cargo run --bin gdr -- ARGS`: the tool's arguments too.
            let bin = args
                .iter()
                .position(|a| a == "--bin")
                .and_then(|i| args.get(i + 1));
            if let (Some("gdr"), Some(dash)) =
                (bin.map(String::as_str), args.iter().position(|a| a == "--"))
            {
                (parsers.gdr)(&args[dash + 1..]).map_err(|e| format!("`{line}`: {e}"))?;
            }
            Ok(Verdict::Checked)
        }
        Some(other) => Ok(Verdict::NotChecked(format!("cargo {other}"))),
        None => Ok(Verdict::NotChecked("cargo".into())),
    }
}

/// `-p P`, `--example E`, `--test T` and `--bench B` (before `--`) must exist; with no `-p`,
/// a target may be in any package whose directory the guide's command is run from (the root
/// package or a member), so any package's target counts.
fn check_cargo_targets(
    line: &str,
    sub: &str,
    args: &[String],
    targets: &[(String, String, String)],
) -> Result<()> {
    let args: Vec<&String> = args.iter().take_while(|a| a.as_str() != "--").collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a.as_str() == flag)
            .and_then(|i| args.get(i + 1))
            .map(|s| s.as_str())
    };
    let package = value("-p").or(value("--package"));
    if let Some(p) = package {
        if !targets.iter().any(|(pkg, _, _)| pkg == p) {
            return Err(format!("`{line}`: no workspace package {p:?}"));
        }
    }
    for (flag, kind) in [
        ("--example", "example"),
        ("--test", "test"),
        ("--bench", "bench"),
    ] {
        if let Some(name) = value(flag) {
            let found = targets
                .iter()
                .any(|(pkg, k, n)| k == kind && n == name && package.is_none_or(|p| p == pkg));
            if !found {
                return Err(format!(
                    "`{line}`: cargo {sub}: no {kind} {name:?}{}",
                    package.map(|p| format!(" in {p}")).unwrap_or_default()
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(text: &str) -> Block {
        Block {
            file: "a.md".into(),
            line: 1,
            heading: String::new(),
            info: "sh".into(),
            text: text.into(),
        }
    }

    #[test]
    fn lines_join_continuations_and_drop_comments() {
        let b = block("# a comment\ncargo xtask test   # every test\nGDR_X=1 \\\n    cargo test -p gdr # x\n\n");
        assert_eq!(
            lines(&b),
            ["cargo xtask test", "GDR_X=1      cargo test -p gdr"]
        );
        assert_eq!(strip_comment("echo '#not' x # yes"), "echo '#not' x ");
    }

    #[test]
    fn words_stop_at_pipes_and_skip_assignments() {
        assert_eq!(
            words("A=1 B_2=x sudo gdr doctor --json > a.json"),
            ["gdr", "doctor", "--json"]
        );
        assert_eq!(
            words("etcd --data-dir \"$(mktemp -d)\" &"),
            ["etcd", "--data-dir", "$(mktemp -d)"]
        );
        assert_eq!(words("NCCL_DEBUG=INFO ./job 2>&1 | tee job.log"), ["./job"]);
    }

    fn targets() -> Vec<(String, String, String)> {
        [
            ("gdr-xfer", "example", "kv_transfer"),
            ("gdr", "test", "hw_gpudirect"),
            ("gdr-tools", "example", "rdma_write"),
        ]
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
    }

    #[test]
    fn cargo_lines_name_targets_that_exist() {
        let xtask = |a: &[String]| {
            if a.first().is_some_and(|s| s == "test") {
                Ok(())
            } else {
                Err("unknown".to_string())
            }
        };
        let gdr = |a: &[String]| {
            if a.first().is_some_and(|s| s == "doctor") {
                Ok(())
            } else {
                Err("no such subcommand".to_string())
            }
        };
        let t = targets();
        let parsers = Parsers {
            xtask: &xtask,
            gdr: &gdr,
        };
        let ok = |l: &str| check(l, &parsers, &t);
        assert_eq!(
            ok("sudo gdr doctor --json > a.json").unwrap(),
            Verdict::Checked
        );
        assert!(ok("gdr doctr").unwrap_err().contains("no such subcommand"));
        assert_eq!(
            ok("sudo apt-get install -y libibverbs-dev").unwrap(),
            Verdict::Checked
        );
        assert!(ok("apt-get install libfoo").unwrap_err().contains("libfoo"));
        assert!(ok("cargo run --bin gdr -- doctr")
            .unwrap_err()
            .contains("no such subcommand"));
        assert_eq!(ok("cargo xtask test --vm-only").unwrap(), Verdict::Checked);
        assert!(ok("cargo xtask tset").unwrap_err().contains("unknown"));
        assert_eq!(
            ok("cargo run -p gdr-xfer --example kv_transfer -- --serve").unwrap(),
            Verdict::Checked
        );
        assert!(ok("cargo run -p gdr-xfer --example kv")
            .unwrap_err()
            .contains("no example \"kv\" in gdr-xfer"));
        assert!(ok("cargo run -p gdr --example kv_transfer").is_err());
        assert_eq!(
            ok("cargo run --example rdma_write -- --gpu").unwrap(),
            Verdict::Checked
        );
        assert!(ok("cargo test -p nope")
            .unwrap_err()
            .contains("no workspace package"));
        assert_eq!(
            ok("GDR_TEST_GPU=0 cargo test -p gdr --test hw_gpudirect -- --ignored").unwrap(),
            Verdict::Checked
        );
        assert_eq!(
            ok("pip install ./gdr-py").unwrap(),
            Verdict::NotChecked("pip".into())
        );
    }
}
