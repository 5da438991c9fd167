use super::*;
use crate::SegmentId;

/// Endpoints of the tests: a queue pair number and a packet sequence number, 8 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TestCodec;

impl Codec for TestCodec {
    type Endpoint = (u32, u32);

    fn encode_endpoint(e: &(u32, u32)) -> Result<Vec<u8>, String> {
        if e.0 == 0 {
            return Err("queue pair number 0".into());
        }
        let mut v = e.0.to_be_bytes().to_vec();
        v.extend_from_slice(&e.1.to_be_bytes());
        Ok(v)
    }

    fn decode_endpoint(b: &[u8]) -> Result<(u32, u32), String> {
        let b: [u8; 8] = b
            .try_into()
            .map_err(|_| format!("{} bytes, not 8", b.len()))?;
        let qpn = u32::from_be_bytes(b[..4].try_into().unwrap());
        if qpn == 0 {
            return Err("queue pair number 0".into());
        }
        Ok((qpn, u32::from_be_bytes(b[4..].try_into().unwrap())))
    }
}

type Msg = Message<TestCodec>;

fn endpoint(qpn: u32) -> (u32, u32) {
    (qpn, 0x1234)
}

fn samples() -> Vec<Msg> {
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
                id: SegmentId::new(7),
                name: "kv-layer-3".into(),
                addr: 0x7f00_0000_0000,
                len: 1 << 20,
                rkeys: vec![0xabcd, 0xabce],
                location: Location::Cuda { ordinal: 3 },
            },
            SegmentInfo {
                id: SegmentId::new(8),
                name: String::new(),
                addr: 0x1000,
                len: 4096,
                rkeys: vec![1],
                location: Location::Cpu { numa: Some(1) },
            },
        ]),
        Message::Removed(vec![
            SegmentId::new(7),
            SegmentId::new(8),
            SegmentId::new(9),
        ]),
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

fn is_protocol(r: Result<Msg, WireError>) -> bool {
    matches!(r, Err(WireError::Protocol { .. }))
}

#[test]
fn every_message_survives_a_round_trip() {
    for m in samples() {
        let bytes = m.encode().unwrap();
        assert_eq!(Msg::decode("peer", &bytes).unwrap(), m);
    }
}

