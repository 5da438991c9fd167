//! The directory's own tokio runtime: one current-thread runtime driven by one thread of its own
//! (`gdr-xfer-etcd`), so the directory's blocking API can be called from any thread, inside or
//! outside someone else's runtime, without `block_on` (which panics inside a runtime).

use std::future::Future;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::error::{Error, Result};

/// A runtime thread; stopped (its tasks dropped) when this is dropped.
pub(crate) struct Runtime {
    handle: tokio::runtime::Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Runtime {
    /// Starts the runtime and its thread.
    pub(crate) fn start() -> Result<Runtime> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("etcd directory: build its tokio runtime", e))?;
        let handle = rt.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("gdr-xfer-etcd".into())
            .spawn(move || {
                // Ends when the sender is sent to or dropped; the runtime's tasks are dropped
                // with it, here, outside any runtime context.
                rt.block_on(async {
                    let _ = stopped.await;
                });
                rt.shutdown_timeout(Duration::from_millis(200));
            })
            .map_err(|e| Error::io("etcd directory: spawn its runtime thread", e))?;
        Ok(Runtime {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Spawns a background task.
    pub(crate) fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.handle.spawn(fut)
    }

    /// Runs `fut` on the runtime and waits for its result at most `limit`; past it, the future is
    /// dropped and `on_timeout()` is returned.
    pub(crate) fn call<T, F>(
        &self,
        limit: Duration,
        fut: F,
        on_timeout: impl Fn() -> Error,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        let task = self.handle.spawn(async move {
            let r = tokio::time::timeout(limit, fut).await;
            let _ = tx.send(r);
        });
        // The task's own timer ends it at `limit`; the margin covers a runtime thread that is
        // late (or gone), so this never waits forever.
        match rx.recv_timeout(limit + Duration::from_millis(500)) {
            Ok(Ok(r)) => r,
            Ok(Err(_elapsed)) => Err(on_timeout()),
            Err(_) => {
                task.abort();
                Err(on_timeout())
            }
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // Joining the runtime's own thread from itself would fail; nothing of the directory
            // runs there, but a stray drop must not turn into a panic.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}
