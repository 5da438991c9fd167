//! Notifications: small messages bound to a transfer, delivered to the target only after every
//! byte of the transfer landed there.
//!
//! The initiator sends a transfer's notification as an RDMA SEND once the completions of all of
//! the transfer's writes (or reads) are in, on every queue pair that carried them: an RC
//! completion at the initiator means the peer's NIC acknowledged the data, so when the SEND
//! arrives the data is in the target's memory (for GPU memory, call
//! [`Segment::read`](crate::Segment::read), which flushes first). Each peer connection has a
//! pool of receive slots on each rail's first queue pair. A slot's message is copied out when
//! it arrives, and the slot posted again at once while the agent keeps fewer than
//! `notify_queue` notifications without their slot (across all connections, [`NoteQueue`]);
//! past that, the slot is posted again only once the application took the notification
//! ([`Agent::take_notifications`](crate::Agent::take_notifications),
//! [`Agent::wait_notification`](crate::Agent::wait_notification)). So what peers can make us
//! hold is bounded by the queue and the slots (`notify_slots` per rail and connection); a
//! sender faster than the application waits in the NIC's receiver-not-ready retries, without
//! limit of time (its transfers' deadlines still apply), and nothing is lost.
//!
//! Every message starts with a header, `flags u8 | id u64` ([`gdr_xfer_proto::Header`]): the
//! id numbers the sender's notifications on the connection, so a notification sent again after
//! its rail failed (the first copy may have arrived before the failure) is delivered once; the
//! probe flag marks the message that re-admits a rail, never delivered.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::wr::RecvRequest;
use gdr_xfer_proto::{Header, Receipt};

use crate::error::{Error, Result};
use crate::wakers::Wakers;

/// A notification a peer sent with a transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sending agent's name.
    pub peer: String,
    /// The bytes it attached.
    pub data: Vec<u8>,
}

/// A notification in the agent's queue: delivered by a peer (with its receive slot's receipt)
/// or put back by the application ([`Agent::requeue_notification`](crate::Agent::requeue_notification)).
pub(crate) struct Delivered {
    pub(crate) notification: Notification,
    /// The connection it arrived on; `None` for a notification put back.
    pub(crate) from: Option<Arrival>,
}

/// The connection a notification arrived on, as the queue sees it: what it calls back on it
/// outside its lock (implemented by [`crate::connection::Connection`]; the queue holds it
/// weakly).
pub(crate) trait SlotOwner: Send + Sync {
    /// The application took a notification that held slot `receipt`: post it again.
    fn consumed(&self, receipt: Receipt);
    /// The bound lets the connection post the receive slots it deferred.
    fn rearm(&self);
}

/// Where a delivered notification came from: its connection, its receipt, and the
/// connection's [`SlotLedger`].
pub(crate) struct Arrival {
    pub(crate) conn: Weak<dyn SlotOwner>,
    pub(crate) receipt: Receipt,
    pub(crate) ledger: Arc<SlotLedger>,
}

/// Per connection, what the agent's notification bound needs to know of it; changed only under
/// the [`NoteQueue`]'s lock.
#[derive(Debug, Default)]
pub(crate) struct SlotLedger {
    /// Notifications in the queue holding one of its receive slots.
    held: AtomicUsize,
    /// The connection closes: its held notifications hold no slot any more (they count as
    /// orphans), it posts no new slot.
    sealed: AtomicBool,
}

impl SlotLedger {
    /// Whether the connection closed (for the bound: it posts no new slot).
    pub(crate) fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }
}

/// What taking a notification from the queue leaves to do outside its lock.
enum Taken {
    /// Nothing (put back, or its connection closed).
    Nothing,
    /// Hand its receipt back to its connection (its slot is posted again, or its place in the
    /// connection's own bound is freed).
    Consumed(Weak<dyn SlotOwner>, Receipt),
}

