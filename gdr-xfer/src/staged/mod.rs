//! Staged segments: the engine's side of staging (the driver thread, the bounce buffers of each
//! rail, the segments' paths); the module documentation of [`crate::staging`] says how it works.

mod device;
pub(crate) mod driver;
#[cfg(feature = "emulated-gpu")]
mod emulated;
mod pace;
mod stage;

pub use device::SegmentPath;
pub(crate) use device::{StagedDevice, StagedMemory};
pub use driver::StagingStats;
#[cfg(feature = "emulated-gpu")]
pub use emulated::EmulatedGpu;
pub(crate) use stage::Bounce;
