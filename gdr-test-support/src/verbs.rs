//! gdr's verbs on the device under test: a protection domain, two connected queue pairs, and
//! the port's link taken down and brought back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr::cq::{Completion, CompletionQueue};
use gdr::device::Context;
use gdr::pd::ProtectionDomain;
use gdr::qp::{QueuePair, QueuePairBuilder};

use crate::device;

/// A protection domain on the device under test.
pub fn pd() -> Arc<ProtectionDomain> {
    let ctx = Context::open(&device()).expect("open the test device");
    ProtectionDomain::new(&ctx).unwrap()
}

/// Two queue pairs of one process with a completion queue each (`cq_b` has a completion
/// channel).
pub struct Pair {
    pub pd: Arc<ProtectionDomain>,
    pub a: QueuePair,
    pub b: QueuePair,
    pub cq_a: Arc<CompletionQueue>,
    pub cq_b: Arc<CompletionQueue>,
}

/// Two queue pairs built with `f`, connected to each other when `connect`.
pub fn pair_of(connect: bool, f: impl Fn(QueuePairBuilder) -> QueuePairBuilder) -> Pair {
    let ctx = Context::open(&device()).expect("open the test device");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq_a = CompletionQueue::new(&ctx, 1024).unwrap();
    let cq_b = CompletionQueue::with_channel(&ctx, 1024).unwrap();
    let a = f(QueuePair::builder(&pd, &cq_a, &cq_a)).build().unwrap();
    let b = f(QueuePair::builder(&pd, &cq_b, &cq_b)).build().unwrap();
    if connect {
        a.connect(&b.endpoint()).unwrap();
        b.connect(&a.endpoint()).unwrap();
    }
    Pair {
        pd,
        a,
        b,
        cq_a,
        cq_b,
    }
}

/// Everything `cq` reports within `d`.
pub fn drain_for(cq: &CompletionQueue, d: Duration) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut buf = [Completion::default(); 16];
    let end = Instant::now() + d;
    while Instant::now() < end {
        let n = cq.poll(&mut buf).unwrap();
        got.extend_from_slice(&buf[..n]);
        if n == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    got
}

/// The network device under RDMA port `port` of `device` (Soft-RoCE's netdev), from sysfs.
pub fn netdev_of(device: &str, port: u8) -> String {
    let path = format!("/sys/class/infiniband/{device}/ports/{port}/gid_attrs/ndevs/0");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (a RoCE port names its netdev there)"))
        .trim()
        .to_string()
}

/// Takes `netdev` down or up (`ip link set`; needs root, as in the VM).
pub fn set_link(netdev: &str, up: bool) {
    let state = if up { "up" } else { "down" };
    let ok = std::process::Command::new("ip")
        .args(["link", "set", netdev, state])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "ip link set {netdev} {state} failed");
}

/// Waits until port `port` of `ctx` is ACTIVE again and its RoCE v2 GID is back at the index the
/// harness announced (`GDR_TEST_GID_INDEX`), so the tests after this one find the device as it was.
pub fn wait_port_restored(ctx: &Context, port: u8) {
    let want: Option<u32> = std::env::var("GDR_TEST_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok());
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let active = ctx
            .query_port(port)
            .map(|p| p.state == gdr::device::PortState::Active);
        let gid = ctx.default_gid(port).map(|g| g.index);
        if *active.as_ref().unwrap_or(&false)
            && (want.is_none() || gid.as_ref().ok() == want.as_ref())
        {
            return;
        }
        assert!(
            Instant::now() < end,
            "port {port} not restored: active {active:?}, GID index {gid:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
