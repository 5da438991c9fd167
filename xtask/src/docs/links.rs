//! The guide's links between its own files: every relative Markdown link
//! (`[text](../guide/install.md#a-crate-that-uses-gdr)`) names a file or directory of the
//! checkout, and its `#anchor`, when it has one and names a Markdown file, one of that file's
//! headings (as mdBook and GitHub make anchors of headings).

use std::path::Path;

/// The anchor mdBook and GitHub give a heading: lower case, letters, digits, `-` and `_` kept,
/// spaces turned into `-`, everything else dropped.
pub fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// The targets of the inline links of `text` outside code (fenced blocks and `code spans`).
pub fn targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans may hold `](` that is no link.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            match after.find(')') {
                Some(j) => {
                    out.push(after[..j].to_string());
                    rest = &after[j + 1..];
                }
                None => break,
            }
        }
    }
    out
}

/// Every broken link of the guide file `file` (relative to `root`), as a message.
pub fn broken(root: &Path, file: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let dir = Path::new(file).parent().unwrap_or(Path::new(""));
    for t in targets(text) {
        if t.contains("://") || t.starts_with("mailto:") {
            continue;
        }
        let (path, frag) = t.split_once('#').unwrap_or((t.as_str(), ""));
        let target = if path.is_empty() {
            root.join(file)
        } else {
            root.join(dir).join(path)
        };
        if !target.exists() {
            problems.push(format!(
                "{file}: the link ({t}) names {}, which is not there",
                target.display()
            ));
            continue;
        }
        if frag.is_empty() || target.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let headings = std::fs::read_to_string(&target).unwrap_or_default();
        let known = headings
            .lines()
            .filter(|l| l.starts_with('#') && l.contains("# "))
            .any(|l| anchor(l) == frag);
        if !known {
            problems.push(format!(
                "{file}: the link ({t}): no heading of {} has the anchor #{frag}",
                target.display()
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_are_made_as_mdbook_makes_them() {
        assert_eq!(
            anchor("## gdr-xfer against perftest (VM)"),
            "gdr-xfer-against-perftest-vm"
        );
        assert_eq!(anchor("# A crate that uses gdr"), "a-crate-that-uses-gdr");
        assert_eq!(anchor("## `gdr doctor`, and why"), "gdr-doctor-and-why");
    }

    #[test]
    fn links_in_code_are_no_links() {
        let md = "see [a](x.md) and `f(a)](b)`\n```rust\nlet x = [1](2);\n```\n[b](y.md#z)\n";
        assert_eq!(targets(md), ["x.md", "y.md#z"]);
    }

    #[test]
    fn a_missing_file_or_heading_is_reported() {
        let root = std::env::temp_dir().join(format!("xtask-links-{}", std::process::id()));
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::write(root.join("d/b.md"), "# B\n## Two words\n").unwrap();
        let text = "[ok](b.md#two-words) [no](c.md) [bad](b.md#three) [web](https://x/y)";
        let p = broken(&root, "d/a.md", text);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("c.md") && p[1].contains("#three"), "{p:?}");
    }
}
