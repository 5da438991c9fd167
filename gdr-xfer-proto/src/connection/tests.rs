//! Unit tests of the core with a scripted driver: each test makes completions arrive exactly
//! when it wants and checks what the core asked the driver to do.

use std::time::Duration;

use crate::control::Control;
use crate::fault::Lost;
use crate::io::{Event, Header, Op, Status};
use crate::run::Run;
use crate::transfer::{Failure, Spec, TransferKey};

use super::scripted::{cfg, lane, Mock, T};

impl T {
    /// A transfer of `runs` runs of 100 bytes of local segment `local` (one request each).
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &mut self,
        ms: u64,
        handle: u32,
        op: Op,
        runs: u64,
        local: u8,
        timeout_ms: Option<u64>,
        notify: Option<&[u8]>,
    ) -> Result<TransferKey, Failure> {
        let rails = self.c.config().rails;
        let spec = Spec {
            op,
            locals: vec![local],
            runs: (0..runs)
                .map(|i| Run {
                    local: 0,
                    local_offset: i * 1000,
                    remote_addr: 0x10000 + i * 1000,
                    remote: 0,
                    len: 100,
                })
                .collect(),
            rkeys: (0..rails as u32).map(|r| 0xa0 + r).collect(),
            timeout: timeout_ms.map(Duration::from_millis),
            notify: notify.map(<[u8]>::to_vec),
            rail_mask: u32::MAX,
            handle,
        };
        let now = self.at(ms);
        let r = match self.inline_max {
            Some(max) => self.c.submit_inline_up_to(now, &mut self.io, spec, max),
            None => self.c.submit(now, &mut self.io, spec),
        };
        self.drain();
        r
    }
}

#[test]
fn a_transfer_past_its_deadline_reports_only_once_its_requests_completed() {
    let mut t = T::new(cfg(1, 1));
    t.submit(0, 1, Op::Read, 3, 0, Some(10), None).unwrap();
    assert_eq!(t.io.posts.len(), 1, "one batch of three requests");
    t.tick(10);
    assert!(
        t.io.finished.is_empty(),
        "its requests are still in flight: no outcome yet"
    );
    // A second transfer into the same memory must not be overtaken by the first's late bytes:
    // the first's outcome comes only after its requests completed.
    t.complete_all(20);
    match t.io.outcome(1) {
        Some(Err(Failure::Timeout { .. })) | Some(Ok(())) => {}
        other => panic!("{other:?}"),
    }
    assert!(
        t.io.destroyed.is_empty(),
        "completed in time: nothing fenced"
    );
}

#[test]
fn a_timed_out_transfer_that_had_landed_everything_reports_success() {
    let mut t = T::new(cfg(1, 1));
    t.submit(0, 1, Op::Write, 2, 0, Some(10), None).unwrap();
    t.tick(10);
    t.complete_all(12);
    assert_eq!(
        t.io.outcome(1),
        Some(&Ok(())),
        "every byte landed: the outcome says so"
    );
}

#[test]
fn requests_outliving_the_quiesce_time_are_fenced_and_a_read_then_reports() {
    let mut t = T::new(cfg(1, 1));
    t.submit(0, 1, Op::Read, 2, 0, Some(10), None).unwrap();
    t.tick(10);
    t.tick(109);
    assert!(t.io.finished.is_empty());
    assert_eq!(
        t.c.poll_timeout(),
        Some(t.at(110)),
        "the fence is due at deadline + quiesce"
    );
    t.tick(110);
    assert_eq!(
        t.io.destroyed,
        vec![lane(0, 0)],
        "the queue pair carrying its requests"
    );
    assert!(matches!(
        t.io.outcome(1),
        Some(Err(Failure::Timeout { .. }))
    ));
    // The rail is renewed at once, not paused: it counts as usable.
    assert!(matches!(
        t.io.control.last(),
        Some(Control::Renew {
            rail: 0,
            epoch: 1,
            ..
        })
    ));
    assert!(t
        .io
        .events
        .iter()
        .any(|e| matches!(e, Event::Fenced { .. })));
    assert!(
        t.submit(111, 2, Op::Read, 1, 0, Some(1000), None).is_ok(),
        "other transfers wait, not fail"
    );
}

