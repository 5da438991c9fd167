//! What the async forms of the blocking calls wait on: a list of wakers, woken wherever the
//! matching condition variable is notified (a notification delivered, a peer connected or
//! gone, a segment table changed, the agent closed).
//!
//! A future checks its condition, registers its waker, then checks again before it returns
//! `Pending`: a change made between the first check and the registration is seen by the second,
//! and one made after the registration wakes it.

use std::sync::Mutex;
use std::task::Waker;

/// Wakers to wake on the next change.
#[derive(Default)]
pub(crate) struct Wakers(Mutex<Vec<Waker>>);

impl Wakers {
    /// Wakes `waker` on the next change (once; a waker that would wake the same task is kept
    /// once).
    pub(crate) fn register(&self, waker: &Waker) {
        let mut list = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !list.iter().any(|w| w.will_wake(waker)) {
            list.push(waker.clone());
        }
    }

    /// Wakes every registered waker (outside the lock).
    pub(crate) fn wake_all(&self) {
        let list = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        for w in list {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_task_registered_many_times_is_woken_once_and_each_wake_needs_a_new_registration() {
        let w = Wakers::default();
        let (a, b) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        let (wa, wb) = (Waker::from(a.clone()), Waker::from(b.clone()));
        for _ in 0..100 {
            w.register(&wa);
        }
        w.register(&wb);
        w.wake_all();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
        // Woken wakers are forgotten: the next change wakes only who registered again.
        w.register(&wb);
        w.wake_all();
        w.wake_all();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 2);
    }
}
