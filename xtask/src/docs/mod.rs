//! `cargo xtask docs`: the guide (README.md, the book under `docs/`, the crates' READMEs).
//! First every code block is accounted for: `rust` and `toml` blocks are the downstream
//! programs ([`crate::downstream`]: compiled, and run in the VM tier unless `no_run`),
//! `python` blocks are run by `gdr-py/tests/test_docs.py` (which fails for a block it has no
//! runner for), `sh` blocks' commands are checked by [`commands`], and `text` blocks are output
//! shown to the reader; a block of any other kind is an error. Then the book is built with
//! mdBook into `target/book/` (mdBook is installed into `target/tools/` on first use).

pub mod blocks;
pub mod commands;
pub mod links;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::{cargo, say, Result};
use blocks::Block;
use commands::Verdict;

/// The mdBook release the book is built with.
pub const MDBOOK_VERSION: &str = "0.5.4";

/// `cargo xtask docs` options.
#[derive(clap::Args)]
pub struct DocsOpts {
    /// Only account for the code blocks and check the commands and links; no `cargo doc`,
    /// no book.
    #[arg(long)]
    pub no_build: bool,
}

/// What the blocks of the guide are, and how each kind is checked.
#[derive(Debug, Default)]
pub struct Inventory {
    /// Blocks by kind, with what checks them.
    pub kinds: BTreeMap<&'static str, usize>,
    /// Shell command lines checked by [`commands`].
    pub commands_checked: usize,
    /// Shell command lines of programs [`commands`] does not know, by program.
    pub commands_not_checked: BTreeMap<String, usize>,
}

/// Accounts for every block of `all` and checks the `sh` blocks' commands.
pub fn inventory(all: &[Block], targets: &[(String, String, String)]) -> Result<Inventory> {
    let programs = crate::downstream::programs(all)?;
    let mut inv = Inventory::default();
    let parse = |args: &[String]| crate::parse_args(args);
    let gdr = gdr_parser()?;
    let parsers = commands::Parsers {
        xtask: &parse,
        gdr: &gdr,
    };
    let mut problems = Vec::new();
    for b in all {
        let kind = match b.lang() {
            "rust" if programs.iter().any(|p| p.rust == *b && p.runs()) => {
                "rust (built and run in the VM)"
            }
            "rust" => "rust (built; no_run)",
            "toml" => "toml (the programs' dependencies)",
            "python" => "python (run by gdr-py/tests/test_docs.py)",
            "text" => "text (output shown to the reader)",
            "sh" => {
                for line in commands::lines(b) {
                    match commands::check(&line, &parsers, targets) {
                        Ok(Verdict::Checked) => inv.commands_checked += 1,
                        Ok(Verdict::NotChecked(p)) => {
                            *inv.commands_not_checked.entry(p).or_default() += 1
                        }
                        Err(e) => problems.push(format!("{}: {e}", b.place())),
                    }
                }
                "sh (commands)"
            }
            other => {
                problems.push(format!(
                    "{}: a ```{other} block: nothing checks it (use rust, toml, python, sh or text)",
                    b.place()
                ));
                continue;
            }
        };
        *inv.kinds.entry(kind).or_default() += 1;
    }
    if problems.is_empty() {
        Ok(inv)
    } else {
        Err(problems.join("\n"))
    }
}

/// The `gdr` tool's parser: the tool built as the tests build it, run with the line's
/// arguments and `--help` after them. clap parses the arguments in order and prints the help
/// only when every one before it is known and its value valid (required arguments aside), so
/// a line passes when that exits with 0.
fn gdr_parser() -> Result<impl Fn(&[String]) -> Result<()>> {
    let status = cargo::cargo()
        .args([
            "build",
            "--workspace",
            "--all-features",
            "--bin",
            "gdr",
            "--quiet",
        ])
        .status()
        .map_err(|e| format!("cannot run cargo build: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build --bin gdr failed ({status})"));
    }
    let exe = cargo::metadata()?.target_dir.join("debug/gdr");
    Ok(move |args: &[String]| {
        let out = Command::new(&exe)
            .args(args)
            .arg("--help")
            .output()
            .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            Err(format!(
                "gdr refuses it: {}",
                err.lines().next().unwrap_or("").trim()
            ))
        }
    })
}

