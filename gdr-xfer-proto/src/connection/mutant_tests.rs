//! Unit tests written against the mutants cargo-mutants found alive (`cargo xtask mutants`):
//! each pins one decision of the core that neither `tests.rs` nor the simulation observed, with
//! the same scripted driver (`scripted.rs`).

use std::time::Duration;

use crate::control::Control;
use crate::fault::{Lost, RailFault, Rejection, Step, TextError};
use crate::io::{Event, Header, LaneRef, Op, PostResult, Status};
use crate::peer_table::TableError;
use crate::rail::RailState;
use crate::run::Run;
use crate::transfer::{Failure, Spec, TransferKey};

use super::scripted::{cfg, lane, Mock, T};

/// `runs` runs of `len` bytes each, 1000 bytes apart on both sides, of local segment 0 and
/// remote segment 0.
fn runs(runs: u64, len: u64) -> Vec<Run> {
    (0..runs)
        .map(|i| Run {
            local: 0,
            local_offset: i * 1000,
            remote_addr: 0x10000 + i * 1000,
            remote: 0,
            len,
        })
        .collect()
}

impl T {
    /// A spec of the given runs, keys for every rail, any rail.
    fn spec(&self, handle: u32, op: Op, runs: Vec<Run>, timeout_ms: Option<u64>) -> Spec<Mock> {
        let rails = self.c.config().rails as u32;
        Spec {
            op,
            locals: vec![0],
            runs,
            rkeys: (0..rails).map(|r| 0xa0 + r).collect(),
            timeout: timeout_ms.map(Duration::from_millis),
            notify: None,
            rail_mask: u32::MAX,
            handle,
        }
    }

    fn submit_spec(&mut self, ms: u64, spec: Spec<Mock>) -> Result<TransferKey, Failure> {
        let now = self.at(ms);
        let r = self.c.submit(now, &mut self.io, spec);
        self.drain();
        r
    }

    /// `n` runs of 100 bytes (one request each).
    fn submit_n(
        &mut self,
        ms: u64,
        handle: u32,
        op: Op,
        n: u64,
        timeout_ms: Option<u64>,
    ) -> Result<TransferKey, Failure> {
        let spec = self.spec(handle, op, runs(n, 100), timeout_ms);
        self.submit_spec(ms, spec)
    }
}

#[test]
fn lanes_name_each_queue_pair_and_none_once_its_rail_failed() {
    let mut t = T::new(cfg(2, 2));
    assert_eq!(
        t.c.lanes(),
        vec![
            Some(lane(0, 0)),
            Some(lane(1, 1)),
            Some(lane(2, 2)),
            Some(lane(3, 3))
        ]
    );
    t.submit_n(0, 1, Op::Write, 1, None).unwrap();
    let p = t.io.posts.remove(0);
    t.complete(1, p.lane, p.last_wr(), Status::LaneError);
    let rail = p.lane.lane / 2;
    let lanes = t.c.lanes();
    assert_eq!(lanes.len(), 4);
    for (i, l) in lanes.iter().enumerate() {
        if i / 2 == rail {
            assert_eq!(*l, None, "lane {i} of the failed rail");
        } else {
            assert_eq!(*l, Some(lane(i, i as u64)), "lane {i}");
        }
    }
}

#[test]
fn transfers_counts_the_unfinished_ones() {
    let mut t = T::new(cfg(1, 1));
    assert_eq!(t.c.transfers(), 0);
    t.submit_n(0, 1, Op::Write, 1, None).unwrap();
    t.submit_n(0, 2, Op::Write, 1, None).unwrap();
    assert_eq!(t.c.transfers(), 2);
    t.complete_all(1);
    assert_eq!(t.c.transfers(), 0);
    assert_eq!(t.io.finished.len(), 2);
}

