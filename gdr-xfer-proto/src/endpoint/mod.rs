//! The agent's endpoint: what lies between its connections. Which peers are connected, by name
//! and by number; which connection and lane a completion belongs to (by rail and queue pair
//! number); and when a connection that was let go may really go: only once every completion
//! queued before it was let go was handled, so that a notification that arrived just before
//! the peer said goodbye is still delivered, and a queue pair number the device reuses is never
//! taken for the old connection's.
//!
//! Like [`crate::Connection`], it does no I/O and reads no clock: the driver keeps it behind
//! one lock, tells it what happened (a peer admitted, queue pairs made and destroyed, a rail's
//! completion queue drained, a connection let go) and carries out what it answers. `C` is the
//! driver's handle of a connection (`Arc<Connection>` in `gdr-xfer`, an index in the
//! simulation); the endpoint names connections by [`ConnId`], numbers it gives and never
//! gives again.

mod retire;
mod routes;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

use crate::io::LaneRef;
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
}

/// What lies between an agent's connections (see the module documentation).
#[derive(Debug)]
pub struct Endpoint<C> {
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
}

impl<C: Clone> Endpoint<C> {
    /// An endpoint with `rails` completion queues, taking at most `max_peers` peers.
    pub fn new(rails: usize, max_peers: usize) -> Endpoint<C> {
        Endpoint {
            max_peers,
            closed: false,
            next_id: 1,
            known: BTreeMap::new(),
            names: HashMap::new(),
            routes: Routes::default(),
            retiring: Retiring::new(rails),
        }
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
            },
        );
        for &(rail, qp_num, lane) in routes {
            self.routes.insert(rail, qp_num, id, lane);
        }
        Ok(id)
    }

    /// The connected peer named `name`.
    pub fn peer(&self, name: &str) -> Option<&C> {
        let id = self.names.get(name)?;
        self.known.get(id).map(|k| &k.handle)
    }

    /// The connected peers, in the order of their numbers.
    pub fn peers(&self) -> impl Iterator<Item = &C> + '_ {
        self.known
            .iter()
            .filter(|(id, k)| self.names.get(&k.name) == Some(*id))
            .map(|(_, k)| &k.handle)
    }

    /// How many peers are connected.
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
