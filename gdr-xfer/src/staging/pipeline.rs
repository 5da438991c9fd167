//! gdr-xfer's side of the bounce-slot machine: the core's [`core::Pipeline`] (which slot is
//! free, copying, lent or broken) with the bounce bytes themselves, read and written through
//! views ([`BounceViews`]) only while the core says a chunk is lent, and the blocking copies
//! built on both.

use std::ops::{Deref, Range};

use gdr_xfer_proto::staging::{self as core, check_within, CopyEngine, PipelineError};

use super::chunk::{Chunk, Direction, Outcome, StagingEvent, Ticket};
use super::StagingConfig;
use crate::error::{Error, Hint, Result};

/// The bounce bytes of a copy engine, as the CPU sees them.
pub(crate) trait BounceViews {
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

/// A copy engine gdr-xfer drives: the core's copies, gdr's errors, and views of the bytes.
pub(crate) trait Engine: CopyEngine<Error = Error> + BounceViews {}
impl<E: CopyEngine<Error = Error> + BounceViews> Engine for E {}

impl From<PipelineError> for Error {
    fn from(e: PipelineError) -> Error {
        Error::invalid(e.to_string(), e.hint())
    }
}

/// The core's pipeline, its configuration as the caller gave it, and scratch for backings
/// without direct views. Reads the core through `Deref`; every change goes through the
/// methods below, which turn the core's refusals into gdr-xfer's errors.
pub(crate) struct Pipeline<E: Engine> {
    core: core::Pipeline<E>,
    config: StagingConfig,
    scratch: Vec<u8>,
}

impl<E: Engine> Deref for Pipeline<E> {
    type Target = core::Pipeline<E>;
    fn deref(&self) -> &core::Pipeline<E> {
        &self.core
    }
}

impl<E: Engine> Pipeline<E> {
    /// A pipeline over `config.chunks` bounce buffers of `config.chunk_size` bytes in `engine`'s
    /// bounce allocation (which must hold `config.total()` bytes).
    pub(crate) fn new(engine: E, config: StagingConfig) -> Result<Self> {
        config.validate()?;
        Ok(Pipeline {
            core: core::Pipeline::new(engine, config.pipeline())?,
            config,
            scratch: Vec::new(),
        })
    }

    pub(crate) fn config(&self) -> StagingConfig {
        self.config
    }

    /// The copy engine, to change.
    #[cfg(test)]
    pub(crate) fn engine_mut(&mut self) -> &mut E {
        self.core.engine_mut()
    }

    /// Starts moving `range` of `dev` in `direction`.
    pub(crate) fn start(
        &mut self,
        direction: Direction,
        dev: E::Device,
        range: Range<usize>,
    ) -> Result<Ticket> {
        Ok(self.core.start(direction, dev, range)?)
    }

    /// Stops issuing chunks of `ticket` (see [`core::Pipeline::cancel`]).
    pub(crate) fn cancel(&mut self, ticket: Ticket) -> Result<()> {
        Ok(self.core.cancel(ticket)?)
    }

    /// Reaps completed copies, issues new ones, reports events. Never waits.
    pub(crate) fn poll(&mut self, out: &mut Vec<StagingEvent>) {
        let from = out.len();
        self.core.poll(out);
        log_failures(&out[from..]);
    }

    /// Waits for the oldest copy in flight, then reaps.
    pub(crate) fn wait_oldest(&mut self, out: &mut Vec<StagingEvent>) {
        let from = out.len();
        self.core.wait_oldest(out);
        log_failures(&out[from..]);
    }

    /// The caller is done with `chunk` (see [`core::Pipeline::release`]).
    pub(crate) fn release(&mut self, chunk: Chunk) -> Result<()> {
        Ok(self.core.release(chunk)?)
    }

    /// The caller filled host-to-device `chunk` (see [`core::Pipeline::commit`]).
    pub(crate) fn commit(&mut self, chunk: Chunk) -> Result<()> {
        Ok(self.core.commit(chunk)?)
    }

