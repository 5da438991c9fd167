//! Staged transfers: GPU memory the NIC cannot reach moves through bounce buffers, chunk by
//! chunk. A [`StagedJob`] is one such transfer's state machine: which of its runs have a
//! stager ticket, which chunk each child transfer carries, which chunks wait for their buffer
//! to be quiet, the last piece held back with the notification, and its outcome. Its I/O (the
//! stagers, the child transfers on the connection, the buffers' quiet test) is the driver's
//! [`StageIo`].
//!
//! - WRITE: a copy fills a buffer from the GPU ([`StagedJob::on_chunk`] lends it), a child
//!   writes it to the peer, and the buffer goes back once the child ended and nothing uses it.
//! - READ: a child reads the peer's bytes into a lent buffer, which is committed (copied to the
//!   GPU) once the child completed and the buffer is quiet.
//! - The notification goes with the last piece, posted only after every other child completed.
//! - A failure, the deadline or a cancel stops the job: no new ticket, no new child; tickets and
//!   children are cancelled; the outcome comes when the job is over: no ticket (so no copy of
//!   the GPU memory), no child (so no request), no chunk out (so no buffer in use).

use std::time::{Duration, Instant};

use crate::fault::DriverError;
use crate::io::Op;
use crate::transfer::Failure;

/// Why a ticket could not start (`E`: the driver's error, [`StageIo::Error`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start<E> {
    /// The stager has no ticket free now: try again at the next step (the deadline bounds it).
    Busy,
    /// It failed.
    Failed(E),
}

/// What a child transfer did, for the parent's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChildStats {
    /// Requests it took.
    pub slices: u64,
    /// Lanes it used (how many).
    pub lanes: u32,
    /// Rails it used (how many).
    pub rails: u32,
    /// Requests posted again.
    pub retried: u64,
}

/// A staged job's I/O: its stagers and its child transfers.
///
/// A stager must issue its tickets' chunks first started, first served (a later ticket gets a
/// buffer only once every earlier one issued all its chunks), though copies may complete in
/// any order. The job holds its last chunk (with the notification) until every other byte
/// completed, so that order is what keeps a job from holding a buffer that one of its own
/// earlier chunks waits for. gdr-xfer's pipeline serves tickets so; so does the simulation's.
pub trait StageIo {
    /// A bounce chunk a stager lent (given back exactly once).
    type Chunk;
    /// A child transfer's handle.
    type Child: Copy + PartialEq;
    /// What the stager's calls fail with (kept as the driver made it, [`DriverError`], in the
    /// job's [`Failure::StagingFailed`]).
    type Error: std::error::Error + Send + Sync + 'static;

    /// The ticket a chunk belongs to.
    fn ticket_of(&self, chunk: &Self::Chunk) -> u64;
    /// Where a chunk lies in its run: (offset from the run's start, length).
    fn place(&self, chunk: &Self::Chunk, run: usize) -> (u64, u64);
    /// A chunk's length.
    fn len_of(&self, chunk: &Self::Chunk) -> u64;
    /// Starts moving staged run `run` through bounce buffers; the ticket's number (unique in
    /// the driver).
    ///
    /// # Errors
    /// [`Start::Busy`] to try again later; [`Start::Failed`] fails the job.
    fn start(&mut self, run: usize) -> Result<u64, Start<Self::Error>>;
    /// Stops a ticket (its chunks still come back; its end is still reported).
    fn cancel_ticket(&mut self, ticket: u64);
    /// Posts a child transfer of `len` bytes at `offset` of run `run`, from or into `chunk` (a
    /// run of directly registered memory when `None`), with `notify`, within `timeout`.
    ///
    /// # Errors
    /// The child's refusal (it then did nothing).
    fn post(
        &mut self,
        chunk: Option<&Self::Chunk>,
        run: usize,
        offset: u64,
        len: u64,
        timeout: Duration,
        notify: Option<&[u8]>,
    ) -> Result<Self::Child, Failure>;
    /// Stops a child transfer (its outcome still comes, once its memory is quiet).
    fn cancel_child(&mut self, child: Self::Child);
    /// Whether nothing uses the chunk's buffer any more but its stager and the engine's
    /// long-lived holders (every request that used it retired, every copy complete).
    fn is_quiet(&self, chunk: &Self::Chunk) -> bool;
    /// Gives a chunk back: `commit` copies it to the GPU (a READ's bytes), else it is released.
    ///
    /// # Errors
    /// The stager's refusal (the job fails).
    fn give_back(&mut self, chunk: Self::Chunk, commit: bool) -> Result<(), Self::Error>;
}

