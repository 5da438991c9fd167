//! Where each completion goes: the async layer's bookkeeping of requests, the futures waiting
//! for them and their fates. It has no lock and does no I/O: the async queue holds it under one
//! mutex, every transition is one method call under that mutex, and every waker a transition
//! must wake is handed back (in [`Wakers`]) to be woken once the mutex is released. So the
//! host tests below can run every interleaving of these transitions with counting wakers.
//!
//! Three rules keep a completion from reaching the wrong future or none:
//! - Routes are keyed by provenance ([`Key`]): a request the async layer posted carries a mark in
//!   the queue pair's in-flight table (`inflight::OWNED`) and an id unique in the process; a
//!   request posted by hand is keyed by its queue pair, queue and id. No id a hand-posted
//!   request carries can reach an awaited request's future, and no completion of an earlier
//!   async queue can reach a later one's.
//! - A request that ends without a completion (reset, destroy) or whose queue pair or queue
//!   failed (a device event) ends its route with a typed [`Ending`], and its future is woken.
//! - Every task awaiting an unclaimed completion is registered on its own; each arrival wakes
//!   them all, so none can be overwritten or stranded.

use std::collections::hash_map::{Entry, HashMap};
use std::collections::VecDeque;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::task::{Poll, Waker};

use crate::cq::Completion;
use crate::device::AsyncEvent;
use crate::error::{Error, Hint, Result};
use crate::qp::{DropCause, WorkQueue};

/// What a completion is routed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Key {
    /// A request the async layer posted, by the id it gave it (unique in the process).
    Own(u64),
    /// A request posted by hand: its queue pair, queue and the application's id.
    Hand {
        qp_num: u32,
        queue: WorkQueue,
        wr_id: u64,
    },
}

impl Key {
    /// The route of completion `c`.
    pub(super) fn of(c: &Completion) -> Key {
        if c.owned {
            Key::Own(c.wr_id)
        } else {
            Key::Hand {
                qp_num: c.qp_num,
                queue: c.queue(),
                wr_id: c.wr_id,
            }
        }
    }

    /// The request's `wr_id`.
    pub(super) fn wr_id(&self) -> u64 {
        match *self {
            Key::Own(id) | Key::Hand { wr_id: id, .. } => id,
        }
    }
}

/// One word per key: the id, with a hand-posted request's queue pair and queue folded in
/// (equal keys hash equally; an own id that collides with a hand-posted key is told apart by
/// `Eq`).
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(match *self {
            Key::Own(id) => id,
            Key::Hand {
                qp_num,
                queue,
                wr_id,
            } => wr_id ^ (u64::from(qp_num) << 32 | (queue == WorkQueue::Recv) as u64),
        })
    }
}

/// The routes' hasher: a multiply and a rotation per key (SipHash was a fifth of an awaited
/// write's instructions). The keys are ids the async layer counts out or the application chose;
/// nothing a peer sends.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing; the rotation brings the well-mixed high bits down to where
        // hashbrown takes its bucket index.
        self.0 = (self.0 ^ n)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(26);
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Why a request's future resolves with an error instead of the request's completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// The queue pair was reset or destroyed: no completion will ever come.
    Dropped(DropCause),
    /// The queue pair failed (a device event): a flush completion may still come.
    Event(AsyncEvent),
}

/// A route's state.
enum Fate {
    /// A future waits, with the waker of its last poll (none before its first).
    Waiting(Option<Waker>),
    /// The completion arrived; the future has not been polled since.
    Arrived(Completion),
    /// The future resolves with `ending`'s error; `reap` while the request's completion (a
    /// flush) is still to come, to be absorbed.
    Ended { ending: Ending, reap: bool },
    /// The future was dropped first: the completion is absorbed when it comes.
    Abandoned,
}

struct Route {
    qp_num: u32,
    queue: WorkQueue,
    fate: Fate,
}

/// Why the whole async queue stopped: every waiter gets this error.
pub(super) enum Stop {
    /// The driver failed (polling, arming or watching the completion queue).
    Driver(Error),
    /// A device event made the queue's completions unreliable: the queue overran
    /// (`CqError`), or the device failed (`DeviceFatal`).
    Event(AsyncEvent),
}

impl Stop {
    fn error(&self) -> Error {
        match self {
            Stop::Driver(e) => replicate(e),
            Stop::Event(event) => Error::DeviceEvent {
                event: *event,
                hint: Hint::new(event.hint().unwrap_or(
                    "the completion queue can no longer be trusted: recreate it and its queue pairs",
                )),
            },
        }
    }
}

/// Wakers collected under the lock, to be woken after it is released.
#[derive(Default)]
pub(super) struct Wakers(Vec<Waker>);

impl Wakers {
    pub(super) fn push(&mut self, w: Waker) {
        self.0.push(w);
    }

