//! [`Stager`]: pinned bounce buffers and a CUDA stream that move GPU memory to and from host
//! memory in pipelined chunks.

use std::ops::Range;
use std::sync::Arc;

use gdr::cuda::{AsyncCopy, DeviceMemory, DmaHostBuffer, Stream};
use gdr::mr::{AccessFlags, LocalSlice, MemoryRegion};
use gdr::pd::ProtectionDomain;

use super::chunk::{Chunk, Direction, Outcome, StagingEvent, Ticket};
use super::pipeline::{BounceViews, Pipeline};
use super::slots::SlotRegions;
use super::StagingConfig;
use crate::error::{Error, Hint, Result};
use gdr_xfer_proto::staging::CopyEngine;

/// Device memory a ticket copies from or to.
type Device = Arc<dyn DeviceMemory + Send + Sync>;

/// Where the bounce buffers live.
enum Bounce {
    /// Pinned memory only the stager reaches (no RDMA registration).
    Owned(Arc<DmaHostBuffer>),
    /// Pinned memory owned by an RDMA region (CPU access through its atomic copies).
    Registered(Arc<MemoryRegion>),
    /// One pinned allocation per slot, each registered on every rail (the engine's form).
    Slots(Arc<SlotRegions>),
}

/// The CUDA copy engine: one stream, copies between device memory and the bounce allocation.
pub(crate) struct CudaCopies {
    stream: Arc<Stream>,
    bounce: Bounce,
}

impl CopyEngine for CudaCopies {
    type Error = Error;
    type Device = Device;
    type Copy = AsyncCopy;

    fn device_len(dev: &Device) -> usize {
        dev.len()
    }

    fn to_bounce(
        &mut self,
        dev: &Device,
        dev_offset: usize,
        bounce_offset: usize,
        len: usize,
    ) -> Result<AsyncCopy> {
        Ok(match &self.bounce {
            Bounce::Owned(b) => self
                .stream
                .copy_to_host(dev, dev_offset, b, bounce_offset, len)?,
            Bounce::Registered(r) => {
                self.stream
                    .copy_to_host(dev, dev_offset, r, bounce_offset, len)?
            }
            Bounce::Slots(s) => {
                let (r, at) = s.locate(bounce_offset)?;
                self.stream.copy_to_host(dev, dev_offset, r, at, len)?
            }
        })
    }

    fn to_device(
        &mut self,
        bounce_offset: usize,
        dev: &Device,
        dev_offset: usize,
        len: usize,
    ) -> Result<AsyncCopy> {
        Ok(match &self.bounce {
            Bounce::Owned(b) => {
                self.stream
                    .copy_to_device(b, bounce_offset, dev, dev_offset, len)?
            }
            Bounce::Registered(r) => {
                self.stream
                    .copy_to_device(r, bounce_offset, dev, dev_offset, len)?
            }
            Bounce::Slots(s) => {
                let (r, at) = s.locate(bounce_offset)?;
                self.stream.copy_to_device(r, at, dev, dev_offset, len)?
            }
        })
    }

    fn is_complete(&mut self, copy: &mut AsyncCopy) -> Result<bool> {
        Ok(copy.is_complete()?)
    }

    fn wait(&mut self, copy: &mut AsyncCopy) -> Result<()> {
        Ok(copy.wait_mut()?)
    }
}

impl BounceViews for CudaCopies {
    unsafe fn bounce(&self, offset: usize, len: usize) -> Option<&[u8]> {
        match &self.bounce {
            // SAFETY: forwarded: the caller excludes copies and mutable views on these bytes.
            Bounce::Owned(b) => unsafe { b.slice(offset, len) }.ok(),
            Bounce::Registered(_) | Bounce::Slots(_) => None,
        }
    }

    unsafe fn bounce_mut(&self, offset: usize, len: usize) -> Option<&mut [u8]> {
        match &self.bounce {
            // SAFETY: forwarded: the caller excludes copies and every other view.
            Bounce::Owned(b) => unsafe { b.slice_mut(offset, len) }.ok(),
            Bounce::Registered(_) | Bounce::Slots(_) => None,
        }
    }

    unsafe fn read_bounce(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        match &self.bounce {
            Bounce::Owned(b) => {
                // SAFETY: forwarded: no copy writes these bytes and no mutable view exists.
                out.copy_from_slice(unsafe { b.slice(offset, out.len()) }?);
                Ok(())
            }
            Bounce::Registered(r) => Ok(r.read(offset, out)?),
            Bounce::Slots(s) => {
                let (r, at) = s.locate(offset)?;
                Ok(r.read(at, out)?)
            }
        }
    }

