//! The registration cache for GPU memory, keyed by device address range.
//!
//! Registering a range of a [`DeviceBuffer`] that an earlier registration of the same buffer
//! covers reuses that registration: no verbs call, no pinning. A range that overlaps or touches
//! earlier registrations without being covered gets one registration of the union (the earlier
//! ones live on while their segments or in-flight requests hold them; the cache then hands out
//! the union). The cache holds registrations weakly: when the last segment and request using
//! one are gone, it is deregistered and its memory unpinned.
//!
//! The bookkeeping ([`RangeCache`]) is generic over what a registration is, so it is tested on
//! the host without a GPU or a NIC.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use gdr::cuda::{DeviceBuffer, DeviceMemory};
use gdr::gpu_mr::{GpuMemoryRegion, RegistrationPath};
use gdr::mr::AccessFlags;
use gdr::pd::ProtectionDomain;

use crate::error::Result;

/// Counters of the cache, for telemetry and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered by an existing registration.
    pub hits: u64,
    /// Registrations made (verbs calls).
    pub registrations: u64,
    /// Registrations made as the union of overlapping or adjacent ones.
    pub merged: u64,
}

struct Entry<R> {
    /// End of the registered address range (exclusive).
    end: u64,
    /// Which allocation it belongs to (ranges of different allocations never merge).
    owner: usize,
    region: Weak<R>,
}

/// Registrations by address (start of the range -> entry), held weakly.
pub(crate) struct RangeCache<R> {
    entries: BTreeMap<u64, Entry<R>>,
    pub(crate) stats: CacheStats,
}

impl<R> Default for RangeCache<R> {
    fn default() -> Self {
        RangeCache {
            entries: BTreeMap::new(),
            stats: CacheStats::default(),
        }
    }
}

impl<R> RangeCache<R> {
    /// A registration covering `start..end` of allocation `owner` and the offset of `start` in
    /// it: an existing one, or a new one made by `register(lo, hi)` for the union of the range
    /// with every live registration of the same owner it overlaps or touches.
    pub(crate) fn get_or_register(
        &mut self,
        owner: usize,
        start: u64,
        end: u64,
        register: impl FnOnce(u64, u64) -> Result<Arc<R>>,
    ) -> Result<(Arc<R>, u64)> {
        // Covered: a live entry of this owner that starts at or before `start` and ends at or
        // after `end`.
        for (&s, e) in self.entries.range(..=start).rev() {
            if e.owner == owner && e.end >= end {
                if let Some(r) = e.region.upgrade() {
                    self.stats.hits += 1;
                    return Ok((r, start - s));
                }
            }
        }
        // Dead entries are forgotten (their registrations are gone).
        self.entries.retain(|_, e| e.region.strong_count() > 0);
        let touching: Vec<u64> = self
            .entries
            .range(..=end)
            .filter(|(_, e)| e.owner == owner && e.end >= start)
            .map(|(&s, _)| s)
            .collect();
        let (mut lo, mut hi) = (start, end);
        for s in &touching {
            lo = lo.min(*s);
            hi = hi.max(self.entries[s].end);
        }
        let region = register(lo, hi)?;
        self.stats.registrations += 1;
        if !touching.is_empty() {
            self.stats.merged += 1;
        }
        for s in touching {
            self.entries.remove(&s);
        }
        self.entries.insert(
            lo,
            Entry {
                end: hi,
                owner,
                region: Arc::downgrade(&region),
            },
        );
        Ok((region, start - lo))
    }
}

/// The registrations of one GPU range, one per rail (rail 0 first).
pub(crate) type GpuRails = Vec<Arc<GpuMemoryRegion>>;

/// The GPU registration cache of an agent: an entry is the range registered on every rail.
pub(crate) type RegistrationCache = RangeCache<GpuRails>;

impl RegistrationCache {
    /// Registrations (one per rail's protection domain in `pds`) covering
    /// `offset..offset + len` of the device memory `memory` holds, and the offset of that range
    /// in them. The memory's identity is its owner's address (`Arc::as_ptr`), which cannot be
    /// reused while a registration of it lives (the registration holds the owner).
    pub(crate) fn register_gpu<M: DeviceMemory + Send + Sync + 'static>(
        &mut self,
        pds: &[Arc<ProtectionDomain>],
        memory: &Arc<M>,
        offset: usize,
        len: usize,
        access: AccessFlags,
        path: RegistrationPath,
    ) -> Result<(Arc<GpuRails>, usize)> {
        let base = memory.device_ptr();
        let start = base + offset as u64;
        let (region, at) = self.get_or_register(
            Arc::as_ptr(memory) as *const () as usize,
            start,
            start + len as u64,
            |lo, hi| {
                let range = (lo - base) as usize..(hi - base) as usize;
                let rails = pds
                    .iter()
                    .map(|pd| register_one(pd, memory, range.clone(), access, path))
                    .collect::<gdr::Result<GpuRails>>()?;
                Ok(Arc::new(rails))
            },
        )?;
        Ok((region, at as usize))
    }
}

