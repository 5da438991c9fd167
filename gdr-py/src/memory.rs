//! Which memory a Python object offers for registration, and how gdr takes it: the buffer
//! protocol for host memory that exports it (numpy arrays, bytearrays, mmaps), DLPack for
//! everything else (CUDA tensors of torch, cupy or jax; CPU tensors without the buffer
//! protocol, such as torch's).

use pyo3::prelude::*;

use crate::buffer::{not_a_buffer, try_export};
use crate::dlpack::{self, DEVICE_CPU, DEVICE_CUDA, DEVICE_CUDA_MANAGED};
use crate::release::Held;

/// A Python object's memory, taken for registration: held (the object referenced, its export
/// open) until `held` is released.
pub(crate) struct Taken {
    /// Address of the first byte: a host address, or a CUDA device address for `Cuda`.
    pub(crate) addr: u64,
    /// Length in bytes (non-zero).
    pub(crate) len: usize,
    /// Where it lives.
    pub(crate) kind: Kind,
    /// How it was taken: `"buffer"` (the buffer protocol), `"dlpack"` or `"dlpack 1.0"`
    /// (a versioned capsule).
    pub(crate) protocol: &'static str,
    /// The device as DLPack names it (`"cpu"`, `"cuda:0"`, `"cuda_host"`, ...).
    pub(crate) device: String,
    /// What keeps it.
    pub(crate) held: Box<dyn Held>,
}

/// Where taken memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Host memory (including CUDA's pinned host memory).
    Host,
    /// CUDA memory (device or managed: gdr's pointer checks tell them apart).
    Cuda,
}

/// Takes `obj`'s memory: through DLPack when it lives on a GPU, else through the buffer
/// protocol, else through DLPack again (host tensors without the buffer protocol).
///
/// # Errors
/// `NotABuffer` for an object with neither protocol; the refusals of the buffer and DLPack
/// paths (`ReadOnlyBuffer`, `NotContiguous`, `InvalidArgument`).
pub(crate) fn take(obj: &Bound<'_, PyAny>) -> PyResult<Taken> {
    let device = dlpack::device_of(obj)?;
    // GPU memory (or another accelerator's, which the import refuses by name).
    if device.is_some_and(|(t, _)| t != DEVICE_CPU) {
        return from_dlpack(obj);
    }
    if let Some(e) = try_export(obj)? {
        return Ok(Taken {
            addr: e.ptr as u64,
            len: e.len,
            kind: Kind::Host,
            protocol: "buffer",
            device: "cpu".into(),
            held: Box::new(e.held),
        });
    }
    if device.is_some() {
        return from_dlpack(obj);
    }
    Err(not_a_buffer(obj))
}

fn from_dlpack(obj: &Bound<'_, PyAny>) -> PyResult<Taken> {
    let t = dlpack::import(obj)?;
    let kind = match t.device_type {
        DEVICE_CUDA | DEVICE_CUDA_MANAGED => Kind::Cuda,
        _ => Kind::Host,
    };
    Ok(Taken {
        addr: t.addr,
        len: t.len,
        kind,
        protocol: if t.versioned { "dlpack 1.0" } else { "dlpack" },
        device: t.device_text(),
        held: Box::new(t.held),
    })
}
