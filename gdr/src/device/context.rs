//! An open RDMA device (`ibv_context`) and its attributes.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use gdr_sys::ibv;

use super::list::DeviceList;
use super::selection::Selection;
use crate::error::Result;
use crate::return_code::{check, no_hint, teardown};

/// An open RDMA device (`ibv_context`) and the port it was opened for. Shared by `Arc`: every
/// protection domain, completion queue and queue pair keeps its context alive.
pub struct Context {
    ctx: NonNull<ibv::ibv_context>,
    name: String,
    port: u8,
    /// For contexts librdmacm opened: what keeps them open (the `rdma_cm_id`). `None` means we
    /// opened the context and close it in Drop.
    borrowed_from: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// Whether the asynchronous event reader was handed out ([`Context::events`]).
    pub(super) events_taken: std::sync::atomic::AtomicBool,
}

// SAFETY: libibverbs contexts are thread-safe: verbs on one context may be called from any thread.
unsafe impl Send for Context {}
// SAFETY: as above; `Context` exposes no interior mutability of its own.
unsafe impl Sync for Context {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.name)
            .field("port", &self.port)
            .finish()
    }
}

impl Context {
    /// A context we opened (and close in Drop).
    pub(super) fn owned(ctx: NonNull<ibv::ibv_context>, name: String, port: u8) -> Context {
        Context {
            ctx,
            name,
            port,
            borrowed_from: None,
            events_taken: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Opens the first device and port that `spec` selects, and remembers the port
    /// ([`Context::port`]).
    ///
    /// `spec` is a device name (`mlx5_0`), `NAME:PORT` (`mlx5_0:2`), or any list in the
    /// `NCCL_IB_HCA` syntax of [`Selection`]: `mlx5_0:1,^mlx5_2`, `^mlx5_2`, `=mlx5_1`. Names match
    /// by prefix unless the list starts with `=`, as in NCCL, but a device named exactly as an
    /// item is preferred to those it is a prefix of; an empty spec opens the host's first device.
    /// The port is the one the chosen item names, else the device's first port that the list
    /// does not exclude (port state is not considered). A port that the device lacks is an
    /// [`crate::Error::InvalidArgument`] naming it; a list that matches nothing is an
    /// [`crate::Error::DeviceNotFound`] listing the devices that exist.
    pub fn open(spec: &str) -> Result<Arc<Context>> {
        Self::open_selected(&Selection::parse(spec)?).map(|(ctx, _)| ctx)
    }

    /// Opens the first device (and port) that a selection list such as `mlx5_0:1,^mlx5_1`
    /// allows (see [`Selection::first_match`] for the order). Returns the context and the selected
    /// port, which is also [`Context::port`] (1 when the list names none).
    pub fn open_selected(selection: &Selection) -> Result<(Arc<Context>, u8)> {
        let list = DeviceList::new()?;
        let names = list.names();
        // Contexts opened to count ports, kept so the chosen one is not opened twice.
        let mut opened: HashMap<String, Context> = HashMap::new();
        let (name, port) = selection.resolve(&names, |name| {
            let ctx = list.open_unshared(name)?;
            let ports = ctx.query_device()?.phys_port_cnt;
            opened.insert(name.to_string(), ctx);
            Ok(ports)
        })?;
        let mut ctx = match opened.remove(&name) {
            Some(ctx) => ctx,
            None => list.open_unshared(&name)?,
        };
        drop(opened);
        ctx.port = port;
        let ctx = Arc::new(ctx);
        ctx.query_port(port)?;
        Ok((ctx, port))
    }

    /// Wraps a context that librdmacm opened (`rdma_cm_id::verbs`) for `port`; `owner` keeps it
    /// open and is dropped with the last user of the context instead of closing it.
    ///
    /// # Safety
    ///
    /// `raw` must be a valid `ibv_context` that stays open at least as long as `owner` lives.
    pub(crate) unsafe fn borrowed(
        raw: NonNull<ibv::ibv_context>,
        port: u8,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Arc<Context> {
        // SAFETY: the caller guarantees `raw` is valid; its device and name outlive it.
        let name = unsafe { CStr::from_ptr(ibv::ibv_get_device_name((*raw.as_ptr()).device)) }
            .to_string_lossy()
            .into_owned();
        Arc::new(Context {
            ctx: raw,
            name,
            port,
            borrowed_from: Some(owner),
            events_taken: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The device's kernel name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The port this context was opened for: the one [`Context::open`]'s spec selected, the
    /// port rdma_cm resolved for its contexts, 1 when none was given. Queue pairs built on
    /// this context use it unless told otherwise.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// The raw `ibv_context`, for FFI. It stays valid while `self` lives.
    pub fn as_raw(&self) -> *mut ibv::ibv_context {
        self.ctx.as_ptr()
    }

    /// Device attributes (what `ibv_devinfo -v` shows about the device).
    pub fn query_device(&self) -> Result<DeviceAttributes> {
        // SAFETY: ibv_device_attr is plain old data; all-zero is a valid value.
        let mut attr: ibv::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and a writable attribute struct of the right type.
        let rc = unsafe { ibv::ibv_query_device(self.as_raw(), &mut attr) };
        check(
            "ibv_query_device",
            rc,
            || format!("device={}", self.name),
            no_hint,
        )?;
        // The firmware string is NUL-terminated by the provider; read it within the array
        // bounds anyway.
        // SAFETY: `c_char` and `u8` have the same size and alignment; the slice covers the array.
        let fw_bytes: &[u8] =
            unsafe { std::slice::from_raw_parts(attr.fw_ver.as_ptr().cast(), attr.fw_ver.len()) };
        let fw = CStr::from_bytes_until_nul(fw_bytes)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_else(|_| String::from_utf8_lossy(fw_bytes).into_owned());
        Ok(DeviceAttributes {
            fw_ver: fw,
            node_guid: format!("{:016x}", u64::from_be(attr.node_guid)),
            vendor_id: attr.vendor_id,
            vendor_part_id: attr.vendor_part_id,
            hw_ver: attr.hw_ver,
            phys_port_cnt: attr.phys_port_cnt,
            max_mr_size: attr.max_mr_size,
            max_qp: attr.max_qp,
            max_qp_wr: attr.max_qp_wr,
            max_sge: attr.max_sge,
            max_cq: attr.max_cq,
            max_cqe: attr.max_cqe,
            max_mr: attr.max_mr,
            max_pd: attr.max_pd,
            max_qp_rd_atom: attr.max_qp_rd_atom,
            max_qp_init_rd_atom: attr.max_qp_init_rd_atom,
            atomics: attr.atomic_cap != ibv::ibv_atomic_cap::IBV_ATOMIC_NONE,
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.borrowed_from.is_some() {
            return;
        }
        // SAFETY: every child object holds an Arc<Context>, so none is alive any more.
        let rc = unsafe { ibv::ibv_close_device(self.ctx.as_ptr()) };
        // Nothing to keep alive when closing fails: the context is not used again either way.
        teardown("ibv_close_device", &self.name, rc);
    }
}

/// What `ibv_devinfo -v` reports about a device (the fields gdr uses).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttributes {
    /// Firmware version.
    pub fw_ver: String,
    /// Node GUID (hex).
    pub node_guid: String,
    /// PCI vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
    /// Largest memory region in bytes.
    pub max_mr_size: u64,
    /// Queue pairs.
    pub max_qp: i32,
    /// Work requests per queue.
    pub max_qp_wr: i32,
    /// Scatter/gather entries per work request.
    pub max_sge: i32,
    /// Completion queues.
    pub max_cq: i32,
    /// Entries per completion queue.
    pub max_cqe: i32,
    /// Memory regions.
    pub max_mr: i32,
    /// Protection domains.
    pub max_pd: i32,
    /// Outstanding RDMA reads/atomics as target.
    pub max_qp_rd_atom: i32,
    /// Outstanding RDMA reads/atomics as initiator.
    pub max_qp_init_rd_atom: i32,
    /// Whether remote atomics are supported.
    pub atomics: bool,
}
