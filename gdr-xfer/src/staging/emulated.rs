//! Host memory that the engine treats as GPU memory without GPUDirect (feature
//! `emulated-gpu`): staged transfers, tested where there is no GPU. Its copies run on a thread
//! of their own, in issue order, as a CUDA stream's do.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::pipeline::BounceViews;
use super::slots::SlotRegions;
use crate::error::{Error, Result};
use gdr_xfer_proto::staging::CopyEngine;

/// Memory of an emulated GPU without GPUDirect: plain host bytes that
/// [`Agent::register_emulated_gpu`](crate::Agent::register_emulated_gpu) registers as a
/// *staged* segment, so every transfer from or to it takes the staging path (bounce buffers,
/// chunked copies, children) exactly as GPU memory without a direct path does; the copies are
/// `memcpy`s instead of `cuMemcpyAsync`. For testing applications and the engine on machines
/// without a GPU (feature `emulated-gpu`).
pub struct EmulatedGpu {
    ordinal: u32,
    bytes: Mutex<Vec<u8>>,
}

impl std::fmt::Debug for EmulatedGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatedGpu")
            .field("ordinal", &self.ordinal)
            .field("len", &self.len())
            .finish()
    }
}

impl EmulatedGpu {
    /// `len` zeroed bytes of emulated GPU `ordinal` (the ordinal only keys its bounce buffers).
    pub fn new(ordinal: u32, len: usize) -> Arc<EmulatedGpu> {
        Arc::new(EmulatedGpu {
            ordinal,
            bytes: Mutex::new(vec![0; len]),
        })
    }

    /// Its ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Vec<u8>> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn range(
        &self,
        what: &str,
        at: usize,
        len: usize,
        limit: usize,
    ) -> Result<std::ops::Range<usize>> {
        match at.checked_add(len) {
            Some(end) if end <= limit => Ok(at..end),
            _ => Err(Error::invalid(
                format!("EmulatedGpu::{what}: {at}..+{len} lies outside its {limit} bytes"),
                "stay inside the memory",
            )),
        }
    }

    /// Copies bytes out, from `at`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the memory.
    pub fn read(&self, at: usize, out: &mut [u8]) -> Result<()> {
        let bytes = self.lock();
        let r = self.range("read", at, out.len(), bytes.len())?;
        out.copy_from_slice(&bytes[r]);
        Ok(())
    }

    /// Copies `data` in, at `at`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the memory.
    pub fn write(&self, at: usize, data: &[u8]) -> Result<()> {
        let mut bytes = self.lock();
        let r = self.range("write", at, data.len(), bytes.len())?;
        bytes[r].copy_from_slice(data);
        Ok(())
    }
}

/// One copy for the emulated copy engine's thread.
struct CopyJob {
    to_bounce: bool,
    dev: Arc<EmulatedGpu>,
    dev_range: std::ops::Range<usize>,
    region: Arc<gdr::mr::MemoryRegion>,
    at: usize,
    done: Arc<AtomicBool>,
}

impl CopyJob {
    fn run(self) {
        let CopyJob {
            to_bounce,
            dev,
            dev_range,
            region,
            at,
            done,
        } = self;
        {
            let mut bytes = dev.lock();
            // Both ranges were checked when the copy was issued.
            let r = if to_bounce {
                region.write(at, &bytes[dev_range])
            } else {
                region.read(at, &mut bytes[dev_range])
            };
            if let Err(e) = r {
                log::error!("emulated GPU copy: {e}");
            }
        }
        // What the copy held goes before it is seen complete (as a CUDA copy's handle lets go
        // once the copy is known done), so a finished ticket leaves nothing held.
        drop(dev);
        drop(region);
        done.store(true, Ordering::Release);
    }
}

/// The emulated copy engine: a thread that performs the copies in issue order (as a CUDA
/// stream does), between the emulated memory and a bounce slot's region (through the region's
/// atomic copies), so that the staging driver never waits for a copy.
pub(crate) struct HostCopies {
    slots: Arc<SlotRegions>,
    jobs: Option<mpsc::Sender<CopyJob>>,
    thread: Option<JoinHandle<()>>,
}

