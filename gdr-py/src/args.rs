//! Python arguments checked and converted, with gdr's exceptions for bad values, and the loop
//! every blocking call waits in (the GIL released, Ctrl-C honoured).

use std::time::{Duration, Instant};

use gdr_xfer::{Op, SegmentId, TransferOptions};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple};

use crate::buffer::type_name;
use crate::errors::invalid;
use crate::peer::PyRemoteSegment;

/// How long one wait releases the GIL before it checks for signals (Ctrl-C) and its deadline.
const TICK: Duration = Duration::from_millis(100);

/// A timeout in seconds: `None` (and `inf`) for none, else a finite, non-negative number.
///
/// # Errors
/// `InvalidArgument` for a negative number or NaN.
pub(crate) fn timeout(secs: Option<f64>, what: &str) -> PyResult<Option<Duration>> {
    let Some(s) = secs else {
        return Ok(None);
    };
    if s.is_nan() || s < 0.0 {
        return Err(invalid(
            "InvalidArgument",
            format!("{what} = {s}"),
            "give a number of seconds >= 0, or None for no limit",
        ));
    }
    // Past what a Duration holds (or infinite): no limit.
    Ok(Duration::try_from_secs_f64(s).ok())
}

/// A timeout that must be given (a transfer's deadline, an agent setting).
pub(crate) fn duration(secs: f64, what: &str) -> PyResult<Duration> {
    match timeout(Some(secs), what)? {
        Some(d) => Ok(d),
        None => Err(invalid(
            "InvalidArgument",
            format!("{what} = {secs}"),
            "give a finite number of seconds",
        )),
    }
}

/// A non-negative integer below 2^64 (an offset, a length).
pub(crate) fn u64_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    obj.extract::<u64>().map_err(|_| {
        let shown = obj
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| type_name(obj));
        invalid(
            "InvalidArgument",
            format!("{what} = {shown} is not an integer in 0..2**64"),
            "give a non-negative int",
        )
    })
}

/// Block indices: any iterable of integers in `0..2**32` (a list, a range, a numpy array).
/// Numpy arrays are read in one piece, everything else item by item.
pub(crate) fn blocks(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    let index = |i: usize, item: &Bound<'_, PyAny>| {
        item.extract::<u32>().map_err(|_| {
            let shown = item
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| type_name(item));
            invalid(
                "InvalidArgument",
                format!("{what}[{i}] = {shown} is not a block index (an int in 0..2**32)"),
                "block indices are non-negative ints below 2**32",
            )
        })
    };
    // Lists and tuples are not arrays: no attribute probing (a failed one raises and drops an
    // AttributeError, thousands of instructions).
    let sequence = obj.is_exact_instance_of::<PyList>() || obj.is_exact_instance_of::<PyTuple>();
    if !sequence {
        if let Some(v) = integer_array(obj, what)? {
            return Ok(v);
        }
    }
    let iter = obj.try_iter().map_err(|_| {
        invalid(
            "InvalidArgument",
            format!("{what} is a {}, not a sequence of ints", type_name(obj)),
            "give a list, range or numpy array of block indices",
        )
    })?;
    let mut out = Vec::with_capacity(presize(obj));
    for (i, item) in iter.enumerate() {
        push(&mut out, index(i, &item?)?)?;
    }
    Ok(out)
}

/// The most items a list is sized for from what its `__len__` claims: a longer list grows as
/// its items actually come, so a `__len__` that lies (2**40, 2**62) allocates nothing.
const PRESIZE_MAX: usize = 1 << 16;

/// The capacity to start a list of `obj`'s items with: its `__len__`, up to [`PRESIZE_MAX`].
pub(crate) fn presize(obj: &Bound<'_, PyAny>) -> usize {
    obj.len().unwrap_or(0).min(PRESIZE_MAX)
}

/// Pushes `v`, growing `out` with `try_reserve`: an iterable too long for memory raises
/// `MemoryError` instead of aborting the process.
pub(crate) fn push<T>(out: &mut Vec<T>, v: T) -> PyResult<()> {
    if out.len() == out.capacity() {
        out.try_reserve(out.len().max(16)).map_err(|e| {
            pyo3::exceptions::PyMemoryError::new_err(format!(
                "gdr: a list of {} items cannot grow ({e})",
                out.len()
            ))
        })?;
    }
    out.push(v);
    Ok(())
}

