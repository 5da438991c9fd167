//! asyncio: `await transfer`, `Transfer.wait_async()`, `async for note in
//! agent.notifications()`, `Agent.wait_peer_async`, `Peer.wait_segment_async`,
//! `Agent.connect_async` and `Agent.connect_named_async`, without blocking the event loop and
//! without a thread per wait.
//!
//! One thread of this module (the *hub*, `gdr-py-async`) polls the engine's futures
//! ([`gdr_xfer::Transfer`], [`gdr_xfer::Agent::wait_notification_async`],
//! [`gdr_xfer::Agent::wait_peer_async`], [`gdr_xfer::Peer::wait_segment_named_async`] and the
//! [`Connecting`] of [`gdr_xfer::Agent::connect_async`] and `connect_named_async`) with wakers
//! of its own. A waker, called on an engine thread, only queues the key of what it
//! watches for the hub: no engine thread takes the GIL. Once something is ready, the hub takes
//! the GIL and hands the outcome to each waiting asyncio future through
//! `loop.call_soon_threadsafe(gdr._aio._resolve, fut, ...)`, which sets it on the loop's own
//! thread unless the future was cancelled meanwhile.
//!
//! Cancelling the awaiting task cancels the asyncio future: for a transfer, its done callback
//! cancels the transfer too (the transfer then ends as usual and the hub forgets it); for a
//! notification, a peer or a segment, the hub drops the watch and with it the engine's future,
//! whose waker the engine then forgets (nothing stays registered for a wait nobody awaits).
//!
//! A step of `notifications()` never has a notification in flight to it: the hub only watches
//! for one to be queued ([`gdr_xfer::Agent::notification_ready_async`], which takes nothing),
//! and the step's coroutine (`gdr._aio._next_notification`) takes it itself, in the awaiting
//! task, once it runs again, as asyncio's `Queue.get` does. A task cancelled before that, a
//! loop closed meanwhile, a future resolved too late: the notification is still queued, for
//! the next wait of any kind. Connecting is the one wait
//! the engine runs on a thread of its own (the TCP handshake blocks): the hub drops its future,
//! and that thread still ends within the connect timeout; a peer it connected meanwhile stays
//! connected (`Agent.peer(name)` finds it). Nothing stays behind either way.
//!
//! The blocking `Agent.connect_named` waits for the same [`Connecting`] future on the calling
//! thread ([`wait_connecting`]), in slices, so that Ctrl-C interrupts it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Duration;

use gdr_xfer::futures::{Connecting, NotificationReady, WaitPeer, WaitSegment};
use gdr_xfer::{Agent, Peer, Result, SegmentInfo, Transfer, TransferStats};
use pyo3::prelude::*;

use crate::args::wait_until;
use crate::errors::to_py;
use crate::peer::{PyPeer, PyRemoteSegment};

/// A transfer shared by its Python handle and the hub while one awaits it.
pub(crate) struct SharedTransfer {
    /// The hub's key for it.
    key: u64,
    /// Read-locked by the blocking calls (several at once); write-locked only by the hub, for
    /// the moment of a `poll` (which needs `&mut`).
    pub(crate) t: RwLock<Transfer>,
}

impl SharedTransfer {
    /// Wraps a submitted transfer.
    pub(crate) fn new(t: Transfer) -> Arc<Self> {
        Arc::new(SharedTransfer {
            key: next_key(),
            t: RwLock::new(t),
        })
    }

