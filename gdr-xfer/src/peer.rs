//! The handle of a connected peer: its segment table, and the transfers to it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::TransferOptions;
use crate::connection::Connection;
use crate::descriptor::{BlockTable, Desc, LocalList, Op, RemoteList};
use crate::error::{Error, Foreign, Result};
use crate::intake::Intake;
use crate::shared::AgentShared;
use crate::side::Side;
use gdr_xfer_proto::{Failure, Lost, SegmentId, Spec};

use crate::plan::Planner;
use crate::pools::PoolTable;
use crate::staged::driver::Job;
use crate::transfer::{Pending, Stopper, Transfer, TransferCell};
use crate::wire::SegmentInfo;

/// A connected peer. Cheap to clone. Transfers to it are one-sided: the peer's CPU takes no
/// part (its agent's progress thread only receives notifications).
#[derive(Clone)]
pub struct Peer {
    pub(crate) conn: Arc<Connection>,
    /// What a submission passes first: its agent open, the transfer counted as pending, and
    /// the agent's staging driver. Nothing else of the agent: a peer handle does not keep a
    /// dropped agent's threads alive, and holds no pointer back to it.
    pub(crate) intake: Arc<Intake>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("name", &self.conn.name)
            .field("rails", &self.conn.nrails)
            .field("qps_per_rail", &self.conn.qps_per_rail)
            .field("lost", &self.conn.is_lost())
            .finish()
    }
}

impl Peer {
    /// The handle of `conn`, a connection of `agent`.
    pub(crate) fn new(conn: Arc<Connection>, agent: &Arc<AgentShared>) -> Peer {
        Peer {
            conn,
            intake: agent.intake.clone(),
        }
    }

    /// `agent`'s connected (handshake done) peer with this name.
    pub(crate) fn ready(agent: &Arc<AgentShared>, name: &str) -> Option<Peer> {
        let endpoint = agent.lock_endpoint();
        endpoint.peer(name).map(|c| Peer::new(c.clone(), agent))
    }

    /// The peer agent's name.
    pub fn name(&self) -> &str {
        &self.conn.name
    }

    /// Whether the connection works (`false` once it was lost: the peer closed it, died, or a
    /// request failed).
    pub fn is_connected(&self) -> bool {
        self.conn.gone().is_none()
    }

    /// Why the connection was lost, once it was, in words ([`Peer::lost`] as a value).
    pub fn lost_reason(&self) -> Option<String> {
        self.lost().map(|why| why.to_string())
    }

    /// Why the connection was lost, once it was, as a value: this agent disconnected, the
    /// peer said goodbye (its words) or broke the protocol, the control link failed (the
    /// error), the directory lost its record. `None` while it works, and after a shutdown of
    /// this agent ([`Error::AgentClosed`] then).
    pub fn lost(&self) -> Option<Lost> {
        match self.conn.gone()? {
            Failure::PeerLost { why } => Some(why),
            _ => None,
        }
    }

    /// The queue pair numbers of the connection's working lanes (rail-major; a failed
    /// rail's are missing until it is renewed, with new numbers).
    pub fn qp_nums(&self) -> Vec<u32> {
        self.conn.qp_nums()
    }

    /// Per shared rail: its state (active, paused after a failure, renewing, probing), bytes
    /// and slices completed, errors, slices failed over, renewals, re-admissions, bytes in
    /// flight, measured throughput, the last error and the last failover time.
    pub fn rail_stats(&self) -> Vec<crate::RailStats> {
        self.conn.rail_stats()
    }

