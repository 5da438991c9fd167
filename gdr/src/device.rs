//! RDMA devices: listing ([`DeviceList`]), NCCL-style selection ([`Selection`]), opening
//! ([`Context`]), device and port attributes ([`DeviceAttributes`], [`PortAttributes`]) and GID
//! tables ([`GidEntry`], [`pick_roce_gid`]).
//!
//! ```no_run
//! use gdr::device::Context;
//! // A name, NAME:PORT, or an NCCL_IB_HCA-style list: the first device:port it allows is opened.
//! let ctx = Context::open("rxe0:1,^mlx5_2")?;
//! let port = ctx.query_port(ctx.port())?;
//! let gid = ctx.default_gid(ctx.port())?; // the RoCE v2 IPv4 entry on Ethernet, index 0 on InfiniBand
//! println!("{} port {}: {:?}, {} MTU, GID[{}] = {}", ctx.name(), ctx.port(), port.state, port.active_mtu, gid.index, gid.gid);
//! # Ok::<(), gdr::Error>(())
//! ```
//!
//! One concept per file: `list.rs` (the host's devices), `context.rs` (an open device and its
//! attributes), `port.rs` (port attributes, state, link layer, MTU), `gid.rs` (GID types and the
//! GID table), `selection.rs` (the `NCCL_IB_HCA` syntax). Every enum made from a raw C value is
//! tied to its `gdr_sys::ibv` constant in exactly one place (the `constants!` lists, see
//! `raw_enum.rs`, below each enum), and a host test checks that every constant round-trips.

mod context;
mod events;
mod gid;
mod list;
mod port;
mod selection;

pub use context::{Context, DeviceAttributes};
pub use events::{AsyncEvent, AsyncEventKind, DeviceEvents, EventSubject};
pub use gid::{pick_roce_gid, Gid, GidEntry, GidType};
pub use list::{DeviceInfo, DeviceList};
pub use port::{link_rate_gbps, LinkLayer, Mtu, PortAttributes, PortState};
pub use selection::Selection;