/// One registration of `range` of `memory`: gdr's own buffers keep their typed owner (the
/// region's `buffer()`), any other owner is held as it is.
fn register_one<M: DeviceMemory + Send + Sync + 'static>(
    pd: &Arc<ProtectionDomain>,
    memory: &Arc<M>,
    range: std::ops::Range<usize>,
    access: AccessFlags,
    path: RegistrationPath,
) -> gdr::Result<Arc<GpuMemoryRegion>> {
    match (memory.clone() as Arc<dyn std::any::Any + Send + Sync>).downcast::<DeviceBuffer>() {
        Ok(buffer) => GpuMemoryRegion::register(pd, buffer, range, access, path),
        Err(_) => GpuMemoryRegion::register_owned(pd, memory.clone(), range, access, path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake registration: the range it covers.
    #[derive(Debug, PartialEq)]
    struct Reg(u64, u64);

    fn reg(c: &mut RangeCache<Reg>, owner: usize, s: u64, e: u64) -> (Arc<Reg>, u64) {
        c.get_or_register(owner, s, e, |lo, hi| Ok(Arc::new(Reg(lo, hi))))
            .unwrap()
    }

    #[test]
    fn sub_ranges_of_one_registration_cost_no_registration() {
        let mut c = RangeCache::default();
        let (whole, at) = reg(&mut c, 1, 0x1000, 0x1000 + (4 << 30));
        assert_eq!(at, 0);
        // 1,265 tensors inside it: every one a hit, the offsets right.
        let size = (4u64 << 30) / 1265;
        for i in 0..1265u64 {
            let (r, at) = reg(&mut c, 1, 0x1000 + i * size, 0x1000 + (i + 1) * size);
            assert!(Arc::ptr_eq(&r, &whole));
            assert_eq!(at, i * size);
        }
        assert_eq!(
            c.stats,
            CacheStats {
                hits: 1265,
                registrations: 1,
                merged: 0
            }
        );
    }

    #[test]
    fn overlapping_and_adjacent_ranges_get_one_union() {
        let mut c = RangeCache::default();
        let (a, _) = reg(&mut c, 1, 100, 200);
        let (b, at) = reg(&mut c, 1, 150, 300); // overlaps a
        assert_eq!(*b, Reg(100, 300));
        assert_eq!(at, 50);
        let (d, _) = reg(&mut c, 1, 300, 400); // touches b
        assert_eq!(*d, Reg(100, 400));
        // a and b live on for their holders; new lookups get the union.
        assert_eq!(*a, Reg(100, 200));
        let (e, at) = reg(&mut c, 1, 120, 130);
        assert!(Arc::ptr_eq(&e, &d));
        assert_eq!(at, 20);
        assert_eq!(c.stats.merged, 2);
        assert_eq!(c.stats.registrations, 3);
    }

    #[test]
    fn different_allocations_never_merge_and_dead_ones_are_forgotten() {
        let mut c = RangeCache::default();
        let (a, _) = reg(&mut c, 1, 100, 200);
        let (b, _) = reg(&mut c, 2, 150, 250);
        assert_eq!(*b, Reg(150, 250), "another owner's range is not merged");
        assert!(!Arc::ptr_eq(&a, &b));
        // Dropping every holder ends the registration: the next lookup registers again.
        drop(a);
        let (a2, _) = reg(&mut c, 1, 120, 180);
        assert_eq!(*a2, Reg(120, 180));
        assert_eq!(c.stats.registrations, 3);
        assert_eq!(c.stats.hits, 0);
    }

    #[test]
    fn a_failed_registration_changes_nothing() {
        let mut c: RangeCache<Reg> = RangeCache::default();
        let (a, _) = reg(&mut c, 1, 100, 200);
        let e = c.get_or_register(1, 150, 300, |_, _| Err(crate::Error::invalid("no", "test")));
        assert!(e.is_err());
        let (again, _) = reg(&mut c, 1, 110, 190);
        assert!(Arc::ptr_eq(&again, &a), "the old entry is still there");
        assert_eq!(c.stats.registrations, 1);
    }
}