#[test]
fn a_no_rail_failure_names_each_rails_state_and_last_error() {
    let mut t = T::new(cfg(2, 1));
    t.submit_n(0, 1, Op::Read, 2, None).unwrap();
    // Whatever a failed rail carried goes on the other: fail both.
    while let Some(p) = t.io.posts.pop() {
        t.complete(1, p.lane, p.last_wr(), Status::LaneError);
    }
    assert!(t.c.rails().iter().all(|r| r.0 == RailState::Paused));
    t.tick(101);
    let rails = match t.io.outcome(1) {
        Some(Err(Failure::NoRail { rails })) => rails.clone(),
        other => panic!("{other:?}"),
    };
    let why = t.c.rails()[0].1.last_error.clone().expect("a last error");
    // Values to match on, each rail's own.
    assert_eq!(rails.len(), 2);
    for (i, r) in rails.iter().enumerate() {
        assert_eq!(
            (r.rail, r.state, r.last_error.as_ref()),
            (i, RailState::Paused, t.c.rails()[i].1.last_error.as_ref())
        );
    }
    assert_eq!(
        rails.to_string(),
        format!("rail 0 Paused: {why}; rail 1 Paused: {why}"),
    );
    match t.submit_n(102, 2, Op::Read, 1, None) {
        Err(Failure::NoRail { rails: r }) => assert_eq!(r, rails),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_transfer_of_exactly_the_inline_bound_is_posted_at_once() {
    let mut t = T::new(cfg(1, 1));
    let spec = t.spec(1, Op::Write, runs(2, 100), None);
    let now = t.at(0);
    t.c.submit_inline_up_to(now, &mut t.io, spec, 200).unwrap();
    t.drain();
    assert_eq!(t.io.posts.len(), 1, "200 bytes, bound 200: posted inline");
    let spec = t.spec(2, Op::Write, runs(2, 100), None);
    t.c.submit_inline_up_to(now, &mut t.io, spec, 199).unwrap();
    t.drain();
    assert_eq!(t.io.posts.len(), 1, "one byte over: queued");
    assert_eq!(t.c.poll_timeout(), Some(now), "due at once");
}

#[test]
fn a_transfer_needs_a_remote_key_per_rail_for_each_remote_segment() {
    let mut t = T::new(cfg(2, 1));
    let mut spec = t.spec(1, Op::Write, runs(1, 100), None);
    spec.rkeys.truncate(1);
    assert!(matches!(
        t.submit_spec(0, spec),
        Err(Failure::Rejected { .. })
    ));
    assert_eq!(t.c.transfers(), 0);
    assert!(t.io.posts.is_empty());
}

#[test]
fn a_cancelled_transfer_without_a_notification_is_cancelled_even_if_everything_landed() {
    let mut t = T::new(cfg(1, 1));
    let k = t.submit_n(0, 1, Op::Write, 3, None).unwrap();
    assert!(t.c.is_pending(k));
    assert_eq!(t.io.posts.len(), 1, "every request in flight");
    assert!(t.c.cancel(t.at(1), &mut t.io, k));
    t.drain();
    assert!(t.c.is_pending(k), "its requests are still in flight");
    t.complete_all(2);
    assert_eq!(t.io.outcome(1), Some(&Err(Failure::Cancelled)));
    assert!(!t.c.is_pending(k));
}

#[test]
fn a_closing_connection_refuses_new_transfers_with_the_first_reason() {
    let mut t = T::new(cfg(1, 1));
    t.submit_n(0, 1, Op::Write, 1, None).unwrap();
    let goodbye = Failure::PeerLost {
        why: Lost::Message {
            why: TableError::Goodbye {
                reason: "peer said goodbye".into(),
            },
        },
    };
    assert_eq!(t.c.gone(), None);
    t.c.closing(goodbye.clone());
    t.c.closing(Failure::PeerLost {
        why: Lost::Disconnected,
    });
    assert_eq!(t.c.gone(), Some(&goodbye));
    assert!(!t.c.is_closed());
    // The failure kept, as a value: the peer's words, matchable.
    match t.submit_n(1, 2, Op::Write, 1, None) {
        Err(Failure::PeerLost {
            why: Lost::Message {
                why: TableError::Goodbye { reason },
            },
        }) => assert_eq!(reason, "peer said goodbye"),
        other => panic!("{other:?}"),
    }
    // What is in flight goes on.
    t.complete_all(2);
    assert_eq!(t.io.outcome(1), Some(&Ok(())));
    // And what is not posted yet is posted: 12 requests, 8 fit the send queue.
    let mut t = T::new(cfg(1, 1));
    t.submit_n(0, 1, Op::Write, 12, None).unwrap();
    assert_eq!(t.io.posts.len(), 1);
    t.c.closing(Failure::AgentClosed);
    let first = t.io.posts.remove(0);
    assert_eq!(first.pieces.len(), 8);
    t.complete(1, first.lane, first.last_wr(), Status::Success);
    assert_eq!(t.io.posts.len(), 1, "the other 4 go while closing");
    assert_eq!(t.io.posts[0].pieces.len(), 4);
    t.complete_all(2);
    assert_eq!(t.io.outcome(1), Some(&Ok(())));
}

#[test]
fn an_idle_open_connection_still_wakes_for_a_paused_rails_cooldown() {
    let mut t = T::new(cfg(2, 1));
    t.submit_n(0, 1, Op::Read, 1, None).unwrap();
    let p = t.io.posts.remove(0);
    t.complete(1, p.lane, p.last_wr(), Status::LaneError);
    t.complete_all(2);
    assert_eq!(
        t.io.outcome(1),
        Some(&Ok(())),
        "carried on by the other rail"
    );
    assert_eq!(t.c.transfers(), 0);
    assert_eq!(
        t.c.poll_timeout(),
        Some(t.at(1) + crate::FIRST_COOLDOWN),
        "the paused rail's renewal is due after its cool-down"
    );
}

#[test]
fn with_no_rail_the_next_wake_is_one_quiesce_time_later_not_the_cooldown() {
    let mut t = T::new(cfg(1, 1));
    t.submit_n(0, 1, Op::Read, 1, None).unwrap();
    let p = t.io.posts.remove(0);
    t.complete(1, p.lane, p.last_wr(), Status::LaneError);
    assert_eq!(
        t.c.poll_timeout(),
        Some(t.at(101)),
        "the transfers fail one quiesce time after the last rail went"
    );
    t.tick(101);
    assert!(matches!(t.io.outcome(1), Some(Err(Failure::NoRail { .. }))));
    assert_eq!(
        t.c.poll_timeout(),
        Some(t.at(1) + crate::FIRST_COOLDOWN),
        "then only the rail's renewal"
    );
}

#[test]
fn a_rail_with_bytes_in_flight_wakes_for_its_throughput_sample() {
    let mut t = T::new(cfg(1, 1));
    assert_eq!(t.c.poll_timeout(), None, "nothing to do");
    t.submit_n(0, 1, Op::Write, 1, None).unwrap();
    assert_eq!(t.c.poll_timeout(), Some(t.at(0) + crate::SAMPLE));
    t.complete_all(5);
    assert_eq!(t.c.poll_timeout(), None, "idle again");
}

#[test]
fn a_stopped_write_with_nothing_in_flight_waits_for_the_peer_without_a_fence() {
    // Its deadline stops it with its request in flight; its rail then fails, which retires the
    // request (nothing in flight) but leaves it on the wire towards the peer until one quiesce
    // time after the failure. The quiesce time after the stop passes meanwhile: nothing is left
    // to fence.
    let mut t = T::new(cfg(2, 1));
    t.submit_n(0, 1, Op::Write, 1, Some(10)).unwrap();
    t.tick(10);
    let p = t.io.posts.remove(0);
    t.complete(50, p.lane, p.last_wr(), Status::LaneError);
    assert_eq!(t.io.destroyed, vec![p.lane]);
    t.tick(110);
    assert!(
        !t.io
            .events
            .iter()
            .any(|e| matches!(e, Event::Fenced { .. })),
        "{:?}",
        t.io.events
    );
    assert_eq!(t.c.rails()[1 - p.lane.lane].1.fences, 0);
    assert!(t.io.finished.is_empty(), "on the wire until 150");
    t.tick(150);
    assert!(matches!(
        t.io.outcome(1),
        Some(Err(Failure::Timeout { .. }))
    ));
}

#[test]
fn a_closed_connection_never_wakes_even_with_a_queued_transfer_it_ended() {
    let mut t = T::new(cfg(1, 1));
    let spec = t.spec(1, Op::Write, runs(2, 100), None);
    let now = t.at(0);
    t.c.submit_inline_up_to(now, &mut t.io, spec, 0).unwrap();
    t.drain();
    assert_eq!(t.c.poll_timeout(), Some(now), "queued: due at once");
    t.c.close(t.at(1), Failure::AgentClosed);
    t.drain();
    assert_eq!(t.io.outcome(1), Some(&Err(Failure::AgentClosed)));
    assert_eq!(t.c.transfers(), 0);
    assert_eq!(t.c.poll_timeout(), None);
}

#[test]
fn a_rail_counts_the_bytes_and_requests_completed_on_it() {
    let mut t = T::new(cfg(1, 1));
    t.submit_n(0, 1, Op::Write, 3, None).unwrap();
    t.complete_all(1);
    let (state, stats) = &t.c.rails()[0];
    assert_eq!(*state, RailState::Active);
    assert_eq!(
        (stats.bytes, stats.slices, stats.inflight_bytes),
        (300, 3, 0)
    );
}

#[test]
fn a_rail_renewed_after_its_cooldown_does_not_hold_off_the_no_rail_failure() {
    let mut c = cfg(1, 1);
    // Longer than the first cool-down: the renewal starts before the transfers fail.
    c.quiesce = Duration::from_millis(300);
    let mut t = T::new(c);
    t.submit_n(0, 1, Op::Read, 1, None).unwrap();
    let p = t.io.posts.remove(0);
    t.complete(1, p.lane, p.last_wr(), Status::LaneError);
    t.tick(201);
    assert_eq!(t.c.rails()[0].0, RailState::Renewing);
    assert!(t.io.finished.is_empty());
    t.tick(301);
    assert!(
        matches!(t.io.outcome(1), Some(Err(Failure::NoRail { .. }))),
        "{:?}",
        t.io.finished
    );
}

#[test]
fn a_fenced_rail_still_counts_as_usable_while_the_peer_answers() {
    let mut t = T::new(cfg(1, 1));
    t.submit_n(0, 1, Op::Read, 1, Some(10)).unwrap();
    t.submit_n(0, 2, Op::Read, 1, None).unwrap();
    t.tick(10);
    t.tick(110);
    assert!(matches!(
        t.io.outcome(1),
        Some(Err(Failure::Timeout { .. }))
    ));
    assert_eq!(t.c.rails()[0].0, RailState::Renewing, "fenced");
    // One quiesce time into the fence, the renewal (5 s to answer) still carries transfer 2.
    t.tick(211);
    assert_eq!(t.io.outcome(2), None, "{:?}", t.io.finished);
    assert!(t.submit_n(212, 3, Op::Read, 1, None).is_ok());
}

#[test]
fn a_rail_whose_probe_completes_is_readmitted_once() {
    let mut t = T::new(cfg(1, 1));
    t.submit_n(0, 1, Op::Read, 1, None).unwrap();
    let p = t.io.posts.remove(0);
    t.complete(1, p.lane, p.last_wr(), Status::LaneError);
    t.tick(201);
    t.peer_renews(202);
    assert_eq!(t.c.rails()[0].0, RailState::Probing);
    let (lane, wr, _, h, _) = t.io.messages.pop().expect("the probe");
    assert_eq!(h.flags, Header::PROBE);
    t.complete(203, lane, wr, Status::Success);
    let (state, stats) = &t.c.rails()[0];
    assert_eq!(*state, RailState::Active);
    assert_eq!((stats.readmissions, stats.renewals), (1, 1));
    assert!(t
        .io
        .events
        .iter()
        .any(|e| matches!(e, Event::Readmitted { rail: 0 })));
    // New transfers go on the new queue pair.
    t.submit_n(204, 2, Op::Read, 1, None).unwrap();
    assert_eq!(t.io.posts.len(), 1);
    assert_eq!(t.io.posts[0].lane, lane);
    t.complete_all(205);
    assert_eq!(t.io.outcome(2), Some(&Ok(())));
}

impl T {
    /// The peer offers new queue pairs for rail `rail`.
    fn peer_offers(&mut self, ms: u64, rail: usize, epoch: u32) {
        let now = self.at(ms);
        let endpoints = vec![5; self.c.config().lanes_per_rail];
        self.c.handle_control(
            now,
            &mut self.io,
            Control::Renew {
                rail,
                epoch,
                endpoints,
            },
        );
        self.drain();
    }

    /// Fails rail `rail` with a lane error on a transfer pinned to it (by its mask).
    fn fail_rail(&mut self, ms: u64, handle: u32, rail: usize) {
        let mut spec = self.spec(handle, Op::Read, runs(1, 100), None);
        spec.rail_mask = 1 << rail;
        self.submit_spec(ms, spec).unwrap();
        let p = self.io.posts.pop().expect("posted");
        let w = self.c.config().lanes_per_rail;
        assert_eq!(p.lane.lane / w, rail);
        self.complete(ms, p.lane, p.last_wr(), Status::LaneError);
        assert_eq!(self.c.rails()[rail].0, RailState::Paused);
    }

    fn pauses_of(&self, rail: usize) -> usize {
        self.io
            .events
            .iter()
            .filter(|e| matches!(e, Event::RailPaused { rail: r, .. } if *r == rail))
            .count()
    }
}

#[test]
fn a_peer_renewal_of_a_paused_rail_we_cannot_make_fails_it_only_once() {
    // Four rails of two lanes: the failed rail's neighbours keep their queue pairs.
    let mut t = T::new(cfg(4, 2));
    t.fail_rail(0, 1, 3);
    assert_eq!(t.pauses_of(3), 1);
    t.io.create_fails = true;
    t.peer_offers(5, 3, 1);
    assert_eq!(
        t.io.control.last(),
        Some(&Control::Refused { rail: 3, epoch: 1 })
    );
    assert_eq!(t.pauses_of(3), 1, "it was down already: {:?}", t.io.events);
    assert_eq!(t.c.rails()[3].1.errors, 1);
    assert_eq!(t.c.rails()[3].0, RailState::Paused);
}

#[test]
fn a_peer_renewal_of_an_active_rail_we_cannot_make_pauses_it() {
    let mut t = T::new(cfg(2, 1));
    t.io.create_fails = true;
    t.peer_offers(5, 1, 1);
    assert_eq!(
        t.io.control.last(),
        Some(&Control::Refused { rail: 1, epoch: 1 })
    );
    assert_eq!(t.c.rails()[1].0, RailState::Paused);
    assert_eq!(t.c.rails()[1].1.errors, 1);
    assert_eq!(t.c.lanes()[1], None);
    assert_eq!(t.pauses_of(1), 1);
}

#[test]
fn a_peer_renewal_of_a_paused_rail_that_cannot_connect_destroys_the_new_queue_pairs() {
    let mut t = T::new(cfg(1, 1));
    t.fail_rail(0, 1, 0);
    t.io.connect_fails = true;
    t.peer_offers(5, 0, 1);
    assert_eq!(
        t.io.control.last(),
        Some(&Control::Refused { rail: 0, epoch: 1 })
    );
    let new = *t.io.created.last().expect("created");
    assert!(t.io.destroyed.contains(&new), "{:?}", t.io.destroyed);
    assert_eq!(t.c.lanes(), vec![None]);
    assert_eq!(t.c.rails()[0].0, RailState::Paused);
    assert_eq!(t.c.rails()[0].1.errors, 2);
}

#[test]
fn a_failover_is_timed_from_the_failure_to_the_repost() {
    let mut t = T::new(cfg(2, 1));
    t.submit_n(0, 1, Op::Write, 1, None).unwrap();
    let p = t.io.posts.remove(0);
    assert_eq!(t.c.rails()[p.lane.lane].1.last_failover, None);
    t.complete(3, p.lane, p.last_wr(), Status::LaneError);
    assert_eq!(
        t.io.posts.len(),
        1,
        "posted again on the other rail at once"
    );
    let failed = &t.c.rails()[p.lane.lane].1;
    assert_eq!(
        (failed.retries, failed.last_failover),
        (1, Some(Duration::ZERO))
    );
}

#[test]
fn notifications_keep_their_slot_only_past_the_buffered_count() {
    let mut c = cfg(1, 1);
    c.recv_buffered = 1;
    let mut t = T::new(c);
    let now = t.at(0);
    for id in 1..=2u64 {
        let mut msg = Header { flags: 0, id }.encode().to_vec();
        msg.extend_from_slice(b"hi");
        t.c.handle_recv(now, &mut t.io, lane(0, 0), id as u16 - 1, Some(&msg));
        t.drain();
    }
    let holds: Vec<bool> = t.io.delivered.iter().map(|(_, r)| r.holds).collect();
    assert_eq!(
        holds,
        vec![false, true],
        "one buffered, the second holds its slot"
    );
    assert_eq!(t.io.delivered[0].0, b"hi");
}

#[test]
fn a_rail_that_fails_carrying_nothing_has_no_failover_to_time() {
    let mut t = T::new(cfg(3, 1));
    // Rail 0 fails idle (an error completion with nothing posted).
    t.complete(1, lane(0, 0), 0, Status::LaneError);
    assert_eq!(t.c.rails()[0].0, RailState::Paused);
    // Rail 1 fails with a request, posted again on rail 2.
    let mut spec = t.spec(1, Op::Read, runs(1, 100), None);
    spec.rail_mask = 1 << 1;
    t.submit_spec(2, spec).unwrap();
    let p = t.io.posts.remove(0);
    assert_eq!(p.lane.lane, 1);
    t.complete(5, p.lane, p.last_wr(), Status::LaneError);
    assert_eq!(t.io.posts[0].lane.lane, 2);
    assert_eq!(t.c.rails()[1].1.last_failover, Some(Duration::ZERO));
    assert_eq!(
        t.c.rails()[0].1.last_failover,
        None,
        "rail 0 had nothing to post again"
    );
}

#[test]
fn losing_every_rail_with_no_transfer_fails_nothing_and_says_nothing() {
    let mut t = T::new(cfg(1, 1));
    t.complete(1, lane(0, 0), 0, Status::LaneError);
    assert_eq!(t.c.rails()[0].0, RailState::Paused);
    t.tick(101);
    t.tick(150);
    assert!(
        !t.io
            .events
            .iter()
            .any(|e| matches!(e, Event::NoRail { .. })),
        "{:?}",
        t.io.events
    );
    // A transfer submitted now is refused at once: no rail for a quiesce time.
    assert!(matches!(
        t.submit_n(160, 1, Op::Read, 1, None),
        Err(Failure::NoRail { .. })
    ));
}

impl T {
    /// The peer answers our last renewal and our probe completes: the rail is active again.
    fn readmit(&mut self, ms: u64) {
        self.peer_renews(ms);
        let (lane, wr, _, h, _) = self.io.messages.pop().expect("the probe");
        assert_eq!(h.flags, Header::PROBE);
        self.complete(ms, lane, wr, Status::Success);
    }
}

#[test]
fn a_fence_retires_the_bytes_it_carried_and_counts_what_it_posts_again() {
    let mut t = T::new(cfg(1, 1));
    t.submit_n(0, 1, Op::Read, 1, Some(10)).unwrap();
    t.submit_n(0, 2, Op::Read, 1, None).unwrap();
    assert_eq!(t.c.rails()[0].1.inflight_bytes, 200);
    t.tick(10);
    t.io.posts.clear();
    t.tick(110);
    let r = &t.c.rails()[0].1;
    assert_eq!((r.fences, r.retries, r.inflight_bytes), (1, 1, 0));
    assert_eq!(r.last_failover, None, "not posted again yet");
    t.readmit(116);
    assert_eq!(t.io.posts.len(), 1, "transfer 2 again");
    assert_eq!(
        t.c.rails()[0].1.last_failover,
        Some(Duration::from_millis(6))
    );
    t.complete_all(117);
    let o = t.io.full_outcome(2).expect("finished");
    assert_eq!(o.result, Ok(()));
    assert_eq!(o.stats.retried_slices, 1);
}

#[test]
fn a_fenced_write_on_the_second_rail_waits_for_that_rails_peer() {
    let mut t = T::new(cfg(2, 1));
    let mut spec = t.spec(1, Op::Write, runs(1, 100), Some(10));
    spec.rail_mask = 1 << 1;
    t.submit_spec(0, spec).unwrap();
    assert_eq!(t.io.posts[0].lane.lane, 1);
    t.tick(10);
    t.tick(110);
    assert_eq!(t.io.destroyed, vec![lane(1, 1)]);
    assert!(t.io.finished.is_empty(), "its bytes may be on the wire");
    assert_eq!(t.c.poll_timeout(), Some(t.at(210)));
    t.peer_renews(120);
    assert!(matches!(
        t.io.outcome(1),
        Some(Err(Failure::Timeout { .. }))
    ));
}

#[test]
fn a_fence_of_a_stopped_transfer_alone_posts_nothing_again() {
    let mut t = T::new(cfg(2, 1));
    let mut spec = t.spec(1, Op::Read, runs(1, 100), Some(10));
    spec.rail_mask = 1;
    t.submit_spec(0, spec).unwrap();
    t.tick(10);
    t.tick(110);
    assert!(matches!(
        t.io.outcome(1),
        Some(Err(Failure::Timeout { .. }))
    ));
    let r = &t.c.rails()[0].1;
    assert_eq!((r.fences, r.retries), (1, 0));
    t.readmit(112);
    assert_eq!(t.c.rails()[0].0, RailState::Active);
    // Rail 1 fails carrying transfer 2, which goes on rail 0: only rail 1 had a failover.
    let mut spec = t.spec(2, Op::Read, runs(1, 100), None);
    spec.rail_mask = 1 << 1;
    t.submit_spec(113, spec).unwrap();
    let p = t.io.posts.pop().unwrap();
    assert_eq!(p.lane.lane, 1);
    t.complete(120, p.lane, p.last_wr(), Status::LaneError);
    assert_eq!(t.io.posts.last().unwrap().lane.lane, 0);
    assert_eq!(t.c.rails()[1].1.last_failover, Some(Duration::ZERO));
    assert_eq!(t.c.rails()[0].1.last_failover, None);
}

#[test]
fn receive_slots_of_a_destroyed_queue_pair_are_posted_anew_as_the_driver_allows() {
    let mut t = T::new(cfg(1, 1));
    t.io.defer_slots = true;
    t.complete(1, lane(0, 0), 0, Status::LaneError);
    t.tick(201);
    let new = *t.io.created.last().expect("renewal offered");
    assert!(
        t.io.armed.is_empty(),
        "the old queue pair's slots died with it; new ones wait for the driver"
    );
    t.io.defer_slots = false;
    t.c.rearm(&mut t.io);
    t.drain();
    assert_eq!(t.io.armed, vec![(new, 0), (new, 1)]);
}

#[test]
fn an_unanswered_renewal_destroys_its_queue_pairs_and_their_receive_slots_with_them() {
    let mut t = T::new(cfg(1, 1));
    t.complete(1, lane(0, 0), 0, Status::LaneError);
    t.tick(201);
    let offered = *t.io.created.last().expect("renewal offered");
    assert_eq!(t.io.armed, vec![(offered, 0), (offered, 1)]);
    let timeout = 201 + t.c.config().renew_timeout.as_millis() as u64;
    t.tick(timeout);
    assert!(t.io.destroyed.contains(&offered), "{:?}", t.io.destroyed);
    assert_eq!(t.c.rails()[0].0, RailState::Paused);
    assert!(t
        .io
        .events
        .iter()
        .any(|e| matches!(e, Event::RenewalFailed { rail: 0, .. })));
    // The next offer's slots are new posts, which the driver may defer.
    t.io.defer_slots = true;
    t.io.armed.clear();
    let cooldown = 2 * crate::FIRST_COOLDOWN.as_millis() as u64;
    t.tick(timeout + cooldown);
    let next = *t.io.created.last().unwrap();
    assert_ne!(next, offered, "a second offer");
    assert!(t.io.armed.is_empty(), "{:?}", t.io.armed);
}

#[test]
fn a_broken_post_fails_its_rail_and_the_transfer_goes_on_the_other_at_once() {
    let mut t = T::new(cfg(2, 1));
    t.io.script = vec![PostResult::Broken {
        posted: 0,
        error: "not ready".into(),
    }];
    t.submit_n(0, 1, Op::Write, 1, None).unwrap();
    let paused: Vec<usize> = (0..2)
        .filter(|&r| t.c.rails()[r].0 == RailState::Paused)
        .collect();
    assert_eq!(paused.len(), 1);
    assert_eq!(
        t.io.posts.len(),
        1,
        "posted on the other rail in the same call"
    );
    assert_ne!(t.io.posts[0].lane.lane, paused[0]);
}

#[test]
fn the_drivers_own_error_reaches_the_outcome_and_the_event_unchanged() {
    // A refused request: the transfer fails with the driver's error, as the driver's type.
    let mut t = T::new(cfg(2, 1));
    t.io.script = vec![PostResult::Rejected(TextError("not this memory".into()))];
    t.submit_n(0, 1, Op::Write, 1, None).unwrap();
    t.drain();
    let Some(Err(Failure::Rejected {
        why: Rejection::Driver(e),
    })) = t.io.outcome(1)
    else {
        panic!("{:?}", t.io.outcome(1));
    };
    assert_eq!(
        e.downcast_ref::<TextError>(),
        Some(&TextError("not this memory".into()))
    );
    // A broken queue pair: the rail's pause carries the driver's error and the step.
    t.io.script = vec![PostResult::Broken {
        posted: 0,
        error: TextError("queue pair in error".into()),
    }];
    t.submit_n(1, 2, Op::Write, 1, None).unwrap();
    let paused = t.io.events.iter().find_map(|e| match e {
        Event::RailPaused {
            why: RailFault::Driver { step, error },
            ..
        } => Some((*step, error.downcast_ref::<TextError>().cloned())),
        _ => None,
    });
    assert_eq!(
        paused,
        Some((Step::Post, Some(TextError("queue pair in error".into()))))
    );
    let rail = t.c.rails().iter().position(|r| r.0 == RailState::Paused);
    let last = rail.and_then(|r| t.c.rails()[r].1.last_error.clone());
    assert!(
        matches!(
            last,
            Some(RailFault::Driver {
                step: Step::Post,
                ..
            })
        ),
        "{last:?}"
    );
}

#[test]
fn a_malformed_transfer_is_refused_with_its_values() {
    let mut t = T::new(cfg(1, 1));
    let mut spec = t.spec(1, Op::Write, runs(1, 100), None);
    spec.rkeys.clear();
    assert_eq!(
        t.submit_spec(0, spec).unwrap_err(),
        Failure::Rejected {
            why: Rejection::MissingKeys {
                keys: 0,
                remotes: 1,
                rails: 1
            }
        }
    );
    let mut spec = t.spec(2, Op::Write, Vec::new(), None);
    spec.notify = None;
    assert_eq!(
        t.submit_spec(0, spec).unwrap_err(),
        Failure::Rejected {
            why: Rejection::Empty
        }
    );
}

#[test]
fn a_lane_the_driver_found_full_waits_for_a_completion() {
    let mut t = T::new(cfg(1, 1));
    t.submit_n(0, 1, Op::Write, 1, None).unwrap();
    t.io.script = vec![PostResult::Full];
    t.submit_n(0, 2, Op::Write, 1, None).unwrap();
    assert_eq!(t.io.posts.len(), 1);
    t.tick(1);
    t.c.post_queued(t.at(1), &mut t.io);
    t.drain();
    assert_eq!(t.io.posts.len(), 1, "no completion yet: still full");
    let p = t.io.posts[0].clone();
    t.complete(2, p.lane, p.last_wr(), Status::Success);
    assert_eq!(t.io.posts.len(), 2, "the completion made room");
}

#[test]
fn one_rails_lanes_take_batches_in_turn_and_skip_a_full_one() {
    let mut c = cfg(1, 2);
    c.send_depth = 2;
    let mut t = T::new(c);
    for h in 1..=3 {
        t.submit_n(0, h, Op::Write, 2, None).unwrap();
    }
    let lanes: Vec<usize> = t.io.posts.iter().map(|p| p.lane.lane).collect();
    assert_eq!(lanes, vec![0, 1], "round robin; the third waits for room");
    // Lane 1 completes; lane 0 is next in turn but full: the third goes on lane 1.
    let p = t.io.posts[1].clone();
    t.complete(1, p.lane, p.last_wr(), Status::Success);
    assert_eq!(t.io.posts.len(), 3);
    assert_eq!(t.io.posts[2].lane.lane, 1);
}

#[test]
fn a_connection_of_more_than_thirty_two_rails_carries_transfers() {
    let mut t = T::new(cfg(33, 1));
    let mut spec = t.spec(1, Op::Write, runs(1, 100), None);
    // No preferred rail: every rail a mask can name (the first 32) may carry it.
    spec.rail_mask = 0;
    t.submit_spec(0, spec).unwrap();
    assert_eq!(t.io.posts.len(), 1);
    t.complete_all(1);
    assert_eq!(t.io.outcome(1), Some(&Ok(())));
}

#[test]
fn a_rails_lanes_take_batches_in_turn_on_a_connection_of_several_rails() {
    let on_rail_1 = |t: &mut T, h: u32, n: u64| {
        let mut spec = t.spec(h, Op::Write, runs(n, 100), None);
        spec.rail_mask = 1 << 1;
        t.submit_spec(0, spec).unwrap();
        t.io.posts.last().map(|p| p.lane.lane)
    };
    let mut t = T::new(cfg(2, 2));
    let lanes: Vec<_> = (1..=3).map(|h| on_rail_1(&mut t, h, 1)).collect();
    assert_eq!(
        lanes,
        vec![Some(2), Some(3), Some(2)],
        "rail 1's lanes, in turn"
    );
    // Lane 2 full and next in turn: the batch goes on lane 3.
    let mut c = cfg(2, 2);
    c.send_depth = 2;
    let mut t = T::new(c);
    assert_eq!(on_rail_1(&mut t, 1, 2), Some(2));
    assert_eq!(on_rail_1(&mut t, 2, 1), Some(3));
    assert_eq!(on_rail_1(&mut t, 3, 1), Some(3), "lane 2 has no room");
    assert_eq!(t.io.posts.len(), 3);
}

#[test]
fn lanes_of_one_rail_take_single_requests_in_turn_and_are_counted_in_the_stats() {
    let mut t = T::new(cfg(1, 2));
    for h in 1..=3 {
        t.submit_n(0, h, Op::Write, 1, None).unwrap();
    }
    let lanes: Vec<usize> = t.io.posts.iter().map(|p| p.lane.lane).collect();
    assert_eq!(lanes, vec![0, 1, 0]);
    // 12 requests, 8 per batch: one batch per lane.
    let mut t = T::new(cfg(1, 2));
    t.submit_n(0, 1, Op::Write, 12, None).unwrap();
    let lanes: Vec<usize> = t.io.posts.iter().map(|p| p.lane.lane).collect();
    assert_eq!(lanes, vec![0, 1]);
    t.complete_all(1);
    let o = t.io.full_outcome(1).expect("finished");
    assert_eq!(o.result, Ok(()));
    assert_eq!((o.stats.lanes_mask, o.stats.rails_mask), (0b11, 0b1));
}

#[test]
fn a_batch_is_at_most_a_chunk_on_one_rail_and_a_stripe_chunk_on_several() {
    let mut c = cfg(1, 1);
    c.send_depth = 1000;
    let mut t = T::new(c);
    t.submit_n(0, 1, Op::Write, 100, None).unwrap();
    let sizes: Vec<usize> = t.io.posts.iter().map(|p| p.pieces.len()).collect();
    assert_eq!(sizes, vec![crate::CHUNK, 100 - crate::CHUNK]);
    let mut c = cfg(2, 1);
    c.send_depth = 1000;
    let mut t = T::new(c);
    t.submit_n(0, 1, Op::Write, 100, None).unwrap();
    let sizes: Vec<usize> = t.io.posts.iter().map(|p| p.pieces.len()).collect();
    assert_eq!(sizes.iter().sum::<usize>(), 100);
    assert_eq!(sizes[0], crate::STRIPE_CHUNK, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n <= crate::STRIPE_CHUNK), "{sizes:?}");
    // Large slices: a batch holds the stripe's 2 MiB, not STRIPE_CHUNK slices.
    let mut c = cfg(2, 1);
    c.send_depth = 1000;
    c.slice_size = 256 << 10;
    let mut t = T::new(c);
    let spec = t.spec(1, Op::Write, runs(1, 40 * (256 << 10)), None);
    t.submit_spec(0, spec).unwrap();
    let sizes: Vec<usize> = t.io.posts.iter().map(|p| p.pieces.len()).collect();
    assert_eq!(sizes.iter().sum::<usize>(), 40, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n <= 8), "{sizes:?}");
    assert_eq!(sizes[0], 8, "{sizes:?}");
    assert_eq!(crate::stripe_chunk(1), crate::STRIPE_CHUNK as u64);
    assert_eq!(crate::stripe_chunk(0), crate::STRIPE_CHUNK as u64);
    assert_eq!(crate::stripe_chunk(1 << 30), 1);
    assert_eq!(crate::stripe_chunk(u64::MAX), 1);
}

