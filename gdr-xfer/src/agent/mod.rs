//! The agent: one per process, named; owns its rails (each a device port with its protection
//! domain, completion queue and progress thread), segments and peers.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gdr::cuda::{DeviceBuffer, DeviceMemory};
use gdr::device::{Context, DeviceList, PortState, Selection};
use gdr::gpu_mr::RegistrationPath;
use gdr::mr::{AccessFlags, AlignedBuffer, HostMemory, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::CompletionQueue;

use gdr_xfer_proto::{Endpoint, LocalError};

use crate::cache::{CacheStats, RegistrationCache};
use crate::config::AgentConfig;
use crate::control;
use crate::error::{Error, Foreign, Result};
use crate::intake::Intake;
use crate::notify::{NoteQueue, Notification};
use crate::peer::Peer;
use crate::rail::{AgentRail, QpShape, Rails};
use crate::segment::{Backing, Segment};
use crate::shared::{connections, AgentShared};
use crate::staged::driver::Driver as StagingDriver;
use crate::staged_memory::{StagedDevice, StagedMemory};
use crate::wakers::Wakers;
use crate::wire::{Message, SegmentInfo, MAX_NAME};
use crate::GpuStaging;
use gdr_xfer_proto::Location;

/// Access every segment is registered with: peers may read and write it.
const SEGMENT_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

mod registration;
#[cfg(test)]
mod tests;

/// A transfer agent. See the [crate documentation](crate) for an example.
///
/// [`Agent::shutdown`] ends it in order, with a grace time for pending transfers; dropping it
/// does the same without one: every connection closes (pending transfers fail with
/// [`Error::AgentClosed`]), its directory records go, and its threads stop; memory still in use
/// by the NIC is released by gdr only once the queue pairs are destroyed.
pub struct Agent {
    pub(crate) shared: Arc<AgentShared>,
    pub(crate) progress: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) listeners: Mutex<Vec<(SocketAddr, JoinHandle<()>)>>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.shared.config.name)
            .field("rails", &self.rails())
            .finish()
    }
}

impl Agent {
    /// Opens the rails (see [`AgentConfig::device`]), creates their completion queues and
    /// starts their progress threads.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad settings; gdr's errors opening the devices.
    pub fn new(config: AgentConfig) -> Result<Agent> {
        config.validate()?;
        let ports = select_rails(&config)?;
        let mut rails = Vec::with_capacity(ports.len());
        for (ctx, port) in ports {
            let pd = ProtectionDomain::new(&ctx)?;
            let attr = ctx.query_device()?;
            let per_peer = u64::from(config.qps_per_peer) * u64::from(config.send_queue_depth)
                + u64::from(config.notify_slots);
            let want = per_peer * u64::from(config.max_peers);
            let max_cqe = attr.max_cqe.max(1) as u64;
            if per_peer > max_cqe {
                return Err(Error::invalid(
                    format!(
                        "one peer needs {per_peer} completion queue entries; {} allows {max_cqe}",
                        ctx.name()
                    ),
                    "lower qps_per_peer, send_queue_depth or notify_slots",
                ));
            }
            let cq = CompletionQueue::with_channel(&ctx, want.min(max_cqe) as u32)?;
            rails.push(AgentRail { ctx, port, pd, cq });
        }
        let nrails = rails.len();
        let mut staging = config.staging;
        if staging.nic_rate == 0 {
            staging.nic_rate = rails_rate(&rails);
        }
        let staging = Arc::new(StagingDriver::new(
            rails.iter().map(|r| r.pd.clone()).collect(),
            staging,
            config.busy_poll,
        ));
        static AGENTS: AtomicU64 = AtomicU64::new(1);
        let id = AGENTS.fetch_add(1, Ordering::Relaxed);
        let notes = Arc::new(NoteQueue::new(config.notify_queue));
        let max_peers = config.max_peers as usize;
        let shared = Arc::new(AgentShared {
            rails: Arc::new(Rails::new(
                rails,
                QpShape {
                    send_queue_depth: config.send_queue_depth,
                    recv_slots: config.notify_slots,
                    ack_timeout: config.ack_timeout,
                    retry_count: config.retry_count,
                    gid_index: config.gid_index,
                },
            )),
            intake: Arc::new(Intake::new(id, config.default_timeout, staging)),
            config,
            cache: Mutex::new(RegistrationCache::default()),
            endpoint: Arc::new(Mutex::new(Endpoint::new(id, nrails, max_peers))),
            notes,
            peer_wakers: Wakers::default(),
            peers_changed: Condvar::new(),
            shutdown: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            handshakes: AtomicU32::new(0),
            #[cfg(feature = "etcd")]
            published: Mutex::new(None),
        });
        let agent = Agent {
            shared,
            progress: Mutex::new(Vec::with_capacity(nrails)),
            listeners: Mutex::new(Vec::new()),
        };
        for rail in 0..nrails {
            let s = agent.shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("xfer-progress-{}-{rail}", agent.shared.config.name))
                .spawn(move || crate::progress::run(s, rail))
                .map_err(|e| Error::io("starting a progress thread", e))?;
            agent
                .progress
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(h);
        }
        Ok(agent)
    }

    #[cfg(feature = "etcd")]
    pub(crate) fn shared(&self) -> &Arc<AgentShared> {
        &self.shared
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// The RDMA device of its first rail.
    pub fn device(&self) -> &str {
        self.shared.rails[0].ctx.name()
    }

    /// Its rails: (device, port), rail 0 first.
    pub fn rails(&self) -> Vec<(String, u8)> {
        self.shared.rail_names()
    }

    /// Its settings.
    pub fn config(&self) -> &AgentConfig {
        &self.shared.config
    }
}

