//! The control messages agents exchange over their TCP link, version 2. Everything is
//! big-endian; each message travels in one gdr frame ([`gdr::connect::TcpLink::send_bytes`],
//! at most [`gdr::connect::wire::MAX_BODY`] bytes).
//!
//! ```text
//! header:   magic "GXF1" | version u16 | kind u8 | reserved u8
//! hello:    name length u8 (1..=MAX_NAME) | name (UTF-8)
//!           rail count u8 (1..=MAX_RAILS) | rail count x endpoints
//!           notification slots u16 | largest notification u32 (<= MAX_NOTIFY)
//! endpoints: queue pair count u8 (1..=MAX_QPS, the same on every rail) |
//!           count x (length u16 | gdr hello body: the endpoint)
//! segments: count u16 (<= MAX_SEGMENTS_PER_MESSAGE) | count x
//!           (id u32 | addr u64 | len u64 | rkey count u8 (1..=MAX_RAILS) | count x rkey u32 |
//!            location kind u8 | location index u32 | name length u8 (<= MAX_NAME) | name)
//! removed:  count u16 (<= MAX_SEGMENTS_PER_MESSAGE) | count x id u32
//! ready:    (empty)
//! bye:      reason length u16 (<= MAX_REASON) | reason (UTF-8, refused otherwise)
//! renew:    rail u8 (< MAX_RAILS) | epoch u32 | endpoints   (new queue pairs for one rail)
//! renewed:  rail u8 (< MAX_RAILS) | epoch u32 | endpoints   (the answer: the peer's new ones)
//! refused:  rail u8 (< MAX_RAILS) | epoch u32               (the answer: it could not renew)
//! ```
//!
//! Rails are paired by position: rail `r` of one agent talks to rail `r` of the other (NIC `r`
//! of every host on the same network plane, as in rail-optimized fabrics); a segment carries one
//! remote key per rail of its owner.
//!
//! A decoder never trusts a length: every count and size is checked against its limit and the
//! bytes present; trailing bytes, bad UTF-8, a zero-length segment, an address range that
//! overflows, an unknown kind or version are errors ([`Error::Protocol`]), never panics.

use gdr::connect::PeerInfo;
use gdr::qp::Endpoint;

use crate::error::{Error, Result};
use crate::location::Location;

/// Magic bytes that open every message.
pub const MAGIC: [u8; 4] = *b"GXF1";
/// The version this build speaks.
pub const VERSION: u16 = 2;
/// The version of [`AgentRecord`]s this build writes and reads.
pub const RECORD_VERSION: u16 = 1;
/// Most rails (RDMA ports) an agent uses.
pub const MAX_RAILS: usize = 8;
/// Longest agent or segment name, in bytes.
pub const MAX_NAME: usize = 64;
/// Most queue pairs per peer.
pub const MAX_QPS: usize = 16;
/// Largest notification, in bytes.
pub const MAX_NOTIFY: u32 = 4096;
/// Most segment entries (or removed ids) in one message; longer tables take several messages.
pub const MAX_SEGMENTS_PER_MESSAGE: usize = 1024;
/// Longest reason in a bye message, in bytes.
pub const MAX_REASON: usize = 1024;

const KIND_HELLO: u8 = 1;
const KIND_SEGMENTS: u8 = 2;
const KIND_REMOVED: u8 = 3;
const KIND_READY: u8 = 4;
const KIND_BYE: u8 = 5;
const KIND_RAIL_RENEW: u8 = 6;
const KIND_RAIL_RENEWED: u8 = 7;
const KIND_RAIL_REFUSED: u8 = 8;

/// What one agent tells another when they connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The agent's name.
    pub name: String,
    /// Per rail, one endpoint per queue pair the agent created for this peer (the same count
    /// on every rail).
    pub rails: Vec<Vec<Endpoint>>,
    /// How many notifications the agent can receive before it reposts receives.
    pub notify_slots: u16,
    /// The largest notification it accepts.
    pub notify_max: u32,
}

