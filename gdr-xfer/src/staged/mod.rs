//! Staged segments: the engine's side of staging (the driver thread, the bounce buffers of each
//! rail, the segments' paths); the module documentation of [`crate::staging`] says how it works.

pub(crate) mod driver;
mod pace;
mod stage;

pub use driver::StagingStats;
pub(crate) use stage::Bounce;
