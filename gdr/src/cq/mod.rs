//! Completion queues: batch polling, typed completions, and event-driven waits through a
//! completion channel.
//!
//! Polling a completion is what releases the regions its work request kept alive (soundness
//! rule 1): a queue pair registers its in-flight table with its completion queues, and
//! [`CompletionQueue::poll`] hands each reaped completion back to it. A completion is attributed
//! beyond doubt (QP number, incarnation tag and sequence number, see `inflight.rs`); one that
//! cannot be attributed releases nothing. Polling holds the queue's lock from `ibv_poll_cq` until
//! every reaped completion has retired its request, so threads polling one queue concurrently
//! neither lose nor reorder completions.

use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gdr_sys::ibv;

use crate::device::Context;
use crate::error::{Error, Hint, Result};
use crate::return_code;

mod completion;
pub(crate) mod dispatch;
mod status;

pub use completion::Completion;
pub use status::{WcOpcode, WcStatus};

use dispatch::{Attribution, Dispatch};

/// A completion channel: lets a thread sleep until a completion queue has an event.
struct Channel(NonNull<ibv::ibv_comp_channel>);

/// A completion queue (`ibv_cq`), optionally with its own completion channel.
pub struct CompletionQueue {
    cq: NonNull<ibv::ibv_cq>,
    channel: Option<Channel>,
    depth: u32,
    dispatch: Mutex<Dispatch>,
    ctx: Arc<Context>,
}

// SAFETY: ibv_cq may be polled and armed from any thread (providers lock internally); our own
// state is behind a Mutex, which polling holds across ibv_poll_cq.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("device", &self.ctx.name())
            .field("depth", &self.depth)
            .field("channel", &self.channel.is_some())
            .finish()
    }
}

/// Completions fetched from the device per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// Most completions [`CompletionQueue::wait_for`] reserves room for up front (it grows beyond
/// on demand: a huge `n` must not allocate, or abort, before anything arrived).
const WAIT_PREALLOC: usize = 1024;

impl CompletionQueue {
    /// A completion queue with room for `depth` completions, polled only.
    pub fn new(ctx: &Arc<Context>, depth: u32) -> Result<Arc<CompletionQueue>> {
        Self::create(ctx, depth, false)
    }

    /// A completion queue with its own completion channel, for [`CompletionQueue::wait`].
    pub fn with_channel(ctx: &Arc<Context>, depth: u32) -> Result<Arc<CompletionQueue>> {
        Self::create(ctx, depth, true)
    }