/// A segment as peers see it: what they need to read or write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    /// The owner's id for it (never reused by that owner).
    pub id: u32,
    /// Its name (may be empty).
    pub name: String,
    /// The address the owner's NIC uses for byte 0.
    pub addr: u64,
    /// Length in bytes (non-zero).
    pub len: u64,
    /// Remote key on each of the owner's rails (rail 0 first).
    pub rkeys: Vec<u32>,
    /// Where the memory lives.
    pub location: Location,
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Endpoints and limits, first message each way.
    Hello(Hello),
    /// Segments added to the sender's table.
    Segments(Vec<SegmentInfo>),
    /// Segments removed from the sender's table.
    Removed(Vec<u32>),
    /// The sender's queue pairs are connected and its receives posted.
    Ready,
    /// The sender is going away.
    Bye(String),
    /// The sender replaced its queue pairs of one rail (after a failure) and asks the peer to
    /// do the same and connect them.
    RailRenew(RailRenew),
    /// The answer to a [`Message::RailRenew`]: the peer's new queue pairs, connected.
    RailRenewed(RailRenew),
    /// The answer to a [`Message::RailRenew`] the peer could not carry out (its side of the
    /// rail is down too): the offer is void, try again later.
    RailRefused {
        /// The rail.
        rail: u8,
        /// The epoch of the offer refused.
        epoch: u32,
    },
}

/// New queue pairs for one rail ([`Message::RailRenew`], [`Message::RailRenewed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailRenew {
    /// The rail (its position in both agents' rail lists).
    pub rail: u8,
    /// Which renewal this is (an answer names the request it answers).
    pub epoch: u32,
    /// One endpoint per queue pair.
    pub endpoints: Vec<Endpoint>,
}

/// What an agent publishes in a directory about itself (the `<agent>/endpoint` record):
/// magic "GXR1" | version u16 | address length u16 (<= MAX_ADDR) | address (UTF-8, `host:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRecord {
    /// Where peers connect (`host:port`).
    pub addr: String,
}

/// Magic bytes of an agent record.
pub const RECORD_MAGIC: [u8; 4] = *b"GXR1";
/// Longest address in an agent record.
pub const MAX_ADDR: usize = 256;

impl AgentRecord {
    /// Encodes the record.
    pub fn encode(&self) -> Result<Vec<u8>> {
        if self.addr.is_empty() || self.addr.len() > MAX_ADDR {
            return Err(Error::invalid(
                format!("agent address {:?}", self.addr),
                format!("give host:port, at most {MAX_ADDR} bytes"),
            ));
        }
        let mut v = Vec::with_capacity(8 + self.addr.len());
        v.extend_from_slice(&RECORD_MAGIC);
        v.extend_from_slice(&RECORD_VERSION.to_be_bytes());
        v.extend_from_slice(&(self.addr.len() as u16).to_be_bytes());
        v.extend_from_slice(self.addr.as_bytes());
        Ok(v)
    }

    /// Decodes a record published by `agent` (named in errors).
    pub fn decode(agent: &str, buf: &[u8]) -> Result<AgentRecord> {
        let mut r = Reader {
            buf,
            pos: 0,
            peer: agent,
        };
        if r.take(4, "magic")? != RECORD_MAGIC {
            return Err(r.err("not a gdr-xfer agent record (bad magic)".into()));
        }
        let version = r.u16("version")?;
        if version != RECORD_VERSION {
            return Err(r.err(format!(
                "agent record version {version}, this build reads {RECORD_VERSION}"
            )));
        }
        let len = r.u16("address length")? as usize;
        if len == 0 || len > MAX_ADDR {
            return Err(r.err(format!("address of {len} bytes (1..={MAX_ADDR})")));
        }
        let addr = String::from_utf8(r.take(len, "address")?.to_vec())
            .map_err(|_| r.err("address is not UTF-8".into()))?;
        if r.pos != buf.len() {
            return Err(r.err(format!(
                "{} trailing bytes after the record",
                buf.len() - r.pos
            )));
        }
        Ok(AgentRecord { addr })
    }
}