    /// Read access (a poisoned lock still holds a valid transfer).
    pub(crate) fn get(&self) -> std::sync::RwLockReadGuard<'_, Transfer> {
        self.t.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// A fresh key.
fn next_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What the hub watches: the engine's futures, kept across polls (their wakers stay
/// registered once, and go when the watch is dropped).
enum What {
    Transfer(Arc<SharedTransfer>),
    /// A notification queued (not taken), or the agent closed.
    NotificationReady(NotificationReady),
    /// A peer of this name connected (either way).
    Peer(WaitPeer),
    /// A segment of this name announced by the peer.
    Segment(WaitSegment),
    /// A connection being made on the engine's connect thread.
    Connect(Connecting),
}

/// What became ready.
enum Outcome {
    Transfer(Result<TransferStats>),
    NotificationReady,
    Peer(Result<Peer>),
    Segment(Result<SegmentInfo>),
}

/// A watch: what, its waker, and the asyncio futures (with their loops) waiting for it.
struct Entry {
    what: What,
    waker: Waker,
    waiters: Vec<(Py<PyAny>, Py<PyAny>)>,
}

enum Job {
    /// Watch `what` under `key` for the future `fut` of loop `lp` (joining the watch of the
    /// same key if there is one).
    Watch {
        key: u64,
        what: What,
        lp: Py<PyAny>,
        fut: Py<PyAny>,
    },
    /// Poll the watch again.
    Wake(u64),
    /// Drop the watch (its future was cancelled).
    Forget(u64),
}

/// The waker of one watch: queues its key for the hub, nothing else.
struct KeyWaker {
    key: u64,
    tx: Mutex<Sender<Job>>,
}

impl Wake for KeyWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let _ = tx.send(Job::Wake(self.key));
    }
}

/// The hub's queue, started on first use; `None` when its thread could not be started.
static HUB: OnceLock<Option<Mutex<Sender<Job>>>> = OnceLock::new();

/// A sender to the hub, whose thread starts on first use. A transfer awaited while a Python
/// thread blocks in `Transfer.wait` on the same transfer delays the hub by at most one wait
/// slice (100 ms): its poll needs the write lock.
fn hub() -> PyResult<Sender<Job>> {
    let hub = HUB.get_or_init(|| {
        let (tx, rx) = channel();
        let keep = tx.clone();
        match std::thread::Builder::new()
            .name("gdr-py-async".into())
            .spawn(move || run(keep, rx))
        {
            Ok(_) => Some(Mutex::new(tx)),
            Err(e) => {
                log::error!("gdr-py: cannot start the asyncio thread ({e})");
                None
            }
        }
    });
    match hub {
        Some(tx) => Ok(tx.lock().unwrap_or_else(|p| p.into_inner()).clone()),
        None => Err(pyo3::exceptions::PyRuntimeError::new_err(
            "gdr: the asyncio thread could not be started",
        )),
    }
}

/// The hub thread.
fn run(tx: Sender<Job>, rx: Receiver<Job>) {
    let mut watches: HashMap<u64, Entry> = HashMap::new();
    while let Ok(job) = rx.recv() {
        let key = match job {
            Job::Watch { key, what, lp, fut } => {
                if let Some(e) = watches.get_mut(&key) {
                    e.waiters.push((lp, fut));
                    continue;
                }
                let waker = Waker::from(Arc::new(KeyWaker {
                    key,
                    tx: Mutex::new(tx.clone()),
                }));
                watches.insert(
                    key,
                    Entry {
                        what,
                        waker,
                        waiters: vec![(lp, fut)],
                    },
                );
                key
            }
            Job::Wake(key) => key,
            Job::Forget(key) => {
                if let Some(Entry { what, waiters, .. }) = watches.remove(&key) {
                    // The Python objects under the GIL; the agent (maybe its last share, whose
                    // drop joins threads) without it.
                    let _ = crate::release::with_python(move |_| drop(waiters));
                    drop(what);
                }
                continue;
            }
        };
        let Some(entry) = watches.get_mut(&key) else {
            continue;
        };
        if let Some(outcome) = poll(entry) {
            if let Some(entry) = watches.remove(&key) {
                resolve(entry, outcome);
            }
        }
    }
}

/// Polls a watch once with its waker (registering it again).
fn poll(entry: &mut Entry) -> Option<Outcome> {
    let mut cx = Context::from_waker(&entry.waker);
    match &mut entry.what {
        What::Transfer(shared) => {
            let mut t = shared.t.write().unwrap_or_else(|p| p.into_inner());
            match Pin::new(&mut *t).poll(&mut cx) {
                Poll::Ready(r) => Some(Outcome::Transfer(r)),
                Poll::Pending => None,
            }
        }
        What::NotificationReady(ready) => match Pin::new(ready).poll(&mut cx) {
            Poll::Ready(()) => Some(Outcome::NotificationReady),
            Poll::Pending => None,
        },
        What::Peer(found) => match Pin::new(found).poll(&mut cx) {
            Poll::Ready(r) => Some(Outcome::Peer(r)),
            Poll::Pending => None,
        },
        What::Segment(found) => match Pin::new(found).poll(&mut cx) {
            Poll::Ready(r) => Some(Outcome::Segment(r)),
            Poll::Pending => None,
        },
        What::Connect(connecting) => match Pin::new(connecting).poll(&mut cx) {
            Poll::Ready(r) => Some(Outcome::Peer(r)),
            Poll::Pending => None,
        },
    }
}

