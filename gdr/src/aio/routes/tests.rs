//! The bookkeeping on its own, with wakers that count. Each transition runs under the async
//! queue's one mutex, so the interleavings of concurrent tasks are exactly the orders of these
//! calls: the `every_interleaving_*` tests run all of them (a model check by enumeration, the
//! same state space loom would explore here, without its dependency).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Poll, Wake, Waker};

use super::*;
use crate::device::{AsyncEventKind, EventSubject};
use crate::WcStatus;

/// A waker that counts its wakes.
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn waker() -> (Waker, Arc<Count>) {
    let c = Arc::new(Count(AtomicUsize::new(0)));
    (Waker::from(c.clone()), c)
}

fn wakes(c: &Count) -> usize {
    c.0.load(Ordering::SeqCst)
}

fn own(wr_id: u64, qp_num: u32) -> Completion {
    Completion {
        wr_id,
        qp_num,
        owned: true,
        ..Default::default()
    }
}

fn hand(wr_id: u64, qp_num: u32) -> Completion {
    Completion {
        wr_id,
        qp_num,
        ..Default::default()
    }
}

fn deliver(r: &mut Routes, c: Completion) {
    let mut w = Wakers::default();
    r.deliver(c, &mut w);
    w.wake_all();
}

fn qp_event(kind: AsyncEventKind, qp_num: u32) -> AsyncEvent {
    AsyncEvent {
        kind,
        subject: EventSubject::Qp { qp_num },
    }
}