impl Agent {
    // ----- peers -----

    /// Accepts connections from peers on `addr` (for example `0.0.0.0:0`) in a background
    /// thread; returns the address bound. Accepted peers appear in [`Agent::peers`].
    ///
    /// # Errors
    /// [`Error::Io`] when the address cannot be bound.
    pub fn listen(&self, addr: &str) -> Result<SocketAddr> {
        self.shared.check_open()?;
        let listener =
            TcpListener::bind(addr).map_err(|e| Error::io(format!("listening on {addr}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io("listener address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("non-blocking listener", e))?;
        let shared = self.shared.clone();
        let handle = std::thread::Builder::new()
            .name(format!("xfer-listen-{}", self.name()))
            .spawn(move || control::accept_loop(shared, listener))
            .map_err(|e| Error::io("starting the listener thread", e))?;
        self.listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((local, handle));
        Ok(local)
    }

    /// Connects to the agent listening at `addr` (`host:port`). A refused connection is tried
    /// again until [`AgentConfig::connect_timeout`] (10 s by default: the peer may not listen
    /// yet), and the handshake must end within what is left of it.
    ///
    /// # Errors
    /// [`Error::Io`] (with the last refusal or the socket's error) when nothing accepted within
    /// the connect timeout, or when the handshake's socket failed or timed out;
    /// [`Error::Protocol`] for a peer that is not a compatible gdr-xfer agent;
    /// [`Error::InvalidArgument`] when a peer of that name is already connected.
    pub fn connect(&self, addr: &str) -> Result<Peer> {
        self.connect_within(addr, self.shared.config.connect_timeout)
    }

    /// [`Agent::connect`], all of it (dialling and the handshake) within `timeout`.
    pub(crate) fn connect_within(&self, addr: &str, timeout: Duration) -> Result<Peer> {
        control::connect(&self.shared, addr, timeout)
    }

    /// The connected peer with this name.
    pub fn peer(&self, name: &str) -> Option<Peer> {
        Peer::ready(&self.shared, name)
    }

    /// The connected peers.
    pub fn peers(&self) -> Vec<Peer> {
        let endpoint = self.shared.lock_endpoint();
        let mut v: Vec<Peer> = endpoint
            .peers()
            .map(|c| Peer::new(c.clone(), &self.shared))
            .collect();
        v.sort_by(|a, b| a.name().cmp(b.name()));
        v
    }

    /// Waits until a peer with this name is connected (it connected to us, or we to it).
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::AgentClosed`] at once after [`Agent::shutdown`] (a wait in
    /// progress when it begins ends with it).
    pub fn wait_peer(&self, name: &str, timeout: Duration) -> Result<Peer> {
        let end = Instant::now().checked_add(timeout);
        let mut endpoint = self.shared.lock_endpoint();
        loop {
            // Checked under the peers' lock, which shutdown sets the flag under before it
            // wakes the waiters: none misses it.
            self.shared.check_open()?;
            if let Some(c) = endpoint.peer(name) {
                return Ok(Peer::new(c.clone(), &self.shared));
            }
            let left = end.map_or(Duration::from_secs(3600), |e| {
                e.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                return Err(Error::Timeout {
                    what: format!("waiting for peer {name:?} to connect"),
                    after: timeout,
                    hint: "is it running and connecting to this agent's listen address?".into(),
                });
            }
            endpoint = self
                .shared
                .peers_changed
                .wait_timeout(endpoint, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Closes the connection to a peer. New transfers to it are refused at once; those in
    /// flight stop, each reporting [`Error::PeerLost`] (success if all its bytes had landed)
    /// once neither side's memory can be touched by it: its requests in flight completed, or
    /// were fenced (within about twice [`AgentConfig::quiesce`]). It returns once they all
    /// reported (or that bound passed); then the peer is told goodbye and the connection
    /// closes. After [`Agent::shutdown`] every connection is closed already: it does nothing.
    ///
    /// # Errors
    /// [`Error::ForeignObject`] for another agent's peer handle (its connection is left as it
    /// is).
    pub fn disconnect(&self, peer: &Peer) -> Result<()> {
        if peer.conn.agent_id != self.shared.id() {
            return Err(Error::ForeignObject {
                call: "Agent::disconnect",
                object: Foreign::Peer(peer.name().to_string()),
                hint: "disconnect a peer through the agent that connected it".into(),
            });
        }
        self.shared.disconnect(&peer.conn);
        Ok(())
    }

    // ----- notifications -----

    /// Notifications received (or put back) and not taken yet: at most
    /// [`AgentConfig::notify_queue`] plus the receive slots of the agent's connections, plus
    /// those put back (see [`AgentConfig::notify_queue`]).
    pub fn pending_notifications(&self) -> usize {
        self.shared.notes.len()
    }

    /// Takes every notification received so far (their receive slots are posted again: the
    /// peers may send more). After [`Agent::shutdown`] it still gives what was received
    /// before.
    pub fn take_notifications(&self) -> Vec<Notification> {
        self.shared.notes.take_all()
    }

    /// Waits for the next notification (`Ok(None)` when `timeout` passes first).
    ///
    /// # Errors
    /// [`Error::AgentClosed`] once the agent is shut down and every notification received
    /// (or put back) before was taken.
    pub fn wait_notification(&self, timeout: Duration) -> Result<Option<Notification>> {
        self.shared.notes.wait(timeout)
    }

    /// Puts back a notification the application took but could not deliver (its consumer
    /// went away, say): it goes to the FRONT of the agent's queue, so the next wait or take
    /// ([`Agent::wait_notification`], [`Agent::wait_notification_async`],
    /// [`Agent::notifications`], [`Agent::take_notifications`]) returns it first, and the
    /// waiters wake as for a delivery. It holds no receive slot (its slot was posted again
    /// when it was taken). It works after [`Agent::shutdown`] too: waits end with
    /// [`Error::AgentClosed`] only once the queue is empty, so a notification put back is
    /// still returned.
    ///
    /// Putting back notifications in the reverse order they were taken restores the queue's
    /// order.
    pub fn requeue_notification(&self, n: Notification) {
        self.shared.notes.requeue(n);
    }
}

/// The rails an agent opens: every port the selection allows, in its order, active ones only
/// when there are any (else the first allowed), at most `max_rails`.
fn select_rails(config: &AgentConfig) -> Result<Vec<(Arc<Context>, u8)>> {
    let selection = Selection::parse(&config.device)?;
    let list = DeviceList::new()?;
    let mut ports: Vec<(String, u8, bool)> = Vec::new();
    let mut contexts: HashMap<String, Arc<Context>> = HashMap::new();
    for name in list.names() {
        let Ok(ctx) = list.open(&name) else {
            continue;
        };
        let count = ctx.query_device().map_or(0, |a| a.phys_port_cnt);
        for port in 1..=count {
            if selection.allows(&name, port) {
                let active = ctx
                    .query_port(port)
                    .is_ok_and(|p| p.state == PortState::Active);
                ports.push((name.clone(), port, active));
            }
        }
        contexts.insert(name, ctx);
    }
    // The selection's order: repeatedly its first match among the ports left.
    let mut ordered = Vec::with_capacity(ports.len());
    while !ports.is_empty() {
        let pairs: Vec<(&str, u8)> = ports.iter().map(|(n, p, _)| (n.as_str(), *p)).collect();
        let i = match selection.first_match(&pairs) {
            Some((n, p)) => ports
                .iter()
                .position(|(pn, pp, _)| *pn == n && *pp == p)
                .unwrap_or(0),
            None => 0,
        };
        ordered.push(ports.remove(i));
    }
    let any_active = ordered.iter().any(|(_, _, a)| *a);
    let chosen: Vec<(String, u8)> = if any_active {
        ordered
            .into_iter()
            .filter(|(_, _, a)| *a)
            .take(usize::from(config.max_rails))
            .map(|(n, p, _)| (n, p))
            .collect()
    } else {
        ordered
            .into_iter()
            .take(1)
            .map(|(n, p, _)| (n, p))
            .collect()
    };
    if chosen.is_empty() {
        // Nothing allowed: gdr's own error names the devices that exist.
        let (ctx, port) = Context::open_selected(&selection)?;
        return Ok(vec![(ctx, port)]);
    }
    Ok(chosen
        .into_iter()
        .filter_map(|(n, p)| contexts.get(&n).map(|c| (c.clone(), p)))
        .collect())
}

/// The rails' link rates together, in bytes per second (0 when a port does not say): what a
/// staged transfer's chunks can leave or arrive at, for the least-time cut
/// ([`crate::staging::StagingConfig::nic_rate`]).
fn rails_rate(rails: &[AgentRail]) -> u64 {
    let mut gbps = 0.0f64;
    for r in rails {
        match r.ctx.query_port(r.port).ok().and_then(|a| a.rate_gbps) {
            Some(g) if g.is_finite() && g > 0.0 => gbps += g,
            _ => return 0,
        }
    }
    // Gb/s to bytes per second; at most a few Tb/s, far inside u64.
    (gbps * 1e9 / 8.0) as u64
}
