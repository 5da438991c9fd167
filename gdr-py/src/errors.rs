//! gdr-xfer's errors as Python exceptions: the class is chosen by matching the variant of
//! [`gdr_xfer::Error`] (never by reading its text), and the variant's fields become the
//! exception's attributes. The classes are defined in Python (`gdr/_errors.py`), so that they
//! can also derive from the built-in exception of the same concept (`ValueError`,
//! `TimeoutError`, `ConnectionError`, `OSError`).

use std::time::Duration;

use gdr_xfer::gdr;
use gdr_xfer::{Error, Foreign, Side};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::PyModule;
use pyo3::IntoPyObjectExt;

/// The module that defines the exception classes.
const ERRORS_MODULE: &str = "gdr._errors";

static ERRORS: GILOnceCell<Py<PyModule>> = GILOnceCell::new();

/// An attribute of an exception: its name and its value.
type Attr = (&'static str, PyObject);

/// The exception `class` of `gdr._errors`, with message `message` and attributes `attrs`
/// (`hint` among them when the error has one). Never fails: should the class be missing (a
/// broken installation), a `RuntimeError` with the same message is returned instead.
pub(crate) fn exception(
    py: Python<'_>,
    class: &str,
    message: String,
    hint: Option<&str>,
    attrs: Vec<Attr>,
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let module = ERRORS.get_or_try_init(py, || {
            PyModule::import(py, ERRORS_MODULE).map(Bound::unbind)
        })?;
        let class = module.bind(py).getattr(class)?;
        let value = class.call1((message.clone(),))?;
        value.setattr("hint", hint)?;
        for (name, v) in attrs {
            value.setattr(name, v)?;
        }
        Ok(PyErr::from_value(value))
    };
    build().unwrap_or_else(|e| {
        PyRuntimeError::new_err(format!(
            "{message} (and gdr's exception class {class} could not be made: {e})"
        ))
    })
}

/// A binding-level `gdr._errors.InvalidArgument` or one of its subclasses (`NotABuffer`,
/// `ReadOnlyBuffer`, `NotContiguous`), for input refused before the engine saw it.
pub(crate) fn invalid(class: &str, message: impl Into<String>, hint: &str) -> PyErr {
    Python::with_gil(|py| exception(py, class, message.into(), Some(hint), Vec::new()))
}

/// The Python exception for an engine error.
pub(crate) fn to_py(e: Error) -> PyErr {
    Python::with_gil(|py| convert(py, e))
}

fn obj<'py, T: IntoPyObjectExt<'py>>(py: Python<'py>, v: T) -> PyObject {
    // Strings, integers, floats and `None` always convert; `None` stands in should one not.
    v.into_py_any(py).unwrap_or_else(|_| py.None())
}