    /// Wakes every one (call with no lock held).
    pub(super) fn wake_all(self) {
        for w in self.0 {
            w.wake();
        }
    }

    /// Hands them to a caller that wakes them later.
    pub(super) fn into_vec(self) -> Vec<Waker> {
        self.0
    }
}

/// The bookkeeping of one async completion queue.
#[derive(Default)]
pub(super) struct Routes {
    routes: HashMap<Key, Route, BuildHasherDefault<KeyHasher>>,
    /// Completions of requests posted by hand that no future claims (yet), in arrival order.
    /// Each with whether [`Routes::add_hand`] may still match it: not once its queue pair was
    /// reset or destroyed (a future asked for by id afterwards means a request of the new
    /// incarnation, or of a new queue pair with the reused number).
    unclaimed: VecDeque<(Completion, bool)>,
    /// Tasks awaiting an unclaimed completion, each under its own token. Registered only while
    /// `unclaimed` is empty; an arrival wakes (and unregisters) them all.
    waiters: Vec<(u64, Waker)>,
    last_token: u64,
    /// Set once the queue stopped; the first cause stays.
    stopped: Option<Stop>,
}

impl Routes {
    /// The error every waiter gets once the queue stopped.
    pub(super) fn stopped(&self) -> Option<Error> {
        self.stopped.as_ref().map(Stop::error)
    }

    /// Registers the route of a request the async layer is about to post as `id` on `queue` of
    /// QP `qp_num` (before the post: the completion may arrive before the post returns).
    ///
    /// # Errors
    /// The stop error once the queue stopped: then nothing may be posted.
    pub(super) fn add_own(&mut self, id: u64, qp_num: u32, queue: WorkQueue) -> Result<()> {
        if self.stopped.is_some() {
            return Err(self.stopped().expect("checked"));
        }
        self.routes.insert(
            Key::Own(id),
            Route {
                qp_num,
                queue,
                fate: Fate::Waiting(None),
            },
        );
        Ok(())
    }

    /// Registers a future for the completion of a request posted by hand; it is ready at once
    /// when that completion already arrived unclaimed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when another future already waits for it; the stop error.
    pub(super) fn add_hand(&mut self, qp_num: u32, queue: WorkQueue, wr_id: u64) -> Result<Key> {
        if let Some(e) = self.stopped() {
            return Err(e);
        }
        let key = Key::Hand {
            qp_num,
            queue,
            wr_id,
        };
        if self.routes.contains_key(&key) {
            return Err(Error::invalid(
                format!(
                    "another future already waits for wr_id {wr_id} on the {queue} queue of QP {qp_num:#x}"
                ),
                "await each completion once (keep the first Completed), or post with distinct ids",
            ));
        }
        let fate = match self
            .unclaimed
            .iter()
            .position(|(c, claimable)| *claimable && Key::of(c) == key)
        {
            Some(i) => Fate::Arrived(self.unclaimed.remove(i).expect("index found above").0),
            None => Fate::Waiting(None),
        };
        self.routes.insert(
            key,
            Route {
                qp_num,
                queue,
                fate,
            },
        );
        Ok(key)
    }

    /// The post of `key` failed: `posted` when the request may still run (a failed doorbell;
    /// its completion is then absorbed), otherwise it never will.
    pub(super) fn withdraw(&mut self, key: Key, posted: bool) {
        if posted {
            self.forsake(key);
        } else {
            self.routes.remove(&key);
        }
    }

    /// Hands one completion to whoever waits for it.
    pub(super) fn deliver(&mut self, c: Completion, wake: &mut Wakers) {
        if let Entry::Occupied(mut e) = self.routes.entry(Key::of(&c)) {
            match &mut e.get_mut().fate {
                fate @ Fate::Waiting(_) => {
                    if let Fate::Waiting(Some(w)) = std::mem::replace(fate, Fate::Arrived(c)) {
                        wake.push(w);
                    }
                    return;
                }
                Fate::Abandoned => {
                    e.remove();
                    return;
                }
                Fate::Ended { reap, .. } if *reap => {
                    *reap = false;
                    return;
                }
                // A second completion under one key (only a hand-posted id can repeat: the
                // application posted two requests with it): unclaimed, below.
                Fate::Arrived(_) | Fate::Ended { .. } => {}
            }
        }
        if c.owned {
            // A request of the async layer whose future is gone with its queue (an earlier
            // async queue on this completion queue): nobody may have it.
            log::debug!(
                "completion of an earlier async queue's request {:#x} (QP {:#x}) absorbed",
                c.wr_id,
                c.qp_num
            );
            return;
        }
        self.unclaimed.push_back((c, true));
        for (_, w) in self.waiters.drain(..) {
            wake.push(w);
        }
    }

