//! The staging pipeline's bookkeeping, independent of CUDA: which bounce buffer is free, copying,
//! or lent to the caller; which ticket each belongs to; when a ticket is over. The copies
//! themselves are a [`CopyEngine`]'s (CUDA in [`super::Stager`], a fake in the tests).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::chunk::{Chunk, Direction, Outcome, StagingEvent, Ticket};
use super::cut::{self, CopyModel};
use super::plan::ChunkPlan;
use super::StagingConfig;
use crate::error::{Error, Hint, Result};

/// Copies between device memory and the bounce allocation, issued without waiting.
pub(crate) trait CopyEngine {
    /// A handle on device memory (kept by the pipeline while a ticket uses it).
    type Device;
    /// One copy in flight (keeps what it uses alive until complete).
    type Copy;

    /// The device memory's length.
    fn device_len(dev: &Self::Device) -> usize;
    /// Issues a copy of `len` bytes from `dev` at `dev_offset` to the bounce allocation at
    /// `bounce_offset`.
    fn to_bounce(
        &mut self,
        dev: &Self::Device,
        dev_offset: usize,
        bounce_offset: usize,
        len: usize,
    ) -> Result<Self::Copy>;
    /// Issues a copy of `len` bytes from the bounce allocation at `bounce_offset` to `dev` at
    /// `dev_offset`.
    fn to_device(
        &mut self,
        bounce_offset: usize,
        dev: &Self::Device,
        dev_offset: usize,
        len: usize,
    ) -> Result<Self::Copy>;
    /// Whether the copy completed (never waits). Copies complete in issue order.
    fn is_complete(&mut self, copy: &mut Self::Copy) -> Result<bool>;
    /// Waits for the copy.
    fn wait(&mut self, copy: &mut Self::Copy) -> Result<()>;

    /// A direct view of bounce bytes, when the backing allows one (`None`: use
    /// [`read_bounce`](Self::read_bounce)).
    ///
    /// # Safety
    /// No copy may be in flight on `offset..offset + len` or start while the view lives, and no
    /// mutable view of those bytes may exist.
    unsafe fn bounce(&self, offset: usize, len: usize) -> Option<&[u8]>;
    /// A direct mutable view of bounce bytes, when the backing allows one.
    ///
    /// # Safety
    /// As [`bounce`](Self::bounce), and no other view of those bytes may exist.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bounce_mut(&self, offset: usize, len: usize) -> Option<&mut [u8]>;
    /// Copies bounce bytes out.
    ///
    /// # Safety
    /// No mutable view of those bytes may exist (concurrent copies are tolerated only by backings
    /// whose CPU access is atomic; callers exclude them anyway).
    unsafe fn read_bounce(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Copies bytes into the bounce allocation.
    ///
    /// # Safety
    /// No copy may be in flight on those bytes, and no other view of them may exist.
    unsafe fn write_bounce(&self, offset: usize, data: &[u8]) -> Result<()>;
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

#[derive(Debug)]
struct Job<D> {
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
    error: Option<Error>,
}

impl<D> Job<D> {
    fn stopped(&self) -> bool {
        self.cancelled || self.error.is_some()
    }
    fn fail(&mut self, e: Error) {
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
pub(crate) struct Pipeline<E: CopyEngine> {
    id: u64,
    pub(crate) engine: E,
    config: StagingConfig,
    slots: Vec<Slot<E::Copy>>,
    jobs: Vec<Job<E::Device>>,
    /// Slots with a copy in flight, in issue order (copies complete in that order).
    in_flight: VecDeque<usize>,
    next_ticket: u64,
    /// Reused scratch for backings without direct views.
    scratch: Vec<u8>,
    /// The least-time cuts of the last few (direction, length) pairs (`None`: none made).
    pub(crate) cuts: Vec<KeptCut>,
}

/// A least-time cut kept for a direction and a length (`None`: none could be made).
type KeptCut = ((Direction, usize), Option<Arc<[usize]>>);

/// How many cuts a pipeline keeps.
pub(crate) const CUTS_KEPT: usize = 8;

impl<E: CopyEngine> Pipeline<E> {
    /// A pipeline over `config.chunks` bounce buffers of `config.chunk_size` bytes in `engine`'s
    /// bounce allocation (which must hold `config.total()` bytes).
    pub(crate) fn new(engine: E, config: StagingConfig) -> Result<Self> {
        config.validate()?;
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
            scratch: Vec::new(),
            cuts: Vec::new(),
        })
    }

    pub(crate) fn config(&self) -> StagingConfig {
        self.config
    }

    /// Tickets started and not yet reported finished.
    pub(crate) fn active_tickets(&self) -> usize {
        self.jobs.len()
    }

    /// Copies in flight.
    pub(crate) fn copies_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Bounce buffers that can never be used again (a copy on them failed).
    pub(crate) fn broken_slots(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s.state, SlotState::Broken(_)))
            .count()
    }

