//! The bounce-slot machine: which bounce buffer is free, copying, or lent to the caller; which
//! ticket each belongs to; when a ticket is over. The copies themselves are a [`CopyEngine`]'s
//! (CUDA or `memcpy` in gdr-xfer, timed events in the simulation).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::chunk::{Chunk, Direction, Outcome, StagingEvent, Ticket};
use super::cut::{self, CopyModel};
use super::plan::ChunkPlan;
use super::{PipelineConfig, PipelineError};

/// Copies between device memory and the bounce buffers, issued without waiting. What the
/// pipeline needs of its driver's copy engine; reading and writing the bounce bytes themselves
/// is the driver's (after [`Pipeline::check_chunk`]).
pub trait CopyEngine {
    /// A handle on device memory (kept by the pipeline while a ticket uses it).
    type Device;
    /// One copy in flight (keeps what it uses alive until complete).
    type Copy;
    /// How a copy failed (kept, unchanged, in the ticket's [`Outcome::Failed`]).
    type Error;

    /// The device memory's length.
    fn device_len(dev: &Self::Device) -> usize;
    /// Issues a copy of `len` bytes from `dev` at `dev_offset` to the bounce buffers at
    /// `bounce_offset`.
    ///
    /// # Errors
    /// The copy could not be issued (nothing is in flight).
    fn to_bounce(
        &mut self,
        dev: &Self::Device,
        dev_offset: usize,
        bounce_offset: usize,
        len: usize,
    ) -> Result<Self::Copy, Self::Error>;
    /// Issues a copy of `len` bytes from the bounce buffers at `bounce_offset` to `dev` at
    /// `dev_offset`.
    ///
    /// # Errors
    /// The copy could not be issued (nothing is in flight).
    fn to_device(
        &mut self,
        bounce_offset: usize,
        dev: &Self::Device,
        dev_offset: usize,
        len: usize,
    ) -> Result<Self::Copy, Self::Error>;
    /// Whether the copy completed (never waits). Copies complete in issue order.
    ///
    /// # Errors
    /// The copy failed, or whether it completed cannot be known: its slot is never reused.
    fn is_complete(&mut self, copy: &mut Self::Copy) -> Result<bool, Self::Error>;
    /// Waits for the copy.
    ///
    /// # Errors
    /// As [`is_complete`](Self::is_complete).
    fn wait(&mut self, copy: &mut Self::Copy) -> Result<(), Self::Error>;
}

/// What one bounce buffer is doing.
#[derive(Debug)]
enum SlotState<C> {
    /// Unused.
    Free,
    /// A device-to-bounce copy is in flight into it.
    ToBounce(C),
    /// Lent to the caller (a [`StagingEvent::Ready`] or [`StagingEvent::Fill`] chunk).
    Lent,
    /// A bounce-to-device copy is in flight from it.
    ToDevice(C),
    /// A copy on it failed without being known complete: never reused (the copy is kept, and
    /// its buffers leak if it can never be waited for).
    Broken(C),
}

#[derive(Debug)]
struct Slot<C> {
    state: SlotState<C>,
    /// Bumped each time the slot is lent, so a chunk names one lending.
    seq: u64,
    ticket: Ticket,
    direction: Direction,
    device_offset: usize,
    len: usize,
}

impl<C> Slot<C> {
    /// Lends the slot (slot `index` of stager `stager`) for its ticket's chunk: a new lending,
    /// so a chunk of an earlier one no longer names it.
    fn lend(&mut self, stager: u64, index: usize, chunk_size: usize) -> Chunk {
        self.state = SlotState::Lent;
        self.seq += 1;
        Chunk {
            stager,
            slot: index,
            seq: self.seq,
            ticket: self.ticket,
            direction: self.direction,
            device_offset: self.device_offset,
            bounce_offset: index * chunk_size,
            len: self.len,
        }
    }
}

#[derive(Debug)]
struct Job<D, X> {
    ticket: Ticket,
    direction: Direction,
    dev: D,
    plan: ChunkPlan,
    /// Copies in flight for it.
    in_flight: usize,
    /// Chunks lent to the caller.
    lent: usize,
    bytes_done: u64,
    chunks_done: u64,
    cancelled: bool,
    error: Option<X>,
}

