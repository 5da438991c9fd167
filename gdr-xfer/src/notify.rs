//! Notifications: small messages bound to a transfer, delivered to the target only after every
//! byte of the transfer landed there.
//!
//! The initiator sends a transfer's notification as an RDMA SEND once the completions of all of
//! the transfer's writes (or reads) are in, on every queue pair that carried them: an RC
//! completion at the initiator means the peer's NIC acknowledged the data, so when the SEND
//! arrives the data is in the target's memory (for GPU memory, call
//! [`Segment::read`](crate::Segment::read), which flushes first). Each peer connection has a
//! pool of receive slots on each rail's first queue pair. A slot's message is copied out when
//! it arrives; the slot is posted again once the application took the notification
//! ([`Agent::take_notifications`](crate::Agent::take_notifications),
//! [`Agent::wait_notification`](crate::Agent::wait_notification)). So what a peer can make us
//! hold is bounded by the slots (`notify_slots` per rail and peer); a sender faster than the
//! application waits in the NIC's receiver-not-ready retries, without limit of time (its
//! transfers' deadlines still apply), and nothing is lost.
//!
//! Every message starts with a header, `flags u8 | id u64` ([`gdr_xfer_proto::Header`]): the
//! id numbers the sender's notifications on the connection, so a notification sent again after
//! its rail failed (the first copy may have arrived before the failure) is delivered once; the
//! probe flag marks the message that re-admits a rail, never delivered.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use gdr::mr::{AccessFlags, MemoryRegion};
use gdr::pd::ProtectionDomain;
use gdr::qp::QueuePair;
use gdr::wr::RecvRequest;
use gdr_xfer_proto::{Header, Receipt};

use crate::connection::Connection;
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
    /// The connection it arrived on and its receipt; `None` for a notification put back.
    pub(crate) slot: Option<(Weak<Connection>, Receipt)>,
}

impl Delivered {
    /// The application took it: its slot is posted again. Called outside the queue's lock.
    pub(crate) fn take(self) -> Notification {
        if let Some((conn, receipt)) = self.slot {
            if let Some(c) = conn.upgrade() {
                c.consumed(receipt);
            }
        }
        self.notification
    }
}

/// The agent's queue of notifications not taken yet, what blocking waits sleep on (a condition
/// variable) and async waits register with (a [`Wakers`] list), and whether the agent closed.
#[derive(Default)]
pub(crate) struct NoteQueue {
    state: Mutex<NoteState>,
    cond: Condvar,
    /// The async waits ([`crate::futures`]).
    pub(crate) wakers: Wakers,
}

#[derive(Default)]
struct NoteState {
    queue: VecDeque<Delivered>,
    /// The agent is shutting down: a wait that finds the queue empty ends.
    closed: bool,
}

impl NoteQueue {
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

    /// A peer's notification arrived: at the back.
    pub(crate) fn push(&self, d: Delivered) {
        self.lock().queue.push_back(d);
        self.wake();
    }

    /// A notification the application took and puts back: at the front, holding no slot.
    pub(crate) fn requeue(&self, n: Notification) {
        self.lock().queue.push_front(Delivered {
            notification: n,
            slot: None,
        });
        self.wake();
    }

    /// Whether a wait would end now: a notification is queued, or the queue is closed.
    pub(crate) fn ready(&self) -> bool {
        let s = self.lock();
        !s.queue.is_empty() || s.closed
    }

    /// The next notification; `Some(None)` once the queue is closed and empty; `None` while it
    /// is open and empty.
    pub(crate) fn next(&self) -> Option<Option<Notification>> {
        let mut s = self.lock();
        match s.queue.pop_front() {
            Some(d) => {
                drop(s);
                Some(Some(d.take()))
            }
            None if s.closed => Some(None),
            None => None,
        }
    }

    /// Every notification queued now.
    pub(crate) fn take_all(&self) -> Vec<Notification> {
        let taken: Vec<Delivered> = self.lock().queue.drain(..).collect();
        taken.into_iter().map(Delivered::take).collect()
    }

    /// How many notifications are queued.
    pub(crate) fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Waits up to `timeout` for the next notification (`Ok(None)` when it passes first).
    ///
    /// # Errors
    /// [`Error::AgentClosed`] once the queue is closed and empty.
    pub(crate) fn wait(&self, timeout: Duration) -> Result<Option<Notification>> {
        let end = Instant::now().checked_add(timeout);
        let mut s = self.lock();
        loop {
            if let Some(d) = s.queue.pop_front() {
                drop(s);
                return Ok(Some(d.take()));
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

    /// Posts every receive slot on `qp`, the queue pair of generation `gen`.
    pub(crate) fn post_all(&self, qp: &QueuePair, gen: u64) -> Result<()> {
        (0..self.slots).try_for_each(|slot| self.post_recv(qp, gen, slot))
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

    fn note(peer: &str, data: &str) -> Notification {
        Notification {
            peer: peer.into(),
            data: data.as_bytes().to_vec(),
        }
    }

    fn delivered(data: &str) -> Delivered {
        Delivered {
            notification: note("p", data),
            slot: None,
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
        let q = NoteQueue::default();
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
        let q = Arc::new(NoteQueue::default());
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
        let q = NoteQueue::default();
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
        let q = NoteQueue::default();
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
        let q = Arc::new(NoteQueue::default());
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || q.wait(Duration::from_secs(30)))
        };
        std::thread::sleep(Duration::from_millis(50));
        q.close();
        assert!(matches!(waiter.join().unwrap(), Err(Error::AgentClosed)));
    }

    #[test]
    fn receive_ids_carry_the_generation() {
        for (gen, slot) in [(0, 0), (1, 63), (0xffff_ffff, u16::MAX)] {
            assert_eq!(split_recv_wr_id(recv_wr_id(gen, slot)), (gen, slot));
        }
    }
}
