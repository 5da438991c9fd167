//! Waiting for rdma_cm events: the event channel, its backlog of events read for other ids, and
//! the two ways a connection flow waits (blocking, or through tokio).

use super::*;

/// Longest single `poll` while waiting for an event. Waits of any length (up to "forever",
/// `Duration::MAX`) are many polls, so no timeout overflows poll's `int` milliseconds, and a
/// waiter notices soon when another thread has read its event into the backlog.
pub(super) const POLL_SLICE: Duration = Duration::from_millis(100);

/// Most events kept for ids other than the reader's (see [`Backlog`]).
pub(super) const BACKLOG_CAP: usize = 256;

/// Which events a waiter takes.
pub(super) type Wanted<'a> = dyn Fn(&Event) -> bool + Send + Sync + 'a;

/// The error of a wait for an rdma_cm event that ran out of time.
pub(super) fn event_timeout(timeout: Duration) -> Error {
    Error::Timeout {
        what: "rdma_cm event".into(),
        after: timeout,
        hint: Hint::new("is the peer listening on that address and port, and reachable over RDMA?"),
    }
}

/// How a connection flow waits for its next event: [`Blocking`] polls the channel's descriptor
/// in slices; with the `tokio` feature, [`Tokio`] awaits it through tokio. The flows (resolve,
/// connect, next request, accept) are written once, as async functions over this.
pub(super) trait EventWait: Sync {
    fn event<'a>(
        &'a self,
        channel: &'a EventChannel,
        deadline: Option<Instant>,
        timeout: Duration,
        wanted: &'a Wanted<'a>,
    ) -> impl std::future::Future<Output = Result<Event>> + Send + 'a;
}

/// Waits by blocking the thread (the blocking API): its futures are ready when first polled.
pub(super) struct Blocking;

impl EventWait for Blocking {
    fn event<'a>(
        &'a self,
        channel: &'a EventChannel,
        deadline: Option<Instant>,
        timeout: Duration,
        wanted: &'a Wanted<'a>,
    ) -> impl std::future::Future<Output = Result<Event>> + Send + 'a {
        std::future::ready(channel.wait_for(deadline, timeout, wanted))
    }
}

/// Runs a flow over [`Blocking`] to its end on this thread (its waits block inside the poll, so
/// the flow finishes in the first poll; polling again is only a fallback).
pub(super) fn block_now<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

/// Waits by awaiting the channel's descriptor on tokio (a duplicate of it, registered for the
/// wait: rdma_cm waits are rare).
#[cfg(feature = "tokio")]
pub(super) struct Tokio;

/// A duplicate of an event channel's descriptor, owned, for tokio's `AsyncFd`.
#[cfg(feature = "tokio")]
pub(super) struct DupFd(std::os::fd::OwnedFd);

#[cfg(feature = "tokio")]
impl std::os::fd::AsRawFd for DupFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.0)
    }
}

#[cfg(feature = "tokio")]
impl EventWait for Tokio {
    async fn event<'a>(
        &'a self,
        channel: &'a EventChannel,
        deadline: Option<Instant>,
        timeout: Duration,
        wanted: &'a Wanted<'a>,
    ) -> Result<Event> {
        use std::os::fd::FromRawFd;
        loop {
            if let Some(e) = channel.take(wanted)? {
                return Ok(e);
            }
            let left = time_left(deadline);
            if left.is_zero() {
                return Err(event_timeout(timeout));
            }
            // SAFETY: the channel's descriptor is open while `channel` lives; dup has no
            // memory-safety precondition.
            let dup = unsafe { libc::fcntl(channel.fd(), libc::F_DUPFD_CLOEXEC, 0) };
            if dup < 0 {
                return Err(Error::io(
                    "duplicating the rdma_cm event channel's descriptor",
                    std::io::Error::last_os_error(),
                ));
            }
            // SAFETY: `dup` is a new descriptor owned from here on.
            let owned = DupFd(unsafe { std::os::fd::OwnedFd::from_raw_fd(dup) });
            let afd = crate::aio::watch(owned, "the rdma_cm event channel")?;
            // Readable, or a slice passed: look again either way. (tokio panics creating a
            // timer on a runtime without one: that becomes an error.)
            let slice = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                tokio::time::timeout(left.min(POLL_SLICE), afd.readable())
            }))
            .map_err(|_| {
                Error::invalid(
                    "the tokio runtime has no timer",
                    "build it with enable_time() (or enable_all())",
                )
            })?;
            let _ = slice.await;
        }
    }
}

