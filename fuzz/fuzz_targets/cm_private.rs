//! rdma_cm private data (gdr::connect::cm): what a connecting or accepting peer sends.
#![no_main]

use gdr::connect::cm::{decode_private_data, encode_private_data, PRIVATE_DATA_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(region) = decode_private_data(data) else {
        return;
    };
    if let Some(r) = region {
        assert!(
            r.addr.checked_add(r.len).is_some(),
            "overflowing region {r:?}"
        );
    }
    // Round trip: what decoded encodes to bytes that decode to the same region.
    let encoded = encode_private_data(region);
    assert_eq!(encoded.len(), PRIVATE_DATA_LEN);
    match decode_private_data(&encoded) {
        Ok(back) if region.is_some() => assert_eq!(back, region),
        // Foreign data (no magic, or too short) decodes as None; ours then says "no region".
        Ok(back) => assert_eq!(back, None),
        Err(e) => panic!("own encoding refused: {e}"),
    }
});