    /// Starts moving `range` of `dev` in `direction`.
    pub(crate) fn start(
        &mut self,
        direction: Direction,
        dev: E::Device,
        range: Range<usize>,
    ) -> Result<Ticket> {
        let dev_len = E::device_len(&dev);
        if range.start > range.end || range.end > dev_len {
            return Err(Error::InvalidArgument {
                what: format!(
                    "staging {direction:?}: range {}..{} is not inside the device memory's {dev_len} bytes",
                    range.start, range.end
                ),
                hint: Hint::new("pass start <= end <= the buffer's len()"),
            });
        }
        if self.jobs.len() >= self.config.max_tickets {
            return Err(Error::InvalidArgument {
                what: format!(
                    "staging: {} tickets are active, the most this stager accepts (max_tickets)",
                    self.jobs.len()
                ),
                hint: Hint::new("poll until tickets finish, or raise StagingConfig::max_tickets"),
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
                        StagingConfig::CUT_FLOOR,
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

    fn job_mut(&mut self, ticket: Ticket) -> Option<&mut Job<E::Device>> {
        self.jobs.iter_mut().find(|j| j.ticket == ticket)
    }

    /// Stops issuing chunks of `ticket`. Copies in flight finish; lent chunks must still be given
    /// back; then the ticket is reported [`Outcome::Cancelled`].
    pub(crate) fn cancel(&mut self, ticket: Ticket) -> Result<()> {
        let Some(job) = self.job_mut(ticket) else {
            return Err(unknown_ticket(ticket));
        };
        job.cancelled = true;
        job.plan.stop();
        Ok(())
    }

    /// Reaps completed copies, issues copies (or lends fill chunks) into free bounce buffers,
    /// and reports ready chunks and finished tickets into `out`. Never waits.
    pub(crate) fn poll(&mut self, out: &mut Vec<StagingEvent>) {
        self.reap(out);
        self.schedule(out);
        self.finish(out);
    }

    /// Takes completed copies off the front of the in-flight queue.
    fn reap(&mut self, out: &mut Vec<StagingEvent>) {
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

    /// Waits for the oldest copy in flight (for the blocking copies), then reaps.
    pub(crate) fn wait_oldest(&mut self, out: &mut Vec<StagingEvent>) {
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
    fn complete(&mut self, i: usize, out: &mut Vec<StagingEvent>) {
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
                slot.state = SlotState::Lent;
                slot.seq += 1;
                job.lent += 1;
                out.push(StagingEvent::Ready(Chunk {
                    stager: self.id,
                    slot: i,
                    seq: slot.seq,
                    ticket,
                    direction: Direction::DeviceToHost,
                    device_offset: slot.device_offset,
                    bounce_offset: i * self.config.chunk_size,
                    len,
                }));
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
    fn break_slot(&mut self, i: usize, e: Error) {
        let slot = &mut self.slots[i];
        let was = std::mem::replace(&mut slot.state, SlotState::Free);
        if let SlotState::ToBounce(c) | SlotState::ToDevice(c) = was {
            slot.state = SlotState::Broken(c);
        }
        let ticket = slot.ticket;
        log::error!("staging: a copy of ticket {} failed: {e}", ticket.0);
        if let Some(job) = self.job_mut(ticket) {
            job.in_flight -= 1;
            job.fail(e);
        }
    }

    /// Fills free bounce buffers with the next chunks of the oldest tickets.
    fn schedule(&mut self, out: &mut Vec<StagingEvent>) {
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
                    slot.state = SlotState::Lent;
                    slot.seq += 1;
                    job.lent += 1;
                    out.push(StagingEvent::Fill(Chunk {
                        stager: self.id,
                        slot: i,
                        seq: slot.seq,
                        ticket: job.ticket,
                        direction: Direction::HostToDevice,
                        device_offset: range.start,
                        bounce_offset,
                        len: range.len(),
                    }));
                }
            }
        }
    }

    /// Reports (and forgets) tickets that are over.
    fn finish(&mut self, out: &mut Vec<StagingEvent>) {
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

    /// Checks that `chunk` is lent by this pipeline right now.
    pub(crate) fn check_chunk(&self, chunk: &Chunk, call: &str) -> Result<()> {
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
            Err(Error::InvalidArgument {
                what: format!(
                    "{call}: chunk (ticket {}, slot {}) is not lent by this stager",
                    chunk.ticket.0, chunk.slot
                ),
                hint: Hint::new("give a chunk back to the stager that lent it"),
            })
        }
    }

    /// The caller is done with `chunk`: a sent device-to-host chunk, or an unfilled
    /// host-to-device chunk (which cancels its ticket).
    pub(crate) fn release(&mut self, chunk: Chunk) -> Result<()> {
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
    pub(crate) fn commit(&mut self, chunk: Chunk) -> Result<()> {
        self.check_chunk(&chunk, "Stager::commit")?;
        if chunk.direction != Direction::HostToDevice {
            let ticket = chunk.ticket.0;
            // Given back as released, so the bounce buffer is not lost with the chunk.
            self.release(chunk)?;
            return Err(Error::InvalidArgument {
                what: format!(
                    "Stager::commit: chunk of ticket {ticket} is a device-to-host chunk (it was \
                     released instead)"
                ),
                hint: Hint::new("give device-to-host chunks back with Stager::release"),
            });
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
                let shown = e.to_string();
                job.fail(e);
                Err(Error::InvalidArgument {
                    what: format!(
                        "Stager::commit: the copy of ticket {} failed: {shown}",
                        chunk.ticket.0
                    ),
                    hint: Hint::new("the ticket is failed; its Finished event carries the error"),
                })
            }
        }
    }

    /// A view of a lent chunk's bytes, when the backing allows one.
    pub(crate) fn chunk_bytes(&self, chunk: &Chunk) -> Result<Option<&[u8]>> {
        self.check_chunk(chunk, "Stager::chunk_bytes")?;
        // SAFETY: the slot is lent (checked): no copy is in flight on its bytes, and none starts
        // before the chunk is given back, which needs `&mut self` (excluded while this borrow of
        // `self` lives); no mutable view exists, since those also borrow `self` mutably.
        Ok(unsafe { self.engine.bounce(chunk.bounce_offset, chunk.len) })
    }

    /// A mutable view of a lent chunk's bytes, when the backing allows one.
    pub(crate) fn chunk_bytes_mut(&mut self, chunk: &Chunk) -> Result<Option<&mut [u8]>> {
        self.check_chunk(chunk, "Stager::chunk_bytes_mut")?;
        // SAFETY: as in chunk_bytes, and `&mut self` excludes every other view.
        Ok(unsafe { self.engine.bounce_mut(chunk.bounce_offset, chunk.len) })
    }

    /// Copies a lent chunk's bytes (from `at` within the chunk) into `out`.
    pub(crate) fn read_chunk(&self, chunk: &Chunk, at: usize, out: &mut [u8]) -> Result<()> {
        self.check_chunk(chunk, "Stager::read_chunk")?;
        check_within("Stager::read_chunk", chunk, at, out.len())?;
        // SAFETY: lent slot (no copy in flight on it); mutable views borrow `self` mutably.
        unsafe { self.engine.read_bounce(chunk.bounce_offset + at, out) }
    }

    /// Copies `data` into a lent chunk at `at` within it.
    pub(crate) fn write_chunk(&mut self, chunk: &Chunk, at: usize, data: &[u8]) -> Result<()> {
        self.check_chunk(chunk, "Stager::write_chunk")?;
        check_within("Stager::write_chunk", chunk, at, data.len())?;
        // SAFETY: lent slot (no copy in flight on it); `&mut self` excludes other views.
        unsafe { self.engine.write_bounce(chunk.bounce_offset + at, data) }
    }

    /// Refuses a blocking copy while tickets are active (their events would be lost).
    fn check_idle(&self, call: &str) -> Result<()> {
        if self.jobs.is_empty() {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            what: format!(
                "{call}: the stager has {} active ticket(s); a blocking copy needs it idle",
                self.jobs.len()
            ),
            hint: Hint::new("poll until every ticket finished, or use another stager"),
        })
    }

    /// Moves `range` of `dev` to host through the bounce buffers, handing each chunk to
    /// `sink(device_offset, bytes)` while the next chunks are copied; returns when done.
    pub(crate) fn copy_d2h(
        &mut self,
        dev: E::Device,
        range: Range<usize>,
        mut sink: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<Outcome> {
        self.check_idle("copy_d2h_pipelined")?;
        let ticket = self.start(Direction::DeviceToHost, dev, range)?;
        let mut events = Vec::new();
        let mut sink_error = None;
        self.poll(&mut events);
        loop {
            if events.is_empty() {
                self.wait_oldest(&mut events);
                if events.is_empty() && self.jobs.is_empty() {
                    // Unreachable: a ticket always ends with a Finished event.
                    return Err(lost(ticket));
                }
                continue;
            }
            for ev in std::mem::take(&mut events) {
                match ev {
                    StagingEvent::Ready(chunk) => {
                        if sink_error.is_none() {
                            let r = self.with_chunk(&chunk, |off, bytes| sink(off, bytes));
                            if let Err(e) = r {
                                sink_error = Some(e);
                                let _ = self.cancel(ticket);
                            }
                        }
                        self.release(chunk)?;
                    }
                    StagingEvent::Fill(chunk) => self.release(chunk)?,
                    StagingEvent::Finished { outcome, .. } => {
                        return match sink_error {
                            Some(e) => Err(e),
                            None => outcome_result(outcome),
                        };
                    }
                }
            }
            self.poll(&mut events);
        }
    }

    /// Calls `f(device_offset, bytes)` with a lent chunk's bytes (a direct view, or a copy).
    fn with_chunk(
        &mut self,
        chunk: &Chunk,
        f: impl FnOnce(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        if let Some(bytes) = self.chunk_bytes(chunk)? {
            return f(chunk.device_offset, bytes);
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(chunk.len, 0);
        let r = self
            .read_chunk(chunk, 0, &mut scratch)
            .and_then(|()| f(chunk.device_offset, &scratch));
        self.scratch = scratch;
        r
    }

    /// Moves bytes to `range` of `dev` through the bounce buffers: `source(device_offset, buf)`
    /// fills each chunk, which is copied to the device while the next is filled.
    pub(crate) fn copy_h2d(
        &mut self,
        dev: E::Device,
        range: Range<usize>,
        mut source: impl FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<Outcome> {
        self.check_idle("copy_h2d_pipelined")?;
        let ticket = self.start(Direction::HostToDevice, dev, range)?;
        let mut events = Vec::new();
        let mut source_error = None;
        self.poll(&mut events);
        loop {
            if events.is_empty() {
                self.wait_oldest(&mut events);
                if events.is_empty() && self.jobs.is_empty() {
                    return Err(lost(ticket));
                }
                continue;
            }
            for ev in std::mem::take(&mut events) {
                match ev {
                    StagingEvent::Fill(chunk) => {
                        if source_error.is_some() {
                            self.release(chunk)?;
                            continue;
                        }
                        match self.fill_chunk(&chunk, &mut source) {
                            Ok(()) => {
                                // A failed copy fails the ticket; its Finished event says so.
                                let _ = self.commit(chunk);
                            }
                            Err(e) => {
                                source_error = Some(e);
                                self.release(chunk)?;
                            }
                        }
                    }
                    StagingEvent::Ready(chunk) => self.release(chunk)?,
                    StagingEvent::Finished { outcome, .. } => {
                        return match source_error {
                            Some(e) => Err(e),
                            None => outcome_result(outcome),
                        };
                    }
                }
            }
            self.poll(&mut events);
        }
    }

    fn fill_chunk(
        &mut self,
        chunk: &Chunk,
        source: &mut impl FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        if let Some(bytes) = self.chunk_bytes_mut(chunk)? {
            return source(chunk.device_offset, bytes);
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(chunk.len, 0);
        let r = source(chunk.device_offset, &mut scratch)
            .and_then(|()| self.write_chunk(chunk, 0, &scratch));
        self.scratch = scratch;
        r
    }
}

fn check_within(call: &str, chunk: &Chunk, at: usize, len: usize) -> Result<()> {
    match at.checked_add(len) {
        Some(end) if end <= chunk.len => Ok(()),
        _ => Err(Error::InvalidArgument {
            what: format!(
                "{call}: {len} bytes at {at} do not fit in the chunk's {} bytes",
                chunk.len
            ),
            hint: Hint::new("keep at + length within Chunk::len()"),
        }),
    }
}

/// A blocking copy's result: a failed ticket is its error.
fn outcome_result(outcome: Outcome) -> Result<Outcome> {
    match outcome {
        Outcome::Failed(e) => Err(e),
        other => Ok(other),
    }
}

fn unknown_ticket(ticket: Ticket) -> Error {
    Error::InvalidArgument {
        what: format!("staging: no active ticket {}", ticket.0),
        hint: Hint::new("the ticket finished already (its Finished event was reported)"),
    }
}

fn lost(ticket: Ticket) -> Error {
    Error::InvalidArgument {
        what: format!(
            "staging: ticket {} ended without a Finished event",
            ticket.0
        ),
        hint: Hint::NONE,
    }
}
