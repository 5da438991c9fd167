//! The registration cache for GPU memory, keyed by device address range.
//!
//! Registering a range of a [`DeviceBuffer`] that an earlier registration of the same buffer
//! covers reuses that registration: no verbs call, no pinning. A range that overlaps or touches
//! earlier registrations without being covered gets one registration of the union (the earlier
//! ones live on while their segments or in-flight requests hold them; the cache then hands out
//! the union). The cache holds registrations weakly: when the last segment and request using
//! one are gone, it is deregistered and its memory unpinned.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use gdr::cuda::DeviceBuffer;
use gdr::gpu_mr::{GpuMemoryRegion, RegistrationPath};
use gdr::mr::AccessFlags;
use gdr::pd::ProtectionDomain;

use crate::error::Result;

struct Entry {
    /// End of the registered device address range (exclusive).
    end: u64,
    /// The buffer it belongs to (identity only: ranges of different allocations never merge).
    buffer: *const DeviceBuffer,
    region: Weak<GpuMemoryRegion>,
}

// SAFETY: `buffer` is only compared, never dereferenced.
unsafe impl Send for Entry {}

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

/// GPU registrations by device address (start of the range -> entry).
#[derive(Default)]
pub(crate) struct RegistrationCache {
    entries: BTreeMap<u64, Entry>,
    pub(crate) stats: CacheStats,
}

impl RegistrationCache {
    /// A registration covering `offset..offset + len` of `buffer`, and the offset of that range
    /// in it.
    pub(crate) fn get_or_register(
        &mut self,
        pd: &Arc<ProtectionDomain>,
        buffer: &Arc<DeviceBuffer>,
        offset: usize,
        len: usize,
        access: AccessFlags,
        path: RegistrationPath,
    ) -> Result<(Arc<GpuMemoryRegion>, usize)> {
        let id = Arc::as_ptr(buffer);
        let start = buffer.device_ptr() + offset as u64;
        let end = start + len as u64;
        self.entries.retain(|_, e| e.region.strong_count() > 0);
        // Covered: an entry of this buffer that starts at or before `start` and ends at or after
        // `end`.
        for (&s, e) in self.entries.range(..=start).rev() {
            if e.buffer == id && e.end >= end {
                if let Some(r) = e.region.upgrade() {
                    self.stats.hits += 1;
                    return Ok((r, (start - s) as usize));
                }
            }
        }
        // Not covered: register the union with every overlapping or adjacent entry of the buffer.
        let touching: Vec<u64> = self
            .entries
            .iter()
            .filter(|(&s, e)| e.buffer == id && s <= end && e.end >= start)
            .map(|(&s, _)| s)
            .collect();
        let mut lo = start;
        let mut hi = end;
        for s in &touching {
            lo = lo.min(*s);
            hi = hi.max(self.entries[s].end);
        }
        let base = buffer.device_ptr();
        let region = GpuMemoryRegion::register(
            pd,
            buffer.clone(),
            (lo - base) as usize..(hi - base) as usize,
            access,
            path,
        )?;
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
                buffer: id,
                region: Arc::downgrade(&region),
            },
        );
        Ok((region, (start - lo) as usize))
    }
}
