//! What an agent's threads share: its settings, its rails, its endpoint (peers, routes, its own
//! segments), its notifications, its staging driver and its lifecycle. The agent, its control
//! readers, its progress threads and its async waits hold it; it refers to none of them, so the
//! modules that drive it (`agent`, `control`, `progress`, `discovery`, `futures`) depend on it
//! and not on each other's back. A connection holds none of it: it is given the rails, the
//! endpoint (weakly) and the notification queue, the parts it needs; a peer handle holds only
//! the agent's [`Intake`].
//!
//! Locks, in order: [`AgentShared::published`] (held across a publish, which reads the
//! endpoint under it), then a connection's core and writer (`connection.rs`), then
//! [`AgentShared::endpoint`], a leaf. [`AgentShared::cache`] and [`AgentShared::threads`] are
//! leaves taken with nothing else held. Nothing is taken the other way round.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use gdr_xfer_proto::{Endpoint, Failure, LaneRef, Location, Lost, Refusal};

use crate::cache::RegistrationCache;
use crate::config::AgentConfig;
use crate::connection::{lock_endpoint, Connection, SharedEndpoint};
use crate::error::{Error, Result};
use crate::intake::Intake;
use crate::notify::NoteQueue;
use crate::rail::Rails;
use crate::segment::Segment;
use crate::wakers::Wakers;
use crate::wire::Message;

/// The agent's state, shared by its threads (quinn's `EndpointInner`: the core's endpoint
/// under one lock, beside what the driver itself needs).
pub(crate) struct AgentShared {
    pub(crate) config: AgentConfig,
    /// The rails, shared with the connections (which make their queue pairs on them).
    pub(crate) rails: Arc<Rails>,
    /// The registration cache of GPU memory; held across a registration's verbs calls, so
    /// that two registrations of one buffer make one region. A leaf taken alone.
    pub(crate) cache: Mutex<RegistrationCache>,
    /// The core's [`Endpoint`]: the connected peers, by name and number, and whether each is
    /// ready (tables exchanged); where each completion belongs (by rail and queue pair
    /// number); the connections let go but still draining; this agent's own segments, the ids
    /// it gives and the admission of a segment handed to its calls ([`LocalTable`](gdr_xfer_proto::LocalTable)); the rails
    /// each memory location's transfers stripe over; when the timers are due. A connection
    /// stays routed (and alive) after it was let go until the progress threads drained every
    /// completion queue past that moment, so that completions already queued, a notification
    /// that arrived just before the peer said goodbye among them, are still handled.
    ///
    /// A leaf lock: nothing else is taken while it is held (a connection's core and writer
    /// come before it).
    /// Shared with the connections' lanes, which route their new queue pairs in it (they hold
    /// it weakly: it holds them).
    pub(crate) endpoint: Arc<SharedEndpoint>,
    /// Notifications delivered (or put back) and not taken yet, and their waiters; shared with
    /// the connections, which deliver into it.
    pub(crate) notes: Arc<NoteQueue>,
    /// The async waits for peers.
    pub(crate) peer_wakers: Wakers,
    /// The blocking waits for peers ([`Agent::wait_peer`](crate::Agent::wait_peer)), on the
    /// endpoint's lock.
    pub(crate) peers_changed: Condvar,
    /// Set at a shutdown once the transfers in flight have left, just before the connections
    /// close: the listener stops, and no handshake is admitted after it.
    pub(crate) shutdown: AtomicBool,
    /// Whether the agent takes new work, its pending transfers and its staging driver:
    /// what its peer handles need of it.
    pub(crate) intake: Arc<Intake>,
    /// Threads to join at drop (control readers, directory watches). A leaf taken alone.
    pub(crate) threads: Mutex<Vec<JoinHandle<()>>>,
    /// Handshakes of accepted connections in progress (at most `max_peers`).
    pub(crate) handshakes: AtomicU32,
    /// The directory this agent published itself in (feature `etcd`). Taken before the
    /// endpoint, never after it.
    #[cfg(feature = "etcd")]
    pub(crate) published: Mutex<Option<crate::directory::Published>>,
}

/// Every connection of `endpoint` admitted and not let go (ready or still exchanging tables).
pub(crate) fn connections(endpoint: &Endpoint<Arc<Connection>, Segment>) -> Vec<Arc<Connection>> {
    endpoint.connections().map(|(c, _)| c.clone()).collect()
}

impl AgentShared {
    #[cfg(feature = "etcd")]
    pub(crate) fn lock_published(&self) -> MutexGuard<'_, Option<crate::directory::Published>> {
        self.published.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn lock_endpoint(&self) -> MutexGuard<'_, Endpoint<Arc<Connection>, Segment>> {
        lock_endpoint(&self.endpoint)
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

    /// Every connection admitted and not let go (ready or still exchanging tables).
    pub(crate) fn peer_list(&self) -> Vec<Arc<Connection>> {
        connections(&self.lock_endpoint())
    }

