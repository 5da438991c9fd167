//! The async forms of the blocking calls: futures that any executor can await (they need no
//! runtime, like [`crate::Transfer`]), and a [`Stream`] of notifications.
//!
//! | blocking | async |
//! |---|---|
//! | [`Agent::wait_notification`] | [`Agent::wait_notification_async`], [`Agent::notifications`] (a stream) |
//! | [`Agent::wait_peer`] | [`Agent::wait_peer_async`] |
//! | [`Peer::wait_segment_named`] | [`Peer::wait_segment_named_async`] |
//! | [`Agent::connect`] | [`Agent::connect_async`] |
//! | `Agent::connect_named` (feature `etcd`) | `Agent::connect_named_async` |
//!
//! The waits have no timeout of their own: wrap them in your runtime's timer
//! (`tokio::time::timeout`); dropping one stops it. Connecting runs the TCP handshake (blocking
//! socket calls) on a thread of its own and completes the future from there; it keeps the
//! agent's (or the call's) timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures_core::Stream;

use crate::agent::Agent;
use crate::error::{Error, Result};
use crate::notify::Notification;
use crate::peer::Peer;
use crate::shared::AgentShared;
use crate::wakers::Waiter;
use crate::wire::SegmentInfo;

impl Agent {
    /// The next notification, awaited ([`Agent::wait_notification`] without blocking a
    /// thread). The future owns what it needs (it is `'static`, `Send` and `Unpin`): it may
    /// outlive this borrow, and be kept across polls by a long-lived poller. Dropping it
    /// removes its waker.
    ///
    /// # Errors
    /// [`Error::AgentClosed`] once the agent is shut down and every notification received
    /// (or put back with [`Agent::requeue_notification`]) before was taken.
    pub fn wait_notification_async(&self) -> WaitNotification {
        WaitNotification {
            shared: self.shared.clone(),
            waiter: Waiter::default(),
        }
    }

    /// Completes once a wait for a notification would end at once: a notification is queued,
    /// or the agent is shut down. It takes nothing: the caller takes the notification itself
    /// ([`Agent::wait_notification`] with a zero timeout), so a caller cancelled between the
    /// wake-up and the take loses nothing (how asyncio's `Queue.get` stays exact; the Python
    /// binding's `notifications()` is built on it). Several may complete for one notification:
    /// one takes it, the others find the queue empty and wait again. `'static`, `Send`,
    /// `Unpin`; dropping it removes its waker.
    pub fn notification_ready_async(&self) -> NotificationReady {
        NotificationReady {
            shared: self.shared.clone(),
            waiter: Waiter::default(),
        }
    }

    /// The notifications, as they arrive, as a [`Stream`]; it ends once the agent is shut
    /// down and every notification received before was taken. The stream owns what it needs
    /// (`'static`, `Send`, `Unpin`); dropping it removes its waker.
    pub fn notifications(&self) -> Notifications {
        Notifications {
            shared: self.shared.clone(),
            waiter: Waiter::default(),
        }
    }

    /// Waits until a peer with this name is connected ([`Agent::wait_peer`] without blocking
    /// a thread). The future owns a copy of the name (`'static`, `Send`, `Unpin`); dropping
    /// it removes its waker.
    ///
    /// # Errors
    /// [`Error::AgentClosed`] once the agent is shut down.
    pub fn wait_peer_async(&self, name: &str) -> WaitPeer {
        WaitPeer {
            shared: self.shared.clone(),
            name: name.to_string(),
            waiter: Waiter::default(),
        }
    }

    /// [`Agent::connect`], awaited: the handshake runs on a thread of its own.
    ///
    /// # Errors
    /// As [`Agent::connect`].
    pub fn connect_async(&self, addr: &str) -> Connecting {
        let shared = self.shared.clone();
        let addr = addr.to_string();
        Connecting::spawn(&self.shared.config.name, move || {
            let timeout = shared.config.connect_timeout;
            crate::control::connect(&shared, &addr, timeout)
        })
    }
}

