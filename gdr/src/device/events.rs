//! The device's asynchronous events (`ibv_get_async_event`): a port going down or up, a queue
//! pair entering the error state behind the application's back, a completion queue overrun, the
//! device failing. Without reading them these are invisible until something times out.
//!
//! ```no_run
//! use std::time::Duration;
//! let ctx = gdr::Context::open("rxe0")?;
//! let events = ctx.events()?;                        // one reader per context
//! while let Some(e) = events.next(Duration::from_secs(1))? {
//!     eprintln!("{e}");                              // e.g. "port 1: port error (...); hint: ..."
//! }
//! # Ok::<(), gdr::Error>(())
//! ```
//!
//! With the `tokio` feature, [`crate::aio::AsyncDeviceEvents`] awaits them instead.

use std::fmt;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr_sys::ibv;

use super::Context;
use crate::cq::{wait_readable, CompletionQueue};
use crate::error::{Error, Result};
use crate::qp::QueuePair;
use crate::raw_enum::constants;
use crate::return_code;

/// `ibv_event_type` values as plain numbers (the binding's enum cannot hold values a newer
/// provider might report, so events are read as numbers and matched against these).
mod raw {
    use gdr_sys::ibv::ibv_event_type as E;
    pub(super) const CQ_ERR: u32 = E::IBV_EVENT_CQ_ERR as u32;
    pub(super) const QP_FATAL: u32 = E::IBV_EVENT_QP_FATAL as u32;
    pub(super) const QP_REQ_ERR: u32 = E::IBV_EVENT_QP_REQ_ERR as u32;
    pub(super) const QP_ACCESS_ERR: u32 = E::IBV_EVENT_QP_ACCESS_ERR as u32;
    pub(super) const COMM_EST: u32 = E::IBV_EVENT_COMM_EST as u32;
    pub(super) const SQ_DRAINED: u32 = E::IBV_EVENT_SQ_DRAINED as u32;
    pub(super) const PATH_MIG: u32 = E::IBV_EVENT_PATH_MIG as u32;
    pub(super) const PATH_MIG_ERR: u32 = E::IBV_EVENT_PATH_MIG_ERR as u32;
    pub(super) const DEVICE_FATAL: u32 = E::IBV_EVENT_DEVICE_FATAL as u32;
    pub(super) const PORT_ACTIVE: u32 = E::IBV_EVENT_PORT_ACTIVE as u32;
    pub(super) const PORT_ERR: u32 = E::IBV_EVENT_PORT_ERR as u32;
    pub(super) const LID_CHANGE: u32 = E::IBV_EVENT_LID_CHANGE as u32;
    pub(super) const PKEY_CHANGE: u32 = E::IBV_EVENT_PKEY_CHANGE as u32;
    pub(super) const SM_CHANGE: u32 = E::IBV_EVENT_SM_CHANGE as u32;
    pub(super) const SRQ_ERR: u32 = E::IBV_EVENT_SRQ_ERR as u32;
    pub(super) const SRQ_LIMIT_REACHED: u32 = E::IBV_EVENT_SRQ_LIMIT_REACHED as u32;
    pub(super) const QP_LAST_WQE_REACHED: u32 = E::IBV_EVENT_QP_LAST_WQE_REACHED as u32;
    pub(super) const CLIENT_REREGISTER: u32 = E::IBV_EVENT_CLIENT_REREGISTER as u32;
    pub(super) const GID_CHANGE: u32 = E::IBV_EVENT_GID_CHANGE as u32;
    pub(super) const WQ_FATAL: u32 = E::IBV_EVENT_WQ_FATAL as u32;
}

