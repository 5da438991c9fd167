//! What travels with a connect request and reply: gdr's private data (magic, version, region),
//! the socket address and the connection parameters.

use super::*;

/// Private data each side sends: magic, version, and an optional region.
pub(super) mod private {
    use crate::mr::RemoteRegion;

    const MAGIC: &[u8; 4] = b"GDRc";
    /// Encoded length (fits the 56 bytes a connect request carries).
    pub(crate) const LEN: usize = 4 + 1 + 1 + 20;

    /// Encodes our private data, advertising `r` if given.
    pub(crate) fn encode(r: Option<RemoteRegion>) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4] = 1;
        if let Some(r) = r {
            b[5] = 1;
            b[6..14].copy_from_slice(&r.addr.to_be_bytes());
            b[14..22].copy_from_slice(&r.len.to_be_bytes());
            b[22..26].copy_from_slice(&r.rkey.to_be_bytes());
        }
        b
    }

    /// The peer's region; `None` when the peer is not a gdr program (no magic) or sent none.
    /// Private data may be zero-padded by the transport: trailing bytes are ignored.
    pub(crate) fn decode(b: &[u8]) -> Result<Option<RemoteRegion>, String> {
        if b.len() < LEN || &b[..4] != MAGIC {
            return Ok(None);
        }
        if b[4] != 1 {
            return Err(format!(
                "peer's private data has version {}, this build speaks 1",
                b[4]
            ));
        }
        if b[5] == 0 {
            return Ok(None);
        }
        let addr = u64::from_be_bytes(b[6..14].try_into().expect("8 bytes"));
        let len = u64::from_be_bytes(b[14..22].try_into().expect("8 bytes"));
        let rkey = u32::from_be_bytes(b[22..26].try_into().expect("4 bytes"));
        if addr.checked_add(len).is_none() {
            return Err(format!("peer's region {addr:#x}+{len} overflows"));
        }
        Ok(Some(RemoteRegion { addr, len, rkey }))
    }
}

/// Length of the private data gdr sends with a connect request or reply (fits the 56 bytes a
/// connect request carries).
pub const PRIVATE_DATA_LEN: usize = private::LEN;

/// Encodes the private data gdr sends with a connect request or reply, advertising `region` if
/// given. The inverse of [`decode_private_data`].
pub fn encode_private_data(region: Option<RemoteRegion>) -> [u8; PRIVATE_DATA_LEN] {
    private::encode(region)
}

/// Decodes a peer's connect private data the way [`Listener::next_request`] and
/// [`Connector::connect`] do: `Ok(None)` when the peer is not a gdr program (no magic) or
/// advertised no region, [`Error::Protocol`] for another version or a region whose end
/// overflows. Trailing bytes (transport padding) are ignored. Public so the decoder can be
/// fuzzed (`fuzz/`) and captured requests inspected.
pub fn decode_private_data(data: &[u8]) -> Result<Option<RemoteRegion>> {
    private::decode(data).map_err(Error::protocol)
}

pub(super) fn sockaddr_of(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write(std::ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in>(), sin) };
            (
                ss,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe {
                std::ptr::write(
                    std::ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in6>(),
                    sin6,
                )
            };
            (
                ss,
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        }
    }
}

pub(super) fn conn_param(qp: &QueuePair, data: &[u8; private::LEN]) -> ibv::rdma_conn_param {
    let cfg = qp.config();
    // SAFETY: plain old data.
    let mut p: ibv::rdma_conn_param = unsafe { std::mem::zeroed() };
    p.private_data = data.as_ptr().cast();
    p.private_data_len = private::LEN as u8;
    p.responder_resources = cfg.max_rd_atomic.unwrap_or(16);
    p.initiator_depth = cfg.max_rd_atomic.unwrap_or(16);
    p.retry_count = cfg.retry_count.min(7);
    p.rnr_retry_count = cfg.rnr_retry.min(7);
    p.qp_num = qp.qp_num();
    p
}
