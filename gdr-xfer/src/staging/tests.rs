//! Host tests of the staging pipeline: a fake copy engine that performs each copy only when it
//! reports it complete (a few polls after issue), so a chunk handed out early, a bounce buffer
//! reused under a copy, or a copy completed out of order shows up as wrong bytes or a failed
//! check.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use super::chunk::{Direction, Outcome, StagingEvent};
use super::pipeline::{BounceViews, Pipeline};
use super::{Stager, StagingConfig};
use crate::error::{Error, Hint, Result};
use gdr_xfer_proto::staging::CopyEngine;

struct FakeDev {
    bytes: Mutex<Vec<u8>>,
}

fn dev(len: usize, seed: u8) -> Arc<FakeDev> {
    Arc::new(FakeDev {
        bytes: Mutex::new(pattern(len, seed)),
    })
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8 ^ seed)
        .collect()
}

struct FakeCopy {
    id: usize,
    to_bounce: bool,
    dev: Arc<FakeDev>,
    dev_offset: usize,
    bounce_offset: usize,
    len: usize,
    polls_left: u32,
    done: bool,
}

#[derive(Default)]
struct FakeLog {
    issued: usize,
    completed: Vec<usize>,
    /// Bounce bytes with a copy in flight.
    busy: Vec<(usize, usize)>,
    max_in_flight: usize,
}

struct FakeEngine {
    bounce: *mut u8,
    bounce_len: usize,
    latency: u32,
    direct: bool,
    fail_issue: Option<usize>,
    fail_query: Option<usize>,
    log: RefCell<FakeLog>,
}

impl FakeEngine {
    fn new(config: StagingConfig, latency: u32, direct: bool) -> Self {
        let len = config.total().unwrap();
        let bounce = Box::into_raw(vec![0u8; len].into_boxed_slice()).cast::<u8>();
        FakeEngine {
            bounce,
            bounce_len: len,
            latency,
            direct,
            fail_issue: None,
            fail_query: None,
            log: RefCell::default(),
        }
    }

    fn issue(
        &mut self,
        to_bounce: bool,
        dev: &Arc<FakeDev>,
        dev_offset: usize,
        bounce_offset: usize,
        len: usize,
    ) -> Result<FakeCopy> {
        let mut log = self.log.borrow_mut();
        let id = log.issued;
        log.issued += 1;
        if self.fail_issue == Some(id) {
            return Err(fake_error("issue", id));
        }
        assert!(bounce_offset + len <= self.bounce_len);
        assert!(dev_offset + len <= dev.bytes.lock().unwrap().len());
        for &(o, l) in &log.busy {
            assert!(
                bounce_offset + len <= o || o + l <= bounce_offset,
                "copy {id} into bounce {bounce_offset}+{len} overlaps a copy in flight at {o}+{l}"
            );
        }
        log.busy.push((bounce_offset, len));
        log.max_in_flight = log.max_in_flight.max(log.busy.len());
        Ok(FakeCopy {
            id,
            to_bounce,
            dev: dev.clone(),
            dev_offset,
            bounce_offset,
            len,
            polls_left: self.latency,
            done: false,
        })
    }

    fn run(&self, c: &mut FakeCopy) {
        let mut log = self.log.borrow_mut();
        assert!(
            log.completed.last().is_none_or(|&last| last < c.id),
            "copies completed out of issue order"
        );
        log.completed.push(c.id);
        let pos = log
            .busy
            .iter()
            .position(|&b| b == (c.bounce_offset, c.len))
            .unwrap();
        log.busy.remove(pos);
        let mut d = c.dev.bytes.lock().unwrap();
        // SAFETY: in bounds (asserted at issue); the test is single-threaded and no view of the
        // bounce bytes is alive during a copy (the pipeline's invariant, which this checks).
        let bounce =
            unsafe { std::slice::from_raw_parts_mut(self.bounce.add(c.bounce_offset), c.len) };
        let dev = &mut d[c.dev_offset..c.dev_offset + c.len];
        if c.to_bounce {
            bounce.copy_from_slice(dev);
        } else {
            dev.copy_from_slice(bounce);
        }
        c.done = true;
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        // SAFETY: made by Box::into_raw of a boxed slice of this length in `new`.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.bounce,
                self.bounce_len,
            ))
        });
    }
}

