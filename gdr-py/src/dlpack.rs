//! Taking a tensor's memory through DLPack (`__dlpack__`): torch, cupy, jax and numpy tensors,
//! on the CPU or a CUDA GPU.
//!
//! The exporter hands over a capsule holding a `DLManagedTensor` (or, for exporters that know
//! DLPack 1.0 and are asked with `max_version=(1, 0)`, a `DLManagedTensorVersioned`). The
//! consumer takes ownership by renaming the capsule to `used_dltensor[_versioned]` and must
//! call the tensor's `deleter` exactly once when done: until then the exporter keeps the memory
//! allocated and in place (DLPack's contract). gdr holds the managed tensor (and a reference to
//! the exporting object) in the segment's release closure, so the memory outlives every request
//! that uses it; the deleter runs on gdr's release thread under the GIL.
//!
//! Layout of the C structs: dlpack.h (`DLTensor`, `DLManagedTensor`,
//! `DLManagedTensorVersioned`, ABI version 1).

use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::buffer::type_name;
use crate::errors::invalid;
use crate::release::Held;

/// `kDLCPU`.
pub(crate) const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`: memory of a CUDA device (`cudaMalloc`, a caching allocator).
pub(crate) const DEVICE_CUDA: i32 = 2;
/// `kDLCUDAHost`: pinned host memory (`cudaMallocHost`).
pub(crate) const DEVICE_CUDA_HOST: i32 = 3;
/// `kDLCUDAManaged`: managed (unified) memory (`cudaMallocManaged`).
pub(crate) const DEVICE_CUDA_MANAGED: i32 = 13;

/// `DLPACK_FLAG_BITMASK_READ_ONLY` of `DLManagedTensorVersioned::flags`.
const FLAG_READ_ONLY: u64 = 1;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

const NAME: &CStr = c"dltensor";
const USED_NAME: &CStr = c"used_dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";
const USED_NAME_VERSIONED: &CStr = c"used_dltensor_versioned";

/// A managed tensor gdr took from its capsule: it owns the exporter's promise until dropped,
/// when the deleter runs (once).
enum Managed {
    Legacy(NonNull<DLManagedTensor>),
    Versioned(NonNull<DLManagedTensorVersioned>),
}

/// What keeps a DLPack export's memory: the managed tensor (its deleter runs on drop) and a
/// reference to the exporting object.
pub(crate) struct HeldTensor {
    managed: Managed,
    /// The exporter (a torch tensor, a numpy array): kept so that Python sees it referenced.
    _obj: Py<PyAny>,
}

// SAFETY: the managed tensor is owned by this value alone (its capsule was renamed "used_", so
// nothing else calls its deleter), and DLPack lets the deleter run on any thread: exporters
// that need the GIL take it themselves (numpy's deleter calls PyGILState_Ensure). gdr drops it
// on its release thread, with the GIL held anyway.
unsafe impl Send for HeldTensor {}

impl Drop for HeldTensor {
    fn drop(&mut self) {
        match self.managed {
            Managed::Legacy(p) => {
                // SAFETY: `p` came from a valid "dltensor" capsule, which gdr renamed to take
                // ownership; this is the only call of its deleter (drop runs once).
                if let Some(deleter) = unsafe { (*p.as_ptr()).deleter } {
                    // SAFETY: as above; DLPack's deleter takes the managed tensor itself.
                    unsafe { deleter(p.as_ptr()) }
                }
            }
            Managed::Versioned(p) => {
                // SAFETY: as for the legacy struct, for a "dltensor_versioned" capsule.
                if let Some(deleter) = unsafe { (*p.as_ptr()).deleter } {
                    // SAFETY: as above.
                    unsafe { deleter(p.as_ptr()) }
                }
            }
        }
    }
}

impl Held for HeldTensor {
    fn release(self: Box<Self>, _py: Python<'_>) {
        drop(self);
    }
}

/// A tensor's memory, taken through DLPack.
pub(crate) struct Imported {
    /// `kDLCPU`, `kDLCUDA`, `kDLCUDAHost` or `kDLCUDAManaged`.
    pub(crate) device_type: i32,
    /// The device's ordinal (0 for the CPU).
    pub(crate) device_id: i32,
    /// Address of the first byte (a host address, or a CUDA device address).
    pub(crate) addr: u64,
    /// Length in bytes (non-zero).
    pub(crate) len: usize,
    /// `max_version=(1, 0)` was understood (a versioned capsule).
    pub(crate) versioned: bool,
    /// What keeps the memory (the deleter runs when it is dropped).
    pub(crate) held: HeldTensor,
}

impl Imported {
    /// `"cpu"`, `"cuda:N"`, `"cuda_host"` or `"cuda_managed:N"`.
    pub(crate) fn device_text(&self) -> String {
        device_text(self.device_type, self.device_id)
    }
}

/// The device a DLPack device pair names, as text.
pub(crate) fn device_text(device_type: i32, device_id: i32) -> String {
    match device_type {
        DEVICE_CPU => "cpu".into(),
        DEVICE_CUDA => format!("cuda:{device_id}"),
        DEVICE_CUDA_HOST => "cuda_host".into(),
        DEVICE_CUDA_MANAGED => format!("cuda_managed:{device_id}"),
        t => format!("dlpack device type {t}:{device_id}"),
    }
}

/// `obj.__dlpack_device__()`: `None` when the object does not speak DLPack.
pub(crate) fn device_of(obj: &Bound<'_, PyAny>) -> PyResult<Option<(i32, i32)>> {
    if !obj.hasattr("__dlpack_device__")? || !obj.hasattr("__dlpack__")? {
        return Ok(None);
    }
    let pair = obj.call_method0("__dlpack_device__")?;
    // The device type is an IntEnum in most exporters: take it as an int.
    let (t, id): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair.extract()?;
    Ok(Some((t.extract()?, id.extract()?)))
}

/// Takes `obj`'s memory through `__dlpack__`.
///
/// # Errors
/// `ReadOnlyBuffer` for a tensor flagged read-only, `NotContiguous` for strides that are not
/// row-major compact, `InvalidArgument` for an empty tensor, sub-byte sizes, a device gdr does
/// not register or a capsule that is not DLPack's; the exporter's own errors from `__dlpack__`
/// (numpy raises `BufferError` for a read-only array).
pub(crate) fn import(obj: &Bound<'_, PyAny>) -> PyResult<Imported> {
    let py = obj.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("max_version", (1, 0))?;
    let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
        Ok(c) => c,
        // An exporter older than DLPack 1.0 takes no `max_version`.
        Err(e) if e.is_instance_of::<PyTypeError>(py) => obj.call_method0("__dlpack__")?,
        Err(e) => return Err(e),
    };
    let cap = capsule.as_ptr();
    let (managed, name_used) = if capsule_named(&capsule, NAME_VERSIONED) {
        // SAFETY: a valid capsule of that name (checked): its pointer is the exporter's
        // DLManagedTensorVersioned, non-null (PyCapsule_IsValid checks that too).
        let p = unsafe { pyo3::ffi::PyCapsule_GetPointer(cap, NAME_VERSIONED.as_ptr()) };
        (
            NonNull::new(p.cast()).map(Managed::Versioned),
            USED_NAME_VERSIONED,
        )
    } else if capsule_named(&capsule, NAME) {
        // SAFETY: as above, for a DLManagedTensor.
        let p = unsafe { pyo3::ffi::PyCapsule_GetPointer(cap, NAME.as_ptr()) };
        (NonNull::new(p.cast()).map(Managed::Legacy), USED_NAME)
    } else {
        (None, USED_NAME)
    };
    let Some(managed) = managed else {
        return Err(invalid(
            "InvalidArgument",
            format!(
                "{}.__dlpack__() returned something that is not an unused DLPack capsule",
                type_name(obj)
            ),
            "pass a tensor or array whose __dlpack__ follows the DLPack protocol",
        ));
    };
    // Taking ownership: the capsule's destructor no longer calls the deleter; `held` does.
    // SAFETY: `cap` is a valid capsule; the new name is a 'static C string (the capsule keeps
    // the pointer).
    if unsafe { pyo3::ffi::PyCapsule_SetName(cap, name_used.as_ptr()) } != 0 {
        return Err(PyErr::fetch(py));
    }
    let held = HeldTensor {
        managed,
        _obj: obj.clone().unbind(),
    };
    // From here on, every early return drops `held`, which calls the deleter.
    let (tensor, read_only, versioned): (&DLTensor, bool, bool) = match held.managed {
        Managed::Legacy(p) => {
            // SAFETY: the exporter's managed tensor, valid until its deleter runs (when `held`
            // drops, after this borrow).
            let m = unsafe { &*p.as_ptr() };
            (&m.dl_tensor, false, false)
        }
        Managed::Versioned(p) => {
            // SAFETY: as above.
            let m = unsafe { &*p.as_ptr() };
            if m.version.major != 1 {
                return Err(invalid(
                    "InvalidArgument",
                    format!(
                        "{}.__dlpack__ returned DLPack ABI {}.{} (gdr reads 1.x)",
                        type_name(obj),
                        m.version.major,
                        m.version.minor
                    ),
                    "upgrade gdr, or export with an older DLPack version",
                ));
            }
            (&m.dl_tensor, m.flags & FLAG_READ_ONLY != 0, true)
        }
    };
    let (device_type, device_id) = (tensor.device.device_type, tensor.device.device_id);
    if read_only {
        return Err(invalid(
            "ReadOnlyBuffer",
            format!(
                "the {} object is exported read-only (DLPack)",
                type_name(obj)
            ),
            "peers may write any segment and READs write into it: register writable memory",
        ));
    }
    if !matches!(
        device_type,
        DEVICE_CPU | DEVICE_CUDA | DEVICE_CUDA_HOST | DEVICE_CUDA_MANAGED
    ) {
        return Err(invalid(
            "InvalidArgument",
            format!(
                "the {} object lives on {}, which gdr does not register",
                type_name(obj),
                device_text(device_type, device_id)
            ),
            "register CPU or CUDA memory",
        ));
    }
    let len = byte_length(tensor).map_err(|(class, what)| {
        invalid(
            class,
            format!("the {} object (DLPack) {what}", type_name(obj)),
            match class {
                "NotContiguous" => {
                    "register a contiguous tensor (.contiguous()), not a strided view"
                }
                _ => "register a non-empty tensor of whole bytes",
            },
        )
    })?;
    let addr = (tensor.data as u64)
        .checked_add(tensor.byte_offset)
        .filter(|a| *a != 0 && a.checked_add(len as u64).is_some())
        .ok_or_else(|| {
            invalid(
                "InvalidArgument",
                format!(
                    "the {} object's DLPack data pointer {:p} + byte_offset {} is not an address",
                    type_name(obj),
                    tensor.data,
                    tensor.byte_offset
                ),
                "pass a tensor with allocated memory",
            )
        })?;
    Ok(Imported {
        device_type,
        device_id,
        addr,
        len,
        versioned,
        held,
    })
}

/// Whether `obj` is a capsule named `name` with a non-null pointer.
fn capsule_named(obj: &Bound<'_, PyAny>, name: &CStr) -> bool {
    // SAFETY: `obj` is a live object (the borrow holds it); PyCapsule_IsValid accepts any
    // object and only compares the capsule's name, without setting an exception.
    unsafe { pyo3::ffi::PyCapsule_IsValid(obj.as_ptr(), name.as_ptr()) == 1 }
}

/// The length in bytes of a compact row-major tensor, or which check it failed.
fn byte_length(t: &DLTensor) -> Result<usize, (&'static str, String)> {
    let ndim =
        usize::try_from(t.ndim).map_err(|_| ("InvalidArgument", format!("has ndim {}", t.ndim)))?;
    let dims: &[i64] = if ndim == 0 {
        &[]
    } else if t.shape.is_null() {
        return Err(("InvalidArgument", "has no shape".into()));
    } else {
        // SAFETY: DLTensor's contract: `shape` points to `ndim` dimensions, valid while the
        // managed tensor lives (the caller's borrow).
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let mut elements: u64 = 1;
    for &d in dims {
        let d = u64::try_from(d).map_err(|_| ("InvalidArgument", format!("has shape {dims:?}")))?;
        elements = elements
            .checked_mul(d)
            .ok_or_else(|| ("InvalidArgument", format!("has shape {dims:?} (overflows)")))?;
    }
    if elements == 0 {
        return Err(("InvalidArgument", "is empty".into()));
    }
    if !t.strides.is_null() && ndim > 0 {
        // SAFETY: as for `shape`: `strides` holds `ndim` entries when not null.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut expected: i64 = 1;
        for (&d, &s) in dims.iter().zip(strides).rev() {
            // A dimension of one element may have any stride.
            if d != 1 && s != expected {
                return Err((
                    "NotContiguous",
                    format!("has strides {strides:?} for shape {dims:?}"),
                ));
            }
            expected = expected.saturating_mul(d);
        }
    }
    let bits = u64::from(t.dtype.bits) * u64::from(t.dtype.lanes);
    let total = elements
        .checked_mul(bits)
        .ok_or_else(|| ("InvalidArgument", format!("has shape {dims:?} (overflows)")))?;
    if total == 0 {
        return Err(("InvalidArgument", "is empty".into()));
    }
    if total % 8 != 0 {
        return Err((
            "InvalidArgument",
            format!("holds {total} bits, not whole bytes"),
        ));
    }
    usize::try_from(total / 8)
        .map_err(|_| ("InvalidArgument", format!("has shape {dims:?} (overflows)")))
}
