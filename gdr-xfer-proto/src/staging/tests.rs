//! The bounce-slot machine on its own, with a scripted copy engine: copies complete when the
//! test says so, and fail where it says so.

use std::collections::VecDeque;

use super::*;

/// Device memory: its length.
#[derive(Debug, Clone, Copy)]
struct Dev(usize);

/// Copies issued: (to device, device offset, bounce offset, len), and which complete next.
#[derive(Debug, Default)]
struct Script {
    issued: Vec<(bool, usize, usize, usize)>,
    /// Copies numbered below this are complete.
    complete_below: usize,
    /// Issue fails for this copy number.
    refuse: Option<usize>,
    /// Completion fails for these copy numbers.
    broken: VecDeque<usize>,
}

impl CopyEngine for Script {
    type Device = Dev;
    type Copy = usize;
    type Error = String;

    fn device_len(dev: &Dev) -> usize {
        dev.0
    }
    fn to_bounce(&mut self, _: &Dev, d: usize, b: usize, len: usize) -> Result<usize, String> {
        self.issue(false, d, b, len)
    }
    fn to_device(&mut self, b: usize, _: &Dev, d: usize, len: usize) -> Result<usize, String> {
        self.issue(true, d, b, len)
    }
    fn is_complete(&mut self, copy: &mut usize) -> Result<bool, String> {
        if self.broken.contains(copy) {
            return Err(format!("copy {copy} failed"));
        }
        Ok(*copy < self.complete_below)
    }
    fn wait(&mut self, copy: &mut usize) -> Result<(), String> {
        self.complete_below = self.complete_below.max(*copy + 1);
        self.is_complete(copy).map(|_| ())
    }
}

impl Script {
    fn issue(&mut self, to_device: bool, d: usize, b: usize, len: usize) -> Result<usize, String> {
        let n = self.issued.len();
        if self.refuse == Some(n) {
            return Err(format!("copy {n} refused"));
        }
        self.issued.push((to_device, d, b, len));
        Ok(n)
    }
}

fn config(chunk_size: usize, chunks: usize, max_tickets: usize) -> PipelineConfig {
    PipelineConfig {
        chunk_size,
        chunks,
        max_tickets,
        min_piece: 1,
        first_piece: chunk_size,
        nic_rate: 0,
    }
}

fn pipeline(chunk_size: usize, chunks: usize) -> Pipeline<Script> {
    Pipeline::new(Script::default(), config(chunk_size, chunks, 4)).unwrap()
}

fn poll(p: &mut Pipeline<Script>) -> Vec<StagingEvent<String>> {
    let mut out = Vec::new();
    p.poll(&mut out);
    out
}

fn chunk(ev: StagingEvent<String>) -> Chunk {
    match ev {
        StagingEvent::Ready(c) | StagingEvent::Fill(c) => c,
        StagingEvent::Finished { ticket, .. } => panic!("ticket {ticket:?} finished"),
    }
}

#[test]
fn device_to_host_lends_each_chunk_once_its_copy_completed_and_finishes_last() {
    let mut p = pipeline(16, 2);
    let t = p.start(Direction::DeviceToHost, Dev(40), 0..40).unwrap();
    assert!(poll(&mut p).is_empty(), "two copies issued, none complete");
    assert_eq!(p.copies_in_flight(), 2);
    assert_eq!(
        p.engine().issued,
        vec![(false, 0, 0, 16), (false, 16, 16, 16)]
    );
    p.engine_mut().complete_below = 1;
    let mut ev = poll(&mut p);
    assert_eq!(ev.len(), 1, "only the first copy completed");
    let c = chunk(ev.remove(0));
    assert_eq!(
        (c.ticket(), c.slot(), c.device_offset(), c.len()),
        (t, 0, 0, 16)
    );
    assert_eq!(c.direction(), Direction::DeviceToHost);
    assert!(p.check_chunk(&c, "test").is_ok());
    p.engine_mut().complete_below = 2;
    let c1 = chunk(poll(&mut p).remove(0));
    assert_eq!(c1.bounce_offset(), 16);
    assert!(!p.is_idle());
    p.release(c).unwrap();
    assert!(
        poll(&mut p).is_empty(),
        "the third copy issued into the freed buffer"
    );
    assert_eq!(p.engine().issued[2], (false, 32, 0, 8));
    p.release(c1).unwrap();
    p.engine_mut().complete_below = 3;
    let c2 = chunk(poll(&mut p).remove(0));
    assert_eq!(p.active_tickets(), 1, "not over while a chunk is lent");
    p.release(c2).unwrap();
    match poll(&mut p).remove(0) {
        StagingEvent::Finished {
            ticket,
            outcome: Outcome::Completed { bytes, chunks },
        } => assert_eq!((ticket, bytes, chunks), (t, 40, 3)),
        e => panic!("{e:?}"),
    }
    assert!(p.is_idle());
}