fn fake_error(what: &str, id: usize) -> Error {
    Error::InvalidArgument {
        what: format!("fake copy {id}: injected {what} failure"),
        hint: Hint::NONE,
    }
}

impl CopyEngine for FakeEngine {
    type Error = Error;
    type Device = Arc<FakeDev>;
    type Copy = FakeCopy;

    fn device_len(dev: &Arc<FakeDev>) -> usize {
        dev.bytes.lock().unwrap().len()
    }
    fn to_bounce(
        &mut self,
        dev: &Arc<FakeDev>,
        dev_offset: usize,
        bounce_offset: usize,
        len: usize,
    ) -> Result<FakeCopy> {
        self.issue(true, dev, dev_offset, bounce_offset, len)
    }
    fn to_device(
        &mut self,
        bounce_offset: usize,
        dev: &Arc<FakeDev>,
        dev_offset: usize,
        len: usize,
    ) -> Result<FakeCopy> {
        self.issue(false, dev, dev_offset, bounce_offset, len)
    }
    fn is_complete(&mut self, c: &mut FakeCopy) -> Result<bool> {
        if c.done {
            return Ok(true);
        }
        if self.fail_query == Some(c.id) {
            return Err(fake_error("query", c.id));
        }
        if c.polls_left > 0 {
            c.polls_left -= 1;
            return Ok(false);
        }
        self.run(c);
        Ok(true)
    }
    fn wait(&mut self, c: &mut FakeCopy) -> Result<()> {
        if !c.done {
            if self.fail_query == Some(c.id) {
                return Err(fake_error("wait", c.id));
            }
            self.run(c);
        }
        Ok(())
    }
}

impl BounceViews for FakeEngine {
    unsafe fn bounce(&self, offset: usize, len: usize) -> Option<&[u8]> {
        assert!(offset + len <= self.bounce_len);
        // SAFETY: in bounds; the caller excludes writers.
        self.direct
            .then(|| unsafe { std::slice::from_raw_parts(self.bounce.add(offset), len) })
    }
    unsafe fn bounce_mut(&self, offset: usize, len: usize) -> Option<&mut [u8]> {
        assert!(offset + len <= self.bounce_len);
        // SAFETY: in bounds; the caller guarantees exclusive access.
        self.direct
            .then(|| unsafe { std::slice::from_raw_parts_mut(self.bounce.add(offset), len) })
    }
    unsafe fn read_bounce(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        // SAFETY: forwarded.
        out.copy_from_slice(unsafe { self.bounce_direct(offset, out.len()) });
        Ok(())
    }
    unsafe fn write_bounce(&self, offset: usize, data: &[u8]) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.bounce_direct_mut(offset, data.len()) }.copy_from_slice(data);
        Ok(())
    }
}

impl FakeEngine {
    /// # Safety
    /// As `CopyEngine::bounce`.
    unsafe fn bounce_direct(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset + len <= self.bounce_len);
        // SAFETY: in bounds; forwarded contract.
        unsafe { std::slice::from_raw_parts(self.bounce.add(offset), len) }
    }
    /// # Safety
    /// As `CopyEngine::bounce_mut`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bounce_direct_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset + len <= self.bounce_len);
        // SAFETY: in bounds; forwarded contract.
        unsafe { std::slice::from_raw_parts_mut(self.bounce.add(offset), len) }
    }
}

fn pipeline(chunk: usize, chunks: usize, latency: u32, direct: bool) -> Pipeline<FakeEngine> {
    let config = StagingConfig::new(chunk, chunks);
    Pipeline::new(FakeEngine::new(config, latency, direct), config).unwrap()
}

