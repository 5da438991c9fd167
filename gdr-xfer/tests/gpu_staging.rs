//! GPU tier for host staging (`gdr_xfer::staging`) and the asynchronous copies under it
//! (`gdr::cuda::Stream`): every byte arrives, buffers live as long as a copy may touch them, a
//! stager dropped with copies in flight waits for them. Needs a CUDA GPU (no RDMA device): run on
//! the GPU machine with `--ignored --test-threads=1 --nocapture` (`cargo xtask gpu-bundle`;
//! README, "The GPU machine"). Without a GPU each test fails loudly at `gpu()`.
//!
//! What the pipeline costs and reaches (copy costs, throughput against pinned `cuMemcpy`, the
//! overlap with a simulated NIC at KV-cache sizes) is measured by the `gpu_staging` benchmark
//! (`benches/gpu_staging.rs`), built optimized, never by a timed test.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use gdr::cuda::{DeviceBuffer, DmaHostBuffer, Stream};
use gdr_test_support::gpu;
use gdr_xfer::staging::{Direction, Stager, StagingConfig, StagingEvent};

const MIB: usize = 1 << 20;

fn gpu() {
    gpu::require_gpu("this test");
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    gpu::block_pattern(len, seed)
}

/// Prints `line` and appends it to `$OUT/gpu-staging.txt` (see [`gpu::report`]).
fn report(line: &str) {
    gpu::report("gpu-staging.txt", line);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_async_copies_keep_their_buffers_until_complete() {
    gpu();
    let len = 256 * MIB;
    let stream = Arc::new(Stream::new(0).unwrap());
    let data = pattern(len, 1);
    let dev = Arc::new(DeviceBuffer::alloc(0, len).unwrap());
    dev.copy_from_host(0, &data).unwrap();
    let host = Arc::new(DmaHostBuffer::alloc(0, len).unwrap());
    let weak_dev: Weak<DeviceBuffer> = Arc::downgrade(&dev);
    let weak_host: Weak<DmaHostBuffer> = Arc::downgrade(&host);

    // Issue, then drop our own references at once: the copy keeps both buffers alive.
    let copy = stream.copy_to_host(&dev, 0, &host, 0, len).unwrap();
    let host_keep = host.clone();
    drop(dev);
    drop(host);
    assert!(
        weak_dev.upgrade().is_some(),
        "the copy holds the device buffer"
    );
    copy.wait().unwrap();
    assert!(weak_dev.upgrade().is_none(), "released once complete");
    // SAFETY: the only copy into it is complete and no other view exists.
    let got = unsafe { host_keep.slice(0, len) }.unwrap();
    assert!(got == &data[..], "D2H bytes differ");

    // A handle dropped mid-copy waits: the buffers outlive the copy engine's use.
    let dev2 = Arc::new(DeviceBuffer::alloc(0, len).unwrap());
    let weak2 = Arc::downgrade(&dev2);
    let up = stream.copy_to_device(&host_keep, 0, &dev2, 0, len).unwrap();
    drop(dev2);
    let t = Instant::now();
    drop(up); // waits for the copy, then releases dev2
    report(&format!(
        "drop of an in-flight 256 MiB H2D copy waited {:?}",
        t.elapsed()
    ));
    assert!(weak2.upgrade().is_none());
    drop(host_keep);
    assert!(weak_host.upgrade().is_none());

    // A copy issued on one thread may be waited for on another.
    let dev3 = Arc::new(DeviceBuffer::alloc(0, MIB).unwrap());
    let host3 = Arc::new(DmaHostBuffer::alloc(0, MIB).unwrap());
    dev3.copy_from_host(0, &data[..MIB]).unwrap();
    let copy = stream.copy_to_host(&dev3, 0, &host3, 0, MIB).unwrap();
    std::thread::spawn(move || copy.wait().unwrap())
        .join()
        .unwrap();
    // SAFETY: the copy is complete (joined) and no other view exists.
    assert!(unsafe { host3.slice(0, MIB) }.unwrap() == &data[..MIB]);

    // Bounds are checked before anything is issued.
    let dev = Arc::new(DeviceBuffer::alloc(0, MIB).unwrap());
    let host = Arc::new(DmaHostBuffer::alloc(0, MIB).unwrap());
    for (so, dof, n) in [
        (1, 0, MIB),
        (0, 1, MIB),
        (usize::MAX, 0, 2),
        (0, 0, MIB + 1),
    ] {
        let e = stream.copy_to_host(&dev, so, &host, dof, n).unwrap_err();
        assert!(matches!(e, gdr::Error::OutOfBounds { .. }), "{e}");
        let e = stream.copy_to_device(&host, dof, &dev, so, n).unwrap_err();
        assert!(matches!(e, gdr::Error::OutOfBounds { .. }), "{e}");
    }
    let mut empty = stream.copy_to_host(&dev, MIB, &host, 0, 0).unwrap();
    assert!(empty.is_complete().unwrap() && empty.is_empty());
    assert!(stream.is_idle().unwrap());
    stream.synchronize().unwrap();
}

/// The engine's way: `poll` from one thread, chunks held while "RDMA" uses them (a copy out of
/// the bounce buffer here), D2H and H2D tickets at once; then a stager dropped with copies in
/// flight.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_stager_nonblocking_flow_moves_every_byte() {
    gpu();
    let len = 100 * MIB + 12_345;
    let src = pattern(len, 2);
    let a = Arc::new(DeviceBuffer::alloc(0, len).unwrap());
    a.copy_from_host(0, &src).unwrap();
    let b = Arc::new(DeviceBuffer::alloc(0, len).unwrap());
    let up = pattern(len, 3);

    let mut st = Stager::new(0, StagingConfig::new(4 * MIB, 6)).unwrap();
    report(&st.describe());
    assert!(st.describe().contains("staged through host"));
    let ta = st.start_d2h(&a, 0..len).unwrap();
    let tb = st.start_h2d(&b, 7..len).unwrap();
    let mut got = vec![0u8; len];
    let mut events = Vec::new();
    let mut lent = std::collections::VecDeque::new();
    let mut finished = 0;
    let mut max_in_flight_while_lent = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while finished < 2 {
        assert!(Instant::now() < deadline, "staging did not finish");
        st.poll(&mut events);
        for ev in events.drain(..) {
            match ev {
                StagingEvent::Ready(c) => {
                    let o = c.device_offset();
                    st.read_chunk(&c, 0, &mut got[o..o + c.len()]).unwrap();
                    lent.push_back(c);
                }
                StagingEvent::Fill(c) => {
                    let o = c.device_offset();
                    st.write_chunk(&c, 0, &up[o..o + c.len()]).unwrap();
                    lent.push_back(c);
                }
                StagingEvent::Finished { ticket, outcome } => {
                    assert!(outcome.is_completed(), "{ticket:?}: {outcome:?}");
                    finished += 1;
                }
            }
        }
        if !lent.is_empty() {
            max_in_flight_while_lent = max_in_flight_while_lent.max(st.copies_in_flight());
        }
        // "RDMA completions" arrive one per poll, oldest first.
        if let Some(c) = lent.pop_front() {
            match c.direction() {
                Direction::DeviceToHost => st.release(c).unwrap(),
                Direction::HostToDevice => st.commit(c).unwrap(),
            }
        }
    }
    let _ = (ta, tb);
    assert!(got == src, "D2H bytes differ");
    let on_dev = b.to_vec().unwrap();
    assert!(on_dev[7..] == up[7..], "H2D bytes differ");
    assert_eq!(Arc::strong_count(&a), 1);
    assert_eq!(Arc::strong_count(&b), 1);
    report(&format!(
        "copies in flight while chunks were lent: up to {max_in_flight_while_lent}"
    ));
    assert!(
        max_in_flight_while_lent >= 1,
        "copies overlapped lent chunks"
    );

    // Dropped with copies in flight: the stager waits for them before the memory goes.
    let weak = Arc::downgrade(&a);
    st.start_d2h(&a, 0..len).unwrap();
    st.poll(&mut events);
    assert!(st.copies_in_flight() > 0);
    drop(a);
    assert!(
        weak.upgrade().is_some(),
        "the ticket holds the device memory"
    );
    drop(events);
    drop(st);
    assert!(weak.upgrade().is_none(), "freed after the stager waited");
}