#[test]
fn a_batch_goes_to_the_emptier_of_equal_rails() {
    let mut t = T::new(cfg(2, 1));
    let mut spec = t.spec(1, Op::Write, runs(1, 100), None);
    spec.rail_mask = 1;
    t.submit_spec(0, spec).unwrap();
    t.submit_n(0, 2, Op::Write, 1, None).unwrap();
    let lanes: Vec<usize> = t.io.posts.iter().map(|p| p.lane.lane).collect();
    assert_eq!(lanes, vec![0, 1]);
    t.complete_all(1);
    assert_eq!(
        t.io.full_outcome(2).expect("finished").stats.rails_mask,
        1 << 1
    );
}

#[test]
fn a_batch_weighs_its_own_bytes_against_each_rails_speed() {
    let mut c = cfg(2, 1);
    c.send_depth = 100;
    let mut t = T::new(c);
    let on = |t: &mut T, ms: u64, h: u32, rail: usize, n: u64| {
        let mut spec = t.spec(h, Op::Write, runs(n, 100), None);
        spec.rail_mask = 1 << rail;
        t.submit_spec(ms, spec).unwrap();
    };
    // Rail 0 moves 1,000 bytes in 10 ms, rail 1 in 100 ms.
    on(&mut t, 0, 1, 0, 10);
    t.complete_all(10);
    t.tick(20);
    on(&mut t, 20, 2, 1, 10);
    t.complete_all(120);
    t.tick(120);
    let rate = |t: &T, r: usize| t.c.rails()[r].1.throughput;
    assert!((rate(&t, 0) - 1.0e5).abs() < 1.0, "{}", rate(&t, 0));
    assert!((rate(&t, 1) - 1.0e4).abs() < 1.0, "{}", rate(&t, 1));
    // 2,000 bytes queued on the fast rail: a batch of 1,000 bytes still ends sooner there
    // (3,000 bytes at 100 kB/s) than alone on the slow one (1,000 bytes at 10 kB/s).
    on(&mut t, 121, 3, 0, 20);
    t.submit_n(121, 4, Op::Write, 10, None).unwrap();
    let last = t.io.posts.last().unwrap();
    assert_eq!((last.lane.lane, last.pieces.len()), (0, 10));
}