/// Events read from a shared channel for an id other than the reader's: an accepted
/// connection's `ESTABLISHED` that the listener's `next_request` read, a second client's
/// `CONNECT_REQUEST` that arrived during `accept`. Each waiter takes its own; a destroyed id's
/// events are purged so a later id at the same address never sees them.
#[derive(Default)]
pub(super) struct Backlog {
    pub(super) events: std::collections::VecDeque<Event>,
}

impl Backlog {
    /// The oldest event `wanted` accepts.
    pub(super) fn take(&mut self, wanted: &dyn Fn(&Event) -> bool) -> Option<Event> {
        let i = self.events.iter().position(wanted)?;
        self.events.remove(i)
    }

    /// Keeps `e`; returns the event that did not fit (the oldest) when the backlog is full.
    pub(super) fn push(&mut self, e: Event) -> Option<Event> {
        self.events.push_back(e);
        if self.events.len() > BACKLOG_CAP {
            self.events.pop_front()
        } else {
            None
        }
    }

    /// Removes every event of `id`.
    pub(super) fn purge(&mut self, id: *mut ibv::rdma_cm_id) -> Vec<Event> {
        let (gone, kept): (Vec<Event>, Vec<Event>) = std::mem::take(&mut self.events)
            .into_iter()
            .partition(|e| e.id == id);
        self.events = kept.into();
        gone
    }
}

/// An rdma_cm event channel (non-blocking) and the events read for ids other than the reader's.
pub(super) struct EventChannel {
    pub(super) ch: NonNull<ibv::rdma_event_channel>,
    pub(super) backlog: std::sync::Mutex<Backlog>,
}

