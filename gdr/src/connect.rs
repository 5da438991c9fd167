//! Connection setup: an out-of-band TCP exchange of endpoints and remote regions with a
//! versioned, length-bounded wire format ([`wire`]), and rdma_cm ([`cm`]) to connect by IP
//! address and port like `rping` or `ucmatose` peers do.
//!
//! ```no_run
//! use gdr::connect::{PeerInfo, TcpLink};
//! # fn f(qp: &gdr::qp::QueuePair, mr: &std::sync::Arc<gdr::mr::MemoryRegion>) -> gdr::Result<()> {
//! use gdr::mr::RegionExt;
//! let mut link = TcpLink::connect("10.0.0.2:18515", std::time::Duration::from_secs(10))?;
//! let peer = link.exchange(&PeerInfo::new(qp.endpoint()).region(mr.remote()))?;
//! qp.connect(&peer.endpoint)?;
//! # Ok(()) }
//! ```

pub mod cm;
pub mod wire;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::{Error, Hint, Result};
use crate::mr::RemoteRegion;
use crate::qp::{Endpoint, QueuePair};

pub use wire::PeerInfo;

/// How long one TCP connection attempt of [`TcpLink::connect`] may take.
const CONNECT_ATTEMPT: Duration = Duration::from_millis(500);
/// Pause between rounds of attempts.
const CONNECT_RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Read and write timeout of a new link.
const DEFAULT_LINK_TIMEOUT: Duration = Duration::from_secs(30);

/// The instant `timeout` from now, or `None` (no deadline: wait forever) when it does not fit
/// an [`Instant`], as with `Duration::MAX`.
pub(crate) fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// Time left until `deadline` (zero once it passed; `Duration::MAX` without one).
pub(crate) fn time_left(deadline: Option<Instant>) -> Duration {
    match deadline {
        Some(d) => d.saturating_duration_since(Instant::now()),
        None => Duration::MAX,
    }
}

/// A duration in whole milliseconds, saturating at `u64::MAX`, for error messages.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A TCP connection to the peer for the out-of-band exchange.
#[derive(Debug)]
pub struct TcpLink {
    stream: TcpStream,
    peer: SocketAddr,
    /// The read/write timeout in force, for error messages.
    timeout: std::sync::Mutex<Option<Duration>>,
}