fn check_name(what: &str, name: &str) -> Result<()> {
    if name.len() > MAX_NAME {
        return Err(Error::invalid(
            format!("{what} {name:?} is {} bytes long", name.len()),
            format!("names are at most {MAX_NAME} bytes"),
        ));
    }
    Ok(())
}

fn count_u16(what: &str, n: usize, limit: usize) -> Result<u16> {
    if n > limit {
        return Err(Error::invalid(
            format!("{n} {what} in one message"),
            format!("at most {limit}: split the list"),
        ));
    }
    Ok(n as u16)
}

impl Message {
    /// Encodes the message. Values a peer would refuse are an [`Error::InvalidArgument`].
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&MAGIC);
        v.extend_from_slice(&VERSION.to_be_bytes());
        match self {
            Message::Hello(h) => {
                v.push(KIND_HELLO);
                v.push(0);
                check_name("agent name", &h.name)?;
                if h.name.is_empty() {
                    return Err(Error::invalid("empty agent name", "name every agent"));
                }
                v.push(h.name.len() as u8);
                v.extend_from_slice(h.name.as_bytes());
                if h.rails.is_empty() || h.rails.len() > MAX_RAILS {
                    return Err(Error::invalid(
                        format!("{} rails", h.rails.len()),
                        format!("use 1..={MAX_RAILS}"),
                    ));
                }
                v.push(h.rails.len() as u8);
                for r in &h.rails {
                    if r.len() != h.rails[0].len() {
                        return Err(Error::invalid(
                            "rails with different queue pair counts",
                            "create the same number of queue pairs on every rail",
                        ));
                    }
                    encode_endpoints(&mut v, r)?;
                }
                if h.notify_max > MAX_NOTIFY {
                    return Err(Error::invalid(
                        format!("notifications of {} bytes", h.notify_max),
                        format!("at most {MAX_NOTIFY}"),
                    ));
                }
                v.extend_from_slice(&h.notify_slots.to_be_bytes());
                v.extend_from_slice(&h.notify_max.to_be_bytes());
            }
            Message::Segments(list) => {
                v.push(KIND_SEGMENTS);
                v.push(0);
                let n = count_u16("segments", list.len(), MAX_SEGMENTS_PER_MESSAGE)?;
                v.extend_from_slice(&n.to_be_bytes());
                for s in list {
                    check_name("segment name", &s.name)?;
                    v.extend_from_slice(&s.id.to_be_bytes());
                    v.extend_from_slice(&s.addr.to_be_bytes());
                    v.extend_from_slice(&s.len.to_be_bytes());
                    if s.rkeys.is_empty() || s.rkeys.len() > MAX_RAILS {
                        return Err(Error::invalid(
                            format!("segment {} with {} remote keys", s.id, s.rkeys.len()),
                            format!("one per rail, 1..={MAX_RAILS}"),
                        ));
                    }
                    v.push(s.rkeys.len() as u8);
                    for k in &s.rkeys {
                        v.extend_from_slice(&k.to_be_bytes());
                    }
                    let (kind, index) = s.location.to_wire();
                    v.push(kind);
                    v.extend_from_slice(&index.to_be_bytes());
                    v.push(s.name.len() as u8);
                    v.extend_from_slice(s.name.as_bytes());
                }
            }
            Message::Removed(ids) => {
                v.push(KIND_REMOVED);
                v.push(0);
                let n = count_u16("removed segments", ids.len(), MAX_SEGMENTS_PER_MESSAGE)?;
                v.extend_from_slice(&n.to_be_bytes());
                for id in ids {
                    v.extend_from_slice(&id.to_be_bytes());
                }
            }
            Message::Ready => {
                v.push(KIND_READY);
                v.push(0);
            }
            Message::Bye(reason) => {
                v.push(KIND_BYE);
                v.push(0);
                // Cut at a character boundary: a reason is informational.
                let mut end = reason.len().min(MAX_REASON);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                v.extend_from_slice(&(end as u16).to_be_bytes());
                v.extend_from_slice(&reason.as_bytes()[..end]);
            }
            Message::RailRenew(r) | Message::RailRenewed(r) => {
                v.push(if matches!(self, Message::RailRenew(_)) {
                    KIND_RAIL_RENEW
                } else {
                    KIND_RAIL_RENEWED
                });
                v.push(0);
                if usize::from(r.rail) >= MAX_RAILS {
                    return Err(Error::invalid(
                        format!("rail {}", r.rail),
                        format!("rails are 0..{MAX_RAILS}"),
                    ));
                }
                v.push(r.rail);
                v.extend_from_slice(&r.epoch.to_be_bytes());
                encode_endpoints(&mut v, &r.endpoints)?;
            }
            Message::RailRefused { rail, epoch } => {
                v.push(KIND_RAIL_REFUSED);
                v.push(0);
                if usize::from(*rail) >= MAX_RAILS {
                    return Err(Error::invalid(
                        format!("rail {rail}"),
                        format!("rails are 0..{MAX_RAILS}"),
                    ));
                }
                v.push(*rail);
                v.extend_from_slice(&epoch.to_be_bytes());
            }
        }
        Ok(v)
    }

    /// Decodes and validates a message from `peer` (named in errors).
    pub fn decode(peer: &str, buf: &[u8]) -> Result<Message> {
        let mut r = Reader { buf, pos: 0, peer };
        if r.take(4, "magic")? != MAGIC {
            return Err(r.err("not a gdr-xfer message (bad magic)".into()));
        }
        let version = r.u16("version")?;
        if version != VERSION {
            return Err(r.err(format!(
                "wire version {version}, this build speaks {VERSION}: run the same gdr-xfer version on both sides"
            )));
        }
        let kind = r.u8("kind")?;
        let _reserved = r.u8("reserved")?;
        let msg = match kind {
            KIND_HELLO => {
                let name = r.name("agent name")?;
                if name.is_empty() {
                    return Err(r.err("empty agent name".into()));
                }
                let n = r.u8("rail count")? as usize;
                if n == 0 || n > MAX_RAILS {
                    return Err(r.err(format!("{n} rails (must be 1..={MAX_RAILS})")));
                }
                let mut rails = Vec::with_capacity(n);
                for _ in 0..n {
                    let endpoints = r.endpoints()?;
                    if rails
                        .first()
                        .is_some_and(|f: &Vec<Endpoint>| f.len() != endpoints.len())
                    {
                        return Err(r.err("rails with different queue pair counts".into()));
                    }
                    rails.push(endpoints);
                }
                let notify_slots = r.u16("notification slots")?;
                let notify_max = r.u32("largest notification")?;
                if notify_max > MAX_NOTIFY {
                    return Err(r.err(format!(
                        "notifications of {notify_max} bytes (at most {MAX_NOTIFY})"
                    )));
                }
                Message::Hello(Hello {
                    name,
                    rails,
                    notify_slots,
                    notify_max,
                })
            }
            KIND_SEGMENTS => {
                let n = r.count("segment count")?;
                let mut list = Vec::with_capacity(n.min(buf.len() / 30 + 1));
                for i in 0..n {
                    let id = r.u32("segment id")?;
                    let addr = r.u64("segment address")?;
                    let len = r.u64("segment length")?;
                    let nkeys = r.u8("rkey count")? as usize;
                    if nkeys == 0 || nkeys > MAX_RAILS {
                        return Err(r.err(format!(
                            "segment entry {i} (id {id}) with {nkeys} remote keys (1..={MAX_RAILS})"
                        )));
                    }
                    let mut rkeys = Vec::with_capacity(nkeys);
                    for _ in 0..nkeys {
                        rkeys.push(r.u32("segment rkey")?);
                    }
                    let kind = r.u8("location kind")?;
                    let index = r.u32("location index")?;
                    let name = r.name("segment name")?;
                    if len == 0 {
                        return Err(r.err(format!("segment entry {i} (id {id}) is empty")));
                    }
                    if addr.checked_add(len).is_none() {
                        return Err(r.err(format!(
                            "segment entry {i} (id {id}): address {addr:#x} + length {len} overflows"
                        )));
                    }
                    let location = Location::from_wire(kind, index).ok_or_else(|| {
                        r.err(format!(
                            "segment entry {i} (id {id}): unknown location kind {kind}"
                        ))
                    })?;
                    list.push(SegmentInfo {
                        id,
                        name,
                        addr,
                        len,
                        rkeys,
                        location,
                    });
                }
                Message::Segments(list)
            }
            KIND_REMOVED => {
                let n = r.count("removed count")?;
                let mut ids = Vec::with_capacity(n.min(buf.len() / 4 + 1));
                for _ in 0..n {
                    ids.push(r.u32("removed id")?);
                }
                Message::Removed(ids)
            }
            KIND_READY => Message::Ready,
            KIND_BYE => {
                let len = r.u16("reason length")? as usize;
                if len > MAX_REASON {
                    return Err(r.err(format!("bye reason of {len} bytes (at most {MAX_REASON})")));
                }
                let bytes = r.take(len, "reason")?;
                // Refused, not repaired: a lossy decode would turn one byte into three and
                // make the message differ from what was sent.
                let reason = String::from_utf8(bytes.to_vec())
                    .map_err(|_| r.err("bye reason is not UTF-8".into()))?;
                Message::Bye(reason)
            }
            KIND_RAIL_RENEW | KIND_RAIL_RENEWED => {
                let rail = r.u8("rail")?;
                if usize::from(rail) >= MAX_RAILS {
                    return Err(r.err(format!("rail {rail} (rails are 0..{MAX_RAILS})")));
                }
                let epoch = r.u32("epoch")?;
                let endpoints = r.endpoints()?;
                let renew = RailRenew {
                    rail,
                    epoch,
                    endpoints,
                };
                if kind == KIND_RAIL_RENEW {
                    Message::RailRenew(renew)
                } else {
                    Message::RailRenewed(renew)
                }
            }
            KIND_RAIL_REFUSED => {
                let rail = r.u8("rail")?;
                if usize::from(rail) >= MAX_RAILS {
                    return Err(r.err(format!("rail {rail} (rails are 0..{MAX_RAILS})")));
                }
                let epoch = r.u32("epoch")?;
                Message::RailRefused { rail, epoch }
            }
            other => return Err(r.err(format!("unknown message kind {other}"))),
        };
        if r.pos != buf.len() {
            return Err(r.err(format!(
                "{} trailing bytes after the message",
                buf.len() - r.pos
            )));
        }
        Ok(msg)
    }
}