#[test]
fn host_to_device_finishes_only_once_every_commit_copy_completed() {
    let mut p = pipeline(8, 1);
    let t = p.start(Direction::HostToDevice, Dev(8), 0..8).unwrap();
    let c = chunk(poll(&mut p).remove(0));
    assert_eq!(c.direction(), Direction::HostToDevice);
    p.commit(c).unwrap();
    assert!(
        poll(&mut p).is_empty(),
        "the copy to the device is in flight"
    );
    assert!(!p.is_idle());
    p.engine_mut().complete_below = 1;
    match poll(&mut p).remove(0) {
        StagingEvent::Finished {
            ticket,
            outcome: Outcome::Completed { bytes, chunks },
        } => assert_eq!((ticket, bytes, chunks), (t, 8, 1)),
        e => panic!("{e:?}"),
    }
    assert!(p.is_idle());
}

#[test]
fn a_started_ticket_is_work_before_any_buffer_is_used_and_an_empty_one_ends_at_once() {
    let mut p = pipeline(8, 1);
    assert!(p.is_idle() && p.broken_slots() == 0 && p.cuts_kept() == 0);
    let t = p.start(Direction::DeviceToHost, Dev(8), 4..4).unwrap();
    assert!(
        !p.is_idle(),
        "a ticket is active though no buffer is used yet"
    );
    match poll(&mut p).remove(0) {
        StagingEvent::Finished {
            ticket,
            outcome:
                Outcome::Completed {
                    bytes: 0,
                    chunks: 0,
                },
        } => assert_eq!(ticket, t),
        e => panic!("{e:?}"),
    }
    assert!(p.is_idle());
}

#[test]
fn wait_oldest_waits_for_the_oldest_copy_only() {
    let mut p = pipeline(8, 2);
    p.start(Direction::DeviceToHost, Dev(16), 0..16).unwrap();
    poll(&mut p);
    let mut out = Vec::new();
    p.wait_oldest(&mut out);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(chunk(out.remove(0)).device_offset(), 0);
    assert_eq!(p.copies_in_flight(), 1);
}

#[test]
fn a_known_nic_rate_cuts_for_least_time_and_keeps_the_cut() {
    let mb = 1 << 20;
    let cfg = PipelineConfig {
        nic_rate: 25_000_000_000,
        ..config(8 * mb, 64, 4)
    };
    let mut p = Pipeline::new(Script::default(), cfg).unwrap();
    let len = 64 * mb;
    p.start(Direction::DeviceToHost, Dev(len), 0..len).unwrap();
    poll(&mut p);
    let want = cut::least_time(
        len,
        Direction::DeviceToHost,
        cfg.nic_rate,
        cut::CopyModel::of(Direction::DeviceToHost),
        CUT_FLOOR,
        cfg.chunk_size,
    )
    .unwrap();
    let got: Vec<usize> = p.engine().issued.iter().map(|c| c.3).collect();
    assert_eq!(got, want, "the copies follow the least-time cut");
    assert!(want.iter().all(|&l| l >= CUT_FLOOR) && CUT_FLOOR == 256 << 10);
    assert_eq!(p.cuts_kept(), 1);
    p.start(Direction::DeviceToHost, Dev(len), 0..len).unwrap();
    assert_eq!(p.cuts_kept(), 1, "the same length reuses its cut");
    p.start(Direction::HostToDevice, Dev(len), 0..len).unwrap();
    assert_eq!(p.cuts_kept(), 2, "another direction is another cut");
    // Without a rate: cut in pieces (a sixteenth, at least min_piece), no cut kept.
    let mut q = pipeline(8 * mb, 64);
    q.start(Direction::DeviceToHost, Dev(len), 0..len).unwrap();
    poll(&mut q);
    assert!(q.engine().issued.iter().all(|c| c.3 == 4 * mb));
    assert_eq!(q.cuts_kept(), 0);
}

