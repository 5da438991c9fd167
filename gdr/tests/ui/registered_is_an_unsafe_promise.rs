// Rule 1/3: claiming that memory is registered is an `unsafe` promise a reviewer must check.
use std::sync::Arc;
use gdr::mr::{AccessFlags, MemoryKind, Registered};
use gdr::pd::ProtectionDomain;

struct Fake(Arc<ProtectionDomain>);

impl Registered for Fake {
    fn lkey(&self) -> u32 { 0 }
    fn rkey(&self) -> u32 { 0 }
    fn iova(&self) -> u64 { 0 }
    fn len(&self) -> usize { usize::MAX }
    fn pd(&self) -> &Arc<ProtectionDomain> { &self.0 }
    fn kind(&self) -> MemoryKind { MemoryKind::Host }
    fn access(&self) -> AccessFlags { AccessFlags::all() }
}

fn main() {}
