//! `gdr.Segment`: registered local memory.

use gdr_xfer::gdr::gpu_mr::RegistrationPath;
use gdr_xfer::{Segment, SegmentPath};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::args::{bytes, u64_arg};
use crate::errors::{invalid, to_py};

/// A registered segment of this agent's memory (from `Agent.register` or `Agent.alloc`).
///
/// Peers address it by `id` or find it by `name`. It stays registered until
/// `Agent.deregister(segment)`; its memory (and, for `Agent.register`, the Python object it was
/// registered from) is released once it is deregistered, this handle is gone, and no request
/// in flight uses it any more.
#[pyclass(module = "gdr._gdr", name = "Segment", frozen)]
pub(crate) struct PySegment {
    pub(crate) seg: Segment,
}

#[pymethods]
impl PySegment {
    /// The id peers address it by (unique in its agent, never reused).
    #[getter]
    fn id(&self) -> u32 {
        self.seg.id().get()
    }

    /// Its name (empty when registered without one).
    #[getter]
    fn name(&self) -> String {
        self.seg.name().to_owned()
    }

    /// Its length in bytes.
    #[getter]
    fn length(&self) -> u64 {
        self.seg.len()
    }

    /// Where its memory lives: `"cpu"`, `"cpu:N"` (NUMA node N) or `"cuda:N"`.
    #[getter]
    fn location(&self) -> String {
        self.seg.location().to_string()
    }

    /// How the NIC reaches it: `"host"`, `"gpudirect-dmabuf"`, `"gpudirect-peermem"`, or
    /// `"staged: ..."` with the reason.
    #[getter]
    fn path(&self) -> String {
        match self.seg.path() {
            SegmentPath::Host => "host".into(),
            SegmentPath::GpuDirect(RegistrationPath::DmaBuf) => "gpudirect-dmabuf".into(),
            SegmentPath::GpuDirect(RegistrationPath::PeerMemory) => "gpudirect-peermem".into(),
            SegmentPath::GpuDirect(_) => "gpudirect".into(),
            SegmentPath::Staged(why) => format!("staged: {why}"),
            // `SegmentPath` is `#[non_exhaustive]`.
            _ => "other".into(),
        }
    }

    /// Copies `length` bytes at `offset` out of the segment.
    ///
    /// Raises `OutOfSegment` for a range outside it.
    fn read(
        &self,
        py: Python<'_>,
        offset: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyBytes>> {
        let offset = u64_arg(offset, "offset")?;
        let length = u64_arg(length, "length")?;
        let fits = offset
            .checked_add(length)
            .is_some_and(|end| end <= self.seg.len());
        let len = usize::try_from(length)
            .ok()
            .filter(|_| fits)
            .ok_or_else(|| {
                invalid(
                    "OutOfSegment",
                    format!(
                        "range {offset}..+{length} lies outside segment {} ({} bytes)",
                        self.seg.id(),
                        self.seg.len()
                    ),
                    "stay inside the segment",
                )
            })?;
        let seg = &self.seg;
        // Read straight into the new bytes object (no Python code sees it before it is
        // filled), the GIL released meanwhile; Python's allocation failing raises MemoryError.
        let mut failed = None;
        let out = PyBytes::new_with(py, len, |buf| {
            if let Err(e) = py.allow_threads(|| seg.read(offset, buf)) {
                failed = Some(e);
            }
            Ok(())
        })?;
        match failed {
            Some(e) => Err(to_py(e)),
            None => Ok(out.unbind()),
        }
    }

    /// Copies `data` (bytes, bytearray, str or any buffer) into the segment at `offset`.
    ///
    /// Raises `OutOfSegment` for a range outside it.
    fn write(
        &self,
        py: Python<'_>,
        offset: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let offset = u64_arg(offset, "offset")?;
        let data = bytes(data, "data")?;
        let seg = &self.seg;
        py.allow_threads(|| seg.write(offset, &data)).map_err(to_py)
    }

    fn __len__(&self) -> usize {
        usize::try_from(self.seg.len()).unwrap_or(usize::MAX)
    }

    fn __repr__(&self) -> String {
        format!(
            "Segment(id={}, name={:?}, length={}, location={:?}, path={:?})",
            self.seg.id(),
            self.seg.name(),
            self.seg.len(),
            self.seg.location().to_string(),
            self.path()
        )
    }
}
