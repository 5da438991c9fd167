//! One module per `gdr` subcommand.

pub mod bw;
pub mod devinfo;
pub mod doctor;
pub mod lat;
pub mod xfer_bench;
