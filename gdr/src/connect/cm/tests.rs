use super::*;

#[test]
fn public_private_data_codec_is_the_one_connections_use() {
    let r = RemoteRegion::new(0x7f00_0000_1000, 1 << 20, 0xabcd);
    let b = encode_private_data(Some(r));
    assert_eq!(b, private::encode(Some(r)));
    assert_eq!(b.len(), PRIVATE_DATA_LEN);
    assert_eq!(decode_private_data(&b).unwrap(), Some(r));
    let mut v2 = b;
    v2[4] = 2;
    match decode_private_data(&v2) {
        Err(Error::Protocol { peer, detail, .. }) => {
            assert!(detail.contains("version 2"), "{detail}");
            assert_eq!(peer, crate::error::UNKNOWN_PEER);
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
    assert_eq!(decode_private_data(b"short").unwrap(), None);
}

#[test]
fn private_data_round_trip_and_foreign_peers() {
    let r = RemoteRegion::new(0x1000, 4096, 0xabc);
    let b = private::encode(Some(r));
    assert_eq!(private::decode(&b).unwrap(), Some(r));
    let mut padded = b.to_vec();
    padded.resize(56, 0);
    assert_eq!(
        private::decode(&padded).unwrap(),
        Some(r),
        "transport padding is ignored"
    );
    assert_eq!(private::decode(&private::encode(None)).unwrap(), None);
    assert_eq!(
        private::decode(&[0; 56]).unwrap(),
        None,
        "a non-gdr peer (rping) sends no magic"
    );
    let mut v2 = b;
    v2[4] = 2;
    assert!(private::decode(&v2).unwrap_err().contains("version 2"));
    let mut overflow = b;
    overflow[6..14].copy_from_slice(&u64::MAX.to_be_bytes());
    assert!(private::decode(&overflow)
        .unwrap_err()
        .contains("overflows"));
}

/// A fake id: never dereferenced, the backlog only compares ids.
fn fake_id(n: usize) -> *mut ibv::rdma_cm_id {
    std::ptr::without_provenance_mut(n * 64)
}

fn event(kind: u32, id: usize) -> Event {
    Event {
        kind,
        status: 0,
        id: fake_id(id),
        private: Vec::new(),
    }
}

#[test]
fn backlog_keeps_events_for_their_owners_in_order() {
    use ibv::rdma_cm_event_type::*;
    let mut b = Backlog::default();
    assert!(b.push(event(RDMA_CM_EVENT_ESTABLISHED, 1)).is_none());
    assert!(b.push(event(RDMA_CM_EVENT_DISCONNECTED, 2)).is_none());
    assert!(b.push(event(RDMA_CM_EVENT_DISCONNECTED, 1)).is_none());
    let id1 = fake_id(1);
    assert_eq!(
        b.take(&|e| e.id == id1).unwrap().kind,
        RDMA_CM_EVENT_ESTABLISHED
    );
    assert_eq!(
        b.take(&|e| e.id == id1).unwrap().kind,
        RDMA_CM_EVENT_DISCONNECTED
    );
    assert!(b.take(&|e| e.id == id1).is_none());
    // A destroyed id's events are purged; others stay.
    assert!(b.push(event(RDMA_CM_EVENT_TIMEWAIT_EXIT, 3)).is_none());
    let gone = b.purge(fake_id(2));
    assert_eq!(gone.len(), 1);
    assert_eq!(b.events.len(), 1);
    assert_eq!(b.events[0].id, fake_id(3));
}

#[test]
fn backlog_is_bounded() {
    use ibv::rdma_cm_event_type::*;
    let mut b = Backlog::default();
    for i in 0..BACKLOG_CAP {
        assert!(b.push(event(RDMA_CM_EVENT_DISCONNECTED, i + 1)).is_none());
    }
    let dropped = b.push(event(RDMA_CM_EVENT_DISCONNECTED, 9999)).unwrap();
    assert_eq!(dropped.id, fake_id(1), "the oldest goes");
    assert_eq!(b.events.len(), BACKLOG_CAP);
    // Events that are not connection requests are simply dropped.
    dropped.dispose();
}

#[test]
fn resolve_timeouts_never_overflow() {
    assert_eq!(resolve_ms(Duration::ZERO), 1);
    assert_eq!(resolve_ms(Duration::from_millis(1500)), 1500);
    assert_eq!(resolve_ms(Duration::from_secs(1 << 40)), i32::MAX);
    assert_eq!(resolve_ms(Duration::MAX), i32::MAX);
}

#[test]
fn private_data_decoder_takes_hostile_input() {
    // Every length from empty to longer than a connect request's 56 bytes, every byte value
    // at each position of the header: never a panic, never a region that overflows.
    let good = private::encode(Some(RemoteRegion::new(0x1000, 4096, 7)));
    for len in 0..=80 {
        let mut b = good.to_vec();
        b.resize(len, 0xff);
        if let Ok(Some(r)) = private::decode(&b) {
            assert!(r.addr.checked_add(r.len).is_some());
        }
    }
    for pos in 0..private::LEN {
        for v in [0u8, 1, 2, 0x7f, 0xff] {
            let mut b = good;
            b[pos] = v;
            if let Ok(Some(r)) = private::decode(&b) {
                assert!(r.addr.checked_add(r.len).is_some(), "pos {pos} = {v}");
            }
        }
    }
    let mut max = good;
    max[6..14].copy_from_slice(&(u64::MAX - 4095).to_be_bytes());
    max[14..22].copy_from_slice(&4095u64.to_be_bytes());
    assert_eq!(
        private::decode(&max).unwrap().map(|r| r.addr + r.len),
        Some(u64::MAX),
        "the last byte of the address space is a valid end"
    );
}

#[test]
fn event_status_of_any_value_formats() {
    for status in [i32::MIN, -1, 0, 28, i32::MAX] {
        let e = Event {
            kind: ibv::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED,
            status,
            id: std::ptr::null_mut(),
            private: Vec::new(),
        };
        let err = check_event(
            &e,
            ibv::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
            "accepting",
        )
        .unwrap_err();
        assert!(
            matches!(&err, Error::CmEvent { step, got, status: s, .. }
                if step == "accepting" && got == "RDMA_CM_EVENT_REJECTED" && *s == status),
            "{err:?}"
        );
        assert!(err.to_string().contains("accepting"), "{err}");
    }
}

#[test]
fn sockaddr_conversion() {
    let (ss, len) = sockaddr_of(&"10.1.2.3:7471".parse().unwrap());
    assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
    // SAFETY: written as sockaddr_in above.
    let sin = unsafe { &*std::ptr::addr_of!(ss).cast::<libc::sockaddr_in>() };
    assert_eq!(u16::from_be(sin.sin_port), 7471);
    assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 1, 2, 3]);
}
