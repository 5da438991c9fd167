//! rdma_cm: connect by IP address and port, as `rping`/`ucmatose` peers do.
//!
//! The connection manager resolves the peer's IP address to a device, port and route, then runs
//! the connection handshake; gdr builds the queue pair itself (on the device rdma_cm chose) and
//! drives it through INIT -> RTR -> RTS with the attributes rdma_cm computes. Each side may
//! advertise one region in the connection's private data.
//!
//! ```no_run
//! use std::time::Duration;
//! use gdr::{connect::cm, cq::CompletionQueue, pd::ProtectionDomain, qp::QueuePair};
//! // Client: resolve, build on the resolved device, connect.
//! let pending = cm::Connector::resolve("10.0.0.1:7471".parse().unwrap(), Duration::from_secs(5))?;
//! let pd = ProtectionDomain::new(pending.context())?;
//! let cq = CompletionQueue::new(pending.context(), 64)?;
//! let qp = QueuePair::builder(&pd, &cq, &cq).port(pending.port()).build()?;
//! let conn = pending.connect(qp, None)?;
//! println!("server region: {:?}", conn.remote_region());
//! # Ok::<(), gdr::Error>(())
//! ```

use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr_sys::ibv;

use super::{deadline_after, millis, time_left};
use crate::device::Context;
use crate::error::{Error, Hint, Result};
use crate::mr::RemoteRegion;
use crate::qp::{QpState, QueuePair};
use crate::return_code::{check, errno_of, no_hint, non_null, teardown};

/// Longest single `poll` while waiting for an event. Waits of any length (up to "forever",
/// `Duration::MAX`) are many polls, so no timeout overflows poll's `int` milliseconds, and a
/// waiter notices soon when another thread has read its event into the backlog.
const POLL_SLICE: Duration = Duration::from_millis(100);

/// Most events kept for ids other than the reader's (see [`Backlog`]).
const BACKLOG_CAP: usize = 256;

/// Which events a waiter takes.
type Wanted<'a> = dyn Fn(&Event) -> bool + Send + Sync + 'a;

/// The error of a wait for an rdma_cm event that ran out of time.
fn event_timeout(timeout: Duration) -> Error {
    Error::Timeout {
        what: "rdma_cm event".into(),
        millis: millis(timeout),
        hint: Hint::new("is the peer listening on that address and port, and reachable over RDMA?"),
    }
}

/// How a connection flow waits for its next event: [`Blocking`] polls the channel's descriptor
/// in slices; with the `tokio` feature, [`Tokio`] awaits it through tokio. The flows (resolve,
/// connect, next request, accept) are written once, as async functions over this.
trait EventWait: Sync {
    fn event<'a>(
        &'a self,
        channel: &'a EventChannel,
        deadline: Option<Instant>,
        timeout: Duration,
        wanted: &'a Wanted<'a>,
    ) -> impl std::future::Future<Output = Result<Event>> + Send + 'a;
}

