//! CUDA streams and asynchronous copies between device memory and host memory, whose handles
//! keep both buffers alive until the copy is known complete.

use std::sync::Arc;

use gdr_sys::cuda as sys;

use super::context::PrimaryContext;
use super::memory::check_range;
use super::{check, has_symbol, no_hint, result_name, DeviceMemory, HostDmaMemory};
use crate::error::{Error, Result};

/// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation with the legacy default stream.
const STREAM_NON_BLOCKING: u32 = 0x1;
/// `CU_EVENT_DISABLE_TIMING`: the cheapest event, for completion queries only.
const EVENT_DISABLE_TIMING: u32 = 0x2;

/// Driver symbols streams and asynchronous copies call (checked once, before the first stream).
const STREAM_SYMBOLS: &[&str] = &[
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync_v2",
];

/// A CUDA stream (`cuStreamCreate`, non-blocking) in a GPU's primary context.
///
/// Copies issued on it run in issue order. Share it in an `Arc`: every [`AsyncCopy`] keeps one,
/// so the stream outlives the copies on it. Dropping the last reference synchronises the stream,
/// then destroys it.
///
/// ```no_run
/// # fn main() -> gdr::Result<()> {
/// use std::sync::Arc;
/// use gdr::cuda::{DeviceBuffer, DmaHostBuffer, Stream};
/// let stream = Arc::new(Stream::new(0)?);
/// let dev = Arc::new(DeviceBuffer::alloc(0, 1 << 20)?);
/// let host = Arc::new(DmaHostBuffer::alloc(0, 1 << 20)?);
/// let copy = stream.copy_to_host(&dev, 0, &host, 0, 1 << 20)?; // returns at once
/// copy.wait()?; // now the bytes are in `host`; until then `copy` kept `dev` and `host` alive
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Stream {
    raw: sys::CUstream,
    ctx: PrimaryContext,
    /// Events of completed copies, for the next copies to record (creating and destroying an
    /// event per copy cost more than a small copy's transfer on the staging path). At most
    /// [`EVENT_POOL`]; destroyed with the stream.
    events: std::sync::Mutex<Vec<sys::CUevent>>,
}

/// The most idle events a stream keeps.
const EVENT_POOL: usize = 64;