    /// The rails transfers from memory at `location` stripe over (bit per rail). Found from
    /// the machine's topology the first time, outside the endpoint's lock (it reads sysfs).
    pub(crate) fn rail_mask(&self, location: Location) -> u32 {
        if let Some(m) = self.lock_endpoint().rail_mask(location) {
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
        self.lock_endpoint().set_rail_mask(location, m)
    }

    /// (device, port) of every rail.
    pub(crate) fn rail_names(&self) -> Vec<(String, u8)> {
        self.rails.names()
    }

    /// Makes a connection known by name and by queue pair number (`routes`, its first queue
    /// pairs', [`Connection::routes`], read before the endpoint was locked: a connection's
    /// core comes before the endpoint).
    pub(crate) fn add_peer(
        &self,
        endpoint: &mut Endpoint<Arc<Connection>, Segment>,
        conn: &Arc<Connection>,
        routes: &[(usize, u32, LaneRef)],
    ) -> Result<()> {
        // Checked under the lock `shutdown` and `Drop` close the endpoint and take their
        // snapshot of the peers under: a handshake cannot slip a connection in after it.
        if self.shutdown.load(Ordering::Acquire) {
            return Err(Error::AgentClosed);
        }
        self.check_open()?;
        let id = endpoint
            .admit(&conn.name, conn.clone(), routes)
            .map_err(|r| match r {
                Refusal::Closed => Error::AgentClosed,
                Refusal::NameTaken { .. } => Error::invalid(
                    r.to_string(),
                    "disconnect it first, or give each agent its own name",
                ),
                Refusal::Full { .. } => {
                    Error::invalid(r.to_string(), "raise AgentConfig::max_peers")
                }
            })?;
        conn.set_id(id);
        Ok(())
    }

    /// The connection exchanged its segment tables with the peer: the application sees it
    /// from now on ([`Agent::peer`](crate::Agent::peer),
    /// [`Agent::wait_peer`](crate::Agent::wait_peer)).
    pub(crate) fn set_ready(&self, conn: &Connection) {
        if let Some(id) = conn.id() {
            self.lock_endpoint().ready(id);
        }
        self.notify_peers_changed();
    }

    /// Forgets a connection by name; the progress threads let it go once the completions
    /// queued before now are handled.
    pub(crate) fn remove_peer(&self, conn: &Arc<Connection>) {
        self.retire(conn, None);
    }

    /// As [`AgentShared::remove_peer`], and fails what is still in flight on it with
    /// `failure` once the completions queued before now were handled.
    pub(crate) fn remove_peer_after_drain(&self, conn: &Arc<Connection>, failure: Failure) {
        self.retire(conn, Some(failure));
    }

    fn retire(&self, conn: &Arc<Connection>, failure: Option<Failure>) {
        let now = match conn.id() {
            Some(id) => self.lock_endpoint().let_go(id, failure),
            // Never admitted: nothing of it is routed, nothing to drain.
            None => failure,
        };
        self.notify_peers_changed();
        if let Some(f) = now {
            conn.lose(f);
        }
    }

    /// Called by rail `rail`'s progress thread after a poll that drained its completion
    /// queue: lets go of the connections the endpoint says may go now, failing what is still
    /// in flight on them.
    pub(crate) fn drained(&self, rail: usize) {
        let gone = self.lock_endpoint().drained(rail);
        // Outside the lock: what is still in flight on them now will not complete; their last
        // references (and their queue pairs) may go here.
        for (conn, failure) in gone {
            if let Some(f) = failure {
                conn.lose(f);
            }
        }
    }

    /// [`Agent::disconnect`](crate::Agent::disconnect) of the connection `conn`.
    pub(crate) fn disconnect(&self, conn: &Arc<Connection>) {
        let failure = Failure::PeerLost {
            why: Lost::Disconnected,
        };
        // Transfers in flight report first, once quiet on both sides: closing at once would
        // report them while requests already on the wire may still land in the peer's memory.
        conn.start_leaving(failure.clone());
        conn.wait_left(Instant::now() + conn.leave_bound());
        conn.send_control(&Message::Bye(format!(
            "{} closed the connection",
            self.config.name
        )));
        conn.lose(failure);
        self.remove_peer(conn);
    }

    pub(crate) fn notify_peers_changed(&self) {
        self.peers_changed.notify_all();
        self.peer_wakers.wake_all();
    }

    /// The connection and lane of a queue pair number.
    pub(crate) fn route(&self, rail: usize, qp_num: u32) -> Option<(Arc<Connection>, LaneRef)> {
        let endpoint = self.lock_endpoint();
        let (c, lane) = endpoint.lookup(rail, qp_num)?;
        Some((c.clone(), lane))
    }

    /// Runs every connection's timers when [`crate::config::TICK`] has passed since they
    /// last ran; any progress thread (or a waiter past its deadline) may do it, one at a time.
    pub(crate) fn run_timers(&self, now: Instant) {
        // Never waits for the endpoint: a thread that finds it taken tries again at its next
        // poll (within a tick), and the progress threads' routing is not held up by timers.
        let conns = {
            let mut endpoint = match self.endpoint.try_lock() {
                Ok(e) => e,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            };
            if !endpoint.timers_due(now, crate::config::TICK) {
                return;
            }
            connections(&endpoint)
        };
        for conn in conns {
            conn.tick(now);
        }
    }

    /// [`Error::AgentClosed`] once [`Agent::shutdown`](crate::Agent::shutdown) began (or the
    /// agent is being dropped).
    pub(crate) fn check_open(&self) -> Result<()> {
        self.intake.check_open()
    }

    /// This agent's number in the process (segments carry it: another agent's segment is
    /// refused before anything is posted).
    pub(crate) fn id(&self) -> u64 {
        self.intake.agent
    }
}