#[test]
fn blocking_d2h_delivers_every_byte_in_order() {
    for direct in [true, false] {
        let mut p = pipeline(64, 3, 2, direct);
        let d = dev(1000, 1);
        let want = pattern(1000, 1);
        let mut got = Vec::new();
        let mut offsets = Vec::new();
        let out = p
            .copy_d2h(d.clone(), 13..1000, |off, bytes| {
                offsets.push(off);
                got.extend_from_slice(bytes);
                Ok(())
            })
            .unwrap();
        assert_eq!(got, want[13..1000]);
        assert_eq!(offsets, (13..1000).step_by(64).collect::<Vec<_>>());
        let n = 987usize.div_ceil(64) as u64;
        assert!(
            matches!(out, Outcome::Completed { bytes: 987, chunks } if chunks == n),
            "{out:?}"
        );
        assert_eq!(Arc::strong_count(&d), 1, "the ticket let go of the device");
        assert!(
            p.engine().log.borrow().max_in_flight >= 2,
            "copies overlapped"
        );
        assert_eq!(p.active_tickets(), 0);
    }
}

#[test]
fn blocking_h2d_writes_every_byte() {
    for direct in [true, false] {
        let mut p = pipeline(100, 4, 1, direct);
        let d = dev(5000, 0);
        let src = pattern(4321, 9);
        let out = p
            .copy_h2d(d.clone(), 500..4821, |off, buf| {
                buf.copy_from_slice(&src[off - 500..off - 500 + buf.len()]);
                Ok(())
            })
            .unwrap();
        assert!(
            matches!(out, Outcome::Completed { bytes: 4321, .. }),
            "{out:?}"
        );
        let now = d.bytes.lock().unwrap().clone();
        let before = pattern(5000, 0);
        assert_eq!(&now[500..4821], &src[..]);
        assert_eq!(
            &now[..500],
            &before[..500],
            "bytes before the range untouched"
        );
        assert_eq!(
            &now[4821..],
            &before[4821..],
            "bytes after the range untouched"
        );
        assert!(p.engine().log.borrow().max_in_flight >= 2);
    }
}

/// The engine's way: several tickets in both directions at once, chunks held for a while (as
/// an RDMA request would hold them) and given back out of order.
#[test]
fn nonblocking_tickets_in_both_directions_share_the_bounce_buffers() {
    let mut p = pipeline(32, 4, 3, true);
    let a = dev(777, 2);
    let b = dev(300, 3);
    let c = dev(1024, 0);
    let src_c = pattern(1000, 5);
    let ta = p.start(Direction::DeviceToHost, a.clone(), 0..777).unwrap();
    let tb = p
        .start(Direction::DeviceToHost, b.clone(), 100..300)
        .unwrap();
    let tc = p
        .start(Direction::HostToDevice, c.clone(), 24..1024)
        .unwrap();
    let mut got_a = vec![0u8; 777];
    let mut got_b = vec![0u8; 300];
    let mut held = Vec::new();
    let mut finished = Vec::new();
    let mut overlap_seen = false;
    let mut events = Vec::new();
    for round in 0..10_000 {
        p.poll(&mut events);
        for ev in events.drain(..) {
            match ev {
                StagingEvent::Ready(ch) => {
                    let mut buf = vec![0u8; ch.len()];
                    p.read_chunk(&ch, 0, &mut buf).unwrap();
                    let direct = p.chunk_bytes(&ch).unwrap().unwrap();
                    assert_eq!(direct, &buf[..]);
                    let dst = if ch.ticket() == ta {
                        &mut got_a
                    } else {
                        &mut got_b
                    };
                    dst[ch.device_offset()..ch.device_offset() + ch.len()].copy_from_slice(&buf);
                    held.push((round + 2, ch));
                }
                StagingEvent::Fill(ch) => {
                    assert_eq!(ch.ticket(), tc);
                    let o = ch.device_offset() - 24;
                    p.write_chunk(&ch, 0, &src_c[o..o + ch.len()]).unwrap();
                    held.push((round + 1, ch));
                }
                StagingEvent::Finished { ticket, outcome } => {
                    assert!(outcome.is_completed(), "{ticket:?}: {outcome:?}");
                    finished.push(ticket);
                }
            }
        }
        if !held.is_empty() && p.copies_in_flight() > 0 {
            overlap_seen = true;
        }
        // Give back, newest first, the chunks whose "RDMA" is done.
        let mut k = held.len();
        while k > 0 {
            k -= 1;
            if held[k].0 <= round {
                let (_, ch) = held.remove(k);
                match ch.direction() {
                    Direction::DeviceToHost => p.release(ch).unwrap(),
                    Direction::HostToDevice => p.commit(ch).unwrap(),
                }
            }
        }
        if finished.len() == 3 {
            break;
        }
    }
    finished.sort();
    assert_eq!(finished, vec![ta, tb, tc]);
    assert!(overlap_seen, "copies ran while chunks were lent");
    assert_eq!(got_a, pattern(777, 2));
    assert_eq!(&got_b[100..], &pattern(300, 3)[100..]);
    assert_eq!(&c.bytes.lock().unwrap()[24..], &src_c[..]);
    for d in [&a, &b, &c] {
        assert_eq!(Arc::strong_count(d), 1);
    }
}

