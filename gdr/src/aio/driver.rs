//! The driver task: arms the completion queue, reaps it and sleeps on its channel while some
//! future waits; and the reaping that futures do themselves before they sleep.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use super::routes::{Stop, Wakers};
use super::Shared;
use crate::cq::{Completion, CompletionQueue};
use crate::error::{Error, Result};

/// A duplicate of the completion channel's descriptor, for `AsyncFd`: each async queue registers
/// its own descriptor with tokio, so a new one can start while the driver of a dropped one is
/// still being torn down. It also holds the completion queue, which owns the channel.
pub(super) struct ChannelFd {
    pub(super) fd: OwnedFd,
    pub(super) _cq: Arc<CompletionQueue>,
}

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Shared {
    /// Reaps the queue from a future's poll (while the driver is active); an error stops every
    /// waiter as a driver failure would.
    pub(super) fn deliver_now(&self) {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        if *active {
            if let Err(e) = self.deliver() {
                drop(active);
                fail(self, e);
            }
        }
    }

    /// Hands out every completion the queue holds now.
    fn deliver(&self) -> Result<()> {
        let mut buf = [Completion::default(); 32];
        loop {
            let n = self.cq.poll(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            let mut wake = Wakers::default();
            {
                let mut routes = self.lock();
                for c in &buf[..n] {
                    routes.deliver(*c, &mut wake);
                }
            }
            wake.wake_all();
            if n < buf.len() {
                return Ok(());
            }
        }
    }
}

/// The driver: arm, deliver, sleep on the channel; until the last handle is dropped. It touches
/// the completion queue only while `active` is set, under its lock.
pub(super) async fn drive(shared: Arc<Shared>, afd: AsyncFd<ChannelFd>) {
    let cq = shared.cq.clone();
    loop {
        // Idle until some future sleeps (its notification is kept if it comes first).
        while !shared.lock().needs_driver() {
            shared.wanted.notified().await;
        }
        {
            let active = shared.active.lock().unwrap_or_else(|p| p.into_inner());
            if !*active {
                return;
            }
            // Arm first, then deliver: a completion that lands after the arm raises an event,
            // one that landed before is delivered now, so none is missed.
            if let Err(e) = cq.arm().and_then(|()| shared.deliver()) {
                drop(active);
                fail(&shared, e);
                return;
            }
        }
        if !shared.lock().needs_driver() {
            // Everyone was served: no need to watch the channel (an event the arm still raises
            // is taken the next time round).
            continue;
        }
        let waited = afd.readable().await;
        let mut ready = match waited {
            Ok(r) => r,
            Err(e) => {
                fail(&shared, Error::io("waiting on the completion channel", e));
                return;
            }
        };
        {
            let active = shared.active.lock().unwrap_or_else(|p| p.into_inner());
            if !*active {
                return;
            }
            // Take and acknowledge every pending event (the descriptor is non-blocking).
            loop {
                match cq.wait(Duration::ZERO) {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(e) => {
                        drop(active);
                        fail(&shared, e);
                        return;
                    }
                }
            }
        }
        ready.clear_ready();
    }
}

/// Stops every waiter with the driver's error.
pub(super) fn fail(shared: &Shared, e: Error) {
    log::error!("async completion queue stopped: {e}");
    let mut wake = Wakers::default();
    shared.lock().stop(Stop::Driver(e), &mut wake);
    wake.wake_all();
}
