//! One GPU's bounce buffers and the stager that fills and drains them, whatever the copy engine
//! (CUDA, or the emulated GPU's `memcpy`).

use std::ops::Range;
use std::sync::Arc;

use gdr::mr::{AccessFlags, HostMemory};
use gdr::pd::ProtectionDomain;

use crate::error::{Error, Result};
use crate::segment::{Backing, Segment, SegmentInner};
use crate::staged_memory::StagedDevice;
use crate::staging::slots::SlotRegions;
use crate::staging::{Chunk, Direction, Stager, StagingConfig, StagingEvent, Ticket};
use crate::wire::SegmentInfo;
use gdr_xfer_proto::Location;

/// A stager, seen the same way for every copy engine.
pub(crate) trait Stage: Send {
    fn start(&mut self, dir: Direction, dev: &StagedDevice, range: Range<usize>) -> Result<Ticket>;
    fn poll(&mut self, out: &mut Vec<StagingEvent>);
    fn release(&mut self, chunk: Chunk) -> Result<()>;
    fn commit(&mut self, chunk: Chunk) -> Result<()>;
    fn cancel(&mut self, ticket: Ticket) -> Result<()>;
}

fn wrong_device() -> Error {
    Error::invalid(
        "staging: the memory belongs to another kind of GPU than these bounce buffers",
        "this is a bug in gdr-xfer's staging driver",
    )
}

impl Stage for Stager {
    fn start(&mut self, dir: Direction, dev: &StagedDevice, range: Range<usize>) -> Result<Ticket> {
        match dev.cuda() {
            Some(memory) => self.start_device(dir, memory, range),
            None => Err(wrong_device()),
        }
    }
    fn poll(&mut self, out: &mut Vec<StagingEvent>) {
        Stager::poll(self, out)
    }
    fn release(&mut self, chunk: Chunk) -> Result<()> {
        Stager::release(self, chunk)
    }
    fn commit(&mut self, chunk: Chunk) -> Result<()> {
        Stager::commit(self, chunk)
    }
    fn cancel(&mut self, ticket: Ticket) -> Result<()> {
        Stager::cancel(self, ticket)
    }
}

#[cfg(feature = "emulated-gpu")]
impl Stage for crate::staging::pipeline::Pipeline<crate::staging::emulated::HostCopies> {
    fn start(&mut self, dir: Direction, dev: &StagedDevice, range: Range<usize>) -> Result<Ticket> {
        match dev {
            StagedDevice::Emulated(g) => {
                crate::staging::pipeline::Pipeline::start(self, dir, g.clone(), range)
            }
            StagedDevice::Cuda(_) | StagedDevice::CudaForeign { .. } => Err(wrong_device()),
        }
    }
    fn poll(&mut self, out: &mut Vec<StagingEvent>) {
        crate::staging::pipeline::Pipeline::poll(self, out)
    }
    fn release(&mut self, chunk: Chunk) -> Result<()> {
        crate::staging::pipeline::Pipeline::release(self, chunk)
    }
    fn commit(&mut self, chunk: Chunk) -> Result<()> {
        crate::staging::pipeline::Pipeline::commit(self, chunk)
    }
    fn cancel(&mut self, ticket: Ticket) -> Result<()> {
        crate::staging::pipeline::Pipeline::cancel(self, ticket)
    }
}

/// One GPU's bounce buffers: the stager, its slots (one registration per rail each), and per
/// slot the segment children post from.
pub(crate) struct Bounce {
    pub(crate) key: (bool, i32),
    pub(crate) stage: Box<dyn Stage>,
    pub(crate) slots: Arc<SlotRegions>,
    pub(crate) segments: Vec<Arc<SegmentInner>>,
    pub(crate) describe: String,
}