impl TcpLink {
    /// Connects to `addr`, retrying until `timeout` passes (the server may not listen yet).
    /// Every round tries each address once (at most 500 ms each), so a zero timeout still makes
    /// one round; `Duration::MAX` retries forever.
    pub fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> Result<TcpLink> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| Error::io("resolving the peer's address", e))?
            .collect();
        if addrs.is_empty() {
            return Err(Error::invalid(
                "the peer's address resolved to no socket address",
                Hint::NONE,
            ));
        }
        let start = Instant::now();
        let deadline = deadline_after(timeout);
        loop {
            let mut last = None;
            for a in &addrs {
                match TcpStream::connect_timeout(a, CONNECT_ATTEMPT) {
                    Ok(stream) => return Self::from_stream(stream),
                    Err(e) => last = Some((a, e)),
                }
            }
            let left = time_left(deadline);
            if left.is_zero() {
                let (a, e) =
                    last.ok_or_else(|| Error::invalid("no address to connect to", Hint::NONE))?;
                return Err(Error::io(
                    format!(
                        "connecting to {a} (tried for {} ms)",
                        millis(start.elapsed())
                    ),
                    e,
                ));
            }
            std::thread::sleep(left.min(CONNECT_RETRY_PAUSE));
        }
    }

    /// Accepts one connection on `listener`.
    pub fn accept(listener: &TcpListener) -> Result<TcpLink> {
        let (stream, _) = listener
            .accept()
            .map_err(|e| Error::io("accepting the peer's connection", e))?;
        Self::from_stream(stream)
    }

    /// Wraps a connected stream.
    pub fn from_stream(stream: TcpStream) -> Result<TcpLink> {
        let peer = stream
            .peer_addr()
            .map_err(|e| Error::io("peer address of the TCP link", e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| Error::io("TCP_NODELAY", e))?;
        let link = TcpLink {
            stream,
            peer,
            timeout: std::sync::Mutex::new(None),
        };
        link.set_timeout(Some(DEFAULT_LINK_TIMEOUT))?;
        Ok(link)
    }

    /// Sets the read/write timeout of later exchanges (default 30 s; `None` waits forever, and
    /// so does a timeout too long for the operating system, such as `Duration::MAX`). A zero
    /// timeout is an [`Error::Io`] (`InvalidInput`), as with [`TcpStream::set_read_timeout`].
    pub fn set_timeout(&self, t: Option<Duration>) -> Result<()> {
        self.stream
            .set_read_timeout(t)
            .map_err(|e| Error::io("setting the TCP read timeout", e))?;
        self.stream
            .set_write_timeout(t)
            .map_err(|e| Error::io("setting the TCP write timeout", e))?;
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner()) = t;
        Ok(())
    }

    /// The error of a failed exchange step `what`: a timeout is [`Error::Timeout`], a peer that
    /// closed the connection is an [`Error::Protocol`] that says so (mid-frame: a truncated
    /// frame), anything else an [`Error::Io`].
    fn link_error(&self, what: String, mid_frame: bool, e: std::io::Error) -> Error {
        use std::io::ErrorKind::*;
        match e.kind() {
            WouldBlock | TimedOut => Error::Timeout {
                what: format!("{what} ({})", self.peer),
                after: self
                    .timeout
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .unwrap_or(Duration::MAX),
                hint: Hint::new("is the peer alive and at the same step? raise the link timeout with set_timeout"),
            },
            UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted => Error::PeerLost {
                peer: self.peer.to_string(),
                reason: if mid_frame {
                    format!("{what}: truncated frame, the peer closed the connection in the middle of a message")
                } else {
                    format!("{what}: the peer closed the connection")
                },
                hint: Hint::new("the peer process exited or gave up (look at its output); reconnect"),
            },
            _ => Error::io(format!("{what} ({})", self.peer), e),
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    fn send_message(&mut self, kind: u16, body: &[u8]) -> Result<()> {
        let msg = wire::frame(kind, body)?;
        self.stream
            .write_all(&msg)
            .map_err(|e| self.link_error(format!("sending a {}-byte message", msg.len()), false, e))
    }

    fn recv_message(&mut self, want: u16) -> Result<Vec<u8>> {
        let mut header = [0u8; wire::HEADER_LEN];
        self.stream
            .read_exact(&mut header)
            .map_err(|e| self.link_error("receiving a message header".into(), false, e))?;
        let (kind, len) = wire::parse_header(&header).map_err(|e| e.from_peer(self.peer))?;
        if kind != want {
            return Err(Error::protocol(format!(
                "expected message kind {want}, peer sent kind {kind}"
            ))
            .from_peer(self.peer));
        }
        // `len` is at most wire::MAX_BODY (parse_header checked it): a bounded allocation.
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body).map_err(|e| {
            self.link_error(format!("receiving a {len}-byte message body"), true, e)
        })?;
        Ok(body)
    }

    /// Sends ours and receives the peer's [`PeerInfo`] (both sides call it; order does not matter).
    pub fn exchange(&mut self, mine: &PeerInfo) -> Result<PeerInfo> {
        self.send_message(wire::KIND_HELLO, &mine.encode_body()?)?;
        let body = self.recv_message(wire::KIND_HELLO)?;
        PeerInfo::decode_body(&body).map_err(|e| e.from_peer(self.peer))
    }

    /// Waits until the peer reaches the same point (both sides call it).
    pub fn barrier(&mut self) -> Result<()> {
        self.send_message(wire::KIND_BARRIER, &[])?;
        let body = self.recv_message(wire::KIND_BARRIER)?;
        if !body.is_empty() {
            return Err(Error::protocol(format!(
                "barrier message carries {} unexpected bytes",
                body.len()
            ))
            .from_peer(self.peer));
        }
        Ok(())
    }

    /// Sends a small application message (at most [`wire::MAX_BODY`] bytes).
    pub fn send_bytes(&mut self, data: &[u8]) -> Result<()> {
        if data.len() > wire::MAX_BODY {
            return Err(Error::invalid(
                format!("message of {} bytes exceeds {}", data.len(), wire::MAX_BODY),
                Hint::NONE,
            ));
        }
        self.send_message(wire::KIND_APP, data)
    }

    /// Receives a message sent with [`TcpLink::send_bytes`].
    pub fn recv_bytes(&mut self) -> Result<Vec<u8>> {
        self.recv_message(wire::KIND_APP)
    }
}

