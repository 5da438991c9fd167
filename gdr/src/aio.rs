//! Async completions on tokio (feature `tokio`): post a request, await its own completion.
//!
//! An [`AsyncCompletionQueue`] takes a completion queue made with a completion channel and runs a
//! small driver task on the current tokio runtime: it arms the queue, polls it, hands each
//! completion to the future waiting for it, and sleeps on the channel's file descriptor (through
//! tokio's `AsyncFd`) until the next event. Posting stays synchronous and checked as always;
//! [`AsyncCompletionQueue::post_send`] and [`AsyncCompletionQueue::post_recv`] return a
//! [`Completed`] future that resolves with that request's completion.
//!
//! Cancel safety: dropping a [`Completed`] at any point is harmless. The queue pair keeps the
//! request's regions alive until its completion is reaped (gdr's rule for every post, blocking or
//! not), the driver reaps it whenever it arrives, and the abandoned completion is absorbed without
//! reaching any other future.
//!
//! ```no_run
//! # async fn demo() -> gdr::Result<()> {
//! use gdr::aio::AsyncCompletionQueue;
//! use gdr::{AccessFlags, DeviceContext, SendRequest};
//!
//! let ctx = DeviceContext::open("rxe0")?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq_with_channel(1024)?;
//! let qp = pd.queue_pair(&cq, &cq).build()?;
//! # let peer = qp.endpoint();
//! qp.connect(&peer)?;                            // endpoints exchanged as usual (gdr::connect)
//! let acq = AsyncCompletionQueue::new(&cq)?;     // inside a tokio runtime
//! let mr = pd.register_copy(b"hello", AccessFlags::LOCAL_WRITE)?;
//! # let remote = mr.remote();
//! let done = acq.post_send(&qp, &SendRequest::write(&[mr.slice(..)?], remote.slice(0..5)?))?;
//! let c = done.await?;                           // this write's completion, or its error
//! # let _ = c;
//! # Ok(()) }
//! ```
//!
//! Many requests may be outstanding on one queue pair and one completion queue at once, from any
//! number of tasks: each future resolves with its own completion. Requests posted to the queue
//! through the blocking API (their `wr_id` must have the top bit clear) can be awaited with
//! [`AsyncCompletionQueue::completion`]; completions nobody claims are returned by
//! [`AsyncCompletionQueue::next_unclaimed`].

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::cq::{Completion, CompletionQueue};
use crate::device::{AsyncEvent, DeviceEvents};
use crate::error::{Error, Hint, Result};
use crate::qp::QueuePair;
use crate::wr::{RecvRequest, SendRequest};

/// `wr_id`s the async layer assigns have this bit set; requests posted by hand must leave it
/// clear.
const OWN_ID: u64 = 1 << 63;

/// A completion queue whose completions are delivered to futures. Cheap to clone (all clones
/// share one driver task); the driver stops when the last clone and the last [`Completed`] are
/// dropped.
#[derive(Clone)]
pub struct AsyncCompletionQueue {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AsyncCompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCompletionQueue")
            .field("cq", &self.inner.cq)
            .finish()
    }
}

/// What the driver and the handles share.
struct Shared {
    cq: Arc<CompletionQueue>,
    routes: Mutex<Routes>,
    next_id: AtomicU64,
    /// Whether the driver may still touch the completion queue. The driver holds this lock for
    /// each step that does (arm, deliver, take events), and the last handle clears it under the
    /// lock: after that the driver never touches the queue again, so a new async queue may take
    /// it over at once.
    active: Mutex<bool>,
    /// Raised by a future that goes to sleep: the driver arms the queue and watches the channel
    /// only while some future sleeps (a future first reaps the queue itself, so one whose
    /// completion is already there never involves the driver).
    wanted: tokio::sync::Notify,
}

/// The handle every clone and every [`Completed`] holds; the last one stops the driver.
struct Inner {
    shared: Arc<Shared>,
    driver: OnceLock<tokio::task::AbortHandle>,
}

impl std::ops::Deref for Inner {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        *self.shared.active.lock().unwrap_or_else(|p| p.into_inner()) = false;
        if let Some(d) = self.driver.get() {
            d.abort();
        }
        self.shared
            .cq
            .async_attached
            .store(false, Ordering::Release);
    }
}

