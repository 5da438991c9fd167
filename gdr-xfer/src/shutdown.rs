//! Ending an agent: [`Agent::shutdown`] (refuse new work, let pending transfers end within a
//! grace time, fail the rest, withdraw from the directory, close every connection and stop
//! every thread) and the same without the grace time when an [`Agent`] is dropped.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gdr_xfer_proto::Failure;

use crate::agent::Agent;

use crate::wire::Message;

/// What [`Agent::shutdown`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// The caller's transfers pending when the shutdown began.
    pub pending: usize,
    /// Those still pending when the grace time ended: they stopped with
    /// [`Error::AgentClosed`](crate::Error::AgentClosed) (or succeeded, if all their bytes had landed), reported, as every
    /// outcome, only once neither side's memory can be touched by them.
    pub failed: usize,
}

impl Agent {
    /// Ends the agent in order:
    ///
    /// 1. New work is refused at once: transfers, registrations, connections (both ways),
    ///    `listen` and `publish` fail with [`Error::AgentClosed`](crate::Error::AgentClosed).
    /// 2. Pending transfers get up to `grace` to end (`Duration::ZERO`: none;
    ///    `Duration::MAX`: as long as they take, each still bounded by its own deadline).
    /// 3. The agent's directory records (feature `etcd`) are deleted, so that peers looking it
    ///    up find nothing and peers watching it let it go, without waiting for its lease to end.
    /// 4. Transfers still pending stop: each reports [`Error::AgentClosed`](crate::Error::AgentClosed) (success if all
    ///    its bytes had landed) once neither side's memory can be touched by it: its requests
    ///    in flight completed, or were fenced (within about twice
    ///    [`AgentConfig::quiesce`](crate::AgentConfig::quiesce)). Then every connection is
    ///    closed, peers are told (`bye`), and every thread of the agent ends before this
    ///    returns.
    ///
    /// Afterwards the agent only answers: segments can be listed and deregistered,
    /// notifications already received taken. Calling it again, or dropping the agent, does
    /// nothing more. Dropping an agent that was not shut down does steps 1, 3 and 4 with no
    /// grace time.
    ///
    /// A [`Transfer`](crate::Transfer) handle whose outcome is
    /// [`Error::AgentClosed`](crate::Error::AgentClosed) may be dropped, and its memory reused, at once: as with every
    /// outcome, none of its requests will touch its memory again.
    pub fn shutdown(&self, grace: Duration) -> ShutdownReport {
        let shared = &self.shared;
        let pending = {
            // Under the endpoint's lock, which `add_peer` admits under: no handshake completes
            // after this.
            let mut endpoint = shared.lock_endpoint();
            endpoint.close();
            shared.intake.close();
            shared.intake.pending()
        };
        // Waits see the agent closed now, not after the grace time.
        shared.notes.close();
        shared.notify_peers_changed();
        for c in shared.peer_list() {
            c.table_wakers.wake_all();
        }
        let end = Instant::now().checked_add(grace);
        while shared.intake.pending() > 0 && end.is_none_or(|e| Instant::now() < e) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let failed = shared.intake.pending();
        if failed > 0 {
            log::warn!(
                "{}: shutting down with {failed} transfers pending after {grace:?}: they fail with AgentClosed",
                shared.config.name
            );
        }
        self.close();
        ShutdownReport { pending, failed }
    }

    /// Steps 1, 3 and 4 of [`Agent::shutdown`]; idempotent.
    fn close(&self) {
        let shared = &self.shared;
        {
            let mut endpoint = shared.lock_endpoint();
            endpoint.close();
            shared.intake.close();
        }
        shared.notes.close();
        shared.notify_peers_changed();
        #[cfg(feature = "etcd")]
        self.withdraw();
        // Transfers still in flight stop and report once quiet on both sides, while the
        // progress threads still run (closing at once would report them while requests already
        // on the wire may still land in the peers' memory).
        let peers = shared.peer_list();
        for c in &peers {
            c.start_leaving(Failure::AgentClosed);
        }
        let end = Instant::now()
            + peers
                .iter()
                .map(|c| c.leave_bound())
                .max()
                .unwrap_or_default();
        for c in &peers {
            c.wait_left(end);
        }
        {
            let _endpoint = shared.lock_endpoint();
            shared.shutdown.store(true, Ordering::Release);
        }
        for c in shared.peer_list() {
            c.send_control(&Message::Bye(format!("{} shut down", shared.config.name)));
            c.lose(Failure::AgentClosed);
            shared.remove_peer(&c);
        }
        let listeners: Vec<_> = self
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for (_, h) in listeners {
            let _ = h.join();
        }
        // Staged transfers fail (their children did, with the connections), and the staging
        // thread ends.
        shared.intake.staging.stop();
        let progress: Vec<_> = self
            .progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for h in progress {
            let _ = h.join();
        }
        // The control readers end once their sockets are shut down (lose() did): join them, so
        // that when this returns no thread of this agent runs and its queue pairs are gone.
        for h in shared.take_threads() {
            let _ = h.join();
        }
        // Async waits see the agent closed.
        shared.peer_wakers.wake_all();
        shared.notes.close();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.close();
    }
}
