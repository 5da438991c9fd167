//! `gdr.Transfer`: a submitted transfer, observed, waited for or cancelled.

use std::sync::Arc;
use std::time::Duration;

use gdr_xfer::{Error, Status, Transfer, TransferStats};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::aio::SharedTransfer;
use crate::args::{op_name, timeout, wait_until};
use crate::errors::to_py;

/// A transfer submitted with `Peer.write`, `Peer.read`, `Peer.transfer_blocks` or
/// `Peer.send_notification`.
///
/// Its outcome, whatever it is, comes only once none of its requests can touch its memory any
/// more. Dropping this handle does not stop the transfer: the engine finishes it (or fails it at
/// its deadline) and releases the memory once the NIC is done with it.
///
/// `await transfer` (or `await transfer.wait_async()`) waits without blocking the event loop.
#[pyclass(module = "gdr._gdr", name = "Transfer", frozen)]
pub(crate) struct PyTransfer {
    /// Shared with the asyncio thread while a future awaits it. No lock guard of it is ever
    /// held while the GIL is being acquired (the asyncio thread write-locks it without the GIL).
    shared: Arc<SharedTransfer>,
}

impl PyTransfer {
    /// The handle of a submitted transfer.
    pub(crate) fn new(t: Transfer) -> Self {
        PyTransfer {
            shared: SharedTransfer::new(t),
        }
    }
}

/// A transfer's statistics as a dict (times in seconds).
pub(crate) fn stats<'py>(py: Python<'py>, s: &TransferStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes", s.bytes)?;
    d.set_item("descriptors", s.descriptors)?;
    d.set_item("runs", s.runs)?;
    d.set_item("slices", s.slices)?;
    d.set_item("qps_used", s.qps_used)?;
    d.set_item("rails_used", s.rails_used)?;
    d.set_item("retried_slices", s.retried_slices)?;
    d.set_item("time_to_post_s", s.time_to_post.as_secs_f64())?;
    d.set_item("time_to_complete_s", s.time_to_complete.as_secs_f64())?;
    d.set_item("plan_time_s", s.plan_time.as_secs_f64())?;
    d.set_item("submit_time_s", s.submit_time.as_secs_f64())?;
    Ok(d)
}

#[pymethods]
impl PyTransfer {
    /// Blocks (the GIL released) until the transfer finishes, and returns its statistics:
    /// `bytes`, `descriptors`, `runs`, `slices`, `qps_used`, `rails_used`, `retried_slices`,
    /// and `time_to_post_s`, `time_to_complete_s`, `plan_time_s`, `submit_time_s`.
    ///
    /// Raises the transfer's failure (`Timeout` at its deadline, `PeerLost`, `Cancelled`,
    /// `SliceFailed`, `NoRail`, `AgentClosed`, ...), or `Timeout` when `timeout_s` passes
    /// first (the transfer goes on: wait again or cancel it). `timeout_s=None` waits as long as
    /// the transfer takes (it has a deadline of its own).
    #[pyo3(signature = (timeout_s=None))]
    fn wait<'py>(&self, py: Python<'py>, timeout_s: Option<f64>) -> PyResult<Bound<'py, PyDict>> {
        let limit = timeout(timeout_s, "timeout_s")?;
        let shared = &self.shared;
        // The read lock is taken and dropped inside each slice, without the GIL.
        let outcome = wait_until(py, limit, |slice| {
            let t = shared.get();
            if let Some(r) = t.poll_result() {
                return Some(r);
            }
            let _ = t.wait(slice);
            t.poll_result()
        })?;
        match outcome {
            Some(Ok(s)) => stats(py, &s),
            Some(Err(e)) => Err(to_py(e)),
            None => Err(to_py(Error::Timeout {
                what: format!("waiting for a transfer to {}", self.peer()),
                after: limit.unwrap_or(Duration::MAX),
                hint: "the transfer goes on until its own deadline: wait again, or cancel it"
                    .into(),
            })),
        }
    }

    /// The outcome if the transfer finished, without blocking: its statistics, `None` while it
    /// is pending; raises its failure.
    fn poll<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let outcome = self.shared.get().poll_result();
        match outcome {
            None => Ok(None),
            Some(Ok(s)) => stats(py, &s).map(Some),
            Some(Err(e)) => Err(to_py(e)),
        }
    }

    /// Stops the transfer: nothing more of it is posted, and it finishes with `Cancelled` once
    /// its requests in flight are retired, even when they all land (its notification is not
    /// sent); a transfer that had finished keeps its outcome. Returns at once; `wait` for the
    /// outcome.
    fn cancel(&self, py: Python<'_>) {
        let shared = &self.shared;
        py.allow_threads(|| shared.get().cancel());
    }

    /// An asyncio future (of the running event loop) of the outcome: `wait`'s statistics, or
    /// its failure raised. The loop is never blocked: gdr's asyncio thread completes the future
    /// through `loop.call_soon_threadsafe`. Cancelling the future (or the task awaiting it)
    /// cancels the transfer; wrap it in `asyncio.shield` to let the transfer go on. Raises
    /// `RuntimeError` outside a running loop.
    fn wait_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        crate::aio::transfer_future(py, &self.shared)
    }

    /// `await transfer`: as `await transfer.wait_async()`.
    fn __await__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.wait_async(py)?.call_method0("__await__")
    }

    /// `"pending"`, `"done"` or `"failed"`.
    #[getter]
    fn status(&self) -> &'static str {
        match self.shared.get().status() {
            Status::Pending => "pending",
            Status::Done => "done",
            Status::Failed => "failed",
        }
    }

    /// Whether it finished (done or failed).
    #[getter]
    fn done(&self) -> bool {
        self.shared.get().status() != Status::Pending
    }

    /// Bytes it moves.
    #[getter]
    fn bytes(&self) -> u64 {
        self.shared.get().bytes()
    }

    /// `"write"` or `"read"`.
    #[getter]
    fn op(&self) -> &'static str {
        op_name(self.shared.get().op())
    }

    /// The peer's name.
    #[getter]
    fn peer(&self) -> String {
        self.shared.get().peer().to_owned()
    }

    /// Its deadline in seconds from submission.
    #[getter]
    fn timeout_s(&self) -> f64 {
        self.shared.get().timeout().as_secs_f64()
    }

    fn __repr__(&self) -> String {
        format!(
            "Transfer(op={:?}, peer={:?}, bytes={}, status={:?})",
            self.op(),
            self.peer(),
            self.shared.get().bytes(),
            self.status()
        )
    }
}
