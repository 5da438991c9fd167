//! Host memory that the engine treats as GPU memory without GPUDirect (feature
//! `emulated-gpu`): staged transfers, tested where there is no GPU.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::staging::pipeline::CopyEngine;
use crate::staging::slots::SlotRegions;

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

/// The emulated copy engine: each copy is done when issued, between the emulated memory and a
/// bounce slot's region (through the region's atomic copies).
pub(crate) struct HostCopies {
    pub(crate) slots: Arc<SlotRegions>,
}

impl CopyEngine for HostCopies {
    type Device = Arc<EmulatedGpu>;
    type Copy = ();

    fn device_len(dev: &Arc<EmulatedGpu>) -> usize {
        dev.len()
    }

    fn to_bounce(
        &mut self,
        dev: &Arc<EmulatedGpu>,
        dev_offset: usize,
        bounce_offset: usize,
        len: usize,
    ) -> Result<()> {
        let (region, at) = self.slots.locate(bounce_offset)?;
        let bytes = dev.lock();
        let r = dev.range("copy to the bounce buffer", dev_offset, len, bytes.len())?;
        Ok(region.write(at, &bytes[r])?)
    }

    fn to_device(
        &mut self,
        bounce_offset: usize,
        dev: &Arc<EmulatedGpu>,
        dev_offset: usize,
        len: usize,
    ) -> Result<()> {
        let (region, at) = self.slots.locate(bounce_offset)?;
        let mut bytes = dev.lock();
        let r = dev.range("copy from the bounce buffer", dev_offset, len, bytes.len())?;
        Ok(region.read(at, &mut bytes[r])?)
    }

    fn is_complete(&mut self, _copy: &mut ()) -> Result<bool> {
        Ok(true)
    }

    fn wait(&mut self, _copy: &mut ()) -> Result<()> {
        Ok(())
    }

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
