//! Connections let go, and when they may go: once every rail's completion queue was drained
//! twice since (the second drain began after the first ended, which was after the connection
//! was let go: every completion queued before that was handled).

use super::ConnId;
use crate::transfer::Failure;

/// The connections let go and not gone yet.
#[derive(Debug)]
pub(super) struct Retiring {
    /// Per rail, how many polls found its completion queue drained.
    drains: Vec<u64>,
    /// Each connection let go, the drain counts then, and the failure to give what is still in
    /// flight on it once it goes.
    waiting: Vec<(ConnId, Vec<u64>, Option<Failure>)>,
}

impl Retiring {
    pub(super) fn new(rails: usize) -> Retiring {
        Retiring {
            drains: vec![0; rails],
            waiting: Vec::new(),
        }
    }

    /// Lets go of `id` (see [`super::Endpoint::let_go`]): returns the failure to apply now when
    /// it was let go before without one.
    pub(super) fn add(&mut self, id: ConnId, failure: Option<Failure>) -> Option<Failure> {
        match self.waiting.iter_mut().find(|(w, _, _)| *w == id) {
            None => {
                self.waiting.push((id, self.drains.clone(), failure));
                None
            }
            // Let go before: its first failure stands; one given now where it had none is
            // applied now.
            Some((_, _, Some(_))) => None,
            Some((_, _, None)) => failure,
        }
    }

    /// Rail `rail` drained: the connections that may go now.
    pub(super) fn drained(&mut self, rail: usize) -> Vec<(ConnId, Option<Failure>)> {
        let Some(d) = self.drains.get_mut(rail) else {
            return Vec::new();
        };
        *d += 1;
        if self.waiting.is_empty() {
            return Vec::new();
        }
        let now = &self.drains;
        let mut gone = Vec::new();
        self.waiting.retain_mut(|(id, at, failure)| {
            let due = now
                .iter()
                .zip(at.iter())
                .all(|(n, a)| *n >= a.saturating_add(2));
            if due {
                gone.push((*id, failure.take()));
            }
            !due
        });
        gone
    }

    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }
}