/// The agent's queue of notifications not taken yet, what blocking waits sleep on (a condition
/// variable) and async waits register with (a [`Wakers`] list), whether the agent closed, and
/// the agent-wide bound on what peers make it keep.
///
/// The bound ([`crate::AgentConfig::notify_queue`], `bound` here): a notification that
/// arrives is kept without its receive slot only while fewer than `bound` are so kept
/// (`buffered`, counted across every connection, with those put back); past that it holds its
/// slot until taken (the slot is not posted again, so the peer's next sends wait in its NIC).
/// When a connection closes, the notifications holding its slots hold nothing any more: they
/// are `orphans`, and while any is untaken no connection posts a receive slot beyond those
/// given back one for one (a taken notification's own slot), so reconnecting cannot make the
/// agent keep more than the queue plus the slots that existed when the bound was last free.
/// Connections whose posts were deferred (`starved`) are re-armed when the last orphan is
/// taken.
pub(crate) struct NoteQueue {
    state: Mutex<NoteState>,
    cond: Condvar,
    /// The async waits ([`crate::futures`]).
    pub(crate) wakers: Wakers,
}

struct NoteState {
    queue: VecDeque<Delivered>,
    /// The agent is shutting down: a wait that finds the queue empty ends.
    closed: bool,
    /// Notifications kept without a receive slot may be at most this many
    /// ([`crate::AgentConfig::notify_queue`]), put back ones aside.
    bound: usize,
    /// Notifications kept without a receive slot (delivered under the bound, or put back).
    buffered: usize,
    /// Notifications that held a slot of a connection that closed since.
    orphans: usize,
    /// Connections that deferred posting receive slots while orphans were untaken.
    starved: Vec<Weak<dyn SlotOwner>>,
}

