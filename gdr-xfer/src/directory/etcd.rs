//! [`EtcdDirectory`]: lease-bound keys under a prefix in etcd, with lookup, consistent prefix
//! listing and gap-free watches, behind a blocking API with a timeout on every call.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KvClient, PutOptions, Txn, TxnOp,
    WatchClient, WatchOptions,
};

use super::keys::{self, accept, check_value, display_key, full_key, prefix_end, shorten};
use super::lease::{self, LeaseState};
use super::runtime::Runtime;
use super::watch::{Queue, Watch, WatchTask};
use super::{DEFAULT_TTL, MAX_LIST_ENTRIES, MAX_VALUE_LEN, WATCH_TIMEOUT};
use crate::error::{Error, Hint, Result};

/// The longest lease TTL, timeout and watch timeout accepted (one day).
const MAX_TTL_SECS: u64 = 24 * 3600;

/// Keys per page of a [`list`](EtcdDirectory::list) (each page at one revision).
const LIST_PAGE: i64 = 32;

/// The largest gRPC message the directory decodes: a full list page of keys and values at their
/// bounds, with room for etcd's framing.
const MAX_MESSAGE: usize =
    (LIST_PAGE as usize) * (MAX_VALUE_LEN + keys::MAX_KEY_LEN + 256) + (1 << 20);

/// How to reach etcd and how long to wait. [`EtcdConfig::new`] fills in the defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// etcd client endpoints, `host:port` or `http://host:port` (no TLS).
    pub endpoints: Vec<String>,
    /// Prefix of every key this directory puts, gets, lists and watches (e.g.
    /// `/gdr-xfer/agents/`; at most 512 bytes). Keys in the API are relative to it.
    pub prefix: String,
    /// Lease TTL: how long after this process dies (its keepalives stop) etcd deletes its keys.
    /// Whole seconds (rounded up), 1 s to one day; etcd may grant more (its minimum is about
    /// 1.5 x its election timeout: 2 s for a default etcd). Default [`DEFAULT_TTL`].
    pub ttl: Duration,
    /// Limit of every call (connect, put, get, list, watch creation, revoke). Default 5 s; at
    /// most one day.
    pub timeout: Duration,
    /// A watch on which etcd says nothing (not even the progress reports it is asked for every
    /// half of this) for this long ends with [`Lost`](super::WatchEvent::Lost). Default
    /// [`WATCH_TIMEOUT`] (NIXL's etcd watch timeout); 200 ms to one day.
    pub watch_timeout: Duration,
}

impl EtcdConfig {
    /// A configuration with the default TTL and timeouts.
    pub fn new(endpoints: &[String], prefix: &str) -> EtcdConfig {
        EtcdConfig {
            endpoints: endpoints.to_vec(),
            prefix: prefix.to_owned(),
            ttl: DEFAULT_TTL,
            timeout: Duration::from_secs(5),
            watch_timeout: WATCH_TIMEOUT,
        }
    }
}

/// Every key of a prefix at one revision (from [`EtcdDirectory::list`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listing {
    /// etcd's revision the listing is at: pass it to [`EtcdDirectory::watch`] to get every change
    /// after it, none lost.
    pub revision: i64,
    /// Keys (relative to the directory's prefix) and values, in key order.
    pub entries: Vec<(String, Vec<u8>)>,
    /// Entries that were refused (key not UTF-8 or over the bound, value over the bound), as
    /// (key as text, reason). They are not in `entries`.
    pub refused: Vec<(String, String)>,
}

/// A directory of lease-bound records in etcd (feature `etcd`).
///
/// At connect it grants a lease and keeps it alive from its own runtime thread; every key it puts
/// is bound to that lease, so all of them disappear, and every watcher sees a
/// [`Delete`](super::WatchEvent::Delete) for each, when the lease ends: at [`revoke`](Self::revoke),
/// at drop, or within the TTL after this process dies. Every call is blocking and returns within
/// the configured timeout (plus half a second at most), whatever etcd does.
///
/// If the lease is lost while the process lives (etcd unreachable for a TTL), every watch of this
/// directory ends with [`Lost`](super::WatchEvent::Lost), [`put`](Self::put) fails, and
/// [`lease_lost`](Self::lease_lost) says why: connect a new directory and publish again.
///
/// Keys are relative to the prefix. Values are opaque bytes. What comes back from etcd is
/// checked: keys up to [`MAX_KEY_LEN`](super::MAX_KEY_LEN) bytes (prefix included), UTF-8, under
/// the prefix; values up to [`MAX_VALUE_LEN`](super::MAX_VALUE_LEN).
pub struct EtcdDirectory {
    config: EtcdConfig,
    kv: KvClient,
    watch: WatchClient,
    lease: etcd_client::LeaseClient,
    lease_id: i64,
    granted_ttl: Duration,
    state: Arc<LeaseState>,
    keepalive: Option<tokio::task::JoinHandle<()>>,
    runtime: Arc<Runtime>,
}