#[test]
fn every_truncation_and_every_trailing_byte_is_refused() {
    for m in samples() {
        let bytes = m.encode().unwrap();
        for cut in 0..bytes.len() {
            assert!(
                is_protocol(Msg::decode("p", &bytes[..cut])),
                "{m:?} cut at {cut}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(is_protocol(Msg::decode("p", &long)));
    }
}

#[test]
fn hostile_segment_tables_are_refused() {
    let seg = |addr: u64, len: u64| {
        Msg::Segments(vec![SegmentInfo {
            id: SegmentId::new(1),
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
        let e = Msg::decode("evil", &seg(addr, len)).unwrap_err();
        assert!(
            matches!(e, WireError::Protocol { ref peer, .. } if peer == "evil"),
            "{e}"
        );
    }
    // A count larger than the limit, a location kind nobody knows, a name that is not UTF-8.
    let mut big = seg(0x1000, 1);
    big[8..10].copy_from_slice(&u16::MAX.to_be_bytes());
    assert!(Msg::decode("evil", &big).is_err());
    let mut loc = seg(0x1000, 1);
    loc[8 + 2 + 20 + 1 + 4] = 9;
    let e = Msg::decode("evil", &loc).unwrap_err();
    assert!(e.to_string().contains("unknown location kind 9"), "{e}");
    let mut name = seg(0x1000, 1);
    let last = name.len() - 1;
    name[last] = 0xff;
    assert!(Msg::decode("evil", &name)
        .unwrap_err()
        .to_string()
        .contains("UTF-8"));
}

#[test]
fn hostile_rail_fields_are_refused() {
    // A segment with no remote key, or more than one per possible rail.
    let mut seg = Msg::Segments(vec![SegmentInfo {
        id: SegmentId::new(1),
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
        assert!(is_protocol(Msg::decode("evil", &seg)));
    }
    // A rail number past the limit, and rails of different widths.
    let mut renew = Msg::RailRenew(RailRenew {
        rail: 0,
        epoch: 1,
        endpoints: vec![endpoint(1)],
    })
    .encode()
    .unwrap();
    renew[8] = MAX_RAILS as u8;
    assert!(Msg::decode("evil", &renew).is_err());
    let uneven = Msg::Hello(Hello {
        name: "a".into(),
        rails: vec![vec![endpoint(1)], vec![endpoint(2), endpoint(3)]],
        notify_slots: 1,
        notify_max: 1,
    });
    assert!(matches!(uneven.encode(), Err(WireError::Invalid { .. })));
    // Hand-made: rail count 0, and one past the limit.
    let mut ok = Msg::Hello(Hello {
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
    assert!(Msg::decode("evil", &zero_rails).is_err());
    ok[10] = MAX_RAILS as u8 + 1;
    assert!(Msg::decode("evil", &ok).is_err());
}

#[test]
fn the_codec_refuses_endpoints_it_cannot_read_and_the_error_names_the_position() {
    let mut renew = Msg::RailRenew(RailRenew {
        rail: 0,
        epoch: 1,
        endpoints: vec![endpoint(1), endpoint(2)],
    })
    .encode()
    .unwrap();
    // The second endpoint's queue pair number becomes 0: header 8, rail 1, epoch 4, count 1,
    // first endpoint 2 + 8, second's length 2.
    let at = 8 + 1 + 4 + 1 + 10 + 2;
    renew[at..at + 4].copy_from_slice(&[0; 4]);
    let e = Msg::decode("evil", &renew).unwrap_err();
    assert!(
        e.to_string().contains("endpoint 1: queue pair number 0"),
        "{e}"
    );
    // And this side refuses to send one.
    let e = Msg::RailRenew(RailRenew {
        rail: 0,
        epoch: 1,
        endpoints: vec![(0, 0)],
    })
    .encode()
    .unwrap_err();
    assert!(matches!(e, WireError::Invalid { .. }), "{e}");
}

#[test]
fn versions_magic_kinds_and_sizes_are_checked() {
    // Version 1 (single rail) is refused with the reason, not misread.
    let mut m = Msg::Ready.encode().unwrap();
    m[5] = 1;
    assert!(Msg::decode("p", &m)
        .unwrap_err()
        .to_string()
        .contains("wire version 1"));
    let mut m = Msg::Ready.encode().unwrap();
    m[0] = b'X';
    assert!(Msg::decode("p", &m).is_err());
    let mut m = Msg::Ready.encode().unwrap();
    m[6] = 99;
    assert!(Msg::decode("p", &m)
        .unwrap_err()
        .to_string()
        .contains("kind 99"));
    let mut huge = Msg::Ready.encode().unwrap();
    huge.resize(MAX_MESSAGE + 1, 0);
    assert!(Msg::decode("p", &huge)
        .unwrap_err()
        .to_string()
        .contains("at most 65536"));
}

#[test]
fn encoding_refuses_what_a_peer_would_refuse() {
    let long = "n".repeat(MAX_NAME + 1);
    let h = |name: String, n: usize, max: u32| {
        Msg::Hello(Hello {
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
    assert!(
        Msg::Removed(vec![SegmentId::new(0); MAX_SEGMENTS_PER_MESSAGE + 1])
            .encode()
            .is_err()
    );
    assert!(Msg::RailRefused {
        rail: MAX_RAILS as u8,
        epoch: 0
    }
    .encode()
    .is_err());
    // A long reason is cut at a character boundary, not refused.
    let reason = "é".repeat(MAX_REASON);
    let m = Msg::decode("p", &Msg::Bye(reason).encode().unwrap()).unwrap();
    assert!(matches!(m, Message::Bye(r) if r.len() <= MAX_REASON));
}

#[test]
fn rail_messages_carry_the_cores_control_messages_both_ways() {
    let controls = [
        Control::Renew {
            rail: 3,
            epoch: 7,
            endpoints: vec![endpoint(5), endpoint(6)],
        },
        Control::Renewed {
            rail: 0,
            epoch: u32::MAX,
            endpoints: vec![endpoint(9)],
        },
        Control::Refused { rail: 7, epoch: 1 },
    ];
    for c in controls {
        let bytes = Msg::from_control(c.clone()).encode().unwrap();
        let back = Msg::decode("p", &bytes).unwrap().into_control();
        assert_eq!(back, Ok(c));
    }
    // A rail no message can name is refused when encoded, not cut to another rail.
    let far = Msg::from_control(Control::Refused {
        rail: 256 + 1,
        epoch: 0,
    });
    assert!(far.encode().is_err());
    // The driver's messages are not the core's.
    assert_eq!(Msg::Ready.into_control(), Err(Msg::Ready));
}

#[test]
fn a_large_segment_table_is_split_by_encoded_size_and_every_part_fits_a_frame() {
    // 2,000 segments with 64-byte names and 8 keys: 123 bytes each, so 1,024 of them would
    // be 126 KB, twice a frame.
    let list: Vec<SegmentInfo> = (1..=2000u32)
        .map(|id| SegmentInfo {
            id: SegmentId::new(id),
            name: format!("{id:064}"),
            addr: 0x1000,
            len: 4096,
            rkeys: vec![id; MAX_RAILS],
            location: Location::Cuda { ordinal: 3 },
        })
        .collect();
    let msgs = segment_messages::<TestCodec>(&list);
    assert!(msgs.len() >= 4, "{} messages", msgs.len());
    let mut back = Vec::new();
    for m in &msgs {
        let bytes = m.encode().unwrap();
        assert!(bytes.len() <= MAX_MESSAGE, "{} bytes", bytes.len());
        match Msg::decode("p", &bytes).unwrap() {
            Message::Segments(v) => back.extend(v),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(back, list);
    assert!(segment_messages::<TestCodec>(&[]).is_empty());
}

#[test]
fn counts_claiming_more_than_the_bytes_hold_are_refused() {
    // Within the limits, but with nothing behind them: refused as truncated (the decoder
    // reserves no more than the bytes received can hold, so a claim costs no memory).
    let header = |kind: u8| {
        let mut v = Msg::Ready.encode().unwrap();
        v[6] = kind;
        v.truncate(8);
        v
    };
    let ready = Msg::Ready.encode().unwrap();
    assert_eq!(ready.len(), 8, "the header alone");
    for (kind, what) in [(KIND_SEGMENTS, "segments"), (KIND_REMOVED, "removed")] {
        for n in [1u16, MAX_SEGMENTS_PER_MESSAGE as u16] {
            let mut m = header(kind);
            m.extend_from_slice(&n.to_be_bytes());
            assert!(is_protocol(Msg::decode("evil", &m)), "{what} {n}");
        }
        let mut m = header(kind);
        m.extend_from_slice(&u16::MAX.to_be_bytes());
        let e = Msg::decode("evil", &m).unwrap_err();
        assert!(e.to_string().contains("exceeds the limit"), "{e}");
    }
    // A hello claiming the most rails and queue pairs, with no endpoint behind them.
    let mut hello = header(KIND_HELLO);
    hello.push(1);
    hello.push(b'a');
    hello.push(MAX_RAILS as u8);
    hello.push(MAX_QPS as u8);
    assert!(is_protocol(Msg::decode("evil", &hello)));
    // A bye reason longer than the bytes after it.
    let mut bye = header(KIND_BYE);
    bye.extend_from_slice(&(MAX_REASON as u16).to_be_bytes());
    assert!(is_protocol(Msg::decode("evil", &bye)));
}