/// Waits by blocking the thread (the blocking API): its futures are ready when first polled.
struct Blocking;

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
fn block_now<F: std::future::Future>(f: F) -> F::Output {
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
struct Tokio;

/// A duplicate of an event channel's descriptor, owned, for tokio's `AsyncFd`.
#[cfg(feature = "tokio")]
struct DupFd(std::os::fd::OwnedFd);

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
struct Backlog {
    events: std::collections::VecDeque<Event>,
}

impl Backlog {
    /// The oldest event `wanted` accepts.
    fn take(&mut self, wanted: &dyn Fn(&Event) -> bool) -> Option<Event> {
        let i = self.events.iter().position(wanted)?;
        self.events.remove(i)
    }

    /// Keeps `e`; returns the event that did not fit (the oldest) when the backlog is full.
    fn push(&mut self, e: Event) -> Option<Event> {
        self.events.push_back(e);
        if self.events.len() > BACKLOG_CAP {
            self.events.pop_front()
        } else {
            None
        }
    }

    /// Removes every event of `id`.
    fn purge(&mut self, id: *mut ibv::rdma_cm_id) -> Vec<Event> {
        let (gone, kept): (Vec<Event>, Vec<Event>) = std::mem::take(&mut self.events)
            .into_iter()
            .partition(|e| e.id == id);
        self.events = kept.into();
        gone
    }
}

/// An rdma_cm event channel (non-blocking) and the events read for ids other than the reader's.
struct EventChannel {
    ch: NonNull<ibv::rdma_event_channel>,
    backlog: std::sync::Mutex<Backlog>,
}

// SAFETY: the channel is a file descriptor plus library state that librdmacm locks; the
// backlog is behind a mutex.
unsafe impl Send for EventChannel {}
// SAFETY: as above: reads are non-blocking calls into librdmacm, made under the backlog lock.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    fn new() -> Result<Arc<EventChannel>> {
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

    fn fd(&self) -> libc::c_int {
        // SAFETY: the channel is valid while self lives.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    fn backlog(&self) -> std::sync::MutexGuard<'_, Backlog> {
        self.backlog.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads one event if one is ready: copies what we need and acknowledges it.
    fn read_one(&self) -> Result<Option<Event>> {
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
    fn take(&self, wanted: &Wanted<'_>) -> Result<Option<Event>> {
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
    fn wait_for(
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
    fn purge(&self, id: *mut ibv::rdma_cm_id) {
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
struct Event {
    kind: u32,
    status: i32,
    id: *mut ibv::rdma_cm_id,
    private: Vec<u8>,
}

// SAFETY: `id` is a handle compared by address or passed back to librdmacm, which locks its
// own state; nothing is dereferenced through it outside librdmacm calls.
unsafe impl Send for Event {}

impl Event {
    /// Disposes of an event nobody will take: a connection request's new id is rejected and
    /// destroyed (its peer is told at once instead of timing out); others are dropped.
    fn dispose(self) {
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

fn event_name(kind: u32) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    unsafe { std::ffi::CStr::from_ptr(ibv::rdma_event_str(kind)) }
        .to_string_lossy()
        .into_owned()
}

/// An `rdma_cm_id`, destroyed on drop.
struct CmId {
    id: NonNull<ibv::rdma_cm_id>,
    channel: Arc<EventChannel>,
}

// SAFETY: cm ids may be used from any thread; librdmacm locks its own state.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl CmId {
    fn new(channel: &Arc<EventChannel>) -> Result<Arc<CmId>> {
        let mut id: *mut ibv::rdma_cm_id = std::ptr::null_mut();
        // SAFETY: valid channel and out-pointer.
        let rc = unsafe {
            ibv::rdma_create_id(
                channel.ch.as_ptr(),
                &mut id,
                std::ptr::null_mut(),
                ibv::rdma_port_space::RDMA_PS_TCP,
            )
        };
        check("rdma_create_id", rc, || "ps=RDMA_PS_TCP".into(), no_hint)?;
        let id = non_null("rdma_create_id", id, || "ps=RDMA_PS_TCP".into(), no_hint)?;
        Ok(Arc::new(CmId {
            id,
            channel: channel.clone(),
        }))
    }

    fn raw(&self) -> *mut ibv::rdma_cm_id {
        self.id.as_ptr()
    }

    /// The context librdmacm opened for this id (after address resolution or a connect request).
    fn context(self: &Arc<Self>) -> Result<Arc<Context>> {
        // SAFETY: the id is valid; `verbs` is set once the id is bound to a device.
        let verbs = unsafe { (*self.raw()).verbs };
        let verbs = NonNull::new(verbs).ok_or_else(|| {
            Error::invalid("the rdma_cm id is not bound to a device yet", Hint::NONE)
        })?;
        let owner: Arc<dyn std::any::Any + Send + Sync> = self.clone();
        // SAFETY: librdmacm keeps the context open while the id exists; `owner` keeps the id.
        Ok(unsafe { Context::borrowed(verbs, self.port(), owner) })
    }

    fn port(&self) -> u8 {
        // SAFETY: the id is valid.
        unsafe { (*self.raw()).port_num }
    }

    /// Moves `qp` to `state` with the attributes rdma_cm computes for this connection.
    fn transition(&self, qp: &QueuePair, state: u32, target: QpState) -> Result<()> {
        // SAFETY: plain old data.
        let mut attr: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        let mut mask = 0;
        // SAFETY: valid id and output pointers.
        let rc = unsafe { ibv::rdma_init_qp_attr(self.raw(), &mut attr, &mut mask) };
        check(
            "rdma_init_qp_attr",
            rc,
            || format!("state={target:?}"),
            no_hint,
        )?;
        qp.apply(&mut attr, mask, target)
    }

    async fn expect<W: EventWait>(
        &self,
        w: &W,
        want: u32,
        timeout: Duration,
        what: &str,
    ) -> Result<Event> {
        let me = self.raw() as usize;
        let wanted = move |e: &Event| e.id as usize == me;
        let e = w
            .event(&self.channel, deadline_after(timeout), timeout, &wanted)
            .await?;
        check_event(&e, want, what)?;
        Ok(e)
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: every event of this id was acknowledged; no QP was created through the id.
        let rc = unsafe { ibv::rdma_destroy_id(self.id.as_ptr()) };
        // Events other readers kept for this id must not reach a later id at the same address.
        self.channel.purge(self.id.as_ptr());
        if !teardown("rdma_destroy_id", "cm id", rc) {
            // The id still refers to its channel: keep the channel open rather than free it
            // under librdmacm.
            std::mem::forget(self.channel.clone());
        }
    }
}

fn check_event(e: &Event, want: u32, what: &str) -> Result<()> {
    use ibv::rdma_cm_event_type::*;
    if e.kind == want && e.status == 0 {
        return Ok(());
    }
    let hint = match e.kind {
        RDMA_CM_EVENT_ADDR_ERROR => "no RDMA device has a route to that address: give the RoCE netdev an IP address in the peer's subnet, or check the IB/IPoIB address",
        RDMA_CM_EVENT_ROUTE_ERROR => "route resolution failed: check the GID table and IP routing (`ip route get`), and the subnet manager on InfiniBand",
        RDMA_CM_EVENT_REJECTED => "the peer rejected the connection: is anything listening on that port (rping -s, gdr cm listener)?",
        RDMA_CM_EVENT_UNREACHABLE | RDMA_CM_EVENT_CONNECT_ERROR => "the peer did not answer the connection request: check that it runs and that RoCE traffic (UDP 4791) passes",
        _ => "see rdma_cm(7)",
    };
    let status = if e.status < 0 {
        crate::error::errno_text(e.status.saturating_neg())
    } else {
        format!("status {}", e.status)
    };
    Err(Error::Protocol {
        what: format!(
            "{what}: expected {}, got {} ({status})",
            event_name(want),
            event_name(e.kind)
        ),
        hint: Hint::new(hint),
    })
}

/// Private data each side sends: magic, version, and an optional region.
mod private {
    use crate::mr::RemoteRegion;

    const MAGIC: &[u8; 4] = b"GDRc";
    /// Encoded length (fits the 56 bytes a connect request carries).
    pub(super) const LEN: usize = 4 + 1 + 1 + 20;

    /// Encodes our private data, advertising `r` if given.
    pub(super) fn encode(r: Option<RemoteRegion>) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4] = 1;
        if let Some(r) = r {
            b[5] = 1;
            b[6..14].copy_from_slice(&r.addr.to_be_bytes());
            b[14..22].copy_from_slice(&r.len.to_be_bytes());
            b[22..26].copy_from_slice(&r.rkey.to_be_bytes());
        }
        b
    }

    /// The peer's region; `None` when the peer is not a gdr program (no magic) or sent none.
    /// Private data may be zero-padded by the transport: trailing bytes are ignored.
    pub(super) fn decode(b: &[u8]) -> Result<Option<RemoteRegion>, String> {
        if b.len() < LEN || &b[..4] != MAGIC {
            return Ok(None);
        }
        if b[4] != 1 {
            return Err(format!(
                "peer's private data has version {}, this build speaks 1",
                b[4]
            ));
        }
        if b[5] == 0 {
            return Ok(None);
        }
        let addr = u64::from_be_bytes(b[6..14].try_into().expect("8 bytes"));
        let len = u64::from_be_bytes(b[14..22].try_into().expect("8 bytes"));
        let rkey = u32::from_be_bytes(b[22..26].try_into().expect("4 bytes"));
        if addr.checked_add(len).is_none() {
            return Err(format!("peer's region {addr:#x}+{len} overflows"));
        }
        Ok(Some(RemoteRegion { addr, len, rkey }))
    }
}

/// Length of the private data gdr sends with a connect request or reply (fits the 56 bytes a
/// connect request carries).
pub const PRIVATE_DATA_LEN: usize = private::LEN;

/// Encodes the private data gdr sends with a connect request or reply, advertising `region` if
/// given. The inverse of [`decode_private_data`].
pub fn encode_private_data(region: Option<RemoteRegion>) -> [u8; PRIVATE_DATA_LEN] {
    private::encode(region)
}

/// Decodes a peer's connect private data the way [`Listener::next_request`] and
/// [`Connector::connect`] do: `Ok(None)` when the peer is not a gdr program (no magic) or
/// advertised no region, [`Error::Protocol`] for another version or a region whose end
/// overflows. Trailing bytes (transport padding) are ignored. Public so the decoder can be
/// fuzzed (`fuzz/`) and captured requests inspected.
pub fn decode_private_data(data: &[u8]) -> Result<Option<RemoteRegion>> {
    private::decode(data).map_err(Error::protocol)
}

fn sockaddr_of(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write(std::ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in>(), sin) };
            (
                ss,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe {
                std::ptr::write(
                    std::ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in6>(),
                    sin6,
                )
            };
            (
                ss,
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        }
    }
}

fn conn_param(qp: &QueuePair, data: &[u8; private::LEN]) -> ibv::rdma_conn_param {
    let cfg = qp.config();
    // SAFETY: plain old data.
    let mut p: ibv::rdma_conn_param = unsafe { std::mem::zeroed() };
    p.private_data = data.as_ptr().cast();
    p.private_data_len = private::LEN as u8;
    p.responder_resources = cfg.max_rd_atomic.unwrap_or(16);
    p.initiator_depth = cfg.max_rd_atomic.unwrap_or(16);
    p.retry_count = cfg.retry_count.min(7);
    p.rnr_retry_count = cfg.rnr_retry.min(7);
    p.qp_num = qp.qp_num();
    p
}

/// A connection made through rdma_cm: the connected queue pair and the region the peer
/// advertised. Dropping it disconnects.
pub struct CmConnection {
    qp: QueuePair,
    remote: Option<RemoteRegion>,
    id: Arc<CmId>,
}

impl CmConnection {
    /// The connected queue pair (RTS).
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// The region the peer advertised in its private data, if any.
    pub fn remote_region(&self) -> Option<RemoteRegion> {
        self.remote
    }
}

impl Drop for CmConnection {
    fn drop(&mut self) {
        // SAFETY: valid id; disconnect moves the QP to the error state through the CM.
        let rc = unsafe { ibv::rdma_disconnect(self.id.raw()) };
        if rc != 0 {
            // The peer may have disconnected first; the queue pair is destroyed next either way.
            log::debug!(
                "rdma_disconnect(qpn={:#x}): {}",
                self.qp.qp_num(),
                crate::error::errno_text(errno_of(rc))
            );
        }
    }
}

/// The `timeout_ms` argument of `rdma_resolve_addr`/`rdma_resolve_route`: the timeout in
/// milliseconds, at least 1, at most `i32::MAX` (longer timeouts are cut to about 24 days).
fn resolve_ms(timeout: Duration) -> libc::c_int {
    libc::c_int::try_from(timeout.as_millis().max(1)).unwrap_or(libc::c_int::MAX)
}

/// The active side after address and route resolution: build the queue pair on
/// [`Connector::context`] and [`Connector::port`], then [`Connector::connect`].
pub struct Connector {
    id: Arc<CmId>,
    ctx: Arc<Context>,
    timeout: Duration,
}

impl Connector {
    /// Resolves `addr` to a device, port and route (`rdma_resolve_addr`, `rdma_resolve_route`).
    pub fn resolve(addr: SocketAddr, timeout: Duration) -> Result<Connector> {
        block_now(Self::resolve_with(&Blocking, addr, timeout))
    }

    /// [`Connector::resolve`], awaiting rdma_cm's events on tokio (feature `tokio`).
    #[cfg(feature = "tokio")]
    pub async fn resolve_async(addr: SocketAddr, timeout: Duration) -> Result<Connector> {
        Self::resolve_with(&Tokio, addr, timeout).await
    }

    async fn resolve_with<W: EventWait>(
        w: &W,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Connector> {
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        let ms = resolve_ms(timeout);
        let rc = {
            let (mut ss, _) = sockaddr_of(&addr);
            // SAFETY: valid id; `ss` holds a sockaddr of the right family.
            unsafe {
                ibv::rdma_resolve_addr(
                    id.raw(),
                    std::ptr::null_mut(),
                    std::ptr::addr_of_mut!(ss).cast(),
                    ms,
                )
            }
        };
        check(
            "rdma_resolve_addr",
            rc,
            || format!("dst={addr}, timeout_ms={ms}"),
            |_| Hint::new("is the address an IP of an RDMA-capable interface's peer?"),
        )?;
        id.expect(
            w,
            ibv::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
            timeout,
            &format!("resolving {addr}"),
        )
        .await?;
        // SAFETY: valid id with a resolved address.
        let rc = unsafe { ibv::rdma_resolve_route(id.raw(), ms) };
        check(
            "rdma_resolve_route",
            rc,
            || format!("dst={addr}, timeout_ms={ms}"),
            no_hint,
        )?;
        id.expect(
            w,
            ibv::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
            timeout,
            &format!("resolving a route to {addr}"),
        )
        .await?;
        let ctx = id.context()?;
        Ok(Connector { id, ctx, timeout })
    }

    /// The device rdma_cm resolved the address to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The port on that device.
    pub fn port(&self) -> u8 {
        self.id.port()
    }

    /// Connects `qp` (built on [`Connector::context`], in INIT) and advertises `region`.
    pub fn connect(self, qp: QueuePair, region: Option<RemoteRegion>) -> Result<CmConnection> {
        block_now(self.connect_with(&Blocking, qp, region))
    }

    /// [`Connector::connect`], awaiting rdma_cm's events on tokio (feature `tokio`).
    #[cfg(feature = "tokio")]
    pub async fn connect_async(
        self,
        qp: QueuePair,
        region: Option<RemoteRegion>,
    ) -> Result<CmConnection> {
        self.connect_with(&Tokio, qp, region).await
    }

    async fn connect_with<W: EventWait>(
        self,
        w: &W,
        qp: QueuePair,
        region: Option<RemoteRegion>,
    ) -> Result<CmConnection> {
        check_qp(&qp, &self.ctx, self.id.port())?;
        let rc = {
            let data = private::encode(region);
            let mut param = conn_param(&qp, &data);
            // SAFETY: valid id with a resolved route; `param` and `data` live across the call.
            unsafe { ibv::rdma_connect(self.id.raw(), &mut param) }
        };
        check(
            "rdma_connect",
            rc,
            || format!("qpn={:#x}", qp.qp_num()),
            no_hint,
        )?;
        let e = self
            .id
            .expect(
                w,
                ibv::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_RESPONSE,
                self.timeout,
                "connecting",
            )
            .await?;
        let remote = private::decode(&e.private).map_err(Error::protocol)?;
        self.id
            .transition(&qp, ibv::ibv_qp_state::IBV_QPS_RTR, QpState::Rtr)?;
        self.id
            .transition(&qp, ibv::ibv_qp_state::IBV_QPS_RTS, QpState::Rts)?;
        // SAFETY: valid id after CONNECT_RESPONSE with the QP in RTS.
        let rc = unsafe { ibv::rdma_establish(self.id.raw()) };
        check(
            "rdma_establish",
            rc,
            || format!("qpn={:#x}", qp.qp_num()),
            no_hint,
        )?;
        Ok(CmConnection {
            qp,
            remote,
            id: self.id,
        })
    }
}

fn check_qp(qp: &QueuePair, ctx: &Arc<Context>, port: u8) -> Result<()> {
    if qp.pd().context().as_raw() != ctx.as_raw() {
        return Err(Error::invalid(
            format!("the queue pair is on {}, rdma_cm resolved the peer to {}", qp.pd().context().name(), ctx.name()),
            "build the protection domain, completion queues and queue pair on the context rdma_cm returns",
        ));
    }
    if qp.port() != port {
        return Err(Error::invalid(
            format!(
                "the queue pair uses port {}, rdma_cm resolved port {port}",
                qp.port()
            ),
            "build it with .port(connector.port())",
        ));
    }
    Ok(())
}

/// The passive side: listens on an address and port.
pub struct Listener {
    id: Arc<CmId>,
    channel: Arc<EventChannel>,
}

impl Listener {
    /// Binds and listens (`rdma_bind_addr`, `rdma_listen`). Use `0.0.0.0:PORT` for every device.
    pub fn bind(addr: SocketAddr) -> Result<Listener> {
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        let (mut ss, _) = sockaddr_of(&addr);
        // SAFETY: valid id and sockaddr.
        let rc = unsafe { ibv::rdma_bind_addr(id.raw(), std::ptr::addr_of_mut!(ss).cast()) };
        check(
            "rdma_bind_addr",
            rc,
            || format!("addr={addr}"),
            |_| Hint::new("is the port in use, or the address not on an RDMA-capable interface?"),
        )?;
        // SAFETY: bound id.
        let rc = unsafe { ibv::rdma_listen(id.raw(), 16) };
        check("rdma_listen", rc, || format!("addr={addr}"), no_hint)?;
        Ok(Listener { id, channel })
    }

    /// The port actually bound (useful after binding port 0).
    pub fn port(&self) -> u16 {
        // SAFETY: bound id.
        u16::from_be(unsafe { ibv::rdma_get_src_port(self.id.raw()) })
    }

    /// Waits for a connection request.
    pub fn next_request(&self, timeout: Duration) -> Result<ConnectRequest> {
        block_now(self.next_request_with(&Blocking, timeout))
    }

    /// [`Listener::next_request`], awaiting rdma_cm's events on tokio (feature `tokio`).
    #[cfg(feature = "tokio")]
    pub async fn next_request_async(&self, timeout: Duration) -> Result<ConnectRequest> {
        self.next_request_with(&Tokio, timeout).await
    }

    async fn next_request_with<W: EventWait>(
        &self,
        w: &W,
        timeout: Duration,
    ) -> Result<ConnectRequest> {
        let me = self.id.raw() as usize;
        let wanted = move |e: &Event| {
            e.kind == ibv::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST || e.id as usize == me
        };
        let e = w
            .event(&self.channel, deadline_after(timeout), timeout, &wanted)
            .await?;
        check_event(
            &e,
            ibv::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST,
            "waiting for a connection request",
        )?;
        let id = NonNull::new(e.id).ok_or_else(|| {
            Error::verbs(
                "rdma_get_cm_event",
                "CONNECT_REQUEST",
                libc::EIO,
                "librdmacm delivered a connection request without an id",
            )
        })?;
        let id = Arc::new(CmId {
            id,
            channel: self.channel.clone(),
        });
        let remote = match private::decode(&e.private) {
            Ok(r) => r,
            Err(what) => {
                // SAFETY: valid new id; rejecting frees the peer from waiting.
                let rc = unsafe { ibv::rdma_reject(id.raw(), std::ptr::null(), 0) };
                if rc != 0 {
                    log::debug!("rdma_reject: {}", crate::error::errno_text(errno_of(rc)));
                }
                return Err(Error::protocol(what));
            }
        };
        let ctx = id.context()?;
        Ok(ConnectRequest {
            id,
            ctx,
            remote,
            timeout,
        })
    }
}

/// A peer's connection request: build the queue pair on [`ConnectRequest::context`] and
/// [`ConnectRequest::port`], then [`ConnectRequest::accept`] (or drop it to reject).
pub struct ConnectRequest {
    id: Arc<CmId>,
    ctx: Arc<Context>,
    remote: Option<RemoteRegion>,
    timeout: Duration,
}

impl ConnectRequest {
    /// The device the request arrived on.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The port it arrived on.
    pub fn port(&self) -> u8 {
        self.id.port()
    }

    /// The region the peer advertised.
    pub fn remote_region(&self) -> Option<RemoteRegion> {
        self.remote
    }

    /// Accepts with `qp` (built on [`ConnectRequest::context`], in INIT), advertising `region`.
    pub fn accept(self, qp: QueuePair, region: Option<RemoteRegion>) -> Result<CmConnection> {
        block_now(self.accept_with(&Blocking, qp, region))
    }

    /// [`ConnectRequest::accept`], awaiting rdma_cm's events on tokio (feature `tokio`).
    #[cfg(feature = "tokio")]
    pub async fn accept_async(
        self,
        qp: QueuePair,
        region: Option<RemoteRegion>,
    ) -> Result<CmConnection> {
        self.accept_with(&Tokio, qp, region).await
    }

    async fn accept_with<W: EventWait>(
        self,
        w: &W,
        qp: QueuePair,
        region: Option<RemoteRegion>,
    ) -> Result<CmConnection> {
        check_qp(&qp, &self.ctx, self.id.port())?;
        self.id
            .transition(&qp, ibv::ibv_qp_state::IBV_QPS_RTR, QpState::Rtr)?;
        self.id
            .transition(&qp, ibv::ibv_qp_state::IBV_QPS_RTS, QpState::Rts)?;
        let rc = {
            let data = private::encode(region);
            let mut param = conn_param(&qp, &data);
            // SAFETY: valid id from a connect request; `param`/`data` live across the call.
            unsafe { ibv::rdma_accept(self.id.raw(), &mut param) }
        };
        check(
            "rdma_accept",
            rc,
            || format!("qpn={:#x}", qp.qp_num()),
            no_hint,
        )?;
        // The ESTABLISHED event arrives on the listener's channel, for this id; events for other
        // ids stay in the channel's backlog for their owners. No deadline when the timeout
        // does not fit an Instant (Duration::MAX).
        let me = self.id.raw() as usize;
        let wanted = move |e: &Event| e.id as usize == me;
        let e = w
            .event(
                &self.id.channel,
                deadline_after(self.timeout),
                self.timeout,
                &wanted,
            )
            .await?;
        check_event(
            &e,
            ibv::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
            "accepting",
        )?;
        Ok(CmConnection {
            qp,
            remote: self.remote,
            id: self.id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_private_data_codec_is_the_one_connections_use() {
        let r = RemoteRegion::new(0x7f00_0000_1000, 1 << 20, 0xabcd);
        let b = encode_private_data(Some(r));
        assert_eq!(b, private::encode(Some(r)));
        assert_eq!(b.len(), PRIVATE_DATA_LEN);
        assert_eq!(decode_private_data(&b).unwrap(), Some(r));
        let mut v2 = b;
        v2[4] = 2;
        match decode_private_data(&v2) {
            Err(Error::Protocol { what, .. }) => assert!(what.contains("version 2"), "{what}"),
            other => panic!("expected a protocol error, got {other:?}"),
        }
        assert_eq!(decode_private_data(b"short").unwrap(), None);
    }

    #[test]
    fn private_data_round_trip_and_foreign_peers() {
        let r = RemoteRegion::new(0x1000, 4096, 0xabc);
        let b = private::encode(Some(r));
        assert_eq!(private::decode(&b).unwrap(), Some(r));
        let mut padded = b.to_vec();
        padded.resize(56, 0);
        assert_eq!(
            private::decode(&padded).unwrap(),
            Some(r),
            "transport padding is ignored"
        );
        assert_eq!(private::decode(&private::encode(None)).unwrap(), None);
        assert_eq!(
            private::decode(&[0; 56]).unwrap(),
            None,
            "a non-gdr peer (rping) sends no magic"
        );
        let mut v2 = b;
        v2[4] = 2;
        assert!(private::decode(&v2).unwrap_err().contains("version 2"));
        let mut overflow = b;
        overflow[6..14].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(private::decode(&overflow)
            .unwrap_err()
            .contains("overflows"));
    }

    /// A fake id: never dereferenced, the backlog only compares ids.
    fn fake_id(n: usize) -> *mut ibv::rdma_cm_id {
        std::ptr::without_provenance_mut(n * 64)
    }

    fn event(kind: u32, id: usize) -> Event {
        Event {
            kind,
            status: 0,
            id: fake_id(id),
            private: Vec::new(),
        }
    }

    #[test]
    fn backlog_keeps_events_for_their_owners_in_order() {
        use ibv::rdma_cm_event_type::*;
        let mut b = Backlog::default();
        assert!(b.push(event(RDMA_CM_EVENT_ESTABLISHED, 1)).is_none());
        assert!(b.push(event(RDMA_CM_EVENT_DISCONNECTED, 2)).is_none());
        assert!(b.push(event(RDMA_CM_EVENT_DISCONNECTED, 1)).is_none());
        let id1 = fake_id(1);
        assert_eq!(
            b.take(&|e| e.id == id1).unwrap().kind,
            RDMA_CM_EVENT_ESTABLISHED
        );
        assert_eq!(
            b.take(&|e| e.id == id1).unwrap().kind,
            RDMA_CM_EVENT_DISCONNECTED
        );
        assert!(b.take(&|e| e.id == id1).is_none());
        // A destroyed id's events are purged; others stay.
        assert!(b.push(event(RDMA_CM_EVENT_TIMEWAIT_EXIT, 3)).is_none());
        let gone = b.purge(fake_id(2));
        assert_eq!(gone.len(), 1);
        assert_eq!(b.events.len(), 1);
        assert_eq!(b.events[0].id, fake_id(3));
    }

    #[test]
    fn backlog_is_bounded() {
        use ibv::rdma_cm_event_type::*;
        let mut b = Backlog::default();
        for i in 0..BACKLOG_CAP {
            assert!(b.push(event(RDMA_CM_EVENT_DISCONNECTED, i + 1)).is_none());
        }
        let dropped = b.push(event(RDMA_CM_EVENT_DISCONNECTED, 9999)).unwrap();
        assert_eq!(dropped.id, fake_id(1), "the oldest goes");
        assert_eq!(b.events.len(), BACKLOG_CAP);
        // Events that are not connection requests are simply dropped.
        dropped.dispose();
    }

    #[test]
    fn resolve_timeouts_never_overflow() {
        assert_eq!(resolve_ms(Duration::ZERO), 1);
        assert_eq!(resolve_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(resolve_ms(Duration::from_secs(1 << 40)), i32::MAX);
        assert_eq!(resolve_ms(Duration::MAX), i32::MAX);
    }

    #[test]
    fn private_data_decoder_takes_hostile_input() {
        // Every length from empty to longer than a connect request's 56 bytes, every byte value
        // at each position of the header: never a panic, never a region that overflows.
        let good = private::encode(Some(RemoteRegion::new(0x1000, 4096, 7)));
        for len in 0..=80 {
            let mut b = good.to_vec();
            b.resize(len, 0xff);
            if let Ok(Some(r)) = private::decode(&b) {
                assert!(r.addr.checked_add(r.len).is_some());
            }
        }
        for pos in 0..private::LEN {
            for v in [0u8, 1, 2, 0x7f, 0xff] {
                let mut b = good;
                b[pos] = v;
                if let Ok(Some(r)) = private::decode(&b) {
                    assert!(r.addr.checked_add(r.len).is_some(), "pos {pos} = {v}");
                }
            }
        }
        let mut max = good;
        max[6..14].copy_from_slice(&(u64::MAX - 4095).to_be_bytes());
        max[14..22].copy_from_slice(&4095u64.to_be_bytes());
        assert_eq!(
            private::decode(&max).unwrap().map(|r| r.addr + r.len),
            Some(u64::MAX),
            "the last byte of the address space is a valid end"
        );
    }

    #[test]
    fn event_status_of_any_value_formats() {
        for status in [i32::MIN, -1, 0, 28, i32::MAX] {
            let e = Event {
                kind: ibv::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED,
                status,
                id: std::ptr::null_mut(),
                private: Vec::new(),
            };
            let err = check_event(
                &e,
                ibv::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
                "accepting",
            )
            .unwrap_err();
            assert!(matches!(err, Error::Protocol { .. }), "{err}");
            assert!(err.to_string().contains("accepting"), "{err}");
        }
    }

    #[test]
    fn sockaddr_conversion() {
        let (ss, len) = sockaddr_of(&"10.1.2.3:7471".parse().unwrap());
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
        // SAFETY: written as sockaddr_in above.
        let sin = unsafe { &*std::ptr::addr_of!(ss).cast::<libc::sockaddr_in>() };
        assert_eq!(u16::from_be(sin.sin_port), 7471);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 1, 2, 3]);
    }
}
