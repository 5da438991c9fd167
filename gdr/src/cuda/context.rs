//! Making a CUDA context current for a scope, and restoring the previous one.

use std::marker::PhantomData;

use gdr_sys::cuda as sys;

use super::{check, device_handle, init, no_hint};
use crate::error::Result;

/// A retained primary context of one device: `cuDevicePrimaryCtxRetain` on creation,
/// `cuDevicePrimaryCtxRelease` on drop. Allocations hold one so their context outlives them.
#[derive(Debug)]
pub(crate) struct PrimaryContext {
    ordinal: i32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: a CUcontext handle is an opaque token valid on every thread; the driver API is
// thread-safe, and retain/release are reference counted by the driver.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; &PrimaryContext only reads the handle.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Retains the primary context of `ordinal` (creating it on first use).
    pub(crate) fn retain(ordinal: i32) -> Result<Self> {
        init()?;
        let dev = device_handle(ordinal)?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: initialised driver, `dev` from cuDeviceGet, `ctx` a valid out-pointer.
        let rc = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) };
        check(
            rc,
            "cuDevicePrimaryCtxRetain",
            || format!("ordinal={ordinal}"),
            |_| {
                "check nvidia-smi: the GPU may be in exclusive-process mode or out of memory".into()
            },
        )?;
        Ok(PrimaryContext { ordinal, dev, ctx })
    }

    /// The raw context handle.
    pub(crate) fn raw(&self) -> sys::CUcontext {
        self.ctx
    }

    /// The device ordinal.
    pub(crate) fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Makes this context current until the guard drops.
    ///
    /// # Safety
    /// The guard must be dropped before `self` (the guard does not retain the context).
    pub(crate) unsafe fn make_current(&self) -> Result<ContextGuard> {
        // SAFETY: `self` keeps the context retained; the caller drops the guard first.
        unsafe { ContextGuard::push(self.ctx, None) }
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: balanced with the successful retain in `retain`.
        let rc = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            log::warn!(
                "cuDevicePrimaryCtxRelease(ordinal={}) failed: {rc:?}",
                self.ordinal
            );
        }
    }
}

/// Makes a CUDA context current on this thread and restores the previously current one (possibly
/// none) when dropped.
///
/// CUDA keeps the current context per thread, so the guard is neither `Send` nor `Sync`: it must
/// be dropped on the thread that created it.
///
/// ```no_run
/// # fn main() -> gdr::Result<()> {
/// let ctx = gdr::cuda::ContextGuard::primary(0)?; // GPU 0's primary context is current
/// assert_eq!(gdr::cuda::ContextGuard::current()?, ctx.as_raw());
/// drop(ctx); // the previous context (or none) is current again
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ContextGuard {
    previous: sys::CUcontext,
    current: sys::CUcontext,
    primary: Option<PrimaryContext>,
    _not_send: PhantomData<*mut ()>,
}

impl ContextGuard {
    /// Retains the primary context of device `ordinal` (the one the CUDA runtime, PyTorch and
    /// pool allocators use) and makes it current.
    ///
    /// # Errors
    /// [`crate::Error::CudaUnavailable`] without a driver, [`crate::Error::InvalidArgument`] for
    /// an ordinal that does not exist, [`crate::Error::Cuda`] if the context cannot be created.
    pub fn primary(ordinal: i32) -> Result<Self> {
        let primary = PrimaryContext::retain(ordinal)?;
        let ctx = primary.raw();
        // SAFETY: the guard owns `primary`, so the context stays retained while it is current.
        unsafe { ContextGuard::push(ctx, Some(primary)) }
    }

    /// Makes an existing context current.
    ///
    /// # Safety
    /// `ctx` must be a valid context (from `cuPointerGetAttributes(CONTEXT)` of a live allocation,
    /// `cuCtxCreate`, ...) that is not destroyed while the guard lives.
    pub unsafe fn from_raw(ctx: sys::CUcontext) -> Result<Self> {
        init()?;
        // SAFETY: forwarded to the caller's contract.
        unsafe { ContextGuard::push(ctx, None) }
    }

    /// # Safety
    /// `ctx` must stay valid while the guard lives (the caller's contract, or `primary` holds it).
    unsafe fn push(ctx: sys::CUcontext, primary: Option<PrimaryContext>) -> Result<Self> {
        let mut previous: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: initialised driver (every constructor ran init()); valid out-pointer.
        let rc = unsafe { sys::cuCtxGetCurrent(&mut previous) };
        check(rc, "cuCtxGetCurrent", String::new, no_hint)?;
        if previous != ctx {
            // SAFETY: `ctx` is valid per this function's contract.
            let rc = unsafe { sys::cuCtxSetCurrent(ctx) };
            check(rc, "cuCtxSetCurrent", || format!("ctx={ctx:p}"), no_hint)?;
        }
        Ok(ContextGuard {
            previous,
            current: ctx,
            primary,
            _not_send: PhantomData,
        })
    }

    /// The context this guard made current.
    pub fn as_raw(&self) -> sys::CUcontext {
        self.current
    }

    /// The context that was current before (null if none); it is restored on drop.
    pub fn previous(&self) -> sys::CUcontext {
        self.previous
    }

    /// The device ordinal, when this guard holds a primary context.
    pub fn ordinal(&self) -> Option<i32> {
        self.primary.as_ref().map(PrimaryContext::ordinal)
    }

    /// The context current on this thread right now (null if none).
    ///
    /// # Errors
    /// [`crate::Error::CudaUnavailable`] without a driver.
    pub fn current() -> Result<sys::CUcontext> {
        init()?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: initialised driver; valid out-pointer.
        let rc = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
        check(rc, "cuCtxGetCurrent", String::new, no_hint)?;
        Ok(ctx)
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if self.previous != self.current {
            // SAFETY: `previous` was current when the guard was made (or null, which unsets the
            // current context); restoring it is what the caller expects.
            let rc = unsafe { sys::cuCtxSetCurrent(self.previous) };
            if rc != sys::CUresult::CUDA_SUCCESS {
                log::warn!(
                    "cuCtxSetCurrent(previous={:p}) failed while restoring: {rc:?}",
                    self.previous
                );
            }
        }
        // `primary` (if any) is released after the previous context is back.
    }
}
