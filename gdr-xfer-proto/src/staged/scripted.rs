//! The scripted stager of the staged job's unit tests (`staged.rs`'s and `mutant_tests.rs`): it
//! records the tickets started and cancelled, the children posted and cancelled, and the
//! buffers given back, and answers as each test tells it to.

use std::time::{Duration, Instant};

use super::*;
use crate::fault::TextError;

/// A chunk: (ticket, offset in run, len, buffer).
#[derive(Debug, PartialEq)]
pub(super) struct C(
    pub(super) u64,
    pub(super) u64,
    pub(super) u64,
    pub(super) usize,
);

#[derive(Default)]
pub(super) struct Io {
    pub(super) next_ticket: u64,
    pub(super) busy: bool,
    /// (child, run, offset, len, with the notification).
    pub(super) posted: Vec<(u32, usize, u64, u64, bool)>,
    pub(super) timeouts: Vec<Duration>,
    pub(super) next_child: u32,
    pub(super) cancelled: Vec<u32>,
    pub(super) cancelled_tickets: Vec<u64>,
    pub(super) not_quiet: Vec<usize>,
    /// (buffer, committed).
    pub(super) back: Vec<(usize, bool)>,
}

impl StageIo for Io {
    type Chunk = C;
    type Child = u32;
    type Error = TextError;
    fn ticket_of(&self, c: &C) -> u64 {
        c.0
    }
    fn place(&self, c: &C, _run: usize) -> (u64, u64) {
        (c.1, c.2)
    }
    fn len_of(&self, c: &C) -> u64 {
        c.2
    }
    fn start(&mut self, _run: usize) -> Result<u64, Start<TextError>> {
        if self.busy {
            return Err(Start::Busy);
        }
        self.next_ticket += 1;
        Ok(self.next_ticket)
    }
    fn cancel_ticket(&mut self, t: u64) {
        self.cancelled_tickets.push(t);
    }
    fn post(
        &mut self,
        _c: Option<&C>,
        run: usize,
        offset: u64,
        len: u64,
        timeout: Duration,
        notify: Option<&[u8]>,
    ) -> Result<u32, Failure> {
        self.next_child += 1;
        self.timeouts.push(timeout);
        self.posted
            .push((self.next_child, run, offset, len, notify.is_some()));
        Ok(self.next_child)
    }
    fn cancel_child(&mut self, c: u32) {
        self.cancelled.push(c);
    }
    fn is_quiet(&self, c: &C) -> bool {
        !self.not_quiet.contains(&c.3)
    }
    fn give_back(&mut self, c: C, commit: bool) -> Result<(), TextError> {
        self.back.push((c.3, commit));
        Ok(())
    }
}

pub(super) fn staged(lens: &[u64]) -> Vec<StagedRun> {
    lens.iter()
        .map(|&len| StagedRun { staged: true, len })
        .collect()
}

/// A job of staged runs of `lens` bytes, with a notification or not, deadline in a second.
pub(super) fn job(op: Op, lens: &[u64], notify: bool, t0: Instant) -> StagedJob<C, u32> {
    StagedJob::new(
        op,
        staged(lens),
        notify.then(|| b"n".to_vec()),
        Some(Duration::from_secs(1)),
        t0,
    )
}
