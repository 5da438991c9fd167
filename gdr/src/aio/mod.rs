//! Async completions on tokio (feature `tokio`): post a request, await its own completion.
//!
//! An [`AsyncCompletionQueue`] takes a completion queue made with a completion channel and runs a
//! small driver task on the current tokio runtime: it arms the queue, polls it, hands each
//! completion to the future waiting for it, and sleeps on the channel's file descriptor (through
//! tokio's `AsyncFd`) until the next event. Posting stays synchronous and checked as always;
//! [`AsyncCompletionQueue::post_send`] and [`AsyncCompletionQueue::post_recv`] return a
//! [`Completed`] future that resolves with that request's outcome.
//!
//! Cancel safety: dropping a [`Completed`] at any point is harmless. The queue pair keeps the
//! request's regions alive until its completion is reaped (gdr's rule for every post, blocking or
//! not), the driver reaps it whenever it arrives, and the abandoned completion is absorbed without
//! reaching any other future.
//!
//! ```no_run
//! # async fn demo() -> gdr::Result<()> {
//! use gdr::aio::AsyncCompletionQueue;
//! use gdr::{AccessFlags, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair};
//! use gdr::SendRequest;
//!
//! let ctx = Context::open("rxe0")?;
//! let pd = ProtectionDomain::new(&ctx)?;
//! let cq = CompletionQueue::with_channel(&ctx, 1024)?;
//! let qp = QueuePair::builder(&pd, &cq, &cq).build()?;
//! # let peer = qp.endpoint();
//! qp.connect(&peer)?;                            // endpoints exchanged as usual (gdr::connect)
//! let acq = AsyncCompletionQueue::new(&cq)?;     // inside a tokio runtime
//! let mr = MemoryRegion::with_data(&pd, b"hello", AccessFlags::LOCAL_WRITE)?;
//! # let remote = mr.remote();
//! let done = acq.post_send(&qp, &SendRequest::write(&[mr.slice(..)?], remote.slice(0..5)?))?;
//! let c = done.await?;                           // this write's completion, or its error
//! # let _ = c;
//! # Ok(()) }
//! ```
//!
//! Many requests may be outstanding on one queue pair and one completion queue at once, from any
//! number of tasks: each future resolves with its own completion. Requests posted to the queue
//! through the blocking API (with any `wr_id`) can be awaited with
//! [`AsyncCompletionQueue::completion`]; completions nobody claims are returned by
//! [`AsyncCompletionQueue::next_unclaimed`], to any number of waiting tasks.
//!
//! Every future learns its request's fate:
//! - Completions are routed by provenance, not by id: a request the async layer posted is marked
//!   as such in its queue pair's in-flight table and gets an id unique in the process, and a
//!   request posted by hand is awaited by its queue pair, queue and id. So no completion of
//!   another queue pair, of a request posted by hand, or of an earlier async queue on the same
//!   completion queue can resolve a future that is not its own.
//! - [`QueuePair::reset`] and dropping a queue pair end its requests in flight without
//!   completions: their futures resolve with [`Error::RequestDropped`]. After
//!   [`QueuePair::disconnect`] they complete as flushed, as in the blocking API.
//! - [`AsyncCompletionQueue::handle_event`] applies the device's events: a queue pair's fatal
//!   error fails its futures at once, and the queue's overrun (`CqError`) or the device's
//!   failure (`DeviceFatal`) fails every future of the queue ([`Error::DeviceEvent`]).

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::Waker;

use crate::cq::dispatch::Watcher;
use crate::cq::{Completion, CompletionQueue};
use crate::device::AsyncEvent;
use crate::error::{Error, Result};
use crate::qp::{DropCause, QueuePair, WorkQueue};
use crate::wr::{RecvRequest, SendRequest};

mod driver;
mod events;
mod future;
mod routes;

pub(crate) use events::watch;
pub use events::AsyncDeviceEvents;
pub use future::Completed;

use driver::{drive, ChannelFd};
use routes::{Key, Routes, Stop, Wakers};

/// The ids the async layer gives its requests: one counter for the whole process, so that no
/// two requests it posts (through any async queue, at any time) share one. The top bit is set
/// only to make them easy to recognise; routing does not rely on it.
static NEXT_OWN_ID: AtomicU64 = AtomicU64::new(0);
const OWN_ID_BIT: u64 = 1 << 63;

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

