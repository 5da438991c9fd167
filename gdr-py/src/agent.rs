//! `gdr.Agent`: one per process; its rails, segments, peers and notifications.

use std::sync::Arc;
use std::time::Duration;

use gdr_xfer::gdr::cuda::ForeignDeviceMemory;
use gdr_xfer::gdr::mr::ForeignHostMemory;
use gdr_xfer::{Agent, AgentConfig, Error, Location, Notification};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::args::{duration, timeout, wait_until};
use crate::directory::PyDirectory;
use crate::errors::{invalid, to_py};
use crate::memory::{self, Kind};
use crate::peer::PyPeer;
use crate::release;
use crate::segment::PySegment;

/// A notification a peer sent: after the data of a transfer, or alone
/// (`Peer.send_notification`).
#[pyclass(module = "gdr._gdr", name = "Notification", frozen)]
pub(crate) struct PyNotification {
    /// The sending agent's name.
    #[pyo3(get)]
    peer: String,
    data: Vec<u8>,
}

impl From<Notification> for PyNotification {
    fn from(n: Notification) -> Self {
        PyNotification {
            peer: n.peer,
            data: n.data,
        }
    }
}

#[pymethods]
impl PyNotification {
    /// The bytes it carries.
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data)
    }

    fn __repr__(&self) -> String {
        format!(
            "Notification(peer={:?}, data={} bytes)",
            self.peer,
            self.data.len()
        )
    }
}

/// A transfer agent: one per process (or more, each with its own name). See the package
/// documentation for an example.
///
/// `Agent(name, device=None, gid_index=None, *, qps_per_peer=None, connect_timeout_s=None,
/// default_timeout_s=None)` opens the rails (`device`: an NCCL-style list such as
/// `"mlx5_0:1,mlx5_1:1"` or `"rxe0"`; `None`: every device's active ports) and starts their
/// progress threads. `shutdown()` (or leaving a `with` block) ends it; so does dropping it.
#[pyclass(module = "gdr._gdr", name = "Agent", frozen)]
pub(crate) struct PyAgent {
    /// `None` only while it is dropped. Shared with gdr's asyncio thread while a future waits
    /// for a notification.
    agent: Option<Arc<Agent>>,
}

/// `Agent.notifications()`: an async iterator of the agent's notifications.
#[pyclass(module = "gdr._gdr", name = "NotificationStream", frozen)]
pub(crate) struct PyNotificationStream {
    agent: Arc<Agent>,
}

#[pymethods]
impl PyNotificationStream {
    fn __aiter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// A coroutine of the next notification (`StopAsyncIteration` once the agent is shut
    /// down and every notification received before was taken): it waits, without blocking the
    /// event loop, until one is queued, then takes it itself in the awaiting task. A task
    /// cancelled while it waits takes nothing, so no notification is ever lost to it.
    fn __anext__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("gdr._aio")?
            .getattr("_next_notification")?
            .call1((slf,))
    }

    /// Takes the next notification without waiting: `None` when there is none; raises
    /// `StopAsyncIteration` once the agent is shut down and none is left.
    fn _take(&self, py: Python<'_>) -> PyResult<Option<PyNotification>> {
        let agent = &self.agent;
        match py.allow_threads(|| agent.wait_notification(Duration::ZERO)) {
            Ok(n) => Ok(n.map(Into::into)),
            Err(Error::AgentClosed) => Err(pyo3::exceptions::PyStopAsyncIteration::new_err(())),
            Err(e) => Err(to_py(e)),
        }
    }

    /// An asyncio future of the running loop that completes (with `None`) once a notification
    /// is queued or the agent is shut down; it takes nothing.
    fn _ready<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        crate::aio::notification_ready_future(py, &self.agent)
    }
    fn __repr__(&self) -> String {
        format!("NotificationStream(agent={:?})", self.agent.name())
    }
}

impl Drop for PyAgent {
    fn drop(&mut self) {
        if let Some(agent) = self.agent.take() {
            // Closing connections and joining the progress threads takes a while: let other
            // Python threads run meanwhile.
            // A stream of its notifications may share it: ending the agent ends the stream too
            // (and the asyncio thread lets its share go), as dropping the last share would.
            Python::with_gil(|py| {
                py.allow_threads(move || {
                    if Arc::strong_count(&agent) > 1 {
                        agent.shutdown(Duration::ZERO);
                    }
                    drop(agent)
                })
            });
        }
    }
}

