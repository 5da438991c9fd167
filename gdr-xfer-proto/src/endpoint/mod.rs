//! The agent's endpoint: what lies between its connections. Which peers are connected, by name
//! and by number; which connection and lane a completion belongs to (by rail and queue pair
//! number); and when a connection that was let go may really go: only once every completion
//! queued before it was let go was handled, so that a notification that arrived just before
//! the peer said goodbye is still delivered, and a queue pair number the device reuses is never
//! taken for the old connection's.
//!
//! It also holds what the agent decides once for all its connections: its own segments and
//! their admission ([`LocalTable`]), which rails the transfers from each memory location
//! stripe over, and when the connections' timers are due.
//!
//! Like [`crate::Connection`], it does no I/O and reads no clock: the driver keeps it behind
//! one lock, tells it what happened (a peer admitted, its tables exchanged, queue pairs made
//! and destroyed, a rail's completion queue drained, a connection let go, the time) and
//! carries out what it answers. `C` is the driver's handle of a connection (`Arc<Connection>`
//! in `gdr-xfer`, an index in the simulation), `S` its handle of a segment; the endpoint names
//! connections by [`ConnId`], numbers it gives and never gives again.

mod retire;
mod routes;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::io::LaneRef;
use crate::local_table::LocalTable;
use crate::location::Location;
use crate::transfer::Failure;

use retire::Retiring;
use routes::Routes;

/// A connection's number in its endpoint (given at admission, never given again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// Why the endpoint refused a peer ([`Endpoint::admit`]); nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The endpoint is closed ([`Endpoint::close`]): its agent shuts down.
    Closed,
    /// A connected peer has this name already.
    NameTaken {
        /// The name.
        name: String,
    },
    /// The endpoint has as many peers as it takes.
    Full {
        /// Its bound.
        max: usize,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Closed => f.write_str("the agent is shutting down"),
            Refusal::NameTaken { name } => write!(f, "a peer named {name:?} is already connected"),
            Refusal::Full { max } => write!(f, "{max} peers are connected already"),
        }
    }
}

/// One connection the endpoint knows: named (connected) or let go and draining.
#[derive(Debug)]
struct Known<C> {
    handle: C,
    name: String,
    /// Both sides exchanged their segment tables: the application sees the peer
    /// ([`Endpoint::ready`]).
    ready: bool,
}

/// What lies between an agent's connections (see the module documentation).
#[derive(Debug)]
pub struct Endpoint<C, S> {
    max_peers: usize,
    closed: bool,
    /// The number the next admitted connection gets.
    next_id: u64,
    /// Every connection admitted and not gone yet (connected, or let go and draining).
    known: BTreeMap<ConnId, Known<C>>,
    /// The connected ones by name.
    names: HashMap<String, ConnId>,
    routes: Routes,
    retiring: Retiring,
    /// The agent's own segments.
    segments: LocalTable<S>,
    /// Per memory location, the rails its transfers stripe over (bit per rail), once the
    /// driver found them.
    rail_masks: HashMap<Location, u32>,
    /// When the connections' timers last ran.
    timers_at: Option<Instant>,
}

impl<C: Clone, S> Endpoint<C, S> {
    /// The endpoint of agent `agent` (a number no other agent of the process has), with `rails`
    /// completion queues, taking at most `max_peers` peers.
    pub fn new(agent: u64, rails: usize, max_peers: usize) -> Endpoint<C, S> {
        Endpoint {
            max_peers,
            closed: false,
            next_id: 1,
            known: BTreeMap::new(),
            names: HashMap::new(),
            routes: Routes::default(),
            retiring: Retiring::new(rails),
            segments: LocalTable::new(agent),
            rail_masks: HashMap::new(),
            timers_at: None,
        }
    }

    /// The agent's own segments and their admission.
    pub fn segments(&self) -> &LocalTable<S> {
        &self.segments
    }

    /// The agent's own segments, to add or remove one.
    pub fn segments_mut(&mut self) -> &mut LocalTable<S> {
        &mut self.segments
    }

    /// The rails transfers from memory at `location` stripe over (bit per rail), once
    /// [`Endpoint::set_rail_mask`] said.
    pub fn rail_mask(&self, location: Location) -> Option<u32> {
        self.rail_masks.get(&location).copied()
    }

    /// Records the rails transfers from memory at `location` stripe over (the driver finds
    /// them from the machine's topology, outside the endpoint's lock) and returns the mask
    /// kept: the first recorded for a location stands.
    pub fn set_rail_mask(&mut self, location: Location, mask: u32) -> u32 {
        *self.rail_masks.entry(location).or_insert(mask)
    }

    /// Whether the connections' timers are due at `now`, `period` after they last ran; when
    /// they are, the endpoint counts them as run now, so that of the threads asking at once
    /// one runs them.
    pub fn timers_due(&mut self, now: Instant, period: Duration) -> bool {
        if self
            .timers_at
            .is_some_and(|at| now.saturating_duration_since(at) < period)
        {
            return false;
        }
        self.timers_at = Some(now);
        true
    }

