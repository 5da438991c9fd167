//! # gdr-xfer-proto: the sans-IO core of gdr-xfer
//!
//! The transfer engine's bookkeeping, with no I/O: which requests of which transfer are posted
//! on which lane, what a completion credits, when a transfer has reached its outcome, when its
//! deadline stops it and when its requests in flight are fenced, which rail a batch goes to,
//! how a failed rail's requests are posted again and how the rail is renewed with the peer,
//! when a notification may go and when a received one is delivered. It is driven by calls with
//! the time passed in ([`Connection::submit`], [`Connection::handle_send_completion`],
//! [`Connection::handle_recv`], [`Connection::handle_control`],
//! [`Connection::handle_timeout`]) and asked when to wake ([`Connection::poll_timeout`]);
//! the I/O whose answer it needs at once (posts, queue pairs made) goes through its driver's
//! [`Io`], and everything else it leaves, in order, in its action queue for the driver to carry
//! out ([`Connection::poll_action`], [`Action`]). The driver's failures are its own error type
//! ([`Io::Error`]), kept unchanged ([`DriverError`]) in the outcomes and events they cause
//! ([`Rejection::Driver`], [`RailFault::Driver`]): nothing crosses the boundary as text. What lies between an agent's
//! connections is its [`Endpoint`]: which peers are connected and ready, which connection and
//! lane each completion belongs to, when a connection let go may go, the agent's own segments
//! ([`LocalTable`]), the rails each memory location's transfers use, and when the timers are
//! due. The control messages agents
//! exchange are encoded and decoded here too ([`wire`]), with a queue pair's endpoint written
//! by the driver's [`wire::Codec`]. It has no dependency beyond
//! the standard library: no gdr, no libibverbs, no threads, no clock.
//!
//! `gdr-xfer` drives it with gdr's queue pairs, progress threads and sockets. The
//! deterministic simulation (feature `sim`, module `sim`) drives it with simulated RC queue pairs
//! and faults drawn from a seed, and checks the engine's promises after every step.
//!
//! ```
//! use std::time::Duration;
//! use gdr_xfer_proto::Config;
//!
//! // A connection of two rails with four queue pairs each, the engine's defaults otherwise.
//! let mut cfg = Config::new(2, 4);
//! cfg.quiesce = Duration::from_millis(200);
//! // However a transfer ends, its outcome comes at most this long after its deadline.
//! assert_eq!(cfg.outcome_bound(), Duration::from_millis(400));
//! ```
//!
//! A [`Connection`] is made from such a configuration and the time, and driven by its
//! driver's events; the simulation's driver (module `sim`) is the smallest whole one.
//!
//! ## The promises
//!
//! - A transfer's outcome is final and means what it says: when it is reported, none of the
//!   transfer's requests will touch its local or remote memory again (see
//!   [`Connection`]'s documentation for how, and for the bound on how long after the deadline
//!   an outcome may come: [`Config::outcome_bound`]).
//! - `Ok` means every byte landed exactly where asked, and the notification, if any, was
//!   delivered to the peer's NIC after all of them.
//! - One transfer's bad request fails only that transfer.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod config;
mod connection;
mod control;
mod endpoint;
mod fault;
pub mod handshake;
mod io;
mod lane;
mod local_table;
mod location;
mod notify;
mod peer_table;
mod rail;
mod run;
mod segment_id;
#[cfg(feature = "sim")]
pub mod sim;
mod slab;
pub mod staged;
pub mod staging;
mod transfer;
pub mod wire;

pub use config::{stripe_chunk, Config, CHUNK, STRIPE_BYTES, STRIPE_CHUNK};
pub use connection::Connection;
pub use control::Control;
pub use endpoint::{ConnId, Endpoint, Refusal};
#[cfg(any(test, feature = "sim"))]
pub use fault::TextError;
pub use fault::{DriverError, Lost, RailFault, RailReport, RailReports, Rejection, Step, Unposted};
pub use io::{
    Action, Event, Header, Io, LaneRef, Op, Pieces, PostResult, Receipt, SendCompletion, Status,
};
pub use local_table::{LocalError, LocalTable};
pub use location::{Location, ParseLocationError};
pub use peer_table::{PeerTable, TableError, MAX_REMOTE_SEGMENTS};
pub use rail::{RailCounters, RailState, FIRST_COOLDOWN, HEALTHY, MAX_COOLDOWN, SAMPLE};
pub use run::{slices_of, Cursor, Run};
pub use segment_id::SegmentId;
pub use transfer::{Failure, Outcome, Spec, Stats, TransferKey};
