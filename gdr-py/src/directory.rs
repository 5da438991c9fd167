//! `gdr.Directory`: the etcd directory agents publish themselves in and find peers through
//! (gdr-xfer's [`EtcdDirectory`], feature `etcd`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gdr_xfer::directory::{EtcdDirectory, DEFAULT_PREFIX, DEFAULT_TTL};
use gdr_xfer::Error;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::args::duration;
use crate::buffer::type_name;
use crate::errors::{invalid, to_py};

/// The default limit of every etcd call, in seconds (gdr-xfer's `EtcdConfig` default).
const DEFAULT_TIMEOUT_S: f64 = 5.0;

/// A connection to etcd holding one lease: the directory agents publish themselves in
/// (`Agent.publish`) and find their peers through (`Agent.connect_named`). One per process is
/// enough; every agent of the process can share it.
///
/// `Directory(endpoints, prefix="/gdr-xfer/agents/", ttl_s=10.0, timeout_s=5.0)` connects to
/// etcd at `endpoints` (a `"host:port"` str, several separated by commas, or a list of them),
/// grants a lease of `ttl_s` seconds and keeps it alive from a thread of its own. Every record
/// an agent publishes is bound to that lease: when the process dies its records go within
/// `ttl_s`; `close()` (or leaving a `with` block) revokes the lease at once once no published
/// agent uses it any more. `timeout_s` bounds every etcd call.
///
/// Raises `DirectoryError` when etcd cannot be reached or refuses the lease,
/// `InvalidArgument` for empty endpoints, a bad prefix, a TTL or timeout out of range.
#[pyclass(module = "gdr._gdr", name = "Directory", frozen)]
pub(crate) struct PyDirectory {
    /// `None` once closed. Agents that published themselves in it hold shares of their own.
    dir: Mutex<Option<Arc<EtcdDirectory>>>,
    endpoints: Vec<String>,
    prefix: String,
    ttl: Duration,
    lease_id: i64,
}

impl PyDirectory {
    /// The directory, or `DirectoryError` once it was closed.
    pub(crate) fn get(&self) -> PyResult<Arc<EtcdDirectory>> {
        self.dir
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| {
                to_py(Error::Directory {
                    op: "use",
                    key: self.prefix.clone(),
                    detail: "the directory was closed".into(),
                    hint: "make a new gdr.Directory".into(),
                })
            })
    }

    /// Drops this handle's share, the GIL released (the last share revokes the lease, which
    /// waits for etcd up to the directory's timeout).
    fn release(&self, py: Python<'_>) {
        let dir = self.dir.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(dir) = dir {
            py.allow_threads(move || drop(dir));
        }
    }
}

/// etcd endpoints: a str (several separated by commas) or an iterable of str.
fn endpoint_list(obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let bad = || {
        invalid(
            "InvalidArgument",
            format!("endpoints is a {}, not a str or a list of str", type_name(obj)),
            "give etcd's client address, e.g. \"127.0.0.1:2379\" or [\"10.0.0.1:2379\", \"10.0.0.2:2379\"]",
        )
    };
    if let Ok(s) = obj.downcast::<PyString>() {
        return Ok(s
            .to_cow()?
            .split(',')
            .map(|e| e.trim().to_owned())
            .collect());
    }
    let iter = obj.try_iter().map_err(|_| bad())?;
    iter.map(|e| e.and_then(|e| e.extract::<String>().map_err(|_| bad())))
        .collect()
}

impl Drop for PyDirectory {
    fn drop(&mut self) {
        let dir = self.dir.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(dir) = dir {
            // Revoking the lease waits for etcd: let other Python threads run meanwhile.
            Python::with_gil(|py| py.allow_threads(move || drop(dir)));
        }
    }
}

#[pymethods]
impl PyDirectory {
    #[new]
    #[pyo3(
        signature = (endpoints, prefix=DEFAULT_PREFIX.to_owned(), ttl_s=DEFAULT_TTL.as_secs_f64(), timeout_s=DEFAULT_TIMEOUT_S),
        text_signature = "(endpoints, prefix='/gdr-xfer/agents/', ttl_s=10.0, timeout_s=5.0)"
    )]
    fn new(
        py: Python<'_>,
        endpoints: &Bound<'_, PyAny>,
        prefix: String,
        ttl_s: f64,
        timeout_s: f64,
    ) -> PyResult<Self> {
        let endpoints = endpoint_list(endpoints)?;
        let ttl = duration(ttl_s, "ttl_s")?;
        let limit = duration(timeout_s, "timeout_s")?;
        let dir = py
            .allow_threads(|| EtcdDirectory::connect(&endpoints, &prefix, ttl, limit))
            .map_err(to_py)?;
        Ok(PyDirectory {
            endpoints,
            prefix,
            ttl: dir.ttl(),
            lease_id: dir.lease_id(),
            dir: Mutex::new(Some(Arc::new(dir))),
        })
    }

    /// The etcd endpoints it was connected with.
    #[getter]
    fn endpoints(&self) -> Vec<String> {
        self.endpoints.clone()
    }

    /// The prefix of every key it puts and reads.
    #[getter]
    fn prefix(&self) -> String {
        self.prefix.clone()
    }

    /// The lease's TTL in seconds, as etcd granted it (at least the one asked for).
    #[getter]
    fn ttl_s(&self) -> f64 {
        self.ttl.as_secs_f64()
    }

    /// The lease's id (`etcdctl lease list` shows it in hex).
    #[getter]
    fn lease_id(&self) -> i64 {
        self.lease_id
    }

    /// Why the lease was lost (etcd unreachable for a TTL: the published records are gone;
    /// make a new directory and publish again), or `None` while it holds.
    #[getter]
    fn lease_lost(&self) -> PyResult<Option<String>> {
        Ok(self.get()?.lease_lost())
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.dir.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    /// Lets the directory go, the GIL released: once no agent published in it remains (an
    /// agent lets go when it shuts down), the lease is revoked and every record bound to it
    /// disappears at once. Later calls with it raise `DirectoryError`. Calling it again does
    /// nothing.
    fn close(&self, py: Python<'_>) {
        self.release(py);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release(py);
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Directory(endpoints={:?}, prefix={:?}, ttl_s={}, lease_id={:#x}{})",
            self.endpoints,
            self.prefix,
            self.ttl.as_secs_f64(),
            self.lease_id,
            if self.closed() { ", closed" } else { "" }
        )
    }
}