// SAFETY: a CUstream is a driver handle usable from any thread (the driver API is thread-safe);
// the context is retained by `ctx` and made current around every call.
unsafe impl Send for Stream {}
// SAFETY: as above; `&Stream` only issues driver calls.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a non-blocking stream in GPU `ordinal`'s primary context.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] without a driver, [`Error::InvalidArgument`] for a missing
    /// ordinal, [`Error::Unsupported`] when libcuda lacks a stream or event symbol,
    /// [`Error::Cuda`] when `cuStreamCreate` fails.
    pub fn new(ordinal: i32) -> Result<Stream> {
        let ctx = PrimaryContext::retain(ordinal)?;
        if let Some(missing) = STREAM_SYMBOLS.iter().find(|s| !has_symbol(s)) {
            return Err(Error::unsupported(
                format!("CUDA streams: libcuda lacks {missing}"),
                "install an NVIDIA driver for CUDA 11.2 or newer",
            ));
        }
        let mut raw: sys::CUstream = std::ptr::null_mut();
        {
            // SAFETY: the guard is dropped at the end of this block, before `ctx`.
            let _g = unsafe { ctx.make_current() }?;
            // SAFETY: a context is current; `raw` is a valid out-pointer.
            let rc = unsafe { sys::cuStreamCreate(&mut raw, STREAM_NON_BLOCKING) };
            check(
                rc,
                "cuStreamCreate",
                || format!("flags=NON_BLOCKING, ordinal={ordinal}"),
                no_hint,
            )?;
        }
        Ok(Stream {
            raw,
            ctx,
            events: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// An idle event of the pool, if any.
    fn pooled_event(&self) -> Option<sys::CUevent> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    /// Keeps `event` (whose copy completed, and which nothing refers to any more) for a later
    /// copy; `Err(event)` when the pool is full.
    fn pool_event(&self, event: sys::CUevent) -> std::result::Result<(), sys::CUevent> {
        let mut pool = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() >= EVENT_POOL {
            return Err(event);
        }
        pool.push(event);
        Ok(())
    }

    /// The GPU whose primary context owns the stream.
    pub fn ordinal(&self) -> i32 {
        self.ctx.ordinal()
    }

    /// The raw `CUstream` (for logs, or to hand to other CUDA code; gdr keeps ownership).
    pub fn as_raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Waits until every copy issued on the stream so far has completed.
    ///
    /// # Errors
    /// [`Error::Cuda`] naming `cuStreamSynchronize` (an earlier asynchronous failure shows here).
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the guard is dropped at the end of this function, before `self.ctx`.
        let _g = unsafe { self.ctx.make_current() }?;
        // SAFETY: `raw` is our live stream.
        let rc = unsafe { sys::cuStreamSynchronize(self.raw) };
        check(
            rc,
            "cuStreamSynchronize",
            || format!("stream={:p}", self.raw),
            no_hint,
        )
    }

    /// `true` when every copy issued so far has completed (`cuStreamQuery`), without waiting.
    ///
    /// # Errors
    /// [`Error::Cuda`] for any result but success and `CUDA_ERROR_NOT_READY`.
    pub fn is_idle(&self) -> Result<bool> {
        // SAFETY: the guard is dropped at the end of this function, before `self.ctx`.
        let _g = unsafe { self.ctx.make_current() }?;
        // SAFETY: `raw` is our live stream.
        let rc = unsafe { sys::cuStreamQuery(self.raw) };
        if rc == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(
            rc,
            "cuStreamQuery",
            || format!("stream={:p}", self.raw),
            no_hint,
        )?;
        Ok(true)
    }

    /// Issues a copy of `len` bytes from device memory `src` at `src_offset` to host memory `dst`
    /// at `dst_offset` (`cuMemcpyDtoHAsync`), and returns at once.
    ///
    /// The returned handle keeps an `Arc` of both buffers (and of the stream) until the copy is
    /// known complete; dropping it before then waits for the copy. Copies on one stream complete
    /// in issue order. Host memory that is not page-locked works, but the driver then copies
    /// synchronously; [`super::DmaHostBuffer`] is pinned.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when either range does not lie inside its buffer (nothing issued);
    /// [`Error::Cuda`] from the driver.
    pub fn copy_to_host<D, H>(
        self: &Arc<Self>,
        src: &Arc<D>,
        src_offset: usize,
        dst: &Arc<H>,
        dst_offset: usize,
        len: usize,
    ) -> Result<AsyncCopy>
    where
        D: DeviceMemory + Send + Sync + ?Sized + 'static,
        H: HostDmaMemory + ?Sized,
    {
        check_range(
            "Stream::copy_to_host source (device)",
            src_offset,
            len,
            src.len(),
        )?;
        check_range(
            "Stream::copy_to_host destination (host)",
            dst_offset,
            len,
            dst.len(),
        )?;
        let keep: [Box<dyn Keep>; 2] = [Box::new(src.clone()), Box::new(dst.clone())];
        let from = src.device_ptr().wrapping_add(src_offset as u64);
        // In bounds of the host allocation (checked above), so the add stays inside it.
        let to = dst.host_ptr().as_ptr().wrapping_add(dst_offset);
        self.issue(keep, len, "cuMemcpyDtoHAsync", |stream| {
            // SAFETY: `from..from+len` lies in a live device allocation (bounds checked above;
            // DeviceMemory's contract: allocated while the value lives, kept by the handle's Arc); `to..to+len` in live host memory the
            // engine may write while shared (HostDmaMemory's contract, kept alive likewise).
            unsafe { sys::cuMemcpyDtoHAsync_v2(to.cast(), from, len, stream) }
        })
        .map_err(|e| with_args(e, format!("dst={to:p}, src={from:#x}, bytes={len}")))
    }

    /// Issues a copy of `len` bytes from host memory `src` at `src_offset` to device memory `dst`
    /// at `dst_offset` (`cuMemcpyHtoDAsync`), and returns at once. Lifetimes as in
    /// [`copy_to_host`](Self::copy_to_host).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when either range does not lie inside its buffer (nothing issued);
    /// [`Error::Cuda`] from the driver.
    pub fn copy_to_device<H, D>(
        self: &Arc<Self>,
        src: &Arc<H>,
        src_offset: usize,
        dst: &Arc<D>,
        dst_offset: usize,
        len: usize,
    ) -> Result<AsyncCopy>
    where
        H: HostDmaMemory + ?Sized,
        D: DeviceMemory + Send + Sync + ?Sized + 'static,
    {
        check_range(
            "Stream::copy_to_device source (host)",
            src_offset,
            len,
            src.len(),
        )?;
        check_range(
            "Stream::copy_to_device destination (device)",
            dst_offset,
            len,
            dst.len(),
        )?;
        let keep: [Box<dyn Keep>; 2] = [Box::new(src.clone()), Box::new(dst.clone())];
        let from = src.host_ptr().as_ptr().wrapping_add(src_offset);
        let to = dst.device_ptr().wrapping_add(dst_offset as u64);
        self.issue(keep, len, "cuMemcpyHtoDAsync", |stream| {
            // SAFETY: as in copy_to_host, with the roles swapped: both ranges lie in live memory
            // kept alive by the Arcs the handle holds until the copy is known complete.
            unsafe { sys::cuMemcpyHtoDAsync_v2(to, from.cast_const().cast(), len, stream) }
        })
        .map_err(|e| with_args(e, format!("dst={to:#x}, src={from:p}, bytes={len}")))
    }

    /// Issues one copy (`enqueue`) and records an event after it.
    fn issue(
        self: &Arc<Self>,
        keep: [Box<dyn Keep>; 2],
        len: usize,
        call: &'static str,
        enqueue: impl FnOnce(sys::CUstream) -> sys::CUresult,
    ) -> Result<AsyncCopy> {
        if len == 0 {
            return Ok(AsyncCopy {
                stream: self.clone(),
                event: None,
                keep: None,
                len,
            });
        }
        // SAFETY: the guard is dropped at the end of this function, before `self`.
        let _g = unsafe { self.ctx.make_current() }?;
        let event = match self.pooled_event() {
            Some(e) => e,
            None => {
                let mut event: sys::CUevent = std::ptr::null_mut();
                // SAFETY: a context is current; `event` is a valid out-pointer.
                let rc = unsafe { sys::cuEventCreate(&mut event, EVENT_DISABLE_TIMING) };
                check(
                    rc,
                    "cuEventCreate",
                    || "flags=DISABLE_TIMING".into(),
                    no_hint,
                )?;
                event
            }
        };
        // From here on the handle owns the event (destroyed in Drop).
        let mut copy = AsyncCopy {
            stream: self.clone(),
            event: Some(event),
            keep: None,
            len,
        };
        let rc = enqueue(self.raw);
        check(rc, call, String::new, no_hint)?;
        // The copy is queued: from now on the buffers must outlive it.
        copy.keep = Some(keep);
        // SAFETY: `event` and `raw` are live and belong to the current context.
        let rc = unsafe { sys::cuEventRecord(event, self.raw) };
        if let Err(e) = check(rc, "cuEventRecord", String::new, no_hint) {
            // Without the event the copy cannot be waited for on its own: wait for the whole
            // stream, and leak the buffers if even that fails (the engine may still use them).
            // Either way `keep` is empty before `copy` drops, so Drop never trusts the
            // unrecorded event.
            match self.synchronize() {
                Ok(()) => copy.keep = None,
                Err(_) => std::mem::forget(copy.keep.take()),
            }
            return Err(e);
        }
        Ok(copy)
    }
}

/// Puts the copy's arguments into a driver error that was made without them.
fn with_args(e: Error, text: String) -> Error {
    match e {
        Error::Cuda {
            call,
            args,
            result,
            name,
            hint,
        } if args.is_empty() => Error::Cuda {
            call,
            args: text,
            result,
            name,
            hint,
        },
        other => other,
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the guard is dropped at the end of this function, before the fields.
        let _g = unsafe { self.ctx.make_current() };
        let pooled = std::mem::take(self.events.get_mut().unwrap_or_else(|p| p.into_inner()));
        for event in pooled {
            // SAFETY: an idle event of ours (its copy completed and its handle is gone), destroyed
            // once, here.
            let rc = unsafe { sys::cuEventDestroy_v2(event) };
            if rc != sys::CUresult::CUDA_SUCCESS {
                log::warn!("cuEventDestroy failed: {}", result_name(rc));
            }
        }
        // SAFETY: our live stream; every copy on it held an Arc of the stream, so none is
        // pending a wait, but synchronise anyway before destroying it.
        unsafe {
            let rc = sys::cuStreamSynchronize(self.raw);
            if rc != sys::CUresult::CUDA_SUCCESS {
                log::warn!(
                    "cuStreamSynchronize({:p}) at drop failed: {}",
                    self.raw,
                    result_name(rc)
                );
            }
            let rc = sys::cuStreamDestroy_v2(self.raw);
            if rc != sys::CUresult::CUDA_SUCCESS {
                log::warn!(
                    "cuStreamDestroy({:p}) failed: {}",
                    self.raw,
                    result_name(rc)
                );
            }
        }
    }
}

/// Anything kept alive for an in-flight copy (an `Arc` of a buffer).
trait Keep: Send + Sync {}
impl<T: Send + Sync + ?Sized> Keep for T {}

/// One asynchronous copy in flight on a [`Stream`]. Owns an `Arc` of the source, the destination
/// and the stream until the copy is known complete: by [`is_complete`](Self::is_complete)
/// returning `true`, by [`wait`](Self::wait), or by `Drop`, which waits. If the driver cannot say
/// that the copy finished (a failed query or wait: the context is broken), the buffers are leaked
/// rather than freed under a copy that may still run.
pub struct AsyncCopy {
    stream: Arc<Stream>,
    event: Option<sys::CUevent>,
    keep: Option<[Box<dyn Keep>; 2]>,
    len: usize,
}

// SAFETY: the event is a driver handle usable from any thread; the kept values are Send + Sync.
unsafe impl Send for AsyncCopy {}
// SAFETY: `&AsyncCopy` only reads plain fields.
unsafe impl Sync for AsyncCopy {}

impl std::fmt::Debug for AsyncCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCopy")
            .field("stream", &self.stream.raw)
            .field("len", &self.len)
            .field("complete", &self.keep.is_none())
            .finish()
    }
}

