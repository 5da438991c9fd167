// Rule 4: a local slice only comes from a region's bounds-checked `slice()`.
use std::sync::Arc;
use gdr::mr::{LocalSlice, MemoryRegion, Registered};

fn forge(mr: Arc<MemoryRegion>) -> LocalSlice {
    let region: Arc<dyn Registered> = mr;
    LocalSlice { region, offset: 0, len: usize::MAX }
}

fn main() {}
