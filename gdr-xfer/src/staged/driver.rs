//! The staging driver: one thread per agent that runs the staged transfers' state machines
//! ([`gdr_xfer_proto::staged::StagedJob`]) over the GPUs' stagers and the connections' child
//! transfers, and reports each transfer's outcome once the job is over (no copy, no request,
//! no buffer of it left).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gdr::pd::ProtectionDomain;
use gdr_xfer_proto::staged::{ChildStats, StageIo, StagedJob, StagedRun, Start};
use gdr_xfer_proto::{DriverError, Rejection, Run, Spec, TransferKey};

use super::pace::{Pace, Wait};
use super::Bounce;
use crate::connection::Connection;
use crate::descriptor::Op;
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::segment::{Backing, SegmentInner};
use crate::staged_memory::StagedDevice;
use crate::staging::{Chunk, Direction, StagingConfig, StagingEvent, Ticket};
use crate::transfer::{Failure, RunsJobs, Stopper, TransferCell};
use crate::transfer_stats::TransferStats;

/// How long [`Driver::stop`] lets the jobs of a closing agent drain (their children failed
/// with the connections; copies and bounce buffers come back within this).
const STOP_DRAIN: Duration = Duration::from_secs(5);

/// The hint of a condition the staging driver never makes (seen only through a bug).
const NOT_SEEN: &str =
    "the staging driver keeps its chunks and runs consistent: a bug in gdr-xfer if seen";

/// A chunk as the core sees it: whose bounce buffers (the GPU's index), and the stager's chunk.
pub(crate) struct BounceChunk {
    bounce: usize,
    chunk: Chunk,
}

/// What a job is about, besides its state machine.
struct JobCtx {
    parent: Arc<TransferCell>,
    conn: Arc<Connection>,
    /// The plan's local segments (held until the job ends), and for each its bounce buffers and
    /// device memory when it is staged.
    locals: Vec<Arc<SegmentInner>>,
    staged: Vec<Option<(usize, StagedDevice)>>,
    runs: Vec<Run>,
    /// Remote keys, `rails` per remote segment of the runs.
    rkeys: Vec<u32>,
    rails: usize,
    rail_mask: u32,
    /// Per ticket the job holds: its number, its GPU's bounce buffers, the stager's ticket, and
    /// where its run starts in the device memory.
    tickets: Vec<(u64, usize, Ticket, usize)>,
    /// The children in flight: their keys and cells.
    cells: Vec<(TransferKey, Arc<TransferCell>)>,
}

/// A transfer with staged local segments.
pub(crate) struct Job {
    id: u64,
    ctx: JobCtx,
    core: StagedJob<BounceChunk, TransferKey>,
}

impl Job {
    pub(crate) fn new(
        parent: Arc<TransferCell>,
        conn: Arc<Connection>,
        plan: Plan,
        rail_mask: u32,
        notify: Option<Vec<u8>>,
    ) -> Job {
        static JOBS: AtomicU64 = AtomicU64::new(1);
        let staged: Vec<Option<(usize, StagedDevice)>> = plan
            .locals
            .iter()
            .map(|l| match &l.backing {
                Backing::Staged(m) => Some((m.bounce, m.device.clone())),
                _ => None,
            })
            .collect();
        let runs: Vec<StagedRun> = plan
            .runs
            .iter()
            .map(|r| StagedRun {
                staged: staged.get(r.local as usize).is_some_and(Option::is_some),
                len: r.len,
            })
            .collect();
        let op = parent.op;
        let timeout = Some(parent.timeout);
        let core = StagedJob::new(op, runs, notify, timeout, parent.started);
        Job {
            id: JOBS.fetch_add(1, Ordering::Relaxed),
            ctx: JobCtx {
                parent,
                rails: conn.nrails.max(1),
                conn,
                locals: plan.locals,
                staged,
                runs: plan.runs,
                rkeys: plan.rkeys,
                rail_mask,
                tickets: Vec::new(),
                cells: Vec::new(),
            },
            core,
        }
    }

    /// The job's number for the stager's ticket `ticket` of GPU `bounce`.
    fn ticket_number(&self, bounce: usize, ticket: Ticket) -> Option<u64> {
        self.ctx
            .tickets
            .iter()
            .find(|t| t.1 == bounce && t.2 == ticket)
            .map(|t| t.0)
    }

