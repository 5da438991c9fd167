//! Awaited RDMA writes on tokio: many tasks, each posting a write and awaiting its own
//! completion, between two queue pairs of one process on one device.
//!
//! ```text
//! cargo run --features tokio --example async_write -- [DEVICE] [WRITES]
//! cargo xtask vm -- target/debug/examples/async_write rxe0 1000     # in the Soft-RoCE VM
//! ```
//!
//! Every task registers its own 4 KiB source, writes it into its slot of one destination
//! region, and awaits the completion; the program then checks every byte. Dropping a task's
//! future early would be just as safe: the queue pair keeps the source registered until the
//! NIC is done with it.

use std::sync::Arc;
use std::time::Instant;

use gdr::aio::AsyncCompletionQueue;
use gdr::{
    AccessFlags, CompletionQueue, Context, Error, MemoryRegion, ProtectionDomain, QueuePair,
    SendRequest,
};

const SLOT: usize = 4096;

#[tokio::main]
async fn main() -> gdr::Result<()> {
    let mut args = std::env::args().skip(1);
    let device = args.next().unwrap_or_else(|| "rxe0".into());
    let writes: usize = match args.next() {
        Some(n) => n
            .parse()
            .map_err(|e| Error::invalid(format!("WRITES {n:?}: {e}"), "a count, e.g. 1000"))?,
        None => 256,
    };

    let ctx = Context::open(&device)?;
    let pd = ProtectionDomain::new(&ctx)?;
    let cq = CompletionQueue::with_channel(&ctx, 4096)?;
    let peer_cq = CompletionQueue::new(&ctx, 64)?;
    let qp = Arc::new(QueuePair::builder(&pd, &cq, &cq).max_send_wr(256).build()?);
    let peer = QueuePair::builder(&pd, &peer_cq, &peer_cq).build()?;
    qp.connect(&peer.endpoint())?;
    peer.connect(&qp.endpoint())?;
    let dst = MemoryRegion::new(&pd, writes * SLOT, AccessFlags::remote_rw())?;
    let remote = dst.remote();
    let acq = AsyncCompletionQueue::new(&cq)?;

    let start = Instant::now();
    let mut tasks = Vec::with_capacity(writes);
    for i in 0..writes {
        let (pd, qp, acq) = (pd.clone(), qp.clone(), acq.clone());
        tasks.push(tokio::spawn(async move {
            let src =
                MemoryRegion::with_data(&pd, &[(i % 251) as u8; SLOT], AccessFlags::LOCAL_WRITE)?;
            let off = (i * SLOT) as u64;
            let local = [src.slice(..)?];
            let req = SendRequest::write(&local, remote.slice(off..off + SLOT as u64)?);
            loop {
                match acq.post_send(&qp, &req) {
                    Ok(done) => return done.await.map(|_| ()),
                    // The send queue is full: let other tasks' completions free a slot.
                    Err(Error::QueueFull { .. }) => tokio::task::yield_now().await,
                    Err(e) => return Err(e),
                }
            }
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| Error::invalid(format!("a write task failed: {e}"), "see its panic"))??;
    }
    let took = start.elapsed();
    let data = dst.to_vec();
    for i in 0..writes {
        if data[i * SLOT..(i + 1) * SLOT]
            .iter()
            .any(|&b| b != (i % 251) as u8)
        {
            return Err(Error::invalid(
                format!("slot {i} holds the wrong bytes"),
                "a bug: report it",
            ));
        }
    }
    println!(
        "{writes} awaited writes of {SLOT} bytes from {writes} tasks in {took:?} on {device}: every byte verified"
    );
    Ok(())
}
