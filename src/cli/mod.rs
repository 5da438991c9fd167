//! One module per `gdr` subcommand.

pub mod doctor;
