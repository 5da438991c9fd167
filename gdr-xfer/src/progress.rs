//! The progress threads: one per rail. Each reaps its rail's completion queue, credits
//! completions to transfers, posts what waits for room, delivers notifications; rail 0's also
//! fails transfers past their deadline, samples the rails' throughput and starts rail
//! renewals. It polls while work completes and sleeps on the completion
//! channel otherwise (waking at least every [`TICK`] for deadlines), so an idle agent costs no
//! CPU. The caller's thread never waits for it: submitting posts what fits at once.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gdr::Completion;

use crate::agent::AgentShared;

/// Longest sleep, and the period of deadline checks.
pub(crate) const TICK: Duration = Duration::from_millis(5);

pub(crate) fn run(agent: Arc<AgentShared>, rail: usize) {
    let cq = agent.rails[rail].cq.clone();
    let mut wcs = vec![Completion::default(); 64];
    let mut last_work = Instant::now();
    let mut last_tick = Instant::now();
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
            last_work = now;
            armed = false;
        }
        if rail == 0 && now.duration_since(last_tick) >= TICK {
            last_tick = now;
            for conn in agent.peer_list() {
                let (msgs, _) = conn.tick(now);
                for m in &msgs {
                    conn.send_control(m);
                }
            }
        }
        if n == 0 && now.duration_since(last_work) >= agent.config.busy_poll {
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
    if c.is_recv {
        if let Some(n) = conn.on_recv_completion(lane, c) {
            agent.deliver(n);
        }
    } else {
        conn.on_send_completion(lane, c);
    }
}
