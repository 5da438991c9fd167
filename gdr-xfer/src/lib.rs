//! # gdr-xfer: a safe transfer engine on gdr
//!
//! (crate documentation is written with the engine)

#![deny(missing_docs)]
#![warn(unsafe_op_in_unsafe_fn)]
#![warn(unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod directory;
pub mod error;

pub use error::{Error, Result};
