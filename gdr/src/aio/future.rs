//! The futures: [`Completed`], one request's outcome, and the wait for an unclaimed completion.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use super::routes::Key;
use super::{Inner, Shared};
use crate::cq::Completion;
use crate::error::Result;

/// The outcome of one posted request. Resolves to the completion on success, and otherwise to
/// a typed error: [`Error::Completion`](crate::Error::Completion) (with its status) when the
/// request failed, [`Error::RequestDropped`](crate::Error::RequestDropped) when its queue pair
/// was reset or destroyed while it was in flight (the device reports nothing for it then),
/// [`Error::DeviceEvent`](crate::Error::DeviceEvent) when a device event passed to
/// [`AsyncCompletionQueue::handle_event`](super::AsyncCompletionQueue::handle_event) failed its
/// queue pair or queue. Dropping it is always safe: the request's memory stays registered until
/// the completion is reaped (or the queue pair reset or destroyed), and the completion is then
/// absorbed.
#[must_use = "a completion future does nothing unless awaited (dropping it is safe)"]
pub struct Completed {
    pub(super) inner: Arc<Inner>,
    pub(super) key: Key,
    pub(super) done: bool,
}

impl std::fmt::Debug for Completed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completed")
            .field("wr_id", &self.key.wr_id())
            .finish()
    }
}

impl Completed {
    /// The `wr_id` the request was posted with.
    pub fn wr_id(&self) -> u64 {
        self.key.wr_id()
    }
}

impl Future for Completed {
    type Output = Result<Completion>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let key = self.key;
        let shared: &Shared = &self.inner;
        if shared.lock().is_waiting(&key) {
            // Reap the queue here first: a completion that is already there is handed out
            // without waking the driver (the cost of a poll, as in the blocking API).
            shared.deliver_now();
        }
        let outcome = shared.lock().poll_request(key, cx.waker());
        match outcome {
            Poll::Pending => {
                shared.wanted.notify_one();
                Poll::Pending
            }
            Poll::Ready(r) => {
                self.done = true;
                Poll::Ready(r)
            }
        }
    }
}

impl Drop for Completed {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.inner.lock().forsake(self.key) {
            // Its completion must still be reaped (the driver absorbs it).
            self.inner.wanted.notify_one();
        }
    }
}

/// A task's wait for the next unclaimed completion, registered under a token of its own (so a
/// second waiter cannot take its place) and unregistered when dropped.
pub(super) struct Unclaimed<'a> {
    pub(super) shared: &'a Shared,
    pub(super) token: Option<u64>,
}

impl Future for Unclaimed<'_> {
    type Output = Result<Completion>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if this.shared.lock().stopped().is_none() {
            this.shared.deliver_now();
        }
        let outcome = this
            .shared
            .lock()
            .poll_unclaimed(&mut this.token, cx.waker());
        if outcome.is_pending() {
            this.shared.wanted.notify_one();
        }
        outcome
    }
}

impl Drop for Unclaimed<'_> {
    fn drop(&mut self) {
        if self.token.is_some() {
            self.shared.lock().leave(&mut self.token);
        }
    }
}
