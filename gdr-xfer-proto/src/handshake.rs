//! The hello negotiation: what two agents agree on when they connect. The initiator offers
//! its rails with the same number of queue pairs on each; the acceptor answers with the rails
//! both have (paired by position) and as many queue pairs per rail as offered (at most
//! [`MAX_QPS`]); the initiator checks the answer. Each side then configures its end of the
//! connection from its own [`Settings`] and the peer's limits: notifications are at most the
//! smaller of both agents' bounds, and a side sends at most as many at once as the peer has
//! receive slots.
//!
//! `gdr-xfer` runs it over TCP with gdr's queue pairs; the simulation runs it between agents of
//! different settings, so every seed's connections are configured as the driver configures
//! them.

use std::time::Duration;

use crate::config::Config;
use crate::wire::{Codec, Hello, MAX_QPS};

/// A connection's shape: rails, and queue pairs (lanes) on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Rails.
    pub rails: usize,
    /// Queue pairs per rail.
    pub lanes_per_rail: usize,
}

/// What a hello says that the negotiation needs (its endpoints aside).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// The agent's name.
    pub name: String,
    /// Its rails and queue pairs per rail.
    pub shape: Shape,
    /// Its receive slots per connection.
    pub notify_slots: u16,
    /// The largest notification it takes.
    pub notify_max: u32,
}

impl Offer {
    /// The offer a hello makes.
    pub fn of<C: Codec>(hello: &Hello<C>) -> Offer {
        Offer {
            name: hello.name.clone(),
            shape: Shape {
                rails: hello.rails.len(),
                lanes_per_rail: hello.rails.first().map_or(0, Vec::len),
            },
            notify_slots: hello.notify_slots,
            notify_max: hello.notify_max,
        }
    }
}

/// Why a handshake failed; nothing was connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeError {
    /// A hello without a rail or without a queue pair.
    Empty {
        /// Its shape.
        shape: Shape,
    },
    /// The acceptor answered with more rails than offered, or another number of queue pairs
    /// per rail.
    AnswerExceedsOffer {
        /// What the initiator offered.
        offered: Shape,
        /// What the acceptor answered.
        answered: Shape,
    },
    /// The peer has this agent's name.
    SameName {
        /// The name.
        name: String,
    },
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::Empty { shape } => write!(
                f,
                "a hello with {} rails of {} queue pairs",
                shape.rails, shape.lanes_per_rail
            ),
            HandshakeError::AnswerExceedsOffer { offered, answered } => write!(
                f,
                "answered with {} rails of {} queue pairs, we offered {} of {}",
                answered.rails, answered.lanes_per_rail, offered.rails, offered.lanes_per_rail
            ),
            HandshakeError::SameName { name } => {
                write!(f, "the peer is called {name:?}, as this agent")
            }
        }
    }
}

/// The acceptor's answer to `offer` when it has `our_rails` rails: the rails both have, the
/// offered queue pairs per rail (at most [`MAX_QPS`]).
///
/// # Errors
/// [`HandshakeError::Empty`] for an offer (or an agent) without rails or queue pairs;
/// [`HandshakeError::SameName`] when the offer has `our_name`.
pub fn answer(our_name: &str, our_rails: usize, offer: &Offer) -> Result<Shape, HandshakeError> {
    check_name(our_name, offer)?;
    let shape = Shape {
        rails: offer.shape.rails.min(our_rails),
        lanes_per_rail: offer.shape.lanes_per_rail.min(MAX_QPS),
    };
    if shape.rails == 0 || shape.lanes_per_rail == 0 {
        return Err(HandshakeError::Empty { shape: offer.shape });
    }
    Ok(shape)
}

/// The initiator's check of the acceptor's answer to its offer of `offered`: the shape both
/// use.
///
/// # Errors
/// [`HandshakeError::AnswerExceedsOffer`], [`HandshakeError::Empty`],
/// [`HandshakeError::SameName`] when the answer has `our_name`.
pub fn agree(our_name: &str, offered: Shape, answer: &Offer) -> Result<Shape, HandshakeError> {
    let answered = answer.shape;
    if answered.lanes_per_rail != offered.lanes_per_rail || answered.rails > offered.rails {
        return Err(HandshakeError::AnswerExceedsOffer { offered, answered });
    }
    if answered.rails == 0 || answered.lanes_per_rail == 0 {
        return Err(HandshakeError::Empty { shape: answered });
    }
    check_name(our_name, answer)?;
    Ok(answered)
}

fn check_name(ours: &str, offer: &Offer) -> Result<(), HandshakeError> {
    if offer.name == ours {
        return Err(HandshakeError::SameName {
            name: offer.name.clone(),
        });
    }
    Ok(())
}