#[test]
fn a_fenced_write_waits_for_the_peer_to_confirm_or_one_more_quiesce_time() {
    let mut t = T::new(cfg(1, 1));
    t.submit(0, 1, Op::Write, 2, 0, Some(10), None).unwrap();
    t.tick(10);
    t.tick(110);
    assert_eq!(t.io.destroyed, vec![lane(0, 0)]);
    assert!(
        t.io.finished.is_empty(),
        "its bytes may still be on the wire towards the peer"
    );
    // The peer answers the renewal (it destroyed its side first): the outcome comes.
    t.peer_renews(115);
    assert!(matches!(
        t.io.outcome(1),
        Some(Err(Failure::Timeout { .. }))
    ));
    // Without an answer, one quiesce time after the fence.
    let mut t = T::new(cfg(1, 1));
    t.submit(0, 1, Op::Write, 1, 0, Some(10), None).unwrap();
    t.tick(10);
    t.tick(110);
    t.tick(209);
    assert!(t.io.finished.is_empty());
    assert_eq!(t.c.poll_timeout(), Some(t.at(210)));
    t.tick(210);
    assert!(matches!(
        t.io.outcome(1),
        Some(Err(Failure::Timeout { .. }))
    ));
    assert!(t.at(210) <= t.at(10) + t.c.config().outcome_bound());
}

#[test]
fn a_post_refused_for_its_own_memory_fails_only_that_transfer() {
    let mut t = T::new(cfg(1, 1));
    t.io.foreign = vec![9];
    t.submit(0, 1, Op::Write, 2, 0, Some(1000), None).unwrap();
    t.submit(0, 2, Op::Write, 2, 9, Some(1000), None).unwrap();
    t.submit(0, 3, Op::Write, 2, 0, Some(1000), None).unwrap();
    assert!(
        matches!(t.io.outcome(2), Some(Err(Failure::Rejected { .. }))),
        "{:?}",
        t.io.finished
    );
    assert!(t.io.destroyed.is_empty(), "no rail failed");
    t.complete_all(1);
    assert_eq!(t.io.outcome(1), Some(&Ok(())));
    assert_eq!(t.io.outcome(3), Some(&Ok(())));
    assert!(t.c.rails()[0].1.errors == 0);
}

#[test]
fn a_request_error_fails_its_transfer_and_renews_the_rail_without_failing_the_others() {
    let mut t = T::new(cfg(1, 1));
    t.submit(0, 1, Op::Write, 1, 0, Some(1000), None).unwrap();
    t.submit(0, 2, Op::Write, 1, 0, Some(1000), None).unwrap();
    let first = t.io.posts[0].clone();
    t.io.posts.clear();
    // The first transfer's request hit a bad remote key: its queue pair is in error.
    t.complete(1, first.lane, first.wr_ids[0], Status::RequestError);
    assert!(
        t.io.outcome(2).is_none(),
        "the other is posted again, not failed"
    );
    assert!(
        t.io.outcome(1).is_none(),
        "a WRITE whose queue pair is destroyed waits for the peer"
    );
    assert_eq!(t.c.rails()[0].1.errors, 0, "not a rail failure");
    t.peer_renews(2);
    assert!(matches!(
        t.io.outcome(1),
        Some(Err(Failure::SliceFailed { .. }))
    ));
    // The probe, then the transfer again on the new queue pair.
    let probe = t.io.messages.pop().unwrap();
    assert_eq!(probe.3.flags, Header::PROBE);
    t.complete(3, probe.0, probe.1, Status::Success);
    assert_eq!(t.io.posts.len(), 1);
    assert_eq!(t.io.posts[0].lane.gen, probe.0.gen);
    t.complete_all(4);
    assert_eq!(
        t.io.outcome(2),
        Some(&Ok(())),
        "the peer confirmed its side when it answered"
    );
}

