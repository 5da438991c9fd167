//! [`EtcdDirectory`]: lease-bound keys under a prefix in etcd, with lookup, consistent prefix
//! listing and gap-free watches, behind a blocking API with a timeout on every call.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KvClient, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchClient, WatchOptions,
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

/// A name held in the directory, from [`EtcdDirectory::claim`]: its key, created at one
/// revision under this directory's lease, holds every key under its scope for this directory
/// alone until [`release`](EtcdDirectory::release) deletes it or the lease ends. It is that key
/// at that revision: a key of the same name created later (by anyone) is another claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    scope: String,
    key: String,
    revision: i64,
    lease: i64,
}

impl Claim {
    /// The scope held, relative to the directory's prefix (e.g. `prefill-0/`).
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The key that holds it, relative to the directory's prefix (e.g. `prefill-0/endpoint`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// etcd's revision at which the key was created.
    pub fn revision(&self) -> i64 {
        self.revision
    }
}

/// A directory of lease-bound records in etcd (feature `etcd`).
///
/// At connect it grants a lease and keeps it alive from its own runtime thread; every key it puts
/// is bound to that lease, so all of them disappear, and every watcher sees a
/// [`Delete`](super::WatchEvent::Delete) for each, when the lease ends: at [`revoke`](Self::revoke),
/// at drop, or within the TTL after this process dies. Every call is blocking and returns within
/// the configured timeout (plus half a second at most), whatever etcd does.
///
/// A key belongs to the lease that created it: [`put`](Self::put) replaces only a key of this
/// directory and [`delete`](Self::delete) deletes only one, so no directory can take over or
/// remove another's records (a key held by another lease is refused with
/// [`Error::NameTaken`]). A whole name (every key under a scope such as `prefill-0/`) is held
/// with [`claim`](Self::claim): created only when nothing lies under the scope, written and
/// deleted through [`put_claimed`](Self::put_claimed), [`delete_claimed`](Self::delete_claimed)
/// and [`release`](Self::release), which act only while that claim stands.
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

    /// Puts `value` at `key` (relative to the prefix), bound to this directory's lease, if no
    /// key is there or the one there is this directory's (bound to its lease): one etcd
    /// transaction, so a key of another directory is never replaced.
    ///
    /// # Errors
    /// [`Error::NameTaken`] when the key is held by another lease (or by none); nothing was put.
    /// [`Error::TooLarge`] for a key over [`MAX_KEY_LEN`](super::MAX_KEY_LEN) (prefix included)
    /// or a value over [`MAX_VALUE_LEN`](super::MAX_VALUE_LEN); [`Error::Directory`] when the
    /// lease is lost or etcd fails.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let full = full_key(&self.config.prefix, key, "put")?;
        check_value(key, value)?;
        self.check_lease("put", &full)?;
        match self.owned_put(&full, value, None)? {
            PutOutcome::Done => Ok(()),
            PutOutcome::Held { key: k, lease } | PutOutcome::GuardHeld { key: k, lease } => {
                Err(self.taken("EtcdDirectory::put", key, &full, vec![(k, lease)]))
            }
            PutOutcome::GuardGone => unreachable!("no guard was given"),
        }
    }

    /// Holds the name `scope` (relative to the prefix, e.g. `prefill-0/`): puts `value` at
    /// `key`, which lies under `scope`, bound to this directory's lease, if and only if no key
    /// at all lies under `scope` (one etcd transaction: every key in the scope's range has
    /// create revision 0). Exactly one of several directories (or callers sharing one
    /// directory) claiming a free scope at once wins.
    ///
    /// The claim lasts until [`release`](Self::release) or the end of the lease; meanwhile
    /// every other claim of the scope is refused, including one through this same directory.
    /// The scope is free again once every key under it is gone.
    ///
    /// # Errors
    /// [`Error::NameTaken`] when some key lies under `scope` (the error names one and its
    /// lease); [`Error::InvalidArgument`] for an empty `scope` or a `key` outside it; as
    /// [`put`](Self::put) otherwise.
    pub fn claim(&self, scope: &str, key: &str, value: &[u8]) -> Result<Claim> {
        let full_scope = full_key(&self.config.prefix, scope, "claim")?;
        let full = full_key(&self.config.prefix, key, "claim")?;
        check_value(key, value)?;
        if scope.is_empty() || !key.starts_with(scope) {
            return Err(Error::invalid(
                format!("directory claim: key {:?} does not lie under the scope {:?}", shorten(key), shorten(scope)),
                "claim a scope such as \"prefill-0/\" with a key under it such as \"prefill-0/endpoint\"",
            ));
        }
        self.check_lease("claim", &full)?;
        let lease = self.lease_id;
        let end = prefix_end(full_scope.as_bytes());
        let txn = Txn::new()
            .when([
                Compare::create_revision(full_scope.clone(), CompareOp::Equal, 0)
                    .with_range(end.clone()),
            ])
            .and_then([TxnOp::put(full.clone(), value.to_vec(), with_lease(lease))])
            .or_else([TxnOp::get(
                full_scope.clone(),
                Some(
                    GetOptions::new()
                        .with_range(end)
                        .with_keys_only()
                        .with_limit(16),
                ),
            )]);
        let mut kv = self.kv.clone();
        let eps = self.config.endpoints.clone();
        let k = full.clone();
        let resp = self.call("claim", &full, async move {
            kv.txn(txn).await.map_err(|e| map_err("claim", &k, &eps, e))
        })?;
        if !resp.succeeded() {
            let found = resp
                .op_responses()
                .into_iter()
                .filter_map(|op| match op {
                    TxnOpResponse::Get(get) => Some(get),
                    _ => None,
                })
                .flat_map(|get| {
                    get.kvs()
                        .iter()
                        .map(|e| (e.key().to_vec(), e.lease()))
                        .collect::<Vec<_>>()
                })
                .collect();
            return Err(self.taken("EtcdDirectory::claim", scope, &full_scope, found));
        }
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        if revision <= 0 {
            return Err(Error::Directory {
                op: "claim",
                key: shorten(&full),
                detail: "etcd's answer has no revision".into(),
                hint: Hint::new("is the endpoint an etcd v3 server?"),
            });
        }
        Ok(Claim {
            scope: scope.to_owned(),
            key: key.to_owned(),
            revision,
            lease,
        })
    }

    /// [`put`](Self::put) of a `key` under `claim`'s scope, done only while the claim stands
    /// (its key is still the one created at its revision), in one etcd transaction.
    ///
    /// # Errors
    /// [`Error::NameTaken`] when the claim's key is now another's, or `key` is held by another
    /// lease; [`Error::Directory`] when the claim is gone (released, or the lease ended);
    /// [`Error::InvalidArgument`] for a claim of another directory or a key outside its scope;
    /// as [`put`](Self::put) otherwise.
    pub fn put_claimed(&self, claim: &Claim, key: &str, value: &[u8]) -> Result<()> {
        let full = full_key(&self.config.prefix, key, "put")?;
        check_value(key, value)?;
        self.check_claim(claim, key)?;
        self.check_lease("put", &full)?;
        let claim_key = format!("{}{}", self.config.prefix, claim.key);
        let call = "EtcdDirectory::put_claimed";
        match self.owned_put(&full, value, Some((claim_key.clone(), claim.revision)))? {
            PutOutcome::Done => Ok(()),
            PutOutcome::GuardGone => Err(claim_gone("put", &full, claim)),
            PutOutcome::GuardHeld { key: k, lease } => {
                Err(self.taken(call, &claim.scope, &claim_key, vec![(k, lease)]))
            }
            PutOutcome::Held { key: k, lease } => {
                Err(self.taken(call, key, &full, vec![(k, lease)]))
            }
        }
    }

    /// Deletes `key` (under `claim`'s scope) if the claim still stands and the key is this
    /// directory's; returns whether it did. Nothing of another lease or of a later claim of
    /// the same name is deleted.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a claim of another directory or a key outside its scope;
    /// [`Error::Directory`] when etcd fails.
    pub fn delete_claimed(&self, claim: &Claim, key: &str) -> Result<bool> {
        let full = full_key(&self.config.prefix, key, "delete")?;
        self.check_claim(claim, key)?;
        let claim_key = format!("{}{}", self.config.prefix, claim.key);
        let txn = Txn::new()
            .when([
                Compare::create_revision(claim_key, CompareOp::Equal, claim.revision),
                Compare::lease(full.clone(), CompareOp::Equal, self.lease_id),
            ])
            .and_then([TxnOp::delete(full.clone(), None)]);
        self.delete_txn("delete", &full, txn)
    }

    /// Ends `claim`: deletes its key if it is still the one created at the claim's revision;
    /// returns whether it did. Delete the other keys under the scope first
    /// ([`delete_claimed`](Self::delete_claimed)): the scope is free once every key under it is
    /// gone (keys left behind go when the lease ends).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a claim of another directory; [`Error::Directory`] when
    /// etcd fails.
    pub fn release(&self, claim: &Claim) -> Result<bool> {
        self.check_claim(claim, &claim.key)?;
        let claim_key = format!("{}{}", self.config.prefix, claim.key);
        let txn = Txn::new()
            .when([Compare::create_revision(
                claim_key.clone(),
                CompareOp::Equal,
                claim.revision,
            )])
            .and_then([TxnOp::delete(claim_key.clone(), None)]);
        self.delete_txn("release", &claim_key, txn)
    }

    /// Puts `value` at `full` bound to this directory's lease if the key there is this lease's
    /// or there is none, and (with a `guard`) only while the guard's key has the given create
    /// revision. Every put is one transaction guarded by those comparisons; a key that changes
    /// between the "create" and the "replace" attempt is tried again, a few times. (One
    /// transaction with both branches would carry the value twice, over etcd's request bound
    /// for values near [`MAX_VALUE_LEN`](super::MAX_VALUE_LEN).)
    fn owned_put(
        &self,
        full: &str,
        value: &[u8],
        guard: Option<(String, i64)>,
    ) -> Result<PutOutcome> {
        let mut kv = self.kv.clone();
        let lease = self.lease_id;
        let eps = self.config.endpoints.clone();
        let k = full.to_owned();
        let value = value.to_vec();
        self.call("put", full, async move {
            let mut replace = false;
            for _ in 0..4 {
                let mut when = Vec::new();
                if let Some((g, rev)) = &guard {
                    when.push(Compare::create_revision(g.clone(), CompareOp::Equal, *rev));
                }
                when.push(if replace {
                    Compare::lease(k.clone(), CompareOp::Equal, lease)
                } else {
                    Compare::create_revision(k.clone(), CompareOp::Equal, 0)
                });
                let keys_only = || Some(GetOptions::new().with_keys_only());
                let mut gets = vec![TxnOp::get(k.clone(), keys_only())];
                if let Some((g, _)) = &guard {
                    gets.push(TxnOp::get(g.clone(), keys_only()));
                }
                let txn = Txn::new()
                    .when(when)
                    .and_then([TxnOp::put(k.clone(), value.clone(), with_lease(lease))])
                    .or_else(gets);
                let resp = kv.txn(txn).await.map_err(|e| map_err("put", &k, &eps, e))?;
                if resp.succeeded() {
                    return Ok(PutOutcome::Done);
                }
                let ops = resp.op_responses();
                let found = |i: usize| match ops.get(i) {
                    Some(TxnOpResponse::Get(get)) => get
                        .kvs()
                        .first()
                        .map(|e| (e.key().to_vec(), e.lease(), e.create_revision())),
                    _ => None,
                };
                if let Some((_, rev)) = &guard {
                    match found(1) {
                        None => return Ok(PutOutcome::GuardGone),
                        Some((key, lease, created)) if created != *rev => {
                            return Ok(PutOutcome::GuardHeld { key, lease })
                        }
                        Some(_) => {}
                    }
                }
                match found(0) {
                    None => replace = false,
                    Some((_, l, _)) if l == lease => replace = true,
                    Some((key, lease, _)) => return Ok(PutOutcome::Held { key, lease }),
                }
            }
            Err(Error::Directory {
                op: "put",
                key: shorten(&k),
                detail: "the key kept changing between attempts (created and deleted by others)"
                    .into(),
                hint: Hint::new(
                    "another client keeps writing this key: find it with `etcdctl watch`",
                ),
            })
        })
    }

    /// Fails when the lease is lost: nothing can be put any more.
    fn check_lease(&self, op: &'static str, full: &str) -> Result<()> {
        match self.state.lost() {
            Some(reason) => Err(Error::Directory {
                op,
                key: shorten(full),
                detail: format!("the directory's lease is lost: {reason}"),
                hint: Hint::new("connect a new EtcdDirectory and publish again"),
            }),
            None => Ok(()),
        }
    }

    /// Refuses a claim of another directory, or a key outside its scope.
    fn check_claim(&self, claim: &Claim, key: &str) -> Result<()> {
        if claim.lease != self.lease_id {
            return Err(Error::invalid(
                format!(
                    "directory: the claim of {:?} was made by lease {:#x}, not this directory's ({:#x})",
                    shorten(&claim.scope),
                    claim.lease,
                    self.lease_id
                ),
                "use a claim with the directory that made it",
            ));
        }
        if !key.starts_with(&claim.scope) {
            return Err(Error::invalid(
                format!(
                    "directory: key {:?} does not lie under the claimed scope {:?}",
                    shorten(key),
                    shorten(&claim.scope)
                ),
                "claim the key's own scope",
            ));
        }
        Ok(())
    }

    /// Runs a transaction of one guarded delete; returns whether it succeeded.
    fn delete_txn(&self, op: &'static str, full: &str, txn: Txn) -> Result<bool> {
        let mut kv = self.kv.clone();
        let eps = self.config.endpoints.clone();
        let k = full.to_owned();
        self.call(op, full, async move {
            let resp = kv.txn(txn).await.map_err(|e| map_err(op, &k, &eps, e))?;
            Ok(resp.succeeded())
        })
    }

    /// [`Error::NameTaken`] for `name` (relative), from the keys and leases a refused
    /// transaction found (`full` when it found none).
    fn taken(
        &self,
        call: &'static str,
        name: &str,
        full: &str,
        found: Vec<(Vec<u8>, i64)>,
    ) -> Error {
        let (key, holder) = found
            .iter()
            .find(|(_, l)| *l != self.lease_id)
            .or(found.first())
            .map(|(k, l)| (display_key(k), *l))
            .unwrap_or_else(|| (shorten(full), 0));
        let hint = if holder == self.lease_id {
            "another agent (or caller) of this process holds it through this same directory: give each agent its own name".to_owned()
        } else if holder == 0 {
            format!("a record bound to no lease stays until someone deletes it: if it is stale, `etcdctl del {key}`")
        } else {
            format!(
                "choose another agent name, or wait until its holder withdraws (shutdown or drop of that agent) or its lease ends (within the holder's TTL after its process dies, {DEFAULT_TTL:?} by default); `etcdctl get --prefix {}` shows its records",
                shorten(full)
            )
        };
        Error::NameTaken {
            call,
            name: shorten(name),
            key,
            holder_lease: holder,
            hint: Hint::new(hint),
        }
    }

    /// Deletes `key` if this directory put it (it is bound to this directory's lease); returns
    /// whether it did. A key of another directory (another lease) is left alone.
    pub fn delete(&self, key: &str) -> Result<bool> {
        let full = full_key(&self.config.prefix, key, "delete")?;
        let txn = Txn::new()
            .when([Compare::lease(
                full.clone(),
                CompareOp::Equal,
                self.lease_id,
            )])
            .and_then([TxnOp::delete(full.clone(), None)]);
        self.delete_txn("delete", &full, txn)
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

fn with_lease(lease: i64) -> Option<PutOptions> {
    Some(PutOptions::new().with_lease(lease))
}

/// How [`EtcdDirectory::owned_put`] ended.
enum PutOutcome {
    /// Put.
    Done,
    /// The key is held by another lease (or by none).
    Held { key: Vec<u8>, lease: i64 },
    /// The guard's key is gone.
    GuardGone,
    /// The guard's key is another one (created at another revision).
    GuardHeld { key: Vec<u8>, lease: i64 },
}

/// The error of a write under a claim whose key is gone.
fn claim_gone(op: &'static str, full: &str, claim: &Claim) -> Error {
    Error::Directory {
        op,
        key: shorten(full),
        detail: format!(
            "the claim of {:?} is gone: its key {:?} was deleted (released, or the lease ended)",
            shorten(&claim.scope),
            shorten(&claim.key)
        ),
        hint: Hint::new(
            "claim the name again (publish again with a new EtcdDirectory if the lease was lost)",
        ),
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
