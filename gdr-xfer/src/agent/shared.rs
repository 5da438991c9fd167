//! What an agent's threads share: segments, peers, routes, rails and notifications; the accept
//! loop and connecting to a peer.

use super::*;

pub(crate) struct AgentShared {
    pub(crate) config: AgentConfig,
    /// This agent's number in the process (segments carry it: another agent's segment is
    /// refused before anything is posted).
    pub(crate) id: u64,
    pub(crate) rails: Vec<AgentRail>,
    /// Per memory location, the rails its transfers stripe over (bit per rail; see
    /// [`crate::rail::preferred_rails`]).
    pub(super) rail_masks: Mutex<HashMap<Location, u32>>,
    pub(super) segments: Mutex<BTreeMap<SegmentId, Segment>>,
    pub(super) next_segment: AtomicU32,
    pub(super) cache: Mutex<RegistrationCache>,
    pub(super) peers: Mutex<HashMap<String, Arc<Connection>>>,
    /// (rail, queue pair number) -> (connection, its lane and the queue pair's generation);
    /// numbers are per device, so two rails may have the same ones ([`qp_key`]). A connection
    /// stays here (and alive) after it was lost until the progress thread drained the
    /// completion queue past the loss (`retiring`), so that completions already queued, a
    /// notification that arrived just before the peer said goodbye among them, are still
    /// handled.
    pub(super) by_qpn: RwLock<HashMap<u64, (Arc<Connection>, LaneRef)>>,
    /// Connections forgotten by name, with the drain count at that moment, and the failure to
    /// give what is still in flight on them once the completions queued then were handled.
    pub(super) retiring: Mutex<Vec<Retiring>>,
    /// Per rail, how many polls found its completion queue drained (fewer completions than
    /// asked for).
    pub(super) drains: Vec<AtomicU64>,
    /// Notifications delivered (or put back) and not taken yet, and their waiters.
    pub(crate) notes: NoteQueue,
    /// The async waits for peers.
    pub(crate) peer_wakers: Wakers,
    /// When the connections' timers last ran; whichever progress thread finds it free and due
    /// runs them.
    pub(super) timers: Mutex<Instant>,
    pub(super) peers_changed: Condvar,
    pub(crate) shutdown: AtomicBool,
    /// Set by [`Agent::shutdown`] (and drop): new transfers, registrations and connections are
    /// refused with [`Error::AgentClosed`].
    pub(crate) closing: AtomicBool,
    /// The callers' transfers without an outcome yet ([`crate::transfer::Pending`]).
    pub(crate) pending: Arc<AtomicUsize>,
    /// Threads to join at drop (control readers, directory watches).
    pub(super) threads: Mutex<Vec<JoinHandle<()>>>,
    /// Handshakes of accepted connections in progress (at most `max_peers`).
    pub(super) handshakes: AtomicU32,
    /// The directory this agent published itself in (feature `etcd`).
    #[cfg(feature = "etcd")]
    pub(super) published: Mutex<Option<crate::discovery::Published>>,
    /// Transfers of staged GPU segments ([`crate::staging`]).
    pub(crate) staging: Arc<StagingDriver>,
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

pub(super) fn accept_loop(shared: Arc<AgentShared>, listener: TcpListener) {
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
    pub(crate) fn lock_segments(&self) -> MutexGuard<'_, BTreeMap<SegmentId, Segment>> {
        self.segments.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[cfg(feature = "etcd")]
    pub(crate) fn lock_published(&self) -> MutexGuard<'_, Option<crate::discovery::Published>> {
        self.published.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn lock_peers(&self) -> MutexGuard<'_, HashMap<String, Arc<Connection>>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
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

    pub(super) fn retire(&self, conn: &Arc<Connection>, failure: Option<Failure>) {
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

    /// The connected (handshake done) peer with this name.
    pub(crate) fn ready_peer(&self, name: &str) -> Option<Peer> {
        let peers = self.lock_peers();
        peers
            .get(name)
            .filter(|c| c.is_ready())
            .map(|c| Peer { conn: c.clone() })
    }

    pub(crate) fn deliver(&self, n: Delivered) {
        self.notes.push(n);
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
pub(super) fn qp_key(rail: usize, qp_num: u32) -> u64 {
    ((rail as u64) << 32) | u64::from(qp_num)
}