/// Connects a queue pair to a peer in one call: sends our endpoint and regions, receives the
/// peer's, moves the queue pair to RTS, and waits at a barrier so that neither side posts before
/// the other is ready.
///
/// # Errors, and the queue pair afterwards
///
/// * The hello exchange fails (I/O error, timeout, [`Error::Protocol`] for a malformed or
///   incompatible hello): `qp` is untouched, still in INIT; handshake again over a new link.
/// * The hello succeeded but [`QueuePair::connect`] or the barrier fails (the peer closed the
///   link, timed out, or sent garbage): the peer may already believe the connection is up, so
///   handshake moves `qp` to the error state ([`QueuePair::disconnect`]). Requests already
///   posted complete with flush errors (reap them to release their regions), new posts are
///   refused, and the caller must [`QueuePair::reset`] it and handshake again (both sides)
///   before using it. If even that transition fails, the failure is logged, the original error
///   is returned, and [`QueuePair::state`] tells where the queue pair is.
///
/// The error returned is always the one that broke the handshake.
pub fn handshake(link: &mut TcpLink, qp: &QueuePair, regions: &[RemoteRegion]) -> Result<PeerInfo> {
    let mine = PeerInfo {
        endpoint: qp.endpoint(),
        regions: regions.to_vec(),
        app: Vec::new(),
    };
    let peer = link.exchange(&mine)?;
    let connected = qp.connect(&peer.endpoint).and_then(|()| link.barrier());
    if let Err(e) = connected {
        if let Err(d) = qp.disconnect() {
            log::error!(
                "handshake with {} failed ({e}); moving QP {:#x} to the error state failed too: {d}",
                link.peer_addr(),
                qp.qp_num()
            );
        }
        return Err(e);
    }
    Ok(peer)
}

impl PeerInfo {
    /// Our endpoint and no regions.
    #[must_use]
    pub fn new(endpoint: Endpoint) -> Self {
        PeerInfo {
            endpoint,
            regions: Vec::new(),
            app: Vec::new(),
        }
    }

    /// Adds a region the peer may access.
    #[must_use]
    pub fn region(mut self, r: RemoteRegion) -> Self {
        self.regions.push(r);
        self
    }

    /// Attaches application bytes (sizes, names, ...).
    #[must_use]
    pub fn app_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.app = data.into();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Shutdown;

    #[test]
    fn deadlines_never_overflow() {
        assert_eq!(
            deadline_after(Duration::MAX),
            None,
            "no deadline, not a panic"
        );
        assert_eq!(time_left(None), Duration::MAX);
        assert!(deadline_after(Duration::from_secs(1)).is_some());
        let past = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(time_left(Some(past)), Duration::ZERO);
        assert_eq!(millis(Duration::MAX), u64::MAX);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
    }

