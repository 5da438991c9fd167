//! The fenced code blocks of the guide's Markdown files: where each is, under which heading,
//! its info string and its text.

use std::path::{Path, PathBuf};

use crate::Result;

/// One fenced code block (```` ``` ````) of a Markdown file.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// The file, relative to the workspace root (`README.md`, `docs/src/guide/xfer.md`).
    pub file: String,
    /// The line of the opening fence, 1-based.
    pub line: usize,
    /// The nearest heading above it (`## Peers found by name: etcd`), or "" before the first.
    pub heading: String,
    /// The info string after the fence (`rust,no_run`), trimmed.
    pub info: String,
    /// The block's lines, each ending with a newline.
    pub text: String,
}

impl Block {
    /// The language: the info string's first word (`rust` for `rust,no_run`), or "".
    pub fn lang(&self) -> &str {
        self.info.split([',', ' ']).next().unwrap_or("")
    }

    /// Whether the info string carries the attribute `attr` (`no_run` of `rust,no_run`).
    pub fn has(&self, attr: &str) -> bool {
        self.info.split([',', ' ']).skip(1).any(|a| a == attr)
    }

    /// `file:line`, for messages.
    pub fn place(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// Every fenced block of `text` (the file `file`), in order. A fence inside a block closes it
/// only when it is a bare ```` ``` ```` line, as CommonMark has it for an opening fence of
/// three backticks.
pub fn parse(file: &str, text: &str) -> Result<Vec<Block>> {
    let mut blocks = Vec::new();
    let mut heading = String::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        match open.as_mut() {
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    open = Some(Block {
                        file: file.to_string(),
                        line: i + 1,
                        heading: heading.clone(),
                        info: info.trim().to_string(),
                        text: String::new(),
                    });
                } else if line.starts_with('#') && line.contains("# ") {
                    heading = line.trim_end().to_string();
                }
            }
            Some(block) => {
                if line.trim_end() == "```" {
                    blocks.extend(open.take());
                } else {
                    block.text.push_str(line);
                    block.text.push('\n');
                }
            }
        }
    }
    match open {
        Some(b) => Err(format!("{}: a code block is not closed", b.place())),
        None => Ok(blocks),
    }
}

/// The files the guide is made of, relative to `root`: README.md, then every Markdown file
/// under `docs/src/` (sorted), then each crate's own README.
pub fn guide_files(root: &Path) -> Result<Vec<String>> {
    let mut files = vec!["README.md".to_string()];
    let mut book = Vec::new();
    collect_md(&root.join("docs/src"), &mut book)?;
    book.sort();
    for f in book {
        let rel = f
            .strip_prefix(root)
            .map_err(|_| format!("{} is outside {}", f.display(), root.display()))?;
        files.push(rel.to_string_lossy().into_owned());
    }
    for krate in CRATE_READMES {
        if root.join(krate).exists() {
            files.push(krate.to_string());
        }
    }
    Ok(files)
}

/// The crates' own READMEs (their crates.io pages), beside the top-level one.
pub const CRATE_READMES: &[&str] = &[
    "gdr/README.md",
    "gdr-sys/README.md",
    "gdr-doctor/README.md",
    "gdr-xfer/README.md",
    "gdr-xfer-proto/README.md",
    "gdr-py/README.md",
];

fn collect_md(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry
            .map_err(|e| format!("reading {}: {e}", dir.display()))?
            .path();
        if path.is_dir() {
            collect_md(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    Ok(())
}

/// Every block of every guide file under `root`.
pub fn all(root: &Path) -> Result<Vec<Block>> {
    let mut blocks = Vec::new();
    for file in guide_files(root)? {
        let path = root.join(&file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        blocks.extend(parse(&file, &text)?);
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MD: &str = "# x\n\n## Using\n\ntext\n\n```toml\n[dependencies]\n```\n\n```rust,no_run\nfn main() {\n    let s = \"```\";\n}\n```\n\n### Next\n\n```\nplain\n```\n";

    #[test]
    fn blocks_keep_their_place_heading_and_info() {
        let b = parse("a.md", MD).unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(
            (b[0].line, b[0].lang(), b[0].heading.as_str()),
            (7, "toml", "## Using")
        );
        assert_eq!(b[0].text, "[dependencies]\n");
        assert!(b[1].has("no_run") && !b[1].has("rust") && b[1].lang() == "rust");
        assert_eq!(b[1].text, "fn main() {\n    let s = \"```\";\n}\n");
        assert_eq!((b[2].lang(), b[2].heading.as_str()), ("", "### Next"));
        assert_eq!(b[2].place(), "a.md:19");
    }

    #[test]
    fn an_open_block_is_an_error() {
        let e = parse("a.md", "```toml\na = 1\n").unwrap_err();
        assert!(e.contains("a.md:1") && e.contains("not closed"), "{e}");
    }

    #[test]
    fn a_hash_in_a_block_is_no_heading() {
        let b = parse("a.md", "## A\n```sh\n# a comment\n```\n```sh\nx\n```\n").unwrap();
        assert_eq!(b[1].heading, "## A");
    }
}
