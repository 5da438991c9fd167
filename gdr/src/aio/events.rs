//! The device's asynchronous events, awaited.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::device::{AsyncEvent, DeviceEvents};
use crate::error::{Error, Result};

/// A device context's asynchronous events, awaited: port up/down, queue pair and completion
/// queue errors, device failure (see [`crate::device::DeviceEvents`] for the blocking reader).
///
/// ```no_run
/// # async fn demo() -> gdr::Result<()> {
/// let ctx = gdr::Context::open("rxe0")?;
/// let events = gdr::aio::AsyncDeviceEvents::new(ctx.events()?)?;
/// loop {
///     let e = events.next().await?;
///     if e.kind.is_error() {
///         eprintln!("{e}");
///     }
/// }
/// # }
/// ```
pub struct AsyncDeviceEvents {
    events: DeviceEvents,
    afd: AsyncFd<EventFd>,
}

impl std::fmt::Debug for AsyncDeviceEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncDeviceEvents")
            .field("events", &self.events)
            .finish()
    }
}

/// The context's event descriptor, for `AsyncFd`; it holds the context (which owns the
/// descriptor) so the descriptor stays open as long as the `AsyncFd`.
struct EventFd {
    fd: RawFd,
    _ctx: Arc<crate::device::Context>,
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl AsyncDeviceEvents {
    /// Awaits the events `events` reads. Call inside a tokio runtime.
    ///
    /// # Errors
    /// [`Error::Io`] when tokio cannot watch the descriptor (outside a runtime, for one).
    pub fn new(events: DeviceEvents) -> Result<AsyncDeviceEvents> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::invalid(
                "AsyncDeviceEvents::new outside a tokio runtime",
                "create it from inside the runtime (an async fn, or Runtime::enter)",
            ));
        }
        let fd = events.fd();
        let owner = EventFd {
            fd,
            _ctx: events.context().clone(),
        };
        // `owner` keeps the context (which owns the descriptor) alive as long as the AsyncFd.
        let afd = watch(owner, "the async event descriptor")?;
        Ok(AsyncDeviceEvents { events, afd })
    }

    /// The next event.
    ///
    /// # Errors
    /// [`Error::Io`] when waiting fails, [`Error::Verbs`] when reading the event does.
    pub async fn next(&self) -> Result<AsyncEvent> {
        loop {
            if let Some(e) = self.events.try_next()? {
                return Ok(e);
            }
            let mut ready = self
                .afd
                .readable()
                .await
                .map_err(|e| Error::io("waiting on the async event descriptor", e))?;
            match self.events.try_next()? {
                Some(e) => return Ok(e),
                None => ready.clear_ready(),
            }
        }
    }
}

/// Registers `owner`'s descriptor with the current tokio runtime's reactor, for readability.
/// tokio panics on a runtime without an I/O driver: that becomes an error here.
pub(crate) fn watch<T: AsRawFd>(owner: T, what: &str) -> Result<AsyncFd<T>> {
    let fd = owner.as_raw_fd();
    let registered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: every caller passes an owner that keeps `fd` open, and returns it from
        // `as_raw_fd`, for the AsyncFd's whole life (it owns the descriptor, or the object that
        // owns it).
        unsafe { AsyncFd::register_with_interest(owner, Interest::READABLE) }
    }))
    .map_err(|_| {
        Error::invalid(
            format!("watching {what} (fd {fd}): the tokio runtime has no I/O driver"),
            "build the runtime with enable_io() (or enable_all())",
        )
    })?;
    registered.map_err(|e| Error::io(format!("registering {what} (fd {fd}) with tokio"), e.into()))
}
