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

/// The guards alive on one thread, oldest first, and the context that was current before the
/// oldest of them. Dropping any guard removes its entry; the context current afterwards is that
/// of the newest remaining guard, or the base when none remains. So the drop order does not
/// matter, and a guard never restores a context that an older guard already released.
#[derive(Debug, Default)]
pub(crate) struct ContextStack {
    base: usize,
    entries: Vec<(u64, usize)>,
    next_id: u64,
}

impl ContextStack {
    /// Records a new guard for `ctx`; `current` is the context current right now (used as the
    /// base when no guard is alive). Returns the guard's id.
    pub(crate) fn push(&mut self, ctx: usize, current: usize) -> u64 {
        if self.entries.is_empty() {
            self.base = current;
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.entries.push((id, ctx));
        id
    }

    /// Forgets the guard `id`. Returns the context to make current when it was the newest guard
    /// (the next newest one's, or the base), `None` when a newer guard stays current (or the id
    /// is unknown).
    pub(crate) fn remove(&mut self, id: u64) -> Option<usize> {
        let pos = self.entries.iter().position(|(i, _)| *i == id)?;
        self.entries.remove(pos);
        if pos != self.entries.len() {
            return None;
        }
        Some(self.entries.last().map_or(self.base, |(_, c)| *c))
    }

    /// The number of live guards.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

thread_local! {
    static STACK: std::cell::RefCell<ContextStack> = std::cell::RefCell::new(ContextStack::default());
}

/// Makes a CUDA context current on this thread and restores a correct one when dropped: the
/// context of the newest guard still alive on this thread, or the context that was current
/// before the first of them (possibly none). Guards may be dropped in any order: dropping an
/// older guard while a newer one lives leaves the newer one's context current.
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
    id: u64,
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
    /// `cuCtxCreate`, ...) that is not destroyed while the guard lives (a guard given to
    /// `mem::forget` lives for the rest of the thread: newer guards may restore its context).
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
        let id = STACK
            .try_with(|s| s.borrow_mut().push(ctx as usize, previous as usize))
            .unwrap_or(u64::MAX);
        Ok(ContextGuard {
            id,
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

    /// The context that was current when the guard was made (null if none). Dropping the guard
    /// restores it when this guard is the only one alive on the thread, or the newest one and
    /// the older ones are still alive.
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
        // Which context must be current once this guard is gone: the newest remaining guard's,
        // or the base; nothing changes when a newer guard is still alive. Every context in the
        // stack belongs to a live guard, so it is still valid (retained, or by the contract of
        // `from_raw`). Without the thread-local (thread exit), restore what was current before.
        let target = STACK
            .try_with(|s| s.borrow_mut().remove(self.id))
            .unwrap_or(Some(self.previous as usize));
        if let Some(target) = target {
            let target = target as sys::CUcontext;
            let mut now: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: initialised driver (the guard exists); valid out-pointer.
            let rc = unsafe { sys::cuCtxGetCurrent(&mut now) };
            if rc != sys::CUresult::CUDA_SUCCESS || now != target {
                // SAFETY: `target` is null (unsets the current context), the base that was
                // current before the first live guard, or the context of a live guard.
                let rc = unsafe { sys::cuCtxSetCurrent(target) };
                if rc != sys::CUresult::CUDA_SUCCESS {
                    log::warn!("cuCtxSetCurrent({target:p}) failed while restoring: {rc:?}");
                }
            }
        }
        // `primary` (if any) is released after the right context is current.
    }
}

#[cfg(test)]
mod tests {
    use super::ContextStack;

    #[test]
    fn nested_guards_restore_in_order() {
        let mut s = ContextStack::default();
        let a = s.push(0xa, 0);
        let b = s.push(0xb, 0xa);
        assert_eq!(s.remove(b), Some(0xa));
        assert_eq!(s.remove(a), Some(0));
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn out_of_order_drops_never_restore_a_released_context() {
        // GPU A's guard, then GPU B's; A's dropped first (its primary context is released).
        let mut s = ContextStack::default();
        let a = s.push(0xa, 0);
        let b = s.push(0xb, 0xa);
        assert_eq!(s.remove(a), None, "B stays current");
        assert_eq!(s.remove(b), Some(0), "back to none, not to the released A");
        // Three guards, the middle one first.
        let a = s.push(0xa, 0x5);
        let b = s.push(0xb, 0xa);
        let c = s.push(0xc, 0xb);
        assert_eq!(s.remove(b), None);
        assert_eq!(s.remove(c), Some(0xa));
        assert_eq!(
            s.remove(a),
            Some(0x5),
            "the base from before the first guard"
        );
        assert_eq!(s.remove(a), None, "a second removal does nothing");
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn the_base_is_taken_when_the_stack_is_empty() {
        let mut s = ContextStack::default();
        let a = s.push(0xa, 0x1);
        assert_eq!(s.remove(a), Some(0x1));
        let b = s.push(0xb, 0x2);
        assert_eq!(s.remove(b), Some(0x2));
    }
}
