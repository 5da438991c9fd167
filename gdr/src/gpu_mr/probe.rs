//! Step 1 of registration: the capabilities, probed once and cached. The host's peer-memory and
//! dma-buf facts ([`system_facts`]) and, per NIC, whether it imports dma-bufs
//! ([`probe_nic_dma_buf`]). What the answers mean is decided in [`super::rules`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use gdr_sys::ibv;

use super::rules::{NicDmaBuf, PeerMemory, SystemFacts};
use crate::mr::AccessFlags;
use crate::pd::ProtectionDomain;
use crate::return_code::teardown;

/// This machine's [`SystemFacts`] (read below `/` once per process, by
/// [`super::facts::FactReader`], the reader of `gdr-doctor`'s collector).
pub fn system_facts() -> &'static SystemFacts {
    static FACTS: OnceLock<SystemFacts> = OnceLock::new();
    FACTS.get_or_init(|| SystemFacts::probe(Path::new("/")))
}

/// Whether a peer-memory module is loaded on the machine whose `/proc` and `/sys` lie below
/// `root` (`/` on a live system, a snapshot folder in tests), by the rule of
/// [`SystemFacts::peer_memory`].
pub fn probe_peer_memory(root: &Path) -> PeerMemory {
    SystemFacts::probe(root).peer_memory()
}

/// [`probe_peer_memory`] of `/`, once per process.
pub fn peer_memory() -> &'static PeerMemory {
    static PEER: OnceLock<PeerMemory> = OnceLock::new();
    PEER.get_or_init(|| system_facts().peer_memory())
}

/// Probes (once per device name, then cached) whether the NIC behind `pd` imports dma-bufs:
/// `ibv_reg_dmabuf_mr` with fd -1 fails with `EBADF` on a NIC that does, `EOPNOTSUPP` or
/// `EPROTONOSUPPORT` on one that does not.
pub fn probe_nic_dma_buf(pd: &ProtectionDomain) -> NicDmaBuf {
    static CACHE: OnceLock<Mutex<HashMap<String, NicDmaBuf>>> = OnceLock::new();
    let name = pd.context().name().to_string();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache.lock().ok().and_then(|m| m.get(&name).copied()) {
        return v;
    }
    let len = crate::mr::page_size();
    // SAFETY: `pd` is a live protection domain; fd -1 refers to no file, so nothing is imported;
    // if a provider registers something anyway it is deregistered below.
    let mr = unsafe {
        ibv::ibv_reg_dmabuf_mr(
            pd.as_raw(),
            0,
            len,
            0,
            -1,
            AccessFlags::LOCAL_WRITE.bits() as i32,
        )
    };
    let result = if mr.is_null() {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        NicDmaBuf::from_probe_errno(errno)
    } else {
        // SAFETY: `mr` was just returned by ibv_reg_dmabuf_mr, is used by nothing and is
        // deregistered once. If that fails, the handle is leaked (it maps no memory of ours).
        let rc = unsafe { ibv::ibv_dereg_mr(mr) };
        teardown("ibv_dereg_mr", format_args!("dma-buf probe on {name}"), rc);
        NicDmaBuf::Supported
    };
    log::debug!("dma-buf probe on {name}: {result:?}");
    if let Ok(mut m) = cache.lock() {
        m.insert(name, result);
    }
    result
}

/// [`probe_nic_dma_buf`] on the RDMA device `name` (opened, with a protection domain allocated
/// for the probe); `None` when it cannot be opened.
pub fn probe_nic_dma_buf_by_name(name: &str) -> Option<NicDmaBuf> {
    let ctx = match crate::device::DeviceList::new().and_then(|l| l.open(name)) {
        Ok(ctx) => ctx,
        Err(e) => {
            log::debug!("dma-buf probe: cannot open {name}: {e}");
            return None;
        }
    };
    match ProtectionDomain::new(&ctx) {
        Ok(pd) => Some(probe_nic_dma_buf(&pd)),
        Err(e) => {
            log::debug!("dma-buf probe: no protection domain on {name}: {e}");
            None
        }
    }
}