    fn create(ctx: &Arc<Context>, depth: u32, with_channel: bool) -> Result<Arc<CompletionQueue>> {
        if depth == 0 {
            return Err(Error::invalid(
                "completion queue depth 0",
                "use at least the sum of the queue depths it serves",
            ));
        }
        let channel = if with_channel {
            // SAFETY: valid context.
            let ch = unsafe { ibv::ibv_create_comp_channel(ctx.as_raw()) };
            let ch = return_code::non_null(
                "ibv_create_comp_channel",
                ch,
                || format!("device={}", ctx.name()),
                return_code::no_hint,
            )?;
            let channel = Channel(ch);
            // Non-blocking, so a waiter whose event another waiter took sees EAGAIN instead of
            // sleeping in ibv_get_cq_event until the next event.
            // SAFETY: the channel is valid; fcntl on its own descriptor.
            let fd = unsafe { (*ch.as_ptr()).fd };
            // SAFETY: as above.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            let rc = if flags < 0 {
                -1
            } else {
                // SAFETY: as above.
                unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }
            };
            if let Err(e) = return_code::check(
                "fcntl",
                rc,
                || format!("completion channel fd {fd}, F_SETFL O_NONBLOCK"),
                return_code::no_hint,
            ) {
                // SAFETY: created above, not used by any CQ.
                unsafe { ibv::ibv_destroy_comp_channel(ch.as_ptr()) };
                return Err(e);
            }
            Some(channel)
        } else {
            None
        };
        let ch_ptr = channel
            .as_ref()
            .map_or(std::ptr::null_mut(), |c| c.0.as_ptr());
        // SAFETY: valid context; the channel (if any) lives as long as the CQ (dropped after it).
        let cq = unsafe {
            ibv::ibv_create_cq(ctx.as_raw(), depth as i32, std::ptr::null_mut(), ch_ptr, 0)
        };
        let cq = match return_code::non_null(
            "ibv_create_cq",
            cq,
            || format!("device={}, cqe={depth}", ctx.name()),
            |_| Hint::new("the depth may exceed the device's max_cqe (`ibv_devinfo -v`)"),
        ) {
            Ok(cq) => cq,
            Err(e) => {
                if let Some(ch) = channel {
                    // SAFETY: created above, not used by any CQ.
                    unsafe { ibv::ibv_destroy_comp_channel(ch.0.as_ptr()) };
                }
                return Err(e);
            }
        };
        // SAFETY: the CQ is valid; `cqe` is the real size the provider allocated.
        let real = unsafe { (*cq.as_ptr()).cqe }.max(0) as u32;
        Ok(Arc::new(CompletionQueue {
            cq,
            channel,
            depth: real,
            dispatch: Mutex::new(Dispatch::default()),
            ctx: ctx.clone(),
        }))
    }

    /// The number of completions it can hold (as the provider rounded it).
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The raw `ibv_cq`.
    pub fn as_raw(&self) -> *mut ibv::ibv_cq {
        self.cq.as_ptr()
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Reaps up to `out.len()` completions without blocking; returns how many were written.
    ///
    /// Each reaped completion releases the regions of its work request (and of the unsignalled
    /// requests before it on the same queue). Completions of requests that gdr signalled on its
    /// own (to bound the unsignalled run) are consumed here, unless they failed. Completions that
    /// belong to no live queue pair (a destroyed one, or requests from before a
    /// [`crate::qp::QueuePair::reset`]) are dropped and release nothing.
    ///
    /// Safe to call from several threads: the queue is polled under its lock, so each completion
    /// is reported exactly once, to one caller, in the device's order.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        let mut d = self.lock_dispatch();
        let mut filled = 0;
        while filled < out.len() {
            match d.backlog.pop_front() {
                Some(c) => {
                    out[filled] = c;
                    filled += 1;
                }
                None => break,
            }
        }
        let mut wcs: [MaybeUninit<ibv::ibv_wc>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        while filled < out.len() {
            let want = (out.len() - filled).min(POLL_BATCH);
            // SAFETY: `wcs` has room for `want` entries; the provider initialises the first `n`.
            let n =
                unsafe { ibv::ibv_poll_cq(self.cq.as_ptr(), want as i32, wcs.as_mut_ptr().cast()) };
            if n < 0 {
                if filled > 0 {
                    // Hand out what was reaped; the error repeats on the next poll.
                    break;
                }
                return Err(Error::verbs(
                    "ibv_poll_cq",
                    format!("device={}", self.ctx.name()),
                    return_code::errno_of(n),
                    "the CQ overran: make it deeper than the sum of the queues it serves",
                ));
            }
            for wc in &wcs[..n as usize] {
                // SAFETY: the first `n` entries were written by ibv_poll_cq.
                let wc = unsafe { wc.assume_init_ref() };
                if let Some(c) = translate(&d, wc) {
                    out[filled] = c;
                    filled += 1;
                }
            }
            if (n as usize) < want {
                // The queue is empty now: no completion of a buried incarnation is left in it.
                d.drained();
                break;
            }
        }
        Ok(filled)
    }

    /// Polls until at least `n` completions have been reaped or `timeout` passes; returns them.
    /// Sleeps on the completion channel when there is one, spins otherwise. On a timeout the
    /// completions that did arrive are kept: the next poll returns them first.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Result<Vec<Completion>> {
        // No deadline when `timeout` reaches past what an Instant can hold.
        let deadline = Instant::now().checked_add(timeout);
        let mut got = Vec::with_capacity(n.min(WAIT_PREALLOC));
        let mut buf = [Completion::default(); 16];
        while got.len() < n {
            let k = self.poll(&mut buf[..(n - got.len()).min(16)])?;
            got.extend_from_slice(&buf[..k]);
            if got.len() >= n {
                break;
            }
            let now = Instant::now();
            let left = match deadline {
                Some(d) if now >= d => {
                    let arrived = got.len();
                    self.put_back(got);
                    return Err(Error::Timeout {
                        what: format!(
                            "waiting for {n} completions on {} ({arrived} arrived, kept for the next poll)",
                            self.ctx.name(),
                        ),
                        after: timeout,
                        hint: Hint::new(
                            "is the peer alive and connected? were the requests posted signalled?",
                        ),
                    });
                }
                Some(d) => d - now,
                None => Duration::MAX,
            };
            if k == 0 {
                if self.channel.is_some() {
                    self.arm()?;
                    // Re-poll after arming so a completion that raced the arm is not missed.
                    let k = self.poll(&mut buf[..(n - got.len()).min(16)])?;
                    got.extend_from_slice(&buf[..k]);
                    if k == 0 {
                        self.wait(left)?;
                    }
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        Ok(got)
    }

    /// Polls until the completion of the request with id `wr_id` arrives, or `timeout` passes;
    /// returns it (a failed one too: check [`Completion::result`]). Completions of other requests
    /// that arrive meanwhile are kept, in order, for the next poll. Only signalled requests (and
    /// failed unsignalled ones) are ever reported.
    ///
    /// # Errors
    /// [`Error::Timeout`] (every completion that arrived is kept), or a polling error.
    pub fn wait_for_id(&self, wr_id: u64, timeout: Duration) -> Result<Completion> {
        let deadline = Instant::now().checked_add(timeout);
        let mut others = Vec::new();
        let mut buf = [Completion::default(); 16];
        loop {
            let k = match self.poll(&mut buf) {
                Ok(k) => k,
                Err(e) => {
                    self.put_back(others);
                    return Err(e);
                }
            };
            for (i, c) in buf[..k].iter().enumerate() {
                if c.wr_id == wr_id {
                    // What came after it in this batch goes back behind the others.
                    others.extend_from_slice(&buf[i + 1..k]);
                    let found = *c;
                    self.put_back(others);
                    return Ok(found);
                }
                others.push(*c);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let arrived = others.len();
                self.put_back(others);
                return Err(Error::Timeout {
                    what: format!(
                        "waiting for the completion of wr_id {wr_id} on {} ({arrived} others arrived, kept for the next poll)",
                        self.ctx.name()
                    ),
                    after: timeout,
                    hint: Hint::new("was the request posted signalled, on a queue pair reporting to this queue?"),
                });
            }
            if k == 0 {
                std::hint::spin_loop();
            }
        }
    }

    /// The completion channel's file descriptor (non-blocking), when there is a channel.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn channel_fd(&self) -> Option<libc::c_int> {
        // SAFETY: the channel is valid while self lives.
        self.channel
            .as_ref()
            .map(|ch| unsafe { (*ch.0.as_ptr()).fd })
    }

    /// Returns reaped completions to the front of the queue, for the next poll.
    fn put_back(&self, done: Vec<Completion>) {
        let mut d = self.lock_dispatch();
        for c in done.into_iter().rev() {
            d.backlog.push_front(c);
        }
    }

    pub(crate) fn lock_dispatch(&self) -> MutexGuard<'_, Dispatch> {
        self.dispatch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Requests an event on the channel for the next completion (`ibv_req_notify_cq`).
    pub fn arm(&self) -> Result<()> {
        if self.channel.is_none() {
            return Err(Error::invalid(
                "arm() on a completion queue without a channel",
                "create it with CompletionQueue::with_channel",
            ));
        }
        // SAFETY: valid CQ.
        let rc = unsafe { ibv::ibv_req_notify_cq(self.cq.as_ptr(), 0) };
        return_code::check(
            "ibv_req_notify_cq",
            rc,
            || format!("device={}", self.ctx.name()),
            return_code::no_hint,
        )
    }

    /// Sleeps until the armed completion queue has an event or `timeout` passes. Returns whether
    /// an event arrived (`false` also when another thread waiting on the same queue took it).
    /// Call [`CompletionQueue::arm`] first and poll afterwards.
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        let ch = self.channel.as_ref().ok_or_else(|| {
            Error::invalid(
                "wait() on a completion queue without a channel",
                "create it with CompletionQueue::with_channel",
            )
        })?;
        // SAFETY: the channel is valid while self lives.
        let fd = unsafe { (*ch.0.as_ptr()).fd };
        if !wait_readable(fd, timeout, "completion channel")? {
            return Ok(false);
        }
        let mut cq: *mut ibv::ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: the fd is readable, so ibv_get_cq_event does not block; out-pointers are valid.
        let rc = unsafe { ibv::ibv_get_cq_event(ch.0.as_ptr(), &mut cq, &mut ctx) };
        if rc != 0 && return_code::errno_of(rc) == libc::EAGAIN {
            return Ok(false);
        }
        return_code::check(
            "ibv_get_cq_event",
            rc,
            || format!("device={}", self.ctx.name()),
            return_code::no_hint,
        )?;
        // SAFETY: acknowledges the one event we just took from this CQ.
        unsafe { ibv::ibv_ack_cq_events(cq, 1) };
        Ok(true)
    }
}

