//! Segments: registered memory an agent reads from, writes into, and publishes to its peers.
//!
//! A segment is a byte range of a registration, with an id peers use to address it, an optional
//! name and a [`Location`]. Several segments may share one registration (the registration cache,
//! [`crate::cache`], and [`Agent::register_within`](crate::Agent::register_within)): a segment
//! holds its registration alive, and so does every request in flight that uses it, so memory is
//! deregistered only after the last transfer that used it completed (or its queue pair was
//! destroyed, after which the NIC cannot touch it).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gdr::gpu_mr::GpuMemoryRegion;
use gdr::mr::{LocalSlice, MemoryRegion};

use crate::error::{Error, Result};
use crate::staged_memory::{SegmentPath, StagedMemory};
use crate::wire::SegmentInfo;
use gdr_xfer_proto::{Location, SegmentId};

/// The registrations under a segment: one per rail of the agent (rail 0 first), all of the
/// same memory at the same address.
#[derive(Clone)]
pub(crate) enum Backing {
    /// Host memory the first registration owns (the others are `register_again` of it).
    Host(Arc<Vec<Arc<MemoryRegion>>>),
    /// GPU memory registered for each rail's NIC.
    Gpu(Arc<Vec<Arc<GpuMemoryRegion>>>),
    /// GPU memory the NIC cannot reach: staged through bounce buffers ([`crate::staging`]).
    Staged(Arc<StagedMemory>),
}

pub(crate) struct SegmentInner {
    pub(crate) info: SegmentInfo,
    /// The segment's bytes as a local slice, per rail: holds the registrations alive, and
    /// every slice a transfer posts on a rail is cut from that rail's. Empty for a staged
    /// segment (never posted from: its transfers post from bounce buffers).
    pub(crate) whole: Vec<LocalSlice>,
    /// Offset of the segment's byte 0 in its registration.
    pub(crate) base: usize,
    pub(crate) backing: Backing,
    /// The agent that registered it (its number in the process).
    pub(crate) agent: u64,
    /// The rails transfers from it stripe over (bit per rail), ranked once at registration
    /// from where its memory lives ([`crate::rail::preferred_rails`]): no transfer asks again.
    pub(crate) rail_mask: u32,
    /// Cleared when its agent deregisters it: new transfers from it are refused.
    pub(crate) registered: AtomicBool,
}

impl SegmentInner {
    pub(crate) fn is_staged(&self) -> bool {
        matches!(self.backing, Backing::Staged(_))
    }

    pub(crate) fn is_registered(&self) -> bool {
        self.registered.load(Ordering::Acquire)
    }

    pub(crate) fn set_deregistered(&self) {
        self.registered.store(false, Ordering::Release);
    }
}

/// A registered segment of local memory. Cheap to clone (all clones are the same segment).
///
/// Peers address it by [`id`](Segment::id) (or look it up by [`name`](Segment::name)). It stays
/// registered until [`Agent::deregister`](crate::Agent::deregister) and every transfer using it
/// finished.
#[derive(Clone)]
pub struct Segment {
    pub(crate) inner: Arc<SegmentInner>,
}

impl fmt::Debug for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner.info;
        f.debug_struct("Segment")
            .field("id", &i.id)
            .field("name", &i.name)
            .field("len", &i.len)
            .field("location", &i.location)
            .finish()
    }
}

impl Segment {
    /// Whether `other` is a handle of this very segment (not another registration under the
    /// same id).
    pub(crate) fn is(&self, other: &Segment) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn new(
        info: SegmentInfo,
        backing: Backing,
        base: usize,
        agent: u64,
        rail_mask: u32,
    ) -> Result<Segment> {
        let end = base + info.len as usize;
        let whole = match &backing {
            Backing::Host(m) => m
                .iter()
                .map(|r| r.slice(base..end))
                .collect::<gdr::Result<Vec<_>>>()?,
            Backing::Gpu(m) => m
                .iter()
                .map(|r| r.slice(base..end))
                .collect::<gdr::Result<Vec<_>>>()?,
            Backing::Staged(m) => {
                if end > m.device.len() {
                    return Err(Error::invalid(
                        format!(
                            "staged segment {base}..{end} outside its {} bytes",
                            m.device.len()
                        ),
                        "stay inside the memory",
                    ));
                }
                Vec::new()
            }
        };
        Ok(Segment {
            inner: Arc::new(SegmentInner {
                info,
                whole,
                base,
                backing,
                agent,
                rail_mask,
                registered: AtomicBool::new(true),
            }),
        })
    }

    /// How the NIC reaches its memory: host memory, GPUDirect (and which registration path), or
    /// staged through host bounce buffers (with the line that says how).
    pub fn path(&self) -> SegmentPath {
        match &self.inner.backing {
            Backing::Host(_) => SegmentPath::Host,
            Backing::Gpu(m) => SegmentPath::GpuDirect(m[0].path()),
            Backing::Staged(m) => SegmentPath::Staged(m.describe.clone()),
        }
    }

