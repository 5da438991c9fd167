//! gdr-xfer on the device under test: agents, and two of them connected (feature `xfer`).

use std::time::Duration;

use gdr_xfer::{Agent, AgentConfig, Peer};

use crate::device;

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