#[test]
fn a_lane_error_pauses_its_rail_and_what_it_carried_goes_on_the_other() {
    let mut t = T::new(cfg(2, 1));
    // 12 requests, 8 fit a send queue: two batches, one per rail.
    t.submit(0, 1, Op::Write, 12, 0, Some(1000), None).unwrap();
    let on_rail: Vec<usize> = t.io.posts.iter().map(|p| p.lane.lane).collect();
    assert!(
        on_rail.contains(&0) && on_rail.contains(&1),
        "striped: {on_rail:?}"
    );
    let p0 =
        t.io.posts
            .iter()
            .find(|p| p.lane.lane == 0)
            .unwrap()
            .clone();
    t.io.posts.retain(|p| p.lane.lane != 0);
    t.complete(1, p0.lane, p0.wr_ids[0], Status::LaneError);
    assert_eq!(t.c.rails()[0].0, crate::RailState::Paused);
    assert!(t.io.destroyed.contains(&lane(0, 0)));
    // Posted again on rail 1, with rail 1's key.
    let again = t.io.posts.last().unwrap();
    assert_eq!(again.lane.lane, 1);
    assert!(again.rkeys.iter().all(|&k| k == 0xa1));
    t.complete_all(2);
    assert!(
        t.io.outcome(1).is_none(),
        "its first requests may still be on the wire"
    );
    t.tick(101);
    assert_eq!(
        t.io.outcome(1),
        Some(&Ok(())),
        "one quiesce time after the failure"
    );
    assert!(t.c.rails()[0].1.retries > 0);
}

#[test]
fn with_no_rail_for_a_quiesce_time_every_transfer_fails() {
    let mut t = T::new(cfg(1, 1));
    t.submit(0, 1, Op::Read, 1, 0, Some(1000), None).unwrap();
    t.submit(0, 2, Op::Read, 1, 0, Some(1000), None).unwrap();
    let p = t.io.posts[0].clone();
    t.complete(1, p.lane, p.wr_ids[0], Status::LaneError);
    assert!(t.io.destroyed.contains(&lane(0, 0)));
    // They wait: the peer may renew the rail (its own request may have broken it).
    assert!(t.io.finished.is_empty());
    assert!(t.submit(2, 3, Op::Read, 1, 0, Some(1000), None).is_ok());
    t.tick(100);
    assert!(t.io.finished.is_empty());
    t.tick(101);
    for h in [1, 2, 3] {
        assert!(
            matches!(t.io.outcome(h), Some(Err(Failure::NoRail { .. }))),
            "{h}"
        );
    }
    assert!(matches!(
        t.submit(102, 4, Op::Read, 1, 0, None, None),
        Err(Failure::NoRail { .. })
    ));
    // After the cool-down the rail is renewed.
    t.tick(1 + crate::FIRST_COOLDOWN.as_millis() as u64);
    assert!(matches!(
        t.io.control.last(),
        Some(Control::Renew { rail: 0, .. })
    ));
}

#[test]
fn a_rail_the_peer_renews_within_the_quiesce_time_carries_the_waiting_transfers_on() {
    // The peer's bad request broke the queue pairs both sides share: ours see their retries
    // exceeded and the only rail pauses; the peer's renewal arrives before the quiesce time.
    let mut t = T::new(cfg(1, 1));
    t.submit(0, 1, Op::Read, 1, 0, Some(1000), None).unwrap();
    let p = t.io.posts.remove(0);
    t.complete(1, p.lane, p.wr_ids[0], Status::LaneError);
    let now = t.at(20);
    t.c.handle_control(
        now,
        &mut t.io,
        Control::Renew {
            rail: 0,
            epoch: 1,
            endpoints: vec![5],
        },
    );
    t.drain();
    assert!(matches!(
        t.io.control.last(),
        Some(Control::Renewed { epoch: 1, .. })
    ));
    t.complete_all(21);
    t.tick(200);
    assert_eq!(t.io.outcome(1), Some(&Ok(())));
}

#[test]
fn a_notification_goes_only_after_every_request_completed_and_is_sent_again_after_a_failure() {
    let mut t = T::new(cfg(2, 1));
    t.submit(0, 1, Op::Write, 12, 0, Some(1000), Some(b"req-1"))
        .unwrap();
    let posts = std::mem::take(&mut t.io.posts);
    t.drain();
    assert_eq!(posts.len(), 2);
    t.complete(
        1,
        posts[0].lane,
        *posts[0].wr_ids.last().unwrap(),
        Status::Success,
    );
    assert!(t.io.messages.is_empty(), "half the data is still in flight");
    t.complete(
        1,
        posts[1].lane,
        *posts[1].wr_ids.last().unwrap(),
        Status::Success,
    );
    let (l, wr, _, h, data) = t.io.messages.pop().unwrap();
    assert_eq!((h.flags, data.as_slice()), (0, &b"req-1"[..]));
    // Its rail fails before it completed: sent again (same id) on the other rail.
    t.complete(2, l, wr, Status::LaneError);
    let (l2, wr2, _, h2, _) = t.io.messages.pop().unwrap();
    assert_ne!(l2.lane, l.lane);
    assert_eq!(h2.id, h.id);
    assert!(t.io.outcome(1).is_none());
    t.complete(3, l2, wr2, Status::Success);
    t.tick(102);
    assert_eq!(t.io.outcome(1), Some(&Ok(())));
}