impl NoteQueue {
    /// An empty queue keeping at most `bound` notifications without their receive slots.
    pub(crate) fn new(bound: u32) -> NoteQueue {
        NoteQueue {
            state: Mutex::new(NoteState {
                queue: VecDeque::new(),
                closed: false,
                bound: bound as usize,
                buffered: 0,
                orphans: 0,
                starved: Vec::new(),
            }),
            cond: Condvar::new(),
            wakers: Wakers::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, NoteState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes every waiter, blocking and async, after a change made under the lock: a blocking
    /// waiter checks under it before it sleeps, an async one checks again after it registered,
    /// so none misses the change.
    fn wake(&self) {
        self.cond.notify_all();
        self.wakers.wake_all();
    }

    /// A notification arrived that its connection's own bound lets be kept without its slot:
    /// whether the agent's does too (`true` takes a place, given back when it is taken).
    pub(crate) fn try_buffer(&self) -> bool {
        let mut s = self.lock();
        if s.buffered < s.bound {
            s.buffered += 1;
            true
        } else {
            false
        }
    }

    /// Whether the connection of `ledger` may post new receive slots: not once it closes, nor
    /// while notifications of closed connections are untaken (it is then re-armed, through
    /// `conn`, once the last is taken).
    pub(crate) fn may_arm(&self, ledger: &SlotLedger, conn: &Weak<dyn SlotOwner>) -> bool {
        if ledger.is_sealed() {
            return false;
        }
        let mut s = self.lock();
        if s.orphans == 0 {
            return true;
        }
        if !s.starved.iter().any(|w| w.ptr_eq(conn)) {
            s.starved.push(conn.clone());
        }
        false
    }

    /// The connection of `ledger` closes: its notifications in the queue hold no slot any
    /// more. Idempotent.
    pub(crate) fn seal(&self, ledger: &SlotLedger) {
        let mut s = self.lock();
        if !ledger.sealed.swap(true, Ordering::AcqRel) {
            s.orphans += ledger.held.swap(0, Ordering::AcqRel);
        }
    }

    /// A peer's notification arrived: at the back.
    pub(crate) fn push(&self, d: Delivered) {
        let mut s = self.lock();
        match &d.from {
            // Its place in the bound was taken by try_buffer.
            Some(a) if !a.receipt.holds => {}
            Some(a) if a.ledger.is_sealed() => s.orphans += 1,
            Some(a) => {
                a.ledger.held.fetch_add(1, Ordering::AcqRel);
            }
            None => s.buffered += 1,
        }
        s.queue.push_back(d);
        drop(s);
        self.wake();
    }

    /// A notification the application took and puts back: at the front, holding no slot (it
    /// counts as kept without one).
    pub(crate) fn requeue(&self, n: Notification) {
        let mut s = self.lock();
        s.buffered += 1;
        s.queue.push_front(Delivered {
            notification: n,
            from: None,
        });
        drop(s);
        self.wake();
    }

    /// Whether a wait would end now: a notification is queued, or the queue is closed.
    pub(crate) fn ready(&self) -> bool {
        let s = self.lock();
        !s.queue.is_empty() || s.closed
    }

    /// Takes the front notification's place in the bookkeeping (under the lock); returns
    /// what is left to do outside it, and the connections to re-arm.
    fn account(s: &mut NoteState, d: &mut Delivered) -> (Taken, Vec<Weak<dyn SlotOwner>>) {
        let mut rearm = Vec::new();
        let taken = match d.from.take() {
            None => {
                s.buffered = s.buffered.saturating_sub(1);
                Taken::Nothing
            }
            Some(a) if !a.receipt.holds => {
                s.buffered = s.buffered.saturating_sub(1);
                Taken::Consumed(a.conn, a.receipt)
            }
            Some(a) if a.ledger.is_sealed() => {
                s.orphans = s.orphans.saturating_sub(1);
                if s.orphans == 0 {
                    rearm = std::mem::take(&mut s.starved);
                }
                Taken::Nothing
            }
            Some(a) => {
                a.ledger.held.fetch_sub(1, Ordering::AcqRel);
                Taken::Consumed(a.conn, a.receipt)
            }
        };
        (taken, rearm)
    }

    /// Does outside the lock what taking notifications left to do.
    fn finish(taken: Vec<Taken>, rearm: Vec<Weak<dyn SlotOwner>>) {
        for t in taken {
            if let Taken::Consumed(conn, receipt) = t {
                if let Some(c) = conn.upgrade() {
                    c.consumed(receipt);
                }
            }
        }
        for conn in rearm {
            if let Some(c) = conn.upgrade() {
                c.rearm();
            }
        }
    }

    /// Pops the front notification under the lock `s`, releases it, and finishes.
    fn pop_locked(mut s: MutexGuard<'_, NoteState>) -> Option<Notification> {
        let mut d = s.queue.pop_front()?;
        let (taken, rearm) = Self::account(&mut s, &mut d);
        drop(s);
        Self::finish(vec![taken], rearm);
        Some(d.notification)
    }

    /// The next notification; `Some(None)` once the queue is closed and empty; `None` while it
    /// is open and empty.
    pub(crate) fn next(&self) -> Option<Option<Notification>> {
        let s = self.lock();
        if s.queue.is_empty() {
            return s.closed.then_some(None);
        }
        Some(Self::pop_locked(s))
    }

    /// Every notification queued now.
    pub(crate) fn take_all(&self) -> Vec<Notification> {
        let mut s = self.lock();
        let mut out = Vec::with_capacity(s.queue.len());
        let mut taken = Vec::with_capacity(s.queue.len());
        let mut rearm = Vec::new();
        while let Some(mut d) = s.queue.pop_front() {
            let (t, r) = Self::account(&mut s, &mut d);
            taken.push(t);
            rearm.extend(r);
            out.push(d.notification);
        }
        drop(s);
        Self::finish(taken, rearm);
        out
    }

    /// How many notifications are queued.
    pub(crate) fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// (kept without a slot, orphans): the bound's bookkeeping, for tests.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let s = self.lock();
        (s.buffered, s.orphans)
    }

    /// Waits up to `timeout` for the next notification (`Ok(None)` when it passes first).
    ///
    /// # Errors
    /// [`Error::AgentClosed`] once the queue is closed and empty.
    pub(crate) fn wait(&self, timeout: Duration) -> Result<Option<Notification>> {
        let end = Instant::now().checked_add(timeout);
        let mut s = self.lock();
        loop {
            if !s.queue.is_empty() {
                return Ok(Self::pop_locked(s));
            }
            if s.closed {
                return Err(Error::AgentClosed);
            }
            let left = end.map_or(Duration::from_secs(3600), |e| {
                e.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                return Ok(None);
            }
            s = self
                .cond
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The agent is shutting down: waits that find the queue empty end (what is queued is
    /// still given first). Idempotent.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.wake();
    }
}

/// One rail's notification buffers for a peer connection: `slots` receive slots and `slots`
/// send slots of `max` bytes (plus the header) each.
pub(crate) struct NotifyPool {
    pub(crate) recv: Arc<MemoryRegion>,
    pub(crate) send: Arc<MemoryRegion>,
    pub(crate) slots: u16,
    pub(crate) max: u32,
}

/// The receive wr_id of `slot` on the queue pair of generation `gen`: a completion of a queue
/// pair that was replaced since is recognised as stale and ignored.
pub(crate) fn recv_wr_id(gen: u64, slot: u16) -> u64 {
    (gen << 16) | u64::from(slot)
}

/// The (generation, slot) of a receive wr_id.
pub(crate) fn split_recv_wr_id(wr_id: u64) -> (u64, u16) {
    (wr_id >> 16, wr_id as u16)
}

impl NotifyPool {
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, slots: u16, max: u32) -> Result<NotifyPool> {
        let bytes = usize::from(slots.max(1)) * (max as usize + Header::LEN);
        Ok(NotifyPool {
            recv: MemoryRegion::new(pd, bytes, AccessFlags::LOCAL_WRITE)?,
            send: MemoryRegion::new(pd, bytes, AccessFlags::LOCAL_WRITE)?,
            slots,
            max,
        })
    }

    fn slot_range(&self, slot: u16) -> std::ops::Range<usize> {
        let size = self.max as usize + Header::LEN;
        let start = usize::from(slot) * size;
        start..start + size
    }

    /// Posts the receive of `slot` on `qp`, the queue pair of generation `gen`.
    pub(crate) fn post_recv(&self, qp: &QueuePair, gen: u64, slot: u16) -> Result<()> {
        if slot >= self.slots {
            return Err(Error::invalid(
                format!("notification slot {slot} of {}", self.slots),
                "a slot number comes from the engine",
            ));
        }
        let s = [self.recv.slice(self.slot_range(slot))?];
        qp.post_recv(&RecvRequest::new(&s).id(recv_wr_id(gen, slot)))?;
        Ok(())
    }

    /// The message (header and payload) a completed receive of `slot` holds, `len` bytes as
    /// the completion reported, bounded by the slot.
    pub(crate) fn read(&self, slot: u16, len: u32) -> Result<Vec<u8>> {
        if slot >= self.slots {
            return Err(Error::invalid(
                format!("notification slot {slot} of {}", self.slots),
                "a receive completion names a slot the engine posted",
            ));
        }
        let len = (len as usize).min(self.max as usize + Header::LEN);
        let mut v = vec![0u8; len];
        self.recv.read(self.slot_range(slot).start, &mut v)?;
        Ok(v)
    }

    /// Fills send `slot` with the header and `data` and returns the slice to send.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `data` is longer than a slot holds.
    pub(crate) fn stage(
        &self,
        slot: u16,
        header: Header,
        data: &[u8],
    ) -> Result<gdr::mr::LocalSlice> {
        if slot >= self.slots || data.len() > self.max as usize {
            return Err(Error::invalid(
                format!(
                    "a message of {} bytes in send slot {slot} ({} slots of {} bytes)",
                    data.len(),
                    self.slots,
                    self.max
                ),
                "notifications are at most the smaller of both agents' notify_max",
            ));
        }
        let start = self.slot_range(slot).start;
        let mut msg = Vec::with_capacity(Header::LEN + data.len());
        msg.extend_from_slice(&header.encode());
        msg.extend_from_slice(data);
        self.send.write(start, &msg)?;
        Ok(self.send.slice(start..start + msg.len())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake, Waker};

    /// A connection that is gone: what the queue's callbacks find for a test's arrivals.
    struct Gone;

    impl SlotOwner for Gone {
        fn consumed(&self, _: Receipt) {}
        fn rearm(&self) {}
    }

    fn nobody() -> Weak<dyn SlotOwner> {
        Weak::<Gone>::new()
    }

    fn note(peer: &str, data: &str) -> Notification {
        Notification {
            peer: peer.into(),
            data: data.as_bytes().to_vec(),
        }
    }

    fn delivered(data: &str) -> Delivered {
        Delivered {
            notification: note("p", data),
            from: None,
        }
    }

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// What [`crate::futures::WaitNotification`] does, on a bare queue.
    struct Next<'a> {
        q: &'a NoteQueue,
        waiter: crate::wakers::Waiter,
    }

    impl Future for Next<'_> {
        type Output = Option<Notification>;
        fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let q = self.q;
            self.waiter.poll(cx, &q.wakers, || q.next())
        }
    }

    impl Drop for Next<'_> {
        fn drop(&mut self) {
            self.waiter.cancel(&self.q.wakers);
        }
    }

