//! Unit tests of the staged job written against the mutants cargo-mutants found alive (`cargo
//! xtask mutants`), with the same scripted stager as `staged.rs`'s own tests (`scripted.rs`).

use std::time::{Duration, Instant};

use super::scripted::{job, Io, C};
use super::*;

#[test]
fn a_job_owns_its_children_and_counts_its_chunks_out() {
    let t0 = Instant::now();
    let mut io = Io::default();
    let mut j = job(Op::Write, &[300], true, t0);
    j.step(&mut io, t0, 4);
    assert!(j.owns_ticket(1));
    j.on_chunk(&mut io, t0, C(1, 0, 100, 0));
    j.on_chunk(&mut io, t0, C(1, 100, 100, 1));
    // The last piece is held with the notification.
    j.on_chunk(&mut io, t0, C(1, 200, 100, 2));
    assert!(j.owns_child(1) && j.owns_child(2));
    assert!(!j.owns_child(3), "never posted");
    assert_eq!(j.chunks_out(), (3, 0, 0), "two with children, one held");
    io.not_quiet = vec![0, 1];
    j.on_child_finished(1, Ok(ChildStats::default()));
    assert!(!j.owns_child(1), "finished");
    j.step(&mut io, t0, 4);
    assert_eq!(j.chunks_out(), (2, 1, 1), "buffer 0 waits for the NIC");
    j.on_child_finished(2, Ok(ChildStats::default()));
    assert_eq!(j.chunks_out(), (1, 2, 1), "buffer 1 not tried yet");
    assert_eq!(j.posted_at(), None);
    let t1 = t0 + Duration::from_millis(5);
    j.step(&mut io, t1, 4);
    assert_eq!(io.posted.last(), Some(&(3, 0, 200, 100, true)));
    assert_eq!(j.posted_at(), Some(t1), "when the last piece went");
    assert!(
        io.cancelled.is_empty() && io.cancelled_tickets.is_empty(),
        "a job that did not fail stops nothing"
    );
}

#[test]
fn a_cancelled_job_cancels_its_children_and_ends_cancelled() {
    let t0 = Instant::now();
    let mut io = Io::default();
    let mut j = job(Op::Read, &[200], false, t0);
    j.step(&mut io, t0, 4);
    j.on_chunk(&mut io, t0, C(1, 0, 100, 0));
    j.cancel();
    j.step(&mut io, t0, 4);
    j.step(&mut io, t0, 4);
    assert_eq!(io.cancelled, vec![1], "cancelled once");
    assert_eq!(io.cancelled_tickets, vec![1]);
    j.on_child_finished(1, Ok(ChildStats::default()));
    j.on_ticket_finished(1, Ok(()));
    j.step(&mut io, t0, 4);
    assert!(j.is_over());
    assert_eq!(j.result(), Err(Failure::Cancelled));
    assert_eq!(
        io.back,
        vec![(0, false)],
        "nothing committed after the stop"
    );
}

#[test]
fn an_aborted_job_ends_with_the_first_failure() {
    let t0 = Instant::now();
    let mut io = Io::default();
    let mut j = job(Op::Write, &[100], false, t0);
    j.step(&mut io, t0, 4);
    j.abort(Failure::AgentClosed);
    j.abort(Failure::Cancelled);
    j.step(&mut io, t0, 4);
    assert_eq!(io.cancelled_tickets, vec![1]);
    j.on_ticket_finished(1, Ok(()));
    j.step(&mut io, t0, 4);
    assert!(j.is_over());
    assert_eq!(j.result(), Err(Failure::AgentClosed));
}

