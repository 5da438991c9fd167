//! The in-flight table of a queue pair: every posted request's bookkeeping until its completion
//! is reaped (soundness rule 1), and the `wr_id` the provider carries for it.
//!
//! # Attribution
//!
//! gdr never hands the application's `wr_id` to the provider. Each posted request gets a 64-bit
//! provider id made of
//!
//! | bits | meaning |
//! |---|---|
//! | 63 | 1 for the receive queue, 0 for the send queue |
//! | 40..63 | the queue pair's *tag*: which incarnation of this QP number posted it |
//! | 0..40 | the request's sequence number on its queue (modulo 2^40) |
//!
//! A completion is attributed to a request only when its QP number is registered with the
//! completion queue, its tag is that queue pair's current tag, and its sequence number lies in the
//! queue's in-flight window. A queue pair gets a new tag when it is created and when it is reset;
//! the completion queue remembers the (QP number, tag) pairs whose completions may still sit in it
//! ([`crate::cq`]'s tombstones) until it has been polled empty, and a new tag never repeats one of
//! them. So a stale completion (of a destroyed queue pair whose number the provider reused, or of
//! requests from before a reset) can never retire, or release the memory of, a live request.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Hint, Result};
use crate::mr::Registered;
use crate::qp::{QpState, WorkQueue};

/// The top bit of a provider `wr_id` marks receive-queue requests.
const RECV_BIT: u64 = 1 << 63;
/// Bits of the sequence number in a provider `wr_id`.
const SEQ_BITS: u32 = 40;
pub(crate) const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// Bits of the tag in a provider `wr_id`.
const TAG_BITS: u32 = 23;
const TAG_MASK: u32 = (1 << TAG_BITS) - 1;

/// The provider `wr_id` of request `seq` posted to `queue` by the incarnation `tag`.
pub(crate) fn encode(queue: WorkQueue, tag: u32, seq: u64) -> u64 {
    let q = match queue {
        WorkQueue::Send => 0,
        WorkQueue::Recv => RECV_BIT,
    };
    q | (u64::from(tag & TAG_MASK) << SEQ_BITS) | (seq & SEQ_MASK)
}

/// A provider `wr_id` taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProviderId {
    pub(crate) queue: WorkQueue,
    pub(crate) tag: u32,
    /// The sequence number modulo 2^40.
    pub(crate) seq: u64,
}

/// Takes a provider `wr_id` apart (any 64-bit value decodes; attribution checks the parts).
pub(crate) fn decode(wr_id: u64) -> ProviderId {
    ProviderId {
        queue: if wr_id & RECV_BIT != 0 {
            WorkQueue::Recv
        } else {
            WorkQueue::Send
        },
        tag: ((wr_id >> SEQ_BITS) as u32) & TAG_MASK,
        seq: wr_id & SEQ_MASK,
    }
}

/// Source of tags: consecutive values, so a tag repeats only after 2^23 incarnations, and never
/// while the completion queues still hold a completion carrying it (see [`new_tag`]).
static NEXT_TAG: AtomicU32 = AtomicU32::new(1);

/// A tag for a new incarnation of QP number `qpn`: the next one for which `in_use(tag)` is false
/// (the caller passes the completion queues' tombstones of `qpn`).
pub(crate) fn new_tag(qpn: u32, in_use: impl Fn(u32) -> bool) -> Result<u32> {
    for _ in 0..=TAG_MASK {
        let tag = NEXT_TAG.fetch_add(1, Ordering::Relaxed) & TAG_MASK;
        if !in_use(tag) {
            return Ok(tag);
        }
    }
    Err(Error::invalid(
        format!("QP {qpn:#x}: every tag is held by completions still queued for its earlier incarnations"),
        "poll the completion queues until they are empty, then create or reset the queue pair again",
    ))
}

/// One posted request's bookkeeping.
struct Slot {
    user_wr_id: u64,
    /// [`SIGNALED`] and [`OWNED`]; one byte, written whole by [`Ring::stage`], so staging costs
    /// what it did before ownership was tracked.
    flags: u8,
    regions: Vec<Arc<dyn Registered>>,
}

/// The application asked for the request's completion.
const SIGNALED: u8 = 1;
/// The async layer (`gdr::aio`) posted the request, with an id of its own: its completion is
/// delivered by provenance, never by comparing ids with requests posted by hand.
const OWNED: u8 = 2;

