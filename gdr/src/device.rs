//! RDMA devices: listing, NCCL-style selection, opening, attributes, ports and GID tables.
//!
//! ```no_run
//! use gdr::device::Context;
//! let ctx = Context::open("rxe0")?;
//! let port = ctx.query_port(1)?;
//! let gid = ctx.default_gid(1)?; // the RoCE v2 IPv4 entry on Ethernet, index 0 on InfiniBand
//! println!("{} port 1: {:?}, {} MTU, GID[{}] = {}", ctx.name(), port.state, port.active_mtu, gid.index, gid.gid);
//! # Ok::<(), gdr::Error>(())
//! ```

use std::ffi::CStr;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::ptr::NonNull;
use std::sync::Arc;

use gdr_sys::ibv;

use crate::error::{Error, Hint, Result};

const NO_DEVICE_HINT: &str = "no RDMA device is visible: check `ibv_devices`, load the NIC driver \
     (mlx5_ib, ...) or create a Soft-RoCE device (`rdma link add rxe0 type rxe netdev eth0`)";

fn not_found(wanted: &str, names: &[String]) -> Error {
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
        match NonNull::new(raw) {
            Some(list) => Ok(DeviceList {
                list,
                len: n.max(0) as usize,
            }),
            None => {
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                let hint = if errno == libc::ENOSYS {
                    "the kernel has no RDMA stack loaded (no /sys/class/infiniband_verbs): load ib_uverbs and \
                     the NIC driver (mlx5_ib, ...), or use Soft-RoCE (rdma_rxe); `cargo xtask vm` runs one"
                } else {
                    "is libibverbs installed with a provider (ibverbs-providers)? is /dev/infiniband readable?"
                };
                Err(Error::verbs("ibv_get_device_list", "", errno, hint))
            }
        }
    }

    fn raw(&self, i: usize) -> *mut ibv::ibv_device {
        debug_assert!(i < self.len);
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

    /// Names and GUIDs of all devices.
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

    /// Device names.
    pub fn names(&self) -> Vec<String> {
        self.devices().into_iter().map(|d| d.name).collect()
    }

    /// Opens the device called `name`.
    pub fn open(&self, name: &str) -> Result<Arc<Context>> {
        let names = self.names();
        let i = names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| not_found(name, &names))?;
        let dev = self.raw(i);
        // SAFETY: `dev` belongs to the live list; an opened context stays valid after the list
        // is freed (libibverbs keeps a reference to the device).
        let ctx = unsafe { ibv::ibv_open_device(dev) };
        let ctx = NonNull::new(ctx).ok_or_else(|| {
            Error::verbs_errno(
                "ibv_open_device",
                format!("device={name}"),
                "check permissions on /dev/infiniband/uverbs*",
            )
        })?;
        Ok(Arc::new(Context {
            ctx,
            name: name.to_string(),
            borrowed_from: None,
        }))
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed exactly once.
        unsafe { ibv::ibv_free_device_list(self.list.as_ptr()) }
    }
}

/// An open RDMA device (`ibv_context`). Shared by `Arc`: every protection domain, completion
/// queue and queue pair keeps its context alive.
pub struct Context {
    ctx: NonNull<ibv::ibv_context>,
    name: String,
    /// For contexts librdmacm opened: what keeps them open (the `rdma_cm_id`). `None` means we
    /// opened the context and close it in Drop.
    borrowed_from: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: libibverbs contexts are thread-safe: verbs on one context may be called from any thread.
unsafe impl Send for Context {}
// SAFETY: as above; `Context` exposes no interior mutability of its own.
unsafe impl Sync for Context {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

impl Context {
    /// Opens a device by name (`mlx5_0`) or `name:port` (the port is checked to exist).
    pub fn open(spec: &str) -> Result<Arc<Context>> {
        let (name, port) = match spec.split_once(':') {
            Some((n, p)) => {
                let port: u8 = p.parse().map_err(|_| {
                    Error::invalid(
                        format!("device spec {spec:?}: port {p:?} is not a number"),
                        "use NAME or NAME:PORT, e.g. mlx5_0:1",
                    )
                })?;
                (n, Some(port))
            }
            None => (spec, None),
        };
        let ctx = DeviceList::new()?.open(name)?;
        if let Some(p) = port {
            ctx.query_port(p)?;
        }
        Ok(ctx)
    }