    /// Whether peers can address it: every segment but a staged one (the NIC cannot reach
    /// that memory, so it is only ever the local side of transfers, and never announced).
    pub fn is_published(&self) -> bool {
        !self.inner.is_staged()
    }

    /// The id peers address it by (unique in this agent, never reused).
    pub fn id(&self) -> SegmentId {
        self.inner.info.id
    }

    /// Its name (empty when registered without one).
    pub fn name(&self) -> &str {
        &self.inner.info.name
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.inner.info.len
    }

    /// Whether it is empty (never true: empty segments are refused).
    pub fn is_empty(&self) -> bool {
        self.inner.info.len == 0
    }

    /// Where its memory lives.
    pub fn location(&self) -> Location {
        self.inner.info.location
    }

    /// What peers see of it.
    pub fn info(&self) -> &SegmentInfo {
        &self.inner.info
    }

    /// Whether two segments share one registration (one `ibv_reg_mr`).
    pub fn shares_registration_with(&self, other: &Segment) -> bool {
        match (&self.inner.backing, &other.inner.backing) {
            (Backing::Host(a), Backing::Host(b)) => Arc::ptr_eq(a, b),
            (Backing::Gpu(a), Backing::Gpu(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// A weak reference to the registration, to observe when it is released (tests, leak
    /// checks): it upgrades while the segment or any request in flight still uses it.
    pub fn registration_weak(&self) -> RegistrationWeak {
        match &self.inner.backing {
            Backing::Host(m) => RegistrationWeak {
                host: m.iter().map(Arc::downgrade).collect(),
                gpu: Vec::new(),
                staged: Vec::new(),
            },
            Backing::Gpu(m) => RegistrationWeak {
                host: Vec::new(),
                gpu: m.iter().map(Arc::downgrade).collect(),
                staged: Vec::new(),
            },
            Backing::Staged(m) => RegistrationWeak {
                host: Vec::new(),
                gpu: Vec::new(),
                staged: vec![Arc::downgrade(m)],
            },
        }
    }

    fn check_range(&self, offset: u64, len: usize) -> Result<usize> {
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        offset
            .checked_add(len)
            .filter(|&end| end <= self.len())
            .map(|_| self.inner.base + offset as usize)
            .ok_or_else(|| Error::OutOfSegment {
                index: None,
                side: crate::side::Side::Local,
                segment: self.id(),
                offset,
                len,
                segment_len: self.len(),
                hint: "stay inside the segment: offset + len must be at most Segment::len".into(),
            })
    }

    /// Copies bytes out of the segment, starting at `offset`. For GPU memory, RDMA writes that
    /// completed are made visible first (`flush_rdma_writes`), then the bytes are copied with
    /// the CUDA driver.
    ///
    /// # Errors
    /// [`Error::OutOfSegment`] for a range outside the segment; gdr's errors from the copy.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let at = self.check_range(offset, out.len())?;
        match &self.inner.backing {
            Backing::Host(m) => Ok(m[0].read(at, out)?),
            Backing::Gpu(m) => {
                let m = &m[0];
                m.flush_rdma_writes()?;
                let buf = m.buffer().ok_or_else(|| {
                    Error::invalid(
                        "GPU segment without a DeviceBuffer",
                        "register a DeviceBuffer",
                    )
                })?;
                let region_start = (m.device_ptr() - buf.device_ptr()) as usize;
                Ok(buf.copy_to_host(region_start + at, out)?)
            }
            Backing::Staged(m) => m.device.read(at, out),
        }
    }

    /// The segment's bytes `offset..offset + len`, copied (see [`Segment::read`]).
    ///
    /// # Errors
    /// As [`Segment::read`].
    /// The range is checked against the segment before anything is allocated, and the
    /// allocation itself is fallible: a length no segment has is [`Error::OutOfSegment`], never
    /// a panic or an abort.
    ///
    /// # Errors
    /// As [`Segment::read`]; [`Error::Io`] (`OutOfMemory`) when the process cannot allocate
    /// the copy of a range that does lie inside the segment.
    pub fn to_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.check_range(offset, len)?;
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|e| {
            Error::io(
                format!(
                    "allocating {len} bytes for a copy of segment {} at offset {offset} ({e}): read it in smaller ranges (Segment::read into your own buffer)",
                    self.id()
                ),
                std::io::ErrorKind::OutOfMemory.into(),
            )
        })?;
        v.resize(len, 0);
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// Copies `data` into the segment at `offset` (host memory: word-wise atomic stores; GPU
    /// memory: a CUDA copy).
    ///
    /// # Errors
    /// [`Error::OutOfSegment`] for a range outside the segment; gdr's errors from the copy.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let at = self.check_range(offset, data.len())?;
        match &self.inner.backing {
            Backing::Host(m) => Ok(m[0].write(at, data)?),
            Backing::Gpu(m) => {
                let m = &m[0];
                let buf = m.buffer().ok_or_else(|| {
                    Error::invalid(
                        "GPU segment without a DeviceBuffer",
                        "register a DeviceBuffer",
                    )
                })?;
                let region_start = (m.device_ptr() - buf.device_ptr()) as usize;
                Ok(buf.copy_from_host(region_start + at, data)?)
            }
            Backing::Staged(m) => m.device.write(at, data),
        }
    }
}

/// Weak references to a segment's registrations, one per rail
/// ([`Segment::registration_weak`]).
#[derive(Debug, Clone)]
pub struct RegistrationWeak {
    host: Vec<std::sync::Weak<MemoryRegion>>,
    gpu: Vec<std::sync::Weak<GpuMemoryRegion>>,
    /// A staged segment's device memory and bounce assignment.
    staged: Vec<std::sync::Weak<StagedMemory>>,
}

impl RegistrationWeak {
    /// Whether a registration still exists on any rail (something still holds it).
    pub fn is_alive(&self) -> bool {
        self.host.iter().any(|w| w.strong_count() > 0)
            || self.gpu.iter().any(|w| w.strong_count() > 0)
            || self.staged.iter().any(|w| w.strong_count() > 0)
    }

