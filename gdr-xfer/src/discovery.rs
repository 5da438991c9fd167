//! Finding peers through etcd (feature `etcd`): an agent publishes its address and its segment
//! table under lease-bound keys of an [`EtcdDirectory`]; another agent finds it by name,
//! connects, and watches its keys. When the published agent's lease ends (it died, hung, or
//! unpublished) its endpoint key is deleted and every transfer pending to it fails at once with
//! [`Error::PeerLost`], even when no packet or socket would tell (a stopped process, a host cut
//! off the network).
//!
//! Keys, relative to the directory's prefix:
//!
//! | key | value |
//! |---|---|
//! | `<agent>/endpoint` | the agent record: the `host:port` peers connect to ([`wire::AgentRecord`]) |
//! | `<agent>/segments/<id>` | one segment, as a [`Message::Segments`] of one entry |
//!
//! A name belongs to the agent that published it first: the endpoint key is an
//! [`EtcdDirectory::claim`] of the scope `<agent>/`, made only when no key lies under it, and
//! the segment keys are written and deleted under that claim. A second agent publishing the
//! same name (through another directory or the same one) is refused with
//! [`Error::NameTaken`] and can neither replace nor delete the holder's records, so the
//! holder's peers never lose it to a name taken over.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::agent::Agent;
use crate::connection::Connection;
use crate::directory::{endpoint_key, EtcdDirectory, Published, WatchEvent};
use crate::error::{Error, Result};
use crate::peer::Peer;
use crate::segment::Segment;
use crate::shared::AgentShared;
use crate::wire::{AgentRecord, Message};
use gdr_xfer_proto::{Failure, Lost, SegmentId};

/// An address a peer can connect to: a specific IP and a port.
fn check_advertised(addr: SocketAddr) -> Result<()> {
    if addr.ip().is_unspecified() || addr.port() == 0 {
        return Err(Error::invalid(
            format!("advertised address {addr}: peers cannot connect to it"),
            "advertise this host's IP on the network the peers use and the port listen() returned (listen on \"0.0.0.0:0\" binds every interface; publish e.g. 10.0.0.2 with its port)",
        ));
    }
    Ok(())
}

fn check_publishable(name: &str) -> Result<()> {
    if name.contains('/') {
        return Err(Error::invalid(
            format!("agent name {name:?} contains '/'"),
            "names published in a directory cannot contain '/' (it separates the keys)",
        ));
    }
    Ok(())
}

impl Agent {
    /// Publishes this agent in `dir`: `advertise` (the address peers connect to, where
    /// [`Agent::listen`] listens) and every segment, now and as they are registered and
    /// deregistered, all bound to the directory's lease.
    ///
    /// The name belongs to this agent from then on: it is claimed in one etcd transaction
    /// that succeeds only when no key lies under `<name>/` ([`EtcdDirectory::claim`]), so of
    /// agents publishing one name only the first gets it, and no other agent can replace or
    /// delete its records. The records are deleted when the agent shuts down or is dropped
    /// (its segments, then its endpoint: the name stays held until all of them are gone); a
    /// record of an agent that died goes when the directory's lease ends. Then the name is
    /// free again.
    ///
    /// If the directory's lease is lost (etcd unreachable for its TTL), the records are gone
    /// and another agent may take the name; this agent's later segment records are refused
    /// (logged). Publish again from a new agent with a new directory.
    ///
    /// # Errors
    /// [`Error::NameTaken`] when another agent holds the name (published it through another
    /// directory or this one, and has not withdrawn, and its lease has not ended); nothing of
    /// it was touched. [`Error::InvalidArgument`] for a name with `/`, when already published,
    /// or for an address peers cannot connect to (`0.0.0.0`, `::`, port 0: what
    /// `listen("0.0.0.0:0")` binds, not where peers reach it); [`Error::Directory`] when etcd
    /// refuses; [`Error::AgentClosed`] after [`Agent::shutdown`].
    pub fn publish(&self, dir: Arc<EtcdDirectory>, advertise: SocketAddr) -> Result<()> {
        let shared = self.shared();
        shared.check_open()?;
        let name = &shared.config.name;
        check_publishable(name)?;
        check_advertised(advertise)?;
        let mut slot = shared.lock_published();
        if slot.is_some() {
            return Err(Error::invalid(
                format!("{name} is published already"),
                "publish an agent once",
            ));
        }
        let record = AgentRecord {
            addr: advertise.to_string(),
        };
        let claim = dir
            .claim(&format!("{name}/"), &endpoint_key(name), &record.encode()?)
            .map_err(|e| match e {
                Error::NameTaken {
                    key,
                    holder_lease,
                    hint,
                    ..
                } => Error::NameTaken {
                    call: "Agent::publish",
                    name: name.clone(),
                    key,
                    holder_lease,
                    hint,
                },
                other => other,
            })?;
        let published = Published { dir, claim };
        // Segments registered from now on are published by the registration itself (it sees
        // `slot` set once we release it); the ones registered before, here.
        let segments: Vec<Segment> = shared
            .lock_endpoint()
            .segments()
            .values()
            .filter(|s| s.is_published())
            .cloned()
            .collect();
        for seg in &segments {
            published.put_segment(name, seg);
        }
        *slot = Some(published);
        Ok(())
    }

