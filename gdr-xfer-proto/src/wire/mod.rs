//! The control messages agents exchange over their TCP link, version 2. Everything is
//! big-endian; each message travels in one frame of the driver's control link (at most
//! [`MAX_MESSAGE`] bytes).
//!
//! ```text
//! header:   magic "GXF1" | version u16 | kind u8 | reserved u8
//! hello:    name length u8 (1..=MAX_NAME) | name (UTF-8)
//!           rail count u8 (1..=MAX_RAILS) | rail count x endpoints
//!           notification slots u16 | largest notification u32 (<= MAX_NOTIFY)
//! endpoints: queue pair count u8 (1..=MAX_QPS, the same on every rail) |
//!           count x (length u16 | the endpoint, as the driver's Codec writes it)
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
//! What a queue pair's endpoint is belongs to the driver: a [`Codec`] encodes and decodes it
//! (gdr-xfer writes gdr's connection-hello body; the simulation writes its queue pair's
//! number). Everything else is decided here.
//!
//! A decoder never trusts a length: every count and size is checked against its limit and the
//! bytes present; trailing bytes, bad UTF-8, a zero-length segment, an address range that
//! overflows, an unknown kind or version are errors ([`WireError::Protocol`]), never panics.

mod error;
mod reader;
mod record;
#[cfg(test)]
mod tests;

use std::fmt;

use crate::control::Control;
use crate::location::Location;
use reader::Reader;

pub use error::WireError;
pub use record::{AgentRecord, MAX_ADDR, RECORD_MAGIC, RECORD_VERSION};

/// Magic bytes that open every message.
pub const MAGIC: [u8; 4] = *b"GXF1";
/// The version this build speaks.
pub const VERSION: u16 = 2;
/// Most rails (RDMA ports) an agent uses.
pub const MAX_RAILS: usize = 8;
/// Longest agent or segment name, in bytes.
pub const MAX_NAME: usize = 64;
/// Most queue pairs per peer.
pub const MAX_QPS: usize = 16;
/// Largest notification, in bytes.
pub const MAX_NOTIFY: u32 = 64 * 1024;
/// Most segment entries (or removed ids) in one message; longer tables take several messages.
pub const MAX_SEGMENTS_PER_MESSAGE: usize = 1024;
/// Longest reason in a bye message, in bytes.
pub const MAX_REASON: usize = 1024;
/// Largest encoded message: the largest frame body of the driver's control link (gdr's
/// `connect::wire::MAX_BODY`; gdr-xfer checks at compile time that the two agree).
pub const MAX_MESSAGE: usize = 64 * 1024;

const KIND_HELLO: u8 = 1;
const KIND_SEGMENTS: u8 = 2;
const KIND_REMOVED: u8 = 3;
const KIND_READY: u8 = 4;
const KIND_BYE: u8 = 5;
const KIND_RAIL_RENEW: u8 = 6;
const KIND_RAIL_RENEWED: u8 = 7;
const KIND_RAIL_REFUSED: u8 = 8;

/// Bytes of a message's header (magic, version, kind, reserved).
const HEADER_LEN: usize = 8;

/// How a driver writes and reads one queue pair's endpoint. Implemented by a marker type of
/// the driver's, which names the message types (`Message<MyCodec>`).
pub trait Codec {
    /// One queue pair's endpoint.
    type Endpoint: Clone + fmt::Debug + PartialEq + Eq;
    /// The endpoint's bytes (at most `u16::MAX`); an error names what cannot be sent.
    fn encode_endpoint(endpoint: &Self::Endpoint) -> Result<Vec<u8>, String>;
    /// The endpoint written by [`Codec::encode_endpoint`]; an error names what is wrong with
    /// the bytes (the decoder adds the peer and the endpoint's position).
    fn decode_endpoint(bytes: &[u8]) -> Result<Self::Endpoint, String>;
}

/// What one agent tells another when they connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello<C: Codec> {
    /// The agent's name.
    pub name: String,
    /// Per rail, one endpoint per queue pair the agent created for this peer (the same count
    /// on every rail).
    pub rails: Vec<Vec<C::Endpoint>>,
    /// How many notifications the agent can receive before it reposts receives.
    pub notify_slots: u16,
    /// The largest notification it accepts.
    pub notify_max: u32,
}

/// A segment as peers see it: what they need to read or write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    /// The owner's id for it (never reused by that owner).
    pub id: crate::SegmentId,
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