impl AsyncCopy {
    /// The number of bytes copied.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a zero-length copy (issued as nothing).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `true` once the copy has completed (`cuEventQuery`); then its buffers are released.
    /// Never waits.
    ///
    /// # Errors
    /// [`Error::Cuda`] naming `cuEventQuery` when the copy (or an earlier one on the stream)
    /// failed; the buffers then stay held (and leak on drop).
    pub fn is_complete(&mut self) -> Result<bool> {
        let Some(event) = self.event else {
            return Ok(self.keep.is_none());
        };
        if self.keep.is_none() {
            return Ok(true);
        }
        // SAFETY: the guard is dropped at the end of this function, before `self.stream`.
        let _g = unsafe { self.stream.ctx.make_current() }?;
        // SAFETY: `event` is live (destroyed only in Drop).
        let rc = unsafe { sys::cuEventQuery(event) };
        if rc == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(
            rc,
            "cuEventQuery",
            || format!("copy of {} bytes", self.len),
            no_hint,
        )?;
        self.keep = None;
        Ok(true)
    }

    /// Waits until the copy has completed (`cuEventSynchronize`), then releases its buffers.
    ///
    /// # Errors
    /// [`Error::Cuda`] naming `cuEventSynchronize` when the copy failed (the buffers leak).
    pub fn wait(mut self) -> Result<()> {
        self.wait_mut()
    }