/// Where each completion goes.
#[derive(Default)]
struct Routes {
    /// Futures waiting for a `wr_id`, and completions that arrived for them.
    by_id: HashMap<u64, Route>,
    /// Completions no future asked for (yet).
    unclaimed: VecDeque<Completion>,
    unclaimed_waker: Option<Waker>,
    /// Set when the driver stopped on an error: every waiter gets it.
    failed: Option<String>,
    /// The queue pair each of our own ids was posted on (for failing a queue pair's futures).
    qp_of: HashMap<u64, u32>,
}

impl Routes {
    /// Fails every waiting future of a request on QP `qp_num` with `event`; returns how many.
    fn fail_qp(&mut self, qp_num: u32, event: AsyncEvent) -> usize {
        let ids: Vec<u64> = self
            .qp_of
            .iter()
            .filter(|&(_, &q)| q == qp_num)
            .map(|(&id, _)| id)
            .collect();
        let mut failed = 0;
        for id in ids {
            if let Some(r) = self.by_id.get_mut(&id) {
                if let Route::Waiting(w) = r {
                    let w = w.take();
                    *r = Route::Failed {
                        event,
                        in_flight: true,
                    };
                    failed += 1;
                    if let Some(w) = w {
                        w.wake();
                    }
                }
            }
        }
        failed
    }

    /// Forgets everything about `id`.
    fn forget(&mut self, id: u64) -> Option<Route> {
        self.qp_of.remove(&id);
        self.by_id.remove(&id)
    }

    /// Whether the driver must watch the queue: a future sleeps until its completion arrives,
    /// or a dropped future's request is still in flight (its completion must be reaped so the
    /// queue pair releases the memory and the slot).
    fn needs_driver(&self) -> bool {
        self.unclaimed_waker.is_some()
            || self.by_id.values().any(|r| {
                matches!(
                    r,
                    Route::Waiting(Some(_))
                        | Route::Abandoned
                        | Route::Failed {
                            in_flight: true,
                            ..
                        }
                )
            })
    }
}

enum Route {
    /// A future waits (with the waker of its last poll).
    Waiting(Option<Waker>),
    /// The completion arrived; the future has not been polled since.
    Arrived(Completion),
    /// The future was dropped: absorb the completion when it comes.
    Abandoned,
    /// The request's queue pair failed (a fatal asynchronous event): the future gets this error
    /// at once; `in_flight` while its completion (a flush) is still to be reaped and absorbed.
    Failed { event: AsyncEvent, in_flight: bool },
}

