//! The out-of-band wire format, version 1. Everything is big-endian.
//!
//! ```text
//! header (12 bytes): magic "GDR1" | version u16 | kind u16 | body length u32 (<= MAX_BODY)
//! hello body:        qpn u32 | psn u32 | lid u16 | gid [16] | gid_index u32 | mtu u16 (bytes) | port u8 | reserved u8
//!                    region count u16 (<= MAX_REGIONS) | count x (addr u64 | len u64 | rkey u32)
//!                    app length u16 (<= MAX_APP) | app bytes
//! ```
//!
//! A decoder never trusts a length: every count and size is checked against both its limit and
//! the bytes actually present, and trailing bytes are an error. Malformed input is an
//! [`Error::Protocol`], never a panic.

use crate::device::{Gid, Mtu};
use crate::error::{Error, Result};
use crate::mr::RemoteRegion;
use crate::qp::Endpoint;

/// Magic bytes that open every message.
pub const MAGIC: [u8; 4] = *b"GDR1";
/// The wire version this build speaks.
pub const VERSION: u16 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 12;
/// Largest body accepted.
pub const MAX_BODY: usize = 64 * 1024;
/// Most regions in one hello.
pub const MAX_REGIONS: usize = 1024;
/// Most application bytes in one hello.
pub const MAX_APP: usize = 4096;

/// Message kind: endpoint and regions.
pub const KIND_HELLO: u16 = 1;
/// Message kind: barrier.
pub const KIND_BARRIER: u16 = 2;
/// Message kind: application bytes.
pub const KIND_APP: u16 = 3;

const ENDPOINT_LEN: usize = 4 + 4 + 2 + 16 + 4 + 2 + 1 + 1;
const REGION_LEN: usize = 8 + 8 + 4;

/// What peers exchange: a queue pair endpoint, the regions the peer may access, and optional
/// application bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The queue pair endpoint.
    pub endpoint: Endpoint,
    /// Regions the receiver may access remotely.
    pub regions: Vec<RemoteRegion>,
    /// Application bytes.
    pub app: Vec<u8>,
}

/// Builds header + body. A body longer than [`MAX_BODY`] is an [`Error::InvalidArgument`]
/// (the peer would refuse it).
pub fn frame(kind: u16, body: &[u8]) -> Result<Vec<u8>> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|_| body.len() <= MAX_BODY)
        .ok_or_else(|| {
            Error::invalid(
                format!(
                    "message body of {} bytes exceeds the wire limit {MAX_BODY}",
                    body.len()
                ),
                "send bulk data over RDMA",
            )
        })?;
    let mut v = Vec::with_capacity(HEADER_LEN + body.len());
    v.extend_from_slice(&MAGIC);
    v.extend_from_slice(&VERSION.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(body);
    Ok(v)
}

/// Checks a header; returns the kind and body length.
pub fn parse_header(h: &[u8; HEADER_LEN]) -> Result<(u16, usize)> {
    if h[..4] != MAGIC {
        return Err(Error::protocol(format!(
            "bad magic {:02x?} (expected \"GDR1\"): the peer is not a gdr program or speaks another protocol",
            &h[..4]
        )));
    }
    let version = u16::from_be_bytes([h[4], h[5]]);
    if version != VERSION {
        return Err(Error::Protocol {
            peer: crate::error::UNKNOWN_PEER.to_string(),
            detail: format!("peer speaks wire version {version}, this build speaks {VERSION}"),
            hint: "run the same gdr version on both sides".into(),
        });
    }
    let kind = u16::from_be_bytes([h[6], h[7]]);
    let len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
    match usize::try_from(len) {
        Ok(len) if len <= MAX_BODY => Ok((kind, len)),
        _ => Err(Error::protocol(format!(
            "body length {len} exceeds the limit {MAX_BODY}"
        ))),
    }
}

/// A bounds-checked reader over a body.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                Error::protocol(format!(
                    "message truncated: {what} needs {n} bytes at offset {}, body has {}",
                    self.pos,
                    self.buf.len()
                ))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_be_bytes(
            self.take(2, what)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_be_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_be_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }
}

