//! The applications of the simulated agents: submitting transfers (direct and staged), the
//! staging driver's steps, and consuming outcomes.

use super::*;

impl World {
    /// One application submission from `agent` to `peer`.
    pub(super) fn submit(&mut self, agent: usize, peer: usize, left: u32) {
        if left > 1 {
            let d = self.us(0, 8000);
            self.at(
                d,
                Ev::Submit {
                    agent,
                    peer,
                    left: left - 1,
                },
            );
        }
        if !self.net.borrow().alive[agent] || self.conns[agent][peer].is_none() {
            return;
        }
        let op = if self.rng.percent(50) {
            Op::Write
        } else {
            Op::Read
        };
        // After the heal (the liveness phase): plain direct transfers only, each of which
        // must succeed, on the connections that stayed up (not to a peer that died).
        let healed = self.healed;
        if healed
            && self.conns[agent][peer]
                .as_ref()
                .is_none_or(|c| c.core.gone().is_some())
        {
            return;
        }
        if self.rng.percent(self.p.staged_pct) && !healed {
            self.submit_staged(agent, peer, op);
            return;
        }
        let misuse = if healed {
            None
        } else if self.rng.percent(6) {
            Some(Misuse::ForeignLocal)
        } else if self.rng.percent(4) {
            Some(Misuse::LongNotify)
        } else {
            None
        };
        // Some are messages: a notification without data.
        let message = misuse != Some(Misuse::ForeignLocal) && self.rng.percent(5) && !healed;
        let nruns = if message { 0 } else { 1 + self.rng.index(3) };
        let x = self.net.borrow().xfers.list.len();
        let drawn = self.draw_runs(agent, peer, x, nruns, misuse);
        // A foreign run that found no room was not added: the transfer is an honest one.
        let misuse = match misuse {
            Some(Misuse::ForeignLocal) if !drawn.foreign_added => None,
            m => m,
        };
        let generous = self.rng.percent(75) || healed;
        let timeout = if generous {
            Duration::from_millis(self.rng.range(1500, 3000))
        } else {
            self.us(50, 8000)
        };
        let cancel = self.rng.percent(8) && !healed;
        let max = self.notify_max(agent, peer);
        let notify = self.draw_notify(x, message, misuse, max);
        if healed {
            self.liveness.push(x);
            self.report.liveness += 1;
        }
        let (rkeys, stale) = self.remote_keys(agent, peer, &drawn.remote_segs);
        let parted = self.parted[agent][peer];
        self.report.stale_plans += u64::from(stale);
        let rail_mask = if self.rng.percent(30) { 1 } else { u32::MAX };
        // Some are queued without posting (as an event loop's submissions are), posted a while
        // later by the application's post thread, or by whatever posts first.
        // (`inline_max` drawn around the transfers' sizes: the core decides which are posted.)
        let queued = self.rng.percent(25) && !healed;
        let inline_max = self.rng.range(0, self.p.cfg.slice_size * 2);
        {
            let mut net = self.net.borrow_mut();
            net.xfers.list.push(Xfer {
                kind: Kind::App,
                staged: false,
                agent,
                peer,
                op,
                runs: drawn.xruns,
                notify: notify.is_some(),
                misuse,
                deadline: Some(self.now + timeout),
                innocent: generous && misuse.is_none() && !cancel && !stale && !parted,
                state: XState::Live,
                key: None,
                arrivals: 0,
                deliveries: 0,
            });
            let Net { xfers, mem, .. } = &mut *net;
            xfers.fill_source(x, mem);
        }
        if drawn.runs.is_empty() && notify.is_none() {
            self.net.borrow_mut().xfers.refused(x);
            return;
        }
        let spec = Spec {
            op,
            locals: drawn.locals,
            runs: drawn.runs,
            rkeys,
            timeout: Some(timeout),
            notify,
            rail_mask,
            handle: x,
        };
        self.report.submitted += 1;
        if spec.runs.is_empty() {
            self.report.messages += 1;
        }
        self.log(|| {
            format!("submit {x}: {agent}->{peer} {op:?} misuse {misuse:?} timeout {timeout:?}")
        });
        let mut result = None;
        self.call(agent, peer, |core, io, now| {
            result = Some(if queued {
                core.submit_inline_up_to(now, io, spec, inline_max)
            } else {
                core.submit(now, io, spec)
            })
        });
        // Half of them get the post thread's call; the others wait for the next completion or
        // timer.
        if queued && matches!(result, Some(Ok(_))) && self.rng.percent(50) {
            let d = self.us(0, 3000);
            self.at(d, Ev::PostQueued { agent, peer });
        }
        self.submitted(x, cancel, result);
    }

