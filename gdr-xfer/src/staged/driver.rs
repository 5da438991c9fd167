//! The staging driver: one thread per agent that turns each transfer of a staged segment into
//! stager tickets and child transfers, and gives every bounce buffer back only once the NIC can
//! no longer touch it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gdr::pd::ProtectionDomain;
use gdr_xfer_proto::{Failure as CoreFailure, Run, Spec, TransferKey};

use super::{Bounce, StagedDevice};
use crate::connection::Connection;
use crate::descriptor::Op;
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::segment::{Backing, SegmentInner};
use crate::staging::{Chunk, Direction, Outcome, StagingConfig, StagingEvent, Ticket};
use crate::transfer::{Failure, Stopper, TransferCell, TransferStats};

/// The failure a copy engine's error gives the transfer.
fn staging_failure(e: &Error) -> Failure {
    Failure::Staging {
        detail: e.to_string(),
    }
}

/// How long [`Driver::stop`] lets the jobs of a closing agent drain (their children failed
/// with the connections; copies and bounce buffers come back within this).
const STOP_DRAIN: Duration = Duration::from_secs(5);

/// How long the driver sleeps between polls while its work moves (copies and children progress
/// without it; this bounds the added latency per chunk). Polls that find nothing changed double
/// the sleep, up to [`POLL_IDLE`], so that waiting on a slow link or copy costs little CPU.
const POLL: Duration = Duration::from_micros(20);
const POLL_IDLE: Duration = Duration::from_millis(1);

/// A ticket of a job: which bounce buffers, which run, and where the run starts and ends in the
/// device memory.
struct TicketRun {
    bounce: usize,
    ticket: Ticket,
    run: usize,
    dev_start: usize,
    dev_end: usize,
}

/// A chunk lent to a job, and what to do with it once its slot is quiet.
struct Lent {
    bounce: usize,
    chunk: Chunk,
    /// Whether to commit it (a READ child completed: copy it to the device) rather than
    /// release it.
    commit: bool,
    /// Whether it was found not quiet at least once (something still held its buffer).
    waited: bool,
    /// Whether its child completed (its bytes went through).
    moved: bool,
}

/// A child transfer and the chunk it moves (none for a run of a directly registered segment).
struct Child {
    cell: Arc<TransferCell>,
    key: TransferKey,
    chunk: Option<(usize, Chunk)>,
}

/// The last piece of a transfer with a notification: posted (with it) once every other child
/// completed.
enum Held {
    Chunk {
        bounce: usize,
        chunk: Chunk,
        remote_addr: u64,
        remote: u32,
    },
    Direct(usize),
}

/// A transfer with staged local segments.
pub(crate) struct Job {
    id: u64,
    parent: Arc<TransferCell>,
    conn: Arc<Connection>,
    runs: Vec<Run>,
    /// Remote keys, `rails` per remote segment of the runs.
    rkeys: Vec<u32>,
    rails: usize,
    rail_mask: u32,
    notify: Option<Vec<u8>>,
    /// Set by [`Driver::cancel`].
    cancelled: bool,
    posted_at: Option<Instant>,
    /// Telemetry gathered from the children.
    qps_used: u32,
    rails_used: u32,
    retried: u64,
    slices: u64,
    /// The plan's local segments (held until the job ends), and for each its bounce buffers and
    /// device memory when it is staged.
    locals: Vec<Arc<SegmentInner>>,
    staged: Vec<Option<(usize, StagedDevice)>>,
    next_run: usize,
    tickets: Vec<TicketRun>,
    children: Vec<Child>,
    held: Option<Held>,
    /// Chunks whose child ended, waiting for their slot to be quiet.
    draining: Vec<Lent>,
    failure: Option<Failure>,
}