    #[test]
    fn connect_with_duration_max_connects() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || TcpLink::accept(&listener).map(|l| l.peer_addr()));
        let link = TcpLink::connect(addr, Duration::MAX).unwrap();
        assert_eq!(link.peer_addr(), addr);
        assert_eq!(
            server.join().unwrap().unwrap(),
            link.stream.local_addr().unwrap()
        );
        link.set_timeout(Some(Duration::MAX)).unwrap();
        link.set_timeout(None).unwrap();
        assert!(matches!(
            link.set_timeout(Some(Duration::ZERO)),
            Err(Error::Io { .. })
        ));
    }

    #[test]
    fn connect_with_zero_timeout_tries_once() {
        // A port nobody listens on: bind one, note it, close it.
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let t = Instant::now();
        let e = TcpLink::connect(addr, Duration::ZERO).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    #[test]
    fn a_silent_peer_is_a_timeout_not_an_io_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_millis(800));
            drop(s);
        });
        let mut link = TcpLink::connect(addr, Duration::from_secs(5)).unwrap();
        link.set_timeout(Some(Duration::from_millis(200))).unwrap();
        match link.recv_bytes() {
            Err(Error::Timeout { after, what, .. }) if after == Duration::from_millis(200) => {
                assert!(what.contains("message header"), "{what}")
            }
            other => panic!("{other:?}"),
        }
        peer.join().unwrap();
    }

    /// A link whose peer is a thread that writes `bytes` raw and then closes.
    fn hostile_peer(bytes: Vec<u8>) -> TcpLink {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let _ = s.write_all(&bytes);
            let _ = s.shutdown(Shutdown::Write);
            // Drain what the other side sends until it closes, so no reset races the bytes.
            let _ = std::io::copy(&mut s, &mut std::io::sink());
        });
        let link = TcpLink::connect(addr, Duration::from_secs(5)).unwrap();
        link.set_timeout(Some(Duration::from_secs(5))).unwrap();
        link
    }

    fn header(kind: u16, len: u32) -> Vec<u8> {
        let mut h = wire::frame(kind, &[]).unwrap();
        h[8..12].copy_from_slice(&len.to_be_bytes());
        h
    }

    #[test]
    fn hostile_peers_get_errors_not_panics_or_huge_allocations() {
        // Lengths near u32::MAX are refused from the header alone.
        for len in [u32::MAX, u32::MAX - 1, wire::MAX_BODY as u32 + 1] {
            let e = hostile_peer(header(wire::KIND_APP, len))
                .recv_bytes()
                .unwrap_err();
            assert!(matches!(e, Error::Protocol { .. }), "{len}: {e}");
        }
        // A body length at the limit with the body missing: a truncated frame, named as such.
        let e = hostile_peer(header(wire::KIND_APP, wire::MAX_BODY as u32))
            .recv_bytes()
            .unwrap_err();
        assert!(
            matches!(&e, Error::PeerLost { peer, reason, .. }
                if reason.contains("truncated frame") && peer.starts_with("127.0.0.1:")),
            "{e}"
        );
        // A truncated header, and nothing at all: the peer closed the connection.
        for bytes in [header(wire::KIND_APP, 0)[..7].to_vec(), Vec::new()] {
            let e = hostile_peer(bytes).recv_bytes().unwrap_err();
            assert!(
                matches!(&e, Error::PeerLost { reason, .. } if reason.contains("closed the connection")),
                "{e}"
            );
        }
        // The wrong kind, a barrier with a body, a hello that does not decode.
        let e = hostile_peer(wire::frame(wire::KIND_BARRIER, &[]).unwrap())
            .recv_bytes()
            .unwrap_err();
        assert!(e.to_string().contains("expected message kind 3"), "{e}");
        assert!(
            matches!(&e, Error::Protocol { peer, .. } if peer.starts_with("127.0.0.1:")),
            "the link names its peer: {e:?}"
        );
        let e = hostile_peer(wire::frame(wire::KIND_BARRIER, &[1, 2]).unwrap())
            .barrier()
            .unwrap_err();
        assert!(e.to_string().contains("2 unexpected bytes"), "{e}");
        let e = hostile_peer(wire::frame(wire::KIND_HELLO, &[0; 20]).unwrap())
            .recv_message(wire::KIND_HELLO)
            .and_then(|b| PeerInfo::decode_body(&b))
            .unwrap_err();
        assert!(matches!(e, Error::Protocol { .. }), "{e}");
        // And a well-formed message still arrives.
        let got = hostile_peer(wire::frame(wire::KIND_APP, b"fine").unwrap())
            .recv_bytes()
            .unwrap();
        assert_eq!(got, b"fine");
    }

    #[test]
    fn oversized_sends_are_refused_before_anything_is_written() {
        let mut link = hostile_peer(Vec::new());
        let e = link.send_bytes(&vec![0; wire::MAX_BODY + 1]).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    }
}