/// A duplicate of the completion channel's descriptor, for `AsyncFd`: each async queue registers
/// its own descriptor with tokio, so a new one can start while the driver of a dropped one is
/// still being torn down. It also holds the completion queue, which owns the channel.
struct ChannelFd {
    fd: OwnedFd,
    _cq: Arc<CompletionQueue>,
}

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsyncCompletionQueue {
    /// Starts delivering `cq`'s completions to futures. `cq` must have a completion channel
    /// ([`CompletionQueue::with_channel`]); call this inside a tokio runtime (the driver task is
    /// spawned on it). From now on, poll `cq` only through this value: a blocking poll elsewhere
    /// would take completions the futures are waiting for. One async queue per completion queue
    /// at a time (clone it to share); once every clone and future is dropped, another may start.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a queue without a channel, one another async queue already
    /// delivers, or outside a runtime;
    /// [`Error::Io`] when tokio cannot watch the channel.
    pub fn new(cq: &Arc<CompletionQueue>) -> Result<AsyncCompletionQueue> {
        let fd = cq.channel_fd().ok_or_else(|| {
            Error::invalid(
                "AsyncCompletionQueue::new on a completion queue without a completion channel",
                "create it with CompletionQueue::with_channel (ctx.create_cq_with_channel)",
            )
        })?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            Error::invalid(
                format!("AsyncCompletionQueue::new outside a tokio runtime: {e}"),
                "create it from inside the runtime (an async fn, or Runtime::enter)",
            )
        })?;
        let _entered = runtime.enter();
        if cq.async_attached.swap(true, Ordering::AcqRel) {
            return Err(Error::invalid(
                "another AsyncCompletionQueue already delivers this completion queue's completions",
                "share one AsyncCompletionQueue (it is cheap to clone)",
            ));
        }
        let detach = || cq.async_attached.store(false, Ordering::Release);
        // SAFETY: `fd` is the channel's open descriptor; dup has no memory-safety precondition.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            detach();
            return Err(Error::io(
                format!("duplicating completion channel fd {fd}"),
                std::io::Error::last_os_error(),
            ));
        }
        let owner = ChannelFd {
            // SAFETY: `dup` is a new descriptor this value now owns (and closes).
            fd: unsafe { OwnedFd::from_raw_fd(dup) },
            _cq: cq.clone(),
        };
        // The descriptor is owned by `owner` and open until it drops, after the AsyncFd.
        let afd = watch(owner, "the completion channel").inspect_err(|_| detach())?;
        let shared = Arc::new(Shared {
            cq: cq.clone(),
            routes: Mutex::new(Routes::default()),
            next_id: AtomicU64::new(0),
            active: Mutex::new(true),
            wanted: tokio::sync::Notify::new(),
        });
        let inner = Arc::new(Inner {
            shared: shared.clone(),
            driver: OnceLock::new(),
        });
        let task = runtime.spawn(drive(shared, afd));
        let _ = inner.driver.set(task.abort_handle());
        Ok(AsyncCompletionQueue { inner })
    }

    /// The completion queue.
    pub fn cq(&self) -> &Arc<CompletionQueue> {
        &self.inner.cq
    }

    /// Posts `req` on `qp` (checked exactly as [`QueuePair::post_send`]; the request is signalled
    /// and gets an id of gdr's choosing) and returns the future of its completion.
    ///
    /// # Errors
    /// Every error of [`QueuePair::post_send`], and [`Error::InvalidArgument`] when `qp` does not
    /// report its send completions to this queue. Nothing is posted then.
    pub fn post_send(&self, qp: &QueuePair, req: &SendRequest<'_>) -> Result<Completed> {
        self.check_queue(qp.send_cq(), "send")?;
        let id = self.inner.own_id(qp.qp_num());
        let mut req = req.clone().id(id);
        req.signaled = true;
        self.posted(id, qp.post_send(&req))
    }

    /// Posts the receive `req` on `qp` (checked as [`QueuePair::post_recv`]) and returns the
    /// future of its completion (the message that lands in it).
    ///
    /// # Errors
    /// As [`AsyncCompletionQueue::post_send`], for the receive queue.
    pub fn post_recv(&self, qp: &QueuePair, req: &RecvRequest<'_>) -> Result<Completed> {
        self.check_queue(qp.recv_cq(), "receive")?;
        let id = self.inner.own_id(qp.qp_num());
        let req = req.clone().id(id);
        self.posted(id, qp.post_recv(&req))
    }

    /// The future of the completion of a request posted by hand with `wr_id` (top bit clear;
    /// signalled, or it may never be reported). If that completion already arrived unclaimed, the
    /// future is ready at once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `wr_id` with the top bit set (those are gdr's own) or one
    /// another future already waits for.
    pub fn completion(&self, wr_id: u64) -> Result<Completed> {
        if wr_id & OWN_ID != 0 {
            return Err(Error::invalid(
                format!("wr_id {wr_id:#x} has the top bit set, which the async layer reserves"),
                "post requests you await by hand with ids below 2^63",
            ));
        }
        let mut routes = self.inner.lock();
        if routes.by_id.contains_key(&wr_id) {
            return Err(Error::invalid(
                format!("another future already waits for wr_id {wr_id}"),
                Hint::NONE,
            ));
        }
        let route = match routes.unclaimed.iter().position(|c| c.wr_id == wr_id) {
            Some(i) => Route::Arrived(routes.unclaimed.remove(i).expect("index found above")),
            None => Route::Waiting(None),
        };
        routes.by_id.insert(wr_id, route);
        drop(routes);
        Ok(Completed {
            inner: self.inner.clone(),
            id: wr_id,
            done: false,
        })
    }

    /// The next completion no future claims (requests posted by hand and not awaited), in
    /// arrival order.
    ///
    /// # Errors
    /// [`Error::Io`]-style failures of the driver (a CQ overrun, the channel failing).
    pub async fn next_unclaimed(&self) -> Result<Completion> {
        std::future::poll_fn(|cx| {
            self.inner.deliver_now();
            let mut routes = self.inner.lock();
            if let Some(c) = routes.unclaimed.pop_front() {
                return Poll::Ready(Ok(c));
            }
            if let Some(e) = &routes.failed {
                return Poll::Ready(Err(driver_failed(e)));
            }
            routes.unclaimed_waker = Some(cx.waker().clone());
            drop(routes);
            self.inner.wanted.notify_one();
            Poll::Pending
        })
        .await
    }

    /// Applies a device event ([`AsyncDeviceEvents::next`]): a queue pair's fatal, request or
    /// access error fails every future waiting for a request posted through this queue on that
    /// queue pair at once, with [`Error::DeviceEvent`], instead of leaving them to the flush
    /// completions (their completions are still reaped, so the memory is released, and
    /// absorbed). Returns how many futures it failed; other events change nothing.
    pub fn handle_event(&self, event: &AsyncEvent) -> usize {
        use crate::device::{AsyncEventKind as K, EventSubject};
        let qp_num = match (event.kind, event.subject) {
            (K::QpFatal | K::QpRequestError | K::QpAccessError, EventSubject::Qp { qp_num }) => {
                qp_num
            }
            _ => return 0,
        };
        self.inner.lock().fail_qp(qp_num, *event)
    }

    fn check_queue(&self, cq: &Arc<CompletionQueue>, which: &str) -> Result<()> {
        if Arc::ptr_eq(cq, &self.inner.cq) {
            Ok(())
        } else {
            Err(Error::invalid(
                format!("the queue pair reports its {which} completions to another completion queue"),
                "build the queue pair with this completion queue (or await through the AsyncCompletionQueue of its own)",
            ))
        }
    }

    /// Registers the route of `id` before the post's outcome is known (a completion may arrive
    /// before `post` returns), and removes it again when nothing was posted.
    fn posted(&self, id: u64, outcome: Result<()>) -> Result<Completed> {
        match outcome {
            Ok(()) => Ok(Completed {
                inner: self.inner.clone(),
                id,
                done: false,
            }),
            Err(e) => {
                let mut routes = self.inner.lock();
                // A refused post never completes; one the provider may have queued (an error
                // from the doorbell) still may: absorb its completion.
                if matches!(e, Error::Verbs { .. }) {
                    if let Some(r) = routes.by_id.get_mut(&id) {
                        if matches!(r, Route::Waiting(_)) {
                            *r = Route::Abandoned;
                            self.inner.wanted.notify_one();
                        }
                    }
                } else {
                    routes.forget(id);
                }
                Err(e)
            }
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new id of our own for a request on QP `qp_num`, its route registered.
    fn own_id(&self, qp_num: u32) -> u64 {
        let id = OWN_ID | (self.next_id.fetch_add(1, Ordering::Relaxed) & !OWN_ID);
        let mut routes = self.lock();
        routes.by_id.insert(id, Route::Waiting(None));
        routes.qp_of.insert(id, qp_num);
        id
    }

    /// Reaps the queue from a future's poll (while the driver is active); an error stops every
    /// waiter as a driver failure would.
    fn deliver_now(&self) {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        if *active {
            if let Err(e) = self.deliver() {
                drop(active);
                fail(self, e);
            }
        }
    }

    /// Hands out every completion the queue holds now.
    fn deliver(&self) -> Result<()> {
        let mut buf = [Completion::default(); 32];
        loop {
            let n = self.cq.poll(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            let mut routes = self.lock();
            for c in &buf[..n] {
                route(&mut routes, *c);
            }
            drop(routes);
            if n < buf.len() {
                return Ok(());
            }
        }
    }
}

/// Gives one completion to whoever waits for it.
fn route(routes: &mut Routes, c: Completion) {
    match routes.by_id.get_mut(&c.wr_id) {
        Some(Route::Waiting(w)) => {
            let w = w.take();
            routes.by_id.insert(c.wr_id, Route::Arrived(c));
            if let Some(w) = w {
                w.wake();
            }
        }
        Some(Route::Abandoned) => {
            routes.forget(c.wr_id);
        }
        Some(Route::Failed { in_flight, .. }) => {
            // The failed queue pair's flush: absorbed (the future already has its error).
            *in_flight = false;
        }
        // A second completion for one id (a request posted twice by hand with the same id):
        // the first stays with its future, this one is unclaimed.
        Some(Route::Arrived(_)) | None => {
            routes.unclaimed.push_back(c);
            if let Some(w) = routes.unclaimed_waker.take() {
                w.wake();
            }
        }
    }
}

/// The driver: arm, deliver, sleep on the channel; until the last handle is dropped. It touches
/// the completion queue only while `active` is set, under its lock.
async fn drive(shared: Arc<Shared>, afd: AsyncFd<ChannelFd>) {
    let cq = shared.cq.clone();
    loop {
        // Idle until some future sleeps (its notification is kept if it comes first).
        while !shared.lock().needs_driver() {
            shared.wanted.notified().await;
        }
        {
            let active = shared.active.lock().unwrap_or_else(|p| p.into_inner());
            if !*active {
                return;
            }
            // Arm first, then deliver: a completion that lands after the arm raises an event,
            // one that landed before is delivered now, so none is missed.
            if let Err(e) = cq.arm().and_then(|()| shared.deliver()) {
                drop(active);
                fail(&shared, e);
                return;
            }
        }
        if !shared.lock().needs_driver() {
            // Everyone was served: no need to watch the channel (an event the arm still raises
            // is taken the next time round).
            continue;
        }
        let waited = afd.readable().await;
        let mut ready = match waited {
            Ok(r) => r,
            Err(e) => {
                fail(&shared, Error::io("waiting on the completion channel", e));
                return;
            }
        };
        {
            let active = shared.active.lock().unwrap_or_else(|p| p.into_inner());
            if !*active {
                return;
            }
            // Take and acknowledge every pending event (the descriptor is non-blocking).
            loop {
                match cq.wait(Duration::ZERO) {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(e) => {
                        drop(active);
                        fail(&shared, e);
                        return;
                    }
                }
            }
        }
        ready.clear_ready();
    }
}

/// Stops every waiter with the driver's error.
fn fail(inner: &Shared, e: Error) {
    log::error!("async completion queue stopped: {e}");
    let mut routes = inner.lock();
    routes.failed = Some(e.to_string());
    for r in routes.by_id.values_mut() {
        if let Route::Waiting(w) = r {
            if let Some(w) = w.take() {
                w.wake();
            }
        }
    }
    if let Some(w) = routes.unclaimed_waker.take() {
        w.wake();
    }
}

fn driver_failed(e: &str) -> Error {
    Error::invalid(
        format!("the async completion queue's driver stopped: {e}"),
        "the completion queue overran or its channel failed; recreate the queue pairs and queues",
    )
}

/// A device context's asynchronous events, awaited: port up/down, queue pair and completion
/// queue errors, device failure (see [`crate::device::DeviceEvents`] for the blocking reader).
///
/// ```no_run
/// # async fn demo() -> gdr::Result<()> {
/// let ctx = gdr::DeviceContext::open("rxe0")?;
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

/// The completion of one posted request. Resolves to the completion on success and to
/// [`Error::Completion`] (with its typed status) when the request failed. Dropping it is always
/// safe: the request's memory stays registered until the completion is reaped, and the
/// completion is then absorbed.
///
/// A queue pair destroyed while its requests are in flight produces no completions for them, so
/// their futures would stay pending: disconnect or reset the queue pair first (the requests then
/// complete as flushed), or fail them with [`AsyncCompletionQueue::handle_event`] when the device
/// reports the queue pair's fatal error.
#[must_use = "a completion future does nothing unless awaited (dropping it is safe)"]
pub struct Completed {
    inner: Arc<Inner>,
    id: u64,
    done: bool,
}

impl std::fmt::Debug for Completed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completed")
            .field("wr_id", &self.id)
            .finish()
    }
}

