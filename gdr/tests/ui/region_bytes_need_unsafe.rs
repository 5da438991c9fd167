// Rule 2: memory the NIC or a peer may write is never handed out as a plain slice by safe code.
use gdr::mr::MemoryRegion;

fn peek(mr: &MemoryRegion) -> u8 {
    mr.as_slice()[0]
}

fn main() {}