    unsafe fn write_bounce(&self, offset: usize, data: &[u8]) -> Result<()> {
        match &self.bounce {
            Bounce::Owned(b) => {
                // SAFETY: forwarded: no copy touches these bytes and no other view exists.
                unsafe { b.slice_mut(offset, data.len()) }?.copy_from_slice(data);
                Ok(())
            }
            Bounce::Registered(r) => Ok(r.write(offset, data)?),
            Bounce::Slots(s) => {
                let (r, at) = s.locate(offset)?;
                Ok(r.write(at, data)?)
            }
        }
    }
}

/// Host staging for GPU memory the NIC cannot reach directly: `chunks` pinned bounce buffers of
/// `chunk_size` bytes and a CUDA stream, moving a range of device memory to host memory or back
/// in chunks, with copies of later chunks queued while the caller works on earlier ones.
///
/// # Driving it without blocking (the engine's progress thread)
///
/// 1. once per GPU: [`Stager::registered`] (the bounce buffers become one RDMA region,
///    [`bounce_region`](Self::bounce_region));
/// 2. device to host (staged RDMA WRITE from GPU memory): [`start_d2h`](Self::start_d2h); each
///    [`poll`](Self::poll) issues copies into free bounce buffers and reports
///    [`StagingEvent::Ready`] chunks: post the RDMA WRITE from
///    [`chunk_slice`](Self::chunk_slice), and when its completion arrives,
///    [`release`](Self::release) the chunk;
/// 3. host to device (staged RDMA READ into GPU memory): [`start_h2d`](Self::start_h2d); `poll`
///    lends [`StagingEvent::Fill`] chunks: post the RDMA READ into `chunk_slice`, and when it
///    completes, [`commit`](Self::commit) the chunk (which queues its copy to the device);
/// 4. `poll` reports [`StagingEvent::Finished`] once every copy of a ticket is complete and every
///    chunk came back; from then on the stager holds nothing of that device memory.
///
/// `poll` only queries events and issues asynchronous copies: it never waits. Dropping the stager
/// waits for the copies in flight (never for lent chunks, which hold no memory).
///
/// ```no_run
/// # fn main() -> gdr_xfer::Result<()> {
/// use std::sync::Arc;
/// use gdr_xfer::staging::{Stager, StagingConfig};
/// let dev = Arc::new(gdr::cuda::DeviceBuffer::alloc(0, 64 << 20)?);
/// let mut stager = Stager::new(0, StagingConfig::default())?; // 4 x 8 MiB
/// let mut host = vec![0u8; 64 << 20];
/// stager.copy_d2h_pipelined(&dev, 0..64 << 20, |offset, bytes| {
///     host[offset..offset + bytes.len()].copy_from_slice(bytes);
///     Ok(())
/// })?;
/// # Ok(()) }
/// ```
pub struct Stager {
    core: Pipeline<CudaCopies>,
    ordinal: i32,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("ordinal", &self.ordinal)
            .field("config", &self.core.config())
            .field("registered", &self.bounce_region().is_some())
            .field("active_tickets", &self.core.active_tickets())
            .field("copies_in_flight", &self.core.copies_in_flight())
            .finish()
    }
}

impl Stager {
    /// A stager on GPU `ordinal` whose bounce buffers are not registered for RDMA (for host
    /// copies, benchmarks, or registration by other means).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad `config` (checked first);
    /// [`gdr::Error::CudaUnavailable`] (inside [`Error::Gdr`]) without a usable CUDA driver;
    /// [`gdr::Error::Cuda`] when the pinned allocation or the stream fails.
    pub fn new(ordinal: i32, config: StagingConfig) -> Result<Stager> {
        let total = config.total()?;
        let bounce = Arc::new(DmaHostBuffer::alloc(ordinal, total)?);
        let stream = Arc::new(Stream::new(ordinal)?);
        Self::build(ordinal, config, stream, Bounce::Owned(bounce))
    }

    /// A stager on GPU `ordinal` whose bounce buffers are one pinned allocation registered with
    /// `pd` (`ibv_reg_mr`, once): chunks are slices of [`bounce_region`](Self::bounce_region).
    /// `access` needs [`AccessFlags::LOCAL_WRITE`] for host-to-device staging (the NIC writes the
    /// bounce buffers); remote access is never needed.
    ///
    /// # Errors
    /// As [`new`](Self::new), plus [`gdr::Error::Verbs`] naming `ibv_reg_mr` (the locked-memory
    /// limit, ...).
    pub fn registered(
        pd: &Arc<ProtectionDomain>,
        ordinal: i32,
        config: StagingConfig,
        access: AccessFlags,
    ) -> Result<Stager> {
        let total = config.total()?;
        let buffer = DmaHostBuffer::alloc(ordinal, total)?;
        let region = MemoryRegion::register(pd, Box::new(buffer), access)?;
        let stream = Arc::new(Stream::new(ordinal)?);
        Self::build(ordinal, config, stream, Bounce::Registered(region))
    }