fn side(s: Side) -> &'static str {
    match s {
        Side::Local => "local",
        Side::Remote => "remote",
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The class, the hint and the attributes of `e`; then the exception.
fn convert(py: Python<'_>, e: Error) -> PyErr {
    let message = e.to_string();
    let (class, hint, attrs): (&str, Option<String>, Vec<Attr>) = match &e {
        Error::Gdr(g) => return convert_gdr(py, g, message),
        Error::InvalidArgument { what, hint } => (
            "InvalidArgument",
            hint.text().map(str::to_owned),
            vec![("what", obj(py, what.as_str()))],
        ),
        Error::TooLarge {
            what,
            len,
            max,
            hint,
        } => (
            "TooLarge",
            hint.text().map(str::to_owned),
            vec![
                ("what", obj(py, what.as_str())),
                ("length", obj(py, *len)),
                ("max", obj(py, *max)),
            ],
        ),
        Error::OutOfSegment {
            index,
            side: s,
            segment,
            offset,
            len,
            segment_len,
            hint,
        } => (
            "OutOfSegment",
            hint.text().map(str::to_owned),
            vec![
                ("index", obj(py, *index)),
                ("side", obj(py, side(*s))),
                ("segment", obj(py, segment.get())),
                ("offset", obj(py, *offset)),
                ("length", obj(py, *len)),
                ("segment_len", obj(py, *segment_len)),
            ],
        ),
        Error::UnknownSegment {
            owner,
            segment,
            hint,
        } => (
            "UnknownSegment",
            hint.text().map(str::to_owned),
            vec![
                ("owner", obj(py, owner.as_str())),
                ("segment", obj(py, segment.get())),
            ],
        ),
        Error::ForeignSegment {
            index,
            segment,
            hint,
        } => (
            "ForeignSegment",
            hint.text().map(str::to_owned),
            vec![
                ("index", obj(py, *index)),
                ("segment", obj(py, segment.get())),
            ],
        ),
        Error::ForeignObject { call, object, hint } => {
            let (kind, segment, peer) = match object {
                Foreign::Segment(id) => ("segment", Some(id.get()), None),
                Foreign::Peer(name) => ("peer", None, Some(name.as_str())),
                Foreign::RemoteList(name) => ("remote list", None, Some(name.as_str())),
                _ => ("object", None, None),
            };
            (
                "ForeignObject",
                hint.text().map(str::to_owned),
                vec![
                    ("call", obj(py, *call)),
                    ("kind", obj(py, kind)),
                    ("segment", obj(py, segment)),
                    ("peer", obj(py, peer)),
                ],
            )
        }
        Error::Cancelled { peer } => ("Cancelled", None, vec![("peer", obj(py, peer.as_str()))]),
        Error::Rejected { peer, why, hint } => (
            "Rejected",
            hint.text().map(str::to_owned),
            vec![
                ("peer", obj(py, peer.as_str())),
                ("detail", obj(py, why.to_string())),
            ],
        ),
        Error::LengthMismatch {
            index,
            local_len,
            remote_len,
        } => (
            "LengthMismatch",
            None,
            vec![
                ("index", obj(py, *index)),
                ("local_len", obj(py, *local_len)),
                ("remote_len", obj(py, *remote_len)),
            ],
        ),
        Error::IndexOutOfRange { list, index, len } => (
            "IndexOutOfRange",
            None,
            vec![
                ("list", obj(py, *list)),
                ("index", obj(py, *index)),
                ("length", obj(py, *len)),
            ],
        ),
        Error::BlockOutOfSegment {
            pool,
            side: s,
            block,
            segment,
            offset,
            block_len,
            segment_len,
            hint,
        } => (
            "BlockOutOfSegment",
            hint.text().map(str::to_owned),
            vec![
                ("pool", obj(py, *pool)),
                ("side", obj(py, side(*s))),
                ("block", obj(py, *block)),
                ("segment", obj(py, segment.get())),
                ("offset", obj(py, *offset)),
                ("block_len", obj(py, *block_len)),
                ("segment_len", obj(py, *segment_len)),
            ],
        ),
        Error::UnknownPeer { name, hint } => (
            "UnknownPeer",
            hint.text().map(str::to_owned),
            vec![("name", obj(py, name.as_str()))],
        ),
        Error::PeerLost { peer, why, hint } => (
            "PeerLost",
            hint.text().map(str::to_owned),
            vec![
                ("peer", obj(py, peer.as_str())),
                ("reason", obj(py, why.to_string())),
                ("why", obj(py, lost_kind(why))),
            ],
        ),
        Error::Protocol { peer, detail, hint } => (
            "ProtocolError",
            hint.text().map(str::to_owned),
            vec![
                ("peer", obj(py, peer.as_str())),
                ("detail", obj(py, detail.as_str())),
            ],
        ),
        Error::Timeout { what, after, hint } => (
            "Timeout",
            hint.text().map(str::to_owned),
            vec![
                ("what", obj(py, what.as_str())),
                ("after_s", obj(py, secs(*after))),
            ],
        ),
        Error::SliceFailed {
            peer,
            qp_num,
            status,
            vendor_err,
            hint,
        } => (
            "SliceFailed",
            hint.text().map(str::to_owned),
            vec![
                ("peer", obj(py, peer.as_str())),
                ("qp_num", obj(py, *qp_num)),
                ("status", obj(py, status.to_string())),
                ("vendor_err", obj(py, *vendor_err)),
            ],
        ),
        Error::NoRail { peer, rails, hint } => (
            "NoRail",
            hint.text().map(str::to_owned),
            vec![
                ("peer", obj(py, peer.as_str())),
                ("detail", obj(py, rails.to_string())),
            ],
        ),
        Error::AgentClosed => ("AgentClosed", None, Vec::new()),
        Error::StagingFailed { peer, error, hint } => (
            "StagingFailed",
            hint.text().map(str::to_owned),
            vec![
                ("peer", obj(py, peer.as_str())),
                ("detail", obj(py, error.to_string())),
            ],
        ),
        Error::NameTaken {
            call,
            name,
            key,
            holder_lease,
            hint,
        } => (
            "NameTaken",
            hint.text().map(str::to_owned),
            vec![
                ("call", obj(py, *call)),
                ("name", obj(py, name.as_str())),
                ("key", obj(py, key.as_str())),
                ("holder_lease", obj(py, *holder_lease)),
            ],
        ),
        Error::Directory {
            op,
            key,
            detail,
            hint,
        } => (
            "DirectoryError",
            hint.text().map(str::to_owned),
            vec![
                ("op", obj(py, *op)),
                ("key", obj(py, key.as_str())),
                ("detail", obj(py, detail.as_str())),
            ],
        ),
        Error::Io { what, source } => (
            "IoError",
            None,
            vec![
                ("what", obj(py, what.as_str())),
                ("errno", obj(py, source.raw_os_error())),
            ],
        ),
        // The enum is `#[non_exhaustive]`: a variant added later is still a GdrError.
        _ => ("GdrError", None, Vec::new()),
    };
    exception(py, class, message, hint.as_deref(), attrs)
}

/// gdr's own errors (those gdr-xfer does not map to a variant of its own): `RdmaError`, or its
/// subclasses for the cases a caller handles differently.
fn convert_gdr(py: Python<'_>, g: &gdr::Error, message: String) -> PyErr {
    let errno = ("errno", obj(py, g.errno()));
    let (class, attrs) = match g {
        gdr::Error::DeviceNotFound {
            wanted, available, ..
        } => (
            "DeviceNotFound",
            vec![
                ("wanted", obj(py, wanted.as_str())),
                ("available", obj(py, available.clone())),
                errno,
            ],
        ),
        gdr::Error::Unsupported { what, .. } => {
            ("Unsupported", vec![("what", obj(py, what.as_str())), errno])
        }
        gdr::Error::NotGpuMemory { address, kind, .. } => (
            "NotGpuMemory",
            vec![
                ("address", obj(py, *address)),
                ("kind", obj(py, kind.as_str())),
                errno,
            ],
        ),
        _ => ("RdmaError", vec![errno]),
    };
    exception(py, class, message, g.hint(), attrs)
}

/// One error of each variant, by the name of its Python class, converted: for the host tests of
/// the mapping (`gdr._gdr._error_for_test`). `None` for a name that is not one.
pub(crate) fn sample(py: Python<'_>, class: &str) -> Option<PyErr> {
    use gdr_xfer::{Hint, SegmentId};
    let hint = || Hint::new("a hint");
    let seg = SegmentId::new(7);
    let e = match class {
        "InvalidArgument" => Error::invalid("len 0", "pass a length"),
        "TooLarge" => Error::TooLarge {
            what: "segment name".into(),
            len: 65,
            max: 64,
            hint: hint(),
        },
        "OutOfSegment" => Error::OutOfSegment {
            index: Some(2),
            side: Side::Remote,
            segment: seg,
            offset: 4000,
            len: 200,
            segment_len: 4096,
            hint: hint(),
        },
        "UnknownSegment" => Error::UnknownSegment {
            owner: "peer-b".into(),
            segment: seg,
            hint: hint(),
        },
        "ForeignSegment" => Error::ForeignSegment {
            index: 0,
            segment: seg,
            hint: hint(),
        },
        "ForeignObject" => Error::ForeignObject {
            call: "Agent::register_within",
            object: gdr_xfer::Foreign::Segment(seg),
            hint: hint(),
        },
        "Cancelled" => Error::Cancelled {
            peer: "peer-b".into(),
        },
        "Rejected" => Error::Rejected {
            peer: "peer-b".into(),
            why: gdr_xfer::Rejection::Empty,
            hint: hint(),
        },
        "LengthMismatch" => Error::LengthMismatch {
            index: 1,
            local_len: 10,
            remote_len: 20,
        },
        "IndexOutOfRange" => Error::IndexOutOfRange {
            list: "local blocks",
            index: 9,
            len: 4,
        },
        "BlockOutOfSegment" => Error::BlockOutOfSegment {
            pool: 0,
            side: Side::Local,
            block: 9,
            segment: seg,
            offset: 9 * 4096,
            block_len: 4096,
            segment_len: 4 * 4096,
            hint: hint(),
        },
        "UnknownPeer" => Error::UnknownPeer {
            name: "nobody".into(),
            hint: hint(),
        },
        "PeerLost" => Error::PeerLost {
            peer: "peer-b".into(),
            why: gdr_xfer::Lost::Disconnected,
            hint: hint(),
        },
        "ProtocolError" => Error::Protocol {
            peer: "10.0.0.2:7000".into(),
            detail: "bad kind".into(),
            hint: hint(),
        },
        "Timeout" => Error::Timeout {
            what: "waiting".into(),
            after: Duration::from_millis(250),
            hint: hint(),
        },
        "SliceFailed" => Error::SliceFailed {
            peer: "peer-b".into(),
            qp_num: 0x11,
            status: gdr::WcStatus::RemoteAccess,
            vendor_err: 0x88,
            hint: hint(),
        },
        "NoRail" => Error::NoRail {
            peer: "peer-b".into(),
            rails: gdr_xfer::RailReports(vec![gdr_xfer::RailReport {
                rail: 0,
                state: gdr_xfer::RailState::Paused,
                last_error: Some(gdr_xfer::RailFault::Unanswered),
            }]),
            hint: hint(),
        },
        "AgentClosed" => Error::AgentClosed,
        "StagingFailed" => Error::StagingFailed {
            peer: "peer-b".into(),
            error: gdr_xfer::DriverError::new(std::io::Error::other("copy failed")),
            hint: hint(),
        },
        "DirectoryError" => Error::Directory {
            op: "put",
            key: "/gdr/a".into(),
            detail: "unavailable".into(),
            hint: hint(),
        },
        "NameTaken" => Error::NameTaken {
            call: "Agent::publish",
            name: "svc".into(),
            key: "/gdr-xfer/agents/svc/endpoint".into(),
            holder_lease: 0x1234,
            hint: hint(),
        },
        "IoError" => Error::io(
            "listening on 10.0.0.1:1",
            std::io::Error::from_raw_os_error(98),
        ),
        "RdmaError" => Error::Gdr(gdr::Error::Verbs {
            call: "ibv_reg_mr",
            args: "len=4096".into(),
            source: std::io::Error::from_raw_os_error(12),
            hint: hint(),
        }),
        "DeviceNotFound" => Error::Gdr(gdr::Error::DeviceNotFound {
            wanted: "mlx5_9".into(),
            available: vec!["rxe0".into()],
            hint: hint(),
        }),
        "Unsupported" => Error::Gdr(gdr::Error::unsupported("dma-buf", "use a newer driver")),
        "NotGpuMemory" => Error::Gdr(gdr::Error::NotGpuMemory {
            address: 0x7f00_0000_1000,
            kind: gdr::cuda::PointerType::PageableHost,
            hint: hint(),
        }),
        _ => return None,
    };
    Some(convert(py, e))
}

/// `PeerLost.why`: which way the connection ended, a name to compare (`reason` has the words).
fn lost_kind(why: &gdr_xfer::Lost) -> &'static str {
    match why {
        gdr_xfer::Lost::Disconnected => "disconnected",
        gdr_xfer::Lost::Message {
            why: gdr_xfer::TableError::Goodbye { .. },
        } => "goodbye",
        gdr_xfer::Lost::Message { .. } => "protocol",
        gdr_xfer::Lost::Link { .. } => "link",
        gdr_xfer::Lost::Handshake => "handshake",
        gdr_xfer::Lost::Unlisted => "unlisted",
        gdr_xfer::Lost::EngineFault => "engine_fault",
    }
}