impl std::fmt::Debug for EtcdDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdDirectory")
            .field("endpoints", &self.config.endpoints)
            .field("prefix", &self.config.prefix)
            .field("lease_id", &self.lease_id)
            .field("ttl", &self.granted_ttl)
            .finish_non_exhaustive()
    }
}

impl EtcdDirectory {
    /// Connects to etcd at `endpoints` (like `127.0.0.1:2379`), grants a lease of `ttl` and keeps
    /// it alive in the background, with the default watch timeout. See [`EtcdConfig`].
    pub fn connect(
        endpoints: &[String],
        prefix: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<EtcdDirectory> {
        let mut config = EtcdConfig::new(endpoints, prefix);
        config.ttl = ttl;
        config.timeout = timeout;
        Self::connect_with(config)
    }

    /// Connects with every setting of `config`.
    pub fn connect_with(config: EtcdConfig) -> Result<EtcdDirectory> {
        keys::check_prefix(&config.prefix)?;
        if config.endpoints.is_empty() || config.endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err(Error::invalid(
                format!("etcd directory: endpoints {:?} are empty", config.endpoints),
                "give etcd's client address, e.g. 127.0.0.1:2379",
            ));
        }
        let ttl_secs = config.ttl.as_secs() + u64::from(config.ttl.subsec_nanos() > 0);
        if !(1..=MAX_TTL_SECS).contains(&ttl_secs) {
            return Err(Error::invalid(
                format!(
                    "etcd directory: lease TTL {:?} is out of range (1 s to {MAX_TTL_SECS} s)",
                    config.ttl
                ),
                "use a TTL of a few seconds (the default is 10 s)",
            ));
        }
        for (what, d, min) in [
            ("timeout", config.timeout, Duration::from_millis(1)),
            (
                "watch timeout",
                config.watch_timeout,
                Duration::from_millis(200),
            ),
        ] {
            if d < min || d > Duration::from_secs(MAX_TTL_SECS) {
                return Err(Error::invalid(
                    format!(
                        "etcd directory: {what} {d:?} is out of range ({min:?} to {MAX_TTL_SECS} s)"
                    ),
                    "use a few seconds",
                ));
            }
        }
        let runtime = Arc::new(Runtime::start()?);
        let endpoints = config.endpoints.clone();
        let prefix = config.prefix.clone();
        let connect_timeout = config.timeout;
        let (client, lease_id, granted) = runtime.call(
            config.timeout,
            async move {
                // No request timeout (it would end watches and keepalive streams) and no HTTP/2
                // pings (etcd answers pings more often than every 5 s with GOAWAY): calls are
                // bounded here, watches by their progress probes.
                let options = ConnectOptions::new()
                    .with_connect_timeout(connect_timeout)
                    .with_require_leader(true);
                let mut client = Client::connect(&endpoints, Some(options))
                    .await
                    .map_err(|e| map_err("connect", &prefix, &endpoints, e))?;
                let grant = client
                    .lease_grant(ttl_secs as i64, None)
                    .await
                    .map_err(|e| {
                        let mut err = map_err("connect", &prefix, &endpoints, e);
                        if let Error::Directory { detail, .. } = &mut err {
                            *detail = format!("lease grant: {detail}");
                        }
                        err
                    })?;
                Ok((client, grant.id(), grant.ttl()))
            },
            || timeout_err("connect", &config.prefix, &config),
        )?;
        // etcd grants at least the TTL asked for; a smaller or absurd answer is not believed
        // for the keepalive period (renewing too often is harmless, too rarely loses the lease).
        let granted_ttl =
            Duration::from_secs(u64::try_from(granted).unwrap_or(0).clamp(1, MAX_TTL_SECS));
        let state = Arc::new(LeaseState::default());
        let keepalive = runtime.spawn(lease::keep_alive(
            client.lease_client(),
            lease_id,
            granted_ttl.min(Duration::from_secs(ttl_secs)),
            state.clone(),
        ));
        log::info!(
            "etcd directory: connected to {:?}, prefix {:?}, lease {lease_id:#x} (TTL {granted_ttl:?})",
            config.endpoints,
            config.prefix
        );
        Ok(EtcdDirectory {
            kv: client.kv_client().max_decoding_message_size(MAX_MESSAGE),
            watch: client.watch_client().max_decoding_message_size(MAX_MESSAGE),
            lease: client.lease_client(),
            config,
            lease_id,
            granted_ttl,
            state,
            keepalive: Some(keepalive),
            runtime,
        })
    }

