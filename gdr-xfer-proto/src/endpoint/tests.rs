use super::*;

fn lane(lane: usize, gen: u64) -> LaneRef {
    LaneRef { lane, gen }
}

fn lost(why: &str) -> Failure {
    Failure::PeerLost {
        why: crate::Lost::Message {
            why: crate::TableError::Goodbye { reason: why.into() },
        },
    }
}

#[test]
fn admission_refuses_a_closed_endpoint_a_taken_name_and_a_full_one_changing_nothing() {
    let mut e: Endpoint<&str, ()> = Endpoint::new(0, 1, 2);
    let a = e.admit("a", "conn-a", &[(0, 7, lane(0, 0))]).unwrap();
    assert_eq!(
        e.admit("a", "conn-a2", &[(0, 8, lane(0, 0))]),
        Err(Refusal::NameTaken { name: "a".into() })
    );
    // The refused admission routed nothing.
    assert!(e.lookup(0, 8).is_none());
    let b = e.admit("b", "conn-b", &[]).unwrap();
    assert_ne!(a, b);
    assert_eq!(e.admit("c", "conn-c", &[]), Err(Refusal::Full { max: 2 }));
    assert!(e.ready(a) && e.ready(b));
    assert_eq!(e.peer("a"), Some(&"conn-a"));
    assert_eq!(e.peers().copied().collect::<Vec<_>>(), ["conn-a", "conn-b"]);
    e.close();
    assert_eq!(e.admit("d", "conn-d", &[]), Err(Refusal::Closed));
    assert_eq!(e.peer_count(), 2);
}

#[test]
fn a_connection_let_go_frees_its_name_at_once_and_its_routes_after_two_drains_of_every_rail() {
    let mut e: Endpoint<&str, ()> = Endpoint::new(0, 2, 4);
    let a = e
        .admit("a", "old", &[(0, 7, lane(0, 0)), (1, 7, lane(1, 1))])
        .unwrap();
    assert!(e.ready(a));
    assert_eq!(e.let_go(a, Some(lost("bye"))), None);
    // Let go, it is ready no more.
    assert!(!e.ready(a));
    assert!(e.peer("a").is_none() && e.peers().next().is_none());
    // Completions queued before it was let go still reach it.
    assert_eq!(e.lookup(0, 7), Some((&"old", lane(0, 0))));
    // A new connection to the same peer may come at once, under a new number.
    let a2 = e.admit("a", "new", &[(0, 9, lane(0, 0))]).unwrap();
    assert_ne!(a, a2);
    // Rail 0 drains twice: rail 1 has not drained yet, so the old connection stays.
    assert!(e.drained(0).is_empty());
    assert!(e.drained(0).is_empty());
    assert!(e.drained(1).is_empty());
    assert_eq!(e.draining(), 1);
    let gone = e.drained(1);
    assert_eq!(gone, vec![("old", Some(lost("bye")))]);
    assert!(e.lookup(0, 7).is_none() && e.lookup(1, 7).is_none());
    assert_eq!(e.lookup(0, 9), Some((&"new", lane(0, 0))));
    assert_eq!(e.draining(), 0);
    // The old connection's routes are gone, not merely unreachable.
    assert_eq!(e.routes.len(), 1);
    // Drains of a rail the endpoint does not have change nothing.
    assert!(e.drained(5).is_empty());
}

#[test]
fn a_drain_that_began_before_the_let_go_does_not_count() {
    let mut e: Endpoint<u32, ()> = Endpoint::new(0, 1, 4);
    let a = e.admit("a", 1, &[]).unwrap();
    e.let_go(a, None);
    // The poll in progress when it was let go ends: one drain since, not enough.
    assert!(e.drained(0).is_empty());
    assert_eq!(e.drained(0), vec![(1, None)]);
}

#[test]
fn a_failure_is_given_once_the_first_stands_and_a_late_one_is_applied_at_once() {
    let mut e: Endpoint<u32, ()> = Endpoint::new(0, 1, 4);
    let a = e.admit("a", 1, &[]).unwrap();
    // Let go without a failure (a plain removal), then with one: applied now.
    assert_eq!(e.let_go(a, None), None);
    assert_eq!(e.let_go(a, Some(lost("late"))), Some(lost("late")));
    e.drained(0);
    assert_eq!(e.drained(0), vec![(1, None)]);
    // Let go with a failure, then with another: the first is given at the drain, once.
    let b = e.admit("b", 2, &[]).unwrap();
    assert_eq!(e.let_go(b, Some(lost("first"))), None);
    assert_eq!(e.let_go(b, Some(lost("second"))), None);
    e.drained(0);
    assert_eq!(e.drained(0), vec![(2, Some(lost("first")))]);
    // Gone already: the failure is applied at once; nothing else changes.
    assert_eq!(e.let_go(b, Some(lost("again"))), Some(lost("again")));
    assert_eq!(e.draining(), 0);
}