impl HostCopies {
    pub(crate) fn new(slots: Arc<SlotRegions>) -> Result<HostCopies> {
        let (tx, rx) = mpsc::channel::<CopyJob>();
        let thread = std::thread::Builder::new()
            .name("xfer-emulated-copies".into())
            .spawn(move || {
                for job in rx {
                    job.run();
                }
            })
            .map_err(|e| Error::io("starting the emulated copy thread", e))?;
        Ok(HostCopies {
            slots,
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    fn issue(
        &mut self,
        to_bounce: bool,
        dev: &Arc<EmulatedGpu>,
        dev_offset: usize,
        bounce_offset: usize,
        len: usize,
    ) -> Result<Arc<AtomicBool>> {
        let (region, at) = self.slots.locate(bounce_offset)?;
        let dev_range = dev.range("copy", dev_offset, len, dev.len())?;
        if at + len > self.slots.chunk_size {
            return Err(Error::invalid(
                format!("emulated GPU copy of {len} bytes at {at} of a bounce buffer"),
                "a chunk lies inside its bounce buffer",
            ));
        }
        let done = Arc::new(AtomicBool::new(false));
        let job = CopyJob {
            to_bounce,
            dev: dev.clone(),
            dev_range,
            region: region.clone(),
            at,
            done: done.clone(),
        };
        self.jobs
            .as_ref()
            .and_then(|tx| tx.send(job).ok())
            .ok_or_else(|| {
                Error::invalid("the emulated copy thread is gone", "restart the agent")
            })?;
        Ok(done)
    }
}

impl Drop for HostCopies {
    fn drop(&mut self) {
        // The thread ends after the copies queued (which hold what they use).
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl CopyEngine for HostCopies {
    type Error = Error;
    type Device = Arc<EmulatedGpu>;
    type Copy = Arc<AtomicBool>;

    fn device_len(dev: &Arc<EmulatedGpu>) -> usize {
        dev.len()
    }

    fn to_bounce(
        &mut self,
        dev: &Arc<EmulatedGpu>,
        dev_offset: usize,
        bounce_offset: usize,
        len: usize,
    ) -> Result<Arc<AtomicBool>> {
        self.issue(true, dev, dev_offset, bounce_offset, len)
    }

    fn to_device(
        &mut self,
        bounce_offset: usize,
        dev: &Arc<EmulatedGpu>,
        dev_offset: usize,
        len: usize,
    ) -> Result<Arc<AtomicBool>> {
        self.issue(false, dev, dev_offset, bounce_offset, len)
    }

    fn is_complete(&mut self, copy: &mut Arc<AtomicBool>) -> Result<bool> {
        Ok(copy.load(Ordering::Acquire))
    }

    fn wait(&mut self, copy: &mut Arc<AtomicBool>) -> Result<()> {
        while !copy.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        Ok(())
    }
}

impl BounceViews for HostCopies {
    unsafe fn bounce(&self, _offset: usize, _len: usize) -> Option<&[u8]> {
        None
    }

    unsafe fn bounce_mut(&self, _offset: usize, _len: usize) -> Option<&mut [u8]> {
        None
    }

    unsafe fn read_bounce(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let (region, at) = self.slots.locate(offset)?;
        Ok(region.read(at, out)?)
    }

    unsafe fn write_bounce(&self, offset: usize, data: &[u8]) -> Result<()> {
        let (region, at) = self.slots.locate(offset)?;
        Ok(region.write(at, data)?)
    }
}

#[cfg(test)]
mod tests {
    use super::EmulatedGpu;

    #[test]
    fn emulated_memory_checks_every_range() {
        let g = EmulatedGpu::new(3, 100);
        assert_eq!((g.ordinal(), g.len(), g.is_empty()), (3, 100, false));
        g.write(90, &[7; 10]).unwrap();
        let mut out = [0u8; 12];
        g.read(89, &mut out).unwrap_err();
        g.read(88, &mut out).unwrap();
        let mut ok = [0u8; 10];
        g.read(90, &mut ok).unwrap();
        assert_eq!(ok, [7; 10]);
        assert!(g.write(usize::MAX, &[1]).is_err(), "overflowing offset");
        assert!(g.read(101, &mut []).is_err());
        g.read(100, &mut []).unwrap();
    }
}