impl Completed {
    /// The `wr_id` the request was posted with.
    pub fn wr_id(&self) -> u64 {
        self.id
    }
}

impl Future for Completed {
    type Output = Result<Completion>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let id = self.id;
        let mut routes = self.inner.lock();
        if matches!(routes.by_id.get(&id), Some(Route::Waiting(_))) && routes.failed.is_none() {
            // Reap the queue here first: a completion that is already there is handed out
            // without waking the driver (the cost of a poll, as in the blocking API).
            drop(routes);
            self.inner.deliver_now();
            routes = self.inner.lock();
        }
        let failed = routes.failed.clone();
        let outcome = match routes.by_id.get_mut(&id) {
            Some(Route::Arrived(_)) => match routes.forget(id) {
                Some(Route::Arrived(c)) => Poll::Ready(c.result().copied()),
                _ => unreachable!("matched Arrived above"),
            },
            Some(Route::Waiting(_)) if failed.is_some() => {
                routes.by_id.insert(id, Route::Abandoned);
                Poll::Ready(Err(driver_failed(failed.as_deref().unwrap_or_default())))
            }
            Some(Route::Waiting(w)) => {
                *w = Some(cx.waker().clone());
                drop(routes);
                self.inner.wanted.notify_one();
                return Poll::Pending;
            }
            // Polled again after it resolved.
            Some(Route::Failed { event, in_flight }) => {
                let (event, in_flight) = (*event, *in_flight);
                if in_flight {
                    routes.by_id.insert(id, Route::Abandoned);
                } else {
                    routes.forget(id);
                }
                Poll::Ready(Err(Error::DeviceEvent {
                    event,
                    hint: Hint::new("the request's queue pair failed before its completion: reset() it and connect again"),
                }))
            }
            Some(Route::Abandoned) | None => Poll::Ready(Err(Error::invalid(
                format!("the completion of wr_id {id} was already returned"),
                "await a Completed once",
            ))),
        };
        drop(routes);
        self.done = true;
        outcome
    }
}

