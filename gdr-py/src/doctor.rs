//! `gdr.doctor()`: the report of `gdr doctor` as a Python dict.

use std::path::Path;

use gdr_doctor::topology::{collect_with, CollectOptions, Snapshot};
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyModule;

/// The report `gdr doctor --json` prints, as a dict: `gpudirect_usable`, `gpus`, `nics`,
/// `pairs` (one verdict per GPU-NIC pair with its findings), `findings` (each with `id`,
/// `severity`, the values it was decided on and a fix), `nccl` (the NCCL settings that fit the
/// host) and `rails` (the ports gdr ranks for each memory location).
///
/// `snapshot`: the path of a snapshot saved with `gdr doctor dump` to diagnose instead of this
/// machine. This machine is read as `gdr doctor` reads it (sysfs and procfs, the CUDA driver's
/// facts, each RDMA device's dma-buf probe), the GIL released. Raises `OSError` when the
/// snapshot cannot be read or parsed.
#[pyfunction]
#[pyo3(signature = (snapshot=None))]
pub(crate) fn doctor(py: Python<'_>, snapshot: Option<String>) -> PyResult<PyObject> {
    let json = py
        .allow_threads(|| -> Result<String, gdr_doctor::Error> {
            let snap = match &snapshot {
                Some(path) => {
                    let text =
                        std::fs::read_to_string(path).map_err(|source| gdr_doctor::Error::Io {
                            what: format!("reading snapshot {path}"),
                            source,
                        })?;
                    Snapshot::from_json(&text, path)?
                }
                None => collect_with(Path::new("/"), CollectOptions::live())?,
            };
            Ok(gdr_doctor::diagnose(&snap).to_json())
        })
        .map_err(|e| {
            let hint = e.hint().map(|h| format!(" ({h})")).unwrap_or_default();
            PyOSError::new_err(format!("gdr doctor: {e}{hint}"))
        })?;
    let loads = PyModule::import(py, "json")?.getattr("loads")?;
    Ok(loads.call1((json,))?.unbind())
}
