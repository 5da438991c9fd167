//! Running cargo from xtask: workspace metadata and the executables a build produced.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::Result;

/// The cargo that runs us (so toolchain overrides carry over).
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

/// The workspace root: xtask lives directly under it.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}

pub struct Metadata {
    pub root: PathBuf,
    pub target_dir: PathBuf,
    /// Package name by manifest directory.
    pub packages: HashMap<PathBuf, String>,
    /// Every target of every workspace package: (package, kind, name), e.g.
    /// `("gdr-xfer", "example", "kv_transfer")`.
    pub targets: Vec<(String, String, String)>,
}

/// `cargo metadata --no-deps`.
pub fn metadata() -> Result<Metadata> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata failed ({})", out.status));
    }
    let v: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    let path = |key: &str| {
        v[key]
            .as_str()
            .map(PathBuf::from)
            .ok_or_else(|| format!("cargo metadata has no {key}"))
    };
    let packages = v["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let dir = Path::new(p["manifest_path"].as_str()?)
                .parent()?
                .to_path_buf();
            Some((dir, p["name"].as_str()?.to_string()))
        })
        .collect();
    let mut targets = Vec::new();
    for p in v["packages"].as_array().into_iter().flatten() {
        let package = p["name"].as_str().unwrap_or_default();
        for t in p["targets"].as_array().into_iter().flatten() {
            let name = t["name"].as_str().unwrap_or_default();
            for kind in t["kind"].as_array().into_iter().flatten() {
                let kind = kind.as_str().unwrap_or_default();
                targets.push((package.to_string(), kind.to_string(), name.to_string()));
            }
        }
    }
    Ok(Metadata {
        root: path("workspace_root")?,
        target_dir: path("target_directory")?,
        packages,
        targets,
    })
}

/// One executable that cargo built.
#[derive(Clone, Debug)]
pub struct Artifact {
    /// Package name.
    pub package: String,
    /// The package's directory (cargo runs tests there).
    pub package_dir: PathBuf,
    /// Target kind: `lib`, `bin`, `test`, `example`, `bench`, ...
    pub kind: String,
    /// Target name, e.g. `device_query`.
    pub name: String,
    /// Built with the test harness (`cargo test`).
    pub test: bool,
    pub executable: PathBuf,
}

impl Artifact {
    /// E.g. `gdr-sys test device_query`.
    pub fn label(&self) -> String {
        format!("{} {} {}", self.package, self.kind, self.name)
    }
}

/// Runs `cargo <args> --message-format=json-render-diagnostics` (diagnostics and progress go to
/// stderr as usual) and returns every executable it produced.
pub fn build(args: &[&str]) -> Result<Vec<Artifact>> {
    let meta = metadata()?;
    let mut child = cargo()
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    let mut found: Vec<Artifact> = Vec::new();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.map_err(|e| e.to_string())?;
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = v["executable"].as_str() else {
            continue;
        };
        let Some(dir) = v["manifest_path"]
            .as_str()
            .and_then(|p| Path::new(p).parent())
        else {
            continue;
        };
        let artifact = Artifact {
            package: meta
                .packages
                .get(dir)
                .cloned()
                .unwrap_or_else(|| dir.display().to_string()),
            package_dir: dir.to_path_buf(),
            kind: v["target"]["kind"][0].as_str().unwrap_or("?").to_string(),
            name: v["target"]["name"].as_str().unwrap_or("?").to_string(),
            test: v["profile"]["test"].as_bool().unwrap_or(false),
            executable: PathBuf::from(exe),
        };
        if !found.iter().any(|a| a.executable == artifact.executable) {
            found.push(artifact);
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("cargo {} failed ({status})", args.join(" ")));
    }
    found.sort_by(|a, b| (&a.package, &a.kind, &a.name).cmp(&(&b.package, &b.kind, &b.name)));
    Ok(found)
}
