//! Helpers shared by gdr-xfer's integration tests (each test binary uses what it needs).
#![allow(dead_code)]

pub mod etcd;