    /// Up to `nruns` runs of transfer `x` from `agent` to `peer` in free memory of both (the
    /// last one's local side in another agent's memory for [`Misuse::ForeignLocal`]), reserved
    /// for it.
    fn draw_runs(
        &mut self,
        agent: usize,
        peer: usize,
        x: usize,
        nruns: usize,
        misuse: Option<Misuse>,
    ) -> DrawnRuns {
        let max_grains = (3 * self.p.cfg.slice_size as usize / GRAIN).max(1);
        let mut runs = Vec::new();
        let mut locals: Vec<SimLocal> = Vec::new();
        let mut remote_segs: Vec<usize> = Vec::new();
        let mut xruns = Vec::new();
        let mut foreign_added = false;
        for i in 0..nruns {
            let len = GRAIN * (1 + self.rng.index(max_grains));
            let foreign = misuse == Some(Misuse::ForeignLocal) && i == nruns - 1;
            let local_agent = if foreign {
                (agent + 1 + self.rng.index(self.p.agents - 1)) % self.p.agents
            } else {
                agent
            };
            let (Some(l), Some(r)) = (
                self.free_range(local_agent, len),
                self.free_range(peer, len),
            ) else {
                break;
            };
            let mut net = self.net.borrow_mut();
            if !foreign {
                net.xfers.reserve(agent, l, len, x);
            }
            net.xfers.reserve(peer, r, len, x);
            drop(net);
            let sl = SimLocal {
                agent: local_agent,
                seg: l / SEG,
            };
            let li = match locals.iter().position(|&s| s == sl) {
                Some(i) => i,
                None => {
                    locals.push(sl);
                    locals.len() - 1
                }
            };
            let rs = r / SEG;
            let ri = match remote_segs.iter().position(|&s| s == rs) {
                Some(i) => i,
                None => {
                    remote_segs.push(rs);
                    remote_segs.len() - 1
                }
            };
            runs.push(Run {
                local: li as u32,
                local_offset: (l % SEG) as u64,
                remote_addr: r as u64,
                remote: ri as u32,
                len: len as u64,
            });
            xruns.push(XRun {
                local_agent,
                local: l,
                remote: r,
                len,
            });
            foreign_added |= foreign;
        }
        DrawnRuns {
            runs,
            locals,
            remote_segs,
            xruns,
            foreign_added,
        }
    }

    /// The notification of transfer `x`, if it has one (a message always does): its id first,
    /// one byte too long for [`Misuse::LongNotify`].
    fn draw_notify(
        &mut self,
        x: usize,
        message: bool,
        misuse: Option<Misuse>,
        max: usize,
    ) -> Option<Vec<u8>> {
        (message || self.rng.percent(50) || misuse == Some(Misuse::LongNotify)).then(|| {
            let len = if misuse == Some(Misuse::LongNotify) {
                max + 1 + self.rng.index(16)
            } else {
                8 + self.rng.index(max - 7)
            };
            let mut d = vec![0xabu8; len];
            d[..8].copy_from_slice(&(x as u64).to_be_bytes());
            d
        })
    }

    /// The largest notification `agent`'s connection to `peer` sends (the handshake's: the
    /// smaller of both agents' bounds); 8 once the connection is gone.
    fn notify_max(&self, agent: usize, peer: usize) -> usize {
        self.conns[agent][peer]
            .as_ref()
            .map_or(8, |c| c.core.config().notify_max as usize)
    }

    /// The remote keys of `peer`'s segments `segs` on every rail, as `agent`'s table has them
    /// (the driver's planner reads them there), and whether one of them is stale (the owner
    /// deregistered it and its message is still on the way).
    fn remote_keys(&mut self, agent: usize, peer: usize, segs: &[usize]) -> (Vec<u32>, bool) {
        if let Some(found) = self.table_keys(agent, peer, segs) {
            return found;
        }
        self.net.borrow_mut().violation(format!(
            "agent {agent}'s table of agent {peer} lacks one of its segments {segs:?}"
        ));
        (Vec::new(), true)
    }

