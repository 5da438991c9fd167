//! What the async forms of the blocking calls wait on: the wakers of the futures waiting for a
//! condition, woken wherever the matching condition variable is notified (a notification
//! delivered, a peer connected or gone, a segment table changed, the agent closed).
//!
//! A future checks its condition, registers its waker, then checks again before it returns
//! `Pending`: a change made between the first check and the registration is seen by the second,
//! and one made after the registration wakes it.
//!
//! Each future holds at most one registration, named by a [`Key`] it keeps across polls: a
//! poll again replaces the waker in its slot (no new entry), and dropping the future removes
//! it ([`Wakers::deregister`]). A change wakes and removes every registration; a key's
//! generation is never given again, so a key whose registration was woken (or removed) names
//! nothing, and removing it later does nothing, whatever registered since in its slot. So the
//! list holds at most one waker per live, pending future.

use std::sync::Mutex;
use std::task::Waker;

/// The registration of one future ([`Wakers::register`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key {
    index: usize,
    gen: u64,
}

#[derive(Default)]
struct Slots {
    /// `(generation, waker)` per slot; `None` when free.
    slots: Vec<Option<(u64, Waker)>>,
    /// Free slots.
    free: Vec<usize>,
    /// Registrations held.
    len: usize,
    /// The next generation: unique over the list's life.
    next_gen: u64,
}

/// Wakers to wake on the next change.
#[derive(Default)]
pub(crate) struct Wakers(Mutex<Slots>);

impl Wakers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes `waker` on the next change (once). `key` is the caller's registration: when it
    /// still names one, its waker is replaced (kept when it would wake the same task); else a
    /// new registration is made and `key` names it.
    pub(crate) fn register(&self, key: &mut Option<Key>, waker: &Waker) {
        let mut s = self.lock();
        if let Some(k) = *key {
            if let Some(Some((gen, w))) = s.slots.get_mut(k.index) {
                if *gen == k.gen {
                    if w.will_wake(waker) {
                        return;
                    }
                    // The old waker is dropped outside the lock.
                    let old = std::mem::replace(w, waker.clone());
                    drop(s);
                    drop(old);
                    return;
                }
            }
        }
        let gen = s.next_gen;
        s.next_gen = s.next_gen.wrapping_add(1);
        let index = match s.free.pop() {
            Some(i) => i,
            None => {
                s.slots.push(None);
                s.slots.len() - 1
            }
        };
        s.slots[index] = Some((gen, waker.clone()));
        s.len += 1;
        *key = Some(Key { index, gen });
    }

    /// Removes the registration `key` names, if it still does (not woken since), and clears
    /// `key`.
    pub(crate) fn deregister(&self, key: &mut Option<Key>) {
        let Some(k) = key.take() else {
            return;
        };
        let mut s = self.lock();
        let current = matches!(s.slots.get(k.index), Some(Some((gen, _))) if *gen == k.gen);
        if current {
            let gone = s.slots[k.index].take();
            s.free.push(k.index);
            s.len -= 1;
            // The waker is dropped outside the lock.
            drop(s);
            drop(gone);
        }
    }

    /// Wakes every registered waker (outside the lock) and removes them.
    pub(crate) fn wake_all(&self) {
        let woken: Vec<Waker> = {
            let mut s = self.lock();
            if s.len == 0 {
                return;
            }
            s.free.clear();
            s.len = 0;
            let slots = std::mem::take(&mut s.slots);
            slots.into_iter().flatten().map(|(_, w)| w).collect()
        };
        for w in woken {
            w.wake();
        }
    }

    /// The registrations held (one per pending future at most).
    pub(crate) fn len(&self) -> usize {
        self.lock().len
    }
}

/// One future's side of a [`Wakers`] list: its registration, kept across polls, removed when
/// it completes or is dropped (the owner calls [`Waiter::cancel`] in its `Drop`).
#[derive(Debug, Default)]
pub(crate) struct Waiter {
    key: Option<Key>,
}

impl Waiter {
    /// Polls `ready` with the waker registered in between: ready at once, or registered and
    /// checked again (see the module documentation). A ready result removes the registration.
    pub(crate) fn poll<T>(
        &mut self,
        cx: &std::task::Context<'_>,
        wakers: &Wakers,
        mut ready: impl FnMut() -> Option<T>,
    ) -> std::task::Poll<T> {
        if let Some(v) = ready() {
            wakers.deregister(&mut self.key);
            return std::task::Poll::Ready(v);
        }
        wakers.register(&mut self.key, cx.waker());
        match ready() {
            Some(v) => {
                wakers.deregister(&mut self.key);
                std::task::Poll::Ready(v)
            }
            None => std::task::Poll::Pending,
        }
    }