#[test]
fn received_notifications_are_delivered_once_and_hold_their_slot_until_taken() {
    let mut t = T::new(cfg(1, 1));
    let l = lane(0, 0);
    let msg = |id: u64, body: &[u8]| {
        let mut m = Header { flags: 0, id }.encode().to_vec();
        m.extend_from_slice(body);
        m
    };
    let now = t.at(1);
    t.c.handle_recv(now, &mut t.io, l, 0, Some(&msg(5, b"a")));
    t.drain();
    t.c.handle_recv(now, &mut t.io, l, 1, Some(&msg(5, b"a")));
    t.drain();
    assert_eq!(
        t.io.delivered.len(),
        1,
        "a repeat (sent again after a failure) is dropped"
    );
    // The message is copied out, so any slot may be posted again: one now (the repeat's), the
    // delivered one's only once the application took it. A sender faster than the application
    // is held back by its own receiver-not-ready retries, not by our memory.
    assert_eq!(t.io.armed.len(), 1);
    let receipt = t.io.delivered[0].1;
    t.c.consumed(&mut t.io, receipt);
    t.drain();
    assert_eq!(t.io.armed.len(), 2);
    assert_ne!(t.io.armed[0].1, t.io.armed[1].1);
    // A probe is never delivered; a short message neither.
    let probe = Header {
        flags: Header::PROBE,
        id: 0,
    }
    .encode();
    t.c.handle_recv(now, &mut t.io, l, 0, Some(&probe));
    t.drain();
    t.c.handle_recv(now, &mut t.io, l, 1, Some(&[1, 2]));
    t.drain();
    assert_eq!(t.io.delivered.len(), 1);
}

#[test]
fn bad_submissions_are_refused_with_nothing_kept_whatever_the_state() {
    let mut t = T::new(cfg(1, 1));
    assert!(matches!(
        t.submit(0, 1, Op::Write, 1, 0, None, Some(&[0; 17])),
        Err(Failure::Rejected { .. })
    ));
    let spec = |runs: Vec<Run>, rkeys: Vec<u32>| Spec::<Mock> {
        op: Op::Write,
        locals: vec![0],
        runs,
        rkeys,
        timeout: None,
        notify: None,
        rail_mask: 1,
        handle: 9,
    };
    let run = |local, remote, len| Run {
        local,
        local_offset: 0,
        remote_addr: 0,
        remote,
        len,
    };
    let now = t.at(0);
    for s in [
        spec(vec![], vec![1]),
        spec(vec![run(0, 0, 0)], vec![1]),
        spec(vec![run(1, 0, 10)], vec![1]),
        spec(vec![run(0, 1, 10)], vec![1]),
    ] {
        assert!(matches!(
            t.c.submit(now, &mut t.io, s),
            Err(Failure::Rejected { .. })
        ));
        t.drain();
    }
    assert_eq!(t.c.transfers(), 0);
    // Closed: still the argument error first, then the state.
    t.c.close(
        now,
        Failure::PeerLost {
            why: Lost::Unlisted,
        },
    );
    t.drain();
    assert!(matches!(
        t.submit(0, 1, Op::Write, 1, 0, None, Some(&[0; 17])),
        Err(Failure::Rejected { .. })
    ));
    assert!(matches!(
        t.submit(0, 1, Op::Write, 1, 0, None, None),
        Err(Failure::PeerLost { .. })
    ));
}

