//! Notification bookkeeping: the ids a receiver already delivered (a notification is sent again
//! after its rail failed, and the first copy may have arrived).

use std::collections::BTreeSet;

/// How many notification ids a receiver remembers to drop repeats.
pub(crate) const SEEN_WINDOW: usize = 4096;

/// The ids of notifications already delivered from one peer (the latest [`SEEN_WINDOW`]).
#[derive(Default, Debug)]
pub(crate) struct Seen {
    ids: BTreeSet<u64>,
}

impl Seen {
    /// Whether `id` is new (and remembers it). Ids older than the window count as seen: a
    /// repeat comes within a transfer's deadline, long before 4096 newer ones.
    pub(crate) fn first_time(&mut self, id: u64) -> bool {
        if self.ids.len() >= SEEN_WINDOW && self.ids.first().is_some_and(|&f| id < f) {
            return false;
        }
        if !self.ids.insert(id) {
            return false;
        }
        while self.ids.len() > SEEN_WINDOW {
            self.ids.pop_first();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_dropped_and_the_window_is_bounded() {
        let mut s = Seen::default();
        assert!(s.first_time(5));
        assert!(!s.first_time(5), "a repeat");
        assert!(s.first_time(3), "out of order is fine");
        for id in 10..10 + SEEN_WINDOW as u64 {
            assert!(s.first_time(id));
        }
        assert_eq!(s.ids.len(), SEEN_WINDOW);
        assert!(!s.first_time(4), "older than everything remembered");
        assert!(!s.first_time(10 + SEEN_WINDOW as u64 - 1));
        assert!(s.first_time(u64::MAX));
    }
}