impl Job {
    pub(crate) fn new(
        parent: Arc<TransferCell>,
        conn: Arc<Connection>,
        plan: Plan,
        rail_mask: u32,
        notify: Option<Vec<u8>>,
    ) -> Job {
        let locals = plan.locals;
        let staged = locals
            .iter()
            .map(|l| match &l.backing {
                Backing::Staged(m) => Some((m.bounce, m.device.clone())),
                _ => None,
            })
            .collect();
        static JOBS: AtomicU64 = AtomicU64::new(1);
        Job {
            id: JOBS.fetch_add(1, Ordering::Relaxed),
            parent,
            rails: conn.nrails.max(1),
            conn,
            runs: plan.runs,
            rkeys: plan.rkeys,
            rail_mask,
            notify,
            cancelled: false,
            posted_at: None,
            qps_used: 0,
            rails_used: 0,
            retried: 0,
            slices: 0,
            locals,
            staged,
            next_run: 0,
            tickets: Vec::new(),
            children: Vec::new(),
            held: None,
            draining: Vec::new(),
            failure: None,
        }
    }

    fn direction(&self) -> Direction {
        match self.parent.op {
            Op::Write => Direction::DeviceToHost,
            Op::Read => Direction::HostToDevice,
        }
    }

    /// Records the first failure and stops the children; the transfer reports it once the job
    /// is over (every child ended, every copy complete, every bounce buffer quiet), so that no
    /// copy or request touches its memory after its outcome.
    fn fail(&mut self, f: Failure) {
        if self.failure.is_some() {
            return;
        }
        let f = match f {
            Failure::Core(CoreFailure::Timeout { .. }) => Failure::Core(CoreFailure::Timeout {
                after: self.parent.timeout,
            }),
            f => f,
        };
        for c in &self.children {
            self.conn.cancel(c.key);
        }
        self.failure = Some(f);
    }

