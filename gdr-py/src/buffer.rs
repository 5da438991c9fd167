//! Taking a Python object's memory for registration through the buffer protocol.
//!
//! gdr takes the buffer export itself (`PyObject_GetBuffer`, in the stable ABI since Python
//! 3.11) into a `Py_buffer` that this module owns, out of Python's reach: no Python object
//! stands for it, so no Python code can end it (`memoryview.release()` worked on the
//! `memoryview` an earlier version held, and `gc.get_objects()` found that view). While the
//! export lasts, exporters that could move or free their memory refuse to (`BufferError`): a
//! `bytearray` or `array.array` resized, an `mmap` closed or resized, a `memoryview` released.
//!
//! Some objects only borrow their memory from another object: a numpy array's `.base` (an
//! array, a `memoryview`, an `mmap`), a `memoryview`'s `.obj`. gdr follows that chain and takes
//! an export of every link that has the buffer protocol, so the owner cannot let the memory go
//! either (`np.frombuffer(b).base.release()` and then `b` resized would otherwise free the
//! registered memory). numpy counts no buffer exports when it resizes an array with
//! `refcheck=False`, but it refuses to resize an array that has a weak reference: gdr holds one
//! to every numpy array of the chain.
//!
//! Only plain data is registrable: a peer may write any byte of a segment, so a buffer whose
//! items are Python objects (numpy's `O` dtype, struct format `O`) or pointers (`P`, `&`) would
//! hand a peer the process's object pointers. The export's format is parsed (PEP 3118's struct
//! syntax) and anything but numbers, characters, bytes, padding and structs of them is refused
//! with `NotPlainData`.

use std::ffi::CStr;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyMemoryView, PyModule};

use crate::errors::invalid;
use crate::release::Held;

/// How many links of `.base` / `.obj` gdr follows from the registered object to its owner.
const MAX_CHAIN: usize = 32;