/// One run of a staged job: whether it is staged (else its memory is registered directly),
/// and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedRun {
    /// Whether it goes through bounce buffers.
    pub staged: bool,
    /// Bytes.
    pub len: u64,
}

/// A chunk lent to the job, waiting for its buffer to be quiet.
struct Lent<C> {
    chunk: C,
    /// Copy it to the GPU (a READ child completed), rather than release it.
    commit: bool,
    /// Whether it was found not quiet at least once.
    waited: bool,
    /// Whether its child completed (its bytes went through).
    moved: bool,
}

struct Child<C, K> {
    child: K,
    chunk: Option<C>,
    run: usize,
    len: u64,
}

/// The last piece, posted with the notification once every other child completed.
enum Held<C> {
    Chunk { chunk: C, run: usize, offset: u64 },
    Direct(usize),
}

/// What a staged job moved and waited for (for the driver's counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StagedStats {
    /// Chunks whose bytes went through, and their bytes.
    pub chunks: u64,
    /// Bytes of those chunks.
    pub bytes: u64,
    /// Chunks whose buffer had to wait for the NIC after their child ended.
    pub waited_for_nic: u64,
    /// Requests, lanes and rails of the children (largest counts), requests posted again.
    pub child: ChildStats,
}

/// A staged transfer's state machine (see the [module documentation](self)): `C` is the
/// driver's chunk, `K` its child handle ([`StageIo::Chunk`], [`StageIo::Child`]).
pub struct StagedJob<C, K> {
    op: Op,
    runs: Vec<StagedRun>,
    notify: Option<Vec<u8>>,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    next_run: usize,
    tickets: Vec<(u64, usize)>,
    children: Vec<Child<C, K>>,
    /// Per run, the bytes whose children completed.
    done: Vec<u64>,
    held: Option<Held<C>>,
    draining: Vec<Lent<C>>,
    failure: Option<Failure>,
    /// Whether the failure's cancels went out.
    stopped: bool,
    cancel: bool,
    posted_at: Option<Instant>,
    stats: StagedStats,
}

impl<C, K> std::fmt::Debug for StagedJob<C, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedJob")
            .field("runs", &self.runs)
            .field("next_run", &self.next_run)
            .field("tickets", &self.tickets)
            .field("children", &self.children.len())
            .field("done", &self.done)
            .field(
                "held",
                &self.held.as_ref().map(|h| match h {
                    Held::Chunk { run, offset, .. } => format!("chunk of run {run} at {offset}"),
                    Held::Direct(run) => format!("run {run}"),
                }),
            )
            .field("draining", &self.draining.len())
            .field("failure", &self.failure)
            .finish()
    }
}

impl<C, K: Copy + PartialEq> StagedJob<C, K> {
    /// A job of `runs` in direction `op`, started `now`, with a deadline `timeout` later.
    pub fn new(
        op: Op,
        runs: Vec<StagedRun>,
        notify: Option<Vec<u8>>,
        timeout: Option<Duration>,
        now: Instant,
    ) -> StagedJob<C, K> {
        let n = runs.len();
        StagedJob {
            op,
            runs,
            notify,
            timeout,
            deadline: timeout.and_then(|t| now.checked_add(t)),
            next_run: 0,
            tickets: Vec::new(),
            children: Vec::new(),
            done: vec![0; n],
            held: None,
            draining: Vec::new(),
            failure: None,
            stopped: false,
            cancel: false,
            posted_at: None,
            stats: StagedStats::default(),
        }
    }

    /// Whether ticket `ticket` is this job's.
    pub fn owns_ticket(&self, ticket: u64) -> bool {
        self.tickets.iter().any(|&(t, _)| t == ticket)
    }

    /// Whether child `child` is this job's.
    pub fn owns_child(&self, child: K) -> bool {
        self.children.iter().any(|c| c.child == child)
    }

    /// What it moved so far.
    pub fn stats(&self) -> StagedStats {
        self.stats
    }

    /// When its last piece was posted.
    pub fn posted_at(&self) -> Option<Instant> {
        self.posted_at
    }

    /// Chunks out now: (lent to children or held, waiting for their buffer, of those the ones
    /// found not quiet).
    pub fn chunks_out(&self) -> (usize, usize, usize) {
        let with_children = self.children.iter().filter(|c| c.chunk.is_some()).count()
            + usize::from(matches!(self.held, Some(Held::Chunk { .. })));
        let waiting = self.draining.iter().filter(|l| l.waited).count();
        (with_children, self.draining.len(), waiting)
    }