#[test]
fn a_write_releases_its_buffers_and_adds_up_its_childrens_figures() {
    let t0 = Instant::now();
    let mut io = Io::default();
    let mut j = job(Op::Write, &[200], false, t0);
    j.step(&mut io, t0, 4);
    j.on_chunk(&mut io, t0, C(1, 0, 100, 0));
    j.on_chunk(&mut io, t0, C(1, 100, 100, 1));
    let s = |slices, lanes, rails, retried| ChildStats {
        slices,
        lanes,
        rails,
        retried,
    };
    j.on_child_finished(1, Ok(s(3, 2, 1, 1)));
    j.on_child_finished(2, Ok(s(4, 1, 2, 2)));
    j.on_ticket_finished(1, Ok(()));
    j.step(&mut io, t0, 4);
    assert!(j.is_over());
    assert_eq!(j.result(), Ok(()));
    assert_eq!(
        j.stats().child,
        s(7, 2, 2, 3),
        "requests and retries add up, lanes and rails are the largest"
    );
    assert_eq!((j.stats().chunks, j.stats().bytes), (2, 200));
    // A WRITE's buffers held bytes for the peer: released, never copied to the GPU.
    io.back.sort_unstable();
    assert_eq!(io.back, vec![(0, false), (1, false)]);
}

#[test]
fn tickets_keep_to_the_window_and_a_busy_stager_posts_nothing_yet() {
    let t0 = Instant::now();
    let mut io = Io {
        busy: true,
        ..Io::default()
    };
    let mut j = job(Op::Write, &[100, 100, 100], false, t0);
    j.step(&mut io, t0, 2);
    assert_eq!(io.next_ticket, 0);
    assert_eq!(j.posted_at(), None, "nothing started, nothing posted");
    io.busy = false;
    j.step(&mut io, t0, 2);
    assert_eq!(io.next_ticket, 2, "a window of two tickets");
    assert!(j.owns_ticket(1) && j.owns_ticket(2) && !j.owns_ticket(3));
    assert_eq!(j.posted_at(), None, "run 2 not started");
    j.on_ticket_finished(1, Ok(()));
    j.step(&mut io, t0, 2);
    assert_eq!(io.next_ticket, 3);
    assert_eq!(j.posted_at(), None, "tickets 2 and 3 still lend chunks");
}

#[test]
fn a_direct_job_is_posted_when_its_last_run_goes_and_keeps_that_time() {
    let t0 = Instant::now();
    let t1 = t0 + Duration::from_millis(7);
    let mut io = Io::default();
    let runs = vec![
        StagedRun {
            staged: false,
            len: 100,
        };
        2
    ];
    let mut j: StagedJob<C, u32> = StagedJob::new(Op::Write, runs, None, None, t0);
    j.step(&mut io, t0, 4);
    assert_eq!(io.posted.len(), 2);
    assert_eq!(io.timeouts, vec![Duration::MAX; 2], "no deadline");
    assert_eq!(j.posted_at(), Some(t0));
    j.step(&mut io, t1, 4);
    assert_eq!(j.posted_at(), Some(t0), "not moved by a later step");
    j.on_child_finished(1, Ok(ChildStats::default()));
    j.on_child_finished(2, Ok(ChildStats::default()));
    j.step(&mut io, t1, 4);
    assert!(j.is_over());
    assert_eq!(j.result(), Ok(()));
}

#[test]
fn a_buffer_that_waited_for_the_nic_is_counted() {
    let t0 = Instant::now();
    let mut io = Io::default();
    let mut j = job(Op::Read, &[200], false, t0);
    j.step(&mut io, t0, 4);
    j.on_chunk(&mut io, t0, C(1, 0, 100, 0));
    j.on_chunk(&mut io, t0, C(1, 100, 100, 1));
    io.not_quiet = vec![0, 1];
    j.on_child_finished(1, Ok(ChildStats::default()));
    j.on_child_finished(2, Ok(ChildStats::default()));
    j.on_ticket_finished(1, Ok(()));
    j.step(&mut io, t0, 4);
    assert!(!j.is_over());
    io.not_quiet.clear();
    j.step(&mut io, t0, 4);
    assert!(j.is_over());
    assert_eq!(j.stats().waited_for_nic, 2);
    io.back.sort_unstable();
    assert_eq!(
        io.back,
        vec![(0, true), (1, true)],
        "a READ's bytes committed"
    );
}