    /// A child moving `len` bytes between `local` at `local_offset` and the peer.
    fn child(
        &self,
        local: Arc<SegmentInner>,
        local_offset: u64,
        remote_addr: u64,
        remote: u32,
        len: u64,
        notify: Option<Vec<u8>>,
    ) -> std::result::Result<(Arc<TransferCell>, TransferKey), Failure> {
        let parent = &self.parent;
        let left = match parent.deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => parent.timeout,
        };
        if left.is_zero() {
            return Err(Failure::Core(CoreFailure::Timeout {
                after: parent.timeout,
            }));
        }
        let rails = self.rails;
        let at = remote as usize * rails;
        let rkeys = self
            .rkeys
            .get(at..at + rails)
            .ok_or_else(|| {
                Failure::Core(CoreFailure::Rejected {
                    detail: format!("remote segment {remote} has no keys"),
                })
            })?
            .to_vec();
        let cell = Arc::new(TransferCell::new(
            parent.op,
            parent.peer.clone(),
            len,
            1,
            left,
        ));
        let spec = Spec {
            op: parent.op,
            locals: vec![local],
            runs: vec![Run {
                local: 0,
                local_offset,
                remote_addr,
                remote: 0,
                len,
            }],
            rkeys,
            timeout: Some(left),
            notify,
            rail_mask: self.rail_mask,
            handle: cell.clone(),
        };
        let key = self.conn.submit(spec)?;
        cell.set_stopper(Stopper::Core(Arc::downgrade(&self.conn), key));
        Ok((cell, key))
    }

    fn is_last_piece(&self, run: usize, end: usize, tr_end: usize) -> bool {
        run + 1 == self.runs.len() && end == tr_end
    }

    /// Gives a chunk that was never posted (or whose child ended) to the draining list.
    fn give_back(&mut self, bounce: usize, chunk: Chunk) {
        self.draining.push(Lent {
            bounce,
            chunk,
            commit: false,
            waited: false,
            moved: false,
        });
    }

    /// Posts a chunk's child from its bounce buffer `local` (a chunk it cannot post is given
    /// back and fails the job).
    fn post_chunk(
        &mut self,
        bounce: usize,
        chunk: Chunk,
        local: Arc<SegmentInner>,
        (remote_addr, remote): (u64, u32),
        notify: Option<Vec<u8>>,
    ) {
        match self.child(local, 0, remote_addr, remote, chunk.len() as u64, notify) {
            Ok((cell, key)) => self.children.push(Child {
                cell,
                key,
                chunk: Some((bounce, chunk)),
            }),
            Err(f) => {
                self.give_back(bounce, chunk);
                self.fail(f);
            }
        }
    }

    /// Posts run `i` of a directly registered segment as one child.
    fn post_direct(&mut self, i: usize, notify: Option<Vec<u8>>) {
        let run = self.runs[i];
        let Some(seg) = self.locals.get(run.local as usize).cloned() else {
            self.fail(Failure::Core(CoreFailure::Rejected {
                detail: format!("run {i} names a local segment the transfer does not have"),
            }));
            return;
        };
        match self.child(
            seg,
            run.local_offset,
            run.remote_addr,
            run.remote,
            run.len,
            notify,
        ) {
            Ok((cell, key)) => self.children.push(Child {
                cell,
                key,
                chunk: None,
            }),
            Err(f) => self.fail(f),
        }
    }

    /// A chunk the stager lent for this job (its bytes ready to send, or free to fill).
    fn on_chunk(&mut self, bounce: usize, chunk: Chunk, segments: &[Arc<SegmentInner>]) {
        let Some(tr) = self
            .tickets
            .iter()
            .find(|t| t.bounce == bounce && t.ticket == chunk.ticket())
        else {
            // Not ours any more: cannot happen (tickets are removed only when finished).
            self.give_back(bounce, chunk);
            return;
        };
        if self.failure.is_some() {
            // Never posted: the NIC never saw it.
            self.give_back(bounce, chunk);
            return;
        }
        let run = self.runs[tr.run];
        let offset = (chunk.device_offset() - tr.dev_start) as u64;
        let remote_addr = run.remote_addr + offset;
        let last = self.is_last_piece(tr.run, chunk.device_offset() + chunk.len(), tr.dev_end);
        if last && self.notify.is_some() {
            self.held = Some(Held::Chunk {
                bounce,
                chunk,
                remote_addr,
                remote: run.remote,
            });
            return;
        }
        let Some(local) = segments.get(chunk.slot()).cloned() else {
            self.give_back(bounce, chunk);
            self.fail(staging_failure(&Error::invalid(
                "a chunk names a bounce slot its buffers do not have",
                "this is a bug in gdr-xfer's staging driver",
            )));
            return;
        };
        self.post_chunk(bounce, chunk, local, (remote_addr, run.remote), None);
    }

    fn on_finished(&mut self, bounce: usize, ticket: Ticket, outcome: Outcome) {
        self.tickets
            .retain(|t| !(t.bounce == bounce && t.ticket == ticket));
        if let Outcome::Failed(e) = outcome {
            self.fail(staging_failure(&e));
        }
    }

    /// Starts tickets (or direct children) for the next runs, at most `window` tickets at once.
    fn start_runs(&mut self, bounces: &mut [Bounce], window: usize) {
        while self.failure.is_none()
            && self.next_run < self.runs.len()
            && self.tickets.len() < window
        {
            let i = self.next_run;
            let run = self.runs[i];
            let local = run.local as usize;
            match self.staged.get(local).cloned().flatten() {
                Some((b, dev)) => {
                    let Some(bounce) = bounces.get_mut(b) else {
                        self.fail(staging_failure(&Error::invalid(
                            format!("segment of run {i} names bounce buffers {b} this agent does not have"),
                            "stage only segments registered with this agent",
                        )));
                        break;
                    };
                    let start = self.locals[local].base + run.local_offset as usize;
                    let end = start + run.len as usize;
                    match bounce.stage.start(self.direction(), &dev, start..end) {
                        Ok(ticket) => self.tickets.push(TicketRun {
                            bounce: b,
                            ticket,
                            run: i,
                            dev_start: start,
                            dev_end: end,
                        }),
                        // Too many tickets on this GPU (the ranges are checked when segments
                        // are made, so that is the only argument a stager refuses): try again
                        // at the next poll; the transfer's deadline bounds the wait.
                        Err(Error::InvalidArgument { .. }) => break,
                        Err(e) => {
                            self.fail(staging_failure(&e));
                            break;
                        }
                    }
                }
                None => {
                    if i + 1 == self.runs.len() && self.notify.is_some() {
                        self.held = Some(Held::Direct(i));
                    } else {
                        self.post_direct(i, None);
                    }
                }
            }
            self.next_run += 1;
        }
    }

    /// Collects children that ended (their memory is quiet): their chunks go to draining,
    /// their telemetry to the parent; a failed one fails the job.
    fn reap_children(&mut self) {
        let mut i = 0;
        while i < self.children.len() {
            let Some(outcome) = self.children[i].cell.outcome() else {
                i += 1;
                continue;
            };
            let child = self.children.swap_remove(i);
            if let Ok(s) = &outcome {
                self.qps_used = self.qps_used.max(s.qps_used);
                self.rails_used = self.rails_used.max(s.rails_used);
                self.retried += s.retried_slices;
                self.slices += s.slices;
            }
            let ok = outcome.is_ok();
            if let Some((bounce, chunk)) = child.chunk {
                let commit = ok && chunk.direction() == Direction::HostToDevice;
                self.draining.push(Lent {
                    bounce,
                    chunk,
                    commit,
                    waited: false,
                    moved: ok,
                });
            }
            if let Err(f) = outcome {
                self.fail(f);
            }
        }
    }

    /// Gives back every draining chunk whose slot is quiet.
    fn drain(&mut self, bounces: &mut [Bounce], stats: &mut Counters) {
        let mut i = 0;
        while i < self.draining.len() {
            let l = &mut self.draining[i];
            if !bounces
                .get(l.bounce)
                .is_some_and(|b| b.slots.is_quiet(l.chunk.slot()))
            {
                l.waited = true;
                i += 1;
                continue;
            }
            let l = self.draining.swap_remove(i);
            stats.waited_for_nic += u64::from(l.waited);
            if l.moved {
                stats.chunks += 1;
                stats.bytes += l.chunk.len() as u64;
            }
            let Some(stage) = bounces.get_mut(l.bounce).map(|b| &mut b.stage) else {
                continue;
            };
            let r = if l.commit && self.failure.is_none() {
                stage.commit(l.chunk)
            } else {
                stage.release(l.chunk)
            };
            if let Err(e) = r {
                self.fail(staging_failure(&e));
            }
        }
    }

    /// Posts the held last piece, with the notification, once every other child completed.
    fn post_held(&mut self, segments: &[&[Arc<SegmentInner>]]) {
        if self.failure.is_some() {
            if let Some(Held::Chunk { bounce, chunk, .. }) = self.held.take() {
                self.give_back(bounce, chunk);
            }
            self.held = None;
            return;
        }
        if !self.children.is_empty() || self.next_run < self.runs.len() {
            return;
        }
        // Every other piece must have been posted and completed: no ticket may be left but the
        // one whose last chunk is held (its earlier chunks were children, now complete).
        let others_open = match &self.held {
            None => return,
            Some(Held::Direct(_)) => !self.tickets.is_empty(),
            Some(Held::Chunk { bounce, chunk, .. }) => self
                .tickets
                .iter()
                .any(|t| !(t.bounce == *bounce && t.ticket == chunk.ticket())),
        };
        if others_open {
            return;
        }
        let Some(held) = self.held.take() else {
            return;
        };
        let notify = self.notify.clone();
        match held {
            Held::Chunk {
                bounce,
                chunk,
                remote_addr,
                remote,
            } => {
                let Some(local) = segments
                    .get(bounce)
                    .and_then(|s| s.get(chunk.slot()))
                    .cloned()
                else {
                    self.give_back(bounce, chunk);
                    self.fail(staging_failure(&Error::invalid(
                        "the held chunk names a bounce slot its buffers do not have",
                        "this is a bug in gdr-xfer's staging driver",
                    )));
                    return;
                };
                self.post_chunk(bounce, chunk, local, (remote_addr, remote), notify);
            }
            Held::Direct(i) => self.post_direct(i, notify),
        }
        self.posted_at = Some(Instant::now());
    }

    /// Whether nothing of the job is left anywhere (it is then finished).
    fn is_over(&self) -> bool {
        (self.failure.is_some() || self.next_run >= self.runs.len())
            && self.tickets.is_empty()
            && self.children.is_empty()
            && self.draining.is_empty()
            && self.held.is_none()
    }

    fn cancel_tickets(&self, bounces: &mut [Bounce]) {
        for t in &self.tickets {
            // A ticket already cancelled, or finishing, is refused: nothing to do then.
            if let Some(b) = bounces.get_mut(t.bounce) {
                let _ = b.stage.cancel(t.ticket);
            }
        }
    }

    /// Reports the outcome (the job is over: nothing of it touches the memory any more).
    fn finish(&self, now: Instant) {
        let p = &self.parent;
        let outcome = match &self.failure {
            Some(f) => Err(f.clone()),
            None => Ok(TransferStats {
                bytes: p.bytes,
                descriptors: p.descriptors,
                runs: self.runs.len() as u64,
                slices: self.slices,
                qps_used: self.qps_used,
                rails_used: self.rails_used,
                retried_slices: self.retried,
                time_to_post: self
                    .posted_at
                    .unwrap_or(now)
                    .saturating_duration_since(p.started),
                time_to_complete: now.saturating_duration_since(p.started),
                plan_time: Duration::ZERO,
                submit_time: Duration::ZERO,
            }),
        };
        p.finish(outcome);
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
    pds: Vec<Arc<ProtectionDomain>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Driver {
    /// A driver (its thread starts with the first bounce buffers).
    pub(crate) fn new(pds: Vec<Arc<ProtectionDomain>>, config: StagingConfig) -> Driver {
        Driver {
            state: Mutex::new(State {
                bounces: Vec::new(),
                jobs: Vec::new(),
                stop: false,
                events: Vec::new(),
                counters: Counters::default(),
            }),
            wake: Condvar::new(),
            config,
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
            return Err(Failure::Core(CoreFailure::AgentClosed));
        }
        job.parent
            .set_stopper(Stopper::Staged(Arc::downgrade(self), job.id));
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
            j.cancelled = true;
        }
        drop(st);
        self.wake.notify_all();
    }

    /// What it holds and did.
    pub(crate) fn stats(&self) -> StagingStats {
        let st = self.lock();
        let waiting_now = st
            .jobs
            .iter()
            .map(|j| j.draining.iter().filter(|l| l.waited).count())
            .sum();
        let chunks_in_use = st
            .jobs
            .iter()
            .map(|j| {
                j.draining.len()
                    + j.children.iter().filter(|c| c.chunk.is_some()).count()
                    + usize::from(matches!(j.held, Some(Held::Chunk { .. })))
            })
            .sum();
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
        let mut pause = POLL;
        let mut stop_by: Option<Instant> = None;
        loop {
            if st.stop {
                let by = *stop_by.get_or_insert_with(|| Instant::now() + STOP_DRAIN);
                for job in &mut st.jobs {
                    job.fail(Failure::Core(CoreFailure::AgentClosed));
                }
                if st.jobs.is_empty() || Instant::now() >= by {
                    for job in st.jobs.drain(..) {
                        log::warn!(
                            "a staged transfer to {} did not drain within {STOP_DRAIN:?} of the agent closing",
                            job.parent.peer
                        );
                        job.finish(Instant::now());
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
                // A bug: keep the thread (and every other job's deadline) alive; the jobs of
                // this step fail and drain.
                log::error!("the staging driver panicked in a step (a bug); its jobs fail");
                for job in &mut st.jobs {
                    job.fail(staging_failure(&Error::invalid(
                        "the staging driver failed",
                        "this is a bug in gdr-xfer's staging driver",
                    )));
                }
            }
            pause = if activity(&st) == before {
                (pause * 2).min(POLL_IDLE)
            } else {
                POLL
            };
            drop(st);
            std::thread::sleep(pause);
            st = self.lock();
        }
    }
}

/// A fingerprint of the driver's work: it changes whenever a step moved anything (an event,
/// a child, a chunk, a ticket, a run, a job).
fn activity(st: &State) -> (usize, u64, u64, u64) {
    let mut parts = 0u64;
    for j in &st.jobs {
        let n = |x: usize| x as u64;
        parts = parts
            .wrapping_add(n(j.children.len()))
            .wrapping_add(n(j.draining.len()).wrapping_shl(12))
            .wrapping_add(n(j.tickets.len()).wrapping_shl(24))
            .wrapping_add(n(j.next_run).wrapping_shl(36))
            .wrapping_add(u64::from(j.cancelled).wrapping_shl(61))
            .wrapping_add(u64::from(j.held.is_some()).wrapping_shl(62));
    }
    (
        st.jobs.len(),
        st.counters.chunks,
        st.counters.transfers,
        parts,
    )
}

/// One round: the stagers' events to their jobs, then each job's children, chunks, runs,
/// deadline and end.
fn step(st: &mut State, window: usize, now: Instant) {
    let State {
        bounces,
        jobs,
        events,
        counters,
        ..
    } = st;
    for (b, bounce) in bounces.iter_mut().enumerate() {
        bounce.stage.poll(events);
        for ev in events.drain(..) {
            let ticket = match &ev {
                StagingEvent::Ready(c) | StagingEvent::Fill(c) => c.ticket(),
                StagingEvent::Finished { ticket, .. } => *ticket,
            };
            let job = jobs.iter_mut().find(|j| {
                j.tickets
                    .iter()
                    .any(|t| t.bounce == b && t.ticket == ticket)
            });
            match (ev, job) {
                (StagingEvent::Ready(c) | StagingEvent::Fill(c), Some(j)) => {
                    j.on_chunk(b, c, &bounce.segments)
                }
                (StagingEvent::Finished { ticket, outcome }, Some(j)) => {
                    j.on_finished(b, ticket, outcome)
                }
                // A ticket no job has: cannot happen; give its chunk back.
                (StagingEvent::Ready(c) | StagingEvent::Fill(c), None) => {
                    let _ = bounce.stage.release(c);
                }
                (StagingEvent::Finished { .. }, None) => {}
            }
        }
    }
    for job in jobs.iter_mut() {
        job.reap_children();
        if job.failure.is_none() && job.cancelled {
            job.fail(Failure::Core(CoreFailure::Cancelled));
        }
        if job.failure.is_none() && job.parent.deadline.is_some_and(|d| now >= d) {
            job.fail(Failure::Core(CoreFailure::Timeout {
                after: job.parent.timeout,
            }));
        }
        if job.failure.is_some() {
            job.cancel_tickets(bounces);
        }
    }
    let segments: Vec<&[Arc<SegmentInner>]> =
        bounces.iter().map(|b| b.segments.as_slice()).collect();
    for job in jobs.iter_mut() {
        job.post_held(&segments);
    }
    drop(segments);
    for job in jobs.iter_mut() {
        job.drain(bounces, counters);
        job.start_runs(bounces, window);
    }
    jobs.retain(|job| {
        if !job.is_over() {
            return true;
        }
        job.finish(now);
        false
    });
}