    /// Whether `key`'s future still waits (and the queue runs): its poll reaps the queue first.
    pub(super) fn is_waiting(&self, key: &Key) -> bool {
        self.stopped.is_none()
            && matches!(
                self.routes.get(key),
                Some(Route {
                    fate: Fate::Waiting(_),
                    ..
                })
            )
    }

    /// A request future's poll: its completion, its ending's error, the stop error, or pending
    /// (with `waker` kept).
    pub(super) fn poll_request(&mut self, key: Key, waker: &Waker) -> Poll<Result<Completion>> {
        let stopped = self.stopped.is_some();
        let Entry::Occupied(mut e) = self.routes.entry(key) else {
            return Poll::Ready(Err(already_returned(key)));
        };
        let r = e.get_mut();
        match &mut r.fate {
            Fate::Arrived(c) => {
                let c = *c;
                e.remove();
                Poll::Ready(c.result().copied())
            }
            Fate::Ended { ending, reap } => {
                let err = ending_error(*ending, key, r.qp_num, r.queue);
                if *reap {
                    r.fate = Fate::Abandoned;
                } else {
                    e.remove();
                }
                Poll::Ready(Err(err))
            }
            Fate::Waiting(_) if stopped => {
                // Its completion may still come (the driver reaps it if it still can).
                r.fate = Fate::Abandoned;
                Poll::Ready(Err(self.stopped().expect("checked")))
            }
            Fate::Waiting(w) => {
                match w {
                    Some(old) if old.will_wake(waker) => {}
                    _ => *w = Some(waker.clone()),
                }
                Poll::Pending
            }
            Fate::Abandoned => Poll::Ready(Err(already_returned(key))),
        }
    }

    /// A request future dropped before it resolved. Returns whether the driver must now reap
    /// the request's completion (to absorb it, and so release its memory).
    pub(super) fn forsake(&mut self, key: Key) -> bool {
        let Some(r) = self.routes.get_mut(&key) else {
            return false;
        };
        match r.fate {
            Fate::Waiting(_) | Fate::Ended { reap: true, .. } => {
                r.fate = Fate::Abandoned;
                true
            }
            Fate::Arrived(_) | Fate::Ended { reap: false, .. } => {
                self.routes.remove(&key);
                false
            }
            Fate::Abandoned => false,
        }
    }

    /// A `next_unclaimed` poll: the oldest unclaimed completion, the stop error, or pending with
    /// `waker` registered under the task's own `token` (assigned at its first wait).
    pub(super) fn poll_unclaimed(
        &mut self,
        token: &mut Option<u64>,
        waker: &Waker,
    ) -> Poll<Result<Completion>> {
        if let Some((c, _)) = self.unclaimed.pop_front() {
            self.leave(token);
            return Poll::Ready(Ok(c));
        }
        if let Some(e) = self.stopped() {
            self.leave(token);
            return Poll::Ready(Err(e));
        }
        let t = *token.get_or_insert_with(|| {
            self.last_token += 1;
            self.last_token
        });
        match self.waiters.iter_mut().find(|(k, _)| *k == t) {
            Some((_, w)) if w.will_wake(waker) => {}
            Some((_, w)) => *w = waker.clone(),
            None => self.waiters.push((t, waker.clone())),
        }
        Poll::Pending
    }

    /// A `next_unclaimed` wait that ended or was dropped: its registration goes.
    pub(super) fn leave(&mut self, token: &mut Option<u64>) {
        if let Some(t) = token.take() {
            self.waiters.retain(|(k, _)| *k != t);
        }
    }

    /// A queue pair's fatal, request or access error: every future still waiting for a request
    /// of QP `qp_num` resolves with `event`'s error at once. Returns how many.
    pub(super) fn fail_qp(&mut self, qp_num: u32, event: AsyncEvent, wake: &mut Wakers) -> usize {
        let mut failed = 0;
        for (key, r) in self.routes.iter_mut() {
            if r.qp_num != qp_num {
                continue;
            }
            if let Fate::Waiting(w) = &mut r.fate {
                if let Some(w) = w.take() {
                    wake.push(w);
                }
                // The flush of an awaited request of ours is still to be reaped and absorbed;
                // one of a request posted by hand (if it was posted at all) goes unclaimed.
                r.fate = Fate::Ended {
                    ending: Ending::Event(event),
                    reap: matches!(key, Key::Own(_)),
                };
                failed += 1;
            }
        }
        failed
    }