    /// The configuration it was connected with.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// The lease's id (as etcd and `etcdctl lease list` show it, in hex).
    pub fn lease_id(&self) -> i64 {
        self.lease_id
    }

    /// The TTL etcd granted (at least the one asked for).
    pub fn ttl(&self) -> Duration {
        self.granted_ttl
    }

    /// Why the lease was lost, if it was (see the type's documentation).
    pub fn lease_lost(&self) -> Option<String> {
        self.state.lost()
    }

    /// Puts `value` at `key` (relative to the prefix), bound to this directory's lease.
    /// Fails with [`Error::TooLarge`] for a key over [`MAX_KEY_LEN`](super::MAX_KEY_LEN)
    /// (prefix included) or a value over [`MAX_VALUE_LEN`](super::MAX_VALUE_LEN), and with
    /// [`Error::Directory`] when the lease is lost or etcd fails.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let full = full_key(&self.config.prefix, key, "put")?;
        check_value(key, value)?;
        if let Some(reason) = self.state.lost() {
            return Err(Error::Directory {
                op: "put",
                key: full,
                detail: format!("the directory's lease is lost: {reason}"),
                hint: Hint::new("connect a new EtcdDirectory and publish again"),
            });
        }
        let mut kv = self.kv.clone();
        let value = value.to_vec();
        let lease = self.lease_id;
        let eps = self.config.endpoints.clone();
        let k = full.clone();
        self.call("put", &full, async move {
            kv.put(k.clone(), value, Some(PutOptions::new().with_lease(lease)))
                .await
                .map_err(|e| map_err("put", &k, &eps, e))?;
            Ok(())
        })
    }

    /// Deletes `key` if this directory put it (it is bound to this directory's lease); returns
    /// whether it did. A key of another directory (another lease) is left alone.
    pub fn delete(&self, key: &str) -> Result<bool> {
        let full = full_key(&self.config.prefix, key, "delete")?;
        let mut kv = self.kv.clone();
        let lease = self.lease_id;
        let eps = self.config.endpoints.clone();
        let k = full.clone();
        self.call("delete", &full, async move {
            let txn = Txn::new()
                .when([Compare::lease(k.clone(), CompareOp::Equal, lease)])
                .and_then([TxnOp::delete(k.clone(), None)]);
            let resp = kv
                .txn(txn)
                .await
                .map_err(|e| map_err("delete", &k, &eps, e))?;
            Ok(resp.succeeded())
        })
    }

    /// The value at `key` (relative to the prefix), whoever put it; `None` when there is none.
    /// A value over [`MAX_VALUE_LEN`](super::MAX_VALUE_LEN) is refused with
    /// [`Error::Directory`].
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let full = full_key(&self.config.prefix, key, "get")?;
        let mut kv = self.kv.clone();
        let eps = self.config.endpoints.clone();
        let prefix = self.config.prefix.clone();
        let k = full.clone();
        self.call("get", &full, async move {
            let mut resp = kv.get(k.clone(), None).await.map_err(|e| map_err("get", &k, &eps, e))?;
            let Some(entry) = resp.take_kvs().into_iter().find(|e| e.key() == k.as_bytes()) else {
                return Ok(None);
            };
            if let Err(reason) = accept(&prefix, entry.key(), Some(entry.value())) {
                return Err(Error::Directory {
                    op: "get",
                    key: k,
                    detail: format!("refused what etcd returned: {reason}"),
                    hint: Hint::new("another client of this etcd wrote a record gdr-xfer does not accept; find it with `etcdctl get --prefix`"),
                });
            }
            let (_, value) = entry.into_key_value();
            Ok(Some(value))
        })
    }

    /// Every key under `key_prefix` (relative to the directory's prefix; `""` for all), with their
    /// values, at one revision (read in pages of 32 keys, all at the revision of the first).
    /// Refused entries are reported in [`Listing::refused`]; more than
    /// [`MAX_LIST_ENTRIES`](super::MAX_LIST_ENTRIES) fail the call.
    pub fn list(&self, key_prefix: &str) -> Result<Listing> {
        let full = full_key(&self.config.prefix, key_prefix, "list")?;
        let mut kv = self.kv.clone();
        let eps = self.config.endpoints.clone();
        let prefix = self.config.prefix.clone();
        let k = full.clone();
        self.call("list", &full, async move {
            let end = prefix_end(k.as_bytes());
            let mut from = k.as_bytes().to_vec();
            let mut listing = Listing::default();
            loop {
                let mut options = GetOptions::new()
                    .with_range(end.clone())
                    .with_limit(LIST_PAGE);
                if listing.revision > 0 {
                    options = options.with_revision(listing.revision);
                }
                let mut resp = kv
                    .get(from.clone(), Some(options))
                    .await
                    .map_err(|e| map_err("list", &k, &eps, e))?;
                if listing.revision == 0 {
                    listing.revision = resp.header().map(|h| h.revision()).unwrap_or(0);
                    if listing.revision <= 0 {
                        return Err(Error::Directory {
                            op: "list",
                            key: k,
                            detail: "etcd's answer has no revision".into(),
                            hint: Hint::new("is the endpoint an etcd v3 server?"),
                        });
                    }
                }
                let more = resp.more();
                let page = resp.take_kvs();
                let Some(last) = page.last().map(|e| e.key().to_vec()) else {
                    break;
                };
                if last.as_slice() < from.as_slice()
                    || last.as_slice() >= end.as_slice() && end != [0]
                {
                    return Err(Error::Directory {
                        op: "list",
                        key: k,
                        detail: format!(
                            "etcd returned key {:?} outside the range asked for",
                            display_key(&last)
                        ),
                        hint: Hint::NONE,
                    });
                }
                for entry in page {
                    match accept(&prefix, entry.key(), Some(entry.value())) {
                        Ok(key) => listing.entries.push((key, entry.into_key_value().1)),
                        Err(reason) => listing.refused.push((display_key(entry.key()), reason)),
                    }
                }
                if listing.entries.len() + listing.refused.len() > MAX_LIST_ENTRIES {
                    return Err(Error::Directory {
                        op: "list",
                        key: k,
                        detail: format!("more than {MAX_LIST_ENTRIES} entries"),
                        hint: Hint::new("list a narrower prefix"),
                    });
                }
                if !more {
                    break;
                }
                from = last;
                from.push(0);
            }
            Ok(listing)
        })
    }

    /// Watches every key under `key_prefix` (relative to the directory's prefix). With
    /// `after = Some(listing.revision)` the watch delivers every change after that listing, none
    /// lost and none twice; with `None`, changes from now on. Returns once etcd has created the
    /// watch; fails with [`Error::Directory`] when etcd refuses it. A start revision that etcd
    /// has compacted away (etcd 3.4 creates the watch, then cancels it) ends the watch at once
    /// with [`Lost`](super::WatchEvent::Lost): list again and watch after the new listing.
    pub fn watch(&self, key_prefix: &str, after: Option<i64>) -> Result<Watch> {
        let full = full_key(&self.config.prefix, key_prefix, "watch")?;
        let mut client = self.watch.clone();
        let eps = self.config.endpoints.clone();
        let k = full.clone();
        let stream = self.call("watch", &full, async move {
            let mut options = WatchOptions::new().with_range(prefix_end(k.as_bytes()));
            if let Some(rev) = after {
                options = options.with_start_revision(rev.saturating_add(1).max(1));
            }
            let mut stream = client
                .watch(k.clone(), Some(options))
                .await
                .map_err(|e| map_err("watch", &k, &eps, e))?;
            match stream.message().await {
                Ok(Some(resp)) if resp.created() && !resp.canceled() => Ok(stream),
                Ok(Some(resp)) => Err(Error::Directory {
                    op: "watch",
                    key: k,
                    detail: format!(
                        "etcd refused the watch: {} (compact revision {})",
                        resp.cancel_reason(),
                        resp.compact_revision()
                    ),
                    hint: Hint::new("the start revision was compacted: list again and watch after the new listing's revision"),
                }),
                Ok(None) => Err(Error::Directory {
                    op: "watch",
                    key: k,
                    detail: "etcd closed the watch stream before creating the watch".into(),
                    hint: Hint::NONE,
                }),
                Err(e) => Err(map_err("watch", &k, &eps, e)),
            }
        })?;
        let queue = Arc::new(Queue::default());
        self.state.register(&queue);
        let task = self.runtime.spawn(
            WatchTask {
                stream,
                queue: queue.clone(),
                prefix: self.config.prefix.clone(),
                watched: full,
                watch_timeout: self.config.watch_timeout,
            }
            .run(),
        );
        Ok(Watch::new(queue, task, self.runtime.clone()))
    }

    /// [`list`](Self::list) then [`watch`](Self::watch) after the listing's revision: every key
    /// under `key_prefix` now, and every change after, none lost and none twice.
    pub fn list_and_watch(&self, key_prefix: &str) -> Result<(Listing, Watch)> {
        let listing = self.list(key_prefix)?;
        let watch = self.watch(key_prefix, Some(listing.revision))?;
        Ok((listing, watch))
    }

    /// Ends the lease now: every key of this directory is deleted, and every watcher sees a
    /// [`Delete`](super::WatchEvent::Delete) for each.
    pub fn revoke(mut self) -> Result<()> {
        self.revoke_now(self.config.timeout)
    }

    fn revoke_now(&mut self, limit: Duration) -> Result<()> {
        if let Some(k) = self.keepalive.take() {
            k.abort();
        } else {
            return Ok(());
        }
        let mut lease = self.lease.clone();
        let id = self.lease_id;
        let eps = self.config.endpoints.clone();
        let key = self.config.prefix.clone();
        self.runtime.call(
            limit,
            async move {
                match lease.revoke(id).await {
                    Ok(_) => Ok(()),
                    // Already expired: its keys are gone, which is what was asked.
                    Err(etcd_client::Error::GRpcStatus(s))
                        if s.message().contains("lease not found") =>
                    {
                        Ok(())
                    }
                    Err(e) => Err(map_err("lease revoke", &key, &eps, e)),
                }
            },
            || timeout_err("lease revoke", &self.config.prefix, &self.config),
        )
    }

    fn call<T: Send + 'static>(
        &self,
        op: &'static str,
        key: &str,
        fut: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.runtime.call(self.config.timeout, fut, || {
            timeout_err(op, key, &self.config)
        })
    }
}