#[test]
fn hostile_chunks_and_ranges_are_refused() {
    let mut p = pipeline(16, 2, 0, true);
    let q = pipeline(16, 2, 0, true);
    let d = dev(64, 0);
    #[allow(clippy::reversed_empty_ranges)]
    for r in [0..65, 60..70, 10..5, usize::MAX - 1..usize::MAX] {
        let e = p
            .start(Direction::DeviceToHost, d.clone(), r.clone())
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{r:?}: {e}");
    }
    let t = p.start(Direction::DeviceToHost, d.clone(), 0..64).unwrap();
    let mut ev = Vec::new();
    while ev.is_empty() {
        p.poll(&mut ev);
    }
    let StagingEvent::Ready(ch) = ev.remove(0) else {
        panic!("expected a ready chunk")
    };
    // Another stager does not know it.
    assert!(q.chunk_bytes(&ch).is_err());
    assert!(q.read_chunk(&ch, 0, &mut [0; 4]).is_err());
    // Past the chunk's end.
    for (at, n) in [(0, 17), (16, 1), (usize::MAX, 2)] {
        let e = p.read_chunk(&ch, at, &mut vec![0; n]).unwrap_err();
        assert!(e.to_string().contains("do not fit"), "{e}");
    }
    // A device-to-host chunk cannot be committed; the commit gives it back instead.
    let e = p.commit(ch).unwrap_err();
    assert!(e.to_string().contains("device-to-host"), "{e}");
    // Unknown tickets.
    assert!(p.cancel(super::Ticket(999)).is_err());
    // Drain: the ticket still finishes.
    let mut done = false;
    for _ in 0..100 {
        for e in std::mem::take(&mut ev) {
            match e {
                StagingEvent::Ready(c) => p.release(c).unwrap(),
                StagingEvent::Finished { ticket, .. } => {
                    assert_eq!(ticket, t);
                    done = true;
                }
                StagingEvent::Fill(_) => unreachable!(),
            }
        }
        p.poll(&mut ev);
    }
    assert!(done && p.active_tickets() == 0);
    // Ticket limit.
    let config = StagingConfig {
        max_tickets: 2,
        ..StagingConfig::new(16, 2)
    };
    let mut p = Pipeline::new(FakeEngine::new(config, 0, true), config).unwrap();
    p.start(Direction::DeviceToHost, d.clone(), 0..1).unwrap();
    p.start(Direction::HostToDevice, d.clone(), 0..1).unwrap();
    let e = p.start(Direction::DeviceToHost, d, 0..1).unwrap_err();
    assert!(e.to_string().contains("max_tickets"), "{e}");
}