/// The application's view of a polled completion, or `None` when it is consumed here (a request
/// gdr signalled on its own that succeeded) or belongs to no live request.
fn translate(d: &Dispatch, wc: &ibv::ibv_wc) -> Option<Completion> {
    let status = WcStatus::from_raw(wc.status);
    let done = match d.attribute(wc.qp_num, wc.wr_id) {
        Attribution::Retired(done) => done,
        Attribution::Stale => {
            log::debug!(
                "completion ({status}) of an earlier incarnation of QP {:#x} dropped",
                wc.qp_num
            );
            return None;
        }
        Attribution::Unknown => {
            log::warn!(
                "completion ({status}, wr_id {:#x}) for no request in flight on QP {:#x} dropped",
                wc.wr_id,
                wc.qp_num
            );
            return None;
        }
    };
    if status == WcStatus::Success && !done.user_signaled {
        return None;
    }
    let has_imm = wc.wc_flags & ibv::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
    Some(Completion {
        wr_id: done.user_wr_id,
        status,
        opcode: WcOpcode::from_raw(wc.opcode),
        byte_len: wc.byte_len,
        // SAFETY: with IBV_WC_WITH_IMM the union holds immediate data (network byte order).
        imm: has_imm.then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })),
        qp_num: wc.qp_num,
        vendor_err: wc.vendor_err,
        is_recv: done.queue == crate::qp::WorkQueue::Recv,
        owned: done.owned,
    })
}