#[test]
fn a_pinned_transfer_keeps_to_its_rail_when_its_preferred_rail_comes_back() {
    // Found by the simulation (seed 36036): pinned to rail 1 while rail 0, which it prefers,
    // was down; once rail 0 was back the preference excluded the pin and it never posted again.
    let mut c = cfg(2, 1);
    c.stripe_min = 1 << 20;
    c.send_depth = 1;
    let mut t = T::new(c);
    // Rail 0 fails.
    t.submit(0, 1, Op::Write, 1, 0, Some(5000), None).unwrap();
    let p = t.io.posts.remove(0);
    assert_eq!(p.lane.lane, 0);
    t.complete(1, p.lane, p.wr_ids[0], Status::LaneError);
    t.complete_all(1);
    t.tick(101);
    assert_eq!(t.io.outcome(1), Some(&Ok(())), "posted again on rail 1");
    // A two-request transfer preferring rail 0 starts on rail 1 (depth 1: one at a time).
    let spec = Spec::<Mock> {
        op: Op::Write,
        locals: vec![0],
        runs: vec![Run {
            local: 0,
            local_offset: 0,
            remote_addr: 0,
            remote: 0,
            len: 200,
        }],
        rkeys: vec![0xa0, 0xa1],
        timeout: Some(Duration::from_secs(5)),
        notify: None,
        rail_mask: 1,
        handle: 2,
    };
    let now = t.at(2);
    t.c.submit(now, &mut t.io, spec).unwrap();
    t.drain();
    let first = t.io.posts.remove(0);
    assert_eq!(first.lane.lane, 1);
    // Rail 0 comes back (renewal answered, probe completed).
    t.tick(2 + crate::FIRST_COOLDOWN.as_millis() as u64);
    t.peer_renews(300);
    let probe = t.io.messages.pop().unwrap();
    t.complete(301, probe.0, probe.1, Status::Success);
    assert_eq!(t.c.rails()[0].0, crate::RailState::Active);
    // Its first request completes: the second goes on rail 1, its rail.
    t.complete(302, first.lane, first.wr_ids[0], Status::Success);
    let second = t.io.posts.remove(0);
    assert_eq!(second.lane.lane, 1);
    t.complete(303, second.lane, second.wr_ids[0], Status::Success);
    assert_eq!(t.io.outcome(2), Some(&Ok(())));
}

#[test]
fn a_cancelled_transfer_posts_nothing_more_and_reports_when_quiet() {
    let mut c = cfg(1, 1);
    c.send_depth = 2;
    let mut t = T::new(c);
    let k = t.submit(0, 1, Op::Write, 5, 0, None, Some(b"n")).unwrap();
    assert_eq!(t.io.posts.len(), 1);
    assert!(t.c.cancel(t.at(1), &mut t.io, k));
    t.drain();
    assert!(t.io.finished.is_empty(), "two requests still in flight");
    t.complete_all(2);
    assert_eq!(t.io.outcome(1), Some(&Err(Failure::Cancelled)));
    assert!(
        t.io.posts.is_empty() && t.io.messages.is_empty(),
        "neither the rest nor the notification"
    );
    assert!(!t.c.cancel(t.at(3), &mut t.io, k), "gone");
    t.drain();
}

#[test]
fn a_cancel_while_everything_is_in_flight_still_reports_cancelled_once_quiet() {
    // Every request posted before the cancel, and every one then lands: the caller asked for a
    // stop before the transfer finished, so it is told Cancelled (not a success whose
    // notification was never sent), once the memory is quiet.
    let mut t = T::new(cfg(1, 1));
    let k = t.submit(0, 1, Op::Write, 3, 0, None, Some(b"n")).unwrap();
    assert_eq!(t.io.posts.len(), 1, "one batch with every request");
    assert!(t.c.cancel(t.at(1), &mut t.io, k));
    t.drain();
    assert!(t.io.finished.is_empty(), "requests still in flight");
    t.complete_all(2);
    assert_eq!(t.io.outcome(1), Some(&Err(Failure::Cancelled)));
    assert!(
        t.io.messages.is_empty(),
        "no notification for a cancelled transfer"
    );
    // A transfer that finished keeps its outcome: cancelling it does nothing.
    let k2 = t.submit(3, 2, Op::Write, 1, 0, None, None).unwrap();
    t.complete_all(4);
    assert_eq!(t.io.outcome(2), Some(&Ok(())));
    assert!(!t.c.cancel(t.at(5), &mut t.io, k2));
    t.drain();
    assert_eq!(t.io.outcome(2), Some(&Ok(())));
}