    /// Reports the outcome (the job is over: nothing of it touches the memory any more).
    fn finish(&self, now: Instant) {
        let p = &self.ctx.parent;
        let s = self.core.stats();
        let outcome = self.core.result().map(|()| TransferStats {
            bytes: p.bytes,
            descriptors: p.descriptors,
            runs: self.ctx.runs.len() as u64,
            slices: s.child.slices,
            qps_used: s.child.lanes,
            rails_used: s.child.rails,
            retried_slices: s.child.retried,
            time_to_post: self
                .core
                .posted_at()
                .unwrap_or(now)
                .saturating_duration_since(p.started),
            time_to_complete: now.saturating_duration_since(p.started),
            plan_time: Duration::ZERO,
            submit_time: Duration::ZERO,
        });
        p.finish(outcome);
    }
}

/// A job's I/O during one step: its context and the GPUs' stagers.
struct JobIo<'a> {
    ctx: &'a mut JobCtx,
    bounces: &'a mut [Bounce],
    next_ticket: &'a mut u64,
}

impl JobIo<'_> {
    fn direction(&self) -> Direction {
        match self.ctx.parent.op {
            Op::Write => Direction::DeviceToHost,
            Op::Read => Direction::HostToDevice,
        }
    }

    fn ticket(&self, number: u64) -> Option<&(u64, usize, Ticket, usize)> {
        self.ctx.tickets.iter().find(|t| t.0 == number)
    }
}

impl StageIo for JobIo<'_> {
    type Chunk = BounceChunk;
    type Child = TransferKey;
    type Error = Error;

    fn ticket_of(&self, c: &BounceChunk) -> u64 {
        self.ctx
            .tickets
            .iter()
            .find(|t| t.1 == c.bounce && t.2 == c.chunk.ticket())
            .map_or(0, |t| t.0)
    }

    fn place(&self, c: &BounceChunk, _run: usize) -> (u64, u64) {
        let start = self.ticket(self.ticket_of(c)).map_or(0, |t| t.3);
        (
            c.chunk.device_offset().saturating_sub(start) as u64,
            c.chunk.len() as u64,
        )
    }

    fn len_of(&self, c: &BounceChunk) -> u64 {
        c.chunk.len() as u64
    }

    fn start(&mut self, run: usize) -> std::result::Result<u64, Start<Error>> {
        let r = self.ctx.runs[run];
        let local = r.local as usize;
        let Some((b, dev)) = self.ctx.staged.get(local).cloned().flatten() else {
            return Err(Start::Failed(Error::invalid(
                format!("run {run} is not staged"),
                NOT_SEEN,
            )));
        };
        let direction = self.direction();
        let start = self.ctx.locals[local].base + r.local_offset as usize;
        let end = start + r.len as usize;
        let Some(bounce) = self.bounces.get_mut(b) else {
            return Err(Start::Failed(Error::invalid(
                format!("run {run} names bounce buffers {b} this agent does not have"),
                NOT_SEEN,
            )));
        };
        match bounce.stage.start(direction, &dev, start..end) {
            Ok(ticket) => {
                let n = *self.next_ticket;
                *self.next_ticket += 1;
                self.ctx.tickets.push((n, b, ticket, start));
                Ok(n)
            }
            // Too many tickets on this GPU (the ranges are checked when segments are made, so
            // that is the only argument a stager refuses): try again at the next step.
            Err(Error::InvalidArgument { .. }) => Err(Start::Busy),
            Err(e) => Err(Start::Failed(e)),
        }
    }

    fn cancel_ticket(&mut self, number: u64) {
        if let Some(&(_, b, t, _)) = self.ticket(number) {
            // A ticket already cancelled, or finishing, is refused: nothing to do then.
            if let Some(bounce) = self.bounces.get_mut(b) {
                let _ = bounce.stage.cancel(t);
            }
        }
    }

    fn post(
        &mut self,
        chunk: Option<&BounceChunk>,
        run: usize,
        offset: u64,
        len: u64,
        timeout: Duration,
        notify: Option<&[u8]>,
    ) -> std::result::Result<TransferKey, Failure> {
        let r = self.ctx.runs[run];
        let (local, local_offset) =
            match chunk {
                Some(c) => {
                    let seg = self
                        .bounces
                        .get(c.bounce)
                        .and_then(|b| b.segments.get(c.chunk.slot()))
                        .cloned()
                        .ok_or_else(|| Failure::StagingFailed {
                            error: DriverError::new(Error::invalid(
                                "a chunk names a bounce slot its buffers do not have",
                                NOT_SEEN,
                            )),
                        })?;
                    (seg, 0)
                }
                None => {
                    let seg = self.ctx.locals.get(r.local as usize).cloned().ok_or(
                        Failure::Rejected {
                            why: Rejection::UnknownLocal { run },
                        },
                    )?;
                    (seg, r.local_offset + offset)
                }
            };
        let rails = self.ctx.rails;
        let at = r.remote as usize * rails;
        let rkeys = self
            .ctx
            .rkeys
            .get(at..at + rails)
            .ok_or(Failure::Rejected {
                why: Rejection::MissingKeys {
                    keys: self.ctx.rkeys.len(),
                    remotes: u64::from(r.remote) + 1,
                    rails,
                },
            })?
            .to_vec();
        let p = &self.ctx.parent;
        let cell = Arc::new(TransferCell::new(p.op, p.peer.clone(), len, 1, timeout));
        let spec = Spec {
            op: p.op,
            locals: vec![local],
            runs: vec![Run {
                local: 0,
                local_offset,
                remote_addr: r.remote_addr + offset,
                remote: 0,
                len,
            }],
            rkeys,
            timeout: Some(timeout),
            notify: notify.map(<[u8]>::to_vec),
            rail_mask: self.ctx.rail_mask,
            handle: cell.clone(),
        };
        let key = self.ctx.conn.submit(spec)?;
        cell.set_stopper(Stopper::core(&self.ctx.conn, key));
        self.ctx.cells.push((key, cell));
        Ok(key)
    }

    fn cancel_child(&mut self, child: TransferKey) {
        self.ctx.conn.cancel(child);
    }

    fn is_quiet(&self, c: &BounceChunk) -> bool {
        self.bounces
            .get(c.bounce)
            .is_some_and(|b| b.slots.is_quiet(c.chunk.slot()))
    }

    fn give_back(&mut self, c: BounceChunk, commit: bool) -> std::result::Result<(), Error> {
        let Some(bounce) = self.bounces.get_mut(c.bounce) else {
            return Err(Error::invalid(
                "a chunk names bounce buffers this agent does not have",
                NOT_SEEN,
            ));
        };
        if commit {
            bounce.stage.commit(c.chunk)
        } else {
            bounce.stage.release(c.chunk)
        }
    }
}

