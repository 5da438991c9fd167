//! The cluster tier's environment: several Soft-RoCE hosts with several rails each
//! (`cargo xtask cluster`, run by `cargo xtask test`), the same test binary on every host at once.
//! The harness tells each host who it is and where its peers are:
//!
//! * `GDR_HOSTS`, `GDR_RAILS`: how many hosts and rails; `GDR_HOST_INDEX`: this host (from 1);
//! * `GDR_RAIL<r>_DEVICE`, `GDR_RAIL<r>_GID_INDEX`: this host's RDMA device on rail `r` (from 0)
//!   and its RoCE v2 GID;
//! * `GDR_HOST<h>_RAIL<r>_ADDR`: host `h`'s address on rail `r` (`10.78.<r>.<h>`);
//! * `GDR_FAULT`: the `gdr-fault` command that cuts links and adds loss on the hosts' rails.

/// The cluster variable `k`; a missing one is a failure.
pub fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| {
        panic!("{k} is not set: this test needs the cluster tier (cargo xtask test runs it)")
    })
}

/// This host's RDMA device on rail `rail`.
pub fn device(rail: u32) -> String {
    env(&format!("GDR_RAIL{rail}_DEVICE"))
}

/// Host `host`'s IP address on rail `rail`.
pub fn addr(host: u32, rail: u32) -> String {
    env(&format!("GDR_HOST{host}_RAIL{rail}_ADDR"))
}

/// Packets rxe sent on rail `rail` so far (the port's hardware counter).
pub fn sent_pkts(rail: u32) -> u64 {
    let p = format!(
        "/sys/class/infiniband/{}/ports/1/hw_counters/sent_pkts",
        device(rail)
    );
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

/// Runs `gdr-fault` with `args`; panics unless it succeeded.
pub fn fault(args: &[&str]) {
    let st = std::process::Command::new(env("GDR_FAULT"))
        .args(args)
        .status()
        .unwrap();
    assert!(st.success(), "gdr-fault {args:?}: {st}");
}
