//! Taking a Python object's memory for registration through the buffer protocol.
//!
//! The wheel uses CPython's stable ABI from 3.9 on, whose limited API has no
//! `PyObject_GetBuffer` before 3.11; so the export is a `memoryview` of the object (in the
//! stable ABI), and its address is read through `ctypes` (`c_char.from_buffer`, which also
//! checks that the buffer is writable and C-contiguous). Holding the `memoryview` holds both a
//! reference to the object and its buffer export: the object stays alive, and exporters that
//! could move their memory (a `bytearray` resized, a numpy array resized, an `mmap` closed)
//! refuse to while the export lasts (`BufferError`).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyModule;

use crate::errors::invalid;
use crate::release::Held;

/// A `memoryview` holding a registered object's buffer export (and a reference to it).
pub(crate) struct HeldView(pub(crate) Py<PyAny>);

impl Held for HeldView {
    fn release(self: Box<Self>, py: Python<'_>) {
        let view = self.0.into_bound(py);
        // `memoryview.release()` gives the export back at once (a bytearray may be resized
        // again); then the reference goes, and with the last one the object and its memory.
        if let Err(e) = view.call_method0("release") {
            e.write_unraisable(py, Some(&view));
        }
    }
}

/// A writable, C-contiguous buffer export of a Python object.
pub(crate) struct Exported {
    /// Address of its first byte.
    pub(crate) ptr: *mut u8,
    /// Its length in bytes (non-zero).
    pub(crate) len: usize,
    /// The `memoryview` holding the export (and a reference to the object).
    pub(crate) view: Py<PyAny>,
}

/// Exports `obj`'s buffer for registration: `None` when `obj` does not export the buffer
/// protocol at all.
///
/// # Errors
/// `ReadOnlyBuffer`, `NotContiguous`, `InvalidArgument` for an empty buffer; Python's own
/// errors from `memoryview` and `ctypes`.
pub(crate) fn try_export(obj: &Bound<'_, PyAny>) -> PyResult<Option<Exported>> {
    let py = obj.py();
    let builtins = PyModule::import(py, "builtins")?;
    let view = match builtins.getattr("memoryview")?.call1((obj,)) {
        Ok(v) => v,
        Err(e) if e.is_instance_of::<PyTypeError>(py) => return Ok(None),
        Err(e) => return Err(e),
    };
    match checked(py, &view, obj) {
        Ok((ptr, len)) => Ok(Some(Exported {
            ptr,
            len,
            view: view.unbind(),
        })),
        Err(e) => {
            // Give the export back now rather than whenever the view is collected.
            let _ = view.call_method0("release");
            Err(e)
        }
    }
}

/// The error for an object that exports neither the buffer protocol nor DLPack.
pub(crate) fn not_a_buffer(obj: &Bound<'_, PyAny>) -> PyErr {
    invalid(
        "NotABuffer",
        format!(
            "a {} object exports neither the buffer protocol nor DLPack",
            type_name(obj)
        ),
        "register a torch tensor, a numpy or cupy array, a bytearray, an mmap or another writable buffer",
    )
}

/// The address and length of `view`'s buffer, once it is known to be writable, C-contiguous
/// and not empty.
fn checked(
    py: Python<'_>,
    view: &Bound<'_, PyAny>,
    obj: &Bound<'_, PyAny>,
) -> PyResult<(*mut u8, usize)> {
    if view.getattr("readonly")?.extract::<bool>()? {
        return Err(invalid(
            "ReadOnlyBuffer",
            format!("the {} object's buffer is read-only", type_name(obj)),
            "peers may write any segment and READs write into it: register writable memory (a bytearray, a writable numpy array), not bytes or a read-only view",
        ));
    }
    if !view.getattr("c_contiguous")?.extract::<bool>()? {
        return Err(invalid(
            "NotContiguous",
            format!("the {} object's buffer is not C-contiguous", type_name(obj)),
            "register the whole array (or numpy.ascontiguousarray of it), not a strided view",
        ));
    }
    let len: usize = view.getattr("nbytes")?.extract()?;
    if len == 0 {
        return Err(invalid(
            "InvalidArgument",
            format!("the {} object's buffer is empty", type_name(obj)),
            "register at least one byte",
        ));
    }
    let ctypes = PyModule::import(py, "ctypes")?;
    let first = ctypes
        .getattr("c_char")?
        .call_method1("from_buffer", (view,))?;
    let addr: usize = ctypes.getattr("addressof")?.call1((&first,))?.extract()?;
    // `first` holds an export of the view: gone with it, here.
    drop(first);
    Ok((addr as *mut u8, len))
}

/// The Python type name of `obj`, for messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}
