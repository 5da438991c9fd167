//! `cargo xtask demo`: the README's main job, run inside the Soft-RoCE VM.

use crate::vm::{self, shell_quote, VmOpts};
use crate::{cargo, say, setup, Result};

/// What the demo builds on the host and what it then runs inside the VM.
struct Payload {
    /// Arguments for `cargo` (run in the workspace root).
    build: Vec<&'static str>,
    /// POSIX sh run as root inside the VM, in the workspace root, with rxe0 up and
    /// `GDR_TEST_DEVICE`, `GDR_TEST_GID_INDEX`, `GDR_TEST_ADDR` exported.
    script: String,
}

/// The one function to change when the demo changes. Today: query rxe0 through gdr-sys.
///
/// For the RDMA write demo this becomes, for example:
/// build `["build", "--example", "rdma_write"]` and the script
/// `"$EX" --server & sleep 1; "$EX" --connect "$GDR_TEST_ADDR"; rc=$?; wait; exit $rc`
/// (one rxe device, two processes: they reach each other through rxe0's own address).
fn payload(target_dir: &std::path::Path) -> Payload {
    let example = target_dir.join("debug/examples/query_device");
    Payload {
        build: vec!["build", "-p", "gdr-sys", "--example", "query_device"],
        script: format!(
            "exec {} \"$GDR_TEST_DEVICE\"\n",
            shell_quote(&example.to_string_lossy())
        ),
    }
}

pub fn demo(opts: &VmOpts) -> Result<i32> {
    setup::ensure_packages()?;
    let meta = cargo::metadata()?;
    let p = payload(&meta.target_dir);
    say!("building: cargo {}", p.build.join(" "));
    setup::run(cargo::cargo().args(&p.build))?;
    std::env::set_current_dir(&meta.root).map_err(|e| e.to_string())?;
    Ok(vm::boot(opts, &p.script)?.code)
}
