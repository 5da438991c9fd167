//! Connecting two agents over TCP (the direct way, no server): the hello exchange, queue pairs
//! connected, segment tables sent, both sides ready; then a reader thread per peer applies the
//! peer's segment announcements and notices when it goes away.

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use gdr::connect::TcpLink;
use gdr::qp::QueuePair;

use crate::config::AgentConfig;
use gdr_xfer_proto::handshake::{self, HandshakeError, Offer, Settings, Shape};
use gdr_xfer_proto::{DriverError, Failure, Lost, TableError};

use crate::connection::{Connection, Parts};
use crate::error::{Error, Result};
use crate::notify::NotifyPool;
use crate::peer::Peer;
use crate::shared::AgentShared;
use crate::wire::{segment_messages, Hello, Message};

/// How long a rail renewal waits for the peer's answer (the control link normally answers
/// within milliseconds; an offer lost with a stalled link is made again after the cool-down).
const RENEW_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects `shared`'s agent to the agent at `addr`, all of it (dialling and the handshake)
/// within `timeout`; dialling gives up when the agent closes.
pub(crate) fn connect(shared: &Arc<AgentShared>, addr: &str, timeout: Duration) -> Result<Peer> {
    shared.check_open()?;
    let end = Instant::now().checked_add(timeout);
    let stream = dial(addr, timeout, &|| shared.intake.is_closing())?;
    let left = end.map_or(timeout, |e| e.saturating_duration_since(Instant::now()));
    let conn = establish(shared, stream, true, left)?;
    Ok(Peer::new(conn, shared))
}