/// Stages one request per slot (see [`Ring::stage_ids`]).
#[inline(always)]
fn stage_plain<T>(slots: &mut [Slot], items: &[T], id: impl Fn(&T) -> u64) {
    for (slot, item) in slots.iter_mut().zip(items) {
        slot.user_wr_id = id(item);
        slot.flags = 0;
        // Retired slots are already empty (see `Ring::stage`).
        if !slot.regions.is_empty() {
            slot.regions.clear();
        }
    }
}

/// Requests posted to one work queue, in posting order. The NIC completes a queue's requests in
/// order (RC), so a completion for sequence number `s` retires every request up to `s`.
pub(crate) struct Ring {
    queue: WorkQueue,
    /// A power of two at least the depth, so a sequence number's slot is `seq & mask`.
    slots: Box<[Slot]>,
    mask: u64,
    depth: u64,
    /// Sequence number of the next request to post.
    pub(crate) head: u64,
    /// Sequence number of the oldest request still in flight.
    pub(crate) tail: u64,
    /// Unsignalled requests posted since the last signalled one.
    pub(crate) since_signal: u32,
    /// The queue pair's current incarnation.
    tag: u32,
    /// The queue pair's state as gdr last moved it (the device may have moved it to the error
    /// state since; posting there is harmless: the requests complete as flushed).
    pub(crate) state: QpState,
    /// The send queue's request list for batches (`qp::batch`), allocated by the first one.
    pub(crate) list: Option<Box<crate::qp::batch::ListScratch>>,
}

impl Ring {
    fn new(queue: WorkQueue, depth: u32, max_sge: u32, tag: u32) -> Self {
        let depth = depth.max(1);
        let slots: Box<[Slot]> = (0..depth.next_power_of_two())
            .map(|_| Slot {
                user_wr_id: 0,
                flags: SIGNALED,
                regions: Vec::with_capacity(max_sge.max(1) as usize),
            })
            .collect();
        Ring {
            queue,
            mask: slots.len() as u64 - 1,
            slots,
            depth: u64::from(depth),
            head: 0,
            tail: 0,
            since_signal: 0,
            tag,
            state: QpState::Reset,
            list: None,
        }
    }

    /// Capacity in requests.
    pub(crate) fn capacity(&self) -> u64 {
        self.depth
    }

    /// Requests in flight.
    pub(crate) fn outstanding(&self) -> u64 {
        self.head - self.tail
    }

    /// The incarnation tag its requests carry.
    pub(crate) fn tag(&self) -> u32 {
        self.tag
    }

    /// Free slots.
    pub(crate) fn free(&self) -> u64 {
        self.depth - self.outstanding()
    }

    /// The provider `wr_id` of sequence number `seq`.
    pub(crate) fn provider_id(&self, seq: u64) -> u64 {
        encode(self.queue, self.tag, seq)
    }

    /// Whether a request must be signalled when `since_signal` unsignalled ones precede it, to
    /// keep the queue from filling with requests nobody can retire.
    pub(crate) fn signal_due(&self, since_signal: u32) -> bool {
        u64::from(since_signal) + 1 >= self.signal_every()
    }

    /// The longest run of requests before one must be signalled (half the queue, at least 1):
    /// a request with `since_signal + 1 >= signal_every()` is signalled.
    pub(crate) fn signal_every(&self) -> u64 {
        (self.capacity() / 2).max(1)
    }

    /// The provider id of sequence number 0 of this incarnation: `provider_id(seq)` is
    /// `id_base() | (seq & SEQ_MASK)` (for loops that number many requests).
    pub(crate) fn id_base(&self) -> u64 {
        encode(self.queue, self.tag, 0)
    }

