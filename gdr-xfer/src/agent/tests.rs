use super::registration::no_direct_path;

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
