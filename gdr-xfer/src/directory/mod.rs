//! Where agents publish what peers need to find them, and learn when one leaves.
//!
//! # The etcd directory (feature `etcd`)
//!
//! [`EtcdDirectory`] keeps records in etcd (v3 API; Debian's `etcd-server` 3.4 and newer) under a
//! key prefix, each bound to the directory's lease. It is the cluster way of finding peers, as
//! NIXL (`NIXL_ETCD_ENDPOINTS`, keys `<namespace>/<agent>/metadata` and
//! `<namespace>/<agent>/<label>` under the namespace `/nixl/agents`) and Mooncake
//! (`mooncake/rpc_meta/<name>`, `mooncake/ram/<segment>`) do. The engine chooses the records; the
//! suggested layout is [`DEFAULT_PREFIX`] then `<agent>/<record>` (e.g.
//! `/gdr-xfer/agents/prefill-0/metadata`), so one [`list`](EtcdDirectory::list) and one
//! [`watch`](EtcdDirectory::watch) of `""` see every agent, and one of `"<agent>/"` one agent.
//!
//! - Lease: granted at connect with a TTL ([`DEFAULT_TTL`]), renewed every third of it. If the
//!   process dies, etcd deletes its keys within the TTL and every watcher sees a
//!   [`WatchEvent::Delete`] for each; [`EtcdDirectory::revoke`] (or dropping the directory) does
//!   it at once.
//! - List then watch without a gap: [`Listing::revision`] passed to `watch` delivers every change
//!   after the listing.
//! - Never silence: a watch whose stream fails, whose start revision was compacted, on which etcd
//!   stays silent for [`WATCH_TIMEOUT`] (it is asked for a progress report every half of it), or
//!   whose directory's lease was lost, ends with [`WatchEvent::Lost`].
//! - Never blocking forever: every call has the configured timeout; the client runs on a small
//!   tokio runtime of the directory's own, on one thread.
//! - Untrusted answers: keys over [`MAX_KEY_LEN`], not UTF-8 or outside the prefix and values
//!   over [`MAX_VALUE_LEN`] are refused ([`WatchEvent::Refused`], [`Listing::refused`]), never
//!   used, never a panic.
//!
//! ```no_run
//! # fn main() -> gdr_xfer::Result<()> {
//! use std::time::Duration;
//! use gdr_xfer::directory::{EtcdDirectory, WatchEvent, DEFAULT_PREFIX, DEFAULT_TTL};
//!
//! let etcd = ["127.0.0.1:2379".to_string()];
//! let me = EtcdDirectory::connect(&etcd, DEFAULT_PREFIX, DEFAULT_TTL, Duration::from_secs(5))?;
//! me.put("prefill-0/metadata", b"endpoints and segment table")?;
//!
//! let listing = me.list("")?; // every agent's records, at one revision
//! let watch = me.watch("", Some(listing.revision))?; // every change after it
//! while let Some(event) = watch.recv_timeout(Duration::from_secs(1)) {
//!     match event {
//!         WatchEvent::Put { key, .. } => println!("{key} published"),
//!         WatchEvent::Delete { key, .. } => println!("{key} gone (its agent left or died)"),
//!         WatchEvent::Refused { key, reason } => println!("{key} refused: {reason}"),
//!         WatchEvent::Lost { reason } => { println!("watch lost: {reason}"); break }
//!     }
//! }
//! me.revoke()?; // every record of this agent disappears now
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
mod keys;
#[cfg(feature = "etcd")]
mod lease;
#[cfg(feature = "etcd")]
mod runtime;
#[cfg(feature = "etcd")]
mod watch;

#[cfg(feature = "etcd")]
pub use etcd::{EtcdConfig, EtcdDirectory, Listing};
#[cfg(feature = "etcd")]
pub use keys::{MAX_KEY_LEN, MAX_LIST_ENTRIES, MAX_VALUE_LEN};
#[cfg(feature = "etcd")]
pub use watch::{Watch, WatchEvent, MAX_QUEUED_BYTES, MAX_QUEUED_EVENTS};

/// The suggested key prefix of gdr-xfer's records in etcd (after NIXL's `/nixl/agents`).
pub const DEFAULT_PREFIX: &str = "/gdr-xfer/agents/";

/// The default lease TTL: a dead agent's records disappear within it.
pub const DEFAULT_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// The default watch timeout: a watch on which etcd says nothing for this long ends with
/// `WatchEvent::Lost` (NIXL's etcd watch timeout, `nixl_params.h`).
pub const WATCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