/// What happened (`ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEventKind {
    /// A completion queue overran or failed: its queue pairs are in the error state.
    CqError,
    /// A queue pair hit an error it cannot report in a completion: it is in the error state.
    QpFatal,
    /// A queue pair received an invalid request (transport error): it is in the error state.
    QpRequestError,
    /// A queue pair hit a local access violation: it is in the error state.
    QpAccessError,
    /// The first packet arrived on a queue pair in RTR.
    CommunicationEstablished,
    /// A send queue in SQD drained.
    SqDrained,
    /// Path migration succeeded.
    PathMigrated,
    /// Path migration failed.
    PathMigrationError,
    /// The device failed: every object on it is unusable; close and reopen it.
    DeviceFatal,
    /// A port became ACTIVE.
    PortActive,
    /// A port left the ACTIVE state (link down): its connections fail.
    PortError,
    /// A port's LID changed.
    LidChange,
    /// A port's P_Key table changed.
    PkeyChange,
    /// The subnet manager changed.
    SmChange,
    /// A shared receive queue failed.
    SrqError,
    /// A shared receive queue fell below its limit.
    SrqLimitReached,
    /// The last work request of a queue pair attached to a shared receive queue was reached.
    QpLastWqeReached,
    /// The subnet manager asks clients to register again.
    ClientReregister,
    /// A port's GID table changed (an address was added or removed).
    GidChange,
    /// A work queue failed.
    WqFatal,
    /// An event this version does not know.
    Unknown(u32),
}

constants!(AsyncEventKind: u32 {
    CqError = raw::CQ_ERR,
    QpFatal = raw::QP_FATAL,
    QpRequestError = raw::QP_REQ_ERR,
    QpAccessError = raw::QP_ACCESS_ERR,
    CommunicationEstablished = raw::COMM_EST,
    SqDrained = raw::SQ_DRAINED,
    PathMigrated = raw::PATH_MIG,
    PathMigrationError = raw::PATH_MIG_ERR,
    DeviceFatal = raw::DEVICE_FATAL,
    PortActive = raw::PORT_ACTIVE,
    PortError = raw::PORT_ERR,
    LidChange = raw::LID_CHANGE,
    PkeyChange = raw::PKEY_CHANGE,
    SmChange = raw::SM_CHANGE,
    SrqError = raw::SRQ_ERR,
    SrqLimitReached = raw::SRQ_LIMIT_REACHED,
    QpLastWqeReached = raw::QP_LAST_WQE_REACHED,
    ClientReregister = raw::CLIENT_REREGISTER,
    GidChange = raw::GID_CHANGE,
    WqFatal = raw::WQ_FATAL,
});

impl AsyncEventKind {
    /// From `ibv_event_type`.
    pub fn from_raw(v: u32) -> Self {
        Self::from_constant(v).unwrap_or(AsyncEventKind::Unknown(v))
    }

    /// The `ibv_event_type` value.
    pub fn raw(self) -> u32 {
        match self {
            AsyncEventKind::Unknown(v) => v,
            k => k.constant().unwrap_or(u32::MAX),
        }
    }

    /// What the event is about, for the `ibv_async_event` union.
    fn subject_type(self) -> SubjectType {
        use AsyncEventKind::*;
        match self {
            CqError => SubjectType::Cq,
            QpFatal
            | QpRequestError
            | QpAccessError
            | CommunicationEstablished
            | SqDrained
            | PathMigrated
            | PathMigrationError
            | QpLastWqeReached => SubjectType::Qp,
            SrqError | SrqLimitReached => SubjectType::Srq,
            WqFatal => SubjectType::Wq,
            PortActive | PortError | LidChange | PkeyChange | SmChange | ClientReregister
            | GidChange => SubjectType::Port,
            DeviceFatal | Unknown(_) => SubjectType::Device,
        }
    }

    /// Whether the event means something failed (as opposed to news such as a port coming up).
    pub fn is_error(self) -> bool {
        use AsyncEventKind::*;
        matches!(
            self,
            CqError
                | QpFatal
                | QpRequestError
                | QpAccessError
                | PathMigrationError
                | DeviceFatal
                | PortError
                | SrqError
                | WqFatal
        )
    }

    /// What to do about it.
    pub fn hint(self) -> Option<&'static str> {
        use AsyncEventKind::*;
        Some(match self {
            CqError => "the completion queue overran: make it deeper than the sum of the queues it serves, then recreate it and its queue pairs",
            QpFatal | QpRequestError | QpAccessError => "the queue pair is in the error state: its requests complete as flushed; reset() it and connect again (the peer too)",
            DeviceFatal => "the device failed: drop every object on it and open the device again (check dmesg and the firmware)",
            PortError => "the port's link is down: check the cable/switch port (`ibstat`, `ip link`); connections over it fail until it is ACTIVE again",
            GidChange => "the GID table changed: a RoCE v2 GID index chosen earlier may now name another address; pick it again",
            PathMigrationError => "alternate path migration failed: the queue pair stays on its primary path",
            SrqError | WqFatal => "the queue failed: recreate it",
            _ => return None,
        })
    }
}