#[test]
fn every_refusal_says_what_to_do() {
    let t = Ticket(1);
    let all = [
        PipelineError::Config { setting: "x" },
        PipelineError::OutsideDevice {
            direction: Direction::DeviceToHost,
            start: 0,
            end: 9,
            device_len: 8,
        },
        PipelineError::TooManyTickets { active: 1 },
        PipelineError::UnknownTicket { ticket: t },
        PipelineError::NotLent {
            call: "c",
            ticket: t,
            slot: 0,
        },
        PipelineError::CommitDeviceToHost { ticket: t },
        PipelineError::CopyNotIssued { ticket: t },
        PipelineError::OutsideChunk {
            call: "c",
            at: 0,
            len: 9,
            chunk_len: 8,
        },
    ];
    let hints: Vec<&str> = all.iter().map(PipelineError::hint).collect();
    for (e, h) in all.iter().zip(&hints) {
        assert!(h.len() > 20, "{e}: {h}");
    }
    assert!(hints[2].contains("max_tickets") && hints[4].contains("stager that lent it"));
    let mut unique = hints.clone();
    unique.dedup();
    assert_eq!(unique.len(), hints.len(), "one hint per refusal");
}

#[test]
fn chunks_given_back_twice_or_to_another_pipeline_are_refused_and_change_nothing() {
    let mut p = pipeline(8, 2);
    let mut q = pipeline(8, 2);
    q.start(Direction::HostToDevice, Dev(8), 0..8).unwrap();
    let theirs = chunk(poll(&mut q).remove(0));
    p.start(Direction::HostToDevice, Dev(16), 0..16).unwrap();
    let mut ev = poll(&mut p);
    let (a, b) = (chunk(ev.remove(0)), chunk(ev.remove(0)));
    assert!(matches!(
        p.release(theirs),
        Err(PipelineError::NotLent { slot: 0, .. })
    ));
    // The same chunk given back twice (a copy only a test can make): refused the second time.
    let stale = Chunk {
        stager: a.stager,
        slot: a.slot,
        seq: a.seq,
        ticket: a.ticket,
        direction: a.direction,
        device_offset: a.device_offset,
        bounce_offset: a.bounce_offset,
        len: a.len,
    };
    p.release(a).unwrap();
    assert!(matches!(
        p.commit(stale),
        Err(PipelineError::NotLent { .. })
    ));
    assert!(
        p.check_chunk(&b, "test").is_ok(),
        "the other chunk is still lent"
    );
    assert!(matches!(
        p.cancel(Ticket(99)),
        Err(PipelineError::UnknownTicket { .. })
    ));
}

#[test]
fn a_device_to_host_commit_is_released_and_refused() {
    let mut p = pipeline(8, 1);
    p.start(Direction::DeviceToHost, Dev(8), 0..8).unwrap();
    poll(&mut p);
    p.engine_mut().complete_below = 1;
    let c = chunk(poll(&mut p).remove(0));
    let t = c.ticket();
    assert_eq!(
        p.commit(c),
        Err(PipelineError::CommitDeviceToHost { ticket: t })
    );
    assert!(matches!(
        poll(&mut p).remove(0),
        StagingEvent::Finished {
            outcome: Outcome::Completed { bytes: 8, .. },
            ..
        }
    ));
}

#[test]
fn refused_starts_change_nothing() {
    let mut p = Pipeline::new(Script::default(), config(8, 1, 1)).unwrap();
    #[allow(clippy::reversed_empty_ranges)]
    for r in [0..9, 5..4, usize::MAX - 1..usize::MAX] {
        assert!(matches!(
            p.start(Direction::DeviceToHost, Dev(8), r),
            Err(PipelineError::OutsideDevice { device_len: 8, .. })
        ));
    }
    assert_eq!(p.active_tickets(), 0);
    p.start(Direction::DeviceToHost, Dev(8), 0..8).unwrap();
    assert_eq!(
        p.start(Direction::DeviceToHost, Dev(8), 0..8),
        Err(PipelineError::TooManyTickets { active: 1 })
    );
    for bad in [
        config(0, 1, 1),
        config(1, 0, 1),
        config(1, 1, 0),
        config(usize::MAX, 2, 1),
    ] {
        assert!(matches!(
            Pipeline::new(Script::default(), bad),
            Err(PipelineError::Config { .. })
        ));
    }
}