// SAFETY: the channel is a file descriptor plus library state that librdmacm locks; the
// backlog is behind a mutex.
unsafe impl Send for EventChannel {}
// SAFETY: as above: reads are non-blocking calls into librdmacm, made under the backlog lock.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    pub(super) fn new() -> Result<Arc<EventChannel>> {
        // SAFETY: no preconditions.
        let ch = unsafe { ibv::rdma_create_event_channel() };
        let ch = non_null("rdma_create_event_channel", ch, String::new, |_| {
            Hint::new("is /dev/infiniband/rdma_cm present? load rdma_ucm")
        })?;
        let channel = Arc::new(EventChannel {
            ch,
            backlog: Default::default(),
        });
        // Non-blocking, so that a reader whose event another thread took does not block in
        // rdma_get_cm_event (as rdma_cm(7) suggests for polled channels).
        let fd = channel.fd();
        // SAFETY: fcntl on the channel's own descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        let rc = if flags < 0 {
            -1
        } else {
            // SAFETY: as above.
            unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }
        };
        if rc < 0 {
            return Err(Error::io(
                "making the rdma_cm event channel non-blocking",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(channel)
    }

    pub(super) fn fd(&self) -> libc::c_int {
        // SAFETY: the channel is valid while self lives.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    pub(super) fn backlog(&self) -> std::sync::MutexGuard<'_, Backlog> {
        self.backlog.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads one event if one is ready: copies what we need and acknowledges it.
    pub(super) fn read_one(&self) -> Result<Option<Event>> {
        let mut ev: *mut ibv::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: valid channel; non-blocking; `ev` receives an event we acknowledge below.
        let rc = unsafe { ibv::rdma_get_cm_event(self.ch.as_ptr(), &mut ev) };
        if rc != 0 && errno_of(rc) == libc::EAGAIN {
            return Ok(None);
        }
        check("rdma_get_cm_event", rc, String::new, no_hint)?;
        if ev.is_null() {
            return Err(Error::verbs(
                "rdma_get_cm_event",
                "",
                libc::EIO,
                "librdmacm returned success without an event",
            ));
        }
        // SAFETY: `ev` is a valid event until acknowledged.
        let e = unsafe { &*ev };
        let private = if matches!(
            e.event,
            ibv::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST
                | ibv::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_RESPONSE
                | ibv::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED
        ) {
            // SAFETY: for connection events the `conn` member is active; private_data points to
            // private_data_len bytes (or is NULL).
            let conn = unsafe { &e.param.conn };
            if conn.private_data.is_null() || conn.private_data_len == 0 {
                Vec::new()
            } else {
                // SAFETY: as above.
                unsafe {
                    std::slice::from_raw_parts(
                        conn.private_data.cast::<u8>(),
                        conn.private_data_len as usize,
                    )
                }
                .to_vec()
            }
        } else {
            Vec::new()
        };
        let out = Event {
            kind: e.event,
            status: e.status,
            id: e.id,
            private,
        };
        // SAFETY: acknowledges the event we took; nothing refers to it afterwards.
        let rc = unsafe { ibv::rdma_ack_cm_event(ev) };
        if rc != 0 {
            log::warn!(
                "rdma_ack_cm_event failed: {}",
                crate::error::errno_text(errno_of(rc))
            );
        }
        Ok(Some(out))
    }

    /// The oldest event `wanted` accepts, if one is queued or readable now (events for others go
    /// to the backlog); never waits.
    pub(super) fn take(&self, wanted: &Wanted<'_>) -> Result<Option<Event>> {
        let mut backlog = self.backlog();
        if let Some(e) = backlog.take(wanted) {
            return Ok(Some(e));
        }
        while let Some(e) = self.read_one()? {
            if wanted(&e) {
                return Ok(Some(e));
            }
            if let Some(old) = backlog.push(e) {
                log::warn!(
                    "rdma_cm: more than {BACKLOG_CAP} events nobody waits for; dropping {}",
                    event_name(old.kind)
                );
                old.dispose();
            }
        }
        Ok(None)
    }

    /// Waits until `deadline` (`None`: forever) for the oldest event `wanted` accepts; events for
    /// others go to the backlog. `timeout` is what the caller asked for, for the error message.
    pub(super) fn wait_for(
        &self,
        deadline: Option<Instant>,
        timeout: Duration,
        wanted: &Wanted<'_>,
    ) -> Result<Event> {
        loop {
            if let Some(e) = self.take(wanted)? {
                return Ok(e);
            }
            let left = time_left(deadline);
            if left.is_zero() {
                return Err(event_timeout(timeout));
            }
            match crate::cq::wait_readable(self.fd(), left.min(POLL_SLICE), "rdma_cm event channel")
            {
                // A signal interrupted the poll: wait again.
                Err(e) if e.errno() == Some(libc::EINTR) => {}
                other => {
                    other?;
                }
            }
        }
    }

    /// Forgets the events of a destroyed id.
    pub(super) fn purge(&self, id: *mut ibv::rdma_cm_id) {
        for e in self.backlog().purge(id) {
            e.dispose();
        }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        for e in std::mem::take(&mut self.backlog().events) {
            e.dispose();
        }
        // SAFETY: every id on this channel holds an Arc to it, so none is left; the connection
        // requests nobody took were rejected and destroyed above.
        unsafe { ibv::rdma_destroy_event_channel(self.ch.as_ptr()) }
    }
}

/// What gdr keeps of an rdma_cm event (it is acknowledged as soon as it is read).
pub(super) struct Event {
    pub(super) kind: u32,
    pub(super) status: i32,
    pub(super) id: *mut ibv::rdma_cm_id,
    pub(super) private: Vec<u8>,
}

// SAFETY: `id` is a handle compared by address or passed back to librdmacm, which locks its
// own state; nothing is dereferenced through it outside librdmacm calls.
unsafe impl Send for Event {}

impl Event {
    /// Disposes of an event nobody will take: a connection request's new id is rejected and
    /// destroyed (its peer is told at once instead of timing out); others are dropped.
    pub(super) fn dispose(self) {
        if self.kind != ibv::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST || self.id.is_null()
        {
            return;
        }
        // SAFETY: a connection request's id is new and owned by nobody else: reject, destroy.
        let rc = unsafe { ibv::rdma_reject(self.id, std::ptr::null(), 0) };
        if rc != 0 {
            log::debug!("rdma_reject: {}", crate::error::errno_text(errno_of(rc)));
        }
        // SAFETY: as above; its only event was acknowledged when it was read.
        let rc = unsafe { ibv::rdma_destroy_id(self.id) };
        teardown("rdma_destroy_id", "unclaimed connection request", rc);
    }
}

pub(super) fn event_name(kind: u32) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    unsafe { std::ffi::CStr::from_ptr(ibv::rdma_event_str(kind)) }
        .to_string_lossy()
        .into_owned()
}