impl Drop for EtcdDirectory {
    /// Revokes the lease (best effort, at most the configured timeout), so peers see this
    /// directory's keys go at once rather than after the TTL.
    fn drop(&mut self) {
        if let Err(e) = self.revoke_now(self.config.timeout) {
            log::warn!("etcd directory: revoking the lease at drop failed (its keys expire within the TTL): {e}");
        }
    }
}

fn start_hint(endpoints: &[String]) -> Hint {
    let ep = endpoints
        .first()
        .map(|e| e.trim_start_matches("http://"))
        .unwrap_or("127.0.0.1:2379");
    Hint::new(format!(
        "is etcd running at {endpoints:?}? start one with `etcd --listen-client-urls http://{ep} --advertise-client-urls http://{ep}` (Debian: apt-get install etcd-server; in this repository `cargo xtask setup`)"
    ))
}

fn timeout_err(op: &'static str, key: &str, config: &EtcdConfig) -> Error {
    Error::Directory {
        op,
        key: shorten(key),
        detail: format!(
            "no answer from etcd at {:?} within {:?}",
            config.endpoints, config.timeout
        ),
        hint: start_hint(&config.endpoints),
    }
}

fn map_err(op: &'static str, key: &str, endpoints: &[String], e: etcd_client::Error) -> Error {
    let detail = e.to_string();
    let hint = match &e {
        etcd_client::Error::GRpcStatus(s) if s.message().contains("lease not found") => {
            Hint::new("the directory's lease expired (etcd was unreachable for longer than the TTL): connect a new EtcdDirectory and publish again")
        }
        etcd_client::Error::GRpcStatus(s) if s.message().contains("too large") => {
            Hint::new("the request is over etcd's --max-request-bytes (1.5 MiB by default)")
        }
        etcd_client::Error::GRpcStatus(s)
            if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded) =>
        {
            start_hint(endpoints)
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => start_hint(endpoints),
        etcd_client::Error::InvalidUri(_) | etcd_client::Error::InvalidArgs(_) => {
            Hint::new("endpoints look like 127.0.0.1:2379 or http://127.0.0.1:2379 (TLS is not supported)")
        }
        _ => Hint::NONE,
    };
    Error::Directory {
        op,
        key: shorten(key),
        detail,
        hint,
    }
}