    /// Finds the agent called `name` in `dir` (waiting up to `timeout` for it to appear),
    /// connects to it, and watches its keys: when they go (its lease ended), the peer is lost
    /// and its pending transfers fail with [`Error::PeerLost`].
    ///
    /// All of it (the lookup, connecting, the handshake) takes at most `timeout`: an address
    /// that does not answer (a record left by an agent that died) is tried again, with the
    /// record looked up again, until then.
    ///
    /// # Errors
    /// [`Error::UnknownPeer`] when it does not appear, or does not answer, in time (the hint
    /// names the address tried); [`Error::Protocol`] for a malformed record;
    /// [`Agent::connect`]'s other errors; [`Error::Directory`]; [`Error::AgentClosed`] after
    /// [`Agent::shutdown`].
    pub fn connect_named(
        &self,
        dir: &Arc<EtcdDirectory>,
        name: &str,
        timeout: Duration,
    ) -> Result<Peer> {
        connect_named(self.shared(), dir, name, timeout)
    }

    /// [`Agent::connect_named`], awaited: it runs on a thread of its own (see
    /// [`crate::futures`]).
    ///
    /// # Errors
    /// As [`Agent::connect_named`].
    pub fn connect_named_async(
        &self,
        dir: &Arc<EtcdDirectory>,
        name: &str,
        timeout: Duration,
    ) -> crate::futures::Connecting {
        let (shared, dir, name) = (self.shared().clone(), dir.clone(), name.to_string());
        crate::futures::Connecting::spawn(&shared.config.name.clone(), move || {
            connect_named(&shared, &dir, &name, timeout)
        })
    }
}

