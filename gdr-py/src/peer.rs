//! `gdr.Peer` (a connected agent, and the transfers to it) and `gdr.RemoteSegment` (a segment
//! a peer announced).

use std::time::Duration;

use gdr_xfer::{BlockTable, Desc, Error, Op, Peer, PoolTable, SegmentId, SegmentInfo};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::{blocks, bytes, duration, op, options, remote, timeout, u64_arg, wait_until};
use crate::buffer::type_name;
use crate::errors::{invalid, to_py};
use crate::lists::{PyLocalList, PyRemoteList};
use crate::segment::PySegment;
use crate::transfer::PyTransfer;

/// A segment a peer announced: what a transfer needs to address it.
#[pyclass(module = "gdr._gdr", name = "RemoteSegment", frozen)]
pub(crate) struct PyRemoteSegment {
    /// The id the peer gave it.
    #[pyo3(get)]
    pub(crate) id: u32,
    /// Its name (may be empty).
    #[pyo3(get)]
    pub(crate) name: String,
    /// Its length in bytes.
    #[pyo3(get)]
    pub(crate) length: u64,
    /// Where its memory lives (`"cpu"`, `"cpu:N"`, `"cuda:N"`).
    #[pyo3(get)]
    pub(crate) location: String,
}

impl From<SegmentInfo> for PyRemoteSegment {
    fn from(s: SegmentInfo) -> Self {
        PyRemoteSegment {
            id: s.id.get(),
            name: s.name,
            length: s.len,
            location: s.location.to_string(),
        }
    }
}

#[pymethods]
impl PyRemoteSegment {
    fn __len__(&self) -> usize {
        usize::try_from(self.length).unwrap_or(usize::MAX)
    }

    fn __repr__(&self) -> String {
        format!(
            "RemoteSegment(id={}, name={:?}, length={}, location={:?})",
            self.id, self.name, self.length, self.location
        )
    }
}

/// A connected peer (from `Agent.connect`, `Agent.wait_peer` or `Agent.peers`). Transfers to it
/// are one-sided: the peer's CPU takes no part.
#[pyclass(module = "gdr._gdr", name = "Peer", frozen)]
pub(crate) struct PyPeer {
    pub(crate) peer: Peer,
}

impl PyPeer {
    /// Submits one descriptor in direction `direction`.
    #[allow(clippy::too_many_arguments)]
    fn one(
        &self,
        py: Python<'_>,
        direction: Op,
        local_segment: &Bound<'_, PySegment>,
        local_offset: &Bound<'_, PyAny>,
        remote_segment: &Bound<'_, PyAny>,
        remote_offset: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
        notify: Option<&Bound<'_, PyAny>>,
        timeout_s: Option<f64>,
    ) -> PyResult<PyTransfer> {
        let local_offset = u64_arg(local_offset, "local_offset")?;
        let remote_id = remote(remote_segment, "remote_segment")?;
        let remote_offset = u64_arg(remote_offset, "remote_offset")?;
        let length = u64_arg(length, "length")?;
        let opts = options(notify, timeout_s)?;
        let (opts, deferred) = crate::post::options(py, opts, length);
        let seg = &local_segment.get().seg;
        let peer = &self.peer;
        let t = py
            .allow_threads(|| {
                let desc = Desc::new(seg, local_offset, remote_id, remote_offset, length);
                peer.transfer(direction, &[desc], &opts)
            })
            .map_err(to_py)?;
        crate::post::queued(&self.peer, deferred);
        Ok(PyTransfer::new(t))
    }
}

/// One pool of `Peer.transfer_pools`: the local segment, its base, the peer's segment, its
/// base.
type PoolLine<'py> = (Bound<'py, PySegment>, u64, SegmentId, u64);