#[test]
fn a_reused_queue_pair_number_routes_to_its_newest_queue_pair_only() {
    let mut e: Endpoint<&str, ()> = Endpoint::new(0, 2, 4);
    let a = e.admit("a", "a", &[(0, 7, lane(0, 0))]).unwrap();
    let b = e.admit("b", "b", &[]).unwrap();
    // The device gave number 7 again (after a's queue pair was destroyed) to one of b's.
    assert!(e.route(0, 7, b, lane(0, 3)));
    // Destroying a's old queue pair late must not unroute b's.
    e.unroute(0, 7, a, lane(0, 0));
    assert_eq!(e.lookup(0, 7), Some((&"b", lane(0, 3))));
    // The same number on the other rail is another queue pair.
    assert!(e.lookup(1, 7).is_none());
    // A connection the endpoint does not know is routed nowhere.
    assert!(!e.route(1, 8, ConnId(99), lane(0, 0)));
    assert!(e.lookup(1, 8).is_none());
    e.unroute(0, 7, b, lane(0, 3));
    assert!(e.lookup(0, 7).is_none());
}

#[test]
fn a_connection_gone_is_routed_nowhere_and_its_late_routes_are_refused() {
    let mut e: Endpoint<&str, ()> = Endpoint::new(0, 1, 4);
    let a = e.admit("a", "a", &[(0, 1, lane(0, 0))]).unwrap();
    e.let_go(a, None);
    // A renewal in flight routes a new queue pair while it drains: still its own.
    assert!(e.route(0, 2, a, lane(0, 5)));
    e.drained(0);
    assert_eq!(e.drained(0), vec![("a", None)]);
    assert!(e.lookup(0, 1).is_none() && e.lookup(0, 2).is_none());
    assert!(!e.route(0, 3, a, lane(0, 6)));
    assert!(e.lookup(0, 3).is_none());
}

#[test]
fn a_peer_is_seen_only_once_ready_and_its_name_is_taken_from_admission() {
    let mut e: Endpoint<&str, ()> = Endpoint::new(0, 1, 4);
    let a = e.admit("a", "conn-a", &[(0, 7, lane(0, 0))]).unwrap();
    // Admitted, tables not exchanged yet: routed and named, but not seen.
    assert!(e.peer("a").is_none() && e.peers().next().is_none());
    assert_eq!(e.connections().collect::<Vec<_>>(), [(&"conn-a", false)]);
    assert_eq!(e.lookup(0, 7), Some((&"conn-a", lane(0, 0))));
    assert_eq!(
        e.admit("a", "conn-a2", &[]),
        Err(Refusal::NameTaken { name: "a".into() })
    );
    assert_eq!(e.peer_count(), 1);
    assert!(e.ready(a));
    assert_eq!(e.peer("a"), Some(&"conn-a"));
    assert_eq!(e.connections().collect::<Vec<_>>(), [(&"conn-a", true)]);
    // An unknown number makes nothing ready.
    assert!(!e.ready(ConnId(99)));
    // Let go before it was ready: never seen, and a new connection under the name is not
    // ready because the old one was made ready late.
    let b = e.admit("b", "conn-b", &[]).unwrap();
    e.let_go(b, None);
    assert!(!e.ready(b));
    let b2 = e.admit("b", "conn-b2", &[]).unwrap();
    assert!(e.peer("b").is_none());
    assert!(e.ready(b2));
    assert_eq!(e.peer("b"), Some(&"conn-b2"));
}

#[test]
fn the_first_rail_mask_of_a_location_stands() {
    let mut e: Endpoint<&str, ()> = Endpoint::new(0, 2, 4);
    let gpu = Location::Cuda { ordinal: 0 };
    let cpu = Location::Cpu { numa: Some(1) };
    assert_eq!(e.rail_mask(gpu), None);
    assert_eq!(e.set_rail_mask(gpu, 0b10), 0b10);
    // Two threads found it at once: the first kept wins, every transfer agrees.
    assert_eq!(e.set_rail_mask(gpu, 0b01), 0b10);
    assert_eq!(e.rail_mask(gpu), Some(0b10));
    assert_eq!(e.rail_mask(cpu), None);
}

#[test]
fn the_timers_are_due_to_one_caller_per_period() {
    let mut e: Endpoint<&str, ()> = Endpoint::new(0, 1, 4);
    let t0 = Instant::now();
    let period = Duration::from_millis(10);
    assert!(e.timers_due(t0, period), "never ran: due");
    assert!(
        !e.timers_due(t0, period),
        "another thread at the same time: not again"
    );
    assert!(!e.timers_due(t0 + Duration::from_millis(9), period));
    assert!(e.timers_due(t0 + period, period));
    // A clock read before the last run (another thread's, older) is not due.
    assert!(!e.timers_due(t0, period));
}

#[test]
fn the_endpoint_holds_its_agents_segments_and_refuses_anothers() {
    use crate::local_table::LocalError;
    let mut e: Endpoint<&str, &str> = Endpoint::new(3, 1, 4);
    let id = e.segments_mut().next_id().unwrap();
    e.segments_mut().insert(id, "seg");
    assert_eq!(e.segments().admit(3, id, |_| true), Ok(&"seg"));
    assert_eq!(
        e.segments().admit(4, id, |_| true),
        Err(LocalError::Foreign {
            owner: 4,
            segment: id
        })
    );
}