/// An integer setting in `0..=max`.
fn small(obj: &Bound<'_, PyAny>, what: &str, max: u64) -> PyResult<u64> {
    match crate::args::u64_arg(obj, what)? {
        v if v <= max => Ok(v),
        v => Err(invalid(
            "InvalidArgument",
            format!("{what} = {v}"),
            &format!("use 0..={max}"),
        )),
    }
}

impl PyAgent {
    fn agent(&self) -> PyResult<&Agent> {
        self.agent
            .as_deref()
            .ok_or_else(|| to_py(Error::AgentClosed))
    }

    /// The agent's share, for what outlives the call (an asyncio wait).
    fn shared(&self) -> PyResult<&Arc<Agent>> {
        self.agent.as_ref().ok_or_else(|| to_py(Error::AgentClosed))
    }
}

/// The timeout of `connect_named`: a finite number of seconds (the lookup runs on a thread of
/// the engine that must end by itself).
fn lookup_timeout(timeout_s: f64) -> PyResult<Duration> {
    duration(timeout_s, "timeout_s")
}

#[pymethods]
impl PyAgent {
    #[new]
    #[pyo3(signature = (name, device=None, gid_index=None, *, qps_per_peer=None, connect_timeout_s=None, default_timeout_s=None))]
    fn new(
        py: Python<'_>,
        name: String,
        device: Option<String>,
        gid_index: Option<&Bound<'_, PyAny>>,
        qps_per_peer: Option<&Bound<'_, PyAny>>,
        connect_timeout_s: Option<f64>,
        default_timeout_s: Option<f64>,
    ) -> PyResult<Self> {
        let mut config = AgentConfig::new(name);
        if let Some(d) = device {
            config = config.device(d);
        }
        if let Some(g) = gid_index.filter(|g| !g.is_none()) {
            config = config.gid_index(small(g, "gid_index", u32::MAX.into())? as u32);
        }
        if let Some(q) = qps_per_peer.filter(|q| !q.is_none()) {
            config = config.qps_per_peer(small(q, "qps_per_peer", 16)? as u8);
        }
        if let Some(t) = connect_timeout_s {
            config = config.connect_timeout(duration(t, "connect_timeout_s")?);
        }
        if let Some(t) = default_timeout_s {
            config = config.default_timeout(duration(t, "default_timeout_s")?);
        }
        let agent = py.allow_threads(|| Agent::new(config)).map_err(to_py)?;
        Ok(PyAgent {
            agent: Some(Arc::new(agent)),
        })
    }

    /// The agent's name.
    #[getter]
    fn name(&self) -> PyResult<String> {
        Ok(self.agent()?.name().to_owned())
    }

    /// The RDMA device of its first rail.
    #[getter]
    fn device(&self) -> PyResult<String> {
        Ok(self.agent()?.device().to_owned())
    }

    /// Its rails: `(device, port)` pairs, rail 0 first.
    #[getter]
    fn rails(&self) -> PyResult<Vec<(String, u8)>> {
        Ok(self.agent()?.rails())
    }

    /// Accepts connections from peers on `addr` (`"host:port"`, port 0 for any) in a
    /// background thread; returns the address bound. Raises `IoError` when it cannot be bound.
    fn listen(&self, py: Python<'_>, addr: String) -> PyResult<String> {
        let agent = self.agent()?;
        py.allow_threads(|| agent.listen(&addr))
            .map(|a| a.to_string())
            .map_err(to_py)
    }

    /// Connects to the agent listening at `addr` (`"host:port"`), the GIL released. A refused
    /// connection is tried again until the agent's connect timeout (10 s by default). Ctrl-C
    /// interrupts the wait (the engine's connect thread then ends on its own within the
    /// connect timeout, and a peer it connected stays connected).
    ///
    /// Raises `IoError` when nothing accepted in time, `ProtocolError` for a peer that is not a
    /// compatible agent, `InvalidArgument` when a peer of that name is already connected.
    fn connect(&self, py: Python<'_>, addr: String) -> PyResult<PyPeer> {
        let agent = self.agent()?;
        // On a thread of the engine, waited for here in slices: Ctrl-C interrupts the wait.
        let connecting = py.allow_threads(|| agent.connect_async(&addr));
        let peer = crate::aio::wait_connecting(py, connecting)?;
        Ok(PyPeer { peer })
    }