    /// Fills the slot of sequence number `head + ahead` (the `ahead`-th request of a list being
    /// posted); returns that number. The caller has checked that the slot is free and that
    /// `regions` fits the slot's reserved capacity (no allocation). Always inlined: it is the
    /// per-request step of every post loop (`post_rdma_batch` spends a fifth less per request
    /// with it inlined; the compiler's own choice changed as the crate grew).
    #[inline(always)]
    pub(crate) fn stage<'r>(
        &mut self,
        ahead: u64,
        user_wr_id: u64,
        user_signaled: bool,
        regions: impl Iterator<Item = &'r Arc<dyn Registered>>,
    ) -> u64 {
        let seq = self.head + ahead;
        let slot = &mut self.slots[(seq & self.mask) as usize];
        slot.user_wr_id = user_wr_id;
        slot.flags = if user_signaled { SIGNALED } else { 0 };
        // Retired slots are already empty (retire and restart clear them): only a slot that
        // still holds something is cleared, so staging a request without regions costs nothing.
        if !slot.regions.is_empty() {
            slot.regions.clear();
        }
        // One push per region (most requests of a batch have none): cheaper than `extend`,
        // which reserves first.
        for r in regions {
            slot.regions.push(r.clone());
        }
        seq
    }

    /// Stages the requests `head..head + ids.len()` (at most the ring's size) in one pass, with
    /// application ids `id(&ids[i])`, as [`Ring::stage`] would with
    /// `user_signaled` false and no regions (a batch's requests, the costly part of posting
    /// 10^5 of them: no index arithmetic or bounds check per request). The caller has checked
    /// that the slots are free; [`Ring::mark_last`] then gives the batch's last request its
    /// flag and region.
    #[inline(always)]
    pub(crate) fn stage_ids<T>(&mut self, ids: &[T], id: impl Fn(&T) -> u64 + Copy) {
        let start = (self.head & self.mask) as usize;
        // The slots from `start` to the end of the ring, then from its beginning (wrapping):
        // two plain loops (a chained iterator costs more per request than the loop's body).
        let (wrapped, from_start) = self.slots.split_at_mut(start);
        let first = ids.len().min(from_start.len());
        stage_plain(&mut from_start[..first], &ids[..first], id);
        let rest = &ids[first..];
        stage_plain(&mut wrapped[..rest.len().min(start)], rest, id);
    }

    /// Marks the staged request `seq` as signalled for the application when `user_signaled`,
    /// and makes it hold `region` (the last request of a batch; see [`Ring::stage_ids`]).
    pub(crate) fn mark_last(
        &mut self,
        seq: u64,
        user_signaled: bool,
        region: &Arc<dyn Registered>,
    ) {
        let slot = &mut self.slots[(seq & self.mask) as usize];
        if user_signaled {
            slot.flags |= SIGNALED;
        }
        slot.regions.push(region.clone());
    }

    /// Marks the staged or in-flight request `seq` as posted by the async layer (see [`OWNED`]).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn mark_owned(&mut self, seq: u64) {
        self.slots[(seq & self.mask) as usize].flags |= OWNED;
    }

    /// The requests in flight, oldest first: each one's application `wr_id` and whether the
    /// async layer posted it. A reset or destroy tells the async layer these ended.
    pub(crate) fn in_flight(&self) -> impl Iterator<Item = (u64, bool)> + '_ {
        (self.tail..self.head).map(move |s| {
            let slot = &self.slots[(s & self.mask) as usize];
            (slot.user_wr_id, slot.flags & OWNED != 0)
        })
    }

    /// Makes the in-flight request `seq` keep `regions` alive too (until it is retired or the
    /// ring cleared); drops them at once when `seq` is no longer in flight.
    pub(crate) fn adopt(&mut self, seq: u64, regions: impl Iterator<Item = Arc<dyn Registered>>) {
        if seq >= self.tail && seq < self.head {
            self.slots[(seq & self.mask) as usize]
                .regions
                .extend(regions);
        }
    }

    /// Undoes [`Ring::stage`] for a request the provider reported as not posted.
    pub(crate) fn unstage(&mut self, seq: u64) {
        self.slots[(seq & self.mask) as usize].regions.clear();
    }

    /// Settles a list of `signaled.len()` staged requests of which the provider took the first
    /// `taken`: those are committed, the rest unstaged. When the list's region `holder` was
    /// among those refused, the last committed request holds it instead (a batch's region
    /// rides on one request; see `qp::batch`).
    pub(crate) fn settle(
        &mut self,
        signaled: &[bool],
        taken: usize,
        holder: Option<&Arc<dyn Registered>>,
    ) {
        let taken = taken.min(signaled.len());
        for &sig in &signaled[..taken] {
            self.commit(sig);
        }
        let head = self.head;
        for i in taken..signaled.len() {
            self.unstage(head + (i - taken) as u64);
        }
        if let Some(region) = holder {
            if taken > 0 && taken < signaled.len() {
                self.adopt(head - 1, std::iter::once(region.clone()));
            }
        }
    }

    /// Marks the oldest staged request as posted.
    pub(crate) fn commit(&mut self, signaled: bool) {
        self.head += 1;
        self.since_signal = if signaled { 0 } else { self.since_signal + 1 };
    }

    /// Marks the `n` oldest staged requests as posted, `since_signal` being the count of
    /// unsignalled ones after the last signalled one among them and before (what `n` calls of
    /// [`commit`](Self::commit) would leave).
    pub(crate) fn commit_many(&mut self, n: usize, since_signal: u32) {
        self.head += n as u64;
        self.since_signal = since_signal;
    }

    /// Retires every request up to and including the one `id` names; returns that request's
    /// bookkeeping (application `wr_id`, signalled, posted by the async layer), or `None`
    /// (retiring nothing) when `id` is not one of this incarnation's requests in flight.
    fn retire(&mut self, id: ProviderId) -> Option<(u64, bool, bool)> {
        if id.tag != self.tag || id.queue != self.queue {
            return None;
        }
        // The one in-flight sequence number congruent to `id.seq` modulo 2^40 (the window is at
        // most the depth, far below 2^40, so there is at most one).
        let seq = self.tail + (id.seq.wrapping_sub(self.tail) & SEQ_MASK);
        if seq >= self.head {
            return None;
        }
        for s in self.tail..=seq {
            self.slots[(s & self.mask) as usize].regions.clear();
        }
        self.tail = seq + 1;
        let slot = &self.slots[(seq & self.mask) as usize];
        Some((
            slot.user_wr_id,
            slot.flags & SIGNALED != 0,
            slot.flags & OWNED != 0,
        ))
    }

    /// Forgets everything in flight and starts incarnation `tag` with sequence number 0 (after
    /// the queue pair was reset or destroyed: the NIC no longer touches the requests' memory, and
    /// completions still queued for them carry the old tag). Sequence numbers restart as they do
    /// for a new queue pair that reuses a QP number, so only the tag tells the incarnations apart.
    pub(crate) fn restart(&mut self, tag: u32) {
        for s in self.tail..self.head {
            self.slots[(s & self.mask) as usize].regions.clear();
        }
        self.head = 0;
        self.tail = 0;
        self.since_signal = 0;
        self.tag = tag;
    }
}