impl Context {
    /// A completion queue with room for `depth` completions, polled only (the same as
    /// [`CompletionQueue::new`]).
    #[deprecated(
        since = "0.1.0",
        note = "one way to build each object: use CompletionQueue::new(&ctx, depth)"
    )]
    pub fn create_cq(self: &Arc<Self>, depth: u32) -> Result<Arc<CompletionQueue>> {
        CompletionQueue::new(self, depth)
    }

    /// A completion queue with its own completion channel (the same as
    /// [`CompletionQueue::with_channel`]).
    #[deprecated(
        since = "0.1.0",
        note = "one way to build each object: use CompletionQueue::with_channel(&ctx, depth)"
    )]
    pub fn create_cq_with_channel(self: &Arc<Self>, depth: u32) -> Result<Arc<CompletionQueue>> {
        CompletionQueue::with_channel(self, depth)
    }
}

/// The dispatch state of one or two completion queues (a queue pair's send and receive queues),
/// locked in one global order (by address) so that two threads locking the same pair cannot
/// deadlock. Lock order everywhere: completion queues, then a queue pair's rings.
pub(crate) struct CqLocks<'a> {
    first: MutexGuard<'a, Dispatch>,
    second: Option<MutexGuard<'a, Dispatch>>,
    /// The queue `first` belongs to (as an address, for [`CqLocks::of`]).
    first_cq: usize,
}

impl CqLocks<'_> {
    /// The locked dispatch state of `cq` (one of the two queues locked).
    pub(crate) fn of(&self, cq: &CompletionQueue) -> &Dispatch {
        match &self.second {
            Some(second) if cq as *const CompletionQueue as usize != self.first_cq => second,
            _ => &self.first,
        }
    }

    /// Each locked queue's dispatch state.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Dispatch> {
        std::iter::once(&mut *self.first).chain(self.second.as_deref_mut())
    }

    /// Each locked queue's dispatch state, shared.
    pub(crate) fn all(&self) -> Vec<&Dispatch> {
        std::iter::once(&*self.first)
            .chain(self.second.as_deref())
            .collect()
    }
}

/// Locks `a` and `b` (once when they are the same queue).
pub(crate) fn lock_both<'a>(a: &'a CompletionQueue, b: &'a CompletionQueue) -> CqLocks<'a> {
    if std::ptr::eq(a, b) {
        return CqLocks {
            first: a.lock_dispatch(),
            second: None,
            first_cq: a as *const CompletionQueue as usize,
        };
    }
    let (x, y) = if (a as *const CompletionQueue) < (b as *const CompletionQueue) {
        (a, b)
    } else {
        (b, a)
    };
    let first = x.lock_dispatch();
    CqLocks {
        first,
        second: Some(y.lock_dispatch()),
        first_cq: x as *const CompletionQueue as usize,
    }
}

/// Waits until `fd` is readable or `timeout` passes; returns whether it became readable. A wait
/// a signal interrupts (EINTR) returns `false` early: callers loop until their own deadline.
pub(crate) fn wait_readable(fd: libc::c_int, timeout: Duration, what: &str) -> Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(Error::io(format!("poll on the {what}"), e));
    }
    Ok(rc > 0)
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc to it, so none is alive any more.
        let rc = unsafe { ibv::ibv_destroy_cq(self.cq.as_ptr()) };
        if !return_code::teardown("ibv_destroy_cq", self.ctx.name(), rc) {
            // The CQ still exists and may use its channel: keep the channel too.
            return;
        }
        if let Some(ch) = self.channel.take() {
            // SAFETY: the CQ that used the channel is gone.
            unsafe { ibv::ibv_destroy_comp_channel(ch.0.as_ptr()) };
        }
    }
}