    /// What the core said to transfer `x`'s submission (`None`: the connection was gone):
    /// accepted (and maybe cancelled later), or refused, which only a misuse may be.
    fn submitted(
        &mut self,
        x: usize,
        cancel: bool,
        result: Option<Result<crate::transfer::TransferKey, Failure>>,
    ) {
        if let Some(Err(f)) = &result {
            if self.liveness.contains(&x) {
                self.net.borrow_mut().violation(format!(
                    "transfer {x}, submitted after the faults healed and the rails had time to come back, was refused: {f:?}"
                ));
            }
        }
        match result {
            Some(Ok(key)) => {
                self.net.borrow_mut().xfers.list[x].key = Some(key);
                if cancel {
                    let d = self.us(0, 5000);
                    self.at(d, Ev::Cancel { xfer: x });
                }
            }
            Some(Err(f)) => {
                self.report.refused += 1;
                let mut net = self.net.borrow_mut();
                let t = &net.xfers.list[x];
                let bad = match (&f, t.misuse) {
                    (Failure::Rejected { .. }, Some(Misuse::LongNotify)) => None,
                    (_, Some(Misuse::LongNotify)) => Some(format!(
                        "a notification longer than the peer takes was refused with {f:?}"
                    )),
                    (_, _) if t.innocent && self.p.class == FaultClass::Clean => Some(format!(
                        "transfer {x} had nothing wrong with it, yet was refused: {f:?}"
                    )),
                    _ => None,
                };
                if let Some(b) = bad {
                    net.violation(b);
                }
                net.xfers.refused(x);
            }
            None => {
                // The connection is gone (closed after its peer died): never submitted.
                self.net.borrow_mut().xfers.refused(x);
            }
        }
        if self.net.borrow().xfers.list[x].misuse == Some(Misuse::LongNotify)
            && self.net.borrow().xfers.list[x].state == XState::Live
        {
            self.net.borrow_mut().violation(format!(
                "transfer {x}'s notification is longer than the peer takes, yet it was accepted"
            ));
        }
    }

    /// A staged transfer from `agent` to `peer`: its runs' local side in the agent's GPU
    /// memory (some in host memory, moved directly), through the agent's stager.
    pub(super) fn submit_staged(&mut self, agent: usize, peer: usize, op: Op) {
        let x = self.net.borrow().xfers.list.len();
        let max_grains = (3 * self.p.stager.chunk_size / GRAIN).max(1);
        let mut sruns = Vec::new();
        let mut xruns = Vec::new();
        for _ in 0..1 + self.rng.index(3) {
            let len = GRAIN * (1 + self.rng.index(max_grains));
            let staged = self.rng.percent(80);
            let local = if staged {
                self.free_in(agent, GPU_SEG, len)
            } else {
                self.free_range(agent, len)
            };
            let (Some(l), Some(r)) = (local, self.free_range(peer, len)) else {
                break;
            };
            let mut net = self.net.borrow_mut();
            net.xfers.reserve(agent, l, len, x);
            net.xfers.reserve(peer, r, len, x);
            drop(net);
            sruns.push(SRun {
                staged,
                local: l,
                remote: r,
                len,
            });
            xruns.push(XRun {
                local_agent: agent,
                local: l,
                remote: r,
                len,
            });
        }
        let generous = self.rng.percent(75);
        let timeout = if generous {
            Duration::from_millis(self.rng.range(1500, 3000))
        } else {
            self.us(50, 8000)
        };
        let cancel = self.rng.percent(8);
        let max = self.notify_max(agent, peer);
        let notify = self.rng.percent(50).then(|| {
            let mut d = vec![0xcdu8; 8 + self.rng.index(max - 7)];
            d[..8].copy_from_slice(&(x as u64).to_be_bytes());
            d
        });
        let all: Vec<usize> = (0..SEGS).collect();
        let parted = self.parted[agent][peer];
        let (epochs, stale) = match self.seen(agent, peer, &all) {
            Some(seen) => (seen.epochs, seen.stale),
            None => {
                self.net.borrow_mut().violation(format!(
                    "agent {agent}'s table of agent {peer} lacks one of its segments"
                ));
                (vec![0; SEGS], true)
            }
        };
        {
            let mut net = self.net.borrow_mut();
            net.xfers.list.push(Xfer {
                kind: Kind::App,
                staged: true,
                agent,
                peer,
                op,
                runs: xruns,
                notify: notify.is_some(),
                misuse: None,
                deadline: Some(self.now + timeout),
                innocent: generous && !cancel && !stale && !parted,
                state: XState::Live,
                key: None,
                arrivals: 0,
                deliveries: 0,
            });
            let Net { xfers, mem, .. } = &mut *net;
            if sruns.is_empty() {
                xfers.refused(x);
                return;
            }
            xfers.fill_source(x, mem);
        }
        self.report.submitted += 1;
        self.report.staged += 1;
        self.log(|| format!("submit staged {x}: {agent}->{peer} {op:?} timeout {timeout:?}"));
        let runs: Vec<StagedRun> = sruns
            .iter()
            .map(|r| StagedRun {
                staged: r.staged,
                len: r.len as u64,
            })
            .collect();
        let now = self.instant();
        let Some(c) = self.conns[agent][peer].as_mut() else {
            self.net.borrow_mut().xfers.refused(x);
            return;
        };
        if c.core.gone().is_some() {
            self.report.refused += 1;
            self.net.borrow_mut().xfers.refused(x);
            return;
        }
        let mut core = StagedJob::new(op, runs, notify, Some(timeout), now);
        if cancel {
            core.cancel();
        }
        c.jobs.push(SimJob {
            xfer: x,
            op,
            runs: sruns,
            core,
            children: Vec::new(),
            epochs,
        });
        self.stage_soon(agent);
    }

