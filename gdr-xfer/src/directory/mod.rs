//! Where agents publish what peers need to find them, and learn when one leaves.
//!
//! The etcd directory, `EtcdDirectory`, needs the feature `etcd`.
#![cfg_attr(feature = "etcd", doc = "")]
#![cfg_attr(feature = "etcd", doc = include_str!("etcd.md"))]

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
mod keys;
#[cfg(feature = "etcd")]
mod lease;
#[cfg(feature = "etcd")]
mod published;
#[cfg(feature = "etcd")]
mod runtime;
#[cfg(feature = "etcd")]
mod watch;

#[cfg(feature = "etcd")]
pub use etcd::{Claim, EtcdConfig, EtcdDirectory, Listing};
#[cfg(feature = "etcd")]
pub use keys::{MAX_KEY_LEN, MAX_LIST_ENTRIES, MAX_VALUE_LEN};
#[cfg(feature = "etcd")]
pub(crate) use published::{endpoint_key, Published};
#[cfg(feature = "etcd")]
pub use watch::{Watch, WatchEvent, MAX_QUEUED_BYTES, MAX_QUEUED_EVENTS};

/// The suggested key prefix of gdr-xfer's records in etcd (after NIXL's `/nixl/agents`).
pub const DEFAULT_PREFIX: &str = "/gdr-xfer/agents/";

/// The default lease TTL: a dead agent's records disappear within it.
pub const DEFAULT_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// The default watch timeout: a watch on which etcd says nothing for this long ends with
/// `WatchEvent::Lost` (NIXL's etcd watch timeout, `nixl_params.h`).
pub const WATCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
