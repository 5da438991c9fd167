//! The agent: one per process, named; owns its rails (each a device port with its protection
//! domain, completion queue and progress thread), segments and peers.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener};
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gdr::cuda::{DeviceBuffer, DeviceMemory};
use gdr::device::{Context, DeviceList, PortState, Selection};
use gdr::gpu_mr::RegistrationPath;
use gdr::mr::{AccessFlags, AlignedBuffer, HostMemory, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::CompletionQueue;

use gdr_xfer_proto::LaneRef;

use crate::cache::{CacheStats, RegistrationCache};
use crate::config::AgentConfig;
use crate::connection::Connection;
use crate::control;
use crate::error::{Error, Result};
use crate::notify::{Delivered, Notification};
use crate::peer::Peer;
use crate::rail::AgentRail;
use crate::segment::{Backing, Segment};
use crate::staged::driver::Driver as StagingDriver;
use crate::staged::{StagedDevice, StagedMemory};
use crate::transfer::Failure;
use crate::wakers::Wakers;
use crate::wire::{Message, SegmentInfo, MAX_NAME};
use crate::GpuStaging;
use gdr_xfer_proto::Location;

/// Access every segment is registered with: peers may read and write it.
const SEGMENT_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// A connection forgotten by name: each rail's drain count then, and what to fail its transfers
/// with.
type Retiring = (Arc<Connection>, Vec<u64>, Option<Failure>);

/// What the agent's threads share.
pub(crate) struct AgentShared {
    pub(crate) config: AgentConfig,
    /// This agent's number in the process (segments carry it: another agent's segment is
    /// refused before anything is posted).
    pub(crate) id: u64,
    pub(crate) rails: Vec<AgentRail>,
    /// Per memory location, the rails its transfers stripe over (bit per rail; see
    /// [`crate::rail::preferred_rails`]).
    rail_masks: Mutex<HashMap<Location, u32>>,
    segments: Mutex<BTreeMap<u32, Segment>>,
    next_segment: AtomicU32,
    cache: Mutex<RegistrationCache>,
    peers: Mutex<HashMap<String, Arc<Connection>>>,
    /// (rail, queue pair number) -> (connection, its lane and the queue pair's generation);
    /// numbers are per device, so two rails may have the same ones ([`qp_key`]). A connection
    /// stays here (and alive) after it was lost until the progress thread drained the
    /// completion queue past the loss (`retiring`), so that completions already queued, a
    /// notification that arrived just before the peer said goodbye among them, are still
    /// handled.
    by_qpn: RwLock<HashMap<u64, (Arc<Connection>, LaneRef)>>,
    /// Connections forgotten by name, with the drain count at that moment, and the failure to
    /// give what is still in flight on them once the completions queued then were handled.
    retiring: Mutex<Vec<Retiring>>,
    /// Per rail, how many polls found its completion queue drained (fewer completions than
    /// asked for).
    drains: Vec<AtomicU64>,
    /// Notifications delivered and not taken yet; each holds its receive slot until taken, so
    /// the queue is bounded by the peers' slots.
    notifications: Mutex<VecDeque<Delivered>>,
    notified: Condvar,
    /// The async waits for notifications ([`crate::futures`]).
    pub(crate) notification_wakers: Wakers,
    /// The async waits for peers.
    pub(crate) peer_wakers: Wakers,
    /// When the connections' timers last ran; whichever progress thread finds it free and due
    /// runs them.
    timers: Mutex<Instant>,
    peers_changed: Condvar,
    pub(crate) shutdown: AtomicBool,
    /// Set by [`Agent::shutdown`] (and drop): new transfers, registrations and connections are
    /// refused with [`Error::AgentClosed`].
    pub(crate) closing: AtomicBool,
    /// The callers' transfers without an outcome yet ([`crate::transfer::Pending`]).
    pub(crate) pending: Arc<AtomicUsize>,
    /// Threads to join at drop (control readers, directory watches).
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Handshakes of accepted connections in progress (at most `max_peers`).
    handshakes: AtomicU32,
    /// The directory this agent published itself in (feature `etcd`).
    #[cfg(feature = "etcd")]
    published: Mutex<Option<crate::discovery::Published>>,
    /// Transfers of staged GPU segments ([`crate::staged`]).
    pub(crate) staging: Arc<StagingDriver>,
}

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
        let staging = Arc::new(StagingDriver::new(
            rails.iter().map(|r| r.pd.clone()).collect(),
            config.staging,
        ));
        static AGENTS: AtomicU64 = AtomicU64::new(1);
        let shared = Arc::new(AgentShared {
            config,
            id: AGENTS.fetch_add(1, Ordering::Relaxed),
            rails,
            rail_masks: Mutex::new(HashMap::new()),
            segments: Mutex::new(BTreeMap::new()),
            next_segment: AtomicU32::new(1),
            cache: Mutex::new(RegistrationCache::default()),
            peers: Mutex::new(HashMap::new()),
            by_qpn: RwLock::new(HashMap::new()),
            retiring: Mutex::new(Vec::new()),
            drains: (0..nrails).map(|_| AtomicU64::new(0)).collect(),
            notifications: Mutex::new(VecDeque::new()),
            notified: Condvar::new(),
            notification_wakers: Wakers::default(),
            peer_wakers: Wakers::default(),
            timers: Mutex::new(Instant::now()),
            peers_changed: Condvar::new(),
            shutdown: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            pending: Arc::new(AtomicUsize::new(0)),
            threads: Mutex::new(Vec::new()),
            handshakes: AtomicU32::new(0),
            #[cfg(feature = "etcd")]
            published: Mutex::new(None),
            staging,
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

    // ----- segments -----

    /// Registers host memory the segment will own (`Vec<u8>`, gdr's `AlignedBuffer`, ...).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name over 64 bytes; gdr's registration errors.
    pub fn register_host(
        &self,
        memory: impl HostMemory,
        name: &str,
        location: Location,
    ) -> Result<Segment> {
        self.shared.check_open()?;
        check_name(name)?;
        let first =
            MemoryRegion::register(&self.shared.rails[0].pd, Box::new(memory), SEGMENT_ACCESS)?;
        let len = gdr::mr::Registered::len(&*first) as u64;
        let mut regions = vec![first.clone()];
        for rail in &self.shared.rails[1..] {
            regions.push(first.register_again(&rail.pd, SEGMENT_ACCESS)?);
        }
        self.add_segment(name, location, Backing::Host(Arc::new(regions)), 0, len)
    }

    /// Allocates `len` zeroed, page-aligned bytes of host memory and registers them.
    ///
    /// # Errors
    /// As [`Agent::register_host`].
    pub fn alloc_host(&self, len: usize, name: &str) -> Result<Segment> {
        self.register_host(
            AlignedBuffer::zeroed(len)?,
            name,
            Location::Cpu { numa: None },
        )
    }

    /// Registers `range` of a GPU buffer, through the registration cache: a range an earlier
    /// registration of the same buffer covers costs no verbs call (see [`Agent::cache_stats`]).
    /// The path (dma-buf or peer memory) is gdr's choice ([`RegistrationPath::Auto`]).
    ///
    /// When gdr finds no direct path (no peer-memory module, no dma-buf support) and
    /// [`AgentConfig::gpu_staging`] is [`GpuStaging::Fallback`] (the default), the segment is
    /// *staged* instead: its transfers go through pinned host bounce buffers
    /// ([`crate::staged`]); a warning says so and [`Segment::path`] tells. A staged segment is
    /// the local side of transfers only: peers cannot address it.
    ///
    /// # Errors
    /// gdr's pointer checks and registration errors (with the doctor's hints); with staging,
    /// the errors of making the bounce buffers (pinned memory, `ibv_reg_mr`).
    pub fn register_gpu(
        &self,
        buffer: &Arc<DeviceBuffer>,
        range: impl RangeBounds<usize>,
        name: &str,
    ) -> Result<Segment> {
        self.shared.check_open()?;
        check_name(name)?;
        let (offset, len) = resolve(range, buffer.len())?;
        let location = Location::Cuda {
            ordinal: buffer.ordinal().max(0) as u32,
        };
        let staged = StagedDevice::Cuda(buffer.clone());
        if self.shared.config.gpu_staging == GpuStaging::Always {
            return self.add_staged(name, location, staged, offset, len, "staging is forced");
        }
        let pds: Vec<_> = self.shared.rails.iter().map(|r| r.pd.clone()).collect();
        let registered = self.lock_cache().register_gpu(
            &pds,
            buffer,
            offset,
            len,
            SEGMENT_ACCESS,
            RegistrationPath::Auto,
        );
        match registered {
            Ok((mr, base)) => self.add_segment(name, location, Backing::Gpu(mr), base, len as u64),
            Err(e)
                if self.shared.config.gpu_staging == GpuStaging::Fallback && no_direct_path(&e) =>
            {
                let why = e.to_string();
                self.add_staged(name, location, staged, offset, len, &why)
            }
            Err(e) => Err(e),
        }
    }

    /// Registers `range` of GPU memory the application allocated itself (PyTorch's caching
    /// allocator, cudarc, a pool), through the registration cache, for the NIC to reach
    /// directly. `memory` is any owner implementing gdr's [`DeviceMemory`] (an `unsafe` trait:
    /// its implementation promises the range stays allocated and unchanged while the value
    /// lives); the segment and every request using it keep the `Arc`, so the memory outlives
    /// the NIC's use of it. Sub-ranges of one owner share registrations as for
    /// [`Agent::register_gpu`].
    ///
    /// Without a GPUDirect path the registration fails with gdr's error and its hint: staging
    /// through bounce buffers needs gdr's own [`DeviceBuffer`] ([`Agent::register_gpu`]).
    ///
    /// For an address from C or Python with no Rust owner, wrap it in a type whose `unsafe impl
    /// DeviceMemory` states who keeps it allocated (see [`DeviceMemory`]'s safety section).
    ///
    /// # Errors
    /// As [`Agent::register_gpu`]; [`Error::InvalidArgument`] for a bad range or name.
    pub fn register_gpu_memory<M: DeviceMemory + Send + Sync + 'static>(
        &self,
        memory: Arc<M>,
        range: impl RangeBounds<usize>,
        name: &str,
    ) -> Result<Segment> {
        self.shared.check_open()?;
        check_name(name)?;
        let (offset, len) = resolve(range, memory.len())?;
        let pds: Vec<_> = self.shared.rails.iter().map(|r| r.pd.clone()).collect();
        let (mr, base) = self.lock_cache().register_gpu(
            &pds,
            &memory,
            offset,
            len,
            SEGMENT_ACCESS,
            RegistrationPath::Auto,
        )?;
        let location = Location::Cuda {
            ordinal: mr[0].ordinal().max(0) as u32,
        };
        self.add_segment(name, location, Backing::Gpu(mr), base, len as u64)
    }

    /// Registers `range` of an emulated GPU's memory as a staged segment (feature
    /// `emulated-gpu`): every transfer from or to it takes the staging path, with `memcpy`
    /// copies, as GPU memory without GPUDirect does with `cuMemcpyAsync`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad range or name; the errors of making the bounce
    /// buffers (`ibv_reg_mr`).
    #[cfg(feature = "emulated-gpu")]
    pub fn register_emulated_gpu(
        &self,
        gpu: &Arc<crate::staged::EmulatedGpu>,
        range: impl RangeBounds<usize>,
        name: &str,
    ) -> Result<Segment> {
        self.shared.check_open()?;
        check_name(name)?;
        let (offset, len) = resolve(range, gpu.len())?;
        let location = Location::Cuda {
            ordinal: gpu.ordinal(),
        };
        let dev = StagedDevice::Emulated(gpu.clone());
        self.add_staged(name, location, dev, offset, len, "an emulated GPU")
    }

    fn add_staged(
        &self,
        name: &str,
        location: Location,
        device: StagedDevice,
        offset: usize,
        len: usize,
        why: &str,
    ) -> Result<Segment> {
        let (bounce, how) = self.shared.staging.bounce_for(&device, self.name())?;
        log::warn!("segment {name:?} ({len} bytes of GPU memory) is staged: {why}; {how}");
        let describe = format!("{how}; staged because {why}");
        let memory = Arc::new(StagedMemory {
            device,
            bounce,
            describe,
        });
        self.add_segment(name, location, Backing::Staged(memory), offset, len as u64)
    }

    /// A new segment for `offset..offset + len` of an existing one: same registration, no verbs
    /// call (for many tensors in one allocation).
    ///
    /// # Errors
    /// [`Error::OutOfSegment`] for a range outside `parent`.
    pub fn register_within(
        &self,
        parent: &Segment,
        offset: u64,
        len: u64,
        name: &str,
    ) -> Result<Segment> {
        self.shared.check_open()?;
        check_name(name)?;
        crate::descriptor::check_local(0, parent, offset, len)?;
        self.add_segment(
            name,
            parent.location(),
            parent.inner.backing.clone(),
            parent.inner.base + offset as usize,
            len,
        )
    }

    fn add_segment(
        &self,
        name: &str,
        location: Location,
        backing: Backing,
        base: usize,
        len: u64,
    ) -> Result<Segment> {
        let (addr, rkeys) = match &backing {
            Backing::Host(m) => (m[0].slice(..)?.addr(), m.iter().map(|r| r.rkey()).collect()),
            Backing::Gpu(m) => (m[0].slice(..)?.addr(), m.iter().map(|r| r.rkey()).collect()),
            // Never announced: no address or key a peer could use.
            Backing::Staged(_) => (0, Vec::new()),
        };
        let id = next_segment_id(&self.shared.next_segment).ok_or_else(|| {
            Error::invalid(
                "segment ids are exhausted (2^32 - 2 registrations by this agent)",
                "restart the agent",
            )
        })?;
        let info = SegmentInfo {
            id,
            name: name.to_string(),
            addr: addr + base as u64,
            len,
            rkeys,
            location,
        };
        let seg = Segment::new(info.clone(), backing, base, self.shared.id)?;
        // Ranked now, so that the first transfer from this memory does not pay for it.
        self.shared.rail_mask(location);
        let peers = {
            let mut table = self.shared.lock_segments();
            table.insert(id, seg.clone());
            self.shared.peer_list()
        };
        if !seg.is_published() {
            return Ok(seg);
        }
        #[cfg(feature = "etcd")]
        if let Some(p) = self.shared.lock_published().as_ref() {
            p.put_segment(self.name(), &seg);
        }
        for p in peers {
            p.send_control(&Message::Segments(vec![info.clone()]));
        }
        Ok(seg)
    }

    /// What staging holds and did: the GPUs with bounce buffers, staged transfers, chunks moved,
    /// and chunks whose buffer waited for the NIC to let go ([`crate::staged`]).
    pub fn staging_stats(&self) -> crate::StagingStats {
        self.shared.staging.stats()
    }

    /// Removes a segment from the table peers see (they are told at once; their new transfers
    /// to it fail with [`Error::UnknownSegment`]) and from this agent's own transfers (new ones
    /// with it as their local side fail the same way). Its memory is deregistered once no
    /// segment and no request in flight uses the registration any more.
    ///
    /// # Errors
    /// [`Error::UnknownSegment`] when it is not (or no longer) registered with this agent.
    pub fn deregister(&self, segment: &Segment) -> Result<()> {
        let peers = {
            let mut table = self.shared.lock_segments();
            match table.get(&segment.id()) {
                Some(s) if Arc::ptr_eq(&s.inner, &segment.inner) => {}
                _ => {
                    return Err(Error::UnknownSegment {
                        owner: "local".into(),
                        segment: segment.id(),
                        hint: "it was deregistered already, or belongs to another agent".into(),
                    })
                }
            }
            table.remove(&segment.id());
            segment.inner.set_deregistered();
            if !segment.is_published() {
                return Ok(());
            }
            self.shared.peer_list()
        };
        #[cfg(feature = "etcd")]
        if let Some(p) = self.shared.lock_published().as_ref() {
            p.delete_segment(self.name(), segment.id());
        }
        for p in peers {
            p.send_control(&Message::Removed(vec![segment.id()]));
        }
        Ok(())
    }

    /// The registered segments, by id.
    pub fn segments(&self) -> Vec<Segment> {
        self.shared.lock_segments().values().cloned().collect()
    }

    /// Counters of the GPU registration cache.
    pub fn cache_stats(&self) -> CacheStats {
        self.lock_cache().stats
    }

    fn lock_cache(&self) -> MutexGuard<'_, RegistrationCache> {
        self.shared.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

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
            .spawn(move || accept_loop(shared, listener))
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
        connect_shared(&self.shared, addr, timeout)
    }

    /// The connected peer with this name.
    pub fn peer(&self, name: &str) -> Option<Peer> {
        let peers = self.shared.lock_peers();
        peers
            .get(name)
            .filter(|c| c.is_ready())
            .map(|c| Peer { conn: c.clone() })
    }

    /// The connected peers.
    pub fn peers(&self) -> Vec<Peer> {
        let peers = self.shared.lock_peers();
        let mut v: Vec<Peer> = peers
            .values()
            .filter(|c| c.is_ready())
            .map(|c| Peer { conn: c.clone() })
            .collect();
        v.sort_by(|a, b| a.name().cmp(b.name()));
        v
    }

    /// Waits until a peer with this name is connected (it connected to us, or we to it).
    ///
    /// # Errors
    /// [`Error::Timeout`].
    pub fn wait_peer(&self, name: &str, timeout: Duration) -> Result<Peer> {
        let end = Instant::now().checked_add(timeout);
        let mut peers = self.shared.lock_peers();
        loop {
            if let Some(c) = peers.get(name).filter(|c| c.is_ready()) {
                return Ok(Peer { conn: c.clone() });
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
            peers = self
                .shared
                .peers_changed
                .wait_timeout(peers, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Closes the connection to a peer: its pending transfers fail with [`Error::PeerLost`].
    pub fn disconnect(&self, peer: &Peer) {
        self.shared.disconnect(peer);
    }

    // ----- notifications -----

    /// Notifications received and not taken yet (at most [`AgentConfig::notify_queue`] plus
    /// the receive slots, per peer).
    pub fn pending_notifications(&self) -> usize {
        self.shared.lock_notifications().len()
    }

    /// Takes every notification received so far (their receive slots are posted again: the
    /// peers may send more).
    pub fn take_notifications(&self) -> Vec<Notification> {
        let taken: Vec<Delivered> = self.shared.lock_notifications().drain(..).collect();
        taken.into_iter().map(Delivered::take).collect()
    }

    /// Waits for the next notification (`Ok(None)` when `timeout` passes first).
    ///
    /// # Errors
    /// None yet; the `Result` leaves room for a closed agent.
    pub fn wait_notification(&self, timeout: Duration) -> Result<Option<Notification>> {
        let end = Instant::now().checked_add(timeout);
        let mut q = self.shared.lock_notifications();
        loop {
            if let Some(n) = q.pop_front() {
                drop(q);
                return Ok(Some(n.take()));
            }
            let left = end.map_or(Duration::from_secs(3600), |e| {
                e.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                return Ok(None);
            }
            q = self
                .shared
                .notified
                .wait_timeout(q, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Whether a GPU registration failed because gdr found no direct path for the NIC (the cases
/// staging serves), rather than for bad memory or exhausted resources.
fn no_direct_path(e: &Error) -> bool {
    match e {
        Error::Gdr(gdr::Error::Unsupported { .. }) => true,
        Error::Gdr(g @ gdr::Error::Verbs { .. }) => matches!(
            g.errno(),
            Some(libc::EFAULT | libc::EOPNOTSUPP | libc::EPROTONOSUPPORT)
        ),
        _ => false,
    }
}

/// The next segment id (1, 2, ...): `None` once they are exhausted. Never wraps, so an id is
/// never given twice (0 and `u32::MAX` are never given).
fn next_segment_id(counter: &AtomicU32) -> Option<u32> {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < u32::MAX - 1).then_some(n + 1)
        })
        .ok()
}

fn check_name(name: &str) -> Result<()> {
    if name.len() > MAX_NAME {
        return Err(Error::invalid(
            format!("segment name of {} bytes", name.len()),
            "names are at most 64 bytes",
        ));
    }
    Ok(())
}

fn resolve(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    use std::ops::Bound::*;
    let start = match range.start_bound() {
        Included(&s) => Some(s),
        Excluded(&s) => s.checked_add(1),
        Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Included(&e) => e.checked_add(1),
        Excluded(&e) => Some(e),
        Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s < e && e <= len => Ok((s, e - s)),
        _ => Err(Error::invalid(
            format!("range {start:?}..{end:?} of a {len}-byte buffer"),
            "give a non-empty range inside the buffer",
        )),
    }
}

/// Connects `shared`'s agent to the agent at `addr`, all of it (dialling and the handshake)
/// within `timeout`; dialling gives up when the agent closes.
pub(crate) fn connect_shared(
    shared: &Arc<AgentShared>,
    addr: &str,
    timeout: Duration,
) -> Result<Peer> {
    shared.check_open()?;
    let end = Instant::now().checked_add(timeout);
    let stream = control::dial(addr, timeout, &|| shared.closing.load(Ordering::SeqCst))?;
    let left = end.map_or(timeout, |e| e.saturating_duration_since(Instant::now()));
    let conn = control::establish(shared, stream, true, left)?;
    Ok(Peer { conn })
}

fn accept_loop(shared: Arc<AgentShared>, listener: TcpListener) {
    while !shared.shutdown.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, from)) => {
                if let Err(e) = stream.set_nonblocking(false) {
                    log::warn!("{}: connection from {from}: {e}", shared.config.name);
                    continue;
                }
                // A bounded number of handshakes at once: connections that send nothing cannot
                // pile up threads, queue pairs and descriptors. (Refused handshakes linger
                // half a second to deliver their reason, hence the margin over max_peers.)
                let cap = shared.config.max_peers.saturating_mul(2).saturating_add(8);
                if shared.handshakes.fetch_add(1, Ordering::AcqRel) >= cap {
                    shared.handshakes.fetch_sub(1, Ordering::AcqRel);
                    log::warn!(
                        "{}: connection from {from} dropped: {cap} handshakes in progress already",
                        shared.config.name
                    );
                    continue;
                }
                // Each handshake on its own thread: a slow or hostile peer cannot hold up
                // the others.
                let s = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("xfer-accept-{}", shared.config.name))
                    .spawn(move || {
                        if let Err(e) =
                            control::establish(&s, stream, false, s.config.connect_timeout)
                        {
                            log::warn!("{}: connection from {from} refused: {e}", s.config.name);
                        }
                        s.handshakes.fetch_sub(1, Ordering::AcqRel);
                    });
                if let Err(e) = spawned {
                    shared.handshakes.fetch_sub(1, Ordering::AcqRel);
                    log::warn!("{}: no thread for a handshake: {e}", shared.config.name);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                log::warn!("{}: accept failed: {e}", shared.config.name);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl AgentShared {
    pub(crate) fn lock_segments(&self) -> MutexGuard<'_, BTreeMap<u32, Segment>> {
        self.segments.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[cfg(feature = "etcd")]
    pub(crate) fn lock_published(&self) -> MutexGuard<'_, Option<crate::discovery::Published>> {
        self.published.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn lock_peers(&self) -> MutexGuard<'_, HashMap<String, Arc<Connection>>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_notifications(&self) -> MutexGuard<'_, VecDeque<Delivered>> {
        self.notifications.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps a thread to join when the agent is dropped (finished ones are let go).
    pub(crate) fn keep_thread(&self, h: JoinHandle<()>) {
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        threads.retain(|t| !t.is_finished());
        threads.push(h);
    }

    /// The threads kept so far (to join them).
    pub(crate) fn take_threads(&self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn peer_list(&self) -> Vec<Arc<Connection>> {
        self.lock_peers().values().cloned().collect()
    }

    /// The rails transfers from memory at `location` stripe over (bit per rail).
    pub(crate) fn rail_mask(&self, location: Location) -> u32 {
        let mut masks = self.rail_masks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&m) = masks.get(&location) {
            return m;
        }
        let m = if self.rails.len() == 1 {
            1
        } else {
            crate::rail::preferred_rails_here(
                &self.rail_names(),
                location,
                self.config.rails_follow_nccl_env,
            )
        };
        masks.insert(location, m);
        m
    }

    /// (device, port) of every rail.
    pub(crate) fn rail_names(&self) -> Vec<(String, u8)> {
        self.rails
            .iter()
            .map(|r| (r.ctx.name().to_string(), r.port))
            .collect()
    }

    /// Creates `n` queue pairs on rail `rail` for a peer connection.
    pub(crate) fn create_qps(&self, rail: usize, n: usize) -> Result<Vec<QueuePair>> {
        let cfg = &self.config;
        let r = &self.rails[rail];
        (0..n)
            .map(|_| {
                let mut b = QueuePair::builder(&r.pd, &r.cq, &r.cq)
                    .port(r.port)
                    .max_send_wr(cfg.send_queue_depth)
                    .max_recv_wr(u32::from(cfg.notify_slots))
                    .timeout(cfg.ack_timeout)
                    .retry_count(cfg.retry_count);
                if let Some(g) = cfg.gid_index {
                    b = b.gid_index(g);
                }
                Ok(b.build()?)
            })
            .collect()
    }

    /// Makes a connection known by name and by queue pair number.
    pub(crate) fn add_peer(&self, conn: &Arc<Connection>) -> Result<()> {
        {
            let mut peers = self.lock_peers();
            // Checked under the lock `shutdown` and `Drop` take their snapshot of the peers
            // under: a handshake cannot slip a connection in after the snapshot.
            if self.shutdown.load(Ordering::Acquire) {
                return Err(Error::AgentClosed);
            }
            self.check_open()?;
            if peers.contains_key(&conn.name) {
                return Err(Error::invalid(
                    format!("a peer named {:?} is already connected", conn.name),
                    "disconnect it first, or give each agent its own name",
                ));
            }
            if peers.len() >= self.config.max_peers as usize {
                return Err(Error::invalid(
                    format!("{} peers are connected already", peers.len()),
                    "raise AgentConfig::max_peers",
                ));
            }
            peers.insert(conn.name.clone(), conn.clone());
        }
        for (rail, qpn, lane) in conn.routes() {
            self.route_qps(rail, conn, &[(qpn, lane)]);
        }
        Ok(())
    }

    /// Routes the completions of rail `rail`'s queue pairs `(number, lane)` to `conn`.
    pub(crate) fn route_qps(&self, rail: usize, conn: &Arc<Connection>, nums: &[(u32, LaneRef)]) {
        let mut by_qpn = self.by_qpn.write().unwrap_or_else(|p| p.into_inner());
        for &(n, lane) in nums {
            by_qpn.insert(qp_key(rail, n), (conn.clone(), lane));
        }
    }

    /// Forgets the route of rail `rail`'s queue pair `qpn` (destroyed), if it still names
    /// `lane`.
    pub(crate) fn unroute(&self, rail: usize, qpn: u32, lane: LaneRef) {
        let mut by_qpn = self.by_qpn.write().unwrap_or_else(|p| p.into_inner());
        let key = qp_key(rail, qpn);
        if by_qpn.get(&key).is_some_and(|(_, l)| *l == lane) {
            by_qpn.remove(&key);
        }
    }

    /// Forgets a connection by name (if it is still the one registered under it); the
    /// progress thread lets it go once the completions queued before now are handled.
    pub(crate) fn remove_peer(&self, conn: &Arc<Connection>) {
        self.retire(conn, None);
    }

    /// As [`AgentShared::remove_peer`], and fails what is still in flight on it with
    /// `failure` once the completions queued before now were handled.
    pub(crate) fn remove_peer_after_drain(&self, conn: &Arc<Connection>, failure: Failure) {
        self.retire(conn, Some(failure));
    }

    fn retire(&self, conn: &Arc<Connection>, failure: Option<Failure>) {
        {
            let mut peers = self.lock_peers();
            if peers.get(&conn.name).is_some_and(|c| Arc::ptr_eq(c, conn)) {
                peers.remove(&conn.name);
            }
        }
        self.peers_changed.notify_all();
        self.peer_wakers.wake_all();
        let mut retiring = self.retiring.lock().unwrap_or_else(|p| p.into_inner());
        if !retiring.iter().any(|(c, _, _)| Arc::ptr_eq(c, conn)) {
            let at = self
                .drains
                .iter()
                .map(|d| d.load(Ordering::Acquire))
                .collect();
            retiring.push((conn.clone(), at, failure));
        } else if let Some(f) = failure {
            // Already retiring without a failure to give (a plain removal): lose it now.
            drop(retiring);
            conn.lose(f);
        }
    }

    /// Called by rail `rail`'s progress thread after a poll that drained its completion
    /// queue: lets go of the connections forgotten at least two drains ago on every rail (the
    /// second drain began after the first ended, which was after the connection was forgotten:
    /// every completion queued before that was handled).
    pub(crate) fn drained(&self, rail: usize) {
        self.drains[rail].fetch_add(1, Ordering::AcqRel);
        let mut retiring = self.retiring.lock().unwrap_or_else(|p| p.into_inner());
        if retiring.is_empty() {
            return;
        }
        let now: Vec<u64> = self
            .drains
            .iter()
            .map(|d| d.load(Ordering::Acquire))
            .collect();
        let mut gone = Vec::new();
        retiring.retain_mut(|(c, at, failure)| {
            if now.iter().zip(at.iter()).all(|(n, a)| *n >= a + 2) {
                gone.push((c.clone(), failure.take()));
                false
            } else {
                true
            }
        });
        drop(retiring);
        if gone.is_empty() {
            return;
        }
        // What is still in flight on them now will not complete: fail it.
        for (conn, failure) in &mut gone {
            if let Some(f) = failure.take() {
                conn.lose(f);
            }
        }
        let mut by_qpn = self.by_qpn.write().unwrap_or_else(|p| p.into_inner());
        by_qpn.retain(|_, (c, _)| !gone.iter().any(|(g, _)| Arc::ptr_eq(c, g)));
        drop(by_qpn);
        // The last references of the connections (and their queue pairs) may go here, outside
        // every lock.
        drop(gone);
    }

    /// [`Agent::disconnect`].
    pub(crate) fn disconnect(&self, peer: &Peer) {
        peer.conn.send_control(&Message::Bye(format!(
            "{} closed the connection",
            self.config.name
        )));
        peer.conn.lose(Failure::PeerLost {
            reason: "disconnected by this agent".into(),
        });
        self.remove_peer(&peer.conn);
    }

    pub(crate) fn notify_peers_changed(&self) {
        self.peers_changed.notify_all();
        self.peer_wakers.wake_all();
    }

    /// The connection and lane of a queue pair number.
    pub(crate) fn route(&self, rail: usize, qp_num: u32) -> Option<(Arc<Connection>, LaneRef)> {
        let by_qpn = self.by_qpn.read().unwrap_or_else(|p| p.into_inner());
        let (c, i) = by_qpn.get(&qp_key(rail, qp_num))?;
        Some((c.clone(), *i))
    }

    /// The next notification kept for the application, if any.
    pub(crate) fn pop_notification(&self) -> Option<Notification> {
        let n = self.lock_notifications().pop_front()?;
        Some(n.take())
    }

    pub(crate) fn deliver(&self, n: Delivered) {
        self.lock_notifications().push_back(n);
        self.notified.notify_all();
        self.notification_wakers.wake_all();
    }

    /// Runs every connection's timers when [`crate::progress::TICK`] has passed since they
    /// last ran; any progress thread (or a waiter past its deadline) may do it, one at a time.
    pub(crate) fn run_timers(&self, now: Instant) {
        let Ok(mut last) = self.timers.try_lock() else {
            return;
        };
        if now.saturating_duration_since(*last) < crate::progress::TICK {
            return;
        }
        *last = now;
        for conn in self.peer_list() {
            conn.tick(now);
        }
    }
}

/// The routing key of queue pair `qp_num` of rail `rail` (queue pair numbers are per device).
fn qp_key(rail: usize, qp_num: u32) -> u64 {
    ((rail as u64) << 32) | u64::from(qp_num)
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

#[cfg(test)]
mod tests {
    use super::{next_segment_id, no_direct_path};
    use std::sync::atomic::AtomicU32;

    #[test]
    fn segment_ids_never_wrap_and_never_repeat() {
        let c = AtomicU32::new(1);
        assert_eq!(next_segment_id(&c), Some(1));
        assert_eq!(next_segment_id(&c), Some(2));
        let c = AtomicU32::new(u32::MAX - 2);
        assert_eq!(next_segment_id(&c), Some(u32::MAX - 2));
        assert_eq!(
            next_segment_id(&c),
            None,
            "exhausted: refused, not wrapped to 0 or 1"
        );
        assert_eq!(next_segment_id(&c), None);
        // Many threads at the edge: every id given once.
        let c = AtomicU32::new(u32::MAX - 1000);
        let got: Vec<u32> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        (0..200)
                            .filter_map(|_| next_segment_id(&c))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let mut sorted = got.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), got.len(), "no id twice");
        assert_eq!(got.len(), 999);
        assert!(got.iter().all(|&i| i != 0 && i != u32::MAX));
    }
    use crate::error::Error;

    #[test]
    fn only_a_missing_direct_path_falls_back_to_staging() {
        let no_path = |e: gdr::Error| no_direct_path(&Error::Gdr(e));
        // choose_path found no way (GPUDirect blocked, no dma-buf, no peer memory).
        assert!(no_path(gdr::Error::unsupported("dma-buf registration", "")));
        // ibv_reg_mr on a device pointer without a peer-memory module; dma-buf refused.
        for errno in [libc::EFAULT, libc::EOPNOTSUPP, libc::EPROTONOSUPPORT] {
            assert!(
                no_path(gdr::Error::verbs("ibv_reg_mr", "", errno, "")),
                "{errno}"
            );
        }
        // Exhausted resources and bad memory are the caller's to fix: no silent fallback.
        for errno in [libc::ENOMEM, libc::EPERM, libc::EINVAL, libc::EACCES] {
            assert!(
                !no_path(gdr::Error::verbs("ibv_reg_mr", "", errno, "")),
                "{errno}"
            );
        }
        assert!(!no_path(gdr::Error::invalid("not device memory", "")));
        assert!(!no_direct_path(&Error::invalid("bad range", "")));
    }
}
