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

/// The demo: `examples/rdma_write.rs` as server and client, two processes on the VM's one rxe
/// device (they reach each other through rxe0's own address). The client writes a pattern into
/// the server's registered memory; the server verifies every byte.
fn payload(target_dir: &std::path::Path) -> Payload {
    let example = shell_quote(
        &target_dir
            .join("debug/examples/rdma_write")
            .to_string_lossy(),
    );
    Payload {
        build: vec!["build", "--example", "rdma_write"],
        script: format!(
            "{example} --server --size 1048576 &\n\
             server=$!\n\
             sleep 1\n\
             {example} --connect \"$GDR_TEST_ADDR\" --size 1048576 --iters 20\n\
             client=$?\n\
             wait $server; server=$?\n\
             [ $client -eq 0 ] && [ $server -eq 0 ] && echo 'demo: RDMA write verified' || echo 'demo: FAILED'\n\
             exit $((client | server))\n"
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