/// A count or size already checked against its limit (all limits fit a `u16`).
fn wire_u16(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

impl PeerInfo {
    /// Encodes the hello body.
    pub fn encode_body(&self) -> Result<Vec<u8>> {
        if self.regions.len() > MAX_REGIONS {
            return Err(Error::invalid(
                format!(
                    "{} regions exceed the wire limit {MAX_REGIONS}",
                    self.regions.len()
                ),
                "advertise one large region instead",
            ));
        }
        if self.app.len() > MAX_APP {
            return Err(Error::invalid(
                format!(
                    "{} application bytes exceed the wire limit {MAX_APP}",
                    self.app.len()
                ),
                "send bulk data over RDMA",
            ));
        }
        let e = &self.endpoint;
        let mut v = Vec::with_capacity(
            ENDPOINT_LEN + 2 + self.regions.len() * REGION_LEN + 2 + self.app.len(),
        );
        v.extend_from_slice(&e.qpn.to_be_bytes());
        v.extend_from_slice(&e.psn.to_be_bytes());
        v.extend_from_slice(&e.lid.to_be_bytes());
        v.extend_from_slice(&e.gid.0);
        v.extend_from_slice(&e.gid_index.to_be_bytes());
        v.extend_from_slice(&wire_u16(e.mtu.bytes() as usize).to_be_bytes());
        v.push(e.port);
        v.push(0);
        v.extend_from_slice(&wire_u16(self.regions.len()).to_be_bytes());
        for r in &self.regions {
            v.extend_from_slice(&r.addr.to_be_bytes());
            v.extend_from_slice(&r.len.to_be_bytes());
            v.extend_from_slice(&r.rkey.to_be_bytes());
        }
        v.extend_from_slice(&wire_u16(self.app.len()).to_be_bytes());
        v.extend_from_slice(&self.app);
        Ok(v)
    }

    /// Decodes and validates a hello body from a peer.
    pub fn decode_body(body: &[u8]) -> Result<PeerInfo> {
        let mut r = Reader { buf: body, pos: 0 };
        let qpn = r.u32("qpn")?;
        let psn = r.u32("psn")?;
        let lid = r.u16("lid")?;
        let gid = Gid(r.take(16, "gid")?.try_into().expect("16 bytes"));
        let gid_index = r.u32("gid_index")?;
        let mtu_bytes = r.u16("mtu")?;
        let mtu = Mtu::from_bytes(u32::from(mtu_bytes)).ok_or_else(|| {
            Error::protocol(format!(
                "invalid path MTU {mtu_bytes} (must be 256, 512, 1024, 2048 or 4096)"
            ))
        })?;
        let port = r.u8("port")?;
        let _reserved = r.u8("reserved")?;
        let endpoint = Endpoint {
            qpn,
            psn,
            lid,
            gid,
            gid_index,
            mtu,
            port,
        };
        endpoint.validate()?;
        let n = r.u16("region count")? as usize;
        if n > MAX_REGIONS {
            return Err(Error::protocol(format!(
                "{n} regions exceed the limit {MAX_REGIONS}"
            )));
        }
        let mut regions = Vec::with_capacity(n.min((body.len() / REGION_LEN) + 1));
        for i in 0..n {
            let addr = r.u64("region address")?;
            let len = r.u64("region length")?;
            let rkey = r.u32("region rkey")?;
            if addr.checked_add(len).is_none() {
                return Err(Error::protocol(format!(
                    "region {i}: address {addr:#x} + length {len} overflows"
                )));
            }
            regions.push(RemoteRegion { addr, len, rkey });
        }
        let app_len = r.u16("app length")? as usize;
        if app_len > MAX_APP {
            return Err(Error::protocol(format!(
                "{app_len} application bytes exceed the limit {MAX_APP}"
            )));
        }
        let app = r.take(app_len, "app data")?.to_vec();
        if r.pos != body.len() {
            return Err(Error::protocol(format!(
                "{} trailing bytes after the hello",
                body.len() - r.pos
            )));
        }
        Ok(PeerInfo {
            endpoint,
            regions,
            app,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PeerInfo {
        PeerInfo {
            endpoint: Endpoint {
                qpn: 0x11,
                psn: 0xabcdef,
                lid: 0,
                gid: Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1]),
                gid_index: 1,
                mtu: Mtu::B1024,
                port: 1,
            },
            regions: vec![RemoteRegion::new(0x7f00_0000_1000, 1 << 20, 0x1234)],
            app: b"size=65536".to_vec(),
        }
    }

    #[test]
    fn round_trip() {
        let p = sample();
        let body = p.encode_body().unwrap();
        assert_eq!(PeerInfo::decode_body(&body).unwrap(), p);
        let f = frame(KIND_HELLO, &body).unwrap();
        let (kind, len) = parse_header(f[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!((kind, len), (KIND_HELLO, body.len()));
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let body = sample().encode_body().unwrap();
        for cut in 0..body.len() {
            let e = PeerInfo::decode_body(&body[..cut]).unwrap_err();
            assert!(matches!(e, Error::Protocol { .. }), "cut {cut}: {e}");
        }
        let mut long = body.clone();
        long.push(0);
        assert!(PeerInfo::decode_body(&long)
            .unwrap_err()
            .to_string()
            .contains("1 trailing bytes"));
    }

    #[test]
    fn hostile_values_are_rejected() {
        let good = sample().encode_body().unwrap();
        let mut bad_mtu = good.clone();
        bad_mtu[30..32].copy_from_slice(&1500u16.to_be_bytes());
        assert!(PeerInfo::decode_body(&bad_mtu)
            .unwrap_err()
            .to_string()
            .contains("invalid path MTU 1500"));
        let mut bad_qpn = good.clone();
        bad_qpn[0..4].copy_from_slice(&0u32.to_be_bytes());
        assert!(PeerInfo::decode_body(&bad_qpn)
            .unwrap_err()
            .to_string()
            .contains("invalid QP number"));
        let mut many = good.clone();
        many[34..36].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(PeerInfo::decode_body(&many)
            .unwrap_err()
            .to_string()
            .contains("exceed the limit"));
        let mut overflow = good.clone();
        overflow[36..44].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(PeerInfo::decode_body(&overflow)
            .unwrap_err()
            .to_string()
            .contains("overflows"));
    }

    #[test]
    fn headers_are_checked() {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&frame(KIND_HELLO, &[]).unwrap()[..HEADER_LEN]);
        assert!(parse_header(&h).is_ok());
        let mut bad = h;
        bad[0] = b'X';
        assert!(parse_header(&bad)
            .unwrap_err()
            .to_string()
            .contains("bad magic"));
        let mut v2 = h;
        v2[4..6].copy_from_slice(&2u16.to_be_bytes());
        let e = parse_header(&v2).unwrap_err();
        assert!(
            e.to_string()
                .contains("peer speaks wire version 2, this build speaks 1"),
            "{e}"
        );
        let mut big = h;
        big[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_header(&big)
            .unwrap_err()
            .to_string()
            .contains("exceeds the limit"));
    }

    fn header_with_len(len: u32) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&frame(KIND_APP, &[]).unwrap()[..HEADER_LEN]);
        h[8..12].copy_from_slice(&len.to_be_bytes());
        h
    }

    #[test]
    fn body_lengths_near_the_limits() {
        let max = MAX_BODY as u32;
        assert_eq!(
            parse_header(&header_with_len(max)).unwrap(),
            (KIND_APP, MAX_BODY)
        );
        for len in [max + 1, u32::MAX / 2, u32::MAX - 1, u32::MAX] {
            let e = parse_header(&header_with_len(len)).unwrap_err();
            assert!(matches!(e, Error::Protocol { .. }), "{len}: {e}");
            assert!(e.to_string().contains(&len.to_string()), "{e}");
        }
        assert_eq!(
            frame(KIND_APP, &vec![0; MAX_BODY]).unwrap().len(),
            HEADER_LEN + MAX_BODY
        );
        let e = frame(KIND_APP, &vec![0; MAX_BODY + 1]).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    }

    #[test]
    fn the_largest_hello_fits_the_body_limit() {
        let mut p = sample();
        p.regions = (0..MAX_REGIONS as u64)
            .map(|i| RemoteRegion::new(i << 20, 4096, i as u32))
            .collect();
        p.app = vec![7; MAX_APP];
        let body = p.encode_body().unwrap();
        assert!(body.len() <= MAX_BODY, "{} bytes", body.len());
        assert!(frame(KIND_HELLO, &body).is_ok());
        assert_eq!(PeerInfo::decode_body(&body).unwrap(), p);
        p.regions.push(RemoteRegion::new(0, 1, 1));
        assert!(matches!(
            p.encode_body(),
            Err(Error::InvalidArgument { .. })
        ));
        p.regions.pop();
        p.app.push(0);
        assert!(matches!(
            p.encode_body(),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn counts_and_lengths_the_body_cannot_back_are_refused() {
        let good = sample().encode_body().unwrap();
        // A region count at the limit with one region's bytes present: truncated, not a big
        // allocation.
        let mut many = good.clone();
        many[34..36].copy_from_slice(&(MAX_REGIONS as u16).to_be_bytes());
        let e = PeerInfo::decode_body(&many).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        // An application length past the limit, and one at the limit with no bytes behind it.
        let app_at = good.len() - sample().app.len() - 2;
        for (len, want) in [
            (u16::MAX, "exceed the limit"),
            (MAX_APP as u16, "truncated"),
        ] {
            let mut b = good.clone();
            b[app_at..app_at + 2].copy_from_slice(&len.to_be_bytes());
            let e = PeerInfo::decode_body(&b).unwrap_err();
            assert!(e.to_string().contains(want), "{len}: {e}");
        }
        // A region ending exactly at the top of the address space is fine; one byte more is not.
        let mut top = good.clone();
        top[36..44].copy_from_slice(&(u64::MAX - 16).to_be_bytes());
        top[44..52].copy_from_slice(&16u64.to_be_bytes());
        assert_eq!(
            PeerInfo::decode_body(&top).unwrap().regions[0].addr,
            u64::MAX - 16
        );
        top[44..52].copy_from_slice(&17u64.to_be_bytes());
        assert!(PeerInfo::decode_body(&top).is_err());
    }

    #[test]
    fn pseudo_random_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..400 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            assert!(
                PeerInfo::decode_body(&bytes).is_err(),
                "random bytes of length {len} decoded"
            );
            if bytes.len() >= HEADER_LEN {
                assert!(parse_header(bytes[..HEADER_LEN].try_into().unwrap()).is_err());
            }
        }
    }
}
