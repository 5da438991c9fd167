//! One module per `gdr` subcommand.

pub mod bw;
pub mod doctor;
pub mod lat;