/// A copy of `data`, or `MemoryError` when it cannot be allocated (never an abort).
pub(crate) fn copied(data: &[u8]) -> PyResult<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(data.len()).map_err(|e| {
        pyo3::exceptions::PyMemoryError::new_err(format!(
            "gdr: cannot copy {} bytes ({e})",
            data.len()
        ))
    })?;
    v.extend_from_slice(data);
    Ok(v)
}

/// Block indices from a one-dimensional numpy array of integers, read in one piece: its bytes
/// (`tobytes()`, a copy) decoded here, instead of one Python int per index (four times slower
/// than a list's). `None` for anything else (the caller iterates it). The attribute names are
/// interned: a handful of attribute reads per call.
fn integer_array(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<Vec<u32>>> {
    let py = obj.py();
    let Ok(dtype) = obj.getattr(intern!(py, "dtype")) else {
        return Ok(None);
    };
    let Ok(ndim) = obj.getattr(intern!(py, "ndim")) else {
        return Ok(None);
    };
    if ndim.extract::<usize>().ok() != Some(1) {
        return Ok(None);
    }
    // `kind`, `byteorder` (one-character strings Python keeps) and `itemsize`: cheaper than
    // `dtype.str`, which numpy formats with sprintf on every read.
    let text = |name: &Bound<'_, pyo3::types::PyString>| -> Option<char> {
        let v = dtype.getattr(name).ok()?;
        let s = v.downcast::<PyString>().ok()?.to_cow().ok()?;
        let mut chars = s.chars();
        chars.next().filter(|_| chars.next().is_none())
    };
    let (Some(kind), Some(order)) = (text(intern!(py, "kind")), text(intern!(py, "byteorder")))
    else {
        return Ok(None);
    };
    let Ok(size) = dtype
        .getattr(intern!(py, "itemsize"))
        .and_then(|n| n.extract::<usize>())
    else {
        return Ok(None);
    };
    let signed = match kind {
        'i' => true,
        'u' => false,
        _ => return Ok(None),
    };
    // '=' is the machine's order, '|' has none (one byte); '<' little, '>' big.
    let big = match order {
        '>' => true,
        '<' | '|' => false,
        '=' => cfg!(target_endian = "big"),
        _ => return Ok(None),
    };
    if ![1, 2, 4, 8].contains(&size) {
        return Ok(None);
    }
    let raw = obj.call_method0(intern!(py, "tobytes"))?;
    let raw = raw.downcast::<pyo3::types::PyBytes>()?.as_bytes();
    // An object that only looks like an array may hand back bytes that disagree with its own
    // item size or length: refused, not decoded into other indices.
    let len = obj.len().ok();
    if raw.len() % size != 0 || len.is_some_and(|n| n.checked_mul(size) != Some(raw.len())) {
        return Err(invalid(
            "InvalidArgument",
            format!(
                "{what}: tobytes() gave {} bytes for {} items of {size} bytes",
                raw.len(),
                len.map_or_else(|| "?".to_string(), |n| n.to_string())
            ),
            "give a list, range or numpy array of block indices",
        ));
    }
    // Reserved fallibly (never an abort), zeroed within that room, then written in place:
    // a `push` per index after `try_reserve_exact` cost 9 more instructions per index under
    // callgrind (a capacity check the optimizer could no longer drop).
    let n = raw.len() / size;
    let mut out: Vec<u32> = Vec::new();
    out.try_reserve_exact(n).map_err(|e| {
        pyo3::exceptions::PyMemoryError::new_err(format!("gdr: {what}: {n} indices ({e})"))
    })?;
    out.resize(n, 0);
    for (i, (slot, b)) in out.iter_mut().zip(raw.chunks_exact(size)).enumerate() {
        let mut word = [0u8; 8];
        if big {
            word[8 - size..].copy_from_slice(b);
        } else {
            word[..size].copy_from_slice(b);
        }
        let unsigned = if big {
            u64::from_be_bytes(word)
        } else {
            u64::from_le_bytes(word)
        };
        // Sign-extend a negative value of a signed type.
        let value: i128 = if signed && (unsigned >> (size * 8 - 1)) & 1 == 1 {
            i128::from(unsigned) - (1i128 << (size * 8))
        } else {
            i128::from(unsigned)
        };
        let Ok(v) = u32::try_from(value) else {
            return Err(invalid(
                "InvalidArgument",
                format!("{what}[{i}] = {value} is not a block index (an int in 0..2**32)"),
                "block indices are non-negative ints below 2**32",
            ));
        };
        *slot = v;
    }
    Ok(Some(out))
}

