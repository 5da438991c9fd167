//! Watches: the events of a key prefix, in etcd's revision order, delivered to an ordinary thread
//! through a bounded queue; every way a watch can break ends it with [`WatchEvent::Lost`].

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{EventType, WatchStream};

use super::keys::{accept, display_key};
use super::runtime::Runtime;

/// The most events a watch queues for a consumer that does not take them; past it the watch ends
/// with [`WatchEvent::Lost`] (the consumer lists again).
pub const MAX_QUEUED_EVENTS: usize = 65_536;

/// The most bytes (keys and values) a watch queues; past it the watch ends with
/// [`WatchEvent::Lost`].
pub const MAX_QUEUED_BYTES: usize = 64 << 20;

/// One change under a watched prefix. Keys are relative to the directory's prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// `key` was created or changed; `revision` is etcd's revision of the change.
    Put {
        /// The key, relative to the directory's prefix.
        key: String,
        /// The new value.
        value: Vec<u8>,
        /// etcd's revision of the change.
        revision: i64,
    },
    /// `key` was deleted, by its owner or because its owner's lease ended (the owner died or
    /// revoked it).
    Delete {
        /// The key, relative to the directory's prefix.
        key: String,
        /// etcd's revision of the change.
        revision: i64,
    },
    /// A change was received but refused (key not UTF-8, over [`MAX_KEY_LEN`](super::MAX_KEY_LEN),
    /// outside the prefix, or a value over [`MAX_VALUE_LEN`](super::MAX_VALUE_LEN)). The watch goes
    /// on; treat the key as deleted: whatever it held before no longer holds.
    Refused {
        /// The key as text (lossy, shortened).
        key: String,
        /// Why it was refused.
        reason: String,
    },
    /// The watch ended: etcd is gone or silent for longer than the watch timeout, the stream
    /// failed, the start revision was compacted, the consumer fell behind, or this directory's
    /// lease was lost. No event follows (every later receive returns this again): treat every
    /// key seen through this watch as unknown, and list and watch again.
    Lost {
        /// Why, for the log.
        reason: String,
    },
}

impl WatchEvent {
    fn bytes(&self) -> usize {
        match self {
            WatchEvent::Put { key, value, .. } => key.len() + value.len(),
            WatchEvent::Delete { key, .. } | WatchEvent::Refused { key, .. } => key.len(),
            WatchEvent::Lost { reason } => reason.len(),
        }
    }
}

#[derive(Default)]
struct QueueState {
    events: VecDeque<WatchEvent>,
    bytes: usize,
    /// Set once: the reason of the final [`WatchEvent::Lost`].
    lost: Option<String>,
}

/// The queue between a watch task (producer, never blocks) and its [`Watch`] (consumer).
#[derive(Default)]
pub(crate) struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A panic while the lock is held cannot leave the queue half-changed in a way that
        // matters (each change is one push or pop), so a poisoned lock is used as it is.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues an event; false when the watch has ended (now or before).
    pub(crate) fn push(&self, ev: WatchEvent) -> bool {
        let mut s = self.lock();
        if s.lost.is_some() {
            return false;
        }
        let n = ev.bytes();
        if s.events.len() >= MAX_QUEUED_EVENTS || s.bytes + n > MAX_QUEUED_BYTES {
            let reason = format!(
                "the consumer fell behind: {} events ({} bytes) were waiting, over the bound of {MAX_QUEUED_EVENTS} events or {MAX_QUEUED_BYTES} bytes",
                s.events.len(),
                s.bytes
            );
            s.events.clear();
            s.bytes = 0;
            s.lost = Some(reason);
            drop(s);
            self.ready.notify_all();
            return false;
        }
        s.bytes += n;
        s.events.push_back(ev);
        drop(s);
        self.ready.notify_all();
        true
    }

    /// Ends the watch with `reason`, after the events already queued; the first reason stays.
    pub(crate) fn lose(&self, reason: String) {
        let mut s = self.lock();
        if s.lost.is_none() {
            s.lost = Some(reason);
        }
        drop(s);
        self.ready.notify_all();
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lock().lost.is_some()
    }

    fn take(s: &mut QueueState) -> Option<WatchEvent> {
        if let Some(ev) = s.events.pop_front() {
            s.bytes -= ev.bytes();
            return Some(ev);
        }
        s.lost
            .as_ref()
            .map(|r| WatchEvent::Lost { reason: r.clone() })
    }

    fn recv_timeout(&self, t: Duration) -> Option<WatchEvent> {
        let deadline = Instant::now().checked_add(t);
        let mut s = self.lock();
        loop {
            if let Some(ev) = Self::take(&mut s) {
                return Some(ev);
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                // A timeout too large for the clock: wait in long steps.
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return None;
            }
            s = self
                .ready
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// A watch on a key prefix (from [`EtcdDirectory::watch`](super::EtcdDirectory::watch)): events
/// in etcd's revision order. Dropping it cancels the watch.
pub struct Watch {
    queue: Arc<Queue>,
    task: tokio::task::JoinHandle<()>,
    // Keeps the runtime (and so the watch's task) running after the directory is dropped.
    _runtime: Arc<Runtime>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("lost", &self.queue.is_lost())
            .finish_non_exhaustive()
    }
}

impl Watch {
    pub(crate) fn new(
        queue: Arc<Queue>,
        task: tokio::task::JoinHandle<()>,
        runtime: Arc<Runtime>,
    ) -> Watch {
        Watch {
            queue,
            task,
            _runtime: runtime,
        }
    }

    /// The next event, waiting at most `timeout`; `None` when none came in time.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<WatchEvent> {
        self.queue.recv_timeout(timeout)
    }

    /// The next event if one is queued, without waiting.
    pub fn try_recv(&self) -> Option<WatchEvent> {
        Self::take_now(&self.queue)
    }

    fn take_now(q: &Queue) -> Option<WatchEvent> {
        Queue::take(&mut q.lock())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a watch task needs besides its stream.
pub(crate) struct WatchTask {
    pub(crate) stream: WatchStream,
    pub(crate) queue: Arc<Queue>,
    /// The directory's prefix (keys are delivered relative to it).
    pub(crate) prefix: String,
    /// The watched prefix, for messages.
    pub(crate) watched: String,
    /// Silence longer than this ends the watch.
    pub(crate) watch_timeout: Duration,
}

impl WatchTask {
    /// Reads the stream until it ends, fails, is cancelled, or etcd stays silent for longer than
    /// the watch timeout: the task asks etcd for a progress report every half timeout, so a live
    /// etcd always answers within it, even when nothing changes.
    pub(crate) async fn run(self) {
        let WatchTask {
            mut stream,
            queue,
            prefix,
            watched,
            watch_timeout,
        } = self;
        let probe_every = watch_timeout / 2;
        let mut last_heard = tokio::time::Instant::now();
        let mut next_probe = last_heard + probe_every;
        let reason = loop {
            tokio::select! {
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        last_heard = tokio::time::Instant::now();
                        if resp.canceled() {
                            let c = resp.compact_revision();
                            break if c > 0 {
                                format!("etcd cancelled the watch on {watched:?}: its history before revision {c} is compacted; list again")
                            } else {
                                format!("etcd cancelled the watch on {watched:?}: {}", resp.cancel_reason())
                            };
                        }
                        for ev in resp.events() {
                            if !queue.push(convert(&prefix, ev)) {
                                return;
                            }
                        }
                    }
                    Ok(None) => break format!("etcd closed the watch stream on {watched:?}"),
                    Err(e) => break format!("the watch stream on {watched:?} failed: {e}"),
                },
                _ = tokio::time::sleep_until(next_probe) => {
                    let silent = last_heard.elapsed();
                    if silent >= watch_timeout {
                        break format!("etcd did not answer the watch on {watched:?} for {silent:.1?} (watch timeout {watch_timeout:?})");
                    }
                    // Bounded too: a stalled connection must not keep this task from the check.
                    match tokio::time::timeout(probe_every, stream.request_progress()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => break format!("the watch stream on {watched:?} failed: {e}"),
                        Err(_) => break format!("etcd took no progress request on the watch on {watched:?} for {probe_every:?}"),
                    }
                    next_probe = tokio::time::Instant::now() + probe_every;
                }
            }
        };
        log::warn!("etcd directory: watch lost: {reason}");
        queue.lose(reason);
    }
}

