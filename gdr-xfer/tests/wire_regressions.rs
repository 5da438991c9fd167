//! The control-message decoder (`gdr_xfer::wire::Message::decode`) against inputs the fuzz target
//! `xfer_wire` (fuzz/fuzz_targets/xfer_wire.rs) checks: the committed seeds of that target are
//! real encodings of real messages, and what the fuzzing found stays fixed.
//!
//! `GDR_WRITE_SEEDS=1 cargo test -p gdr-xfer --test wire_regressions` rewrites the seeds from
//! the messages below (after a wire format change).

use std::path::PathBuf;

use gdr::device::{Gid, Mtu};
use gdr::qp::Endpoint;
use gdr_xfer::wire::WireError;
use gdr_xfer::wire::{
    Hello, Message, RailRenew, MAGIC, MAX_REASON, MAX_SEGMENTS_PER_MESSAGE, VERSION,
};
use gdr_xfer::{Location, SegmentInfo};

/// An endpoint as an rxe queue pair reports it: RoCE v2, IPv4-mapped GID at index 1, no LID.
fn rxe_endpoint(qpn: u32, psn: u32) -> Endpoint {
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[10, 77, 0, 1]);
    Endpoint {
        qpn,
        psn,
        lid: 0,
        gid: Gid(gid),
        gid_index: 1,
        mtu: Mtu::B1024,
        port: 1,
    }
}

/// An InfiniBand endpoint: a LID, a link-local GID, 4 KiB MTU.
fn ib_endpoint(qpn: u32) -> Endpoint {
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[8..].copy_from_slice(&[0x0c, 0x42, 0xa1, 0x03, 0x00, 0x6d, 0x2e, 0x10]);
    Endpoint {
        qpn,
        psn: 0x00ab_cdef,
        lid: 0x0017,
        gid: Gid(gid),
        gid_index: 0,
        mtu: Mtu::B4096,
        port: 1,
    }
}

fn segment(id: u32, name: &str, addr: u64, len: u64, location: Location) -> SegmentInfo {
    SegmentInfo {
        id: gdr_xfer::SegmentId::new(id),
        name: name.into(),
        addr,
        len,
        rkeys: vec![0x0001_2a00 + id, 0x0002_2a00 + id],
        location,
    }
}

/// The seeds of the fuzz target: one message of every kind, as agents send them.
fn seeds() -> Vec<(&'static str, Message)> {
    vec![
        (
            "hello-one-qp",
            Message::Hello(Hello {
                name: "decode-0".into(),
                rails: vec![vec![rxe_endpoint(0x11, 0x5a_1234)]],
                notify_slots: 64,
                notify_max: 256,
            }),
        ),
        (
            "hello-four-qps-ib",
            Message::Hello(Hello {
                name: "prefill-node-3/gpu-7".into(),
                rails: vec![
                    (0..4).map(|i| ib_endpoint(0x0100 + i)).collect(),
                    (0..4).map(|i| ib_endpoint(0x0200 + i)).collect(),
                ],
                notify_slots: 1024,
                notify_max: 4096,
            }),
        ),
        (
            "segments-kv-pool",
            Message::Segments(vec![
                segment(
                    1,
                    "kv-pool",
                    0x7f3a_0000_0000,
                    1 << 30,
                    Location::Cuda { ordinal: 0 },
                ),
                segment(
                    2,
                    "kv-layer-0",
                    0x7f3a_0000_0000,
                    1 << 24,
                    Location::Cuda { ordinal: 0 },
                ),
                segment(3, "", 0x5555_5600_0000, 4096, Location::Cpu { numa: None }),
                segment(
                    4,
                    "staging",
                    0x7f00_1000_0000,
                    1 << 21,
                    Location::Cpu { numa: Some(1) },
                ),
            ]),
        ),
        ("segments-empty-table", Message::Segments(Vec::new())),
        (
            "removed",
            Message::Removed([2, 3, 4].map(gdr_xfer::SegmentId::new).to_vec()),
        ),
        ("ready", Message::Ready),
        ("bye", Message::Bye("decode-0 shut down".into())),
        (
            "rail-renew",
            Message::RailRenew(RailRenew {
                rail: 1,
                epoch: 2,
                endpoints: vec![rxe_endpoint(0x21, 0x11_2233), rxe_endpoint(0x22, 0x44_5566)],
            }),
        ),
        ("rail-refused", Message::RailRefused { rail: 1, epoch: 3 }),
        (
            "rail-renewed",
            Message::RailRenewed(RailRenew {
                rail: 1,
                epoch: 2,
                endpoints: vec![ib_endpoint(0x31), ib_endpoint(0x32)],
            }),
        ),
        (
            "bye-handshake-refusal",
            Message::Bye(
                "invalid argument: peer at 10.77.0.1:40522 is called \"decode-0\", as this agent \
                 (give every agent its own name)"
                    .into(),
            ),
        ),
    ]
}

fn seed_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/xfer_wire")
}