    /// [`wait`](Self::wait) without consuming the handle.
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    pub fn wait_mut(&mut self) -> Result<()> {
        let Some(event) = self.event else {
            return Ok(());
        };
        if self.keep.is_none() {
            return Ok(());
        }
        // SAFETY: the guard is dropped at the end of this function, before `self.stream`.
        let _g = unsafe { self.stream.ctx.make_current() }?;
        // SAFETY: `event` is live.
        let rc = unsafe { sys::cuEventSynchronize(event) };
        check(
            rc,
            "cuEventSynchronize",
            || format!("copy of {} bytes", self.len),
            no_hint,
        )?;
        self.keep = None;
        Ok(())
    }
}

impl Drop for AsyncCopy {
    fn drop(&mut self) {
        if self.keep.is_some() {
            if let Err(e) = self.wait_mut() {
                log::error!(
                    "an asynchronous copy of {} bytes could not be waited for ({e}); its buffers \
                     are leaked so the copy engine never writes freed memory",
                    self.len
                );
                std::mem::forget(self.keep.take());
            }
        }
        if let Some(event) = self.event.take() {
            // A completed copy's event goes back to its stream's pool (the copy was waited for
            // or seen complete: `keep` is empty; on the leak path above it is not, and the
            // event is destroyed, the driver deferring the release).
            let event = if self.keep.is_none() {
                match self.stream.pool_event(event) {
                    Ok(()) => return,
                    Err(e) => e,
                }
            } else {
                event
            };
            // SAFETY: the guard is dropped at the end of this block, before `self.stream`.
            let _g = unsafe { self.stream.ctx.make_current() };
            // SAFETY: our live event, destroyed once; the driver defers the release if it is
            // still pending (only possible on the leak path above).
            let rc = unsafe { sys::cuEventDestroy_v2(event) };
            if rc != sys::CUresult::CUDA_SUCCESS {
                log::warn!("cuEventDestroy failed: {}", result_name(rc));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::DmaHostBuffer;

    /// Without a usable driver (the machines the host tier runs on), streams and bounce buffers
    /// are typed errors, never panics; a zero length is refused before the driver is asked.
    #[test]
    fn without_cuda_streams_and_dma_buffers_are_typed_errors() {
        let e = DmaHostBuffer::alloc(0, 0).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        match super::super::device_count() {
            Err(Error::CudaUnavailable { .. }) => {
                let e = Stream::new(0).unwrap_err();
                assert!(matches!(e, Error::CudaUnavailable { .. }), "{e}");
                let e = DmaHostBuffer::alloc(0, 4096).unwrap_err();
                assert!(matches!(e, Error::CudaUnavailable { .. }), "{e}");
            }
            Ok(n) => {
                let e = Stream::new(n + 3).unwrap_err();
                assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
            }
            Err(other) => panic!("device_count: {other}"),
        }
    }

    #[test]
    fn with_args_fills_only_empty_arguments() {
        let e = Error::Cuda {
            call: "cuMemcpyDtoHAsync",
            args: String::new(),
            result: sys::CUresult::CUDA_ERROR_INVALID_VALUE,
            name: "CUDA_ERROR_INVALID_VALUE".into(),
            hint: crate::Hint::NONE,
        };
        let e = with_args(e, "dst=0x1, src=0x2, bytes=3".into());
        assert!(
            e.to_string()
                .starts_with("cuMemcpyDtoHAsync(dst=0x1, src=0x2, bytes=3) failed"),
            "{e}"
        );
        let e = with_args(e, "other".into());
        assert!(!e.to_string().contains("other"), "{e}");
        let e = with_args(Error::invalid("x", crate::Hint::NONE), "y".into());
        assert!(matches!(e, Error::InvalidArgument { .. }));
    }
}