/// New queue pairs for one rail ([`Message::RailRenew`], [`Message::RailRenewed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailRenew<C: Codec> {
    /// The rail (its position in both agents' rail lists).
    pub rail: u8,
    /// Which renewal this is (an answer names the request it answers).
    pub epoch: u32,
    /// One endpoint per queue pair.
    pub endpoints: Vec<C::Endpoint>,
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<C: Codec> {
    /// Endpoints and limits, first message each way.
    Hello(Hello<C>),
    /// Segments added to the sender's table.
    Segments(Vec<SegmentInfo>),
    /// Segments removed from the sender's table.
    Removed(Vec<crate::SegmentId>),
    /// The sender's queue pairs are connected and its receives posted.
    Ready,
    /// The sender is going away.
    Bye(String),
    /// The sender replaced its queue pairs of one rail (after a failure) and asks the peer to
    /// do the same and connect them ([`Control::Renew`]).
    RailRenew(RailRenew<C>),
    /// The answer to a [`Message::RailRenew`]: the peer's new queue pairs, connected
    /// ([`Control::Renewed`]).
    RailRenewed(RailRenew<C>),
    /// The answer to a [`Message::RailRenew`] the peer could not carry out (its side of the
    /// rail is down too): the offer is void, try again later ([`Control::Refused`]).
    RailRefused {
        /// The rail.
        rail: u8,
        /// The epoch of the offer refused.
        epoch: u32,
    },
}

fn check_name(what: &str, name: &str) -> Result<(), WireError> {
    if name.len() > MAX_NAME {
        return Err(WireError::invalid(
            format!("{what} {name:?} is {} bytes long", name.len()),
            format!("names are at most {MAX_NAME} bytes"),
        ));
    }
    Ok(())
}

fn check_rail(rail: u8) -> Result<(), WireError> {
    if usize::from(rail) >= MAX_RAILS {
        return Err(WireError::invalid(
            format!("rail {rail}"),
            format!("rails are 0..{MAX_RAILS}"),
        ));
    }
    Ok(())
}

fn count_u16(what: &str, n: usize, limit: usize) -> Result<u16, WireError> {
    if n > limit {
        return Err(WireError::invalid(
            format!("{n} {what} in one message"),
            format!("at most {limit}: split the list"),
        ));
    }
    Ok(n as u16)
}

/// A queue pair count and that many endpoints.
fn encode_endpoints<C: Codec>(v: &mut Vec<u8>, endpoints: &[C::Endpoint]) -> Result<(), WireError> {
    if endpoints.is_empty() || endpoints.len() > MAX_QPS {
        return Err(WireError::invalid(
            format!("{} queue pairs per rail", endpoints.len()),
            format!("use 1..={MAX_QPS}"),
        ));
    }
    v.push(endpoints.len() as u8);
    for (i, e) in endpoints.iter().enumerate() {
        let body = C::encode_endpoint(e).map_err(|e| {
            WireError::invalid(format!("endpoint {i}: {e}"), "send a valid endpoint")
        })?;
        let len = u16::try_from(body.len()).map_err(|_| {
            WireError::invalid(
                format!("endpoint {i} of {} bytes", body.len()),
                "endpoints are at most 65,535 bytes",
            )
        })?;
        v.extend_from_slice(&len.to_be_bytes());
        v.extend_from_slice(&body);
    }
    Ok(())
}

