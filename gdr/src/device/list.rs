//! The host's RDMA devices (`ibv_get_device_list`).

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

use gdr_sys::ibv;

use super::context::Context;
use crate::error::{Error, Hint, Result};
use crate::return_code::non_null;

pub(super) const NO_DEVICE_HINT: &str =
    "no RDMA device is visible: check `ibv_devices`, load the NIC driver \
     (mlx5_ib, ...) or create a Soft-RoCE device (`rdma link add rxe0 type rxe netdev eth0`)";

/// [`Error::DeviceNotFound`] for `wanted` among `names`, with the no-device hint when there are none.
pub(super) fn not_found(wanted: &str, names: &[String]) -> Error {
    Error::DeviceNotFound {
        wanted: wanted.to_string(),
        available: names.to_vec(),
        hint: if names.is_empty() {
            Hint::new(NO_DEVICE_HINT)
        } else {
            Hint::NONE
        },
    }
}

/// One RDMA device as listed by `ibv_get_device_list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel name, e.g. `mlx5_0` or `rxe0`.
    pub name: String,
    /// Node GUID as printed by `ibv_devices` (16 hex digits).
    pub guid: String,
}

/// The RDMA devices of this host.
pub struct DeviceList {
    list: NonNull<*mut ibv::ibv_device>,
    len: usize,
}

impl DeviceList {
    /// Lists the devices. An empty list is not an error; opening a name that is absent is.
    pub fn new() -> Result<Self> {
        let mut n: libc::c_int = 0;
        // SAFETY: ibv_get_device_list writes the count into `n` and returns a NULL-terminated
        // array that we free in Drop with ibv_free_device_list.
        let raw = unsafe { ibv::ibv_get_device_list(&mut n) };
        let list = non_null("ibv_get_device_list", raw, String::new, |errno| {
            Hint::new(if errno == libc::ENOSYS {
                "the kernel has no RDMA stack loaded (no /sys/class/infiniband_verbs): load ib_uverbs and \
                 the NIC driver (mlx5_ib, ...), or use Soft-RoCE (rdma_rxe); `cargo xtask vm` runs one"
            } else {
                "is libibverbs installed with a provider (ibverbs-providers)? is /dev/infiniband readable?"
            })
        })?;
        Ok(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    pub(super) fn raw(&self, i: usize) -> *mut ibv::ibv_device {
        assert!(i < self.len, "device index {i} out of {}", self.len);
        // SAFETY: `i < len`, and the array has `len` valid entries until Drop.
        unsafe { *self.list.as_ptr().add(i) }
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no device.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Names and GUIDs of all devices, in the host's order.
    pub fn devices(&self) -> Vec<DeviceInfo> {
        (0..self.len)
            .map(|i| {
                let dev = self.raw(i);
                // SAFETY: `dev` is a valid device of the live list; the name is a C string owned
                // by the device, copied before the list is freed.
                let name = unsafe { CStr::from_ptr(ibv::ibv_get_device_name(dev)) }
                    .to_string_lossy()
                    .into_owned();
                // SAFETY: as above; returns the GUID in network byte order.
                let guid = u64::from_be(unsafe { ibv::ibv_get_device_guid(dev) });
                DeviceInfo {
                    name,
                    guid: format!("{guid:016x}"),
                }
            })
            .collect()
    }

    /// Device names, in the host's order.
    pub fn names(&self) -> Vec<String> {
        self.devices().into_iter().map(|d| d.name).collect()
    }

    /// Opens the device called exactly `name`; its [`Context::port`] is 1. To choose a port or
    /// use a selection list, use [`Context::open`].
    pub fn open(&self, name: &str) -> Result<Arc<Context>> {
        self.open_unshared(name).map(Arc::new)
    }

    /// Opens the device called exactly `name`, for port 1.
    pub(super) fn open_unshared(&self, name: &str) -> Result<Context> {
        let names = self.names();
        let i = names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| not_found(name, &names))?;
        // SAFETY: the device belongs to the live list; an opened context stays valid after the
        // list is freed (libibverbs keeps a reference to the device).
        let ctx = unsafe { ibv::ibv_open_device(self.raw(i)) };
        let ctx = non_null(
            "ibv_open_device",
            ctx,
            || format!("device={name}"),
            |_| Hint::new("check permissions on /dev/infiniband/uverbs*"),
        )?;
        Ok(Context::owned(ctx, name.to_string(), 1))
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed exactly once.
        unsafe { ibv::ibv_free_device_list(self.list.as_ptr()) }
    }
}
