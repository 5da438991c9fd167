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

use super::{deadline_after, time_left};
use crate::device::Context;
use crate::error::{Error, Hint, Result};
use crate::mr::RemoteRegion;
use crate::qp::{QpState, QueuePair};
use crate::return_code::{check, errno_of, no_hint, non_null, teardown};

mod events;
mod id;
mod private_data;

use events::*;
use id::*;
use private_data::{conn_param, private, sockaddr_of};
pub use private_data::{decode_private_data, encode_private_data, PRIVATE_DATA_LEN};
#[cfg(test)]
mod tests;

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