/// Bytes of a message's header (magic, version, kind, reserved).
const HEADER_LEN: usize = 8;

/// The encoded size of one entry of a [`Message::Segments`].
fn segment_entry_len(s: &SegmentInfo) -> usize {
    4 + 8 + 8 + 1 + 4 * s.rkeys.len() + 1 + 4 + 1 + s.name.len()
}

/// A segment table as [`Message::Segments`] messages that each fit one frame
/// ([`gdr::connect::wire::MAX_BODY`] bytes, and at most [`MAX_SEGMENTS_PER_MESSAGE`] entries):
/// packed by encoded size, not by count (1,024 entries with 64-byte names and 8 keys would be
/// twice a frame).
pub fn segment_messages(list: &[SegmentInfo]) -> Vec<Message> {
    let limit = gdr::connect::wire::MAX_BODY - HEADER_LEN - 2;
    let mut out = Vec::new();
    let mut cur: Vec<SegmentInfo> = Vec::new();
    let mut size = 0;
    for s in list {
        let n = segment_entry_len(s);
        if !cur.is_empty() && (size + n > limit || cur.len() == MAX_SEGMENTS_PER_MESSAGE) {
            out.push(Message::Segments(std::mem::take(&mut cur)));
            size = 0;
        }
        size += n;
        cur.push(s.clone());
    }
    if !cur.is_empty() {
        out.push(Message::Segments(cur));
    }
    out
}

