use super::registration::{next_segment_id, no_direct_path};
use std::sync::atomic::AtomicU32;

#[test]
fn segment_ids_never_wrap_and_never_repeat() {
    let c = AtomicU32::new(1);
    assert_eq!(next_segment_id(&c), Some(1));
    assert_eq!(next_segment_id(&c), Some(2));
    let c = AtomicU32::new(u32::MAX - 2);
    assert_eq!(next_segment_id(&c), Some(u32::MAX - 2));
    assert_eq!(
        next_segment_id(&c),
        None,
        "exhausted: refused, not wrapped to 0 or 1"
    );
    assert_eq!(next_segment_id(&c), None);
    // Many threads at the edge: every id given once.
    let c = AtomicU32::new(u32::MAX - 1000);
    let got: Vec<u32> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    (0..200)
                        .filter_map(|_| next_segment_id(&c))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut sorted = got.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), got.len(), "no id twice");
    assert_eq!(got.len(), 999);
    assert!(got.iter().all(|&i| i != 0 && i != u32::MAX));
}
use crate::error::Error;

#[test]
fn only_a_missing_direct_path_falls_back_to_staging() {
    let no_path = |e: gdr::Error| no_direct_path(&Error::Gdr(e));
    // choose_path found no way (GPUDirect blocked, no dma-buf, no peer memory).
    assert!(no_path(gdr::Error::unsupported("dma-buf registration", "")));
    // ibv_reg_mr on a device pointer without a peer-memory module; dma-buf refused.
    for errno in [libc::EFAULT, libc::EOPNOTSUPP, libc::EPROTONOSUPPORT] {
        assert!(
            no_path(gdr::Error::verbs("ibv_reg_mr", "", errno, "")),
            "{errno}"
        );
    }
    // Exhausted resources and bad memory are the caller's to fix: no silent fallback.
    for errno in [libc::ENOMEM, libc::EPERM, libc::EINVAL, libc::EACCES] {
        assert!(
            !no_path(gdr::Error::verbs("ibv_reg_mr", "", errno, "")),
            "{errno}"
        );
    }
    assert!(!no_path(gdr::Error::invalid("not device memory", "")));
    assert!(!no_direct_path(&Error::invalid("bad range", "")));
}