    /// `connect`, awaited: an asyncio future of the running loop with the `Peer` (or
    /// `connect`'s exception), without blocking the event loop. The TCP handshake runs on a
    /// thread of the engine (socket calls block), which completes the future through gdr's
    /// asyncio thread; it keeps the agent's connect timeout.
    ///
    /// Cancelling the future loses nothing: the connect thread still ends within the connect
    /// timeout, and a peer it connected meanwhile stays connected (`peer(name)` finds it).
    fn connect_async<'py>(&self, py: Python<'py>, addr: String) -> PyResult<Bound<'py, PyAny>> {
        let agent = self.agent()?;
        crate::aio::connect_future(py, || agent.connect_async(&addr))
    }

    /// Publishes this agent in `directory` (a `Directory`): `advertise_addr` (`"ip:port"`,
    /// where peers reach the address `listen` bound) and every segment, now and as they are
    /// registered and deregistered, all bound to the directory's lease. Peers then find it by
    /// name with `connect_named`. The name is this agent's while it stays published: another
    /// agent publishing it is refused, and can neither replace nor delete its records. The
    /// records go when the agent shuts down, or within the directory's TTL when the process
    /// dies. The GIL is released while etcd answers.
    ///
    /// Raises `InvalidArgument` for an address that is not `"ip:port"` or that peers cannot
    /// connect to (`0.0.0.0`, `::` or port 0: listen on `"0.0.0.0:0"` but advertise this
    /// host's IP with the port `listen` returned), a name with `/`, or when already
    /// published; `NameTaken` when a live agent holds the name; `DirectoryError` when etcd
    /// refuses or the directory was closed; `AgentClosed` after `shutdown`.
    fn publish(
        &self,
        py: Python<'_>,
        directory: &Bound<'_, PyDirectory>,
        advertise_addr: String,
    ) -> PyResult<()> {
        let agent = self.agent()?;
        let dir = directory.get().get()?;
        let addr: std::net::SocketAddr = advertise_addr.trim().parse().map_err(|e| {
            invalid(
                "InvalidArgument",
                format!("advertise_addr = {advertise_addr:?} is not an \"ip:port\" address ({e})"),
                "give the IP peers reach this host at and the port listen() returned, e.g. \"10.0.0.2:7100\"",
            )
        })?;
        py.allow_threads(|| agent.publish(dir, addr)).map_err(to_py)
    }

    /// Finds the agent called `name` in `directory` (a `Directory`), waiting up to `timeout_s`
    /// for it to be published, connects to it and watches its records: when they go (it shut
    /// down, or its lease ended because it died or hung) the peer is lost at once and its
    /// pending transfers fail with `PeerLost`. Returns the `Peer`.
    ///
    /// The whole of it (lookup, connecting, handshake) takes at most about `timeout_s` (a
    /// finite number of seconds); the GIL is released and Ctrl-C interrupts the wait (the
    /// engine's lookup then ends on its own within `timeout_s`, and a peer it connected stays
    /// connected).
    ///
    /// Raises `UnknownPeer` when no agent of that name is published, or none answers at its
    /// address, within `timeout_s`; `DirectoryError` when etcd fails or the directory was
    /// closed; `ProtocolError` for a malformed record or an agent that is not `name`;
    /// `InvalidArgument` for a name with `/` or a bad timeout; `connect`'s other errors;
    /// `AgentClosed` after `shutdown`.
    #[pyo3(signature = (directory, name, timeout_s=10.0))]
    fn connect_named(
        &self,
        py: Python<'_>,
        directory: &Bound<'_, PyDirectory>,
        name: String,
        timeout_s: f64,
    ) -> PyResult<PyPeer> {
        let agent = self.agent()?;
        let dir = directory.get().get()?;
        let limit = lookup_timeout(timeout_s)?;
        let connecting = py.allow_threads(|| agent.connect_named_async(&dir, &name, limit));
        let peer = crate::aio::wait_connecting(py, connecting)?;
        Ok(PyPeer { peer })
    }

    /// `connect_named`, awaited: an asyncio future of the running loop with the `Peer` (or
    /// `connect_named`'s exception), without blocking the event loop. The lookup and the
    /// connection run on a thread of the engine, which completes the future through gdr's
    /// asyncio thread.
    ///
    /// Cancelling the future loses nothing: the lookup still ends within `timeout_s`, and a
    /// peer it connected meanwhile stays connected (`peer(name)` finds it).
    #[pyo3(signature = (directory, name, timeout_s=10.0))]
    fn connect_named_async<'py>(
        &self,
        py: Python<'py>,
        directory: &Bound<'_, PyDirectory>,
        name: String,
        timeout_s: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let agent = self.agent()?;
        let dir = directory.get().get()?;
        let limit = lookup_timeout(timeout_s)?;
        crate::aio::connect_future(py, || agent.connect_named_async(&dir, &name, limit))
    }

    /// Waits (the GIL released) until a peer named `name` is connected (either way). Raises
    /// `Timeout` after `timeout_s` (`None`: no limit).
    #[pyo3(signature = (name, timeout_s=10.0))]
    fn wait_peer(&self, py: Python<'_>, name: String, timeout_s: Option<f64>) -> PyResult<PyPeer> {
        let agent = self.agent()?;
        let limit = timeout(timeout_s, "timeout_s")?;
        let found = wait_until(py, limit, |slice| match agent.wait_peer(&name, slice) {
            Ok(p) => Some(Ok(p)),
            Err(Error::Timeout { .. }) => None,
            Err(e) => Some(Err(e)),
        })?;
        match found {
            Some(Ok(peer)) => Ok(PyPeer { peer }),
            Some(Err(e)) => Err(to_py(e)),
            None => Err(to_py(Error::Timeout {
                what: format!("waiting for peer {name:?} to connect"),
                after: limit.unwrap_or(Duration::MAX),
                hint: "is it running and connecting to this agent's listen address?".into(),
            })),
        }
    }

    /// `wait_peer`, awaited: an asyncio future of the running loop with the `Peer` named
    /// `name` once it is connected (either way), completed by gdr's asyncio thread without
    /// blocking the event loop. It has no timeout of its own: wrap it in
    /// `asyncio.wait_for(..., timeout)`. Raises `AgentClosed` once the agent is shut down.
    /// Cancelling it only stops the wait.
    fn wait_peer_async<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let agent = self.shared()?;
        crate::aio::peer_future(py, agent, name)
    }

    /// The connected peer named `name`, or `None`.
    fn peer(&self, name: String) -> PyResult<Option<PyPeer>> {
        Ok(self.agent()?.peer(&name).map(|peer| PyPeer { peer }))
    }

    /// The connected peers, by name.
    fn peers(&self) -> PyResult<Vec<PyPeer>> {
        Ok(self
            .agent()?
            .peers()
            .into_iter()
            .map(|peer| PyPeer { peer })
            .collect())
    }

    /// Closes the connection to `peer`: new transfers are refused at once; those in flight
    /// stop, each ending `PeerLost` (or success, if all its bytes had landed) once neither
    /// side's memory can be touched by it; then the peer is told goodbye (GIL released while
    /// it waits). Raises `ForeignObject` for another agent's peer (its connection is left as it
    /// is).
    fn disconnect(&self, py: Python<'_>, peer: &Bound<'_, PyPeer>) -> PyResult<()> {
        let agent = self.agent()?;
        let peer = &peer.get().peer;
        py.allow_threads(|| agent.disconnect(peer)).map_err(to_py)
    }

    /// Registers the memory of `obj` as a segment named `name` that peers may read and write:
    /// a CUDA tensor through DLPack (torch, cupy, jax: `__dlpack__`), host memory through the
    /// buffer protocol (numpy arrays, bytearrays, mmaps) or DLPack (torch CPU tensors). It must
    /// be writable and C-contiguous.
    ///
    /// The segment holds a reference to `obj` and its export (the buffer export, or the DLPack
    /// capsule's tensor): `del obj` is harmless, the memory stays until the segment is
    /// deregistered, its handle is gone and no request in flight uses it; then the export is
    /// given back (on gdr's release thread, under the GIL). While registered, a buffer cannot
    /// be resized (`BufferError`); a tensor's memory stays allocated as DLPack promises (do not
    /// `resize_` it in place). Python code may still read and write it: bytes a transfer moves
    /// meanwhile may then be torn, as with any RDMA memory. CUDA data must be ready (the
    /// producing stream synchronized) before a transfer reads it.
    ///
    /// CUDA memory goes through gdr's pointer checks (`cuPointerGetAttributes`: device memory,
    /// one allocation, GPUDirect-capable), then GPUDirect registration (dma-buf, else peer
    /// memory) or, without a direct path, staging through pinned bounce buffers:
    /// `Segment.path` says which and why.
    ///
    /// Raises `NotABuffer`, `ReadOnlyBuffer` (peers may write every segment, and READs write
    /// into it), `NotContiguous`, `NotPlainData` (Python objects or pointers: numpy
    /// `dtype=object`), `InvalidArgument` (empty), `TooLarge` (a name over 64 bytes),
    /// `Unsupported` (managed memory), `NotGpuMemory`, or the device's `RdmaError`
    /// (locked-memory limit, ...).
    #[pyo3(signature = (obj, name=String::new()), text_signature = "(self, obj, name='')")]
    fn register(
        &self,
        py: Python<'_>,
        obj: &Bound<'_, PyAny>,
        name: String,
    ) -> PyResult<PySegment> {
        let agent = self.agent()?;
        let taken = memory::take(obj)?;
        release::exported();
        let (addr, len, held) = (taken.addr, taken.len, taken.held);
        let release = move || release::hand_back(held);
        let seg = match taken.kind {
            Kind::Host => {
                // SAFETY: `addr..addr + len` is host memory of a writable, C-contiguous export
                // of plain data (no object pointers) that `held` keeps: a buffer export that
                // gdr owns in a `Py_buffer` no Python object stands for (PEP 3118 binds the
                // exporter to keep the memory allocated and in place until the export is
                // released; a bytearray, array.array or mmap refuses to resize or close
                // meanwhile), with exports of the objects it borrows its memory from and weak
                // references that make numpy refuse to resize (`crate::buffer`), or a DLPack
                // tensor (the exporter keeps its memory until the deleter runs). It lasts until the
                // release closure has run: the closure moves `held` to the release thread,
                // which gives it back under the GIL; a failed registration drops the value, so
                // the closure runs then too. The bytes were initialised by their Python owner.
                // Python code can still reach the same bytes; Rust never makes a reference to
                // them (gdr copies in and out through raw pointers, the NIC by DMA), so
                // concurrent Python access can tear a transfer's bytes, as with the NIC's own
                // concurrent writes, but cannot invalidate the memory gdr registered.
                let memory = unsafe { ForeignHostMemory::new(addr as *mut u8, len, release) }
                    .map_err(|e| to_py(e.into()))?;
                py.allow_threads(|| {
                    agent.register_host(memory, &name, Location::Cpu { numa: None })
                })
            }
            Kind::Cuda => {
                // SAFETY: `addr..addr + len` is the CUDA memory of a DLPack tensor whose
                // exporter keeps it allocated, at that address, until the managed tensor's
                // deleter runs; `held` owns the managed tensor and runs the deleter only when
                // the release closure gives it back, after the segment, the registration cache
                // and every request are done with the memory. gdr's pointer checks still run
                // before any registration (a range CUDA does not know is refused).
                let memory = unsafe { ForeignDeviceMemory::new(addr, len, release) };
                py.allow_threads(|| agent.register_gpu_memory(Arc::new(memory), .., &name))
            }
        };
        Ok(PySegment {
            seg: seg.map_err(to_py)?,
        })
    }

    /// Allocates `length` zeroed, page-aligned bytes of host memory and registers them as a
    /// segment named `name` (read and write them with `Segment.read` / `Segment.write`).
    #[pyo3(signature = (length, name=String::new()), text_signature = "(self, length, name='')")]
    fn alloc(
        &self,
        py: Python<'_>,
        length: &Bound<'_, PyAny>,
        name: String,
    ) -> PyResult<PySegment> {
        let agent = self.agent()?;
        let length = crate::args::u64_arg(length, "length")?;
        let len = usize::try_from(length).map_err(|_| {
            invalid(
                "InvalidArgument",
                format!("length = {length}"),
                "allocate less than the address space",
            )
        })?;
        let seg = py
            .allow_threads(|| agent.alloc_host(len, &name))
            .map_err(to_py)?;
        Ok(PySegment { seg })
    }

    /// Removes `segment` from the table peers see (their new transfers to it fail with
    /// `UnknownSegment`) and from this agent's transfers. Its memory is released once no
    /// handle and no request in flight uses it. Raises `ForeignObject` for another agent's
    /// segment and `UnknownSegment` when it is no longer registered.
    fn deregister(&self, py: Python<'_>, segment: &Bound<'_, PySegment>) -> PyResult<()> {
        let agent = self.agent()?;
        let seg = &segment.get().seg;
        py.allow_threads(|| agent.deregister(seg)).map_err(to_py)
    }

    /// The registered segments, by id.
    fn segments(&self) -> PyResult<Vec<PySegment>> {
        Ok(self
            .agent()?
            .segments()
            .into_iter()
            .map(|seg| PySegment { seg })
            .collect())
    }

    /// What GPU staging holds and did, a dict: `gpus` (per GPU with bounce buffers, the line
    /// that says how it is staged), `buffers`, `active_transfers`, `transfers`, `chunks`,
    /// `bytes`, `waited_for_nic` (chunks whose buffer waited for the NIC to let go),
    /// `waiting_now`, `chunks_in_use`. All zero on an agent that staged nothing.
    fn staging_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let agent = self.agent()?;
        let s = py.allow_threads(|| agent.staging_stats());
        let d = PyDict::new(py);
        d.set_item("gpus", &s.gpus)?;
        d.set_item("buffers", s.buffers)?;
        d.set_item("active_transfers", s.active_transfers)?;
        d.set_item("transfers", s.transfers)?;
        d.set_item("chunks", s.chunks)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("waited_for_nic", s.waited_for_nic)?;
        d.set_item("waiting_now", s.waiting_now)?;
        d.set_item("chunks_in_use", s.chunks_in_use)?;
        Ok(d)
    }

    /// Counters of the GPU registration cache, a dict: `hits` (lookups answered by an existing
    /// registration), `registrations` (verbs registrations made), `merged` (registrations made
    /// as the union of overlapping or adjacent ones).
    fn cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let agent = self.agent()?;
        let s = py.allow_threads(|| agent.cache_stats());
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("registrations", s.registrations)?;
        d.set_item("merged", s.merged)?;
        Ok(d)
    }

    /// Waits (the GIL released) for the next notification; `None` when `timeout_s` passes
    /// first (`None`: no limit).
    #[pyo3(signature = (timeout_s=None))]
    fn wait_notification(
        &self,
        py: Python<'_>,
        timeout_s: Option<f64>,
    ) -> PyResult<Option<PyNotification>> {
        let agent = self.agent()?;
        let limit = timeout(timeout_s, "timeout_s")?;
        let got = wait_until(py, limit, |slice| match agent.wait_notification(slice) {
            Ok(Some(n)) => Some(Ok(n)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        })?;
        match got {
            Some(Ok(n)) => Ok(Some(n.into())),
            Some(Err(e)) => Err(to_py(e)),
            None => Ok(None),
        }
    }

    /// Takes every notification received so far.
    fn take_notifications(&self) -> PyResult<Vec<PyNotification>> {
        let agent = self.agent()?;
        Ok(agent
            .take_notifications()
            .into_iter()
            .map(Into::into)
            .collect())
    }

    /// Notifications received and not taken yet.
    #[getter]
    fn pending_notifications(&self) -> PyResult<usize> {
        Ok(self.agent()?.pending_notifications())
    }

    /// The notifications as an async iterator: `async for note in agent.notifications():`
    /// waits without blocking the event loop (gdr's asyncio thread completes each step through
    /// `loop.call_soon_threadsafe`), and ends once the agent is shut down and every
    /// notification received before was taken. Cancelling a step loses nothing: a
    /// notification taken for it meanwhile (or for a step whose event loop closed) goes back
    /// to the front of the agent's queue, the next one any wait gets.
    fn notifications(&self) -> PyResult<PyNotificationStream> {
        let agent = self
            .agent
            .as_ref()
            .ok_or_else(|| to_py(Error::AgentClosed))?;
        Ok(PyNotificationStream {
            agent: agent.clone(),
        })
    }

    /// Ends the agent (the GIL released): new work is refused at once with `AgentClosed`,
    /// pending transfers get up to `grace_s` seconds to end, then every connection closes and
    /// the rest fail with `AgentClosed`. Returns `{"pending": n, "failed": m}`. Calling it
    /// again does nothing more.
    #[pyo3(signature = (grace_s=0.0))]
    fn shutdown<'py>(&self, py: Python<'py>, grace_s: f64) -> PyResult<Bound<'py, PyDict>> {
        let agent = self.agent()?;
        let grace = timeout(Some(grace_s), "grace_s")?.unwrap_or(Duration::MAX);
        let report = py.allow_threads(|| agent.shutdown(grace));
        let d = PyDict::new(py);
        d.set_item("pending", report.pending)?;
        d.set_item("failed", report.failed)?;
        Ok(d)
    }

    /// For tests and leak checks: wakers the engine holds for pending waits, a dict
    /// (`notifications`, `peers`). A wait that ended or was cancelled holds none.
    fn _waker_counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.agent()?.waker_counts();
        let d = PyDict::new(py);
        d.set_item("notifications", c.notifications)?;
        d.set_item("peers", c.peers)?;
        Ok(d)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.shutdown(py, 0.0)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match &self.agent {
            Some(a) => format!("Agent(name={:?}, rails={:?})", a.name(), a.rails()),
            None => "Agent(<dropped>)".into(),
        }
    }
}