/// The inventory of this checkout's guide, printed; `Ok(false)` when a block is unchecked or
/// a command does not parse.
pub fn check_blocks() -> Result<bool> {
    let root = cargo::workspace_root();
    let all = blocks::all(&root)?;
    let meta = cargo::metadata()?;
    let (mut broken, mut links) = (Vec::new(), 0);
    for file in blocks::guide_files(&root)? {
        let text = std::fs::read_to_string(root.join(&file))
            .map_err(|e| format!("reading {file}: {e}"))?;
        links += links::targets(&text).len();
        broken.extend(links::broken(&root, &file, &text));
    }
    if !broken.is_empty() {
        say!("docs: FAILED: broken links:\n{}", broken.join("\n"));
        return Ok(false);
    }
    match inventory(&all, &meta.targets) {
        Ok(inv) => {
            say!(
                "docs: {} code blocks in {} files; {links} links, the relative ones checked",
                all.len(),
                blocks::guide_files(&root)?.len()
            );
            for (kind, n) in &inv.kinds {
                say!("docs:   {n:3} {kind}");
            }
            let not: Vec<String> = inv
                .commands_not_checked
                .iter()
                .map(|(p, n)| format!("{p} {n}"))
                .collect();
            say!(
                "docs: shell commands: {} checked (cargo xtask and gdr lines parse, cargo targets exist, apt-get packages are setup's); not checked: {}",
                inv.commands_checked,
                not.join(", ")
            );
            Ok(true)
        }
        Err(e) => {
            say!("docs: FAILED:\n{e}");
            Ok(false)
        }
    }
}

/// mdBook, installed into `target/tools/` on first use.
fn mdbook(target: &Path) -> Result<std::path::PathBuf> {
    let root = target.join("tools");
    let exe = root.join("bin/mdbook");
    let current = Command::new(&exe)
        .arg("--version")
        .output()
        .ok()
        .is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains(MDBOOK_VERSION));
    if !current {
        say!(
            "docs: installing mdbook {MDBOOK_VERSION} into {}",
            root.display()
        );
        let status = cargo::cargo()
            .args(["install", "mdbook", "--locked", "--version", MDBOOK_VERSION])
            .args(["--no-default-features", "--features", "search", "--root"])
            .arg(&root)
            .status()
            .map_err(|e| format!("cannot run cargo install: {e}"))?;
        if !status.success() {
            return Err(format!(
                "cargo install mdbook {MDBOOK_VERSION} failed ({status})"
            ));
        }
    }
    Ok(exe)
}

/// Builds the book into `target/book/`.
pub fn build_book() -> Result<bool> {
    let meta = cargo::metadata()?;
    let exe = mdbook(&meta.target_dir)?;
    let dest = meta.target_dir.join("book");
    let status = Command::new(exe)
        .arg("build")
        .arg(meta.root.join("docs"))
        .arg("--dest-dir")
        .arg(&dest)
        .status()
        .map_err(|e| format!("cannot run mdbook: {e}"))?;
    if status.success() {
        say!("docs: the book is in {}", dest.join("index.html").display());
    }
    Ok(status.success())
}

/// The crates' API documentation: `cargo doc` of the workspace (every feature, xtask left out)
/// with rustdoc's warnings as errors (broken intra-doc links, bare URLs, unclosed HTML).
pub fn check_api_docs() -> Result<bool> {
    say!("docs: cargo doc --workspace --no-deps --all-features --exclude xtask (RUSTDOCFLAGS=-D warnings)");
    let status = cargo::cargo()
        .args([
            "doc",
            "--workspace",
            "--no-deps",
            "--all-features",
            "--exclude",
            "xtask",
        ])
        .env("RUSTDOCFLAGS", "-D warnings")
        .status()
        .map_err(|e| format!("cannot run cargo doc: {e}"))?;
    if !status.success() {
        say!("docs: FAILED: cargo doc has warnings or errors ({status})");
    }
    Ok(status.success())
}

/// `cargo xtask docs`.
pub fn docs(opts: &DocsOpts) -> Result<i32> {
    let mut ok = check_blocks()?;
    if !opts.no_build {
        ok &= check_api_docs()?;
        ok &= build_book()?;
    }
    Ok(if ok { 0 } else { 1 })
}