/// An agent's settings for its connections (what of its configuration the core uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Send queue depth of every queue pair.
    pub send_depth: u64,
    /// Largest request ([`Config::slice_size`]).
    pub slice_size: u64,
    /// Smallest transfer striped over several rails ([`Config::stripe_min`]).
    pub stripe_min: u64,
    /// Receive slots per connection (and send slots it offers).
    pub notify_slots: u16,
    /// Notifications the agent keeps without their slot ([`Config::recv_buffered`]).
    pub notify_queue: u32,
    /// Largest notification it takes.
    pub notify_max: u32,
    /// [`Config::quiesce`].
    pub quiesce: Duration,
    /// [`Config::renew_timeout`].
    pub renew_timeout: Duration,
}

impl Settings {
    /// The core's configuration of this side of a connection of shape `agreed` with the peer
    /// that offered `theirs` (`initiator`: this side connected).
    pub fn config(&self, agreed: Shape, theirs: &Offer, initiator: bool) -> Config {
        Config {
            rails: agreed.rails,
            lanes_per_rail: agreed.lanes_per_rail,
            send_depth: self.send_depth,
            slice_size: self.slice_size,
            stripe_min: self.stripe_min,
            // The peer posts its own count of receive slots; we have our count of send slots.
            send_slots: self.notify_slots.min(theirs.notify_slots).max(1),
            recv_slots: self.notify_slots,
            recv_buffered: self.notify_queue,
            notify_max: self.notify_max.min(theirs.notify_max),
            initiator,
            quiesce: self.quiesce,
            renew_timeout: self.renew_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(name: &str, rails: usize, lanes: usize, slots: u16, max: u32) -> Offer {
        Offer {
            name: name.into(),
            shape: Shape {
                rails,
                lanes_per_rail: lanes,
            },
            notify_slots: slots,
            notify_max: max,
        }
    }

    fn settings(slots: u16, max: u32) -> Settings {
        Settings {
            send_depth: 64,
            slice_size: 4096,
            stripe_min: 0,
            notify_slots: slots,
            notify_queue: 8,
            notify_max: max,
            quiesce: Duration::from_millis(50),
            renew_timeout: Duration::from_millis(100),
        }
    }

    #[test]
    fn both_sides_agree_on_the_rails_both_have_and_the_smaller_limits() {
        // a (2 rails, 4 queue pairs, 16 slots, 1 KiB) connects to b (1 rail, 8 slots, 4 KiB).
        let a = offer("a", 2, 4, 16, 1024);
        let shape = answer("b", 1, &a).unwrap();
        assert_eq!(
            shape,
            Shape {
                rails: 1,
                lanes_per_rail: 4
            }
        );
        let b = offer("b", shape.rails, shape.lanes_per_rail, 8, 4096);
        let agreed = agree("a", a.shape, &b).unwrap();
        assert_eq!(agreed, shape);
        let ca = settings(16, 1024).config(agreed, &b, true);
        let cb = settings(8, 4096).config(agreed, &a, false);
        assert_eq!((ca.rails, ca.lanes_per_rail), (1, 4));
        assert_eq!((ca.send_slots, ca.recv_slots), (8, 16));
        assert_eq!((cb.send_slots, cb.recv_slots), (8, 8));
        assert_eq!((ca.notify_max, cb.notify_max), (1024, 1024));
        assert!(ca.initiator && !cb.initiator);
    }

    #[test]
    fn an_answer_beyond_the_offer_an_empty_hello_and_our_own_name_are_refused() {
        let offered = Shape {
            rails: 1,
            lanes_per_rail: 2,
        };
        for (rails, lanes) in [(2, 2), (1, 3), (1, 1)] {
            let e = agree("a", offered, &offer("b", rails, lanes, 4, 64)).unwrap_err();
            assert!(
                matches!(e, HandshakeError::AnswerExceedsOffer { answered, .. } if answered.rails == rails),
                "{e}"
            );
        }
        assert!(matches!(
            answer("b", 2, &offer("a", 0, 2, 4, 64)),
            Err(HandshakeError::Empty { .. })
        ));
        // An answer of no rails (within the offer's lanes) is as empty as a hello of none.
        assert!(matches!(
            agree("a", offered, &offer("b", 0, 2, 4, 64)),
            Err(HandshakeError::Empty { .. })
        ));
        assert!(matches!(
            answer("b", 0, &offer("a", 1, 2, 4, 64)),
            Err(HandshakeError::Empty { .. })
        ));
        assert_eq!(
            answer("a", 1, &offer("a", 1, 2, 4, 64)),
            Err(HandshakeError::SameName { name: "a".into() })
        );
        assert!(matches!(
            agree("a", offered, &offer("a", 1, 2, 4, 64)),
            Err(HandshakeError::SameName { .. })
        ));
        // At most MAX_QPS queue pairs per rail, whatever is offered; a zero-slot peer still
        // leaves one send slot.
        let big = answer("b", 1, &offer("a", 1, MAX_QPS + 5, 0, 64)).unwrap();
        assert_eq!(big.lanes_per_rail, MAX_QPS);
        let c = settings(4, 64).config(big, &offer("a", 1, MAX_QPS, 0, 64), false);
        assert_eq!(c.send_slots, 1);
    }
}
