//! Posting an event loop's large transfers off the loop.
//!
//! A submission's own work is bookkeeping: arguments converted, the transfer checked and
//! planned (0.06 ms for a 16 MiB write in the Soft-RoCE VM). Posting its requests is the
//! provider's `ibv_post_send`, and a software NIC does the NIC's work inside that call
//! (Soft-RoCE: about 400 ms for those 16 MiB in the VM). So a submission made on a thread that
//! runs an asyncio event loop, and that moves more than [`INLINE_MAX`], is checked, planned and
//! queued on the loop (its errors still raise from the call) with
//! [`gdr_xfer::TransferOptions::post_inline_max`], and posted by this module's thread
//! (`gdr-py-post`) with [`gdr_xfer::Peer::post_queued`], or by the connection's next
//! completion or timer tick, whichever comes first. Smaller transfers, and every transfer submitted outside
//! an event loop, are posted at once as before. The thread never takes the GIL.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

use gdr_xfer::{Peer, TransferOptions};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;

/// The most bytes a transfer submitted on an event loop's thread posts there.
pub(crate) const INLINE_MAX: u64 = 64 << 10;

/// The post thread's queue; `None` when it could not be started (then the loop posts itself).
static POSTER: OnceLock<Option<Mutex<Sender<Peer>>>> = OnceLock::new();

/// `asyncio._get_running_loop`, looked up once asyncio is loaded.
static RUNNING_LOOP: GILOnceCell<PyObject> = GILOnceCell::new();

/// Whether this thread runs an asyncio event loop now. Without asyncio loaded none can run:
/// asyncio is never imported here (importing it costs millions of instructions).
fn in_event_loop(py: Python<'_>) -> bool {
    let get = match RUNNING_LOOP.get(py) {
        Some(f) => f,
        None => {
            // SAFETY: the GIL is held; `PyImport_GetModuleDict` returns a borrowed reference
            // to `sys.modules`, and `PyDict_GetItemString` a borrowed reference (or NULL,
            // without an exception) to the module, used only while the GIL is held here.
            let module = unsafe {
                let modules = pyo3::ffi::PyImport_GetModuleDict();
                let m = pyo3::ffi::PyDict_GetItemString(modules, c"asyncio".as_ptr());
                Bound::from_borrowed_ptr_or_opt(py, m)
            };
            let Some(asyncio) = module else {
                return false;
            };
            match asyncio.getattr("_get_running_loop") {
                Ok(f) => RUNNING_LOOP.get_or_init(py, || f.unbind()),
                Err(_) => return false,
            }
        }
    };
    get.call0(py).is_ok_and(|l| !l.is_none(py))
}

/// `opts`, set to queue instead of posting when this thread runs an event loop and the
/// transfer may move more than [`INLINE_MAX`] (`estimate`: an upper bound of its bytes, or
/// more; the engine decides on the planned bytes). Checks for a loop only then, so that
/// small transfers cost nothing more.
/// Returns the options and whether they may queue it.
pub(crate) fn options(
    py: Python<'_>,
    opts: TransferOptions,
    estimate: u64,
) -> (TransferOptions, bool) {
    if estimate > INLINE_MAX && in_event_loop(py) {
        (opts.post_inline_max(INLINE_MAX), true)
    } else {
        (opts, false)
    }
}

/// After a submission whose [`options`] may have queued it (the engine decides, on the
/// planned bytes): the post thread posts what the peer has queued (nothing, when the engine
/// posted it at once: `post_queued` is cheap then).
pub(crate) fn queued(peer: &Peer, deferred: bool) {
    if !deferred {
        return;
    }
    let sender = POSTER.get_or_init(start).as_ref().map(|tx| {
        tx.lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(peer.clone())
    });
    if !matches!(sender, Some(Ok(()))) {
        // No post thread: post here rather than leave it to the next completion.
        peer.post_queued();
    }
}

fn start() -> Option<Mutex<Sender<Peer>>> {
    let (tx, rx) = channel::<Peer>();
    let spawned = std::thread::Builder::new()
        .name("gdr-py-post".into())
        .spawn(move || {
            while let Ok(peer) = rx.recv() {
                peer.post_queued();
            }
        });
    match spawned {
        Ok(_) => Some(Mutex::new(tx)),
        Err(e) => {
            log::error!(
                "gdr-py: cannot start the post thread ({e}); event loops post their own transfers"
            );
            None
        }
    }
}