/// Hands the outcome to every waiting future, on its loop's thread.
fn resolve(entry: Entry, outcome: Outcome) {
    let Entry { what, waiters, .. } = entry;
    let _ = crate::release::with_python(|py| {
        // ok: True (a result), False (an exception), None (the end of the stream).
        let (ok, value): (Option<bool>, PyObject) = match outcome {
            Outcome::Transfer(Ok(s)) => match crate::transfer::stats(py, &s) {
                Ok(d) => (Some(true), d.into_any().unbind()),
                Err(e) => (Some(false), e.into_value(py).into_any()),
            },
            Outcome::Transfer(Err(e)) => (Some(false), to_py(e).into_value(py).into_any()),
            Outcome::NotificationReady => (Some(true), py.None()),
            Outcome::Peer(Ok(peer)) => match Py::new(py, PyPeer { peer }) {
                Ok(p) => (Some(true), p.into_any()),
                Err(e) => (Some(false), e.into_value(py).into_any()),
            },
            Outcome::Segment(Ok(s)) => match Py::new(py, PyRemoteSegment::from(s)) {
                Ok(s) => (Some(true), s.into_any()),
                Err(e) => (Some(false), e.into_value(py).into_any()),
            },
            Outcome::Peer(Err(e)) | Outcome::Segment(Err(e)) => {
                (Some(false), to_py(e).into_value(py).into_any())
            }
        };
        let resolver = py.import("gdr._aio").and_then(|m| m.getattr("_resolve"));
        for (lp, fut) in waiters {
            let done = resolver
                .as_ref()
                .map_err(|e| e.clone_ref(py))
                .and_then(|r| lp.call_method1(py, "call_soon_threadsafe", (r, &fut, ok, &value)));
            // A closed loop refuses the call: nobody awaits the future any more (a notification
            // step took nothing: what it watched for is still queued).
            if let Err(e) = done {
                log::debug!("gdr-py: an asyncio future was not resolved: {e}");
            }
        }
    });
    // Outside the GIL: the last share of an agent ends it (joining its threads).
    drop(what);
}

/// A new future of the running loop, and the loop.
fn new_future(py: Python<'_>) -> PyResult<(Bound<'_, PyAny>, Bound<'_, PyAny>)> {
    let lp = py.import("asyncio")?.call_method0("get_running_loop")?;
    let fut = lp.call_method0("create_future")?;
    Ok((lp, fut))
}

/// The done callback of a transfer's future: a cancelled future cancels the transfer.
#[pyclass(module = "gdr._gdr", name = "_CancelTransfer", frozen)]
struct CancelTransfer {
    shared: Arc<SharedTransfer>,
}

#[pymethods]
impl CancelTransfer {
    fn __call__(&self, py: Python<'_>, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        if fut.call_method0("cancelled")?.is_truthy()? {
            let shared = &self.shared;
            py.allow_threads(|| shared.get().cancel());
        }
        Ok(())
    }
}

/// The done callback of the future of a notification, a peer, a segment or a connection: a
/// cancelled future drops the watch.
#[pyclass(module = "gdr._gdr", name = "_ForgetWatch", frozen)]
struct ForgetWatch {
    key: u64,
}

#[pymethods]
impl ForgetWatch {
    fn __call__(&self, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        if fut.call_method0("cancelled")?.is_truthy()? {
            if let Ok(tx) = hub() {
                let _ = tx.send(Job::Forget(self.key));
            }
        }
        Ok(())
    }
}