#[test]
fn a_queued_transfer_is_checked_at_once_and_posted_by_post_queued_or_the_next_timer() {
    let mut t = T::new(cfg(1, 1));
    // Runs of 100 bytes: three are over the limit, two are not.
    t.inline_max = Some(250);
    // Refused at once, as submit refuses it.
    assert!(t.submit(0, 9, Op::Write, 0, 0, None, None).is_err());
    let _ = t.submit(0, 1, Op::Write, 3, 0, None, None).unwrap();
    assert!(t.io.posts.is_empty(), "queued, nothing posted");
    // The timers are due at once while it waits: the next tick posts it.
    assert_eq!(t.c.poll_timeout(), Some(t.at(0)));
    t.tick(1);
    assert_eq!(t.io.posts.len(), 1, "posted by the timer");
    assert!(
        t.c.poll_timeout().is_none_or(|d| d > t.at(1)),
        "nothing due now"
    );
    t.complete_all(2);
    assert_eq!(t.io.outcome(1), Some(&Ok(())));
    // Or by post_queued, before any timer.
    let _ = t.submit(3, 2, Op::Write, 3, 0, None, None).unwrap();
    assert!(t.io.posts.is_empty());
    let now = t.at(3);
    t.c.post_queued(now, &mut t.io);
    t.drain();
    assert_eq!(t.io.posts.len(), 1);
    t.complete_all(4);
    assert_eq!(t.io.outcome(2), Some(&Ok(())));
    // A transfer within the limit is posted at once.
    let _ = t.submit(5, 3, Op::Write, 2, 0, None, None).unwrap();
    assert_eq!(t.io.posts.len(), 1, "posted inline");
    t.complete_all(6);
    assert_eq!(t.io.outcome(3), Some(&Ok(())));
}

#[test]
fn renewals_cross_the_initiator_wins_and_refusals_and_silence_pause_the_rail() {
    // Both sides offer at once: the initiator ignores the peer's offer; the other side takes it.
    for initiator in [true, false] {
        let mut c = cfg(1, 1);
        c.initiator = initiator;
        let mut t = T::new(c);
        t.submit(0, 1, Op::Read, 1, 0, Some(1000), None).unwrap();
        let p = t.io.posts[0].clone();
        t.complete(1, p.lane, p.wr_ids[0], Status::LaneError);
        t.tick(1 + crate::FIRST_COOLDOWN.as_millis() as u64);
        let n = t.io.control.len();
        let now = t.at(300);
        t.c.handle_control(
            now,
            &mut t.io,
            Control::Renew {
                rail: 0,
                epoch: 7,
                endpoints: vec![5],
            },
        );
        t.drain();
        if initiator {
            assert_eq!(t.io.control.len(), n, "ours wins: no answer");
        } else {
            assert!(matches!(
                t.io.control.last(),
                Some(Control::Renewed { epoch: 7, .. })
            ));
            assert_eq!(t.c.rails()[0].0, crate::RailState::Active);
        }
    }
    // A refusal pauses it again, longer; so does silence.
    let mut t = T::new(cfg(1, 1));
    t.submit(0, 1, Op::Read, 1, 0, Some(10_000), None).unwrap();
    let p = t.io.posts[0].clone();
    t.complete(1, p.lane, p.wr_ids[0], Status::LaneError);
    t.tick(201);
    let epoch = match t.io.control.last() {
        Some(Control::Renew { epoch, .. }) => *epoch,
        other => panic!("{other:?}"),
    };
    let now = t.at(202);
    t.c.handle_control(now, &mut t.io, Control::Refused { rail: 0, epoch });
    t.drain();
    assert_eq!(t.c.rails()[0].0, crate::RailState::Paused);
    t.tick(202 + 400);
    assert_eq!(t.c.rails()[0].0, crate::RailState::Renewing);
    let renew_timeout = t.c.config().renew_timeout.as_millis() as u64;
    t.tick(602 + renew_timeout);
    assert_eq!(
        t.c.rails()[0].0,
        crate::RailState::Paused,
        "the peer never answered"
    );
    assert!(t.c.rails()[0].1.errors >= 3);
    // An answer to nothing is ignored.
    let now = t.at(9000);
    t.c.handle_control(
        now,
        &mut t.io,
        Control::Renewed {
            rail: 0,
            epoch: 999,
            endpoints: vec![1],
        },
    );
    t.drain();
    t.c.handle_control(
        now,
        &mut t.io,
        Control::Renew {
            rail: 5,
            epoch: 1,
            endpoints: vec![1],
        },
    );
    t.drain();
    assert!(
        t.io.events
            .iter()
            .filter(|e| matches!(e, Event::Ignored { .. }))
            .count()
            >= 2
    );
}