/// One buffer export, held in memory gdr owns. Released only through [`Export::release`],
/// under the GIL; dropped without that, the export is kept for the rest of the process (the
/// memory stays: safe, only leaked).
struct Export {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the `Py_buffer` is a plain C struct (pointers into the exporter's memory and a strong
// reference to the exporter); gdr reads it only while taking it and releases it only under the
// GIL (`Export::release` takes a `Python` token), from whichever thread holds the value then.
// No thread reads it concurrently: the value is moved, never shared.
unsafe impl Send for Export {}

impl Export {
    /// Takes an export of `obj` with `flags`, or raises the exporter's error.
    fn take(obj: &Bound<'_, PyAny>, flags: std::os::raw::c_int) -> PyResult<Export> {
        let mut view = Box::new(ffi::Py_buffer::new());
        // SAFETY: `obj` is a live object (the GIL is held: `Bound`), `view` points to a zeroed
        // `Py_buffer` that lives in its box (its address never changes while exported).
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(Export { view })
    }

    /// Gives the export back (the exporter may move its memory again) and drops the reference
    /// to the exporter it held.
    fn release(mut self, _py: Python<'_>) {
        // SAFETY: the GIL is held (the token); `view` was filled by a successful
        // `PyObject_GetBuffer` and is released exactly once (`self` is consumed).
        unsafe { ffi::PyBuffer_Release(&mut *self.view) };
    }
}

/// What a registration holds of a Python object through the buffer protocol: the registered
/// object's export, the exports of the objects it borrows its memory from, and weak references
/// that keep numpy from resizing arrays of that chain.
pub(crate) struct HeldBuffer {
    exports: Vec<Export>,
    weak: Vec<Py<PyAny>>,
}

impl Held for HeldBuffer {
    fn release(self: Box<Self>, py: Python<'_>) {
        let HeldBuffer { exports, weak } = *self;
        // The registered object's export first, then its owners'.
        for e in exports {
            e.release(py);
        }
        drop(weak);
    }
}

/// A writable, C-contiguous buffer export of plain data.
pub(crate) struct Exported {
    /// Address of its first byte.
    pub(crate) ptr: *mut u8,
    /// Its length in bytes (non-zero).
    pub(crate) len: usize,
    /// What keeps it (the exports and the object references).
    pub(crate) held: HeldBuffer,
}

/// Exports `obj`'s buffer for registration: `None` when `obj` does not export the buffer
/// protocol at all.
///
/// # Errors
/// `ReadOnlyBuffer`, `NotContiguous`, `NotPlainData`, `InvalidArgument` for an empty buffer;
/// the exporter's own errors.
pub(crate) fn try_export(obj: &Bound<'_, PyAny>) -> PyResult<Option<Exported>> {
    let py = obj.py();
    // SAFETY: `obj` is a live object and the GIL is held.
    if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 0 {
        return Ok(None);
    }
    // The most any exporter can give (strides, suboffsets, format): what it is is checked
    // below, so that each refusal has its own error.
    let export = Export::take(obj, ffi::PyBUF_FULL_RO)?;
    let (ptr, len) = match checked(&export.view, obj) {
        Ok(v) => v,
        Err(e) => {
            export.release(py);
            return Err(e);
        }
    };
    let mut held = HeldBuffer {
        exports: vec![export],
        weak: Vec::new(),
    };
    hold_owners(obj, &mut held);
    Ok(Some(Exported { ptr, len, held }))
}

/// Follows `obj`'s chain of owners (a numpy array's `.base`, a `memoryview`'s `.obj`), taking
/// an export of each owner that has the buffer protocol and a weak reference to each numpy
/// array, `obj` included. Best effort: a link that refuses either is left as it is (its own
/// exporter's rules still hold).
fn hold_owners(obj: &Bound<'_, PyAny>, held: &mut HeldBuffer) {
    let py = obj.py();
    let ndarray = numpy_array_type(py);
    let weakref = PyModule::import(py, "weakref").and_then(|m| m.getattr("ref"));
    let mut cur = obj.clone();
    for _ in 0..MAX_CHAIN {
        let is_array = ndarray
            .as_ref()
            .is_some_and(|t| cur.is_instance(t).unwrap_or(false));
        let next = if is_array {
            if let Ok(Ok(w)) = weakref.as_ref().map(|r| r.call1((&cur,))) {
                held.weak.push(w.unbind());
            }
            cur.getattr("base").ok()
        } else if cur.is_instance_of::<PyMemoryView>() {
            cur.getattr("obj").ok()
        } else {
            None
        };
        let Some(next) = next.filter(|n| !n.is_none()) else {
            return;
        };
        // SAFETY: `next` is a live object and the GIL is held.
        if unsafe { ffi::PyObject_CheckBuffer(next.as_ptr()) } != 0 {
            match Export::take(&next, ffi::PyBUF_FULL_RO) {
                Ok(e) => held.exports.push(e),
                Err(e) => {
                    log::debug!("gdr-py: an owner of a registered buffer refused an export: {e}")
                }
            }
        }
        cur = next;
    }
}

/// numpy's `ndarray` type when numpy is loaded (never imported by gdr itself).
fn numpy_array_type(py: Python<'_>) -> Option<Bound<'_, PyAny>> {
    let modules = PyModule::import(py, "sys").ok()?.getattr("modules").ok()?;
    let numpy = modules.get_item("numpy").ok()?;
    numpy.getattr("ndarray").ok()
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

/// The address and length of the export, once it is known to be writable, C-contiguous, of
/// plain data and not empty.
fn checked(view: &ffi::Py_buffer, obj: &Bound<'_, PyAny>) -> PyResult<(*mut u8, usize)> {
    if view.readonly != 0 {
        return Err(invalid(
            "ReadOnlyBuffer",
            format!("the {} object's buffer is read-only", type_name(obj)),
            "peers may write any segment and READs write into it: register writable memory (a bytearray, a writable numpy array), not bytes or a read-only view",
        ));
    }
    // SAFETY: `view` was filled by a successful `PyObject_GetBuffer` and is still held.
    let contiguous =
        view.suboffsets.is_null() && unsafe { ffi::PyBuffer_IsContiguous(view, b'C' as _) } != 0;
    if !contiguous {
        return Err(invalid(
            "NotContiguous",
            format!("the {} object's buffer is not C-contiguous", type_name(obj)),
            "register the whole array (or numpy.ascontiguousarray of it), not a strided view",
        ));
    }
    // A NULL format means unsigned bytes ("B").
    let format = if view.format.is_null() {
        b"B".as_slice()
    } else {
        // SAFETY: a non-NULL format of a held export is a NUL-terminated string the exporter
        // keeps until the export is released.
        unsafe { CStr::from_ptr(view.format) }.to_bytes()
    };
    if !plain_format(format) {
        return Err(invalid(
            "NotPlainData",
            format!(
                "the {} object's items (format {:?}) are not plain data",
                type_name(obj),
                String::from_utf8_lossy(format)
            ),
            "peers may write any byte of a segment: register numbers, bytes or structs of them, never Python objects (numpy dtype=object) or pointers",
        ));
    }
    let len = usize::try_from(view.len).unwrap_or(0);
    if len == 0 || view.buf.is_null() {
        return Err(invalid(
            "InvalidArgument",
            format!("the {} object's buffer is empty", type_name(obj)),
            "register at least one byte",
        ));
    }
    Ok((view.buf.cast(), len))
}

/// Whether a buffer format (the `struct` module's syntax with PEP 3118's additions) describes
/// plain data only: numbers, characters, bytes, padding, and structs and sub-arrays of them.
/// Python objects (`O`), pointers (`P`, `&`), function pointers and anything not understood
/// are refused.
pub(crate) fn plain_format(format: &[u8]) -> bool {
    let mut depth = 0usize;
    let mut i = 0;
    while i < format.len() {
        match format[i] {
            // Byte order, sizes and alignment: any of them, anywhere between items.
            b'@' | b'=' | b'<' | b'>' | b'!' | b'^' => {}
            // Repeat counts and sub-array shapes: "(2,3)f".
            b'0'..=b'9' | b'(' | b')' | b',' | b' ' => {}
            // Plain items: padding, chars, ints, bool, floats, long double, bytes, pascal
            // strings, UCS-2/UCS-4 characters.
            b'x' | b'c' | b'b' | b'B' | b'?' | b'h' | b'H' | b'i' | b'I' | b'l' | b'L' | b'q'
            | b'Q' | b'n' | b'N' | b'e' | b'f' | b'd' | b'g' | b's' | b'p' | b'u' | b'w' => {}
            // Complex numbers: "Zf", "Zd", "Zg".
            b'Z' => match format.get(i + 1) {
                Some(b'f' | b'd' | b'g') => i += 1,
                _ => return false,
            },
            // A struct: "T{...}".
            b'T' => {
                if format.get(i + 1) != Some(&b'{') || depth >= 64 {
                    return false;
                }
                depth += 1;
                i += 1;
            }
            b'}' => {
                if depth == 0 {
                    return false;
                }
                depth -= 1;
            }
            // A field name: ":name:".
            b':' => match format[i + 1..].iter().position(|&c| c == b':') {
                Some(n) => i += n + 1,
                None => return false,
            },
            _ => return false,
        }
        i += 1;
    }
    depth == 0
}

/// The Python type name of `obj`, for messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}