impl fmt::Display for AsyncEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use AsyncEventKind::*;
        let s = match self {
            CqError => "completion queue error",
            QpFatal => "queue pair fatal error",
            QpRequestError => "queue pair invalid request error",
            QpAccessError => "queue pair access error",
            CommunicationEstablished => "communication established",
            SqDrained => "send queue drained",
            PathMigrated => "path migrated",
            PathMigrationError => "path migration error",
            DeviceFatal => "device fatal error",
            PortActive => "port active",
            PortError => "port error",
            LidChange => "LID change",
            PkeyChange => "P_Key change",
            SmChange => "subnet manager change",
            SrqError => "shared receive queue error",
            SrqLimitReached => "shared receive queue limit reached",
            QpLastWqeReached => "last work request reached",
            ClientReregister => "client reregister",
            GidChange => "GID table change",
            WqFatal => "work queue fatal error",
            Unknown(v) => return write!(f, "unknown event {v}"),
        };
        f.write_str(s)
    }
}

enum SubjectType {
    Cq,
    Qp,
    Srq,
    Wq,
    Port,
    Device,
}

/// The object an event concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventSubject {
    /// A queue pair, by number (compare with [`QueuePair::qp_num`] or [`AsyncEvent::concerns_qp`]).
    Qp {
        /// The queue pair number.
        qp_num: u32,
    },
    /// A completion queue (compare with [`AsyncEvent::concerns_cq`]).
    Cq {
        /// The `ibv_cq` address, as an identity only.
        raw: usize,
    },
    /// A shared receive queue (gdr creates none).
    Srq,
    /// A work queue (gdr creates none).
    Wq,
    /// A port of the device.
    Port(u8),
    /// The device as a whole.
    Device,
}

/// One asynchronous event, typed, with the object it concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// What it happened to.
    pub subject: EventSubject,
}

impl AsyncEvent {
    /// Whether the event concerns `qp`.
    pub fn concerns_qp(&self, qp: &QueuePair) -> bool {
        self.subject
            == (EventSubject::Qp {
                qp_num: qp.qp_num(),
            })
    }

    /// Whether the event concerns `cq`.
    pub fn concerns_cq(&self, cq: &CompletionQueue) -> bool {
        self.subject
            == (EventSubject::Cq {
                raw: cq.as_raw() as usize,
            })
    }

    /// What to do about it (from [`AsyncEventKind::hint`]).
    pub fn hint(&self) -> Option<&'static str> {
        self.kind.hint()
    }
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.subject {
            EventSubject::Qp { qp_num } => write!(f, "QP {qp_num:#x}: ")?,
            EventSubject::Cq { raw } => write!(f, "CQ {raw:#x}: ")?,
            EventSubject::Srq => f.write_str("SRQ: ")?,
            EventSubject::Wq => f.write_str("WQ: ")?,
            EventSubject::Port(p) => write!(f, "port {p}: ")?,
            EventSubject::Device => f.write_str("device: ")?,
        }
        write!(f, "{}", self.kind)?;
        if let Some(h) = self.hint() {
            write!(f, "; hint: {h}")?;
        }
        Ok(())
    }
}

/// The reader of one device context's asynchronous events ([`Context::events`]). Events are
/// acknowledged as they are read, so destroying the objects they concern never waits on them.
pub struct DeviceEvents {
    ctx: Arc<Context>,
}

impl fmt::Debug for DeviceEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceEvents")
            .field("device", &self.ctx.name())
            .finish()
    }
}

impl Context {
    /// The reader of this context's asynchronous events. There is one per context (the events
    /// would otherwise be split between readers); it makes the context's event descriptor
    /// non-blocking.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a reader was already taken; [`Error::Verbs`] when the
    /// descriptor cannot be made non-blocking.
    pub fn events(self: &Arc<Self>) -> Result<DeviceEvents> {
        if self.events_taken.swap(true, Ordering::AcqRel) {
            return Err(Error::invalid(
                format!(
                    "{}: the asynchronous event reader was already taken",
                    self.name()
                ),
                "keep the first DeviceEvents (one reader per context) and share what it reads",
            ));
        }
        let fd = self.async_fd();
        // SAFETY: fcntl on the context's own open descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        let rc = if flags < 0 {
            -1
        } else {
            // SAFETY: as above.
            unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }
        };
        return_code::check(
            "fcntl",
            rc,
            || format!("{} async event fd {fd}, F_SETFL O_NONBLOCK", self.name()),
            return_code::no_hint,
        )
        .inspect_err(|_| self.events_taken.store(false, Ordering::Release))?;
        Ok(DeviceEvents { ctx: self.clone() })
    }

    /// The context's asynchronous event descriptor.
    fn async_fd(&self) -> libc::c_int {
        // SAFETY: the context is open while self lives.
        unsafe { (*self.as_raw()).async_fd }
    }
}

