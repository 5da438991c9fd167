//! What encoding or decoding a control message can refuse.

use std::fmt;

/// A message that cannot be encoded (a value a peer would refuse) or decoded (malformed or
/// hostile bytes). Nothing was sent or used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// A value this side tried to send is outside the protocol's limits.
    Invalid {
        /// What is wrong, with the values.
        what: String,
        /// How to fix it.
        hint: String,
    },
    /// A peer sent something malformed or hostile.
    Protocol {
        /// The peer's name or address.
        peer: String,
        /// What was wrong.
        detail: String,
    },
}

impl WireError {
    pub(crate) fn invalid(what: impl Into<String>, hint: impl Into<String>) -> Self {
        WireError::Invalid {
            what: what.into(),
            hint: hint.into(),
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Invalid { what, hint } => write!(f, "{what}; hint: {hint}"),
            WireError::Protocol { peer, detail } => {
                write!(f, "protocol error from {peer}: {detail}")
            }
        }
    }
}

impl std::error::Error for WireError {}
