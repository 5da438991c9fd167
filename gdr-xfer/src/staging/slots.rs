//! Bounce buffers registered one per slot, on every rail: the form the engine's staged transfers
//! use, because whether the NIC may still touch a chunk is then known per chunk.
//!
//! Every request gdr posts from a chunk holds an `Arc` of that slot's region until gdr retired
//! it (its completion was reaped, or its queue pair was destroyed). So once the engine and the
//! copies hold no extra reference, [`SlotRegions::is_quiet`] says that no request and no copy
//! can touch the slot's bytes any more, whatever happened to the transfer that used them.

use std::sync::Arc;

use gdr::mr::{AccessFlags, HostMemory, MemoryRegion};
use gdr::pd::ProtectionDomain;

use crate::error::{Error, Result};

/// `chunks` registrations of `chunk_size` bytes each, one per rail ([slot][rail]).
pub(crate) struct SlotRegions {
    pub(crate) chunk_size: usize,
    pub(crate) regions: Vec<Vec<Arc<MemoryRegion>>>,
    /// Strong counts of each region when nothing is in flight (taken by [`Self::settle`]).
    baseline: Vec<Vec<usize>>,
}

impl SlotRegions {
    /// Allocates `chunks` buffers with `alloc` and registers each with every protection domain
    /// (`pds[0]` first, the others as `register_again` of it).
    pub(crate) fn register(
        pds: &[Arc<ProtectionDomain>],
        chunks: usize,
        chunk_size: usize,
        access: AccessFlags,
        mut alloc: impl FnMut(usize) -> Result<Box<dyn HostMemory>>,
    ) -> Result<SlotRegions> {
        let mut regions = Vec::with_capacity(chunks);
        for _ in 0..chunks {
            let first = MemoryRegion::register(&pds[0], alloc(chunk_size)?, access)?;
            let mut per_rail = vec![first.clone()];
            for pd in &pds[1..] {
                per_rail.push(first.register_again(pd, access)?);
            }
            regions.push(per_rail);
        }
        Ok(SlotRegions {
            chunk_size,
            regions,
            baseline: Vec::new(),
        })
    }

    /// Records the strong counts of every region as the quiet state: call once every
    /// long-lived holder (the engine's per-slot segments) exists.
    pub(crate) fn settle(&mut self) {
        self.baseline = self
            .regions
            .iter()
            .map(|rails| rails.iter().map(Arc::strong_count).collect())
            .collect();
    }

    /// Whether nothing beyond the long-lived holders references slot `slot`'s regions: no
    /// request gdr has not retired, no copy in flight.
    pub(crate) fn is_quiet(&self, slot: usize) -> bool {
        match (self.regions.get(slot), self.baseline.get(slot)) {
            (Some(rails), Some(base)) => rails
                .iter()
                .zip(base)
                .all(|(r, &b)| Arc::strong_count(r) <= b),
            _ => false,
        }
    }

    /// The rail-0 region of the slot holding bounce offset `offset`, and the offset in it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an offset past the last slot.
    pub(crate) fn locate(&self, offset: usize) -> Result<(&Arc<MemoryRegion>, usize)> {
        let slot = offset / self.chunk_size.max(1);
        match self.regions.get(slot).and_then(|rails| rails.first()) {
            Some(r) => Ok((r, offset % self.chunk_size.max(1))),
            None => Err(Error::invalid(
                format!(
                    "bounce offset {offset} lies past the last of {} slots of {} bytes",
                    self.regions.len(),
                    self.chunk_size
                ),
                "a chunk's offset comes from its stager",
            )),
        }
    }
}