#[test]
fn the_fuzz_seeds_are_real_encodings_of_every_kind() {
    let dir = seed_dir();
    let write = std::env::var_os("GDR_WRITE_SEEDS").is_some();
    if write {
        std::fs::create_dir_all(&dir).unwrap();
    }
    let mut kinds = std::collections::HashSet::new();
    for (name, msg) in seeds() {
        let bytes = msg.encode().unwrap();
        assert_eq!(Message::decode("seed", &bytes).unwrap(), msg, "{name}");
        kinds.insert(std::mem::discriminant(&msg));
        let path = dir.join(name);
        if write {
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (GDR_WRITE_SEEDS=1 writes the seeds)",
                path.display()
            )
        });
        assert_eq!(
            committed,
            bytes,
            "{} is not the current encoding of its message (GDR_WRITE_SEEDS=1 rewrites it)",
            path.display()
        );
    }
    assert_eq!(kinds.len(), 8, "a seed of every message kind");
    // No stale seed: every file in the directory is one of the above.
    let names: Vec<&str> = seeds().iter().map(|(n, _)| *n).collect();
    for e in std::fs::read_dir(&dir).unwrap() {
        let f = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            names.contains(&f.as_str()),
            "stale seed {f} in {}",
            dir.display()
        );
    }
}

/// A bye of `reason` bytes, framed as an agent sends it (no check of the bytes).
fn raw_bye(reason: &[u8]) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&VERSION.to_be_bytes());
    v.push(5); // bye
    v.push(0);
    v.extend_from_slice(&(reason.len() as u16).to_be_bytes());
    v.extend_from_slice(reason);
    v
}

/// The first crash of the fuzz target (fuzz/artifacts/xfer_wire/crash-d1f7fb7b…, after 653
/// executions): a bye whose reason is not UTF-8. The decoder converted it lossily, each bad
/// byte becoming U+FFFD (3 bytes), so the message did not survive a round trip (its 18 reason bytes
/// came back as 30) and a reason of MAX_REASON bad bytes decoded to 3 KiB, over the MAX_REASON
/// the format promises. The module's contract is that bad UTF-8 is a protocol error.
#[test]
fn a_bye_reason_that_is_not_utf8_is_a_protocol_error() {
    // (Found at wire version 1; the same bytes at the current version.)
    let crash: &[u8] = b"GXF1\x00\x02\x05\x00\x00\x12de\x95\x90\x9b\x9a\xd2\xcf\xdf\x8chut down";
    assert_eq!(
        crash,
        raw_bye(b"de\x95\x90\x9b\x9a\xd2\xcf\xdf\x8chut down")
    );
    for input in [
        crash.to_vec(),
        raw_bye(&[0xff; MAX_REASON]),
        raw_bye(&[0x80; MAX_REASON]),
        // A character cut at the end, as a careless encoder would leave it.
        raw_bye(&"shut down é".as_bytes()[..11]),
    ] {
        match Message::decode("evil", &input) {
            Err(WireError::Protocol { peer, detail }) => {
                assert_eq!(peer, "evil");
                assert!(detail.contains("UTF-8"), "{detail}");
            }
            other => panic!("a bye that is not UTF-8 decoded as {other:?}"),
        }
    }
    // UTF-8 up to the limit decodes and round-trips byte for byte; one byte more is refused.
    let reason = "é".repeat(MAX_REASON / 2);
    let bytes = raw_bye(reason.as_bytes());
    let m = Message::decode("p", &bytes).unwrap();
    assert_eq!(m, Message::Bye(reason));
    assert_eq!(m.encode().unwrap(), bytes);
    let e = Message::decode("evil", &raw_bye(&[b'x'; MAX_REASON + 1])).unwrap_err();
    assert!(
        matches!(e, WireError::Protocol { ref peer, .. } if peer == "evil"),
        "{e}"
    );
}

/// The largest tables a peer may send decode; one entry more is refused before allocation.
#[test]
fn the_largest_tables_decode_and_one_more_is_refused() {
    let list: Vec<SegmentInfo> = (0..MAX_SEGMENTS_PER_MESSAGE as u32)
        .map(|i| {
            segment(
                i + 1,
                "kv-layer-xx",
                0x1000 * u64::from(i + 1),
                4096,
                Location::Cpu { numa: None },
            )
        })
        .collect();
    let m = Message::Segments(list);
    let bytes = m.encode().unwrap();
    assert_eq!(Message::decode("p", &bytes).unwrap(), m);
    // The count field says one more; the bytes are those of the full table.
    let mut more = bytes.clone();
    more[8..10].copy_from_slice(&(MAX_SEGMENTS_PER_MESSAGE as u16 + 1).to_be_bytes());
    let e = Message::decode("p", &more).unwrap_err();
    assert!(e.to_string().contains("exceeds the limit"), "{e}");
    let ids = Message::Removed(
        (0..MAX_SEGMENTS_PER_MESSAGE as u32)
            .map(gdr_xfer::SegmentId::new)
            .collect(),
    );
    assert_eq!(Message::decode("p", &ids.encode().unwrap()).unwrap(), ids);
}
