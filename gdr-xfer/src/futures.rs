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
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures_core::Stream;

use crate::agent::{Agent, AgentShared};
use crate::error::{Error, Result};
use crate::notify::Notification;
use crate::peer::Peer;
use crate::wire::SegmentInfo;

impl Agent {
    /// The next notification, awaited ([`Agent::wait_notification`] without blocking a
    /// thread).
    ///
    /// # Errors
    /// [`Error::AgentClosed`] once the agent is shut down and every notification received
    /// before was taken.
    pub fn wait_notification_async(&self) -> WaitNotification<'_> {
        WaitNotification {
            shared: &self.shared,
        }
    }

    /// The notifications, as they arrive, as a [`Stream`]; it ends once the agent is shut
    /// down and every notification received before was taken.
    pub fn notifications(&self) -> Notifications<'_> {
        Notifications {
            shared: &self.shared,
        }
    }

    /// Waits until a peer with this name is connected ([`Agent::wait_peer`] without blocking
    /// a thread).
    ///
    /// # Errors
    /// [`Error::AgentClosed`] once the agent is shut down.
    pub fn wait_peer_async<'a>(&'a self, name: &'a str) -> WaitPeer<'a> {
        WaitPeer { agent: self, name }
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
            crate::agent::connect_shared(&shared, &addr, timeout)
        })
    }
}

impl Peer {
    /// Waits until the peer has announced a segment with this name
    /// ([`Peer::wait_segment_named`] without blocking a thread).
    ///
    /// # Errors
    /// [`Error::PeerLost`] when the connection is lost meanwhile.
    pub fn wait_segment_named_async<'a>(&'a self, name: &'a str) -> WaitSegment<'a> {
        WaitSegment { peer: self, name }
    }
}

/// Polls `ready` with the waker registered in between (see [`crate::wakers`]).
fn poll_ready<T>(
    cx: &Context<'_>,
    wakers: &crate::wakers::Wakers,
    mut ready: impl FnMut() -> Option<T>,
) -> Poll<T> {
    if let Some(v) = ready() {
        return Poll::Ready(v);
    }
    wakers.register(cx.waker());
    match ready() {
        Some(v) => Poll::Ready(v),
        None => Poll::Pending,
    }
}

/// A notification, or the end once the agent is closed and nothing is left.
fn next_notification(shared: &AgentShared) -> Option<Option<Notification>> {
    if let Some(n) = shared.pop_notification() {
        return Some(Some(n));
    }
    if shared.closing.load(Ordering::SeqCst) {
        return Some(None);
    }
    None
}

/// The future of [`Agent::wait_notification_async`].
#[must_use = "futures do nothing unless awaited"]
pub struct WaitNotification<'a> {
    shared: &'a Arc<AgentShared>,
}

impl Future for WaitNotification<'_> {
    type Output = Result<Notification>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let shared = self.shared;
        poll_ready(cx, &shared.notification_wakers, || {
            next_notification(shared)
        })
        .map(|n| n.ok_or(Error::AgentClosed))
    }
}

/// The stream of [`Agent::notifications`].
#[must_use = "streams do nothing unless polled"]
pub struct Notifications<'a> {
    shared: &'a Arc<AgentShared>,
}

impl Stream for Notifications<'_> {
    type Item = Notification;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Notification>> {
        let shared = self.shared;
        poll_ready(cx, &shared.notification_wakers, || {
            next_notification(shared)
        })
    }
}

/// The future of [`Agent::wait_peer_async`].
#[must_use = "futures do nothing unless awaited"]
pub struct WaitPeer<'a> {
    agent: &'a Agent,
    name: &'a str,
}

impl Future for WaitPeer<'_> {
    type Output = Result<Peer>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (agent, name) = (self.agent, self.name);
        poll_ready(cx, &agent.shared.peer_wakers, || {
            if let Some(p) = agent.peer(name) {
                return Some(Ok(p));
            }
            agent.shared.check_open().err().map(Err)
        })
    }
}

/// The future of [`Peer::wait_segment_named_async`].
#[must_use = "futures do nothing unless awaited"]
pub struct WaitSegment<'a> {
    peer: &'a Peer,
    name: &'a str,
}

impl Future for WaitSegment<'_> {
    type Output = Result<SegmentInfo>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (peer, name) = (self.peer, self.name);
        poll_ready(cx, &peer.conn.table_wakers, || {
            if let Some(s) = peer.segment_named(name) {
                return Some(Ok(s));
            }
            peer.check_connected().err().map(Err)
        })
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