#[test]
fn cancel_waits_for_copies_and_lent_chunks_then_lets_go_of_the_memory() {
    let mut p = pipeline(8, 3, 2, true);
    let d = dev(1000, 4);
    let t = p
        .start(Direction::DeviceToHost, d.clone(), 0..1000)
        .unwrap();
    let mut ev = Vec::new();
    let mut lent = Vec::new();
    while lent.is_empty() {
        p.poll(&mut ev);
        lent.extend(ev.drain(..).filter_map(|e| match e {
            StagingEvent::Ready(c) => Some(c),
            _ => None,
        }));
    }
    p.cancel(t).unwrap();
    assert!(Arc::strong_count(&d) > 1, "held while chunks are lent");
    for _ in 0..10 {
        p.poll(&mut ev);
        for e in ev.drain(..) {
            match e {
                StagingEvent::Ready(c) => lent.push(c),
                other => panic!("nothing finishes while a chunk is lent: {other:?}"),
            }
        }
    }
    assert_eq!(p.copies_in_flight(), 0);
    for c in lent.drain(..) {
        p.release(c).unwrap();
    }
    p.poll(&mut ev);
    match ev.pop() {
        Some(StagingEvent::Finished {
            ticket,
            outcome: Outcome::Cancelled { bytes_done },
        }) => {
            assert_eq!(ticket, t);
            assert!(bytes_done > 0 && bytes_done < 1000);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(Arc::strong_count(&d), 1);
    // An empty range finishes at once.
    let t = p.start(Direction::HostToDevice, d.clone(), 5..5).unwrap();
    p.poll(&mut ev);
    assert!(matches!(
        ev.pop(),
        Some(StagingEvent::Finished { ticket, outcome: Outcome::Completed { bytes: 0, chunks: 0 } }) if ticket == t
    ));
}

#[test]
fn failed_copies_fail_the_ticket_and_the_stager_goes_on() {
    // A copy refused at issue.
    let mut p = pipeline(10, 2, 1, true);
    p.engine_mut().fail_issue = Some(1);
    let d = dev(100, 0);
    let e = p.copy_d2h(d.clone(), 0..100, |_, _| Ok(())).unwrap_err();
    assert!(e.to_string().contains("injected issue failure"), "{e}");
    assert_eq!(p.active_tickets(), 0);
    assert_eq!(Arc::strong_count(&d), 1);
    // The next ticket works.
    let mut got = Vec::new();
    p.copy_d2h(d.clone(), 0..100, |_, b| {
        got.extend_from_slice(b);
        Ok(())
    })
    .unwrap();
    assert_eq!(got, pattern(100, 0));

    // A copy whose completion cannot be known: its bounce buffer is never reused.
    let mut p = pipeline(10, 3, 1, true);
    p.engine_mut().fail_query = Some(0);
    let e = p.copy_h2d(d.clone(), 0..100, |_, b| {
        b.fill(7);
        Ok(())
    });
    assert!(e.unwrap_err().to_string().contains("injected"));
    assert_eq!(p.broken_slots(), 1);
    let mut got = Vec::new();
    p.copy_d2h(d.clone(), 0..100, |_, b| {
        got.extend_from_slice(b);
        Ok(())
    })
    .unwrap();
    let before = pattern(100, 0);
    assert_eq!(&got[..10], &before[..10], "the failed copy wrote nothing");
    assert!(
        got[10..30].iter().all(|&b| b == 7),
        "the copies in flight behind it completed"
    );
    assert_eq!(
        &got[30..],
        &before[30..],
        "nothing was issued after the failure"
    );

    // The sink's error ends the copy, cancels the rest, and leaks no bounce buffer.
    let mut p = pipeline(10, 2, 0, true);
    let mut calls = 0;
    let e = p
        .copy_d2h(d.clone(), 0..100, |off, _| {
            calls += 1;
            if off == 20 {
                Err(fake_error("sink", 20))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
    assert!(e.to_string().contains("sink"));
    assert_eq!(calls, 3, "no chunk after the failing one reached the sink");
    assert_eq!(p.active_tickets(), 0);
    assert_eq!(p.broken_slots(), 0);
    p.copy_d2h(d.clone(), 0..100, |_, _| Ok(())).unwrap();
    // A busy stager refuses a blocking copy.
    p.start(Direction::DeviceToHost, d.clone(), 0..10).unwrap();
    let e = p.copy_d2h(d, 0..10, |_, _| Ok(())).unwrap_err();
    assert!(e.to_string().contains("needs it idle"), "{e}");
}

/// Without a usable CUDA driver (as on the machines `cargo xtask test` runs on), making a
/// stager is a typed error, never a panic; a bad configuration is refused before CUDA is asked.
#[test]
fn stager_without_cuda_is_a_typed_error() {
    let e = Stager::new(0, StagingConfig::new(0, 4)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    match gdr::cuda::device_count() {
        Err(gdr::Error::CudaUnavailable { .. }) => {
            let e = Stager::new(0, StagingConfig::default()).unwrap_err();
            assert!(
                matches!(e, Error::Gdr(gdr::Error::CudaUnavailable { .. })),
                "{e}"
            );
            println!("no CUDA: {e}");
        }
        Ok(n) => {
            // A GPU machine: a missing ordinal is a typed error too.
            let e = Stager::new(n + 7, StagingConfig::default()).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        }
        Err(other) => panic!("device_count failed unexpectedly: {other}"),
    }
}

#[test]
fn bytes_text_is_human() {
    use super::stager::bytes_text;
    assert_eq!(bytes_text(8 << 20), "8 MiB");
    assert_eq!(bytes_text(1 << 30), "1 GiB");
    assert_eq!(bytes_text(1536), "1536 B");
    assert_eq!(bytes_text(4096), "4 KiB");
}

/// The engine moves its stagers into its progress thread.
#[test]
fn stagers_and_chunks_can_move_to_the_progress_thread() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Stager>();
    send_sync::<super::Chunk>();
    send_sync::<StagingEvent>();
    send_sync::<gdr::cuda::AsyncCopy>();
    send_sync::<gdr::cuda::Stream>();
    send_sync::<gdr::cuda::DmaHostBuffer>();
}

/// A range of two chunk sizes is cut into sixteen pieces where `min_piece` allows (here eight of
/// 64 KiB), so its copies still overlap the caller's work on every bounce buffer.
#[test]
fn short_ranges_use_every_bounce_buffer() {
    let config = StagingConfig {
        min_piece: 64 << 10,
        ..StagingConfig::new(256 << 10, 4)
    };
    let mut p = Pipeline::new(FakeEngine::new(config, 1, true), config).unwrap();
    let d = dev(512 << 10, 6);
    let mut offsets = Vec::new();
    let mut got = Vec::new();
    p.copy_d2h(d, 0..512 << 10, |off, b| {
        offsets.push((off, b.len()));
        got.extend_from_slice(b);
        Ok(())
    })
    .unwrap();
    let piece = 64 << 10;
    assert_eq!(
        offsets,
        (0..8).map(|k| (k * piece, piece)).collect::<Vec<_>>()
    );
    assert_eq!(got, pattern(512 << 10, 6));
    assert_eq!(p.engine().log.borrow().max_in_flight, 4);
}

/// With the NIC's rate known, ranges follow the least-time cut (the same one for the same
/// length, kept), in both directions, and every byte still arrives once.
#[test]
fn a_known_nic_rate_cuts_for_least_time_and_moves_every_byte() {
    let len = 16 << 20;
    let config = StagingConfig {
        nic_rate: 50_000_000_000,
        ..StagingConfig::new(8 << 20, 4)
    };
    let want_d2h = super::cut::least_time(
        len,
        Direction::DeviceToHost,
        config.nic_rate,
        super::cut::CopyModel::DEVICE_TO_HOST,
        StagingConfig::CUT_FLOOR,
        config.chunk_size,
    )
    .unwrap();
    assert!(want_d2h.len() > 4, "{want_d2h:?}");
    let mut p = Pipeline::new(FakeEngine::new(config, 1, true), config).unwrap();
    let d = dev(len, 3);
    for _ in 0..2 {
        let mut lens = Vec::new();
        let mut got = Vec::new();
        p.copy_d2h(d.clone(), 0..len, |_, b| {
            lens.push(b.len());
            got.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(lens, want_d2h);
        assert!(got == pattern(len, 3), "D2H bytes");
    }
    assert_eq!(p.cuts_kept(), 1, "one cut kept for one length");
    let src = pattern(len, 4);
    let mut lens = Vec::new();
    p.copy_h2d(d.clone(), 0..len, |off, buf| {
        lens.push(buf.len());
        buf.copy_from_slice(&src[off..off + buf.len()]);
        Ok(())
    })
    .unwrap();
    assert!(*d.bytes.lock().unwrap() == src, "H2D bytes");
    assert!(
        lens.len() > 4 && lens.iter().sum::<usize>() == len,
        "{lens:?}"
    );
    // Ranges of many lengths: the kept cuts stay few.
    for k in 1..40usize {
        p.copy_d2h(d.clone(), 0..k * 4096 + 1, |_, _| Ok(()))
            .unwrap();
    }
    assert!(p.cuts_kept() <= gdr_xfer_proto::staging::CUTS_KEPT);
}