/// The driver's running totals.
#[derive(Default)]
struct Counters {
    transfers: u64,
    chunks: u64,
    bytes: u64,
    waited_for_nic: u64,
}

struct State {
    bounces: Vec<Bounce>,
    jobs: Vec<Job>,
    stop: bool,
    events: Vec<StagingEvent>,
    counters: Counters,
    /// The next ticket number (unique across the GPUs).
    next_ticket: u64,
}

/// What the staging driver of an agent holds and did ([`crate::Agent::staging_stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StagingStats {
    /// Per GPU with bounce buffers, the line that says how it is staged.
    pub gpus: Vec<String>,
    /// Bounce buffers, all GPUs together.
    pub buffers: usize,
    /// Staged transfers not yet over (a failed one stays until the NIC let go of its buffers).
    pub active_transfers: usize,
    /// Staged transfers taken since the agent started.
    pub transfers: u64,
    /// Chunks moved through a bounce buffer (sent, or read and copied to the GPU), and their
    /// bytes.
    pub chunks: u64,
    /// Bytes of those chunks.
    pub bytes: u64,
    /// Chunks whose buffer had to wait, after their transfer ended, until gdr retired the
    /// requests that used it (a failed or timed-out transfer's requests still in flight).
    pub waited_for_nic: u64,
    /// Chunks waiting so now.
    pub waiting_now: usize,
    /// Chunks lent to transfers now (held, posted or waiting).
    pub chunks_in_use: usize,
}