#[test]
fn closing_the_connection_destroys_its_queue_pairs_and_ends_every_transfer() {
    let mut t = T::new(cfg(2, 2));
    t.submit(0, 1, Op::Write, 8, 0, None, Some(b"x")).unwrap();
    t.submit(0, 2, Op::Read, 1, 0, Some(5), None).unwrap();
    let now = t.at(1);
    t.c.close(
        now,
        Failure::PeerLost {
            why: Lost::Disconnected,
        },
    );
    t.drain();
    assert_eq!(t.io.destroyed.len(), 4);
    assert!(matches!(
        t.io.outcome(1),
        Some(Err(Failure::PeerLost { .. }))
    ));
    assert!(matches!(
        t.io.outcome(2),
        Some(Err(Failure::PeerLost { .. }))
    ));
    assert_eq!(t.c.poll_timeout(), None, "nothing left to wake for");
    // Late completions of the destroyed queue pairs are ignored.
    t.complete(2, lane(0, 0), 1, Status::LaneError);
    assert_eq!(t.io.finished.len(), 2);
}

#[test]
fn a_message_is_a_notification_without_data_held_back_by_the_send_slots() {
    let mut t = T::new(cfg(2, 1));
    let message = |t: &mut T, ms: u64, handle: u32, timeout_ms: u64, body: &[u8]| {
        let spec = Spec::<Mock> {
            op: Op::Write,
            locals: vec![],
            runs: vec![],
            rkeys: vec![],
            timeout: Some(Duration::from_millis(timeout_ms)),
            notify: Some(body.to_vec()),
            rail_mask: u32::MAX,
            handle,
        };
        let now = t.at(ms);
        t.c.submit(now, &mut t.io, spec)
    };
    t.drain();
    // Sent at once, nothing else posted; done once the peer's NIC took it.
    message(&mut t, 0, 1, 1000, b"want 7").unwrap();
    assert!(t.io.posts.is_empty());
    let (l, wr, _, h, data) = t.io.messages.pop().unwrap();
    assert_eq!((h.flags, data.as_slice()), (0, &b"want 7"[..]));
    assert!(t.io.outcome(1).is_none());
    t.complete(1, l, wr, Status::Success);
    assert_eq!(t.io.outcome(1), Some(&Ok(())));
    // Two send slots per rail, two rails: the fifth message waits for a slot, and its
    // deadline passes first: it fails without ever being sent.
    for h in 2..6 {
        message(&mut t, 2, h, 1000, b"m").unwrap();
    }
    message(&mut t, 2, 6, 10, b"late").unwrap();
    assert_eq!(t.io.messages.len(), 4, "one per send slot");
    t.tick(20);
    assert!(matches!(
        t.io.outcome(6),
        Some(Err(Failure::Timeout { .. }))
    ));
    t.complete_all(21);
    for h in 2..6 {
        assert_eq!(t.io.outcome(h), Some(&Ok(())), "message {h}");
    }
    assert!(
        t.io.messages.iter().all(|m| m.4 != b"late"),
        "a message past its deadline is never sent"
    );
    // Too long for the peer: refused, nothing kept.
    assert!(matches!(
        message(&mut t, 30, 7, 1000, &[0; 17]),
        Err(Failure::Rejected { .. })
    ));
    assert_eq!(t.c.transfers(), 0);
}