#[test]
fn completions_are_routed_by_provenance_never_by_id_alone() {
    let mut r = Routes::default();
    let (w, count) = waker();
    const ID: u64 = 1 << 63;
    r.add_own(ID, 7, WorkQueue::Send).unwrap();
    assert!(r.poll_request(Key::Own(ID), &w).is_pending());
    // Finding 1: a request posted by hand, with the same id, on another queue pair (or this
    // one): unclaimed, the awaited request untouched.
    deliver(&mut r, hand(ID, 8));
    deliver(&mut r, hand(ID, 7));
    assert_eq!(wakes(&count), 0);
    assert!(r.poll_request(Key::Own(ID), &w).is_pending());
    // A completion of an earlier async queue's request (owned, no route): absorbed, nobody's.
    deliver(&mut r, own(ID + 1, 7));
    assert_eq!(r.unclaimed.len(), 2, "the two hand-posted ones only");
    deliver(&mut r, own(ID, 7));
    assert_eq!(wakes(&count), 1);
    match r.poll_request(Key::Own(ID), &w) {
        Poll::Ready(Ok(c)) => assert_eq!((c.wr_id, c.qp_num, c.owned), (ID, 7, true)),
        other => panic!("{other:?}"),
    }
    // A hand future is keyed by its queue pair and queue as well as its id.
    let key = r.add_hand(9, WorkQueue::Send, 5).unwrap();
    assert!(r.poll_request(key, &w).is_pending());
    let mut recv = hand(5, 9);
    recv.is_recv = true;
    deliver(&mut r, hand(5, 10));
    deliver(&mut r, recv);
    assert!(r.poll_request(key, &w).is_pending());
    deliver(&mut r, hand(5, 9));
    assert!(matches!(r.poll_request(key, &w), Poll::Ready(Ok(c)) if c.qp_num == 9));
    // One arrived earlier is claimed at once; a second future for one request is refused.
    let key = r.add_hand(10, WorkQueue::Send, 5).unwrap();
    assert!(matches!(
        r.add_hand(10, WorkQueue::Send, 5),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(r.poll_request(key, &w), Poll::Ready(Ok(c)) if c.qp_num == 10));
    assert_eq!(r.len(), 0);
    let left: Vec<(u64, u32, bool)> = r
        .unclaimed
        .iter()
        .map(|(c, _)| (c.wr_id, c.qp_num, c.is_recv))
        .collect();
    assert_eq!(left, [(ID, 8, false), (ID, 7, false), (5, 9, true)]);
}

#[test]
fn reset_ends_exactly_the_requests_it_dropped() {
    let mut r = Routes::default();
    let (w, count) = waker();
    for id in [1, 2, 3, 4] {
        r.add_own(id, 7, WorkQueue::Send).unwrap();
    }
    // 5: registered before the reset, posted after it (in the new incarnation): not listed.
    r.add_own(5, 7, WorkQueue::Send).unwrap();
    let hand_key = r.add_hand(7, WorkQueue::Send, 42).unwrap();
    for k in [Key::Own(1), hand_key] {
        assert!(r.poll_request(k, &w).is_pending());
    }
    assert!(r.forsake(Key::Own(2)), "abandoned while in flight");
    deliver(&mut r, own(3, 7)); // arrived before the reset
    r.add_own(6, 8, WorkQueue::Send).unwrap(); // another queue pair's
    let mut woken = Wakers::default();
    let mut listed = [(1, true), (2, true), (4, true), (42, false)].into_iter();
    r.dropped(
        7,
        WorkQueue::Send,
        DropCause::Reset,
        &mut listed,
        &mut woken,
    );
    woken.wake_all();
    assert_eq!(wakes(&count), 2, "the two sleeping futures");
    for (key, id) in [(Key::Own(1), 1), (Key::Own(4), 4), (hand_key, 42)] {
        match r.poll_request(key, &w) {
            Poll::Ready(Err(Error::RequestDropped {
                wr_id,
                qp_num: 7,
                queue: WorkQueue::Send,
                cause: DropCause::Reset,
                ..
            })) => assert_eq!(wr_id, id),
            other => panic!("{key:?}: {other:?}"),
        }
    }
    assert!(matches!(
        r.poll_request(Key::Own(3), &w),
        Poll::Ready(Ok(_))
    ));
    assert!(r.poll_request(Key::Own(5), &w).is_pending());
    assert!(r.poll_request(Key::Own(6), &w).is_pending());
    assert_eq!(r.len(), 2, "5 and 6 wait on; the abandoned 2 is gone");
    r.forsake(Key::Own(5));
    r.forsake(Key::Own(6));
    deliver(&mut r, own(5, 7));
    deliver(&mut r, own(6, 8));
    assert_eq!(r.len(), 0);
    assert!(!r.needs_driver(), "nothing left to reap");
}

/// Of finding 1's class: a completion of a hand-posted request that went unclaimed before its
/// queue pair was reset (or destroyed, and its number reused) is never matched to a future asked
/// for by the same (QP, queue, id) afterwards: that future means the new incarnation's request.
#[test]
fn an_earlier_incarnations_unclaimed_completion_is_never_claimed_by_id() {
    for cause in [DropCause::Reset, DropCause::Destroyed] {
        let mut r = Routes::default();
        let (w, _) = waker();
        deliver(&mut r, hand(5, 7));
        let mut recv = hand(5, 7);
        recv.is_recv = true;
        deliver(&mut r, recv);
        let mut woken = Wakers::default();
        r.dropped(
            7,
            WorkQueue::Send,
            cause,
            &mut std::iter::empty(),
            &mut woken,
        );
        let key = r.add_hand(7, WorkQueue::Send, 5).unwrap();
        assert!(r.poll_request(key, &w).is_pending(), "{cause}");
        assert!(
            matches!(r.add_hand(7, WorkQueue::Recv, 5), Ok(k) if r.poll_request(k, &w).is_ready()),
            "the receive queue was not {cause}"
        );
        deliver(&mut r, hand(5, 7)); // the new incarnation's
        assert!(matches!(r.poll_request(key, &w), Poll::Ready(Ok(_))));
        let mut t = None;
        assert!(
            matches!(r.poll_unclaimed(&mut t, &w), Poll::Ready(Ok(c)) if c.qp_num == 7 && !c.is_recv),
            "the old completion is still handed out unclaimed"
        );
    }
}

#[test]
fn destroy_ends_every_route_of_its_queue() {
    let mut r = Routes::default();
    let (w, _) = waker();
    r.add_own(1, 7, WorkQueue::Send).unwrap();
    r.add_own(2, 7, WorkQueue::Recv).unwrap();
    r.add_own(3, 8, WorkQueue::Send).unwrap();
    // Awaited but never posted (or posted unsignalled): nothing lists it, yet nothing of a
    // destroyed queue pair can complete, and its number may be reused.
    let unposted = r.add_hand(7, WorkQueue::Send, 9).unwrap();
    let mut woken = Wakers::default();
    r.dropped(
        7,
        WorkQueue::Send,
        DropCause::Destroyed,
        &mut std::iter::empty(),
        &mut woken,
    );
    for key in [Key::Own(1), unposted] {
        assert!(matches!(
            r.poll_request(key, &w),
            Poll::Ready(Err(Error::RequestDropped {
                cause: DropCause::Destroyed,
                ..
            }))
        ));
    }
    assert!(r.poll_request(Key::Own(2), &w).is_pending(), "other queue");
    assert!(r.poll_request(Key::Own(3), &w).is_pending(), "other QP");
}

#[test]
fn a_queue_pair_failure_fails_its_waiters_only_and_absorbs_their_flushes() {
    let mut r = Routes::default();
    let (w, count) = waker();
    for (id, qp) in [(1, 7), (2, 7), (3, 8)] {
        r.add_own(id, qp, WorkQueue::Send).unwrap();
        assert!(r.poll_request(Key::Own(id), &w).is_pending());
    }
    let hand_key = r.add_hand(7, WorkQueue::Send, 50).unwrap();
    let event = qp_event(AsyncEventKind::QpFatal, 7);
    let mut woken = Wakers::default();
    assert_eq!(r.fail_qp(7, event, &mut woken), 3);
    woken.wake_all();
    assert_eq!(wakes(&count), 2);
    assert!(r.poll_request(Key::Own(3), &w).is_pending(), "another QP");
    assert!(r.needs_driver(), "the flushes still have to be reaped");
    // Request 1's flush arrives before its future looks: absorbed, not unclaimed.
    deliver(&mut r, own(1, 7));
    for key in [Key::Own(1), Key::Own(2), hand_key] {
        assert!(matches!(
            r.poll_request(key, &w),
            Poll::Ready(Err(Error::DeviceEvent { event: e, .. })) if e == event
        ));
    }
    // Request 2's flush after its future resolved: absorbed; the hand request's: unclaimed.
    deliver(&mut r, own(2, 7));
    deliver(&mut r, hand(50, 7));
    assert_eq!(r.unclaimed.len(), 1);
    r.forsake(Key::Own(3));
    deliver(&mut r, own(3, 8));
    assert_eq!(r.len(), 0);
    assert!(!r.needs_driver());
}

#[test]
fn a_stopped_queue_fails_every_waiter_and_refuses_posts() {
    let mut r = Routes::default();
    let (w, count) = waker();
    r.add_own(1, 7, WorkQueue::Send).unwrap();
    assert!(r.poll_request(Key::Own(1), &w).is_pending());
    deliver(&mut r, hand(9, 7));
    let (mut t1, mut t2) = (None, None);
    assert!(r.poll_unclaimed(&mut t1, &w).is_ready(), "the one there");
    assert!(r.poll_unclaimed(&mut t2, &w).is_pending());
    let event = AsyncEvent {
        kind: AsyncEventKind::DeviceFatal,
        subject: EventSubject::Device,
    };
    let mut woken = Wakers::default();
    assert_eq!(r.stop(Stop::Event(event), &mut woken), 2);
    woken.wake_all();
    assert_eq!(wakes(&count), 2);
    let is_event = |p: Poll<Result<Completion>>| matches!(p, Poll::Ready(Err(Error::DeviceEvent { event: e, .. })) if e == event);
    assert!(is_event(r.poll_request(Key::Own(1), &w)));
    assert!(is_event(r.poll_unclaimed(&mut t2, &w)));
    assert!(matches!(
        r.add_own(2, 7, WorkQueue::Send),
        Err(Error::DeviceEvent { .. })
    ));
    // A driver failure after the event does not replace the first cause; a copy of a driver's
    // error keeps its variant and errno.
    r.stop(
        Stop::Driver(Error::verbs("ibv_poll_cq", "device=rxe0", libc::EIO, "x")),
        &mut Wakers::default(),
    );
    assert!(matches!(r.stopped(), Some(Error::DeviceEvent { .. })));
    let copy = replicate(&Error::verbs("ibv_poll_cq", "device=rxe0", libc::EIO, "x"));
    assert!(matches!(
        copy,
        Error::Verbs {
            call: "ibv_poll_cq",
            ..
        }
    ));
    assert_eq!(copy.errno(), Some(libc::EIO));
    // The abandoned request's completion is still absorbed when it comes.
    deliver(&mut r, own(1, 7));
    assert_eq!(r.len(), 0);
}

#[test]
fn a_failed_completion_is_the_futures_typed_error() {
    let mut r = Routes::default();
    let (w, _) = waker();
    r.add_own(1, 7, WorkQueue::Send).unwrap();
    let mut c = own(1, 7);
    c.status = WcStatus::WrFlush;
    deliver(&mut r, c);
    assert!(matches!(
        r.poll_request(Key::Own(1), &w),
        Poll::Ready(Err(Error::Completion {
            status: WcStatus::WrFlush,
            wr_id: 1,
            ..
        }))
    ));
    assert!(matches!(
        r.poll_request(Key::Own(1), &w),
        Poll::Ready(Err(Error::InvalidArgument { .. }))
    ));
}

// ---------------------------------------------------------------------------------------------
// Every interleaving.

/// Runs every sequence of the actions `enabled` offers, replaying each prefix from scratch;
/// `check` runs at every settled point: where no action that `progress` names is enabled (the
/// others, such as a cancellation or a reset, may happen or not). Returns how many points it
/// checked.
fn every_interleaving<S, A: Copy + std::fmt::Debug>(
    new: &dyn Fn() -> S,
    enabled: &dyn Fn(&S) -> Vec<A>,
    progress: &dyn Fn(A) -> bool,
    apply: &dyn Fn(&mut S, A),
    check: &dyn Fn(&S, &[A]),
) -> usize {
    struct Model<'a, S, A> {
        new: &'a dyn Fn() -> S,
        enabled: &'a dyn Fn(&S) -> Vec<A>,
        progress: &'a dyn Fn(A) -> bool,
        apply: &'a dyn Fn(&mut S, A),
        check: &'a dyn Fn(&S, &[A]),
    }
    fn go<S, A: Copy + std::fmt::Debug>(m: &Model<'_, S, A>, path: &mut Vec<A>) -> usize {
        let mut s = (m.new)();
        for &a in path.iter() {
            (m.apply)(&mut s, a);
        }
        let next = (m.enabled)(&s);
        let mut checked = 0;
        if !next.iter().any(|&a| (m.progress)(a)) {
            (m.check)(&s, path);
            checked += 1;
        }
        for a in next {
            path.push(a);
            checked += go(m, path);
            path.pop();
        }
        checked
    }
    let m = Model {
        new,
        enabled,
        progress,
        apply,
        check,
    };
    go(&m, &mut Vec::new())
}

