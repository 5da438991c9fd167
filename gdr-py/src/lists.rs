//! `gdr.LocalList` and `gdr.RemoteList`: ranges checked once, then named by index in
//! `Peer.transfer_indexed` (NIXL's prepared descriptor lists).

use gdr_xfer::{LocalList, RemoteList, SegmentId};
use pyo3::prelude::*;

use crate::args::{presize, push, remote, u64_arg};
use crate::buffer::type_name;
use crate::errors::{invalid, to_py};
use crate::peer::PyPeer;
use crate::segment::PySegment;

/// `(what, offset, length)` triples from any iterable of 3-sequences; `what` converted by
/// `first`.
fn triples<'py, T>(
    obj: &Bound<'py, PyAny>,
    shape: &str,
    mut first: impl FnMut(&Bound<'py, PyAny>, usize) -> PyResult<T>,
) -> PyResult<Vec<(T, u64, u64)>> {
    let bad = |what: String| {
        invalid(
            "InvalidArgument",
            what,
            &format!("give a list of {shape} tuples"),
        )
    };
    let iter = obj
        .try_iter()
        .map_err(|_| bad(format!("ranges is a {}, not a list", type_name(obj))))?;
    let mut out = Vec::with_capacity(presize(obj));
    for (i, item) in iter.enumerate() {
        let item = item?;
        let fields: Vec<Bound<'py, PyAny>> = match item.try_iter() {
            // One more than needed tells a wrong length, whatever the item claims.
            Ok(it) => it.take(4).collect::<PyResult<_>>()?,
            Err(_) => return Err(bad(format!("ranges[{i}] is a {}", type_name(&item)))),
        };
        let [what, offset, length] = fields.as_slice() else {
            return Err(bad(format!(
                "ranges[{i}] has {} items, not 3",
                if fields.len() > 3 {
                    "more".to_string()
                } else {
                    fields.len().to_string()
                }
            )));
        };
        let entry = (
            first(what, i)?,
            u64_arg(offset, &format!("ranges[{i}][1] (offset)"))?,
            u64_arg(length, &format!("ranges[{i}][2] (length)"))?,
        );
        push(&mut out, entry)?;
    }
    Ok(out)
}

/// Ranges of this agent's segments, checked once (each inside its segment, none empty), then
/// named by index in `Peer.transfer_indexed`: `LocalList([(segment, offset, length), ...])`.
/// It holds its segments' memory as a request would.
///
/// Raises `OutOfSegment` for a range outside its segment, `InvalidArgument` for an empty range
/// or a malformed tuple.
#[pyclass(module = "gdr._gdr", name = "LocalList", frozen)]
pub(crate) struct PyLocalList {
    pub(crate) list: LocalList,
}

#[pymethods]
impl PyLocalList {
    #[new]
    fn new(py: Python<'_>, ranges: &Bound<'_, PyAny>) -> PyResult<Self> {
        let entries = triples(ranges, "(Segment, offset, length)", |s, i| {
            s.downcast::<PySegment>().cloned().map_err(|_| {
                invalid(
                    "InvalidArgument",
                    format!("ranges[{i}][0] is a {}, not a Segment", type_name(s)),
                    "give a list of (Segment, offset, length) tuples",
                )
            })
        })?;
        let refs: Vec<_> = entries
            .iter()
            .map(|(s, o, l)| (&s.get().seg, *o, *l))
            .collect();
        let list = py.allow_threads(|| LocalList::new(&refs)).map_err(to_py)?;
        Ok(PyLocalList { list })
    }

    fn __len__(&self) -> usize {
        self.list.len()
    }

    fn __repr__(&self) -> String {
        format!("LocalList({} ranges)", self.list.len())
    }
}

/// Ranges of one peer's segments, checked once against the segment table it announced, then
/// named by index in that peer's `transfer_indexed`:
/// `RemoteList(peer, [(remote_segment, offset, length), ...])` (a `RemoteSegment` or its id).
///
/// Raises `UnknownSegment` for a segment the peer does not have, `OutOfSegment` for a range
/// outside it, `InvalidArgument` for an empty range or a malformed tuple.
#[pyclass(module = "gdr._gdr", name = "RemoteList", frozen)]
pub(crate) struct PyRemoteList {
    pub(crate) list: RemoteList,
    peer: String,
}

#[pymethods]
impl PyRemoteList {
    #[new]
    fn new(py: Python<'_>, peer: &Bound<'_, PyPeer>, ranges: &Bound<'_, PyAny>) -> PyResult<Self> {
        let entries: Vec<(SegmentId, u64, u64)> =
            triples(ranges, "(RemoteSegment or id, offset, length)", |s, i| {
                remote(s, &format!("ranges[{i}][0] (remote_segment)"))
            })?;
        let peer = &peer.get().peer;
        let list = py
            .allow_threads(|| peer.prepare_remote(&entries))
            .map_err(to_py)?;
        Ok(PyRemoteList {
            list,
            peer: peer.name().to_owned(),
        })
    }

    /// The name of the peer it was prepared for.
    #[getter]
    fn peer(&self) -> &str {
        &self.peer
    }

    fn __len__(&self) -> usize {
        self.list.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "RemoteList(peer={:?}, {} ranges)",
            self.peer,
            self.list.len()
        )
    }
}
