//! The progress threads: one per rail. Each reaps its rail's completion queue and hands every
//! completion to its connection's core; every one of them also runs the connections' timers
//! (deadlines, fences, renewals, throughput samples) when they are due and no other thread is
//! running them, so timers do not depend on one thread. A thread polls while work completes and
//! sleeps on the completion channel otherwise (waking at least every [`TICK`] for the timers),
//! so an idle agent costs no CPU. The caller's thread never waits for it: submitting posts what
//! fits at once.
//!
//! The core does not panic (the simulation checks it on every seed); should a completion's
//! handling panic all the same, the progress thread survives it: the connection is closed
//! (its transfers fail, their queue pairs destroyed) and the thread goes on for the others.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use gdr::Completion;
use gdr_xfer_proto::{Failure, Lost};

use crate::config::TICK;
use crate::shared::AgentShared;
use crate::spacing::Spacing;

pub(crate) fn run(agent: Arc<AgentShared>, rail: usize) {
    let cq = agent.rails[rail].cq.clone();
    let mut wcs = vec![Completion::default(); 64];
    // The spacing of polls that found completions: polling on after a completion only pays
    // when the next one tends to come sooner than `busy_poll`; otherwise it takes a core from
    // whatever else would run there (on a few cores: a software NIC's kernel work).
    let mut found = Spacing::new();
    let mut armed = false;
    while !agent.shutdown.load(Ordering::Acquire) {
        let n = match cq.poll(&mut wcs) {
            Ok(n) => n,
            Err(e) => {
                log::error!("{}: polling the completion queue: {e}", agent.config.name);
                std::thread::sleep(TICK);
                0
            }
        };
        for c in &wcs[..n] {
            handle(&agent, rail, c);
        }
        if n < wcs.len() {
            agent.drained(rail);
        }
        let now = Instant::now();
        if n > 0 {
            found.record(now);
            armed = false;
        }
        if catch_unwind(AssertUnwindSafe(|| agent.run_timers(now))).is_err() {
            log::error!(
                "{}: a panic running the timers (a bug); going on",
                agent.config.name
            );
        }
        if n == 0 && !found.polling_pays(now, agent.config.busy_poll) {
            if !armed {
                if let Err(e) = cq.arm() {
                    log::error!("{}: arming the completion queue: {e}", agent.config.name);
                }
                armed = true;
                // A completion may have arrived before the arm: poll once more first.
                continue;
            }
            match cq.wait(TICK) {
                Ok(true) => armed = false,
                Ok(false) => {}
                Err(e) => {
                    log::error!("{}: waiting for completions: {e}", agent.config.name);
                    std::thread::sleep(TICK);
                }
            }
        }
    }
}

fn handle(agent: &AgentShared, rail: usize, c: &Completion) {
    let Some((conn, lane)) = agent.route(rail, c.qp_num) else {
        log::debug!("completion for QP {:#x} of no live peer dropped", c.qp_num);
        return;
    };
    let handled = catch_unwind(AssertUnwindSafe(|| {
        if c.is_recv {
            conn.on_recv_completion(lane, c);
        } else {
            conn.on_send_completion(lane, c);
        }
    }));
    if handled.is_err() {
        log::error!(
            "{}: a panic handling a completion of peer {} (a bug): the connection is closed",
            agent.config.name,
            conn.name
        );
        let closed = catch_unwind(AssertUnwindSafe(|| {
            conn.lose(Failure::PeerLost {
                why: Lost::EngineFault,
            })
        }));
        if closed.is_err() {
            log::error!(
                "{}: closing peer {} panicked too",
                agent.config.name,
                conn.name
            );
        }
    }
}