/// What a reaped completion retired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Done {
    pub(crate) user_wr_id: u64,
    pub(crate) user_signaled: bool,
    pub(crate) queue: WorkQueue,
    /// Posted by the async layer (see [`OWNED`]).
    pub(crate) owned: bool,
}

/// The in-flight table of one queue pair: its send and receive rings.
pub(crate) struct InFlight {
    pub(crate) send: Mutex<Ring>,
    pub(crate) recv: Mutex<Ring>,
}

impl InFlight {
    pub(crate) fn new(
        tag: u32,
        send_depth: u32,
        send_sge: u32,
        recv_depth: u32,
        recv_sge: u32,
    ) -> Self {
        InFlight {
            send: Mutex::new(Ring::new(WorkQueue::Send, send_depth, send_sge, tag)),
            recv: Mutex::new(Ring::new(WorkQueue::Recv, recv_depth, recv_sge, tag)),
        }
    }

    /// The current tag.
    pub(crate) fn tag(&self) -> u32 {
        lock(&self.send).tag
    }

    /// Retires the request a completion's provider `wr_id` names, if it is one of ours.
    pub(crate) fn complete(&self, wr_id: u64) -> Option<Done> {
        let id = decode(wr_id);
        let ring = match id.queue {
            WorkQueue::Send => &self.send,
            WorkQueue::Recv => &self.recv,
        };
        let (user_wr_id, user_signaled, owned) = lock(ring).retire(id)?;
        Some(Done {
            user_wr_id,
            user_signaled: user_signaled || id.queue == WorkQueue::Recv,
            queue: id.queue,
            owned,
        })
    }
}

