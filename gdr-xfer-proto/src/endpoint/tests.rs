use super::*;

fn lane(lane: usize, gen: u64) -> LaneRef {
    LaneRef { lane, gen }
}

fn lost(why: &str) -> Failure {
    Failure::PeerLost { reason: why.into() }
}

#[test]
fn admission_refuses_a_closed_endpoint_a_taken_name_and_a_full_one_changing_nothing() {
    let mut e: Endpoint<&str> = Endpoint::new(1, 2);
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
    assert_eq!(e.peer("a"), Some(&"conn-a"));
    assert_eq!(e.peers().copied().collect::<Vec<_>>(), ["conn-a", "conn-b"]);
    e.close();
    assert_eq!(e.admit("d", "conn-d", &[]), Err(Refusal::Closed));
    assert_eq!(e.peer_count(), 2);
}

#[test]
fn a_connection_let_go_frees_its_name_at_once_and_its_routes_after_two_drains_of_every_rail() {
    let mut e: Endpoint<&str> = Endpoint::new(2, 4);
    let a = e
        .admit("a", "old", &[(0, 7, lane(0, 0)), (1, 7, lane(1, 1))])
        .unwrap();
    assert_eq!(e.let_go(a, Some(lost("bye"))), None);
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
    let mut e: Endpoint<u32> = Endpoint::new(1, 4);
    let a = e.admit("a", 1, &[]).unwrap();
    e.let_go(a, None);
    // The poll in progress when it was let go ends: one drain since, not enough.
    assert!(e.drained(0).is_empty());
    assert_eq!(e.drained(0), vec![(1, None)]);
}

#[test]
fn a_failure_is_given_once_the_first_stands_and_a_late_one_is_applied_at_once() {
    let mut e: Endpoint<u32> = Endpoint::new(1, 4);
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
    let mut e: Endpoint<&str> = Endpoint::new(2, 4);
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
    let mut e: Endpoint<&str> = Endpoint::new(1, 4);
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