impl<D, X> Job<D, X> {
    fn stopped(&self) -> bool {
        self.cancelled || self.error.is_some()
    }
    fn fail(&mut self, e: X) {
        if self.error.is_none() {
            self.error = Some(e);
        }
        self.plan.stop();
    }
    fn is_over(&self) -> bool {
        (self.plan.is_done() || self.stopped()) && self.in_flight == 0 && self.lent == 0
    }
}

/// Numbers stagers apart, so a chunk given to the wrong one is refused.
static NEXT_STAGER: AtomicU64 = AtomicU64::new(1);

/// The pipeline: bounce buffers, tickets, copies in flight.
///
/// # The promise its driver relies on
///
/// While [`check_chunk`](Self::check_chunk) accepts a chunk, no copy is in flight on the
/// chunk's bounce bytes, and none starts on them before the chunk is given back
/// ([`release`](Self::release) or [`commit`](Self::commit), which take the chunk by value and
/// `&mut self`). A driver may therefore read and write those bytes while it holds a shared
/// borrow of the pipeline.
pub struct Pipeline<E: CopyEngine> {
    id: u64,
    engine: E,
    config: PipelineConfig,
    slots: Vec<Slot<E::Copy>>,
    jobs: Vec<Job<E::Device, E::Error>>,
    /// Slots with a copy in flight, in issue order (copies complete in that order).
    in_flight: VecDeque<usize>,
    next_ticket: u64,
    /// The least-time cuts of the last few (direction, length) pairs (`None`: none made).
    cuts: Vec<KeptCut>,
}

/// A least-time cut kept for a direction and a length (`None`: none could be made).
type KeptCut = ((Direction, usize), Option<Arc<[usize]>>);

/// How many cuts a pipeline keeps.
pub const CUTS_KEPT: usize = 8;

impl<E: CopyEngine> Pipeline<E> {
    /// A pipeline over `config.chunks` bounce buffers of `config.chunk_size` bytes in `engine`'s
    /// bounce allocation (which must hold `chunks * chunk_size` bytes; slot `i` starts at
    /// `i * chunk_size`).
    ///
    /// # Errors
    /// [`PipelineError::Config`] for a configuration [`PipelineConfig::check`] refuses.
    pub fn new(engine: E, config: PipelineConfig) -> Result<Self, PipelineError> {
        config.check()?;
        let slots = (0..config.chunks)
            .map(|_| Slot {
                state: SlotState::Free,
                seq: 0,
                ticket: Ticket(0),
                direction: Direction::DeviceToHost,
                device_offset: 0,
                len: 0,
            })
            .collect();
        Ok(Pipeline {
            id: NEXT_STAGER.fetch_add(1, Ordering::Relaxed),
            engine,
            config,
            slots,
            jobs: Vec::new(),
            in_flight: VecDeque::new(),
            next_ticket: 1,
            cuts: Vec::new(),
        })
    }

    /// Its configuration.
    pub fn config(&self) -> PipelineConfig {
        self.config
    }

    /// Its copy engine.
    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// Its copy engine, to change (copies the pipeline does not know of must not touch the
    /// bounce buffers).
    pub fn engine_mut(&mut self) -> &mut E {
        &mut self.engine
    }

    /// How many least-time cuts it keeps now (at most [`CUTS_KEPT`]).
    pub fn cuts_kept(&self) -> usize {
        self.cuts.len()
    }

    /// Whether nothing is going on: no ticket active, no copy in flight, no chunk lent (a
    /// broken buffer stays broken, and does not count).
    pub fn is_idle(&self) -> bool {
        self.jobs.is_empty()
            && self
                .slots
                .iter()
                .all(|s| matches!(s.state, SlotState::Free | SlotState::Broken(_)))
    }

    /// Tickets started and not yet reported finished.
    pub fn active_tickets(&self) -> usize {
        self.jobs.len()
    }