impl<C: Codec> Message<C> {
    /// Encodes the message. Values a peer would refuse are a [`WireError::Invalid`].
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&MAGIC);
        v.extend_from_slice(&VERSION.to_be_bytes());
        match self {
            Message::Hello(h) => {
                v.push(KIND_HELLO);
                v.push(0);
                check_name("agent name", &h.name)?;
                if h.name.is_empty() {
                    return Err(WireError::invalid("empty agent name", "name every agent"));
                }
                v.push(h.name.len() as u8);
                v.extend_from_slice(h.name.as_bytes());
                if h.rails.is_empty() || h.rails.len() > MAX_RAILS {
                    return Err(WireError::invalid(
                        format!("{} rails", h.rails.len()),
                        format!("use 1..={MAX_RAILS}"),
                    ));
                }
                v.push(h.rails.len() as u8);
                for r in &h.rails {
                    if r.len() != h.rails[0].len() {
                        return Err(WireError::invalid(
                            "rails with different queue pair counts",
                            "create the same number of queue pairs on every rail",
                        ));
                    }
                    encode_endpoints::<C>(&mut v, r)?;
                }
                if h.notify_max > MAX_NOTIFY {
                    return Err(WireError::invalid(
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
                    v.extend_from_slice(&s.id.get().to_be_bytes());
                    v.extend_from_slice(&s.addr.to_be_bytes());
                    v.extend_from_slice(&s.len.to_be_bytes());
                    if s.rkeys.is_empty() || s.rkeys.len() > MAX_RAILS {
                        return Err(WireError::invalid(
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
                    v.extend_from_slice(&id.get().to_be_bytes());
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
                check_rail(r.rail)?;
                v.push(r.rail);
                v.extend_from_slice(&r.epoch.to_be_bytes());
                encode_endpoints::<C>(&mut v, &r.endpoints)?;
            }
            Message::RailRefused { rail, epoch } => {
                v.push(KIND_RAIL_REFUSED);
                v.push(0);
                check_rail(*rail)?;
                v.push(*rail);
                v.extend_from_slice(&epoch.to_be_bytes());
            }
        }
        if v.len() > MAX_MESSAGE {
            return Err(WireError::invalid(
                format!("a message of {} bytes", v.len()),
                format!("messages are at most {MAX_MESSAGE} bytes: send segment tables with segment_messages"),
            ));
        }
        Ok(v)
    }

    /// Decodes and validates a message from `peer` (named in errors).
    pub fn decode(peer: &str, buf: &[u8]) -> Result<Message<C>, WireError> {
        let mut r = Reader::new(peer, buf);
        if buf.len() > MAX_MESSAGE {
            return Err(r.err(format!(
                "a message of {} bytes (at most {MAX_MESSAGE})",
                buf.len()
            )));
        }
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
                let mut rails: Vec<Vec<C::Endpoint>> = Vec::with_capacity(n);
                for _ in 0..n {
                    let endpoints = r.endpoints::<C>()?;
                    if rails.first().is_some_and(|f| f.len() != endpoints.len()) {
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
                    list.push(decode_segment(&mut r, i)?);
                }
                Message::Segments(list)
            }
            KIND_REMOVED => {
                let n = r.count("removed count")?;
                let mut ids = Vec::with_capacity(n.min(buf.len() / 4 + 1));
                for _ in 0..n {
                    ids.push(crate::SegmentId::new(r.u32("removed id")?));
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
                let endpoints = r.endpoints::<C>()?;
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
        r.finish("message")?;
        Ok(msg)
    }

    /// The message that carries the core's `control` to the peer's core. A rail past
    /// [`MAX_RAILS`] is refused when the message is encoded.
    pub fn from_control(control: Control<Vec<C::Endpoint>>) -> Message<C> {
        let rail = |r: usize| u8::try_from(r).unwrap_or(u8::MAX);
        match control {
            Control::Renew {
                rail: r,
                epoch,
                endpoints,
            } => Message::RailRenew(RailRenew {
                rail: rail(r),
                epoch,
                endpoints,
            }),
            Control::Renewed {
                rail: r,
                epoch,
                endpoints,
            } => Message::RailRenewed(RailRenew {
                rail: rail(r),
                epoch,
                endpoints,
            }),
            Control::Refused { rail: r, epoch } => Message::RailRefused {
                rail: rail(r),
                epoch,
            },
        }
    }

    /// The core's control message this message carries, for
    /// [`Connection::handle_control`](crate::Connection::handle_control); any other message
    /// (the driver's: hello, segment tables, ready, bye) comes back as `Err`.
    pub fn into_control(self) -> Result<Control<Vec<C::Endpoint>>, Message<C>> {
        match self {
            Message::RailRenew(r) => Ok(Control::Renew {
                rail: usize::from(r.rail),
                epoch: r.epoch,
                endpoints: r.endpoints,
            }),
            Message::RailRenewed(r) => Ok(Control::Renewed {
                rail: usize::from(r.rail),
                epoch: r.epoch,
                endpoints: r.endpoints,
            }),
            Message::RailRefused { rail, epoch } => Ok(Control::Refused {
                rail: usize::from(rail),
                epoch,
            }),
            other => Err(other),
        }
    }
}

/// One entry of a [`Message::Segments`], the `i`th.
fn decode_segment(r: &mut Reader<'_>, i: usize) -> Result<SegmentInfo, WireError> {
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
    Ok(SegmentInfo {
        id: crate::SegmentId::new(id),
        name,
        addr,
        len,
        rkeys,
        location,
    })
}

/// The encoded size of one entry of a [`Message::Segments`].
fn segment_entry_len(s: &SegmentInfo) -> usize {
    4 + 8 + 8 + 1 + 4 * s.rkeys.len() + 1 + 4 + 1 + s.name.len()
}

/// A segment table as [`Message::Segments`] messages that each fit one frame
/// ([`MAX_MESSAGE`] bytes, and at most [`MAX_SEGMENTS_PER_MESSAGE`] entries): packed by
/// encoded size, not by count (1,024 entries with 64-byte names and 8 keys would be twice a
/// frame).
pub fn segment_messages<C: Codec>(list: &[SegmentInfo]) -> Vec<Message<C>> {
    let limit = MAX_MESSAGE - HEADER_LEN - 2;
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