impl Drop for Completed {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut routes = self.inner.lock();
        match routes.by_id.get(&self.id) {
            // Arrived but never looked at: nothing more will come for it.
            Some(Route::Arrived(_)) => {
                routes.forget(self.id);
            }
            // Still in flight: absorb the completion when it comes (the driver reaps it).
            Some(Route::Waiting(_)) => {
                routes.by_id.insert(self.id, Route::Abandoned);
                drop(routes);
                self.inner.wanted.notify_one();
            }
            Some(Route::Failed { in_flight, .. }) => {
                if *in_flight {
                    routes.by_id.insert(self.id, Route::Abandoned);
                } else {
                    routes.forget(self.id);
                }
            }
            Some(Route::Abandoned) | None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(wr_id: u64) -> Completion {
        Completion {
            wr_id,
            ..Default::default()
        }
    }

    #[test]
    fn a_queue_pair_failure_fails_its_waiters_only_and_absorbs_their_flushes() {
        use crate::device::{AsyncEventKind, EventSubject};
        let mut r = Routes::default();
        for (id, qp) in [(1, 7), (2, 7), (3, 8)] {
            r.by_id.insert(id, Route::Waiting(None));
            r.qp_of.insert(id, qp);
        }
        let event = AsyncEvent {
            kind: AsyncEventKind::QpFatal,
            subject: EventSubject::Qp { qp_num: 7 },
        };
        assert_eq!(r.fail_qp(7, event), 2);
        assert!(
            matches!(r.by_id.get(&3), Some(Route::Waiting(_))),
            "another QP's future waits on"
        );
        assert!(
            r.needs_driver(),
            "the failed requests' flushes still have to be reaped"
        );
        // The flush of request 1 arrives: absorbed, not unclaimed.
        route(&mut r, c(1));
        assert!(r.unclaimed.is_empty());
        assert!(matches!(
            r.by_id.get(&1),
            Some(Route::Failed {
                in_flight: false,
                ..
            })
        ));
        route(&mut r, c(3));
        assert!(matches!(r.by_id.get(&3), Some(Route::Arrived(_))));
    }

    #[test]
    fn completions_go_to_their_own_waiter_and_abandoned_ones_are_absorbed() {
        let mut r = Routes::default();
        r.by_id.insert(1, Route::Waiting(None));
        r.by_id.insert(2, Route::Abandoned);
        route(&mut r, c(2));
        assert!(!r.by_id.contains_key(&2), "absorbed");
        route(&mut r, c(1));
        assert!(matches!(r.by_id.get(&1), Some(Route::Arrived(x)) if x.wr_id == 1));
        route(&mut r, c(1));
        route(&mut r, c(9));
        let ids: Vec<u64> = r.unclaimed.iter().map(|c| c.wr_id).collect();
        assert_eq!(
            ids,
            [1, 9],
            "duplicates and unknown ids are unclaimed, not misdelivered"
        );
    }
}
