//! The `rdma_cm_id` that a connector, listener or connection owns, and the check of the events it
//! receives.

use super::*;

/// An `rdma_cm_id`, destroyed on drop.
pub(super) struct CmId {
    pub(super) id: NonNull<ibv::rdma_cm_id>,
    pub(super) channel: Arc<EventChannel>,
}

// SAFETY: cm ids may be used from any thread; librdmacm locks its own state.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl CmId {
    pub(super) fn new(channel: &Arc<EventChannel>) -> Result<Arc<CmId>> {
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

    pub(super) fn raw(&self) -> *mut ibv::rdma_cm_id {
        self.id.as_ptr()
    }

    /// The context librdmacm opened for this id (after address resolution or a connect request).
    pub(super) fn context(self: &Arc<Self>) -> Result<Arc<Context>> {
        // SAFETY: the id is valid; `verbs` is set once the id is bound to a device.
        let verbs = unsafe { (*self.raw()).verbs };
        let verbs = NonNull::new(verbs).ok_or_else(|| {
            Error::invalid("the rdma_cm id is not bound to a device yet", Hint::NONE)
        })?;
        let owner: Arc<dyn std::any::Any + Send + Sync> = self.clone();
        // SAFETY: librdmacm keeps the context open while the id exists; `owner` keeps the id.
        Ok(unsafe { Context::borrowed(verbs, self.port(), owner) })
    }

    pub(super) fn port(&self) -> u8 {
        // SAFETY: the id is valid.
        unsafe { (*self.raw()).port_num }
    }

    /// Moves `qp` to `state` with the attributes rdma_cm computes for this connection.
    pub(super) fn transition(&self, qp: &QueuePair, state: u32, target: QpState) -> Result<()> {
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

    pub(super) async fn expect<W: EventWait>(
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

pub(super) fn check_event(e: &Event, want: u32, what: &str) -> Result<()> {
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
    Err(Error::CmEvent {
        step: what.to_string(),
        expected: event_name(want),
        got: event_name(e.kind),
        status: e.status,
        hint: Hint::new(hint),
    })
}