/// Bytes from `bytes`, `bytearray`, `str` (UTF-8) or any object with the buffer protocol.
pub(crate) fn bytes(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.downcast::<PyBytes>() {
        return copied(b.as_bytes());
    }
    if let Ok(b) = obj.downcast::<PyByteArray>() {
        // SAFETY: the GIL is held and no Python code runs while the bytes are copied, so the
        // bytearray cannot be resized meanwhile.
        return copied(unsafe { b.as_bytes() });
    }
    if let Ok(s) = obj.downcast::<PyString>() {
        return copied(s.to_cow()?.as_bytes());
    }
    let exported = PyModule::import(obj.py(), "builtins")?
        .getattr("memoryview")?
        .call1((obj,))
        .and_then(|v| v.call_method0("tobytes"));
    match exported {
        Ok(b) => copied(b.downcast::<PyBytes>()?.as_bytes()),
        Err(_) => Err(invalid(
            "NotABuffer",
            format!("{what} is a {}, not bytes", type_name(obj)),
            "give bytes, a bytearray, a str or another buffer",
        )),
    }
}

/// A direction: `"write"` or `"read"`.
pub(crate) fn op(name: &str) -> PyResult<Op> {
    match name {
        "write" => Ok(Op::Write),
        "read" => Ok(Op::Read),
        other => Err(invalid(
            "InvalidArgument",
            format!("op = {other:?}"),
            "use \"write\" (local to remote) or \"read\" (remote to local)",
        )),
    }
}

/// The name of a direction.
pub(crate) fn op_name(op: Op) -> &'static str {
    match op {
        Op::Write => "write",
        Op::Read => "read",
    }
}

/// A peer's segment: a `RemoteSegment` or its id.
pub(crate) fn remote(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<SegmentId> {
    if let Ok(r) = obj.downcast::<PyRemoteSegment>() {
        return Ok(SegmentId::new(r.get().id));
    }
    obj.extract::<u32>().map(SegmentId::new).map_err(|_| {
        invalid(
            "InvalidArgument",
            format!(
                "{what} is a {}, not a RemoteSegment or a segment id",
                type_name(obj)
            ),
            "pass what Peer.wait_segment returned, or its id",
        )
    })
}

/// A transfer's options from its keyword arguments.
pub(crate) fn options(
    notify: Option<&Bound<'_, PyAny>>,
    timeout_s: Option<f64>,
) -> PyResult<TransferOptions> {
    let mut opts = TransferOptions::new();
    if let Some(n) = notify {
        if !n.is_none() {
            opts = opts.notify(bytes(n, "notify")?);
        }
    }
    if let Some(t) = timeout_s {
        opts = opts.timeout(duration(t, "timeout_s")?);
    }
    Ok(opts)
}

/// Calls `step` with slices of at most [`TICK`] until it returns `Some` or `limit` passes
/// (`Ok(None)`), with the GIL released during each slice and Python's signal handlers run
/// between them (Ctrl-C raises `KeyboardInterrupt`).
pub(crate) fn wait_until<T: Send>(
    py: Python<'_>,
    limit: Option<Duration>,
    mut step: impl FnMut(Duration) -> Option<T> + Send,
) -> PyResult<Option<T>> {
    let end = limit.and_then(|l| Instant::now().checked_add(l));
    loop {
        let slice = end.map_or(TICK, |e| {
            e.saturating_duration_since(Instant::now()).min(TICK)
        });
        if let Some(v) = py.allow_threads(|| step(slice)) {
            return Ok(Some(v));
        }
        py.check_signals()?;
        if end.is_some_and(|e| Instant::now() >= e) {
            return Ok(None);
        }
    }
}