#[test]
fn messages_go_on_the_first_lane_of_the_first_active_rail_each_with_its_own_id() {
    let mut t = T::new(cfg(2, 2));
    // Rail 0 fails: rail 1's first lane (lane 2, generation 2) carries the messages.
    t.complete(1, lane(0, 0), 0, Status::LaneError);
    for h in 1..=2 {
        let mut spec = t.spec(h, Op::Write, Vec::new(), None);
        spec.notify = Some(vec![h as u8]);
        t.submit_spec(2, spec).unwrap();
    }
    let sent: Vec<(LaneRef, u64, Vec<u8>)> =
        t.io.messages
            .iter()
            .map(|(l, _, _, h, d)| (*l, h.id, d.clone()))
            .collect();
    assert_eq!(
        sent,
        vec![(lane(2, 2), 1, vec![1]), (lane(2, 2), 2, vec![2])]
    );
    t.complete_all(3);
    assert_eq!(t.io.outcome(1), Some(&Ok(())));
    assert_eq!(t.io.outcome(2), Some(&Ok(())));
}

#[test]
fn a_failed_rail_is_offered_again_only_after_its_cooldown_and_probed_on_its_first_lane() {
    let mut t = T::new(cfg(2, 2));
    t.complete(1, lane(2, 2), 0, Status::LaneError);
    assert_eq!(t.c.rails()[1].0, RailState::Paused);
    t.tick(100);
    assert!(t.io.control.is_empty(), "cooling down: {:?}", t.io.control);
    t.tick(201);
    assert!(matches!(
        t.io.control.last(),
        Some(Control::Renew { rail: 1, .. })
    ));
    let new = t.io.created.clone();
    assert_eq!(new.len(), 2);
    assert_eq!((new[0].lane, new[1].lane), (2, 3));
    assert_ne!(new[0].gen, new[1].gen, "a generation is never reused");
    t.peer_renews(202);
    let (probe_lane, probe_wr, _, h, _) = t.io.messages.pop().expect("the probe");
    assert_eq!(h.flags, Header::PROBE);
    assert_eq!(probe_lane, new[0], "on the rail's first new lane");
    // The next request gets a number of its own.
    t.submit_n(203, 1, Op::Write, 1, None).unwrap();
    let first = t.io.posts[0].pieces[0].4;
    assert!(first > probe_wr, "{first} after the probe's {probe_wr}");
}