/// Accepts connections on `listener` until the agent shuts down, each handshake on its own
/// thread.
pub(crate) fn accept_loop(shared: Arc<AgentShared>, listener: TcpListener) {
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
                        if let Err(e) = establish(&s, stream, false, s.config.connect_timeout) {
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

/// Opens a TCP connection to `addr`, retrying refused attempts until `timeout` (the peer may
/// not listen yet) or until `stop` says so ([`Error::AgentClosed`]).
pub(crate) fn dial(addr: &str, timeout: Duration, stop: &dyn Fn() -> bool) -> Result<TcpStream> {
    // No end for a timeout past what the clock can count (`Duration::MAX`).
    let end = Instant::now().checked_add(timeout);
    let mut last = None;
    loop {
        if stop() {
            return Err(Error::AgentClosed);
        }
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|e| Error::io(format!("resolving {addr:?}"), e))?
            .collect();
        for a in &addrs {
            let left = end.map_or(Duration::MAX, |e| {
                e.saturating_duration_since(Instant::now())
            });
            let attempt = left.clamp(Duration::from_millis(1), Duration::from_millis(500));
            match TcpStream::connect_timeout(a, attempt) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        if end.is_some_and(|e| Instant::now() >= e) {
            return Err(match last {
                Some(e) => Error::io(format!("connecting to {addr} for {timeout:?}"), e),
                None => {
                    Error::invalid(format!("{addr:?} resolves to no address"), "give host:port")
                }
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Turns on TCP keepalive with short probes (idle 10 s, every 5 s, 3 probes): an idle control
/// link to a host that disappeared ends within about 25 s. Best effort: a failure is logged.
fn set_keepalive(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: `fd` is an open socket for the duration of the call; the option value is a
        // c_int on the stack, its size given.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    let rc = set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)
        | set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10)
        | set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5)
        | set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
    if rc != 0 {
        log::warn!(
            "TCP keepalive on the control link: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn send(link: &mut TcpLink, msg: &Message) -> Result<()> {
    link.send_bytes(&msg.encode()?)?;
    Ok(())
}

fn recv(link: &mut TcpLink, peer: &str) -> Result<Message> {
    let bytes = link.recv_bytes()?;
    Ok(Message::decode(peer, &bytes)?)
}

/// The peer's hello; a bye instead (the peer refused us) is an error with its reason.
fn expect_hello(reader: &mut TcpLink, addr: &str) -> Result<Hello> {
    match recv(reader, addr)? {
        Message::Hello(h) => Ok(h),
        Message::Bye(reason) => Err(Error::protocol(addr, format!("refused: {reason}"))),
        _ => Err(Error::protocol(addr, "expected a hello")),
    }
}

fn refuse(link: &mut TcpLink, linger: Linger<'_>, err: Error) -> Error {
    let _ = send(link, &Message::Bye(err.to_string()));
    // Close only after the peer has read the bye: closing a socket with unread bytes in its
    // receive buffer sends a reset, and a reset discards what the peer has not read yet (the
    // bye among it). So stop writing, and read what the peer still sends (briefly) until it
    // closes too.
    let _ = linger.socket.shutdown(std::net::Shutdown::Write);
    if linger
        .reader
        .set_timeout(Some(Duration::from_millis(500)))
        .is_ok()
    {
        let end = Instant::now() + Duration::from_millis(500);
        while Instant::now() < end && linger.reader.recv_bytes().is_ok() {}
    }
    err
}

/// What [`refuse`] needs to close a refused connection gracefully.
struct Linger<'a> {
    socket: &'a TcpStream,
    reader: &'a mut TcpLink,
}

/// Runs the handshake on a new TCP connection (`initiator`: we connected), within `timeout`,
/// and returns the established connection, registered with the agent. The steps: open the
/// control links, exchange hellos (queue pairs offered and answered), build the lanes, make the
/// connection, send our segment table, receive the peer's, start the reader thread.
pub(crate) fn establish(
    agent: &Arc<AgentShared>,
    stream: TcpStream,
    initiator: bool,
    timeout: Duration,
) -> Result<Arc<Connection>> {
    let mut links = Links::open(stream, timeout)?;
    let (rails, shape, theirs) = exchange_hellos(agent, &mut links, initiator)?;
    let (qps, notify) = build_lanes(agent, rails, &theirs)?;
    let mut rail_names = agent.rail_names();
    rail_names.truncate(shape.rails);
    let Links {
        addr,
        mut reader,
        writer,
        socket,
    } = links;
    let conn = Connection::new(Parts {
        name: theirs.name.clone(),
        agent_id: agent.id(),
        rails: agent.rails.clone(),
        endpoint: Arc::downgrade(&agent.endpoint),
        notes: agent.notes.clone(),
        config: settings(&agent.config).config(shape, &Offer::of(&theirs), initiator),
        rail_names,
        qps,
        notify,
        writer,
        socket,
    });
    // Before the peer may send: it sends nothing before it has our table.
    conn.post_first_slots();
    send_our_table(agent, &conn, &mut reader)?;
    if let Err(e) = receive_their_table(&conn, &mut reader) {
        conn.lose(Failure::PeerLost {
            why: Lost::Handshake,
        });
        agent.remove_peer(&conn);
        return Err(e);
    }
    reader.set_timeout(None)?;
    agent.set_ready(&conn);
    start_reader(agent, &conn, reader)?;
    log::info!(
        "{}: connected to {} at {addr} ({} rails x {} queue pairs, {} segments)",
        agent.config.name,
        conn.name,
        conn.nrails,
        conn.qps_per_rail,
        conn.remote.read().map_or(0, |t| t.len())
    );
    Ok(conn)
}

/// The control connection's two links (reading and writing on clones of one socket) and the
/// socket itself, for shutting it down.
struct Links {
    /// The peer's address, for messages.
    addr: String,
    reader: TcpLink,
    writer: TcpLink,
    socket: TcpStream,
}

impl Links {
    /// The links of a new connection, each with `timeout` for the handshake.
    fn open(stream: TcpStream, timeout: Duration) -> Result<Links> {
        let addr = stream
            .peer_addr()
            .map_or_else(|_| "?".to_string(), |a| a.to_string());
        let writer_stream = stream
            .try_clone()
            .map_err(|e| Error::io("cloning the control socket", e))?;
        let socket = stream
            .try_clone()
            .map_err(|e| Error::io("cloning the control socket", e))?;
        // A peer host that vanishes without closing the socket is noticed by TCP keepalive (the
        // kernel's probes) even while no transfer is pending.
        set_keepalive(&stream);
        let reader = TcpLink::from_stream(stream)?;
        let writer = TcpLink::from_stream(writer_stream)?;
        reader.set_timeout(Some(timeout))?;
        writer.set_timeout(Some(timeout))?;
        Ok(Links {
            addr,
            reader,
            writer,
            socket,
        })
    }

    /// Refuses the connection with `e` (see [`refuse`]).
    fn refuse(&mut self, e: Error) -> Error {
        refuse(
            &mut self.writer,
            Linger {
                socket: &self.socket,
                reader: &mut self.reader,
            },
            e,
        )
    }
}

/// Our hello: our name, the endpoints of the queue pairs of each rail, our notification slots.
fn hello(cfg: &AgentConfig, rails: &[Vec<QueuePair>]) -> Message {
    Message::Hello(Hello {
        name: cfg.name.clone(),
        rails: rails
            .iter()
            .map(|qps| qps.iter().map(|q| q.endpoint()).collect())
            .collect(),
        notify_slots: cfg.notify_slots,
        notify_max: cfg.notify_max,
    })
}

/// Exchanges hellos: the initiator offers its rails and queue pairs and the acceptor answers
/// with at most as many ([`handshake`]); returns our queue pairs of the rails both use (paired
/// by position), the shape both use and the peer's hello. Refuses a peer that answers with more
/// than offered, or that has our name.
fn exchange_hellos(
    agent: &Arc<AgentShared>,
    links: &mut Links,
    initiator: bool,
) -> Result<(Vec<Vec<QueuePair>>, Shape, Hello)> {
    let cfg = &agent.config;
    let create = |shape: Shape| -> Result<Vec<Vec<QueuePair>>> {
        (0..shape.rails)
            .map(|r| Ok(agent.rails.create_qps(r, shape.lanes_per_rail)?))
            .collect()
    };
    let refused = |links: &mut Links, e: HandshakeError, peer: &str| {
        let e = match e {
            HandshakeError::SameName { .. } => Error::invalid(
                format!("peer at {} is called {peer:?}, as this agent", links.addr),
                "give every agent its own name",
            ),
            e => Error::protocol(peer, e.to_string()),
        };
        links.refuse(e)
    };
    if initiator {
        let offered = Shape {
            rails: agent.rails.len(),
            lanes_per_rail: usize::from(cfg.qps_per_peer),
        };
        let mut rails = create(offered)?;
        send(&mut links.writer, &hello(cfg, &rails))?;
        let theirs = expect_hello(&mut links.reader, &links.addr)?;
        match handshake::agree(&cfg.name, offered, &Offer::of(&theirs)) {
            Ok(agreed) => {
                rails.truncate(agreed.rails);
                Ok((rails, agreed, theirs))
            }
            Err(e) => Err(refused(links, e, &theirs.name)),
        }
    } else {
        let theirs = expect_hello(&mut links.reader, &links.addr)?;
        match handshake::answer(&cfg.name, agent.rails.len(), &Offer::of(&theirs)) {
            Ok(shape) => {
                let rails = create(shape)?;
                send(&mut links.writer, &hello(cfg, &rails))?;
                Ok((rails, shape, theirs))
            }
            Err(e) => Err(refused(links, e, &theirs.name)),
        }
    }
}

/// The lanes: every rail's queue pairs in rail-major order (lane `i` starts with generation
/// `i`, as the core does) and its notification buffers, every queue pair connected to the
/// peer's of the same position.
fn build_lanes(
    agent: &Arc<AgentShared>,
    rails: Vec<Vec<QueuePair>>,
    theirs: &Hello,
) -> Result<(Vec<QueuePair>, Vec<NotifyPool>)> {
    let cfg = &agent.config;
    let mut qps = Vec::with_capacity(rails.len() * rails[0].len());
    let mut notify = Vec::with_capacity(rails.len());
    for (r, rail_qps) in rails.into_iter().enumerate() {
        let pool = NotifyPool::new(&agent.rails[r].pd, cfg.notify_slots, cfg.notify_max)?;
        // The receive slots are posted once the connection exists, as far as the agent's
        // notification bound lets (Connection::post_first_slots).
        qps.extend(rail_qps);
        notify.push(pool);
    }
    for (qp, e) in qps.iter().zip(theirs.rails.iter().flatten()) {
        qp.connect(e)?;
    }
    Ok((qps, notify))
}

/// What of the agent's configuration its connections' cores use ([`handshake::Settings`]).
fn settings(cfg: &AgentConfig) -> Settings {
    Settings {
        send_depth: u64::from(cfg.send_queue_depth),
        slice_size: cfg.slice_size,
        stripe_min: cfg.stripe_min,
        notify_slots: cfg.notify_slots,
        notify_queue: cfg.notify_queue,
        notify_max: cfg.notify_max,
        quiesce: cfg.quiesce,
        renew_timeout: RENEW_TIMEOUT.min(cfg.connect_timeout),
    }
}

/// Publishes the connection (so later registrations reach it) and takes our segment table in
/// one step under the endpoint's lock, and sends the table holding the writer from before that
/// step: any announcement made after the snapshot is sent after it, in order. A refusal by the agent (full, the name
/// taken, closing) is told to the peer.
fn send_our_table(
    agent: &Arc<AgentShared>,
    conn: &Arc<Connection>,
    reader: &mut TcpLink,
) -> Result<()> {
    // The core before the writer before the endpoint.
    let routes = conn.routes();
    let mut w = conn.writer.lock().unwrap_or_else(|p| p.into_inner());
    let mut endpoint = agent.lock_endpoint();
    if let Err(e) = agent.add_peer(&mut endpoint, conn, &routes) {
        drop(endpoint);
        return Err(refuse(
            &mut w,
            Linger {
                socket: &conn.socket,
                reader,
            },
            e,
        ));
    }
    let infos: Vec<_> = endpoint
        .segments()
        .values()
        .filter(|s| s.is_published())
        .map(|s| s.info().clone())
        .collect();
    drop(endpoint);
    let sent = segment_messages(&infos)
        .iter()
        .try_for_each(|m| send(&mut w, m))
        .and_then(|()| send(&mut w, &Message::Ready));
    drop(w);
    if let Err(e) = sent {
        agent.remove_peer(conn);
        return Err(e);
    }
    Ok(())
}

/// The peer's segment table, until its ready.
fn receive_their_table(conn: &Connection, reader: &mut TcpLink) -> Result<()> {
    loop {
        match recv(reader, &conn.name)? {
            Message::Ready => return Ok(()),
            msg => conn
                .apply_table(msg)
                .map_err(|e| Error::protocol(&conn.name, e.to_string()))?,
        }
    }
}

/// Starts the connection's control reader thread, joined when the agent is dropped (after its
/// socket is shut down, which ends it).
fn start_reader(agent: &Arc<AgentShared>, conn: &Arc<Connection>, reader: TcpLink) -> Result<()> {
    let weak = Arc::downgrade(agent);
    let c = conn.clone();
    let reader_thread = std::thread::Builder::new()
        .name(format!("xfer-ctl-{}", conn.name))
        .spawn(move || read_control(weak, c, reader))
        .map_err(|e| Error::io("starting the control reader thread", e))?;
    agent.keep_thread(reader_thread);
    Ok(())
}

/// The reader thread of one peer: applies its announcements until the connection ends, then
/// loses the peer (failing its pending transfers) and forgets it.
fn read_control(agent: Weak<AgentShared>, conn: Arc<Connection>, mut link: TcpLink) {
    let why = loop {
        match recv(&mut link, &conn.name) {
            Ok(msg) => {
                if let Err(why) = conn.apply(msg) {
                    break Lost::Message { why };
                }
            }
            Err(e) => {
                break Lost::Link {
                    error: DriverError::new(e),
                }
            }
        }
    };
    if !conn.is_lost() {
        if matches!(
            why,
            Lost::Message {
                why: TableError::Goodbye { .. }
            }
        ) {
            log::info!("peer {}: {why}", conn.name);
        } else {
            log::warn!("peer {} lost: {why}", conn.name);
        }
    }
    // New transfers are refused from now on; those in flight get their completions already
    // queued handled first (a peer that read our last notification and said goodbye must not
    // turn that transfer into a failure), then fail.
    let failure = Failure::PeerLost { why };
    conn.set_closing(failure.clone());
    match agent.upgrade() {
        Some(a) => a.remove_peer_after_drain(&conn, failure),
        None => conn.lose(failure),
    }
}