    /// A stager on GPU `ordinal` whose bounce buffers are `slots` (one pinned allocation per
    /// slot, registered on every rail): the engine's staged transfers.
    pub(crate) fn with_slots(
        ordinal: i32,
        config: StagingConfig,
        slots: Arc<SlotRegions>,
    ) -> Result<Stager> {
        let stream = Arc::new(Stream::new(ordinal)?);
        Self::build(ordinal, config, stream, Bounce::Slots(slots))
    }

    fn build(
        ordinal: i32,
        config: StagingConfig,
        stream: Arc<Stream>,
        bounce: Bounce,
    ) -> Result<Stager> {
        let core = Pipeline::new(CudaCopies { stream, bounce }, config)?;
        let stager = Stager { core, ordinal };
        log::info!("{}", stager.describe());
        Ok(stager)
    }

    /// One line for logs and segment info: how GPU memory is staged.
    pub fn describe(&self) -> String {
        let c = self.core.config();
        let reg = match &self.core.engine().bounce {
            Bounce::Owned(_) => "not registered".to_string(),
            Bounce::Registered(r) => format!("registered, lkey {:#x}", r.lkey()),
            Bounce::Slots(s) => format!(
                "registered per buffer on {} rail(s)",
                s.regions.first().map_or(0, Vec::len)
            ),
        };
        let cut = if c.nic_rate > 0 {
            format!(
                ", runs cut for least time against {:.1} GB/s",
                c.nic_rate as f64 / 1e9
            )
        } else {
            String::new()
        };
        format!(
            "GPU cuda:{} staged through host: {} x {} pinned bounce buffers ({reg}), \
             pipelined cuMemcpyAsync on one stream{cut}",
            self.ordinal,
            c.chunks,
            bytes_text(c.chunk_size)
        )
    }

    /// The GPU it stages for.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Its configuration.
    pub fn config(&self) -> StagingConfig {
        self.core.config()
    }

    /// The RDMA region of the bounce buffers, for a stager made with
    /// [`registered`](Self::registered).
    pub fn bounce_region(&self) -> Option<&Arc<MemoryRegion>> {
        match &self.core.engine().bounce {
            Bounce::Registered(r) => Some(r),
            Bounce::Owned(_) | Bounce::Slots(_) => None,
        }
    }

