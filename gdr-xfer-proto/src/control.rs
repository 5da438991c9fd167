//! The control messages the core exchanges with its peer's core about rails (the driver
//! encodes them on its control link, with the endpoints of its queue pairs).

/// A rail renewal message. `E` is the driver's endpoint list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control<E> {
    /// The sender replaced its queue pairs of `rail` (after a failure, or to fence requests)
    /// and asks the peer to replace its own and connect them to `endpoints`. The sender's old
    /// queue pairs of the rail are destroyed before this is sent.
    Renew {
        /// The rail.
        rail: usize,
        /// Which renewal this is (the answer names it).
        epoch: u32,
        /// The sender's new endpoints.
        endpoints: E,
    },
    /// The answer to a [`Control::Renew`]: the peer's new queue pairs, connected. The peer's
    /// old queue pairs of the rail were destroyed before this was sent.
    Renewed {
        /// The rail.
        rail: usize,
        /// The offer's epoch.
        epoch: u32,
        /// The peer's new endpoints.
        endpoints: E,
    },
    /// The answer to a [`Control::Renew`] the peer could not carry out. The peer's old queue
    /// pairs of the rail were destroyed before this was sent.
    Refused {
        /// The rail.
        rail: usize,
        /// The offer's epoch.
        epoch: u32,
    },
}