/// An asyncio future (of the running loop) of the transfer's outcome: its statistics, or its
/// failure raised. Cancelling the future cancels the transfer.
pub(crate) fn transfer_future<'py>(
    py: Python<'py>,
    shared: &Arc<SharedTransfer>,
) -> PyResult<Bound<'py, PyAny>> {
    let (lp, fut) = new_future(py)?;
    let cb = Py::new(
        py,
        CancelTransfer {
            shared: shared.clone(),
        },
    )?;
    fut.call_method1("add_done_callback", (cb,))?;
    hub()?
        .send(Job::Watch {
            key: shared.key,
            what: What::Transfer(shared.clone()),
            lp: lp.unbind(),
            fut: fut.clone().unbind(),
        })
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("gdr: the asyncio thread ended"))?;
    Ok(fut)
}

/// An asyncio future (of the running loop) that completes with `None` once a notification is
/// queued or the agent is shut down; it takes nothing. Cancelling it drops the watch.
pub(crate) fn notification_ready_future<'py>(
    py: Python<'py>,
    agent: &Agent,
) -> PyResult<Bound<'py, PyAny>> {
    watched_future(py, |_| {
        What::NotificationReady(agent.notification_ready_async())
    })
}

/// An asyncio future of the outcome of what `what` makes (once the running loop is known),
/// watched by the hub; cancelling it drops the watch.
fn watched_future<'py>(
    py: Python<'py>,
    what: impl FnOnce(Python<'_>) -> What,
) -> PyResult<Bound<'py, PyAny>> {
    // The loop first: without one nothing is started.
    let (lp, fut) = new_future(py)?;
    let what = what(py);
    let key = next_key();
    fut.call_method1("add_done_callback", (Py::new(py, ForgetWatch { key })?,))?;
    hub()?
        .send(Job::Watch {
            key,
            what,
            lp: lp.unbind(),
            fut: fut.clone().unbind(),
        })
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("gdr: the asyncio thread ended"))?;
    Ok(fut)
}

/// An asyncio future of the peer named `name`, once it is connected (either way); it raises
/// `AgentClosed` once the agent is shut down. Cancelling it drops the watch.
pub(crate) fn peer_future<'py>(
    py: Python<'py>,
    agent: &Arc<Agent>,
    name: String,
) -> PyResult<Bound<'py, PyAny>> {
    watched_future(py, |_| What::Peer(agent.wait_peer_async(&name)))
}

/// An asyncio future of the peer's segment named `name`, once announced; it raises `PeerLost`
/// when the connection is lost first. Cancelling it drops the watch.
pub(crate) fn segment_future<'py>(
    py: Python<'py>,
    peer: &Peer,
    name: String,
) -> PyResult<Bound<'py, PyAny>> {
    watched_future(py, |_| What::Segment(peer.wait_segment_named_async(&name)))
}

/// An asyncio future of a connection the engine makes on a thread of its own, which `start`
/// starts (the GIL released) once the running loop is known. Cancelling the future drops the
/// watch; the thread still ends within its timeout, and a peer it connected stays connected.
pub(crate) fn connect_future<'py>(
    py: Python<'py>,
    start: impl FnOnce() -> Connecting + Send,
) -> PyResult<Bound<'py, PyAny>> {
    watched_future(py, |py| What::Connect(py.allow_threads(start)))
}

/// Wakes the thread that waits for a future on its own ([`wait_connecting`]).
struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Waits on this thread for a connection the engine makes on its own thread: the GIL released,
/// in slices with Python's signal handlers run between them (Ctrl-C raises
/// `KeyboardInterrupt`; the connect thread then ends on its own within its timeout, and a
/// peer it connected stays connected). The engine's timeout bounds the wait.
pub(crate) fn wait_connecting(py: Python<'_>, mut connecting: Connecting) -> PyResult<Peer> {
    let found = wait_until(py, None, |slice: Duration| {
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        if let Poll::Ready(r) = Pin::new(&mut connecting).poll(&mut cx) {
            return Some(r);
        }
        // Woken (or the slice over): polled again by the next step.
        std::thread::park_timeout(slice);
        match Pin::new(&mut connecting).poll(&mut cx) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        }
    })?;
    match found {
        Some(r) => r.map_err(to_py),
        // No limit was given: only a result (or a signal, above) ends the loop.
        None => Err(pyo3::exceptions::PyRuntimeError::new_err(
            "gdr: a wait without a limit ended without a result",
        )),
    }
}