    /// A view of a lent chunk's bytes, when the backing allows one.
    pub(crate) fn chunk_bytes(&self, chunk: &Chunk) -> Result<Option<&[u8]>> {
        self.core.check_chunk(chunk, "Stager::chunk_bytes")?;
        // SAFETY: the core lends the chunk (checked), so no copy is in flight on its bytes and
        // none starts before it is given back (the core's promise), which needs `&mut self`,
        // excluded while this borrow of `self` lives; no mutable view exists, since those also
        // borrow `self` mutably.
        Ok(unsafe {
            self.core
                .engine()
                .bounce(chunk.bounce_offset(), chunk.len())
        })
    }

    /// A mutable view of a lent chunk's bytes, when the backing allows one.
    pub(crate) fn chunk_bytes_mut(&mut self, chunk: &Chunk) -> Result<Option<&mut [u8]>> {
        self.core.check_chunk(chunk, "Stager::chunk_bytes_mut")?;
        // SAFETY: as in chunk_bytes, and `&mut self` excludes every other view.
        Ok(unsafe {
            self.core
                .engine()
                .bounce_mut(chunk.bounce_offset(), chunk.len())
        })
    }

    /// Copies a lent chunk's bytes (from `at` within the chunk) into `out`.
    pub(crate) fn read_chunk(&self, chunk: &Chunk, at: usize, out: &mut [u8]) -> Result<()> {
        self.core.check_chunk(chunk, "Stager::read_chunk")?;
        check_within("Stager::read_chunk", chunk, at, out.len())?;
        // SAFETY: lent slot (no copy in flight on it); mutable views borrow `self` mutably.
        unsafe {
            self.core
                .engine()
                .read_bounce(chunk.bounce_offset() + at, out)
        }
    }

    /// Copies `data` into a lent chunk at `at` within it.
    pub(crate) fn write_chunk(&mut self, chunk: &Chunk, at: usize, data: &[u8]) -> Result<()> {
        self.core.check_chunk(chunk, "Stager::write_chunk")?;
        check_within("Stager::write_chunk", chunk, at, data.len())?;
        // SAFETY: lent slot (no copy in flight on it); `&mut self` excludes other views.
        unsafe {
            self.core
                .engine()
                .write_bounce(chunk.bounce_offset() + at, data)
        }
    }
    /// Refuses a blocking copy while tickets are active (their events would be lost).
    fn check_idle(&self, call: &str) -> Result<()> {
        if self.core.active_tickets() == 0 {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            what: format!(
                "{call}: the stager has {} active ticket(s); a blocking copy needs it idle",
                self.core.active_tickets()
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
                if events.is_empty() && self.core.active_tickets() == 0 {
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
            return f(chunk.device_offset(), bytes);
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(chunk.len(), 0);
        let r = self
            .read_chunk(chunk, 0, &mut scratch)
            .and_then(|()| f(chunk.device_offset(), &scratch));
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
                if events.is_empty() && self.core.active_tickets() == 0 {
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
            return source(chunk.device_offset(), bytes);
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(chunk.len(), 0);
        let r = source(chunk.device_offset(), &mut scratch)
            .and_then(|()| self.write_chunk(chunk, 0, &scratch));
        self.scratch = scratch;
        r
    }
}

/// Staging is never silent: a ticket a copy failed is logged as it is reported.
fn log_failures(events: &[StagingEvent]) {
    for ev in events {
        if let StagingEvent::Finished {
            ticket,
            outcome: Outcome::Failed(e),
        } = ev
        {
            log::error!("staging: a copy of ticket {} failed: {e}", ticket.id());
        }
    }
}

/// A blocking copy's result: a failed ticket is its error.
fn outcome_result(outcome: Outcome) -> Result<Outcome> {
    match outcome {
        Outcome::Failed(e) => Err(e),
        other => Ok(other),
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