impl Peer {
    /// Waits until the peer has announced a segment with this name
    /// ([`Peer::wait_segment_named`] without blocking a thread). The future owns a handle of
    /// the peer and a copy of the name (`'static`, `Send`, `Unpin`); dropping it removes its
    /// waker.
    ///
    /// # Errors
    /// [`Error::PeerLost`] when the connection is lost meanwhile; [`Error::AgentClosed`] once
    /// this agent is shut down.
    pub fn wait_segment_named_async(&self, name: &str) -> WaitSegment {
        WaitSegment {
            peer: self.clone(),
            name: name.to_string(),
            waiter: Waiter::default(),
        }
    }
}

/// A notification, or the end once the agent is closed and nothing is left.
fn next_notification(shared: &AgentShared) -> Option<Option<Notification>> {
    shared.notes.next()
}

/// The future of [`Agent::wait_notification_async`]: `'static`, `Send` and `Unpin`. Its
/// waker is registered while it is pending and removed when it completes or is dropped.
#[must_use = "futures do nothing unless awaited"]
pub struct WaitNotification {
    shared: Arc<AgentShared>,
    waiter: Waiter,
}

impl std::fmt::Debug for WaitNotification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitNotification")
            .field("agent", &self.shared.config.name)
            .finish()
    }
}

impl Future for WaitNotification {
    type Output = Result<Notification>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let shared = &this.shared;
        this.waiter
            .poll(cx, &shared.notes.wakers, || next_notification(shared))
            .map(|n| n.ok_or(Error::AgentClosed))
    }
}

impl Drop for WaitNotification {
    fn drop(&mut self) {
        self.waiter.cancel(&self.shared.notes.wakers);
    }
}

/// The future of [`Agent::notification_ready_async`]: `'static`, `Send` and `Unpin`. Its
/// waker is registered while it is pending and removed when it completes or is dropped.
#[must_use = "futures do nothing unless awaited"]
pub struct NotificationReady {
    shared: Arc<AgentShared>,
    waiter: Waiter,
}

impl std::fmt::Debug for NotificationReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotificationReady")
            .field("agent", &self.shared.config.name)
            .finish()
    }
}

impl Future for NotificationReady {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let shared = &this.shared;
        this.waiter.poll(cx, &shared.notes.wakers, || {
            shared.notes.ready().then_some(())
        })
    }
}

impl Drop for NotificationReady {
    fn drop(&mut self) {
        self.waiter.cancel(&self.shared.notes.wakers);
    }
}

/// The stream of [`Agent::notifications`]: `'static`, `Send` and `Unpin`. Its waker is
/// registered while it is pending and removed when it yields or is dropped.
#[must_use = "streams do nothing unless polled"]
pub struct Notifications {
    shared: Arc<AgentShared>,
    waiter: Waiter,
}

impl std::fmt::Debug for Notifications {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifications")
            .field("agent", &self.shared.config.name)
            .finish()
    }
}

impl Stream for Notifications {
    type Item = Notification;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Notification>> {
        let this = self.get_mut();
        let shared = &this.shared;
        this.waiter
            .poll(cx, &shared.notes.wakers, || next_notification(shared))
    }
}

impl Drop for Notifications {
    fn drop(&mut self) {
        self.waiter.cancel(&self.shared.notes.wakers);
    }
}

/// The future of [`Agent::wait_peer_async`]: `'static`, `Send` and `Unpin`. Its waker is
/// registered while it is pending and removed when it completes or is dropped.
#[must_use = "futures do nothing unless awaited"]
pub struct WaitPeer {
    shared: Arc<AgentShared>,
    name: String,
    waiter: Waiter,
}

impl std::fmt::Debug for WaitPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitPeer")
            .field("agent", &self.shared.config.name)
            .field("peer", &self.name)
            .finish()
    }
}

