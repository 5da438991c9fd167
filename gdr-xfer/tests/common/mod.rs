//! What the gdr-xfer device tests share: the device under test and agents on it.
#![allow(dead_code)]

pub mod etcd;

use std::time::Duration;

use gdr_xfer::{Agent, AgentConfig, Peer};

/// The RDMA device the tests run on (`GDR_TEST_DEVICE`); a missing device is a failure.
pub fn device() -> String {
    std::env::var("GDR_TEST_DEVICE").expect("GDR_TEST_DEVICE is not set: this test needs an RDMA device (cargo xtask test runs it in the Soft-RoCE VM)")
}

/// An agent on the test device.
pub fn agent(name: &str) -> Agent {
    agent_with(AgentConfig::new(name))
}

/// An agent on the test device with settings. `GDR_TEST_DEVICE` may list several devices
/// (`rxe0,rxe1`: the VM tier's two-rail run); the agent must then have one rail per device, so
/// that a missing device fails here instead of the tests passing on fewer rails.
pub fn agent_with(cfg: AgentConfig) -> Agent {
    let spec = device();
    let agent = Agent::new(cfg.device(spec.clone())).expect("agent on the test device");
    let want = spec.split(',').filter(|d| !d.is_empty()).count();
    assert_eq!(
        agent.rails().len(),
        want,
        "GDR_TEST_DEVICE={spec} names {want} devices but the agent opened {:?}: a device is missing or down",
        agent.rails()
    );
    agent
}

/// Two agents of this process, `a` connected to `b`: (a, b, a's handle of b, b's handle of a).
pub fn connected(a: Agent, b: Agent) -> (Agent, Agent, Peer, Peer) {
    let addr = b.listen("127.0.0.1:0").unwrap();
    let pb = a.connect(&addr.to_string()).unwrap();
    let pa = b.wait_peer(a.name(), Duration::from_secs(10)).unwrap();
    (a, b, pb, pa)
}

/// A pattern that differs for every byte position and every seed.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(40503))
                .rotate_left(7) as u8
        })
        .collect()
}