/// A task awaiting `next_unclaimed` in the model.
struct Waiter {
    token: Option<u64>,
    waker: Waker,
    count: Arc<Count>,
    /// Wakes already answered by a poll.
    seen: usize,
    polled: bool,
    got: Option<u64>,
    dropped: bool,
}

struct UnclaimedModel {
    r: Routes,
    waiters: Vec<Waiter>,
    delivered: u64,
    drops_left: usize,
}

#[derive(Debug, Clone, Copy)]
enum U {
    /// Waiter `i` is polled (its first poll, or after a wake).
    Poll(usize),
    /// The next completion arrives.
    Arrive,
    /// Waiter `i` is dropped (cancelled), woken or not.
    Drop(usize),
}

/// Finding 3 of issue 25 and its class: any number of tasks awaiting unclaimed completions,
/// any of them cancelled at any point, completions arriving at any time: when everything has
/// settled, no completion is held back from a task still waiting, none is given twice.
#[test]
fn every_interleaving_of_unclaimed_waiters_loses_no_wakeup() {
    for (n_waiters, n_completions, drops) in [(2, 2, 0), (2, 2, 1), (3, 2, 1), (3, 3, 1), (2, 1, 1)]
    {
        let ends = every_interleaving::<UnclaimedModel, U>(
            &|| UnclaimedModel {
                r: Routes::default(),
                waiters: (0..n_waiters)
                    .map(|_| {
                        let (waker, count) = waker();
                        Waiter {
                            token: None,
                            waker,
                            count,
                            seen: 0,
                            polled: false,
                            got: None,
                            dropped: false,
                        }
                    })
                    .collect(),
                delivered: 0,
                drops_left: drops,
            },
            &|m| {
                let mut v = Vec::new();
                for (i, w) in m.waiters.iter().enumerate() {
                    let live = !w.dropped && w.got.is_none();
                    if live && (!w.polled || wakes(&w.count) > w.seen) {
                        v.push(U::Poll(i));
                    }
                    if live && m.drops_left > 0 {
                        v.push(U::Drop(i));
                    }
                }
                if m.delivered < n_completions {
                    v.push(U::Arrive);
                }
                v
            },
            &|a| !matches!(a, U::Drop(_)),
            &|m, a| match a {
                U::Poll(i) => {
                    let w = &mut m.waiters[i];
                    w.polled = true;
                    w.seen = wakes(&w.count);
                    if let Poll::Ready(r) = m.r.poll_unclaimed(&mut w.token, &w.waker) {
                        w.got = Some(r.unwrap().wr_id);
                    }
                }
                U::Arrive => {
                    let c = hand(m.delivered, 1);
                    m.delivered += 1;
                    deliver(&mut m.r, c);
                }
                U::Drop(i) => {
                    m.drops_left -= 1;
                    let w = &mut m.waiters[i];
                    w.dropped = true;
                    m.r.leave(&mut w.token);
                }
            },
            &|m, path| {
                let mut got: Vec<u64> = m.waiters.iter().filter_map(|w| w.got).collect();
                let taken = got.len();
                got.sort_unstable();
                got.dedup();
                assert_eq!(got.len(), taken, "a completion given twice: {path:?}");
                assert_eq!(
                    taken + m.r.unclaimed.len(),
                    n_completions as usize,
                    "{path:?}"
                );
                let stranded = m.waiters.iter().any(|w| !w.dropped && w.got.is_none());
                assert!(
                    !stranded || m.r.unclaimed.is_empty(),
                    "lost wakeup: a task waits while a completion sits unclaimed: {path:?}"
                );
                assert!(
                    !stranded || m.r.needs_driver(),
                    "a task waits but the driver would idle: {path:?}"
                );
                if !stranded {
                    assert!(m.r.waiters.is_empty(), "a registration outlived its task");
                }
            },
        );
        assert!(ends > 10, "{ends}");
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum R {
    Poll,
    Drop,
    Complete,
    Reset,
    Destroy,
    FailQp,
    Stop,
}

struct RequestModel {
    r: Routes,
    key: Key,
    owned: bool,
    waker: Waker,
    count: Arc<Count>,
    seen: usize,
    polled: bool,
    result: Option<Result<Completion>>,
    dropped: bool,
    in_flight: bool,
    history: Vec<R>,
}

/// Findings 1 and 2 of issue 25 and their class: one awaited request (posted by the async
/// layer or by hand), its future polled, woken and dropped at any point, against its
/// completion, a reset, a destroy, its queue pair's fatal event and the queue's stop, in every
/// order: the future resolves with its own completion or the typed error of what ended it,
/// never waits with its fate decided, and no route outlives the request and its future.
#[test]
fn every_interleaving_of_a_request_gives_its_future_a_fate_and_leaks_nothing() {
    const QP: u32 = 7;
    for owned in [true, false] {
        let ends = every_interleaving::<RequestModel, R>(
            &|| {
                let mut r = Routes::default();
                let key = if owned {
                    r.add_own(1 << 63, QP, WorkQueue::Send).unwrap();
                    Key::Own(1 << 63)
                } else {
                    r.add_hand(QP, WorkQueue::Send, 5).unwrap()
                };
                let (waker, count) = waker();
                RequestModel {
                    r,
                    key,
                    owned,
                    waker,
                    count,
                    seen: 0,
                    polled: false,
                    result: None,
                    dropped: false,
                    in_flight: true,
                    history: Vec::new(),
                }
            },
            &|m| {
                let mut v = Vec::new();
                let live = !m.dropped && m.result.is_none();
                if live && (!m.polled || wakes(&m.count) > m.seen) {
                    v.push(R::Poll);
                }
                if live {
                    v.push(R::Drop);
                }
                if m.in_flight {
                    v.push(R::Complete);
                }
                for once in [R::Reset, R::Destroy, R::FailQp, R::Stop] {
                    if !m.history.contains(&once) && !m.history.contains(&R::Destroy) {
                        v.push(once);
                    }
                }
                v
            },
            &|a| matches!(a, R::Poll | R::Complete),
            &|m, a| {
                m.history.push(a);
                let mut woken = Wakers::default();
                match a {
                    R::Poll => {
                        m.polled = true;
                        m.seen = wakes(&m.count);
                        if let Poll::Ready(r) = m.r.poll_request(m.key, &m.waker) {
                            m.result = Some(r);
                        }
                    }
                    R::Drop => {
                        m.dropped = true;
                        m.r.forsake(m.key);
                    }
                    R::Complete => {
                        m.in_flight = false;
                        let c = if m.owned {
                            own(1 << 63, QP)
                        } else {
                            hand(5, QP)
                        };
                        m.r.deliver(c, &mut woken);
                    }
                    R::Reset | R::Destroy => {
                        let cause = if a == R::Reset {
                            DropCause::Reset
                        } else {
                            DropCause::Destroyed
                        };
                        let listed: Vec<(u64, bool)> = if m.in_flight {
                            vec![(m.key.wr_id(), m.owned)]
                        } else {
                            vec![]
                        };
                        m.in_flight = false;
                        m.r.dropped(
                            QP,
                            WorkQueue::Send,
                            cause,
                            &mut listed.into_iter(),
                            &mut woken,
                        );
                    }
                    R::FailQp => {
                        m.r.fail_qp(QP, qp_event(AsyncEventKind::QpFatal, QP), &mut woken);
                    }
                    R::Stop => {
                        let event = AsyncEvent {
                            kind: AsyncEventKind::DeviceFatal,
                            subject: EventSubject::Device,
                        };
                        m.r.stop(Stop::Event(event), &mut woken);
                    }
                }
                woken.wake_all();
            },
            &|m, path| {
                // Settled: the request is no longer in flight, so its fate is decided.
                assert!(
                    m.dropped || m.result.is_some(),
                    "the future waits with its fate decided: {path:?}"
                );
                let first = |x: R| path.iter().position(|&a| a == x);
                let before = |x: R, y: R| match (first(x), first(y)) {
                    (Some(a), Some(b)) => a < b,
                    (Some(_), None) => true,
                    _ => false,
                };
                match &m.result {
                    Some(Ok(c)) => {
                        assert!(first(R::Complete).is_some(), "{path:?}");
                        assert_eq!((c.wr_id, c.qp_num), (m.key.wr_id(), QP), "{path:?}");
                    }
                    Some(Err(Error::RequestDropped { wr_id, cause, .. })) => {
                        assert_eq!(*wr_id, m.key.wr_id());
                        let by = if *cause == DropCause::Reset {
                            R::Reset
                        } else {
                            R::Destroy
                        };
                        assert!(
                            before(by, R::Complete) || !owned && before(by, R::Poll),
                            "{path:?}"
                        );
                    }
                    Some(Err(Error::DeviceEvent { .. })) => {
                        assert!(first(R::FailQp).is_some() || first(R::Stop).is_some());
                    }
                    Some(Err(e)) => panic!("{e} after {path:?}"),
                    None => {}
                }
                assert_eq!(m.r.len(), 0, "a route outlived its request: {path:?}");
                assert!(
                    !m.r.needs_driver(),
                    "the driver would watch for nothing: {path:?}"
                );
            },
        );
        assert!(ends > 100, "{ends}");
    }
}
