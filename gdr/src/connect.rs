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
use crate::qp::Endpoint;

pub use wire::PeerInfo;

/// A TCP connection to the peer for the out-of-band exchange.
pub struct TcpLink {
    stream: TcpStream,
    peer: SocketAddr,
}

impl TcpLink {
    /// Connects to `addr`, retrying until `timeout` passes (the server may not listen yet).
    pub fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> Result<TcpLink> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| Error::io("resolving the peer's address", e))?
            .collect();
        let deadline = Instant::now() + timeout;
        loop {
            let mut last = None;
            for a in &addrs {
                match TcpStream::connect_timeout(a, Duration::from_millis(500)) {
                    Ok(stream) => return Self::from_stream(stream),
                    Err(e) => last = Some((a, e)),
                }
            }
            if Instant::now() >= deadline {
                let (a, e) =
                    last.ok_or_else(|| Error::invalid("no address to connect to", Hint::NONE))?;
                return Err(Error::io(
                    format!("connecting to {a} (tried for {} ms)", timeout.as_millis()),
                    e,
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
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
        let link = TcpLink { stream, peer };
        link.set_timeout(Some(Duration::from_secs(30)))?;
        Ok(link)
    }

    /// Sets the read/write timeout of later exchanges (default 30 s; `None` waits forever).
    pub fn set_timeout(&self, t: Option<Duration>) -> Result<()> {
        self.stream
            .set_read_timeout(t)
            .map_err(|e| Error::io("setting the TCP read timeout", e))?;
        self.stream
            .set_write_timeout(t)
            .map_err(|e| Error::io("setting the TCP write timeout", e))
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    fn send_message(&mut self, kind: u16, body: &[u8]) -> Result<()> {
        let msg = wire::frame(kind, body);
        self.stream
            .write_all(&msg)
            .map_err(|e| Error::io(format!("sending to {}", self.peer), e))
    }

    fn recv_message(&mut self, want: u16) -> Result<Vec<u8>> {
        let mut header = [0u8; wire::HEADER_LEN];
        self.stream
            .read_exact(&mut header)
            .map_err(|e| Error::io(format!("receiving a header from {}", self.peer), e))?;
        let (kind, len) = wire::parse_header(&header)?;
        if kind != want {
            return Err(Error::protocol(format!(
                "expected message kind {want}, peer sent kind {kind}"
            )));
        }
        let mut body = vec![0u8; len];
        self.stream
            .read_exact(&mut body)
            .map_err(|e| Error::io(format!("receiving {len} bytes from {}", self.peer), e))?;
        Ok(body)
    }

    /// Sends ours and receives the peer's [`PeerInfo`] (both sides call it; order does not matter).
    pub fn exchange(&mut self, mine: &PeerInfo) -> Result<PeerInfo> {
        self.send_message(wire::KIND_HELLO, &mine.encode_body()?)?;
        let body = self.recv_message(wire::KIND_HELLO)?;
        PeerInfo::decode_body(&body)
    }

    /// Waits until the peer reaches the same point (both sides call it).
    pub fn barrier(&mut self) -> Result<()> {
        self.send_message(wire::KIND_BARRIER, &[])?;
        let body = self.recv_message(wire::KIND_BARRIER)?;
        if !body.is_empty() {
            return Err(Error::protocol(format!(
                "barrier message carries {} unexpected bytes",
                body.len()
            )));
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
pub fn handshake(
    link: &mut TcpLink,
    qp: &crate::qp::QueuePair,
    regions: &[RemoteRegion],
) -> Result<PeerInfo> {
    let mine = PeerInfo {
        endpoint: qp.endpoint(),
        regions: regions.to_vec(),
        app: Vec::new(),
    };
    let peer = link.exchange(&mine)?;
    qp.connect(&peer.endpoint)?;
    link.barrier()?;
    Ok(peer)
}

impl PeerInfo {
    /// Our endpoint and no regions.
    pub fn new(endpoint: Endpoint) -> Self {
        PeerInfo {
            endpoint,
            regions: Vec::new(),
            app: Vec::new(),
        }
    }

    /// Adds a region the peer may access.
    pub fn region(mut self, r: RemoteRegion) -> Self {
        self.regions.push(r);
        self
    }

    /// Attaches application bytes (sizes, names, ...).
    pub fn app_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.app = data.into();
        self
    }
}