/// The pools of `Peer.transfer_pools`: `(local_segment, local_base, remote_segment,
/// remote_base)` tuples.
fn pool_lines<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Vec<PoolLine<'py>>> {
    let bad = |what: String| {
        invalid(
            "InvalidArgument",
            what,
            "give a list of (Segment, local_base, RemoteSegment or id, remote_base) tuples",
        )
    };
    let iter = obj
        .try_iter()
        .map_err(|_| bad(format!("pools is a {}, not a list", type_name(obj))))?;
    let mut out = Vec::with_capacity(crate::args::presize(obj));
    for (i, item) in iter.enumerate() {
        let item = item?;
        let fields: Vec<Bound<'py, PyAny>> = match item.try_iter() {
            // One more than needed tells a wrong length, whatever the item claims.
            Ok(it) => it.take(5).collect::<PyResult<_>>()?,
            Err(_) => return Err(bad(format!("pools[{i}] is a {}", type_name(&item)))),
        };
        let [seg, local_base, remote_seg, remote_base] = fields.as_slice() else {
            return Err(bad(format!(
                "pools[{i}] has {} items, not 4",
                if fields.len() > 4 {
                    "more".to_string()
                } else {
                    fields.len().to_string()
                }
            )));
        };
        let seg = seg.downcast::<PySegment>().map_err(|_| {
            bad(format!(
                "pools[{i}][0] is a {}, not a Segment",
                type_name(seg)
            ))
        })?;
        let line = (
            seg.clone(),
            u64_arg(local_base, &format!("pools[{i}][1] (local_base)"))?,
            remote(remote_seg, &format!("pools[{i}][2] (remote_segment)"))?,
            u64_arg(remote_base, &format!("pools[{i}][3] (remote_base)"))?,
        );
        crate::args::push(&mut out, line)?;
    }
    Ok(out)
}

#[pymethods]
impl PyPeer {
    /// The peer agent's name.
    #[getter]
    fn name(&self) -> String {
        self.peer.name().to_owned()
    }

    /// Whether the connection works (`False` once it was lost).
    #[getter]
    fn is_connected(&self) -> bool {
        self.peer.is_connected()
    }

    /// Why the connection was lost, once it was (else `None`).
    #[getter]
    fn lost_reason(&self) -> Option<String> {
        self.peer.lost_reason()
    }

