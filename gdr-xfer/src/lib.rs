//! # gdr-xfer: a safe transfer engine on gdr
//!
//! (crate documentation is written with the engine)

#![deny(missing_docs)]
#![warn(unsafe_op_in_unsafe_fn)]
#![warn(unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod agent;
mod cache;
mod config;
mod connection;
mod control;
mod descriptor;
pub mod directory;
pub mod error;
mod location;
mod notify;
mod peer;
mod plan;
mod progress;
mod segment;
pub mod staging;
mod transfer;
pub mod wire;

pub use agent::Agent;
pub use cache::CacheStats;
pub use config::{AgentConfig, TransferOptions};
pub use descriptor::{BlockTable, Desc, LocalList, Op, RemoteList};
pub use error::{Error, Hint, Result};
pub use location::Location;
pub use notify::Notification;
pub use peer::Peer;
pub use segment::{RegistrationWeak, Segment};
pub use transfer::{Status, Transfer, TransferStats};
pub use wire::SegmentInfo;