    /// Asks it to stop (at its next step), as cancelled.
    pub fn cancel(&mut self) {
        self.cancel = true;
    }

    /// Stops it with `failure` (at its next step), unless it failed already.
    pub fn abort(&mut self, failure: Failure) {
        self.fail(failure);
    }

    /// Records the first failure; the job stops at its next step.
    fn fail(&mut self, f: Failure) {
        if self.failure.is_none() {
            self.failure = Some(f);
        }
    }

    fn give_back(&mut self, chunk: C, commit: bool, moved: bool) {
        self.draining.push(Lent {
            chunk,
            commit,
            waited: false,
            moved,
        });
    }

    fn is_last_piece(&self, run: usize, offset: u64, len: u64) -> bool {
        run + 1 == self.runs.len() && offset + len == self.runs[run].len
    }

    fn left(&self, now: Instant) -> Option<Duration> {
        match (self.deadline, self.timeout) {
            (Some(d), _) => {
                let left = d.saturating_duration_since(now);
                (!left.is_zero()).then_some(left)
            }
            (None, _) => Some(Duration::MAX),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn post<S: StageIo<Chunk = C, Child = K>>(
        &mut self,
        io: &mut S,
        now: Instant,
        chunk: Option<C>,
        run: usize,
        offset: u64,
        len: u64,
        notify: bool,
    ) {
        let Some(left) = self.left(now) else {
            if let Some(c) = chunk {
                self.give_back(c, false, false);
            }
            self.fail(Failure::Timeout {
                after: self.timeout.unwrap_or_default(),
            });
            return;
        };
        let note = if notify { self.notify.as_deref() } else { None };
        match io.post(chunk.as_ref(), run, offset, len, left, note) {
            Ok(child) => self.children.push(Child {
                child,
                chunk,
                run,
                len,
            }),
            Err(f) => {
                if let Some(c) = chunk {
                    self.give_back(c, false, false);
                }
                self.fail(f);
            }
        }
    }

    /// A chunk a stager lent for one of this job's tickets (its bytes ready to send, or free
    /// to fill).
    pub fn on_chunk<S: StageIo<Chunk = C, Child = K>>(
        &mut self,
        io: &mut S,
        now: Instant,
        chunk: C,
    ) {
        let ticket = io.ticket_of(&chunk);
        let Some(&(_, run)) = self.tickets.iter().find(|&&(t, _)| t == ticket) else {
            // Not ours any more: cannot happen (tickets are forgotten only when finished).
            self.give_back(chunk, false, false);
            return;
        };
        if self.failure.is_some() {
            // Never posted: the NIC never saw it.
            self.give_back(chunk, false, false);
            return;
        }
        let (offset, len) = io.place(&chunk, run);
        if self.notify.is_some() && self.is_last_piece(run, offset, len) {
            self.held = Some(Held::Chunk { chunk, run, offset });
            return;
        }
        self.post(io, now, Some(chunk), run, offset, len, false);
    }

    /// A ticket of this job ended (every copy of it complete, every chunk given back).
    pub fn on_ticket_finished(&mut self, ticket: u64, result: Result<(), DriverError>) {
        self.tickets.retain(|&(t, _)| t != ticket);
        if let Err(error) = result {
            self.fail(Failure::StagingFailed { error });
        }
    }

    /// A child of this job reached its outcome (its memory is quiet).
    pub fn on_child_finished(&mut self, child: K, result: Result<ChildStats, Failure>) {
        let Some(i) = self.children.iter().position(|c| c.child == child) else {
            return;
        };
        let c = self.children.swap_remove(i);
        let ok = result.is_ok();
        if ok {
            self.done[c.run] += c.len;
        }
        if let Ok(s) = &result {
            let t = &mut self.stats.child;
            t.slices += s.slices;
            t.lanes = t.lanes.max(s.lanes);
            t.rails = t.rails.max(s.rails);
            t.retried += s.retried;
        }
        if let Some(chunk) = c.chunk {
            self.give_back(chunk, ok && self.op == Op::Read, ok);
        }
        if let Err(f) = result {
            self.fail(f);
        }
    }

    /// One round: the deadline and a cancel, the stop's cancels, the held last piece, the
    /// chunks whose buffers are quiet, and new tickets for the next runs (at most `window` at
    /// once).
    pub fn step<S: StageIo<Chunk = C, Child = K>>(
        &mut self,
        io: &mut S,
        now: Instant,
        window: usize,
    ) {
        if self.failure.is_none() && self.cancel {
            self.fail(Failure::Cancelled);
        }
        if self.failure.is_none() && self.deadline.is_some_and(|d| now >= d) {
            self.fail(Failure::Timeout {
                after: self.timeout.unwrap_or_default(),
            });
        }
        if self.failure.is_some() && !self.stopped {
            self.stopped = true;
            for &(t, _) in &self.tickets {
                io.cancel_ticket(t);
            }
            for c in &self.children {
                io.cancel_child(c.child);
            }
        }
        self.post_held(io, now);
        self.drain(io);
        self.start_runs(io, now, window);
    }

    /// Posts the held last piece, with the notification, once every other child completed.
    fn post_held<S: StageIo<Chunk = C, Child = K>>(&mut self, io: &mut S, now: Instant) {
        if self.failure.is_some() {
            if let Some(Held::Chunk { chunk, .. }) = self.held.take() {
                self.give_back(chunk, false, false);
            }
            self.held = None;
            return;
        }
        if self.next_run < self.runs.len() {
            return;
        }
        // Every other byte of the transfer completed: every other run whole, and the held
        // piece's run up to it. (Counted in bytes, not in tickets or children: chunks may be
        // lent in any order.)
        let (held_run, held_from) = match &self.held {
            None => return,
            Some(Held::Direct(run)) => (*run, 0),
            Some(Held::Chunk { run, offset, .. }) => (*run, *offset),
        };
        let others_done = self
            .runs
            .iter()
            .zip(&self.done)
            .enumerate()
            .all(|(r, (run, &done))| {
                if r == held_run {
                    done == held_from
                } else {
                    done == run.len
                }
            });
        if !others_done {
            return;
        }
        match self.held.take() {
            Some(Held::Chunk { chunk, run, offset }) => {
                let (_, len) = io.place(&chunk, run);
                self.post(io, now, Some(chunk), run, offset, len, true);
            }
            Some(Held::Direct(run)) => {
                let len = self.runs[run].len;
                self.post(io, now, None, run, 0, len, true);
            }
            None => return,
        }
        self.posted_at = Some(now);
    }

    /// Gives back every waiting chunk whose buffer is quiet.
    fn drain<S: StageIo<Chunk = C, Child = K>>(&mut self, io: &mut S) {
        let mut i = 0;
        while i < self.draining.len() {
            if !io.is_quiet(&self.draining[i].chunk) {
                self.draining[i].waited = true;
                i += 1;
                continue;
            }
            let l = self.draining.swap_remove(i);
            self.stats.waited_for_nic += u64::from(l.waited);
            if l.moved {
                self.stats.chunks += 1;
                self.stats.bytes += io.len_of(&l.chunk);
            }
            let commit = l.commit && self.failure.is_none();
            if let Err(e) = io.give_back(l.chunk, commit) {
                self.fail(Failure::StagingFailed {
                    error: DriverError::new(e),
                });
            }
        }
    }

    /// Starts tickets (or direct children) for the next runs.
    fn start_runs<S: StageIo<Chunk = C, Child = K>>(
        &mut self,
        io: &mut S,
        now: Instant,
        window: usize,
    ) {
        while self.failure.is_none()
            && self.next_run < self.runs.len()
            && self.tickets.len() < window
        {
            let i = self.next_run;
            let run = self.runs[i];
            if run.staged {
                match io.start(i) {
                    Ok(t) => self.tickets.push((t, i)),
                    Err(Start::Busy) => break,
                    Err(Start::Failed(e)) => {
                        self.fail(Failure::StagingFailed {
                            error: DriverError::new(e),
                        });
                        break;
                    }
                }
            } else if i + 1 == self.runs.len() && self.notify.is_some() {
                self.held = Some(Held::Direct(i));
            } else {
                self.post(io, now, None, i, 0, run.len, false);
            }
            self.next_run += 1;
        }
        if self.failure.is_none()
            && self.next_run >= self.runs.len()
            && self.held.is_none()
            && self.posted_at.is_none()
            && self.tickets.is_empty()
        {
            self.posted_at = Some(now);
        }
    }

    /// Whether nothing of the job is left anywhere: no ticket (no copy of the GPU memory), no
    /// child (no request), no chunk out (no buffer in use). Its outcome is then final.
    pub fn is_over(&self) -> bool {
        if cfg!(gdr_mutant = "staged_outcome_before_quiet") && self.failure.is_some() {
            // The bug the simulation must find: a failed staged transfer reports at once, its
            // copies and children still running.
            return true;
        }
        (self.failure.is_some() || self.next_run >= self.runs.len())
            && self.tickets.is_empty()
            && self.children.is_empty()
            && self.draining.is_empty()
            && self.held.is_none()
    }

    /// Its outcome (meaningful once it [is over](Self::is_over)).
    pub fn result(&self) -> Result<(), Failure> {
        match &self.failure {
            Some(f) => Err(f.clone()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::scripted::{job, Io, C};

    #[test]
    fn the_notification_waits_for_every_other_byte_whatever_the_order_chunks_come_in() {
        let t0 = Instant::now();
        let mut io = Io::default();
        let mut j = job(Op::Write, &[100, 200], true, t0);
        j.step(&mut io, t0, 4);
        // Run 1's last chunk is lent before run 1's first and before all of run 0.
        j.on_chunk(&mut io, t0, C(2, 100, 100, 0));
        assert!(io.posted.is_empty(), "the last piece is held");
        j.on_chunk(&mut io, t0, C(1, 0, 100, 1));
        j.on_chunk(&mut io, t0, C(2, 0, 100, 2));
        assert_eq!(io.posted.len(), 2);
        j.on_child_finished(1, Ok(ChildStats::default()));
        j.step(&mut io, t0, 4);
        assert_eq!(io.posted.len(), 2, "run 1's first half still in flight");
        j.on_child_finished(2, Ok(ChildStats::default()));
        j.step(&mut io, t0, 4);
        assert_eq!(
            io.posted.last(),
            Some(&(3, 1, 100, 100, true)),
            "now, with the notification"
        );
        j.on_child_finished(3, Ok(ChildStats::default()));
        j.on_ticket_finished(1, Ok(()));
        j.on_ticket_finished(2, Ok(()));
        j.step(&mut io, t0, 4);
        assert!(j.is_over());
        assert_eq!(j.result(), Ok(()));
        assert_eq!(j.stats().bytes, 300);
    }

    #[test]
    fn a_stopped_job_is_over_only_once_its_children_tickets_and_buffers_are() {
        let t0 = Instant::now();
        let mut io = Io::default();
        let mut j = job(Op::Read, &[300], false, t0);
        j.step(&mut io, t0, 4);
        j.on_chunk(&mut io, t0, C(1, 0, 100, 0));
        j.on_chunk(&mut io, t0, C(1, 100, 100, 1));
        // The deadline passes: children and the ticket are cancelled, nothing new is posted.
        let late = t0 + Duration::from_secs(2);
        j.step(&mut io, late, 4);
        assert_eq!(io.cancelled, vec![1, 2]);
        assert_eq!(io.cancelled_tickets, vec![1]);
        j.on_chunk(&mut io, late, C(1, 200, 100, 2));
        assert_eq!(
            io.posted.len(),
            2,
            "a chunk lent after the stop is given back, not posted"
        );
        assert!(!j.is_over());
        // One child completed anyway, one failed; the first's buffer is still in use.
        io.not_quiet.push(0);
        j.on_child_finished(1, Ok(ChildStats::default()));
        j.on_child_finished(2, Err(Failure::Cancelled));
        j.on_ticket_finished(1, Ok(()));
        j.step(&mut io, late, 4);
        assert!(!j.is_over(), "buffer 0 is not quiet");
        io.not_quiet.clear();
        j.step(&mut io, late, 4);
        assert!(j.is_over());
        assert!(matches!(j.result(), Err(Failure::Timeout { .. })));
        // Nothing is committed to the GPU after the stop.
        assert!(io.back.iter().all(|&(_, commit)| !commit), "{:?}", io.back);
    }

    #[test]
    fn a_busy_stager_delays_the_runs_and_the_deadline_still_stops_the_job() {
        let t0 = Instant::now();
        let mut io = Io {
            busy: true,
            ..Io::default()
        };
        let mut j = job(Op::Write, &[100], false, t0);
        j.step(&mut io, t0, 4);
        assert!(!j.is_over() && io.posted.is_empty());
        j.step(&mut io, t0 + Duration::from_secs(2), 4);
        assert!(j.is_over(), "nothing started: over at the deadline");
        assert!(matches!(j.result(), Err(Failure::Timeout { .. })));
    }
}

#[cfg(test)]
mod mutant_tests;
#[cfg(test)]
mod scripted;
