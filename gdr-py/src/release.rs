//! Giving Python objects back from the engine's threads.
//!
//! A registered buffer's last reference may be dropped on any thread: a progress thread retiring
//! the last request that used it, or the thread that deregistered it. Those threads must never
//! wait for the GIL (a progress thread waiting for it would stall every transfer of its rail
//! while Python runs, and a thread holding an engine lock while waiting for it could deadlock
//! against a Python thread waiting for that lock). So the release closure only queues the
//! object; one thread of this module ("gdr-py-release") takes the GIL and releases the queued
//! buffer exports and references.
//!
//! At interpreter exit (`gdr._gdr._at_exit`, an `atexit` handler) the queue is drained, and from
//! then on objects are leaked instead: once Python finalizes, a thread that asks for the GIL is
//! stopped inside CPython, which Rust frames cannot unwind through.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// Set by the `atexit` handler: release nothing more through Python.
static FINALIZING: AtomicBool = AtomicBool::new(false);
/// Held by the release thread while it holds (or asks for) the GIL, and by the `atexit` handler
/// while it sets [`FINALIZING`]: the release thread never asks for the GIL after that.
static RELEASING: Mutex<()> = Mutex::new(());
/// Buffers registered with an agent (their exports taken).
static EXPORTED: AtomicU64 = AtomicU64::new(0);
/// Buffers handed to the release thread (their registrations are gone).
static HANDED_BACK: AtomicU64 = AtomicU64::new(0);
/// Buffers whose export and reference the release thread has dropped.
static RELEASED: AtomicU64 = AtomicU64::new(0);
/// Buffers leaked at interpreter exit.
static LEAKED: AtomicU64 = AtomicU64::new(0);

/// What a registration holds of a Python object: given back under the GIL, on the release
/// thread.
pub(crate) trait Held: Send {
    /// Gives the memory back to its owner (the GIL is held).
    fn release(self: Box<Self>, py: Python<'_>);
}

/// The release thread's queue; `None` when the thread could not be started.
static QUEUE: OnceLock<Option<Sender<Box<dyn Held>>>> = OnceLock::new();

/// Counts a buffer export taken for a registration.
pub(crate) fn exported() {
    EXPORTED.fetch_add(1, Ordering::Relaxed);
}

/// Hands `held` (a buffer export or a DLPack tensor, with the registered object) back to
/// Python: queued for the release thread, which releases it under the GIL. Never blocks and
/// never takes the GIL itself; callable from any thread.
pub(crate) fn hand_back(held: Box<dyn Held>) {
    HANDED_BACK.fetch_add(1, Ordering::Relaxed);
    if FINALIZING.load(Ordering::Acquire) {
        leak(held);
        return;
    }
    let queue = QUEUE.get_or_init(start);
    let Some(queue) = queue else {
        leak(held);
        return;
    };
    if let Err(e) = queue.send(held) {
        leak(e.0);
    }
}

/// Runs `f` under the GIL from one of this module's own threads (never an engine thread),
/// unless the interpreter is finalizing: then `f` does not run and `None` comes back (what it
/// would have touched is left to leak). Serialised with the `atexit` handler like the release
/// thread, so no thread of this module asks for the GIL once finalization began.
pub(crate) fn with_python<T>(f: impl FnOnce(Python<'_>) -> T) -> Option<T> {
    let _releasing = RELEASING.lock().unwrap_or_else(|p| p.into_inner());
    if FINALIZING.load(Ordering::Acquire) {
        return None;
    }
    Some(Python::with_gil(f))
}

/// Keeps the object (and its memory) for the rest of the process, without touching Python.
fn leak(held: Box<dyn Held>) {
    LEAKED.fetch_add(1, Ordering::Relaxed);
    std::mem::forget(held);
}

fn start() -> Option<Sender<Box<dyn Held>>> {
    let (tx, rx) = channel();
    match std::thread::Builder::new()
        .name("gdr-py-release".into())
        .spawn(move || run(rx))
    {
        Ok(_) => Some(tx),
        Err(e) => {
            log::error!("gdr-py: cannot start the release thread ({e}); registered buffers will be kept until exit");
            None
        }
    }
}

/// The release thread: each queued object's export is released and its reference dropped,
/// under the GIL.
fn run(rx: Receiver<Box<dyn Held>>) {
    while let Ok(held) = rx.recv() {
        let _releasing = RELEASING.lock().unwrap_or_else(|p| p.into_inner());
        if FINALIZING.load(Ordering::Acquire) {
            leak(held);
            continue;
        }
        Python::with_gil(|py| {
            held.release(py);
            // Counted before the GIL goes: Python code that saw the object die sees it counted.
            RELEASED.fetch_add(1, Ordering::Release);
        });
    }
}

/// The `atexit` handler: waits (up to a second, without the GIL) for the release thread to
/// release what was handed to it, then stops it from asking for the GIL again. Buffers still
/// registered (agents and segments alive at exit) are leaked when the interpreter drops them.
#[pyfunction]
pub(crate) fn _at_exit(py: Python<'_>) {
    py.allow_threads(|| {
        let end = Instant::now() + Duration::from_secs(1);
        while RELEASED.load(Ordering::Acquire) + LEAKED.load(Ordering::Relaxed)
            < HANDED_BACK.load(Ordering::Relaxed)
            && Instant::now() < end
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        let _releasing = RELEASING.lock().unwrap_or_else(|p| p.into_inner());
        FINALIZING.store(true, Ordering::Release);
    });
}

/// Counters of registered buffers, for tests and leak checks: `exported` (buffers registered),
/// `handed_back` (registrations gone), `released` (exports and references dropped) and `leaked`
/// (kept at exit).
#[pyfunction]
pub(crate) fn _release_stats(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let d = pyo3::types::PyDict::new(py);
    d.set_item("exported", EXPORTED.load(Ordering::Relaxed))?;
    d.set_item("handed_back", HANDED_BACK.load(Ordering::Relaxed))?;
    d.set_item("released", RELEASED.load(Ordering::Acquire))?;
    d.set_item("leaked", LEAKED.load(Ordering::Relaxed))?;
    Ok(d)
}