    /// Rails whose registration still exists.
    pub fn alive_rails(&self) -> usize {
        self.host.iter().filter(|w| w.strong_count() > 0).count()
            + self.gpu.iter().filter(|w| w.strong_count() > 0).count()
            + self.staged.iter().filter(|w| w.strong_count() > 0).count()
    }
}

/// A staged segment of `len` bytes on an emulated GPU, for unit tests that need a segment and
/// no device.
#[cfg(all(test, feature = "emulated-gpu"))]
pub(crate) fn emulated_segment(id: u32, name: &str, len: usize) -> Segment {
    use crate::staged_memory::StagedDevice;
    use crate::staging::EmulatedGpu;
    let info = SegmentInfo {
        id: SegmentId::new(id),
        name: name.into(),
        addr: 0,
        len: len as u64,
        rkeys: Vec::new(),
        location: Location::Cuda { ordinal: 0 },
    };
    let m = StagedMemory {
        device: StagedDevice::Emulated(EmulatedGpu::new(0, len)),
        bounce: 0,
        describe: String::new(),
    };
    Segment::new(info, Backing::Staged(Arc::new(m)), 0, 1, u32::MAX).expect("a valid segment")
}

#[cfg(all(test, feature = "emulated-gpu"))]
mod tests {
    use super::*;

    /// A 4 KiB segment on an emulated GPU (a staged segment: no device needed).
    fn segment() -> Segment {
        emulated_segment(7, "s", 4096)
    }

    fn out_of_segment(r: Result<impl std::fmt::Debug>, offset: u64, len: u64) {
        match r {
            Err(Error::OutOfSegment {
                offset: o,
                len: l,
                segment_len: 4096,
                segment,
                ..
            }) => {
                assert_eq!((o, l), (offset, len));
                assert_eq!(segment, SegmentId::new(7));
            }
            other => panic!("{offset}..+{len}: expected OutOfSegment, got {other:?}"),
        }
    }

    #[test]
    fn lying_sizes_are_out_of_segment_before_anything_is_allocated() {
        let s = segment();
        // Each of these panicked (capacity overflow) or aborted the process (SIGABRT) when the
        // copy was allocated before the range was checked.
        out_of_segment(s.to_vec(0, usize::MAX), 0, u64::MAX);
        out_of_segment(s.to_vec(0, 1 << 40), 0, 1 << 40);
        out_of_segment(s.to_vec(u64::MAX, 1), u64::MAX, 1);
        out_of_segment(s.to_vec(4096, 1), 4096, 1);
        out_of_segment(s.to_vec(1, 4096), 1, 4096);
        out_of_segment(s.write(u64::MAX, b"x"), u64::MAX, 1);
        out_of_segment(s.write(4095, b"xy"), 4095, 2);
        let mut buf = [0u8; 2];
        out_of_segment(s.read(u64::MAX - 1, &mut buf), u64::MAX - 1, 2);
        // What lies inside works, to the last byte; an empty range at the end too.
        s.write(4095, b"z").unwrap();
        assert_eq!(s.to_vec(4095, 1).unwrap(), b"z");
        assert_eq!(s.to_vec(0, 4096).unwrap().len(), 4096);
        assert!(s.to_vec(4096, 0).unwrap().is_empty());
    }
}
