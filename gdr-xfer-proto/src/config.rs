//! A connection's settings, fixed when it is made.

use std::time::Duration;

/// Most requests per post (one doorbell), and between two signalled ones, on a connection of one
/// rail: fewer signalled requests, fewer completions to handle.
pub const CHUNK: usize = 64;

/// Most requests per post on a connection of several rails: the grain at which a transfer is
/// spread over them (each batch goes to the rail that would finish it first), so smaller
/// than [`CHUNK`], as a skewed estimate of one rail's throughput must not draw a whole
/// transfer to it.
pub const STRIPE_CHUNK: usize = 32;

/// Most bytes per post on a connection of several rails, where fewer than [`STRIPE_CHUNK`]
/// slices hold them: the striping grain stays 2 MiB whatever the slice size (32 requests of
/// 64 KiB, 8 of the default 256 KiB), so a larger slice does not draw more of a transfer to
/// one rail.
pub const STRIPE_BYTES: u64 = 2 << 20;

/// Requests per post on a connection of several rails with slices of `slice_size` bytes:
/// [`STRIPE_BYTES`] worth, at least 1 and at most [`STRIPE_CHUNK`].
pub fn stripe_chunk(slice_size: u64) -> u64 {
    (STRIPE_BYTES / slice_size.max(1)).clamp(1, STRIPE_CHUNK as u64)
}

/// A connection's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Rails shared with the peer (1..=32).
    pub rails: usize,
    /// Queue pairs per rail (at least 1).
    pub lanes_per_rail: usize,
    /// Send-queue depth of each queue pair.
    pub send_depth: u64,
    /// Largest request: longer runs are cut into slices of this size.
    pub slice_size: u64,
    /// Transfers of at most this many bytes stay on one rail.
    pub stripe_min: u64,
    /// Notifications in flight per rail (the peer's receive slots, at most our send slots).
    pub send_slots: u16,
    /// Receive slots we post per rail.
    pub recv_slots: u16,
    /// Notifications delivered and not yet taken by the application that the connection
    /// buffers while it keeps posting receive slots; past that, each new one holds its slot
    /// until taken, and the peer's next messages wait (receiver not ready) instead of piling
    /// up. What a peer can make us hold is at most this plus the slots. The driver may bound
    /// it further across its connections ([`crate::Io::buffer_notification`]).
    pub recv_buffered: u32,
    /// Largest notification we may send (the smaller of our send slots and the peer's limit).
    pub notify_max: u32,
    /// Whether we connected (the initiator's renewal wins when both sides renew a rail).
    pub initiator: bool,
    /// How long a stopped transfer (timed out, cancelled, failed) waits for its requests in
    /// flight to complete before the queue pairs carrying them are fenced (destroyed and
    /// renewed); and how long a fenced WRITE then waits for the peer to confirm its side.
    pub quiesce: Duration,
    /// How long a renewal offer waits for the peer's answer.
    pub renew_timeout: Duration,
}

impl Config {
    /// A configuration with the engine's defaults for `rails` x `lanes_per_rail` lanes.
    pub fn new(rails: usize, lanes_per_rail: usize) -> Config {
        Config {
            rails,
            lanes_per_rail,
            send_depth: 256,
            slice_size: 256 * 1024,
            stripe_min: 256 * 1024,
            send_slots: 64,
            recv_slots: 64,
            recv_buffered: 1024,
            notify_max: 1024,
            initiator: true,
            quiesce: Duration::from_millis(500),
            renew_timeout: Duration::from_secs(5),
        }
    }

    /// The bound on how long after its deadline a transfer's outcome may come: its requests
    /// are fenced after [`Config::quiesce`], and a fenced WRITE waits at most as long again for
    /// the peer.
    pub fn outcome_bound(&self) -> Duration {
        self.quiesce * 2
    }

    pub(crate) fn lanes(&self) -> usize {
        self.rails * self.lanes_per_rail
    }
}