/// The agent's staging driver: its GPUs' bounce buffers and the staged transfers in flight.
pub(crate) struct Driver {
    state: Mutex<State>,
    wake: Condvar,
    config: StagingConfig,
    /// How long the thread polls on after its work moved ([`Pace`]).
    busy_poll: Duration,
    pds: Vec<Arc<ProtectionDomain>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Driver {
    /// A driver (its thread starts with the first bounce buffers) that polls on for up to
    /// `busy_poll` after its work moved.
    pub(crate) fn new(
        pds: Vec<Arc<ProtectionDomain>>,
        config: StagingConfig,
        busy_poll: Duration,
    ) -> Driver {
        Driver {
            state: Mutex::new(State {
                bounces: Vec::new(),
                jobs: Vec::new(),
                stop: false,
                events: Vec::new(),
                counters: Counters::default(),
                next_ticket: 1,
            }),
            wake: Condvar::new(),
            config,
            busy_poll,
            pds,
            thread: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bounce buffers of `dev`'s GPU (made on first use, with the driver's thread): their
    /// index and the line that describes them.
    pub(crate) fn bounce_for(
        self: &Arc<Self>,
        dev: &StagedDevice,
        agent: &str,
    ) -> Result<(usize, String)> {
        {
            let st = self.lock();
            if let Some(i) = st.bounces.iter().position(|b| b.key == dev.key()) {
                return Ok((i, st.bounces[i].describe.clone()));
            }
        }
        // Made without the lock (registering them takes a while); another thread may have made
        // this GPU's meanwhile: then those are used and these dropped. The index is taken under
        // the same lock as the push, so it is this GPU's whatever other GPUs were added.
        let bounce = Bounce::new(&self.pds, dev, self.config)?;
        let (i, describe) = {
            let mut st = self.lock();
            match st.bounces.iter().position(|b| b.key == dev.key()) {
                Some(i) => (i, st.bounces[i].describe.clone()),
                None => {
                    let describe = bounce.describe.clone();
                    st.bounces.push(bounce);
                    (st.bounces.len() - 1, describe)
                }
            }
        };
        let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if thread.is_none() {
            let me = self.clone();
            let h = std::thread::Builder::new()
                .name(format!("xfer-staging-{agent}"))
                .spawn(move || me.run())
                .map_err(|e| Error::io("starting the staging thread", e))?;
            *thread = Some(h);
        }
        Ok((i, describe))
    }

    /// Takes a transfer with staged local segments.
    pub(crate) fn submit(self: &Arc<Self>, job: Job) -> std::result::Result<(), Failure> {
        let mut st = self.lock();
        if st.stop {
            return Err(Failure::AgentClosed);
        }
        job.ctx.parent.set_stopper(Stopper::staged(self, job.id));
        st.jobs.push(job);
        st.counters.transfers += 1;
        drop(st);
        self.wake.notify_all();
        Ok(())
    }

    /// Cancels staged transfer `job` (see [`crate::Transfer::cancel`]).
    pub(crate) fn cancel(&self, job: u64) {
        let mut st = self.lock();
        if let Some(j) = st.jobs.iter_mut().find(|j| j.id == job) {
            j.core.cancel();
        }
        drop(st);
        self.wake.notify_all();
    }

    /// What it holds and did.
    pub(crate) fn stats(&self) -> StagingStats {
        let st = self.lock();
        let (mut chunks_in_use, mut waiting_now) = (0, 0);
        for j in &st.jobs {
            let (out, draining, waiting) = j.core.chunks_out();
            chunks_in_use += out + draining;
            waiting_now += waiting;
        }
        StagingStats {
            gpus: st.bounces.iter().map(|b| b.describe.clone()).collect(),
            buffers: st.bounces.iter().map(|b| b.segments.len()).sum(),
            active_transfers: st.jobs.len(),
            transfers: st.counters.transfers,
            chunks: st.counters.chunks,
            bytes: st.counters.bytes,
            waited_for_nic: st.counters.waited_for_nic,
            waiting_now,
            chunks_in_use,
        }
    }

    /// Stops the thread: transfers still staged fail (their children already did, with the
    /// connections) and are reported once drained (at most [`STOP_DRAIN`]); it returns once
    /// the thread ended.
    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_all();
        let h = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    fn run(&self) {
        let mut st = self.lock();
        let mut pace = Pace::new(self.busy_poll);
        let mut stop_by: Option<Instant> = None;
        loop {
            if st.stop {
                let by = *stop_by.get_or_insert_with(|| Instant::now() + STOP_DRAIN);
                for job in &mut st.jobs {
                    job.core.abort(Failure::AgentClosed);
                }
                if st.jobs.is_empty() || Instant::now() >= by {
                    for job in st.jobs.drain(..) {
                        log::warn!(
                            "a staged transfer to {} did not drain within {STOP_DRAIN:?} of the agent closing",
                            job.ctx.parent.peer
                        );
                        job.ctx.parent.finish(Err(Failure::AgentClosed));
                    }
                    return;
                }
            }
            if st.jobs.is_empty() {
                st = self
                    .wake
                    .wait_timeout(st, Duration::from_millis(100))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                continue;
            }
            let before = activity(&st);
            let window = self.config.chunks;
            let stepped = catch_unwind(AssertUnwindSafe(|| step(&mut st, window, Instant::now())));
            if stepped.is_err() {
                // A bug: keep the thread (and every other job's deadline) alive; the jobs stop
                // and drain.
                log::error!("the staging driver panicked in a step (a bug); its jobs stop");
                for job in &mut st.jobs {
                    job.core.abort(Failure::StagingFailed {
                        error: DriverError::new(Error::invalid(
                            "the staging driver failed (it panicked)",
                            NOT_SEEN,
                        )),
                    });
                }
            }
            let wait = pace.after_round(Instant::now(), activity(&st) != before);
            drop(st);
            match wait {
                Wait::Poll => std::thread::yield_now(),
                Wait::Sleep(d) => std::thread::sleep(d),
            }
            st = self.lock();
        }
    }
}

/// A fingerprint of the driver's work: it changes whenever a step moved anything (an event,
/// a child, a chunk, a ticket, a job).
fn activity(st: &State) -> (usize, u64, u64, u64) {
    let mut parts = 0u64;
    for j in &st.jobs {
        let (out, draining, waiting) = j.core.chunks_out();
        let n = |x: usize| x as u64;
        parts = parts
            .wrapping_add(n(j.ctx.cells.len()))
            .wrapping_add(n(draining).wrapping_shl(12))
            .wrapping_add(n(j.ctx.tickets.len()).wrapping_shl(24))
            .wrapping_add(n(out).wrapping_shl(36))
            .wrapping_add(n(waiting).wrapping_shl(48));
    }
    (
        st.jobs.len(),
        st.counters.chunks,
        st.counters.transfers,
        parts.wrapping_add(st.next_ticket),
    )
}

/// One round: the stagers' events to their jobs, the children's outcomes, then each job's
/// step; a job that is over reports its outcome.
fn step(st: &mut State, window: usize, now: Instant) {
    let State {
        bounces,
        jobs,
        events,
        counters,
        next_ticket,
        ..
    } = st;
    for b in 0..bounces.len() {
        bounces[b].stage.poll(events);
        for ev in events.drain(..) {
            let ticket = match &ev {
                StagingEvent::Ready(c) | StagingEvent::Fill(c) => c.ticket(),
                StagingEvent::Finished { ticket, .. } => *ticket,
            };
            let job = jobs
                .iter_mut()
                .find_map(|j| j.ticket_number(b, ticket).map(|n| (n, j)));
            match (ev, job) {
                (StagingEvent::Ready(c) | StagingEvent::Fill(c), Some((_, j))) => {
                    let mut io = JobIo {
                        ctx: &mut j.ctx,
                        bounces,
                        next_ticket,
                    };
                    j.core.on_chunk(
                        &mut io,
                        now,
                        BounceChunk {
                            bounce: b,
                            chunk: c,
                        },
                    );
                }
                (StagingEvent::Finished { outcome, .. }, Some((n, j))) => {
                    let r = match outcome {
                        crate::staging::Outcome::Failed(e) => Err(DriverError::new(e)),
                        _ => Ok(()),
                    };
                    j.core.on_ticket_finished(n, r);
                    j.ctx.tickets.retain(|t| t.0 != n);
                }
                // A ticket no job has: cannot happen; give its chunk back.
                (StagingEvent::Ready(c) | StagingEvent::Fill(c), None) => {
                    let _ = bounces[b].stage.release(c);
                }
                (StagingEvent::Finished { .. }, None) => {}
            }
        }
    }
    for job in jobs.iter_mut() {
        let mut i = 0;
        while i < job.ctx.cells.len() {
            let Some(outcome) = job.ctx.cells[i].1.outcome() else {
                i += 1;
                continue;
            };
            let (key, _) = job.ctx.cells.swap_remove(i);
            let r = outcome.map(|s| ChildStats {
                slices: s.slices,
                lanes: s.qps_used,
                rails: s.rails_used,
                retried: s.retried_slices,
            });
            job.core.on_child_finished(key, r);
        }
        let mut io = JobIo {
            ctx: &mut job.ctx,
            bounces,
            next_ticket,
        };
        job.core.step(&mut io, now, window);
    }
    jobs.retain(|job| {
        if !job.core.is_over() {
            return true;
        }
        let s = job.core.stats();
        counters.chunks += s.chunks;
        counters.bytes += s.bytes;
        counters.waited_for_nic += s.waited_for_nic;
        job.finish(now);
        false
    });
}

impl RunsJobs for Driver {
    fn stop_job(&self, job: u64) {
        self.cancel(job);
    }
}
