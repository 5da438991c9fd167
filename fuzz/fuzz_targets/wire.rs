//! The TCP wire format (gdr::connect::wire): header checks, and the hello body with a
//! decode -> encode -> decode round trip. The input is a whole frame: 12 header bytes, then the
//! body (the body is decoded whatever the header says, so the fuzzer need not guess lengths).
#![no_main]

use gdr::connect::wire::{self, PeerInfo, HEADER_LEN, KIND_HELLO};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let body = match data.split_first_chunk::<HEADER_LEN>() {
        Some((header, body)) => {
            if let Ok((_kind, len)) = wire::parse_header(header) {
                assert!(
                    len <= wire::MAX_BODY,
                    "parse_header let {len} bytes through"
                );
            }
            body
        }
        None => data,
    };
    let Ok(peer) = PeerInfo::decode_body(body) else {
        return;
    };
    assert!(peer.regions.len() <= wire::MAX_REGIONS);
    assert!(peer.app.len() <= wire::MAX_APP);
    // Whatever decodes must encode, decode to the same value, and encode to the same bytes.
    let encoded = peer
        .encode_body()
        .expect("a decoded hello must encode again");
    let again = PeerInfo::decode_body(&encoded).expect("an encoded hello must decode");
    assert_eq!(again, peer, "decode(encode(p)) != p");
    assert_eq!(again.encode_body().expect("encode"), encoded);
    // Only the reserved byte may differ from the input.
    assert_eq!(encoded.len(), body.len());
    // And it frames: the header reads back as a hello of that length.
    let framed = wire::frame(KIND_HELLO, &encoded).expect("a decoded hello fits a frame");
    let (header, rest) = framed.split_first_chunk::<HEADER_LEN>().expect("header");
    assert_eq!(
        wire::parse_header(header).expect("own header"),
        (KIND_HELLO, encoded.len())
    );
    assert_eq!(rest, &encoded[..]);
});