/// A queue pair count and that many endpoints.
fn encode_endpoints(v: &mut Vec<u8>, endpoints: &[Endpoint]) -> Result<()> {
    if endpoints.is_empty() || endpoints.len() > MAX_QPS {
        return Err(Error::invalid(
            format!("{} queue pairs per rail", endpoints.len()),
            format!("use 1..={MAX_QPS}"),
        ));
    }
    v.push(endpoints.len() as u8);
    for e in endpoints {
        let body = PeerInfo::new(*e).encode_body()?;
        v.extend_from_slice(&(body.len() as u16).to_be_bytes());
        v.extend_from_slice(&body);
    }
    Ok(())
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    peer: &'a str,
}

impl<'a> Reader<'a> {
    fn err(&self, detail: String) -> Error {
        Error::protocol(self.peer, detail)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                self.err(format!(
                    "message ends inside the {what} ({} bytes left, {n} needed)",
                    self.buf.len() - self.pos
                ))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    fn count(&mut self, what: &str) -> Result<usize> {
        let n = self.u16(what)? as usize;
        if n > MAX_SEGMENTS_PER_MESSAGE {
            return Err(self.err(format!(
                "{what} {n} exceeds the limit {MAX_SEGMENTS_PER_MESSAGE}"
            )));
        }
        Ok(n)
    }

    fn endpoints(&mut self) -> Result<Vec<Endpoint>> {
        let n = self.u8("queue pair count")? as usize;
        if n == 0 || n > MAX_QPS {
            return Err(self.err(format!("{n} queue pairs (must be 1..={MAX_QPS})")));
        }
        let mut endpoints = Vec::with_capacity(n);
        for i in 0..n {
            let len = self.u16("endpoint length")? as usize;
            let body = self.take(len, "endpoint")?;
            let info =
                PeerInfo::decode_body(body).map_err(|e| self.err(format!("endpoint {i}: {e}")))?;
            if !info.regions.is_empty() || !info.app.is_empty() {
                return Err(self.err(format!("endpoint {i} carries regions or app bytes")));
            }
            endpoints.push(info.endpoint);
        }
        Ok(endpoints)
    }

    fn name(&mut self, what: &str) -> Result<String> {
        let len = self.u8(what)? as usize;
        if len > MAX_NAME {
            return Err(self.err(format!("{what} of {len} bytes (at most {MAX_NAME})")));
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.err(format!("{what} is not UTF-8")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdr::device::{Gid, Mtu};

    fn endpoint(qpn: u32) -> Endpoint {
        Endpoint {
            qpn,
            psn: 0x1234,
            lid: 0,
            gid: Gid([0xfe; 16]),
            gid_index: 1,
            mtu: Mtu::B1024,
            port: 1,
        }
    }

    fn samples() -> Vec<Message> {
        vec![
            Message::Hello(Hello {
                name: "prefill-0".into(),
                rails: vec![
                    vec![endpoint(0x11), endpoint(0x12)],
                    vec![endpoint(0x21), endpoint(0x22)],
                ],
                notify_slots: 64,
                notify_max: 1024,
            }),
            Message::Segments(vec![
                SegmentInfo {
                    id: 7,
                    name: "kv-layer-3".into(),
                    addr: 0x7f00_0000_0000,
                    len: 1 << 20,
                    rkeys: vec![0xabcd, 0xabce],
                    location: Location::Cuda { ordinal: 3 },
                },
                SegmentInfo {
                    id: 8,
                    name: String::new(),
                    addr: 0x1000,
                    len: 4096,
                    rkeys: vec![1],
                    location: Location::Cpu { numa: Some(1) },
                },
            ]),
            Message::Removed(vec![7, 8, 9]),
            Message::Ready,
            Message::Bye("shutting down".into()),
            Message::RailRenew(RailRenew {
                rail: 1,
                epoch: 3,
                endpoints: vec![endpoint(0x31), endpoint(0x32)],
            }),
            Message::RailRenewed(RailRenew {
                rail: 7,
                epoch: u32::MAX,
                endpoints: vec![endpoint(0x41)],
            }),
            Message::RailRefused { rail: 1, epoch: 9 },
        ]
    }

    #[test]
    fn every_message_survives_a_round_trip() {
        for m in samples() {
            let bytes = m.encode().unwrap();
            assert_eq!(Message::decode("peer", &bytes).unwrap(), m);
        }
    }

    #[test]
    fn every_truncation_and_every_trailing_byte_is_refused() {
        for m in samples() {
            let bytes = m.encode().unwrap();
            for cut in 0..bytes.len() {
                assert!(
                    matches!(
                        Message::decode("p", &bytes[..cut]),
                        Err(Error::Protocol { .. })
                    ),
                    "{m:?} cut at {cut}"
                );
            }
            let mut long = bytes.clone();
            long.push(0);
            assert!(matches!(
                Message::decode("p", &long),
                Err(Error::Protocol { .. })
            ));
        }
    }

    #[test]
    fn hostile_segment_tables_are_refused() {
        let seg = |addr: u64, len: u64| {
            Message::Segments(vec![SegmentInfo {
                id: 1,
                name: "x".into(),
                addr,
                len,
                rkeys: vec![1],
                location: Location::Cpu { numa: None },
            }])
            .encode()
            .unwrap()
        };
        for (addr, len) in [(u64::MAX, 1), (1, u64::MAX), (0, 0)] {
            let e = Message::decode("evil", &seg(addr, len)).unwrap_err();
            assert!(
                matches!(e, Error::Protocol { ref peer, .. } if peer == "evil"),
                "{e}"
            );
        }
        // A count larger than the limit, a location kind nobody knows, a name that is not UTF-8.
        let mut big = seg(0x1000, 1);
        big[8..10].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(Message::decode("evil", &big).is_err());
        let mut loc = seg(0x1000, 1);
        loc[8 + 2 + 20 + 1 + 4] = 9;
        let e = Message::decode("evil", &loc).unwrap_err();
        assert!(e.to_string().contains("unknown location kind 9"), "{e}");
        let mut name = seg(0x1000, 1);
        let last = name.len() - 1;
        name[last] = 0xff;
        assert!(Message::decode("evil", &name)
            .unwrap_err()
            .to_string()
            .contains("UTF-8"));
    }

    #[test]
    fn hostile_rail_fields_are_refused() {
        // A segment with no remote key, or more than one per possible rail.
        let mut seg = Message::Segments(vec![SegmentInfo {
            id: 1,
            name: String::new(),
            addr: 0x1000,
            len: 1,
            rkeys: vec![5],
            location: Location::Cpu { numa: None },
        }])
        .encode()
        .unwrap();
        for n in [0u8, MAX_RAILS as u8 + 1, u8::MAX] {
            seg[8 + 2 + 20] = n;
            let e = Message::decode("evil", &seg).unwrap_err();
            assert!(matches!(e, Error::Protocol { .. }), "{e}");
        }
        // A rail number past the limit, and rails of different widths.
        let mut renew = Message::RailRenew(RailRenew {
            rail: 0,
            epoch: 1,
            endpoints: vec![endpoint(1)],
        })
        .encode()
        .unwrap();
        renew[8] = MAX_RAILS as u8;
        assert!(Message::decode("evil", &renew).is_err());
        let uneven = Message::Hello(Hello {
            name: "a".into(),
            rails: vec![vec![endpoint(1)], vec![endpoint(2), endpoint(3)]],
            notify_slots: 1,
            notify_max: 1,
        });
        assert!(matches!(
            uneven.encode(),
            Err(Error::InvalidArgument { .. })
        ));
        // Hand-made: rail count 2, widths 1 and 2.
        let mut ok = Message::Hello(Hello {
            name: "a".into(),
            rails: vec![vec![endpoint(1)], vec![endpoint(2)]],
            notify_slots: 1,
            notify_max: 1,
        })
        .encode()
        .unwrap();
        let zero_rails = {
            let mut z = ok.clone();
            z[10] = 0;
            z
        };
        assert!(Message::decode("evil", &zero_rails).is_err());
        ok[10] = MAX_RAILS as u8 + 1;
        assert!(Message::decode("evil", &ok).is_err());
    }

    #[test]
    fn agent_records_round_trip_and_refuse_garbage() {
        let r = AgentRecord {
            addr: "10.0.0.2:7100".into(),
        };
        let b = r.encode().unwrap();
        assert_eq!(AgentRecord::decode("a", &b).unwrap(), r);
        for cut in 0..b.len() {
            assert!(AgentRecord::decode("a", &b[..cut]).is_err());
        }
        let mut long = b.clone();
        long.push(b'x');
        assert!(AgentRecord::decode("a", &long).is_err());
        assert!(AgentRecord {
            addr: String::new()
        }
        .encode()
        .is_err());
        assert!(AgentRecord {
            addr: "x".repeat(MAX_ADDR + 1)
        }
        .encode()
        .is_err());
    }

    #[test]
    fn versions_magic_and_kinds_are_checked() {
        // Version 1 (single rail) is refused with the reason, not misread.
        let mut m = Message::Ready.encode().unwrap();
        m[5] = 1;
        assert!(Message::decode("p", &m)
            .unwrap_err()
            .to_string()
            .contains("wire version 1"));
        let mut m = Message::Ready.encode().unwrap();
        m[0] = b'X';
        assert!(Message::decode("p", &m).is_err());
        let mut m = Message::Ready.encode().unwrap();
        m[6] = 99;
        assert!(Message::decode("p", &m)
            .unwrap_err()
            .to_string()
            .contains("kind 99"));
    }

    #[test]
    fn encoding_refuses_what_a_peer_would_refuse() {
        let long = "n".repeat(MAX_NAME + 1);
        let h = |name: String, n: usize, max: u32| {
            Message::Hello(Hello {
                name,
                rails: vec![(0..n as u32).map(|i| endpoint(i + 1)).collect()],
                notify_slots: 1,
                notify_max: max,
            })
            .encode()
        };
        assert!(h(long, 1, 16).is_err());
        assert!(h(String::new(), 1, 16).is_err());
        assert!(h("a".into(), 0, 16).is_err());
        assert!(h("a".into(), MAX_QPS + 1, 16).is_err());
        assert!(h("a".into(), 1, MAX_NOTIFY + 1).is_err());
        assert!(Message::Removed(vec![0; MAX_SEGMENTS_PER_MESSAGE + 1])
            .encode()
            .is_err());
        // A long reason is cut at a character boundary, not refused.
        let reason = "é".repeat(MAX_REASON);
        let m = Message::decode("p", &Message::Bye(reason).encode().unwrap()).unwrap();
        assert!(matches!(m, Message::Bye(r) if r.len() <= MAX_REASON));
    }

    #[test]
    fn a_large_segment_table_is_split_by_encoded_size_and_every_part_fits_a_frame() {
        // 2,000 segments with 64-byte names and 8 keys: 123 bytes each, so 1,024 of them would
        // be 126 KB, twice a frame.
        let list: Vec<SegmentInfo> = (1..=2000u32)
            .map(|id| SegmentInfo {
                id,
                name: format!("{id:064}"),
                addr: 0x1000,
                len: 4096,
                rkeys: vec![id; MAX_RAILS],
                location: Location::Cuda { ordinal: 3 },
            })
            .collect();
        let msgs = segment_messages(&list);
        assert!(msgs.len() >= 4, "{} messages", msgs.len());
        let mut back = Vec::new();
        for m in &msgs {
            let bytes = m.encode().unwrap();
            assert!(
                bytes.len() <= gdr::connect::wire::MAX_BODY,
                "{} bytes",
                bytes.len()
            );
            match Message::decode("p", &bytes).unwrap() {
                Message::Segments(v) => back.extend(v),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(back, list);
        assert!(segment_messages(&[]).is_empty());
    }
}