    /// The peer's segments, as it last announced them.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let table = self.conn.remote.read().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<SegmentInfo> = table.iter().cloned().collect();
        v.sort_by_key(|s| s.id);
        v
    }

    /// The peer's segment with this id.
    pub fn segment(&self, id: SegmentId) -> Option<SegmentInfo> {
        let table = self.conn.remote.read().unwrap_or_else(|p| p.into_inner());
        table.get(id).cloned()
    }

    /// The peer's segment with this name (the one with the lowest id if several share it).
    pub fn segment_named(&self, name: &str) -> Option<SegmentInfo> {
        self.segments().into_iter().find(|s| s.name == name)
    }

    /// Waits until the peer has announced a segment with this name.
    ///
    /// # Errors
    /// [`Error::Timeout`], or [`Error::PeerLost`] when the connection is lost meanwhile;
    /// [`Error::AgentClosed`] once this agent is shut down.
    pub fn wait_segment_named(
        &self,
        name: &str,
        timeout: std::time::Duration,
    ) -> Result<SegmentInfo> {
        // No end for a timeout past what the clock can count (`Duration::MAX`).
        let end = Instant::now().checked_add(timeout);
        loop {
            self.check_agent()?;
            if let Some(s) = self.segment_named(name) {
                return Ok(s);
            }
            self.check_connected()?;
            if end.is_some_and(|e| Instant::now() >= e) {
                return Err(Error::Timeout {
                    what: format!("waiting for {}'s segment {name:?}", self.name()),
                    after: timeout,
                    hint: "register it on the peer first".into(),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// [`Error::AgentClosed`] once this peer's agent is shut down (or dropped).
    pub(crate) fn check_agent(&self) -> Result<()> {
        self.intake.check_open()
    }

    pub(crate) fn check_connected(&self) -> Result<()> {
        match self.conn.gone() {
            None => Ok(()),
            Some(Failure::PeerLost { why }) => Err(Error::PeerLost {
                peer: self.conn.name.clone(),
                why,
                hint: crate::error::PEER_LOST_HINT.into(),
            }),
            // The connection closes with PeerLost, or AgentClosed at a shutdown.
            Some(_) => Err(Error::AgentClosed),
        }
    }

    /// Checks `(segment id, offset, len)` ranges of the peer's segments once, for
    /// [`Peer::transfer_indexed`].
    ///
    /// # Errors
    /// [`Error::UnknownSegment`], [`Error::OutOfSegment`], or [`Error::InvalidArgument`] for an
    /// empty range; [`Error::AgentClosed`] once this agent is shut down.
    pub fn prepare_remote(&self, ranges: &[(SegmentId, u64, u64)]) -> Result<RemoteList> {
        self.check_agent()?;
        let table = self.conn.remote.read().unwrap_or_else(|p| p.into_inner());
        for (i, &(id, offset, len)) in ranges.iter().enumerate() {
            let s = table.get(id).ok_or_else(|| Error::UnknownSegment {
                owner: self.conn.name.clone(),
                segment: id,
                hint: "list the peer's segments with Peer::segments".into(),
            })?;
            if len == 0 {
                return Err(Error::invalid(
                    format!("remote range {i} is empty"),
                    "every range moves at least one byte",
                ));
            }
            if offset.checked_add(len).is_none_or(|e| e > s.len) {
                return Err(Error::OutOfSegment {
                    index: Some(i),
                    side: Side::Remote,
                    segment: id,
                    offset,
                    len,
                    segment_len: s.len,
                    hint: "check the range against Peer::segment".into(),
                });
            }
        }
        Ok(RemoteList {
            peer: self.conn.name.clone(),
            conn: self.conn.serial,
            entries: ranges.to_vec(),
        })
    }

    /// Writes a descriptor list into the peer's memory.
    ///
    /// # Errors
    /// Bad input, before anything is posted: [`Error::OutOfSegment`], [`Error::UnknownSegment`],
    /// [`Error::InvalidArgument`] (empty list or descriptor), [`Error::TooLarge`] (a notification over the bound);
    /// [`Error::PeerLost`] when the connection is gone. Failures after submission are the
    /// transfer's ([`Transfer::wait`]).
    pub fn write(&self, descs: &[Desc<'_>], opts: &TransferOptions) -> Result<Transfer> {
        self.transfer(Op::Write, descs, opts)
    }

    /// Reads a descriptor list from the peer's memory into local segments (as
    /// [`Peer::write`]).
    ///
    /// # Errors
    /// As [`Peer::write`].
    pub fn read(&self, descs: &[Desc<'_>], opts: &TransferOptions) -> Result<Transfer> {
        self.transfer(Op::Read, descs, opts)
    }

    /// Posts the requests of transfers to this peer that were queued without posting
    /// ([`TransferOptions::post_inline_max`]) and fit the queues now; what does not fit is
    /// posted as completions free room, as always. Cheap when nothing is queued. Meant for a
    /// thread other than the one that submitted (an event loop's helper thread).
    pub fn post_queued(&self) {
        self.conn.post_queued();
    }

    /// Moves a descriptor list in direction `op` (as [`Peer::write`]).
    ///
    /// # Errors
    /// As [`Peer::write`].
    pub fn transfer(&self, op: Op, descs: &[Desc<'_>], opts: &TransferOptions) -> Result<Transfer> {
        self.submit(op, opts, descs.len(), |p| p.descs(descs))
    }

    /// Moves the blocks of a block table in direction `op` (the paged form: no descriptor per
    /// block).
    ///
    /// # Errors
    /// As [`Peer::write`], and [`Error::IndexOutOfRange`] for a block outside its segment
    /// ([`Error::BlockOutOfSegment`] when the table's base leaves no whole block).
    pub fn transfer_blocks(
        &self,
        op: Op,
        table: &BlockTable<'_>,
        opts: &TransferOptions,
    ) -> Result<Transfer> {
        self.submit(op, opts, table.local_blocks.len(), |p| p.blocks(table))
    }

    /// Moves the same blocks in every pool of a layer-aware table (layers x {K, V} of a KV
    /// cache) in direction `op`: one call, one transfer, and one outcome for all of its
    /// blocks. Runs continuing on both sides are merged, as for a block table.
    ///
    /// The outcome is the transfer's: when it fails, any of its blocks may or may not have
    /// landed, so a caller reporting blocks that failed to load (vLLM's
    /// `get_block_ids_with_load_errors`) reports all of them.
    ///
    /// # Errors
    /// As [`Peer::write`], [`Error::BlockOutOfSegment`] for a block outside its pool's segment
    /// (naming the pool), [`Error::InvalidArgument`] for index arrays of different lengths, a
    /// zero block length, strides shorter than a block, or no pool.
    pub fn transfer_pools(
        &self,
        op: Op,
        table: &PoolTable<'_>,
        opts: &TransferOptions,
    ) -> Result<Transfer> {
        let capacity = usize::try_from(table.blocks()).unwrap_or(usize::MAX);
        self.submit(op, opts, capacity.min(1 << 24), |p| p.pools(table))
    }

    /// Moves entries `local_idx[i]` of a prepared local list to or from entries `remote_idx[i]`
    /// of a prepared remote list.
    ///
    /// # Errors
    /// As [`Peer::write`], [`Error::IndexOutOfRange`] and [`Error::LengthMismatch`];
    /// [`Error::ForeignObject`] for a remote list prepared on another connection (another
    /// agent's, or an earlier connection to this peer's name).
    pub fn transfer_indexed(
        &self,
        op: Op,
        local: &LocalList,
        local_idx: &[u32],
        remote: &RemoteList,
        remote_idx: &[u32],
        opts: &TransferOptions,
    ) -> Result<Transfer> {
        if remote.conn != self.conn.serial {
            return Err(Error::ForeignObject {
                call: "Peer::transfer_indexed",
                object: Foreign::RemoteList(remote.peer.clone()),
                hint: "prepare the remote list with Peer::prepare_remote on this peer (again after a reconnection)".into(),
            });
        }
        self.submit(op, opts, local_idx.len(), |p| {
            p.indexed(local, local_idx, remote, remote_idx)
        })
    }

    /// Sends `data` to the peer as a notification without a transfer (NIXL's `genNotif`): the
    /// peer takes it like any other ([`crate::Agent::wait_notification`],
    /// [`crate::Agent::notifications`]), once. The returned transfer is done once the peer's
    /// NIC took the message; `opts`' timeout applies while it waits for a send slot. Messages
    /// travel like notifications, on the first rail with a free send slot: over several rails
    /// two of them may arrive in either order.
    ///
    /// Messages are sized by the receiver: at most the smaller of its
    /// [`AgentConfig::notify_max`](crate::AgentConfig::notify_max) and this agent's (up to
    /// 64 KiB), and held back by its receive slots, as notifications are (a receiver that does
    /// not take them makes the sender's NIC retry, not the receiver's memory grow).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty message, one longer than the peer takes, or
    /// `opts` with a notification of its own; [`Error::PeerLost`], [`Error::AgentClosed`].
    pub fn send_notification(
        &self,
        data: impl Into<Vec<u8>>,
        opts: &TransferOptions,
    ) -> Result<Transfer> {
        let started = Instant::now();
        let data = data.into();
        if data.is_empty() || opts.notify.is_some() {
            return Err(Error::invalid(
                format!(
                    "a message of {} bytes{}",
                    data.len(),
                    if opts.notify.is_some() {
                        " with a notification of its own"
                    } else {
                        ""
                    }
                ),
                "send at least one byte, and leave TransferOptions::notify unset: the message is the notification",
            ));
        }
        let pending = self.begin(Some(&data))?;
        let timeout = opts.timeout.unwrap_or(self.intake.default_timeout);
        let cell = Arc::new(TransferCell::new(
            Op::Write,
            self.conn.name.clone(),
            0,
            0,
            timeout,
        ));
        cell.set_message();
        cell.set_pending(pending);
        let spec = Spec {
            op: Op::Write,
            locals: Vec::new(),
            runs: Vec::new(),
            rkeys: Vec::new(),
            timeout: Some(timeout),
            notify: Some(data),
            rail_mask: u32::MAX,
            handle: cell.clone(),
        };
        let key = self.conn.submit(spec).map_err(|f| cell.error(&f))?;
        cell.set_stopper(Stopper::core(&self.conn, key));
        cell.set_times(Duration::ZERO, started.elapsed());
        Ok(Transfer { cell })
    }

    /// What every submission checks first: the agent open, the peer connected, the
    /// notification within what the peer takes. Returns the transfer counted as pending.
    fn begin(&self, notify: Option<&[u8]>) -> Result<Pending> {
        let pending = self.intake.admit()?;
        self.check_connected()?;
        if let Some(n) = notify {
            if n.len() > self.conn.notify_max as usize {
                return Err(Error::TooLarge {
                    what: format!(
                        "notification to {} (the bound is the smaller of its notify_max and this agent's)",
                        self.conn.name
                    ),
                    len: n.len() as u64,
                    max: u64::from(self.conn.notify_max),
                    hint: "send a short key and keep the payload in a segment, or raise notify_max on both agents (up to 64 KiB)".into(),
                });
            }
        }
        Ok(pending)
    }

    fn submit(
        &self,
        op: Op,
        opts: &TransferOptions,
        capacity: usize,
        plan: impl FnOnce(&mut Planner<'_>) -> Result<()>,
    ) -> Result<Transfer> {
        let started = Instant::now();
        let pending = self.begin(opts.notify.as_deref())?;
        let intake = &self.intake;
        let plan = {
            let table = self.conn.remote.read().unwrap_or_else(|p| p.into_inner());
            let mut planner = Planner::new(
                &self.conn.name,
                &table,
                self.conn.nrails,
                capacity,
                intake.agent,
            );
            plan(&mut planner)?;
            planner.finish()?
        };
        let plan_time = started.elapsed();
        let timeout = opts.timeout.unwrap_or(intake.default_timeout);
        let rail_mask = plan.locals.first().map_or(u32::MAX, |l| l.rail_mask);
        let bytes = plan.runs.iter().fold(0u64, |b, r| b.saturating_add(r.len));
        let cell = Arc::new(TransferCell::new(
            op,
            self.conn.name.clone(),
            bytes,
            plan.descriptors,
            timeout,
        ));
        cell.set_pending(pending);
        if plan.locals.iter().any(|l| l.is_staged()) {
            // Staged local memory: the staging driver moves it in chunks, each a child transfer
            // from or to a bounce buffer (crate::staging).
            let job = Job::new(
                cell.clone(),
                self.conn.clone(),
                plan,
                rail_mask,
                opts.notify.clone(),
            );
            intake.staging.submit(job).map_err(|f| cell.error(&f))?;
        } else {
            let spec = Spec {
                op,
                locals: plan.locals,
                runs: plan.runs,
                rkeys: plan.rkeys,
                timeout: Some(timeout),
                notify: opts.notify.clone(),
                rail_mask,
                handle: cell.clone(),
            };
            // Refused at once (peer gone, no rail left): the same error the transfer would give.
            // Whether it is posted now is the core's decision.
            let key = match opts.post_inline_max {
                Some(max) => self.conn.submit_inline_up_to(spec, max),
                None => self.conn.submit(spec),
            }
            .map_err(|f| cell.error(&f))?;
            cell.set_stopper(Stopper::core(&self.conn, key));
        }
        cell.set_times(plan_time, started.elapsed());
        #[cfg(feature = "metrics")]
        crate::metrics::transfer_planned(op, plan_time);
        Ok(Transfer { cell })
    }
}
