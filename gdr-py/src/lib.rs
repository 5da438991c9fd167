//! # gdr-py: gdr's transfer engine for Python
//!
//! The native module `gdr._gdr` of the Python package `gdr` (built with maturin into one abi3
//! wheel for CPython >= 3.11): [`gdr_xfer`]'s agents, peers, segments and transfers as Python
//! classes. What it adds to the Rust API:
//!
//! * **Python memory, kept alive by its segment.** `Agent.register(obj, name)` takes CUDA
//!   tensors through DLPack (`src/dlpack.rs`: torch, cupy, jax) into gdr's pointer checks and
//!   GPU registration ([`ForeignDeviceMemory`], staged without a direct path), and host memory
//!   through the buffer protocol (numpy arrays, bytearrays, mmaps) or DLPack (`src/memory.rs`
//!   chooses); the segment holds the object and its export through gdr's
//!   [`ForeignHostMemory`] or [`ForeignDeviceMemory`], whose release closure hands them back to
//!   Python only once the segment is deregistered, its handle is gone and no request in flight
//!   uses it (`src/release.rs`). `del tensor` during a transfer is harmless.
//!   `gdr.inspect_memory(obj)` (`src/inspect.rs`) says what gdr would register and how the NIC
//!   would reach it, without an agent; `gdr.doctor()` (`src/doctor.rs`) is the doctor's report.
//! * **The GIL released** around every call into the engine; blocking waits (`Transfer.wait`,
//!   `Agent.wait_notification`, `Peer.wait_segment`, `Agent.wait_peer`, `Agent.connect`,
//!   `Agent.connect_named`) wait in slices of 100 ms and run Python's signal handlers between
//!   them, so Ctrl-C interrupts them.
//! * **asyncio**: `await transfer`, `async for note in agent.notifications()`,
//!   `await agent.wait_peer_async(name)`, `await peer.wait_segment_async(name)`,
//!   `await agent.connect_async(addr)` and `await agent.connect_named_async(directory, name)`,
//!   completed by one thread of this module that polls the engine's futures (`src/aio.rs`):
//!   the event loop never blocks, no thread waits per transfer, and no engine thread takes the
//!   GIL. A transfer of more than 64 KiB submitted on an event loop's thread is checked and
//!   queued there and posted by another thread of this module (`src/post.rs`): a software
//!   NIC does the NIC's work inside the post call.
//! * **Peers found by name through etcd**: `gdr.Directory` (gdr-xfer's `EtcdDirectory`),
//!   `Agent.publish` and `Agent.connect_named` (`src/directory.rs`).
//! * **Exceptions by variant**: every [`gdr_xfer::Error`] becomes the Python class of its
//!   variant, with its fields as attributes (`src/errors.rs`, `gdr/_errors.py`).
//!
//! No engine thread ever takes the GIL: the only Python work they cause (dropping a registered
//! object, completing an asyncio future) is queued for this module's own threads.
//!
//! [`ForeignHostMemory`]: gdr_xfer::gdr::mr::ForeignHostMemory
//! [`ForeignDeviceMemory`]: gdr_xfer::gdr::cuda::ForeignDeviceMemory

#![deny(missing_docs)]
#![warn(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod agent;
mod aio;
mod args;
mod buffer;
mod directory;
mod dlpack;
mod doctor;
mod errors;
mod inspect;
mod lists;
mod memory;
mod peer;
mod post;
mod release;
mod segment;
mod staging_check;
mod transfer;

use pyo3::prelude::*;

/// The exception of variant `class` (a class name of `gdr._errors`), as the engine's error of
/// that variant converts: for the host tests of the mapping. `None` for an unknown name.
#[pyfunction]
fn _error_for_test(py: Python<'_>, class: &str) -> Option<PyObject> {
    errors::sample(py, class).map(|e| e.into_value(py).into_any())
}

/// The native module `gdr._gdr`; the package `gdr` re-exports it with the exception classes.
#[pymodule]
fn _gdr(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The engine logs through `log`: RUST_LOG=gdr_xfer=debug shows it on stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = env_logger::try_init();
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("WRITE", "write")?;
    m.add("READ", "read")?;
    m.add_class::<agent::PyAgent>()?;
    m.add_class::<agent::PyNotification>()?;
    m.add_class::<agent::PyNotificationStream>()?;
    m.add_class::<directory::PyDirectory>()?;
    m.add("DEFAULT_PREFIX", gdr_xfer::directory::DEFAULT_PREFIX)?;
    m.add_class::<peer::PyPeer>()?;
    m.add_class::<peer::PyRemoteSegment>()?;
    m.add_class::<segment::PySegment>()?;
    m.add_class::<lists::PyLocalList>()?;
    m.add_class::<lists::PyRemoteList>()?;
    m.add_class::<transfer::PyTransfer>()?;
    m.add_function(wrap_pyfunction!(inspect::inspect_memory, m)?)?;
    m.add_function(wrap_pyfunction!(doctor::doctor, m)?)?;
    m.add_function(wrap_pyfunction!(_error_for_test, m)?)?;
    m.add_function(wrap_pyfunction!(staging_check::_staged_read_for_test, m)?)?;
    m.add_function(wrap_pyfunction!(staging_check::_staged_write_for_test, m)?)?;
    m.add_function(wrap_pyfunction!(release::_at_exit, m)?)?;
    m.add_function(wrap_pyfunction!(release::_release_stats, m)?)?;
    Ok(())
}
