//! `gdr._staged_read_for_test` / `gdr._staged_write_for_test`: gdr's staging copies on a Python
//! object's CUDA memory, without an agent. A segment staged because its GPU memory has no
//! direct path moves its bytes with these copies (gdr-xfer's `Stager`, through pinned bounce
//! buffers) and reads or writes it synchronously with `gdr::cuda::copy_to_host_from` /
//! `copy_from_host_into`; the GPU machine has no RDMA device, so its tier checks them here, on
//! torch and cupy tensors taken through DLPack as `Agent.register` takes them.

use std::sync::Arc;

use gdr_xfer::gdr;
use gdr_xfer::gdr::cuda::{DeviceMemory, ForeignDeviceMemory};
use gdr_xfer::staging::{Outcome, Stager, StagingConfig};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::args::bytes;
use crate::errors::{invalid, to_py};
use crate::memory::{self, Kind, Taken};

/// The CUDA memory of `obj` taken as `Agent.register` takes it, checked by gdr's pointer checks,
/// and handed to `f` as a [`ForeignDeviceMemory`] with its GPU's ordinal. The export is given
/// back once `f` returned and the memory value (with every clone) is gone.
fn with_cuda<T: Send>(
    obj: &Bound<'_, PyAny>,
    f: impl FnOnce(&Arc<ForeignDeviceMemory>, i32) -> gdr_xfer::Result<T> + Send,
) -> PyResult<T> {
    let py = obj.py();
    let taken: Taken = memory::take(obj)?;
    if taken.kind != Kind::Cuda {
        let device = taken.device.clone();
        taken.held.release(py);
        return Err(invalid(
            "InvalidArgument",
            format!("the object's memory is on {device}, not a CUDA GPU"),
            "pass a CUDA tensor",
        ));
    }
    let (addr, len) = (taken.addr, taken.len);
    let result = py.allow_threads(|| -> gdr_xfer::Result<T> {
        let range = gdr::gpu_mr::check_gpu_range(addr, len)?;
        // SAFETY: `taken.held` keeps the exporter's memory (`addr..addr + len`, one live CUDA
        // allocation: checked just above) allocated until it is released below, which is after
        // this closure returned, and so after `memory` and every clone of it (the stager's,
        // dropped with it inside `f`) are gone; the release closure does nothing.
        let memory = Arc::new(unsafe { ForeignDeviceMemory::new(addr, len, || {}) });
        let out = f(&memory, range.gpu.ordinal);
        drop(memory);
        out
    });
    taken.held.release(py);
    result.map_err(to_py)
}

/// The bytes of a CUDA tensor read twice: through gdr's staging pipeline (a `Stager` of the
/// default configuration: pinned bounce buffers, `cuMemcpyAsync` chunk by chunk) and with the
/// synchronous copy staged segments use for `Segment.read`. For the GPU tier's tests.
#[pyfunction]
pub(crate) fn _staged_read_for_test<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let (piped, sync) = with_cuda(obj, |memory, ordinal| {
        let len = memory.len();
        let mut piped = vec![0u8; len];
        let mut stager = Stager::new(ordinal, StagingConfig::default())?;
        let outcome = stager.copy_d2h_pipelined(memory, 0..len, |at, chunk| {
            piped[at..at + chunk.len()].copy_from_slice(chunk);
            Ok(())
        })?;
        completed(outcome)?;
        drop(stager);
        let mut sync = vec![0u8; len];
        gdr::cuda::copy_to_host_from(&**memory, ordinal, 0, &mut sync)?;
        Ok((piped, sync))
    })?;
    Ok((PyBytes::new(py, &piped), PyBytes::new(py, &sync)))
}

/// Writes `data` (as long as the tensor) into a CUDA tensor through gdr's staging pipeline,
/// host to device. For the GPU tier's tests.
#[pyfunction]
pub(crate) fn _staged_write_for_test(
    obj: &Bound<'_, PyAny>,
    data: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let data = bytes(data, "data")?;
    with_cuda(obj, |memory, ordinal| {
        let len = memory.len();
        if data.len() != len {
            return Err(gdr_xfer::Error::invalid(
                format!("{} bytes of data for a tensor of {len}", data.len()),
                "pass exactly the tensor's length",
            ));
        }
        let mut stager = Stager::new(ordinal, StagingConfig::default())?;
        let outcome = stager.copy_h2d_pipelined(memory, 0..len, |at, chunk| {
            let n = chunk.len();
            chunk.copy_from_slice(&data[at..at + n]);
            Ok(())
        })?;
        completed(outcome)
    })
}

/// An error unless the staged copy moved every byte.
fn completed(outcome: Outcome) -> gdr_xfer::Result<()> {
    if outcome.is_completed() {
        Ok(())
    } else {
        Err(gdr_xfer::Error::invalid(
            format!("the staged copy ended {outcome:?}"),
            "see the log for the copy that failed",
        ))
    }
}
