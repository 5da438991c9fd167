//! What an agent published in an etcd directory: the claim of its name, and the keys of its
//! records under it.

use std::sync::Arc;

use gdr_xfer_proto::SegmentId;

use super::{Claim, EtcdDirectory};
use crate::error::Error;
use crate::segment::Segment;
use crate::wire::Message;

/// The key of `agent`'s agent record.
pub(crate) fn endpoint_key(agent: &str) -> String {
    format!("{agent}/endpoint")
}

/// The key of `agent`'s segment `id`.
pub(crate) fn segment_key(agent: &str, id: SegmentId) -> String {
    format!("{agent}/segments/{id}")
}

/// The directory an agent published itself in, and its claim of its name there.
pub(crate) struct Published {
    /// The directory.
    pub(crate) dir: Arc<EtcdDirectory>,
    /// The claim of the agent's name (its scope `<agent>/`).
    pub(crate) claim: Claim,
}

impl Published {
    /// Publishes `seg` as a segment of `agent` (a failure is logged: the peers that watch
    /// miss it, the direct connections do not).
    pub(crate) fn put_segment(&self, agent: &str, seg: &Segment) {
        let value = Message::Segments(vec![seg.info().clone()])
            .encode()
            .map_err(Error::from);
        let r = value.and_then(|v| {
            self.dir
                .put_claimed(&self.claim, &segment_key(agent, seg.id()), &v)
        });
        if let Err(e) = r {
            log::warn!(
                "{agent}: publishing segment {} in the directory: {e}",
                seg.id()
            );
        }
    }

    /// Withdraws `agent`'s segment `id` (a failure is logged: the record goes with the lease).
    pub(crate) fn delete_segment(&self, agent: &str, id: SegmentId) {
        if let Err(e) = self
            .dir
            .delete_claimed(&self.claim, &segment_key(agent, id))
        {
            log::warn!("{agent}: withdrawing segment {id} from the directory: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_lie_under_the_agents_name() {
        assert_eq!(endpoint_key("a"), "a/endpoint");
        assert_eq!(segment_key("a", SegmentId::new(7)), "a/segments/7");
    }
}