#[test]
fn a_peer_renewal_counts_a_readmission_only_for_a_rail_that_was_down() {
    let mut t = T::new(cfg(2, 1));
    t.peer_offers(1, 0, 1);
    assert!(matches!(
        t.io.control.last(),
        Some(Control::Renewed {
            rail: 0,
            epoch: 1,
            ..
        })
    ));
    let r = &t.c.rails()[0].1;
    assert_eq!((r.readmissions, r.renewals), (0, 1), "it was active");
    t.fail_rail(2, 1, 1);
    t.peer_offers(3, 1, 1);
    assert_eq!(t.c.rails()[1].0, RailState::Active);
    let r = &t.c.rails()[1].1;
    assert_eq!((r.readmissions, r.renewals), (1, 1), "it was paused");
}

#[test]
fn answers_to_renewals_never_offered_are_ignored() {
    let mut t = T::new(cfg(1, 1));
    let ignored = |t: &T| {
        t.io.events
            .iter()
            .filter(|e| matches!(e, Event::Ignored { .. }))
            .count()
    };
    // No offer at all, and a rail that does not exist.
    let now = t.at(1);
    t.c.handle_control(now, &mut t.io, Control::Refused { rail: 0, epoch: 7 });
    t.drain();
    t.c.handle_control(now, &mut t.io, Control::Refused { rail: 1, epoch: 1 });
    t.drain();
    let renewed = |rail, epoch, n| Control::Renewed {
        rail,
        epoch,
        endpoints: vec![9; n],
    };
    t.c.handle_control(now, &mut t.io, renewed(1, 1, 1));
    t.drain();
    assert_eq!(ignored(&t), 3);
    assert_eq!(t.c.rails()[0].0, RailState::Active);
    assert_eq!(t.c.rails()[0].1.errors, 0);
    // Our offer (epoch 1) is out: a stale epoch, or the wrong number of queue pairs, is not its
    // answer.
    t.complete(2, lane(0, 0), 0, Status::LaneError);
    t.tick(202);
    assert!(matches!(
        t.io.control.last(),
        Some(Control::Renew {
            rail: 0,
            epoch: 1,
            ..
        })
    ));
    t.c.handle_control(t.at(203), &mut t.io, renewed(0, 0, 1));
    t.drain();
    t.c.handle_control(t.at(203), &mut t.io, renewed(0, 1, 2));
    t.drain();
    assert_eq!(ignored(&t), 5);
    assert_eq!(t.c.rails()[0].0, RailState::Renewing);
    assert!(t.io.messages.is_empty(), "no probe");
    t.c.handle_control(t.at(204), &mut t.io, renewed(0, 1, 1));
    t.drain();
    assert_eq!(t.c.rails()[0].0, RailState::Probing);
}
