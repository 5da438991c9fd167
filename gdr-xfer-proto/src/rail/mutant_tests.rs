//! Unit tests of a rail's bookkeeping written against the mutants cargo-mutants found alive
//! (`cargo xtask mutants`).

use std::time::{Duration, Instant};

use super::*;

#[test]
fn a_readmitted_rail_samples_one_period_after_it_came_back() {
    let t0 = Instant::now();
    let mut r = RailLink::new(2, t0);
    assert_eq!(r.next_sample(), t0 + SAMPLE);
    let later = t0 + Duration::from_secs(3);
    r.pause(later, RailFault::Unanswered);
    r.admit(later, 2);
    assert_eq!(r.next_sample(), later + SAMPLE);
}

#[test]
fn busy_time_starts_with_the_first_bytes_posted_not_a_later_post() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut r = RailLink::new(1, t0);
    r.posted(1000, t0);
    r.posted(1000, t0 + ms(10));
    r.completed(2000, 2, t0 + ms(20));
    assert_eq!((r.stats.bytes, r.stats.slices), (2000, 2));
    r.sample(t0 + SAMPLE);
    // 2,000 bytes over the 20 ms the rail was busy.
    assert!(
        (r.stats.throughput - 100_000.0).abs() < 1.0,
        "{}",
        r.stats.throughput
    );
}

#[test]
fn a_rail_renewed_after_a_failure_is_not_usable_a_fenced_one_is() {
    let t0 = Instant::now();
    let mut r = RailLink::new(1, t0);
    assert!(r.is_usable());
    r.pause(t0, RailFault::Unanswered);
    assert!(!r.is_usable());
    // Renewing after its cool-down: not usable until the probe re-admits it.
    r.state = RailState::Renewing;
    assert!(!r.is_usable());
    r.state = RailState::Probing;
    assert!(!r.is_usable());
    // A fence renews an active rail: usable meanwhile.
    r.admit(t0, 1);
    r.fencing = true;
    r.state = RailState::Renewing;
    assert!(r.is_usable());
    r.state = RailState::Probing;
    assert!(r.is_usable());
}
