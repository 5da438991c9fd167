//! The control messages agents exchange over their TCP link: the core's wire format
//! ([`gdr_xfer_proto::wire`], where the layout, limits and checks are documented), with queue
//! pair endpoints written as gdr's connection-hello body ([`QpCodec`]). Each message travels in
//! one gdr frame ([`gdr::connect::TcpLink::send_bytes`]).
//!
//! Public for the fuzz targets and tests that feed the decoder what a hostile peer would send;
//! errors are [`WireError`]s, which convert into [`crate::Error`].

use gdr::connect::PeerInfo;
use gdr::qp::Endpoint;

pub use gdr_xfer_proto::wire::SegmentInfo;
pub use gdr_xfer_proto::wire::{
    AgentRecord, WireError, MAGIC, MAX_ADDR, MAX_MESSAGE, MAX_NAME, MAX_NOTIFY, MAX_QPS, MAX_RAILS,
    MAX_REASON, MAX_SEGMENTS_PER_MESSAGE, RECORD_MAGIC, RECORD_VERSION, VERSION,
};

// A message must fit one gdr frame.
const _: () = assert!(MAX_MESSAGE == gdr::connect::wire::MAX_BODY);

/// Queue pair endpoints on the wire: gdr's connection-hello body, with no regions and no
/// application bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCodec;

impl gdr_xfer_proto::wire::Codec for QpCodec {
    type Endpoint = Endpoint;

    fn encode_endpoint(endpoint: &Endpoint) -> Result<Vec<u8>, String> {
        PeerInfo::new(*endpoint)
            .encode_body()
            .map_err(|e| e.to_string())
    }

    fn decode_endpoint(bytes: &[u8]) -> Result<Endpoint, String> {
        let info = PeerInfo::decode_body(bytes).map_err(|e| e.to_string())?;
        if !info.regions.is_empty() || !info.app.is_empty() {
            return Err("carries regions or app bytes".into());
        }
        Ok(info.endpoint)
    }
}

/// One control message, with gdr's queue pair endpoints.
pub type Message = gdr_xfer_proto::wire::Message<QpCodec>;
/// What one agent tells another when they connect.
pub type Hello = gdr_xfer_proto::wire::Hello<QpCodec>;
/// New queue pairs for one rail.
pub type RailRenew = gdr_xfer_proto::wire::RailRenew<QpCodec>;

/// A segment table as [`Message::Segments`] messages that each fit one frame.
pub fn segment_messages(list: &[SegmentInfo]) -> Vec<Message> {
    gdr_xfer_proto::wire::segment_messages(list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdr::device::{Gid, Mtu};

    fn endpoint(qpn: u32) -> Endpoint {
        Endpoint {
            qpn,
            psn: 0x1234,
            lid: 7,
            gid: Gid([0xfe; 16]),
            gid_index: 1,
            mtu: Mtu::B1024,
            port: 1,
        }
    }

    #[test]
    fn gdr_endpoints_survive_the_core_wire_format() {
        let m = Message::Hello(Hello {
            name: "prefill-0".into(),
            rails: vec![
                vec![endpoint(0x11), endpoint(0x12)],
                vec![endpoint(0x21), endpoint(0x22)],
            ],
            notify_slots: 64,
            notify_max: 1024,
        });
        let bytes = m.encode().unwrap();
        assert_eq!(Message::decode("peer", &bytes).unwrap(), m);
        for cut in 0..bytes.len() {
            assert!(matches!(
                Message::decode("p", &bytes[..cut]),
                Err(WireError::Protocol { .. })
            ));
        }
    }

    #[test]
    fn an_endpoint_carrying_regions_is_refused() {
        let mut info = PeerInfo::new(endpoint(5));
        info.app = vec![1, 2, 3];
        let body = info.encode_body().unwrap();
        let mut bytes = Message::RailRefused { rail: 0, epoch: 1 }.encode().unwrap();
        // Rebuild as a renew with the hostile endpoint: kind 6, rail 0, epoch 1, one endpoint.
        bytes.truncate(6);
        bytes.extend_from_slice(&[6, 0, 0, 0, 0, 0, 1, 1]);
        bytes.extend_from_slice(&(body.len() as u16).to_be_bytes());
        bytes.extend_from_slice(&body);
        let e = Message::decode("evil", &bytes).unwrap_err();
        assert!(
            e.to_string()
                .contains("endpoint 0: carries regions or app bytes"),
            "{e}"
        );
        let e: crate::Error = e.into();
        assert!(matches!(e, crate::Error::Protocol { .. }), "{e}");
    }
}