#[test]
fn the_drivers_bound_holds_slots_and_defers_new_posts_until_rearm() {
    let mut c = cfg(1, 1);
    c.recv_slots = 4;
    c.recv_buffered = 100;
    let mut t = T::new(c);
    let l = lane(0, 0);
    let msg = |id: u64| {
        let mut m = Header { flags: 0, id }.encode().to_vec();
        m.push(b'x');
        m
    };
    let now = t.at(1);
    // One place left in the driver's bound: the first is kept without its slot (posted
    // again), the second holds its slot although the connection's own bound has room.
    t.io.buffer_places = Some(1);
    t.c.handle_recv(now, &mut t.io, l, 0, Some(&msg(1)));
    t.drain();
    t.c.handle_recv(now, &mut t.io, l, 1, Some(&msg(2)));
    t.drain();
    let holds: Vec<bool> = t.io.delivered.iter().map(|(_, r)| r.holds).collect();
    assert_eq!(holds, [false, true]);
    assert_eq!(t.io.armed, [(l, 0)], "only the first's slot posted again");
    // The driver defers new posts: a slot whose notification is kept without it stays
    // unposted; a slot given back one for one (a taken notification's own, a probe's) is
    // posted all the same.
    t.io.defer_slots = true;
    t.io.buffer_places = Some(1);
    t.c.handle_recv(now, &mut t.io, l, 2, Some(&msg(3)));
    t.drain();
    assert_eq!(t.io.armed.len(), 1, "deferred");
    let probe = Header {
        flags: Header::PROBE,
        id: 0,
    }
    .encode();
    t.c.handle_recv(now, &mut t.io, l, 3, Some(&probe));
    t.drain();
    assert_eq!(t.io.armed.len(), 2, "a probe's slot is given back");
    let held = t.io.delivered[1].1;
    t.c.consumed(&mut t.io, held);
    t.drain();
    assert_eq!(
        t.io.armed.len(),
        3,
        "a taken notification's slot is given back"
    );
    // Once the driver lets, rearm posts what was deferred: every slot is posted again.
    t.c.rearm(&mut t.io);
    t.drain();
    assert_eq!(t.io.armed.len(), 3);
    t.io.defer_slots = false;
    t.c.rearm(&mut t.io);
    t.drain();
    let mut slots: Vec<u16> = t.io.armed[1..].iter().map(|(_, s)| *s).collect();
    slots.sort_unstable();
    assert_eq!(slots, [1, 2, 3]);
    // A new connection's slots, not posted by the driver, are posted by rearm.
    let mut t = T::new(cfg(1, 1));
    t.c.recv_slots_unposted();
    t.io.defer_slots = true;
    t.c.rearm(&mut t.io);
    t.drain();
    assert!(t.io.armed.is_empty());
    t.io.defer_slots = false;
    t.c.rearm(&mut t.io);
    t.drain();
    assert_eq!(t.io.armed.len(), 2);
}

/// Leaving a connection whose peer is up (a disconnect): new transfers are refused at once,
/// and a WRITE on the wire reports only once nothing of it can land any more: when its
/// requests complete (success: every byte landed), or, never completing, once fenced and the
/// peer confirmed (or one more quiesce time) — never at the leave itself.
#[test]
fn leaving_reports_each_transfer_only_once_nothing_of_it_can_land() {
    let lost = || Failure::PeerLost {
        why: Lost::Disconnected,
    };
    let mut t = T::new(cfg(1, 1));
    t.submit(0, 1, Op::Write, 2, 0, Some(10_000), None).unwrap();
    t.c.leave(t.at(1), lost());
    t.drain();
    assert!(
        t.io.finished.is_empty(),
        "reported while its requests were on the wire"
    );
    assert!(matches!(
        t.submit(1, 2, Op::Write, 1, 0, Some(10_000), None),
        Err(Failure::PeerLost { .. })
    ));
    t.complete_all(2);
    assert_eq!(t.io.outcome(1), Some(&Ok(())), "every byte had landed");
    assert_eq!(t.c.transfers(), 0);

    // Its requests never complete: fenced after the quiesce time, then the peer's answer.
    let mut t = T::new(cfg(1, 1));
    t.submit(0, 1, Op::Write, 2, 0, Some(10_000), None).unwrap();
    t.c.leave(t.at(1), lost());
    t.drain();
    t.tick(50);
    assert!(t.io.finished.is_empty() && t.io.destroyed.is_empty());
    t.tick(101);
    assert_eq!(t.io.destroyed, vec![lane(0, 0)]);
    assert!(
        t.io.finished.is_empty(),
        "its bytes may still be on the wire towards the peer"
    );
    t.peer_renews(105);
    assert!(matches!(
        t.io.outcome(1),
        Some(Err(Failure::PeerLost { .. }))
    ));
    assert_eq!(t.c.transfers(), 0);
}