impl Bounce {
    /// Bounce buffers for the GPU of `dev`, registered with every rail's protection domain.
    pub(crate) fn new(
        pds: &[Arc<ProtectionDomain>],
        dev: &StagedDevice,
        config: StagingConfig,
    ) -> Result<Bounce> {
        config.validate()?;
        let key = dev.key();
        match dev {
            StagedDevice::Cuda(_) | StagedDevice::CudaForeign { .. } => {
                let (_, ordinal) = key;
                let (slots, segments) = Self::slots(pds, config, |len| {
                    Ok(Box::new(gdr::cuda::DmaHostBuffer::alloc(ordinal, len)?))
                })?;
                let stager = Stager::with_slots(ordinal, config, slots.clone())?;
                let describe = stager.describe();
                Ok(Bounce {
                    key,
                    stage: Box::new(stager),
                    slots,
                    segments,
                    describe,
                })
            }
            #[cfg(feature = "emulated-gpu")]
            StagedDevice::Emulated(g) => {
                let (slots, segments) = Self::slots(pds, config, |len| {
                    Ok(Box::new(gdr::mr::AlignedBuffer::zeroed(len)?))
                })?;
                let engine = crate::staging::emulated::HostCopies::new(slots.clone())?;
                let pipeline = crate::staging::pipeline::Pipeline::new(engine, config)?;
                let describe = format!(
                    "emulated GPU {} staged through host: {} x {} bounce buffers (registered per \
                     buffer on {} rail(s)), memcpy copies on a thread",
                    g.ordinal(),
                    config.chunks,
                    crate::staging::bytes_text(config.chunk_size),
                    pds.len()
                );
                log::info!("{describe}");
                Ok(Bounce {
                    key,
                    stage: Box::new(pipeline),
                    slots,
                    segments,
                    describe,
                })
            }
        }
    }

    /// Registers the slots and makes their segments, then records the quiet state.
    fn slots(
        pds: &[Arc<ProtectionDomain>],
        config: StagingConfig,
        alloc: impl FnMut(usize) -> Result<Box<dyn HostMemory>>,
    ) -> Result<(Arc<SlotRegions>, Vec<Arc<SegmentInner>>)> {
        let mut slots = SlotRegions::register(
            pds,
            config.chunks,
            config.chunk_size,
            AccessFlags::LOCAL_WRITE,
            alloc,
        )?;
        let mut segments = Vec::with_capacity(slots.regions.len());
        for rails in &slots.regions {
            let info = SegmentInfo {
                id: gdr_xfer_proto::SegmentId::new(0),
                name: "staging bounce buffer".into(),
                addr: rails[0].slice(..)?.addr(),
                len: config.chunk_size as u64,
                rkeys: Vec::new(),
                location: Location::Cpu { numa: None },
            };
            // Engine-owned: never a caller's local side (agent 0 is no agent); its chunks go
            // on the rails of the job they serve.
            let seg = Segment::new(info, Backing::Host(Arc::new(rails.clone())), 0, 0, u32::MAX)?;
            segments.push(seg.inner);
        }
        slots.settle();
        Ok((Arc::new(slots), segments))
    }
}

#[cfg(all(test, feature = "emulated-gpu"))]
mod tests {
    use gdr::device::Context;
    use gdr::pd::ProtectionDomain;

    use super::Bounce;
    use crate::staged_memory::StagedDevice;
    use crate::staging::EmulatedGpu;
    use crate::staging::StagingConfig;

    #[test]
    #[ignore = "needs an RDMA device named by GDR_TEST_DEVICE (run in the VM: cargo xtask test)"]
    fn a_bounce_buffer_is_quiet_only_when_nothing_but_the_engine_holds_it() {
        let spec = std::env::var("GDR_TEST_DEVICE").expect("GDR_TEST_DEVICE is not set");
        let pds: Vec<_> = spec
            .split(',')
            .map(|d| ProtectionDomain::new(&Context::open(d).unwrap()).unwrap())
            .collect();
        let dev = StagedDevice::Emulated(EmulatedGpu::new(0, 1 << 20));
        let b = Bounce::new(&pds, &dev, StagingConfig::new(64 << 10, 2)).unwrap();
        assert!(b.slots.is_quiet(0) && b.slots.is_quiet(1));
        assert!(!b.slots.is_quiet(2), "no such slot");
        // What a posted request keeps (gdr holds the slice's region until it retires the
        // request): a piece cut from the slot segment's slice on the last rail.
        let rail = pds.len() - 1;
        let held = b.segments[1].whole[rail].sub(0..4096).unwrap();
        assert!(
            b.slots.is_quiet(0),
            "another slot's hold says nothing of this one"
        );
        assert!(!b.slots.is_quiet(1), "a request's hold makes its slot busy");
        drop(held);
        assert!(b.slots.is_quiet(1));
        // A copy in flight keeps an Arc of the region it copies to.
        let copy = b.slots.regions[0][0].clone();
        assert!(!b.slots.is_quiet(0));
        drop(copy);
        assert!(b.slots.is_quiet(0));
    }
}