    /// Removes the registration, if any (the future is dropped).
    pub(crate) fn cancel(&mut self, wakers: &Wakers) {
        wakers.deregister(&mut self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake};

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    #[test]
    fn a_key_polled_many_times_is_registered_once_and_each_wake_needs_a_new_registration() {
        let w = Wakers::default();
        let ((a, wa), (b, wb)) = (counter(), counter());
        let (mut ka, mut kb) = (None, None);
        for _ in 0..100 {
            w.register(&mut ka, &wa);
        }
        w.register(&mut kb, &wb);
        assert_eq!(w.len(), 2);
        w.wake_all();
        assert_eq!(w.len(), 0);
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
        // Woken wakers are forgotten: the next change wakes only who registered again.
        w.register(&mut kb, &wb);
        w.wake_all();
        w.wake_all();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_poll_with_another_waker_replaces_it_in_place() {
        let w = Wakers::default();
        let ((a, wa), (b, wb)) = (counter(), counter());
        let mut k = None;
        w.register(&mut k, &wa);
        w.register(&mut k, &wb);
        assert_eq!(w.len(), 1);
        w.wake_all();
        assert_eq!(
            a.0.load(Ordering::SeqCst),
            0,
            "the replaced waker is not woken"
        );
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_stale_key_removes_nothing_even_when_its_slot_was_given_again() {
        let w = Wakers::default();
        let ((_, wa), (b, wb)) = (counter(), counter());
        let mut old = None;
        w.register(&mut old, &wa);
        let stale = old;
        w.deregister(&mut old);
        assert_eq!(old, None);
        // The slot is reused by another future.
        let mut new = None;
        w.register(&mut new, &wb);
        assert_eq!(new.map(|k| k.index), stale.map(|k| k.index));
        let mut stale = stale;
        w.deregister(&mut stale);
        assert_eq!(w.len(), 1, "the stale key left the new registration alone");
        // After a wake_all, the woken key is stale too.
        let mut woken = new;
        w.wake_all();
        let mut c = None;
        w.register(&mut c, &wb);
        w.deregister(&mut woken);
        assert_eq!(w.len(), 1);
        w.wake_all();
        assert_eq!(b.0.load(Ordering::SeqCst), 2);
    }

    /// A future as the crate's are made: a [`Waiter`] on a shared list, cancelled on drop.
    struct Wait {
        wakers: Arc<Wakers>,
        ready: Arc<AtomicUsize>,
        waiter: Waiter,
    }

    impl Future for Wait {
        type Output = ();
        fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let this = &mut *self;
            let ready = this.ready.clone();
            this.waiter.poll(cx, &this.wakers, || {
                (ready.load(Ordering::SeqCst) > 0).then_some(())
            })
        }
    }

    impl Drop for Wait {
        fn drop(&mut self) {
            self.waiter.cancel(&self.wakers);
        }
    }

    #[test]
    fn ten_thousand_dropped_futures_leave_no_registration() {
        let wakers = Arc::new(Wakers::default());
        let ready = Arc::new(AtomicUsize::new(0));
        let (count, waker) = counter();
        let mut cx = Context::from_waker(&waker);
        for i in 0..10_000 {
            let mut f = Box::pin(Wait {
                wakers: wakers.clone(),
                ready: ready.clone(),
                waiter: Waiter::default(),
            });
            for _ in 0..3 {
                assert!(f.as_mut().poll(&mut cx).is_pending());
            }
            assert_eq!(wakers.len(), 1, "one registration per pending future");
            if i % 100 == 0 {
                // Woken then dropped: the drop finds nothing to remove.
                wakers.wake_all();
            }
            drop(f);
            assert_eq!(wakers.len(), 0, "future {i} left its waker behind");
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 100);
        // Many pending at once, then all dropped.
        let mut fs: Vec<_> = (0..10_000)
            .map(|_| {
                Box::pin(Wait {
                    wakers: wakers.clone(),
                    ready: ready.clone(),
                    waiter: Waiter::default(),
                })
            })
            .collect();
        for f in &mut fs {
            assert!(f.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(wakers.len(), 10_000);
        drop(fs);
        assert_eq!(wakers.len(), 0);
        // A ready future removes its registration as it completes.
        let mut f = Box::pin(Wait {
            wakers: wakers.clone(),
            ready: ready.clone(),
            waiter: Waiter::default(),
        });
        assert!(f.as_mut().poll(&mut cx).is_pending());
        ready.store(1, Ordering::SeqCst);
        assert!(f.as_mut().poll(&mut cx).is_ready());
        assert_eq!(wakers.len(), 0);
    }
}