    /// The requests of QP `qp_num`'s `queue` that `in_flight` lists (application id, posted by
    /// the async layer) ended without completions for `cause`; after a destroy, nothing of
    /// that queue can complete any more, so every route of it ends. Its unclaimed completions
    /// stay for `next_unclaimed`, but no future asked for by id will match them any more.
    pub(super) fn dropped(
        &mut self,
        qp_num: u32,
        queue: WorkQueue,
        cause: DropCause,
        in_flight: &mut dyn Iterator<Item = (u64, bool)>,
        wake: &mut Wakers,
    ) {
        let ending = Ending::Dropped(cause);
        for (wr_id, owned) in in_flight {
            let key = if owned {
                Key::Own(wr_id)
            } else {
                Key::Hand {
                    qp_num,
                    queue,
                    wr_id,
                }
            };
            self.end(key, ending, wake);
        }
        for (c, claimable) in self.unclaimed.iter_mut() {
            if c.qp_num == qp_num && c.queue() == queue {
                *claimable = false;
            }
        }
        if cause == DropCause::Destroyed {
            let keys: Vec<Key> = self
                .routes
                .iter()
                .filter(|(_, r)| r.qp_num == qp_num && r.queue == queue)
                .map(|(k, _)| *k)
                .collect();
            for key in keys {
                self.end(key, ending, wake);
            }
        }
    }

    /// `key`'s request will never complete.
    fn end(&mut self, key: Key, ending: Ending, wake: &mut Wakers) {
        let Some(r) = self.routes.get_mut(&key) else {
            return;
        };
        match &mut r.fate {
            Fate::Waiting(w) => {
                if let Some(w) = w.take() {
                    wake.push(w);
                }
                r.fate = Fate::Ended {
                    ending,
                    reap: false,
                };
            }
            // Its future already has its error; no flush will come now.
            Fate::Ended { reap, .. } => *reap = false,
            Fate::Abandoned => {
                self.routes.remove(&key);
            }
            // The completion came first: the future gets it.
            Fate::Arrived(_) => {}
        }
    }

    /// Stops the queue: every waiter, now and later, gets `stop`'s error (the first cause
    /// stays). Returns how many futures were waiting.
    pub(super) fn stop(&mut self, stop: Stop, wake: &mut Wakers) -> usize {
        if self.stopped.is_none() {
            self.stopped = Some(stop);
        }
        let mut waiting = 0;
        for r in self.routes.values_mut() {
            if let Fate::Waiting(w) = &mut r.fate {
                waiting += 1;
                if let Some(w) = w.take() {
                    wake.push(w);
                }
            }
        }
        waiting += self.waiters.len();
        for (_, w) in self.waiters.drain(..) {
            wake.push(w);
        }
        waiting
    }

    /// Whether the driver must watch the queue: a future sleeps until its completion arrives,
    /// a task awaits an unclaimed one, or a request whose future is gone is still in flight
    /// (its completion must be reaped so the queue pair releases the memory and the slot).
    pub(super) fn needs_driver(&self) -> bool {
        !self.waiters.is_empty()
            || self.routes.values().any(|r| {
                matches!(
                    r.fate,
                    Fate::Waiting(Some(_)) | Fate::Abandoned | Fate::Ended { reap: true, .. }
                )
            })
    }

    /// How many routes are kept (for tests: none may outlive its request and its future).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.routes.len()
    }
}

fn already_returned(key: Key) -> Error {
    Error::invalid(
        format!(
            "the outcome of wr_id {:#x} was already returned",
            key.wr_id()
        ),
        "await a Completed once",
    )
}

/// The error a future whose request ended with `ending` resolves with.
fn ending_error(ending: Ending, key: Key, qp_num: u32, queue: WorkQueue) -> Error {
    match ending {
        Ending::Dropped(cause) => Error::RequestDropped {
            wr_id: key.wr_id(),
            queue,
            qp_num,
            cause,
            hint: Hint::new(match cause {
                DropCause::Reset => "whether it ran is unknown: connect() the queue pair again and post it again if it must run",
                DropCause::Destroyed => "whether it ran is unknown: keep a queue pair until its awaited requests resolve",
            }),
        },
        Ending::Event(event) => Error::DeviceEvent {
            event,
            hint: Hint::new(
                "the request's queue pair failed before its completion: reset() it and connect again",
            ),
        },
    }
}

/// A copy of `e` for each waiter of a stopped queue (`Error` holds an `io::Error`, which is not
/// `Clone`): the same variant, call, values and errno.
fn replicate(e: &Error) -> Error {
    fn io(e: &std::io::Error) -> std::io::Error {
        match e.raw_os_error() {
            Some(errno) => std::io::Error::from_raw_os_error(errno),
            None => std::io::Error::new(e.kind(), e.to_string()),
        }
    }
    match e {
        Error::Verbs {
            call,
            args,
            source,
            hint,
        } => Error::Verbs {
            call,
            args: args.clone(),
            source: io(source),
            hint: hint.clone(),
        },
        Error::Io { what, source } => Error::Io {
            what: what.clone(),
            source: io(source),
        },
        other => Error::invalid(
            format!("the async completion queue's driver stopped: {other}"),
            "recreate the completion queue and its queue pairs",
        ),
    }
}

#[cfg(test)]
mod tests;
