//! Protection domains, and the factories that start from one: regions and queue pairs.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use gdr_sys::ibv;

use crate::cq::CompletionQueue;
use crate::device::Context;
use crate::error::{Hint, Result};
use crate::mr::{AccessFlags, HostMemory, MemoryRegion};
use crate::qp::{QueuePair, QueuePairBuilder};
use crate::return_code;

/// A protection domain (`ibv_pd`): memory regions and queue pairs of one domain may work together.
/// It keeps its [`Context`] alive; regions and queue pairs keep it alive in turn.
pub struct ProtectionDomain {
    pd: NonNull<ibv::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: ibv_pd handles may be used from any thread; the verbs that take one are thread-safe.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above; no interior mutability on our side.
unsafe impl Sync for ProtectionDomain {}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.ctx.name())
            .finish()
    }
}

impl ProtectionDomain {
    /// Allocates a protection domain on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        // SAFETY: `ctx` is an open context kept alive by the Arc we store.
        let pd = unsafe { ibv::ibv_alloc_pd(ctx.as_raw()) };
        let pd = return_code::non_null(
            "ibv_alloc_pd",
            pd,
            || format!("device={}", ctx.name()),
            |_| Hint::new("the device's max_pd may be exhausted"),
        )?;
        Ok(Arc::new(ProtectionDomain {
            pd,
            ctx: ctx.clone(),
        }))
    }

    /// The raw `ibv_pd`, for FFI. Valid while `self` lives.
    pub fn as_raw(&self) -> *mut ibv::ibv_pd {
        self.pd.as_ptr()
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Context {
    /// Allocates a protection domain on this device (the same as [`ProtectionDomain::new`]).
    #[deprecated(
        since = "0.1.0",
        note = "one way to build each object: use ProtectionDomain::new(&ctx)"
    )]
    pub fn alloc_pd(self: &Arc<Self>) -> Result<Arc<ProtectionDomain>> {
        ProtectionDomain::new(self)
    }
}

impl ProtectionDomain {
    /// Allocates `len` zeroed, page-aligned bytes and registers them with this domain (the same
    /// as [`MemoryRegion::new`]).
    #[deprecated(
        since = "0.1.0",
        note = "one way to build each object: use MemoryRegion::new(&pd, len, access)"
    )]
    pub fn alloc_region(
        self: &Arc<Self>,
        len: usize,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>> {
        MemoryRegion::new(self, len, access)
    }

    /// Registers a copy of `data` with this domain (the same as [`MemoryRegion::with_data`]).
    #[deprecated(
        since = "0.1.0",
        note = "one way to build each object: use MemoryRegion::with_data(&pd, data, access)"
    )]
    pub fn register_copy(
        self: &Arc<Self>,
        data: &[u8],
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>> {
        MemoryRegion::with_data(self, data, access)
    }

    /// Registers host memory the region will own (the same as [`MemoryRegion::register`]).
    #[deprecated(
        since = "0.1.0",
        note = "one way to build each object: use MemoryRegion::register(&pd, mem, access)"
    )]
    pub fn register(
        self: &Arc<Self>,
        mem: Box<dyn HostMemory>,
        access: AccessFlags,
    ) -> Result<Arc<MemoryRegion>> {
        MemoryRegion::register(self, mem, access)
    }

    /// A builder for a reliable-connected queue pair in this domain (the same as
    /// [`QueuePair::builder`]).
    #[deprecated(
        since = "0.1.0",
        note = "one way to build each object: use QueuePair::builder(&pd, send_cq, recv_cq)"
    )]
    pub fn queue_pair(
        self: &Arc<Self>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
    ) -> QueuePairBuilder {
        QueuePair::builder(self, send_cq, recv_cq)
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every region and queue pair of this domain holds an Arc to it, so none is alive.
        let rc = unsafe { ibv::ibv_dealloc_pd(self.pd.as_ptr()) };
        return_code::teardown("ibv_dealloc_pd", self.ctx.name(), rc);
    }
}
