//! gdr-xfer's control messages (gdr_xfer::wire::Message::decode): what a peer agent sends over
//! the TCP link. Whatever decodes must satisfy the limits the decoder promises, encode again,
//! decode to the same value, and encode to the same bytes (decode -> encode -> decode).
#![no_main]

use gdr_xfer::wire::{
    Message, MAX_NAME, MAX_NOTIFY, MAX_QPS, MAX_RAILS, MAX_REASON, MAX_SEGMENTS_PER_MESSAGE,
};
use libfuzzer_sys::fuzz_target;

/// The limits `Message::decode` documents, checked on what it returned.
fn check_limits(msg: &Message) {
    match msg {
        Message::Hello(h) => {
            assert!(
                !h.name.is_empty() && h.name.len() <= MAX_NAME,
                "name {:?}",
                h.name
            );
            assert!(
                (1..=MAX_RAILS).contains(&h.rails.len()),
                "{} rails",
                h.rails.len()
            );
            for r in &h.rails {
                assert!(
                    (1..=MAX_QPS).contains(&r.len()) && r.len() == h.rails[0].len(),
                    "rails of {} and {} endpoints",
                    r.len(),
                    h.rails[0].len()
                );
            }
            assert!(h.notify_max <= MAX_NOTIFY, "notify_max {}", h.notify_max);
        }
        Message::Segments(list) => {
            assert!(
                list.len() <= MAX_SEGMENTS_PER_MESSAGE,
                "{} segments",
                list.len()
            );
            for s in list {
                assert!(s.len > 0, "empty segment {s:?}");
                assert!(
                    s.addr.checked_add(s.len).is_some(),
                    "overflowing segment {s:?}"
                );
                assert!(s.name.len() <= MAX_NAME, "segment name {:?}", s.name);
                assert!(
                    (1..=MAX_RAILS).contains(&s.rkeys.len()),
                    "{} remote keys",
                    s.rkeys.len()
                );
            }
        }
        Message::Removed(ids) => {
            assert!(
                ids.len() <= MAX_SEGMENTS_PER_MESSAGE,
                "{} removed ids",
                ids.len()
            );
        }
        Message::Ready => {}
        Message::RailRefused { rail, .. } => {
            assert!(usize::from(*rail) < MAX_RAILS, "rail {rail}");
        }
        Message::RailRenew(r) | Message::RailRenewed(r) => {
            assert!(usize::from(r.rail) < MAX_RAILS, "rail {}", r.rail);
            assert!(
                (1..=MAX_QPS).contains(&r.endpoints.len()),
                "{} endpoints",
                r.endpoints.len()
            );
        }
        Message::Bye(reason) => {
            assert!(
                reason.len() <= MAX_REASON,
                "a decoded bye reason of {} bytes (MAX_REASON is {MAX_REASON})",
                reason.len()
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = Message::decode("fuzz", data) else {
        return;
    };
    check_limits(&msg);
    let encoded = msg.encode().expect("a decoded message must encode again");
    let again = Message::decode("fuzz", &encoded).expect("an encoded message must decode");
    assert_eq!(again, msg, "decode(encode(m)) != m");
    assert_eq!(
        again.encode().expect("encode"),
        encoded,
        "encode is not stable"
    );
    // Only the reserved byte (and the reserved bytes of the gdr hello bodies) may differ from
    // the input, never the length.
    assert_eq!(encoded.len(), data.len(), "re-encoding changed the length");
});
