//! Which connection and lane a completion belongs to: by rail (queue pair numbers are per
//! device) and queue pair number.

use std::collections::HashMap;

use super::ConnId;
use crate::io::LaneRef;

/// Rail and queue pair number to connection and lane.
#[derive(Debug, Default)]
pub(super) struct Routes {
    by_qpn: HashMap<(usize, u32), (ConnId, LaneRef)>,
}

impl Routes {
    pub(super) fn insert(&mut self, rail: usize, qp_num: u32, id: ConnId, lane: LaneRef) {
        self.by_qpn.insert((rail, qp_num), (id, lane));
    }

    pub(super) fn get(&self, rail: usize, qp_num: u32) -> Option<(ConnId, LaneRef)> {
        self.by_qpn.get(&(rail, qp_num)).copied()
    }

    /// Removes the route of `(rail, qp_num)` if it is still `lane` of `id`.
    pub(super) fn remove_if(&mut self, rail: usize, qp_num: u32, id: ConnId, lane: LaneRef) {
        if self.by_qpn.get(&(rail, qp_num)) == Some(&(id, lane)) {
            self.by_qpn.remove(&(rail, qp_num));
        }
    }

    /// Routes kept (a connection gone keeps none: they would pile up with every reconnection).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_qpn.len()
    }

    /// Removes every route of the connections `gone`.
    pub(super) fn remove_connections<T>(&mut self, gone: &[(ConnId, T)]) {
        self.by_qpn
            .retain(|_, (id, _)| !gone.iter().any(|(g, _)| g == id));
    }
}
