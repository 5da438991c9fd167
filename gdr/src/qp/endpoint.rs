//! What peers exchange to connect their queue pairs.

use crate::device::{Gid, Mtu};
use crate::error::{Error, Result};

/// What a peer needs to connect its queue pair to ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number the peer must expect (24 bits).
    pub psn: u32,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// GID (RoCE: the address the peer routes to).
    pub gid: Gid,
    /// The GID's index in our table (informational for the peer).
    pub gid_index: u32,
    /// Our path MTU limit.
    pub mtu: Mtu,
    /// Our port (informational).
    pub port: u8,
}

impl Endpoint {
    /// Checks values that came from a peer.
    pub fn validate(&self) -> Result<()> {
        if self.qpn == 0 || self.qpn >= 1 << 24 {
            return Err(Error::protocol(format!(
                "peer endpoint has invalid QP number {:#x} (must be 1..2^24)",
                self.qpn
            )));
        }
        if self.psn >= 1 << 24 {
            return Err(Error::protocol(format!(
                "peer endpoint has invalid PSN {:#x} (24 bits)",
                self.psn
            )));
        }
        if self.gid.is_zero() && self.lid == 0 {
            return Err(Error::protocol("peer endpoint has neither a GID nor a LID"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_validation_rejects_peer_garbage() {
        let ok = Endpoint {
            qpn: 0x11,
            psn: 0x123456,
            lid: 0,
            gid: Gid([0xfe; 16]),
            gid_index: 1,
            mtu: Mtu::B1024,
            port: 1,
        };
        assert!(ok.validate().is_ok());
        for bad in [
            Endpoint { qpn: 0, ..ok },
            Endpoint { qpn: 1 << 24, ..ok },
            Endpoint { psn: 1 << 24, ..ok },
            Endpoint {
                gid: Gid::default(),
                lid: 0,
                ..ok
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(Error::Protocol { .. })),
                "{bad:?}"
            );
        }
    }
}