    #[test]
    fn a_notification_put_back_is_the_next_one_taken() {
        let q = NoteQueue::new(1024);
        q.push(delivered("a"));
        q.push(delivered("b"));
        let a = q.wait(Duration::ZERO).unwrap().unwrap();
        assert_eq!(a, note("p", "a"));
        q.requeue(a);
        assert_eq!(q.len(), 2);
        // Put back in the reverse order taken: the queue's order again.
        let (a, b) = (q.next().unwrap().unwrap(), q.next().unwrap().unwrap());
        q.requeue(b);
        q.requeue(a);
        let all: Vec<_> = q.take_all().into_iter().map(|n| n.data).collect();
        assert_eq!(all, vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(q.wait(Duration::ZERO).unwrap(), None);
    }

    #[test]
    fn a_blocked_waiter_wakes_for_a_notification_put_back() {
        let q = Arc::new(NoteQueue::new(1024));
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || q.wait(Duration::from_secs(30)))
        };
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        q.requeue(note("p", "back"));
        let got = waiter.join().unwrap().unwrap();
        assert_eq!(got, Some(note("p", "back")));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "woken, not timed out"
        );
    }

    #[test]
    fn an_async_waiter_wakes_for_a_notification_put_back() {
        let q = NoteQueue::new(1024);
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut f = Box::pin(Next {
            q: &q,
            waiter: Default::default(),
        });
        assert!(f.as_mut().poll(&mut cx).is_pending());
        assert!(f.as_mut().poll(&mut cx).is_pending());
        assert_eq!(q.wakers.len(), 1);
        q.requeue(note("p", "back"));
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken by the put-back");
        assert_eq!(q.wakers.len(), 0);
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(Some(n)) => assert_eq!(n, note("p", "back")),
            other => panic!("{other:?}"),
        }
        drop(f);
        assert_eq!(q.wakers.len(), 0);
    }

    #[test]
    fn after_close_what_is_queued_or_put_back_comes_before_the_end() {
        let q = NoteQueue::new(1024);
        q.push(delivered("a"));
        q.close();
        q.requeue(note("p", "back"));
        assert_eq!(
            q.wait(Duration::from_secs(5)).unwrap(),
            Some(note("p", "back"))
        );
        assert_eq!(q.next(), Some(Some(note("p", "a"))));
        assert!(matches!(
            q.wait(Duration::from_secs(5)),
            Err(Error::AgentClosed)
        ));
        assert_eq!(q.next(), Some(None));
        // Put back after the end was seen: returned again, then the end.
        q.requeue(note("p", "late"));
        assert_eq!(q.next(), Some(Some(note("p", "late"))));
        assert_eq!(q.next(), Some(None));
        // A blocked waiter is woken by the close.
        let q = Arc::new(NoteQueue::new(1024));
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || q.wait(Duration::from_secs(30)))
        };
        std::thread::sleep(Duration::from_millis(50));
        q.close();
        assert!(matches!(waiter.join().unwrap(), Err(Error::AgentClosed)));
    }

    fn arrival(ledger: &Arc<SlotLedger>, holds: bool) -> Delivered {
        Delivered {
            notification: note("p", "x"),
            from: Some(Arrival {
                conn: nobody(),
                receipt: Receipt {
                    lane: gdr_xfer_proto::LaneRef { lane: 0, gen: 0 },
                    slot: 0,
                    holds,
                },
                ledger: ledger.clone(),
            }),
        }
    }

    #[test]
    fn the_bound_is_the_agents_and_closed_connections_slots_count_as_orphans() {
        let q = NoteQueue::new(4);
        let l1 = Arc::new(SlotLedger::default());
        // Four kept without their slot, then the bound is reached: the next ones hold theirs.
        for _ in 0..4 {
            assert!(q.try_buffer());
            q.push(arrival(&l1, false));
        }
        assert!(!q.try_buffer());
        q.push(arrival(&l1, true));
        q.push(arrival(&l1, true));
        assert_eq!(q.counts(), (4, 0));
        assert_eq!(l1.held.load(Ordering::SeqCst), 2);
        // The connection closes: its held notifications are orphans; no connection posts new
        // slots while they are untaken (the one asking is remembered, to re-arm later).
        q.seal(&l1);
        q.seal(&l1);
        assert_eq!(q.counts(), (4, 2));
        let l2 = Arc::new(SlotLedger::default());
        assert!(!q.may_arm(&l2, &nobody()));
        assert!(
            !q.may_arm(&l1, &nobody()),
            "a closed connection never posts"
        );
        assert_eq!(q.lock().starved.len(), 1);
        // A notification arriving on the closed connection after it closed is an orphan too.
        q.push(arrival(&l1, true));
        assert_eq!(q.counts(), (4, 3));
        // Taking them in order: the four kept first, then the orphans; the last orphan taken
        // lets the connections post again.
        assert_eq!(q.take_all().len(), 7);
        assert_eq!(q.counts(), (0, 0));
        assert!(q.lock().starved.is_empty());
        assert!(q.may_arm(&l2, &nobody()));
        // Put back ones count as kept without a slot.
        q.requeue(note("p", "back"));
        assert_eq!(q.counts(), (1, 0));
        assert!(q.next().is_some());
        assert_eq!(q.counts(), (0, 0));
    }

    /// The audit's reconnect attack on the bookkeeping: a peer that sends until the agent holds
    /// it back, closes, and connects again, five times, while the application takes nothing.
    /// Before, each connection had its own bound: 5 x (queue + slots) were kept.
    #[test]
    fn reconnecting_peers_cannot_grow_the_queue_past_the_bound_and_the_slots() {
        const BOUND: usize = 1024;
        const SLOTS: usize = 64;
        let q = NoteQueue::new(BOUND as u32);
        let mut peak = 0;
        for _connection in 0..5 {
            let ledger = Arc::new(SlotLedger::default());
            // What the connection posts at the start, as far as the bound lets.
            let mut armed = if q.may_arm(&ledger, &nobody()) {
                SLOTS
            } else {
                0
            };
            let mut sent = 0;
            while armed > 0 && sent < BOUND + SLOTS {
                armed -= 1;
                sent += 1;
                let holds = !q.try_buffer();
                q.push(arrival(&ledger, holds));
                // A slot whose notification is kept without it is posted again if the bound
                // lets (the core's arm_free_slots with nothing given back).
                if !holds && q.may_arm(&ledger, &nobody()) {
                    armed += 1;
                }
                peak = peak.max(q.len());
            }
            q.seal(&ledger);
        }
        assert!(
            peak <= BOUND + SLOTS,
            "the agent kept {peak} notifications, over its bound {BOUND} + {SLOTS} slots"
        );
        assert_eq!(q.len(), BOUND + SLOTS);
    }

    #[test]
    fn receive_ids_carry_the_generation() {
        for (gen, slot) in [(0, 0), (1, 63), (0xffff_ffff, u16::MAX)] {
            assert_eq!(split_recv_wr_id(recv_wr_id(gen, slot)), (gen, slot));
        }
    }
}