/// [`Agent::connect_named`] for `shared`'s agent.
fn connect_named(
    shared: &Arc<AgentShared>,
    dir: &Arc<EtcdDirectory>,
    name: &str,
    timeout: Duration,
) -> Result<Peer> {
    check_publishable(name)?;
    shared.check_open()?;
    let end = Instant::now().checked_add(timeout);
    let left = || {
        end.map_or(Duration::MAX, |e| {
            e.saturating_duration_since(Instant::now())
        })
    };
    // The last address that did not answer, and why: a record left by an agent that died
    // stays until its lease ends, and a restarted agent may replace it meanwhile.
    let mut stale: Option<(String, Error)> = None;
    let (peer, watch, addr) = loop {
        // List and watch at one revision: nothing between the lookup and the watch is
        // missed.
        let (listing, watch) = dir.list_and_watch(&format!("{name}/"))?;
        let record = listing
            .entries
            .iter()
            .find(|(k, _)| *k == endpoint_key(name))
            .map(|(_, v)| AgentRecord::decode(name, v))
            .transpose()?;
        if let Some(record) = record {
            let budget = left().min(shared.config.connect_timeout);
            match crate::control::connect(shared, &record.addr, budget) {
                Ok(peer) => break (peer, watch, record.addr),
                Err(e @ (Error::Io { .. } | Error::Timeout { .. })) => {
                    stale = Some((record.addr, e));
                }
                Err(e) => return Err(e),
            }
        }
        if left().is_zero() {
            let hint = match &stale {
                Some((addr, e)) => format!("its directory record points at {addr}, where no agent answered within {timeout:?} ({e}): a record left by an agent that died stays until its lease ends").into(),
                None => "is it running and published in the same etcd prefix?".into(),
            };
            return Err(Error::UnknownPeer {
                name: name.to_string(),
                hint,
            });
        }
        std::thread::sleep(left().min(Duration::from_millis(50)));
    };
    if peer.name() != name {
        shared.disconnect(&peer.conn);
        return Err(Error::protocol(
            name,
            format!(
                "the agent at {addr} says it is {:?}, the directory says {name:?}",
                peer.name()
            ),
        ));
    }
    let weak = Arc::downgrade(shared);
    let conn = peer.conn.clone();
    let endpoint = endpoint_key(name);
    let segments = format!("{name}/segments/");
    let h = std::thread::Builder::new()
        .name(format!("xfer-watch-{name}"))
        .spawn(move || watch_peer(weak, conn, watch, endpoint, segments))
        .map_err(|e| Error::io("starting the directory watch thread", e))?;
    shared.keep_thread(h);
    Ok(peer)
}

impl Agent {
    /// Deletes this agent's records from the directory it published itself in, its segments
    /// first, then its endpoint (the claim of its name: the name stays held until every
    /// record under it is gone, so that a new holder never shares it with the old one's
    /// records); later registrations are not published. Only records of this agent's claim are
    /// deleted. Best effort: what etcd refuses goes when the lease ends (and the name stays
    /// held until then).
    pub(crate) fn withdraw(&self) {
        let shared = self.shared();
        let Some(published) = shared.lock_published().take() else {
            return;
        };
        let name = &shared.config.name;
        let ids: Vec<SegmentId> = shared
            .lock_endpoint()
            .segments()
            .values()
            .filter(|s| s.is_published())
            .map(|s| s.id())
            .collect();
        for id in ids {
            published.delete_segment(name, id);
        }
        if let Err(e) = published.dir.release(&published.claim) {
            log::warn!("{name}: withdrawing from the directory: {e}");
        }
    }
}

/// Follows a peer's keys until it is lost or the agent goes away.
fn watch_peer(
    agent: Weak<AgentShared>,
    conn: Arc<Connection>,
    watch: crate::directory::Watch,
    endpoint: String,
    segments: String,
) {
    loop {
        if conn.is_lost() {
            return;
        }
        match agent.upgrade() {
            Some(a) if !a.shutdown.load(std::sync::atomic::Ordering::Acquire) => {}
            _ => return,
        }
        let Some(event) = watch.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        match event {
            WatchEvent::Delete { key, .. } | WatchEvent::Refused { key, .. } if key == endpoint => {
                log::warn!(
                    "peer {}: its directory record is gone (lease ended or withdrawn)",
                    conn.name
                );
                conn.lose(Failure::PeerLost {
                    why: Lost::Unlisted,
                });
                if let Some(a) = agent.upgrade() {
                    a.remove_peer(&conn);
                }
                return;
            }
            WatchEvent::Delete { key, .. } => {
                if let Some(id) = key
                    .strip_prefix(segments.as_str())
                    .and_then(|i| i.parse::<u32>().ok())
                {
                    // The control link says so too; whichever comes first removes it.
                    let _ = conn.apply(Message::Removed(vec![SegmentId::new(id)]));
                }
            }
            WatchEvent::Lost { reason } => {
                // The directory cannot tell any more; the data connection still can (its
                // control link and its completions): keep the peer, say so.
                log::warn!(
                    "peer {}: directory watch lost ({reason}); the peer's loss is now noticed through its connection only",
                    conn.name
                );
                return;
            }
            WatchEvent::Put { .. } | WatchEvent::Refused { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_a_slash_cannot_be_published() {
        assert!(check_publishable("prefill-0").is_ok());
        assert!(matches!(
            check_publishable("a/b"),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