impl Future for WaitPeer {
    type Output = Result<Peer>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (shared, name) = (&this.shared, this.name.as_str());
        this.waiter.poll(cx, &shared.peer_wakers, || {
            // Closed first: after shutdown the answer is AgentClosed, as for every call.
            if let Err(e) = shared.check_open() {
                return Some(Err(e));
            }
            Peer::ready(shared, name).map(Ok)
        })
    }
}

impl Drop for WaitPeer {
    fn drop(&mut self) {
        self.waiter.cancel(&self.shared.peer_wakers);
    }
}

/// The future of [`Peer::wait_segment_named_async`]: `'static`, `Send` and `Unpin`. Its waker
/// is registered while it is pending and removed when it completes or is dropped.
#[must_use = "futures do nothing unless awaited"]
pub struct WaitSegment {
    peer: Peer,
    name: String,
    waiter: Waiter,
}

impl std::fmt::Debug for WaitSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitSegment")
            .field("peer", &self.peer.name())
            .field("segment", &self.name)
            .finish()
    }
}

impl Future for WaitSegment {
    type Output = Result<SegmentInfo>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (peer, name) = (&this.peer, this.name.as_str());
        this.waiter.poll(cx, &peer.conn.table_wakers, || {
            if let Err(e) = peer.check_agent() {
                return Some(Err(e));
            }
            if let Some(s) = peer.segment_named(name) {
                return Some(Ok(s));
            }
            peer.check_connected().err().map(Err)
        })
    }
}

impl Drop for WaitSegment {
    fn drop(&mut self) {
        self.waiter.cancel(&self.peer.conn.table_wakers);
    }
}

/// How many async waits hold a waker in an agent's lists ([`Agent::waker_counts`]): one per
/// pending future or stream at most; a dropped one holds none.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WakerCounts {
    /// Waits for a notification ([`WaitNotification`], [`Notifications`]).
    pub notifications: usize,
    /// Waits for a peer ([`WaitPeer`]).
    pub peers: usize,
}

impl Agent {
    /// The wakers registered now by pending async waits (for tests: each pending future holds
    /// at most one, a dropped one none).
    #[doc(hidden)]
    pub fn waker_counts(&self) -> WakerCounts {
        WakerCounts {
            notifications: self.shared.notes.wakers.len(),
            peers: self.shared.peer_wakers.len(),
        }
    }
}

impl Peer {
    /// The wakers registered now by pending [`WaitSegment`]s on this peer (for tests).
    #[doc(hidden)]
    pub fn waker_count(&self) -> usize {
        self.conn.table_wakers.len()
    }
}

struct ConnectCell {
    result: Option<Result<Peer>>,
    waker: Option<Waker>,
}

/// The future of [`Agent::connect_async`] (and `Agent::connect_named_async`): the connection
/// is made on a thread of its own. Dropping the future does not stop it; a peer connected
/// meanwhile stays connected ([`Agent::peer`] finds it).
#[must_use = "futures do nothing unless awaited"]
pub struct Connecting {
    cell: Arc<Mutex<ConnectCell>>,
}

impl Connecting {
    pub(crate) fn spawn(agent: &str, f: impl FnOnce() -> Result<Peer> + Send + 'static) -> Self {
        let cell = Arc::new(Mutex::new(ConnectCell {
            result: None,
            waker: None,
        }));
        let done = cell.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("xfer-connect-{agent}"))
            .spawn(move || {
                let r = f();
                let waker = {
                    let mut c = done.lock().unwrap_or_else(|p| p.into_inner());
                    c.result = Some(r);
                    c.waker.take()
                };
                if let Some(w) = waker {
                    w.wake();
                }
            });
        if let Err(e) = spawned {
            cell.lock().unwrap_or_else(|p| p.into_inner()).result =
                Some(Err(Error::io("starting a connect thread", e)));
        }
        Connecting { cell }
    }
}

impl Future for Connecting {
    type Output = Result<Peer>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut c = self.cell.lock().unwrap_or_else(|p| p.into_inner());
        match c.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                c.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