    /// Schedules `agent`'s staging step soon (the driver polls every few tens of microseconds
    /// while it has work).
    pub(super) fn stage_soon(&mut self, agent: usize) {
        let at = self.now + self.us(10, 300);
        if self.stage_at[agent].is_none_or(|t| at < t || t < self.now) {
            self.stage_at[agent] = Some(at);
            self.push(at, Ev::StageStep { agent });
        }
    }

    /// `agent`'s staging step: the stager's events to their jobs, each job's step, and the
    /// outcomes of the jobs that are over.
    pub(super) fn stage_step(&mut self, agent: usize) {
        if !self.net.borrow().alive[agent] {
            return;
        }
        let now = self.instant();
        let window = self.p.stager.max_tickets;
        while let Some(ev) = self.stagers[agent].events.pop_front() {
            let ticket = match &ev {
                StageEvent::Chunk(c) => c.ticket().id(),
                StageEvent::Finished(id, _) => *id,
            };
            let owner = (0..self.p.agents).find_map(|p| {
                let c = self.conns[agent][p].as_ref()?;
                let i = c.jobs.iter().position(|j| j.core.owns_ticket(ticket))?;
                Some((p, i))
            });
            match (ev, owner) {
                (StageEvent::Chunk(chunk), Some((p, i))) => {
                    self.with_job(agent, p, i, now, |job, io| job.on_chunk(io, now, chunk));
                }
                (StageEvent::Finished(id, r), Some((p, i))) => {
                    if let Some(c) = self.conns[agent][p].as_mut() {
                        c.jobs[i].core.on_ticket_finished(id, r);
                    }
                }
                (StageEvent::Chunk(chunk), None) => {
                    let mut net = self.net.borrow_mut();
                    if let Err(e) = self.stagers[agent].release_orphan(&mut net, agent, chunk) {
                        net.violation(e.0);
                    }
                }
                (StageEvent::Finished(..), None) => {}
            }
        }
        let mut busy = self.stagers[agent].busy();
        if self.verbose {
            let d = self.stagers[agent].describe();
            self.log(|| format!("stager {agent}: {d}"));
        }
        for p in 0..self.p.agents {
            let Some(n) = self.conns[agent][p].as_ref().map(|c| c.jobs.len()) else {
                continue;
            };
            let mut i = 0;
            let mut left = n;
            while i < left {
                self.with_job(agent, p, i, now, |job, io| job.step(io, now, window));
                if self.verbose {
                    let d = self.conns[agent][p]
                        .as_ref()
                        .and_then(|c| c.jobs.get(i))
                        .map(|j| format!("job {} {:?}", j.xfer, j.core));
                    if let Some(d) = d {
                        self.log(|| d);
                    }
                }
                let over = self.conns[agent][p]
                    .as_ref()
                    .is_some_and(|c| c.jobs.get(i).is_some_and(|j| j.core.is_over()));
                if over {
                    let job = self.conns[agent][p]
                        .as_mut()
                        .expect("checked")
                        .jobs
                        .swap_remove(i);
                    self.staged_finished(p, &job);
                    left -= 1;
                } else {
                    i += 1;
                }
            }
            busy |= left > 0;
            if let Some(inc) = self.conns[agent][p].as_ref().map(|c| c.inc) {
                self.settle(agent, p, inc);
            }
        }
        if busy {
            self.stage_soon(agent);
        }
    }