#[test]
fn a_failed_copy_fails_its_ticket_and_its_buffer_is_never_used_again() {
    let mut p = pipeline(8, 2);
    let t = p.start(Direction::DeviceToHost, Dev(16), 0..16).unwrap();
    poll(&mut p);
    p.engine_mut().broken.push_back(0);
    p.engine_mut().complete_below = 2;
    let mut ev = poll(&mut p);
    // The failed copy's ticket is stopped: the second copy's bytes are nobody's.
    assert_eq!(p.broken_slots(), 1);
    let finished = ev.pop().unwrap();
    assert!(
        matches!(&finished, StagingEvent::Finished { ticket, outcome: Outcome::Failed(e) }
            if *ticket == t && e == "copy 0 failed"),
        "{finished:?}"
    );
    assert!(ev.is_empty());
    assert!(p.is_idle(), "a broken buffer is not work in progress");
    // A new ticket runs in the one buffer left.
    p.start(Direction::DeviceToHost, Dev(16), 0..16).unwrap();
    poll(&mut p);
    assert_eq!(p.engine().issued.last(), Some(&(false, 0, 8, 8)));
    assert_eq!(p.copies_in_flight(), 1);
}

#[test]
fn a_copy_that_cannot_be_issued_fails_the_ticket_at_once() {
    let mut p = pipeline(8, 1);
    p.engine_mut().refuse = Some(0);
    let t = p.start(Direction::DeviceToHost, Dev(8), 0..8).unwrap();
    let ev = poll(&mut p);
    assert!(matches!(
        &ev[..],
        [StagingEvent::Finished { ticket, outcome: Outcome::Failed(_) }] if *ticket == t
    ));
    // Host to device: the commit's copy is refused; the commit says so, the ticket fails.
    p.engine_mut().refuse = Some(0);
    let t = p.start(Direction::HostToDevice, Dev(8), 0..8).unwrap();
    let c = chunk(poll(&mut p).remove(0));
    assert_eq!(p.commit(c), Err(PipelineError::CopyNotIssued { ticket: t }));
    assert!(matches!(
        poll(&mut p).remove(0),
        StagingEvent::Finished {
            outcome: Outcome::Failed(_),
            ..
        }
    ));
    assert!(p.is_idle());
}

#[test]
fn cancel_waits_for_copies_in_flight_and_lent_chunks() {
    let mut p = pipeline(8, 2);
    let t = p.start(Direction::DeviceToHost, Dev(64), 0..64).unwrap();
    poll(&mut p);
    p.engine_mut().complete_below = 1;
    let c = chunk(poll(&mut p).remove(0));
    p.cancel(t).unwrap();
    assert!(poll(&mut p).is_empty(), "a copy in flight and a chunk lent");
    p.engine_mut().complete_below = 2;
    assert!(
        poll(&mut p).is_empty(),
        "the copy's bytes are dropped; the chunk is still lent"
    );
    p.release(c).unwrap();
    match poll(&mut p).remove(0) {
        StagingEvent::Finished {
            outcome: Outcome::Cancelled { bytes_done },
            ..
        } => assert_eq!(bytes_done, 8),
        e => panic!("{e:?}"),
    }
    assert_eq!(
        p.engine().issued.len(),
        2,
        "nothing issued after the cancel"
    );
    assert!(p.is_idle());
}

#[test]
fn the_chunk_bounds_and_piece_sizes_hold() {
    let mut p = pipeline(8, 1);
    p.start(Direction::HostToDevice, Dev(8), 0..5).unwrap();
    let c = chunk(poll(&mut p).remove(0));
    assert!(check_within("w", &c, 0, 5).is_ok());
    for (at, len) in [(0, 6), (5, 1), (usize::MAX, 2)] {
        assert!(matches!(
            check_within("w", &c, at, len),
            Err(PipelineError::OutsideChunk { chunk_len: 5, .. })
        ));
    }
    let c = PipelineConfig {
        min_piece: 1 << 20,
        ..config(8 << 20, 4, 1)
    };
    assert_eq!(c.piece_size(1 << 20), 1 << 20, "never below min_piece");
    assert_eq!(c.piece_size(64 << 20), 4 << 20, "a sixteenth");
    assert_eq!(c.piece_size(1 << 30), 8 << 20, "never above chunk_size");
    assert_eq!(
        c.piece_size((17 << 20) + 1),
        1152 << 10,
        "rounded up to 64 KiB"
    );
}