fn convert(prefix: &str, ev: &etcd_client::Event) -> WatchEvent {
    let Some(kv) = ev.kv() else {
        return WatchEvent::Refused {
            key: String::new(),
            reason: "event without a key".into(),
        };
    };
    let put = matches!(ev.event_type(), EventType::Put);
    let value = put.then(|| kv.value());
    match accept(prefix, kv.key(), value) {
        Ok(key) if put => WatchEvent::Put {
            key,
            value: kv.value().to_vec(),
            revision: kv.mod_revision(),
        },
        Ok(key) => WatchEvent::Delete {
            key,
            revision: kv.mod_revision(),
        },
        Err(reason) => WatchEvent::Refused {
            key: display_key(kv.key()),
            reason,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(i: usize, len: usize) -> WatchEvent {
        WatchEvent::Put {
            key: format!("k{i}"),
            value: vec![0; len],
            revision: i as i64,
        }
    }

    #[test]
    fn queue_delivers_in_order_then_lost_forever() {
        let q = Queue::default();
        assert!(q.push(put(1, 1)));
        assert!(q.push(put(2, 1)));
        q.lose("gone".into());
        assert!(!q.push(put(3, 1)), "nothing is queued after the end");
        assert_eq!(q.recv_timeout(Duration::ZERO), Some(put(1, 1)));
        assert_eq!(q.recv_timeout(Duration::ZERO), Some(put(2, 1)));
        for _ in 0..2 {
            assert_eq!(
                q.recv_timeout(Duration::ZERO),
                Some(WatchEvent::Lost {
                    reason: "gone".into()
                })
            );
        }
    }

    #[test]
    fn queue_over_its_byte_bound_ends_with_lost() {
        let q = Queue::default();
        let mut pushed = 0;
        while q.push(put(pushed, 1 << 20)) {
            pushed += 1;
            assert!(pushed <= 64, "the byte bound did not hold");
        }
        assert_eq!(
            pushed, 63,
            "63 MiB of values plus keys fit, the 64th does not"
        );
        match q.recv_timeout(Duration::ZERO) {
            Some(WatchEvent::Lost { reason }) => {
                assert!(reason.contains("fell behind"), "{reason}")
            }
            other => panic!("expected Lost, got {other:?}"),
        }
    }

    #[test]
    fn queue_recv_timeout_waits_and_huge_timeouts_do_not_overflow() {
        let q = Arc::new(Queue::default());
        let t = Instant::now();
        assert_eq!(q.recv_timeout(Duration::from_millis(50)), None);
        assert!(t.elapsed() >= Duration::from_millis(50));
        let q2 = q.clone();
        let producer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            q2.push(put(7, 0));
        });
        assert_eq!(q.recv_timeout(Duration::MAX), Some(put(7, 0)));
        producer.join().unwrap();
    }
}