    /// Refuses new peers from now on (the agent shuts down); those connected stay until let go.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Admits a connection to a peer named `name`, with the routes of its first queue pairs
    /// (`(rail, queue pair number, lane)`), unless the endpoint is closed or full, or the name
    /// is connected already. Returns the connection's number.
    ///
    /// # Errors
    /// The [`Refusal`]; nothing changed.
    pub fn admit(
        &mut self,
        name: &str,
        handle: C,
        routes: &[(usize, u32, LaneRef)],
    ) -> Result<ConnId, Refusal> {
        if self.closed {
            return Err(Refusal::Closed);
        }
        if self.names.contains_key(name) {
            return Err(Refusal::NameTaken { name: name.into() });
        }
        if self.names.len() >= self.max_peers {
            return Err(Refusal::Full {
                max: self.max_peers,
            });
        }
        let id = ConnId(self.next_id);
        self.next_id += 1;
        self.names.insert(name.to_string(), id);
        self.known.insert(
            id,
            Known {
                handle,
                name: name.to_string(),
                ready: false,
            },
        );
        for &(rail, qp_num, lane) in routes {
            self.routes.insert(rail, qp_num, id, lane);
        }
        Ok(id)
    }

    /// Connection `id`, admitted and not let go, exchanged its segment tables with the peer:
    /// the application sees it from now on ([`Endpoint::peer`]). Returns `false`, and changes
    /// nothing, for a connection let go or unknown.
    pub fn ready(&mut self, id: ConnId) -> bool {
        match self.known.get_mut(&id) {
            Some(k) if self.names.get(&k.name) == Some(&id) => {
                k.ready = true;
                true
            }
            _ => false,
        }
    }

    /// The connected peer named `name`, once it is ready ([`Endpoint::ready`]).
    pub fn peer(&self, name: &str) -> Option<&C> {
        let id = self.names.get(name)?;
        self.known.get(id).filter(|k| k.ready).map(|k| &k.handle)
    }

    /// The connected peers that are ready, in the order of their numbers.
    pub fn peers(&self) -> impl Iterator<Item = &C> + '_ {
        self.connections()
            .filter(|(_, ready)| *ready)
            .map(|(c, _)| c)
    }

    /// Every connection admitted and not let go, ready or still exchanging its tables, and
    /// whether it is ready, in the order of their numbers.
    pub fn connections(&self) -> impl Iterator<Item = (&C, bool)> + '_ {
        self.known
            .iter()
            .filter(|(id, k)| self.names.get(&k.name) == Some(*id))
            .map(|(_, k)| (&k.handle, k.ready))
    }

    /// How many peers are connected (ready or not).
    pub fn peer_count(&self) -> usize {
        self.names.len()
    }

    /// Routes rail `rail`'s queue pair number `qp_num` to lane `lane` of connection `id` (a
    /// number the device may have given before: the newest route wins). Returns `false`, and
    /// routes nothing, when `id` is not a connection the endpoint knows.
    pub fn route(&mut self, rail: usize, qp_num: u32, id: ConnId, lane: LaneRef) -> bool {
        if !self.known.contains_key(&id) {
            return false;
        }
        self.routes.insert(rail, qp_num, id, lane);
        true
    }

    /// Forgets the route of rail `rail`'s queue pair `qp_num` (destroyed), if it still names
    /// `lane` of `id` (a reused number routed to a newer queue pair keeps its route).
    pub fn unroute(&mut self, rail: usize, qp_num: u32, id: ConnId, lane: LaneRef) {
        self.routes.remove_if(rail, qp_num, id, lane);
    }

    /// The connection and lane of a completion of rail `rail`'s queue pair `qp_num`.
    pub fn lookup(&self, rail: usize, qp_num: u32) -> Option<(&C, LaneRef)> {
        let (id, lane) = self.routes.get(rail, qp_num)?;
        Some((&self.known.get(&id)?.handle, lane))
    }

    /// Lets go of connection `id`: its name is free at once (for a new connection to the same
    /// peer), its routes stay until every completion queued now on every rail was handled
    /// ([`Endpoint::drained`]), which then hands it back with `failure`, to fail what is still
    /// in flight on it. Returns a failure to apply now: `failure` when the connection was let
    /// go before without one (the first failure given stands), or is gone already.
    pub fn let_go(&mut self, id: ConnId, failure: Option<Failure>) -> Option<Failure> {
        let Some(known) = self.known.get(&id) else {
            return failure;
        };
        if self.names.get(&known.name) == Some(&id) {
            self.names.remove(&known.name);
        }
        self.retiring.add(id, failure)
    }

    /// Rail `rail`'s completion queue was polled and found drained (fewer completions than
    /// asked for). Returns the connections that may go now (let go before the previous drain
    /// of every rail began), with the failure to give what is still in flight on them; their
    /// routes are gone.
    pub fn drained(&mut self, rail: usize) -> Vec<(C, Option<Failure>)> {
        let gone = self.retiring.drained(rail);
        if gone.is_empty() {
            return Vec::new();
        }
        self.routes.remove_connections(&gone);
        gone.into_iter()
            .filter_map(|(id, failure)| self.known.remove(&id).map(|k| (k.handle, failure)))
            .collect()
    }

    /// Connections let go and not gone yet (waiting for drains).
    pub fn draining(&self) -> usize {
        self.retiring.len()
    }
}