    /// Opens the first device (and port) that a selection list such as `mlx5_0:1,^mlx5_1` allows.
    /// Returns the context and the selected port (1 when the list names none).
    pub fn open_selected(selection: &Selection) -> Result<(Arc<Context>, u8)> {
        let list = DeviceList::new()?;
        let names = list.names();
        let (name, port) = selection
            .first_match(&names)
            .ok_or_else(|| not_found(&selection.to_string(), &names))?;
        let ctx = list.open(&name)?;
        let port = port.unwrap_or(1);
        ctx.query_port(port)?;
        Ok((ctx, port))
    }

    /// Wraps a context that librdmacm opened (`rdma_cm_id::verbs`); `owner` keeps it open and is
    /// dropped with the last user of the context instead of closing it.
    ///
    /// # Safety
    ///
    /// `raw` must be a valid `ibv_context` that stays open at least as long as `owner` lives.
    pub(crate) unsafe fn borrowed(
        raw: NonNull<ibv::ibv_context>,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Arc<Context> {
        // SAFETY: the caller guarantees `raw` is valid; its device and name outlive it.
        let name = unsafe { CStr::from_ptr(ibv::ibv_get_device_name((*raw.as_ptr()).device)) }
            .to_string_lossy()
            .into_owned();
        Arc::new(Context {
            ctx: raw,
            name,
            borrowed_from: Some(owner),
        })
    }

    /// The device's kernel name.
    pub fn name(&self) -> &str {
        &self.name
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
        if rc != 0 {
            return Err(Error::verbs(
                "ibv_query_device",
                format!("device={}", self.name),
                rc,
                Hint::NONE,
            ));
        }
        // SAFETY: fw_ver is a NUL-terminated C string inside the struct.
        let fw = unsafe { CStr::from_ptr(attr.fw_ver.as_ptr()) }
            .to_string_lossy()
            .into_owned();
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

    /// Attributes of one port (1-based).
    pub fn query_port(&self, port: u8) -> Result<PortAttributes> {
        // SAFETY: ibv_port_attr is plain old data; all-zero is valid.
        let mut attr: ibv::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and attribute struct; ___ibv_query_port is the non-compat entry.
        let rc = unsafe { ibv::___ibv_query_port(self.as_raw(), port, &mut attr) };
        if rc != 0 {
            let errno = if rc < 0 { -rc } else { rc };
            return Err(Error::verbs(
                "ibv_query_port",
                format!("device={}, port={port}", self.name),
                errno,
                "ports are numbered from 1; `ibv_devinfo` lists them",
            ));
        }
        Ok(PortAttributes::from_raw(port, &attr))
    }

    /// The port's GID table: every valid entry with its type and network device index.
    pub fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        let len = self.query_port(port)?.gid_tbl_len.max(1) as usize;
        // Enough entries for every port's table.
        let cap = len * self.query_device()?.phys_port_cnt.max(1) as usize;
        let mut entries: Vec<ibv::ibv_gid_entry> = (0..cap)
            // SAFETY: ibv_gid_entry is plain old data; all-zero is a valid value.
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        // SAFETY: the buffer holds `cap` entries of the size we pass.
        let n = unsafe {
            ibv::_ibv_query_gid_table(
                self.as_raw(),
                entries.as_mut_ptr(),
                cap,
                0,
                std::mem::size_of::<ibv::ibv_gid_entry>(),
            )
        };
        if n < 0 {
            return Err(Error::verbs(
                "ibv_query_gid_table",
                format!("device={}, max_entries={cap}", self.name),
                (-n) as i32,
                Hint::NONE,
            ));
        }
        Ok(entries[..n as usize]
            .iter()
            .filter(|e| e.port_num == u32::from(port))
            // SAFETY: `raw` is the active member of the GID union for every entry.
            .map(|e| GidEntry {
                index: e.gid_index,
                gid: Gid(unsafe { e.gid.raw }),
                gid_type: GidType::from_raw(e.gid_type),
                ndev_ifindex: e.ndev_ifindex,
            })
            .collect())
    }

    /// One GID entry.
    pub fn gid(&self, port: u8, index: u32) -> Result<GidEntry> {
        // SAFETY: plain old data.
        let mut e: ibv::ibv_gid_entry = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and entry buffer of the size we pass.
        let rc = unsafe {
            ibv::_ibv_query_gid_ex(
                self.as_raw(),
                u32::from(port),
                index,
                &mut e,
                0,
                std::mem::size_of::<ibv::ibv_gid_entry>(),
            )
        };
        if rc != 0 {
            let errno = if rc < 0 { -rc } else { rc };
            return Err(Error::verbs(
                "ibv_query_gid_ex",
                format!("device={}, port={port}, index={index}", self.name),
                errno,
                "the GID slot is empty or out of range; `show_gids` or /sys/class/infiniband/DEV/ports/N/gids lists valid ones",
            ));
        }
        // SAFETY: `raw` is the active member.
        Ok(GidEntry {
            index,
            gid: Gid(unsafe { e.gid.raw }),
            gid_type: GidType::from_raw(e.gid_type),
            ndev_ifindex: e.ndev_ifindex,
        })
    }

    /// The GID to use on a port: on Ethernet (RoCE) the RoCE v2 IPv4 entry as NCCL picks it
    /// ([`pick_roce_gid`]); on InfiniBand index 0.
    pub fn default_gid(&self, port: u8) -> Result<GidEntry> {
        let attr = self.query_port(port)?;
        let table = self.gid_table(port)?;
        if attr.link_layer == LinkLayer::InfiniBand {
            return table.into_iter().find(|e| e.index == 0).ok_or_else(|| {
                Error::unsupported(
                    format!("{} port {port}: GID index 0 is empty", self.name),
                    "is the port up? `ibstat`",
                )
            });
        }
        pick_roce_gid(&table).cloned().ok_or_else(|| {
            Error::unsupported(
                format!("{} port {port}: no RoCE v2 GID in a table of {} entries", self.name, table.len()),
                "give the network device an IP address (`ip addr add ... dev <netdev>`); RoCE v2 GIDs follow the addresses",
            )
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.borrowed_from.is_some() {
            // librdmacm owns the context; dropping `borrowed_from` releases our hold on it.
            return;
        }
        // SAFETY: every child object holds an Arc<Context>, so none is alive any more.
        let rc = unsafe { ibv::ibv_close_device(self.ctx.as_ptr()) };
        if rc != 0 {
            log::warn!(
                "ibv_close_device({}) failed: {}",
                self.name,
                crate::error::errno_text(rc.abs())
            );
        }
    }
}

/// What `ibv_devinfo -v` reports about a device (the fields gdr uses).
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Port state (`ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// No state change.
    Nop,
    /// Link down.
    Down,
    /// Initialising (InfiniBand: waiting for the subnet manager).
    Init,
    /// Armed.
    Armed,
    /// Active: traffic can flow.
    Active,
    /// Active, deferred.
    ActiveDefer,
    /// A value this version does not know.
    Unknown(u32),
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE).
    Ethernet,
    /// Not reported.
    Unspecified,
}

/// Path MTU of a port or connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes.
    B256 = 1,
    /// 512 bytes.
    B512 = 2,
    /// 1024 bytes.
    B1024 = 3,
    /// 2048 bytes.
    B2048 = 4,
    /// 4096 bytes.
    B4096 = 5,
}

impl Mtu {
    /// From the `ibv_mtu` enum value (1..=5).
    pub fn from_raw(v: u32) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::B256,
            2 => Mtu::B512,
            3 => Mtu::B1024,
            4 => Mtu::B2048,
            5 => Mtu::B4096,
            _ => return None,
        })
    }

    /// From a size in bytes (256, 512, 1024, 2048, 4096).
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        match bytes {
            256 => Some(Mtu::B256),
            512 => Some(Mtu::B512),
            1024 => Some(Mtu::B1024),
            2048 => Some(Mtu::B2048),
            4096 => Some(Mtu::B4096),
            _ => None,
        }
    }

    /// The size in bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The `ibv_mtu` value.
    pub fn raw(self) -> u32 {
        self as u32
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// What `ibv_devinfo` reports about a port.
#[derive(Debug, Clone, PartialEq)]
pub struct PortAttributes {
    /// Port number (1-based).
    pub port: u8,
    /// State.
    pub state: PortState,
    /// Physical state (`ibv_devinfo` numbering: 5 = LinkUp, 3 = Disabled, 2 = Polling).
    pub phys_state: u8,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// Entries in the GID table.
    pub gid_tbl_len: i32,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Active width code (1 = 1x, 2 = 4x, 4 = 8x, 8 = 12x, 16 = 2x).
    pub active_width: u8,
    /// Active speed code (`ibv_devinfo`'s numbering).
    pub active_speed: u8,
    /// Link rate in Gb/s computed from width and speed, when the codes are known.
    pub rate_gbps: Option<f64>,
}

impl PortAttributes {
    fn from_raw(port: u8, a: &ibv::ibv_port_attr) -> Self {
        let state = match a.state {
            0 => PortState::Nop,
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            s => PortState::Unknown(s),
        };
        let link_layer = match u32::from(a.link_layer) {
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            _ => LinkLayer::Unspecified,
        };
        PortAttributes {
            port,
            state,
            phys_state: a.phys_state,
            max_mtu: Mtu::from_raw(a.max_mtu).unwrap_or(Mtu::B1024),
            active_mtu: Mtu::from_raw(a.active_mtu).unwrap_or(Mtu::B1024),
            gid_tbl_len: a.gid_tbl_len,
            lid: a.lid,
            link_layer,
            active_width: a.active_width,
            active_speed: a.active_speed,
            rate_gbps: link_rate_gbps(a.active_width, a.active_speed),
        }
    }
}

/// Link rate in Gb/s from the `active_width` and `active_speed` codes of `ibv_port_attr`.
pub fn link_rate_gbps(width: u8, speed: u8) -> Option<f64> {
    let lanes = match width {
        1 => 1.0,
        2 => 4.0,
        4 => 8.0,
        8 => 12.0,
        16 => 2.0,
        _ => return None,
    };
    let per_lane = match speed {
        1 => 2.5,       // SDR
        2 => 5.0,       // DDR
        4 | 8 => 10.0,  // QDR, FDR10
        16 => 14.0625,  // FDR
        32 => 25.78125, // EDR
        64 => 50.0,     // HDR
        128 => 100.0,   // NDR
        _ => return None,
    };
    Some(lanes * per_lane)
}

/// A 128-bit GID.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }

    /// Whether all bytes are zero (an empty table slot).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// Whether this is an IPv6 link-local address (fe80::/10).
    pub fn is_link_local(&self) -> bool {
        self.0[0] == 0xfe && (self.0[1] & 0xc0) == 0x80
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ipv4() {
            Some(v4) => write!(f, "::ffff:{v4}"),
            None => write!(f, "{}", Ipv6Addr::from(self.0)),
        }
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// Type of a GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand.
    Ib,
    /// RoCE v1 (Ethernet, not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable): what RoCE fabrics use.
    RoceV2,
    /// A value this version does not know.
    Unknown(u32),
}

impl GidType {
    /// From `ibv_gid_type`.
    pub fn from_raw(v: u32) -> GidType {
        match v {
            ibv::gid_type::IBV_GID_TYPE_IB => GidType::Ib,
            ibv::gid_type::IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            ibv::gid_type::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            other => GidType::Unknown(other),
        }
    }
}

/// One GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's table (what `-x` / `NCCL_IB_GID_INDEX` take).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// Its type.
    pub gid_type: GidType,
    /// Interface index of the network device it belongs to (RoCE), 0 otherwise.
    pub ndev_ifindex: u32,
}

/// Picks the GID a RoCE connection should use, as NCCL does with `NCCL_IB_GID_INDEX=-1`:
/// a RoCE v2 entry with an IPv4-mapped address first, then a RoCE v2 global IPv6 entry, then a
/// RoCE v2 link-local one. RoCE v1 entries are never picked automatically.
pub fn pick_roce_gid(table: &[GidEntry]) -> Option<&GidEntry> {
    let v2 = || {
        table
            .iter()
            .filter(|e| e.gid_type == GidType::RoceV2 && !e.gid.is_zero())
    };
    v2().find(|e| e.gid.ipv4().is_some())
        .or_else(|| v2().find(|e| !e.gid.is_link_local()))
        .or_else(|| v2().next())
}

/// An NCCL-style device selection list, as in `NCCL_IB_HCA`: comma-separated `name[:port]`
/// items; a leading `^` excludes the listed devices instead; a leading `=` makes names match
/// exactly instead of by prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    exclude: bool,
    exact: bool,
    items: Vec<(String, Option<u8>)>,
    text: String,
}

impl Selection {
    /// Parses a list like `mlx5_0:1,mlx5_1`, `^mlx5_2` or `=mlx5_1`. An empty string selects every device.
    pub fn parse(text: &str) -> Result<Selection> {
        let mut rest = text.trim();
        let mut exclude = false;
        let mut exact = false;
        loop {
            if let Some(r) = rest.strip_prefix('^') {
                exclude = true;
                rest = r;
            } else if let Some(r) = rest.strip_prefix('=') {
                exact = true;
                rest = r;
            } else {
                break;
            }
        }
        let mut items = Vec::new();
        for item in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, port) = match item.split_once(':') {
                Some((n, p)) => {
                    let port = p.parse::<u8>().ok().filter(|&p| p > 0).ok_or_else(|| {
                        Error::invalid(
                            format!("device selection {text:?}: port {p:?} of {n:?} is not a number from 1 to 255"),
                            "write NAME or NAME:PORT, e.g. mlx5_0:1,mlx5_1",
                        )
                    })?;
                    (n, Some(port))
                }
                None => (item, None),
            };
            if name.is_empty() {
                return Err(Error::invalid(
                    format!("device selection {text:?}: empty device name"),
                    "write NAME or NAME:PORT",
                ));
            }
            items.push((name.to_string(), port));
        }
        Ok(Selection {
            exclude,
            exact,
            items,
            text: text.to_string(),
        })
    }

    fn name_matches(&self, pattern: &str, name: &str) -> bool {
        if self.exact {
            pattern == name
        } else {
            name.starts_with(pattern)
        }
    }

    /// Whether device `name`, port `port` is selected.
    pub fn allows(&self, name: &str, port: u8) -> bool {
        if self.items.is_empty() {
            return true;
        }
        let hit = self
            .items
            .iter()
            .any(|(p, pp)| self.name_matches(p, name) && pp.is_none_or(|pp| pp == port));
        hit != self.exclude
    }

    /// The first device of `names` (in the list's order, or the host's order for exclusions and
    /// empty lists) that the selection allows, with the port it names.
    pub fn first_match(&self, names: &[String]) -> Option<(String, Option<u8>)> {
        if self.exclude || self.items.is_empty() {
            return names
                .iter()
                .find(|n| {
                    !self.exclude
                        || !self
                            .items
                            .iter()
                            .any(|(p, pp)| pp.is_none() && self.name_matches(p, n))
                })
                .map(|n| (n.clone(), None));
        }
        self.items.iter().find_map(|(p, port)| {
            names
                .iter()
                .find(|n| self.name_matches(p, n))
                .map(|n| (n.clone(), *port))
        })
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn selection_prefix_exact_and_exclude() {
        let s = Selection::parse("mlx5_1:1,mlx5_0").unwrap();
        assert!(s.allows("mlx5_1", 1));
        assert!(!s.allows("mlx5_1", 2));
        assert!(s.allows("mlx5_0", 2));
        assert!(s.allows("mlx5_10", 1), "prefix match like NCCL");
        assert_eq!(
            s.first_match(&names(&["mlx5_0", "mlx5_1"])),
            Some(("mlx5_1".into(), Some(1)))
        );

        let exact = Selection::parse("=mlx5_1").unwrap();
        assert!(exact.allows("mlx5_1", 1));
        assert!(!exact.allows("mlx5_10", 1));

        let ex = Selection::parse("^mlx5_0").unwrap();
        assert!(!ex.allows("mlx5_0", 1));
        assert!(ex.allows("rxe0", 1));
        assert_eq!(
            ex.first_match(&names(&["mlx5_0", "rxe0"])),
            Some(("rxe0".into(), None))
        );

        let both = Selection::parse("^=mlx5_1").unwrap();
        assert!(both.allows("mlx5_10", 1));
        assert!(!both.allows("mlx5_1", 1));

        let all = Selection::parse("").unwrap();
        assert!(all.allows("anything", 3));
        assert_eq!(
            all.first_match(&names(&["a", "b"])),
            Some(("a".into(), None))
        );
        assert_eq!(all.first_match(&[]), None);
    }

    #[test]
    fn selection_rejects_bad_ports() {
        for bad in ["mlx5_0:x", "mlx5_0:0", "mlx5_0:", ":1", "mlx5_0:300"] {
            let e = Selection::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{bad}: {e}");
            assert!(e.hint().is_some());
        }
    }

    fn entry(index: u32, gid: &str, t: GidType) -> GidEntry {
        let addr: Ipv6Addr = gid.parse().unwrap();
        GidEntry {
            index,
            gid: Gid(addr.octets()),
            gid_type: t,
            ndev_ifindex: 3,
        }
    }

    #[test]
    fn roce_v2_ipv4_gid_is_preferred() {
        let table = vec![
            entry(0, "fe80::1", GidType::RoceV1),
            entry(1, "fe80::1", GidType::RoceV2),
            entry(2, "::ffff:10.0.0.1", GidType::RoceV1),
            entry(3, "::ffff:10.0.0.1", GidType::RoceV2),
            entry(4, "2001:db8::1", GidType::RoceV2),
        ];
        assert_eq!(pick_roce_gid(&table).unwrap().index, 3);
        assert_eq!(
            pick_roce_gid(&table[..2]).unwrap().index,
            1,
            "link-local v2 as last resort"
        );
        assert_eq!(
            pick_roce_gid(&[table[0].clone(), table[4].clone()])
                .unwrap()
                .index,
            4
        );
        assert!(
            pick_roce_gid(&[table[0].clone(), table[2].clone()]).is_none(),
            "never RoCE v1"
        );
    }

    #[test]
    fn gid_display_and_ipv4() {
        let e = entry(1, "::ffff:10.77.0.1", GidType::RoceV2);
        assert_eq!(e.gid.to_string(), "::ffff:10.77.0.1");
        assert_eq!(e.gid.ipv4(), Some(Ipv4Addr::new(10, 77, 0, 1)));
        assert!(entry(0, "fe80::5054:ff:fe12:3456", GidType::RoceV2)
            .gid
            .is_link_local());
    }

    #[test]
    fn mtu_and_rate() {
        assert_eq!(Mtu::B4096.bytes(), 4096);
        assert_eq!(Mtu::from_bytes(1024), Some(Mtu::B1024));
        assert_eq!(Mtu::from_raw(9), None);
        assert_eq!(link_rate_gbps(2, 64), Some(200.0)); // 4x HDR
        assert_eq!(link_rate_gbps(2, 32), Some(103.125)); // 4x EDR
        assert_eq!(link_rate_gbps(3, 1), None);
    }
}
