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
//! tied to its `gdr_sys::ibv` constant in exactly one place (the `constants!` lists below each
//! enum), and a host test checks that every constant round-trips.

/// Ties an enum to the C constants its variants stand for, in one list: generates
/// `from_constant` (raw value to variant, `None` for values the list lacks), `constant` (variant
/// to raw value, `None` for variants outside the list, such as `Unknown(v)`) and, for tests,
/// `CONSTANTS` (every pair).
macro_rules! constants {
    ($ty:ident : $raw:ty { $($variant:ident = $konst:path),+ $(,)? }) => {
        impl $ty {
            /// Every (C constant, variant) pair, for the round-trip tests.
            #[cfg(test)]
            pub(crate) const CONSTANTS: &'static [($raw, $ty)] = &[$(($konst, $ty::$variant)),+];

            /// The variant a C constant stands for.
            #[allow(unreachable_patterns)]
            fn from_constant(v: $raw) -> Option<$ty> {
                match v {
                    $($konst => Some($ty::$variant),)+
                    _ => None,
                }
            }

            /// The C constant a variant stands for.
            #[allow(dead_code, unreachable_patterns)]
            fn constant(self) -> Option<$raw> {
                match self {
                    $($ty::$variant => Some($konst),)+
                    _ => None,
                }
            }
        }
    };
}

mod context;
mod gid;
mod list;
mod port;
mod selection;

pub use context::{Context, DeviceAttributes};
pub use gid::{pick_roce_gid, Gid, GidEntry, GidType};
pub use list::{DeviceInfo, DeviceList};
pub use port::{link_rate_gbps, LinkLayer, Mtu, PortAttributes, PortState};
pub use selection::Selection;