impl Shared {
    /// The routes. Lock order: a completion queue's and a queue pair's locks come before this
    /// one (a reset tells the routes under them), and nothing is locked while it is held.
    fn lock(&self) -> MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The queue pairs of the completion queue tell the routes which requests a reset or destroy
/// ended (under their locks, so no completion or post interleaves).
impl Watcher for Shared {
    fn requests_dropped(
        &self,
        qp_num: u32,
        queue: WorkQueue,
        cause: DropCause,
        in_flight: &mut dyn Iterator<Item = (u64, bool)>,
        wake: &mut Vec<Waker>,
    ) {
        let mut woken = Wakers::default();
        self.lock()
            .dropped(qp_num, queue, cause, in_flight, &mut woken);
        wake.extend(woken.into_vec());
    }
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
        detach(&self.shared);
    }
}

/// Takes `shared` off its completion queue (if it is still the queue's watcher), so another
/// async queue may take the queue over.
fn detach(shared: &Arc<Shared>) {
    let mut d = shared.cq.lock_dispatch();
    let ours = d
        .watcher
        .as_ref()
        .is_some_and(|w| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(shared)));
    if ours {
        d.watcher = None;
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
        let shared = Arc::new(Shared {
            cq: cq.clone(),
            routes: Mutex::new(Routes::default()),
            active: Mutex::new(true),
            wanted: tokio::sync::Notify::new(),
        });
        {
            let mut d = cq.lock_dispatch();
            if d.watcher.is_some() {
                return Err(Error::invalid(
                    "another AsyncCompletionQueue already delivers this completion queue's completions",
                    "share one AsyncCompletionQueue (it is cheap to clone)",
                ));
            }
            let watcher: Weak<dyn Watcher> = Arc::downgrade(&shared) as Weak<dyn Watcher>;
            d.watcher = Some(watcher);
        }
        // SAFETY: `fd` is the channel's open descriptor; dup has no memory-safety precondition.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            let e = std::io::Error::last_os_error();
            detach(&shared);
            return Err(Error::io(
                format!("duplicating completion channel fd {fd}"),
                e,
            ));
        }
        let owner = ChannelFd {
            // SAFETY: `dup` is a new descriptor this value now owns (and closes).
            fd: unsafe { OwnedFd::from_raw_fd(dup) },
            _cq: cq.clone(),
        };
        // The descriptor is owned by `owner` and open until it drops, after the AsyncFd.
        let afd = watch(owner, "the completion channel").inspect_err(|_| detach(&shared))?;
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
    /// and gets an id of gdr's choosing, [`Completed::wr_id`]) and returns the future of its
    /// outcome.
    ///
    /// # Errors
    /// Every error of [`QueuePair::post_send`]; [`Error::InvalidArgument`] when `qp` does not
    /// report its send completions to this queue; the error that stopped this queue (a driver
    /// failure, or an event passed to [`AsyncCompletionQueue::handle_event`]). Nothing is posted
    /// then, except after an [`Error::Verbs`] that says the provider may have queued the
    /// request: its completion is then absorbed.
    pub fn post_send(&self, qp: &QueuePair, req: &SendRequest<'_>) -> Result<Completed> {
        self.check_queue(qp.send_cq(), "send")?;
        let id = self.register(qp, WorkQueue::Send)?;
        let mut req = req.clone().id(id);
        req.signaled = true;
        self.posted(Key::Own(id), qp.post_send_owned(&req))
    }

    /// Posts the receive `req` on `qp` (checked as [`QueuePair::post_recv`]) and returns the
    /// future of its outcome (the message that lands in it).
    ///
    /// # Errors
    /// As [`AsyncCompletionQueue::post_send`], for the receive queue.
    pub fn post_recv(&self, qp: &QueuePair, req: &RecvRequest<'_>) -> Result<Completed> {
        self.check_queue(qp.recv_cq(), "receive")?;
        let id = self.register(qp, WorkQueue::Recv)?;
        let req = req.clone().id(id);
        self.posted(Key::Own(id), qp.post_recv_owned(&req))
    }

    /// The future of the completion of a request posted by hand on `qp`'s `queue` with `wr_id`
    /// (any value; signalled, or it may never be reported). If that completion already arrived
    /// unclaimed, the future is ready at once, unless `qp` was reset since: a completion from
    /// before a reset is never matched to a request of the same id after it (it stays for
    /// [`AsyncCompletionQueue::next_unclaimed`]). It resolves as
    /// [`AsyncCompletionQueue::post_send`]'s futures do, with [`Error::RequestDropped`] when `qp`
    /// is reset while the request is in flight or is destroyed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `qp` does not report that queue's completions to this
    /// queue, or another future already waits for the same request; the error that stopped
    /// this queue.
    pub fn completion(&self, qp: &QueuePair, queue: WorkQueue, wr_id: u64) -> Result<Completed> {
        let cq = match queue {
            WorkQueue::Send => qp.send_cq(),
            WorkQueue::Recv => qp.recv_cq(),
        };
        self.check_queue(
            cq,
            if queue == WorkQueue::Send {
                "send"
            } else {
                "receive"
            },
        )?;
        let key = self.inner.lock().add_hand(qp.qp_num(), queue, wr_id)?;
        Ok(Completed {
            inner: self.inner.clone(),
            key,
            done: false,
        })
    }

    /// The next completion no future claims (requests posted by hand and not awaited), in
    /// arrival order. Any number of tasks may wait at once; each completion goes to one.
    ///
    /// # Errors
    /// The error that stopped this queue (a driver failure such as a CQ overrun, or an event
    /// passed to [`AsyncCompletionQueue::handle_event`]), once no unclaimed completion is left.
    pub async fn next_unclaimed(&self) -> Result<Completion> {
        future::Unclaimed {
            shared: &self.inner,
            token: None,
        }
        .await
    }

    /// Applies a device event ([`AsyncDeviceEvents::next`]) of this queue's device context:
    /// - a queue pair's fatal, request or access error fails every future waiting for a request
    ///   of that queue pair at once, with [`Error::DeviceEvent`], instead of leaving them to the
    ///   flush completions (the completions of this queue's own requests are still reaped, so
    ///   the memory is released, and absorbed; those of requests posted by hand go unclaimed);
    /// - this completion queue's error (`CqError`: it overran, and completions were lost) and
    ///   the device's failure (`DeviceFatal`) stop this queue: every future, now and later, and
    ///   every wait for an unclaimed completion fails with [`Error::DeviceEvent`], and posting
    ///   through it is refused.
    ///
    /// Returns how many waiting futures it failed; other events change nothing.
    pub fn handle_event(&self, event: &AsyncEvent) -> usize {
        use crate::device::{AsyncEventKind as K, EventSubject};
        let mut wake = Wakers::default();
        let failed = match (event.kind, event.subject) {
            (K::QpFatal | K::QpRequestError | K::QpAccessError, EventSubject::Qp { qp_num }) => {
                self.inner.lock().fail_qp(qp_num, *event, &mut wake)
            }
            (K::CqError, _) if event.concerns_cq(&self.inner.cq) => {
                self.inner.lock().stop(Stop::Event(*event), &mut wake)
            }
            (K::DeviceFatal, _) => self.inner.lock().stop(Stop::Event(*event), &mut wake),
            _ => 0,
        };
        wake.wake_all();
        failed
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

    /// A new id of our own for a request on `qp`'s `queue`, its route registered before the
    /// post (a completion may arrive before `post` returns).
    fn register(&self, qp: &QueuePair, queue: WorkQueue) -> Result<u64> {
        let id = OWN_ID_BIT | (NEXT_OWN_ID.fetch_add(1, Ordering::Relaxed) & !OWN_ID_BIT);
        self.inner.lock().add_own(id, qp.qp_num(), queue)?;
        Ok(id)
    }

    /// The future of `key` once posted; when the post failed, its route goes (or, when the
    /// provider may have queued the request, waits to absorb its completion).
    fn posted(&self, key: Key, (counted, outcome): (bool, Result<()>)) -> Result<Completed> {
        match outcome {
            Ok(()) => Ok(Completed {
                inner: self.inner.clone(),
                key,
                done: false,
            }),
            Err(e) => {
                self.inner.lock().withdraw(key, counted);
                if counted {
                    self.inner.wanted.notify_one();
                }
                Err(e)
            }
        }
    }
}