    /// The stream its copies run on.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.core.engine().stream
    }

    /// Tickets started and not yet reported finished.
    pub fn active_tickets(&self) -> usize {
        self.core.active_tickets()
    }

    /// Copies in flight on the stream.
    pub fn copies_in_flight(&self) -> usize {
        self.core.copies_in_flight()
    }

    /// Bounce buffers lost to failed copies (never reused).
    pub fn broken_chunks(&self) -> usize {
        self.core.broken_slots()
    }

    /// Starts moving `range` of `dev` to the bounce buffers, chunk by chunk. The stager keeps an
    /// `Arc` of `dev` until the ticket is [finished](StagingEvent::Finished).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside `dev` or too many active tickets.
    pub fn start_d2h<D: DeviceMemory + Send + Sync + 'static>(
        &mut self,
        dev: &Arc<D>,
        range: Range<usize>,
    ) -> Result<Ticket> {
        let dev: Device = dev.clone();
        self.core.start(Direction::DeviceToHost, dev, range)
    }

    /// [`start_d2h`](Self::start_d2h) or [`start_h2d`](Self::start_h2d) for memory already
    /// behind a trait object (the agent's staged segments, whatever their owner).
    pub(crate) fn start_device(
        &mut self,
        dir: Direction,
        dev: Device,
        range: Range<usize>,
    ) -> Result<Ticket> {
        self.core.start(dir, dev, range)
    }

    /// Starts moving bytes the caller provides (in [`StagingEvent::Fill`] chunks) to `range` of
    /// `dev`. The stager keeps an `Arc` of `dev` until the ticket is finished.
    ///
    /// # Errors
    /// As [`start_d2h`](Self::start_d2h).
    pub fn start_h2d<D: DeviceMemory + Send + Sync + 'static>(
        &mut self,
        dev: &Arc<D>,
        range: Range<usize>,
    ) -> Result<Ticket> {
        let dev: Device = dev.clone();
        self.core.start(Direction::HostToDevice, dev, range)
    }

    /// Progress without waiting: reaps completed copies, issues the next ones into free bounce
    /// buffers, and appends ready chunks, fill chunks and finished tickets to `out`.
    pub fn poll(&mut self, out: &mut Vec<StagingEvent>) {
        self.core.poll(out);
    }

    /// Stops issuing chunks of `ticket`; it finishes as [`Outcome::Cancelled`] once its copies
    /// in flight are complete and its lent chunks came back.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a ticket that is not active.
    pub fn cancel(&mut self, ticket: Ticket) -> Result<()> {
        self.core.cancel(ticket)
    }

    /// Gives back a chunk: a device-to-host chunk whose bytes were sent (the RDMA WRITE from it
    /// completed), or a host-to-device chunk that will not be filled (its ticket is cancelled).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a chunk this stager did not lend.
    pub fn release(&mut self, chunk: Chunk) -> Result<()> {
        self.core.release(chunk)
    }

    /// Gives back a filled host-to-device chunk: its copy to the device is queued.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a chunk this stager did not lend, a device-to-host chunk,
    /// or a copy the driver refused (the ticket then fails).
    pub fn commit(&mut self, chunk: Chunk) -> Result<()> {
        self.core.commit(chunk)
    }

    /// The chunk as a slice of the registered bounce region, for a work request's scatter/gather
    /// list (the slice keeps the region alive until the request completes).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a chunk not lent by this stager, or a stager made with
    /// [`new`](Self::new) (no region).
    pub fn chunk_slice(&self, chunk: &Chunk) -> Result<LocalSlice> {
        self.core.check_chunk(chunk, "Stager::chunk_slice")?;
        let Some(region) = self.bounce_region() else {
            return Err(Error::InvalidArgument {
                what: "Stager::chunk_slice: the bounce buffers are not registered".into(),
                hint: Hint::new("make the stager with Stager::registered"),
            });
        };
        Ok(region.slice(chunk.bounce_offset()..chunk.bounce_offset() + chunk.len())?)
    }

    /// The chunk's bytes (no copy), for a stager made with [`new`](Self::new); `None` for a
    /// registered one (use [`read_chunk`](Self::read_chunk)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a chunk this stager did not lend.
    pub fn chunk_bytes(&self, chunk: &Chunk) -> Result<Option<&[u8]>> {
        self.core.chunk_bytes(chunk)
    }

    /// The chunk's bytes for writing (no copy), as [`chunk_bytes`](Self::chunk_bytes).
    ///
    /// # Errors
    /// As [`chunk_bytes`](Self::chunk_bytes).
    pub fn chunk_bytes_mut(&mut self, chunk: &Chunk) -> Result<Option<&mut [u8]>> {
        self.core.chunk_bytes_mut(chunk)
    }

    /// Copies the chunk's bytes from `at` (within the chunk) into `out`; works for both kinds of
    /// stager.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a chunk this stager did not lend or a range past its end.
    pub fn read_chunk(&self, chunk: &Chunk, at: usize, out: &mut [u8]) -> Result<()> {
        self.core.read_chunk(chunk, at, out)
    }

    /// Copies `data` into the chunk at `at`; works for both kinds of stager.
    ///
    /// # Errors
    /// As [`read_chunk`](Self::read_chunk).
    pub fn write_chunk(&mut self, chunk: &Chunk, at: usize, data: &[u8]) -> Result<()> {
        self.core.write_chunk(chunk, at, data)
    }

    /// Copies `range` of `dev` to the host through the bounce buffers and returns when done:
    /// `sink(device_offset, bytes)` gets each chunk in order while the copies of the next chunks
    /// run. The stager must have no active ticket.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad range or a busy stager; the first error of `sink`
    /// (the rest of the range is cancelled); a failed copy's [`gdr::Error::Cuda`].
    pub fn copy_d2h_pipelined<D: DeviceMemory + Send + Sync + 'static>(
        &mut self,
        dev: &Arc<D>,
        range: Range<usize>,
        sink: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<Outcome> {
        let dev: Device = dev.clone();
        self.core.copy_d2h(dev, range, sink)
    }

    /// Copies host bytes to `range` of `dev` through the bounce buffers and returns when done:
    /// `source(device_offset, buf)` fills each chunk in order while the copies of earlier chunks
    /// run. The stager must have no active ticket.
    ///
    /// # Errors
    /// As [`copy_d2h_pipelined`](Self::copy_d2h_pipelined), with `source` for `sink`.
    pub fn copy_h2d_pipelined<D: DeviceMemory + Send + Sync + 'static>(
        &mut self,
        dev: &Arc<D>,
        range: Range<usize>,
        source: impl FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<Outcome> {
        let dev: Device = dev.clone();
        self.core.copy_h2d(dev, range, source)
    }
}

/// `8388608` -> `8 MiB`, `1536` -> `1536 B`.
pub(crate) fn bytes_text(n: usize) -> String {
    if n >= 1 << 30 && n.is_multiple_of(1 << 30) {
        format!("{} GiB", n >> 30)
    } else if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}