    /// Per rail shared with the peer, a dict: `rail` (its index in the agent's rails),
    /// `device`, `port`, `state` (`"active"`, `"paused"` after a failure, `"renewing"`,
    /// `"probing"`), `bytes` and `slices` completed on it, `errors`, `retries` (slices failed
    /// over from it), `renewals`, `readmissions`, `fences`, `inflight_bytes`, `throughput`
    /// (bytes per second, a moving average; 0 until measured), `last_error` (a str or `None`)
    /// and `last_failover_s` (seconds from its last failure until its slices were posted again,
    /// or `None`).
    fn rail_stats<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let peer = &self.peer;
        let rails = py.allow_threads(|| peer.rail_stats());
        rails
            .iter()
            .map(|r| {
                let d = PyDict::new(py);
                d.set_item("rail", r.rail)?;
                d.set_item("device", &r.device)?;
                d.set_item("port", r.port)?;
                d.set_item("state", format!("{:?}", r.state).to_lowercase())?;
                d.set_item("bytes", r.bytes)?;
                d.set_item("slices", r.slices)?;
                d.set_item("errors", r.errors)?;
                d.set_item("retries", r.retries)?;
                d.set_item("renewals", r.renewals)?;
                d.set_item("readmissions", r.readmissions)?;
                d.set_item("fences", r.fences)?;
                d.set_item("inflight_bytes", r.inflight_bytes)?;
                d.set_item("throughput", r.throughput)?;
                d.set_item("last_error", r.last_error.as_deref())?;
                d.set_item("last_failover_s", r.last_failover.map(|t| t.as_secs_f64()))?;
                Ok(d)
            })
            .collect()
    }

    /// The peer's segments, as it last announced them.
    fn segments(&self) -> Vec<PyRemoteSegment> {
        self.peer.segments().into_iter().map(Into::into).collect()
    }

    /// The peer's segment with this name (the lowest id if several share it), or `None`.
    fn segment(&self, name: String) -> Option<PyRemoteSegment> {
        self.peer.segment_named(&name).map(Into::into)
    }

    /// Waits (the GIL released) until the peer announced a segment named `name`.
    ///
    /// Raises `Timeout` after `timeout_s` (`None`: no limit), `PeerLost` when the connection
    /// is lost meanwhile.
    #[pyo3(signature = (name, timeout_s=5.0))]
    fn wait_segment(
        &self,
        py: Python<'_>,
        name: String,
        timeout_s: Option<f64>,
    ) -> PyResult<PyRemoteSegment> {
        let limit = timeout(timeout_s, "timeout_s")?;
        let peer = &self.peer;
        let found = wait_until(py, limit, |slice| {
            match peer.wait_segment_named(&name, slice) {
                Ok(s) => Some(Ok(s)),
                Err(Error::Timeout { .. }) => None,
                Err(e) => Some(Err(e)),
            }
        })?;
        match found {
            Some(Ok(s)) => Ok(s.into()),
            Some(Err(e)) => Err(to_py(e)),
            None => Err(to_py(Error::Timeout {
                what: format!("waiting for {}'s segment {name:?}", peer.name()),
                after: limit.unwrap_or(Duration::MAX),
                hint: "register it on the peer first".into(),
            })),
        }
    }

    /// `wait_segment`, awaited: an asyncio future of the running loop with the `RemoteSegment`
    /// once the peer announced a segment named `name`, completed by gdr's asyncio thread without
    /// blocking the event loop. It has no timeout of its own: wrap it in
    /// `asyncio.wait_for(..., timeout)`. Raises `PeerLost` when the connection is lost first.
    /// Cancelling it only stops the wait.
    fn wait_segment_async<'py>(
        &self,
        py: Python<'py>,
        name: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::aio::segment_future(py, &self.peer, name)
    }

    /// Writes `length` bytes at `local_offset` of the local segment `local_segment` into the peer's
    /// segment `remote_segment` (a `RemoteSegment` or its id) at `remote_offset`.
    ///
    /// `notify` (bytes or str) reaches the peer after every byte landed there; `timeout_s` is
    /// the transfer's deadline (default: the agent's). Returns at once with the `Transfer`.
    /// Raises, before anything is posted, `OutOfSegment`, `UnknownSegment`, `ForeignSegment`,
    /// `InvalidArgument`, `TooLarge` (a notification over the bound) or `PeerLost`.
    #[pyo3(signature = (local_segment, local_offset, remote_segment, remote_offset, length, *, notify=None, timeout_s=None))]
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        py: Python<'_>,
        local_segment: &Bound<'_, PySegment>,
        local_offset: &Bound<'_, PyAny>,
        remote_segment: &Bound<'_, PyAny>,
        remote_offset: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
        notify: Option<&Bound<'_, PyAny>>,
        timeout_s: Option<f64>,
    ) -> PyResult<PyTransfer> {
        self.one(
            py,
            Op::Write,
            local_segment,
            local_offset,
            remote_segment,
            remote_offset,
            length,
            notify,
            timeout_s,
        )
    }

    /// Reads `length` bytes at `remote_offset` of the peer's segment `remote_segment` into the
    /// local segment `local_segment` at `local_offset` (as `write`, the other way).
    #[pyo3(signature = (local_segment, local_offset, remote_segment, remote_offset, length, *, notify=None, timeout_s=None))]
    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        py: Python<'_>,
        local_segment: &Bound<'_, PySegment>,
        local_offset: &Bound<'_, PyAny>,
        remote_segment: &Bound<'_, PyAny>,
        remote_offset: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
        notify: Option<&Bound<'_, PyAny>>,
        timeout_s: Option<f64>,
    ) -> PyResult<PyTransfer> {
        self.one(
            py,
            Op::Read,
            local_segment,
            local_offset,
            remote_segment,
            remote_offset,
            length,
            notify,
            timeout_s,
        )
    }

    /// Moves blocks in direction `op` (`"write"` or `"read"`): block `local_blocks[i]` of the
    /// local segment to or from block `remote_blocks[i]` of the peer's `remote_segment`. Block
    /// `b` of a side starts at `base + b * block_len` (`local_base`, `remote_base`: 0 by
    /// default). Runs contiguous on both sides are merged.
    ///
    /// The block lists are any iterables of ints (lists, ranges, numpy arrays). Returns at once
    /// with the `Transfer`; raises, before anything is posted, `InvalidArgument`,
    /// `IndexOutOfRange` or `BlockOutOfSegment` for a block outside its segment,
    /// `UnknownSegment`, `ForeignSegment`, `PeerLost`.
    #[pyo3(signature = (op, local_segment, local_blocks, remote_segment, remote_blocks, block_len, notify=None, timeout_s=None, *, local_base=None, remote_base=None))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_blocks(
        &self,
        py: Python<'_>,
        op: String,
        local_segment: &Bound<'_, PySegment>,
        local_blocks: &Bound<'_, PyAny>,
        remote_segment: &Bound<'_, PyAny>,
        remote_blocks: &Bound<'_, PyAny>,
        block_len: &Bound<'_, PyAny>,
        notify: Option<&Bound<'_, PyAny>>,
        timeout_s: Option<f64>,
        local_base: Option<&Bound<'_, PyAny>>,
        remote_base: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTransfer> {
        let direction = self::op(&op)?;
        let local_blocks = blocks(local_blocks, "local_blocks")?;
        let remote_id = remote(remote_segment, "remote_segment")?;
        let remote_blocks = blocks(remote_blocks, "remote_blocks")?;
        let block_len = u64_arg(block_len, "block_len")?;
        let local_base = local_base.map_or(Ok(0), |b| u64_arg(b, "local_base"))?;
        let remote_base = remote_base.map_or(Ok(0), |b| u64_arg(b, "remote_base"))?;
        let opts = options(notify, timeout_s)?;
        let (opts, deferred) = crate::post::options(
            py,
            opts,
            (local_blocks.len() as u64).saturating_mul(block_len),
        );
        let seg = &local_segment.get().seg;
        let peer = &self.peer;
        let t = py
            .allow_threads(|| {
                let table =
                    BlockTable::new(seg, &local_blocks, remote_id, &remote_blocks, block_len)
                        .local_base(local_base)
                        .remote_base(remote_base);
                peer.transfer_blocks(direction, &table, &opts)
            })
            .map_err(to_py)?;
        crate::post::queued(&self.peer, deferred);
        Ok(PyTransfer::new(t))
    }

    /// Moves the same blocks in every pool of a layered KV cache (layers x {K, V}) in direction
    /// `op`, as one transfer with one outcome: block `local_blocks[i]` of every local pool to
    /// or from block `remote_blocks[i]` of the matching pool of the peer.
    ///
    /// `pools` lists one `(local_segment, local_base, remote_segment, remote_base)` tuple per
    /// pool: the local `Segment` and the offset of its block 0, the peer's segment (a
    /// `RemoteSegment` or its id) and the offset of its block 0. Block `b` of a pool starts at
    /// its base plus `b` times the side's stride (`local_stride`, `remote_stride`: `block_len`
    /// by default; larger for padding between blocks). Runs continuing on both sides are
    /// merged. When the transfer fails, any of its blocks may or may not have landed.
    ///
    /// Returns at once with the `Transfer`; raises, before anything is posted,
    /// `InvalidArgument` (a malformed pool, index lists of different lengths, a zero block
    /// length, a stride shorter than a block, no pool), `BlockOutOfSegment` (naming the pool),
    /// `UnknownSegment`, `ForeignSegment`, `PeerLost`.
    #[pyo3(signature = (op, pools, local_blocks, remote_blocks, block_len, notify=None, timeout_s=None, *, local_stride=None, remote_stride=None))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_pools(
        &self,
        py: Python<'_>,
        op: String,
        pools: &Bound<'_, PyAny>,
        local_blocks: &Bound<'_, PyAny>,
        remote_blocks: &Bound<'_, PyAny>,
        block_len: &Bound<'_, PyAny>,
        notify: Option<&Bound<'_, PyAny>>,
        timeout_s: Option<f64>,
        local_stride: Option<&Bound<'_, PyAny>>,
        remote_stride: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTransfer> {
        let direction = self::op(&op)?;
        let lines = pool_lines(pools)?;
        let local_blocks = blocks(local_blocks, "local_blocks")?;
        let remote_blocks = blocks(remote_blocks, "remote_blocks")?;
        let block_len = u64_arg(block_len, "block_len")?;
        let local_stride = local_stride.map_or(Ok(block_len), |s| u64_arg(s, "local_stride"))?;
        let remote_stride = remote_stride.map_or(Ok(block_len), |s| u64_arg(s, "remote_stride"))?;
        let opts = options(notify, timeout_s)?;
        let (opts, deferred) = crate::post::options(
            py,
            opts,
            (local_blocks.len() as u64)
                .saturating_mul(block_len)
                .saturating_mul(lines.len() as u64),
        );
        let lines: Vec<_> = lines
            .iter()
            .map(|(seg, lb, rs, rb)| (&seg.get().seg, *lb, *rs, *rb))
            .collect();
        let peer = &self.peer;
        let t = py
            .allow_threads(|| {
                let mut table = PoolTable::new(block_len, &local_blocks, &remote_blocks)
                    .strides(local_stride, remote_stride);
                for &(seg, lb, rs, rb) in &lines {
                    table = table.pool(seg, lb, rs, rb);
                }
                peer.transfer_pools(direction, &table, &opts)
            })
            .map_err(to_py)?;
        crate::post::queued(&self.peer, deferred);
        Ok(PyTransfer::new(t))
    }

    /// Moves entries by index in direction `op` (`"write"` or `"read"`): entry
    /// `local_indices[i]` of the prepared `local` list to or from entry `remote_indices[i]` of
    /// the prepared `remote` list (which must be this peer's). The ranges were checked when the
    /// lists were made; here only the indices and the lengths of each pair are. The index lists
    /// are any iterables of ints (lists, ranges, numpy arrays).
    ///
    /// Returns at once with the `Transfer`; raises, before anything is posted,
    /// `IndexOutOfRange`, `LengthMismatch` (a pair of entries of different lengths),
    /// `InvalidArgument` (index lists of different lengths, a list prepared for another peer),
    /// `UnknownSegment` (a segment the peer removed since), `PeerLost`.
    #[pyo3(signature = (op, local, local_indices, remote, remote_indices, notify=None, timeout_s=None))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_indexed(
        &self,
        py: Python<'_>,
        op: String,
        local: &Bound<'_, PyLocalList>,
        local_indices: &Bound<'_, PyAny>,
        remote: &Bound<'_, PyRemoteList>,
        remote_indices: &Bound<'_, PyAny>,
        notify: Option<&Bound<'_, PyAny>>,
        timeout_s: Option<f64>,
    ) -> PyResult<PyTransfer> {
        let direction = self::op(&op)?;
        let local_idx = blocks(local_indices, "local_indices")?;
        let remote_idx = blocks(remote_indices, "remote_indices")?;
        let opts = options(notify, timeout_s)?;
        let (opts, deferred) = crate::post::options(py, opts, u64::MAX);
        let (local, remote) = (&local.get().list, &remote.get().list);
        let peer = &self.peer;
        let t = py
            .allow_threads(|| {
                peer.transfer_indexed(direction, local, &local_idx, remote, &remote_idx, &opts)
            })
            .map_err(to_py)?;
        crate::post::queued(&self.peer, deferred);
        Ok(PyTransfer::new(t))
    }

    /// Sends `data` (bytes or str) to the peer as a notification without a transfer: the peer
    /// takes it with `Agent.wait_notification`. The returned transfer is done once the peer's
    /// NIC took it. Raises `InvalidArgument` for an empty message or one longer than the peer
    /// takes (1 KiB by default), `PeerLost`, `AgentClosed`.
    #[pyo3(signature = (data, *, timeout_s=None))]
    fn send_notification(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        timeout_s: Option<f64>,
    ) -> PyResult<PyTransfer> {
        let data = bytes(data, "data")?;
        let mut opts = gdr_xfer::TransferOptions::new();
        if let Some(t) = timeout_s {
            opts = opts.timeout(duration(t, "timeout_s")?);
        }
        let peer = &self.peer;
        let t = py
            .allow_threads(|| peer.send_notification(data, &opts))
            .map_err(to_py)?;
        Ok(PyTransfer::new(t))
    }

    fn __repr__(&self) -> String {
        format!(
            "Peer(name={:?}, connected={})",
            self.peer.name(),
            if self.peer.is_connected() {
                "True"
            } else {
                "False"
            }
        )
    }
}