    /// Copies in flight.
    pub fn copies_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Bounce buffers that can never be used again (a copy on them failed).
    pub fn broken_slots(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s.state, SlotState::Broken(_)))
            .count()
    }

    /// Starts moving `range` of `dev` in `direction`.
    pub fn start(
        &mut self,
        direction: Direction,
        dev: E::Device,
        range: Range<usize>,
    ) -> Result<Ticket, PipelineError> {
        let dev_len = E::device_len(&dev);
        if range.start > range.end || range.end > dev_len {
            return Err(PipelineError::OutsideDevice {
                direction,
                start: range.start,
                end: range.end,
                device_len: dev_len,
            });
        }
        if self.jobs.len() >= self.config.max_tickets {
            return Err(PipelineError::TooManyTickets {
                active: self.jobs.len(),
            });
        }
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        let plan = self.plan_for(direction, range);
        self.jobs.push(Job {
            ticket,
            direction,
            dev,
            plan,
            in_flight: 0,
            lent: 0,
            bytes_done: 0,
            chunks_done: 0,
            cancelled: false,
            error: None,
        });
        Ok(ticket)
    }

    /// How `range` is cut: for least time when the NIC's rate is known (cuts kept for the last
    /// few lengths, as KV-cache transfers repeat theirs), else as `min_piece` and `first_piece`
    /// say.
    fn plan_for(&mut self, direction: Direction, range: Range<usize>) -> ChunkPlan {
        let len = range.len();
        let size = self.config.chunk_size;
        if self.config.nic_rate > 0 {
            let key = (direction, len);
            let listed = match self.cuts.iter().position(|(k, _)| *k == key) {
                Some(i) => self.cuts[i].1.clone(),
                None => {
                    let pieces = cut::least_time(
                        len,
                        direction,
                        self.config.nic_rate,
                        CopyModel::of(direction),
                        super::CUT_FLOOR,
                        size,
                    )
                    .map(Arc::from);
                    if self.cuts.len() >= CUTS_KEPT {
                        self.cuts.remove(0);
                    }
                    self.cuts.push((key, pieces.clone()));
                    pieces
                }
            };
            if let Some(pieces) = listed {
                return ChunkPlan::listed(range, size, pieces);
            }
        }
        ChunkPlan::ramped(range, self.config.piece_size(len), self.config.first_piece)
    }

    fn job_mut(&mut self, ticket: Ticket) -> Option<&mut Job<E::Device, E::Error>> {
        self.jobs.iter_mut().find(|j| j.ticket == ticket)
    }

    /// Stops issuing chunks of `ticket`. Copies in flight finish; lent chunks must still be given
    /// back; then the ticket is reported [`Outcome::Cancelled`].
    ///
    /// # Errors
    /// [`PipelineError::UnknownTicket`]: no such ticket is active.
    pub fn cancel(&mut self, ticket: Ticket) -> Result<(), PipelineError> {
        let Some(job) = self.job_mut(ticket) else {
            return Err(PipelineError::UnknownTicket { ticket });
        };
        job.cancelled = true;
        job.plan.stop();
        Ok(())
    }

    /// Reaps completed copies, issues copies (or lends fill chunks) into free bounce buffers,
    /// and reports ready chunks and finished tickets into `out`. Never waits.
    pub fn poll(&mut self, out: &mut Vec<StagingEvent<E::Error>>) {
        self.reap(out);
        self.schedule(out);
        self.finish(out);
    }

    /// Takes completed copies off the front of the in-flight queue.
    fn reap(&mut self, out: &mut Vec<StagingEvent<E::Error>>) {
        while let Some(&i) = self.in_flight.front() {
            let done = match &mut self.slots[i].state {
                SlotState::ToBounce(c) | SlotState::ToDevice(c) => self.engine.is_complete(c),
                // Only slots with a copy are queued.
                _ => Ok(true),
            };
            match done {
                Ok(false) => break,
                Ok(true) => {
                    self.in_flight.pop_front();
                    self.complete(i, out);
                }
                Err(e) => {
                    self.in_flight.pop_front();
                    self.break_slot(i, e);
                }
            }
        }
    }

    /// Waits for the oldest copy in flight (for blocking copies), then reaps.
    pub fn wait_oldest(&mut self, out: &mut Vec<StagingEvent<E::Error>>) {
        if let Some(&i) = self.in_flight.front() {
            let r = match &mut self.slots[i].state {
                SlotState::ToBounce(c) | SlotState::ToDevice(c) => self.engine.wait(c),
                _ => Ok(()),
            };
            if let Err(e) = r {
                self.in_flight.pop_front();
                self.break_slot(i, e);
            }
        }
        self.poll(out);
    }

    /// Slot `i`'s copy completed.
    fn complete(&mut self, i: usize, out: &mut Vec<StagingEvent<E::Error>>) {
        let slot = &mut self.slots[i];
        let was = std::mem::replace(&mut slot.state, SlotState::Free);
        let ticket = slot.ticket;
        let len = slot.len;
        let Some(job) = self.jobs.iter_mut().find(|j| j.ticket == ticket) else {
            return;
        };
        job.in_flight -= 1;
        match was {
            SlotState::ToBounce(copy) => {
                drop(copy);
                if job.stopped() {
                    return; // nobody wants these bytes any more: the slot is free again
                }
                job.lent += 1;
                out.push(StagingEvent::Ready(slot.lend(
                    self.id,
                    i,
                    self.config.chunk_size,
                )));
            }
            SlotState::ToDevice(copy) => {
                drop(copy);
                job.bytes_done += len as u64;
                job.chunks_done += 1;
            }
            _ => {}
        }
    }

    /// Slot `i`'s copy failed: its ticket fails, the slot is never reused.
    fn break_slot(&mut self, i: usize, e: E::Error) {
        let slot = &mut self.slots[i];
        let was = std::mem::replace(&mut slot.state, SlotState::Free);
        if let SlotState::ToBounce(c) | SlotState::ToDevice(c) = was {
            slot.state = SlotState::Broken(c);
        }
        let ticket = slot.ticket;
        if let Some(job) = self.job_mut(ticket) {
            job.in_flight -= 1;
            job.fail(e);
        }
    }

    /// Fills free bounce buffers with the next chunks of the oldest tickets.
    fn schedule(&mut self, out: &mut Vec<StagingEvent<E::Error>>) {
        for i in 0..self.slots.len() {
            if !matches!(self.slots[i].state, SlotState::Free) {
                continue;
            }
            let Some(j) = self.jobs.iter().position(|j| !j.plan.is_done()) else {
                return;
            };
            let job = &mut self.jobs[j];
            let Some(range) = job.plan.next() else {
                continue;
            };
            let bounce_offset = i * self.config.chunk_size;
            let slot = &mut self.slots[i];
            slot.ticket = job.ticket;
            slot.direction = job.direction;
            slot.device_offset = range.start;
            slot.len = range.len();
            match job.direction {
                Direction::DeviceToHost => {
                    match self
                        .engine
                        .to_bounce(&job.dev, range.start, bounce_offset, range.len())
                    {
                        Ok(copy) => {
                            slot.state = SlotState::ToBounce(copy);
                            job.in_flight += 1;
                            self.in_flight.push_back(i);
                        }
                        Err(e) => job.fail(e),
                    }
                }
                Direction::HostToDevice => {
                    job.lent += 1;
                    out.push(StagingEvent::Fill(slot.lend(
                        self.id,
                        i,
                        self.config.chunk_size,
                    )));
                }
            }
        }
    }

    /// Reports (and forgets) tickets that are over.
    fn finish(&mut self, out: &mut Vec<StagingEvent<E::Error>>) {
        let mut k = 0;
        while k < self.jobs.len() {
            if !self.jobs[k].is_over() {
                k += 1;
                continue;
            }
            let job = self.jobs.remove(k);
            let outcome = match (job.error, job.cancelled) {
                (Some(e), _) => Outcome::Failed(e),
                (None, true) => Outcome::Cancelled {
                    bytes_done: job.bytes_done,
                },
                (None, false) => Outcome::Completed {
                    bytes: job.bytes_done,
                    chunks: job.chunks_done,
                },
            };
            out.push(StagingEvent::Finished {
                ticket: job.ticket,
                outcome,
            });
        }
    }

    /// Checks that `chunk` is lent by this pipeline right now (`call` names the caller's call in
    /// the error).
    ///
    /// # Errors
    /// [`PipelineError::NotLent`]: another pipeline's chunk, or one given back already.
    pub fn check_chunk(&self, chunk: &Chunk, call: &'static str) -> Result<(), PipelineError> {
        let ok = chunk.stager == self.id
            && self.slots.get(chunk.slot).is_some_and(|s| {
                matches!(s.state, SlotState::Lent)
                    && s.seq == chunk.seq
                    && s.ticket == chunk.ticket
                    && s.len == chunk.len
                    && s.device_offset == chunk.device_offset
            });
        if ok {
            Ok(())
        } else {
            Err(PipelineError::NotLent {
                call,
                ticket: chunk.ticket,
                slot: chunk.slot,
            })
        }
    }

    /// The caller is done with `chunk`: a sent device-to-host chunk, or an unfilled
    /// host-to-device chunk (which cancels its ticket).
    ///
    /// # Errors
    /// [`PipelineError::NotLent`]: nothing changed.
    pub fn release(&mut self, chunk: Chunk) -> Result<(), PipelineError> {
        self.check_chunk(&chunk, "Stager::release")?;
        let slot = &mut self.slots[chunk.slot];
        slot.state = SlotState::Free;
        if let Some(job) = self.jobs.iter_mut().find(|j| j.ticket == chunk.ticket) {
            job.lent -= 1;
            match chunk.direction {
                Direction::DeviceToHost => {
                    job.bytes_done += chunk.len as u64;
                    job.chunks_done += 1;
                }
                Direction::HostToDevice => {
                    job.cancelled = true;
                    job.plan.stop();
                }
            }
        }
        Ok(())
    }

    /// The caller filled host-to-device `chunk`: copy it to the device.
    ///
    /// # Errors
    /// [`PipelineError::NotLent`] (nothing changed); [`PipelineError::CommitDeviceToHost`] (the
    /// chunk was released instead); [`PipelineError::CopyNotIssued`] (the ticket failed with the
    /// copy engine's error, which its `Finished` event carries).
    pub fn commit(&mut self, chunk: Chunk) -> Result<(), PipelineError> {
        self.check_chunk(&chunk, "Stager::commit")?;
        if chunk.direction != Direction::HostToDevice {
            let ticket = chunk.ticket;
            // Given back as released, so the bounce buffer is not lost with the chunk.
            self.release(chunk)?;
            return Err(PipelineError::CommitDeviceToHost { ticket });
        }
        let i = chunk.slot;
        let Some(job) = self.jobs.iter_mut().find(|j| j.ticket == chunk.ticket) else {
            self.slots[i].state = SlotState::Free;
            return Ok(());
        };
        job.lent -= 1;
        if job.stopped() {
            self.slots[i].state = SlotState::Free;
            return Ok(());
        }
        match self.engine.to_device(
            chunk.bounce_offset,
            &job.dev,
            chunk.device_offset,
            chunk.len,
        ) {
            Ok(copy) => {
                self.slots[i].state = SlotState::ToDevice(copy);
                job.in_flight += 1;
                self.in_flight.push_back(i);
                Ok(())
            }
            Err(e) => {
                self.slots[i].state = SlotState::Free;
                job.fail(e);
                Err(PipelineError::CopyNotIssued {
                    ticket: chunk.ticket,
                })
            }
        }
    }
}

/// Checks that `len` bytes at `at` lie within `chunk` (for a driver's reads and writes of its
/// bytes).
///
/// # Errors
/// [`PipelineError::OutsideChunk`].
pub fn check_within(
    call: &'static str,
    chunk: &Chunk,
    at: usize,
    len: usize,
) -> Result<(), PipelineError> {
    match at.checked_add(len) {
        Some(end) if end <= chunk.len => Ok(()),
        _ => Err(PipelineError::OutsideChunk {
            call,
            at,
            len,
            chunk_len: chunk.len,
        }),
    }
}