/// Locks a ring, recovering from poisoning (the ring's state stays consistent on panic).
pub(crate) fn lock(m: &Mutex<Ring>) -> MutexGuard<'_, Ring> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The "queue full" error of `ring` when `more` requests were asked for.
pub(crate) fn queue_full(ring: &Ring, qp_num: u32, more: usize) -> Error {
    Error::QueueFull {
        queue: ring.queue,
        qp_num,
        outstanding: ring.outstanding(),
        capacity: ring.capacity(),
        requested: more,
        hint: Hint::new(match ring.queue {
            WorkQueue::Send => "poll the completion queue before posting more; signal requests periodically, or raise max_send_wr",
            WorkQueue::Recv => "reap receive completions first or raise max_recv_wr",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(depth: u32) -> Ring {
        Ring::new(WorkQueue::Send, depth, 1, 5)
    }

    /// A request's in-flight entry is one slot of its queue's ring, allocated with the queue
    /// pair (gdr-xfer's crate docs quote the size): 40 bytes, plus 16 per region it holds.
    #[test]
    fn an_in_flight_slot_is_40_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 40);
        assert_eq!(std::mem::size_of::<Arc<dyn Registered>>(), 16);
    }

    fn post(r: &mut Ring, user: u64, sig: bool) -> u64 {
        let seq = r.stage(0, user, sig, std::iter::empty());
        r.commit(sig);
        r.provider_id(seq)
    }

    #[test]
    fn provider_ids_round_trip() {
        for (q, tag, seq) in [
            (WorkQueue::Send, 0, 0),
            (WorkQueue::Recv, TAG_MASK, SEQ_MASK),
            (WorkQueue::Send, 12345, 1 << 39),
        ] {
            let id = decode(encode(q, tag, seq));
            assert_eq!((id.queue, id.tag, id.seq), (q, tag, seq));
        }
        // Out-of-range parts are truncated, never smeared into the other fields.
        let id = decode(encode(WorkQueue::Send, u32::MAX, u64::MAX));
        assert_eq!(
            (id.queue, id.tag, id.seq),
            (WorkQueue::Send, TAG_MASK, SEQ_MASK)
        );
        // Any value decodes.
        let _ = decode(u64::MAX);
    }

    #[test]
    fn ring_retires_in_order_and_ignores_stale_ids() {
        let mut r = ring(4);
        let ids: Vec<u64> = (10..13).map(|u| post(&mut r, u, u == 12)).collect();
        assert_eq!(r.outstanding(), 3);
        assert_eq!(
            r.retire(decode(ids[2])),
            Some((12, true, false)),
            "signalled completion retires the unsignalled before it"
        );
        assert_eq!(r.outstanding(), 0);
        assert_eq!(r.retire(decode(ids[1])), None, "already retired");
        assert_eq!(r.retire(decode(r.provider_id(7))), None, "never posted");
    }

    /// Something the ring can hold for the holder tests. The ring only stores and drops
    /// regions; nothing here is posted, so no method is ever called.
    struct Held;

    // SAFETY: test-only: a `Held` never reaches a device or a work request (the ring stores
    // and drops it), so nothing relies on the contract's promises about real memory.
    unsafe impl Registered for Held {
        fn lkey(&self) -> u32 {
            0
        }
        fn rkey(&self) -> u32 {
            0
        }
        fn iova(&self) -> u64 {
            0
        }
        fn len(&self) -> usize {
            0
        }
        fn pd(&self) -> &Arc<crate::pd::ProtectionDomain> {
            unreachable!("the ring never asks a region for its protection domain")
        }
        fn kind(&self) -> crate::mr::MemoryKind {
            crate::mr::MemoryKind::Host
        }
        fn access(&self) -> crate::mr::AccessFlags {
            crate::mr::AccessFlags::empty()
        }
    }

    fn region() -> Arc<dyn Registered> {
        Arc::new(Held)
    }

    /// A batch staged in one pass across the end of the ring lands in the slots `stage` would
    /// have used, ids in order, the region on its last request only, and is retired whole by
    /// the last one's completion.
    #[test]
    fn a_batch_staged_across_the_ring_end_is_the_same_as_one_by_one() {
        let mut r = ring(8);
        // Move head to 6 of 8 slots, so a batch of 5 wraps after two.
        for i in 0..6u64 {
            r.stage(0, i, true, std::iter::empty());
            r.commit(true);
        }
        let last = r.provider_id(5);
        assert!(r.retire(decode(last)).is_some());
        let reg = region();
        let weak = Arc::downgrade(&reg);
        let ids: Vec<u64> = (100..105).collect();
        r.stage_ids(&ids, |&x| x);
        r.mark_last(r.head + 4, true, &reg);
        drop(reg);
        r.commit_many(5, 0);
        let staged: Vec<(u64, bool)> = r.in_flight().collect();
        assert_eq!(
            staged,
            ids.iter().map(|&i| (i, false)).collect::<Vec<_>>(),
            "ids in posting order across the wrap"
        );
        assert!(
            weak.upgrade().is_some(),
            "the last request holds the region"
        );
        assert_eq!(
            r.retire(decode(r.provider_id(10))),
            Some((104, true, false)),
            "the last one is signalled for the caller"
        );
        assert!(weak.upgrade().is_none(), "released when the batch retired");
    }

    #[test]
    fn a_batch_refused_half_way_moves_its_region_to_the_last_request_taken() {
        let mut r = ring(8);
        let reg = region();
        let weak = Arc::downgrade(&reg);
        // Four requests staged, the region on the last one only (as post_rdma_batch stages).
        for i in 0..4u64 {
            let holds = i == 3;
            r.stage(i, 100 + i, i == 3, holds.then_some(&reg).into_iter());
        }
        drop(reg);
        // The provider took two: the two others are unstaged, and the second takes the region.
        let region = weak.upgrade().unwrap();
        r.settle(&[false, false, false, true], 2, Some(&region));
        drop(region);
        assert_eq!(r.outstanding(), 2);
        assert!(
            weak.upgrade().is_some(),
            "held while request 1 is in flight"
        );
        let first = r.provider_id(0);
        assert_eq!(r.retire(decode(first)), Some((100, false, false)));
        assert!(
            weak.upgrade().is_some(),
            "request 0 retired, request 1 still holds it"
        );
        let second = r.provider_id(1);
        assert_eq!(r.retire(decode(second)), Some((101, false, false)));
        assert!(
            weak.upgrade().is_none(),
            "released with the last request taken"
        );
    }

    #[test]
    fn a_batch_refused_whole_or_taken_whole_needs_no_new_holder() {
        for taken in [0usize, 3] {
            let mut r = ring(8);
            let reg = region();
            let weak = Arc::downgrade(&reg);
            for i in 0..3u64 {
                r.stage(i, i, i == 2, (i == 2).then_some(&reg).into_iter());
            }
            let region = reg.clone();
            drop(reg);
            r.settle(&[false, false, true], taken, Some(&region));
            drop(region);
            assert_eq!(r.outstanding(), taken as u64);
            assert_eq!(
                weak.upgrade().is_some(),
                taken == 3,
                "taken {taken}: held exactly while something is in flight"
            );
            // A bad count from a confused provider is clamped, never a panic.
            r.settle(&[], 7, None);
        }
    }

    #[test]
    fn a_completion_of_another_incarnation_retires_nothing() {
        let mut r = ring(4);
        let old = post(&mut r, 1, true);
        r.restart(6);
        let new = post(&mut r, 2, true);
        assert_eq!(decode(old).seq, decode(new).seq, "sequence numbers restart");
        // The old incarnation's id, even rewritten to the live sequence number, is refused.
        let forged = encode(WorkQueue::Send, 5, decode(new).seq);
        assert_eq!(r.retire(decode(forged)), None);
        assert_eq!(r.retire(decode(old)), None);
        assert_eq!(r.outstanding(), 1, "the live request is still in flight");
        assert_eq!(r.retire(decode(new)), Some((2, true, false)));
        // A receive id never retires a send request.
        let s = post(&mut r, 3, true);
        let as_recv = encode(WorkQueue::Recv, 6, decode(s).seq);
        assert_eq!(r.retire(decode(as_recv)), None);
    }

    #[test]
    fn sequence_numbers_wrap_at_40_bits() {
        let mut r = ring(4);
        r.head = SEQ_MASK - 1;
        r.tail = r.head;
        let a = post(&mut r, 1, false);
        let b = post(&mut r, 2, false);
        let c = post(&mut r, 3, true);
        assert_eq!(decode(a).seq, SEQ_MASK - 1);
        assert_eq!(decode(c).seq, 0, "wrapped");
        assert_eq!(r.retire(decode(b)), Some((2, false, false)));
        assert_eq!(r.retire(decode(c)), Some((3, true, false)));
        assert_eq!(r.outstanding(), 0);
    }

    #[test]
    fn periodic_signalling_bounds_unsignalled_runs() {
        let mut r = ring(8);
        let mut forced = 0;
        for i in 0..32 {
            let sig = r.signal_due(r.since_signal);
            forced += sig as u32;
            let id = post(&mut r, i, sig);
            assert!(
                r.since_signal < 4,
                "never more than half the queue unsignalled"
            );
            if sig {
                r.retire(decode(id));
            }
        }
        assert_eq!(forced, 8);
    }

    #[test]
    fn ownership_is_marked_per_request_and_never_inherited_by_a_slot() {
        let mut r = ring(2);
        let a = r.stage(0, 1 << 63, true, std::iter::empty());
        r.mark_owned(a);
        r.commit(true);
        post(&mut r, 1 << 63, true); // the same id, posted by hand
        assert_eq!(
            r.in_flight().collect::<Vec<_>>(),
            [(1 << 63, true), (1 << 63, false)]
        );
        assert_eq!(
            r.retire(decode(r.provider_id(0))),
            Some((1 << 63, true, true))
        );
        assert_eq!(
            r.retire(decode(r.provider_id(1))),
            Some((1 << 63, true, false))
        );
        // Slot 0 again, staged by hand: the mark is gone.
        let id = post(&mut r, 7, true);
        assert_eq!(r.in_flight().collect::<Vec<_>>(), [(7, false)]);
        assert_eq!(r.retire(decode(id)), Some((7, true, false)));
        assert_eq!(r.in_flight().count(), 0);
    }

    #[test]
    fn a_depth_that_is_not_a_power_of_two_wraps_correctly() {
        let mut r = ring(3);
        assert_eq!(r.capacity(), 3, "capacity is the depth, not the slot count");
        for round in 0..10u64 {
            for k in 0..3 {
                r.stage(k, round * 10 + k, k == 2, std::iter::empty());
            }
            for k in 0..3 {
                r.commit(k == 2);
            }
            assert_eq!(r.outstanding(), 3);
            let last = r.provider_id(r.head - 1);
            assert_eq!(r.retire(decode(last)), Some((round * 10 + 2, true, false)));
        }
    }

    #[test]
    fn batch_shortcuts_match_the_per_request_forms() {
        // id_base | seq is provider_id(seq), wrapping included; commit_many(n, since) is n
        // commits; signal_every is what signal_due tests against.
        let mut a = ring(8);
        let mut b = ring(8);
        a.head = SEQ_MASK - 2;
        b.head = a.head;
        for seq in [0, 1, SEQ_MASK, SEQ_MASK + 1, 1 << 41] {
            assert_eq!(a.id_base() | (seq & SEQ_MASK), a.provider_id(seq));
        }
        let sigs = [false, true, false, false, false];
        let mut since = b.since_signal;
        for &s in &sigs {
            a.commit(s);
            since = if s { 0 } else { since + 1 };
        }
        b.commit_many(sigs.len(), since);
        assert_eq!((a.head, a.since_signal), (b.head, b.since_signal));
        for since in 0..10 {
            assert_eq!(
                a.signal_due(since),
                u64::from(since) + 1 >= a.signal_every()
            );
        }
    }

    #[test]
    fn new_tags_skip_the_ones_in_use() {
        let t = new_tag(7, |_| false).unwrap();
        let u = new_tag(7, |x| x == (t + 1) & TAG_MASK || x == (t + 2) & TAG_MASK).unwrap();
        assert_ne!(u, t);
        assert_ne!(u, (t + 1) & TAG_MASK);
        assert_ne!(u, (t + 2) & TAG_MASK);
        let e = new_tag(7, |_| true).unwrap_err();
        assert!(e.to_string().contains("QP 0x7"), "{e}");
    }

    #[test]
    fn queue_full_is_its_own_variant() {
        let mut r = ring(2);
        post(&mut r, 1, true);
        post(&mut r, 2, true);
        match queue_full(&r, 0x11, 3) {
            Error::QueueFull {
                queue: WorkQueue::Send,
                qp_num: 0x11,
                outstanding: 2,
                capacity: 2,
                requested: 3,
                ..
            } => {}
            e => panic!("{e:?}"),
        }
    }
}
