//! The directory's lease: granted at connect, kept alive every third of its TTL by a background
//! task, revoked at [`EtcdDirectory::revoke`](super::EtcdDirectory::revoke). When the process
//! dies the keepalives stop and etcd deletes every key of the lease within its TTL: that is how
//! peers learn that an agent is gone.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{LeaseClient, LeaseKeepAliveStream, LeaseKeeper};

use super::watch::Queue;

/// What the keepalive task shares with the directory and its watches.
#[derive(Default)]
pub(crate) struct LeaseState {
    /// Set once, when the lease is known to be lost.
    lost: Mutex<Option<String>>,
    /// The watches to tell when it is.
    watches: Mutex<Vec<Weak<Queue>>>,
}

impl LeaseState {
    /// Why the lease was lost, if it was.
    pub(crate) fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Adds a watch to tell; a watch added after the loss is ended at once.
    pub(crate) fn register(&self, queue: &Arc<Queue>) {
        let mut w = self.watches.lock().unwrap_or_else(|p| p.into_inner());
        w.retain(|q| q.strong_count() > 0);
        w.push(Arc::downgrade(queue));
        drop(w);
        if let Some(reason) = self.lost() {
            queue.lose(reason);
        }
    }

    /// Marks the lease lost and ends every watch with `reason`.
    fn lose(&self, reason: String) {
        log::error!("etcd directory: {reason}");
        *self.lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.clone());
        let watches = std::mem::take(&mut *self.watches.lock().unwrap_or_else(|p| p.into_inner()));
        for q in watches.iter().filter_map(Weak::upgrade) {
            q.lose(reason.clone());
        }
    }
}

/// Keeps lease `id` (granted with `ttl`) alive every `ttl / 3` until dropped (aborted). It gives
/// up, and marks the lease lost, when etcd says the lease is gone or when no keepalive was
/// answered for `ttl` (etcd has then expired it, or will before any answer could arrive).
pub(crate) async fn keep_alive(
    mut client: LeaseClient,
    id: i64,
    ttl: Duration,
    state: Arc<LeaseState>,
) {
    let period = ttl / 3;
    let mut last_ok = tokio::time::Instant::now();
    let mut chan: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    loop {
        tokio::time::sleep(period).await;
        let attempt = async {
            if chan.is_none() {
                // Opening the stream sends a first keepalive and reads its answer.
                chan = Some(client.keep_alive(id).await?);
                return Ok::<i64, etcd_client::Error>(1);
            }
            let Some((keeper, stream)) = chan.as_mut() else {
                return Ok(1);
            };
            keeper.keep_alive().await?;
            match stream.message().await? {
                Some(resp) => Ok(resp.ttl()),
                None => Err(etcd_client::Error::LeaseKeepAliveError(
                    "etcd closed the keepalive stream".into(),
                )),
            }
        };
        let outcome = tokio::time::timeout(period, attempt).await;
        let now = tokio::time::Instant::now();
        let failure = match outcome {
            Ok(Ok(left)) if left > 0 => {
                last_ok = now;
                continue;
            }
            Ok(Ok(_)) => {
                return state.lose(format!(
                    "etcd says lease {id:#x} expired: every key of this directory is gone for the peers"
                ));
            }
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(e))) if e.contains("not found") => {
                return state.lose(format!(
                    "etcd no longer knows lease {id:#x} ({e}): every key of this directory is gone for the peers"
                ));
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {period:?}"),
        };
        chan = None;
        let silent = now.duration_since(last_ok);
        if silent >= ttl {
            return state.lose(format!(
                "lease {id:#x} was not renewed for {silent:.1?} (TTL {ttl:?}; last failure: {failure}): etcd has dropped every key of this directory"
            ));
        }
        log::warn!("etcd directory: keepalive of lease {id:#x} failed ({failure}); retrying");
    }
}