impl DeviceEvents {
    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The next event, waiting up to `timeout` (`None` when none came).
    ///
    /// # Errors
    /// [`Error::Io`] when waiting fails, [`Error::Verbs`] when reading the event does.
    pub fn next(&self, timeout: Duration) -> Result<Option<AsyncEvent>> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if let Some(e) = self.try_next()? {
                return Ok(Some(e));
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Ok(None),
                },
                None => Duration::MAX,
            };
            wait_readable(self.ctx.async_fd(), left, "async event descriptor")?;
        }
    }

    /// The next event if one is queued, without waiting.
    ///
    /// # Errors
    /// [`Error::Verbs`] when reading the event fails.
    pub fn try_next(&self) -> Result<Option<AsyncEvent>> {
        let mut ev = MaybeUninit::<ibv::ibv_async_event>::uninit();
        // SAFETY: the context is open; `ev` is written by the call when it returns 0.
        let rc = unsafe { ibv::ibv_get_async_event(self.ctx.as_raw(), ev.as_mut_ptr()) };
        if rc != 0 {
            let errno = return_code::errno_of(rc);
            if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK {
                return Ok(None);
            }
            return return_code::check(
                "ibv_get_async_event",
                rc,
                || format!("device={}", self.ctx.name()),
                return_code::no_hint,
            )
            .map(|()| None);
        }
        // SAFETY: the call filled `ev`. The event type is read as the plain 32-bit number it is
        // in C (the binding's Rust enum must not hold values it does not list), and the union
        // member read is the one the event type says is set; the object it points to stays
        // valid until the event is acknowledged below (libibverbs' destroy calls wait for it).
        let event = unsafe {
            let kind = AsyncEventKind::from_raw(
                std::ptr::addr_of!((*ev.as_ptr()).event_type)
                    .cast::<u32>()
                    .read(),
            );
            let element = std::ptr::addr_of!((*ev.as_ptr()).element);
            let subject = match kind.subject_type() {
                SubjectType::Qp => {
                    let qp = (*element).qp;
                    EventSubject::Qp {
                        qp_num: if qp.is_null() { 0 } else { (*qp).qp_num },
                    }
                }
                SubjectType::Cq => EventSubject::Cq {
                    raw: (*element).cq as usize,
                },
                SubjectType::Srq => EventSubject::Srq,
                SubjectType::Wq => EventSubject::Wq,
                SubjectType::Port => {
                    EventSubject::Port(u8::try_from((*element).port_num).unwrap_or(0))
                }
                SubjectType::Device => EventSubject::Device,
            };
            AsyncEvent { kind, subject }
        };
        // SAFETY: acknowledges the one event just read.
        unsafe { ibv::ibv_ack_async_event(ev.as_mut_ptr()) };
        log::debug!("{}: async event: {event}", self.ctx.name());
        Ok(Some(event))
    }

    /// The event descriptor (non-blocking), for async readers.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn fd(&self) -> libc::c_int {
        self.ctx.async_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_kind_round_trips_and_errors_have_hints() {
        for &(raw, k) in AsyncEventKind::CONSTANTS {
            assert_eq!(AsyncEventKind::from_raw(raw), k);
            assert_eq!(k.raw(), raw);
            if k.is_error() {
                assert!(k.hint().is_some(), "{k} has a hint");
            }
        }
        assert_eq!(AsyncEventKind::from_raw(99), AsyncEventKind::Unknown(99));
        let e = AsyncEvent {
            kind: AsyncEventKind::PortError,
            subject: EventSubject::Port(1),
        };
        assert!(
            e.to_string()
                .starts_with("port 1: port error; hint: the port's link is down"),
            "{e}"
        );
    }
}
