//! What every submission passes before anything is planned: whether the agent still takes
//! work, the count of the callers' transfers without an outcome, and the staging driver that
//! moves staged memory. The agent and each of its [`Peer`](crate::Peer) handles hold it; a
//! peer handle needs nothing else of its agent, so it holds no pointer back to it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::staged::driver::Driver as StagingDriver;
use crate::transfer::Pending;

pub(crate) struct Intake {
    /// The agent's number in the process (segments carry it: another agent's segment is
    /// refused before anything is posted).
    pub(crate) agent: u64,
    /// [`AgentConfig::default_timeout`](crate::AgentConfig::default_timeout).
    pub(crate) default_timeout: Duration,
    /// Set by [`Agent::shutdown`](crate::Agent::shutdown) (and drop), under the endpoint's
    /// lock: new transfers, registrations and connections are refused with
    /// [`Error::AgentClosed`]. The lock-free read every submission makes.
    closing: AtomicBool,
    /// The callers' transfers without an outcome yet ([`Pending`]).
    pending: Arc<AtomicUsize>,
    /// Transfers of staged GPU segments ([`crate::staging`]).
    pub(crate) staging: Arc<StagingDriver>,
}

impl Intake {
    pub(crate) fn new(agent: u64, default_timeout: Duration, staging: Arc<StagingDriver>) -> Self {
        Intake {
            agent,
            default_timeout,
            closing: AtomicBool::new(false),
            pending: Arc::new(AtomicUsize::new(0)),
            staging,
        }
    }

    /// [`Error::AgentClosed`] once [`Agent::shutdown`](crate::Agent::shutdown) began (or the
    /// agent is being dropped).
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_closing() {
            return Err(Error::AgentClosed);
        }
        Ok(())
    }

    /// Whether the agent refuses new work.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// From now on the agent refuses new work.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// A new transfer, counted as pending, or [`Error::AgentClosed`]. It is counted before
    /// the check, so that a shutdown either sees it or refuses it.
    pub(crate) fn admit(&self) -> Result<Pending> {
        let pending = Pending::new(&self.pending);
        self.check_open()?;
        Ok(pending)
    }

    /// The callers' transfers without an outcome now.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intake() -> Intake {
        let staging = StagingDriver::new(
            Vec::new(),
            crate::staging::StagingConfig::default(),
            Duration::ZERO,
        );
        Intake::new(7, Duration::from_secs(1), Arc::new(staging))
    }

    #[test]
    fn a_transfer_is_counted_until_dropped_and_refused_once_closing() {
        let intake = intake();
        let first = intake.admit().expect("open");
        assert_eq!(intake.pending(), 1);
        intake.close();
        assert!(matches!(intake.admit(), Err(Error::AgentClosed)));
        // The refused one was counted only while it was checked.
        assert_eq!(intake.pending(), 1);
        drop(first);
        assert_eq!(intake.pending(), 0);
        assert!(matches!(intake.check_open(), Err(Error::AgentClosed)));
    }
}