    /// Runs `f` on job `i` of `agent`'s connection to `peer`, with its I/O.
    pub(super) fn with_job(
        &mut self,
        agent: usize,
        peer: usize,
        i: usize,
        now: Instant,
        f: impl FnOnce(&mut StagedJob<Chunk, TransferKey>, &mut SimStageIo<'_>),
    ) {
        let rails = self.p.cfg.rails;
        let net = self.net.clone();
        let stager = &mut self.stagers[agent];
        let Some(c) = self.conns[agent][peer].as_mut() else {
            return;
        };
        let Conn { core, io, jobs, .. } = c;
        let Some(job) = jobs.get_mut(i) else {
            return;
        };
        let SimJob {
            xfer,
            op,
            runs,
            core: jcore,
            children,
            epochs,
        } = job;
        let mut sio = SimStageIo {
            stager,
            core,
            io,
            net,
            agent,
            peer,
            rails,
            now,
            xfer: *xfer,
            op: *op,
            runs,
            children,
            epochs,
        };
        f(jcore, &mut sio);
    }

    /// A child transfer of one of `agent`'s staged jobs reached its outcome.
    pub(super) fn child_finished(&mut self, agent: usize, peer: usize, cx: usize, o: Outcome) {
        self.log(|| format!("child outcome {cx}: {:?}", o.result));
        let v = self.net.borrow_mut().xfers.child_outcome(cx, &o.result);
        if let Some(v) = v {
            self.net.borrow_mut().violation(v);
        }
        let Some(c) = self.conns[agent][peer].as_mut() else {
            return;
        };
        for job in &mut c.jobs {
            if let Some(k) = job.children.iter().position(|&(_, x)| x == cx) {
                let (key, _) = job.children.swap_remove(k);
                let r = o.result.clone().map(|()| ChildStats {
                    slices: o.stats.slices,
                    lanes: o.stats.lanes_mask.count_ones(),
                    rails: o.stats.rails_mask.count_ones(),
                    retried: o.stats.retried_slices,
                });
                job.core.on_child_finished(key, r);
                break;
            }
        }
        self.stage_soon(agent);
    }

    /// A staged job is over: its outcome, checked as an application's.
    pub(super) fn staged_finished(&mut self, peer: usize, job: &SimJob) {
        let x = job.xfer;
        let result = job.core.result();
        self.log(|| format!("staged outcome {x}: {result:?}"));
        let bound = self.staged_bound();
        let mut net = self.net.borrow_mut();
        let alive = net.alive[peer];
        let now = self.now;
        let Net { xfers, mem, .. } = &mut *net;
        let mut v = xfers.outcome(x, &result, mem, alive, bound, now);
        let t = &xfers.list[x];
        if let (Err(f), true, true) = (&result, t.innocent, self.p.class == FaultClass::Clean) {
            v.push(format!(
                "staged transfer {x} had nothing wrong with it, yet failed with {f:?}"
            ));
        }
        match &result {
            Ok(()) => self.report.done += 1,
            Err(f) => *self.report.failed.entry(failure_kind(f)).or_default() += 1,
        }
        net.violations.extend(v);
    }

    /// How long after its deadline an outcome may come: the core's bound, then (staged) the
    /// copies and the driver's steps.
    pub(super) fn staged_bound(&self) -> Duration {
        self.p.cfg.outcome_bound()
            + SLACK
            + Duration::from_micros(4 * COPY.1)
            + Duration::from_millis(1)
    }

    /// A free range of `len` bytes in segment `seg` of `agent`'s memory.
    pub(super) fn free_in(&mut self, agent: usize, seg: usize, len: usize) -> Option<usize> {
        for _ in 0..20 {
            let grains = (SEG - len) / GRAIN + 1;
            let at = seg * SEG + GRAIN * self.rng.index(grains);
            if self.net.borrow().xfers.is_free(agent, at, len) {
                return Some(at);
            }
        }
        None
    }

    /// A free range of `len` bytes in `agent`'s memory (inside one segment).
    pub(super) fn free_range(&mut self, agent: usize, len: usize) -> Option<usize> {
        for _ in 0..20 {
            let seg = self.rng.index(SEGS);
            let grains = (SEG - len) / GRAIN + 1;
            let at = seg * SEG + GRAIN * self.rng.index(grains);
            if self.net.borrow().xfers.is_free(agent, at, len) {
                return Some(at);
            }
        }
        None
    }
}

/// The runs [`World::draw_runs`] drew for one transfer.
struct DrawnRuns {
    /// The core's runs.
    runs: Vec<Run>,
    /// The local segments the runs name.
    locals: Vec<SimLocal>,
    /// The peer's segments the runs name.
    remote_segs: Vec<usize>,
    /// The runs as the checks see them.
    xruns: Vec<XRun>,
    /// Whether a run's local side is another agent's memory.
    foreign_added: bool,
}
